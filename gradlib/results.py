"""Tuned rows out, tuned shapes in, for every op: checkpointed merges into the tuned CSV (and the profile and summary
CSVs), the op's side files, and the resume set.

Only the driver writes. Every ``batch`` finished shapes the new rows are merged into the tuned file under its file
lock and written by atomic rename (:func:`aiter_gemm.fileio.merge_csv_rows`), so a run killed at any moment leaves a
complete CSV holding every checkpointed shape, and rows this run did not produce are never changed. The input shape
list is only read. What the rows look like is the op's :class:`~gradlib.tune_ops.TuneOp`.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from aiter_gemm.backends.base import Problem, Solution
from aiter_gemm.configs import (
    DEVICE_NAME_COLUMN,
    SPECS,
    ConfigError,
    TunedRow,
    device_key,
    load_table,
    parse_int,
    parse_time,
    typed_key,
    unusable_time,
)
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.fileio import merge_csv_rows, sort_csv_rows
from aiter_gemm.registry import known_backends, op_spec
from gradlib.records import Candidate, ShapeOutcome
from gradlib.tune_ops import Sidecar, TuneOp

log = logging.getLogger(__name__)
T = TypeVar("T")

_PROFILE_TAIL = ("phase", "libtype", "solidx", "splitK", "kernelName", "status", "us", "{err}", "tflops", "bw",
                 "method", "error")
_PROFILE_KEY_TAIL = ("phase", "libtype", "solidx", "splitK", "kernelName")
_SUMMARY_TAIL = ("status", "libtype", "solidx", "splitK", "kernelName", "us", "tflops", "pct_roofline", "{base}_us",
                 "speedup", "screened", "timed", "ok", "failed", "wall_s")


@dataclass(frozen=True)
class Roofline:
    """Peak dense throughput and memory bandwidth of a device, for "% of roofline": ``flops`` is bf16's,
    ``fp8_flops`` the peak of problems with FP8 operands (their ``fp8``; None: not known)."""

    flops: float  # FLOP/s
    bytes: float  # B/s
    source: str
    fp8_flops: float | None = None  # FLOP/s

    def fraction(self, p: Problem, us: float) -> float:
        """Roofline time over measured time: 1.0 = at the bound (compute or memory, whichever is slower); NaN where
        the problem's compute peak is not known."""
        peak = self.fp8_flops if p.fp8 else self.flops
        if peak is None:
            return math.nan
        bound_s = max(p.flops / peak, p.min_bytes() / self.bytes)
        return bound_s / (us * 1e-6)


# Measured, not datasheet: bf16 dense cuBLAS peak and device-to-device copy bandwidth, counted as bytes read + written
# (a copy of B bytes moves 2B: the convention of the H100's figures, measured by 178edab's bench_tuned_gemm with an
# 8192^3 torch.mm and a 1 GiB copy; no raw file kept). A new entry's source names its raw file:
# `python -m benchmarks.run --bench roofline` measures both and logs the entry to add here.
# Matched on (gfx, cu_num) and a substring of the device name, since an H200 is also sm_90 with 132 SMs but has more
# bandwidth. Other devices: pass --peak_tflops / --peak_bw.
ROOFLINES: tuple[tuple[str, int, str, Roofline], ...] = (
    ("sm_90", 132, "H100", Roofline(790e12, 3.0e12, "H100 SXM, measured")),
    ("sm_90", 132, "H200", Roofline(768e12, 4.16e12, "NVIDIA H200, measured: "
                                    "benchmarks/results/roofline/h200_04f7390/roofline_H200.csv")),
)
#: Dense FP8 tensor-core peak, FLOP/s, from the datasheet (no sparsity): the block-scale op's compute roof (its bytes
#: take the bandwidth of :data:`ROOFLINES`). 1979 TFLOP/s is the Hopper SXM value, the H100 SXM's and the H200 SXM's.
HOPPER_SXM_FP8 = 1979e12
FP8_PEAKS: tuple[tuple[str, int, str, float], ...] = (
    ("sm_90", 132, "H100", HOPPER_SXM_FP8),
    ("sm_90", 132, "H200", HOPPER_SXM_FP8),
)


