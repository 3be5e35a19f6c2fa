"""Skinny GEMM ``C = A @ B.T (+ bias)`` for M <= 16 (decode): GEMV-like kernels that stream the weight once.

At M <= 16 the weight B (N, K) is almost all the bytes (M=1, N=K=4096: 32 MiB of B against 8 KiB of A), so the job
is to read B at full HBM bandwidth: each program owns ``BLOCK_SIZE_N`` rows of B and a slab of K, loads
``[BLOCK_SIZE_N, BLOCK_SIZE_K]`` tiles with K contiguous (16-byte vector loads), and enough programs run to fill
every SM (split-K when ``N / BLOCK_SIZE_N`` alone is too few). Eight variants, selected by ``solidx``:

======  ==============  ============================================================================================
solidx  name            what it does
======  ==============  ============================================================================================
0       ``fma``         CUDA-core multiply-adds into a ``[BM, BN, BK]`` float32 register accumulator, reduced over K
                        once at the end; whole K per program, one launch, deterministic.
1       ``fma_2pass``   as ``fma`` but split-K: float32 partials to a workspace, then a reduce kernel that adds them
                        in split order, adds the bias and casts (two launches, deterministic).
2       ``fma_atomic``  as ``fma`` but split-K with float32 ``atomic_add`` into a zeroed float32 buffer (the output
                        itself for fp32 output, else a workspace cast by a second kernel); summation order varies.
3       ``dot``         tensor-core ``tl.dot`` on A padded to 16 rows (M <= 16 rows of real data); whole K, one launch.
4       ``dot_2pass``   ``dot`` with the deterministic two-pass split-K reduction of ``fma_2pass``.
5       ``dot_atomic``  ``dot`` with the float32 atomic split-K reduction of ``fma_atomic``.
6       ``gemv``        M <= 8 (``_gemv_kernel``): a ``[BN, BK]`` float32 accumulator per row of A, each weight
                        tile loaded once and multiplied into every row, reduced over K at the end; M, N and K
                        compile-time constants (a binary per shape). At M = 1 what Inductor emits for ``F.linear``
                        under max-autotune (a reduction kernel specialised to the shape); ``fma`` at M=1, the same
                        sums through a 3-D accumulator with runtime sizes, ran Inductor's tiles at 0.64-0.69x of
                        it (H100). CUDA-core multiply-adds: on the H100 it won at M = 2 on every shipped shape, at
                        M = 4 on three (summing 8 products per accumulator, ``GEMV_FOLD_FROM_M``), at M = 8 on
                        none (0.74-0.996x F.linear).
7       ``gemv_2pass``  ``gemv`` with the two-pass split-K reduction of ``fma_2pass``.
======  ==============  ============================================================================================

``fma`` keeps ``BM * BN * BK / (32 * num_warps)`` float32 accumulators per thread (M rows padded to a power of two),
so its tiles shrink as M grows; ``dot`` pays for padding M to 16 with tensor-core work that is free at these sizes.
Two load options apply to every variant (kernelName suffixes): ``_EF`` loads the weight ``evict_first``, ``_SP``
compiles N and K into the kernel (``SPEC_N``/``SPEC_K`` of ``_skinny_kernel``: a binary per weight shape, as
Inductor's kernels are; on the H100 the same dot tile ran 0.98-1.10x as fast with it at M = 2 and 16,
docs/exploration.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from aiter_gemm.kernels.common import (
    INTERPRET,
    MAX_KSPLIT,
    MAX_STAGES,
    MAX_TILE_NUMEL,
    KernelName,
    bias_agnostic,
    bias_stride_of,
    splitk_reduce,
)
from aiter_gemm.kernels.gemm_a16w16 import check_operands

try:  # Hopper's grid dependency control (Triton >= 3.3); the interpreter has none
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: _PDL configs run without it
    gdc_launch_dependents = gdc_wait = None
#: Whether a ``_PDL`` config really launches with programmatic dependent launch here (else it runs as plain gemv).
PDL_AVAILABLE = gdc_wait is not None and not INTERPRET
_PDL_LAUNCH = {False: {}, True: {"launch_pdl": True} if PDL_AVAILABLE else {}}  # launch options by cfg.pdl

MAX_M = 16
#: Rows the ``gemv`` variants take. Their M * N * K multiply-adds (plus converting M rows of A per weight load) run
#: on CUDA cores: at M = 8 no tile beat F.linear on the H100 (0.48-0.67x, 0.74-0.996x with the fold below;
#: docs/exploration.md, gemv_m2_m8 and gemv_fold_m2_m8), so more rows would only be slower; the tensor-core
#: ``dot`` variants cover M up to 16.
GEMV_MAX_M = 8
#: From this many rows (BLOCK_SIZE_M) the gemv kernel sums each thread's 8 products of one 16-byte weight load at
#: once (``_gemv_fma``): 8x fewer accumulators. On the H100 that made M = 4 faster ((4, 1280, 8192): 10.0 against
#: 11.1 us) and M = 2 slower ((2, 4096, 14336): 0.95x F.linear against 1.07x; two rows leave too few independent
#: multiply-add chains), docs/exploration.md (gemv_fold_m2_m8).
GEMV_FOLD_FROM_M = 4


def gemv_fold(block_rows: int) -> int:
    """Products a gemv thread sums per accumulator at BLOCK_SIZE_M = ``block_rows``: 8 (one 16-byte load of 16-bit
    values) from GEMV_FOLD_FROM_M rows, else 1 (none). The launcher passes it to the kernel as ``FOLD``."""
    return 8 if block_rows >= GEMV_FOLD_FROM_M else 1

# Reduction modes of the kernel's epilogue.
_STORE, _PARTIALS, _ATOMIC = 0, 1, 2


@dataclass(frozen=True)
class SkinnyVariant:
    """A skinny kernel variant: its ``solidx``, name, compute unit (dot or FMA) and split-K reduction."""

    solidx: int
    name: str
    use_dot: bool
    reduction: int  # _STORE (no split), _PARTIALS (two-pass) or _ATOMIC
    gemv: bool = False  # M <= GEMV_MAX_M, a [BN, BK] accumulator per row

    @property
    def splits_k(self) -> bool:
        return self.reduction != _STORE

    @property
    def deterministic(self) -> bool:
        return self.reduction != _ATOMIC


VARIANTS: dict[int, SkinnyVariant] = {v.solidx: v for v in (
    SkinnyVariant(0, "fma", False, _STORE),
    SkinnyVariant(1, "fma_2pass", False, _PARTIALS),
    SkinnyVariant(2, "fma_atomic", False, _ATOMIC),
    SkinnyVariant(3, "dot", True, _STORE),
    SkinnyVariant(4, "dot_2pass", True, _PARTIALS),
    SkinnyVariant(5, "dot_atomic", True, _ATOMIC),
    SkinnyVariant(6, "gemv", False, _STORE, gemv=True),
    SkinnyVariant(7, "gemv_2pass", False, _PARTIALS, gemv=True),
)}


#: The ``kernelName`` grammar (:attr:`SkinnyConfig.name`): the variant's name first, as in :data:`VARIANTS`.
NAME = KernelName("{variant:" + "|".join(v.name for v in VARIANTS.values()) + "}_BN{BN}_BK{BK}_SK{SK}_W{W}_S{S}"
                  "[_EF][_SP][{pdl:_PDL|_PDLW}]", "skinny kernelName",
                  f"; variants: {', '.join(v.name for v in VARIANTS.values())}; e.g. 'fma_BN16_BK512_SK1_W4_S1'")


def block_m(M: int, use_dot: bool) -> int:
    """Rows of A a program holds: M rounded up to a power of two (16 for ``tl.dot``, whose tiles are >= 16)."""
    return 16 if use_dot else triton.next_power_of_2(M)


@dataclass(frozen=True)
class SkinnyConfig:
    """A skinny kernel launch: ``variant`` (solidx) and tile; ``name`` is its CSV ``kernelName`` spelling."""

    solidx: int = 0
    BLOCK_SIZE_N: int = 16
    BLOCK_SIZE_K: int = 512
    NUM_KSPLIT: int = 1
    num_warps: int = 4
    num_stages: int = 1
    #: Load B with ``eviction_policy="evict_first"`` (and A with ``evict_last``): each weight byte is read once, so
    #: it need not stay in L2 ahead of the activations (what Inductor's M=1 reduction kernels do). Name suffix _EF.
    evict_first: bool = False
    #: Compile N and K into the kernel (a binary per weight shape), as Inductor's templates are: masks and the K
    #: loop's trip count become constants. Name suffix _SP. The gemv variants always are.
    specialize: bool = False
    #: gemv only: launch with programmatic dependent launch (Hopper's PDL, ``griddepcontrol``), so the programs are
    #: placed on the SMs while the previous kernel of the stream drains. 1 (suffix _PDL): they wait for its writes
    #: before loading anything. 2 (suffix _PDLW): they load their first weight tile first, then wait before reading
    #: the activation; correct only while the kernel right before does not write the weight (true of inference:
    #: weights are written long before).
    pdl: int = 0

    def __post_init__(self) -> None:
        if self.solidx not in VARIANTS:
            raise ValueError(f"skinny solidx {self.solidx} is not one of {sorted(VARIANTS)}")
        var = VARIANTS[self.solidx]
        for field in ("BLOCK_SIZE_N", "BLOCK_SIZE_K"):
            v = getattr(self, field)
            if v < (16 if var.use_dot else 1) or v & (v - 1):
                raise ValueError(f"{field}={v} must be a power of two (>= 16 for the dot variants)")
        if self.BLOCK_SIZE_N * self.BLOCK_SIZE_K > MAX_TILE_NUMEL:  # the weight tile every variant loads
            raise ValueError(f"a {self.BLOCK_SIZE_N}x{self.BLOCK_SIZE_K} weight tile: Triton compiles no tensor "
                             f"above {MAX_TILE_NUMEL} elements")
        if var.splits_k != (self.NUM_KSPLIT > 1) or self.NUM_KSPLIT > MAX_KSPLIT:
            raise ValueError(f"variant {var.name} needs NUM_KSPLIT {f'in 2..{MAX_KSPLIT}' if var.splits_k else '== 1'}"
                             f", got {self.NUM_KSPLIT}")
        if self.num_warps not in (1, 2, 4, 8, 16, 32) or not 1 <= self.num_stages <= MAX_STAGES:
            raise ValueError(f"num_warps={self.num_warps} must be one of 1, 2, 4, 8, 16, 32 and num_stages="
                             f"{self.num_stages} in 1..{MAX_STAGES}")
        if self.specialize and var.gemv:
            raise ValueError(f"variant {var.name} is always shape-specialised: drop _SP")
        if self.pdl not in (0, 1, 2):
            raise ValueError(f"pdl={self.pdl} must be 0, 1 (_PDL) or 2 (_PDLW)")
        if self.pdl and not (var.gemv and var.reduction == _STORE):
            raise ValueError(f"_PDL applies to the one-pass gemv variant only, not {var.name}")

    @property
    def variant(self) -> SkinnyVariant:
        return VARIANTS[self.solidx]

    @property
    def name(self) -> str:
        return NAME.format({"variant": self.variant.name, "BN": self.BLOCK_SIZE_N, "BK": self.BLOCK_SIZE_K,
                            "SK": self.NUM_KSPLIT, "W": self.num_warps, "S": self.num_stages, "EF": self.evict_first,
                            "SP": self.specialize, "pdl": (None, "_PDL", "_PDLW")[self.pdl]})

    @classmethod
    def from_name(cls, name: str) -> SkinnyConfig:
        """Parse a ``kernelName`` like ``fma_BN16_BK512_SK1_W4_S1`` (variant name first, as in :data:`VARIANTS`;
        an ``_EF`` suffix sets :attr:`evict_first`, ``_SP`` :attr:`specialize`, ``_PDL`` / ``_PDLW`` :attr:`pdl`)."""
        v = NAME.parse(name)
        solidx = next(s for s, var in VARIANTS.items() if var.name == v["variant"])
        return cls(solidx, v["BN"], v["BK"], v["SK"], v["W"], v["S"], v["EF"], v["SP"],
                   {None: 0, "_PDL": 1, "_PDLW": 2}[v["pdl"]])

    def acc_regs_per_thread(self, M: int) -> int:
        """float32 accumulator registers per thread (the FMA variants' 3-D accumulator, gemv's [BN, BK] per row,
        folded by 8 along K from 4 rows (:func:`gemv_fold`), the dot's [16, BN])."""
        bm = block_m(M, self.variant.use_dot)
        elems = bm * self.BLOCK_SIZE_N * (1 if self.variant.use_dot else self.BLOCK_SIZE_K)
        if self.variant.gemv:
            elems //= gemv_fold(bm)
        return max(1, elems // (32 * self.num_warps))

    def smem_bytes(self, itemsize: int = 2) -> int:
        """Shared memory of the dot variants' pipeline (FMA variants load straight to registers)."""
        if not self.variant.use_dot:
            return 0
        return self.num_stages * (MAX_M + self.BLOCK_SIZE_N) * self.BLOCK_SIZE_K * itemsize




@triton.jit(**bias_agnostic())
def _skinny_kernel(
    a_ptr, b_ptr, bias_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak, stride_bn, stride_bk,
    stride_cs, stride_cm, stride_cn, stride_bias,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    NUM_KSPLIT: tl.constexpr, NUM_STAGES: tl.constexpr,
    USE_DOT: tl.constexpr, REDUCTION: tl.constexpr,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, UPCAST_DOT: tl.constexpr, EVICT_FIRST: tl.constexpr,
    SPEC_N: tl.constexpr, SPEC_K: tl.constexpr,
):
    """BLOCK_SIZE_N output columns x all M rows over one K split (program axis 1). ``SPEC_N``/``SPEC_K`` > 0 compile
    the weight's shape in (``SkinnyConfig.specialize``: a binary per (N, K)); 0 keeps the runtime N and K."""
    if SPEC_N > 0:  # a static branch: N and K become compile-time constants below
        N = SPEC_N
        K = SPEC_K
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    k_tiles_per_split = tl.cdiv(tl.cdiv(K, BLOCK_SIZE_K), NUM_KSPLIT)
    k_start = pid_k * k_tiles_per_split * BLOCK_SIZE_K
    k_len = min(K - k_start, k_tiles_per_split * BLOCK_SIZE_K)

    offs_m = tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    m_mask = offs_m < M
    offs_bn = offs_n % N  # wrap rows past N: B loads stay unmasked along N (C stores are masked)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + (k_start + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + offs_bn[:, None] * stride_bn + (k_start + offs_k)[None, :] * stride_bk

    if USE_DOT:
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    else:
        acc3 = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K), dtype=tl.float32)
    # The weight streams through once; the activations are re-read by every program.
    a_policy: tl.constexpr = "evict_last" if EVICT_FIRST else ""
    b_policy: tl.constexpr = "evict_first" if EVICT_FIRST else ""
    for ki in tl.range(0, tl.cdiv(k_len, BLOCK_SIZE_K), num_stages=NUM_STAGES):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=m_mask[:, None], other=0.0, eviction_policy=a_policy)
            b = tl.load(b_ptrs, eviction_policy=b_policy)
        else:
            k_mask = offs_k[None, :] < k_len - ki * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=m_mask[:, None] & k_mask, other=0.0, eviction_policy=a_policy)
            b = tl.load(b_ptrs, mask=k_mask, other=0.0, eviction_policy=b_policy)
        if USE_DOT:
            if UPCAST_DOT:
                acc = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, tl.trans(b), acc)
        else:
            # Elementwise accumulate; the cross-thread reduction over K happens once, after the loop.
            acc3 += a.to(tl.float32)[:, None, :] * b.to(tl.float32)[None, :, :]
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    if not USE_DOT:
        acc = tl.sum(acc3, axis=2)

    c_mask = m_mask[:, None] & (offs_n[None, :] < N)
    c_ptrs = c_ptr + pid_k * stride_cs + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    if REDUCTION == 0:  # whole K here: bias, cast, store
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
    elif REDUCTION == 1:  # float32 partials of split pid_k
        tl.store(c_ptrs, acc, mask=c_mask)
    else:  # float32 atomics into a zeroed buffer; split 0 contributes the bias
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0).to(tl.float32)
            acc += tl.where(pid_k == 0, bias, 0.0)[None, :]
        tl.atomic_add(c_ptrs, acc, mask=c_mask, sem="relaxed")


