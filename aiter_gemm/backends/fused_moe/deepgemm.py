"""Backend ``deepgemm`` of ``fused_moe``: FP8 experts on DeepGEMM's contiguous grouped GEMMs
(:mod:`aiter_gemm.kernels.fused_moe_deepgemm`). One solution, ``kernelName`` ``deepgemm_m_grouped_contiguous`` (a
tuned row's ``kernelName1`` and ``kernelName2``, ``block_m`` and ``ksplit`` 0); it runs where ``deep_gemm`` imports
with the grouped GEMM and the GPU is sm_90 (that module's ``unavailable_reason``), on the problems its
``shape_error`` and the op's shared rule allow. Optional: without ``deep_gemm`` its rows are misses, warned once with
the reason. Never a default: the tuner times it beside the others and a tuned row names it only where it was measured
faster. ``prepare`` returns a runner bound to the problem; DeepGEMM's JIT compiles its kernels on their first call,
which :meth:`~FusedMoeDeepGemmBackend.precompile` makes ahead (:func:`aiter_gemm.warmup`, the tuner). The tuner checks
its candidate against DeepGEMM's arithmetic (:meth:`~FusedMoeDeepGemmBackend.reference`: GEMM1's output in bf16).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch

from aiter_gemm.backends.base import LibraryCallBackend, MoeProblem, Solution
from aiter_gemm.backends.fused_moe import problem_error
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.kernels import fused_moe_deepgemm as impl

NAME = impl.LIBTYPE
SOLUTION = Solution(NAME, -1, 0, impl.NAME)
#: The arch of DeepGEMM's grouped FP8 kernel with float32 block scales (sm_90a's).
ARCH = "sm_90"


class FusedMoeDeepGemmBackend(LibraryCallBackend):
    name = NAME
    solution = SOLUTION
    build_arch = ARCH

    def library_why(self, device: torch.device | None) -> str | None:
        return impl.unavailable_reason(device)

    def problem_why(self, problem: MoeProblem, arch: str) -> str | None:
        """The op's shared rule, :func:`~aiter_gemm.kernels.fused_moe_deepgemm.shape_error` and, for a GPU arch,
        sm_90 (whether this machine has ``deep_gemm`` and such a GPU is :meth:`library_why`'s)."""
        why = problem_error(problem, NAME, impl.ACTIVATIONS, "DeepGEMM's grouped GEMMs")
        if why is not None:
            return why
        if arch.startswith("sm_") and arch != ARCH:
            return f"DeepGEMM's grouped FP8 kernel with float32 block scales is {ARCH}a's, not {arch}'s"
        return impl.shape_error(problem)

    def prepare(self, problem: MoeProblem, solution: Solution, device: DeviceIdentity):
        """A runner bound to the problem (:func:`~aiter_gemm.kernels.fused_moe_deepgemm.launcher`)."""
        if self.why_not(problem, solution, device) is not None:
            return None
        return impl.launcher(problem)

    def describe(self, solution: Solution) -> dict[str, Any]:
        return {"kernelName1": solution.kernelName, "kernelName2": solution.kernelName}

    def reference(self, problem: MoeProblem, inputs: tuple, variant: Hashable = None) -> torch.Tensor:
        """:func:`~aiter_gemm.kernels.fused_moe_deepgemm.fused_moe_deepgemm_ref`: GEMM1's output rounded to bf16, as
        DeepGEMM writes it (the op's reference keeps it float32, which moves a few requantized values a whole FP8
        step: within :data:`~aiter_gemm.kernels.fused_moe_deepgemm.MAX_REL_ERR` of it, not within err_ratio's
        1e-2 per element)."""
        return impl.fused_moe_deepgemm_ref(*inputs, activation=problem.activation).float()

    def warm(self, problems: list[MoeProblem]) -> dict[MoeProblem, str]:
        """One run per distinct kernel shape (:func:`~aiter_gemm.kernels.fused_moe_deepgemm.warm`): DeepGEMM's JIT
        builds or loads their kernels (the tuner's and :func:`aiter_gemm.warmup`'s :meth:`precompile`)."""
        return impl.warm(problems)


BACKEND = FusedMoeDeepGemmBackend()
