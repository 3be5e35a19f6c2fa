"""FP8 block-scale GEMM kernels in TileLang: SGLang's four variants (base, swapAB, splitK, splitK_swapAB) on this
project's layouts, with a typed config, a builder per orientation and a float32 reference.

The op (:func:`aiter_gemm.gemm_a8w8_blockscale`): XQ (M, K) and WQ (N, K) float8_e4m3fn, x_scale (M, K/128) per
token and 128-wide K group (row-major, or M-major with strides (1, M)), w_scale (N/128, K/128) per 128x128 weight
block, out (M, N) bf16 (fp16 and fp32 too). Every variant multiplies one 128-wide K block at a time with wgmma into a
float32 tile, then promotes it into a second float32 accumulator times that block's scales (DeepGEMM's "2xAcc": the
fp8 partial sums never accumulate more than 128 products). TileLang lowers the K loop (``T.Pipelined``, TMA loads)
to a producer warpgroup and ``threads / 128`` math warpgroups; with two math warpgroups one promotes while the
other's wgmma runs, which is DeepGEMM's overlap for large M.

- ``base`` / ``splitK``: tokens on the MMA's M side (``block_M`` tokens x ``block_N`` weight rows per CTA);
- ``swapAB`` / ``splitK_swapAB``: weight rows on the M side (``block_M`` weight rows x ``block_N`` tokens), the
  decode form: wgmma's M is at least 64, which at M <= 16 tokens would be mostly padding the other way round;
- ``splitK*``: ``split_k`` CTAs share a tile's K range and write float32 partials that a second kernel sums.

M is symbolic (``T.dynamic``): one compiled kernel per (N, K, config, out dtype, x_scale layout) serves every M.
No ``from __future__ import annotations`` here: TileLang evaluates the ``T.Tensor`` annotations of a
``@T.prim_func`` against the builder's closure, which string annotations would not see.
"""

import os
import re
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from aiter_gemm.kernels.a8w8_blockscale_tilelang_ws import PASS_CONFIGS as _WS_PASS_CONFIGS
from aiter_gemm.kernels.a8w8_blockscale_tilelang_ws import build_ws
from aiter_gemm.kernels.a8w8_blockscale_tilelang_ws import math_registers as ws_math_registers

SCALE_BLOCK = 128
#: Scale groups one pipeline stage of the swapped types may hold (``block_K`` up to 512): each weight row then streams
#: 512 contiguous bytes a stage instead of 128, which took M <= 16 decode from 0.73-0.94 to 0.85-1.01 of the weight
#: read on the H100 (benchmarks/results/fp8/decode_limits_h100/wide.csv).
MAX_GROUPS = 4
#: SGLang's kernel types, then ``ws`` (hand-scheduled warp specialisation, DeepGEMM's design:
#: :mod:`aiter_gemm.kernels.a8w8_blockscale_tilelang_ws`); the first word of a config name.
SGLANG_KERNEL_TYPES = ("base", "swapAB", "splitK", "splitK_swapAB")
KERNEL_TYPES = (*SGLANG_KERNEL_TYPES, "ws")
SWAPPED = frozenset({"swapAB", "splitK_swapAB"})
SPLIT = frozenset({"splitK", "splitK_swapAB"})
#: wgmma needs 64 rows per math warpgroup on its M side; N side multiples of 8 up to 256.
_WGMMA_M = 64
#: Shared memory per CTA on sm_90 (227 KB usable), minus what TileLang keeps for barriers and scale staging.
_SMEM_BYTES = 227 * 1024 - 2 * 1024
_OUT_TL = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}

_NAME_RE = re.compile(r"(?P<kt>base|swapAB|splitK|splitK_swapAB|ws)-BM(?P<bm>\d+)_BN(?P<bn>\d+)_BK(?P<bk>\d+)"
                      r"_S(?P<st>\d+)_T(?P<th>\d+)_SK(?P<sk>\d+)(?P<bs>_BS)?(?P<as>_AS)?(?:_SW(?P<sw>\d+))?")


