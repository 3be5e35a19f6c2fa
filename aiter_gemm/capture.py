"""Shape capture (``AITER_TUNE_GEMM=1``): shapes that missed every tuned row go to an untuned CSV for the tuner.

A shape is recorded when its decision is made, which happens once per distinct key, so the per-GEMM cost is zero.
Pending shapes are flushed by a timer (``AITER_TUNE_GEMM_FLUSH_S`` after the first unflushed one) and at exit, under
a file lock, merged with the rows already in the file (kept as they are) and written by atomic rename, so
tensor-parallel ranks can share one file. The file is never inside the package, and never a tuned config (a file with
tuned columns such as ``libtype`` or ``us`` is refused, at reload and at every write). One recorder per op: the op
says which columns its untuned file has (:class:`~aiter_gemm.opspec.OpSpec`). Only shapes the tuner can read are
written: a row that the op table's key parser (the one ``load_untuned``, and so the tuner, reads it with) refuses,
such as a float64 GEMM's (no CSV dtype name), is left out with one warning per refused value.

Nothing recorded is lost without a word: a shape leaves the pending list only once it is in the file, so the exit
flush sees every shape a timer flush has not finished writing; the exit flush waits for the lock (another rank may
hold it) up to ``exit_wait_s``, and shapes it still cannot write are listed in an error message and saved to
``<file>.<pid>.pending.csv`` beside the file (or in the temp folder).
"""

from __future__ import annotations

import atexit
import logging
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Collection, Hashable, Sequence
from pathlib import Path

from aiter_gemm.backends.base import Problem
from aiter_gemm.configs import ConfigError, TableSpec, typed_key
from aiter_gemm.fileio import file_problem, merge_csv_rows, read_csv_rows, render_csv
from aiter_gemm.logs import WarnOnce
from aiter_gemm.settings import package_dirs

log = logging.getLogger(__name__)

EXIT_WAIT_S = 60.0  # how long the exit flush waits for the file (another rank writing) before saving elsewhere
FLUSH_WAIT_S = 30.0  # how long a timer flush waits for the file lock before trying again later


def row_key_of(spec: TableSpec, columns: Sequence[str]) -> Callable[[dict[str, str]], Hashable]:
    """The merge key of an untuned row: its typed key (spellings of one value compare equal); a row that does not
    parse keys on its raw text, so it is kept as it is and never merged with a different one."""

    def key(row: dict[str, str]) -> Hashable:
        try:
            return typed_key(spec, row)
        except ConfigError:
            return ("unparsed", *(str(row.get(c)) for c in columns))

    return key


def row_reader_of(spec: TableSpec) -> Callable[[dict[str, str]], Hashable]:
    """The typed key of an untuned row as the tuner reads it (:func:`~aiter_gemm.configs.typed_key`, which
    ``load_untuned`` uses); ConfigError naming the column when it cannot: what the recorder checks before writing."""
    return lambda row: typed_key(spec, row, "captured row")


def tuned_columns_of(spec: TableSpec) -> frozenset[str]:
    """Columns only a tuned file of ``spec`` has: a capture target with one of them is a tuned config."""
    return frozenset({spec.time_column, "cu_num", "libtype", *(c.name for c in spec.values)})


def refuse_tuned_header(path: str, header: Sequence[str], tuned_columns: Collection[str]) -> None:
    """ConfigError if ``header`` is a tuned file's: appending untuned rows would make it unloadable."""
    found = [h.strip() for h in header if h.strip() in tuned_columns]
    if found:
        raise ConfigError(path, 1, found[0], f"is a tuned config file (columns {found}); captured shapes go to an "
                          "untuned CSV: point AITER_UNTUNED_GEMM_FILE at another file (the tuner's -i input)")


