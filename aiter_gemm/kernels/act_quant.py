"""Dynamic fp8 activation quantization per token and 128-wide K group, in one Triton launch: the activation side of
:func:`aiter_gemm.gemm_a8w8_blockscale` for FP8 models (transformers' ``FP8Linear``, DeepSeek-style checkpoints). For
x (M, K) it writes XQ (M, K) fp8 e4m3 and x_scale (M, ceil(K/128)) float32 with ``x ~= XQ * x_scale`` per group:
``x_scale = max(amax(|group|) / 448, 1e-12)``, ``XQ = clamp(x / x_scale, -448, 448)`` (the format's rule,
:mod:`aiter_gemm.kernels.blockscale_format`, as transformers' and vLLM's quantizers apply it). One program per (row,
group): the group is loaded once, reduced and written, so the whole step is one read of x and one write of XQ. On a
GPU each shape's launch is bound once and later calls launch it from C++ (:mod:`aiter_gemm.triton_launch`), without
Triton's Python launcher. ``m_major=True`` writes x_scale with strides (1, M), the layout torch's block-scaled matmul
takes without a copy; the Triton GEMM takes either. :func:`per_token_group_quant_fp8_ref` is the torch reference.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from aiter_gemm import triton_launch
from aiter_gemm.dtypes import OUT_DTYPES
from aiter_gemm.kernels.blockscale_format import FP8, FP8_MAX, MIN_SCALE, SCALE_BLOCK
from aiter_gemm.kernels.common import INTERPRET

#: The quantization rule's constants as kernels read them from globals (``quant_rows``' arguments).
FP8_MAX_TL = tl.constexpr(FP8_MAX)
MIN_SCALE_TL = tl.constexpr(MIN_SCALE)

__all__ = ["FP8", "FP8_MAX_TL", "GROUP", "MIN_SCALE_TL", "TABLES", "clear_plans", "per_token_group_quant_fp8",
           "per_token_group_quant_fp8_ref", "quant_rows", "quant_triton"]

GROUP = SCALE_BLOCK


@triton.jit
def _quant_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, stride_sm, stride_sg,
                  FP8_MAX: tl.constexpr, EPS: tl.constexpr, GROUP_SIZE: tl.constexpr):
    row = tl.program_id(0)
    g = tl.program_id(1)
    cols = g * GROUP_SIZE + tl.arange(0, GROUP_SIZE)
    mask = cols < K
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) / FP8_MAX, EPS)
    q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + row * stride_qm + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * stride_sm + g * stride_sg, scale)


@triton.jit
def _round_fp8_e4m3(x):
    """float32 ``x`` (|x| <= 448) rounded to the nearest e4m3 value, ties to even, kept in float32: the cast the
    interpreter gets wrong, done in float32 arithmetic (3 mantissa bits; below 2^-6 a fixed step of 2^-9)."""
    exponent = tl.maximum(((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)
    step = ((exponent + 124) << 23).to(tl.float32, bitcast=True)  # 2^(exponent - 3)
    magic = 12582912.0  # 1.5 * 2^23: adding and subtracting it rounds |x / step| < 2^22 to an integer, ties to even
    return ((x / step + magic) - magic) * step


@triton.jit
def quant_rows(x, FP8_MAX: tl.constexpr, EPS: tl.constexpr, EMULATE: tl.constexpr):
    """(q, scale) of a float32 (rows, group) tile, one group per row, by this module's rule: ``scale`` (rows,) =
    max(amax / FP8_MAX, EPS), ``q`` = clamp(x / scale) in fp8 e4m3 (``EMULATE``: in float32 holding e4m3 values,
    for the interpreter). The fused-MoE kernels quantize their activation tiles with it."""
    scale = tl.maximum(tl.max(tl.abs(x), axis=1) / FP8_MAX, EPS)
    q = tl.clamp(x / scale[:, None], -FP8_MAX, FP8_MAX)
    if EMULATE:
        q = _round_fp8_e4m3(q)
    else:
        q = q.to(tl.float8e4nv)
    return q, scale


def _check(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"per_token_group_quant_fp8: x must be a 2-D tensor (M, K), got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    if x.dtype not in OUT_DTYPES:
        raise TypeError(f"per_token_group_quant_fp8: x (shape {tuple(x.shape)}, dtype {x.dtype}) must be one of "
                        f"{list(OUT_DTYPES)}")


def _scale_out(M: int, groups: int, m_major: bool, device: torch.device) -> torch.Tensor:
    if m_major:
        return torch.empty_strided((M, groups), (1, M), dtype=torch.float32, device=device)
    return torch.empty((M, groups), dtype=torch.float32, device=device)


#: Bound launches (:mod:`aiter_gemm.triton_launch`) per (shape, strides, dtype, device, m_major) of x, None where
#: the launch cannot be bound (Triton's launcher runs): what was tried. The key fixes every integer argument.
_PLANS: dict[tuple, Any] = {}
_MAX_PLANS = 4096  # distinct prefill lengths each bind one; past this many the cache starts over
#: The bound plans again, in the extension's plan tables (row-major and M-major x_scale), which find a call's plan
#: from x itself in C++ (no Python key per call); the FP8Linear twin's C++ call reads the M-major one.
TABLES = None if triton_launch.EXT is None else (triton_launch.EXT.triton_table(), triton_launch.EXT.triton_table())
_run_table = None if TABLES is None else triton_launch.EXT.triton_table_run


def clear_plans() -> None:
    """Forget every bound launch (the next call of each shape binds again)."""
    _PLANS.clear()
    if TABLES is not None:
        for table in TABLES:
            triton_launch.EXT.triton_table_clear(table)


def per_token_group_quant_fp8(x: torch.Tensor, m_major: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(XQ, x_scale) of x (M, K) bf16/fp16/fp32, one launch (see the module docstring). Rows may be strided (the
    last dimension must be contiguous: a copy is made otherwise); no host sync, so it runs in CUDA graphs. On a GPU
    a shape's first call binds the launch (:mod:`aiter_gemm.triton_launch`) and later calls run it from C++. CPU
    tensors run the kernel under ``TRITON_INTERPRET=1``, else the torch reference (the same results)."""
    if _run_table is not None:
        out = _run_table(TABLES[1 if m_major else 0], x)
        if out is not None:
            return out
    try:
        key = (x.shape, x.stride(), x.dtype, x.device, m_major)
    except AttributeError:  # not a tensor: _check says so
        key = None
    if key is not None and not (x.is_cuda or INTERPRET):  # compiled Triton takes no CPU tensor: the torch rule runs
        return per_token_group_quant_fp8_ref(x, m_major)
    return quant_triton(x, m_major, key is not None and key not in _PLANS and x.is_cuda and _run_table is not None)


