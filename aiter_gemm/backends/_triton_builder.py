"""A Triton build process of :mod:`aiter_gemm.backends._triton_precompile`, started as ``python -m
aiter_gemm.backends._triton_builder REQUEST RESULT``: never by multiprocessing, whose spawned children re-import the
caller's ``__main__`` (a serving script without an ``if __name__ == "__main__":`` guard would run again in each).
Nothing in the parent imports this module, so the build process holds one copy of it.

REQUEST holds the pickled (GPU index, parent pid, build job, groups of jobs); each group's result (kernelName -> why
for the jobs that raised, kernels compiled and loaded) is appended, pickled, to RESULT as it finishes, so a process
that dies loses only the groups it had not finished. stdout and stderr stay the logs'.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from aiter_gemm.backends.base import Problem, Solution

Job = tuple[Problem, Solution]
#: One group's result: kernelName -> why for the jobs that raised; kernels compiled and loaded from Triton's cache.
GroupResult = tuple[dict[str, str], dict[str, int]]

# Kernels this build process compiled and loaded from Triton's cache (its compilation listener counts them).
_counts = {"compiled": 0, "loaded": 0}


def main(argv: Sequence[str]) -> int:
    """The build process: read REQUEST, take its GPU, run its groups into RESULT."""
    request, result = argv
    with open(request, "rb") as f:
        index, parent, build, groups = pickle.load(f)
    init_builder(index)
    run_share(build, groups, Path(result), parent)
    return 0


def init_builder(index: int) -> None:
    """This process's GPU (visible GPU ``index % count``), and a listener counting what Triton compiles and what it
    loads from its cache."""
    if torch.cuda.is_available():
        torch.cuda.set_device(index % torch.cuda.device_count())
    import triton

    compilation = getattr(getattr(triton, "knobs", None), "compilation", None)  # Triton >= 3.4
    if compilation is not None and hasattr(compilation, "listener"):
        compilation.listener = _count


def _count(*, cache_hit: bool, **_: object) -> None:
    _counts["loaded" if cache_hit else "compiled"] += 1


def run_share(build: Callable[[Problem, Solution], None], groups: Sequence[Sequence[Job]], result: Path,
              parent: int | None = None) -> None:
    """Run ``groups`` in order, appending each one's :data:`GroupResult` to ``result`` as it finishes; stop where
    the parent process ``parent`` is gone (killed without ending its builders: nobody reads the result)."""
    with open(result, "ab") as out:
        for group in groups:
            if parent is not None and os.getppid() != parent:
                return
            pickle.dump(build_group(build, group), out)
            out.flush()


def build_group(build: Callable[[Problem, Solution], None], jobs: Sequence[Job]) -> GroupResult:
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
