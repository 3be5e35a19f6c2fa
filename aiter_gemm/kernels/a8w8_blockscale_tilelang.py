"""FP8 block-scale GEMM kernels in TileLang: SGLang's four variants (base, swapAB, splitK, splitK_swapAB) on this
project's layouts, a builder per orientation and a float32 reference. The typed config and its rules:
:mod:`aiter_gemm.kernels.a8w8_blockscale_tilelang_config`; the ``ws`` kernel: :mod:`.a8w8_blockscale_tilelang_ws`.

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
- ``splitK*``: ``split_k`` CTAs share a tile's K range and write float32 partials that a second kernel sums;
- the swapped types' stages may hold up to 4 scale groups (``block_K`` 256/512), promoted one group at a time.

M is symbolic (``T.dynamic``): one compiled kernel per (N, K, config, out dtype, x_scale layout) serves every M.
No ``from __future__ import annotations`` here: TileLang evaluates the ``T.Tensor`` annotations of a
``@T.prim_func`` against the builder's closure, which string annotations would not see.
"""

import os
import threading
from collections.abc import Callable
from typing import Any

import torch

from aiter_gemm.dtypes import OUT_DTYPES
from aiter_gemm.kernels.a8w8_blockscale_tilelang_config import (
    HAND_SCHEDULED,
    KERNEL_TYPES,
    MAX_GROUPS,
    SGLANG_KERNEL_TYPES,
    SPLIT,
    SWAPPED,
    TileLangConfig,
    auto_ws_math_registers,
    config_name,
    config_space,
    is_config_name,
    shape_error,
)
from aiter_gemm.kernels.a8w8_blockscale_tilelang_ws import PASS_CONFIGS as _WS_PASS_CONFIGS
from aiter_gemm.kernels.a8w8_blockscale_tilelang_ws import build_ws, build_ws_swapped
from aiter_gemm.kernels.blockscale_format import SCALE_BLOCK

#: Public names, those of the configs (:mod:`aiter_gemm.kernels.a8w8_blockscale_tilelang_config`) among them: callers
#: take a config and its kernel from this one module.
__all__ = ["HAND_SCHEDULED", "KERNEL_TYPES", "MAX_GROUPS", "SCALE_BLOCK", "SGLANG_KERNEL_TYPES", "SPLIT", "SWAPPED",
           "TARGET", "TESTED_VERSION", "TileLangConfig", "build", "build_normal", "build_swapped", "compiled",
           "config_name", "config_space", "gemm_a8w8_blockscale_tilelang_ref", "is_config_name", "launcher",
           "pass_configs", "precompile", "shape_error", "unavailable_reason"]

_OUT_TL = {dtype: str(dtype).removeprefix("torch.") for dtype in OUT_DTYPES}  # TileLang's names


# ------------------------------------------------------------------------------------------------ the builders


def _tl():
    import tilelang.language as T  # imported here: aiter_gemm imports without tilelang

    return T


def _scale_step(T, cfg: TileLangConfig, sa_at):
    """The macro of one scale group, shared by both orientations: the token scales (staged in shared memory first
    with ``a_scale_shm`` / ``b_scale_shm``) times the weight block's, one wgmma of the group's fp8 tiles into a fresh
    float32 partial, and its promotion into the accumulator. ``tok0``: the tile's first token; ``wblk``: its weight
    scale block."""
    BM, BN, swapped = cfg.block_M, cfg.block_N, cfg.swapped
    tokens, staged = (BN, cfg.b_scale_shm) if swapped else (BM, cfg.a_scale_shm)

    @T.macro
    def step(X, Y, SA, SB, C_l, Sc, Sx, C_acc, tok0, wblk, k):
        if staged:
            for t in T.Parallel(tokens):
                Sx[t] = sa_at(SA, tok0 + t, k)
            for t in T.Parallel(tokens):
                Sc[t] = Sx[t] * SB[wblk, k]
        else:
            for t in T.Parallel(tokens):
                Sc[t] = sa_at(SA, tok0 + t, k) * SB[wblk, k]
        T.gemm(X, Y, C_l, transpose_B=True, clear_accum=True)
        if swapped:  # C_l holds (weight rows, tokens); the accumulator (tokens, weight rows)
            for i, j in T.Parallel(BM, BN):
                C_acc[j, i] += C_l[i, j] * Sc[j]
        else:
            for i, j in T.Parallel(BM, BN):
                C_acc[i, j] += C_l[i, j] * Sc[i]

    return step


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

    step = _scale_step(T, cfg, sa_at)

    @T.macro
    def mainloop(A, B, SA, SB, C_acc, bx, by, bz):
        A_s = T.alloc_shared((BM, BK), fp8)
        B_s = T.alloc_shared((BN, BK), fp8)
        C_l = T.alloc_fragment((BM, BN), f32)
        Sc = T.alloc_fragment((BM,), f32)
        Sx = T.alloc_shared((BM,), f32) if cfg.a_scale_shm else None
        T.clear(C_acc)
        for ko in T.Pipelined(k_iters, num_stages=cfg.num_stages):
            k = bz * k_iters + ko
            T.copy(A[by * BM, k * BK], A_s)
            T.copy(B[bx * BN, k * BK], B_s)
            step(A_s, B_s, SA, SB, C_l, Sc, Sx, C_acc, by * BM, bx * BN // SCALE_BLOCK, k)

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

    step = _scale_step(T, cfg, sa_at)

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
                step(W_s, X_s, SA, SB, C_l, Sc, Sx, C_acc, bx * BN, by * BM // SCALE_BLOCK, k0)
            else:
                for g in T.unroll(G):
                    sl = slice(g * SCALE_BLOCK, (g + 1) * SCALE_BLOCK)
                    step(W_s[:, sl], X_s[:, sl], SA, SB, C_l, Sc, Sx, C_acc, bx * BN, by * BM // SCALE_BLOCK, k0 + g)

    # weight rows on the wgmma's M side: grid (M tiles, N tiles), the (BN, BM) tile stored at out[bx*BN, by*BM]
    return _kernel(T, M, N, K, cfg, out_dtype, sa_shape, mainloop, swapped=True)


def _kernel(T, M, N: int, K: int, cfg: TileLangConfig, out_dtype: str, sa_shape, mainloop, swapped: bool):
    """The kernel around a builder's ``mainloop``: one launch writing out (M, N), or with ``split_k`` the float32
    partials P (split, M, N) then the deterministic reduce. ``swapped``: the grid's x walks tokens and the tile is
    (tokens, weight rows), as the swapped types' mainloop accumulates it."""
    BM, BN, split = cfg.block_M, cfg.block_N, cfg.split_k
    KB = K // SCALE_BLOCK
    f32, fp8 = "float32", "float8_e4m3fn"
    regs = auto_ws_math_registers(cfg.threads)
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
            "ws": build_ws, "ws_swapAB": build_ws_swapped}


def pass_configs(cfg: TileLangConfig) -> dict[str, Any]:
    """TileLang pass settings of ``cfg``'s kernel: the hand-scheduled types (``ws``, ``ws_swapAB``) turn the automatic
    warp specialisation and barrier insertion off; the SGLang types use TileLang's defaults."""
    return dict(_WS_PASS_CONFIGS) if cfg.kernel_type in HAND_SCHEDULED else {}


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
        group = [(job, f) for job, f in zip(built, funcs) if (job[2].kernel_type in HAND_SCHEDULED) == ws]
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
