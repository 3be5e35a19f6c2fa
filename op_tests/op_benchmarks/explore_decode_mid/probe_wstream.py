"""Weight-streaming probe (issue 14): ``wstream.cu``'s bulk-copy ring against the M = 1 gemv and F.linear at M = 64.

Per weight shape, every config of :func:`grid_configs` streams the weight into shared memory (no products, see
``wstream.cu``); it is screened with the tuner's CUDA-graph timing over rotating weights (> 2x L2), then the 6 fastest
are timed in paired rounds with the M = 1 ``gemv`` reading the same weight and F.linear at M = 64. ``frac_floor`` is
weight bytes / 3.0 TB/s over the time. Cubins come from ``--cubins`` (built ahead with :func:`build_cubins` on a
machine without a GPU), else NVRTC.

  python op_tests/op_benchmarks/explore_decode_mid/probe_wstream.py --out $OUT --cubins .tccubins/ws
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gradlib.timing import cache_bytes, rotating_sets, time_paired, time_runner  # noqa: E402
from op_tests.op_benchmarks.explore_decode_mid import cuda_build  # noqa: E402
from op_tests.op_benchmarks.explore_decode_mid.explore_decode_mid_h100 import (  # noqa: E402
    PAIRED_TIMING,
    SCREEN_TIMING,
    paired_medians,
    write_csv,
)

_SRC = Path(__file__).with_name("wstream.cu")
PEAK_BW = 3.0e12
SHAPES = [(4096, 4096), (8192, 1024), (1280, 8192), (28672, 4096), (4096, 14336)]
CUBIN_DIR: Path | None = None


@dataclass(frozen=True)
class WsConfig:
    RPW: int  # rows per warp
    KC: int  # k per stage
    NS: int  # ring stages
    WN: int  # warps
    KS: int  # K slice per CTA

    @property
    def name(self) -> str:
        return f"WS_R{self.RPW}_KC{self.KC}_NS{self.NS}_W{self.WN}_KS{self.KS}"

    @classmethod
    def from_name(cls, name: str) -> WsConfig:
        m = re.fullmatch(r"WS_R(\d+)_KC(\d+)_NS(\d+)_W(\d+)_KS(\d+)", name)
        if m is None:
            raise ValueError(f"{name!r} is not WS_R<r>_KC<kc>_NS<ns>_W<w>_KS<ks>")
        return cls(*(int(x) for x in m.groups()))

    def smem_bytes(self) -> int:
        return self.WN * self.NS * (self.RPW * (self.KC * 2 + 16) + 8)


def source(c: WsConfig) -> str:
    return cuda_build.with_common(dict(WS_RPW=c.RPW, WS_KC=c.KC, WS_NS=c.NS, WS_WN=c.WN, WS_KS=c.KS), _SRC)


def cubin_name(c: WsConfig) -> str:
    return c.name + ".cubin"


def build_cubins(cfgs: list[WsConfig], out_dir: Path, jobs: int = 2) -> None:
    cuda_build.build_cubins(((out_dir / cubin_name(c), lambda c=c: source(c)) for c in cfgs), jobs)


@cache
def _kernel(c: WsConfig):
    cubin = CUBIN_DIR / cubin_name(c) if CUBIN_DIR is not None else None
    return cuda_build.load_kernel(source(c), "wstream", cubin, c.smem_bytes())


def launch(c: WsConfig, w: torch.Tensor, out: torch.Tensor) -> None:
    N, K = w.shape
    _kernel(c)(grid=(N // (c.RPW * c.WN), K // c.KS, 1), block=(32 * c.WN, 1, 1), args=[w, out, w.stride(0)],
               shared_mem=c.smem_bytes())


def grid_configs(N: int, K: int, cu: int = 132) -> list[WsConfig]:
    """Rows per warp 8/16/32, 64-256 k per stage, 3-6 stages, 4 or 8 warps; the K slice chosen so that the CTAs
    number 1-3 waves of what fits (shared memory, <= 2048 threads per SM)."""
    out = []
    for rpw in (8, 16, 32):
        for kc in (64, 128, 256):
            for ns in (3, 4, 6):
                for wn in (4, 8):
                    c0 = WsConfig(rpw, kc, ns, wn, kc)
                    if c0.smem_bytes() > 227 * 1024 or N % (rpw * wn):
                        continue
                    per_sm = min(228 * 1024 // (c0.smem_bytes() + 1024), 2048 // (32 * wn))
                    blocks = N // (rpw * wn)
                    for ks in sorted({K // s for s in (1, 2, 4, 8, 16) if K % s == 0 and (K // s) % kc == 0}):
                        ctas = blocks * (K // ks)
                        if K // ks >= 1 and ks // kc >= ns and per_sm * cu * 0.5 <= ctas <= per_sm * cu * 3:
                            out.append(WsConfig(rpw, kc, ns, wn, ks))
    return out


def measure(N: int, K: int, cu: int, pairs: int, rows: list) -> None:
    from aiter_gemm.kernels.skinny import SkinnyConfig, launch_skinny
    gemv_cfg = SkinnyConfig.from_name("gemv_BN1_BK2048_SK1_W4_S1_EF")
    dev = torch.device("cuda")
    n_sets = rotating_sets((N * K + 64 * K + 64 * N) * 2, cache_bytes(dev), torch.cuda.mem_get_info(dev)[0])
    sets = [(torch.randn(64, K, dtype=torch.bfloat16, device=dev), torch.randn(N, K, dtype=torch.bfloat16, device=dev))
            for _ in range(n_sets)]
    sink = torch.empty(1 << 22, dtype=torch.int32, device=dev)
    floor = N * K * 2 / PEAK_BW * 1e6
    screened = []
    for c in grid_configs(N, K, cu):
        us = time_runner(lambda i, c=c: launch(c, sets[i][1], sink), n_sets, dev, SCREEN_TIMING).us
        screened.append((us, c))
        rows.append(dict(N=N, K=K, method=c.name, phase="screen", us=round(us, 3), frac_floor=round(floor / us, 4)))
    best = [c for _, c in sorted(screened, key=lambda t: t[0])[:6]]
    calls = {"gemv@M1": lambda i: launch_skinny(sets[i][0][:1], sets[i][1], None, torch.bfloat16, gemv_cfg),
             "F.linear@M64": lambda i: F.linear(sets[i][0], sets[i][1])}
    for c in best:
        calls[c.name] = (lambda i, c=c: launch(c, sets[i][1], sink))
    samples = time_paired(calls, n_sets, PAIRED_TIMING, pairs, captures=2)
    print(f"N={N} K={K}: weight floor {floor:.2f} us, {len(screened)} stream configs screened", flush=True)
    for name, (med, ratio) in paired_medians(samples, "gemv@M1").items():
        print(f"   {name:34s} {med:8.2f} us  {floor / med:.3f} of floor  gemv/this {ratio:.3f}", flush=True)
        rows.append(dict(N=N, K=K, method=name, phase="paired", us=round(med, 3), frac_floor=round(floor / med, 4),
                         gemv_over_this=round(ratio, 4)))


def main() -> int:
    global CUBIN_DIR
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cubins", type=Path)
    ap.add_argument("--pairs", type=int, default=10)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    CUBIN_DIR = args.cubins
    cu = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name(0)} torch {torch.__version__} SMs {cu}", flush=True)
    rows: list[dict] = []
    for N, K in SHAPES:
        measure(N, K, cu, args.pairs, rows)
        torch.cuda.empty_cache()
    write_csv(args.out / "wstream.csv", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
