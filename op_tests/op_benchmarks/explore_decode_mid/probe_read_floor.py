"""How fast can any kernel read an M = 1 decode weight, timed as the benchmarks time a GEMM? (issue 14, H100)

Issue 14 asks the M = 1 GEMM to reach 0.92 of the copy floor (bytes / 3.0 TB/s) on weights >= 32 MB; the `gemv`
reaches 0.89-0.90 on the smallest, (4096, 4096), and 0.93-1.03 on the larger ones, which fits a fixed cost of about
2 us per call plus the bytes at about 3.16 TB/s. This probe measures that fixed cost and the read rate without any
GEMM: an empty kernel (one program, and 4 per SM), and a pure read of the weight (each program sums its slice of the
weight with 16-byte loads and stores one float: no activation, no products, no output to speak of) over a grid of
program counts, block sizes, warp counts, access orders and cache hints, on the same rotating buffers (> 2x L2) and
CUDA-graph timing, paired with the `gemv` at M = 1 and F.linear. If no pure read of the (4096, 4096) weight reaches
0.92 of the floor, the bar is beyond any kernel under this timing method.

  python op_tests/op_benchmarks/explore_decode_mid/probe_read_floor.py --out $OUT/read_floor [--pairs 15]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gradlib.timing import time_paired  # noqa: E402
from op_tests.op_benchmarks.explore_decode_mid.explore_decode_mid_h100 import (  # noqa: E402
    PAIRED_TIMING,
    SCREEN_TIMING,
    Rotating,
    floor_us,
    paired_medians,
    write_csv,
)

WEIGHTS = [(4096, 4096), (6144, 4096), (8192, 3584), (4096, 14336), (7168, 8192)]  # the shipped ones of 32-117 MB


@triton.jit
def _empty_kernel(out_ptr):
    pass


@triton.jit
def _read_kernel(x_ptr, out_ptr, n_elem, chunk, BLOCK_SIZE: tl.constexpr, INTERLEAVE: tl.constexpr,
                 EVICT: tl.constexpr):
    """Sum this program's slice of ``x`` (``chunk`` elements, contiguous; or, INTERLEAVE, every num_programs-th block
    of BLOCK_SIZE) and store it: the loads cannot be dropped, and nothing else moves."""
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    offs = tl.arange(0, BLOCK_SIZE)
    if INTERLEAVE:
        for start in range(pid * BLOCK_SIZE, n_elem, tl.num_programs(0) * BLOCK_SIZE):
            idx = start + offs
            acc += tl.load(x_ptr + idx, mask=idx < n_elem, other=0.0,
                           eviction_policy=EVICT).to(tl.float32)
    else:
        end = tl.minimum(pid * chunk + chunk, n_elem)
        for start in range(pid * chunk, end, BLOCK_SIZE):
            idx = start + offs
            acc += tl.load(x_ptr + idx, mask=idx < end, other=0.0,
                           eviction_policy=EVICT).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


def read_configs(cu: int):
    """(name, programs, BLOCK_SIZE, num_warps, interleave, evict): 1-8 programs per SM, 2-16 KB per iteration,
    contiguous slices or interleaved blocks, loads marked evict-first (the gemv's best tiles use it)."""
    out = []
    for per_sm in (1, 2, 4, 8):
        for block in (1024, 2048, 4096, 8192):
            for warps in (4, 8, 16):
                if block // (warps * 32) < 8:  # at least one 16-byte load per thread
                    continue
                for inter in (0, 1):
                    for evict in ("evict_first", ):
                        name = f"read_P{per_sm * cu}_B{block}_W{warps}" + ("_IL" if inter else "") + (
                            "_EF" if evict else "")
                        out.append((name, per_sm * cu, block, warps, inter, evict))
    return out


def launch_read(w: torch.Tensor, out: torch.Tensor, programs: int, block: int, warps: int, inter: int, evict: str):
    n = w.numel()
    chunk = triton.cdiv(triton.cdiv(n, programs), block) * block
    _read_kernel[(programs, )](w, out, n, chunk, BLOCK_SIZE=block, INTERLEAVE=inter, EVICT=evict, num_warps=warps)


def measure_weight(N: int, K: int, cu: int, sink: torch.Tensor, pairs: int, top: int, screen_rows: list,
                   rows: list) -> None:
    """Screen the pure-read configs on one weight, then pair the best ``top`` with F.linear, the dispatch, the
    gemv's default tile and the empty kernels."""
    from aiter_gemm import gemm_a16w16
    from aiter_gemm.kernels.skinny import SkinnyConfig, launch_skinny
    rot = Rotating(1, N, K, sink.device)
    nset, sets = rot.n, rot.sets
    cands = {}
    for name, p, b, w, il, ev in read_configs(cu):
        fn = (lambda a, wt, c, p=p, b=b, w=w, il=il, ev=ev: launch_read(wt, sink, p, b, w, il, ev))
        us = rot.time(fn, SCREEN_TIMING)
        cands[name] = (us, fn)
        screen_rows.append(dict(N=N, K=K, config=name, screen_us=round(us, 3)))
    best = sorted(cands, key=lambda n: cands[n][0])[:top]
    for i in range(nset):  # the dispatch decides (and compiles) the shape on its first eager call
        gemm_a16w16(sets[i][0], sets[i][1])
    gemv_cfg = SkinnyConfig.from_name("gemv_BN1_BK2048_SK1_W4_S1_EF")
    calls = {"F.linear": lambda i: F.linear(sets[i][0], sets[i][1]),
             "dispatch (M = 1)": lambda i: gemm_a16w16(sets[i][0], sets[i][1]),
             "gemv default tile": lambda i: launch_skinny(sets[i][0], sets[i][1], None, torch.bfloat16, gemv_cfg),
             "empty kernel, 1 program": lambda i: _empty_kernel[(1, )](sink),
             f"empty kernel, {4 * cu} programs": lambda i: _empty_kernel[(4 * cu, )](sink)}
    for n in best:
        calls[n] = (lambda i, f=cands[n][1]: f(*sets[i]))
    samples = time_paired(calls, nset, PAIRED_TIMING, pairs, captures=2)
    floor = floor_us(1, N, K)
    print(f"(1, {N}, {K}): floor {floor:.2f} us ({(N * K + N + K) * 2 / 1e6:.1f} MB at 3.0 TB/s), "
          f"{len(cands)} read configs screened", flush=True)
    for n, (med, ratio) in paired_medians(samples, "F.linear").items():
        print(f"   {n:36s} {med:8.2f} us  x{ratio:.3f} F.linear  {floor / med:.3f} of floor", flush=True)
        rows.append(dict(M=1, N=N, K=K, method=n, us=round(med, 3), vs_flinear=round(ratio, 4),
                         frac_floor=round(floor / med, 4)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--top", type=int, default=3, help="pure-read configs per weight taken to the paired rounds")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    dev = torch.device("cuda")
    cu = torch.cuda.get_device_properties(dev).multi_processor_count
    sink = torch.empty(8 * cu, dtype=torch.float32, device=dev)  # one float per program, up to 8 per SM
    screen_rows: list[dict] = []
    rows: list[dict] = []
    for N, K in WEIGHTS:
        measure_weight(N, K, cu, sink, args.pairs, args.top, screen_rows, rows)
        torch.cuda.empty_cache()
    write_csv(args.out / "screen.csv", screen_rows)
    write_csv(args.out / "paired.csv", rows)
    print(f"done in {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
