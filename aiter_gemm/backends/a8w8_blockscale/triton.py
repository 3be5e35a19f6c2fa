"""Backend ``triton`` of ``gemm_a8w8_blockscale``: the Triton kernels of :mod:`aiter_gemm.kernels.a8w8_blockscale`.

A solution's ``kernelName`` is a :class:`~aiter_gemm.kernels.a8w8_blockscale.BlockscaleConfig` name (e.g.
``splitK_swapAB-BM16_BN128_BK128_GM1_SK4_W4_S3_TMA``); ``splitK`` mirrors its split count (0 when unsplit).
:func:`~aiter_gemm.kernels.a8w8_blockscale.config_error` is the one rule of what can run, for the tuner and the
runtime alike. The default (no row, no JSON bucket) is :func:`~aiter_gemm.kernels.a8w8_blockscale.default_config`.

Where the C++ extension is built, the runner binds its launches (:mod:`aiter_gemm.triton_launch`) on the first call
of each layout of the operands (strides, device; 16-byte aligned), after Triton's own launch, and later calls launch
them from C++: a few microseconds of host time instead of Triton's launcher's ~30, so eager calls on a CUDA GPU keep
the decision (:meth:`BlockscaleTritonBackend.launch_is_cheap`) instead of giving way to torch's block-scaled matmul.
:meth:`~BlockscaleTritonBackend.precompile` builds the kernels of (problem, solution) jobs in parallel build processes
into Triton's disk cache (:mod:`aiter_gemm.backends._triton_precompile`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from aiter_gemm import triton_launch
from aiter_gemm.backends._triton_common import triton_unavailable_reason
from aiter_gemm.backends.a8w8_blockscale import solution_of
from aiter_gemm.backends.base import Backend, GemmProblem, Solution
from aiter_gemm.device import REFERENCE_ARCH, DeviceIdentity
from aiter_gemm.dtypes import OUT_DTYPES
from aiter_gemm.kernels.a8w8_blockscale import (
    BlockscaleConfig,
    config_error,
    config_space,
    default_config,
    gemm_a8w8_blockscale_triton,
)
from aiter_gemm.kernels.blockscale_format import FP8, zero_operands
from aiter_gemm.kernels.common import INTERPRET, splitk_reduce
from aiter_gemm.triton_launch import UNTRIED

NAME = "triton"

#: ``run(XQ, WQ, x_scale, w_scale, dtype) -> out``: the block-scale op's runner.
BlockscaleRunner = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]


def _arch(device: DeviceIdentity) -> str:
    """The arch whose limits apply: the GPU's, or the reference GPU's in the interpreter (tests then refuse what an
    H100 would)."""
    return device.gfx if device.is_gpu else REFERENCE_ARCH


def make_runner(cfg: BlockscaleConfig) -> BlockscaleRunner:
    """The runner of ``cfg``: a :class:`BoundRunner` where launches bind (:data:`~aiter_gemm.triton_launch.BINDS`),
    else Triton's launch."""
    if triton_launch.BINDS:
        return BoundRunner(cfg)

    def run(XQ, WQ, x_scale, w_scale, dtype):
        out = torch.empty((XQ.shape[0], WQ.shape[0]), dtype=dtype, device=XQ.device)
        return gemm_a8w8_blockscale_triton(XQ, WQ, x_scale, w_scale, cfg, out)

    return run


class BoundRunner(triton_launch.PlanCache):
    """One config's runner with bound launches: per layout of the operands (shapes, strides, device, output dtype)
    the first call runs Triton's launch and binds it (the GEMM, and a split config's reduction); later calls launch
    the plans from C++, the last layout's first. A plan declines what it cannot prove the same launch (other strides,
    a misaligned operand, another current device, a Triton launch hook installed, no driver), and Triton's launch
    runs; a launch that cannot be bound at all is logged once (:func:`aiter_gemm.triton_launch.bind`). A layout's
    plans are (output dtype, GEMM plan[, reduction plan]), kept in the :class:`~aiter_gemm.triton_launch.PlanCache`
    this runner is."""

    __slots__ = ("cfg",)

    def __init__(self, cfg: BlockscaleConfig) -> None:
        super().__init__()
        self.cfg = cfg

    def __call__(self, XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                 dtype: torch.dtype) -> torch.Tensor:
        last = self._last
        if last is not None and last[0] is dtype:  # the last layout's plans, inline: this is every eager call
            got = triton_launch.run(last[1], XQ, WQ, x_scale, w_scale)
            if got is not None:
                return got[0] if len(last) == 2 else self._reduce(last, got[0])
        key = (XQ.shape, XQ.stride(), WQ.stride(), x_scale.stride(), w_scale.stride(), XQ.device, dtype)
        plans = self._plans.get(key, UNTRIED)
        if plans is not UNTRIED and plans is not None:
            out = self._run(plans, XQ, WQ, x_scale, w_scale)
            if out is not None:
                self._last = plans
                return out
        # A misaligned operand is not bound (Triton's launch also takes pointer loads instead of TMA for it): a later
        # aligned call of the layout binds it.
        bind = plans is UNTRIED and XQ.is_cuda and all(t.data_ptr() % 16 == 0 for t in (XQ, WQ, x_scale, w_scale))
        launches: list[triton_launch.Launch] | None = [] if bind else None
        out = torch.empty((XQ.shape[0], WQ.shape[0]), dtype=dtype, device=XQ.device)
        gemm_a8w8_blockscale_triton(XQ, WQ, x_scale, w_scale, self.cfg, out, launches)
        if bind:
            bound = triton_launch.bind_all(launches)
            self._store(key, None if bound is None else (dtype, *bound))
        return out

    @staticmethod
    def _run(plans: tuple, XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor,
             w_scale: torch.Tensor) -> torch.Tensor | None:
        """The bound launches of ``plans`` ((dtype, gemm[, reduction])); None where the GEMM's plan declines."""
        got = triton_launch.run(plans[1], XQ, WQ, x_scale, w_scale)
        if got is None or len(plans) == 2:
            return None if got is None else got[0]
        return BoundRunner._reduce(plans, got[0])

    @staticmethod
    def _reduce(plans: tuple, ws: torch.Tensor) -> torch.Tensor:
        """A split config's sum of the workspace ``ws``: its bound reduction, or Triton's where that declines."""
        reduced = triton_launch.run(plans[2], ws)
        if reduced is not None:
            return reduced[0]
        return splitk_reduce(ws, None, torch.empty(ws.shape[1:], dtype=plans[0], device=ws.device))

    def launch_path(self, XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                    dtype: torch.dtype) -> str:
        """Which launch a call with these operands takes now (benchmarks' notes): ``bound launch``, or Triton's
        launcher and why."""
        key = (XQ.shape, XQ.stride(), WQ.stride(), x_scale.stride(), w_scale.stride(), XQ.device, dtype)
        plans = self._plans.get(key, UNTRIED)
        if plans is UNTRIED:
            return "Triton's launcher (not called yet with this layout)"
        if plans is None:
            return "Triton's launcher (not bound: the log says why)"
        if self._run(plans, XQ, WQ, x_scale, w_scale) is None:
            return "Triton's launcher (the plan declines: a launch hook, another device current, a misaligned view)"
        return "bound launch"


