"""Triton kernels built ahead, in parallel, for the Triton backends' :meth:`~aiter_gemm.backends.base.Backend.
precompile` (the tuner before it times anything, :func:`aiter_gemm.warmup` before serving).

Triton compiles a kernel at its first launch with new constexprs or argument specializations, one after another in
the process that launches it: the tuner's timing worker would compile every candidate in turn while the host's other
cores sit idle. Here every distinct job runs once, in build processes on the GPU (``python -m``
:mod:`aiter_gemm.backends._triton_builder`: they never import the caller's ``__main__``), so Triton compiles the
exact specializations a real call launches into its disk cache (``TRITON_CACHE_DIR``, default ``~/.triton/cache``);
the worker's first launch of each is then a cache load. A backend gives the job to run (:data:`BuildJob`: its
runner once, on zero inputs) and what of a problem its kernels depend on (:data:`Variant`). Jobs are grouped by
solution, each group run in order by one process, so what its jobs share compiles once there; the groups are dealt to
the processes ahead, and a process that dies fails only the groups it had not finished. Without a GPU (CPU,
``TRITON_INTERPRET=1``) nothing is compiled ahead: :func:`precompile_triton` returns at once.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Protocol

import torch

from aiter_gemm.backends.base import Backend, Problem, Solution
from aiter_gemm.device import probe_gpu
from aiter_gemm.kernels.common import INTERPRET

log = logging.getLogger("aiter_gemm")

Job = tuple[Problem, Solution]
#: Runs one job once on this process's GPU (raising, saying why, where it cannot): a module-level function of an
#: importable module, as the build processes unpickle it.
BuildJob = Callable[[Problem, Solution], None]
#: What of ``problem`` the kernels ``solution`` launches for it depend on: jobs of one solution with equal values
#: run the same compiled kernels, so only the first is built.
Variant = Callable[[Problem, Solution], Hashable]
#: Build processes by default, at most (each holds a CUDA context and its jobs' inputs).
DEFAULT_WORKERS = 8
#: The module a build process runs (``python -m``).
BUILDER = "aiter_gemm.backends._triton_builder"


class Builder(Protocol):
    """A started build process (:class:`subprocess.Popen`)."""

    def wait(self) -> int: ...

    def kill(self) -> None: ...


#: Starts build process ``index`` on its groups, their results appended to the path (:func:`start_builder`).
Start = Callable[[int, BuildJob, list[list[Job]], Path], Builder]


def default_workers() -> int:
    """Build processes where no setting names a count: :data:`DEFAULT_WORKERS`, or fewer CPUs."""
    return max(1, min(DEFAULT_WORKERS, os.cpu_count() or 1))


def exact(problem: Problem, solution: Solution) -> Hashable:
    """The default :data:`Variant`: the whole problem (only identical jobs are built once)."""
    return problem


def compiles_here() -> bool:
    """Whether Triton compiles kernels in this setting: a GPU, and not the interpreter."""
    return not INTERPRET and torch.cuda.is_available()


def plan(jobs: Sequence[Job], variant: Variant = exact) -> list[list[Job]]:
    """The distinct jobs (the first of each ``variant`` value per solution), one group per solution in first-seen
    order."""
    groups: dict[Solution, dict[Hashable, Job]] = {}
    for problem, sol in jobs:
        groups.setdefault(sol, {}).setdefault(variant(problem, sol), (problem, sol))
    return [list(group.values()) for group in groups.values()]


def precompile_triton(jobs: Sequence[Job], build: BuildJob, variant: Variant = exact,
                      workers: int | None = None) -> dict[str, str]:
    """Build what ``jobs`` launch into Triton's disk cache, ``workers`` processes at once (None:
    :func:`default_workers`); kernelName -> why for the jobs that failed. No GPU (or the interpreter): nothing to
    build, {}."""
    if not jobs or not compiles_here():
        return {}
    return build_in_processes(plan(jobs, variant), build, workers)


def build_in_processes(groups: Sequence[Sequence[Job]], build: BuildJob, workers: int | None = None,
                       start: Start | None = None) -> dict[str, str]:
    """Run each group's jobs in order in one of ``min(workers, groups)`` build processes (``start``: default
    :func:`start_builder`); kernelName -> why for the jobs that failed or whose process died before building them.
    Logs what was built and how long it took."""
    if not groups:
        return {}
    t0 = time.monotonic()
    shares = share(groups, min(workers or default_workers(), len(groups)))
    failed: dict[str, str] = {}
    counts = {"compiled": 0, "loaded": 0}
    procs: list[Builder] = []
    with tempfile.TemporaryDirectory(prefix="aiter_gemm-triton-build-") as tmp:
        results = [Path(tmp, f"{i}.result") for i in range(len(shares))]
        try:
            for i, part in enumerate(shares):
                procs.append((start or start_builder)(i, build, part, results[i]))
            for part, proc, result in zip(shares, procs, results):
                code = proc.wait()
                done = read_results(result)
                for bad, built in done:
                    for name, why in bad.items():
                        failed.setdefault(name, why)
                    for key, value in built.items():
                        counts[key] += value
                for group in part[len(done):]:
                    problem, sol = group[0]
                    failed.setdefault(sol.kernelName, f"{problem.label()}: its build process {ended(code)}")
        except Exception as exc:  # noqa: BLE001 - a process could not start: the workers build per candidate, as before
            stop(procs)
            log.warning("Triton precompile: cannot build ahead (%s: %s); the kernels compile at their first launch",
                        type(exc).__name__, exc)
            return {group[0][1].kernelName: f"not built ahead: {type(exc).__name__}: {exc}" for group in groups}
        except BaseException:  # Ctrl-C, SIGTERM: leave no process building
            stop(procs)
            raise
    log.info("Triton precompile: %d job(s) of %d solution(s) in %d process(es): %d kernel(s) compiled, %d loaded "
             "from Triton's cache, %d failed, %.1f s", sum(map(len, groups)), len(groups), len(shares),
             counts["compiled"], counts["loaded"], len(failed), time.monotonic() - t0)
    return failed


def share(groups: Sequence[Sequence[Job]], n: int) -> list[list[list[Job]]]:
    """``groups`` dealt to ``n`` processes, the longest first to the one with the fewest jobs so far (one process's
    long groups do not hold up the build); each process's groups in first-seen order."""
    load, owner = [0] * n, {}
    for i in sorted(range(len(groups)), key=lambda i: -len(groups[i])):
        owner[i] = load.index(min(load))
        load[owner[i]] += len(groups[i])
    return [[list(g) for i, g in enumerate(groups) if owner[i] == p] for p in range(n)]


