"""The tuner driver, for every op: start the executor, skip shapes the tuned file has, run the searches with
checkpoints, print the table and the summary line. The CLIs (:mod:`gradlib.gemm_tuner`,
:mod:`gradlib.tune_a8w8_blockscale`) only parse arguments into a :class:`TuneJob`.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.configs import ConfigError
from aiter_gemm.device import DeviceIdentity
from gradlib.cli import EXIT_USAGE, Terminated, exit_status, sigterm_as_interrupt, start_executor
from gradlib.pool import Executor, PoolError
from gradlib.progress import Progress
from gradlib.results import CheckpointWriter, Roofline, roofline_for, tuned_keys
from gradlib.search import SearchOptions, ShapeOutcome, ShapeSearch, run_searches
from gradlib.tune_ops import Sidecar, TuneOp

log = logging.getLogger("gradlib")


@dataclass(frozen=True)
class TuneJob:
    """One tuner run, as explicit parameters (no argparse.Namespace below the CLI)."""

    prog: str  # for messages: "gemm-tuner", "python -m gradlib.tune_a8w8_blockscale"
    spec: TuneOp
    problems: list[GemmProblem]
    search: SearchOptions
    tuned_file: str
    batch: int = 8
    retune: bool = False  # --all: retune shapes the tuned file has and replace their rows
    split_shapes: bool = False  # split each shape's candidates over every worker (chunks = workers)
    #: Fixed candidates per shape (skips enumeration); an empty tuple means nothing can run that shape.
    candidates: Callable[[GemmProblem], tuple[Solution, ...]] | None = None
    profile_file: str | None = None
    summary_file: str | None = None
    peak_tflops: float | None = None  # TFLOP/s, overriding the measured roofline table
    peak_bw: float | None = None  # GB/s
    verbose: bool = False
    sidecar: Callable[[DeviceIdentity], Sidecar] | None = None  # the op's side files for this device


def roofline(job: TuneJob, ident: DeviceIdentity) -> Roofline | None:
    """The job's peaks where given, else the measured table's entry for this device (or None)."""
    base = roofline_for(ident)
    flops = job.peak_tflops * 1e12 if job.peak_tflops else (base.flops if base else None)
    bw = job.peak_bw * 1e9 if job.peak_bw else (base.bytes if base else None)
    if flops is None or bw is None:
        return None
    return Roofline(flops, bw, "command line" if job.peak_tflops or job.peak_bw else base.source)


def describe(sol: Solution) -> str:
    name = sol.kernelName if len(sol.kernelName) <= 40 else sol.kernelName[:37] + "..."
    return f"{sol.libtype}[{sol.solidx},{sol.splitK}] {name}".rstrip()


def format_table(spec: TuneOp, outcomes: list[ShapeOutcome], roof: Roofline | None) -> str:
    """One line per shape: winner, time, TFLOP/s, % of roofline and speedup over the baseline where known."""
    base = spec.baseline
    head = (f"{'M':>6} {'N':>6} {'K':>6} " + (f"{'bias':>5} " if spec.show_bias else "")
            + f" {'winner':<52} {'us':>10} {'TFLOPS':>8}" + (f" {'%roof':>6}" if roof else "")
            + (f" {base + ' us':>10} {'speedup':>7}" if base else "") + f" {'ok/cands':>8} {'wall s':>7}")
    lines = [head, "-" * len(head)]
    for o in sorted(outcomes, key=lambda o: o.shape_id):  # input order
        p, w, b = o.problem, o.winner, o.baseline
        full = [c for c in o.candidates if c.phase == "full"]
        ok = sum(1 for c in full if c.result.ok)
        base_us = b.us if b is not None else math.inf
        key = f"{p.M:>6} {p.N:>6} {p.K:>6} " + (f"{p.bias!s:>5} " if spec.show_bias else "")
        if w is None:
            label, us, tflops, roof_s, speed = "FAILED: " + ("; ".join(o.errors)[:44] or "no valid candidate"), \
                "-", "-", "-", "-"
        else:
            label, us, tflops = describe(w.solution), f"{w.us:.3f}", f"{p.flops / w.us / 1e6:.2f}"
            roof_s = f"{100 * roof.fraction(p, w.us):.1f}%" if roof else "-"
            speed = f"{base_us / w.us:.2f}x" if math.isfinite(base_us) else "-"
        lines.append(key + f" {label:<52} {us:>10} {tflops:>8}" + (f" {roof_s:>6}" if roof else "")
                     + (f" {base_us:>10.3f} {speed:>7}" if base else "") + f" {ok:>3}/{len(full):<4} {o.wall_s:>7.1f}")
    return "\n".join(lines)


def _top(o: ShapeOutcome, n: int = 5) -> str:
    rows = [f"  {describe(c.solution):<52} {c.us:>10.3f} us  err {c.result.err_ratio:.4f}"
            + ("" if c.result.ok else f"  ({c.result.error[:60]})") for c in o.ranked()[:n]]
    p = o.problem
    return f"M={p.M} N={p.N} K={p.K} bias={p.bias}: top {len(rows)}\n" + "\n".join(rows)


def drive(pool: Executor, searches: list[ShapeSearch], on_outcome, on_item, writer: CheckpointWriter,
          on_tick=None) -> tuple[KeyboardInterrupt | None, PoolError | None]:
    """Run the searches to the end, or until Ctrl-C / SIGTERM or a pool failure; the checkpoint is written and the
    pool closed either way. Returns (the interruption, if any; pool error)."""
    try:
        run_searches(pool, searches, on_outcome, on_item, on_tick)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as cli.Terminated
        return exc, None
    except PoolError as exc:
        return None, exc
    finally:
        writer.flush()
        pool.close()
    return None, None


def tune(job: TuneJob, pool: Executor) -> int:
    """Run ``job`` on ``pool`` (any :class:`~gradlib.pool.Executor`: the process pool, Ray actors); the exit
    status of :func:`gradlib.cli.exit_status`. SIGTERM is handled as Ctrl-C is: what finished is saved."""
    with sigterm_as_interrupt():
        return _tune(job, pool)


def _tune(job: TuneJob, pool: Executor) -> int:
    t0 = time.monotonic()
    failed = start_executor(pool, job.prog)
    if failed is not None:
        return failed
    ident = pool.identity
    spec = job.spec
    try:
        done = set() if job.retune else tuned_keys(job.tuned_file, ident, spec.op)
    except ConfigError as exc:
        pool.close()
        print(f"{job.prog}: error: tuned file unusable: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from aiter_gemm.op import op_spec

    row_key = op_spec(spec.op).row_key
    sidecar = job.sidecar(ident) if job.sidecar is not None else None
    todo = []
    for p in job.problems:
        if row_key(p) in done:
            if sidecar is not None:
                sidecar.skipped(p)
        else:
            todo.append(p)
    skipped = len(job.problems) - len(todo)
    opts = replace(job.search, chunks=pool.slots) if job.split_shapes else job.search
    roof = roofline(job, ident)
    writer = CheckpointWriter(job.tuned_file, ident, job.batch, job.retune, job.profile_file, job.summary_file, roof,
                              spec, sidecar)
    outcomes: list[ShapeOutcome] = []
    searches = []
    progress = Progress(len(todo), describe)
    counts = {"items": 0, "failed_items": 0}

    def on_item(search: ShapeSearch, res) -> None:
        counts["items"] += 1
        counts["failed_items"] += not res.ok
        progress.item(search, res)

    def on_outcome(o: ShapeOutcome) -> None:
        outcomes.append(o)
        writer.add(o)
        progress.shape(o)
        if job.verbose:
            progress.write(_top(o))

    with progress:
        for i, p in enumerate(todo):
            fixed = job.candidates(p) if job.candidates is not None else None
            if fixed is not None and not fixed:  # nothing can run it: a failed shape without work
                log.warning("M=%d N=%d K=%d: no candidate can run this shape", p.M, p.N, p.K)
                on_outcome(ShapeOutcome(i, p, None, None, [], ["no candidate can run this shape"], 0.0))
                continue
            searches.append(ShapeSearch(i, p, opts, fixed))
        log.info("device %s (gfx=%s cu_num=%d), %d worker(s), libtypes %s: %d shape(s), %d already tuned",
                 ident.name, ident.gfx, ident.cu_num, pool.slots, ",".join(opts.libtypes), len(job.problems),
                 skipped)
        interrupted, pool_error = drive(pool, searches, on_outcome, on_item, writer, progress.tick)
    if outcomes:
        print(format_table(spec, outcomes, roof))
    tuned = sum(o.tuned for o in outcomes)
    failed = len(outcomes) - tuned
    unfinished = len(todo) - len(outcomes)
    print(f"{job.prog}: {tuned} tuned, {skipped} skipped (already in {job.tuned_file}), {failed} failed"
          + (f", {unfinished} not finished" if unfinished else "")
          + f"; {counts['items']} candidates run ({counts['failed_items']} failed), {pool.restarts} worker "
          f"restart(s); {pool.slots} worker(s) on {ident.gfx}/{ident.cu_num}; wall {time.monotonic() - t0:.1f} s; "
          f"{writer.written} row(s) written to {job.tuned_file}"
          + (f" ({writer.stale_replaced} unusable row(s) replaced)" if writer.stale_replaced else "")
          + (f", all candidates in {job.profile_file}" if job.profile_file else "")
          + (sidecar.summary() if sidecar is not None else ""))
    if interrupted is not None:
        name = "SIGTERM" if isinstance(interrupted, Terminated) else "SIGINT"
        print(f"{job.prog}: interrupted ({name}): the {len(outcomes)} shape(s) that finished are saved "
              f"({writer.written} row(s) in {job.tuned_file}); rerun the same command to tune the rest",
              file=sys.stderr)
    return exit_status(job.prog, pool_error, interrupted, failed)
