"""vLLM's and SGLang's fused-MoE Triton config files, read by :func:`aiter_gemm.fused_moe` and written by its tuner.

Both keep one JSON file per (E, N) and device: ``E={E},N={N},device_name={name}[,dtype=fp8_w8a8][,block_shape=[128,
128]].json`` (``N``: the expert's intermediate size I, w2's last dimension; ``name``: torch's device name, spaces as
``_``; the dtype part for FP8 experts, the block shape for (128, 128) block scales: vLLM writes it without the space,
SGLang with it). Its keys are M values (the token count) and its values one Triton config for both GEMMs
(``BLOCK_SIZE_M``, ``BLOCK_SIZE_N``, ``BLOCK_SIZE_K``, ``GROUP_SIZE_M``, ``num_warps``, ``num_stages``, more keys
in newer files); the config of the M nearest the call's runs (``min(keys, key=|key - M|)``, a tie to the key
written first). Here the two spellings are two file families of the op's JSON level (:data:`VLLM_FILES`, then
:data:`SGLANG_FILES`), read from the folders of ``AITER_GEMM_FUSED_MOE_CONFIGS``; the nearest-M rule becomes
``M_LEQ``-style bounds (:func:`~aiter_gemm.jsonconfigs.nearest_m_bounds`) and each value becomes a solution of the
backend that runs such configs (its ``parse_json_entry``: ``triton``). A file that cannot be used is skipped with a
warning naming it and the key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aiter_gemm.backends.base import MoeProblem, Solution
from aiter_gemm.configs import parse_int
from aiter_gemm.jsonconfigs import (
    FP8_FILE_DTYPE,
    PARSE_ERRORS,
    Buckets,
    JSONConfigError,
    JSONFiles,
    load_object,
    merge_m_file,
    nearest_m_bounds,
)
from aiter_gemm.kernels.blockscale_format import SCALE_BLOCK

__all__ = ["DTYPE", "LIBTYPE", "SGLANG_FILES", "VLLM_FILES", "file_name", "merge_file", "read_file"]

#: The dtype part of an FP8 file's name.
DTYPE = FP8_FILE_DTYPE
#: The backend whose ``parse_json_entry`` reads the values (vLLM's and SGLang's configs are Triton configs).
LIBTYPE = "triton"
_M_KEY = re.compile(r"[1-9][0-9]*")


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
    JSONConfigError naming the file and key (a key that is not an M, a value that is not an object, a value
    ``parse_entry`` refuses)."""
    data = load_object(path, "M values")
    solutions: dict[int, Solution] = {}
    for key, entry in data.items():
        if not _M_KEY.fullmatch(key):
            raise JSONConfigError(path, key, "keys are M values (positive integers without sign, blanks or leading "
                                             "zeros)")
        if not isinstance(entry, dict):
            raise JSONConfigError(path, key, f"entry must be an object of kernel parameters, got "
                                             f"{type(entry).__name__}")
        try:
            solutions[parse_int(key, signed=False)] = parse_entry(entry)
        except PARSE_ERRORS as exc:
            raise JSONConfigError(path, key, str(exc) or type(exc).__name__) from None
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
    its lock, atomically: the file's other M keys are kept as written, keys sorted by M (as vLLM writes them). A
    file that does not read (``check_entry`` refusing one of its values) is left alone: JSONConfigError naming it
    and the key, never a user's configs dropped."""
    if not entries:
        raise ValueError(f"merge_file: no entries for {p.label()}")
    path = Path(directory) / problem_file_name(device_name, p)
    return merge_m_file(path, entries, lambda current: read_file(current, check_entry), check_entry)
