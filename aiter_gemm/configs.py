"""Tuned and untuned CSV configs: checked whole at load, merged from several files, indexed by key; a row becomes a
typed :class:`TunedRow` when a lookup first returns it (a table of many models' rows costs little until used).

Merge rules (docs/configs.md): the key is a kind's untuned columns plus ``gfx`` and ``cu_num``; on a duplicate
key the row with the lowest positive ``us`` wins and ties go to the earlier path; a row with ``us = 0`` is hand-set
(AITER ships them) and loses to every timed row (:func:`merge_rank`); rows whose ``us`` is negative, empty, NaN or
infinite are dropped with a warning; a missing path is skipped with a warning, every path missing is an error; an
empty or header-only file is valid; unknown columns are kept; a file without ``gfx`` applies to any arch with that
``cu_num``; malformed rows raise :class:`ConfigError` naming the file, line and column. Input files are only ever read.
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import getitem, itemgetter
from types import MappingProxyType
from typing import Any

import torch

from aiter_gemm.dtypes import parse_dtype
from aiter_gemm.errors import ConfigError
from aiter_gemm.fileio import csv_lines, csv_records, file_problem

log = logging.getLogger(__name__)

BF16_UNTUNED_COLUMNS = ("M", "N", "K", "bias", "dtype", "outdtype", "scaleAB", "bpreshuffle")
# Our columns after AITER's (optional when reading, so AITER's files load unchanged): ``pad_m_min``, the smallest M
# the tuner checked the row for through padding (docs/configs.md), ``timing``, how it was timed, and
# ``device_name``, the device it was tuned on (a key column: such a row serves only that device, README).
DEVICE_NAME_COLUMN = "device_name"
EXTRA_TUNED_COLUMNS = ("pad_m_min", "timing", DEVICE_NAME_COLUMN)
BF16_TUNED_COLUMNS = ("gfx", "cu_num", *BF16_UNTUNED_COLUMNS,
                      "libtype", "solidx", "splitK", "us", "kernelName", "err_ratio", "tflops", "bw",
                      *EXTRA_TUNED_COLUMNS)
TIMING_MODES = ("graph", "eager")


#: Most digits an integer of config text may have: below 2**63, far above any GEMM size or kernel parameter.
MAX_DIGITS = 18
_INT_TEXT = {True: re.compile(r"-?[0-9]+"), False: re.compile(r"[0-9]+")}


def parse_int(text: str, signed: bool = True) -> int:
    """An integer of config text (a CSV cell, a kernelName field, an environment setting): ASCII digits, a leading
    ``-`` only where ``signed`` (solidx -1), at most :data:`MAX_DIGITS`. ``int()`` alone reads ``4_0`` as 40, other
    scripts' digits as digits and ``+1`` or blanks, and fails on thousands of digits with a message naming nothing."""
    if not _INT_TEXT[signed].fullmatch(text):
        raise ValueError("must be an integer in ASCII digits" + ("" if signed else " without a sign"))
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"has more than {MAX_DIGITS} digits")
    return int(text)


