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

from collections.abc import Sequence
from typing import Any

import torch

from aiter_gemm.backends.base import Backend, MoeProblem, Solution
from aiter_gemm.backends.fused_moe import problem_error
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.kernels import fused_moe_deepgemm as impl

NAME = impl.LIBTYPE
SOLUTION = Solution(NAME, -1, 0, impl.NAME)
#: The arch of DeepGEMM's grouped FP8 kernel with float32 block scales (sm_90a's).
ARCH = "sm_90"


class FusedMoeDeepGemmBackend(Backend):
    name = NAME

    def unavailable_reason(self) -> str | None:
        return impl.unavailable_reason()

    def why_not(self, problem: MoeProblem, solution: Solution, device: DeviceIdentity) -> str | None:
        # Looked up through the module at every decision: it depends on the device (and tests replace it).
        return (self._name_error(solution) or impl.unavailable_reason(device.torch_device())
                or self.shape_why_not(problem, solution, device.gfx))

    def shape_why_not(self, problem: MoeProblem, solution: Solution, arch: str) -> str | None:
        """The name, the op's shared rule, :func:`~aiter_gemm.kernels.fused_moe_deepgemm.shape_error` and, for a GPU
        arch, sm_90 (whether this machine has ``deep_gemm`` and such a GPU is :meth:`why_not`'s)."""
        why = self._name_error(solution) or problem_error(problem, NAME, impl.ACTIVATIONS, "DeepGEMM's grouped GEMMs")
        if why is not None:
            return why
        if arch.startswith("sm_") and arch != ARCH:
            return f"DeepGEMM's grouped FP8 kernel with float32 block scales is {ARCH}a's, not {arch}'s"
        return impl.shape_error(problem)

    @staticmethod
    def _name_error(solution: Solution) -> str | None:
        if solution.kernelName != impl.NAME:
            return f"libtype {NAME!r} runs {impl.NAME!r}, not {solution.kernelName!r}"
        return None

    def prepare(self, problem: MoeProblem, solution: Solution, device: DeviceIdentity):
        """A runner bound to the problem (:func:`~aiter_gemm.kernels.fused_moe_deepgemm.launcher`)."""
        if self.why_not(problem, solution, device) is not None:
            return None
        return impl.launcher(problem)

    def describe(self, solution: Solution) -> dict[str, Any]:
        return {"kernelName1": solution.kernelName, "kernelName2": solution.kernelName}

    def reference(self, problem: MoeProblem, inputs: tuple) -> torch.Tensor:
        """:func:`~aiter_gemm.kernels.fused_moe_deepgemm.fused_moe_deepgemm_ref`: GEMM1's output rounded to bf16, as
        DeepGEMM writes it (the op's reference keeps it float32, which moves a few requantized values a whole FP8
        step: within :data:`~aiter_gemm.kernels.fused_moe_deepgemm.MAX_REL_ERR` of it, not within err_ratio's
        1e-2 per element)."""
        return impl.fused_moe_deepgemm_ref(*inputs, activation=problem.activation).float()

    def candidates(self, problem: MoeProblem, device: DeviceIdentity) -> list[Solution]:
        """The one solution where DeepGEMM takes the problem (whether this process can run it is the tuner's
        ``--libtype`` check and the worker's ``why_not``)."""
        return [SOLUTION] if self.shape_why_not(problem, SOLUTION, device.gfx) is None else []

    def precompile(self, jobs: Sequence[tuple[MoeProblem, Solution]]) -> dict[str, str]:
        """One run per distinct kernel shape of the jobs, so DeepGEMM's JIT builds (or loads from its disk cache)
        their kernels before they are timed or served (:func:`~aiter_gemm.kernels.fused_moe_deepgemm.warm`);
        kernelName -> why for what failed (DeepGEMM unavailable here: every job)."""
        why = impl.unavailable_reason()
        if why is not None:
            return {sol.kernelName: why for _, sol in jobs}
        todo, failed = [], {}
        for problem, sol in jobs:
            bad = self.shape_why_not(problem, sol, ARCH)
            if bad is not None:
                failed[sol.kernelName] = bad
            else:
                todo.append(problem)
        for p, msg in impl.warm(todo).items():
            failed[impl.NAME] = f"{p.label()}: {msg}"
        return failed


BACKEND = FusedMoeDeepGemmBackend()
