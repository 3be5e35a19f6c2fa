"""Fake backends for the tuner's tests, registered on import (``--plugin gradlib_fakes``): spawned workers import
this module too, so every process sees the same backends.

``fake`` (not BLASLt): one candidate per behaviour in :data:`FAKE_BEHAVIOURS` (solidx = position).
``fakelt`` (BLASLt, screened in phase 1): solidx 0 returns zeros fastest (passes screening, fails accuracy),
solidx 1 raises, solidx 2..20 are correct and take 0.1 ms more per step, 21..26 are correct but take 50 ms
(screened out: the 20 fastest that ran are 0 and 2..20).
``fakeslow``: one correct candidate taking 20 ms per call (keeps a run busy long enough to be killed).
``fakemoe``, ``fakemoeslow``, ``fakemoebad``: fused-MoE candidates (:class:`FakeMoeBackend` and below).
``fakepair``: two correct candidates, solidx 0 ``fast`` (F.linear in the input dtype, as the torch backend) and
solidx 1 ``slow`` (20 ms more per call), neither of which can run N = 48 (``--compare`` / in-place retune tests: a
deliberately slow row, a shape that cannot be tuned).

Times: under the :data:`CLOCK` virtual clock (fixture ``virtual_clock``; in workers ``GRADLIB_FAKES_VIRTUAL_CLOCK=1``
installs it when they import this plugin) a fake takes exactly the time it declares and any other runner (torch's
F.linear) one tick, so rankings never depend on the machine's load; on the real clock the fakes sleep instead.
``fakeslow`` and ``hangs`` always sleep for real too: they keep a run busy for a kill or a timeout; ``fakeslow`` (and
any ``spend(..., real=True)``) also stops while the file ``GRADLIB_FAKES_HOLD`` names exists.
"""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.nn.functional as F

from aiter_gemm import timing
from aiter_gemm.backends.base import Backend, GemmProblem, Solution
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.registry import register_backend

VIRTUAL_CLOCK_ENV = "GRADLIB_FAKES_VIRTUAL_CLOCK"
#: A file path: while that file exists, a fake that really sleeps waits after its sleep, so a test can hold a run
#: still before killing it (op_tests.runtime_helpers.sigkill_after_rows) instead of racing it.
HOLD_ENV = "GRADLIB_FAKES_HOLD"


class VirtualClock:
    """A clock (seconds) that only moves when read (``tick_s`` per read, so a runner that declares nothing still
    measures one tick, > 0) or when a fake spends its declared time (:meth:`spend`)."""

    def __init__(self, tick_s: float = 1e-6) -> None:
        self.now = 0.0
        self.tick_s = tick_s

    def __call__(self) -> float:
        self.now += self.tick_s
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


CLOCK = VirtualClock()


def spend(seconds: float, real: bool = False) -> None:
    """Take ``seconds``: on the virtual clock when the tuner's CPU timing reads it (and also really sleep if
    ``real``), else by sleeping; a real sleep then waits while the :data:`HOLD_ENV` file exists."""
    if timing.cpu_clock is CLOCK:
        CLOCK.spend(seconds)
        if not real:
            return
    time.sleep(seconds)
    hold = os.environ.get(HOLD_ENV)
    while real and hold and os.path.exists(hold):
        time.sleep(0.05)


def exact(a, b, bias, otype, sa, sb, sc):
    """A correct GEMM (float32 math, so it matches the reference on any CPU)."""
    out = F.linear(a.float(), b.float())
    for s in (sa, sb, sc):
        if s is not None:
            out = out * s
    if bias is not None:
        out = out + bias.float()
    return out.to(otype)


def linear(a, b, bias, otype, sa, sb, sc):
    """F.linear in the input dtype (no scales)."""
    return F.linear(a, b, bias).to(otype)


def slow_linear(a, b, bias, otype, sa, sb, sc):
    spend(0.02)
    return linear(a, b, bias, otype, sa, sb, sc)


def sleeping(seconds: float, real: bool = False):
    def run(a, b, bias, otype, sa, sb, sc):
        spend(seconds, real)
        return exact(a, b, bias, otype, sa, sb, sc)
    return run


def zeros(a, b, bias, otype, sa, sb, sc):
    return torch.zeros(a.shape[0], b.shape[0], dtype=otype, device=a.device)


def nans(a, b, bias, otype, sa, sb, sc):
    out = exact(a, b, bias, otype, sa, sb, sc)
    out[0, 0] = float("nan")
    return out


def raises(a, b, bias, otype, sa, sb, sc):
    raise RuntimeError("fake kernel launch failure")


def hangs(a, b, bias, otype, sa, sb, sc):
    time.sleep(3600)


def exits(a, b, bias, otype, sa, sb, sc):
    os._exit(7)


def sigkills(a, b, bias, otype, sa, sb, sc):
    os.kill(os.getpid(), signal.SIGKILL)


def wrong_shape(a, b, bias, otype, sa, sb, sc):
    return exact(a, b, bias, otype, sa, sb, sc)[:, :-1]


FAKE_BEHAVIOURS = {
    "good_fast": exact, "good_slow": sleeping(0.005), "zeros": zeros, "nan": nans, "raises": raises,
    "hangs": hangs, "exits": exits, "sigkill": sigkills, "wrong_shape": wrong_shape, "unpreparable": None,
}


class FakeBackend(Backend):
    name = "fake"

    def candidates(self, problem: GemmProblem, device: DeviceIdentity) -> list[Solution]:
        return [Solution("fake", i, 0, n) for i, n in enumerate(FAKE_BEHAVIOURS)]

    def prepare(self, problem, solution, device):
        return FAKE_BEHAVIOURS.get(solution.kernelName)


