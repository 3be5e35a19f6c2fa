"""Per-(N, K) JSON config files keyed by M buckets (AITER's Triton convention): an op's JSON level, read strictly,
cached and searched in one place (:class:`JsonLevel`).

A file maps bucket keys to config entries: ``M_LEQ_<n>`` covers M <= n, ``any`` any M, and an op may accept named
buckets (the block-scale op's ``small_M`` / ``medium_M`` / ``large_M``: M <= 256 / 2048 / any). The entry with the
smallest bound >= M wins. An entry may also be the string ``"default"`` (:data:`DEFAULT_ENTRY`): no config for that
range, the runtime's default serves it (the tuner writes such gaps below an M whose row was not confirmed for smaller
M, docs/configs.md); it parses to None. An op's own files hold entries its backends parse (the backend an entry's
``libtype`` names, else the level's: :meth:`~aiter_gemm.backends.base.Backend.parse_json_entry`); every error (bad
JSON, unknown key, two keys covering the same range, an entry its parser rejects) raises :class:`JSONConfigError`
naming the file and the key. Files are only read; :func:`write_buckets` writes atomically.
"""

from __future__ import annotations

import bisect
import glob
import json
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from aiter_gemm.configs import parse_int, shown
from aiter_gemm.errors import ConfigError
from aiter_gemm.fileio import atomic_write_text, file_problem, read_text, update_text

if TYPE_CHECKING:
    from aiter_gemm.backends.base import Backend, GemmProblem, Problem, Solution
    from aiter_gemm.device import DeviceIdentity
    from aiter_gemm.settings import Settings

T = TypeVar("T")
log = logging.getLogger(__name__)

#: Only ``M_LEQ_<n>`` and ``any``: AITER's Triton JSON files.
AITER_BUCKETS: dict[str, int | None] = {"any": None}
#: Also the three named categories of the block-scale configs: M <= 256, M <= 2048, any M.
NAMED_BUCKETS: dict[str, int | None] = {"small_M": 256, "medium_M": 2048, "large_M": None, "any": None}
_LEQ_RE = re.compile(r"M_LEQ_(.*)", re.DOTALL)
#: A key of vLLM's and SGLang's M-keyed files: a token count, no sign, blank or leading zero.
M_KEY = re.compile(r"[1-9][0-9]*")
#: What parsing a file's text or an entry can raise: every one is that file's problem (a JSONConfigError naming it),
#: never the caller's (issue 47: an integer of thousands of digits, an entry's value int() cannot convert).
PARSE_ERRORS = (ValueError, TypeError, ArithmeticError, RecursionError)
#: The dtype part of vLLM's and SGLang's FP8 config file names (``...,dtype=fp8_w8a8,block_shape=[128, 128].json``).
FP8_FILE_DTYPE = "fp8_w8a8"

#: Parsed buckets: (M bound or None for any M, bucket key, entry or None for DEFAULT_ENTRY), smallest bound first.
Buckets = list[tuple[int | None, str, Any]]
#: A bucket value meaning "no config here: the runtime's default serves this M range".
DEFAULT_ENTRY = "default"
#: The op's backend of a libtype (:meth:`aiter_gemm.dispatch.Dispatcher.backend`): whose hooks parse and fit entries.
BackendOf = Callable[[str], "Backend"]


@dataclass(frozen=True)
class JSONFiles:
    """One family of JSON config files of M buckets read at the dispatcher's JSON level, after the families before
    it (docs/configs.md, "Lookup"): the GEMM ops' own ``{arch}-<family>-N=..-K=...json`` files, then SGLang's
    TileLang files; ``fused_moe``'s vLLM/SGLang files. Where they are, what the file of a problem on a device is
    called, and how one becomes buckets (the same :data:`Buckets` every family selects from with
    :func:`select_bucket`)."""

    label: str  # what warnings call one of these files
    folders: Callable[["Settings"], tuple[str, ...]]  # searched in order; the first holding the file decides
    file_name: Callable[["DeviceIdentity", "Problem"], str]  # the file of a problem (its N, K; its E, N) on a device
    #: (N, K) files only: every file of a device (warm-up), whose names match ``nk``; None: not enumerated (a file
    #: name that does not give back a problem: fused_moe's files lack the model dim).
    glob: Callable[["DeviceIdentity"], str] | None
    nk: re.Pattern[str] | None  # (N, K) of a file name, as groups 1 and 2
    #: (path, the op's backends) -> the file's buckets of solutions; strict: JSONConfigError naming file and key.
    read: Callable[[str | os.PathLike, BackendOf], "Buckets"]
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


