"""Backend ``triton`` of ``gemm_a8w8_blockscale``: the Triton kernels of :mod:`aiter_gemm.kernels.a8w8_blockscale`.

A solution's ``kernelName`` is a :class:`~aiter_gemm.kernels.a8w8_blockscale.BlockscaleConfig` name (e.g.
``splitK_swapAB-BM16_BN128_BK128_GM1_SK4_W4_S3_TMA``); ``splitK`` mirrors its split count (0 when unsplit).
:func:`~aiter_gemm.kernels.a8w8_blockscale.config_error` is the one rule of what can run, for the tuner and the
runtime alike. The default (no row, no JSON bucket) is :func:`~aiter_gemm.kernels.a8w8_blockscale.default_config`.
:meth:`~BlockscaleTritonBackend.precompile` builds the kernels of (problem, solution) jobs in parallel build processes
into Triton's disk cache (:mod:`aiter_gemm.backends._triton_precompile`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from aiter_gemm.backends._triton_common import triton_unavailable_reason
from aiter_gemm.backends._triton_precompile import precompile_triton, run_once
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
from aiter_gemm.kernels.common import INTERPRET

NAME = "triton"

#: ``run(XQ, WQ, x_scale, w_scale, dtype) -> out``: the block-scale op's runner.
BlockscaleRunner = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]


def _arch(device: DeviceIdentity) -> str:
    """The arch whose limits apply: the GPU's, or the reference GPU's in the interpreter (tests then refuse what an
    H100 would)."""
    return device.gfx if device.is_gpu else REFERENCE_ARCH


def make_runner(cfg: BlockscaleConfig) -> BlockscaleRunner:
    def run(XQ, WQ, x_scale, w_scale, dtype):
        out = torch.empty((XQ.shape[0], WQ.shape[0]), dtype=dtype, device=XQ.device)
        return gemm_a8w8_blockscale_triton(XQ, WQ, x_scale, w_scale, cfg, out)

    return run


class BlockscaleTritonBackend(Backend):
    name = NAME
    cheap_launch = False  # Triton's Python launcher (and a host-side TMA descriptor per call)
    x_scale_m_major = False  # takes either; tuned on row-major, the faster layout (docs/exploration.md)

    def unavailable_reason(self) -> str | None:
        return triton_unavailable_reason(f"{NAME} (gemm_a8w8_blockscale)")

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
        return precompile_triton(jobs, build_job, workers=self.precompile_workers)


def build_job(problem: GemmProblem, solution: Solution) -> None:
    """Run ``solution`` once on ``problem``'s zero operands on this process's GPU: a build process's job."""
    p = problem
    run_once(BACKEND, p, solution, lambda device: (*zero_operands(p.M, p.N, p.K, device), p.otype))


BACKEND = BlockscaleTritonBackend()
