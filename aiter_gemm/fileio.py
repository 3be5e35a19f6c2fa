"""Safe writes of files that several processes share: a file lock, a merge with what is there, an atomic rename.

Used by shape capture (tensor-parallel ranks appending one untuned CSV) and by the tuner's checkpoints. A reader
never sees a half-written file and a killed writer leaves the previous complete file behind. Every text file of the
package is read here (:func:`read_text`): UTF-8, a leading BOM (Excel's "CSV UTF-8") accepted and kept when the
file is rewritten, other bytes a :class:`~aiter_gemm.errors.ConfigError` naming the file and line.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import errno
import io
import os
import stat
import tempfile
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from filelock import FileLock

from aiter_gemm.errors import ConfigError

Row = dict[str, str]
BOM = "\ufeff"


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to a temp file beside ``path``, fsync it, then rename over ``path`` (atomic on POSIX)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():  # keep the permissions a user gave the file
            os.chmod(tmp, path.stat().st_mode & 0o777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(path: str | os.PathLike, timeout: float = 120.0) -> Iterator[None]:
    """Hold the inter-process lock guarding ``path`` (a ``<path>.lock`` file beside it). A lock file that cannot be
    created (a read-only folder, ``/proc``, a directory in its place) is an OSError naming it at once: filelock
    would retry until ``timeout``, and at exit that held the process for 66 s (issue 31)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = str(path) + ".lock"
    try:
        os.close(os.open(lock, os.O_RDWR | os.O_CREAT, 0o644))
    except OSError as exc:
        raise OSError(exc.errno, f"cannot create the lock file {lock} guarding {path}: {exc.strerror}") from None
    with FileLock(lock, timeout=timeout):
        yield


def file_problem(path: str | os.PathLike) -> str | None:
    """None when ``path`` is a regular file (symlinks followed); else what it is instead, for messages: "not found",
    "a dangling symlink to ...", "a directory", "a symlink loop", "not a regular file" or "not readable (...)".
    Issue 31: a directory or a symlink loop given as a config path was reported as "not found"."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        try:
            return f"a dangling symlink to {os.readlink(path)!r}"
        except OSError:
            return "not found"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop"
        if exc.errno == errno.ENOTDIR:
            return "not found (a folder on its path is a file)"
        return f"not readable ({exc.strerror})"
    if stat.S_ISDIR(mode):
        return "a directory"
    return None if stat.S_ISREG(mode) else "not a regular file"


def read_text(path: str | os.PathLike) -> tuple[str, bool]:
    """The text of a UTF-8 file without its BOM, and whether it had one. Bytes that are not UTF-8 raise
    :class:`ConfigError` naming the file, the line and the byte (a file saved as Latin-1 or UTF-16, say)."""
    data = Path(path).read_bytes()
    bom = data.startswith(codecs.BOM_UTF8)
    body = data[len(codecs.BOM_UTF8):] if bom else data
    try:
        return body.decode("utf-8"), bom
    except UnicodeDecodeError as exc:
        line = body.count(b"\n", 0, exc.start) + 1
        raise ConfigError(str(path), line, None, f"not valid UTF-8 (byte {body[exc.start:exc.start + 1]!r} at "
                          f"offset {exc.start + len(data) - len(body)}: {exc.reason}); save the file as UTF-8"
                          ) from None


class _RaggedRow(dict):
    """A row read with fewer or more cells than the header (as ``csv.DictReader`` gives it: extra cells under the
    key None, missing ones None) that :func:`render_csv` writes back as the file had it, never padded or cut
    (issue 31: a merge dropped the extra cells or padded missing ones). Only merges and sorts see these."""

    __slots__ = ("text", "line", "cells")

    def __init__(self, row: Row, text: str, line: int, cells: int) -> None:
        super().__init__(row)
        self.text, self.line, self.cells = text, line, cells  # the record's lines (endings kept), first line


def _read_csv(path: Path) -> tuple[list[str], list[Row], bool]:
    """Header, rows as ``csv.DictReader`` gives them (blank lines skipped; a row of the wrong length a
    :class:`_RaggedRow`), and whether the file has a BOM."""
    if not path.exists():
        return [], [], False
    text, bom = read_text(path)
    lines = io.StringIO(text, newline="").readlines()
    reader = csv.reader(lines)
    header: list[str] | None = None
    rows: list[Row] = []
    start = 0
    for cells in reader:
        first, start = start + 1, reader.line_num
        if header is None:
            header = cells
            continue
        if not cells:
            continue
        row = dict(zip(header, cells))
        if len(cells) == len(header):
            rows.append(row)
            continue
        if len(cells) > len(header):
            row[None] = cells[len(header):]
        else:
            row.update((name, None) for name in header[len(cells):])
        rows.append(_RaggedRow(row, "".join(lines[first - 1:reader.line_num]), first, len(cells)))
    return header or [], rows, bom


def read_csv_rows(path: str | os.PathLike) -> tuple[list[str], list[Row]]:
    """Header and rows of a CSV (empty lists for a missing or empty file). Values are kept as written; a BOM is
    not part of the first column's name."""
    header, rows, _ = _read_csv(Path(path))
    return header, [dict(r) if type(r) is _RaggedRow else r for r in rows]


