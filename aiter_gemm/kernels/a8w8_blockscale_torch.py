"""A8W8 block-scale GEMM through torch's own block-scaled matmul: ``F.scaled_mm`` with ``BlockWise1x128``
activation scales and ``BlockWise128x128`` weight scales, which torch runs with cuBLASLt on Hopper.

The second implementation :func:`aiter_gemm.gemm_a8w8_blockscale` can dispatch to (CSV ``libtype=torch``,
``kernelName`` :data:`NAME`; JSON entry :meth:`TorchBlockwise.to_json`). On the H100 it ran 1.2-1.4x faster than our
Triton kernel at M >= 1024 and slower at M <= 256 (op_tests/op_benchmarks/results/a8w8_blockscale/h100_run3_final),
so the tuner times both and the table decides per shape.

cuBLASLt wants, and this launcher prepares per call: M padded to a multiple of 4 (a copy of XQ when it is not),
x_scale M-major (strides ``(1, M)``; a transposing copy of M * K/128 floats unless the caller's quantizer already
writes it that way, as vLLM's ``column_major_scales`` does) and w_scale passed K-major (a view). Only the layouts
verified on the H100 are claimed (:func:`shape_error`): K a multiple of 512 (K blocks a multiple of 4: no scale
padding), N a multiple of 16, bf16 output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

__all__ = ["LIBTYPE", "NAME", "TorchBlockwise", "gemm_a8w8_blockscale_torch", "shape_error", "unavailable_reason"]

LIBTYPE = "torch"
NAME = "scaled_mm_blockwise"
_OUT_DTYPE = torch.bfloat16


@dataclass(frozen=True)
class TorchBlockwise:
    """The torch implementation as a dispatch choice, next to :class:`~aiter_gemm.kernels.a8w8_blockscale.
    BlockscaleConfig`: same ``name`` / ``NUM_KSPLIT`` / ``to_json`` surface, no parameters."""

    name: ClassVar[str] = NAME
    libtype: ClassVar[str] = LIBTYPE
    variant: ClassVar[str] = LIBTYPE
    NUM_KSPLIT: ClassVar[int] = 1

    def to_json(self) -> dict[str, object]:
        return {"libtype": LIBTYPE, "kernelName": NAME}

    @classmethod
    def from_json(cls, entry: dict[str, object]) -> "TorchBlockwise":
        if entry != {"libtype": LIBTYPE, "kernelName": NAME}:
            raise ValueError(f"a libtype {LIBTYPE!r} entry must be exactly {{'libtype': {LIBTYPE!r}, "
                             f"'kernelName': {NAME!r}}}, got {entry!r}")
        return cls()


def unavailable_reason(device: torch.device) -> str | None:
    """Why this torch cannot run block-scaled fp8 matmuls on ``device``; None when it can (CUDA, sm_90 or newer,
    ``F.scaled_mm`` with block-wise recipes: torch >= 2.10)."""
    F = torch.nn.functional
    if not (hasattr(F, "scaled_mm") and hasattr(F, "ScalingType")
            and hasattr(F.ScalingType, "BlockWise128x128")):
        return f"torch {torch.__version__} has no F.scaled_mm with BlockWise128x128 scaling"
    if device.type != "cuda" or getattr(torch.version, "hip", None):
        return f"block-scaled F.scaled_mm runs on NVIDIA GPUs (device {device})"
    if torch.cuda.get_device_capability(device) < (9, 0):
        return f"block-scaled F.scaled_mm needs sm_90 or newer, {torch.cuda.get_device_name(device)} is older"
    return None


def shape_error(M: int, N: int, K: int, dtype: torch.dtype = _OUT_DTYPE) -> str | None:
    """Why this implementation is not used for (M, N, K) -> ``dtype``; None if it is."""
    if M < 1:
        return f"empty problem M={M}"
    if dtype != _OUT_DTYPE:
        return f"output {dtype}: only {_OUT_DTYPE} is supported"
    if K % 512:
        return f"K={K} is not a multiple of 512 (K blocks a multiple of 4: the layout verified on the H100)"
    if N % 16:
        return f"N={N} is not a multiple of 16"
    return None


def gemm_a8w8_blockscale_torch(XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                               dtype: torch.dtype = _OUT_DTYPE) -> torch.Tensor:
    """``(XQ * x_scale) @ (WQ * w_scale).T`` by ``F.scaled_mm`` (shapes as :func:`aiter_gemm.gemm_a8w8_blockscale`
    validated them); returns a new (M, N) tensor (rows of a padded one when M is not a multiple of 4)."""
    F = torch.nn.functional
    M, K = XQ.shape
    N = WQ.shape[0]
    why = shape_error(M, N, K, dtype)
    if why is not None:
        raise ValueError(f"gemm_a8w8_blockscale_torch: {why}")
    pad = -M % 4
    if pad:
        a = torch.zeros((M + pad, K), dtype=XQ.dtype, device=XQ.device)
        a[:M] = XQ
        # (M + pad, K/128) M-major: allocate transposed, fill, view back. Ones in the pad rows keep them finite.
        sa = torch.ones((x_scale.shape[1], M + pad), dtype=x_scale.dtype, device=x_scale.device)
        sa[:, :M] = x_scale.t()
        sa = sa.t()
    else:
        a = XQ if XQ.is_contiguous() else XQ.contiguous()
        sa = x_scale if x_scale.stride() == (1, M) else x_scale.t().contiguous().t()
    b = WQ if WQ.is_contiguous() else WQ.contiguous()
    sb = w_scale if w_scale.is_contiguous() else w_scale.contiguous()
    st = F.ScalingType
    out = F.scaled_mm(a, b.t(), sa, st.BlockWise1x128, sb.t(), st.BlockWise128x128, output_dtype=dtype)
    return out[:M] if pad else out
