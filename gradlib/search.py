"""The search of one shape, for every op, as a state machine the scheduling loop drives (docs/design.md, "Tuner").

enumerate: every requested backend of the op (plus the op's baseline, F.linear for ``gemm_a16w16``) lists its
candidates for the shape, in a worker (``quick``: the backends' short lists); or the caller gives a fixed list.
screen (phase 1, only if a BLASLt backend has candidates): BLASLt solutions are timed with few iterations and no
accuracy check, failures are dropped before ranking and the fastest ``screen_top`` (20) are kept (per backend;
``screen_libtypes`` adds other backends with large config spaces to this phase, to trade search breadth for time).
full (phase 2): those plus every candidate of the other backends, plus the baseline, are timed with full warm-up and
checked against the float32 reference, split into up to ``chunks`` tasks that run on different workers at once.
The winner is the fastest eligible candidate with ``err_ratio <= errRatio``; a failed candidate has ``us`` = inf and
can never rank first; a winner other than the baseline must beat it by ``min_gain``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiter_gemm.backends.base import GemmProblem, Solution
from gradlib.pool import Executor, ItemDone, TaskDone
from gradlib.tasks import A16W16, ENUMERATE, TIME, ItemResult, Task
from gradlib.timing import FULL, SCREEN, TimingConfig

log = logging.getLogger(__name__)

BASELINE = "torch"  # F.linear: timed for every gemm_a16w16 shape so the speedup of the winner is known


@dataclass(frozen=True)
class SearchOptions:
    """Search settings shared by every shape of a run."""

    libtypes: tuple[str, ...]
    err_ratio: float = 0.05
    screen_top: int = 20
    screen_libtypes: tuple[str, ...] = ()  # non-BLASLt backends also screened in phase 1 (opt-in: speed)
    seed: int = 0
    # A winner that is not the baseline must beat it by this factor, else the baseline is kept (when eligible):
    # on H100, one shape's F.linear time moved by up to 2.4% between two timings in one session and up to 9% across
    # sessions on compute-bound shapes (BENCHMARKS.md, cublaslt), so smaller wins are noise, not gains.
    min_gain: float = 1.0
    screen: TimingConfig = SCREEN
    full: TimingConfig = FULL
    op: str = A16W16
    baseline: str | None = BASELINE  # libtype timed for every shape as the reference; None: no baseline
    quick: bool = False  # enumerate the backends' short lists
    options: tuple[tuple[str, object], ...] = ()  # passed to every task (the op's input settings)
    chunks: int = 1  # the full phase is split into up to this many tasks (one per worker)
    untunable: tuple[str, ...] = ()  # libtypes timed for comparison but never winners (backend.tunable False)
    accept: Callable[[Solution], bool] | None = None  # keeps only the enumerated solutions it accepts


@dataclass(frozen=True)
class Candidate:
    """One timed solution: which phase timed it, what came out, and its position in the phase's list."""

    solution: Solution
    phase: str  # "screen" or "full"
    result: ItemResult
    eligible: bool  # False for the baseline when it was not asked for, and for untunable backends
    index: int = -1

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
    """The search state of one shape; :func:`run_searches` feeds it events and asks it for its next task.
    ``candidates`` skips enumeration and times exactly those solutions."""

    def __init__(self, shape_id: int, problem: GemmProblem, opts: SearchOptions,
                 candidates: tuple[Solution, ...] | None = None) -> None:
        self.shape_id, self.problem, self.opts = shape_id, problem, opts
        self.done = False
        self.started = 0.0
        self.candidates: list[Candidate] = []
        self.errors: list[str] = []
        self.outcome: ShapeOutcome | None = None
        self._eligible: dict[Solution, bool] = {}
        self._screened: list[Solution] = []
        self._others: list[Solution] = []
        self._baseline: Solution | None = None
        self._phase_items: tuple[Solution, ...] = ()  # the items of the phase being run
        self._results: dict[int, ItemResult] = {}  # phase item index -> result
        self._offset: dict[int, int] = {}  # task id -> index of its first item in the phase
        self._inflight: dict[int, Task] = {}
        self._next = 0  # first phase item not yet handed out
        self._handed = -1  # tasks handed out in this phase (-1: the phase's items are not listed yet)
        if candidates is None:
            self.phase = ENUMERATE
            self.planned = len(self._enumerate_items())  # items this shape will run, as far as known
        else:
            for sol in candidates:
                self._eligible.setdefault(sol, sol.libtype not in opts.untunable)
            self._others = list(dict.fromkeys(candidates))
            self.phase = "full"
            self.planned = len(self._others)

    @property
    def inflight(self) -> bool:
        return bool(self._inflight)

    def _enumerate_items(self) -> tuple[str, ...]:
        libs, base = self.opts.libtypes, self.opts.baseline
        return libs if base is None or base in libs else (*libs, base)

    # ---- driving -----------------------------------------------------------------------------------------
    def next_task(self, task_id: int) -> Task | None:
        """The task to run next, or None while the phase's tasks are all handed out or the search is done."""
        if self.done:
            return None
        if not self.started:
            self.started = time.monotonic()
        o = self.opts
        common = {"seed": o.seed, "options": o.options, "op": o.op}
        if self.phase == ENUMERATE:
            if self._inflight:
                return None
            opts = o.options + ((("quick", True),) if o.quick else ())
            task = Task(task_id, self.shape_id, ENUMERATE, self.problem, self._enumerate_items(),
                        **{**common, "options": opts})
            self._start(task, 0, ())
            return task
        if self._handed < 0:  # entering the phase
            self._phase_items = tuple(self._screened) if self.phase == "screen" else tuple(self._full_items())
            self._results, self._next, self._handed = {}, 0, 0
        if self._next >= len(self._phase_items) and self._handed > 0:
            return None  # all handed out (an empty phase still goes out once, as an empty task)
        if self.phase == "screen":
            size = len(self._phase_items)
            kw = {"timing": o.screen, "check": False}
        else:
            size = max(1, math.ceil(len(self._phase_items) / max(1, o.chunks)))
            kw = {"timing": o.full, "check": True, "max_err": o.err_ratio}
        first = self._next
        items = self._phase_items[first:first + size]
        task = Task(task_id, self.shape_id, TIME, self.problem, items, **kw, **common)
        self._start(task, first, items)
        return task

    def _start(self, task: Task, first: int, items: tuple) -> None:
        self._handed += 1
        self._inflight[task.task_id] = task
        self._offset[task.task_id] = first
        self._next = first + len(items)

    def on_item(self, res: ItemResult) -> None:
        self._results[self._offset[res.task_id] + res.index] = res

    def on_task_done(self, task: Task | None = None) -> None:
        """All items of ``task`` (default: the only one in flight) are in; the phase ends with its last task."""
        task = task if task is not None else next(iter(self._inflight.values()))
        del self._inflight[task.task_id]
        first = self._offset[task.task_id]
        for i in range(len(task.items)):  # an executor bug, but never let a hole look like a success
            if first + i not in self._results:
                self._results[first + i] = ItemResult.failed(task, i, "no result from the executor")
        if self.phase == ENUMERATE:
            self._after_enumerate(task)
        elif self._inflight or self._next < len(self._phase_items):
            return  # more of this phase to come
        elif self.phase == "screen":
            self._after_screen()
        else:
            self._after_full()

    # ---- phases ------------------------------------------------------------------------------------------
    def _after_enumerate(self, task: Task) -> None:
        o = self.opts
        wanted = set(o.libtypes)
        for i, name in enumerate(task.items):
            res = self._results[i]
            if not res.ok:
                if name in wanted:
                    self.errors.append(f"{name}: {res.error}")
                continue
            if name == o.baseline and res.solutions:
                self._baseline = res.solutions[0]
            if name not in wanted:
                continue
            for sol in res.solutions:
                if sol in self._eligible or (o.accept is not None and not o.accept(sol)):
                    continue
                self._eligible[sol] = name not in o.untunable
                screen = res.is_blaslt or name in o.screen_libtypes
                (self._screened if screen else self._others).append(sol)
        if self._baseline is not None:
            self._eligible.setdefault(self._baseline, o.baseline in wanted)
        self._results, self._handed = {}, -1
        if self._screened:
            self.phase = "screen"
        elif self._others or self._baseline is not None:
            self.phase = "full"
        else:
            self._finish()
            return
        n_kept = sum(min(n, o.screen_top) for n in self._count_by_lib(self._screened).values())
        self.planned += len(self._screened) + n_kept + len(self._others) + \
            (self._baseline is not None and self._baseline not in self._others)

    @staticmethod
    def _count_by_lib(sols: list[Solution]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for sol in sols:
            counts[sol.libtype] = counts.get(sol.libtype, 0) + 1
        return counts

    def _after_screen(self) -> None:
        ran = []
        for i, sol in enumerate(self._phase_items):
            res = self._results[i]
            self.candidates.append(Candidate(sol, "screen", res, True, i))
            if res.ok and math.isfinite(res.us) and res.us > 0:  # failures are dropped before ranking
                ran.append((res.us, i, sol))
        ran.sort()
        kept: list[Solution] = []
        per_lib: dict[str, int] = {}
        for _, _, sol in ran:  # the fastest screen_top of each screened backend
            if per_lib.get(sol.libtype, 0) < self.opts.screen_top:
                per_lib[sol.libtype] = per_lib.get(sol.libtype, 0) + 1
                kept.append(sol)
        log.debug("shape %s: screened %d solutions, %d ran, kept %d", self.problem, len(self._phase_items), len(ran),
                  len(kept))
        planned_kept = sum(min(n, self.opts.screen_top) for n in self._count_by_lib(self._screened).values())
        self.planned -= planned_kept - len(kept)
        self._screened = kept
        self.phase, self._handed = "full", -1

    def _full_items(self) -> list[Solution]:
        items = list(dict.fromkeys(self._screened + self._others))
        if self._baseline is not None and self._baseline not in items:
            items.append(self._baseline)
        return items

    def _after_full(self) -> None:
        for i, sol in enumerate(self._phase_items):
            self.candidates.append(Candidate(sol, "full", self._results[i], self._eligible.get(sol, False), i))
        self._finish()

    def _finish(self) -> None:
        full = [c for c in self.candidates if c.phase == "full"]
        valid = [c for c in full if c.eligible and c.result.ok and math.isfinite(c.us)
                 and c.result.err_ratio <= self.opts.err_ratio]
        winner = min(valid, key=lambda c: c.us) if valid else None
        base = next((c for c in full if c.solution == self._baseline), None) if self._baseline is not None else None
        if winner is not None and base is not None and base in valid and winner is not base \
                and base.us < winner.us * self.opts.min_gain:
            winner = base
        self.done = True
        self.outcome = ShapeOutcome(self.shape_id, self.problem, winner, base, self.candidates, self.errors,
                                    time.monotonic() - (self.started or time.monotonic()))


def run_searches(executor: Executor, searches: list[ShapeSearch], on_outcome: Callable[[ShapeOutcome], None],
                 on_item: Callable[[ShapeSearch, ItemResult], None] | None = None,
                 on_tick: Callable[[list[ShapeSearch]], None] | None = None) -> None:
    """Drive ``searches`` to completion on ``executor``: shapes already started get free slots first (so finished
    shapes reach the checkpoint early), then new shapes in order. ``on_outcome`` runs as each shape finishes,
    ``on_tick`` with the shapes in progress after every poll (at least every 0.5 s)."""
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
                s.on_task_done(ev.task)
                if s.done:
                    active.remove(s)
                    on_outcome(s.outcome)
        if on_tick is not None:
            on_tick(active)


__all__ = ["BASELINE", "Candidate", "SearchOptions", "ShapeOutcome", "ShapeSearch", "run_searches"]
