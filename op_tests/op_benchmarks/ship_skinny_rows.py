"""Ship the winners of ``explore_skinny_inductor`` as tuned rows (issue 14), on the GPU that measured them.

Per shape of the exploration's ``results.json``: the config (skinny at M <= 16, the Triton GEMM above) with the
lowest median in its paired final round (CUDA-graph replays over rotating buffers, alternating with F.linear, the
dispatch as shipped and max-autotune), if it beat F.linear there by the tuner's ``--min_gain`` (default 1.02: a
smaller win is not worth a Triton launch) and the shipped dispatch too (else the shape keeps its row).
Its ``err_ratio`` is measured here with the tuner's own check (``gradlib.accuracy``: fraction of outputs outside
the bf16 tolerance, against float32) and a row with any error is not shipped. ``us`` is the paired median. Rows are
merged into ``--out`` under its lock, replacing the row of the same key.

    python -m op_tests.op_benchmarks.ship_skinny_rows --results results/skinny_inductor_h100/run3/results.json \\
        --out configs/bf16_tuned_gemm.csv
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from aiter_gemm import current_device_identity
from aiter_gemm.backends import get_backend
from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.configs import BF16_TUNED_COLUMNS
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.fileio import merge_csv_rows
from gradlib.a16w16 import KEY_COLUMNS, problem_key
from gradlib.accuracy import err_ratio, tolerance_for
from gradlib.results import metrics

BASELINES = ("F.linear", "max-autotune", "dispatch")


def winner(res: dict, min_gain: float) -> tuple[str, float] | None:
    """(kernelName, paired median us) of the fastest explored config of one shape, if ``min_gain`` x faster than
    F.linear and faster than the dispatch as shipped (its row may already be a faster cuBLASLt solution)."""
    med = res["median_us"]
    cands = {k: v for k, v in med.items() if k not in BASELINES}
    if not cands:
        return None
    name = min(cands, key=cands.get)
    return (name, cands[name]) if cands[name] * min_gain <= med["F.linear"] and cands[name] < med["dispatch"] \
        else None


def row_for(res: dict, name: str, us: float, ident: DeviceIdentity) -> dict:
    """The tuned row of ``name`` (a skinny kernelName, or a Triton GEMM one: ``BM...``) at the exploration's shape,
    through the backend's own parser and runner; ``err_ratio`` by the tuner's check. ``pad_m_min`` = M: exact use
    only, the exploration timed this M alone."""
    p = GemmProblem(res["M"], res["N"], res["K"])
    libtype = "triton" if name.startswith("BM") else "skinny"
    backend = get_backend(libtype)
    cfg = backend.select(p, Solution(libtype, -1, 0, name), ident)
    gen = torch.Generator(device="cuda").manual_seed(p.M + p.N + p.K)
    a = torch.randn(p.M, p.K, generator=gen, device="cuda").bfloat16()
    w = (torch.randn(p.N, p.K, generator=gen, device="cuda") / math.sqrt(p.K)).bfloat16()
    out = backend.runner(cfg, ident)(a, w, None, torch.bfloat16)
    err = err_ratio(out, a.float() @ w.float().t(), tolerance_for(torch.bfloat16, torch.bfloat16))
    sol = backend.solution_of(cfg)
    tflops, bw = metrics(p, us)
    return {**problem_key(ident, p), "libtype": sol.libtype, "solidx": str(sol.solidx), "splitK": str(sol.splitK),
            "us": f"{us:.4f}", "kernelName": sol.kernelName, "err_ratio": f"{err:.4f}", "tflops": tflops, "bw": bw,
            "pad_m_min": str(p.M), "timing": "graph"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--min_gain", type=float, default=1.02)
    args = ap.parse_args(argv)
    ident = current_device_identity(on_gpu=True)
    rows = []
    for res in json.loads(open(args.results).read()):
        won = winner(res, args.min_gain)
        if won is None:
            print(f"M={res['M']} N={res['N']} K={res['K']}: no explored config beat F.linear by {args.min_gain}x "
                  "and the shipped dispatch; nothing shipped")
            continue
        row = row_for(res, *won, ident)
        if float(row["err_ratio"]) > 0:
            print(f"M={res['M']} N={res['N']} K={res['K']}: {won[0]} err_ratio {row['err_ratio']}: not shipped")
            continue
        rows.append(row)
        print(f"M={res['M']} N={res['N']} K={res['K']}: {won[0]} {won[1]:.2f} us (F.linear "
              f"{res['median_us']['F.linear']:.2f}, dispatch {res['median_us']['dispatch']:.2f}, max-autotune "
              f"{res['median_us'].get('max-autotune', float('nan')):.2f})")
    appended, replaced = merge_csv_rows(args.out, BF16_TUNED_COLUMNS, rows, KEY_COLUMNS,
                                        replace=lambda old, new: True)
    print(f"{args.out}: {replaced} rows replaced, {appended} appended")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
