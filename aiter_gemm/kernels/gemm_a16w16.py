"""Triton GEMM ``C = A @ B.T (+ bias)`` for 16-bit A (M, K) and B (N, K), any M/N/K, with split-K and a Hopper variant.

Two kernels compute a tile of C:

* :func:`_gemm_a16w16_kernel` -- the classic tiled kernel of Triton's matmul tutorial: one program per
  ``BLOCK_SIZE_M x BLOCK_SIZE_N`` tile (grouped ordering for L2 reuse), pointer loads masked only on the K tail (rows
  past M/N are wrapped with ``%`` so loads stay in bounds; stores are masked). With ``NUM_KSPLIT > 1`` a second grid
  axis splits K; each split writes float32 partial sums to a workspace and
  :func:`~aiter_gemm.kernels.common.splitk_reduce` adds them in a fixed order (deterministic), adds the bias and
  casts to the output dtype, so no partial sum is lost to a low precision intermediate.
* :func:`_gemm_a16w16_tma_persistent_kernel` -- the Hopper variant of Triton's persistent-matmul tutorial: one
  program per SM loops over output tiles, A and B tiles arrive through TMA tensor descriptors (the bulk tensor copy
  engine; out-of-bounds boxes are zero-filled, so no masks). It needs a GPU with TMA (sm_90+) and 16-byte aligned
  rows; :func:`~aiter_gemm.kernels.common.tma_usable` says when, and the launcher falls back to the classic kernel
  otherwise (the interpreter, misaligned or non-contiguous operands). ``FLATTEN`` merges its tile and K loops so the
  software pipeliner prefetches the next tile during this tile's epilogue (up to 1.34x at K=1024 on the H100,
  BENCHMARKS.md).

Under ``TRITON_INTERPRET=1`` (CPU tests) ``tl.dot`` operands are upcast to float32 because Triton 3.9's interpreter
returns garbage for a bf16 ``tl.dot``; on a GPU the dot runs on 16-bit operands with float32 accumulation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from aiter_gemm.dtypes import HALF_DTYPES, OUT_DTYPES
from aiter_gemm.kernels.common import (
    INTERPRET,
    MAX_ACC_NUMEL,
    MAX_GROUP_SIZE_M,
    MAX_KSPLIT,
    MAX_STAGES,
    MAX_TILE_NUMEL,
    KernelName,
    bias_agnostic,
    bias_stride_of,
    splitk_reduce,
    tile_coords,
    tma_usable,
)

__all__ = ["INTERPRET", "GemmConfig", "check_operands", "default_config",
           "gemm_a16w16", "gemm_a16w16_ref", "launch_gemm_a16w16", "splitk_reduce", "tma_available", "tma_usable"]

try:  # host-side TMA descriptors: Triton >= 3.4 (the device machine has 3.6, CI 3.9)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: the TMA variant is simply unavailable
    TensorDescriptor = None



#: The ``kernelName`` grammar (:attr:`GemmConfig.name`).
NAME = KernelName("BM{BM}_BN{BN}_BK{BK}_GM{GM}_SK{SK}_W{W}_S{S}[{kernel:_TMA|_TMAF|_SP}]", "triton kernelName",
                  "; e.g. 'BM128_BN128_BK64_GM8_SK1_W8_S3'")


@dataclass(frozen=True)
class GemmConfig:
    """One point of the Triton GEMM config space; ``name`` is the CSV ``kernelName`` spelling of it."""

    BLOCK_SIZE_M: int = 64
    BLOCK_SIZE_N: int = 64
    BLOCK_SIZE_K: int = 64
    GROUP_SIZE_M: int = 8
    NUM_KSPLIT: int = 1
    num_warps: int = 4
    num_stages: int = 3
    TMA_PERSISTENT: bool = False
    FLATTEN: bool = False  # TMA kernel only: flatten the tile and K loops so the next tile's loads overlap the epilogue
    #: Classic kernel only: compile N and K in (a binary per weight shape, as Inductor's templates are; the skinny
    #: kernels' ``_SP``). Name suffix _SP.
    SPECIALIZE: bool = False

    def __post_init__(self) -> None:
        """The config's ranges, on any shape (shared memory and split sizes: the backend's ``config_error``)."""
        for field in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
            v = getattr(self, field)
            if v < 16 or v & (v - 1):  # tl.dot needs every dimension >= 16; Triton blocks are powers of two
                raise ValueError(f"{field}={v} must be a power of two >= 16")
        bm, bn, bk = self.BLOCK_SIZE_M, self.BLOCK_SIZE_N, self.BLOCK_SIZE_K
        if max(bm, bn) * bk > MAX_TILE_NUMEL:
            raise ValueError(f"operand tiles of {bm}x{bk} and {bn}x{bk}: Triton compiles none above {MAX_TILE_NUMEL} "
                             "elements")
        if bm * bn > MAX_ACC_NUMEL:
            raise ValueError(f"a {bm}x{bn} accumulator tile is above {MAX_ACC_NUMEL} elements")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps={self.num_warps} must be one of 1, 2, 4, 8, 16")
        for field, most in (("GROUP_SIZE_M", MAX_GROUP_SIZE_M), ("NUM_KSPLIT", MAX_KSPLIT),
                            ("num_stages", MAX_STAGES)):
            if not 1 <= getattr(self, field) <= most:
                raise ValueError(f"{field}={getattr(self, field)} must be in 1..{most}")
        if self.TMA_PERSISTENT and self.NUM_KSPLIT != 1:
            raise ValueError("the TMA persistent variant does not split K (NUM_KSPLIT must be 1)")
        if self.FLATTEN and not self.TMA_PERSISTENT:
            raise ValueError("FLATTEN applies to the TMA persistent variant only")
        if self.SPECIALIZE and self.TMA_PERSISTENT:
            raise ValueError("SPECIALIZE (_SP) applies to the classic kernel only, not the TMA persistent variant")

    @property
    def name(self) -> str:
        return NAME.format({
            "BM": self.BLOCK_SIZE_M, "BN": self.BLOCK_SIZE_N, "BK": self.BLOCK_SIZE_K, "GM": self.GROUP_SIZE_M,
            "SK": self.NUM_KSPLIT, "W": self.num_warps, "S": self.num_stages,
            "kernel": "_TMAF" if self.FLATTEN else "_TMA" if self.TMA_PERSISTENT else "_SP" if self.SPECIALIZE
            else None,
        })

    @classmethod
    def from_name(cls, name: str) -> GemmConfig:
        """Parse a ``kernelName`` such as ``BM128_BN128_BK64_GM8_SK1_W8_S3`` (suffix ``_TMA``: persistent TMA
        kernel; ``_TMAF``: the same with flattened loops; ``_SP``: the classic kernel with N and K compiled in)."""
        v = NAME.parse(name)
        sfx = v["kernel"]
        return cls(v["BM"], v["BN"], v["BK"], v["GM"], v["SK"], v["W"], v["S"], sfx in ("_TMA", "_TMAF"),
                   sfx == "_TMAF", sfx == "_SP")

    def smem_bytes(self, itemsize: int = 2) -> int:
        """Shared memory the software pipeline needs: ``num_stages`` buffers of an A and a B tile."""
        return self.num_stages * (self.BLOCK_SIZE_M + self.BLOCK_SIZE_N) * self.BLOCK_SIZE_K * itemsize




@triton.jit(**bias_agnostic())
def _gemm_a16w16_kernel(
    a_ptr, b_ptr, bias_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak, stride_bn, stride_bk,
    stride_cs, stride_cm, stride_cn, stride_bias,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, NUM_KSPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, UPCAST_DOT: tl.constexpr,
    SPEC_N: tl.constexpr = 0, SPEC_K: tl.constexpr = 0,
):
    """One (M, N) tile over one K split; NUM_KSPLIT == 1 writes C, else float32 partials at c_ptr[pid_k].
    ``SPEC_N``/``SPEC_K`` > 0 compile the weight's shape in (``GemmConfig.SPECIALIZE``); 0 keeps the runtime N, K."""
    if SPEC_N > 0:  # a static branch: N and K become compile-time constants below
        N = SPEC_N
        K = SPEC_K
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    pid_m, pid_n = tile_coords(pid, num_pid_m, num_pid_n, GROUP_SIZE_M)

    # Each split owns whole BLOCK_SIZE_K tiles, so only the last split can see a ragged K tail.
    k_tiles_per_split = tl.cdiv(tl.cdiv(K, BLOCK_SIZE_K), NUM_KSPLIT)
    k_start = pid_k * k_tiles_per_split * BLOCK_SIZE_K
    k_len = min(K - k_start, k_tiles_per_split * BLOCK_SIZE_K)

    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    # Rows past M (columns past N) re-read valid rows instead of masking: loads stay unmasked, stores are masked.
    offs_am = offs_m % M
    offs_bn = offs_n % N
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + (k_start + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + offs_bn[:, None] * stride_bn + (k_start + offs_k)[None, :] * stride_bk

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for ki in range(0, tl.cdiv(k_len, BLOCK_SIZE_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_mask = offs_k[None, :] < k_len - ki * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=k_mask, other=0.0)
            b = tl.load(b_ptrs, mask=k_mask, other=0.0)
        if UPCAST_DOT:
            acc = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(b), acc)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    c_ptrs = c_ptr + pid_k * stride_cs + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    if NUM_KSPLIT == 1:
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0)
            acc += bias.to(tl.float32)[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
    else:
        tl.store(c_ptrs, acc, mask=c_mask)


@triton.jit(**bias_agnostic())
def _gemm_a16w16_tma_persistent_kernel(
    a_desc, b_desc, bias_ptr, c_ptr,
    M, N, K,
    stride_cm, stride_cn, stride_bias,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, NUM_SMS: tl.constexpr, HAS_BIAS: tl.constexpr, FLATTEN: tl.constexpr,
):
    """Persistent Hopper kernel: NUM_SMS programs stride over the output tiles; TMA loads zero-fill past M/N/K.
    FLATTEN merges the tile and K loops for the software pipeliner (the next tile's loads overlap this epilogue)."""
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    num_tiles = num_pid_m * num_pid_n
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)
        off_m = pid_m * BLOCK_SIZE_M
        off_n = pid_n * BLOCK_SIZE_N
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([off_m, ki * BLOCK_SIZE_K])
            b = b_desc.load([off_n, ki * BLOCK_SIZE_K])
            acc = tl.dot(a, b.T, acc)
        offs_m = off_m + tl.arange(0, BLOCK_SIZE_M)
        offs_n = off_n + tl.arange(0, BLOCK_SIZE_N)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0)
            acc += bias.to(tl.float32)[None, :]
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def tma_available() -> bool:
    """Whether TMA descriptors can be used at all here: host descriptors importable, a GPU of sm_90+, no interpreter."""
    if INTERPRET or TensorDescriptor is None or not torch.cuda.is_available() or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability()[0] >= 9