@triton.jit
def _gemv_load_a(a_ptr, offs_m, kk, stride_am, stride_ak, K: tl.constexpr, EVEN_K: tl.constexpr,
                 EVICT_FIRST: tl.constexpr):
    """The activation's [BM, 1, BK] slice at rows ``offs_m``, columns ``kk`` (kept in L2: every program reads it)."""
    policy: tl.constexpr = "evict_last" if EVICT_FIRST else ""
    ptrs = a_ptr + offs_m * stride_am + kk * stride_ak
    if EVEN_K:
        return tl.load(ptrs, eviction_policy=policy)
    return tl.load(ptrs, mask=kk < K, other=0.0, eviction_policy=policy)


@triton.jit
def _gemv_load_b(b_ptr, offs_n, kk, stride_bn, stride_bk, N: tl.constexpr, K: tl.constexpr, EVEN_N: tl.constexpr,
                 EVEN_K: tl.constexpr, EVICT_FIRST: tl.constexpr):
    """The weight's [1, BN, BK] tile at rows ``offs_n``, columns ``kk`` (read once: evict_first)."""
    policy: tl.constexpr = "evict_first" if EVICT_FIRST else ""
    ptrs = b_ptr + offs_n * stride_bn + kk * stride_bk
    if EVEN_K:
        if EVEN_N:
            return tl.load(ptrs, eviction_policy=policy)
        return tl.load(ptrs, mask=offs_n < N, other=0.0, eviction_policy=policy)
    return tl.load(ptrs, mask=(offs_n < N) & (kk < K), other=0.0, eviction_policy=policy)


