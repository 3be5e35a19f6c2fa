"""AITER's ``--compare`` / ``--update_improved`` / ``--min_improvement_pct`` and ``--run_config`` on the one driver.

``--compare``: each shape's search also times the incumbent, what the runtime runs for it today: the tuned file's row
(its solution), or the runtime's default when the file has none (:class:`~gradlib.search.ShapeSearch`'s
``incumbent``), in the same phase and the same confirmation rounds as the winner. A shape is *improved* when the
winner is another solution at least ``min_improvement_pct`` % faster than the incumbent (``(pre - post) / pre``, as
AITER computes it), or the op's baseline (the library call) faster by any margin (never slower than the library
call: falling back to it risks nothing), or when the incumbent cannot run here any more; with
``--update_improved`` exactly those rows are written (replaced or added) and every other row of the file is left as
it was; without it the tuned file is not touched and the winners go to a candidate copy (:func:`candidate_path`).
This is the answer to a stale file after a driver or library upgrade:
``gemm-tuner -i tuned.csv -o tuned.csv --all --compare --update_improved``.

``--run_config [FILE]``: time the rows of FILE on this device (or, with no FILE, the runtime's default for the input
shapes) against the op's baseline (``F.linear``) and print the table; nothing is written.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aiter_gemm.backends.base import Problem
from aiter_gemm.configs import TunedRow
from gradlib.records import DEFAULT, Candidate, ShapeOutcome
from gradlib.tune_ops import TuneOp

#: AITER's margin on the error ratio a row was tuned with, before ``--run_config`` calls it a mismatch.
ERR_RATIO_MARGIN = 0.05


@dataclass(frozen=True)
class CompareOptions:
    """``--compare`` settings: the improvement a new winner needs, whether improved rows are written to the tuned
    file (``--update_improved``), and the candidate copy receiving every winner."""

    min_improvement_pct: float = 3.0
    update: bool = False
    candidate_file: str | None = None


@dataclass(frozen=True)
class Verdict:
    """What ``--compare`` decided for one shape: ``action`` UPDATE (row replaced), NEW (row added), KEEP or
    FAILED, the incumbent's (pre) and winner's (post) times, the improvement and why."""

    action: str
    pre_us: float
    post_us: float
    improvement_pct: float
    reason: str

    @property
    def write(self) -> bool:
        return self.action in ("UPDATE", "NEW")


def verdict(outcome: ShapeOutcome, has_row: bool, opts: CompareOptions) -> Verdict:
    """The compare decision for one finished shape (``has_row``: the tuned file had a row for it)."""
    inc = outcome.incumbent
    pre = inc.us if inc is not None and inc.result.ok else math.nan
    new = "NEW" if not has_row else "UPDATE"
    if outcome.winner is None:
        return Verdict("FAILED", pre, math.nan, math.nan, "no valid candidate: row kept")
    post = outcome.winner.us
    if inc is not None and outcome.winner.solution == inc.solution:
        return Verdict("KEEP", pre, post, 0.0, "the row's solution still wins")
    if not (math.isfinite(pre) and pre > 0):
        why = "no row and the default did not run" if not has_row else "the row's solution no longer runs here"
        return Verdict(new, pre, post, math.nan, why)
    pct = (pre - post) / pre * 100.0
    base = outcome.baseline
    if pct > 0 and base is not None and outcome.winner.solution == base.solution:
        return Verdict(new, pre, post, pct, "the library call is faster than the row")
    if pct >= opts.min_improvement_pct:
        return Verdict(new, pre, post, pct, f">= {opts.min_improvement_pct:g}% faster")
    return Verdict("KEEP", pre, post, pct, f"< {opts.min_improvement_pct:g}% faster")


def candidate_path(tuned_file: str | os.PathLike) -> str:
    """Where ``--compare`` keeps its candidate copy of the tuned file (AITER's place: ``<tmp>/aiter_compare``)."""
    base = Path(tuned_file)
    folder = Path(tempfile.gettempdir()) / "aiter_compare"
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder / f"{base.stem}.{os.getpid()}.candidate{base.suffix or '.csv'}")


def seed_candidate(tuned_file: str | os.PathLike, candidate: str | os.PathLike) -> None:
    """Start the candidate copy as the tuned file is now (empty when there is none)."""
    if os.path.isfile(tuned_file):
        shutil.copyfile(tuned_file, candidate)
    elif os.path.exists(candidate):
        os.unlink(candidate)


def _fmt(us: float) -> str:
    return f"{us:.2f}" if math.isfinite(us) and us > 0 else "N/A"


