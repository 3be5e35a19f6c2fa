"""How fast can SMs read from L2, against HBM? (issue 14: is a decode GEMM at M 32-128 bound by L2 traffic?)

A decode GEMM's SMs read the weight once from HBM, plus, from L2, every re-read of the activation (one per N tile)
and of the weight (one per extra M tile) and the split-K partials. Whether those extra L2 bytes cost time depends on
the L2-to-SM bandwidth, which this script measures: programs reading a buffer with 16-byte loads, repeatedly, so
that a buffer smaller than L2 (50 MB on the H100) is served from L2 after the first pass; a 1 GB buffer measures HBM.
Each program reads its own contiguous slice ``passes`` times (``.cg``: L2, not L1), sums it (so nothing is
optimised away) and stores one float. Times are CUDA-event medians over repeated launches; bandwidth = bytes read /
time.

  python op_tests/op_benchmarks/explore_decode_mid/probe_l2_bandwidth.py --out $OUT
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from op_tests.op_benchmarks.explore_decode_mid.explore_decode_mid_h100 import write_csv  # noqa: E402


@triton.jit
def _read_kernel(src_ptr, out_ptr, slice_elems, passes, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    base = src_ptr + pid.to(tl.int64) * slice_elems
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for _ in range(passes):
        for start in range(0, slice_elems, BLOCK):
            acc += tl.load(base + start + offs, cache_modifier=".cg").to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


def measure(buf_bytes: int, programs: int, passes: int, warps: int, block: int, reps: int = 20) -> float:
    """GB/s read by ``programs`` programs over a ``buf_bytes`` buffer, ``passes`` times each."""
    elems = buf_bytes // 2
    slice_elems = elems // programs // block * block
    if slice_elems == 0:  # each program's slice would be empty: nothing read, nothing to measure
        raise ValueError(f"{programs} programs x {block}-element blocks do not fit a {buf_bytes}-byte buffer")
    src = torch.randn(slice_elems * programs, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(programs, dtype=torch.float32, device="cuda")

    def run():
        _read_kernel[(programs,)](src, out, slice_elems, passes, BLOCK=block, num_warps=warps)

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        run()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    t = statistics.median(times)
    return slice_elems * programs * 2 * passes / t / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cu = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name(0)} torch {torch.__version__} triton {triton.__version__} SMs {cu}",
          flush=True)
    rows = []
    plan = []
    for mb, passes in ((4, 64), (8, 32), (16, 16), (24, 12), (32, 8), (1024, 1)):
        for per_sm in (1, 2, 4, 8):
            for warps in (4, 8):
                plan.append((mb, passes, cu * per_sm, warps))
    for mb, passes, programs, warps in plan:
        if (mb << 20) // 2 < programs * 1024 * warps // 4:  # a block per program does not fit: skipped, not 0 GB/s
            continue
        gbs = measure(mb << 20, programs, passes, warps, block=1024 * warps // 4)
        where = "HBM" if mb >= 1024 else "L2"
        print(f"  {where:3s} buffer {mb:5d} MiB  programs {programs:5d}  warps {warps}  {gbs:8.0f} GB/s  "
              f"({gbs / cu:5.1f} GB/s per SM)", flush=True)
        rows.append(dict(buffer_mib=mb, source=where, passes=passes, programs=programs, warps=warps,
                         gb_per_s=round(gbs, 1), gb_per_s_per_sm=round(gbs / cu, 2)))
    write_csv(args.out / "l2_bandwidth.csv", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
