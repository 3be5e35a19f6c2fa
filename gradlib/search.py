"""The search of one shape, for every op, as a state machine the scheduling loop drives (docs/design.md, "Tuner").

enumerate: every requested backend of the op (plus the op's baseline, F.linear for ``gemm_a16w16``) lists its
candidates for the shape, in a worker (``quick``: the backends' short lists); or the caller gives a fixed list.
screen (phase 1, only if a BLASLt backend has candidates): BLASLt solutions are timed with few iterations and no
accuracy check, failures are dropped before ranking and the fastest ``screen_top`` (20) are kept (per backend;
``screen_libtypes`` adds other backends with large config spaces to this phase, to trade search breadth for time).
full (phase 2): those plus every candidate of the other backends, plus the baseline, are timed with full warm-up and
checked against the float32 reference, split into up to ``chunks`` tasks that run on different workers at once.
The winner is the fastest eligible candidate with ``err_ratio <= errRatio``; a failed candidate has ``us`` = inf and
can never rank first; a winner other than the baseline must beat it by ``min_gain``. With ``refine``, further full
rounds time the candidates it derives from the valid ones so far (the MoE tuner's per-stage search: GEMM2's configs
beside GEMM1's winner, then GEMM1's beside GEMM2's), until it has nothing new.
Confirmation (``confirm_rounds``): the pick and its *finalists* (the fastest candidate of each other libtype within
``finalist_margin`` of the pick's full-phase time) are timed again beside the runtime's default and the baseline in
alternating rounds; the finalist with the best median wins, and is written if it beats default and baseline.
An ``incumbent`` (``--compare``: the tuned file's current solution for the shape, or :data:`DEFAULT` when it has
none) is timed beside the candidates in the full phase and the confirmation rounds, so the row can be kept unless the
new winner beats it under the same conditions (:mod:`gradlib.compare`).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from aiter_gemm.backends.base import GemmProblem, Problem, Solution
from aiter_gemm.timing import TimingConfig
from gradlib.pool import Executor, ItemDone, TaskDone
from gradlib.records import A16W16, DEFAULT, DEFAULTS, ENUMERATE, TIME, Candidate, ItemResult, Probe, ShapeOutcome, Task

log = logging.getLogger(__name__)

BASELINE = "torch"  # F.linear: timed for every gemm_a16w16 shape so the speedup of the winner is known
# Phase 1 (BLASLt screening): AITER's reduced warm-up; accuracy is not checked.
SCREEN = TimingConfig(warmup=2, reps=5, target_us=200.0, budget_s=0.5)
# Phase 2: full warm-up, 21 repetitions (odd: the median is one measurement).
FULL = TimingConfig(warmup=10, reps=21, target_us=1000.0, budget_s=2.0)
# Confirmation rounds (the winner against the default and the baseline, alternating): each round is one timing,
# the median over rounds decides, so a round may be shorter than a phase-2 timing.
CONFIRM = TimingConfig(warmup=5, reps=11, target_us=500.0, budget_s=0.5)


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
    # A candidate whose ||out - ref|| / ||ref|| exceeds this many times the baseline's on the same data is rejected,
    # whatever its err_ratio (an edge-tile bug can stay under --errRatio's 5%); the floor keeps fp32-accumulation
    # noise (~1e-6 at K = 4096) from rejecting kernels when the baseline is exact.
    rel_err_factor: float = 2.0
    rel_err_floor: float = 1e-4
    # Confirmation (0 rounds: off): the winner, the runtime's default and the baseline timed again in this many
    # alternating rounds at M, and, for a row padding will serve, at the smallest M of each padding range and one in
    # the middle; the winner is written only if it beats both by min_gain at M, and is kept for padded M only down
    # to where it is no slower than both (within pad_tolerance).
    confirm_rounds: int = 0
    confirm: TimingConfig = CONFIRM
    pad_check: bool = True
    pad_tolerance: float = 1.01
    # Finalists (<= 1: off): the fastest eligible candidate of each other libtype within this factor of the pick's
    # full-phase time joins the confirmation rounds, and the best median there wins: timings taken one after another
    # drift (a GPU heating over compute-heavy candidates reads later ones slower), so close libraries are decided
    # side by side, not by their place in the sequence.
    finalist_margin: float = 1.15
    #: (problem, the eligible valid solutions so far fastest first, round 1, 2, ...) -> solutions for one more full
    #: round (those already timed are dropped); rounds stop when it returns nothing new. None: one full round.
    refine: Callable[[Problem, list[Solution], int], Sequence[Solution]] | None = None


@dataclass
class _Job:
    """One task's worth of work in a phase: a problem and items, and the results as they arrive."""

    problem: Problem
    items: tuple
    kind: str = TIME
    kw: dict = field(default_factory=dict)  # Task fields: timing, check, max_err, options
    results: dict[int, ItemResult] = field(default_factory=dict)
    first: int = 0  # index of the job's first item in the phase's list


