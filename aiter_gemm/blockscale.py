"""``gemm_a8w8_blockscale``: fp8 GEMM with DeepSeek-style block scales, dispatched from tuned CSV rows or JSON.

Which kernel config runs a shape (M, N, K) is decided once per shape and cached, in this order:

1. a row of the ``GEMM_A8W8_BLOCKSCALE`` table (``AITER_CONFIG_GEMM_A8W8_BLOCKSCALE``, default the shipped
   ``configs/a8w8_blockscale_tuned_gemm.csv``) keyed ``gfx, cu_num, M, N, K``, exact M first, then M padded as AITER
   pads it (granularity levels 0 and 1). Columns (AITER's a8w8-blockscale CSV plus ``gfx`` and ``libtype``):
   ``gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName,tflops,bw,errRatio``. ``libtype`` ``triton``: our
   kernel, ``kernelName`` is :attr:`BlockscaleConfig.name` (e.g. ``splitK_swapAB-BM16_BN128_BK128_GM1_SK4_W4_S3``,
   then optionally ``_NS2``, ``_TMA``, ``_WS``) and ``splitK`` must equal its split count (0 or 1 when unsplit);
   ``libtype`` ``torch``: torch's block-scaled ``F.scaled_mm`` (cuBLASLt), ``kernelName`` ``scaled_mm_blockwise``
   (:mod:`aiter_gemm.kernels.a8w8_blockscale_torch`). ``kernelId`` is the candidate's index in the tuner's listing
   (informational). A malformed row raises :class:`ConfigError` naming file, line and column; a well-formed choice
   that cannot run the shape here (or torch's where this torch/GPU lacks it) is a miss (warned once).
2. the per-device JSON ``{arch}-GEMM-A8W8_BLOCKSCALE-N={N}-K={K}.json`` (seed 002's file), searched in the folders
   of ``AITER_GEMM_TRITON_CONFIGS`` (colon-separated) and then the shipped ``configs/triton/``. Its keys are M
   buckets, each mapped to a config object (:meth:`BlockscaleConfig.to_json`, or
   ``{"libtype": "torch", "kernelName": "scaled_mm_blockwise"}``): ``M_LEQ_<n>`` covers M <= n,
   seed 002's ``small_M`` / ``medium_M`` / ``large_M`` mean M <= 256 / M <= 2048 / any M, and ``any`` is any M. The
   bucket with the smallest bound >= M wins. The tuner writes one ``M_LEQ_<m>`` per tuned M plus ``any`` for the
   largest (:func:`buckets_from_tuned`): finer than seed 002's three, because the best variant changes between
   M = 16 (swapAB, split-K) and M = 256 (base) and again above 1024 (larger tiles).
3. the built-in :func:`~aiter_gemm.kernels.a8w8_blockscale.default_config`.

Files are read at first use and again after :func:`aiter_gemm.reload_configs` (noticed through the table object
changing); the per-call path does one dict lookup.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from aiter_gemm.configs import ConfigError, ConfigTable, TunedRow
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.dispatch import MATCH_LEVELS, get_padded_m
from aiter_gemm.fileio import atomic_write_text
from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl
from aiter_gemm.kernels.a8w8_blockscale import (
    SCALE_BLOCK,
    BlockscaleConfig,
    config_error,
    config_space,
    default_config,
    gemm_a8w8_blockscale_triton,
)
from aiter_gemm.kernels.a8w8_blockscale_torch import TorchBlockwise, gemm_a8w8_blockscale_torch
from aiter_gemm.ops import current_device_identity, get_config_table, get_dispatcher

__all__ = [
    "BLOCKSCALE_TUNED_COLUMNS", "BLOCKSCALE_UNTUNED_COLUMNS", "KIND", "LIBTYPE", "LIBTYPES", "BlockscaleChoice",
    "Choice", "JSONConfigError", "TorchBlockwise", "buckets_from_tuned", "choice_error", "config_space", "csv_row",
    "gemm_a8w8_blockscale", "get_GEMM_A8W8_BLOCKSCALE_config", "json_config_path", "parse_choice",
    "read_json_configs", "select_bucket", "write_json_configs",
]

log = logging.getLogger("aiter_gemm")

KIND = "GEMM_A8W8_BLOCKSCALE"
LIBTYPE = BlockscaleConfig.libtype
LIBTYPES = (LIBTYPE, torch_impl.LIBTYPE)
#: What runs a shape: one of our Triton configs, or torch's block-scaled matmul.
Choice = BlockscaleConfig | TorchBlockwise
BLOCKSCALE_UNTUNED_COLUMNS = ("M", "N", "K")
BLOCKSCALE_TUNED_COLUMNS = ("gfx", "cu_num", "M", "N", "K", "libtype", "kernelId", "splitK", "us", "kernelName",
                            "tflops", "bw", "errRatio")

_FP8_IN = (torch.float8_e4m3fn,)  # e4m3 as NVIDIA Triton runs it (tl.float8e4nv)
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Seed 002's buckets and their M bounds (None: any M).
_NAMED_BUCKETS: dict[str, int | None] = {"small_M": 256, "medium_M": 2048, "large_M": None, "any": None}
_LEQ_RE = re.compile(r"^M_LEQ_(\d+)$")
#: Parsed JSON buckets: (M bound, None for any M; bucket key; choice), smallest bound first.
Buckets = list[tuple[Optional[int], str, Choice]]


def parse_choice(name: str) -> Choice:
    """The choice a ``kernelName`` names (torch's :data:`~aiter_gemm.kernels.a8w8_blockscale_torch.NAME` or a
    Triton config name); ValueError saying what is wrong."""
    return TorchBlockwise() if name.strip() == torch_impl.NAME else BlockscaleConfig.from_name(name)


def choice_error(choice: Choice, M: int, N: int, K: int, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | None = None) -> str | None:
    """Why ``choice`` cannot run (M, N, K) -> ``dtype`` (on ``device``, for torch's: None skips the device
    check); None if it can. The rule shared by the runtime and the tuner."""
    if isinstance(choice, TorchBlockwise):
        why = torch_impl.unavailable_reason(device) if device is not None else None
        return why or torch_impl.shape_error(M, N, K, dtype)
    return config_error(choice, M, N, K)


class JSONConfigError(ValueError):
    """A per-(N, K) JSON config that cannot be used as written; names the file and the bucket key."""

    def __init__(self, path: str | os.PathLike, key: str | None, message: str) -> None:
        super().__init__(f"{path}" + (f", key {key!r}" if key else "") + f": {message}")


# ------------------------------------------------------------------------------------------------ JSON files


def json_config_path(directory: str | os.PathLike, arch: str, N: int, K: int) -> Path:
    """Seed 002's file name: ``{arch}-GEMM-A8W8_BLOCKSCALE-N={N}-K={K}.json``."""
    return Path(directory) / f"{arch}-GEMM-A8W8_BLOCKSCALE-N={N}-K={K}.json"


