"""Backend ``deepgemm`` of ``gemm_a8w8_blockscale``: DeepGEMM's SM90 FP8 GEMM (``deep_gemm.fp8_gemm_nt``), see
:mod:`aiter_gemm.kernels.a8w8_blockscale_deepgemm`. One solution, ``kernelName`` ``deepgemm_fp8_gemm_nt``; it runs
where that module's ``unavailable_reason`` (``deep_gemm`` importable, an sm_90 GPU) and ``shape_error`` (bf16 out, N a
multiple of 8, K of 128) allow. Optional: without ``deep_gemm`` its rows are misses, warned with the reason. Never a
default: the tuner times it beside the others and a tuned row names it only where it was measured faster.
``prepare`` returns a runner bound to the shape; its kernels compile on their first call (DeepGEMM's JIT), which
:meth:`~BlockscaleDeepGemmBackend.precompile` makes ahead (:func:`aiter_gemm.warmup`, the tuner).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from aiter_gemm.backends.a8w8_blockscale import solution_of
from aiter_gemm.backends.base import GemmProblem, LibraryCallBackend, Solution
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.kernels import a8w8_blockscale_deepgemm as dg_impl
from aiter_gemm.kernels.blockscale_format import FP8

SOLUTION = solution_of(dg_impl.DeepGemmFP8())
#: The arch whose kernel takes float32 block scales (DeepGEMM's 1D2D kernel is sm_90a's).
ARCH = "sm_90"


class BlockscaleDeepGemmBackend(LibraryCallBackend):
    name = dg_impl.LIBTYPE
    solution = SOLUTION
    build_arch = ARCH
    x_scale_m_major = True  # DeepGEMM takes x_scale M-major (TMA-aligned) as is; row-major costs a transpose a call

    def library_why(self, device: torch.device | None) -> str | None:
        return dg_impl.unavailable_reason(device)

    def problem_why(self, problem: GemmProblem, arch: str) -> str | None:
        """The dtypes, :func:`~aiter_gemm.kernels.a8w8_blockscale_deepgemm.shape_error` and, for a GPU arch, sm_90
        (whether this machine has ``deep_gemm`` and such a GPU is :meth:`library_why`'s)."""
        if problem.dtype != FP8:
            return f"inputs {problem.dtype}: DeepGEMM's FP8 kernel takes float8_e4m3fn"
        if arch.startswith("sm_") and arch != ARCH:
            return f"DeepGEMM's FP8 kernel with float32 block scales is {ARCH}a's, not {arch}'s"
        return dg_impl.shape_error(problem.M, problem.N, problem.K, problem.otype)

    def prepare(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity):
        """A runner bound to the shape (:func:`~aiter_gemm.kernels.a8w8_blockscale_deepgemm.launcher`)."""
        if self.why_not(problem, solution, device) is not None:
            return None
        return dg_impl.launcher(problem.M, problem.N, problem.K, problem.otype)

    def describe(self, solution: Solution) -> dict[str, Any]:
        return dg_impl.DeepGemmFP8().to_json()

    def parse_json_entry(self, entry: Mapping[str, Any]) -> Solution:
        """``{"libtype": "deepgemm", "kernelName": "deepgemm_fp8_gemm_nt"}``, exactly."""
        return solution_of(dg_impl.DeepGemmFP8.from_json(dict(entry)))

    def warm(self, problems: list[GemmProblem]) -> dict[GemmProblem, str]:
        """One call per distinct shape (:func:`~aiter_gemm.kernels.a8w8_blockscale_deepgemm.warm`): DeepGEMM's JIT
        builds or loads their kernels (the tuner's and :func:`aiter_gemm.warmup`'s :meth:`precompile`)."""
        by_job = {(p.M, p.N, p.K, p.otype): p for p in problems}
        return {by_job[job]: msg for job, msg in dg_impl.warm(by_job).items()}


BACKEND = BlockscaleDeepGemmBackend()
