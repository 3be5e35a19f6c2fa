"""Backend ``torch``: ``F.linear`` for 16/32-bit inputs, ``torch._scaled_mm`` for fp8 with per-tensor scales.

Always available (CPU, CUDA, ROCm); it is the heuristic default of last resort. ``solidx`` is unused (0).
fp8 goes through ``_scaled_mm`` only where it can run (a GPU, N and K multiples of 16, as cuBLASLt's fp8 path
requires); elsewhere, and if ``_scaled_mm`` raises once, through a float32 dequantize-and-multiply fallback.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from aiter_gemm.backends.base import Backend, GemmProblem, Runner, Solution, finish_scaled
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.dtypes import FP8_DTYPES, HALF_DTYPES

log = logging.getLogger(__name__)

_LINEAR = Solution("torch", 0, 0, "F.linear")
_SCALED_MM = Solution("torch", 0, 0, "_scaled_mm")


def run_plain(a, b, bias, otype, scale_a, scale_b, scale_c) -> torch.Tensor:
    """The common case (no scales, output in the input dtype): F.linear and nothing else on the hot path."""
    return F.linear(a, b, bias)


def run_float32_out(a, b, bias, otype, scale_a, scale_b, scale_c) -> torch.Tensor:
    """16-bit inputs, fp32 output without rounding through 16 bits: upcast (CPU, or where mm(out_dtype=) fails)."""
    return F.linear(a.float(), b.float(), None if bias is None else bias.float())


def _mm_out_fp32_runner() -> Runner:
    """``torch.mm(a, b.T, out_dtype=float32)`` (fp32 accumulate and output from bf16/fp16 on CUDA, torch >= 2.8),
    switching for good to :func:`run_float32_out` if this build rejects it."""
    state = {"broken": False}

    def run(a, b, bias, otype, scale_a, scale_b, scale_c):
        if not state["broken"]:
            try:
                out = torch.mm(a, b.t(), out_dtype=torch.float32)
                return out if bias is None else out.add_(bias)
            except (TypeError, RuntimeError, NotImplementedError) as exc:
                state["broken"] = True
                log.warning("torch.mm(out_dtype=float32) failed (%s); upcasting to float32 from now on", exc)
        return run_float32_out(a, b, bias, otype, scale_a, scale_b, scale_c)

    return run


def run_linear(a, b, bias, otype, scale_a, scale_b, scale_c) -> torch.Tensor:
    """F.linear in the input dtype, then scales (if any) and the cast to ``otype``."""
    if scale_a is None and scale_b is None and scale_c is None:
        out = F.linear(a, b, bias)
        return out if out.dtype == otype else out.to(otype)
    return finish_scaled(F.linear(a, b), bias, otype, scale_a, scale_b, scale_c)


def run_dequant(a, b, bias, otype, scale_a, scale_b, scale_c) -> torch.Tensor:
    """Reference-quality fp8 path: upcast to float32, multiply, scale, add bias, cast. Runs anywhere."""
    return finish_scaled(a.float() @ b.float().t(), bias, otype, scale_a, scale_b, scale_c)


def _scaled_mm_runner() -> Runner:
    """``torch._scaled_mm`` with a permanent switch to :func:`run_dequant` if this build/device rejects it."""
    state = {"broken": False}
    one = {}

    def run(a, b, bias, otype, scale_a, scale_b, scale_c):
        if not state["broken"]:
            try:
                if scale_a is None or scale_b is None:
                    ones = one.get(a.device)
                    if ones is None:
                        ones = one[a.device] = torch.ones((), dtype=torch.float32, device=a.device)
                    scale_a = ones if scale_a is None else scale_a
                    scale_b = ones if scale_b is None else scale_b
                fused_bias = bias is not None and bias.dtype == otype and otype in HALF_DTYPES
                out = torch._scaled_mm(  # cuBLASLt's bias epilogue reads N contiguous values: strided ones copied
                    a.contiguous(), b.contiguous().t(), scale_a=scale_a, scale_b=scale_b,
                    bias=bias.contiguous() if fused_bias else None, out_dtype=otype, scale_result=scale_c,
                )
                if bias is not None and not fused_bias:
                    out = (out.float() + bias.float()).to(otype)
                return out
            except RuntimeError as exc:
                state["broken"] = True
                log.warning("torch._scaled_mm failed (%s); using the float32 dequantize fallback from now on", exc)
        return run_dequant(a, b, bias, otype, scale_a, scale_b, scale_c)

    return run


class TorchBackend(Backend):
    name = "torch"
    default_priority = 0

    def why_not(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> str | None:
        if problem.bpreshuffle:
            return "a pre-shuffled weight is a BLASLt layout torch cannot read"
        return None

    def prepare(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> Runner | None:
        if self.why_not(problem, solution, device) is not None:
            return None
        if problem.dtype in FP8_DTYPES:
            if device.is_gpu and problem.N % 16 == 0 and problem.K % 16 == 0:
                return _scaled_mm_runner()
            return run_dequant
        if not problem.scaleAB and problem.otype == problem.dtype:
            return run_plain
        if not problem.scaleAB and problem.otype == torch.float32 and problem.dtype in HALF_DTYPES:
            return _mm_out_fp32_runner() if device.is_gpu else run_float32_out
        return run_linear

    def default_for(self, problem: GemmProblem, device: DeviceIdentity) -> Solution | None:
        if problem.bpreshuffle:
            return None
        return _SCALED_MM if problem.dtype in FP8_DTYPES else _LINEAR

    def candidates(self, problem: GemmProblem, device: DeviceIdentity) -> list[Solution]:
        sol = self.default_for(problem, device)
        return [sol] if sol is not None else []


BACKEND = TorchBackend()