def _bucket_bound(path: str | os.PathLike, key: str) -> int | None:
    if key in _NAMED_BUCKETS:
        return _NAMED_BUCKETS[key]
    m = _LEQ_RE.match(key)
    if m is None or int(m.group(1)) < 1:
        raise JSONConfigError(path, key, f"unknown bucket; use M_LEQ_<n> (n >= 1) or one of {list(_NAMED_BUCKETS)}")
    return int(m.group(1))


def read_json_configs(path: str | os.PathLike) -> Buckets:
    """Buckets of a JSON file as (M bound or None for any M, key, config), smallest bound first; strict."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise JSONConfigError(path, None, f"not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise JSONConfigError(path, None, "must be a non-empty object mapping M buckets to configs")
    out = []
    bounds_seen: dict[int | None, str] = {}
    for key, entry in data.items():
        bound = _bucket_bound(path, key)
        if bound in bounds_seen:
            raise JSONConfigError(path, key, f"covers the same M range as {bounds_seen[bound]!r}")
        bounds_seen[bound] = key
        if not isinstance(entry, dict):
            raise JSONConfigError(path, key, "entry must be an object of kernel parameters")
        try:
            cfg = (TorchBlockwise.from_json(entry) if entry.get("libtype") == torch_impl.LIBTYPE
                   else BlockscaleConfig.from_json(entry))
        except (ValueError, TypeError) as exc:
            raise JSONConfigError(path, key, str(exc)) from None
        out.append((bound, key, cfg))
    out.sort(key=lambda t: (t[0] is None, t[0] or 0))
    return out


def select_bucket(buckets: Buckets, M: int) -> tuple[str, Choice] | None:
    """The entry with the smallest bound >= M (an unbounded one last); None when M exceeds every bound."""
    for bound, key, cfg in buckets:
        if bound is None or M <= bound:
            return key, cfg
    return None


def write_json_configs(path: str | os.PathLike, buckets: Mapping[str, Choice]) -> None:
    """Write ``buckets`` (bucket key -> config) atomically, smallest bound first; keys checked as when reading."""
    if not buckets:
        raise ValueError("write_json_configs: no buckets to write")
    bounds = {key: _bucket_bound(path, key) for key in buckets}
    order = sorted(buckets, key=lambda key: (bounds[key] is None, bounds[key] or 0))
    body = {key: buckets[key].to_json() for key in order}
    atomic_write_text(path, json.dumps(body, indent=4) + "\n")


def buckets_from_tuned(best: Mapping[int, Choice]) -> dict[str, Choice]:
    """JSON buckets from the best config per tuned M: ``M_LEQ_<m>`` for each tuned M (covering M above the previous
    tuned M, so the config was timed at a size at least as large) and ``any`` repeating the largest M's config."""
    if not best:
        raise ValueError("buckets_from_tuned: no tuned M")
    ms = sorted(best)
    out = {f"M_LEQ_{m}": best[m] for m in ms}
    out["any"] = best[ms[-1]]
    return out


