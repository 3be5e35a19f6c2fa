"""Per-(N, K) JSON config files keyed by M buckets (AITER's Triton convention), read strictly and cached.

A file maps bucket keys to config entries: ``M_LEQ_<n>`` covers M <= n, ``any`` any M, and an op may accept named
buckets (the block-scale op's ``small_M`` / ``medium_M`` / ``large_M``: M <= 256 / 2048 / any). The entry with the
smallest bound >= M wins. An entry may also be the string ``"default"`` (:data:`DEFAULT_ENTRY`): no config for that
range, the runtime's default serves it (the tuner writes such gaps below an M whose row was not confirmed for smaller
M, docs/configs.md); it parses to None. Each user turns entries into its own config type with a ``parse_entry``
function; every
error (bad JSON, unknown key, two keys covering the same range, an entry its parser rejects) raises
:class:`JSONConfigError` naming the file and the key. Files are only read; :func:`write_buckets` writes atomically.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from aiter_gemm.configs import parse_int, shown
from aiter_gemm.errors import ConfigError
from aiter_gemm.fileio import atomic_write_text, file_problem, read_text

if TYPE_CHECKING:
    from aiter_gemm.device import DeviceIdentity
    from aiter_gemm.settings import Settings

T = TypeVar("T")
log = logging.getLogger(__name__)

#: Only ``M_LEQ_<n>`` and ``any``: AITER's Triton JSON files.
AITER_BUCKETS: dict[str, int | None] = {"any": None}
#: Also the three named categories of the block-scale configs: M <= 256, M <= 2048, any M.
NAMED_BUCKETS: dict[str, int | None] = {"small_M": 256, "medium_M": 2048, "large_M": None, "any": None}
_LEQ_RE = re.compile(r"M_LEQ_(.*)", re.DOTALL)
#: What parsing a file's text or an entry can raise: every one is that file's problem (a JSONConfigError naming it),
#: never the caller's (issue 47: an integer of thousands of digits, an entry's value int() cannot convert).
PARSE_ERRORS = (ValueError, TypeError, ArithmeticError, RecursionError)

#: Parsed buckets: (M bound or None for any M, bucket key, entry or None for DEFAULT_ENTRY), smallest bound first.
Buckets = list[tuple[int | None, str, Any]]
#: A bucket value meaning "no config here: the runtime's default serves this M range".
DEFAULT_ENTRY = "default"


@dataclass(frozen=True)
class JSONFiles:
    """One family of per-(N, K) JSON config files read at the dispatcher's JSON level, after the families before
    it (docs/configs.md, "Lookup"): the op's own ``{arch}-<family>-N=..-K=...json`` files, then SGLang's TileLang
    files. Where they are, what the file of (N, K) on a device is called, and how one becomes buckets (the same
    :data:`Buckets` every family selects from with :func:`select_bucket`)."""

    label: str  # what warnings call one of these files
    folders: Callable[["Settings"], tuple[str, ...]]  # searched in order; the first holding the file decides
    file_name: Callable[["DeviceIdentity", int, int], str]  # the file of (N, K) on a device
    glob: Callable[["DeviceIdentity"], str]  # every file of a device (warm-up); its names match ``nk``
    nk: re.Pattern[str]  # (N, K) of a file name, as groups 1 and 2
    read: Callable[[str | os.PathLike], "Buckets"]  # strict: JSONConfigError naming the file and the key
    #: One warning per file for entries that cannot run here (SGLang's files: written for another runtime), rather
    #: than one per bucket and cause.
    warn_per_file: bool = False


class JSONConfigError(ValueError):
    """A JSON config file that cannot be used as written; names the file and the bucket key."""

    def __init__(self, path: str | os.PathLike, key: str | None, message: str) -> None:
        super().__init__(f"{path}" + (f", key {shown(key)}" if key else "") + f": {message}")


def bucket_bound(path: str | os.PathLike, key: str, named: Mapping[str, int | None] = NAMED_BUCKETS) -> int | None:
    """The largest M bucket ``key`` covers (None: any M); JSONConfigError for an unknown key."""
    if key in named:
        return named[key]
    m = _LEQ_RE.fullmatch(key)
    try:
        bound = parse_int(m.group(1), signed=False) if m is not None else 0
    except ValueError:
        bound = 0
    if bound < 1:
        raise JSONConfigError(path, key, f"unknown bucket; use M_LEQ_<n> (n >= 1) or one of {list(named)}")
    return bound


def _no_duplicates(path: str | os.PathLike, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict; JSONConfigError naming the key when one is written twice (json.loads would keep the
    last silently, issue 31), in a bucket entry as at the top level."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JSONConfigError(path, key, "written twice in one object; keep one")
        out[key] = value
    return out


def load_object(path: str | os.PathLike, what: str = "M buckets") -> dict[str, Any]:
    """The non-empty JSON object of ``path`` (keys in file order); JSONConfigError for bad JSON, bytes that are not
    UTF-8, a key written twice, text json cannot take (nested too deeply, an integer of thousands of digits), or
    anything but a non-empty object mapping ``what`` to configs."""
    try:
        data = json.loads(read_text(path)[0], object_pairs_hook=lambda pairs: _no_duplicates(path, pairs))
    except JSONConfigError:
        raise
    except json.JSONDecodeError as exc:
        raise JSONConfigError(path, None, f"not valid JSON: {exc}") from None
    except ConfigError as exc:  # bytes that are not UTF-8
        raise JSONConfigError(path, None, f"line {exc.line}: {str(exc).split(': ', 1)[1]}") from None
    except RecursionError:
        raise JSONConfigError(path, None, "not readable as JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer past int()'s digit limit
        raise JSONConfigError(path, None, f"not readable as JSON: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise JSONConfigError(path, None, f"must be a non-empty object mapping {what} to configs")
    return data


def read_buckets(path: str | os.PathLike, parse_entry: Callable[[dict], T],
                 named: Mapping[str, int | None] = NAMED_BUCKETS) -> list[tuple[int | None, str, T | None]]:
    """Every bucket of ``path`` as (bound, key, parsed entry or None for :data:`DEFAULT_ENTRY`), smallest bound
    first (``any``-like last)."""
    data = load_object(path)
    out = []
    bounds_seen: dict[int | None, str] = {}
    for key, entry in data.items():
        bound = bucket_bound(path, key, named)
        if bound in bounds_seen:
            raise JSONConfigError(path, key, f"covers the same M range as {bounds_seen[bound]!r}")
        bounds_seen[bound] = key
        if entry == DEFAULT_ENTRY:
            out.append((bound, key, None))
            continue
        if not isinstance(entry, dict):
            raise JSONConfigError(path, key, f"entry must be an object of kernel parameters or {DEFAULT_ENTRY!r}, "
                                             f"got {type(entry).__name__}")
        try:
            parsed = parse_entry(entry)
        except PARSE_ERRORS as exc:
            raise JSONConfigError(path, key, str(exc) or type(exc).__name__) from None
        out.append((bound, key, parsed))
    out.sort(key=lambda t: (t[0] is None, t[0] or 0))
    return out


def select_bucket(buckets: list[tuple[int | None, str, T | None]], M: int) -> tuple[str, T | None] | None:
    """The (key, entry) with the smallest bound >= M (an unbounded one last; entry None: the default serves M);
    None when M exceeds every bound."""
    i = bisect.bisect_left(buckets, M, key=_bound)  # a file of SGLang's may hold 200k buckets
    return buckets[i][1:] if i < len(buckets) else None


def _bound(bucket: tuple[int | None, str, Any]) -> float:
    return math.inf if bucket[0] is None else bucket[0]


def write_buckets(path: str | os.PathLike, buckets: Mapping[str, T | None], to_json: Callable[[T], dict],
                  named: Mapping[str, int | None] = NAMED_BUCKETS) -> None:
    """Write ``buckets`` (key -> entry, None for :data:`DEFAULT_ENTRY`) atomically, smallest bound first; keys
    checked as when reading."""
    if not buckets:
        raise ValueError(f"{path}: no buckets to write")
    bounds = {key: bucket_bound(path, key, named) for key in buckets}
    order = sorted(buckets, key=lambda key: (bounds[key] is None, bounds[key] or 0))
    atomic_write_text(path, json.dumps({key: DEFAULT_ENTRY if buckets[key] is None else to_json(buckets[key])
                                         for key in order}, indent=4) + "\n")


_cache: dict[tuple[str, Hashable], list | None] = {}
_cache_lock = threading.Lock()


def cached_buckets(path: str | os.PathLike, parse_entry: Callable[[dict], T],
                   named: Mapping[str, int | None] = NAMED_BUCKETS, strict: bool = True
                   ) -> list[tuple[int | None, str, T]] | None:
    """:func:`read_buckets` of ``path`` read once until :func:`clear_cache` (None when the file does not exist):
    decisions look files up at most once per (file, parser) between reloads. Not ``strict`` (the dispatcher), a
    file that cannot be used is skipped as absent with one warning saying why, as a broken tuned CSV is (issue 31:
    one bad file raised on every call of its (N, K)); strict, JSONConfigError naming the file and key. A path that
    exists but is no file (a directory, a symlink loop) is said to be one, strict or not."""
    return cached_file(path, lambda p: read_buckets(p, parse_entry, named), strict, (parse_entry, tuple(named.items())))


def cached_file(path: str | os.PathLike, read: Callable[[str | os.PathLike], Buckets], strict: bool = True,
                parser_key: Hashable | None = None) -> Buckets | None:
    """``read(path)`` (a strict reader of one file family, JSONConfigError naming file and key) once per (file,
    ``parser_key`` or ``read``) until :func:`clear_cache`, with :func:`cached_buckets`' rules for missing, broken
    and non-file paths. Whatever else reading the file raises is that file's problem too: strict, a JSONConfigError
    naming it; not strict, the warning and the skip (one place for every family: the op's files, SGLang's)."""
    key = (str(path), read if parser_key is None else parser_key)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    problem = file_problem(path)
    found = None
    if problem is None:
        try:
            found = read(path)
        except Exception as exc:
            error = exc if isinstance(exc, (JSONConfigError, OSError)) else JSONConfigError(
                path, None, f"cannot be read: {type(exc).__name__}: {exc}")
            if strict and error is exc:
                raise
            if strict:
                raise error from exc
            log.warning("aiter_gemm: JSON config %s cannot be used, skipped (its shapes fall back to the next "
                        "folder's file or the default): %s", path, error)
    elif problem != "not found":  # a directory, a symlink loop: say so rather than treat it as absent
        if strict:
            raise JSONConfigError(path, None, f"is {problem}, not a JSON file")
        log.warning("aiter_gemm: JSON config %s: %s; skipped", path, problem)
    with _cache_lock:
        _cache[key] = found
    return found


def clear_cache() -> None:
    """Forget every parsed file (``reload_configs()`` calls it, so edited files are read again)."""
    with _cache_lock:
        _cache.clear()
