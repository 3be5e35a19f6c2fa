"""Safe writes of files that several processes share: a file lock, a merge with what is there, an atomic rename.

Used by shape capture (tensor-parallel ranks appending one untuned CSV) and by the tuner's checkpoints. A reader
never sees a half-written file and a killed writer leaves the previous complete file behind. A path that is a
symlink is written through to its target (the link stays; the lock and the temp file sit beside the target, so
writers reaching one file through different links share its lock). Every text file of the package is read here
(:func:`read_text`): UTF-8, a leading BOM (Excel's "CSV UTF-8") accepted and kept when the file is rewritten, other
bytes a :class:`~aiter_gemm.errors.ConfigError` naming the file and line.

Leftovers, and why none stay: the lock ``<file>.lock`` is removed by its holder before it lets go (waiters that
then lock the removed inode see it and lock the new one: :func:`locked`). The temp file of a write is
``.<file>.<host>.<pid>.<random>.tmp`` beside the target, written under the target's lock; a writer killed in the
middle (SIGKILL, a full node) leaves it behind, and the next write of that target removes it once it is sure its
writer is gone: a temp of this host whose process no longer runs, or one of any host older than
:data:`ORPHAN_AGE_S`. Another live writer's temp is never removed (it holds the lock, and its pid runs).
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import errno
import gc
import io
import os
import re
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from filelock import FileLock, Timeout

from aiter_gemm.errors import ConfigError

try:
    import fcntl
except ImportError:  # Windows: filelock's lock, which removes its file itself
    fcntl = None

Row = dict[str, str]
BOM = "\ufeff"
#: A temp file of a writer on another host (whose pid cannot be checked from here) counts as orphaned past this age;
#: a write holds the target's lock and takes seconds even for the largest tuned CSVs (tens of MB).
ORPHAN_AGE_S = 3600.0
_LOCK_POLL_S = 0.05


def resolved(path: str | os.PathLike) -> Path:
    """The file a write of ``path`` changes: the target of a symlink (followed to its end; it may not exist yet)."""
    return Path(os.path.realpath(path))


def _temp_prefix(target: Path) -> str:
    return f".{target.name}.{socket.gethostname()}.{os.getpid()}."


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it runs, as another user
        return True
    return True


def remove_orphaned_temps(target: Path) -> list[Path]:
    """Remove the temp files of ``target`` left by writers that are gone (the module docstring says which); the
    caller holds the target's lock. Returns those removed."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(?P<host>.+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp")
    host, now, removed = socket.gethostname(), time.time(), []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return removed
    for entry in entries:
        m = pattern.fullmatch(entry.name)
        if m is None:
            continue
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        mine = m["host"] == host
        if (mine and int(m["pid"]) != os.getpid() and not _pid_runs(int(m["pid"]))) or age > ORPHAN_AGE_S:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def _replace_file(target: Path, text: str) -> None:
    """Write ``text`` to a temp file beside ``target``, fsync it, rename it over ``target``; the caller holds the
    lock. An error names the file (a full disk fails in ``write``, whose error names none)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_orphaned_temps(target)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(target), suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if target.exists():  # keep the permissions a user gave the file
            os.chmod(tmp, target.stat().st_mode & 0o777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(target)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` (a symlink's target) under its lock: temp file beside it, fsync, atomic rename."""
    update_text(path, lambda _old: text)


def update_text(path: str | os.PathLike, update: Callable[[Path | None], str]) -> None:
    """Read-modify-write ``path`` (a symlink's target) under its lock: ``update(target or None when absent)`` gives
    the new text, written as :func:`atomic_write_text` writes; an exception from ``update`` leaves the file as is."""
    target = resolved(path)
    with locked(target):
        _replace_file(target, update(target if target.exists() else None))


