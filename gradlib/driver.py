"""The tuner driver, for every op: start the executor, skip shapes the tuned file has, run the searches with
checkpoints, print the table and the summary line. The CLIs (:mod:`gradlib.gemm_tuner`,
:mod:`gradlib.tune_a8w8_blockscale`) only parse arguments into a :class:`TuneJob`. AITER's ``--compare`` and
``--run_config`` are options of the same run (:mod:`gradlib.compare`): the incumbent of a shape is timed by its
search, and a gate decides which winners become rows.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from aiter_gemm.backends.base import Problem, Solution
from aiter_gemm.configs import ConfigError, TunedRow
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.fileio import render_csv, write_error
from gradlib.cli import (
    EXIT_FAILED_SHAPES,
    EXIT_UNSAVED,
    EXIT_USAGE,
    Terminated,
    exit_status,
    sigterm_as_interrupt,
    start_executor,
)
from gradlib.compare import CompareOptions, Verdict, format_compare, format_run_config, seed_candidate, verdict
from gradlib.pool import Executor, PoolError
from gradlib.progress import Progress
from gradlib.records import DEFAULT, ShapeOutcome
from gradlib.results import (
    CheckpointWriter,
    Roofline,
    device_rows,
    fp8_peak_for,
    roofline_for,
    sort_tuned_file,
    tuned_keys,
)
from gradlib.search import SearchOptions, ShapeSearch, run_searches
from gradlib.tasks import backend_of
from gradlib.tune_ops import Sidecar, TuneOp, shape_label

log = logging.getLogger("gradlib")


@dataclass(frozen=True)
class TuneJob:
    """One tuner run, as explicit parameters (no argparse.Namespace below the CLI)."""

    prog: str  # for messages: "gemm-tuner", "python -m gradlib.tune_a8w8_blockscale"
    spec: TuneOp
    problems: list[Problem]
    search: SearchOptions
    tuned_file: str
    batch: int = 8
    retune: bool = False  # --all: retune shapes the tuned file has and replace their rows
    #: --keep_class_rows: this device's rows go beside the rows naming no device (the shapes they serve are tuned)
    keep_class_rows: bool = False
    split_shapes: bool = False  # split each shape's candidates over every worker (chunks = workers)
    #: Fixed candidates per (shape, device) (skips enumeration; the op's baseline is still timed beside them); an
    #: empty tuple: nothing can run that shape.
    candidates: Callable[[Problem, DeviceIdentity], tuple[Solution, ...]] | None = None
    profile_file: str | None = None
    summary_file: str | None = None
    peak_tflops: float | None = None  # TFLOP/s, overriding the measured roofline table
    peak_bw: float | None = None  # GB/s
    verbose: bool = False
    sidecar: Callable[[DeviceIdentity, list[Problem]], Sidecar] | None = None  # the op's side files
    #: A tuned file whose rows for the workers' device are the shapes (instead of ``problems``): ``-i X -o X
    #: --all`` retunes X in place; ``--run_config X`` times X's rows.
    rows_of: str | None = None
    compare: CompareOptions | None = None  # --compare: time each shape's incumbent, write only improved rows
    #: --run_config: time what runs today (``rows_of``'s row, else the runtime default) against the op's baseline,
    #: print that table and write nothing; the value labels the table.
    run_config: str | None = None
    err_limit: float = 0.05  # --run_config: the --errRatio a row must stay within (AITER: or its own + 5%)
    #: (flag, folder) pairs the op's side files are written into (created if missing), checked before tuning as the
    #: output files are: the block-scale tuner's ``--json_dir``.
    output_dirs: tuple[tuple[str, str], ...] = ()


def _baseline_of(op: str, libtype: str | None, p: Problem, ident: DeviceIdentity) -> Solution | None:
    """The baseline backend's solution for ``p`` (its first candidate), for searches with fixed candidates."""
    if libtype is None:
        return None
    backend = backend_of(op, libtype)
    return next(iter(backend.candidates(p, ident)), None) if backend.is_available() else None


