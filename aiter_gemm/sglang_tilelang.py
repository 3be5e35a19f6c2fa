"""SGLang's TileLang FP8 block-scale config files, read by the runtime and written by the tuner.

SGLang keeps one JSON file per (N, K) and device, named ``N={N},K={K},device_name={name},dtype=fp8_w8a8,
block_shape=[128, 128].json`` (``name``: torch's device name, spaces as ``_``), whose keys are M values and whose
values name one of its four kernel types with its parameters (``kernel_type``, ``block_M``, ``block_N``,
``block_K``, ``num_stages``, ``threads``, ``split_k``, ``c_scale_local``, ``a_scale_shm`` / ``b_scale_shm``) plus
the measurement (``latency_ms``, ``tflops``). SGLang runs the entry of the M nearest the call's
(``min(keys, key=|key - M|)`` over the keys in file order: a tie goes to the key written first).

Here those files are one more family of the block-scale op's JSON level (:data:`FILES`, after the op's own files,
above the default: docs/configs.md), read from the folders of ``AITER_GEMM_SGLANG_TILELANG_DIR``. Their nearest-M
rule becomes ``M_LEQ``-style bounds (:func:`~aiter_gemm.jsonconfigs.nearest_m_bounds`), so the dispatcher selects
from them as from any JSON file. Entries run on the ``tilelang`` backend
(:class:`~aiter_gemm.kernels.a8w8_blockscale_tilelang.TileLangConfig` is SGLang's key set); one whose values
TileLang cannot run here is a miss, warned once per file.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Mapping
from itertools import repeat
from pathlib import Path
from typing import Any

from aiter_gemm.backends.a8w8_blockscale import tilelang as tilelang_backend
from aiter_gemm.backends.base import Solution
from aiter_gemm.configs import parse_int
from aiter_gemm.fileio import gc_paused, read_text
from aiter_gemm.jsonconfigs import (
    FP8_FILE_DTYPE,
    M_KEY,
    PARSE_ERRORS,
    Buckets,
    JSONConfigError,
    JSONFiles,
    load_object,
    merge_m_file,
    nearest_m_bounds,
)
from aiter_gemm.kernels import a8w8_blockscale_tilelang as tl_impl
from aiter_gemm.kernels.a8w8_blockscale_tilelang import SPLIT, SWAPPED, TileLangConfig
from aiter_gemm.kernels.blockscale_format import SCALE_BLOCK

__all__ = ["FILES", "entry_solution", "file_name", "merge_file", "nearest_m_bounds", "read_file", "sglang_entry"]

DTYPE = FP8_FILE_DTYPE
BLOCK_SHAPE = (SCALE_BLOCK, SCALE_BLOCK)
_SUFFIX = f",dtype={DTYPE},block_shape=[{BLOCK_SHAPE[0]}, {BLOCK_SHAPE[1]}].json"
_FILE_RE = re.compile(r"N=([0-9]+),K=([0-9]+),device_name=(.+)" + re.escape(_SUFFIX))
_SHORT_M_KEY = re.compile(r"[1-9][0-9]{0,17}")  # configs.MAX_DIGITS: a longer key is left to the checks saying why
#: SGLang's value keys by type (``swizzle``: ours, the L2 panel; SGLang ignores keys it does not read).
_INTS = ("block_M", "block_N", "block_K", "num_stages", "threads", "split_k", "swizzle")
_BOOLS = ("c_scale_local", "a_scale_shm", "b_scale_shm")
_NUMBERS = ("latency_ms", "tflops")
#: What SGLang's loader reads with ``config[key]`` (``split_k`` too for the split-K types).
_REQUIRED = ("kernel_type", "block_M", "block_N", "block_K", "num_stages", "threads")


def file_name(N: int, K: int, device_name: str) -> str:
    """SGLang's file name of (N, K) on ``device_name`` (spaces as ``_``, as :attr:`DeviceIdentity.device_name`)."""
    return f"N={N},K={K},device_name={device_name}{_SUFFIX}"


