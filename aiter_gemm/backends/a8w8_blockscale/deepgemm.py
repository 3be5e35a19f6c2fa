"""Backend ``deepgemm`` of ``gemm_a8w8_blockscale``: DeepGEMM's SM90 FP8 GEMM (``deep_gemm.fp8_gemm_nt``), see
:mod:`aiter_gemm.kernels.a8w8_blockscale_deepgemm`. One solution, ``kernelName`` ``deepgemm_fp8_gemm_nt``; it runs
where that module's ``unavailable_reason`` (``deep_gemm`` importable, an sm_90 GPU) and ``shape_error`` (bf16 out, N a
multiple of 8, K of 128) allow. Optional: without ``deep_gemm`` its rows are misses, warned with the reason. Never a
default: the tuner times it beside the others and a tuned row names it only where it was measured faster.
``prepare`` returns a runner bound to the shape; its kernels compile on their first call (DeepGEMM's JIT), which
:meth:`~BlockscaleDeepGemmBackend.precompile` makes ahead (:func:`aiter_gemm.warmup`, the tuner).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiter_gemm.backends.a8w8_blockscale import solution_of
from aiter_gemm.backends.base import Backend, GemmProblem, Solution
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.kernels import a8w8_blockscale_deepgemm as dg_impl
from aiter_gemm.kernels.blockscale_format import FP8

SOLUTION = solution_of(dg_impl.DeepGemmFP8())
#: The arch whose kernel takes float32 block scales (DeepGEMM's 1D2D kernel is sm_90a's).
ARCH = "sm_90"


class BlockscaleDeepGemmBackend(Backend):
    name = dg_impl.LIBTYPE
    x_scale_m_major = True  # DeepGEMM takes x_scale M-major (TMA-aligned) as is; row-major costs a transpose a call

    def unavailable_reason(self) -> str | None:
        return dg_impl.unavailable_reason()

    def why_not(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> str | None:
        # Looked up through the module at every decision: it depends on the device (and tests replace it).
        return (self._name_error(solution) or dg_impl.unavailable_reason(device.torch_device())
                or self.shape_why_not(problem, solution, device.gfx))

    def shape_why_not(self, problem: GemmProblem, solution: Solution, arch: str) -> str | None:
        """The name, the dtypes, :func:`~aiter_gemm.kernels.a8w8_blockscale_deepgemm.shape_error` and, for a GPU
        arch, sm_90 (whether this machine has ``deep_gemm`` and such a GPU is :meth:`why_not`'s)."""
        if self._name_error(solution):
            return self._name_error(solution)
        if problem.dtype != FP8:
            return f"inputs {problem.dtype}: DeepGEMM's FP8 kernel takes float8_e4m3fn"
        if arch.startswith("sm_") and arch != ARCH:
            return f"DeepGEMM's FP8 kernel with float32 block scales is {ARCH}a's, not {arch}'s"
        return dg_impl.shape_error(problem.M, problem.N, problem.K, problem.otype)

    def _name_error(self, solution: Solution) -> str | None:
        if solution.kernelName != dg_impl.NAME:
            return f"libtype {self.name!r} runs {dg_impl.NAME!r}, not {solution.kernelName!r}"
        return None

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

    def candidates(self, problem: GemmProblem, device: DeviceIdentity) -> list[Solution]:
        """The one solution where DeepGEMM takes the shape (whether this process can run it is the tuner's
        ``--libtype`` check and the worker's ``why_not``)."""
        return [SOLUTION] if self.shape_why_not(problem, SOLUTION, device.gfx) is None else []

    def precompile(self, jobs: Sequence[tuple[GemmProblem, Solution]]) -> dict[str, str]:
        """One call per distinct shape of the jobs, so DeepGEMM's JIT builds (or loads from its disk cache) their
        kernels before they are timed or served (:func:`~aiter_gemm.kernels.a8w8_blockscale_deepgemm.warm`);
        kernelName -> why for what failed (DeepGEMM unavailable here: every job)."""
        why = dg_impl.unavailable_reason()
        if why is not None:
            return {sol.kernelName: why for _, sol in jobs}
        todo, failed = [], {}
        for problem, sol in jobs:
            bad = self.shape_why_not(problem, sol, ARCH)
            if bad is not None:
                failed[sol.kernelName] = bad
            else:
                todo.append((problem.M, problem.N, problem.K, problem.otype))
        for (M, N, K, _), msg in dg_impl.warm(todo).items():
            failed[dg_impl.NAME] = f"M={M} N={N} K={K}: {msg}"
        return failed


BACKEND = BlockscaleDeepGemmBackend()