@dataclass(frozen=True)
class TileLangConfig:
    """One kernel: SGLang's config keys (``kernel_type``, ``block_M``, ``block_N``, ``block_K``, ``num_stages``,
    ``threads``, ``split_k``, ``c_scale_local``, ``b_scale_shm``, ``a_scale_shm``) plus ``swizzle``, the L2
    rasterization panel (``T.use_swizzle``; 0 = launch order). In the swapped types ``block_M`` counts weight rows
    and ``block_N`` tokens, as in SGLang, and ``block_K`` may hold up to :data:`MAX_GROUPS` scale groups a pipeline
    stage (each multiplied and promoted with its own scales; SGLang's kernels take 128 only). ``*_scale_shm``: the
    token scales are staged in shared memory by the producer (cp.async) before the math warpgroup multiplies them in.

    ``c_scale_local`` is read from SGLang's files and not used: the combined per-row scales always live in the math
    threads' registers. TileLang 0.1.15 releases a pipeline stage before the promotion reads scales staged there in
    shared memory (SGLang's ``c_scale_local: false``); on the H100 that gave relative errors up to 0.2 on 136 of 1504
    checks, on tiles of 128x128 elements and more, where the promotion is long enough to lose the race."""

    kernel_type: str
    block_M: int
    block_N: int
    block_K: int = 128
    num_stages: int = 3
    threads: int = 128
    split_k: int = 1
    c_scale_local: bool = True
    b_scale_shm: bool = False
    a_scale_shm: bool = False
    swizzle: int = 0

    libtype = "tilelang"

    @property
    def variant(self) -> str:  # the Triton configs' name for the kernel type
        return self.kernel_type

    @property
    def swapped(self) -> bool:
        return self.kernel_type in SWAPPED

    @property
    def runs_in_sglang(self) -> bool:
        """Whether SGLang's own kernels run this config: its four types with one scale group a stage (``ws`` and
        wider stages are this project's; ``swizzle`` is an extra key SGLang ignores)."""
        return self.kernel_type in SGLANG_KERNEL_TYPES and self.block_K == SCALE_BLOCK

    @property
    def groups(self) -> int:
        """Scale groups (128-wide K blocks, each with its own scales and promotion) a pipeline stage holds."""
        return self.block_K // SCALE_BLOCK

    @property
    def NUM_KSPLIT(self) -> int:  # the op's split-count surface, shared with the Triton configs
        return self.split_k

    @property
    def name(self) -> str:
        """The CSV ``kernelName``: ``<type>-BM<>_BN<>_BK<>_S<stages>_T<threads>_SK<split>[_BS][_AS][_SW<n>]``
        (``c_scale_local`` is always true, so the name does not carry it)."""
        return config_name(asdict(self))

    @classmethod
    def from_name(cls, name: str) -> "TileLangConfig":
        m = _NAME_RE.fullmatch(name.strip())
        if m is None:
            raise ValueError(f"{name!r} is not a TileLang config name (<type>-BM<m>_BN<n>_BK<k>_S<stages>_T<threads>"
                             f"_SK<split>[_BS][_AS][_SW<panel>], type one of {', '.join(KERNEL_TYPES)})")
        return cls(m["kt"], int(m["bm"]), int(m["bn"]), int(m["bk"]), int(m["st"]), int(m["th"]), int(m["sk"]),
                   True, m["bs"] is not None, m["as"] is not None, int(m["sw"] or 0))

    def to_json(self) -> dict[str, Any]:
        """The config as SGLang's JSON value holds it (plus ``libtype`` and, when set, ``swizzle``)."""
        out: dict[str, Any] = {"libtype": self.libtype, **asdict(self)}
        for key in ("swizzle", "a_scale_shm", "b_scale_shm"):
            if not out[key]:
                del out[key]
        return out

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> "TileLangConfig":
        """A config from SGLang's JSON value (``latency_ms`` / ``tflops`` ignored) or :meth:`to_json`; ValueError
        naming the unknown or missing key."""
        known = {f.name for f in fields(cls)}
        extra = set(entry) - known - {"libtype", "latency_ms", "tflops"}
        if extra:
            raise ValueError(f"unknown TileLang config keys {sorted(extra)} (known: {sorted(known)})")
        if entry.get("libtype", cls.libtype) != cls.libtype:
            raise ValueError(f"libtype {entry['libtype']!r} is not {cls.libtype!r}")
        try:
            kwargs = {f.name: entry[f.name] for f in fields(cls) if f.name in entry}
            return cls(**kwargs)
        except TypeError as exc:
            raise ValueError(f"TileLang config {entry!r}: {exc}") from None

    def __post_init__(self) -> None:
        why = self.problem()
        if why is not None:
            raise ValueError(f"TileLang config {self.name}: {why}")

    def problem(self) -> str | None:
        """Why this config cannot be built for any shape (None if it can)."""
        if self.kernel_type not in KERNEL_TYPES:
            return f"kernel_type {self.kernel_type!r} is not one of {KERNEL_TYPES}"
        if self.block_K % SCALE_BLOCK or not SCALE_BLOCK <= self.block_K <= MAX_GROUPS * SCALE_BLOCK:
            return (f"block_K must be {SCALE_BLOCK} times 1..{MAX_GROUPS} (scale groups a pipeline stage), "
                    f"got {self.block_K}")
        if self.block_K != SCALE_BLOCK and self.kernel_type not in SWAPPED:
            return (f"{self.kernel_type} stages one scale group (block_K {SCALE_BLOCK}); wider stages are built "
                    f"for the swapped types")
        if self.kernel_type == "ws":
            return self._ws_problem()
        if self.threads not in (128, 256, 384):
            return f"threads must be 128, 256 or 384 (math warpgroups), got {self.threads}"
        mma_m, mma_n = self.block_M, self.block_N
        if mma_m % _WGMMA_M:
            return f"block_M={mma_m} must be a multiple of {_WGMMA_M} (wgmma M)"
        if mma_n % 8 or not 8 <= mma_n <= 256:
            return f"block_N={mma_n} must be a multiple of 8 in 8..256 (wgmma N)"
        groups, m_tiles = self.threads // 128, mma_m // _WGMMA_M
        if groups > m_tiles and mma_n % (8 * groups // m_tiles):
            return (f"{groups} math warpgroups cannot share a {mma_m}x{mma_n} tile (each needs 64 rows or a "
                    f"multiple-of-8 slice of block_N)")
        weight_tile = self.block_M if self.swapped else self.block_N
        if SCALE_BLOCK % weight_tile and weight_tile % SCALE_BLOCK:
            return f"the weight tile ({weight_tile} rows) must divide or be a multiple of {SCALE_BLOCK}"
        if weight_tile > SCALE_BLOCK:
            return f"the weight tile ({weight_tile} rows) must lie in one {SCALE_BLOCK}-row scale block"
        if self.kernel_type in SPLIT and self.split_k < 2:
            return f"{self.kernel_type} needs split_k >= 2, got {self.split_k}"
        if self.kernel_type not in SPLIT and self.split_k != 1:
            return f"{self.kernel_type} has split_k 1, got {self.split_k}"
        why = self._pipeline_problem(1)
        if why is not None:
            return why
        if self.b_scale_shm and not self.swapped:
            return "b_scale_shm applies to the swapped types (token scales of the B operand)"
        if self.a_scale_shm and self.swapped:
            return "a_scale_shm applies to base and splitK (token scales of the A operand)"
        return None

    def _ws_problem(self) -> str | None:
        """The ``ws`` kernel's rule: 2 or 3 math warpgroups of 64 token rows plus the producer warpgroup, a weight
        tile of 8..256 rows in at most two scale blocks, no split, scales always staged by the producer."""
        if self.block_M not in (128, 192):
            return f"ws needs block_M 128 or 192 (2 or 3 math warpgroups of 64 rows), got {self.block_M}"
        if self.threads != 2 * self.block_M + 128:
            return (f"ws runs block_M/64 math warpgroups and a producer warpgroup: threads={2 * self.block_M + 128}, "
                    f"got {self.threads}")
        if self.block_N % 8 or not 8 <= self.block_N <= 256 or (self.block_N > 128 and self.block_N % 64):
            return f"ws block_N={self.block_N} must be a multiple of 8 up to 128, or 192 or 256"
        # partial + accumulator tiles: 2 * block_N / 2 registers a math thread, within 240 (2 groups) or 160 (3)
        if self.block_N + 32 > ws_math_registers(self.block_M // 64):
            return (f"ws block_N={self.block_N} needs {self.block_N + 32} registers a math thread, more than "
                    f"{ws_math_registers(self.block_M // 64)} with {self.block_M // 64} math warpgroups")
        if self.split_k != 1:
            return f"ws has split_k 1, got {self.split_k}"
        if self.a_scale_shm or self.b_scale_shm:
            return "ws always stages the scales in shared memory: a_scale_shm / b_scale_shm do not apply"
        return self._pipeline_problem(2)

    def _pipeline_problem(self, min_stages: int) -> str | None:
        """The rule every type shares: ``min_stages``..16 stages, shared memory within the SM's, swizzle >= 0."""
        if not min_stages <= self.num_stages <= 16:
            return f"num_stages={self.num_stages} must be {min_stages}..16"
        if self.smem_bytes() > _SMEM_BYTES:
            return f"needs {self.smem_bytes()} bytes of shared memory, more than {_SMEM_BYTES}"
        if self.swizzle < 0:
            return f"swizzle={self.swizzle} must be >= 0"
        return None

    def smem_bytes(self) -> int:
        """Shared memory: the staged fp8 tiles or the output tile, whichever is larger (TileLang places the output
        tile over the stages, whose lifetime has ended: float32 for split-K partials, else at most 2 bytes counted
        as 4 to leave room for an fp32 output), plus the staged scales. ``ws`` keeps no output tile."""
        stages = self.num_stages * (self.block_M + self.block_N) * self.block_K
        if self.kernel_type == "ws":
            return stages + self.num_stages * (self.block_M + 4) * 4
        return max(stages, self.block_M * self.block_N * 4) + 8 * (self.block_M + self.block_N) * self.num_stages


def config_name(values: dict[str, Any]) -> str:
    """:attr:`TileLangConfig.name` of config values, checked or not (values the rule rejects give a name that
    :meth:`TileLangConfig.from_name` rejects saying why: how an SGLang entry that cannot run here is named)."""
    v = {f.name: f.default for f in fields(TileLangConfig) if f.name != "kernel_type"} | values
    return (f"{v['kernel_type']}-BM{v['block_M']}_BN{v['block_N']}_BK{v['block_K']}_S{v['num_stages']}"
            f"_T{v['threads']}_SK{v['split_k']}" + ("_BS" if v["b_scale_shm"] else "")
            + ("_AS" if v["a_scale_shm"] else "") + (f"_SW{v['swizzle']}" if v["swizzle"] else ""))


def is_config_name(name: str) -> bool:
    """Whether ``name`` has the grammar of :attr:`TileLangConfig.name` (values unchecked)."""
    return _NAME_RE.fullmatch(name.strip()) is not None


def shape_error(cfg: TileLangConfig, M: int, N: int, K: int) -> str | None:
    """Why ``cfg`` cannot run (M, N, K) (None if it can): the one rule of the tuner and the runtime."""
    if M < 1 or N < 1 or K < 1:
        return f"empty problem M={M} N={N} K={K}"
    if K % SCALE_BLOCK:
        return f"K={K} is not a multiple of {SCALE_BLOCK}"
    if N % 16:
        return f"N={N} is not a multiple of 16 (TMA rows of the output)"
    kb = K // SCALE_BLOCK
    if kb % (cfg.split_k * cfg.groups):
        return (f"K/{SCALE_BLOCK}={kb} K blocks do not split into {cfg.split_k} equal parts of whole "
                f"{cfg.block_K}-wide stages")
    return None


def _token_tiles(M: int) -> tuple[int, ...]:
    """Token tiles (the swapped types' ``block_N``) worth timing at M: the smallest of 16..256 holding M, and half
    of it (two CTAs share the tokens: at M = 64 on the H100 the 32-token tile won on 5 of 8 weights)."""
    tile = next((t for t in (16, 32, 64, 128, 256) if t >= M), 256)
    return tuple(t for t in (tile, tile // 2) if t >= 16)


def config_space(M: int, N: int, K: int, quick: bool = False) -> list[TileLangConfig]:
    """Configs the tuner times for (M, N, K), each valid there (:func:`shape_error`). Measured on the H100
    (8 weights of 16-131 MB, M 1-4096): swapped types win up to M = 64-128 (split-K where N / 64 tiles leave SMs
    idle), the warp-specialised ``ws`` from 128 up."""
    kb = K // SCALE_BLOCK if K % SCALE_BLOCK == 0 else 0
    out: list[TileLangConfig] = []

    def add(*args, **kw) -> None:
        try:
            cfg = TileLangConfig(*args, **kw)
        except ValueError:  # e.g. 128x128 tiles in 8 stages overflow shared memory: not a candidate
            return
        if shape_error(cfg, M, N, K) is None:
            out.append(cfg)

    if M <= 256:
        for bn in _token_tiles(M)[:1] if quick else _token_tiles(M):
            for st in (8,) if quick else (4, 8):
                for bm in (64,) if quick else (64, 128):
                    add("swapAB", bm, bn, num_stages=st)
            if M <= 64:
                # four scale groups a stage: 512 contiguous bytes of each weight row a stage, 1.03-1.19x the 8-stage
                # swapAB at M 1 and 16 on 6 held-out weights (H100, decode_limits_h100/wide.csv)
                for bk, st in ((512, 3),) if quick else ((512, 3), (512, 4), (256, 4), (256, 6)):
                    add("swapAB", 64, bn, block_K=bk, num_stages=st)
            for sk in (2, 4) if quick else (2, 4, 8):
                if kb and kb % sk == 0:
                    for st in (4,) if quick else (4, 8):
                        add("splitK_swapAB", 64, bn, num_stages=st, split_k=sk)
    if M >= 64:
        # ws: 1.0-1.8x base-BM128_BN128_T256 at M 128-4096 on 8 weights (H100, docs/exploration.md), so base is
        # no longer timed there; 64-wide weight tiles win where 128-wide ones leave SMs idle (M <= 256).
        add("ws", 128, 64, num_stages=4, threads=384)
        add("ws", 128, 128, num_stages=4, threads=384)
        if 128 < M <= 192:
            # one 192-token tile where 128-token ones take two, each mostly padding: at M = 136 ws-BM192_BN96 ran
            # 54.8 us against the quick-tuned row's 67.9 on (24576, 4096), 30.4 against 32.0 on (10240, 5120)
            # (H100, benchmarks/results/fp8/decode_limits_h100/ws.csv; no gain on the 6 other held-out weights)
            add("ws", 192, 96, num_stages=4, threads=512)
        if not quick:
            add("ws", 128, 128, num_stages=4, threads=384, swizzle=8)
            add("ws", 128, 192, num_stages=4, threads=384)
            add("ws", 192, 128, num_stages=4, threads=512)
    return out


# ------------------------------------------------------------------------------------------------ the builders


def _tl():
    import tilelang.language as T  # imported here: aiter_gemm imports without tilelang

    return T


def build_normal(N: int, K: int, cfg: TileLangConfig, out_dtype: str = "bfloat16", mmajor: bool = False):
    """``base`` / ``splitK``: CTA (bx, by, bz) computes tokens [by*BM, +BM) x weight rows [bx*BN, +BN) over K split
    bz. ``mmajor``: x_scale is passed transposed, (K/128, M) contiguous (the caller's M-major view)."""
    T = _tl()
    M = T.dynamic("m")
    BM, BN, BK, split = cfg.block_M, cfg.block_N, cfg.block_K, cfg.split_k
    KB = K // SCALE_BLOCK
    k_iters = KB // split
    fp8, f32 = "float8_e4m3fn", "float32"
    sa_shape = (KB, M) if mmajor else (M, KB)

    def sa_at(SA, m, k):
        return SA[k, m] if mmajor else SA[m, k]

    @T.macro
    def mainloop(A, B, SA, SB, C_acc, bx, by, bz):
        A_s = T.alloc_shared((BM, BK), fp8)
        B_s = T.alloc_shared((BN, BK), fp8)
        C_l = T.alloc_fragment((BM, BN), f32)
        Sc = T.alloc_fragment((BM,), f32)
        if cfg.a_scale_shm:
            Sx = T.alloc_shared((BM,), f32)
        T.clear(C_acc)
        for ko in T.Pipelined(k_iters, num_stages=cfg.num_stages):
            k = bz * k_iters + ko
            T.copy(A[by * BM, k * BK], A_s)
            T.copy(B[bx * BN, k * BK], B_s)
            if cfg.a_scale_shm:
                for i in T.Parallel(BM):
                    Sx[i] = sa_at(SA, by * BM + i, k)
                for i in T.Parallel(BM):
                    Sc[i] = Sx[i] * SB[bx * BN // SCALE_BLOCK, k]
            else:
                for i in T.Parallel(BM):
                    Sc[i] = sa_at(SA, by * BM + i, k) * SB[bx * BN // SCALE_BLOCK, k]
            T.gemm(A_s, B_s, C_l, transpose_B=True, clear_accum=True)
            for i, j in T.Parallel(BM, BN):
                C_acc[i, j] += C_l[i, j] * Sc[i]

    # tokens on the tile's rows: grid (N tiles, M tiles), the (BM, BN) tile stored at out[by*BM, bx*BN]
    return _kernel(T, M, N, K, cfg, out_dtype, sa_shape, mainloop, swapped=False)


def build_swapped(N: int, K: int, cfg: TileLangConfig, out_dtype: str = "bfloat16", mmajor: bool = False):
    """``swapAB`` / ``splitK_swapAB``: CTA (bx, by, bz) computes weight rows [by*BM, +BM) x tokens [bx*BN, +BN)
    (wgmma's M side holds the weight) over K split bz, and stores the tile transposed into out (M, N). A stage holds
    ``cfg.groups`` scale groups (``block_K`` K columns), multiplied and promoted one group at a time."""
    T = _tl()
    M = T.dynamic("m")
    BM, BN, BK, split, G = cfg.block_M, cfg.block_N, cfg.block_K, cfg.split_k, cfg.groups
    KB = K // SCALE_BLOCK
    k_iters = KB // (split * G)  # stages per split
    fp8, f32 = "float8_e4m3fn", "float32"
    sa_shape = (KB, M) if mmajor else (M, KB)

    def sa_at(SA, m, k):
        return SA[k, m] if mmajor else SA[m, k]

    @T.macro
    def step(W, X, SA, SB, C_l, Sc, Sx, C_acc, bx, by, k):  # one scale group: its scales, wgmma, promotion
        if cfg.b_scale_shm:
            for j in T.Parallel(BN):
                Sx[j] = sa_at(SA, bx * BN + j, k)
            for j in T.Parallel(BN):
                Sc[j] = Sx[j] * SB[by * BM // SCALE_BLOCK, k]
        else:
            for j in T.Parallel(BN):
                Sc[j] = sa_at(SA, bx * BN + j, k) * SB[by * BM // SCALE_BLOCK, k]
        T.gemm(W, X, C_l, transpose_B=True, clear_accum=True)
        for i, j in T.Parallel(BM, BN):
            C_acc[j, i] += C_l[i, j] * Sc[j]

    @T.macro
    def mainloop(A, B, SA, SB, C_acc, bx, by, bz):
        W_s = T.alloc_shared((BM, BK), fp8)
        X_s = T.alloc_shared((BN, BK), fp8)
        C_l = T.alloc_fragment((BM, BN), f32)
        Sc = T.alloc_fragment((BN,), f32)
        Sx = T.alloc_shared((BN,), f32) if cfg.b_scale_shm else None
        T.clear(C_acc)
        for ko in T.Pipelined(k_iters, num_stages=cfg.num_stages):
            k0 = (bz * k_iters + ko) * G
            T.copy(B[by * BM, k0 * SCALE_BLOCK], W_s)
            T.copy(A[bx * BN, k0 * SCALE_BLOCK], X_s)
            if G == 1:  # SGLang's kernel as it was measured (an unrolled one-step loop lowers differently)
                step(W_s, X_s, SA, SB, C_l, Sc, Sx, C_acc, bx, by, k0)
            else:
                for g in T.unroll(G):
                    sl = slice(g * SCALE_BLOCK, (g + 1) * SCALE_BLOCK)
                    step(W_s[:, sl], X_s[:, sl], SA, SB, C_l, Sc, Sx, C_acc, bx, by, k0 + g)

    # weight rows on the wgmma's M side: grid (M tiles, N tiles), the (BN, BM) tile stored at out[bx*BN, by*BM]
    return _kernel(T, M, N, K, cfg, out_dtype, sa_shape, mainloop, swapped=True)


def _kernel(T, M, N: int, K: int, cfg: TileLangConfig, out_dtype: str, sa_shape, mainloop, swapped: bool):
    """The kernel around a builder's ``mainloop``: one launch writing out (M, N), or with ``split_k`` the float32
    partials P (split, M, N) then the deterministic reduce. ``swapped``: the grid's x walks tokens and the tile is
    (tokens, weight rows), as the swapped types' mainloop accumulates it."""
    BM, BN, split = cfg.block_M, cfg.block_N, cfg.split_k
    KB = K // SCALE_BLOCK
    f32, fp8 = "float32", "float8_e4m3fn"
    regs = _math_registers(cfg.threads)
    grid = (T.ceildiv(M, BN), T.ceildiv(N, BM)) if swapped else (T.ceildiv(N, BN), T.ceildiv(M, BM))
    tile = (BN, BM) if swapped else (BM, BN)

    def corner(bx, by):  # the tile's first (token, weight row)
        return (bx * BN, by * BM) if swapped else (by * BM, bx * BN)

    @T.macro
    def prologue():
        if cfg.swizzle:
            T.use_swizzle(panel_size=cfg.swizzle)
        if regs:
            T.annotate_producer_reg_dealloc(24)
            T.annotate_consumer_reg_alloc(regs)

    if split == 1:
        @T.prim_func
        def gemm(A: T.Tensor((M, K), fp8), B: T.Tensor((N, K), fp8), C: T.Tensor((M, N), out_dtype),
                 SA: T.Tensor(sa_shape, f32), SB: T.Tensor((T.ceildiv(N, SCALE_BLOCK), KB), f32)):
            with T.Kernel(*grid, threads=cfg.threads) as (bx, by):
                C_acc = T.alloc_fragment(tile, f32)
                C_s = T.alloc_shared(tile, out_dtype)
                prologue()
                mainloop(A, B, SA, SB, C_acc, bx, by, 0)
                T.copy(C_acc, C_s)
                T.copy(C_s, C[corner(bx, by)])

        return gemm.with_attr("global_symbol", "swap_ab" if swapped else "base")  # the kernel's name in profiles

    combine = _combine_macro(T, M, N, split, out_dtype)

    @T.prim_func
    def gemm_split_k(A: T.Tensor((M, K), fp8), B: T.Tensor((N, K), fp8), C: T.Tensor((M, N), out_dtype),
                     SA: T.Tensor(sa_shape, f32), SB: T.Tensor((T.ceildiv(N, SCALE_BLOCK), KB), f32),
                     P: T.Tensor((split, M, N), f32)):
        with T.Kernel(*grid, split, threads=cfg.threads) as (bx, by, bz):
            C_acc = T.alloc_fragment(tile, f32)
            P_s = T.alloc_shared(tile, f32)
            prologue()
            mainloop(A, B, SA, SB, C_acc, bx, by, bz)
            T.copy(C_acc, P_s)
            T.copy(P_s, P[(bz, *corner(bx, by))])
        combine(P, C)

    return gemm_split_k.with_attr("global_symbol", "split_k_swap_ab" if swapped else "split_k")


def _math_registers(threads: int) -> int:
    """Registers a math thread gets with setmaxnreg: TileLang gives the producer as many warpgroups as the math
    ones; producer threads drop to 24 and the math threads take the rest of the 64K-register file (232 each at
    threads=256, where the 512-thread launch would otherwise cap every thread at 128 registers and spill the two
    128x128 float32 accumulators). 0: no reallocation (one math warpgroup has room)."""
    return 0 if threads <= 128 else min(240, (65536 // threads - 24) // 8 * 8)


def _combine_macro(T, M, N: int, split: int, out_dtype: str):
    """The split-K reduce as a macro: out[m, n] = sum over splits of P[s, m, n], in split order (deterministic)."""
    bm, bn = 16, 256

    @T.macro
    def combine(P, C):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            acc = T.alloc_fragment((bm, bn), "float32")
            part = T.alloc_fragment((bm, bn), "float32")
            T.clear(acc)
            for s in T.serial(split):
                T.copy(P[s, by * bm, bx * bn], part)
                for i, j in T.Parallel(bm, bn):
                    acc[i, j] += part[i, j]
            T.copy(acc, C[by * bm, bx * bn])

    return combine


BUILDERS = {"base": build_normal, "splitK": build_normal, "swapAB": build_swapped, "splitK_swapAB": build_swapped,
            "ws": build_ws}


def pass_configs(cfg: TileLangConfig) -> dict[str, Any]:
    """TileLang pass settings of ``cfg``'s kernel: the hand-scheduled ``ws`` kernel turns the automatic warp
    specialisation and barrier insertion off; the SGLang types use TileLang's defaults."""
    return dict(_WS_PASS_CONFIGS) if cfg.kernel_type == "ws" else {}


def build(N: int, K: int, cfg: TileLangConfig, out_dtype: torch.dtype = torch.bfloat16, mmajor: bool = False):
    """The TileLang program (a ``PrimFunc``) of ``cfg`` for a weight (N, K), M symbolic."""
    return BUILDERS[cfg.kernel_type](N, K, cfg, _OUT_TL[out_dtype], mmajor)


# ------------------------------------------------------------------------------------------------ compile, launch

#: The TileLang release these kernels were written and measured with (0.1.15 on the H100); others are tried, and
#: the tuner's correctness check drops what they get wrong.
TESTED_VERSION = "0.1.15"
TARGET = {"kind": "cuda", "arch": "sm_90a"}  # wgmma and TMA: Hopper only
_KERNELS: dict[tuple, Any] = {}
_LOCK = threading.Lock()


def unavailable_reason(device: torch.device | None = None) -> str | None:
    """Why these kernels cannot run here (None if they can): TileLang missing, no NVIDIA GPU, not sm_90."""
    try:
        import tilelang  # noqa: F401
    except ImportError as exc:
        return f"tilelang is not installed ({exc}); pip install 'aiter_gemm[tilelang]'"
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None):
        return "TileLang block-scale kernels run on NVIDIA Hopper GPUs (sm_90a); no such GPU here"
    if device is not None and device.type != "cuda":
        return f"TileLang block-scale kernels run on CUDA tensors, not {device}"
    cap = torch.cuda.get_device_capability(device)
    if cap != (9, 0):
        return f"TileLang block-scale kernels are built for sm_90a (wgmma, TMA); this GPU is sm_{cap[0]}{cap[1]}"
    return None


def _key(N: int, K: int, cfg: TileLangConfig, dtype: torch.dtype, mmajor: bool) -> tuple:
    return (N, K, cfg, dtype, mmajor)


def compiled(N: int, K: int, cfg: TileLangConfig, dtype: torch.dtype = torch.bfloat16, mmajor: bool = False):
    """The compiled kernel of ``cfg`` for a weight (N, K): from this process's map, else TileLang's disk cache
    (``TILELANG_CACHE_DIR``, default ``~/.tilelang/cache``: ~0.04 s on the H100), else nvcc (3-4 s)."""
    key = _key(N, K, cfg, dtype, mmajor)
    kernel = _KERNELS.get(key)
    if kernel is None:
        import tilelang

        with _LOCK:
            kernel = _KERNELS.get(key)
            if kernel is None:
                kernel = _KERNELS[key] = tilelang.compile(build(N, K, cfg, dtype, mmajor), target=TARGET,
                                                          pass_configs=pass_configs(cfg))
    return kernel


def precompile(jobs: list[tuple[int, int, TileLangConfig, torch.dtype]], workers: int | None = None
               ) -> dict[tuple[int, int, TileLangConfig, torch.dtype], str]:
    """Compile (N, K, config, out dtype) jobs, both x_scale layouts each, in parallel (TileLang's thread pool runs
    one nvcc process per worker; default: every CPU), into this process and TileLang's disk cache, so later
    :func:`compiled` calls (here or in a tuner worker, or after a restart) load in milliseconds. Returns the jobs
    that failed to build, with why."""
    import tilelang

    todo = [(N, K, cfg, dt, mm) for N, K, cfg, dt in dict.fromkeys(jobs) for mm in (False, True)
            if _key(N, K, cfg, dt, mm) not in _KERNELS]
    failed: dict[tuple[int, int, TileLangConfig, torch.dtype], str] = {}
    funcs, built = [], []
    for N, K, cfg, dt, mm in todo:
        try:
            funcs.append(build(N, K, cfg, dt, mm))
            built.append((N, K, cfg, dt, mm))
        except Exception as exc:  # noqa: BLE001 - a config TileLang cannot lower is a failed job, not a crash
            failed[(N, K, cfg, dt)] = f"{type(exc).__name__}: {exc}"
    for ws in (False, True):  # one parallel compile per pass setting
        group = [(job, f) for job, f in zip(built, funcs) if (job[2].kernel_type == "ws") == ws]
        if not group:
            continue
        kernels = tilelang.par_compile([f for _, f in group], target=TARGET, num_workers=workers or os.cpu_count() or 1,
                                       ignore_error=True, pass_configs=pass_configs(group[0][0][2]))
        for (job, _), kernel in zip(group, kernels):
            if kernel is None:
                failed.setdefault(job[:4], "TileLang failed to compile it (its log names the error)")
            else:
                _KERNELS[_key(*job)] = kernel
    return failed


def launcher(N: int, K: int, cfg: TileLangConfig, dtype: torch.dtype = torch.bfloat16
             ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]:
    """The runner of ``cfg`` on a weight (N, K) -> ``dtype`` (what the backend's ``prepare`` returns): both kernels
    (row-major and M-major x_scale) compiled here; per call only the layout test, the output (and split-K partials)
    allocated, and the launch (36 us per eager call on the H100 host, the op's torch rows 51 with x_scale row-major)."""
    k_rows = compiled(N, K, cfg, dtype, False)
    k_cols = compiled(N, K, cfg, dtype, True)
    split = cfg.split_k

    def run(XQ, WQ, x_scale, w_scale, _dtype=dtype):
        M = XQ.shape[0]
        if x_scale.is_contiguous():
            kernel, sa = k_rows, x_scale
        elif x_scale.t().is_contiguous():  # M-major: strides (1, M)
            kernel, sa = k_cols, x_scale.t()
        else:
            kernel, sa = k_rows, x_scale.contiguous()
        a = XQ if XQ.is_contiguous() else XQ.contiguous()
        b = WQ if WQ.is_contiguous() else WQ.contiguous()
        sb = w_scale if w_scale.is_contiguous() else w_scale.contiguous()
        out = torch.empty((M, N), dtype=dtype, device=XQ.device)
        if split > 1:
            kernel(a, b, out, sa, sb, torch.empty((split, M, N), dtype=torch.float32, device=XQ.device))
        else:
            kernel(a, b, out, sa, sb)
        return out

    return run


# ------------------------------------------------------------------------------------------------ reference


def gemm_a8w8_blockscale_tilelang_ref(XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor,
                                      w_scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """float32 reference with the kernels' rounding order: per 128-wide K block, the fp8 products summed in float32,
    times that block's scales, accumulated in float32."""
    M, K = XQ.shape
    N = WQ.shape[0]
    acc = torch.zeros((M, N), dtype=torch.float32, device=XQ.device)
    ws = w_scale.float().repeat_interleave(SCALE_BLOCK, dim=0)[:N]
    for kb in range(K // SCALE_BLOCK):
        ks = slice(kb * SCALE_BLOCK, (kb + 1) * SCALE_BLOCK)
        part = XQ[:, ks].float() @ WQ[:, ks].float().t()
        acc += part * x_scale[:, kb:kb + 1].float() * ws[:, kb][None, :]
    return acc.to(dtype)
