"""vLLM's and SGLang's fused-MoE Triton config files, read by :func:`aiter_gemm.fused_moe` and written by its tuner.

Both keep one JSON file per (E, N) and device: ``E={E},N={N},device_name={name}[,dtype=fp8_w8a8][,block_shape=[128,
128]].json`` (``N``: the expert's intermediate size I, w2's last dimension; ``name``: torch's device name, spaces as
``_``; the dtype part for FP8 experts, the block shape for (128, 128) block scales: vLLM writes it without the space,
SGLang with it). Its keys are M values (the token count) and its values one Triton config for both GEMMs
(``BLOCK_SIZE_M``, ``BLOCK_SIZE_N``, ``BLOCK_SIZE_K``, ``GROUP_SIZE_M``, ``num_warps``, ``num_stages``, more keys
in newer files); the config of the M nearest the call's runs (``min(keys, key=|key - M|)``, a tie to the key
written first). vLLM's ``benchmark_moe.py`` also writes ``"triton_version"`` (:data:`VERSION_KEY`) first, the Triton
the configs were tuned with, which its loader drops; here it is read (a mismatch with this process's Triton logged
once per file: configs go stale with a Triton upgrade), kept when the tuner merges into a file and written with the
tuner's Triton (:func:`merge_file`). SGLang keeps the version in its folder name (``configs/triton_3_4_0/``) and
reads M keys only. Here the two spellings are two file families of the op's JSON level (:data:`VLLM_FILES`, then
:data:`SGLANG_FILES`), read from the folders of ``AITER_GEMM_FUSED_MOE_CONFIGS``; the nearest-M rule becomes
``M_LEQ``-style bounds (:func:`~aiter_gemm.jsonconfigs.nearest_m_bounds`) and each value becomes a solution of the
backend that runs such configs (its ``parse_json_entry``: ``triton``). A file that cannot be used is skipped with a
warning naming it and the key.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aiter_gemm.backends.base import MoeProblem, Solution
from aiter_gemm.configs import parse_int
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
from aiter_gemm.kernels.blockscale_format import SCALE_BLOCK

__all__ = ["DTYPE", "LIBTYPE", "SGLANG_FILES", "VERSION_KEY", "VLLM_FILES", "file_name", "merge_file", "read_file",
           "triton_version"]

log = logging.getLogger(__name__)

#: The dtype part of an FP8 file's name.
DTYPE = FP8_FILE_DTYPE
#: The backend whose ``parse_json_entry`` reads the values (vLLM's and SGLang's configs are Triton configs).
LIBTYPE = "triton"
#: The top-level key beside the M keys naming the Triton version the file's configs were tuned with (vLLM's).
VERSION_KEY = "triton_version"


@functools.cache
def triton_version() -> str | None:
    """This process's Triton version (None without Triton): what the tuner's configs are tuned with."""
    try:
        import triton
    except ImportError:
        return None
    return str(triton.__version__)


def file_name(E: int, N: int, device_name: str, dtype: str | None = None,
              block_shape: tuple[int, int] | None = None, spaced: bool = False) -> str:
    """vLLM's name of the file of (E, N) on ``device_name`` (SGLang's with ``spaced``: a blank after the block
    shape's comma)."""
    name = f"E={E},N={N},device_name={device_name}" + (f",dtype={dtype}" if dtype else "")
    if block_shape:
        name += f",block_shape=[{block_shape[0]},{' ' if spaced else ''}{block_shape[1]}]"
    return name + ".json"


def problem_file_name(device_name: str, p: MoeProblem, spaced: bool = False) -> str:
    """The file a problem's configs are in: FP8 experts with (128, 128) block scales name their dtype and block."""
    return file_name(p.expert, p.inter_dim, device_name, DTYPE if p.fp8 else None,
                     (SCALE_BLOCK, SCALE_BLOCK) if p.fp8 else None, spaced)


