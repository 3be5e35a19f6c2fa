"""The FP8 block-scale data format (DeepSeek-V3 / Qwen3-FP8 checkpoints, AITER's ``gemm_a8w8_blockscale``): one
definition for every kernel, quantizer, backend and checker of it.

XQ (M, K) and WQ (N, K) are fp8 e4m3; x_scale holds one float32 per row and :data:`SCALE_BLOCK`-wide K group,
w_scale one per (:data:`SCALE_BLOCK`, :data:`SCALE_BLOCK`) weight block. A group's scale is
``max(amax(|group|) / FP8_MAX, MIN_SCALE)`` and its values ``clamp(x / scale, -FP8_MAX, FP8_MAX)``.
"""

from __future__ import annotations

import torch

__all__ = ["FP8", "FP8_MAX", "FP8_ROUNDING", "MIN_SCALE", "SCALE_BLOCK", "zero_operands"]

#: Quantization block: the K groups of x_scale and both sides of w_scale's blocks. Fixed by the data format.
SCALE_BLOCK = 128
#: The fp8 dtype of XQ and WQ (e4m3 as NVIDIA GPUs run it).
FP8 = torch.float8_e4m3fn
#: The largest finite value of :data:`FP8` (448): a group's amax maps to it.
FP8_MAX = float(torch.finfo(FP8).max)
#: Smallest scale: an all-zero group quantizes to zeros instead of dividing by zero.
MIN_SCALE = 1e-12
#: Relative rounding of :data:`FP8` (3 mantissa bits): quantizing moves a value by at most 2^-4 of itself, the
#: most two arithmetics that differ by one such rounding (an FP8 MoE's intermediate quantized or not) stand apart.
FP8_ROUNDING = 2.0 ** -4


def zero_operands(M: int, N: int, K: int, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(XQ, WQ, x_scale, w_scale) of an (M, N, K) GEMM: zero FP8 operands, unit scales, x_scale row-major (as the
    tuner's inputs): what a call that only builds or warms the kernels of that shape runs on."""
    kb, nb = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK)
    return (torch.zeros((M, K), dtype=FP8, device=device), torch.zeros((N, K), dtype=FP8, device=device),
            torch.ones((M, kb), device=device), torch.ones((nb, kb), device=device))
