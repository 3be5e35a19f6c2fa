"""A8W8 block-scale GEMM through torch's own block-scaled matmul: ``F.scaled_mm`` with ``BlockWise1x128``
activation scales and ``BlockWise128x128`` weight scales, which torch runs with cuBLASLt on Hopper.

The second implementation :func:`aiter_gemm.gemm_a8w8_blockscale` can dispatch to (CSV ``libtype=torch``,
``kernelName`` :data:`NAME`; JSON entry :meth:`TorchBlockwise.to_json`). On the H100 it ran 1.2-1.4x faster than our
Triton kernel at M >= 1024 and slower at M <= 256 (docs/exploration.md),
so the tuner times both and the table decides per shape.

cuBLASLt wants, and the launchers prepare per call: M padded to a multiple of 4 (a copy of XQ when it is not),
x_scale M-major (strides ``(1, M)``; a transposing copy of M * K/128 floats unless the caller's quantizer already
writes it that way, as vLLM's ``column_major_scales`` does) and w_scale passed K-major (a view). Only the layouts
verified on the H100 are claimed (:func:`shape_error`): K a multiple of 512 (K blocks a multiple of 4: no scale
padding), N a multiple of 16, bf16 output. :func:`gemm_a8w8_blockscale_torch` is the plain per-call use of torch's
public API (the benchmarks' baseline); :func:`launcher` binds a runner to one shape for the dispatcher, as the
Triton and cuBLASLt backends do. Outside the dispatcher (the HF loop's torch arm), ``launcher(..., padded_scales=True)``
takes any K multiple of 128 with w_scale's K blocks padded to a multiple of 4 (:func:`pad_scale_blocks`), the layout
torch's own check of ``F.scaled_mm`` asks for there; the op's backend does not claim it (not verified on a GPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from aiter_gemm.kernels.common import NamedChoice

__all__ = ["LIBTYPE", "NAME", "TorchBlockwise", "direct_op", "gemm_a8w8_blockscale_torch", "launcher",
           "pad_scale_blocks", "shape_error", "unavailable_reason"]

LIBTYPE = "torch"
NAME = "scaled_mm_blockwise"
_OUT_DTYPE = torch.bfloat16


@dataclass(frozen=True)
class TorchBlockwise(NamedChoice):
    """The torch implementation as a dispatch choice, next to :class:`~aiter_gemm.kernels.a8w8_blockscale.
    BlockscaleConfig`: same ``name`` / ``NUM_KSPLIT`` / ``to_json`` surface, no parameters."""

    name: ClassVar[str] = NAME
    libtype: ClassVar[str] = LIBTYPE


def unavailable_reason(device: torch.device) -> str | None:
    """Why this torch cannot run block-scaled fp8 matmuls on ``device``; None when it can (CUDA, sm_90 or newer,
    ``F.scaled_mm`` with block-wise recipes: torch >= 2.10)."""
    F = torch.nn.functional
    if not (hasattr(F, "scaled_mm") and hasattr(F, "ScalingType")
            and hasattr(F.ScalingType, "BlockWise128x128")):
        return f"torch {torch.__version__} has no F.scaled_mm with BlockWise128x128 scaling"
    if device.type != "cuda" or getattr(torch.version, "hip", None):
        return f"block-scaled F.scaled_mm runs on NVIDIA GPUs (device {device})"
    if not torch.cuda.is_available():  # e.g. a CUDA device identity forced on a CPU-only build
        return f"torch {torch.__version__} sees no CUDA device"
    if torch.cuda.get_device_capability(device) < (9, 0):
        return f"block-scaled F.scaled_mm needs sm_90 or newer, {torch.cuda.get_device_name(device)} is older"
    return None


def shape_error(M: int, N: int, K: int, dtype: torch.dtype = _OUT_DTYPE, padded_scales: bool = False) -> str | None:
    """Why this implementation is not used for (M, N, K) -> ``dtype``; None if it is. ``padded_scales``: w_scale
    comes with its K blocks padded to a multiple of 4 (:func:`pad_scale_blocks`), so K need only be whole blocks."""
    if M < 1:
        return f"empty problem M={M}"
    if dtype != _OUT_DTYPE:
        return f"output {dtype}: only {_OUT_DTYPE} is supported"
    if padded_scales and K % 128:
        return f"K={K} is not a multiple of 128"
    if K % 512 and not padded_scales:
        return f"K={K} is not a multiple of 512 (K blocks a multiple of 4: the layout verified on the H100)"
    if N % 16:
        return f"N={N} is not a multiple of 16"
    return None


def _operands(XQ: torch.Tensor, x_scale: torch.Tensor, M: int, K: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """XQ and x_scale as cuBLASLt takes them: M + ``pad`` rows (a multiple of 4), A row-major, x_scale M-major.
    Pad rows are left uninitialised: each output row depends only on its own A row and scales, and pad rows are
    sliced off (zeros and ones there cost two fill launches per call, ~5 us each on the H100 host)."""
    if pad:
        a = XQ.new_empty((M + pad, K))
        a[:M].copy_(XQ)
        sa = x_scale.new_empty((x_scale.shape[1], M + pad)).t()  # M-major
        sa[:M].copy_(x_scale)
        return a, sa
    a = XQ if XQ.is_contiguous() else XQ.contiguous()
    if x_scale.stride() == (1, M):
        return a, x_scale
    return a, torch.empty_strided(x_scale.shape, (1, M), dtype=x_scale.dtype, device=x_scale.device).copy_(x_scale)


def _weights(WQ: torch.Tensor, w_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """B = WQ.t() column-major and w_scale K-major, as views of contiguous operands."""
    b = WQ if WQ.is_contiguous() else WQ.contiguous()
    sb = w_scale if w_scale.is_contiguous() else w_scale.contiguous()
    return b.t(), sb.t()


def gemm_a8w8_blockscale_torch(XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                               dtype: torch.dtype = _OUT_DTYPE) -> torch.Tensor:
    """``(XQ * x_scale) @ (WQ * w_scale).T`` by ``F.scaled_mm`` (shapes as :func:`aiter_gemm.gemm_a8w8_blockscale`
    validated them); returns a new (M, N) tensor (rows of a padded one when M is not a multiple of 4). The plain call
    of torch's public API, checked per call; the dispatched op runs :func:`launcher`'s runner, bound once per shape."""
    F = torch.nn.functional
    M, K = XQ.shape
    N = WQ.shape[0]
    why = shape_error(M, N, K, dtype)
    if why is not None:
        raise ValueError(f"gemm_a8w8_blockscale_torch: {why}")
    pad = -M % 4
    a, sa = _operands(XQ, x_scale, M, K, pad)
    b, sb = _weights(WQ, w_scale)
    st = F.ScalingType
    out = F.scaled_mm(a, b, sa, st.BlockWise1x128, sb, st.BlockWise128x128, output_dtype=dtype)
    return out[:M] if pad else out


def direct_op() -> Callable[..., torch.Tensor] | None:
    """``torch._scaled_mm_v2`` when ``F.scaled_mm`` is torch's own wrapper of it (torch 2.10-2.13: it turns single
    scales and recipes into lists and recipes into ints, then calls the op), else None (an older or newer torch, or
    an ``F.scaled_mm`` replaced by a test or a user: it is then called as is). Calling the op with arguments built
    once per shape saves the wrapper's ten helper calls per call (2.4 us on a CPU host)."""
    F = torch.nn.functional
    fn, op = getattr(F, "scaled_mm", None), getattr(torch, "_scaled_mm_v2", None)
    code = getattr(fn, "__code__", None)
    if op is None or code is None or getattr(fn, "__module__", None) != F.__name__:
        return None
    if "_scaled_mm_v2" not in code.co_names or code.co_varnames[:code.co_argcount + code.co_kwonlyargcount] != (
            "mat_a", "mat_b", "scale_a", "scale_recipe_a", "scale_b", "scale_recipe_b", "swizzle_a", "swizzle_b",
            "bias", "output_dtype", "contraction_dim", "use_fast_accum"):
        return None
    return op


