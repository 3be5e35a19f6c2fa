"""Backends of the ``gemm_a8w8_blockscale`` op (:mod:`aiter_gemm.ops.a8w8_blockscale`): ``triton`` (our kernels,
:mod:`aiter_gemm.kernels.a8w8_blockscale`) and ``torch`` (torch's block-scaled ``F.scaled_mm``, cuBLASLt on Hopper).

Same contract as ``gemm_a16w16``'s backends (:class:`aiter_gemm.backends.base.Backend`); the runner signature is
``run(XQ, WQ, x_scale, w_scale, dtype) -> out (M, N)``. Each also says which x_scale layout its runners take
without a copy (``x_scale_m_major``), so FP8 models quantize activations in that layout
(:func:`aiter_gemm.ops.a8w8_blockscale.x_scale_m_major`). A config of any of them names its solution the same
way (:func:`solution_of`).
"""

from __future__ import annotations

from typing import Any

from aiter_gemm.backends.base import Solution


def solution_of(config: Any) -> Solution:
    """The solution (and tuned-row fields) naming a config of one of these backends (``BlockscaleConfig``,
    ``TileLangConfig``, ``TorchBlockwise``): its libtype, its split count (0 when unsplit), its name."""
    split = config.NUM_KSPLIT
    return Solution(config.libtype, -1, split if split > 1 else 0, config.name)

