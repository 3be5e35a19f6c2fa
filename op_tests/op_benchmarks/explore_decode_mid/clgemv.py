"""Host side of ``clgemv.cu`` (exploration, issue 14): config, source, compile, launch and the exploration grid.

The kernel streams each warp's weight rows into a shared-memory ring with 1-D bulk copies, keeps each CTA's
activation slice resident in shared memory and reduces the K splits of a tile inside a thread-block cluster
(distributed shared memory), so split-K costs no global-memory partials and tiles can be wide (8 R WN weight rows).
One binary per config, K split length, dtype pair, output dtype and bias (all ``#define``s).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from op_tests.op_benchmarks.explore_decode_mid import cuda_build

_SRC = Path(__file__).with_name("clgemv.cu")
_OUT_KIND = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
# Dynamic shared memory one CTA may use on sm_90 (227 KiB), less the mbarriers' room.
_SMEM_LIMIT = 227 * 1024 - 1024
CLUSTER_SIZES = (1, 2, 4, 8)  # 8: the largest portable cluster


@dataclass(frozen=True)
class ClGemvConfig:
    MT: int = 64  # tokens per tile (multiple of 16, <= 128)
    WN: int = 8  # warps
    R: int = 2  # 8-row weight tiles per warp
    KC: int = 128  # k per weight stage
    NS: int = 4  # weight ring stages per warp
    S: int = 4  # CTAs per cluster = K splits
    D: int = 0  # diagnostics, timing only (wrong results): 2 no cluster reduction, 3 no products, 4 = 3 without the
    # activation copies, 5 = 4 with plain shared loads instead of ldmatrix, 6 = 5 without clusters (clgemv.cu)

    @property
    def name(self) -> str:
        return (f"CL_MT{self.MT}_WN{self.WN}_R{self.R}_KC{self.KC}_NS{self.NS}_S{self.S}"
                + (f"_D{self.D}" if self.D else ""))

    @classmethod
    def from_name(cls, name: str) -> ClGemvConfig:
        m = re.fullmatch(r"CL_MT(\d+)_WN(\d+)_R(\d+)_KC(\d+)_NS(\d+)_S(\d+)(?:_D(\d))?", name.strip())
        if m is None:
            raise ValueError(f"clgemv kernelName {name!r} does not match "
                             "CL_MT<m>_WN<w>_R<r>_KC<kc>_NS<ns>_S<s>[_D<d>]")
        return cls(*(int(x) for x in m.groups() if x is not None))

    @property
    def rows(self) -> int:
        return 8 * self.R * self.WN

    def smem_bytes(self, K: int) -> int:
        """The activation slice and the warps' weight rings (rows padded by 16 bytes), or the float32 partial tile
        that replaces them, whichever is larger, then the mbarriers: one per stage for the activation, NS per warp for
        the weight rings (the layout of ``clgemv.cu``)."""
        ks = K // self.S
        x_bytes = self.MT * (ks * 2 + 16)
        w_bytes = self.WN * self.NS * 8 * self.R * (self.KC * 2 + 16)
        p_bytes = self.MT * self.rows * 4 if self.S > 1 else 0
        return max(x_bytes + w_bytes, p_bytes) + 8 * (ks // self.KC) + 8 * self.WN * self.NS


def config_error(cfg: ClGemvConfig, M: int, N: int, K: int) -> str | None:
    """Why ``cfg`` cannot run (M, N, K), or None."""
    if cfg.MT % 16 or not 16 <= cfg.MT <= 128:
        return f"{cfg.name}: MT must be a multiple of 16 in 16..128"
    if cfg.D not in (0, 2, 3, 4, 5, 6):
        return f"{cfg.name}: D must be 0 or 2..6"
    if cfg.S not in CLUSTER_SIZES:
        return f"{cfg.name}: S must be one of {CLUSTER_SIZES}"
    if not 1 <= cfg.WN <= 16 or not 1 <= cfg.R <= 4 or cfg.KC % 32 or not 32 <= cfg.KC <= 256 or not 2 <= cfg.NS <= 8:
        return f"{cfg.name}: WN in 1..16, R in 1..4, KC a multiple of 32 in 32..256, NS in 2..8"
    if (cfg.rows // cfg.S) % 4 or cfg.rows % cfg.S:
        return f"{cfg.name}: each of the S ranks sums a multiple of 4 of the {cfg.rows} rows"
    if K % (cfg.S * cfg.KC):
        return f"{cfg.name}: K={K} is not a multiple of S x KC = {cfg.S * cfg.KC}"
    if cfg.smem_bytes(K) > _SMEM_LIMIT:
        return f"{cfg.name}: needs {cfg.smem_bytes(K)} B of shared memory at K={K}"
    return None


def source(cfg: ClGemvConfig, K: int, in_f16: bool, out_kind: int, has_bias: bool) -> str:
    defines = dict(CL_MT=cfg.MT, CL_WN=cfg.WN, CL_R=cfg.R, CL_KC=cfg.KC, CL_NS=cfg.NS, CL_S=cfg.S, CL_KS=K // cfg.S,
                   CL_DIAG=cfg.D, IN_F16=int(in_f16), OUT_KIND=out_kind, HAS_BIAS=int(has_bias))
    return cuda_build.with_common(defines, _SRC)


def cubin_name(cfg: ClGemvConfig, K: int, in_f16: bool, out_kind: int, has_bias: bool) -> str:
    return f"{cfg.name}_K{K}_F{int(in_f16)}_O{out_kind}_B{int(has_bias)}.cubin"


#: Folder of cubins built ahead (``build_cubins``): loaded instead of compiling with NVRTC.
CUBIN_DIR: Path | None = None


@cache
def _kernel(cfg: ClGemvConfig, K: int, in_f16: bool, out_kind: int, has_bias: bool):
    cubin = CUBIN_DIR / cubin_name(cfg, K, in_f16, out_kind, has_bias) if CUBIN_DIR is not None else None
    return cuda_build.load_kernel(source(cfg, K, in_f16, out_kind, has_bias), "clgemv", cubin, cfg.smem_bytes(K))


def build_cubins(cfg_k: list[tuple[ClGemvConfig, int]], out_dir: Path, jobs: int = 2,
                 variants: tuple[tuple[bool, int, bool], ...] = ((False, 0, False),)) -> None:
    """nvcc each (config, K) x (in_f16, out_kind, has_bias) variant to ``out_dir`` for sm_90."""
    cuda_build.build_cubins(((out_dir / cubin_name(c, K, *v), lambda c=c, K=K, v=v: source(c, K, *v))
                             for c, K in cfg_k for v in variants), jobs)


def launch_clgemv(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                  cfg: ClGemvConfig) -> torch.Tensor:
    """``out = a @ b.T (+ bias)``; a (M, K), b (N, K) bf16/fp16 with 16-byte aligned rows, out (M, N) contiguous."""
    M, K = a.shape
    N = b.shape[0]
    why = config_error(cfg, M, N, K)
    if why:
        raise ValueError(why)
    if a.stride(1) != 1 or b.stride(1) != 1 or a.stride(0) % 8 or b.stride(0) % 8 or out.stride(1) != 1:
        raise ValueError(f"clgemv needs unit K stride and 16-byte aligned rows: a {tuple(a.stride())}, "
                         f"b {tuple(b.stride())}, out {tuple(out.stride())}")
    kern = _kernel(cfg, K, a.dtype == torch.float16, _OUT_KIND[out.dtype], bias is not None)
    tiles = -(-M // cfg.MT) * -(-N // cfg.rows)
    kern(grid=(tiles, cfg.S, 1), block=(32 * cfg.WN, 1, 1),
         args=[a, b, bias if bias is not None else a, out, M, N, a.stride(0), b.stride(0), out.stride(0)],
         shared_mem=cfg.smem_bytes(K))
    return out


def grid_configs(M: int, N: int, K: int, cu: int) -> list[ClGemvConfig]:
    """Exploration grid: MT = M rounded up to 16 (<= 128: larger M takes several M tiles), WN 4/8, R 1/2/4, KC
    64/128, ring depth 3/4, every cluster size that fits shared memory, kept where the CTAs number 0.6-4.5 per SM."""
    mt = min(128, -(-M // 16) * 16)
    out = []
    for wn in (4, 8):
        for r in (1, 2, 4):
            for kc in (64, 128):
                for ns in (3, 4):
                    for s in CLUSTER_SIZES:
                        c = ClGemvConfig(mt, wn, r, kc, ns, s)
                        ctas = -(-M // mt) * -(-N // c.rows) * s
                        if config_error(c, M, N, K) is None and 0.6 * cu <= ctas <= 4.5 * cu:
                            out.append(c)
    return out