class BlockscaleTritonBackend(Backend):
    name = NAME
    cheap_launch = False  # Triton's Python launcher (and a host-side TMA descriptor per call), unless bound
    x_scale_m_major = False  # takes either; tuned on row-major, the faster layout (docs/exploration.md)

    def unavailable_reason(self) -> str | None:
        return triton_unavailable_reason(f"{NAME} (gemm_a8w8_blockscale)")

    def launch_is_cheap(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> bool:
        """On a CUDA GPU with bound launches (:data:`~aiter_gemm.triton_launch.BINDS`): a few microseconds of host
        time, so eager calls keep the decision; elsewhere Triton's launcher's cost (``cheap_launch`` False)."""
        return device.kind == "cuda" and triton_launch.BINDS

    def why_not(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> str | None:
        if device.kind == "cpu" and not INTERPRET:
            return "Triton kernels run on CPU tensors only under TRITON_INTERPRET=1"
        return self.shape_why_not(problem, solution, _arch(device))

    def shape_why_not(self, problem: GemmProblem, solution: Solution, arch: str) -> str | None:
        """Dtypes, the name and :func:`~aiter_gemm.kernels.a8w8_blockscale.config_error` on ``arch``."""
        if problem.dtype != FP8 or problem.otype not in OUT_DTYPES:
            return f"{problem.dtype} -> {problem.otype}: inputs must be float8_e4m3fn, outputs bf16/fp16/fp32"
        try:
            cfg = BlockscaleConfig.from_name(solution.kernelName)
        except ValueError as exc:
            return str(exc)
        return config_error(cfg, problem.M, problem.N, problem.K, arch)

    def prepare(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> BlockscaleRunner | None:
        if self.why_not(problem, solution, device) is not None:
            return None
        return make_runner(BlockscaleConfig.from_name(solution.kernelName))

    def default_for(self, problem: GemmProblem, device: DeviceIdentity) -> Solution | None:
        return solution_of(default_config(problem.M, problem.N, problem.K, device.heuristic_cu, device.name))

    def describe(self, solution: Solution) -> dict[str, Any]:
        """The config's parameters, as its JSON entry holds them."""
        return BlockscaleConfig.from_name(solution.kernelName).to_json()

    def parse_json_entry(self, entry: Mapping[str, Any]) -> Solution:
        """A :meth:`~aiter_gemm.kernels.a8w8_blockscale.BlockscaleConfig.to_json` entry (AITER's keys plus
        ``variant``; no ``libtype``)."""
        return solution_of(BlockscaleConfig.from_json(dict(entry)))

    def _space(self, problem: GemmProblem, device: DeviceIdentity, quick: bool) -> list[Solution]:
        # the default config too: a tuned row is never worse than no row
        cfgs = [*config_space(problem.M, problem.N, problem.K, quick, device.heuristic_cu, _arch(device)),
                default_config(problem.M, problem.N, problem.K, device.heuristic_cu, device.name)]
        return [solution_of(c) for c in dict.fromkeys(cfgs)]

    def candidates(self, problem: GemmProblem, device: DeviceIdentity) -> list[Solution]:
        return self._space(problem, device, quick=False)

    def quick_candidates(self, problem: GemmProblem, device: DeviceIdentity) -> list[Solution]:
        return self._space(problem, device, quick=True)

    def precompile(self, jobs: Sequence[tuple[GemmProblem, Solution]]) -> dict[str, str]:
        """Build the jobs' kernels in parallel into Triton's disk cache (each distinct job run once on zero operands,
        :func:`build_job`); kernelName -> why for those that failed. No GPU: {}."""
        from aiter_gemm.backends._triton_precompile import precompile_triton  # the tuner's and warmup's only

        return precompile_triton(jobs, build_job, workers=self.precompile_workers)


def build_job(problem: GemmProblem, solution: Solution) -> None:
    """Run ``solution`` once on ``problem``'s zero operands on this process's GPU: a build process's job."""
    from aiter_gemm.backends._triton_precompile import run_once

    p = problem
    run_once(BACKEND, p, solution, lambda device: (*zero_operands(p.M, p.N, p.K, device), p.otype))


BACKEND = BlockscaleTritonBackend()
