"""Helpers shared by the runtime and tuner tests: a recording fake backend, tuned-CSV writers, running a tuner as a
subprocess (environment, SIGKILL mid-run, resume), and in-process stand-ins for the tuner's executor and the Triton
build processes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from aiter_gemm.backends.base import Backend

REPO = Path(__file__).resolve().parent.parent
BF16_HEADER = "gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,kernelName\n"


class FakeBackend(Backend):
    """Runs F.linear and records every (problem, solution) it prepared; knobs for default/blaslt/rejection."""

    def __init__(self, name: str, *, default_max_m: int = 0, priority: int = 0, blaslt: bool = False,
                 reject_solidx: int | None = None) -> None:
        self.name = name
        self.default_priority = priority
        self.is_blaslt = blaslt
        self.default_max_m = default_max_m
        self.reject_solidx = reject_solidx
        self.prepared: list = []
        self.calls = 0

    def prepare(self, problem, solution, device):
        if self.reject_solidx is not None and solution.solidx == self.reject_solidx:
            return None
        self.prepared.append((problem, solution))

        def run(a, b, bias, otype, scale_a, scale_b, scale_c):
            self.calls += 1
            return F.linear(a, b, bias).to(otype)

        return run

    def default_for(self, problem, device):
        from aiter_gemm.backends.base import Solution

        if problem.M <= self.default_max_m or (self.is_blaslt and problem.bpreshuffle):
            return Solution(self.name, -1, 0, "fake-default")
        return None


#: The (N,) bias layouts a kernel must read by stride: every other element of a longer vector, a column of a 2-D
#: tensor, and a stride-0 ``expand`` of one element. Each lies in a storage of >= 2N elements, so a kernel that
#: ignores the stride reads in bounds and gets wrong values (a test failure, not a crash).
BIAS_LAYOUTS = ("strided", "column", "expand0")


def strided_bias(layout: str, N: int, dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """An (N,) bias laid out as ``layout`` (one of :data:`BIAS_LAYOUTS`), not contiguous when N > 1."""
    if layout == "strided":
        return torch.randn(2 * N, dtype=dtype, device=device)[::2]
    if layout == "column":
        return torch.randn(N, 3, dtype=dtype, device=device)[:, 1]
    if layout == "expand0":
        return torch.randn(2 * N, dtype=dtype, device=device)[N // 2:N // 2 + 1].expand(N)
    raise ValueError(f"unknown bias layout {layout!r}; one of {BIAS_LAYOUTS}")


def bf16_row(M, N, K, libtype="torch", us=1.0, *, gfx=None, cu_num=None, bias=False, dtype="torch.float32",
             outdtype=None, solidx=0, kernel="k") -> str:
    """A tuned row, by default for the device this process dispatches on (the GPU if any, else the CPU)."""
    import aiter_gemm

    ident = aiter_gemm.current_device_identity()
    gfx = ident.gfx if gfx is None else gfx
    cu = ident.cu_num if cu_num is None else cu_num
    return (f"{gfx},{cu},{M},{N},{K},{bias},{dtype},{outdtype or dtype},False,False,{libtype},{solidx},0,{us},"
            f"{kernel}\n")


def sigkill_after_rows(cmd: list[str], env: dict, cwd, path, rows: int, timeout: float = 120.0) -> None:
    """Start ``cmd`` and SIGKILL it once the CSV at ``path`` holds ``rows`` data rows (it must not finish first).
    With ``GRADLIB_FAKES_HOLD`` in ``env`` the run's slow fakes stop from then until the kill, so however late this
    process looks (a loaded machine), the tuner cannot finish the remaining shapes first."""
    from aiter_gemm.fileio import read_csv_rows

    hold = Path(env["GRADLIB_FAKES_HOLD"]) if env.get("GRADLIB_FAKES_HOLD") else None
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists() and len(read_csv_rows(path)[1]) >= rows:
                break
            assert proc.poll() is None, "the tuner finished before it could be killed"
            time.sleep(0.05)
        if hold is not None:
            hold.touch()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
        if hold is not None:
            hold.unlink(missing_ok=True)  # the killed run's held workers go on, find no driver and exit


def moe_call(inputs, **kw):
    """``aiter_gemm.fused_moe`` on one set of its ``make_inputs`` (hidden_states, w1, w2, topk_weight, topk_ids,
    w1_scale, w2_scale): the scales by name, since AITER's sixth positional argument is ``expert_mask``."""
    from aiter_gemm.ops.fused_moe import fused_moe

    x, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale = inputs
    return fused_moe(x, w1, w2, topk_weight, topk_ids, w1_scale=w1_scale, w2_scale=w2_scale, **kw)


