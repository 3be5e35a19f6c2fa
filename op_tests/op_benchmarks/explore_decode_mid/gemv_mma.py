"""Exploration (issue 14, M 17-256): the ``gemv`` kernel's structure with tensor-core products.

Why: on the H100 the M = 1 ``gemv`` kernel (CUDA-core products, many small programs resident per SM, the weight
loaded straight into registers, N and K compiled in) streams a weight at 0.8-1.0 of the copy bandwidth, while every
tensor-core kernel measured at M 17-256 -- cuBLAS, the Triton GEMM, the TMA decode family beside this file with
every tile, depth and split tried (``results/explore_decode_mid_h100/wide``) -- sits at 0.55-0.8 on the small weights
((1280, 8192), (8192, 1024), (4096, 4096)). Nsight Compute (``results/decode_diag``): those kernels run one program
of one warpgroup per SM, their warps waiting on the TMA barriers; the gemv runs ~10 programs per SM.

This kernel keeps the gemv's shape -- a grid of ``N / BLOCK_SIZE_N`` slabs (times a K split), N, K and M constexpr,
weight loads ``evict_first`` straight from global memory, rows past N / M re-read a valid row so loads stay
unmasked -- and computes each slab's ``[BLOCK_SIZE_N, BLOCK_SIZE_M]`` product with ``tl.dot`` on the weight tile
and the activation tile (weight rows on the MMA's M side: 16 rows per mma.sync at 1-2 warps, 64 per wgmma at 4).
The split-K reduction is the in-kernel fix-up of ``gemm_decode`` (the last split of a slab to arrive sums the
float32 partials in split order).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from aiter_gemm.kernels.common import INTERPRET
from op_tests.op_benchmarks.explore_decode_mid.gemm_decode import _counters


@dataclass(frozen=True)
class GemvMmaConfig:
    BLOCK_SIZE_M: int = 32
    BLOCK_SIZE_N: int = 32
    BLOCK_SIZE_K: int = 256
    NUM_KSPLIT: int = 1
    num_warps: int = 4
    num_stages: int = 1

    @property
    def name(self) -> str:
        return (f"GMMA_BM{self.BLOCK_SIZE_M}_BN{self.BLOCK_SIZE_N}_BK{self.BLOCK_SIZE_K}_SK{self.NUM_KSPLIT}"
                f"_W{self.num_warps}_S{self.num_stages}")

    @classmethod
    def from_name(cls, name: str) -> GemvMmaConfig:
        m = re.fullmatch(r"GMMA_BM(\d+)_BN(\d+)_BK(\d+)_SK(\d+)_W(\d+)_S(\d+)", name.strip())
        if m is None:
            raise ValueError(f"gemv_mma kernelName {name!r} does not match GMMA_BM<m>_BN<n>_BK<k>_SK<s>_W<w>_S<st>")
        return cls(*(int(x) for x in m.groups()))


def config_error(cfg: GemvMmaConfig, M: int, N: int, K: int) -> str | None:
    """Why ``cfg`` cannot run (M, N, K), or None."""
    for v in (cfg.BLOCK_SIZE_M, cfg.BLOCK_SIZE_N, cfg.BLOCK_SIZE_K):
        if v < 16 or v & (v - 1):
            raise ValueError(f"{cfg.name}: blocks must be powers of two >= 16")
    k_tiles = triton.cdiv(K, cfg.BLOCK_SIZE_K)
    if cfg.NUM_KSPLIT > k_tiles or triton.cdiv(k_tiles, triton.cdiv(k_tiles, cfg.NUM_KSPLIT)) != cfg.NUM_KSPLIT:
        return f"{cfg.name}: split {cfg.NUM_KSPLIT} of {k_tiles} K tiles leaves one empty"
    smem = cfg.num_stages * (cfg.BLOCK_SIZE_M + cfg.BLOCK_SIZE_N) * cfg.BLOCK_SIZE_K * 2
    if cfg.num_stages > 1 and smem > 200 * 1024:
        return f"{cfg.name}: {smem} B of shared memory"
    regs = (cfg.BLOCK_SIZE_M + cfg.BLOCK_SIZE_N) * cfg.BLOCK_SIZE_K * 2 // (32 * cfg.num_warps)
    if cfg.num_stages == 1 and regs > 512:
        return f"{cfg.name}: {regs} B of tiles per thread in registers"
    return None


@triton.jit
def _gemv_mma_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, cnt_ptr,
    stride_am, stride_bn, stride_cm,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    NUM_KSPLIT: tl.constexpr, NUM_STAGES: tl.constexpr, UPCAST_DOT: tl.constexpr,
):
    """``[BLOCK_SIZE_M, BLOCK_SIZE_N]`` of C over one K split: program axis 0 = slab (M tiles fastest, so the tiles
    that share a weight slab run together), axis 1 = split."""
    K_SPLIT: tl.constexpr = (K // BLOCK_SIZE_K + (K % BLOCK_SIZE_K > 0) + NUM_KSPLIT - 1) // NUM_KSPLIT * BLOCK_SIZE_K
    EVEN_K: tl.constexpr = K_SPLIT * NUM_KSPLIT == K
    NUM_M: tl.constexpr = (M + BLOCK_SIZE_M - 1) // BLOCK_SIZE_M
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = pid % NUM_M
    pid_n = pid // NUM_M
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    rows_n = tl.minimum(offs_n, N - 1)  # past N / M: re-read a valid row, loads stay unmasked
    rows_m = tl.minimum(offs_m, M - 1)
    offs_k = pid_k * K_SPLIT + tl.arange(0, BLOCK_SIZE_K)
    b_ptrs = b_ptr + rows_n[:, None] * stride_bn + offs_k[None, :]
    a_ptrs = a_ptr + rows_m[:, None] * stride_am + offs_k[None, :]
    acc = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_M), dtype=tl.float32)
    for k in tl.range(0, K_SPLIT, BLOCK_SIZE_K, num_stages=NUM_STAGES):
        if EVEN_K:
            w = tl.load(b_ptrs + k, eviction_policy="evict_first")
            x = tl.load(a_ptrs + k, eviction_policy="evict_last")
        else:
            kmask = (offs_k + k) < K
            w = tl.load(b_ptrs + k, mask=kmask[None, :], other=0.0, eviction_policy="evict_first")
            x = tl.load(a_ptrs + k, mask=kmask[None, :], other=0.0, eviction_policy="evict_last")
        if UPCAST_DOT:
            acc = tl.dot(w.to(tl.float32), tl.trans(x.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, tl.trans(x), acc)
    out = tl.trans(acc)  # [BM, BN]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
    if NUM_KSPLIT == 1:
        tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        tile_off = offs_m[:, None] * N + offs_n[None, :]
        tl.store(ws_ptr + pid_k * M * N + tile_off, out, mask=mask)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
        if arrived == NUM_KSPLIT - 1:
            total = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
            for s in tl.static_range(NUM_KSPLIT):
                not_mine = (tile_off * 0 + s) != pid_k
                part = tl.load(ws_ptr + s * M * N + tile_off, mask=mask & not_mine, other=0.0, cache_modifier=".cg")
                total += tl.where(s == pid_k, out, part)
            tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=mask)
            tl.store(cnt_ptr + pid, 0)


def launch_gemv_mma(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, cfg: GemvMmaConfig) -> torch.Tensor:
    """``out = a @ b.T`` (a, b with unit K stride); the split workspace is allocated per call (torch.empty)."""
    M, K = a.shape
    N = b.shape[0]
    slabs = triton.cdiv(M, cfg.BLOCK_SIZE_M) * triton.cdiv(N, cfg.BLOCK_SIZE_N)
    if cfg.NUM_KSPLIT > 1:
        ws = torch.empty((cfg.NUM_KSPLIT, M, N), dtype=torch.float32, device=a.device)
        cnt = _counters(a.device, slabs)
    else:
        ws = cnt = out
    _gemv_mma_kernel[(slabs, cfg.NUM_KSPLIT)](
        a, b, out, ws, cnt, a.stride(0), b.stride(0), out.stride(0),
        M=M, N=N, K=K, BLOCK_SIZE_M=cfg.BLOCK_SIZE_M, BLOCK_SIZE_N=cfg.BLOCK_SIZE_N, BLOCK_SIZE_K=cfg.BLOCK_SIZE_K,
        NUM_KSPLIT=cfg.NUM_KSPLIT, NUM_STAGES=cfg.num_stages, UPCAST_DOT=INTERPRET,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


def grid_configs(M: int, N: int, K: int, cu: int) -> list[GemvMmaConfig]:
    """The exploration grid at (M, N, K): BN 16-64, BK 128-1024, 1-8 warps, 1-3 stages, splits that bring the
    programs to >= 1 and ~3 per SM."""
    bm = min(64, max(16, triton.next_power_of_2(M)))
    out = []
    for bn in (16, 32, 64):
        slabs = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        splits = {1}
        for target in (cu, 3 * cu):
            s = 1
            while slabs * s < target and s < 16:
                s *= 2
            splits.add(s)
        for bk in (128, 256, 512, 1024):
            for w in (2, 4, 8):
                for st in (1, 3):
                    for sk in sorted(splits):
                        c = GemvMmaConfig(bm, bn, bk, sk, w, st)
                        if bn * w > 256 or config_error(c, M, N, K) is not None:
                            continue
                        out.append(c)
    return out