def pad_scale_blocks(w_scale: torch.Tensor) -> torch.Tensor:
    """``w_scale`` (..., N/128, K/128) with its K blocks padded to a multiple of 4 (ones; ``w_scale`` itself when
    they already are), contiguous: what torch's block-scaled matmul reads when K/128 is not a multiple of 4."""
    kb = w_scale.shape[-1]
    if kb % 4 == 0 and w_scale.is_contiguous():
        return w_scale
    out = w_scale.new_ones((*w_scale.shape[:-1], -(-kb // 4) * 4))
    out[..., :kb] = w_scale
    return out


def launcher(M: int, N: int, K: int, dtype: torch.dtype = _OUT_DTYPE, padded_scales: bool = False
             ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]:
    """The runner of one shape (what the ``torch`` backend's ``prepare`` returns): the shape check, the padding and
    the scaled_mm arguments decided here, once; per call only the operands' layouts are made and the op called.
    Same arguments, same result as :func:`gemm_a8w8_blockscale_torch` (a GPU test compares them bit for bit).
    ``padded_scales``: the runner is handed :func:`pad_scale_blocks`' w_scale, and K need only be whole blocks."""
    why = shape_error(M, N, K, dtype, padded_scales)
    if why is not None:
        raise ValueError(f"gemm_a8w8_blockscale_torch: {why}")
    F = torch.nn.functional
    st = F.ScalingType
    pad = -M % 4
    op = direct_op()
    if op is None:
        scaled_mm, ra, rb = F.scaled_mm, st.BlockWise1x128, st.BlockWise128x128

        def run(XQ, WQ, x_scale, w_scale, dtype):
            a, sa = _operands(XQ, x_scale, M, K, pad)
            b, sb = _weights(WQ, w_scale)
            out = scaled_mm(a, b, sa, ra, sb, rb, output_dtype=dtype)
            return out[:M] if pad else out
        return run
    ra, rb, none = [st.BlockWise1x128.value], [st.BlockWise128x128.value], []

    def run_direct(XQ, WQ, x_scale, w_scale, dtype):
        a, sa = _operands(XQ, x_scale, M, K, pad)
        b, sb = _weights(WQ, w_scale)
        out = op(a, b, [sa], ra, none, [sb], rb, none, None, dtype, (), False)
        return out[:M] if pad else out
    return run_direct