def repo_env(**extra: str) -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH, plus ``extra``: for tuner subprocesses."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **extra}


def kill_then_resume(cmd: list[str], env: dict, cwd, tuned: Path, expected: list, key: Callable[[dict], object],
                     min_rows: int, after_kill: Callable[[], None] | None = None) -> list:
    """SIGKILL tuner ``cmd`` once ``tuned`` holds ``min_rows`` rows and check the file is valid and partial; run
    ``after_kill``; rerun ``cmd`` to the end and check it tuned only what was missing, so that every ``key(row)`` of
    ``expected`` appears exactly once, the killed run's rows first and unchanged. Returns the keys at the kill."""
    from aiter_gemm.fileio import read_csv_rows

    sigkill_after_rows(cmd, env, cwd, tuned, min_rows)
    at_kill = [key(r) for r in read_csv_rows(tuned)[1]]
    assert min_rows <= len(at_kill) < len(expected)  # killed mid-run; the file is complete and readable
    if after_kill is not None:
        after_kill()
    res = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"{len(expected) - len(at_kill)} tuned, {len(at_kill)} skipped" in res.stdout
    final = [key(r) for r in read_csv_rows(tuned)[1]]
    assert sorted(final) == sorted(expected) and final[: len(at_kill)] == at_kill
    return at_kill


class InlineExecutor:
    """A one-slot :class:`gradlib.pool.Executor` running items in this process (no spawn, no timeout): for tests of
    the driver and the CLI flags whose candidates can neither hang nor crash."""

    restarts = 0
    slots = 1

    def __init__(self, plugins=()) -> None:
        self.plugins, self.identity, self._runtime, self._task = tuple(plugins), None, None, None

    def start(self) -> None:
        from gradlib.tasks import WorkerRuntime

        self._runtime = WorkerRuntime.create(self.plugins)
        self.identity = self._runtime.identity

    def free_slots(self) -> int:
        return 0 if self._task is not None else 1

    def submit(self, task) -> None:
        self._task = task

    def poll(self, timeout: float) -> list:
        from gradlib.pool import ItemDone, TaskDone

        task, self._task = self._task, None
        if task is None:
            return []
        events = [ItemDone(task, self._runtime.run_item(task, i)) for i in range(task.first, len(task.items))]
        return [*events, TaskDone(task)]

    def close(self) -> None:
        self._task = None


class FakeBuilders:
    """In-process Triton build processes (:mod:`aiter_gemm.backends._triton_precompile`'s ``start_builder``): each
    one started runs its groups here at once, through the build process's own loop, and records them; one reaching a
    group whose kernelName is in ``broken`` dies there (killed by SIGKILL), its later groups not run."""

    def __init__(self, broken: tuple[str, ...] = ()) -> None:
        self.broken, self.shares = broken, []

    def __call__(self, index, build, groups, result) -> FakeBuilder:
        from aiter_gemm.backends._triton_builder import run_share

        assert index == len(self.shares)
        self.shares.append(groups)
        alive = next((i for i, g in enumerate(groups) if g[0][1].kernelName in self.broken), len(groups))
        run_share(build, groups[:alive], result)
        return FakeBuilder(0 if alive == len(groups) else -signal.SIGKILL)

    @property
    def groups(self) -> list:
        """Every group started, process by process."""
        return [group for share in self.shares for group in share]


class FakeBuilder:
    """A finished build process: its exit status; ``killed`` counts :meth:`kill` calls."""

    def __init__(self, code: int) -> None:
        self.code, self.killed = code, 0

    def wait(self) -> int:
        return self.code

    def kill(self) -> None:
        self.killed += 1
