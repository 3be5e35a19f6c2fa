"""What the Triton-kernel backends (``triton``, ``skinny``) share: availability, and the prepare / candidates
template over their config type (one config space per backend, one check shared by the tuner and the runtime)."""

from __future__ import annotations

import logging

import torch

from aiter_gemm.backends.base import Backend, GemmProblem, Runner, Solution
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.kernels.gemm_a16w16 import INTERPRET, SUPPORTED_DTYPES, SUPPORTED_OTYPES

log = logging.getLogger(__name__)


class TritonKernelBackend(Backend):
    """Runs on a GPU Triton targets, or on CPU tensors under ``TRITON_INTERPRET=1`` (tests only). Subclasses give
    the config type's hooks: :meth:`select`, :meth:`fits`, :meth:`space`, :meth:`runner`, :meth:`solution_of`."""

    max_m: int | None = None  # the largest M the kernels handle (None: any)

    def unavailable_reason(self) -> str:
        if INTERPRET or torch.cuda.is_available():
            return ""
        return f"{self.name} backend needs a CUDA/ROCm GPU or TRITON_INTERPRET=1"

    def is_available(self) -> bool:
        return not self.unavailable_reason()

    def supports(self, p: GemmProblem) -> bool:
        """16/32-bit inputs and outputs, no scales, no pre-shuffled weight, non-empty, M within ``max_m``."""
        return (p.dtype in SUPPORTED_DTYPES and p.otype in SUPPORTED_OTYPES and not p.scaleAB and not p.bpreshuffle
                and min(p.M, p.N, p.K) > 0 and (self.max_m is None or p.M <= self.max_m))

    def prepare(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> Runner | None:
        if not self.supports(problem) or (device.kind == "cpu" and not INTERPRET):
            return None
        try:
            cfg = self.select(problem, solution, device)
        except ValueError as exc:
            log.warning("%s: cannot use solidx=%d kernelName=%r: %s", self.name, solution.solidx,
                        solution.kernelName, exc)
            return None
        if not self.fits(cfg, problem, device):
            log.warning("%s: config %s cannot run M=%d N=%d K=%d on %s (shared memory, registers, TMA or split-K)",
                        self.name, cfg.name, problem.M, problem.N, problem.K, device.gfx)
            return None
        return self.runner(cfg, device)

    def candidates(self, problem: GemmProblem, device: DeviceIdentity) -> list[Solution]:
        if not self.supports(problem):
            return []
        return [self.solution_of(c) for c in self.space(problem, device)]

    # ---- hooks ---------------------------------------------------------------------------------------------
    def select(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity):
        """The config a solution names (or the default one); ValueError if it is malformed."""
        raise NotImplementedError

    def fits(self, cfg, problem: GemmProblem, device: DeviceIdentity) -> bool:
        raise NotImplementedError

    def space(self, problem: GemmProblem, device: DeviceIdentity) -> list:
        raise NotImplementedError

    def runner(self, cfg, device: DeviceIdentity) -> Runner:
        raise NotImplementedError

    def solution_of(self, cfg) -> Solution:
        raise NotImplementedError