def entry_solution(entry: Mapping[str, Any]) -> Solution:
    """The ``tilelang`` solution of one SGLang value. ValueError naming the key for a value SGLang itself could not
    read (a missing key, a wrong type, an unknown key); values our kernels cannot run give a solution whose
    kernelName the backend rejects saying why (a miss, not a malformed file). ``split_k`` of the unsplit types is
    ignored, as SGLang ignores it; ``c_scale_local`` is read and not used (:class:`TileLangConfig`)."""
    unknown = sorted(set(entry) - {"kernel_type", *_INTS, *_BOOLS, *_NUMBERS})
    if unknown:
        raise ValueError(f"unknown keys {unknown}")
    kernel_type = entry.get("kernel_type")
    missing = [k for k in (*_REQUIRED, *(("split_k",) if kernel_type in SPLIT else ())) if k not in entry]
    if missing:
        raise ValueError(f"missing keys {missing}")
    if not isinstance(kernel_type, str):
        raise ValueError(f"kernel_type must be a string, got {kernel_type!r}")
    for keys, types, what in ((_INTS, (int,), "an integer"), (_BOOLS, (bool,), "true or false"),
                              (_NUMBERS, (int, float), "a number")):
        for key in keys:
            value = entry.get(key)
            if key in entry and (not isinstance(value, types) or (bool not in types and isinstance(value, bool))):
                raise ValueError(f"{key} must be {what}, got {value!r}")
    values = {k: entry[k] for k in ("kernel_type", *_INTS, *_BOOLS) if k in entry}
    if kernel_type not in SPLIT:
        values["split_k"] = 1
    try:
        return tilelang_backend.solution_of(TileLangConfig(**values))
    except ValueError:  # a config this project's kernels cannot build: the backend says why when it is selected
        return Solution(tilelang_backend.NAME, -1, 0, tl_impl.config_name(values))


def read_file(path: str | os.PathLike) -> Buckets:
    """The buckets of one SGLang file: (largest M served or None, the M key, solution), smallest first; strict:
    JSONConfigError naming the file and key. A file of many M keys is checked once per distinct entry
    (:func:`_plainly_valid`); one that is not plainly valid is checked key by key here, which says why."""
    fast = _plainly_valid(path)
    if fast is not None:
        return fast
    data = load_object(path, "M values")
    ms: list[int] = []
    solutions: dict[int, Solution] = {}
    for key, entry in data.items():
        if not M_KEY.fullmatch(key):
            raise JSONConfigError(path, key, "SGLang's keys are M values (positive integers without sign, blanks "
                                             "or leading zeros)")
        if not isinstance(entry, dict):
            raise JSONConfigError(path, key, f"entry must be an object of kernel parameters, got "
                                             f"{type(entry).__name__}")
        try:
            m = parse_int(key, signed=False)
            solutions[m] = entry_solution(entry)
        except PARSE_ERRORS as exc:
            raise JSONConfigError(path, key, str(exc) or type(exc).__name__) from None
        ms.append(m)
    return _buckets(ms, solutions)


def _buckets(ms: list[int], solutions: Mapping[int, Solution]) -> Buckets:
    bounds = nearest_m_bounds(ms)
    return [(bounds[m], str(m), solutions[m]) for m in sorted(bounds)]  # bounds grow with M: smallest first


def _any_float(text: str) -> float:
    return 0.0


def _plainly_valid(path: str | os.PathLike) -> Buckets | None:
    """:func:`read_file`'s buckets of a file it accepts, read fast (a file of 200k M keys: most of them share a few
    configs), or None when the file is not plainly valid (then :func:`read_file`'s own checks say why). Only the type
    of a JSON float matters to an entry (a number, or a wrong type), so every float parses as 0.0 and entries
    compare equal by their items and types: each distinct entry is checked once. A key written twice is ruled out by
    counting: with no nested containers, the file's ``:`` count is its key count exactly when no key repeats and no
    string holds a ``:``."""
    with gc_paused():  # ~1M objects, no cycle among them: the ~700 collections they would set off free nothing
        return _plain_buckets(path)