def device_entry(table: Sequence[tuple[str, int, str, T]], identity: DeviceIdentity) -> T | None:
    """The value of the first entry of ``table`` whose (gfx, cu_num) is ``identity``'s and whose name is a
    substring of its device name (the one match rule of :data:`ROOFLINES` and :data:`FP8_PEAKS`)."""
    for gfx, cu_num, name, value in table:
        if identity.gfx == gfx and identity.cu_num == cu_num and name in identity.name:
            return value
    return None


def roofline_for(identity: DeviceIdentity) -> Roofline | None:
    """The measured roofline of ``identity``'s device, if :data:`ROOFLINES` has one."""
    return device_entry(ROOFLINES, identity)


def fp8_peak_for(identity: DeviceIdentity) -> float | None:
    """The datasheet dense FP8 peak (FLOP/s) of ``identity``'s device, if :data:`FP8_PEAKS` has one."""
    return device_entry(FP8_PEAKS, identity)


def metrics(p: Problem, us: float) -> tuple[str, str]:
    """(TFLOP/s, GB/s) of ``p`` at ``us`` as written in rows; empty strings for a failed time."""
    if not math.isfinite(us) or us <= 0:
        return "", ""
    return f"{p.flops / us / 1e6:.2f}", f"{p.min_bytes() / us / 1e3:.2f}"


def fmt(x: float, digits: int) -> str:
    return "" if math.isnan(x) else ("inf" if math.isinf(x) else f"{x:.{digits}f}")


def status_of(c: Candidate, baseline: str | None) -> str:
    """ok / inaccurate / failed, with ``,baseline`` for a baseline timed only as the reference."""
    res = c.result
    status = "ok" if res.ok else ("inaccurate" if res.error.startswith("err_ratio") else "failed")
    return status + ",baseline" if not c.eligible and c.solution.libtype == baseline else status


def profile_columns(spec: TuneOp) -> tuple[str, ...]:
    return (*spec.key_columns, *(c.format(err=spec.err_column) for c in _PROFILE_TAIL))


def summary_columns(spec: TuneOp) -> tuple[str, ...]:
    return (*spec.key_columns, *(c.format(base=spec.baseline or "baseline") for c in _SUMMARY_TAIL))


def profile_row(spec: TuneOp, identity: DeviceIdentity, p: Problem, c: Candidate) -> dict[str, str]:
    """One candidate's result as a profile row."""
    res = c.result
    tflops, bw = metrics(p, res.us) if res.ok else ("", "")
    return {**spec.key_of(identity, p), "phase": c.phase, "libtype": c.solution.libtype,
            "solidx": str(c.solution.solidx), "splitK": str(c.solution.splitK), "kernelName": c.solution.kernelName,
            "status": status_of(c, spec.baseline), "us": fmt(res.us, 4) if res.ok else "inf",
            spec.err_column: fmt(res.err_ratio, 4), "tflops": tflops, "bw": bw, "method": res.method,
            "error": res.error}


def summary_row(spec: TuneOp, identity: DeviceIdentity, o: ShapeOutcome, roof: Roofline | None) -> dict[str, str]:
    """One shape's result for BENCHMARKS-style reports: winner, speedup over the baseline, counts, wall time."""
    full = [c for c in o.candidates if c.phase == "full"]
    ok = sum(1 for c in full if c.result.ok)
    base_us = o.baseline.us if o.baseline is not None else math.inf
    row = {**spec.key_of(identity, o.problem), "status": "tuned" if o.tuned else "failed",
           f"{spec.baseline or 'baseline'}_us": fmt(base_us, 4),
           "screened": str(sum(1 for c in o.candidates if c.phase == "screen")),
           "timed": str(len(full)), "ok": str(ok), "failed": str(len(full) - ok), "wall_s": f"{o.wall_s:.2f}"}
    w = o.winner
    if w is not None:
        row.update(libtype=w.solution.libtype, solidx=str(w.solution.solidx), splitK=str(w.solution.splitK),
                   kernelName=w.solution.kernelName, us=f"{w.us:.4f}", tflops=metrics(o.problem, w.us)[0],
                   pct_roofline=fmt(100 * roof.fraction(o.problem, w.us), 1) if roof else "",
                   speedup=f"{base_us / w.us:.4f}" if math.isfinite(base_us) else "")
    return row


