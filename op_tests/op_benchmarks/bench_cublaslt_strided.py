"""cuBLASLt runner on a strided activation (a column slice of a wider tensor, as an o projection reading the q part
of a fused qkv output): rows read in place through a layout with the real row stride, against copying them into a
contiguous buffer first (what the runner did before) and against F.linear on the same slice.

Per shape, the cublaslt solution is the first enumerated candidate (cuBLASLt's heuristic #0); each variant is
timed by gradlib's CUDA-graph timing over rotating input sets spanning twice the L2, 4 rounds of alternating order,
median of the round medians.

    python -m op_tests.op_benchmarks.bench_cublaslt_strided --ms 1,8,128,2048 --out results_dir
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from aiter_gemm.backends import get_backend
from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.device import probe_gpu
from gradlib.timing import FULL, cache_bytes, interleaved, rotating_sets, time_runner

BF16 = torch.bfloat16


def bench(M: int, N: int, K: int, width: int, dev) -> dict:
    """Times of F.linear, the runner in place and the runner after a copy on a[:, :K] of (M, width) inputs."""
    backend = get_backend("cublaslt")
    problem = GemmProblem(M, N, K, False, BF16, BF16)
    solution = backend.candidates(problem, dev)[0]
    runner = backend.prepare(problem, solution, dev)
    per_set = (M * width + N * K + M * N) * 2
    n = rotating_sets(per_set, cache_bytes(torch.device("cuda")), torch.cuda.mem_get_info()[0])
    sets = [(torch.randn(M, width, dtype=BF16, device="cuda")[:, :K],
             torch.randn(N, K, dtype=BF16, device="cuda") / K ** 0.5) for _ in range(n)]
    a, b = sets[0]
    ref = F.linear(a, b)
    got = runner(a, b, None, BF16)
    err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
    variants = {
        "F.linear": lambda i: F.linear(*sets[i]),
        "cublaslt_in_place": lambda i: runner(sets[i][0], sets[i][1], None, BF16),
        "cublaslt_copy": lambda i: runner(sets[i][0].contiguous(), sets[i][1], None, BF16),
    }
    samples = interleaved({k: (lambda fn=fn: time_runner(fn, n, torch.device("cuda"), FULL).us)
                           for k, fn in variants.items()}, 4)
    row = {"M": M, "N": N, "K": K, "row_stride": width, "kernelName": solution.kernelName[:40], "rel_err": err}
    row.update({f"{k}_us": statistics.median(v) for k, v in samples.items()})
    row["copy_over_in_place"] = row["cublaslt_copy_us"] / row["cublaslt_in_place_us"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,8,128,2048")
    ap.add_argument("--shapes", default="4096:4096:6144", help="N:K:row_stride triples, comma separated (default: "
                    "Llama-3.1-8B o projection reading the q slice of the 6144-wide qkv output)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    dev = probe_gpu()
    rows = []
    for shape in args.shapes.split(","):
        N, K, width = map(int, shape.split(":"))
        for M in map(int, args.ms.split(",")):
            row = bench(M, N, K, width, dev)
            rows.append(row)
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                  flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "cublaslt_strided.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M"),
            "cublaslt": get_backend("cublaslt").library().version}
    (args.out / "cublaslt_strided.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