def _plain_buckets(path: str | os.PathLike) -> Buckets | None:
    try:
        text = read_text(path)[0]
        data = json.loads(text, parse_float=_any_float)
    except (ValueError, RecursionError):  # bad JSON or bytes that are not UTF-8 (ConfigError is a ValueError)
        return None
    if not isinstance(data, dict) or not data:
        return None
    entries = list(data.values())
    if set(map(type, entries)) != {dict} or not all(map(_SHORT_M_KEY.fullmatch, data)):
        return None
    if text.count(":") != len(data) + sum(map(len, entries)):
        return None

    # Each entry's keys, values and their types (True == 1 and 0.0 == 0: the types tell them apart), in file order.
    signatures = zip(map(tuple, entries), map(tuple, map(dict.values, entries)),
                     map(tuple, map(map, repeat(type), map(dict.values, entries))))
    try:  # TypeError: a list or an object inside an entry (unhashable)
        solutions = list(map(_CheckedOnce().__getitem__, signatures))
    except (TypeError, ValueError):
        return None
    ms = list(map(int, data))
    return _buckets(ms, dict(zip(ms, solutions)))


class _CheckedOnce(dict):
    """Entry signature (keys, values, types) -> :func:`entry_solution` of that entry, computed on first use."""

    def __missing__(self, sig: tuple[tuple, tuple, tuple]) -> Solution:
        sol = self[sig] = entry_solution(dict(zip(sig[0], sig[1])))
        return sol


FILES = JSONFiles(
    label="SGLang TileLang config", folders=lambda settings: settings.sglang_tilelang_dirs,
    file_name=lambda device, p: file_name(p.N, p.K, device.device_name),
    glob=lambda device: "N=*,K=*," + glob.escape(f"device_name={device.device_name}{_SUFFIX}"),
    nk=_FILE_RE, read=lambda path, _backend: read_file(path),  # SGLang's values: read_file names the solutions
    warn_per_file=True)


# ------------------------------------------------------------------------------------------------ writing


def sglang_entry(cfg: TileLangConfig, latency_ms: float, tflops: float) -> dict[str, Any]:
    """``cfg`` as SGLang's value: its keys for the kernel type (``split_k`` for the split types, ``b_scale_shm`` for
    the swapped ones, else ``a_scale_shm``; ``swizzle`` when set), and the measurement."""
    out: dict[str, Any] = {k: getattr(cfg, k) for k in ("kernel_type", "block_M", "block_N", "block_K",
                                                        "num_stages", "threads")}
    if cfg.kernel_type in SPLIT:
        out["split_k"] = cfg.split_k
    out["c_scale_local"] = cfg.c_scale_local
    scale = "b_scale_shm" if cfg.kernel_type in SWAPPED else "a_scale_shm"
    out[scale] = getattr(cfg, scale)
    if cfg.swizzle:
        out["swizzle"] = cfg.swizzle
    out["latency_ms"] = latency_ms
    out["tflops"] = tflops
    return out


def merge_file(directory: str | os.PathLike, device_name: str, N: int, K: int,
               entries: Mapping[int, Mapping[str, Any]]) -> Path:
    """Write ``entries`` (M -> SGLang value) into the file of (N, K) on ``device_name`` in ``directory``, under its
    lock, atomically: the file's other M keys are kept as written, keys sorted by M (as SGLang writes them). A file
    that does not read as SGLang's is left alone (JSONConfigError naming it and the key): never drop a user's
    rows."""
    if not entries:
        raise ValueError(f"merge_file: no entries for N={N} K={K}")
    path = Path(directory) / file_name(N, K, device_name)
    return merge_m_file(path, entries, read_file, entry_solution)

