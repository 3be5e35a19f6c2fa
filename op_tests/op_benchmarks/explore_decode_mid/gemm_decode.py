"""Batched-decode GEMM ``C = A @ B.T (+ bias)`` for M = 17..256 on Hopper: stream the weight once, fill every SM.

Why a separate kernel family
============================

At M = 17..256 tokens a linear layer's weight ``B`` (N, K) is almost all of the bytes: Llama-3.1-8B's gate_up
(N = 28672, K = 4096) reads 235 MB of weight against 0.1-2 MB of activation ``A`` (M, K). On an H100 (132 SMs,
~3.0 TB/s copy bandwidth, ~790 TFLOP/s bf16, ridge ~260 FLOP/byte) the arithmetic intensity is about M FLOP/byte, so
M <= 128 is bound by HBM and M = 256 sits on the ridge. The floor is ``(M*K + N*K + M*N) * 2 bytes / 3.0 TB/s``;
cuBLAS (``F.linear``) reaches 0.5-0.94 of it here (BENCHMARKS.md, issue 6 table: 0.61 at (4096, 14336) M = 256),
part of which is the ~2.5 us every kernel in a CUDA graph pays (on a 16.8 MB weight that alone caps it at ~0.7).
What a kernel must do to get closer:

1. **Keep enough bytes in flight.** Little's law: 3.0 TB/s x ~1.5 us of HBM latency ~ 4.5 MB outstanding across
   the chip, ~35 KB per SM. A TMA (bulk tensor copy) pipeline of ``num_stages`` = 3-8 buffers of a
   ``BLOCK_SIZE_N x BLOCK_SIZE_K`` weight tile (8-32 KB each) keeps that many bytes requested with one instruction
   per tile and no register staging; the pointer-load path (cp.async) serves misaligned operands and the CPU
   interpreter (on the H100 it was within 2% of TMA on average, 0.76-1.10x per config).
2. **Give every SM work.** Many small programs: 16x64 (swapped) tiles at M <= 32, 64x64 at M <= 128, 64x128 at
   M = 256 beat larger tiles on the H100 even where they re-read the weight from L2 (a second M-tile reads the weight
   block its neighbour just brought into L2: ``pid_m`` runs fastest). Where N / BLOCK_SIZE_N tiles are still too few
   (N = 1280: 20-80 tiles) K is split (``NUM_KSPLIT``), bounded so the float32 partials (8 bytes per output element
   per split) stay under 30% of the weight bytes.
3. **Pay little fixed cost.** A decode GEMM of 17-60 MB lasts 6-40 us, and each kernel in a CUDA graph costs
   ~2.5 us of launch, ramp and tail (BENCHMARKS.md, skinny section). The split-K reduction comes in two forms: the
   two-pass one (float32 partials, then :func:`_splitk_reduce_kernel`) and an in-kernel *fix-up*
   (``REDUCE="FX"``, one launch): every split stores its float32 partial, bumps a per-tile arrival counter
   (``atomic_add``, acq_rel, GPU scope, after a CTA barrier: the CUTLASS split-K semaphore pattern), and the last
   split to arrive sums all partials **in split order** (so the result does not depend on arrival order and equals
   the two-pass result bit for bit), adds the bias, casts and resets the counter. The last program sums alone, so the
   fix-up pays only for small partial tiles (H100: up to 18% faster below 8 KB of partials, 8-10% slower above
   40 KB).
4. **Stream-K** (:func:`_gemm_decode_streamk_kernel`) deals the (tile, k-step) iterations out evenly to one
   persistent program per SM. It is correct and deterministic, but on the H100 it lost to split-K on every shape
   measured (1.02-1.96x slower than the best config): each program restarts its pipelined K loop per tile piece and
   the pieces are summed by one program. It is kept addressable by name, not searched.

Kernels
=======

* :func:`_gemm_decode_kernel` -- grid ``(tiles, NUM_KSPLIT)``; one output tile over one K slice per program.
  ``SWAP_AB`` computes the tile as ``B_tile @ A_tile.T`` so the MMA's M dimension (64 per Hopper warpgroup) is the
  weight's N and the token count is the MMA's N (16/32/...): wgmma-shaped tiles even for BLOCK_SIZE_M = 16/32.
* :func:`_gemm_decode_streamk_kernel` -- ``STREAM_K x num_sms`` persistent programs, each owning a contiguous run of
  ``iters_per_prog`` (tile, k-step) iterations; a tile split between programs is finished by the last one to arrive,
  summing the pieces in program order (deterministic), as in the fix-up above.
* :func:`_splitk_reduce_kernel` -- the second pass of the two-pass split-K.

A and B can each arrive as a TMA tensor descriptor (``triton.tools.tensor_descriptor.TensorDescriptor``, built on the
host: Triton >= 3.4; out-of-bounds boxes are zero-filled, so M = 17 or N = 1000 need no masks) or as a pointer (rows
past M/N re-read valid rows via ``% M``, stores are masked, the K tail is masked). TMA needs 16-byte aligned base
pointers and row strides and a unit K stride; the launcher picks per operand (a column slice of a wider activation
usually qualifies; one that starts at an odd element offset does not and falls back to pointer loads).

Under ``TRITON_INTERPRET=1`` (CPU tests) ``tl.dot`` operands are upcast to float32 (Triton 3.9's interpreter returns
garbage for a bf16 ``tl.dot``); the interpreter also emulates TMA descriptors, so the CPU tests run both paths.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

try:  # host-side TMA descriptors: Triton >= 3.4 (the GPU machine has 3.6, CI 3.9)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: only the pointer path exists
    TensorDescriptor = None

# Read once at import: kernels are specialised on it, and launchers must not read the environment per call.
INTERPRET: bool = os.environ.get("TRITON_INTERPRET") == "1"

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
SUPPORTED_OTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Reduction modes of the kernel epilogue (constexpr REDUCE of _gemm_decode_kernel).
_RED_STORE, _RED_PARTIALS, _RED_FIXUP = 0, 1, 2
# Elements per program of the two-pass reduce kernel (4 KiB of float32 per split per program).
_REDUCE_BLOCK = 1024

# Shared memory one block may use (bytes), by arch: Hopper 227 KiB, A100 163 KiB, Ada 99 KiB; the interpreter has no
# limit. Unknown GPUs get the conservative 99 KiB.
SMEM_PER_BLOCK: dict[str, int] = {"sm_90": 227 * 1024, "sm_100": 227 * 1024, "sm_80": 163 * 1024,
                                  "sm_86": 99 * 1024, "sm_89": 99 * 1024, "cpu": 1 << 30}
_DEFAULT_SMEM = 99 * 1024
# Shared memory the compiler adds beyond the pipeline buffers (mbarriers, the epilogue's layout conversion when it
# cannot reuse the buffers): a margin, so configs at the edge are not offered only to fail at compile time.
_SMEM_MARGIN = 2 * 1024


# ------------------------------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DecodeConfig:
    """One point of the decode kernel family; :attr:`name` is its CSV ``kernelName`` spelling.

    ``NUM_KSPLIT`` > 1 splits K over a second grid axis, reduced two-pass (``REDUCE="2P"``) or by the in-kernel
    fix-up (``"FX"``); ``STREAM_K`` = p > 0 selects the persistent stream-K kernel with ``p * num_sms`` programs
    (then ``NUM_KSPLIT`` must be 1); ``SWAP_AB`` computes tiles as ``B @ A.T``; ``TMA`` loads operands through tensor
    descriptors where they qualify (16-byte aligned), else through pointers."""

    BLOCK_SIZE_M: int = 64
    BLOCK_SIZE_N: int = 128
    BLOCK_SIZE_K: int = 128
    NUM_KSPLIT: int = 1
    num_warps: int = 4
    num_stages: int = 4
    SWAP_AB: bool = False
    REDUCE: str = "2P"
    STREAM_K: int = 0
    TMA: bool = False
    B_TILED: bool = False

    def __post_init__(self) -> None:
        for field in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
            v = getattr(self, field)
            if v < 16 or v > 256 or v & (v - 1):  # tl.dot needs >= 16; TMA boxes are <= 256 per dimension
                raise ValueError(f"{field}={v} must be a power of two in 16..256")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps={self.num_warps} must be one of 1, 2, 4, 8, 16")
        if self.NUM_KSPLIT < 1 or self.num_stages < 1 or not 0 <= self.STREAM_K <= 8:
            raise ValueError(f"NUM_KSPLIT, num_stages must be >= 1 and STREAM_K in 0..8 in {self!r}")
        if self.REDUCE not in ("2P", "FX"):
            raise ValueError(f"REDUCE={self.REDUCE!r} must be '2P' (two-pass) or 'FX' (in-kernel fix-up)")
        if self.STREAM_K and self.NUM_KSPLIT != 1:
            raise ValueError("stream-K balances K itself: NUM_KSPLIT must be 1 with STREAM_K")
        if self.NUM_KSPLIT == 1 and self.REDUCE != "2P":
            # Nothing to reduce: normalise, so that equal kernels have equal configs and names round-trip.
            object.__setattr__(self, "REDUCE", "2P")

    @property
    def name(self) -> str:
        s = (f"BM{self.BLOCK_SIZE_M}_BN{self.BLOCK_SIZE_N}_BK{self.BLOCK_SIZE_K}_SK{self.NUM_KSPLIT}"
             f"_W{self.num_warps}_S{self.num_stages}")
        if self.SWAP_AB:
            s += "_SW"
        if self.REDUCE == "FX":
            s += "_FX"
        if self.STREAM_K:
            s += f"_STK{self.STREAM_K}"
        if self.TMA:
            s += "_TMA"
        if self.B_TILED:
            s += "_BT"
        return s

    @classmethod
    def from_name(cls, name: str) -> DecodeConfig:
        """Parse ``BM64_BN128_BK128_SK4_W4_S4[_SW][_FX][_STK<p>][_TMA][_BT]`` (the :attr:`name` spelling)."""
        m = _NAME_RE.fullmatch(name.strip())
        if m is None:
            raise ValueError(f"decode kernelName {name!r} does not match "
                             "'BM<m>_BN<n>_BK<k>_SK<s>_W<w>_S<st>[_SW][_FX][_STK<p>][_TMA][_BT]' "
                             "(e.g. 'BM64_BN128_BK128_SK4_W4_S4_TMA')")
        bm, bn, bk, sk, w, st, sw, fx, stk, tma, bt = m.groups()
        return cls(int(bm), int(bn), int(bk), int(sk), int(w), int(st), sw is not None, "FX" if fx else "2P",
                   int(stk) if stk else 0, tma is not None, bt is not None)

    def smem_bytes(self, itemsize: int = 2) -> int:
        """Shared memory of the software pipeline: ``num_stages`` buffers of an A and a B tile."""
        return self.num_stages * (self.BLOCK_SIZE_M + self.BLOCK_SIZE_N) * self.BLOCK_SIZE_K * itemsize

    def acc_regs_per_thread(self) -> int:
        """Float32 accumulator registers per thread (<= 128 leaves room for addresses and the epilogue)."""
        return self.BLOCK_SIZE_M * self.BLOCK_SIZE_N // (32 * self.num_warps)


_NAME_RE = re.compile(r"BM(\d+)_BN(\d+)_BK(\d+)_SK(\d+)_W(\d+)_S(\d+)(_SW)?(_FX)?(?:_STK(\d+))?(_TMA)?(_BT)?")


# ------------------------------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------------------------------

@triton.jit
def _mainloop(a_src, b_src, off_m, off_n, kt_begin, kt_end, M, N, K,
              stride_am, stride_ak, stride_bn, stride_bk,
              BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
              SWAP_AB: tl.constexpr, A_TMA: tl.constexpr, B_TMA: tl.constexpr, EVEN_K: tl.constexpr,
              UPCAST_DOT: tl.constexpr, B_TILED: tl.constexpr = False):
    """Accumulate K tiles ``[kt_begin, kt_end)`` of the (off_m, off_n) output tile in float32.

    Returns ``[BLOCK_SIZE_N, BLOCK_SIZE_M]`` when ``SWAP_AB`` (weight rows on the MMA's M side), else
    ``[BLOCK_SIZE_M, BLOCK_SIZE_N]``. The loop is software-pipelined by the kernel's ``num_stages``.
    ``B_TILED``: the weight is stored tile-major (:func:`tile_weight`), each ``[BLOCK_SIZE_N, BLOCK_SIZE_K]`` tile
    contiguous, tiles of one row block consecutive along K; N and K are multiples of the tile."""
    if SWAP_AB:
        acc = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    k0 = kt_begin * BLOCK_SIZE_K
    if not A_TMA:
        # Rows past M re-read valid rows (stores are masked): loads stay unmasked along M.
        offs_am = (off_m + tl.arange(0, BLOCK_SIZE_M)) % M
        a_ptrs = a_src + offs_am[:, None] * stride_am + (k0 + offs_k)[None, :] * stride_ak
    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    if B_TILED:
        # Tile (off_n / BN, kt) starts at element (off_n * k_tiles + kt * BN) * BK; rows of BK inside a tile.
        tile_row0 = off_n * k_tiles + kt_begin * BLOCK_SIZE_N
        if not B_TMA:
            offs_r = tl.arange(0, BLOCK_SIZE_N)
            b_ptrs = b_src + (tile_row0 + offs_r)[:, None] * BLOCK_SIZE_K + offs_k[None, :]
    elif not B_TMA:
        offs_bn = (off_n + tl.arange(0, BLOCK_SIZE_N)) % N
        b_ptrs = b_src + offs_bn[:, None] * stride_bn + (k0 + offs_k)[None, :] * stride_bk
    for kt in range(kt_begin, kt_end):
        k = kt * BLOCK_SIZE_K
        if A_TMA:
            a = a_src.load([off_m, k])  # out-of-bounds rows / K tail arrive as zeros
        elif EVEN_K:
            a = tl.load(a_ptrs)
        else:
            a = tl.load(a_ptrs, mask=(k + offs_k)[None, :] < K, other=0.0)
        if B_TILED and B_TMA:
            b = b_src.load([tile_row0 + (kt - kt_begin) * BLOCK_SIZE_N, 0])
        elif B_TMA:
            b = b_src.load([off_n, k])
        elif EVEN_K or B_TILED:
            b = tl.load(b_ptrs)
        else:
            b = tl.load(b_ptrs, mask=(k + offs_k)[None, :] < K, other=0.0)
        if UPCAST_DOT:  # the interpreter's bf16 dot is wrong: exact float32 products of the 16-bit values
            if SWAP_AB:
                acc = tl.dot(b.to(tl.float32), tl.trans(a.to(tl.float32)), acc, input_precision="ieee")
            else:
                acc = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), acc, input_precision="ieee")
        else:
            if SWAP_AB:
                acc = tl.dot(b, tl.trans(a), acc)
            else:
                acc = tl.dot(a, tl.trans(b), acc)
        if not A_TMA:
            a_ptrs += BLOCK_SIZE_K * stride_ak
        if B_TILED and not B_TMA:
            b_ptrs += BLOCK_SIZE_N * BLOCK_SIZE_K
        elif not B_TMA:
            b_ptrs += BLOCK_SIZE_K * stride_bk
    return acc


@triton.jit
def _store_output(acc, bias_ptr, c_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn, HAS_BIAS: tl.constexpr):
    """Add the bias (float32) and store the ``[BM, BN]`` float32 tile in C's dtype, masked to M x N."""
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _gemm_decode_kernel(
    a_src, b_src, bias_ptr, c_ptr, ws_ptr, cnt_ptr,
    M, N, K,
    stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
    k_tiles_per_split, num_ksplit,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    SWAP_AB: tl.constexpr, A_TMA: tl.constexpr, B_TMA: tl.constexpr,
    REDUCE: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, UPCAST_DOT: tl.constexpr,
    B_TILED: tl.constexpr = False,
):
    """One ``BLOCK_SIZE_M x BLOCK_SIZE_N`` tile of C over one K split (grid: tiles x num_ksplit).

    ``a_src``/``b_src`` are TMA descriptors when ``A_TMA``/``B_TMA``, else pointers. ``REDUCE``: 0 store C (no
    split), 1 store float32 partials to ``ws`` (S, M, N) for the reduce kernel, 2 the same then fix-up in place:
    the last split of a tile to arrive (per-tile counter ``cnt``) sums the S partials in split order into C.
    The split count is a run-time argument, so one compiled kernel serves every split factor."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    # pid_m fastest: the M-tiles sharing a weight column block run together, so the weight is read from HBM once.
    pid_m = pid % num_pid_m
    pid_n = pid // num_pid_m
    off_m = pid_m * BLOCK_SIZE_M
    off_n = pid_n * BLOCK_SIZE_N
    # Each split owns whole BLOCK_SIZE_K tiles (only the last can hold the ragged K tail; TMA boxes never cross
    # into the next split's K range). The launcher guarantees no split is empty.
    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    kt_begin = pid_k * k_tiles_per_split
    kt_end = tl.minimum(kt_begin + k_tiles_per_split, k_tiles)
    acc = _mainloop(a_src, b_src, off_m, off_n, kt_begin, kt_end, M, N, K,
                    stride_am, stride_ak, stride_bn, stride_bk,
                    BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, SWAP_AB, A_TMA, B_TMA, EVEN_K, UPCAST_DOT, B_TILED)
    if SWAP_AB:
        acc = tl.trans(acc)  # [BM, BN]; the epilogue is shared
    offs_m = off_m + tl.arange(0, BLOCK_SIZE_M)
    offs_n = off_n + tl.arange(0, BLOCK_SIZE_N)
    if REDUCE == 0:
        _store_output(acc, bias_ptr, c_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn, HAS_BIAS)
    else:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tile_off = offs_m[:, None] * N + offs_n[None, :]
        tl.store(ws_ptr + pid_k * M * N + tile_off, acc, mask=mask)
        if REDUCE == 2:
            # Release: every thread's partial is stored before one thread bumps the counter (acq_rel, GPU scope);
            # the barrier orders the other threads' stores before it (the CUTLASS split-K semaphore pattern).
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
            if arrived == num_ksplit - 1:
                # Last to arrive: every other split's partial is visible (acquire). Sum in split order, so the
                # result is independent of arrival order and equals the two-pass reduction bit for bit.
                total = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
                for s in range(num_ksplit):
                    # .cg: from L2, never a stale L1 line. This program's own partial comes from its registers
                    # (the same float32 values it stored, so the order and the bits are unchanged).
                    # (the split test is broadcast first: the 3.9 interpreter rejects scalar & block masks)
                    not_mine = (tile_off * 0 + s) != pid_k
                    part = tl.load(ws_ptr + s * M * N + tile_off, mask=mask & not_mine, other=0.0,
                                   cache_modifier=".cg")
                    total += tl.where(s == pid_k, acc, part)
                _store_output(total, bias_ptr, c_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn, HAS_BIAS)
                tl.store(cnt_ptr + pid, 0)  # ready for the next launch (stream order makes it visible)


@triton.jit
def _gemm_decode_streamk_kernel(
    a_src, b_src, bias_ptr, c_ptr, ws_ptr, cnt_ptr,
    M, N, K,
    stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
    iters_per_prog,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    SWAP_AB: tl.constexpr, A_TMA: tl.constexpr, B_TMA: tl.constexpr,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, UPCAST_DOT: tl.constexpr,
):
    """Persistent stream-K: program p owns iterations ``[p*ipp, (p+1)*ipp)`` of the tile-major (tile, k-step) space.

    A tile a program covers whole is stored directly. A tile split between programs gets float32 pieces in ``ws``
    (two slots per program: slot 0 for the piece in its first tile, slot 1 for the piece in its last); the last
    contributor to arrive (per-tile counter) sums the pieces in program order -- deterministic -- adds the bias,
    stores C and resets the counter."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_tiles = num_pid_m * tl.cdiv(N, BLOCK_SIZE_N)
    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    it = pid * iters_per_prog
    it_end = tl.minimum(it + iters_per_prog, num_tiles * k_tiles)
    first_tile = it // k_tiles
    while it < it_end:
        tile = it // k_tiles
        kt_begin = it - tile * k_tiles
        kt_end = tl.minimum(k_tiles, it_end - tile * k_tiles)
        pid_m = tile % num_pid_m
        pid_n = tile // num_pid_m
        off_m = pid_m * BLOCK_SIZE_M
        off_n = pid_n * BLOCK_SIZE_N
        acc = _mainloop(a_src, b_src, off_m, off_n, kt_begin, kt_end, M, N, K,
                        stride_am, stride_ak, stride_bn, stride_bk,
                        BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, SWAP_AB, A_TMA, B_TMA, EVEN_K, UPCAST_DOT)
        if SWAP_AB:
            acc = tl.trans(acc)
        offs_m = off_m + tl.arange(0, BLOCK_SIZE_M)
        offs_n = off_n + tl.arange(0, BLOCK_SIZE_N)
        if (kt_begin == 0) & (kt_end == k_tiles):
            _store_output(acc, bias_ptr, c_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn, HAS_BIAS)
        else:
            offs_t = tl.arange(0, BLOCK_SIZE_M)[:, None] * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)[None, :]
            slot = pid * 2 + (tile != first_tile).to(tl.int32)
            tl.store(ws_ptr + slot * (BLOCK_SIZE_M * BLOCK_SIZE_N) + offs_t, acc)
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            p_first = (tile * k_tiles) // iters_per_prog
            p_last = ((tile + 1) * k_tiles - 1) // iters_per_prog
            if arrived == p_last - p_first:
                total = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
                for p in range(p_first, p_last + 1):
                    p_slot = p * 2 + (tile != (p * iters_per_prog) // k_tiles).to(tl.int32)
                    total += tl.load(ws_ptr + p_slot * (BLOCK_SIZE_M * BLOCK_SIZE_N) + offs_t,
                                     cache_modifier=".cg")
                _store_output(total, bias_ptr, c_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn, HAS_BIAS)
                tl.store(cnt_ptr + tile, 0)
        it = tile * k_tiles + kt_end


@triton.jit
def _splitk_reduce_kernel(ws_ptr, bias_ptr, c_ptr, M, N, stride_cm, stride_cn, num_ksplit,
                          HAS_BIAS: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Second pass of the two-pass split-K: sum the (S, M, N) float32 partials in split order (deterministic), add
    the bias, cast to C's dtype."""
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < M * N
    acc = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)
    for s in range(num_ksplit):
        acc += tl.load(ws_ptr + s * M * N + offs, mask=mask, other=0.0)
    m = offs // N
    n = offs - m * N
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=mask, other=0.0).to(tl.float32)
    tl.store(c_ptr + m * stride_cm + n * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------------------------------

def _is_tma_arch(arch: str) -> bool:
    """TMA exists on NVIDIA sm_90+; the interpreter (arch ``cpu``) emulates descriptors."""
    if arch == "cpu":
        return TensorDescriptor is not None
    if not arch.startswith("sm_"):
        return False
    digits = "".join(ch for ch in arch[3:] if ch.isdigit())
    return TensorDescriptor is not None and bool(digits) and int(digits) >= 90


def _tma_device_ok(t: torch.Tensor) -> bool:
    """Descriptors can be used on ``t``'s device: the interpreter, or a CUDA (not ROCm) GPU of sm_90+."""
    if TensorDescriptor is None:
        return False
    if INTERPRET:
        return True
    return t.is_cuda and torch.version.hip is None and torch.cuda.get_device_capability(t.device)[0] >= 9


def tma_operand_ok(t: torch.Tensor) -> bool:
    """cuTensorMapEncodeTiled's rules for a 2-D (rows, K) operand: unit K stride, 16-byte aligned base and row
    stride (a column slice at a multiple of 8 bf16 elements qualifies)."""
    es = t.element_size()
    return (t.dim() == 2 and t.stride(1) == 1 and (t.stride(0) * es) % 16 == 0 and t.data_ptr() % 16 == 0
            and t.shape[0] > 0 and t.shape[1] > 0)


def split_plan(K: int, block_k: int, num_ksplit: int) -> tuple[int, int]:
    """(k_tiles, k_tiles_per_split) of ``num_ksplit`` splits of whole ``block_k`` tiles."""
    k_tiles = triton.cdiv(K, block_k)
    return k_tiles, triton.cdiv(k_tiles, num_ksplit)


def streamk_plan(M: int, N: int, K: int, cfg: DecodeConfig, num_sms: int) -> tuple[int, int]:
    """(programs, iters_per_prog) of the stream-K kernel: ``STREAM_K * num_sms`` programs at most, each with the same
    number of (tile, k-step) iterations (the last may have fewer; none has zero)."""
    tiles = triton.cdiv(M, cfg.BLOCK_SIZE_M) * triton.cdiv(N, cfg.BLOCK_SIZE_N)
    total = tiles * triton.cdiv(K, cfg.BLOCK_SIZE_K)
    progs = max(1, min(cfg.STREAM_K * max(num_sms, 1), total))
    ipp = triton.cdiv(total, progs)
    return triton.cdiv(total, ipp), ipp


# Per-(device, stream) arrival counters of the fix-up and stream-K reductions (int32, zero between launches: the last
# arrival of a tile resets its counter). Keyed by stream so that such kernels running concurrently on different
# streams never share counters (two graphs replayed concurrently on different streams that captured the same stream's
# buffer would: capture each on its own stream). Every buffer ever handed out stays referenced (_ALL_COUNTERS), so a
# CUDA graph that captured an older, smaller one keeps a valid address.
_COUNTERS: dict[tuple[str, int], torch.Tensor] = {}
_ALL_COUNTERS: list[torch.Tensor] = []


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """A zeroed int32 buffer of at least ``n`` counters for the current stream of ``device``.

    The first call per stream (and one needing more counters) allocates with ``torch.zeros``. During CUDA-graph
    capture a missing buffer is allocated uncached instead (its memset is captured with the kernel: correct, one
    more graph node); warming a shape up before capture, as Triton's compilation needs anyway, avoids that."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    buf = _COUNTERS.get(key)
    if buf is not None and buf.numel() >= n:
        return buf
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.zeros(n, dtype=torch.int32, device=device)
    size = max(n, 2 * buf.numel() if buf is not None else 1024)
    buf = torch.zeros(size, dtype=torch.int32, device=device)
    _COUNTERS[key] = buf
    _ALL_COUNTERS.append(buf)
    return buf


def _operand(t: torch.Tensor, rows_block: int, block_k: int, use_tma: bool):
    """A TMA descriptor for ``t`` (rows, K) with a ``[rows_block, block_k]`` box, or ``t`` itself (pointer path)."""
    if use_tma:
        return TensorDescriptor(t, list(t.shape), [t.stride(0), 1], [rows_block, block_k])
    return t


def launch_gemm_decode(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                       config: DecodeConfig, num_sms: int) -> torch.Tensor:
    """Launch ``config`` computing ``out = a @ b.T (+ bias)`` on validated operands; returns ``out``.

    ``a`` (M, K) and ``b`` (N, K) 16-bit with unit K stride or any strides (pointer path), ``out`` (M, N) of
    bf16/fp16/fp32, ``bias`` (N,) contiguous or None; ``num_sms`` sizes the stream-K grid. Nothing is checked here
    (the dispatcher validated shapes and :func:`config_supported` the config). Allocates only with ``torch.empty``
    (split-K workspace), so it can be captured in a CUDA graph once the kernels are compiled."""
    cfg = config
    M, K = a.shape
    bm, bn, bk = cfg.BLOCK_SIZE_M, cfg.BLOCK_SIZE_N, cfg.BLOCK_SIZE_K
    if cfg.B_TILED:  # b is tile_weight(w, bn, bk): (N / bn, K / bk, bn, bk), read through its 2-D row view
        if b.dim() != 4 or tuple(b.shape[2:]) != (bn, bk) or b.shape[1] * bk != K or not b.is_contiguous():
            raise ValueError(f"{cfg.name} needs tile_weight(w, {bn}, {bk}) of a ({K}-column) weight; "
                             f"got shape {tuple(b.shape)}")
        N = b.shape[0] * bn
        b = b.view(-1, bk)
    else:
        N = b.shape[0]
    tma_dev = cfg.TMA and _tma_device_ok(a)
    a_tma = tma_dev and tma_operand_ok(a)
    b_tma = tma_dev and tma_operand_ok(b)
    a_src = _operand(a, bm, bk, a_tma)
    b_src = _operand(b, bn, bk, b_tma)
    has_bias = bias is not None
    bias_arg = bias if has_bias else out
    common = dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, SWAP_AB=cfg.SWAP_AB, A_TMA=a_tma, B_TMA=b_tma,
                  HAS_BIAS=has_bias, EVEN_K=K % bk == 0, UPCAST_DOT=INTERPRET,
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.B_TILED:
        if cfg.STREAM_K:
            raise ValueError(f"{cfg.name}: the tiled weight layout is not implemented for stream-K")
        common["B_TILED"] = True
    strides = (a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1))
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)

    if cfg.STREAM_K:
        progs, ipp = streamk_plan(M, N, K, cfg, num_sms)
        ws = torch.empty((2 * progs, bm, bn), dtype=torch.float32, device=a.device)
        cnt = _counters(a.device, tiles)
        _gemm_decode_streamk_kernel[(progs,)](a_src, b_src, bias_arg, out, ws, cnt, M, N, K, *strides, ipp,
                                              **common)
        return out

    k_tiles, per_split = split_plan(K, bk, cfg.NUM_KSPLIT)
    split = triton.cdiv(k_tiles, per_split)  # == NUM_KSPLIT for supported configs (no empty split)
    if split == 1:
        _gemm_decode_kernel[(tiles, 1)](a_src, b_src, bias_arg, out, out, out, M, N, K, *strides, per_split, 1,
                                        REDUCE=_RED_STORE, **common)
        return out
    ws = torch.empty((split, M, N), dtype=torch.float32, device=a.device)
    fixup = cfg.REDUCE == "FX"
    cnt = _counters(a.device, tiles) if fixup else ws
    _gemm_decode_kernel[(tiles, split)](a_src, b_src, bias_arg, out, ws, cnt, M, N, K, *strides, per_split, split,
                                        REDUCE=_RED_FIXUP if fixup else _RED_PARTIALS, **common)
    if not fixup:
        _splitk_reduce_kernel[(triton.cdiv(M * N, _REDUCE_BLOCK),)](
            ws, bias_arg, out, M, N, out.stride(0), out.stride(1), split,
            HAS_BIAS=has_bias, BLOCK_SIZE=_REDUCE_BLOCK, num_warps=4)
    return out


def tile_weight(w: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    """The weight (N, K) stored tile-major for ``B_TILED`` configs: (N / bn, K / bk, bn, bk), contiguous, so one
    ``[bn, bk]`` tile is ``bn * bk * 2`` consecutive bytes and a row block's tiles follow each other along K (the
    layout question of issue 14: does a tile read from scattered 2*bk-byte row pieces cost DRAM bandwidth?)."""
    N, K = w.shape
    if N % bn or K % bk:
        raise ValueError(f"tile_weight: ({N}, {K}) is not a multiple of the ({bn}, {bk}) tile")
    return w.reshape(N // bn, bn, K // bk, bk).permute(0, 2, 1, 3).contiguous()


def smem_limit(arch: str) -> int:
    return SMEM_PER_BLOCK.get(arch, _DEFAULT_SMEM)


def config_supported(cfg: DecodeConfig, M: int, N: int, K: int, arch: str, dtype: torch.dtype = torch.bfloat16,
                     *, a: torch.Tensor | None = None, b: torch.Tensor | None = None) -> str | None:
    """Why ``cfg`` cannot run (M, N, K) on ``arch`` (``sm_90``, ``cpu`` for the interpreter, ...), or None if it can.

    Checks: the input dtype; shared memory (pipeline buffers + a margin) against the arch's per-block limit; TMA only
    on archs with it and with 16-byte aligned weight rows (``K * itemsize``; given ``a``/``b``, their base pointers
    and row strides too); split-K with at least one K tile per split and no empty split; accumulators <= 256 float32
    registers per thread (more spills)."""
    if dtype not in SUPPORTED_DTYPES:
        return f"input dtype {dtype} is not bf16/fp16"
    if min(M, N, K) <= 0:
        return f"empty problem M={M} N={N} K={K}"
    isz = torch.empty((), dtype=dtype).element_size()
    need = cfg.smem_bytes(isz) + _SMEM_MARGIN
    if need > smem_limit(arch):
        return f"needs {need // 1024} KiB of shared memory, {arch} has {smem_limit(arch) // 1024} KiB per block"
    if cfg.acc_regs_per_thread() > 256:
        return f"{cfg.acc_regs_per_thread()} float32 accumulators per thread (> 256: spills)"
    if cfg.TMA:
        if not _is_tma_arch(arch):
            return f"TMA needs sm_90+ (arch {arch})"
        if (K * isz) % 16:
            return f"TMA needs 16-byte aligned rows: K={K} x {isz} bytes"
        for label, t in (("a", a), ("b", b)):
            if t is not None and not tma_operand_ok(t):
                return (f"TMA needs {label} with unit K stride and 16-byte aligned base and row stride "
                        f"(stride {tuple(t.stride())}, address % 16 = {t.data_ptr() % 16})")
    if cfg.B_TILED and (N % cfg.BLOCK_SIZE_N or K % cfg.BLOCK_SIZE_K or cfg.STREAM_K):
        return f"the tiled weight layout needs N, K multiples of the tile and no stream-K (N={N} K={K})"
    k_tiles, per = split_plan(K, cfg.BLOCK_SIZE_K, cfg.NUM_KSPLIT)
    if cfg.NUM_KSPLIT > k_tiles:
        return f"NUM_KSPLIT={cfg.NUM_KSPLIT} > {k_tiles} K tiles of {cfg.BLOCK_SIZE_K}"
    if triton.cdiv(k_tiles, per) != cfg.NUM_KSPLIT:
        return (f"NUM_KSPLIT={cfg.NUM_KSPLIT} over {k_tiles} K tiles ({per} per split) leaves a split empty")
    return None


# ------------------------------------------------------------------------------------------------------------------
# Search space and default
# ------------------------------------------------------------------------------------------------------------------

# Tiles (BM, BN, num_warps, SWAP_AB) worth timing per M bucket, from two H100 sweeps of the family (issue 14; run 2
# timed ~30 configs per shape on all 48 shapes). What they showed:
# * small tiles win, even where they re-read the weight from L2: BM = 16 (swapped) at M = 17-32 (geomean 1.03x the
#   per-shape best), 64x64 at M = 64-128 (1.02x / 1.07x), 64x128 at M = 256 (1.13x; 128x128 x 8 warps 1.14x,
#   128x256 and 256x64 1.2x+). More, smaller programs keep more weight requests in flight than fewer large ones;
# * swapped tiles (weight rows on the wgmma M side) are how 16/32-row tiles reach wgmma;
# * accumulators stay <= 128 float32 registers per thread (num_warps 8 from 128x128 up).
_TILES: dict[int, tuple[tuple[int, int, int, bool], ...]] = {
    32: ((16, 64, 4, True), (16, 128, 4, True), (32, 64, 4, True), (32, 128, 4, True), (64, 64, 4, False)),
    64: ((16, 64, 4, True), (32, 64, 4, True), (32, 128, 4, True), (64, 64, 4, False), (64, 128, 4, False)),
    128: ((32, 64, 4, True), (64, 64, 4, False), (64, 128, 4, False), (128, 64, 4, False), (128, 128, 8, False)),
    256: ((64, 64, 4, False), (64, 128, 4, False), (128, 64, 4, False), (128, 128, 8, False)),
}
# Bytes of weight in flight per program the pipeline should reach: Little's law gives ~4.5 MB over the chip
# (3.0 TB/s x ~1.5 us), ~35 KB per SM; twice that leaves room for one program per SM. (Run 2: the deepest
# pipeline offered won most often, e.g. 7 stages of 64x64x64.)
_INFLIGHT_TARGET = 64 * 1024
# Split-K workspace traffic (S partials written and read, 8 bytes per output element each) allowed relative to the
# weight bytes: at M = 256, K = 4096 eight splits move twice the weight (run 1: 0.38x F.linear).
_MAX_WS_RATIO = 0.3
# In-kernel fix-up only when the last program of a tile reads at most this many partial bytes: it sums them alone,
# on the critical path. Run 2, fix-up / two-pass time by partial bytes: < 8 KB 0.994 (best 0.82), 8-16 KB 1.004,
# 16-32 KB 1.02-1.05, 40+ KB 1.08-1.10.
_MAX_FIXUP_BYTES = 16 * 1024
# Shared memory of one Hopper SM and what the driver reserves per resident block (bytes): occupancy arithmetic.
_SMEM_PER_SM = 228 * 1024
_SMEM_PER_BLOCK_RESERVED = 1024


def _bucket(M: int) -> int:
    return 32 if M <= 32 else 64 if M <= 64 else 128 if M <= 128 else 256


def _stages(bm: int, bn: int, bk: int, limit: int, programs: int = 0, cu: int = 1) -> list[int]:
    """Pipeline depths to try: the smallest that keeps ``_INFLIGHT_TARGET`` of weight in flight (3..7), one deeper,
    and, given the launch's ``programs``, the deepest that still lets all of them be resident at once
    (``ceil(programs / cu)`` per SM in ``_SMEM_PER_SM``): run 3 on the H100, 192 programs of 16x64 tiles took 1.00x
    with 5 stages (two per SM) and 1.12x with 6 (one per SM, 1.45 waves). Never more than fits ``limit``."""
    per_stage = (bm + bn) * bk * 2
    fit = (limit - _SMEM_MARGIN) // per_stage
    want = min(7, max(3, math.ceil(_INFLIGHT_TARGET / (bn * bk * 2)) + 1))
    out = {min(want, fit), min(want + 1, fit)}
    if programs > cu:
        per_sm = math.ceil(programs / max(cu, 1))
        resident = (_SMEM_PER_SM // per_sm - _SMEM_PER_BLOCK_RESERVED - _SMEM_MARGIN) // per_stage
        if 3 <= resident < min(out):
            out.add(resident)
    return sorted(st for st in out if st >= 2)


def _split_ok(s: int, k_tiles: int, M: int, K: int) -> bool:
    """>= 4 K tiles per split (fewer is mostly pipeline prologue), no empty split, bounded workspace traffic."""
    return (k_tiles >= 4 * s and triton.cdiv(k_tiles, triton.cdiv(k_tiles, s)) == s
            and (s == 1 or 4 * s * M / K <= _MAX_WS_RATIO))


def _splits(tiles: int, k_tiles: int, cu: int, M: int, K: int) -> list[int]:
    """Split-K factors worth trying for ``tiles`` output tiles.

    No split when the tiles alone fill ~a wave (a memory-bound kernel with resident programs balances itself; run 1:
    SK 7-8 on 224-448 tiles ran at half speed). Otherwise the smallest split that fills 90% of the SMs, and the one
    after it (the next multiple of the tile count that fills them); 1 as well when the tiles fill half the SMs
    (2 M-tiles x 64 N-tiles beat 1 x 64 x 2 splits at M = 32)."""
    if tiles >= 0.9 * cu:
        return [1]
    out = [1] if tiles >= cu // 2 else []
    fill = [s for s in range(2, 17) if tiles * s >= 0.9 * cu and _split_ok(s, k_tiles, M, K)]
    out += fill[:2]
    if not out:  # the workspace cap leaves nothing: the largest split it allows, else none
        ok = [s for s in range(2, 17) if _split_ok(s, k_tiles, M, K)]
        out = [ok[-1]] if ok else [1]
    return out


def _fixup_ok(bm: int, bn: int, s: int, M: int) -> bool:
    return (s - 1) * min(bm, M) * bn * 4 <= _MAX_FIXUP_BYTES


def config_space(M: int, N: int, K: int, cu_num: int, arch: str = "sm_90",
                 dtype: torch.dtype = torch.bfloat16) -> list[DecodeConfig]:
    """The tuner's search space for the decode regime at (M, N, K): <= ~60 configs, every one supported.

    Per tile of ``_TILES`` (4-5 per M bucket): BLOCK_SIZE_K 128, and 64 from M > 32 (deeper pipelines of smaller
    steps won at M = 128-256 in run 2); the pipeline depths of :func:`_stages`; the split factors of
    :func:`_splits`, each reduced two-pass and, where the partial tiles are small (``_MAX_FIXUP_BYTES``), by the
    in-kernel fix-up. TMA wherever the arch has it (the pointer path runs where TMA cannot; run 2: pointer loads were
    within 2% on average, 0.76-1.10x, so TMA is not worth a second copy of the space).

    Not searched: stream-K. On all 48 shapes of run 2 the stream-K config was 1.02-1.96x slower than the best split
    config (geomean 1.28x): its programs restart the pipelined K loop for every tile piece, and a tile's last
    contributor sums the pieces alone. It stays available by name (``_STK<p>``) for shapes outside this regime."""
    cu = max(1, cu_num)
    tma = _is_tma_arch(arch) and arch != "cpu" and (K * 2) % 16 == 0
    limit = smem_limit(arch)
    space: list[DecodeConfig] = []
    for bm, bn, warps, swap in _TILES[_bucket(M)]:
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        bk_max = 64 if (bm + bn) * 128 * 2 * 3 > limit - _SMEM_MARGIN else 128
        for bk in ([64, 128] if M > 32 and bk_max == 128 else [bk_max]):
            k_tiles = triton.cdiv(K, bk)
            for sk in _splits(tiles, k_tiles, cu, M, K):
                for st in _stages(bm, bn, bk, limit, tiles * sk, cu):
                    space.append(DecodeConfig(bm, bn, bk, sk, warps, st, swap, "2P", 0, tma))
                    if sk > 1 and _fixup_ok(bm, bn, sk, M):
                        space.append(DecodeConfig(bm, bn, bk, sk, warps, st, swap, "FX", 0, tma))
    return [c for c in dict.fromkeys(space) if config_supported(c, M, N, K, arch, dtype) is None]


def default_config(M: int, N: int, K: int, cu_num: int, arch: str = "sm_90") -> DecodeConfig:
    """The config to use untuned, by rules read off run 3 (48 shapes, H100): the winners launched about one wave of
    programs (all resident) with the bucket's tile; where that tile gives too few programs, the next smaller one.

    * M <= 32: 32x64 swapped when N / 64 >= half the SMs, else 16x64 (two M-tiles); 32x128 once N / 128 fills
      1.6 waves (N = 28672);
    * M <= 64: 64x64, or 32x64 swapped below half a wave, 64x128 from 1.6 waves;
    * M <= 128: 64x64 (two M-tiles) up to one wave, else 64x128, else 128x128 x 8 warps from 1.6 waves;
    * M > 128: 128x128 x 8 warps with K-step 64 and 6 stages from 0.7 waves, else 128x64 (K-step 64), else 64x64;
    * below half a wave, the split that first fills 90% of the SMs (fix-up when its partials are small);
    * the pipeline depth of :func:`_stages` that keeps every program resident; TMA on sm_90+."""
    cu = max(1, cu_num)
    tma = _is_tma_arch(arch) and arch != "cpu" and (K * 2) % 16 == 0
    n64, n128 = triton.cdiv(N, 64), triton.cdiv(N, 128)
    warps, bk, swap = 4, 128, False
    if M <= 32:
        swap = True
        if n128 >= 1.6 * cu:
            bm, bn = 32, 128
        else:
            bm, bn = (32 if n64 >= cu // 2 else 16), 64
    elif M <= 64:
        if n128 >= 1.6 * cu:
            bm, bn = 64, 128
        elif n64 >= cu // 2:
            bm, bn = 64, 64
        else:
            bm, bn, swap = 32, 64, True
    elif M <= 128:
        if n128 >= 1.6 * cu:
            bm, bn, warps = 128, 128, 8
        elif triton.cdiv(M, 64) * n64 <= cu:
            bm, bn = 64, 64
        else:
            bm, bn = 64, 128
    else:
        if triton.cdiv(M, 128) * n128 >= 0.7 * cu:
            bm, bn, bk, warps = 128, 128, 64, 8
        elif triton.cdiv(M, 128) * n64 >= 0.7 * cu:
            bm, bn, bk = 128, 64, 64
        else:
            bm, bn = 64, 64
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    k_tiles = triton.cdiv(K, bk)
    split = 1
    if tiles < cu // 2:  # run 2: 96-128 unsplit tiles beat the same tiles split in two
        fill = [s for s in range(2, 17) if tiles * s >= 0.9 * cu and _split_ok(s, k_tiles, M, K)]
        ok = [s for s in range(2, 17) if _split_ok(s, k_tiles, M, K)]
        split = fill[0] if fill else (ok[-1] if ok else 1)
    depths = _stages(bm, bn, bk, smem_limit(arch), tiles * split, cu)
    programs = tiles * split
    if programs > cu:  # the deepest pipeline that keeps all programs resident, if one of the depths does
        per_sm = math.ceil(programs / cu)
        per_stage = (bm + bn) * bk * 2
        fits = [d for d in depths
                if d * per_stage <= _SMEM_PER_SM // per_sm - _SMEM_PER_BLOCK_RESERVED - _SMEM_MARGIN]
        stages = max(fits) if fits else max(depths)
    else:
        stages = max(depths)
    red = "FX" if split > 1 and _fixup_ok(bm, bn, split, M) else "2P"
    cfg = DecodeConfig(bm, bn, bk, split, warps, stages, swap, red, 0, tma)
    if config_supported(cfg, M, N, K, arch) is not None:  # tiny or misaligned K: no split, no TMA
        cfg = DecodeConfig(bm, bn, 64, 1, warps, 2, swap, "2P", 0, False)
    return cfg


def gemm_decode(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                otype: torch.dtype | None = None, config: DecodeConfig | None = None,
                num_sms: int | None = None) -> torch.Tensor:
    """Convenience entry (tests, benchmarks): allocate C and launch ``config`` (default: :func:`default_config`)."""
    M, K = a.shape
    N = b.shape[0]
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(a.device).multi_processor_count if a.is_cuda else 4
    cfg = config or default_config(M, N, K, num_sms, _arch_of(a))
    out = torch.empty((M, N), dtype=otype or a.dtype, device=a.device)
    return launch_gemm_decode(a, b, bias, out, cfg, num_sms)


def _arch_of(t: torch.Tensor) -> str:
    if not t.is_cuda:
        return "cpu"
    major, minor = torch.cuda.get_device_capability(t.device)
    return f"sm_{major}{minor}"


def gemm_decode_ref(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                    otype: torch.dtype | None = None) -> torch.Tensor:
    """Float32 reference: upcast, multiply, add bias (float32), cast to ``otype`` (default ``a.dtype``)."""
    out = a.float() @ b.float().t()
    if bias is not None:
        out = out + bias.float()
    return out.to(a.dtype if otype is None else otype)