def read_file(path: str | os.PathLike, parse_entry: Callable[[dict], Solution]) -> Buckets:
    """The buckets of one file: (largest M served or None, the M key, solution), smallest first; strict:
    JSONConfigError naming the file and key (a key that is not an M or :data:`VERSION_KEY`, a version that is not a
    string, a value that is not an object, a value ``parse_entry`` refuses, no M key). A version other than this
    process's Triton's is logged, not refused."""
    data = load_object(path, "M values")
    solutions: dict[int, Solution] = {}
    for key, entry in data.items():
        if key == VERSION_KEY:
            if not isinstance(entry, str):
                raise JSONConfigError(path, key, f"the Triton version must be a string, got {type(entry).__name__}")
            continue
        if not M_KEY.fullmatch(key):
            raise JSONConfigError(path, key, f"keys are M values (positive integers without sign, blanks or leading "
                                             f"zeros) or {VERSION_KEY!r}")
        if not isinstance(entry, dict):
            raise JSONConfigError(path, key, f"entry must be an object of kernel parameters, got "
                                             f"{type(entry).__name__}")
        try:
            solutions[parse_int(key, signed=False)] = parse_entry(entry)
        except PARSE_ERRORS as exc:
            raise JSONConfigError(path, key, str(exc) or type(exc).__name__) from None
    if not solutions:
        raise JSONConfigError(path, None, "holds no M key")
    tuned_with, here = data.get(VERSION_KEY), triton_version()
    if tuned_with is not None and here is not None and tuned_with != here:
        log.warning("aiter_gemm: %s was tuned with Triton %s, this is Triton %s: its configs may no longer be the "
                    "fastest (retune: python -m gradlib.tune_moe --vllm_dir)", path, tuned_with, here)
    bounds = nearest_m_bounds(list(solutions))
    return [(bounds[m], str(m), solutions[m]) for m in sorted(bounds)]


def _family(label: str, spaced: bool) -> JSONFiles:
    return JSONFiles(label=label, folders=lambda settings: settings.fused_moe_dirs,
                     file_name=lambda device, p: problem_file_name(device.device_name, p, spaced),
                     glob=None, nk=None,  # a file name lacks the model dim: not enumerated for warm-up
                     read=lambda path, backend: read_file(path, backend(LIBTYPE).parse_json_entry))


VLLM_FILES = _family("vLLM fused-MoE config", spaced=False)
SGLANG_FILES = _family("SGLang fused-MoE config", spaced=True)


def merge_file(directory: str | os.PathLike, device_name: str, p: MoeProblem, entries: Mapping[int, Mapping[str, Any]],
               check_entry: Callable[[dict], Any]) -> Path:
    """Write ``entries`` (M -> config object) into vLLM's file of ``p`` on ``device_name`` in ``directory``, under
    its lock, atomically: the file's other M keys are kept as written, keys sorted by M (as vLLM writes them), after
    :data:`VERSION_KEY` (:func:`version_header`). A file that does not read (``check_entry`` refusing one of its
    values) is left alone: JSONConfigError naming it and the key, never a user's configs dropped."""
    if not entries:
        raise ValueError(f"merge_file: no entries for {p.label()}")
    path = Path(directory) / problem_file_name(device_name, p)
    return merge_m_file(path, entries, lambda current: read_file(current, check_entry), check_entry,
                        functools.partial(version_header, path))


def version_header(path: Path, old: Mapping[str, Any] | None, covered: bool) -> dict[str, Any]:
    """The non-M keys a merge writes: this Triton's version where every M key is this run's (a new file, or one
    whose keys the merge all replaces), else the file's as written (its other configs were tuned with its version;
    a different one is logged: the file now mixes them)."""
    here, theirs = triton_version(), (old or {}).get(VERSION_KEY)
    if here is None or (old is not None and not covered):
        if theirs is not None and here is not None and theirs != here:
            log.warning("aiter_gemm: %s keeps %s %s for its other M keys; this run's configs were tuned with Triton "
                        "%s", path, VERSION_KEY, theirs, here)
        return dict(old or {})
    return {VERSION_KEY: here, **{k: v for k, v in (old or {}).items() if k != VERSION_KEY}}