def stale_reason(op: str, fields: Mapping[str, str], known: frozenset[str] | None = None) -> str | None:
    """Why a row of a tuned file (its cells as written) is not a tuned row of ``op``, or None if it is: its time is
    not a measurement (:func:`aiter_gemm.configs.unusable_time`; a hand-set ``us = 0`` row runs but was never
    timed), or a libtype no backend of the op has (``known``: the op's libtypes, listed once by the caller for many
    rows). The tuner retunes such a shape even without ``--all`` and replaces the row with its measurement."""
    spec = op_spec(op)
    text = fields.get(SPECS[spec.kind].time_column)
    try:
        why = unusable_time(parse_time(text))
    except ValueError:
        why = "not a number"
    if why is not None:
        return f"us {text!r}: {why}"
    libtype = (fields.get("libtype") or "").strip()
    if libtype not in (known if known is not None else known_libtypes(op)):
        return f"unknown libtype {libtype!r}"
    return None


def known_libtypes(op: str) -> frozenset[str]:
    """Every libtype of ``op``'s backends here (modules and registrations: plugins must be imported first)."""
    return frozenset(known_backends(op_spec(op).backends))


def device_rows(path: str | os.PathLike, identity: DeviceIdentity, op: str) -> list[TunedRow]:
    """The rows of ``path`` the runtime would use on ``identity``, in file order (a missing file has none): a row
    from a file without ``gfx`` counts, as it does for the runtime, and a class row (no ``device_name``) only where
    no row of this device has its key (the runtime's preference, wherever the rows stand in the file)."""
    if not os.path.isfile(path):
        return []
    table = load_table(op_spec(op).kind, [path])
    rows = [row for row in table if row.serves(identity.gfx, identity.cu_num, identity.device_name)]
    exact = {row.key for row in rows if row.device_name is not None}
    return sorted((row for row in rows if row.device_name is not None or row.key not in exact), key=lambda r: r.line)


def tuned_keys(path: str | os.PathLike, identity: DeviceIdentity, op: str, exact_only: bool = False) -> set[tuple]:
    """Table keys ``path`` already has a tuned row for on ``identity`` (the resume set; rows :func:`stale_reason`
    rejects do not count; with ``exact_only`` (``--keep_class_rows``), neither do rows naming no device, unless
    ``identity`` has no name: its own rows are then class rows)."""
    known = known_libtypes(op)
    exact_only = exact_only and bool(identity.device_name)
    return {row.key for row in device_rows(path, identity, op) if stale_reason(op, row.fields, known) is None
            and not (exact_only and row.device_name is None)}


def sort_tuned_file(path: str | os.PathLike, spec: TuneOp) -> None:
    """AITER's ``--sort``: order the rows of ``path`` by their key columns, N before M as AITER sorts GEMM files,
    numbers as numbers; rows are moved, never changed (locked, atomic rename)."""
    cols = list(spec.key_columns)
    if "M" in cols and "N" in cols:
        i, j = cols.index("M"), cols.index("N")
        cols[i], cols[j] = cols[j], cols[i]

    def key(row: dict[str, str]) -> tuple:
        out = []
        for c in cols:
            text = str(row.get(c) or "").strip()
            try:
                out.append((0, parse_int(text), ""))
            except ValueError:
                out.append((1, 0, text))
        return tuple(out)

    sort_csv_rows(path, key)


def row_solutions(path: str | os.PathLike, identity: DeviceIdentity, op: str) -> dict[tuple, Solution]:
    """Table key -> the solution its row names, for the rows of ``path`` usable on ``identity`` (re-confirming a
    tuned file's choices: ``--candidates_from``)."""
    spec = op_spec(op)
    return {row.key: spec.row_solution(row) for row in device_rows(path, identity, op)}