def start_builder(index: int, build: BuildJob, groups: list[list[Job]], result: Path) -> subprocess.Popen:
    """Build process ``index`` (on visible GPU ``index % count``) running ``groups`` with ``build``, its groups'
    results appended to ``result``: ``python -m`` :data:`BUILDER` with this process's environment and ``sys.path``
    (as ``PYTHONPATH``, and ``-P`` so the working directory is not put before it: a checkout that is not installed
    imports as here). Not multiprocessing: its spawned children re-import the caller's ``__main__``."""
    request = result.with_suffix(".request")
    request.write_bytes(pickle.dumps((index, os.getpid(), build, groups)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in sys.path)}
    safe_path = ["-P"] if sys.version_info >= (3, 11) else []
    return subprocess.Popen([sys.executable, *safe_path, "-m", BUILDER, str(request), str(result)], env=env,
                            stdin=subprocess.DEVNULL)


def read_results(result: Path) -> list[tuple[dict[str, str], dict[str, int]]]:
    """The group results (kernelName -> why, kernels compiled and loaded) a build process appended to ``result``: none
    where it wrote nothing; a record cut short by its death ends the list."""
    out = []
    try:
        with open(result, "rb") as f:
            while True:
                out.append(pickle.load(f))
    except (FileNotFoundError, EOFError, pickle.UnpicklingError):
        return out


def ended(code: int) -> str:
    """How a build process that left groups unbuilt ended, from its exit status."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code} before building it (its stderr says why)"


def stop(procs: Sequence[Builder]) -> None:
    """End the build processes now (their partial builds are not cached) and reap them."""
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


def run_once(backend: Backend, problem: Problem, solution: Solution,
             inputs: Callable[[torch.device], tuple]) -> None:
    """``backend``'s runner for the job, called once on the arguments ``inputs(device)`` on this process's GPU and
    waited for: what a :data:`BuildJob` does. ValueError saying why where the backend refuses the job."""
    ident = probe_gpu()
    if ident is None:
        raise RuntimeError("no GPU in this build process")
    runner = backend.prepare(problem, solution, ident)
    if runner is None:
        raise ValueError(backend.why_not(problem, solution, ident) or "the backend refused it")
    runner(*inputs(ident.torch_device()))
    torch.cuda.synchronize()