def pad_probes(M: int, N: int, K: int) -> list[int]:
    """:func:`pad_probes_of` a GEMM of (M, N, K)."""
    return pad_probes_of(GemmProblem(M, N, K))


def pad_probes_of(p: Problem) -> list[int]:
    """The M values to confirm a row of ``p`` for padded use, ascending: the smallest M that pads to ``p.M`` at each
    of the problem's padded lookup levels (``p.padded()``: AITER's getPaddedM granularities for GEMMs, the next
    power of two of the token count for fused MoE), and one in the middle of the widest range (none when no other M
    pads to it)."""
    M = p.M
    lows = []
    for level, _ in p.padded():
        def pad(m: int, level: str = level) -> int:
            return dict(p.with_m(m).padded())[level].M

        if pad(M) != M:
            continue
        lo, hi = 1, M  # smallest m <= M with pad(m) == M: pad is non-decreasing for m <= M
        while lo < hi:
            mid = (lo + hi) // 2
            if pad(mid) >= M:
                hi = mid
            else:
                lo = mid + 1
        if lo < M:
            lows.append(lo)
    if not lows:
        return []
    return sorted({*lows, (min(lows) + M) // 2} - {M})


def finalists_of(pick: Candidate, valid: Sequence[Candidate], margin: float) -> list[Candidate]:
    """The pick, then the fastest of ``valid`` of each other libtype whose full-phase time is within ``margin`` of the
    pick's, fastest first: the candidates the confirmation rounds decide among (``margin`` <= 1: the pick alone)."""
    if not margin > 1.0:
        return [pick]
    best: dict[str, Candidate] = {}
    for c in sorted(valid, key=lambda c: c.us):
        best.setdefault(c.solution.libtype, c)
    return [pick] + [c for lib, c in best.items() if lib != pick.solution.libtype and c.us <= pick.us * margin]


def pad_min_from(M: int, probes: list[Probe]) -> int:
    """The smallest probe M from which every probe up to M passed (M itself when the closest one failed)."""
    pad_min = M
    for probe in sorted(probes, key=lambda p: -p.M):
        if not probe.passed:
            break
        pad_min = probe.M
    return pad_min


class ShapeSearch:
    """The search state of one shape; :func:`run_searches` feeds it events and asks it for its next task.
    ``candidates`` skips enumeration and times exactly those solutions (plus ``baseline``, the op's reference
    solution, when given: eligible only if its libtype is among ``opts.libtypes``); ``incumbent`` is timed beside
    them (a solution may win; :data:`DEFAULT` only competes as a reference)."""

    def __init__(self, shape_id: int, problem: Problem, opts: SearchOptions,
                 candidates: tuple[Solution, ...] | None = None, baseline: Solution | None = None,
                 incumbent: Solution | None = None) -> None:
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
        self._jobs: list[_Job] = []  # the phase's work
        self._handed = 0  # jobs of the phase handed out
        self._inflight: dict[int, int] = {}  # task id -> job index
        self._pick: Candidate | None = None  # the full phase's winner, being confirmed
        self._finalists: list[Candidate] = []  # the pick and its finalists (SearchOptions.finalist_margin)
        self._confirmed_base: Candidate | None = None  # the baseline as the confirmation timed it
        self._default_at: dict[int, Solution] = {}  # M -> what the runtime's default runs there (resolved)
        self.incumbent = incumbent
        self._incumbent_timed: Candidate | None = None
        self._round = 0  # refine rounds done
        self._timed_full = 0  # candidates of the full rounds so far (a round's indexes follow them)
        if candidates is None:
            self.phase = ENUMERATE
            self._jobs = [_Job(problem, self._enumerate_items(), ENUMERATE,
                               {"options": opts.options + ((("quick", True),) if opts.quick else ())})]
        else:
            for sol in candidates:
                self._eligible.setdefault(sol, sol.libtype not in opts.untunable)
            self._others = list(dict.fromkeys(candidates))
            self._baseline = baseline
            if baseline is not None:
                self._eligible.setdefault(baseline, baseline.libtype in opts.libtypes)
            self._add_incumbent()
            self._enter("full")

    @property
    def inflight(self) -> bool:
        return bool(self._inflight)

    def progress(self) -> tuple[str, int, int]:
        """(phase, items of it finished, its items): what the progress display shows, exact by construction (a
        later phase's size is not known before it starts)."""
        return self.phase, sum(len(j.results) for j in self._jobs), sum(len(j.items) for j in self._jobs)

    def _enumerate_items(self) -> tuple[str, ...]:
        libs, base = self.opts.libtypes, self.opts.baseline
        return libs if base is None or base in libs else (*libs, base)

    # ---- driving -----------------------------------------------------------------------------------------
    def next_task(self, task_id: int) -> Task | None:
        """The task to run next, or None while the phase's tasks are all handed out or the search is done."""
        if self.done or self._handed >= len(self._jobs):
            return None
        if not self.started:
            self.started = time.monotonic()
        o = self.opts
        job = self._jobs[self._handed]
        kw = {"seed": o.seed, "options": o.options, "op": o.op, **job.kw}
        task = Task(task_id, self.shape_id, job.kind, job.problem, job.items, **kw)
        self._inflight[task_id] = self._handed
        self._handed += 1
        return task

    def on_item(self, res: ItemResult) -> None:
        self._jobs[self._inflight[res.task_id]].results[res.index] = res

    def on_task_done(self, task: Task | None = None) -> None:
        """All items of ``task`` (default: the only one in flight) are in; the phase ends with its last task."""
        task_id = task.task_id if task is not None else next(iter(self._inflight))
        job = self._jobs[self._inflight.pop(task_id)]
        for i in range(len(job.items)):  # an executor bug, but never let a hole look like a success
            if i not in job.results:
                job.results[i] = ItemResult(task_id, i, False, error="no result from the executor")
        if self._inflight or self._handed < len(self._jobs):
            return  # more of this phase to come
        {ENUMERATE: self._after_enumerate, "screen": self._after_screen, "full": self._after_full,
         DEFAULTS: self._after_defaults, "confirm": self._after_confirm}[self.phase]()

    def _enter(self, phase: str) -> None:
        """Start ``phase``: list its jobs (an empty phase still goes out once, as an empty task)."""
        o = self.opts
        self.phase, self._handed = phase, 0
        if phase == "screen":
            self._jobs = [_Job(self.problem, tuple(self._screened), kw={"timing": o.screen, "check": False})]
        elif phase == "full":
            items = self._full_items()
            size = max(1, math.ceil(len(items) / max(1, o.chunks)))
            kw = {"timing": o.full, "check": True, "max_err": o.err_ratio}
            first = self._timed_full
            self._jobs = [_Job(self.problem, tuple(items[i:i + size]), kw=kw, first=first + i)
                          for i in range(0, len(items), size)] or [_Job(self.problem, (), kw=kw, first=first)]
        elif phase == DEFAULTS:
            self._jobs = [_Job(self.problem, tuple(self._confirm_ms()), DEFAULTS, {"timing": o.confirm})]
        else:
            self._jobs = self._confirm_jobs() or [_Job(self.problem, (), kw={"timing": o.confirm})]

    # ---- phases ------------------------------------------------------------------------------------------
    def _after_enumerate(self) -> None:
        o = self.opts
        wanted = set(o.libtypes)
        (job,) = self._jobs
        for i, name in enumerate(job.items):
            res = job.results[i]
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
        self._add_incumbent()
        if not self._screened and not self._others and self._baseline is None:
            self._finish(None)
            return
        self._enter("screen" if self._screened else "full")

    def _add_incumbent(self) -> None:
        """Time the incumbent in the full phase (never screened out); a solution of the file may win (the row is
        then kept), the runtime default is a reference only."""
        inc = self.incumbent
        if inc is None:
            return
        self._eligible[inc] = inc != DEFAULT
        if inc not in self._others:
            self._others.append(inc)

    def _after_screen(self) -> None:
        (job,) = self._jobs
        ran = []
        for i, sol in enumerate(job.items):
            res = job.results[i]
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
        log.debug("shape %s: screened %d solutions, %d ran, kept %d", self.problem, len(job.items), len(ran),
                  len(kept))
        self._screened = kept
        self._enter("full")

    def _full_items(self) -> list[Solution]:
        items = list(dict.fromkeys(self._screened + self._others))
        if self._round == 0 and self._baseline is not None and self._baseline not in items:
            items.append(self._baseline)
        return items

    def _after_full(self) -> None:
        for job in self._jobs:
            for i, sol in enumerate(job.items):
                self.candidates.append(Candidate(sol, "full", job.results[i], self._eligible.get(sol, False),
                                                 job.first + i))
            self._timed_full += len(job.items)
        o = self.opts
        full = [c for c in self.candidates if c.phase == "full"]
        base = self._base_candidate()
        limit = math.inf
        if base is not None and base.result.ok and math.isfinite(base.result.rel_err):
            limit = max(o.rel_err_factor * base.result.rel_err, o.rel_err_floor)
        valid = [c for c in full if c.eligible and c.result.ok and math.isfinite(c.us)
                 and c.result.err_ratio <= o.err_ratio and not c.result.rel_err > limit]
        if o.refine is not None and self._refine(sorted(valid, key=lambda c: c.us), full):
            return
        winner = min(valid, key=lambda c: c.us) if valid else None
        if o.confirm_rounds > 0 and winner is not None:
            self._pick = winner
            self._finalists = finalists_of(winner, valid, o.finalist_margin)
            self._enter(DEFAULTS)
            return
        if winner is not None and base is not None and base in valid and winner is not base \
                and base.us < winner.us * o.min_gain:
            winner = base
        self._finish(winner)

    def _refine(self, ranked: list[Candidate], full: list[Candidate]) -> bool:
        """Start another full round with what :attr:`SearchOptions.refine` derives from ``ranked`` (solutions not
        timed yet); whether one started."""
        self._round += 1
        timed = {c.solution for c in full}
        more = [s for s in dict.fromkeys(self.opts.refine(self.problem, [c.solution for c in ranked], self._round))
                if s not in timed]
        if not more:
            return False
        for sol in more:
            self._eligible.setdefault(sol, sol.libtype not in self.opts.untunable)
        self._screened, self._others = [], more
        self._enter("full")
        return True

    def _base_candidate(self) -> Candidate | None:
        if self._baseline is None:
            return None
        if self._confirmed_base is not None:
            return self._confirmed_base
        return next((c for c in self.candidates if c.phase == "full" and c.solution == self._baseline), None)

    # ---- confirmation ------------------------------------------------------------------------------------
    def _confirm_ms(self) -> list[int]:
        p = self.problem
        return [p.M] + (pad_probes_of(p) if self.opts.pad_check else [])

    def _after_defaults(self) -> None:
        (job,) = self._jobs
        self._default_at = {m: job.results[i].solutions[0] for i, m in enumerate(job.items)
                            if job.results[i].ok and job.results[i].solutions}
        self._enter("confirm")

    def _runs(self, sol: Solution | None, m: int) -> Solution | None:
        """What ``sol`` runs at M: DEFAULT is the solution it resolved to there (itself while unresolved)."""
        return self._default_at.get(m, DEFAULT) if sol == DEFAULT else sol

    def _confirm_order(self, m: int) -> list[Solution]:
        """Finalists (the pick first), default, baseline and incumbent, each solution once: one that another already
        runs at M (the default resolving to the winner or F.linear) is not timed against itself. On CPU winner,
        default and baseline are all F.linear: 13 of 15 timings of a quick-start shape compared it with itself."""
        order: list[Solution] = []
        for sol in (*(c.solution for c in self._finalists), DEFAULT, self._baseline, self.incumbent):
            if sol is not None and self._runs(sol, m) not in {self._runs(x, m) for x in order}:
                order.append(sol)
        return order

    def _confirm_jobs(self) -> list[_Job]:
        """One job per M with something to compare: alternating rounds of :meth:`_confirm_order` (forward, then
        reversed), every timing's graph as long as the others' (calls sized from the pick's full-phase time,
        :attr:`aiter_gemm.timing.TimingConfig.per_call_us`); the padded M time the finalists too, in one phase."""
        o, p = self.opts, self.problem
        timing = o.confirm
        if math.isfinite(self._pick.us) and self._pick.us > 0:
            timing = replace(o.confirm, per_call_us=self._pick.us)
        kw = {"timing": timing, "check": True, "max_err": o.err_ratio}
        jobs = []
        for m in self._confirm_ms():
            order = self._confirm_order(m)
            if len(order) > 1:
                items = tuple(sol for r in range(o.confirm_rounds) for sol in (order if r % 2 == 0 else order[::-1]))
                jobs.append(_Job(p.with_m(m), items, kw=kw))
        return jobs

    def _timings(self, m: int, job: _Job | None) -> dict[Solution | None, list[float]]:
        """The confirmation's times at M by what each item ran (a failed timing: inf)."""
        times: dict[Solution | None, list[float]] = {}
        for i, sol in enumerate(job.items if job is not None else ()):
            res = job.results[i]
            times.setdefault(self._runs(sol, m), []).append(res.us if res.ok else math.inf)
        return times

    def _decide(self, job: _Job | None) -> Candidate:
        """The finalist with the best confirmation median at the tuned M (the pick on a tie, or alone)."""
        times = self._timings(self.problem.M, job)
        if not times:
            return self._pick
        return min(self._finalists, key=lambda c: statistics.median(times.get(c.solution, [math.inf])))

    def _probe(self, m: int, job: _Job | None, winner: Candidate) -> Probe:
        """Median times at M; ``winner`` passes if it beats the best of default and baseline by ``min_gain`` at
        the tuned M, or is no slower than them within ``pad_tolerance`` at a padded M. Without a job (all of them
        run one solution at M) it passes: at the tuned M with the full phase's time, elsewhere untimed (NaN)."""
        times = self._timings(m, job)
        default = self._default_at.get(m)
        for i, sol in enumerate(job.items if job is not None else ()):
            if sol == DEFAULT and job.results[i].solutions:
                default = job.results[i].solutions[0]
        if job is None:
            times = {winner.solution: [winner.us if m == self.problem.M else math.nan]}

        def median(sol: Solution | None) -> float:
            return statistics.median(times.get(self._runs(sol, m), [math.inf]))

        w, d = median(winner.solution), median(DEFAULT)
        b = median(self._baseline) if self._baseline is not None else math.inf
        inc_us = math.nan if self.incumbent is None else median(self.incumbent)
        best_other = min(d, b)
        if job is None:
            passed = True
        elif m == self.problem.M:
            passed = math.isfinite(w) and w * self.opts.min_gain <= best_other
        else:
            passed = math.isfinite(w) and w <= best_other * self.opts.pad_tolerance
        return Probe(m, w, d, b, default, passed, inc_us)

    def _after_confirm(self) -> None:
        by_m = {job.problem.M: job for job in self._jobs if job.items}
        pick = self._pick
        best = self._decide(by_m.get(self.problem.M))
        if best is not pick:
            log.info("shape %s: the confirmation ranks %s (%s) ahead of the full phase's pick %s",
                     self.problem.label(), best.solution.kernelName, best.solution.libtype, pick.solution.kernelName)
        probes = [self._probe(m, by_m.get(m), best) for m in self._confirm_ms()]
        exact, padded = probes[0], probes[1:]
        for job in self._jobs:  # profile rows: one per timing, the default as what it ran
            for i, sol in enumerate(job.items):
                res = job.results[i]
                shown = res.solutions[0] if sol == DEFAULT and res.solutions else sol
                self.candidates.append(Candidate(shown, f"confirm M={job.problem.M} #{i}", res, False, i))
        if self.incumbent is not None:  # what --compare weighs the winner against: the same rounds
            self._incumbent_timed = Candidate(self.incumbent, "confirm", ItemResult(
                -1, -1, math.isfinite(exact.incumbent_us), us=exact.incumbent_us), False)
        if self._baseline is not None:  # the speedup reported is the confirmation's: same rounds, same state
            base_us = exact.winner_us if self._baseline == best.solution else exact.baseline_us
            self._confirmed_base = Candidate(self._baseline, "confirm", ItemResult(-1, -1, math.isfinite(base_us),
                                                                                    us=base_us), False)
        if exact.passed:
            winner = Candidate(best.solution, "confirm", replace(best.result, us=exact.winner_us), True, best.index)
            self._finish(winner, pad_min_from(self.problem.M, padded), probes, searched=None if best is pick else pick)
            return
        # The winner did not hold: write what runs fastest without it (the default, or the baseline where the
        # default loses to it), for this M only.
        if exact.baseline_us * self.opts.min_gain < exact.default_us and self._baseline is not None:
            sol, us = self._baseline, exact.baseline_us
        elif exact.default is not None and math.isfinite(exact.default_us):
            sol, us = exact.default, exact.default_us
        else:
            self._finish(None, None, probes)
            return
        res = ItemResult(pick.result.task_id, -1, True, us=us, err_ratio=0.0, method="confirm")
        if sol == self._baseline:  # the default resolved to the baseline itself: one solution, one time
            self._confirmed_base = Candidate(sol, "confirm", res, False)
        self._finish(Candidate(sol, "confirm", res, True), self.problem.M, probes, searched=pick)

    def _failure(self) -> str | None:
        """Why no full-phase candidate could win when they all failed: their most common error first (a cause
        every candidate shares, such as inputs too large for the device, is otherwise only in the profile file)."""
        full = [c for c in self.candidates if c.phase == "full"]
        errors = [c.result.error for c in full if not c.result.ok]
        if not full or len(errors) < len(full):
            return None
        error, n = Counter(errors).most_common(1)[0]
        return f"{error} ({'all ' if n == len(full) else ''}{n} of {len(full)} candidate(s))"

    def _finish(self, winner: Candidate | None, pad_m_min: int | None = None, probes: list[Probe] | None = None,
                searched: Candidate | None = None) -> None:
        self.done = True
        why = self._failure() if winner is None and not self.errors else None
        if why is not None:
            self.errors.append(why)
        incumbent = self._incumbent_timed
        if incumbent is None and self.incumbent is not None:
            incumbent = next((c for c in self.candidates if c.phase == "full" and c.solution == self.incumbent), None)
        self.outcome = ShapeOutcome(self.shape_id, self.problem, winner, self._base_candidate(), self.candidates,
                                    self.errors, time.monotonic() - (self.started or time.monotonic()), pad_m_min,
                                    tuple(probes or ()), searched, "graph" if self.opts.full.use_graph else "eager",
                                    incumbent)


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
                if on_item is not None and ev.task.kind != DEFAULTS:  # resolving a default runs no candidate
                    on_item(s, ev.result)
            elif isinstance(ev, TaskDone):
                s.on_task_done(ev.task)
                if s.done:
                    active.remove(s)
                    on_outcome(s.outcome)
        if on_tick is not None:
            on_tick(active)


__all__ = ["BASELINE", "Candidate", "Probe", "SearchOptions", "ShapeOutcome", "ShapeSearch", "pad_probes",
           "pad_probes_of", "run_searches"]