def row_key(op: str, tail: Sequence[str] = (), device_name: str | None = None
            ) -> Callable[[Mapping[str, str]], Hashable]:
    """A CSV row's identity as the runtime's table parser types it (:func:`aiter_gemm.configs.typed_key`): (gfx,
    cu_num, device_name, typed key) and the ``tail`` columns as written (rows of two devices are two rows; with
    ``device_name``, the device the tuner writes rows for, a row naming no device is keyed as that device's, so
    the writer's rule on replacing it applies), so ``0``/``False`` or ``bf16``/``torch.bfloat16``
    spellings of one shape are one row for the tuner as for the runtime. A row whose key does not parse keeps its
    text (it then matches only the same text)."""
    spec = SPECS[op_spec(op).kind]
    names = ("gfx", "cu_num", *(c.name for c in spec.key), *tail)

    def key(row: Mapping[str, str]) -> Hashable:
        text = tuple(str(row.get(c) or "").strip() for c in names)
        try:
            name = device_key(row.get(DEVICE_NAME_COLUMN)) or device_key(device_name)
            typed = (text[0] or None, parse_int(text[1]), name, typed_key(spec, row))
        except (ConfigError, ValueError):
            return "unparsed", text
        return typed, text[len(names) - len(tail):]

    return key


def _shape(row: Mapping[str, str], spec: TuneOp) -> str:
    """A row's shape as warnings name it: its problem's first key cells (M, N, K, bias; token ... topk)."""
    return " ".join(f"{c}={row[c]}" for c in spec.key_columns[2:7] if c in row and c not in ("dtype", "act_type"))


@dataclass
class _Output:
    """One CSV a :class:`CheckpointWriter` merges into: the rows waiting for it, and the error of its last write."""

    path: str
    columns: tuple[str, ...]
    key: Callable[[Mapping[str, str]], Hashable]
    replace: Callable[[dict[str, str], dict[str, str]], bool]
    rows: list[dict[str, str]] = field(default_factory=list)
    error: Exception | None = None

    def write(self) -> tuple[int, int] | None:
        """Merge the waiting rows; (added, replaced), or None if the file could not be written (the rows wait for
        the next checkpoint; the error, which names the file, is logged once per new cause)."""
        try:
            added, replaced = merge_csv_rows(self.path, self.columns, self.rows, self.key, replace=self.replace)
        except (OSError, ConfigError) as exc:  # a full disk, a lock held too long, a file made unreadable meanwhile
            if str(exc) != str(self.error):
                log.error("checkpoint: could not write %s: %s; its %d row(s) are kept and written at the next "
                          "checkpoint", self.path, exc, len(self.rows))
            self.error = exc
            return None
        if self.error is not None:
            log.warning("checkpoint: %s written again (%d row(s) that had waited)", self.path, len(self.rows))
        self.error, self.rows = None, []
        return added, replaced