def roofline(job: TuneJob, ident: DeviceIdentity) -> Roofline | None:
    """The job's peaks where given (``--peak_tflops`` for every dtype), else the measured table's entry for this
    device, with the datasheet's FP8 peak (:func:`~gradlib.results.fp8_peak_for`) for FP8 problems (or None)."""
    base = roofline_for(ident)
    given = job.peak_tflops * 1e12 if job.peak_tflops else None
    flops = given or (base.flops if base else None)
    bw = job.peak_bw * 1e9 if job.peak_bw else (base.bytes if base else None)
    if flops is None or bw is None:
        return None
    return Roofline(flops, bw, "command line" if job.peak_tflops or job.peak_bw else base.source,
                    given or fp8_peak_for(ident))


def describe(sol: Solution) -> str:
    name = sol.kernelName if len(sol.kernelName) <= 40 else sol.kernelName[:37] + "..."
    return f"{sol.libtype}[{sol.solidx},{sol.splitK}] {name}".rstrip()


def format_table(spec: TuneOp, outcomes: list[ShapeOutcome], roof: Roofline | None) -> str:
    """One line per shape: winner, time, TFLOP/s, % of roofline and speedup over the baseline where known."""
    base = spec.baseline
    headers = list(spec.shape_cells(outcomes[0].problem)) if outcomes else ["M", "N", "K"]
    widths = [max(len(h), 6) for h in headers]
    head = ("".join(f"{h:>{w}} " for h, w in zip(headers, widths))
            + f" {'winner':<52} {'us':>10} {'TFLOPS':>8}" + (f" {'%roof':>6}" if roof else "")
            + (f" {base + ' us':>10} {'speedup':>7}" if base else "") + f" {'ok/cands':>8} {'wall s':>7}")
    lines = [head, "-" * len(head)]
    for o in sorted(outcomes, key=lambda o: o.shape_id):  # input order
        p, w, b = o.problem, o.winner, o.baseline
        full = [c for c in o.candidates if c.phase == "full"]
        ok = sum(1 for c in full if c.result.ok)
        base_us = b.us if b is not None else math.inf
        key = "".join(f"{v:>{w}} " for v, w in zip(spec.shape_cells(p).values(), widths))
        if w is None:
            label, us, tflops, roof_s, speed = "FAILED: " + ("; ".join(o.errors)[:44] or "no valid candidate"), \
                "-", "-", "-", "-"
        else:
            label, us, tflops = describe(w.solution), f"{w.us:.3f}", f"{p.flops / w.us / 1e6:.2f}"
            frac = roof.fraction(p, w.us) if roof else math.nan
            roof_s = f"{100 * frac:.1f}%" if math.isfinite(frac) else "-"
            speed = f"{base_us / w.us:.2f}x" if math.isfinite(base_us) else "-"
        lines.append(key + f" {label:<52} {us:>10} {tflops:>8}" + (f" {roof_s:>6}" if roof else "")
                     + (f" {base_us:>10.3f} {speed:>7}" if base else "") + f" {ok:>3}/{len(full):<4} {o.wall_s:>7.1f}")
    return "\n".join(lines)


def _top(o: ShapeOutcome, n: int = 5) -> str:
    rows = [f"  {describe(c.solution):<52} {c.us:>10.3f} us  err {c.result.err_ratio:.4f}"
            + ("" if c.result.ok else f"  ({c.result.error[:60]})") for c in o.ranked()[:n]]
    p = o.problem
    return f"{shape_label(p)}: top {len(rows)}\n" + "\n".join(rows)


def precompile(op: str, libtypes: tuple[str, ...], problems: list[Problem], ident: DeviceIdentity,
               quick: bool, fixed: Callable[[Problem, DeviceIdentity], tuple[Solution, ...]] | None) -> None:
    """Let each backend build what its candidates need before any is timed (TileLang: every kernel compiled in
    parallel into its disk cache, so each worker's ``prepare`` loads it in milliseconds instead of running nvcc per
    candidate; Triton: each distinct candidate run once in parallel build processes, into Triton's disk cache). A
    backend that cannot build here (its package missing in this process) is skipped with a warning: the workers then
    build, or fail, candidate by candidate."""
    from aiter_gemm.backends.base import Backend
    from aiter_gemm.registry import op_spec
    from gradlib.tasks import enumerate_solutions

    package = op_spec(op).backends
    for lib in libtypes:
        backend = backend_of(op, lib)
        if type(backend).precompile is Backend.precompile:
            continue
        jobs = [(p, s) for p in problems
                for s in (fixed(p, ident) if fixed is not None else enumerate_solutions(backend, p, ident, quick))
                if s.libtype == lib]
        if not jobs:
            continue
        t0 = time.monotonic()
        try:
            failed = backend.precompile(jobs)
        except ImportError as exc:
            log.warning("%s (%s): cannot build ahead here (%s); workers build per candidate", lib, package, exc)
            continue
        log.info("%s: %d candidate kernel(s) built in %.1f s, %d failed%s", lib, len(jobs), time.monotonic() - t0,
                 len(failed), "".join(f"; {name}: {why}" for name, why in list(failed.items())[:3]))


