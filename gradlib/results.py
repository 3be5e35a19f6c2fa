"""Tuned rows out, tuned shapes in: checkpointed merges into the tuned CSV (and the profile CSV), and resume.

Only the driver writes. Every ``--batch`` finished shapes the new rows are merged into the tuned file under its
file lock and written by atomic rename (:func:`aiter_gemm.fileio.merge_csv_rows`), so a run killed at any moment
leaves a complete CSV holding every checkpointed shape, and rows this run did not produce are never changed. The
input shape list is only read.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass

from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.configs import BF16_TUNED_COLUMNS, BF16_UNTUNED_COLUMNS, load_table
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.dtypes import dtype_name
from aiter_gemm.fileio import merge_csv_rows
from gradlib.search import Candidate, ShapeOutcome

log = logging.getLogger(__name__)

KEY_COLUMNS = ("gfx", "cu_num", *BF16_UNTUNED_COLUMNS)
PROFILE_COLUMNS = (*KEY_COLUMNS, "phase", "libtype", "solidx", "splitK", "kernelName", "status", "us", "err_ratio",
                   "tflops", "bw", "method", "error")
PROFILE_KEY = (*KEY_COLUMNS, "phase", "libtype", "solidx", "splitK", "kernelName")
SUMMARY_COLUMNS = (*KEY_COLUMNS, "status", "libtype", "solidx", "splitK", "kernelName", "us", "tflops",
                   "pct_roofline", "torch_us", "speedup", "screened", "timed", "ok", "failed", "wall_s")


@dataclass(frozen=True)
class Roofline:
    """Peak bf16 dense throughput and memory bandwidth of a device, for "% of roofline"."""

    flops: float  # FLOP/s
    bytes: float  # B/s
    source: str

    def fraction(self, p: GemmProblem, us: float) -> float:
        """Roofline time over measured time: 1.0 = at the bound (compute or memory, whichever is slower)."""
        bound_s = max(p.flops / self.flops, p.min_bytes() / self.bytes)
        return bound_s / (us * 1e-6)


# Measured, not datasheet (notes/common.md): bf16 dense cuBLAS peak and device-to-device copy bandwidth. Matched on
# (gfx, cu_num) and a substring of the device name, since an H200 is also sm_90 with 132 SMs but has more bandwidth.
# Other devices: pass --peak_tflops / --peak_bw.
ROOFLINES: tuple[tuple[str, int, str, Roofline], ...] = (
    ("sm_90", 132, "H100", Roofline(790e12, 3.0e12, "H100 SXM, measured")),
)


def roofline_for(identity: DeviceIdentity) -> Roofline | None:
    """The measured roofline of ``identity``'s device, if this table has one."""
    for gfx, cu_num, name, roof in ROOFLINES:
        if identity.gfx == gfx and identity.cu_num == cu_num and name in identity.name:
            return roof
    return None


def problem_key(identity: DeviceIdentity, p: GemmProblem) -> dict[str, str]:
    """The key columns of ``p`` on ``identity`` as the tuned CSV spells them."""
    return {"gfx": identity.gfx, "cu_num": str(identity.cu_num), "M": str(p.M), "N": str(p.N), "K": str(p.K),
            "bias": str(p.bias), "dtype": dtype_name(p.dtype), "outdtype": dtype_name(p.otype),
            "scaleAB": str(p.scaleAB), "bpreshuffle": str(p.bpreshuffle)}


def _metrics(p: GemmProblem, us: float) -> tuple[str, str]:
    if not math.isfinite(us) or us <= 0:
        return "", ""
    return f"{p.flops / us / 1e6:.2f}", f"{p.min_bytes() / us / 1e3:.2f}"  # TFLOP/s, GB/s


def _fmt(x: float, digits: int) -> str:
    return "" if math.isnan(x) else ("inf" if math.isinf(x) else f"{x:.{digits}f}")


def tuned_row(identity: DeviceIdentity, outcome: ShapeOutcome) -> dict[str, str]:
    """The winner of ``outcome`` as a tuned-CSV row (BF16_TUNED_COLUMNS)."""
    w = outcome.winner
    if w is None:
        raise ValueError(f"shape {outcome.problem} has no winner to write")
    p, sol, res = outcome.problem, w.solution, w.result
    tflops, bw = _metrics(p, res.us)
    return {**problem_key(identity, p), "libtype": sol.libtype, "solidx": str(sol.solidx), "splitK": str(sol.splitK),
            "us": f"{res.us:.4f}", "kernelName": sol.kernelName, "err_ratio": _fmt(res.err_ratio, 4),
            "tflops": tflops, "bw": bw}