def csv_row(device: DeviceIdentity, M: int, N: int, K: int, cfg: Choice, us: float,
            err_ratio: float = 0.0, kernel_id: int = -1) -> dict[str, object]:
    """A tuned CSV row (:data:`BLOCKSCALE_TUNED_COLUMNS`) for ``cfg`` timed at ``us`` microseconds."""
    flops = 2.0 * M * N * K
    nbytes = M * K + N * K + M * N * 2 + 4 * (M + -(-N // SCALE_BLOCK)) * -(-K // SCALE_BLOCK)
    return {
        "gfx": device.gfx, "cu_num": device.cu_num, "M": M, "N": N, "K": K, "libtype": cfg.libtype,
        "kernelId": kernel_id, "splitK": cfg.NUM_KSPLIT if cfg.NUM_KSPLIT > 1 else 0, "us": round(us, 4),
        "kernelName": cfg.name, "tflops": round(flops / us / 1e6, 2), "bw": round(nbytes / us / 1e3, 2),
        "errRatio": round(err_ratio, 6),
    }


# ------------------------------------------------------------------------------------------------ dispatch


@dataclass(frozen=True)
class BlockscaleChoice:
    """The config a shape runs and why: ``matched`` is exact / padded_gl0 / padded_gl1 / json / default."""

    config: Choice
    matched: str
    source: str  # CSV path:line, JSON path#bucket, or "default heuristic"
    row: TunedRow | None = None

    def as_config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = dict(self.row.fields) if self.row is not None else {}
        cfg.update(self.config.to_json(), kernelName=self.config.name, libtype=self.config.libtype,
                   matched=self.matched,
                   source=self.source, us=self.row.us if self.row is not None else None)
        return cfg


def _row_config(row: TunedRow) -> Choice:
    """The choice a CSV row names; ConfigError (file, line, column) when the row is malformed."""
    libtype = row.fields.get("libtype", "")
    if libtype not in LIBTYPES:
        raise ConfigError(row.source, row.line, "libtype", f"{KIND} rows must have libtype in {LIBTYPES}, got "
                          f"{libtype!r}")
    name = row.values["kernelName"]
    if libtype == torch_impl.LIBTYPE:
        if name != torch_impl.NAME:
            raise ConfigError(row.source, row.line, "kernelName",
                              f"libtype {libtype!r} rows name {torch_impl.NAME!r}, got {name!r}")
        return TorchBlockwise()
    try:
        cfg = BlockscaleConfig.from_name(name)
    except ValueError as exc:
        raise ConfigError(row.source, row.line, "kernelName", str(exc)) from None
    split = row.values["splitK"]
    if (split != cfg.NUM_KSPLIT) if cfg.NUM_KSPLIT > 1 else (split not in (0, 1)):
        raise ConfigError(row.source, row.line, "splitK",
                          f"{split} disagrees with kernelName {name!r} (NUM_KSPLIT={cfg.NUM_KSPLIT})")
    return cfg


class _BlockscaleDispatcher:
    """Per-shape decisions, rebuilt whenever :func:`aiter_gemm.get_config_table` hands out a new table."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._table: ConfigTable | None = None
        self._choices: dict[tuple[int, int, int, bool, torch.dtype], BlockscaleChoice] = {}
        self._json: dict[tuple[str, int, int], tuple[str, list] | None] = {}
        self._json_dirs: tuple[Path, ...] = ()
        self._warned: set[str] = set()

    def choose(self, M: int, N: int, K: int, on_gpu: bool, dtype: torch.dtype = torch.bfloat16) -> BlockscaleChoice:
        table = get_config_table(KIND)
        if table is not self._table:
            self._reset(table)
        key = (M, N, K, on_gpu, dtype)
        choice = self._choices.get(key)
        if choice is None:
            choice = self._choices[key] = self._decide(table, M, N, K, on_gpu, dtype)
        return choice

    def _reset(self, table: ConfigTable) -> None:
        with self._lock:
            self._table = table
            self._choices = {}
            self._json = {}
            self._warned = set()
            # A new table object means reload_configs() re-read the environment into new settings.
            self._json_dirs = tuple(Path(p) for p in get_dispatcher().settings.triton_config_dirs)

    def _warn_once(self, msg: str, *args: object) -> None:
        key = msg % args
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    def _decide(self, table: ConfigTable, M: int, N: int, K: int, on_gpu: bool,
                dtype: torch.dtype) -> BlockscaleChoice:
        dev = current_device_identity(on_gpu)
        device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        for level in MATCH_LEVELS:
            m = M if level == "exact" else get_padded_m(M, N, K, int(level[-1]))
            row = table.lookup(dev.gfx, dev.cu_num, (m, N, K))
            if row is None:
                continue
            cfg = _row_config(row)
            why = choice_error(cfg, M, N, K, dtype, device)
            if why is None:
                return BlockscaleChoice(cfg, level, f"{row.source}:{row.line}", row)
            self._warn_once("aiter_gemm: %s:%d: %s cannot run M=%d N=%d K=%d (%s); row ignored",
                            row.source, row.line, cfg.name, M, N, K, why)
        entry = self._json_entry(dev.gfx, N, K, M)
        if entry is not None:
            path, key, cfg = entry
            why = choice_error(cfg, M, N, K, dtype, device)
            if why is None:
                return BlockscaleChoice(cfg, "json", f"{path}#{key}")
            self._warn_once("aiter_gemm: %s bucket %s: %s cannot run M=%d (%s); using the default",
                            path, key, cfg.name, M, why)
        return BlockscaleChoice(default_config(M, N, K, dev.cu_num if dev.is_gpu else 132), "default",
                                "default heuristic")

    def _json_entry(self, arch: str, N: int, K: int, M: int) -> tuple[str, str, Choice] | None:
        key = (arch, N, K)
        if key not in self._json:
            found = None
            for d in self._json_dirs:
                path = json_config_path(d, arch, N, K)
                if path.is_file():
                    found = (str(path), read_json_configs(path))
                    break
            self._json[key] = found
        found = self._json[key]
        if found is None:
            return None
        hit = select_bucket(found[1], M)
        return None if hit is None else (found[0], hit[0], hit[1])


_DISPATCH = _BlockscaleDispatcher()


def get_GEMM_A8W8_BLOCKSCALE_config(M: int, N: int, K: int, on_gpu: bool | None = None,
                                    dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """The config :func:`gemm_a8w8_blockscale` runs (M, N, K) -> ``dtype`` with on this process's GPU (or CPU), as
    a dict with the kernel parameters, ``kernelName``, ``libtype``, ``matched`` (exact/padded_gl0/padded_gl1/json/
    default) and ``source``."""
    on_gpu = torch.cuda.is_available() if on_gpu is None else on_gpu
    return _DISPATCH.choose(int(M), int(N), int(K), on_gpu, dtype).as_config()


# ------------------------------------------------------------------------------------------------ the op


def _describe(name: str, t: torch.Tensor) -> str:
    return f"{name} (shape {tuple(t.shape)}, dtype {t.dtype})"


def _check_inputs(XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                  dtype: torch.dtype) -> None:
    """Raise ValueError/TypeError naming the offending tensor, its shape and dtype."""
    for name, t in (("XQ", XQ), ("WQ", WQ), ("x_scale", x_scale), ("w_scale", w_scale)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gemm_a8w8_blockscale: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"gemm_a8w8_blockscale: {_describe(name, t)} must be 2-D")
    for name, t in (("XQ", XQ), ("WQ", WQ)):
        if t.dtype not in _FP8_IN:
            raise TypeError(f"gemm_a8w8_blockscale: {_describe(name, t)} must be fp8 e4m3 (torch.float8_e4m3fn)")
    for name, t in (("x_scale", x_scale), ("w_scale", w_scale)):
        if t.dtype != torch.float32:
            raise TypeError(f"gemm_a8w8_blockscale: {_describe(name, t)} must be torch.float32")
    if dtype not in _OUT_DTYPES:
        raise TypeError(f"gemm_a8w8_blockscale: output dtype {dtype} must be one of {list(_OUT_DTYPES)}")
    M, K = XQ.shape
    N = WQ.shape[0]
    if WQ.shape[1] != K:
        raise ValueError(f"gemm_a8w8_blockscale: {_describe('WQ', WQ)} must be (N, K) with K={K} as in "
                         f"{_describe('XQ', XQ)}")
    if N < 1 or K < 1:
        raise ValueError(f"gemm_a8w8_blockscale: {_describe('WQ', WQ)} must have N >= 1 and K >= 1")
    kb, nb = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK)
    if tuple(x_scale.shape) != (M, kb):
        raise ValueError(f"gemm_a8w8_blockscale: {_describe('x_scale', x_scale)} must be (M, ceil(K/128)) = "
                         f"({M}, {kb})")
    if tuple(w_scale.shape) != (nb, kb):
        raise ValueError(f"gemm_a8w8_blockscale: {_describe('w_scale', w_scale)} must be (ceil(N/128), "
                         f"ceil(K/128)) = ({nb}, {kb})")
    dev = XQ.device
    for name, t in (("WQ", WQ), ("x_scale", x_scale), ("w_scale", w_scale)):
        if t.device != dev:
            raise ValueError(f"gemm_a8w8_blockscale: {_describe(name, t)} is on {t.device}, XQ on {dev}")


def gemm_a8w8_blockscale(
    XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16, config: Choice | str | None = None,
) -> torch.Tensor:
    """``(XQ * x_scale) @ (WQ * w_scale).T`` in ``dtype``: XQ (M, K) and WQ (N, K) fp8 e4m3, x_scale
    (M, ceil(K/128)) and w_scale (ceil(N/128), ceil(K/128)) float32; any M, N, K (N and K multiples of 128 are the
    common case; partial last blocks work). x_scale may be row-major or M-major (strides (1, M)): our Triton
    kernels take either, torch's block-scaled matmul needs M-major and copies otherwise. ``config`` (a config,
    :class:`TorchBlockwise`, or a kernelName) bypasses the dispatch, for the tuner; otherwise the tuned CSV row /
    JSON bucket / default decides."""
    _check_inputs(XQ, WQ, x_scale, w_scale, dtype)
    M, K = XQ.shape
    N = WQ.shape[0]
    if M == 0:
        return torch.empty((M, N), dtype=dtype, device=XQ.device)
    if config is None:
        cfg = _DISPATCH.choose(M, N, K, XQ.is_cuda, dtype).config
    else:
        cfg = parse_choice(config) if isinstance(config, str) else config
        why = choice_error(cfg, M, N, K, dtype, XQ.device)
        if why is not None:
            raise ValueError(f"gemm_a8w8_blockscale: config {cfg.name} cannot run M={M} N={N} K={K}: {why}")
    if isinstance(cfg, TorchBlockwise):
        return gemm_a8w8_blockscale_torch(XQ, WQ, x_scale, w_scale, dtype)
    out = torch.empty((M, N), dtype=dtype, device=XQ.device)
    return gemm_a8w8_blockscale_triton(XQ, WQ, x_scale, w_scale, cfg, out)
