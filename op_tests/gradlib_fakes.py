"""Fake backends for the tuner's tests, registered on import (``--plugin gradlib_fakes``): spawned workers import
this module too, so every process sees the same backends.

``fake`` (not BLASLt): one candidate per behaviour in :data:`FAKE_BEHAVIOURS` (solidx = position).
``fakelt`` (BLASLt, screened in phase 1): solidx 0 returns zeros fastest (passes screening, fails accuracy),
solidx 1 raises, solidx 2..20 are correct and take 0.1 ms more per step, 21..26 are correct but take 50 ms
(screened out: the 20 fastest that ran are 0 and 2..20).
``fakeslow``: one correct candidate taking 20 ms per call (keeps a run busy long enough to be killed).
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


for _b in (FakeBackend(), FakeLtBackend(), FakeSlowBackend(), FakePairBackend()):
    register_backend(_b)
if os.environ.get(VIRTUAL_CLOCK_ENV) == "1":  # a worker of a test that uses the virtual_clock fixture
    timing.cpu_clock = CLOCK