def render_csv(header: Sequence[str], rows: Iterable[Mapping[str, object]]) -> str:
    """``header`` and ``rows`` as CSV text (cells a row lacks are empty, keys the header lacks left out); a row read
    with the wrong number of cells (:class:`_RaggedRow`) as the file had it."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(header), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        if type(r) is _RaggedRow:
            buf.write(r.text if r.text.endswith(("\n", "\r")) else r.text + "\n")
        else:
            writer.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue()


def merge_csv_rows(
    path: str | os.PathLike,
    header: Sequence[str],
    rows: Iterable[Mapping[str, object]],
    key_cols: Sequence[str] | Callable[[Row], Hashable],
    replace: Callable[[Row, Row], bool] | None = None,
    timeout: float = 120.0,
    check_header: Callable[[list[str]], None] | None = None,
) -> tuple[int, int]:
    """Merge ``rows`` into the CSV at ``path`` under its lock and write it back atomically.

    Rows already in the file are kept (their values and column order untouched; columns only ``header`` has are
    appended; a BOM the file starts with is kept). A new row whose key (``key_cols`` values, stripped, or
    ``key_cols(row)`` when it is a function) is absent is appended; one whose key is present replaces the old row
    only if ``replace(old, new)`` says so. ``check_header(header)`` may refuse the file as it is under the lock
    (raise) before anything is written; the lock is waited for up to ``timeout`` seconds (``filelock.Timeout``).
    Returns (appended, replaced).
    """
    new_rows = [{k: ("" if v is None else str(v)) for k, v in r.items()} for r in rows]

    def key(r: Row) -> Hashable:
        if callable(key_cols):
            return key_cols(r)
        return tuple(str(r.get(c, "")).strip() for c in key_cols)

    with locked(path, timeout):
        old_header, old_rows, bom = _read_csv(Path(path))
        if check_header is not None:
            check_header(old_header)
        out_header = list(old_header) + [c for c in header if c not in old_header]
        index = {key(r): i for i, r in enumerate(old_rows)}
        appended = replaced = 0
        for r in new_rows:
            k = key(r)
            if k not in index:
                index[k] = len(old_rows)
                old_rows.append(r)
                appended += 1
            elif replace is not None and replace(old_rows[index[k]], r):
                old_rows[index[k]] = r
                replaced += 1
        if appended or replaced or not Path(path).exists():
            _check_ragged(str(path), len(old_header), len(out_header), old_rows)
            atomic_write_text(path, (BOM if bom else "") + render_csv(out_header, old_rows))
        return appended, replaced


def _check_ragged(path: str, old_columns: int, new_columns: int, rows: Iterable[Row]) -> None:
    """ConfigError (file, line) when a row kept as written has cells where columns are being added: written back,
    those cells would read as the new columns' values."""
    for r in rows:
        if new_columns > old_columns and type(r) is _RaggedRow and r.cells > old_columns:
            raise ConfigError(path, r.line, None, f"{r.cells} cells for the {old_columns} columns of the header; new "
                              "columns cannot be added while this row has extra cells: fix the row")


def sort_csv_rows(path: str | os.PathLike, key: Callable[[Row], object]) -> None:
    """Reorder the rows of the CSV at ``path`` by ``key`` (stable) under its lock and write it back atomically; the
    header and every row's text are kept. A missing file is left missing."""
    with locked(path):
        header, rows, bom = _read_csv(Path(path))
        if not header:
            return
        ordered = sorted(rows, key=key)
        if ordered != rows:
            atomic_write_text(path, (BOM if bom else "") + render_csv(header, ordered))