def launch_gemm_a16w16(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                       config: GemmConfig, num_sms: int = 0) -> torch.Tensor:
    """Launch ``config`` on already validated operands, writing ``out`` (M, N); no checks beyond TMA alignment."""
    M, K = a.shape
    N = b.shape[0]
    cfg = config
    bias_stride = bias_stride_of(bias)
    if cfg.TMA_PERSISTENT and num_sms > 0 and not INTERPRET and tma_usable(a) and tma_usable(b):
        a_desc = TensorDescriptor.from_tensor(a, [cfg.BLOCK_SIZE_M, cfg.BLOCK_SIZE_K])
        b_desc = TensorDescriptor.from_tensor(b, [cfg.BLOCK_SIZE_N, cfg.BLOCK_SIZE_K])
        num_tiles = triton.cdiv(M, cfg.BLOCK_SIZE_M) * triton.cdiv(N, cfg.BLOCK_SIZE_N)
        _gemm_a16w16_tma_persistent_kernel[(min(num_sms, num_tiles),)](
            a_desc, b_desc, bias if bias is not None else out, out, M, N, K, out.stride(0), out.stride(1),
            bias_stride,
            BLOCK_SIZE_M=cfg.BLOCK_SIZE_M, BLOCK_SIZE_N=cfg.BLOCK_SIZE_N, BLOCK_SIZE_K=cfg.BLOCK_SIZE_K,
            GROUP_SIZE_M=cfg.GROUP_SIZE_M, NUM_SMS=min(num_sms, num_tiles), HAS_BIAS=bias is not None,
            FLATTEN=cfg.FLATTEN, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        return out
    # The classic kernel (also the fallback of a TMA config on operands TMA cannot read).
    num_tiles = triton.cdiv(M, cfg.BLOCK_SIZE_M) * triton.cdiv(N, cfg.BLOCK_SIZE_N)
    split = cfg.NUM_KSPLIT
    if split > 1:
        target = torch.empty((split, M, N), dtype=torch.float32, device=a.device)
        strides = (target.stride(0), target.stride(1), target.stride(2))
    else:
        target = out
        strides = (0, out.stride(0), out.stride(1))
    _gemm_a16w16_kernel[(num_tiles, split)](
        a, b, bias if bias is not None else a, target, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), *strides, bias_stride,
        BLOCK_SIZE_M=cfg.BLOCK_SIZE_M, BLOCK_SIZE_N=cfg.BLOCK_SIZE_N, BLOCK_SIZE_K=cfg.BLOCK_SIZE_K,
        GROUP_SIZE_M=cfg.GROUP_SIZE_M, NUM_KSPLIT=split, HAS_BIAS=bias is not None and split == 1,
        EVEN_K=K % cfg.BLOCK_SIZE_K == 0, UPCAST_DOT=INTERPRET,
        SPEC_N=N if cfg.SPECIALIZE else 0, SPEC_K=K if cfg.SPECIALIZE else 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if split > 1:
        splitk_reduce(target, bias, out)
    return out


def check_operands(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, otype: torch.dtype) -> None:
    """Raise a ValueError naming the offending tensor (shape, dtype) unless ``a @ b.T + bias`` is supported."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"gemm_a16w16 needs a (M, K) and b (N, K); got a {tuple(a.shape)} {a.dtype}, "
                         f"b {tuple(b.shape)} {b.dtype}")
    if a.dtype not in HALF_DTYPES or b.dtype != a.dtype:
        raise ValueError(f"gemm_a16w16 needs a and b both bf16 or fp16; got a {a.dtype}, b {b.dtype}")
    if otype not in OUT_DTYPES:
        raise ValueError(f"gemm_a16w16 output dtype must be bf16, fp16 or fp32, got {otype}")
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} but b is on {b.device}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != b.shape[0] or bias.device != a.device):
        raise ValueError(f"bias must be ({b.shape[0]},) on {a.device}; got {tuple(bias.shape)} {bias.dtype} "
                         f"on {bias.device}")
    if a.shape[0] == 0 or b.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"gemm_a16w16 needs non-empty operands; got a {tuple(a.shape)}, b {tuple(b.shape)}")


def default_config(M: int, N: int, K: int) -> GemmConfig:
    """A sane config when nothing is tuned: tile to M (16..128 rows), 8 warps for 128x128 tiles."""
    if M <= 16:
        return GemmConfig(16, 64, 128, 1, 1, 4, 4)
    if M <= 32:
        return GemmConfig(32, 64, 128, 1, 1, 4, 4)
    if M <= 64:
        return GemmConfig(64, 64, 64, 8, 1, 4, 4)
    return GemmConfig(128, 128, 64, 8, 1, 8, 3)


def gemm_a16w16(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                otype: torch.dtype | None = None, config: GemmConfig | None = None) -> torch.Tensor:
    """``a @ b.T (+ bias)`` in ``otype`` (default ``a.dtype``) with ``config`` (default: :func:`default_config`)."""
    otype = a.dtype if otype is None else otype
    check_operands(a, b, bias, otype)
    M, K = a.shape
    N = b.shape[0]
    cfg = config or default_config(M, N, K)
    out = torch.empty((M, N), dtype=otype, device=a.device)
    num_sms = torch.cuda.get_device_properties(a.device).multi_processor_count if a.is_cuda else 0
    return launch_gemm_a16w16(a, b, bias, out, cfg, num_sms)


def gemm_a16w16_ref(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                    otype: torch.dtype | None = None) -> torch.Tensor:
    """Float32 reference: upcast, multiply, add bias, cast to ``otype``."""
    out = a.float() @ b.float().t()
    if bias is not None:
        out = out + bias.float()
    return out.to(a.dtype if otype is None else otype)
