"""Triton kernels built ahead, in parallel, for the Triton backends' :meth:`~aiter_gemm.backends.base.Backend.
precompile` (the tuner before it times anything, :func:`aiter_gemm.warmup` before serving).

Triton compiles a kernel at its first launch with new constexprs or argument specializations, one after another in
the process that launches it: the tuner's timing worker would compile every candidate in turn while the host's other
cores sit idle. Here every distinct job runs once, in spawned build processes on the GPU, so Triton compiles the
exact specializations a real call launches into its disk cache (``TRITON_CACHE_DIR``, default ``~/.triton/cache``);
the worker's first launch of each is then a cache load. A backend gives the job to run (:data:`BuildJob`: its
runner once, on zero inputs) and what of a problem its kernels depend on (:data:`Variant`). Jobs are grouped by
solution, each group run in order by one process, so what its jobs share compiles once there. Without a GPU (CPU,
``TRITON_INTERPRET=1``) nothing is compiled ahead: :func:`precompile_triton` returns at once.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor

import torch

from aiter_gemm.backends.base import Backend, Problem, Solution
from aiter_gemm.device import probe_gpu
from aiter_gemm.kernels.common import INTERPRET

log = logging.getLogger("aiter_gemm")

Job = tuple[Problem, Solution]
#: Runs one job once on this process's GPU (raising, saying why, where it cannot): a picklable module-level function,
#: as spawned processes call it.
BuildJob = Callable[[Problem, Solution], None]
#: What of ``problem`` the kernels ``solution`` launches for it depend on: jobs of one solution with equal values
#: run the same compiled kernels, so only the first is built.
Variant = Callable[[Problem, Solution], Hashable]
#: Build processes by default, at most (each holds a CUDA context and its jobs' inputs).
DEFAULT_WORKERS = 8

# Kernels this build process compiled and loaded from Triton's cache (its compilation listener counts them).
_counts = {"compiled": 0, "loaded": 0}


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
                       start: Callable[[int], Executor] | None = None) -> dict[str, str]:
    """Run each group's jobs in order in one of ``min(workers, groups)`` processes (``start(n)``: the executor, by
    default spawned processes spread over the visible GPUs); kernelName -> why for the jobs that failed or whose
    process died. Logs what was built and how long it took."""
    if not groups:
        return {}
    t0 = time.monotonic()
    n = min(workers or default_workers(), len(groups))
    failed: dict[str, str] = {}
    counts = {"compiled": 0, "loaded": 0}
    pool = (start or spawn_builders)(n)
    try:
        futures = [(group, pool.submit(build_group, build, list(group))) for group in groups]
        for group, future in futures:
            try:
                bad, done = future.result()
            except Exception as exc:  # noqa: BLE001 - a dead build process (BrokenProcessPool): the group failed
                problem, sol = group[0]
                bad, done = {sol.kernelName: f"{problem.label()}: its build process failed: {type(exc).__name__}: "
                                             f"{exc}"}, {}
            for name, why in bad.items():
                failed.setdefault(name, why)
            for key, value in done.items():
                counts[key] += value
    except Exception as exc:  # noqa: BLE001 - no process could start: the workers build per candidate, as before
        stop(pool)
        log.warning("Triton precompile: cannot build ahead (%s: %s); the kernels compile at their first launch",
                    type(exc).__name__, exc)
        return {group[0][1].kernelName: f"not built ahead: {type(exc).__name__}: {exc}" for group in groups}
    except BaseException:  # Ctrl-C, SIGTERM: leave no process building
        stop(pool)
        raise
    pool.shutdown()
    log.info("Triton precompile: %d job(s) of %d solution(s) in %d process(es): %d kernel(s) compiled, %d loaded "
             "from Triton's cache, %d failed, %.1f s", sum(map(len, groups)), len(groups), n, counts["compiled"],
             counts["loaded"], len(failed), time.monotonic() - t0)
    return failed


def spawn_builders(n: int) -> ProcessPoolExecutor:
    """``n`` spawned build processes (CUDA cannot be forked), the i-th on visible GPU ``i % count``."""
    ctx = mp.get_context("spawn")
    return ProcessPoolExecutor(n, mp_context=ctx, initializer=init_builder, initargs=(ctx.Value("i", 0),))


def stop(pool: Executor) -> None:
    """Cancel what has not started and end the build processes now (their partial builds are not cached)."""
    # concurrent.futures has no public way to end running workers before Python 3.14's terminate_workers; shutdown
    # forgets them, so they are listed first.
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.kill()


def init_builder(counter) -> None:  # noqa: ANN001 - a multiprocessing Value
    """A build process's start: its GPU (the next of the visible ones), and a listener counting what Triton
    compiles and what it loads from its cache."""
    with counter.get_lock():
        index = counter.value
        counter.value += 1
    if torch.cuda.is_available():
        torch.cuda.set_device(index % torch.cuda.device_count())
    import triton

    compilation = getattr(getattr(triton, "knobs", None), "compilation", None)  # Triton >= 3.4
    if compilation is not None and hasattr(compilation, "listener"):
        compilation.listener = _count


def _count(*, cache_hit: bool, **_: object) -> None:
    _counts["loaded" if cache_hit else "compiled"] += 1


def build_group(build: BuildJob, jobs: list[Job]) -> tuple[dict[str, str], dict[str, int]]:
    """Run ``jobs`` in order in this process: (kernelName -> why for those that raised, kernels compiled and
    loaded meanwhile)."""
    before = dict(_counts)
    failed: dict[str, str] = {}
    for problem, sol in jobs:
        try:
            build(problem, sol)
        except Exception as exc:  # noqa: BLE001 - a job that cannot build is a failed job, not a crash
            failed.setdefault(sol.kernelName, f"{problem.label()}: {type(exc).__name__}: {exc}")
    return failed, {key: _counts[key] - before[key] for key in _counts}


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
