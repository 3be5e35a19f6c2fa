"""What the Triton-kernel backends of ``gemm_a16w16`` (``triton``, ``skinny``) share: availability, and the
why-not / prepare / candidates template over their config type (one config space per backend, one check shared by
the tuner and the runtime)."""

from __future__ import annotations

import torch

from aiter_gemm.backends.base import Backend, GemmProblem, Runner, Solution
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.dtypes import HALF_DTYPES, OUT_DTYPES
from aiter_gemm.kernels.common import INTERPRET


def triton_unavailable_reason(name: str) -> str | None:
    """Why Triton kernels cannot run in this process: no GPU Triton targets and no interpreter."""
    if INTERPRET or torch.cuda.is_available():
        return None
    return f"{name} backend needs a CUDA/ROCm GPU or TRITON_INTERPRET=1"


class TritonKernelBackend(Backend):
    """Runs on a GPU Triton targets, or on CPU tensors under ``TRITON_INTERPRET=1`` (tests only). Subclasses give
    the config type's hooks: :meth:`select`, :meth:`config_error`, :meth:`space`, :meth:`runner`,
    :meth:`solution_of`."""

    max_m: int | None = None  # the largest M the kernels handle (None: any)
    cheap_launch = False  # Triton's Python launcher: +12-18 us per call over cuBLAS on the H100 host

    def unavailable_reason(self) -> str | None:
        return triton_unavailable_reason(self.name)

    def problem_error(self, p: GemmProblem) -> str | None:
        """Why the kernels cannot run ``p`` at all: 16-bit inputs with 16/32-bit outputs, no scales, no
        pre-shuffled weight, non-empty, M within ``max_m``."""
        if p.dtype not in HALF_DTYPES or p.otype not in OUT_DTYPES:
            return f"{p.dtype} -> {p.otype} is not supported (inputs bf16/fp16, outputs bf16/fp16/fp32)"
        if p.scaleAB or p.bpreshuffle:
            return "no per-tensor scales or pre-shuffled weights"
        if min(p.M, p.N, p.K) <= 0:
            return f"empty GEMM M={p.M} N={p.N} K={p.K}"
        if self.max_m is not None and p.M > self.max_m:
            return f"M={p.M} > {self.max_m}"
        return None

    def supports(self, p: GemmProblem) -> bool:
        return self.problem_error(p) is None

    def why_not(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> str | None:
        why = self.problem_error(problem)
        if why is not None:
            return why
        if device.kind == "cpu" and not INTERPRET:
            return "Triton kernels run on CPU tensors only under TRITON_INTERPRET=1"
        try:
            cfg = self.select(problem, solution, device)
        except ValueError as exc:
            return str(exc)
        return self.config_error(cfg, problem, device)

    def prepare(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> Runner | None:
        if self.why_not(problem, solution, device) is not None:
            return None
        return self.runner(self.select(problem, solution, device), device)

    def candidates(self, problem: GemmProblem, device: DeviceIdentity) -> list[Solution]:
        if not self.supports(problem):
            return []
        return [self.solution_of(c) for c in self.space(problem, device)]

    # ---- hooks ---------------------------------------------------------------------------------------------
    def select(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity):
        """The config a solution names (or the default one); ValueError if it is malformed."""
        raise NotImplementedError

    def config_error(self, cfg, problem: GemmProblem, device: DeviceIdentity) -> str | None:
        """Why ``cfg`` cannot run ``problem`` on ``device`` (shared memory, registers, TMA, split-K); None if it can."""
        raise NotImplementedError

    def space(self, problem: GemmProblem, device: DeviceIdentity) -> list:
        raise NotImplementedError

    def runner(self, cfg, device: DeviceIdentity) -> Runner:
        raise NotImplementedError

    def solution_of(self, cfg) -> Solution:
        raise NotImplementedError