class FakeLtBackend(Backend):
    name = "fakelt"
    is_blaslt = True

    def candidates(self, problem: GemmProblem, device: DeviceIdentity) -> list[Solution]:
        return [Solution("fakelt", i, 0, f"lt{i}") for i in range(27)]

    def prepare(self, problem, solution, device):
        i = solution.solidx
        if i == 0:
            return zeros
        if i == 1:
            return raises
        return sleeping(0.0001 * (i - 2)) if i <= 20 else sleeping(0.05)


class FakeSlowBackend(Backend):
    name = "fakeslow"

    def candidates(self, problem: GemmProblem, device: DeviceIdentity) -> list[Solution]:
        return [Solution("fakeslow", 0, 0, "slow")]

    def prepare(self, problem, solution, device):
        return sleeping(0.02, real=True)


class FakePairBackend(Backend):
    name = "fakepair"

    def candidates(self, problem: GemmProblem, device: DeviceIdentity) -> list[Solution]:
        return [Solution("fakepair", 0, 0, "fast"), Solution("fakepair", 1, 0, "slow")]

    def why_not(self, problem, solution, device):
        return "N = 48 is not supported" if problem.N == 48 else None

    def prepare(self, problem, solution, device):
        if self.why_not(problem, solution, device) is not None:
            return None
        return linear if solution.solidx == 0 else slow_linear


# ---- fused_moe fakes (package aiter_gemm.backends.fused_moe) -------------------------------------------------------
#: ``fakemoe``'s stage configs and the us each takes in GEMM1 / GEMM2: the best shared config (both GEMMs the same)
#: is s2 (4 + 6 = 10 us), the best pair s1;s0 (1 + 2 = 3 us), which only a per-stage search finds.
MOE_STAGE1_US = {"s0": 10.0, "s1": 2.0, "s2": 6.0}
MOE_STAGE2_US = {"s0": 1.0, "s1": 8.5, "s2": 4.0}
MOE_PACKAGE = "aiter_gemm.backends.fused_moe"


def moe_exact(problem):
    """A correct fused MoE (the float32 reference) for ``problem``'s activation."""
    from aiter_gemm.kernels.fused_moe import fused_moe_ref

    def run(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale=None, w2_scale=None):
        return fused_moe_ref(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale=w1_scale, w2_scale=w2_scale,
                             activation=problem.activation)

    return run


def moe_taking(problem, seconds: float, real: bool = False):
    exact_run = moe_exact(problem)

    def run(*args):
        spend(seconds, real)
        return exact_run(*args)

    return run


class FakeMoeBackend(Backend):
    """``fakemoe``: pairs of :data:`MOE_STAGE1_US` / :data:`MOE_STAGE2_US` configs (``s1;s0``), correct, taking the
    sum of their stages' times; it lists the shared pairs only, as the Triton backend does."""

    name = "fakemoe"

    def candidates(self, problem, device):
        return [Solution(self.name, -1, 0, n) for n in MOE_STAGE1_US]

    def why_not(self, problem, solution, device):
        from aiter_gemm.backends.fused_moe import stage_names

        first, second = stage_names(solution.kernelName)
        return None if first in MOE_STAGE1_US and second in MOE_STAGE2_US else f"no stage {solution.kernelName!r}"

    def prepare(self, problem, solution, device):
        from aiter_gemm.backends.fused_moe import stage_names

        if self.why_not(problem, solution, device) is not None:
            return None
        first, second = stage_names(solution.kernelName)
        return moe_taking(problem, (MOE_STAGE1_US[first] + MOE_STAGE2_US[second]) * 1e-6)


class FakeMoeSlowBackend(Backend):
    """``fakemoeslow``: one correct candidate really taking 20 ms a call (held by GRADLIB_FAKES_HOLD): keeps a run
    busy long enough to be killed."""

    name = "fakemoeslow"

    def candidates(self, problem, device):
        return [Solution(self.name, -1, 0, "slow")]

    def prepare(self, problem, solution, device):
        return moe_taking(problem, 0.02, real=True)


class FakeMoeFaultyBackend(Backend):
    """``fakemoebad``: a correct candidate (``good``, 5 us) and one per fault: raises, hangs, sigkill (the GEMM fakes,
    which take the op's seven arguments as a GEMM's seven) and wrong_shape (a (T, H - 1) output)."""

    name = "fakemoebad"
    FAULTS = ("raises", "hangs", "sigkill", "wrong_shape")

    def candidates(self, problem, device):
        return [Solution(self.name, -1, 0, n) for n in (*self.FAULTS, "good")]

    def prepare(self, problem, solution, device):
        if solution.kernelName == "good":
            return moe_taking(problem, 5e-6)
        if solution.kernelName == "wrong_shape":
            return lambda hidden_states, *rest: hidden_states[:, :-1].clone()
        return FAKE_BEHAVIOURS[solution.kernelName] if solution.kernelName in self.FAULTS else None


def _register_moe_fakes() -> None:
    from gradlib.moe import STAGED

    for backend in (FakeMoeBackend(), FakeMoeSlowBackend(), FakeMoeFaultyBackend()):
        register_backend(backend, MOE_PACKAGE)
    # fakemoe's pairs are searched stage by stage, as the Triton backend's are
    STAGED["fakemoe"] = lambda p, a, b: Solution("fakemoe", -1, 0, a if a == b else f"{a};{b}")


for _b in (FakeBackend(), FakeLtBackend(), FakeSlowBackend(), FakePairBackend()):
    register_backend(_b)
_register_moe_fakes()
if os.environ.get(VIRTUAL_CLOCK_ENV) == "1":  # a worker of a test that uses the virtual_clock fixture
    timing.cpu_clock = CLOCK