def merge_m_file(path: Path, entries: Mapping[int, Mapping[str, Any]], read_whole: Callable[[Path], object],
                 check_entry: Callable[[dict], object],
                 header: Callable[[Mapping[str, Any] | None, bool], Mapping[str, Any]] | None = None) -> Path:
    """Write ``entries`` (M -> config object) into the M-keyed JSON file ``path`` under its lock, atomically: the
    file's other M keys kept as written, keys sorted by M (as vLLM and SGLang write them), its keys that are not M
    values (vLLM's ``triton_version``, which ``read_whole`` accepts) first, as ``header(old, covered)`` gives them
    (``old``: the file's, None for a new file; ``covered``: whether ``entries`` replace every M key the file had;
    default: ``old`` as written). A file that does not read (``read_whole``) or a new entry ``check_entry`` refuses
    raises, the file untouched (JSONConfigError naming it and the key): a user's configs are never dropped."""

    def merged(current: Path | None) -> str:
        old: dict[str, Any] = {}
        if current is not None:
            read_whole(current)  # the whole file must read before any of it is rewritten
            old = load_object(current, "M values")
        old_meta = {k: v for k, v in old.items() if not M_KEY.fullmatch(k)}
        ms = {k: v for k, v in old.items() if M_KEY.fullmatch(k)}
        covered = set(ms) <= {str(m) for m in entries}
        meta = dict(old_meta) if header is None else dict(header(None if current is None else old_meta, covered))
        out = {**ms, **{str(m): dict(v) for m, v in entries.items()}}
        for key in entries:
            try:
                check_entry(out[str(key)])
            except PARSE_ERRORS as exc:
                raise JSONConfigError(path, str(key), str(exc)) from None
        return json.dumps({**meta, **{k: out[k] for k in sorted(out, key=int)}}, indent=4) + "\n"

    update_text(path, merged)
    return path


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


def nearest_m_bounds(ms: list[int]) -> dict[int, int | None]:
    """The nearest-M choice of SGLang's and vLLM's files (``min(keys, key=|key - M|)``) as the largest M each key
    serves (None: any larger M). ``ms`` in file order: of two keys equally near an M, the one written first wins
    (``min`` over the keys in order)."""
    order = {m: i for i, m in enumerate(ms)}
    ascending = sorted(order)
    out: dict[int, int | None] = {}
    for a, b in zip(ascending, ascending[1:]):
        twice_mid = a + b  # the M at equal distance, times two
        out[a] = twice_mid // 2 if twice_mid % 2 or order[a] < order[b] else twice_mid // 2 - 1
    out[ascending[-1]] = None
    return out


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


def cached_file(path: str | os.PathLike, read: Callable[[str | os.PathLike], Buckets], strict: bool = True,
                parser_key: Hashable | None = None) -> Buckets | None:
    """``read(path)`` (a strict reader of one file family, JSONConfigError naming file and key) once per (file,
    ``parser_key`` or ``read``) until :func:`clear_cache` (None when the file does not exist): decisions look files up
    at most once between reloads. Not ``strict`` (the dispatcher), a file that cannot be used is skipped as absent
    with one warning saying why, as a broken tuned CSV is (issue 31: one bad file raised on every call of its
    (N, K)); strict, JSONConfigError naming the file and key. A path that exists but is no file (a directory, a
    symlink loop) is said to be one, strict or not. Whatever else reading the file raises is that file's problem
    too (one place for every family: the op's files, SGLang's)."""
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