def profile_row(identity: DeviceIdentity, p: GemmProblem, c: Candidate) -> dict[str, str]:
    res = c.result
    tflops, bw = _metrics(p, res.us) if res.ok else ("", "")
    status = "ok" if res.ok else ("inaccurate" if res.error.startswith("err_ratio") else "failed")
    if not c.eligible:
        status += ",baseline"
    return {**problem_key(identity, p), "phase": c.phase, "libtype": c.solution.libtype,
            "solidx": str(c.solution.solidx), "splitK": str(c.solution.splitK), "kernelName": c.solution.kernelName,
            "status": status, "us": _fmt(res.us, 4) if res.ok else "inf", "err_ratio": _fmt(res.err_ratio, 4),
            "tflops": tflops, "bw": bw, "method": res.method, "error": res.error}


def summary_row(identity: DeviceIdentity, o: ShapeOutcome, roof: Roofline | None) -> dict[str, str]:
    """One shape's result for BENCHMARKS-style reports: winner, speedup over torch, candidate counts, wall time."""
    full = [c for c in o.candidates if c.phase == "full"]
    ok = sum(1 for c in full if c.result.ok)
    base_us = o.baseline.us if o.baseline is not None else math.inf
    row = {**problem_key(identity, o.problem), "status": "tuned" if o.tuned else "failed",
           "torch_us": _fmt(base_us, 4), "screened": str(sum(1 for c in o.candidates if c.phase == "screen")),
           "timed": str(len(full)), "ok": str(ok), "failed": str(len(full) - ok), "wall_s": f"{o.wall_s:.2f}"}
    w = o.winner
    if w is not None:
        row.update(libtype=w.solution.libtype, solidx=str(w.solution.solidx), splitK=str(w.solution.splitK),
                   kernelName=w.solution.kernelName, us=f"{w.us:.4f}", tflops=_metrics(o.problem, w.us)[0],
                   pct_roofline=f"{100 * roof.fraction(o.problem, w.us):.1f}" if roof else "",
                   speedup=f"{base_us / w.us:.4f}" if math.isfinite(base_us) else "")
    return row


def tuned_problems(path: str | os.PathLike, identity: DeviceIdentity) -> set[GemmProblem]:
    """Shapes ``path`` already has a usable row for on ``identity`` (a missing file has none). A row from a file
    without ``gfx`` counts, as it does for the runtime."""
    if not os.path.isfile(path):
        return set()
    table = load_table("GEMM_BF16", [path])
    done = set()
    for row in table:
        if row.cu_num == identity.cu_num and row.gfx in (None, identity.gfx):
            done.add(GemmProblem(*row.key))
    return done


class CheckpointWriter:
    """Buffers finished shapes and merges them into the tuned (and profile) file every ``batch`` shapes."""

    def __init__(self, tuned_file: str | os.PathLike, identity: DeviceIdentity, batch: int,
                 replace_existing: bool, profile_file: str | os.PathLike | None = None,
                 summary_file: str | os.PathLike | None = None, roofline: Roofline | None = None) -> None:
        if batch < 1:
            raise ValueError(f"--batch must be >= 1, got {batch}")
        self.tuned_file, self.identity, self.batch = tuned_file, identity, batch
        self.profile_file, self.summary_file, self.roofline = profile_file, summary_file, roofline
        self._summary: list[dict[str, str]] = []
        self._replace = (lambda old, new: True) if replace_existing else None
        self._rows: list[dict[str, str]] = []
        self._profile: list[dict[str, str]] = []
        self._pending_shapes = 0
        self.written = 0
        self.checkpoints = 0

    def add(self, outcome: ShapeOutcome) -> None:
        if outcome.tuned:
            self._rows.append(tuned_row(self.identity, outcome))
        if self.profile_file is not None:
            self._profile.extend(profile_row(self.identity, outcome.problem, c) for c in outcome.candidates)
        if self.summary_file is not None:
            self._summary.append(summary_row(self.identity, outcome, self.roofline))
        self._pending_shapes += 1
        if self._pending_shapes >= self.batch:
            self.flush()

    def flush(self) -> None:
        """Merge everything buffered (a no-op when nothing is)."""
        if self._rows:
            added, replaced = merge_csv_rows(self.tuned_file, BF16_TUNED_COLUMNS, self._rows, KEY_COLUMNS,
                                             replace=self._replace)
            kept = len(self._rows) - added - replaced
            if kept:
                log.warning("%s: %d shape(s) were tuned meanwhile by another writer; their rows were kept",
                            self.tuned_file, kept)
            self.written += added + replaced
            log.info("checkpoint: %d row(s) added, %d replaced in %s", added, replaced, self.tuned_file)
        if self._profile and self.profile_file is not None:
            merge_csv_rows(self.profile_file, PROFILE_COLUMNS, self._profile, PROFILE_KEY, replace=lambda o, n: True)
        if self._summary and self.summary_file is not None:
            merge_csv_rows(self.summary_file, SUMMARY_COLUMNS, self._summary, KEY_COLUMNS, replace=lambda o, n: True)
        if self._rows or self._profile or self._summary:
            self.checkpoints += 1
        self._rows, self._profile, self._summary, self._pending_shapes = [], [], [], 0