@triton.jit
def _halves(x):
    """[d0, d1, r, 2j] -> its even and its odd positions along the last axis, each [d0, d1, r, j]."""
    return tl.split(tl.reshape(x, (x.shape[0], x.shape[1], x.shape[2], x.shape[3] // 2, 2)))


@triton.jit
def _eighths(x):
    """[d0, d1, BK] -> 8 tensors [d0, d1, BK // 8], tensor j holding the elements 8i + j' (j' = j bit-reversed):
    the 8 values of one 16-byte load, which one thread holds, in 8 registers. No data moves between threads."""
    r: tl.constexpr = x.shape[2] // 8
    x0, x1 = _halves(tl.reshape(x, (x.shape[0], x.shape[1], r, 8)))
    x00, x01 = _halves(x0)
    x10, x11 = _halves(x1)
    x000, x001 = _halves(x00)
    x010, x011 = _halves(x01)
    x100, x101 = _halves(x10)
    x110, x111 = _halves(x11)
    s: tl.constexpr = (x.shape[0], x.shape[1], r)
    return (tl.reshape(x000, s), tl.reshape(x001, s), tl.reshape(x010, s), tl.reshape(x011, s),
            tl.reshape(x100, s), tl.reshape(x101, s), tl.reshape(x110, s), tl.reshape(x111, s))


@triton.jit
def _gemv_fma(acc, a, b, FOLD: tl.constexpr):
    """``acc`` + the products of ``a`` [BM, 1, BK] and ``b`` [1, BN, BK] in float32. FOLD == 8 (M >= 3): each
    thread sums the 8 products of one 16-byte load into one accumulator per row and column, as a chain of 8
    multiply-adds (acc is [BM, BN, BK // 8]); FOLD == 1: one accumulator per product (acc is [BM, BN, BK])."""
    a = a.to(tl.float32)
    b = b.to(tl.float32)
    if FOLD == 1:
        acc = acc + b * a
    else:
        tl.static_assert(FOLD == 8, "_gemv_fma folds 1 or 8 products")
        a0, a1, a2, a3, a4, a5, a6, a7 = _eighths(a)
        b0, b1, b2, b3, b4, b5, b6, b7 = _eighths(b)
        acc = acc + a0 * b0 + a1 * b1 + a2 * b2 + a3 * b3 + a4 * b4 + a5 * b5 + a6 * b6 + a7 * b7
    return acc


@triton.jit(**bias_agnostic())
def _gemv_kernel(
    a_ptr, b_ptr, bias_ptr, c_ptr,
    stride_am, stride_ak, stride_bn, stride_bk, stride_cs, stride_cm, stride_bias,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, NUM_KSPLIT: tl.constexpr,
    REDUCTION: tl.constexpr, HAS_BIAS: tl.constexpr, EVICT_FIRST: tl.constexpr, FOLD: tl.constexpr = 1,
    PDL: tl.constexpr = 0,
):
    """M <= GEMV_MAX_M rows of A (BLOCK_SIZE_M: M rounded up to a power of two) against BLOCK_SIZE_N rows of B over
    one K split (program axis 1): each weight element is loaded once and multiplied into the M rows' [BN, BK] float32
    accumulators, reduced over K at the end. M, N and K are compile-time constants, so every mask the shape does not
    need folds away and the K loop has a known trip count; at M == 1 the row axis folds away (compiled for sm_90, the
    same instructions as the earlier M == 1 kernel with a 2-D [BN, BK] accumulator). Rows past M re-read row M - 1
    (no load masks) and are not stored.
    PDL > 0 (launched with programmatic dependent launch): let the next kernel launch as our programs retire and wait
    until the previous kernel's writes are visible before reading A; PDL == 2 loads the first weight tile before
    that wait (``SkinnyConfig.pdl``)."""
    K_SPLIT: tl.constexpr = (K // BLOCK_SIZE_K + (K % BLOCK_SIZE_K > 0) + NUM_KSPLIT - 1) // NUM_KSPLIT * BLOCK_SIZE_K
    EVEN_N: tl.constexpr = N % BLOCK_SIZE_N == 0
    EVEN_K: tl.constexpr = K_SPLIT * NUM_KSPLIT == K
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.arange(0, BLOCK_SIZE_M)[:, None, None]  # [BM, 1, 1]
    offs_m = tl.minimum(rows, M - 1)  # rows past M load row M - 1: unmasked (vector) loads
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)[None, :, None]  # [1, BN, 1]
    offs_k = pid_k * K_SPLIT + tl.arange(0, BLOCK_SIZE_K)[None, None, :]  # [1, 1, BK]
    # FOLD (:func:`gemv_fold`) = 8: each thread folds the 8 products of one 16-byte load into one accumulator per row
    # and column right away (``_gemv_fma``), so the BM * BN accumulators cost BK / 8 registers each, not BK.
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K // FOLD), dtype=tl.float32)
    K_FIRST: tl.constexpr = BLOCK_SIZE_K if PDL == 2 else 0
    if PDL == 1:
        gdc_launch_dependents()
        gdc_wait()
    if PDL == 2:
        gdc_launch_dependents()
        b = _gemv_load_b(b_ptr, offs_n, offs_k, stride_bn, stride_bk, N, K, EVEN_N, EVEN_K, EVICT_FIRST)
        gdc_wait()
        a = _gemv_load_a(a_ptr, offs_m, offs_k, stride_am, stride_ak, K, EVEN_K, EVICT_FIRST)
        acc = _gemv_fma(acc, a, b, FOLD)
    for k in tl.range(K_FIRST, K_SPLIT, BLOCK_SIZE_K):
        kk = offs_k + k
        a = _gemv_load_a(a_ptr, offs_m, kk, stride_am, stride_ak, K, EVEN_K, EVICT_FIRST)
        b = _gemv_load_b(b_ptr, offs_n, kk, stride_bn, stride_bk, N, K, EVEN_N, EVEN_K, EVICT_FIRST)
        acc = _gemv_fma(acc, a, b, FOLD)
    out = tl.sum(acc, axis=2)[:, :, None]  # [BM, BN, 1]
    c_ptrs = c_ptr + pid_k * stride_cs + rows * stride_cm + offs_n
    c_mask = (rows < M) & (offs_n < N)
    if REDUCTION == 0:
        if HAS_BIAS:
            out += tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0).to(tl.float32)
        tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=c_mask)
    else:  # float32 partials of split pid_k (the two-pass reduction adds the bias)
        tl.store(c_ptrs, out, mask=c_mask)


def launch_skinny(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, otype: torch.dtype,
                  config: SkinnyConfig) -> torch.Tensor:
    """Run ``config`` on validated operands (M <= 16) and return the (M, N) ``otype`` output."""
    M, K = a.shape
    N = b.shape[0]
    cfg = config
    var = cfg.variant
    if var.gemv and M > GEMV_MAX_M:
        raise ValueError(f"skinny variant {var.name} takes M <= {GEMV_MAX_M}, got A {tuple(a.shape)}")
    split = cfg.NUM_KSPLIT
    out_is_buffer = var.reduction == _ATOMIC and otype == torch.float32
    if var.reduction == _STORE:
        target = out = torch.empty((M, N), dtype=otype, device=a.device)
        strides = (0, out.stride(0), out.stride(1))
    elif var.reduction == _PARTIALS:
        target = torch.empty((split, M, N), dtype=torch.float32, device=a.device)
        strides = (target.stride(0), target.stride(1), target.stride(2))
    else:
        target = torch.zeros((M, N), dtype=torch.float32, device=a.device)
        strides = (0, target.stride(0), target.stride(1))
    grid = (triton.cdiv(N, cfg.BLOCK_SIZE_N), split)
    if var.gemv:
        rows = block_m(M, False)
        _gemv_kernel[grid](
            a, b, bias if bias is not None else a, target, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            strides[0], strides[1], bias_stride_of(bias), M=M, N=N, K=K, BLOCK_SIZE_M=rows,
            BLOCK_SIZE_N=cfg.BLOCK_SIZE_N, BLOCK_SIZE_K=cfg.BLOCK_SIZE_K, NUM_KSPLIT=split,
            REDUCTION=var.reduction, HAS_BIAS=bias is not None and var.reduction != _PARTIALS,
            EVICT_FIRST=cfg.evict_first, FOLD=gemv_fold(rows), PDL=cfg.pdl if PDL_AVAILABLE else 0,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **_PDL_LAUNCH[cfg.pdl > 0],
        )
    else:
        _skinny_kernel[grid](
            a, b, bias if bias is not None else a, target, M, N, K,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), *strides, bias_stride_of(bias),
            BLOCK_SIZE_M=block_m(M, var.use_dot), BLOCK_SIZE_N=cfg.BLOCK_SIZE_N, BLOCK_SIZE_K=cfg.BLOCK_SIZE_K,
            NUM_KSPLIT=split, NUM_STAGES=cfg.num_stages, USE_DOT=var.use_dot, REDUCTION=var.reduction,
            HAS_BIAS=bias is not None and var.reduction != _PARTIALS,
            EVEN_K=K % cfg.BLOCK_SIZE_K == 0, UPCAST_DOT=INTERPRET, EVICT_FIRST=cfg.evict_first,
            SPEC_N=N if cfg.specialize else 0, SPEC_K=K if cfg.specialize else 0,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    if var.reduction == _STORE or out_is_buffer:
        return target
    out = torch.empty((M, N), dtype=otype, device=a.device)
    if var.reduction == _PARTIALS:
        return splitk_reduce(target, bias, out)
    return splitk_reduce(target.unsqueeze(0), None, out)  # atomic sum already holds the bias: cast only


def default_skinny_config(M: int, N: int, K: int, cu_num: int) -> SkinnyConfig:
    """Heuristic config from the SM/CU count, chosen on H100 sweeps (BENCHMARKS.md).

    M == 1: ``gemv`` one row of B per program, BK 2048, 4 warps, ``evict_first``: 1.052-1.44x F.linear on all 21
    shipped and held-out (N, K) of BENCHMARKS.md, Defaults (geomean 1.145x; the earlier ``fma`` default there:
    1.025x, min 0.877x), N / 1 rows give every SM many programs, so no split-K.
    M >= 2: ``dot`` on 32-row slabs. With at most one slab per SM, each program must keep more bytes in flight:
    BK 512 x 3 stages (N=4096: 128 slabs on 132 SMs); else BK 128 x 4 stages up to K=2048 and BK 256 x 3 beyond.
    Split-K (two-pass) while fewer than a third of the SMs get a slab."""
    if M == 1:
        return SkinnyConfig(6, 1, 2048, 1, 4, 1, True)
    programs = triton.cdiv(N, 32)
    if programs > cu_num and K <= 2048:
        bk, stages = 128, 4
    elif programs > cu_num:
        bk, stages = 256, 3
    else:
        bk, stages = 512, 3
    split = 1
    while 3 * programs * split < cu_num and K // (2 * split) >= 2 * bk:
        split *= 2
    return SkinnyConfig(3 if split == 1 else 4, 32, bk, split, 4, stages)


def skinny_gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                otype: torch.dtype | None = None, config: SkinnyConfig | None = None) -> torch.Tensor:
    """``a @ b.T (+ bias)`` for M <= 16 in ``otype`` (default ``a.dtype``) with ``config`` (default heuristic)."""
    otype = a.dtype if otype is None else otype
    check_operands(a, b, bias, otype)
    M, K = a.shape
    N = b.shape[0]
    if M > MAX_M:
        raise ValueError(f"skinny_gemm supports M <= {MAX_M}; got a {tuple(a.shape)} {a.dtype}")
    cu_num = torch.cuda.get_device_properties(a.device).multi_processor_count if a.is_cuda else 1
    return launch_skinny(a, b, bias, otype, config or default_skinny_config(M, N, K, cu_num))


def skinny_gemm_ref(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                    otype: torch.dtype | None = None) -> torch.Tensor:
    """Float32 reference: upcast, multiply, add bias, cast to ``otype``."""
    out = a.float() @ b.float().t()
    if bias is not None:
        out = out + bias.float()
    return out.to(a.dtype if otype is None else otype)
