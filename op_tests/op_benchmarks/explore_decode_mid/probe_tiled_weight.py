"""Does the weight's layout cap the decode GEMMs at M 17-256? (issue 14)

Every tensor-core kernel measured so far (cuBLAS, the Triton decode family, tcgemv) reads a tile as BLOCK_SIZE_N
pieces of ``2 * BLOCK_SIZE_K`` bytes, one per weight row, 2K bytes apart; the M = 1 ``gemv``, which streams the same
weights 1.09-1.38x faster, reads each row's K elements contiguously. If DRAM page locality is what separates them, the
same decode kernel reading a **tile-major** copy of the weight (``gemm_decode.tile_weight``: each tile 8-32 KB of
consecutive bytes) must be faster than on the row-major weight. This script measures exactly that pair, config for
config, beside F.linear and the M = 1 gemv over the same weight (the bandwidth reference).

Per shape: the best decode configs of the wide exploration (``results/explore_decode_mid_h100/wide``) and the
family's default, each in both layouts, checked against float32 (fresh inputs, output poisoned with NaN), then
timed in paired rounds of CUDA-graph replays over rotating weights (> 2x L2; ``gradlib.timing.time_paired``).

  PYTHONUNBUFFERED=1 python op_tests/op_benchmarks/explore_decode_mid/probe_tiled_weight.py --out $OUT
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gradlib.timing import cache_bytes, rotating_sets, time_paired  # noqa: E402
from op_tests.op_benchmarks.explore_decode_mid import gemm_decode as gd  # noqa: E402
from op_tests.op_benchmarks.explore_decode_mid.explore_decode_mid_h100 import (  # noqa: E402
    PAIRED_TIMING,
    check,
    floor_us,
    paired_medians,
    write_csv,
)

# (M, N, K): the wide exploration's best 2-3 configs per shape (screen order), then the family default is added.
PLAN: dict[tuple[int, int, int], list[str]] = {
    (64, 4096, 4096): ["BM32_BN64_BK128_SK1_W4_S6_SW_TMA", "BM64_BN64_BK128_SK1_W4_S5_TMA",
                       "BM32_BN64_BK256_SK1_W4_S3_SW_TMA"],
    (32, 1280, 8192): ["BM16_BN64_BK256_SK2_W4_S5_SW_FX_TMA", "BM16_BN64_BK128_SK4_W4_S5_SW_FX_TMA"],
    (128, 6144, 4096): ["BM64_BN128_BK128_SK1_W4_S4_TMA", "BM128_BN64_BK64_SK1_W4_S8_TMA"],
    (64, 8192, 1024): ["BM64_BN64_BK128_SK1_W4_S5_TMA", "BM32_BN128_BK128_SK1_W4_S5_SW_TMA"],
    (32, 28672, 4096): ["BM32_BN64_BK128_SK1_W4_S6_SW_TMA", "BM32_BN128_BK128_SK1_W4_S4_SW_TMA"],
    (256, 4096, 14336): ["BM64_BN128_BK128_SK1_W4_S4_TMA", "BM128_BN128_BK64_SK1_W8_S4_TMA"],
}


def measure_shape(M: int, N: int, K: int, names: list[str], cu: int, pairs: int, rows: list, checks: list) -> None:
    """Check, then time in paired rounds, each named config in both weight layouts, F.linear and the M = 1 gemv."""
    from aiter_gemm.kernels.skinny import SkinnyConfig, launch_skinny
    gemv_cfg = SkinnyConfig.from_name("gemv_BN1_BK2048_SK1_W4_S1_EF")
    dev = torch.device("cuda")
    cfgs = []
    for n in dict.fromkeys(names):
        base = gd.DecodeConfig.from_name(n)
        cfgs += [base, gd.DecodeConfig(**{**base.__dict__, "B_TILED": True})]
    # Rotating sets (> 2x L2): the weight in both layouts (a tiled copy per tile shape), activation, output.
    tile_keys = sorted({(c.BLOCK_SIZE_N, c.BLOCK_SIZE_K) for c in cfgs})
    per_set = (M * K + (1 + len(tile_keys)) * N * K + M * N) * 2
    n_sets = rotating_sets(per_set, cache_bytes(dev), torch.cuda.mem_get_info(dev)[0])
    sets = []
    for _ in range(n_sets):
        a = torch.randn(M, K, dtype=torch.bfloat16, device=dev)
        b = torch.randn(N, K, dtype=torch.bfloat16, device=dev)
        tiled = {key: gd.tile_weight(b, *key) for key in tile_keys}
        sets.append((a, b, tiled, torch.empty(M, N, dtype=torch.bfloat16, device=dev)))
    calls = {"F.linear": lambda i: F.linear(sets[i][0], sets[i][1]),
             "gemv@M1": lambda i: launch_skinny(sets[i][0][:1], sets[i][1], None, torch.bfloat16, gemv_cfg)}
    for c in cfgs:
        def fn(a, b, out, c=c):
            w = gd.tile_weight(b, c.BLOCK_SIZE_N, c.BLOCK_SIZE_K) if c.B_TILED else b
            return gd.launch_gemm_decode(a, w, None, out, c, cu)
        why = gd.config_supported(c, M, N, K, "sm_90")
        ok, err, msg = (False, float("nan"), why) if why else check(fn, M, N, K, "cuda", torch.bfloat16)
        checks.append(dict(M=M, N=N, K=K, config=c.name, ok=int(ok), rel_err=f"{err:.2e}", why=msg))
        if not ok:
            print(f"  {c.name}: {msg}", flush=True)
            continue
        key = (c.BLOCK_SIZE_N, c.BLOCK_SIZE_K)
        calls[c.name] = (lambda i, c=c, key=key: gd.launch_gemm_decode(
            sets[i][0], sets[i][2][key] if c.B_TILED else sets[i][1], None, sets[i][3], c, cu))
    samples = time_paired(calls, n_sets, PAIRED_TIMING, pairs, captures=2)
    floor = floor_us(M, N, K)
    print(f"M={M} N={N} K={K}: floor {floor:.2f} us ({n_sets} rotating sets)", flush=True)
    for name, (med, ratio) in paired_medians(samples, "F.linear").items():
        pair = ""
        if name.endswith("_BT") and name[:-3] in samples:
            pair = round(statistics.median(p / t for p, t in zip(samples[name[:-3]], samples[name])), 4)
        print(f"   {name:40s} {med:8.2f} us  x{ratio:.3f} F.linear  {floor / med:.3f} of floor"
              + (f"  tiled/plain speed-up {pair}" if pair != "" else ""), flush=True)
        rows.append(dict(M=M, N=N, K=K, method=name, us=round(med, 3), vs_flinear=round(ratio, 4),
                         frac_floor=round(floor / med, 4), tiled_speedup=pair, n=len(samples[name])))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--pairs", type=int, default=15)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    cu = torch.cuda.get_device_properties(dev).multi_processor_count
    print(f"{torch.cuda.get_device_name(dev)} torch {torch.__version__} cu {cu}", flush=True)
    rows, checks = [], []
    for (M, N, K), names in PLAN.items():
        measure_shape(M, N, K, list(names) + [gd.default_config(M, N, K, cu).name], cu, args.pairs, rows, checks)
        torch.cuda.empty_cache()
    write_csv(args.out / "probe_tiled.csv", rows)
    write_csv(args.out / "checks.csv", checks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