class CheckpointWriter:
    """Buffers finished shapes and merges them into the tuned (and profile, summary) file every ``batch`` shapes;
    the op's side files (``sidecar``) are flushed with each checkpoint once the tuned file holds its rows. A file that
    cannot be written keeps its rows here until a later checkpoint can write them; :meth:`unsaved` lists what is
    left at the end, for the driver to print."""

    def __init__(self, tuned_file: str | os.PathLike, identity: DeviceIdentity, batch: int,
                 replace_existing: bool, profile_file: str | os.PathLike | None = None,
                 summary_file: str | os.PathLike | None = None, roofline: Roofline | None = None,
                 spec: TuneOp | None = None, sidecar: Sidecar | None = None,
                 accept: Callable[[ShapeOutcome], bool] | None = None, keep_class_rows: bool = False) -> None:
        if batch < 1:
            raise ValueError(f"--batch must be >= 1, got {batch}")
        if spec is None:
            from gradlib.tune_ops import tune_op

            spec = tune_op("gemm_a16w16")
        self.spec, self.sidecar = spec, sidecar
        self.accept = accept  # which tuned winners become rows (--compare: the improved ones); None: all
        self.tuned_file, self.identity, self.batch = str(tuned_file), identity, batch
        self.roofline = roofline
        self.replace_existing = replace_existing
        self._stale: list[tuple[dict[str, str], str]] = []  # rows replaced because they were not usable
        self.stale_replaced = 0
        self._known: frozenset[str] | None = None  # the op's libtypes, listed at the first comparison
        # A row naming no device is this device's for the replace rule, unless it is to be kept beside this
        # device's rows (--keep_class_rows): then it keeps a key of its own (an unnamed device's rows have that key).
        key = row_key(spec.op, device_name=None if keep_class_rows else identity.device_name)
        self.tuned = _Output(self.tuned_file, spec.tuned_columns, key, self._replace)
        self.profile = None if profile_file is None else _Output(
            str(profile_file), profile_columns(spec), row_key(spec.op, _PROFILE_KEY_TAIL), lambda o, n: True)
        self.summary = None if summary_file is None else _Output(
            str(summary_file), summary_columns(spec), key, lambda o, n: True)
        self._sidecar_error: Exception | None = None
        self._pending_shapes = 0
        self.written = 0
        self.checkpoints = 0

    def _replace(self, old: dict[str, str], new: dict[str, str]) -> bool:
        """Whether a row of the file with the key of a new one gives way: always with ``--all``; otherwise only a
        row that is not usable (:func:`stale_reason`), which is recorded to be reported."""
        if self.replace_existing:
            return True
        if self._known is None:
            self._known = known_libtypes(self.spec.op)
        why = stale_reason(self.spec.op, old, self._known)
        if why is not None:
            self._stale.append((old, why))
        return why is not None

    def add(self, outcome: ShapeOutcome) -> None:
        spec = self.spec
        if outcome.tuned and (self.accept is None or self.accept(outcome)):
            self.tuned.rows.append(spec.tuned_row(self.identity, outcome, outcome.winner))
        if self.profile is not None:
            self.profile.rows.extend(profile_row(spec, self.identity, outcome.problem, c) for c in outcome.candidates)
        if self.summary is not None:
            self.summary.rows.append(summary_row(spec, self.identity, outcome, self.roofline))
        if self.sidecar is not None:
            self.sidecar.add(outcome)
        self._pending_shapes += 1
        if self._pending_shapes >= self.batch:
            self.flush()

    def flush(self) -> None:
        """Merge everything buffered (a no-op when nothing is), then flush the side files; a file that cannot be
        written is logged and keeps its rows for the next call (never raised: the run goes on)."""
        self._pending_shapes = 0
        n_rows = len(self.tuned.rows)
        if n_rows:
            self._stale = []
            done = self.tuned.write()
            if done is not None:
                self._merged(n_rows, *done)
        wrote = False
        for out in (self.profile, self.summary):
            if out is not None and out.rows:
                wrote |= out.write() is not None
        if (n_rows and not self.tuned.rows) or wrote:
            self.checkpoints += 1
        if self.sidecar is not None and not self.tuned.rows:  # the side files are built from the tuned file
            try:
                self.sidecar.flush()
            except OSError as exc:
                if str(exc) != str(self._sidecar_error):
                    log.error("checkpoint: %s; retried at the next checkpoint", exc)
                self._sidecar_error = exc
            else:
                self._sidecar_error = None

    def close(self) -> None:
        """The run's last checkpoint, whether it finished or was interrupted: the side files are told the run is
        over (:meth:`Sidecar.finish`), then everything is flushed."""
        if self.sidecar is not None:
            self.sidecar.finish()
        self.flush()

    def _merged(self, n_rows: int, added: int, replaced: int) -> None:
        kept = n_rows - added - replaced
        if kept:
            log.warning("%s: %d shape(s) were tuned meanwhile by another writer; their rows were kept",
                        self.tuned_file, kept)
        if self._stale:
            self.stale_replaced += len(self._stale)
            log.warning("%s: replaced %d row(s) that were not usable as tuned rows: %s", self.tuned_file,
                        len(self._stale), "; ".join(f"{_shape(old, self.spec)} ({why})" for old, why in self._stale))
        self.written += added + replaced
        log.info("checkpoint: %d row(s) added, %d replaced in %s", added, replaced, self.tuned_file)

    def unsaved(self) -> list[tuple[str, list[dict[str, str]], Exception | None]]:
        """(file, rows still waiting for it, why its last write failed) for each file this writer could not write;
        the side files' error as a file without rows."""
        left = [(o.path, o.rows, o.error) for o in (self.tuned, self.profile, self.summary) if o is not None and o.rows]
        if self._sidecar_error is not None:
            left.append((getattr(self._sidecar_error, "filename", None) or "side files", [], self._sidecar_error))
        return left
