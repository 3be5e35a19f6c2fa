"""The two-phase search per shape (seed 003, section 4), as a state machine the scheduling loop drives.

enumerate: every requested backend (plus ``torch``, the baseline) lists its candidates for the shape, in a worker;
screen (phase 1, only if a BLASLt backend has candidates): BLASLt solutions are timed with few iterations and no
accuracy check, failures are dropped before ranking and the fastest ``screen_top`` (20) are kept (per backend;
``screen_libtypes`` adds other backends with large config spaces to this phase, to trade search breadth for time);
full (phase 2): those plus every candidate of the other backends, plus the torch baseline, are timed with full
warm-up and checked against the float32 reference. The winner is the fastest candidate with ``err_ratio <=
errRatio``; a failed candidate has ``us`` = inf and can never rank first.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiter_gemm.backends.base import GemmProblem, Solution
from gradlib.pool import Executor, ItemDone, TaskDone
from gradlib.tasks import ENUMERATE, TIME, ItemResult, Task
from gradlib.timing import FULL, SCREEN, TimingConfig

log = logging.getLogger(__name__)

BASELINE = "torch"  # F.linear: timed for every shape so the speedup of the winner is known


@dataclass(frozen=True)
class SearchOptions:
    """Search settings shared by every shape."""

    libtypes: tuple[str, ...]
    err_ratio: float = 0.05
    screen_top: int = 20
    screen_libtypes: tuple[str, ...] = ()  # non-BLASLt backends also screened in phase 1 (opt-in: speed)
    seed: int = 0
    # A winner that is not torch must beat the torch baseline by this factor, else torch is kept (when eligible):
    # on H100, one shape's F.linear time moved by up to 2.4% between two timings in one session and up to 9% across
    # sessions on compute-bound shapes (BENCHMARKS.md, cublaslt), so smaller wins are noise, not gains.
    min_gain: float = 1.0
    screen: TimingConfig = SCREEN
    full: TimingConfig = FULL


@dataclass(frozen=True)
class Candidate:
    """One timed solution: which phase timed it and what came out."""

    solution: Solution
    phase: str  # "screen" or "full"
    result: ItemResult
    eligible: bool  # False for the torch baseline when --libtype did not ask for torch

    @property
    def us(self) -> float:
        return self.result.us if self.result.ok else math.inf


@dataclass
class ShapeOutcome:
    """Everything the writer and the final table need about one shape."""

    shape_id: int
    problem: GemmProblem
    winner: Candidate | None
    baseline: Candidate | None
    candidates: list[Candidate]
    errors: list[str]  # backends that could not enumerate
    wall_s: float

    @property
    def tuned(self) -> bool:
        return self.winner is not None

    def ranked(self) -> list[Candidate]:
        """Phase-2 candidates, fastest valid first; failed ones (us = inf) last."""
        full = [c for c in self.candidates if c.phase == "full"]
        return sorted(full, key=lambda c: (not c.result.ok, c.us))


class ShapeSearch:
    """The search state of one shape; :func:`run_searches` feeds it events and asks it for its next task."""

    def __init__(self, shape_id: int, problem: GemmProblem, opts: SearchOptions) -> None:
        self.shape_id, self.problem, self.opts = shape_id, problem, opts
        self.phase = ENUMERATE
        self.inflight = False
        self.done = False
        self.started = 0.0
        self._results: dict[int, ItemResult] = {}
        self._task: Task | None = None
        self._eligible: dict[Solution, bool] = {}
        self._screened: list[Solution] = []
        self._others: list[Solution] = []
        self._baseline: Solution | None = None
        self.candidates: list[Candidate] = []
        self.errors: list[str] = []
        self.planned = len(self._enumerate_items())  # items this shape will run, as far as known (progress bar)
        self.outcome: ShapeOutcome | None = None

    def _enumerate_items(self) -> tuple[str, ...]:
        libs = self.opts.libtypes
        return libs if BASELINE in libs else (*libs, BASELINE)

    # ---- driving -----------------------------------------------------------------------------------------
    def next_task(self, task_id: int) -> Task | None:
        """The task to run next, or None while one is in flight or the search is done."""
        if self.inflight or self.done:
            return None
        if not self.started:
            self.started = time.monotonic()
        o = self.opts
        if self.phase == ENUMERATE:
            task = Task(task_id, self.shape_id, ENUMERATE, self.problem, self._enumerate_items())
        elif self.phase == "screen":
            task = Task(task_id, self.shape_id, TIME, self.problem, tuple(self._screened), o.screen, check=False,
                        seed=o.seed)
        else:
            task = Task(task_id, self.shape_id, TIME, self.problem, tuple(self._full_items()), o.full, check=True,
                        max_err=o.err_ratio, seed=o.seed)
        self._task, self._results, self.inflight = task, {}, True
        return task

    def on_item(self, res: ItemResult) -> None:
        self._results[res.index] = res

    def on_task_done(self) -> None:
        """All items of the in-flight task are in: move to the next phase."""
        task, self.inflight = self._task, False
        missing = [i for i in range(len(task.items)) if i not in self._results]
        for i in missing:  # an executor bug, but never let a hole look like a success
            self._results[i] = ItemResult.failed(task, i, "no result from the executor")
        if self.phase == ENUMERATE:
            self._after_enumerate(task)
        elif self.phase == "screen":
            self._after_screen(task)
        else:
            self._after_full(task)

    # ---- phases ------------------------------------------------------------------------------------------
    def _after_enumerate(self, task: Task) -> None:
        wanted = set(self.opts.libtypes)
        for i, name in enumerate(task.items):
            res = self._results[i]
            if not res.ok:
                if name in wanted:
                    self.errors.append(f"{name}: {res.error}")
                continue
            if name == BASELINE and res.solutions:
                self._baseline = res.solutions[0]
            if name not in wanted:
                continue
            for sol in res.solutions:
                if sol in self._eligible:
                    continue
                self._eligible[sol] = True
                screen = res.is_blaslt or name in self.opts.screen_libtypes
                (self._screened if screen else self._others).append(sol)
        if self._baseline is not None:
            self._eligible.setdefault(self._baseline, BASELINE in wanted)
        if self._screened:
            self.phase = "screen"
        elif self._others or self._baseline is not None:
            self.phase = "full"
        else:
            self._finish()
            return
        n_kept = sum(min(n, self.opts.screen_top) for n in self._count_by_lib(self._screened).values())
        self.planned += len(self._screened) + n_kept + len(self._others) + \
            (self._baseline is not None and self._baseline not in self._others)

    @staticmethod
    def _count_by_lib(sols: list[Solution]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for sol in sols:
            counts[sol.libtype] = counts.get(sol.libtype, 0) + 1
        return counts

    def _after_screen(self, task: Task) -> None:
        ran = []
        for i, sol in enumerate(task.items):
            res = self._results[i]
            self.candidates.append(Candidate(sol, "screen", res, True))
            if res.ok and math.isfinite(res.us) and res.us > 0:  # failures are dropped before ranking
                ran.append((res.us, i, sol))
        ran.sort()
        kept: list[Solution] = []
        per_lib: dict[str, int] = {}
        for _, _, sol in ran:  # the fastest screen_top of each screened backend
            if per_lib.get(sol.libtype, 0) < self.opts.screen_top:
                per_lib[sol.libtype] = per_lib.get(sol.libtype, 0) + 1
                kept.append(sol)
        log.debug("shape %s: screened %d solutions, %d ran, kept %d", self.problem, len(task.items), len(ran),
                  len(kept))
        planned_kept = sum(min(n, self.opts.screen_top) for n in self._count_by_lib(self._screened).values())
        self.planned -= planned_kept - len(kept)
        self._screened = kept
        self.phase = "full"

    def _full_items(self) -> list[Solution]:
        items = list(dict.fromkeys(self._screened + self._others))
        if self._baseline is not None and self._baseline not in items:
            items.append(self._baseline)
        return items

    def _after_full(self, task: Task) -> None:
        for i, sol in enumerate(task.items):
            self.candidates.append(Candidate(sol, "full", self._results[i], self._eligible.get(sol, False)))
        self._finish()

    def _finish(self) -> None:
        full = [c for c in self.candidates if c.phase == "full"]
        valid = [c for c in full if c.eligible and c.result.ok and math.isfinite(c.us)
                 and c.result.err_ratio <= self.opts.err_ratio]
        winner = min(valid, key=lambda c: c.us) if valid else None
        base = next((c for c in full if c.solution == self._baseline), None)
        if winner is not None and base is not None and base in valid and winner is not base \
                and base.us < winner.us * self.opts.min_gain:
            winner = base
        self.done = True
        self.outcome = ShapeOutcome(self.shape_id, self.problem, winner, base, self.candidates, self.errors,
                                    time.monotonic() - (self.started or time.monotonic()))


def run_searches(executor: Executor, searches: list[ShapeSearch], on_outcome: Callable[[ShapeOutcome], None],
                 on_item: Callable[[ShapeSearch, ItemResult], None] | None = None) -> None:
    """Drive ``searches`` to completion on ``executor``: shapes already started get free slots first (so finished
    shapes reach the checkpoint early), then new shapes in order. ``on_outcome`` runs as each shape finishes."""
    by_id = {s.shape_id: s for s in searches}
    waiting = list(searches)
    active: list[ShapeSearch] = []
    next_id = 0
    while waiting or active:
        while executor.free_slots() > 0:
            task = None
            for s in active:
                task = s.next_task(next_id)
                if task is not None:
                    break
            while task is None and waiting:
                s = waiting.pop(0)
                active.append(s)
                task = s.next_task(next_id)
            if task is None:
                break
            next_id += 1
            executor.submit(task)
        for ev in executor.poll(0.5):
            s = by_id[ev.task.shape_id]
            if isinstance(ev, ItemDone):
                s.on_item(ev.result)
                if on_item is not None:
                    on_item(s, ev.result)
            elif isinstance(ev, TaskDone):
                s.on_task_done()
                if s.done:
                    active.remove(s)
                    on_outcome(s.outcome)


__all__ = ["BASELINE", "Candidate", "SearchOptions", "ShapeOutcome", "ShapeSearch", "run_searches"]
