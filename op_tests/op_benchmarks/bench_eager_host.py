"""Host time per eager call, by decision: what a host-bound eager model (decode) pays per GEMM, beside GPU time.

For each shape: the host time to submit one call (bursts of calls without synchronizing, median over bursts; the
GPU queue absorbs them) and the GPU time per call (CUDA events over a burst), for F.linear and for gemm_a16w16 with
the configured tables. A decision whose host time exceeds F.linear's by more than its GPU gain makes a host-bound
step slower even when its kernel is faster; the eager rules (Backend.eager_min_us) come from these numbers.

    AITER_CONFIG_GEMM_BF16=<tuned.csv>:configs/bf16_tuned_gemm.csv \\
        python -m op_tests.op_benchmarks.bench_eager_host --shapes 8,4096,14336 32,128256,4096 --out host.csv
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def shape(s: str) -> tuple[int, int, int]:
    m, n, k = (int(v) for v in s.split(","))
    return m, n, k


def host_and_gpu_us(fn, burst: int, bursts: int) -> tuple[float, float]:
    """(median host us per submitted call, median GPU us per call) over ``bursts`` bursts of ``burst`` calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    host, gpu = [], []
    for _ in range(bursts):
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        for _ in range(burst):
            fn()
        t1 = time.perf_counter()
        end.record()
        end.synchronize()
        host.append((t1 - t0) / burst * 1e6)
        gpu.append(start.elapsed_time(end) * 1e3 / burst)
    return statistics.median(host), statistics.median(gpu)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", type=shape, required=True, help="M,N,K ...")
    ap.add_argument("--burst", type=int, default=20)
    ap.add_argument("--bursts", type=int, default=41)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from aiter_gemm import eager_ext, gemm_a16w16, get_GEMM_A16W16_config, ops

    rows = []
    for m, n, k in args.shapes:
        a = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        cfg = get_GEMM_A16W16_config(m, n, k, False, torch.bfloat16)
        calls = (("F.linear", lambda a=a, w=w: F.linear(a, w)), ("gemm_a16w16", lambda a=a, w=w: gemm_a16w16(a, w)))
        res = {}
        for rep in range(2):  # two alternating passes; the second is reported (both warm)
            for name, fn in calls[:: 1 if rep % 2 == 0 else -1]:
                res[name] = host_and_gpu_us(fn, args.burst, args.bursts)
        row = dict(gpu=torch.cuda.get_device_name(), M=m, N=n, K=k, libtype=cfg["libtype"],
                   eager_libtype=cfg["eager_libtype"], row_us=cfg.get("us"),
                   host_us_linear=res["F.linear"][0], host_us_ours=res["gemm_a16w16"][0],
                   gpu_us_linear=res["F.linear"][1], gpu_us_ours=res["gemm_a16w16"][1],
                   eager_ext="loaded" if ops.EAGER_EXT is not None else eager_ext.status)
        rows.append(row)
        print(f"{m:6d} {n:6d} {k:6d} {row['libtype']:>9}/{row['eager_libtype']:<9} host us F.linear "
              f"{row['host_us_linear']:7.2f} ours {row['host_us_ours']:7.2f} | GPU us F.linear "
              f"{row['gpu_us_linear']:8.2f} ours {row['gpu_us_ours']:8.2f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        for r in rows:
            wr.writerow({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