# ---- an op's JSON level --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JsonLevel:
    """An op's JSON level: per-(N, K) files of M buckets, the op's own family first (``{arch}-{family}-N={N}-K={K}
    .json`` in the settings' JSON folders, ``AITER_GEMM_TRITON_CONFIGS`` then the shipped ``configs/triton``; then
    ``{arch}-{family}.json`` where ``arch_file``), then the ``more`` families (SGLang's TileLang files for the
    block-scale op), each a :class:`JSONFiles`. An own-family entry names its backend by its ``libtype`` key, else
    it is the level's ``libtype``'s (AITER's files name none); that backend's ``parse_json_entry`` turns it into a
    solution (once per file) and every hit is fitted to its shape by the backend of its solution (``fit``).
    ``fills`` None: a decision level between the tuned rows and the default; a libtype: the files fill in that
    libtype's rows whose kernelName is empty or ``auto`` (AITER's ``gemm_a16w16`` Triton rows), which the backend's
    own default config serves where no file answers."""

    family: str  # "GEMM-A16W16", "GEMM-A8W8_BLOCKSCALE"
    libtype: str  # the backend of own-family entries that name none
    buckets: Mapping[str, int | None] = field(default_factory=lambda: dict(AITER_BUCKETS))
    arch_file: bool = False
    fills: str | None = None
    #: Further file families read after the op's own (entries already solutions), in order.
    more: tuple[JSONFiles, ...] = ()
    #: False: the op has no AITER-style own family, only the ``more`` families (``fused_moe``).
    own_files: bool = True

    @cached_property
    def own(self) -> JSONFiles:
        """The op's own file family, as every family is described."""
        family = self.family
        return JSONFiles(
            label="JSON config", folders=lambda settings: settings.triton_config_dirs,
            file_name=lambda device, p: f"{device.gfx}-{family}-N={p.N}-K={p.K}.json",
            glob=lambda device: f"{glob.escape(device.gfx)}-{family}-N=*-K=*.json",
            nk=re.compile(r".*-N=([0-9]+)-K=([0-9]+)\.json"), read=self.read_own)

    @property
    def families(self) -> tuple[JSONFiles, ...]:
        return (self.own, *self.more) if self.own_files else self.more

    def folders(self, settings: Settings) -> tuple[tuple[Path, ...], ...]:
        """Each family's folders under ``settings``, in :attr:`families` order (what :meth:`hits` searches)."""
        return tuple(tuple(Path(p) for p in files.folders(settings)) for files in self.families)

    def parse(self, entry: Mapping[str, Any], backend: BackendOf) -> Solution:
        """An own-family entry as the solution it names, parsed by the backend its ``libtype`` names (the level's
        when it names none); ValueError saying what is wrong."""
        libtype = entry.get("libtype", self.libtype)
        if not isinstance(libtype, str):
            raise ValueError(f"libtype must be a string, got {libtype!r}")
        return backend(libtype).parse_json_entry(entry)

    def read_own(self, path: str | os.PathLike, backend: BackendOf) -> Buckets:
        """Every bucket of one own-family file as (bound, key, solution or None), smallest bound first; strict."""
        return read_buckets(path, partial(self.parse, backend=backend), self.buckets)

    def buckets_of(self, files: JSONFiles, path: str | os.PathLike, backend: BackendOf,
                   strict: bool = False) -> Buckets | None:
        """One file's buckets, read once until :func:`clear_cache` (:func:`cached_file`'s rules)."""
        return cached_file(path, lambda p: files.read(p, backend), strict, (files, backend))

    def _paths(self, files: JSONFiles, folders: Sequence[str | Path], device: DeviceIdentity,
               problem: Problem | None) -> Iterator[Path]:
        """The one walk over a family's files: those that may hold ``problem`` in lookup order (each name over the
        folders), or with ``problem`` None every (N, K) file of ``device`` (each folder's, sorted; none for a family
        without ``glob``)."""
        if problem is None:
            for folder in folders if files.glob is not None else ():
                yield from sorted(Path(folder).glob(files.glob(device)))
            return
        names = (files.file_name(device, problem),)
        if files is self.own and self.arch_file:
            names += (f"{device.gfx}-{self.family}.json",)
        for name in names:
            for folder in folders:
                yield Path(folder) / name

    def hits(self, folders: Sequence[Sequence[str | Path]], device: DeviceIdentity, problem: Problem,
             backend: BackendOf, strict: bool = False) -> Iterator[tuple[JSONFiles, str, Solution]]:
        """``(family, "<file>#<bucket>", solution)`` per family (``folders``: each family's, in order): the first of
        its files with a bucket covering ``problem.M`` that is not a ``"default"`` one (nothing confirmed there: the
        next family), its solution fitted to ``problem``. Not ``strict`` (the dispatcher), a broken file is warned
        once and skipped; strict, JSONConfigError naming file and key. The search of JSON files: the decision, its
        fill-in of rows naming no kernel, and the op modules' JSON helpers ask it."""
        for files, dirs in zip(self.families, folders):
            for path in self._paths(files, dirs, device, problem):
                hit = select_bucket(self.buckets_of(files, path, backend, strict) or [], problem.M)
                if hit is not None:
                    key, sol = hit
                    if sol is not None:
                        yield files, f"{path}#{key}", backend(sol.libtype).fit(sol, problem, device.gfx)
                    break

    def entries(self, folders: Sequence[Sequence[str | Path]], device: DeviceIdentity, backend: BackendOf,
                key_problem: Callable[[tuple], GemmProblem]) -> Iterator[tuple[GemmProblem, Solution]]:
        """Every bucket of every (N, K) file of ``device`` in each family's folders, as (the problem of its bound,
        ``key_problem((M, N, K))``; its solution fitted to it): what :meth:`~aiter_gemm.dispatch.Dispatcher.warm_up`
        builds ahead. Files that cannot be used are warned once and skipped, as the decision skips them."""
        for files, dirs in zip(self.families, folders):
            for path in self._paths(files, dirs, device, None):
                nk = files.nk.match(path.name) if files.nk is not None else None
                for bound, _key, sol in (self.buckets_of(files, path, backend) or ()) if nk is not None else ():
                    if sol is not None:
                        problem = key_problem((bound or 1, int(nk[1]), int(nk[2])))
                        yield problem, backend(sol.libtype).fit(sol, problem, device.gfx)
