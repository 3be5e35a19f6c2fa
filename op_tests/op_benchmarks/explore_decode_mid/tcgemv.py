"""Host side of ``tcgemv.cu`` (exploration, issue 14): compile with NVRTC through torch, launch, reference.

``torch.cuda._compile_kernel`` (torch >= 2.8) compiles CUDA C++ with NVRTC at run time, so no nvcc or build step is
needed; one binary per config and dtype pair (the parameters are ``#define``s).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from op_tests.op_benchmarks.explore_decode_mid import cuda_build
from op_tests.op_benchmarks.explore_decode_mid.cuda_build import load_kernel
from op_tests.op_benchmarks.explore_decode_mid.gemm_decode import _counters

_SRC = Path(__file__).with_name("tcgemv.cu")


@dataclass(frozen=True)
class TcGemvConfig:
    MT: int = 32  # tokens per tile (multiple of 8, <= 64)
    R: int = 1  # m16 row tiles per warp
    WN: int = 4  # warps along N
    U: int = 4  # 32-k chunks per stage
    XS: int = 3  # activation stages in shared memory
    SK: int = 1  # K splits (grid.y)

    @property
    def name(self) -> str:
        return f"TC_MT{self.MT}_R{self.R}_WN{self.WN}_U{self.U}_XS{self.XS}_SK{self.SK}"

    @classmethod
    def from_name(cls, name: str) -> TcGemvConfig:
        m = re.fullmatch(r"TC_MT(\d+)_R(\d+)_WN(\d+)_U(\d+)_XS(\d+)_SK(\d+)", name.strip())
        if m is None:
            raise ValueError(f"tcgemv kernelName {name!r} does not match TC_MT<m>_R<r>_WN<n>_U<u>_XS<x>_SK<s>")
        return cls(*(int(x) for x in m.groups()))

    @property
    def rows(self) -> int:
        return 16 * self.R * self.WN

    def smem_bytes(self) -> int:
        kc2 = 64 * self.U
        pitch = kc2 + 64 if kc2 % 128 == 0 else kc2
        return self.XS * self.MT * pitch


def config_error(cfg: TcGemvConfig, M: int, N: int, K: int) -> str | None:
    if cfg.MT % 8 or not 8 <= cfg.MT <= 64:
        return f"{cfg.name}: MT must be a multiple of 8 in 8..64"
    if K % (32 * cfg.U):
        return f"{cfg.name}: K={K} is not a multiple of {32 * cfg.U}"
    chunks = K // (32 * cfg.U)
    per = -(-chunks // cfg.SK)
    if cfg.SK > chunks or -(-chunks // per) != cfg.SK:
        return f"{cfg.name}: {cfg.SK} splits of {chunks} chunks leave one empty"
    if cfg.XS < 2 or cfg.smem_bytes() > 200 * 1024:
        return f"{cfg.name}: {cfg.XS} stages, {cfg.smem_bytes()} B of shared memory"
    return None


def source(cfg: TcGemvConfig, in_f16: bool, out_kind: int, has_bias: bool) -> str:
    defines = dict(TC_MT=cfg.MT, TC_R=cfg.R, TC_WN=cfg.WN, TC_U=cfg.U, TC_XS=cfg.XS, IN_F16=int(in_f16),
                   OUT_KIND=out_kind, HAS_BIAS=int(has_bias))
    return cuda_build.with_common(defines, _SRC)


def cubin_name(cfg: TcGemvConfig, in_f16: bool, out_kind: int, has_bias: bool) -> str:
    # the split count is the grid's y: one binary serves every split
    return f"{cfg.name.rsplit('_SK', 1)[0]}_F{int(in_f16)}_O{out_kind}_B{int(has_bias)}.cubin"


#: Folder of cubins built ahead (``build_cubins``, nvcc -arch=sm_90): loaded instead of compiling with NVRTC.
CUBIN_DIR: Path | None = None


def _kernel(cfg: TcGemvConfig, in_f16: bool, out_kind: int, has_bias: bool):
    return _kernel_for(TcGemvConfig(cfg.MT, cfg.R, cfg.WN, cfg.U, cfg.XS, 1), in_f16, out_kind, has_bias)


@cache
def _kernel_for(cfg: TcGemvConfig, in_f16: bool, out_kind: int, has_bias: bool):
    cubin = CUBIN_DIR / cubin_name(cfg, in_f16, out_kind, has_bias) if CUBIN_DIR is not None else None
    return load_kernel(source(cfg, in_f16, out_kind, has_bias), "tcgemv", cubin, cfg.smem_bytes())


def build_cubins(cfgs: list[TcGemvConfig], out_dir: Path, jobs: int = 2) -> None:
    """nvcc every config (bf16 in and out, no bias) to ``out_dir`` for sm_90 (CPU machine, ahead of a GPU run)."""
    cuda_build.build_cubins(((out_dir / cubin_name(c, False, 0, False), lambda c=c: source(c, False, 0, False))
                             for c in cfgs), jobs)


_OUT_KIND = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}


def launch_tcgemv(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                  cfg: TcGemvConfig) -> torch.Tensor:
    M, K = a.shape
    N = b.shape[0]
    kern = _kernel(cfg, a.dtype == torch.float16, _OUT_KIND[out.dtype], bias is not None)
    tiles = -(-M // cfg.MT) * -(-N // cfg.rows)
    chunks = K // (32 * cfg.U)
    per = -(-chunks // cfg.SK)
    if cfg.SK > 1:
        ws = torch.empty((cfg.SK, M, N), dtype=torch.float32, device=a.device)
        cnt = _counters(a.device, tiles)
    else:
        ws = cnt = out
    kern(grid=(tiles, cfg.SK, 1), block=(32 * cfg.WN, 1, 1),
         args=[a, b, bias if bias is not None else a, out, ws, cnt, M, N, K, a.stride(0), b.stride(0),
               out.stride(0), per], shared_mem=cfg.smem_bytes())
    return out


def grid_configs(M: int, N: int, K: int, cu: int) -> list[TcGemvConfig]:
    """Exploration grid: MT = M rounded up to 8 (<= 64), R 1-2, WN 2-4, U 2-8 (<= 8 weight chunks per warp),
    XS 2-4, splits to ~1, 2 and 4 programs per SM."""
    mt = min(64, -(-M // 8) * 8)
    out = []
    for r in (1, 2):
        for wn in (2, 4):
            rows = 16 * r * wn
            tiles = -(-M // mt) * -(-N // rows)
            splits = {1}
            for target in (cu, 2 * cu, 4 * cu):
                s = 1
                while tiles * s < target and s < 32:
                    s += 1
                splits.add(s)
            for u in (2, 4, 8):
                if u * r > 8:
                    continue
                for xs in (2, 4):
                    for sk in sorted(splits):
                        c = TcGemvConfig(mt, r, wn, u, xs, sk)
                        if config_error(c, M, N, K) is None:
                            out.append(c)
    return out
