"""Shape capture (``AITER_TUNE_GEMM=1``): shapes that missed every tuned row go to an untuned CSV for the tuner.

A shape is recorded when its decision is made, which happens once per distinct key, so the per-GEMM cost is zero.
Pending shapes are flushed by a timer (``AITER_TUNE_GEMM_FLUSH_S`` after the first unflushed one) and at exit, under
a file lock, merged with the rows already in the file (kept as they are) and written by atomic rename, so
tensor-parallel ranks can share one file. The file is never inside the package.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from pathlib import Path

from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.configs import BF16_UNTUNED_COLUMNS, SPECS, ConfigError, _parse_cell
from aiter_gemm.dtypes import dtype_name
from aiter_gemm.fileio import merge_csv_rows
from aiter_gemm.settings import package_dirs

log = logging.getLogger(__name__)


def untuned_row(p: GemmProblem) -> dict[str, str]:
    """A problem as an AITER untuned-CSV row."""
    return {"M": str(p.M), "N": str(p.N), "K": str(p.K), "bias": str(p.bias), "dtype": dtype_name(p.dtype),
            "outdtype": dtype_name(p.otype), "scaleAB": str(p.scaleAB), "bpreshuffle": str(p.bpreshuffle)}


def _typed_key(row: dict[str, str]) -> tuple:
    """Typed key of an untuned row, so ``True``/``1`` or ``bf16``/``torch.bfloat16`` spellings compare equal."""
    vals = {}
    for col in SPECS["GEMM_BF16"].key:
        text = (row.get(col.name) or "").strip()
        if col.name == "outdtype" and not text:
            vals[col.name] = vals["dtype"]
            continue
        try:
            vals[col.name] = _parse_cell("<untuned row>", 0, col, text)
        except ConfigError:
            return ("unparsed", *(str(row.get(c)) for c in BF16_UNTUNED_COLUMNS))
    return tuple(vals.values())


class ShapeRecorder:
    """Collects distinct untuned shapes of this process and merges them into ``path``."""

    def __init__(self, path: str, flush_s: float = 30.0) -> None:
        resolved = Path(path).resolve()
        for pkg in package_dirs():
            if resolved == pkg or pkg in resolved.parents:
                raise ValueError(f"aiter_gemm: AITER_UNTUNED_GEMM_FILE={path} lies inside the package ({pkg}); "
                                 "captured shapes are never written there: point it at a working directory")
        self.path = str(resolved)
        self.flush_s = flush_s
        self._seen: set[GemmProblem] = set()
        self._pending: list[GemmProblem] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._closed = False
        ref = weakref.ref(self)
        atexit.register(lambda: (r := ref()) is not None and r.flush())

    def record(self, problem: GemmProblem) -> None:
        """Remember a shape (once); schedule a flush if none is pending."""
        with self._lock:
            if problem in self._seen or self._closed:
                return
            self._seen.add(problem)
            self._pending.append(problem)
            if self._timer is None:
                self._timer = threading.Timer(self.flush_s, self.flush)
                self._timer.daemon = True
                self._timer.start()

    def flush(self) -> int:
        """Merge pending shapes into the file; returns how many rows were added. Failures are logged, not raised
        (this runs at exit and on a timer thread), and the shapes stay pending for the next flush."""
        with self._lock:
            pending, self._pending = self._pending, []
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        if not pending:
            return 0
        try:
            added, _ = merge_csv_rows(self.path, BF16_UNTUNED_COLUMNS, [untuned_row(p) for p in pending], _typed_key)
        except Exception:
            log.exception("aiter_gemm: could not write captured shapes to %s; will retry", self.path)
            with self._lock:
                self._pending[:0] = pending
            return 0
        log.info("aiter_gemm: captured %d new untuned shape(s) into %s", added, self.path)
        return added

    def close(self) -> None:
        """Flush and stop recording (on reload)."""
        self.flush()
        with self._lock:
            self._closed = True