def drive(pool: Executor, searches: list[ShapeSearch], on_outcome, on_item, flush: Callable[[], None],
          on_tick=None) -> tuple[KeyboardInterrupt | None, PoolError | None]:
    """Run the searches to the end, or until Ctrl-C / SIGTERM or a pool failure; the last checkpoint is written
    (``flush``: the writers' ``close``, side files of unfinished groups included) and the pool closed either way.
    Returns (the interruption, if any; pool error)."""
    try:
        run_searches(pool, searches, on_outcome, on_item, on_tick)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as cli.Terminated
        return exc, None
    except PoolError as exc:
        return None, exc
    finally:
        flush()
        pool.close()
    return None, None


def output_errors(job: TuneJob) -> list[str]:
    """What keeps the job's outputs from being written, one message per output naming its flag and path (an empty
    list: all can be): checked before anything runs, so that a run does not tune for hours and then fail to save."""
    files = []
    if job.run_config is None:
        if job.compare is None or job.compare.update:
            files.append(("-o", job.tuned_file))
        if job.compare is not None and job.compare.candidate_file:
            files.append(("--compare's candidate copy", job.compare.candidate_file))
    files += [(flag, f) for flag, f in (("--profile_file", job.profile_file), ("--summary_file", job.summary_file))
              if f is not None]
    out = [f"{flag} {path}: {why}" for flag, path in files if (why := write_error(path)) is not None]
    if job.run_config is None:
        out += [f"{flag} {path}: {why}" for flag, path in job.output_dirs
                if (why := write_error(path, folder=True)) is not None]
    return out


def report_unsaved(job: TuneJob, writers: list[CheckpointWriter]) -> bool:
    """Say which outputs could not be written and print the tuned rows they lack (CSV on stdout), so that nothing
    tuned is lost; whether anything was left unsaved."""
    left = False
    for w in writers:
        for path, rows, exc in w.unsaved():
            left = True
            if rows and path == w.tuned_file:
                print(f"{job.prog}: error: could not write {path}: {exc}; its {len(rows)} tuned row(s) follow on "
                      "stdout as CSV: save them and merge them into the file (or rerun with -o elsewhere)",
                      file=sys.stderr)
                sys.stdout.write(render_csv(job.spec.tuned_columns, rows))
            else:
                print(f"{job.prog}: error: could not write {path}: {exc}" + (f"; {len(rows)} row(s) lost" if rows
                                                                             else ""), file=sys.stderr)
    return left


def run(job: TuneJob, pool: Executor, run_config: bool = False, sort: bool = False) -> int:
    """The run step of every tuner CLI: ``run_config`` (AITER's ``--run_config``) times and checks every candidate
    and confirms or writes nothing (against ``job.rows_of``'s rows, else the default); ``sort`` (``--sort``) sorts
    the tuned file afterwards. The exit status of :func:`tune`."""
    if run_config:
        job = replace(job, search=replace(job.search, err_ratio=1.0, confirm_rounds=0, min_gain=1.0),
                      run_config=f"tuned: {job.rows_of}" if job.rows_of else "default")
    status = tune(job, pool)
    if sort and not run_config and os.path.isfile(job.tuned_file):
        try:
            sort_tuned_file(job.tuned_file, job.spec)
        except OSError as exc:  # the rows are written; only their order is not (a full disk, a lock held long)
            print(f"{job.prog}: error: --sort: could not rewrite {job.tuned_file}: {exc}", file=sys.stderr)
            return status or EXIT_UNSAVED
    return status


