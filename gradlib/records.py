"""The tuner's records, picklable data and nothing that runs: a :class:`Task` (work on one shape for one executor
slot) and the :class:`ItemResult` of each of its items, then what a shape's search made of them (:class:`Candidate`,
:class:`Probe`, :class:`ShapeOutcome`). The executors (:mod:`gradlib.pool`, :mod:`gradlib.ray_executor`), the
workers (:mod:`gradlib.tasks`), the search (:mod:`gradlib.search`) and the ops' tuner sides
(:mod:`gradlib.tune_ops`) all speak them, so they import this module and not each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.testbed import DEFAULT
from aiter_gemm.timing import TimingConfig

ENUMERATE = "enumerate"
TIME = "time"
DEFAULTS = "defaults"  # items are M values: what the runtime's default runs for the task's shape at each M
KINDS = (ENUMERATE, TIME, DEFAULTS)
A16W16 = "gemm_a16w16"
#: DEFAULT (:mod:`aiter_gemm.testbed`, which resolves it): a TIME item standing for whatever the runtime's heuristic
#: default runs for the task's shape (reported in the result's ``solutions``): what the tuner confirms a winner against.
__all__ = ["A16W16", "DEFAULT", "DEFAULTS", "ENUMERATE", "KINDS", "TIME", "Candidate", "ItemResult", "Probe",
           "ShapeOutcome", "Task"]


@dataclass(frozen=True)
class Task:
    """Work on one shape for one executor slot. ``first`` > 0 continues a task after its process was restarted."""

    task_id: int
    shape_id: int
    kind: str  # ENUMERATE: items are libtype names; TIME: items are Solutions; DEFAULTS: items are M values
    problem: GemmProblem
    items: tuple
    timing: TimingConfig | None = None
    check: bool = True  # compare with the float32 reference (phase 2) or not (phase 1 screening)
    max_err: float = 1.0  # a candidate above this err_ratio is not timed (it cannot win)
    seed: int = 0
    first: int = 0
    #: Op settings as (name, value) pairs (picklable, hashable): ``("quick", True)`` enumerates the backends'
    #: short lists; the block-scale op's ``("x_scale_layout", "m_major")`` lays its inputs out that way.
    options: tuple[tuple[str, object], ...] = ()
    op: str = A16W16  # the op (aiter_gemm.registry.op_spec / gradlib.tune_ops.tune_op name)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Task.kind must be one of the registered kinds {list(KINDS)}, got {self.kind!r}")


@dataclass(frozen=True)
class ItemResult:
    """What one item produced. Failed items have ``ok`` False, ``us`` inf and an ``error``; ``restart`` asks the
    executor to replace the process (its device may be unusable after the failure)."""

    task_id: int
    index: int
    ok: bool
    us: float = math.inf
    err_ratio: float = math.nan  # NaN: not checked
    method: str = ""
    error: str = ""
    # ENUMERATE: the candidates; TIME of DEFAULT and DEFAULTS: the solution the default resolved to
    solutions: tuple[Solution, ...] = ()
    rel_err: float = math.nan  # ||out - ref|| / ||ref|| (NaN: not checked)
    is_blaslt: bool = False  # ENUMERATE: the backend wants phase-1 screening
    restart: bool = False

    @staticmethod
    def failed(task: Task, index: int, error: str, restart: bool = False) -> "ItemResult":
        return ItemResult(task.task_id, index, False, error=error, restart=restart)


@dataclass(frozen=True)
class Candidate:
    """One timed solution: which phase timed it, what came out, and its position in the phase's list."""

    solution: Solution
    phase: str  # "screen", "full" or "confirm"
    result: ItemResult
    eligible: bool  # False for the baseline when it was not asked for, and for untunable backends
    index: int = -1

    @property
    def us(self) -> float:
        return self.result.us if self.result.ok else math.inf


@dataclass(frozen=True)
class Probe:
    """The confirmation at one M: median times of the winner, the default and the baseline, and the verdict."""

    M: int
    winner_us: float
    default_us: float
    baseline_us: float
    default: Solution | None  # what the runtime's default ran at this M
    passed: bool
    incumbent_us: float = math.nan  # the incumbent's median (NaN: no incumbent)

    @property
    def ratio(self) -> float:
        """The best of default and baseline over the winner (> 1: the winner is faster)."""
        return min(self.default_us, self.baseline_us) / self.winner_us


@dataclass
class ShapeOutcome:
    """Everything the writer and the final table need about one shape."""

    shape_id: int
    problem: GemmProblem
    winner: Candidate | None
    baseline: Candidate | None
    candidates: list[Candidate]
    errors: list[str]  # backends that could not enumerate; with no winner, the candidates' common failure
    wall_s: float
    pad_m_min: int | None = None  # the smallest M the row was checked for through padding (None: not checked)
    probes: tuple[Probe, ...] = ()  # the confirmation, exact M first
    #: The full phase's pick, when the confirmation wrote another solution (a finalist with a better median, or the
    #: default / baseline where the pick did not hold); None: the pick was written.
    searched: Candidate | None = None
    timing: str = "graph"  # how the candidates were timed: CUDA-graph replay or eager calls
    #: The incumbent as last timed (the confirmation's exact-M median, else its full-phase timing), or None.
    incumbent: Candidate | None = None

    @property
    def tuned(self) -> bool:
        return self.winner is not None

    def ranked(self) -> list[Candidate]:
        """Phase-2 candidates, fastest valid first; failed ones (us = inf) last."""
        full = [c for c in self.candidates if c.phase == "full"]
        return sorted(full, key=lambda c: (not c.result.ok, c.us))
