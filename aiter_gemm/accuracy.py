"""Correctness of a runner's output against a float32 reference: ``err_ratio`` as AITER's tuner reports it, and the
relative error ``rel_error``. One definition for the tuner's check, ``kernel_check --verify`` and the benchmarks.

``err_ratio`` is the fraction of output elements outside ``isclose(out, ref, rtol, atol)``; an output holding any NaN
or Inf scores 1.0 (the whole result is unusable, however few such elements there are). The tuner generates inputs
so the exact outputs are about unit scale (A ~ N(0, 1), B ~ N(0, 1/K)), which is what makes one absolute tolerance
per dtype meaningful.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from aiter_gemm.dtypes import FP8_DTYPES


@dataclass(frozen=True)
class Tolerance:
    """``isclose`` tolerances for outputs of about unit scale, and why they are what they are."""

    rtol: float
    atol: float
    reason: str


# Keyed by dtype; a problem uses the looser of its input and output dtype's entries (see tolerance_for).
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.bfloat16: Tolerance(1e-2, 1e-2, "bf16 keeps 8 mantissa bits: rounding alone is up to 3.9e-3 relative; "
                                          "2.5x that leaves room for accumulation order and split-K"),
    torch.float16: Tolerance(2e-3, 2e-3, "fp16 keeps 11 bits: rounding is up to 4.9e-4 relative; 4x for "
                                         "accumulation order and split-K"),
    torch.float32: Tolerance(2e-3, 2e-3, "float32 outputs may come from TF32 tensor cores (10-bit mantissa: ~7e-4 "
                                         "typical error on unit-scale outputs); 3x that"),
    **{dt: Tolerance(1e-2, 1e-2, "fp8 inputs are exact in the float32 reference (it dequantizes the same values); "
                                 "the error is the output rounding and fp8 tensor cores' reduced-precision "
                                 "accumulation, as for bf16")
       for dt in FP8_DTYPES},
}


def tolerance_for(dtype: torch.dtype, otype: torch.dtype) -> Tolerance:
    """The looser of the input and output dtypes' tolerances (a bf16 GEMM with float32 output is still bf16-class:
    backends such as F.linear round to bf16 before the cast)."""
    try:
        a, b = TOLERANCES[dtype], TOLERANCES[otype]
    except KeyError as exc:
        known = sorted(map(str, TOLERANCES))
        raise KeyError(f"no err_ratio tolerance for dtype {exc.args[0]}; known: {known}") from None
    return a if (a.rtol, a.atol) >= (b.rtol, b.atol) else b


def err_ratio(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> float:
    """Fraction of elements of ``out`` outside ``isclose(ref)``; 1.0 if ``out`` has any NaN/Inf or the wrong shape."""
    if tuple(out.shape) != tuple(ref.shape):
        return 1.0
    if out.numel() == 0:
        return 0.0
    o = out.float()
    if not bool(torch.isfinite(o).all()):
        return 1.0
    bad = ~torch.isclose(o, ref.float(), rtol=tol.rtol, atol=tol.atol)
    return float(bad.sum().item()) / out.numel()


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64 (inf for NaN/Inf outputs or a wrong shape; 0 for an all-zero ref that
    ``out`` matches): the tuner compares it with the library call's on the same data."""
    if tuple(out.shape) != tuple(ref.shape):
        return math.inf
    o, r = out.double(), ref.double()
    if not bool(torch.isfinite(o).all()):
        return math.inf
    num, den = float(torch.linalg.vector_norm(o - r)), float(torch.linalg.vector_norm(r))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)