def tune(job: TuneJob, pool: Executor) -> int:
    """Run ``job`` on ``pool`` (any :class:`~gradlib.pool.Executor`: the process pool, Ray actors); the exit
    status of :func:`gradlib.cli.exit_status`. SIGTERM is handled as Ctrl-C is: what finished is saved."""
    with sigterm_as_interrupt():
        return _tune(job, pool)


def _tune(job: TuneJob, pool: Executor) -> int:
    t0 = time.monotonic()
    unwritable = output_errors(job)
    if unwritable:
        pool.close()
        for message in unwritable:
            print(f"{job.prog}: error: {message}; nothing was tuned", file=sys.stderr)
        return EXIT_USAGE
    failed = start_executor(pool, job.prog)
    if failed is not None:
        return failed
    ident = pool.identity
    spec = job.spec
    from aiter_gemm.registry import op_spec

    opspec = op_spec(spec.op)
    row_key = opspec.row_key
    try:
        file_rows = device_rows(job.rows_of, ident, spec.op) if job.rows_of else None
        problems = job.problems if file_rows is None else list(dict.fromkeys(spec.key_problem(r.key)
                                                                            for r in file_rows))
        done = set() if job.retune or job.run_config else tuned_keys(job.tuned_file, ident, spec.op,
                                                                     exact_only=job.keep_class_rows)
        # What runs each shape today: its row (compare: in the tuned file; run_config: in the file timed).
        rows_now: dict[tuple, TunedRow] = {}
        if job.compare is not None:
            rows_now = {r.key: r for r in device_rows(job.tuned_file, ident, spec.op)}
        elif job.run_config is not None and file_rows is not None:
            rows_now = {r.key: r for r in file_rows}
        as_candidate = spec.row_candidate or opspec.row_solution
        incumbent_of = {key: as_candidate(r) for key, r in rows_now.items()}
    except ConfigError as exc:
        pool.close()
        print(f"{job.prog}: error: tuned file unusable: {exc}", file=sys.stderr)
        return EXIT_USAGE
    sidecar = job.sidecar(ident, problems) if job.sidecar is not None else None
    todo = []
    for p in problems:
        if row_key(p) in done:
            if sidecar is not None:
                sidecar.skipped(p)
        else:
            todo.append(p)
    skipped = len(problems) - len(todo)
    opts = replace(job.search, chunks=pool.slots) if job.split_shapes else job.search
    roof = roofline(job, ident)
    verdicts: dict[int, Verdict] = {}

    def accept(o: ShapeOutcome) -> bool:
        """Which winners become rows of the tuned file: --run_config none, --compare the improved ones (only with
        --update_improved), else all."""
        if job.run_config is not None or (job.compare is not None and not job.compare.update):
            return False
        return verdicts[o.shape_id].write if job.compare is not None else True

    writer = CheckpointWriter(job.tuned_file, ident, job.batch, job.retune, job.profile_file, job.summary_file, roof,
                              spec, sidecar, accept, keep_class_rows=job.keep_class_rows)
    writers = [writer]
    if job.compare is not None and job.compare.candidate_file:
        seed_candidate(job.tuned_file, job.compare.candidate_file)
        writers.append(CheckpointWriter(job.compare.candidate_file, ident, job.batch, True, spec=spec))
    outcomes: list[ShapeOutcome] = []
    searches = []
    progress = Progress(len(todo), describe)
    # [run, failed] per phase: what the summary line reports (listing a backend's candidates runs none).
    counts = {"screen": [0, 0], "full": [0, 0], "confirm": [0, 0]}

    def on_item(search: ShapeSearch, res) -> None:
        if search.phase in counts:  # an item arrives while its phase is the search's (it ends with its last task)
            counts[search.phase][0] += 1
            counts[search.phase][1] += not res.ok
        progress.item(search, res)

    def on_outcome(o: ShapeOutcome) -> None:
        outcomes.append(o)
        if job.compare is not None:
            verdicts[o.shape_id] = verdict(o, row_key(o.problem) in rows_now, job.compare)
        for w in writers:
            w.add(o)
        progress.shape(o)
        if job.verbose:
            progress.write(_top(o))

    with progress:
        for i, p in enumerate(todo):
            fixed = job.candidates(p, ident) if job.candidates is not None else None
            incumbent = None
            if job.compare is not None or job.run_config is not None:
                incumbent = incumbent_of.get(row_key(p), DEFAULT)
            if job.run_config is not None:  # what runs today (the incumbent) against the op's baseline, if any
                fixed = ()
            elif fixed is not None and not fixed:  # nothing can run it: a failed shape without work
                log.warning("%s: no candidate can run this shape", p.label())
                on_outcome(ShapeOutcome(i, p, None, None, [], ["no candidate can run this shape"], 0.0))
                continue
            searches.append(ShapeSearch(i, p, opts, fixed, _baseline_of(spec.op, opts.baseline, p, ident)
                                        if fixed is not None else None, incumbent))
        precompile(spec.op, opts.libtypes, todo, ident, opts.quick, job.candidates)
        log.info("device %s (gfx=%s cu_num=%d), %d worker(s), libtypes %s: %d shape(s), %d already tuned",
                 ident.name, ident.gfx, ident.cu_num, pool.slots, ",".join(opts.libtypes), len(problems), skipped)
        interrupted, pool_error = drive(pool, searches, on_outcome, on_item, lambda: [w.close() for w in writers],
                                        progress.tick)
    if job.run_config is not None:
        table, bad = format_run_config(spec, outcomes, {spec.key_problem(k): r for k, r in rows_now.items()},
                                       job.err_limit, job.run_config)
        print(table)
        print(f"{job.prog}: --run_config: {len(outcomes)} shape(s) timed on {ident.gfx}/{ident.cu_num}, {bad} not OK"
              f"; nothing written; wall {time.monotonic() - t0:.1f} s")
        status = exit_status(job.prog, pool_error, interrupted, 0)
        return status if status or not bad else EXIT_FAILED_SHAPES
    if outcomes:
        print(format_table(spec, outcomes, roof))
        for o in sorted(outcomes, key=lambda o: o.shape_id):  # the table cuts reasons short
            if not o.tuned:
                print(f"{o.problem.label()}: no winner: "
                      + ("; ".join(o.errors) or "no valid candidate"))
        if job.compare is not None:
            print(format_compare(spec, outcomes, verdicts, job.compare, job.tuned_file))
    unsaved = report_unsaved(job, writers)
    tuned = sum(o.tuned for o in outcomes)
    failed = len(outcomes) - tuned
    unfinished = len(todo) - len(outcomes)
    print(f"{job.prog}: {tuned} tuned, {skipped} skipped (already in {job.tuned_file}), {failed} failed"
          + (f", {unfinished} not finished" if unfinished else "")
          + "".join(f"; {n} candidate(s) {what} ({bad} failed)" for what, (n, bad) in
                    (("screened", counts["screen"]), ("timed", counts["full"])) if n or what == "timed")
          + (f", {counts['confirm'][0]} confirmation run(s)" if counts["confirm"][0] else "")
          + f"; {pool.restarts} worker "
          f"restart(s); {pool.slots} worker(s) on {ident.gfx}/{ident.cu_num}; wall {time.monotonic() - t0:.1f} s; "
          f"{writer.written} row(s) written to {job.tuned_file}"
          + (f" ({writer.stale_replaced} unusable row(s) replaced)" if writer.stale_replaced else "")
          + (f", all winners in {job.compare.candidate_file}" if job.compare and job.compare.candidate_file else "")
          + (f", all candidates in {job.profile_file}" if job.profile_file else "")
          + (sidecar.summary() if sidecar is not None else ""))
    if interrupted is not None:
        name = "SIGTERM" if isinstance(interrupted, Terminated) else "SIGINT"
        print(f"{job.prog}: interrupted ({name}): the {len(outcomes)} shape(s) that finished are "
              + ("printed above (not all could be saved)" if unsaved else "saved")
              + f" ({writer.written} row(s) in {job.tuned_file}); rerun the same command to tune the rest",
              file=sys.stderr)
    return exit_status(job.prog, pool_error, interrupted, failed, unsaved)
