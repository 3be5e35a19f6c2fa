"""Backend ``tilelang`` of ``gemm_a8w8_blockscale``: the TileLang kernels of
:mod:`aiter_gemm.kernels.a8w8_blockscale_tilelang` (SGLang's four variants on this op's layouts).

A solution's ``kernelName`` is a :class:`~aiter_gemm.kernels.a8w8_blockscale_tilelang.TileLangConfig` name (e.g.
``splitK_swapAB-BM64_BN16_BK128_S4_T128_SK4``); ``splitK`` mirrors its split count (0 when unsplit). One rule of
what runs, for the tuner and the runtime: the config's own checks plus
:func:`~aiter_gemm.kernels.a8w8_blockscale_tilelang.shape_error`. Optional: without ``tilelang`` installed, or off
sm_90, the backend says why it is unavailable and its rows are misses. It is never the default (a heuristic
TileLang pick for untuned decode shapes ran slower than the op's existing default), so TileLang runs only where the
tuner measured it faster. ``prepare`` compiles the shape's kernels (TileLang's disk cache makes that milliseconds
after the first time; :func:`aiter_gemm.warmup` does it ahead of serving) and returns a runner that only launches.
Outside CUDA graphs its rows serve calls up to M = 4 only (``eager_max_m``; above it torch's block-scaled matmul
runs them): in a model the cuBLASLt call after a TileLang launch pays extra host time. The measurements behind both
rules: docs/exploration.md ("A heuristic TileLang default", "TileLang in eager calls").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiter_gemm.backends.a8w8_blockscale import solution_of
from aiter_gemm.backends.base import Backend, GemmProblem, Solution
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.dtypes import OUT_DTYPES
from aiter_gemm.kernels import a8w8_blockscale_tilelang as tl_impl
from aiter_gemm.kernels.a8w8_blockscale_tilelang import TileLangConfig
from aiter_gemm.kernels.blockscale_format import FP8

NAME = TileLangConfig.libtype


class BlockscaleTileLangBackend(Backend):
    name = NAME
    x_scale_m_major = False  # both layouts compiled; tuned on row-major
    eager_max_m = 4  # eager calls above run torch's matmul (the module docstring says why)

    def unavailable_reason(self) -> str | None:
        return tl_impl.unavailable_reason()

    def why_not(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> str | None:
        if not device.is_gpu:
            return "TileLang kernels run on CUDA tensors only"
        return self.shape_why_not(problem, solution, device.gfx)

    def shape_why_not(self, problem: GemmProblem, solution: Solution, arch: str) -> str | None:
        """The name, dtypes and :func:`~aiter_gemm.kernels.a8w8_blockscale_tilelang.shape_error` (the kernels are
        sm_90a's: whether this machine has TileLang and such a GPU is :meth:`unavailable_reason`)."""
        try:
            cfg = TileLangConfig.from_name(solution.kernelName)
        except ValueError as exc:
            return str(exc)
        if problem.dtype != FP8 or problem.otype not in OUT_DTYPES:
            return f"{problem.dtype} -> {problem.otype}: inputs must be float8_e4m3fn, outputs bf16/fp16/fp32"
        return tl_impl.shape_error(cfg, problem.M, problem.N, problem.K)

    def prepare(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity):
        if self.why_not(problem, solution, device) is not None:
            return None
        cfg = TileLangConfig.from_name(solution.kernelName)
        return tl_impl.launcher(problem.N, problem.K, cfg, problem.otype)

    def describe(self, solution: Solution) -> dict[str, Any]:
        """The config's parameters, as its JSON entry holds them."""
        return TileLangConfig.from_name(solution.kernelName).to_json()

    def parse_json_entry(self, entry: Mapping[str, Any]) -> Solution:
        """A :meth:`~aiter_gemm.kernels.a8w8_blockscale_tilelang.TileLangConfig.to_json` entry (``libtype``
        ``tilelang`` and SGLang's keys)."""
        return solution_of(TileLangConfig.from_json(dict(entry)))

    def _space(self, problem: GemmProblem, quick: bool) -> list[Solution]:
        if problem.dtype != FP8 or problem.otype not in OUT_DTYPES:
            return []
        return [solution_of(c) for c in tl_impl.config_space(problem.M, problem.N, problem.K, quick)]

    def candidates(self, problem: GemmProblem, device: DeviceIdentity) -> list[Solution]:
        return self._space(problem, quick=False)

    def quick_candidates(self, problem: GemmProblem, device: DeviceIdentity) -> list[Solution]:
        return self._space(problem, quick=True)

    def precompile(self, jobs: list[tuple[GemmProblem, Solution]]) -> dict[str, str]:
        """Compile every (problem, solution) job's kernels in parallel into TileLang's disk cache before they are
        timed or served (:func:`~aiter_gemm.kernels.a8w8_blockscale_tilelang.precompile`); kernelName -> why, for
        those that failed (a name no config has among them: an SGLang entry these kernels cannot run)."""
        want, unbuilt = {}, {}
        for problem, sol in jobs:
            try:
                cfg = TileLangConfig.from_name(sol.kernelName)
            except ValueError as exc:
                unbuilt[sol.kernelName] = str(exc)
                continue
            want[(problem.N, problem.K, cfg, problem.otype)] = sol.kernelName
        failed = tl_impl.precompile(list(want), workers=self.precompile_workers) if want else {}
        return unbuilt | {want[job]: why for job, why in failed.items()}


BACKEND = BlockscaleTileLangBackend()
