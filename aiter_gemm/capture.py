"""Shape capture (``AITER_TUNE_GEMM=1``): shapes that missed every tuned row go to an untuned CSV for the tuner.

A shape is recorded when its decision is made, which happens once per distinct key, so the per-GEMM cost is zero.
Pending shapes are flushed by a timer (``AITER_TUNE_GEMM_FLUSH_S`` after the first unflushed one) and at exit, under
a file lock, merged with the rows already in the file (kept as they are) and written by atomic rename, so
tensor-parallel ranks can share one file. The file is never inside the package. One recorder per op: the op says
which columns its untuned file has (:class:`~aiter_gemm.op.OpSpec`).
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path

from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.configs import ConfigError, TableSpec, typed_key
from aiter_gemm.fileio import merge_csv_rows
from aiter_gemm.settings import package_dirs

log = logging.getLogger(__name__)


def row_key_of(spec: TableSpec, columns: Sequence[str]) -> Callable[[dict[str, str]], Hashable]:
    """The merge key of an untuned row: its typed key (spellings of one value compare equal); a row that does not
    parse keys on its raw text, so it is kept as it is and never merged with a different one."""

    def key(row: dict[str, str]) -> Hashable:
        try:
            return typed_key(spec, row)
        except ConfigError:
            return ("unparsed", *(str(row.get(c)) for c in columns))

    return key


class ShapeRecorder:
    """Collects distinct untuned shapes of this process and merges them into ``path``."""

    def __init__(self, path: str, columns: Sequence[str], row_of: Callable[[GemmProblem], dict[str, str]],
                 key_of: Callable[[dict[str, str]], Hashable], flush_s: float = 30.0) -> None:
        resolved = Path(path).resolve()
        for pkg in package_dirs():
            if resolved == pkg or pkg in resolved.parents:
                raise ValueError(f"aiter_gemm: capture file {path} lies inside the package ({pkg}); captured "
                                 "shapes are never written there: point AITER_UNTUNED_GEMM_FILE at a working "
                                 "directory")
        self.path = str(resolved)
        self.columns, self._row_of, self._key_of = tuple(columns), row_of, key_of
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
            added, _ = merge_csv_rows(self.path, self.columns, [self._row_of(p) for p in pending], self._key_of)
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