def _shape(spec: TuneOp, p: Problem) -> str:
    return "(" + ", ".join(v if k in ("M", "N", "K") else f"{k}={v}" for k, v in spec.shape_cells(p).items()) + ")"


def format_compare(spec: TuneOp, outcomes: list[ShapeOutcome], verdicts: Mapping[int, Verdict],
                   opts: CompareOptions, tuned_file: str) -> str:
    """AITER's compare report: counts, then one line per shape with pre / post times, improvement and action."""
    vs = [(o, verdicts[o.shape_id]) for o in sorted(outcomes, key=lambda o: o.shape_id) if o.shape_id in verdicts]
    n_upd = sum(v.action == "UPDATE" for _, v in vs)
    n_new = sum(v.action == "NEW" for _, v in vs)
    verb = "Updated" if opts.update else "Would update"
    head = f"{'Shape':<32} | {'Pre(us)':>10} | {'Post(us)':>10} | {'Improve':>9} | {'Action':>7} | Reason"
    lines = ["============= Compare Report =============",
             f"Total shapes: {len(vs)} | {verb}: {n_upd + n_new} (improved: {n_upd}, new: {n_new}) | Skipped: "
             f"{len(vs) - n_upd - n_new}",
             f"Threshold: >= {opts.min_improvement_pct:.1f}% improvement to update {tuned_file}", head, "-" * len(head)]
    for o, v in vs:
        pct = f"{v.improvement_pct:.2f}%" if math.isfinite(v.improvement_pct) else "N/A"
        lines.append(f"{_shape(spec, o.problem):<32} | {_fmt(v.pre_us):>10} | {_fmt(v.post_us):>10} | {pct:>9} | "
                     f"{v.action:>7} | {v.reason}")
    if not opts.update:
        lines.append(f"{tuned_file} was not updated; re-run with --update_improved to apply"
                     + (f" (every winner is in {opts.candidate_file})" if opts.candidate_file else ""))
    return "\n".join(lines)


def run_config_status(timed: Candidate | None, row: TunedRow | None, err_limit: float, err_column: str) -> str:
    """OK, ERROR: why, or MISMATCH: the error ratio over AITER's limit, max(--errRatio, the row's + 5%)."""
    if timed is None:
        return "ERROR: not timed"
    res = timed.result
    if not res.ok and not res.error.startswith("err_ratio"):
        return f"ERROR: {res.error}"
    limit = err_limit
    if row is not None:
        try:
            limit = max(limit, float(row.fields.get(err_column) or "nan") + ERR_RATIO_MARGIN)
        except ValueError:
            pass
    if not res.err_ratio <= limit:
        return f"MISMATCH: err_ratio={res.err_ratio:.6g} (> {limit:.6g})"
    return "OK"


def format_run_config(spec: TuneOp, outcomes: list[ShapeOutcome], rows: Mapping[Problem, TunedRow],
                      err_limit: float, label: str) -> tuple[str, int]:
    """The ``--run_config`` table (shape, what ran, its time, the baseline's, speedup, status) and how many shapes
    are not OK."""
    base = spec.baseline or "baseline"
    head = (f"{'Shape':<32} | {'libtype':<9} | {'kernelName':<40} | {'us':>10} | {base + ' us':>10} | "
            f"{'speedup':>7} | Status")
    lines = [f"============= Benchmark ({label}) Results =============", head, "-" * len(head)]
    bad = 0
    for o in sorted(outcomes, key=lambda o: o.shape_id):
        full = [c for c in o.candidates if c.phase == "full"]
        timed = o.incumbent
        inc = timed.solution if timed is not None else None
        base_c = next((c for c in full if c.solution.libtype == spec.baseline and c.solution != inc),
                      timed if inc is not None and inc.libtype == spec.baseline else None)
        status = run_config_status(timed, rows.get(o.problem), err_limit, spec.err_column)
        bad += status != "OK"
        sol = timed.solution if timed is not None else DEFAULT
        if sol == DEFAULT and timed is not None and timed.result.solutions:
            sol = timed.result.solutions[0]  # what the default resolved to
        us = timed.us if timed is not None else math.nan
        base_us = base_c.us if base_c is not None else math.nan
        speed = f"{base_us / us:.2f}x" if math.isfinite(us) and math.isfinite(base_us) else "N/A"
        name = sol.kernelName if len(sol.kernelName) <= 40 else sol.kernelName[:37] + "..."
        lines.append(f"{_shape(spec, o.problem):<32} | {sol.libtype:<9} | {name:<40} | {_fmt(us):>10} | "
                     f"{_fmt(base_us):>10} | {speed:>7} | {status}")
    return "\n".join(lines), bad
