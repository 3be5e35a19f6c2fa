"""Ship a GPU tuning run as the default tuned CSV, applying the tuner's ``--min_gain`` rule after the fact.

The H100 run of 2026-11-21 was made before ``--min_gain`` existed (plain fastest wins). This re-applies the rule to
its rows from the run's own summary (``torch_us``, F.linear timed in the same search): a non-torch winner less than
``--min_gain`` times faster than F.linear is replaced by a torch row carrying F.linear's measured time. Rows are
merged into the target with ``aiter_gemm.fileio.merge_csv_rows`` (lock + atomic rename; other rows kept).

    python -m op_tests.op_benchmarks.ship_tuned_csv --tuned results/h100_bf16_tuned_gemm.csv \\
        --summary results/h100_tuner_summary.csv --out configs/bf16_tuned_gemm.csv
"""

from __future__ import annotations

import argparse
import sys

from aiter_gemm.configs import BF16_TUNED_COLUMNS
from aiter_gemm.fileio import merge_csv_rows, read_csv_rows
from gradlib.a16w16 import KEY_COLUMNS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tuned", required=True)
    ap.add_argument("--summary", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--min_gain", type=float, default=1.02)
    args = ap.parse_args(argv)
    _, tuned = read_csv_rows(args.tuned)
    _, summary = read_csv_rows(args.summary)
    torch_us = {tuple(r[c] for c in KEY_COLUMNS): float(r["torch_us"]) for r in summary if r.get("torch_us")}
    out, swapped = [], 0
    for r in tuned:
        base = torch_us.get(tuple(r[c] for c in KEY_COLUMNS))
        if r["libtype"] != "torch" and base is not None and base < float(r["us"]) * args.min_gain:
            scale = float(r["us"]) / base  # tflops and bw scale inversely with time
            r = {**r, "libtype": "torch", "solidx": "0", "splitK": "0", "kernelName": "F.linear",
                 "us": f"{base:.4f}", "err_ratio": "0.0", "tflops": f"{float(r['tflops']) * scale:.2f}",
                 "bw": f"{float(r['bw']) * scale:.2f}"}
            swapped += 1
        out.append(r)
    added, replaced = merge_csv_rows(args.out, BF16_TUNED_COLUMNS, out, KEY_COLUMNS, replace=lambda old, new: True)
    print(f"{len(out)} rows ({swapped} winners within {args.min_gain}x of F.linear kept as torch): "
          f"{added} added, {replaced} replaced in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