def _lock_fd(lock_path: str) -> int | None:
    """A descriptor holding the flock of ``lock_path`` as the file now at that path, or None if it is taken. A holder
    removes the file before it unlocks, so a waiter can win the lock of a removed inode: that one is given back."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another user's lock file: flock needs no write access (NFS's emulation does)
        fd = os.open(lock_path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):  # taken (some filesystems say EACCES)
            return None
        raise
    except BaseException:
        os.close(fd)
        raise
    try:
        current = os.stat(lock_path)
    except FileNotFoundError:
        current = None
    if current is None or not os.path.samestat(current, os.fstat(fd)):
        os.close(fd)  # removed (or replaced) by the holder we waited for: lock the file there now
        return None
    return fd


@contextlib.contextmanager
def locked(path: str | os.PathLike, timeout: float = 120.0) -> Iterator[None]:
    """Hold the inter-process lock guarding ``path`` (``<target>.lock`` beside a symlink's target), waiting up to
    ``timeout`` seconds (``filelock.Timeout``). The lock file is removed when the lock is let go, while still held,
    so no empty ``.lock`` stays beside the file; :func:`_lock_fd` makes that safe for waiters. Not reentrant."""
    target = resolved(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = str(target) + ".lock"
    if fcntl is None:
        with FileLock(lock_path, timeout=timeout):
            yield
        return
    deadline = time.monotonic() + timeout
    fd = _lock_fd(lock_path)
    while fd is None:
        if time.monotonic() >= deadline:
            raise Timeout(lock_path)
        time.sleep(_LOCK_POLL_S)
        fd = _lock_fd(lock_path)
    try:
        yield
    finally:
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path)
        finally:
            os.close(fd)  # releases the flock


def write_error(path: str | os.PathLike, folder: bool = False) -> str | None:
    """Why :func:`atomic_write_text` could not write ``path`` now, or None: checked before long work (a tuner run)
    so that it stops at once naming the file. ``folder``: ``path`` is a folder files will be written into (created
    if missing). Not writable is found by creating (and removing) a temp file there, which also catches a read-only
    mount and ACLs, whoever runs it."""
    target = resolved(path)
    if folder:
        probe_dir = target
        while not probe_dir.exists() and probe_dir.parent != probe_dir:
            probe_dir = probe_dir.parent  # created when written: the first folder that exists must take it
        if not probe_dir.is_dir():
            return f"{probe_dir} is not a folder"
    else:
        if target.is_dir():
            return "is a folder, not a file"
        probe_dir = target.parent
        if not probe_dir.exists():
            return f"its folder {probe_dir} does not exist"
        if not probe_dir.is_dir():
            return f"{probe_dir} is not a folder"
        if target.exists() and not os.access(target, os.W_OK):
            return "is read-only (its permissions forbid writing it)"
    try:
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(target), suffix=".tmp", dir=probe_dir)
    except OSError as exc:
        return f"cannot create files in {probe_dir}: {exc.strerror or exc}"
    os.close(fd)
    os.unlink(tmp)
    return None


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


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off inside (as it was after): for a reader building a large graph of objects
    that hold no reference cycle (a parsed JSON file), where each collection it would set off scans and frees
    nothing."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


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


def csv_lines(path: str | os.PathLike) -> tuple[list[str], bool]:
    """The physical lines of a UTF-8 CSV file (endings kept, split as ``csv`` reads them; BOM dropped) and whether it
    had a BOM (:func:`read_text`'s errors)."""
    text, bom = read_text(path)
    return io.StringIO(text, newline="").readlines(), bom


def csv_records(path: str | os.PathLike, lines: Iterable[str]) -> Iterator[tuple[int, int, list[str]]]:
    """(first line, last line, cells) of each record of ``lines`` (``path``'s, :func:`csv_lines`) that is not blank
    (a record whose cells are all blank, an empty line among them, is skipped): the one CSV reader of the package.
    What csv cannot read (a field longer than ``csv.field_size_limit()``) is a :class:`ConfigError` naming the file
    and line, not a bare ``csv.Error``."""
    reader = csv.reader(lines)
    end = 0
    try:
        for rec in reader:
            start, end = end + 1, reader.line_num
            if rec and (rec[0].strip() or "".join(rec).strip()):  # the first cell decides, nearly always
                yield start, end, rec
    except csv.Error as exc:
        raise ConfigError(str(path), reader.line_num, None, f"not readable as CSV: {exc}") from None


def _read_csv(path: Path) -> tuple[list[str], list[Row], bool]:
    """Header, rows as ``csv.DictReader`` gives them (a row of the wrong length a :class:`_RaggedRow`), and whether
    the file has a BOM; blank records skipped (:func:`csv_records`)."""
    if not path.exists():
        return [], [], False
    lines, bom = csv_lines(path)
    records = csv_records(path, lines)
    first = next(records, None)
    header = [] if first is None else first[2]
    rows: list[Row] = []
    for start, end, cells in records:
        row = dict(zip(header, cells))
        if len(cells) == len(header):
            rows.append(row)
            continue
        if len(cells) > len(header):
            row[None] = cells[len(header):]
        else:
            row.update((name, None) for name in header[len(cells):])
        rows.append(_RaggedRow(row, "".join(lines[start - 1:end]), start, len(cells)))
    return header, rows, bom


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
    ``key_cols(row)`` when it is a function) is absent is appended; one whose key is present replaces the old rows
    of that key ``replace(old, new)`` accepts (none without ``replace``): the first of them takes the new row, the
    others are dropped (a hand-edited file may hold one key twice, spelled two ways). ``check_header(header)`` may
    refuse the file as it is under the lock (raise) before anything is written; the lock is waited for up to
    ``timeout`` seconds (``filelock.Timeout``).
    Returns (appended, replaced).
    """
    new_rows = [{k: ("" if v is None else str(v)) for k, v in r.items()} for r in rows]

    def key(r: Row) -> Hashable:
        if callable(key_cols):
            return key_cols(r)
        return tuple(str(r.get(c, "")).strip() for c in key_cols)

    target = resolved(path)
    with locked(target, timeout):
        old_header, old_rows, bom = _read_csv(target)
        if check_header is not None:
            check_header(old_header)
        out_header = list(old_header) + [c for c in header if c not in old_header]
        at: dict[Hashable, list[int]] = {}  # key -> positions in ``out`` (a hand-edited file may repeat a key)
        for i, r in enumerate(old_rows):
            at.setdefault(key(r), []).append(i)
        out: list[Row | None] = list(old_rows)  # None: a row dropped for a new one that took an earlier place
        appended = replaced = 0
        for r in new_rows:
            k = key(r)
            if k not in at:
                at[k] = [len(out)]
                out.append(r)
                appended += 1
                continue
            gone = [i for i in at[k] if replace is not None and replace(out[i], r)]
            if gone:
                out[gone[0]] = r
                for i in gone[1:]:
                    out[i] = None
                at[k] = [i for i in at[k] if i not in gone[1:]]
                replaced += 1
        if appended or replaced or not target.exists():
            _check_ragged(str(target), len(old_header), len(out_header), [r for r in out if r is not None])
            _replace_file(target, (BOM if bom else "") + render_csv(out_header, [r for r in out if r is not None]))
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
    target = resolved(path)
    with locked(target):
        header, rows, bom = _read_csv(target)
        if not header:
            return
        ordered = sorted(rows, key=key)
        if ordered != rows:
            _replace_file(target, (BOM if bom else "") + render_csv(header, ordered))