class ShapeRecorder:
    """Collects distinct untuned shapes of this process and merges them into ``path``."""

    def __init__(self, path: str, columns: Sequence[str], row_of: Callable[[Problem], dict[str, str]],
                 key_of: Callable[[dict[str, str]], Hashable], flush_s: float = 30.0,
                 tuned_columns: Collection[str] = (), exit_wait_s: float = EXIT_WAIT_S,
                 read_key: Callable[[dict[str, str]], Hashable] | None = None) -> None:
        problem = file_problem(path)
        if problem is not None and not problem.startswith(("not found", "a dangling symlink")):
            # Created on the first flush: a missing file or folder, or a link's missing target, is fine; a directory
            # or a symlink loop killed the import with a raw IsADirectoryError / RuntimeError (issue 31).
            raise ValueError(f"aiter_gemm: capture file {path} is {problem}: captured shapes go to a CSV file; "
                             "point AITER_UNTUNED_GEMM_FILE at one")
        resolved = Path(path).resolve()
        for pkg in package_dirs():
            if resolved == pkg or pkg in resolved.parents:
                raise ValueError(f"aiter_gemm: capture file {path} lies inside the package ({pkg}); captured "
                                 "shapes are never written there: point AITER_UNTUNED_GEMM_FILE at a working "
                                 "directory")
        self.path = str(resolved)
        self.columns, self._row_of, self._key_of, self._read_key = tuple(columns), row_of, key_of, read_key
        self.flush_s, self.exit_wait_s = flush_s, exit_wait_s
        self._tuned_columns = frozenset(tuned_columns)
        self._check_header(read_csv_rows(self.path)[0])  # refuse a tuned file now, not at the first write
        self._seen: set[Problem] = set()
        self._pending: list[Problem] = []  # recorded, not yet in the file: only a finished write removes them
        self._lock = threading.Lock()  # guards _seen, _pending, _timer, _closed
        self._flushing = threading.Lock()  # one flush at a time (a timer flush, the exit flush, close)
        self._timer: threading.Timer | None = None
        self._closed = False
        self._warn = WarnOnce(log)
        ref = weakref.ref(self)
        atexit.register(lambda: (r := ref()) is not None and r.flush(final=True))

    def _check_header(self, header: Sequence[str]) -> None:
        refuse_tuned_header(self.path, header, self._tuned_columns)

    def record(self, problem: Problem) -> None:
        """Remember a shape (once); schedule a flush if none is pending. Empty GEMMs are not shapes to tune, nor
        are shapes whose row the tuner cannot read (``read_key`` refuses it: warned once per refused value)."""
        if problem.empty:
            return
        with self._lock:
            if problem in self._seen or self._closed:
                return
            self._seen.add(problem)
            refused = self._refused(problem)
            if refused is None:
                self._pending.append(problem)
                self._schedule()
        if refused is not None:
            column, value, why = refused
            self._warn(("refused", column, value), "aiter_gemm: not capturing %s (nor other shapes with %s %s) "
                       "into %s: the tuner could not read its row (%s)", problem.label(), column, value, self.path,
                       why)

    def _refused(self, problem: Problem) -> tuple[str, str, str] | None:
        """(column, value, why) when ``read_key`` refuses the problem's untuned row, else None."""
        if self._read_key is None:
            return None
        row = self._row_of(problem)
        try:
            self._read_key(row)
        except ConfigError as exc:
            return str(exc.column), str(row.get(exc.column or "", "")), str(exc).split(": ", 1)[-1]
        return None

    def _schedule(self) -> None:
        """Start the flush timer unless one is pending (call with ``_lock`` held)."""
        if self._timer is None and not self._closed:
            self._timer = threading.Timer(self.flush_s, self.flush)
            self._timer.daemon = True
            self._timer.start()

    def flush(self, final: bool = False) -> int:
        """Merge pending shapes into the file; returns how many rows were added. Failures are logged, not raised
        (this runs at exit and on a timer thread). A timer flush that fails keeps the shapes and tries again later;
        a ``final`` one (exit, reload) waits up to ``exit_wait_s`` for the file, then saves what it could not write
        beside it and says so."""
        deadline = time.monotonic() + (self.exit_wait_s if final else FLUSH_WAIT_S)
        if not self._flushing.acquire(timeout=max(0.0, deadline - time.monotonic())):
            if final:  # a timer flush is stuck on the file: these shapes are still pending, save them
                self._give_up(self._snapshot(), TimeoutError(f"the file stayed locked for {self.exit_wait_s:g} s"))
            return 0
        try:
            with self._lock:
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                if self._closed and not final:
                    return 0
            batch = self._snapshot()
            if not batch:
                return 0
            try:
                added, _ = merge_csv_rows(self.path, self.columns, [self._row_of(p) for p in batch], self._key_of,
                                          timeout=max(0.0, deadline - time.monotonic()),
                                          check_header=self._check_header)
            except Exception as exc:  # noqa: BLE001 - a lock timeout, a tuned file, a full disk: never raised here
                if final:
                    self._give_up(batch, exc)
                else:
                    self._warn(("flush", str(exc)), "aiter_gemm: could not write %d captured shape(s) to %s (%s); "
                               "keeping them: next try in %g s and at exit", len(batch), self.path, exc, self.flush_s)
                    with self._lock:
                        self._schedule()
                return 0
            self._forget(batch)
            log.info("aiter_gemm: captured %d new untuned shape(s) into %s", added, self.path)
            return added
        finally:
            self._flushing.release()

    def _snapshot(self) -> list[Problem]:
        with self._lock:
            return list(self._pending)

    def _forget(self, written: Collection[Problem]) -> None:
        done = set(written)
        with self._lock:
            self._pending = [p for p in self._pending if p not in done]

    def _give_up(self, batch: list[Problem], exc: BaseException) -> None:
        """The last chance for ``batch``: save it in ``<file>.<pid>.pending.csv`` (beside the file, else in the
        temp folder) and log an error listing the shapes and where they are."""
        if not batch:
            return
        rows = [self._row_of(p) for p in batch]
        text = render_csv(self.columns, rows)
        name = f"{Path(self.path).name}.{os.getpid()}.pending.csv"
        saved, errors = None, []
        for folder in (Path(self.path).parent, Path(tempfile.gettempdir())):
            try:
                merge_csv_rows(folder / name, self.columns, rows, self._key_of, timeout=5.0)
            except Exception as err:  # noqa: BLE001 - try the next place
                errors.append(f"{folder / name}: {err}")
                continue
            saved = folder / name
            break
        where = (f"saved them to {saved} (merge it into the file, or tune it: gemm-tuner -i {saved})" if saved
                 else f"could not save them elsewhere either ({'; '.join(errors)})")
        log.error("aiter_gemm: could not write %d captured shape(s) to %s (%s); %s. The shapes:\n%s", len(batch),
                  self.path, exc, where, text.rstrip("\n"))
        self._forget(batch)

    def close(self) -> None:
        """Flush (waiting for the file as at exit) and stop recording (on reload)."""
        self.flush(final=True)
        with self._lock:
            self._closed = True