def quant_triton(x: torch.Tensor, m_major: bool = False, bind: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`per_token_group_quant_fp8` through Triton's launcher (``bind``: then bind the launch for x's key);
    the benchmarks' reference for the bound launch."""
    _check(x)
    key = (x.shape, x.stride(), x.dtype, x.device, m_major)
    if x.stride(-1) != 1:
        x, bind = x.contiguous(), False
    M, K = x.shape
    groups = triton.cdiv(K, GROUP)
    # Triton 3.9's interpreter rounds float32 -> fp8 wrongly (126.2 became 64): interpreted, the kernel writes the
    # float32 quotients and torch rounds them.
    q = torch.empty((M, K), dtype=torch.float32 if INTERPRET else FP8, device=x.device)
    s = _scale_out(M, groups, m_major, x.device)
    if M and K:
        grid = (M, groups)
        args = {"x_ptr": x, "q_ptr": q, "s_ptr": s, "K": K, "stride_xm": x.stride(0), "stride_qm": q.stride(0),
                "stride_sm": s.stride(0), "stride_sg": s.stride(1)}
        compiled = _quant_kernel[grid](**args, FP8_MAX=FP8_MAX, EPS=MIN_SCALE, GROUP_SIZE=GROUP, num_warps=1)
        if bind and not INTERPRET:
            if len(_PLANS) >= _MAX_PLANS:
                clear_plans()
            plan = _PLANS[key] = triton_launch.bind(compiled, grid, args, (x,), (q, s))
            if plan is not None and TABLES is not None:
                triton_launch.EXT.triton_table_add(TABLES[1 if m_major else 0], plan)
    return (q.to(FP8) if INTERPRET else q), s


def per_token_group_quant_fp8_ref(x: torch.Tensor, m_major: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch reference of :func:`per_token_group_quant_fp8` (same rule, same layouts)."""
    _check(x)
    M, K = x.shape
    groups = -(-K // GROUP)
    xp = torch.nn.functional.pad(x.float(), (0, groups * GROUP - K)).view(M, groups, GROUP)
    scale = (xp.abs().amax(dim=2) / FP8_MAX).clamp(min=MIN_SCALE)
    q = (xp / scale[:, :, None]).clamp(-FP8_MAX, FP8_MAX).view(M, groups * GROUP)[:, :K].to(FP8).contiguous()
    return q, _scale_out(M, groups, m_major, x.device).copy_(scale)
