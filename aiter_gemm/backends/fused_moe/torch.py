"""Backend ``torch`` of ``fused_moe``: :mod:`aiter_gemm.kernels.fused_moe_torch`, the op's safe default.

Two solutions, ``kernelName`` :data:`~aiter_gemm.kernels.fused_moe_torch.GROUPED` (``torch._grouped_mm``: bf16, no
host sync) and :data:`~aiter_gemm.kernels.fused_moe_torch.LOOP` (one GEMM per expert that got tokens; FP8 experts
through :func:`aiter_gemm.gemm_a8w8_blockscale`, the project's block-scaled matmul, or its float32 reference where
no backend of it runs: a CPU without the Triton interpreter). The default is the grouped one where
``torch._grouped_mm`` runs the problem, else the loop; it claims every problem, below the Triton kernels' priority.
"""

from __future__ import annotations

from typing import Any

from aiter_gemm.backends.base import Backend, MoeProblem, Solution
from aiter_gemm.backends.fused_moe import problem_error
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.kernels import fused_moe_torch as impl
from aiter_gemm.kernels.a8w8_blockscale import gemm_a8w8_blockscale_ref
from aiter_gemm.kernels.common import INTERPRET

NAME = impl.LIBTYPE
SOLUTIONS = {name: Solution(NAME, -1, 0, name) for name in impl.NAMES}


def capability(arch: str) -> tuple[int, int] | None:
    """(major, minor) of an NVIDIA arch name (``sm_90`` -> (9, 0), ``sm_100`` -> (10, 0)); None for others."""
    digits = arch[3:] if arch.startswith("sm_") else ""
    if not digits.isascii() or not digits.isdigit() or len(digits) < 2:
        return None
    return int(digits[:-1]), int(digits[-1])


class FusedMoeTorchBackend(Backend):
    name = NAME

    def why_not(self, problem: MoeProblem, solution: Solution, device: DeviceIdentity) -> str | None:
        return self._why(problem, solution, device.kind, capability(device.gfx))

    def shape_why_not(self, problem: MoeProblem, solution: Solution, arch: str) -> str | None:
        return self._why(problem, solution, "cuda" if arch.startswith("sm_") else "hip", capability(arch))

    def _why(self, p: MoeProblem, solution: Solution, kind: str, cap: tuple[int, int] | None) -> str | None:
        if solution.kernelName not in impl.NAMES:
            return f"libtype {NAME!r} runs one of {list(impl.NAMES)}, not {solution.kernelName!r}"
        why = problem_error(p, NAME, impl.ACTIVATIONS, "the torch experts")
        if why is not None:
            return why
        if solution.kernelName == impl.GROUPED:
            return impl.grouped_mm_error(kind, cap, p)
        return None

    def prepare(self, problem: MoeProblem, solution: Solution, device: DeviceIdentity):
        if self.why_not(problem, solution, device) is not None:
            return None
        return impl.launcher(problem, solution.kernelName, _fp8_gemm(device) if problem.fp8 else None)

    def describe(self, solution: Solution) -> dict[str, Any]:
        return {"kernelName1": solution.kernelName, "kernelName2": solution.kernelName}

    def default_for(self, problem: MoeProblem, device: DeviceIdentity) -> Solution | None:
        grouped = SOLUTIONS[impl.GROUPED]
        return grouped if self.why_not(problem, grouped, device) is None else SOLUTIONS[impl.LOOP]

    def candidates(self, problem: MoeProblem, device: DeviceIdentity) -> list[Solution]:
        return [s for s in SOLUTIONS.values() if self.why_not(problem, s, device) is None]


def _fp8_gemm(device: DeviceIdentity):
    """The FP8 loop's block-scaled matmul: the ``gemm_a8w8_blockscale`` op (its own tuned dispatch) where one of its
    backends runs (a GPU, or CPU tensors under the Triton interpreter), else its float32 reference."""
    if device.is_gpu or INTERPRET:
        from aiter_gemm.ops.a8w8_blockscale import gemm_a8w8_blockscale

        return gemm_a8w8_blockscale
    return gemm_a8w8_blockscale_ref


BACKEND = FusedMoeTorchBackend()