def json_int(key: str, value: Any) -> int:
    """An integer value of a JSON config entry: a JSON integer of at most :data:`MAX_DIGITS` digits, never
    ``true``, ``4.0`` or a string (which ``int()`` would turn into one: ``"4_0"`` into 40)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer, got {shown(value)}")
    if abs(value) >= 10**MAX_DIGITS:
        raise ValueError(f"{key} has more than {MAX_DIGITS} digits")
    return value


def parse_size(text: str) -> int:
    """A GEMM dimension (M, N, K, B): a positive integer."""
    value = parse_int(text)
    if value < 1:
        raise ValueError("must be a positive integer")
    return value


def parse_float(text: str) -> float:
    """A number of config text: ``float()``'s syntax (``nan`` and ``inf`` included) in ASCII without ``_``
    (``float()`` alone reads ``1_0`` as 10 and other scripts' digits as digits)."""
    if not text.isascii() or "_" in text:
        raise ValueError("must be a number in ASCII digits")
    return float(text)


def shown(value: object, most: int = 48) -> str:
    """``repr(value)`` for a message, cut to ``most`` characters (a cell of thousands of digits)."""
    text = repr(value)
    return text if len(text) <= most else f"{text[:most]}... ({len(text)} characters)"


def parse_time(text: str | None) -> float:
    """A row's time cell as a float (an absent or empty cell is NaN); ValueError if it is not a number."""
    text = (text or "").strip()
    return parse_float(text) if text else math.nan


def unusable_time(us: float) -> str | None:
    """Why a row with this time is not a measurement, or None if it is: only a finite positive time is. The tuner
    neither counts such rows as tuned nor keeps them once it has measured the shape (:mod:`gradlib.results`); the
    runtime loads ``us = 0`` rows as hand-set and drops the rest (:func:`merge_rank`)."""
    if math.isnan(us):
        return "empty or NaN"
    if math.isinf(us):
        return "infinite"
    if us <= 0:
        return "<= 0"
    return None


#: The spellings of a boolean in config text (CSV cells, environment settings, tuner flags), any case, blanks around
#: ignored: AITER's ``str2bool`` words (its ``--sort``) and the environment's on/off; AITER's files write True/False.
TRUE_WORDS = ("1", "true", "yes", "on", "t", "y")
FALSE_WORDS = ("0", "false", "no", "off", "f", "n")


def parse_bool(text: str) -> bool:
    """A boolean of config text: one of :data:`TRUE_WORDS` or :data:`FALSE_WORDS`; ValueError naming them."""
    low = text.strip().lower()
    if low in TRUE_WORDS:
        return True
    if low in FALSE_WORDS:
        return False
    raise ValueError(f"must be {'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}, got {text!r}")


def parse_str(text: str) -> str:
    return text


def parse_timing(text: str) -> str:
    if text not in TIMING_MODES:
        raise ValueError(f"must be one of {TIMING_MODES}")
    return text


@dataclass(frozen=True)
class Column:
    """A typed column; ``default`` (already typed) makes it optional in untuned shape lists; ``optional`` makes an
    absent or empty cell None (a column AITER's files do not have)."""

    name: str
    parse: Callable[[str], Any]
    default: Any = None
    optional: bool = False


@dataclass(frozen=True)
class TableSpec:
    """Which columns key a config kind, and which typed value columns its tuned rows must carry."""

    kind: str
    key: tuple[Column, ...]
    values: tuple[Column, ...] = ()  # typed + validated in tuned files; optional ones get their default
    time_column: str = "us"
    #: Informational number columns the tuners write: returned as floats (None when empty) in config dicts.
    numbers: tuple[str, ...] = ("err_ratio", "errRatio", "tflops", "bw")


def _dtype_col(name: str, default: Any = None) -> Column:
    return Column(name, parse_dtype, default)


_MNK = (Column("M", parse_size), Column("N", parse_size), Column("K", parse_size))
_BMNK = (Column("B", parse_size), *_MNK)
_EXTRA_VALUES = (Column("pad_m_min", parse_size, optional=True),
                 Column("timing", parse_timing, optional=True))
_KERNEL_VALUES = (Column("kernelId", parse_int, -1), Column("splitK", parse_int, 0),
                  Column("kernelName", parse_str, ""), *_EXTRA_VALUES)

SPECS: dict[str, TableSpec] = {
    spec.kind: spec
    for spec in (
        TableSpec(
            "GEMM_BF16",
            key=(*_MNK, Column("bias", parse_bool, False), _dtype_col("dtype", torch.bfloat16),
                 _dtype_col("outdtype"), Column("scaleAB", parse_bool, False),
                 Column("bpreshuffle", parse_bool, False)),
            values=(Column("libtype", parse_str), Column("solidx", parse_int, -1), Column("splitK", parse_int, 0),
                    Column("kernelName", parse_str, ""), *_EXTRA_VALUES),
        ),
        TableSpec("GEMM_A8W8", key=(*_MNK, _dtype_col("q_dtype_w", torch.int8)), values=_KERNEL_VALUES),
        TableSpec("GEMM_A8W8_BPRESHUFFLE", key=(*_MNK, _dtype_col("q_dtype_w", torch.int8)), values=_KERNEL_VALUES),
        TableSpec("GEMM_A8W8_BLOCKSCALE", key=_MNK, values=_KERNEL_VALUES),
        TableSpec("GEMM_A4W4", key=_MNK, values=_KERNEL_VALUES),
        TableSpec("A8W8_BATCHED_GEMM", key=_BMNK, values=_KERNEL_VALUES),
        TableSpec("BF16_BATCHED_GEMM", key=_BMNK, values=_KERNEL_VALUES),
        TableSpec(
            "FMOE",
            key=(Column("token", parse_int), Column("model_dim", parse_int), Column("inter_dim", parse_int),
                 Column("expert", parse_int), Column("topk", parse_int), Column("act_type", parse_str),
                 _dtype_col("dtype"), _dtype_col("q_dtype_a"), _dtype_col("q_dtype_w"), Column("q_type", parse_str),
                 Column("use_g1u1", parse_bool), Column("doweight_stage1", parse_bool)),
            # AITER's outputs (block_m, ksplit, the two stages' kernels, run_1stage) and our optional libtype.
            values=(Column("libtype", parse_str, optional=True), Column("block_m", parse_int, 0),
                    Column("ksplit", parse_int, 0), Column("kernelName1", parse_str, ""),
                    Column("kernelName2", parse_str, ""), Column("run_1stage", parse_bool, False)),
            numbers=("us1", "us2", "err1", "err2", "tflops", "bw"),
        ),
    )
}


def device_key(text: str | None) -> str | None:
    """A ``device_name`` cell as rows are matched on it: the name torch reports with runs of spaces as one ``_``
    (:attr:`aiter_gemm.device.DeviceIdentity.device_name`), so ``NVIDIA H100 80GB HBM3`` and
    ``NVIDIA_H100_80GB_HBM3`` are one device; None for an absent or empty cell (the row serves any device with its
    ``gfx`` and ``cu_num``)."""
    return ("_".join(text.split()) or None) if text else None


def merge_rank(us: float) -> float | None:
    """The one rule for a row's time: None if the row is unusable (negative, NaN or infinite ``us``: dropped with a
    warning), else its rank in a merge, lower wins. A positive ``us`` ranks by itself; ``us = 0`` marks a hand-set
    row (AITER's gfx1250 Triton rows), kept but ranked after every timed row (AITER lets 0 win every merge)."""
    if us == 0:
        return math.inf
    return None if unusable_time(us) is not None else us


@dataclass(frozen=True)
class TunedRow:
    """One tuned row: typed key and values, every column as written (``fields``), and where it came from."""

    key: tuple
    gfx: str | None  # None: the file has no gfx column (or an empty cell): any arch with this cu_num
    cu_num: int
    us: float
    values: Mapping[str, Any]
    fields: Mapping[str, str]
    source: str
    line: int
    #: Every column, known ones typed as AITER's config dicts have them (bools, ints, floats); dtype names and
    #: unknown columns as written.
    typed: Mapping[str, Any] = field(default_factory=dict)
    #: The device the row was tuned on (:func:`device_key`), or None: any device with this gfx and cu_num.
    device_name: str | None = None

    def serves(self, gfx: str, cu_num: int, device_name: str | None) -> bool:
        """Whether the runtime may use this row on that device: same ``cu_num``, ``gfx`` unless the file has none,
        ``device_name`` unless the row has none."""
        return (self.cu_num == cu_num and self.gfx in (None, gfx)
                and self.device_name in (None, device_key(device_name)))

    @property
    def hand_set(self) -> bool:
        """A row written by hand (``us = 0``), not timed by a tuner."""
        return self.us == 0


def _number(text: str) -> float | str | None:
    if not text:
        return None
    try:
        return parse_float(text)
    except ValueError:
        return text


def typed_fields(spec: TableSpec, fields: Mapping[str, str], key: tuple, values: Mapping[str, Any], cu_num: int,
                 us: float) -> dict[str, Any]:
    """A row's columns for a config dict: the key and value columns as parsed where they are numbers or bools,
    ``cu_num`` and the time as numbers, :attr:`TableSpec.numbers` as floats, the rest (dtype names, unknown
    columns) as written."""
    out: dict[str, Any] = dict(fields)
    for col, value in (*zip((c.name for c in spec.key), key), *values.items()):
        if isinstance(value, (bool, int, float)):
            out[col] = value
    for name in spec.numbers:
        if name in out:
            out[name] = _number(out[name])
    out["cu_num"], out[spec.time_column] = cu_num, us
    return out


class ConfigTable:
    """An immutable merged index of one config kind's rows: ``(*key, cu_num, gfx, device_name) -> TunedRow``. Rows
    read from files are held as handles (an int) and built into a :class:`TunedRow` by ``build`` when a lookup or an
    iteration first returns them (then kept): a table of many models' rows costs little until its rows are used."""

    def __init__(self, spec: TableSpec, rows: Mapping[tuple, TunedRow | int], sources: Sequence[str],
                 build: Callable[[int, tuple], TunedRow] | None = None) -> None:
        self.spec = spec
        self._rows: dict[tuple, TunedRow | int] = rows if isinstance(rows, dict) else dict(rows)  # a dict: taken over
        self._build = build
        self._named = any(k[-1] is not None for k in self._rows)  # device-exact rows: one more probe per lookup
        self.sources = tuple(sources)

    def _get(self, k: tuple) -> TunedRow | None:
        row = self._rows.get(k)
        if row.__class__ is int:  # every row was checked at load: building it cannot fail
            row = self._rows[k] = self._build(row, k)
        return row

    def lookup(self, gfx: str, cu_num: int, key: tuple, device_name: str | None = None) -> TunedRow | None:
        """The row for ``key`` on this device: the first of :meth:`rows_for`."""
        return next(self.rows_for(gfx, cu_num, key, device_name), None)

    def rows_for(self, gfx: str, cu_num: int, key: tuple, device_name: str | None = None) -> Iterator[TunedRow]:
        """The rows for ``key`` on this device, best first: a row naming this ``device_name`` (it serves only that
        device), then one naming none; within each, an arch-specific row before one from a file without ``gfx``.
        The dispatcher takes the first that runs here (a device row whose backend is missing: the class row)."""
        get = self._get
        name = device_key(device_name)
        names = (name, None) if name is not None and self._named else (None,)
        for n in names:
            for g in (gfx, None):
                row = get((*key, cu_num, g, n))
                if row is not None:
                    yield row

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[TunedRow]:
        return map(self._get, list(self._rows))


def _cell(row: list[str], idx: dict[str, int], name: str) -> str | None:
    i = idx.get(name)
    return None if i is None else row[i].strip()


def parse_cell(path: str, line: int, col: Column, text: str | None, strict: bool = False) -> Any:
    """Typed value of one cell; an absent or empty cell takes the column default (unless ``strict``) or is an error."""
    if not text:
        if col.optional:
            return None
        if col.default is not None and not strict:
            return col.default
        raise ConfigError(path, line, col.name, "missing required column" if text is None else "empty value")
    try:
        return col.parse(text)
    except (ValueError, KeyError) as exc:
        raise ConfigError(path, line, col.name, f"bad value {shown(text)}: {exc}") from None


def _records(path: str, lines: Iterable[str]) -> Iterator[tuple[int, int, list[str]]]:
    """:func:`~aiter_gemm.fileio.csv_records` of a table: the header (cells stripped; a BOM is not part of it) first;
    ConfigError naming the line for duplicate column names or a row whose field count is not the header's."""
    width = None
    for start, end, rec in csv_records(path, lines):
        if width is None:
            rec = [c.strip() for c in rec]
            if len(set(rec)) != len(rec):
                raise ConfigError(path, end, None, f"duplicate column names in header {rec}")
            width = len(rec)
        elif len(rec) != width:
            raise ConfigError(path, end, None, f"wrong field count: {len(rec)} fields for {width} columns")
        yield start, end, rec


def _read(path: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header and non-blank data rows with their 1-based (last) line numbers (:func:`_records`)."""
    records = _records(path, csv_lines(path)[0])
    first = next(records, None)
    return ([], []) if first is None else (first[2], [(line, rec) for _, line, rec in records])


def _time(spec: TableSpec, path: str, line: int, rec: list[str], idx: dict[str, int]) -> float:
    text = _cell(rec, idx, spec.time_column)
    try:
        return parse_time(text)
    except ValueError:
        raise ConfigError(path, line, spec.time_column, f"bad value {shown(text)}: not a number") from None


class _TunedFile:
    """One tuned CSV as :func:`_scan` read it: its lines (kept, so that building a row reads no file) and header.
    :meth:`row` builds the :class:`TunedRow` of a line, with the same parsers the scan checked it with."""

    __slots__ = ("spec", "path", "lines", "idx", "starts")

    def __init__(self, spec: TableSpec, path: str, lines: list[str], idx: dict[str, int]) -> None:
        self.spec, self.path, self.lines, self.idx = spec, path, lines, idx
        self.starts: dict[int, int] = {}  # last line -> first line, for records spanning lines (quoted newlines)

    def record(self, line: int) -> list[str]:
        return next(csv_records(self.path, self.lines[self.starts.get(line, line) - 1:line]))[2]

    def us(self, line: int) -> float:
        return _time(self.spec, self.path, line, self.record(line), self.idx)

    def row(self, line: int, index_key: tuple) -> TunedRow:
        """The row of ``line``, whose typed key and ``cu_num`` the scan put in its :class:`ConfigTable` index key
        (``(*key, cu_num, gfx, device_name)``): only the value cells are parsed again."""
        spec, path, idx = self.spec, self.path, self.idx
        rec = self.record(line)
        key, cu_num = index_key[:-3], index_key[-3]
        us = _time(spec, path, line, rec, idx)
        values = {c.name: parse_cell(path, line, c, _cell(rec, idx, c.name)) for c in spec.values}
        fields = {name: rec[i].strip() for name, i in idx.items()}
        return TunedRow(key, fields.get("gfx") or None, cu_num, us, MappingProxyType(values),
                        MappingProxyType(fields), path, line,
                        MappingProxyType(typed_fields(spec, fields, key, values, cu_num, us)),
                        device_key(fields.get(DEVICE_NAME_COLUMN)))


_CU_NUM = Column("cu_num", parse_int)
#: How :func:`_scan` reads the merge key's ``gfx`` and ``device_name`` cells, as :meth:`_TunedFile.row` does.
_GFX = Column("gfx", parse_str, optional=True)
_DEVICE = Column(DEVICE_NAME_COLUMN, device_key, optional=True)


class _Parsed(dict):
    """One column's cells as :func:`parse_cell` types them: raw text -> value, each text parsed once (the same texts
    repeat down a file). A text that does not parse raises ConfigError without its place (nothing is kept):
    :func:`_checked` says where."""

    def __init__(self, col: Column, strict: bool) -> None:
        super().__init__()
        self.col, self.strict = col, strict

    def __missing__(self, raw: str) -> Any:
        value = self[raw] = parse_cell("", 0, self.col, raw.strip(), self.strict)
        return value


def _picker(idx: dict[str, int], memos: list[_Parsed]) -> Callable[[list[str]], tuple]:
    """A function typing the cells ``memos`` name (by their column) of a row, in order."""
    at = [idx[m.col.name] for m in memos]
    cells = itemgetter(*at) if len(at) > 1 else lambda rec: tuple(rec[i] for i in at)
    return lambda rec: tuple(map(getitem, memos, cells(rec)))


def _checked(path: str, line: int, rec: list[str], idx: dict[str, int], memos: list[_Parsed]) -> tuple:
    """The typed cells ``memos`` name, parsed one by one: ConfigError naming file, line and column on the first bad
    one."""
    return tuple(memo[rec[idx[memo.col.name]]] if rec[idx[memo.col.name]] in memo else
                 parse_cell(path, line, memo.col, rec[idx[memo.col.name]].strip(), memo.strict) for memo in memos)


def _scan(spec: TableSpec, path: str) -> tuple[_TunedFile | None, dict[tuple, int]]:
    """Check every row of a tuned CSV as building it would (ConfigError naming file, line and column; rows with an
    unusable time dropped with a warning) and index the rest: merge key (:class:`ConfigTable`'s) -> line, a
    duplicate key's row chosen by :func:`merge_rank` (a tie keeps the earlier line). Each column parses a text once
    (:class:`_Parsed`); no :class:`TunedRow` is built here. (None, {}) for an empty file."""
    lines = csv_lines(path)[0]
    records = _records(path, lines)
    first = next(records, None)
    if first is None:
        return None, {}  # an empty file is valid
    idx = {name: i for i, name in enumerate(first[2])}
    # Tuned rows need every key column (defaults are for untuned shape lists only); value columns may default.
    must = [c.name for c in spec.key] + [c.name for c in spec.values if c.default is None and not c.optional]
    must += ["cu_num", spec.time_column]
    for name in must:
        if name not in idx:
            raise ConfigError(path, 1, name, "missing required column")
    file = _TunedFile(spec, path, lines, idx)
    # Cells read before the time (the key, cu_num, gfx, device_name: the merge key; the last two cannot fail) and
    # after it (the values, of rows kept only), in building order; a value column the file lacks takes its default
    # or None. A gfx or device_name column the file lacks reads as an empty cell appended to each row.
    at = {"gfx": len(idx), DEVICE_NAME_COLUMN: len(idx), **idx}
    head = [_Parsed(c, True) for c in spec.key] + [_Parsed(c, False) for c in (_CU_NUM, _GFX, _DEVICE)]
    tail = [_Parsed(c, False) for c in spec.values if c.name in idx]
    head_of, tail_of = _picker(at, head), _picker(at, tail)
    m_at = next((i for i, c in enumerate(spec.key) if c.name == "M"), None)
    pad_at = next((j for j, memo in enumerate(tail) if memo.col.name == "pad_m_min"), None)
    check_pad = pad_at is not None and m_at is not None
    time_i, inf = idx[spec.time_column], math.inf
    rows: dict[tuple, int] = {}
    dropped: list[int] = []
    for start, line, rec in records:
        rec.append("")
        try:
            key = head_of(rec)
        except ConfigError:
            key = _checked(path, line, rec, at, head)
        text = rec[time_i]
        try:  # as parse_time reads it (float strips blanks too; no "_" or other scripts' digits), else _time says why
            us = float(text) if text.isascii() and "_" not in text else _time(spec, path, line, rec, idx)
        except ValueError:
            us = _time(spec, path, line, rec, idx)
        rank = us if 0 < us < inf else merge_rank(us)
        if rank is None:
            dropped.append(line)
            continue
        try:
            values = tail_of(rec)
        except ConfigError:
            values = _checked(path, line, rec, at, tail)
        if check_pad and values[pad_at] is not None and values[pad_at] > key[m_at]:
            raise ConfigError(path, line, "pad_m_min", f"{values[pad_at]} is above the row's M={key[m_at]}: "
                              "the checked range is pad_m_min..M")
        if start != line:
            file.starts[line] = start
        old = rows.setdefault(key, line)
        if old != line and rank < merge_rank(file.us(old)):
            rows[key] = line
    if dropped:
        log.warning("%s: dropped %d row(s) whose %r is empty, NaN, infinite or negative (lines %s)",
                    path, len(dropped), spec.time_column, ", ".join(map(str, dropped[:10])) +
                    (" ..." if len(dropped) > 10 else ""))
    return file, rows


class _Files:
    """The files of one table: a row's handle is its line plus its file's base (the lines of the files before)."""

    def __init__(self) -> None:
        self.files: list[_TunedFile] = []
        self.bases: list[int] = []

    def add(self, file: _TunedFile) -> int:
        base = self.bases[-1] + len(self.files[-1].lines) if self.files else 0
        self.files.append(file)
        self.bases.append(base)
        return base

    def _at(self, handle: int) -> tuple[_TunedFile, int]:
        i = bisect.bisect_left(self.bases, handle) - 1
        return self.files[i], handle - self.bases[i]

    def us(self, handle: int) -> float:
        file, line = self._at(handle)
        return file.us(line)

    def build(self, handle: int, index_key: tuple) -> TunedRow:
        file, line = self._at(handle)
        return file.row(line, index_key)


def load_table(kind: str, paths: Sequence[str | os.PathLike], strict: bool = True) -> ConfigTable:
    """Merge the tuned CSVs ``paths`` (earlier paths win ties) into one :class:`ConfigTable` of ``kind``.

    ``strict``: a malformed or unreadable file raises (:class:`ConfigError` naming file, line and column), and so does
    every path missing. Not strict (the runtime's dispatchers): such a file is skipped with a warning saying why and
    the table holds the other files' rows, possibly none (every shape then runs on the default heuristic), so that
    neither the process nor the tuner that would regenerate the file dies of it."""
    spec = SPECS[kind]
    merged: dict[tuple, int] = {}
    files = _Files()
    found: list[str] = []
    for p in map(str, paths):
        problem = file_problem(p)
        if problem is not None:
            log.warning("aiter_gemm: %s config %s: %s; skipped", kind, p, problem)
            continue
        try:
            file, rows = _scan(spec, p)
        except Exception as exc:  # any failure to read one file is that file's problem, never the process's
            if strict:
                if isinstance(exc, (ConfigError, OSError)):
                    raise
                raise ConfigError(p, None, None, f"cannot be read: {type(exc).__name__}: {exc}") from exc
            log.warning("aiter_gemm: %s config %s cannot be used, skipped (its shapes fall back to the other files' "
                        "rows or the default heuristic): %s", kind, p, exc)
            continue
        found.append(p)
        if file is None:
            continue
        base = files.add(file)
        if not merged and base == 0:
            merged = rows
            continue
        for k, line in rows.items():
            old = merged.get(k)
            # strict: a tie keeps the earlier file's row
            if old is None or merge_rank(file.us(line)) < merge_rank(files.us(old)):
                merged[k] = base + line
    if not found:
        message = f"aiter_gemm: no usable {kind} config file among {list(map(str, paths))}"
        if strict:
            raise FileNotFoundError(message)
        log.warning("%s; every %s shape runs on the default heuristic", message, kind)
    return ConfigTable(spec, merged, found, files.build)


def typed_key(spec: TableSpec, cells: Mapping[str, str | None], path: str = "<row>", line: int = 0) -> tuple:
    """The typed key of a shape row given as ``column -> text`` (absent or empty cells take their defaults; an absent
    ``outdtype`` follows ``dtype``), so ``True``/``1`` or ``bf16``/``torch.bfloat16`` spellings compare equal.
    ConfigError (naming ``path``, ``line`` and the column) when a cell does not parse or a required one is missing."""
    vals: dict[str, Any] = {}
    for c in spec.key:
        text = cells.get(c.name)
        text = text.strip() if text is not None else None
        if c.name == "outdtype" and not text and "dtype" in vals:
            vals[c.name] = vals["dtype"]
        else:
            vals[c.name] = parse_cell(path, line, c, text)
    return tuple(vals.values())


def load_untuned(path: str | os.PathLike, kind: str = "GEMM_BF16") -> list[tuple]:
    """Typed keys of an untuned shape list (``M,N,K`` at least; missing or empty columns take their defaults; an
    absent ``outdtype`` follows ``dtype``). Duplicates are kept once, in file order."""
    spec = SPECS[kind]
    path = str(path)
    header, data = _read(path)
    idx = {name: i for i, name in enumerate(header)}
    for c in spec.key:
        if c.default is None and c.name not in idx and c.name != "outdtype":
            raise ConfigError(path, 1, c.name, "missing required column")
    keys: dict[tuple, None] = {}
    for line, rec in data:
        keys[typed_key(spec, {name: rec[i] for name, i in idx.items()}, path, line)] = None
    return list(keys)
