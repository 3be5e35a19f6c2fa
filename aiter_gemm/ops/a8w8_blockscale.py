"""The ``gemm_a8w8_blockscale`` op: fp8 GEMM with DeepSeek-style block scales, on the generic dispatcher.

This module is the op's :class:`~aiter_gemm.opspec.OpSpec` (:data:`GEMM_A8W8_BLOCKSCALE`), its file formats and its
public entry points; the implementations are its backends in :mod:`aiter_gemm.backends.a8w8_blockscale`
(``triton``: our kernels; ``torch``: torch's block-scaled ``F.scaled_mm``; ``tilelang``; ``deepgemm``: DeepGEMM's
``fp8_gemm_nt`` where ``deep_gemm`` is installed). Which one runs a shape (M, N, K) is decided once per shape, in
the dispatcher's order (docs/design.md):

1. a row of the ``GEMM_A8W8_BLOCKSCALE`` table (``AITER_CONFIG_GEMM_A8W8_BLOCKSCALE``, default the shipped
   ``configs/a8w8_blockscale_tuned_gemm.csv``) keyed ``gfx, cu_num, M, N, K``, exact M first, then M padded as AITER
   pads it (granularity levels 0 and 1). Columns (AITER's a8w8-blockscale CSV plus ``gfx`` and ``libtype``):
   ``gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName,tflops,bw,errRatio``. ``libtype`` ``triton``: our
   kernel, ``kernelName`` is :attr:`BlockscaleConfig.name` (e.g. ``splitK_swapAB-BM16_BN128_BK128_GM1_SK4_W4_S3``,
   then optionally ``_NS2``, ``_TMA``, ``_WS``) and ``splitK`` must equal its split count (0 or 1 when unsplit);
   ``libtype`` ``torch``: ``kernelName`` ``scaled_mm_blockwise``; ``libtype`` ``deepgemm`` (DeepGEMM, optional):
   ``deepgemm_fp8_gemm_nt``. ``kernelId`` is the candidate's index in the tuner's listing (informational). A
   malformed row (its :class:`ConfigError` names file, line and column) and a well-formed choice that cannot run
   the shape here (torch's or DeepGEMM's where this machine lacks it) are misses (warned once).
2. the per-device JSON ``{arch}-GEMM-A8W8_BLOCKSCALE-N={N}-K={K}.json``, searched in the folders of
   ``AITER_GEMM_TRITON_CONFIGS`` (colon-separated) and then the shipped ``configs/triton/``. Its keys are M buckets
   (:mod:`aiter_gemm.jsonconfigs`: ``M_LEQ_<n>``, ``small_M`` / ``medium_M`` / ``large_M`` = M <= 256 / 2048 / any,
   ``any``), each mapped to a config object that the backend its ``libtype`` names parses (none: ``triton``,
   :meth:`BlockscaleConfig.to_json`; ``{"libtype": "torch", "kernelName": "scaled_mm_blockwise"}`` or its
   ``deepgemm`` twin; a ``tilelang`` :meth:`TileLangConfig.to_json`). The tuner writes one ``M_LEQ_<m>`` per tuned M
   plus ``any`` for the largest (:func:`buckets_from_tuned`): the best variant changes between M = 16 (swapAB,
   split-K) and M = 256 (base) and again above 1024 (larger tiles).
   Below those, SGLang's TileLang files (``AITER_GEMM_SGLANG_TILELANG_DIR``, this device's name; nearest M as
   SGLang picks it: :mod:`aiter_gemm.sglang_tilelang`), whose entries run on the ``tilelang`` backend.
3. the default: the highest-priority backend whose ``default_for`` claims the shape
   (:func:`~aiter_gemm.kernels.a8w8_blockscale.default_config` of the Triton backend).

Files are read at first use and again after :func:`aiter_gemm.reload_configs`; the per-call path does one dict
lookup.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from aiter_gemm import sglang_tilelang
from aiter_gemm.backends.a8w8_blockscale import solution_of
from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.configs import EXTRA_TUNED_COLUMNS, ConfigError, TunedRow
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.dispatch import dispatcher_for
from aiter_gemm.dtypes import OUT_DTYPES
from aiter_gemm.jsonconfigs import NAMED_BUCKETS, JSONConfigError, JsonLevel, select_bucket, write_buckets
from aiter_gemm.kernels import a8w8_blockscale_deepgemm as deepgemm_impl
from aiter_gemm.kernels import a8w8_blockscale_tilelang as tilelang_impl
from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl
from aiter_gemm.kernels.a8w8_blockscale import (
    BlockscaleConfig,
    config_space,
    dequantize_blockscale,
    quantize_blockscale,
)
from aiter_gemm.kernels.a8w8_blockscale_deepgemm import DeepGemmFP8
from aiter_gemm.kernels.a8w8_blockscale_tilelang import TileLangConfig
from aiter_gemm.kernels.a8w8_blockscale_torch import TorchBlockwise
from aiter_gemm.kernels.blockscale_format import FP8, SCALE_BLOCK
from aiter_gemm.op_entry import BYPASS, EXT, VALUE, Arg, Decided, OpEntry
from aiter_gemm.opspec import OpSpec
from aiter_gemm.registry import register_op
from aiter_gemm.testbed import Inputs, cloned_sets, free_memory
from aiter_gemm.timing import rotating_sets

__all__ = [
    "BLOCKSCALE_TUNED_COLUMNS", "BLOCKSCALE_UNTUNED_COLUMNS", "GEMM_A8W8_BLOCKSCALE", "KIND", "LIBTYPE", "LIBTYPES",
    "UNTUNED_FILE", "X_SCALE_LAYOUTS",
    "Choice", "DeepGemmFP8", "JSONConfigError", "TorchBlockwise", "buckets_from_tuned", "choice_error", "choice_of",
    "config_space",
    "call_runner", "csv_row", "gemm_a8w8_blockscale", "get_GEMM_A8W8_BLOCKSCALE_config", "json_config_path",
    "make_inputs", "parse_choice", "read_json_configs", "select_bucket", "solution_of", "write_json_configs",
    "x_scale_m_major",
]

KIND = "GEMM_A8W8_BLOCKSCALE"
LIBTYPE = BlockscaleConfig.libtype
LIBTYPES = (LIBTYPE, torch_impl.LIBTYPE, TileLangConfig.libtype, deepgemm_impl.LIBTYPE)
#: What runs a shape: one of our Triton configs, torch's block-scaled matmul, one of our TileLang configs, or DeepGEMM.
Choice = BlockscaleConfig | TorchBlockwise | TileLangConfig | DeepGemmFP8
BLOCKSCALE_UNTUNED_COLUMNS = ("M", "N", "K")
#: AITER's untuned shape list of this op; captured shapes (``AITER_TUNE_GEMM=1``) go to this name in the folder of
#: ``AITER_UNTUNED_GEMM_FILE`` (default: the working directory).
UNTUNED_FILE = "a8w8_blockscale_untuned_gemm.csv"
BLOCKSCALE_TUNED_COLUMNS = ("gfx", "cu_num", "M", "N", "K", "libtype", "kernelId", "splitK", "us", "kernelName",
                            "tflops", "bw", "errRatio", *EXTRA_TUNED_COLUMNS)


# ------------------------------------------------------------------------------------------------ choices


#: libtype -> the choice class whose ``from_name`` parses its kernelNames (rows are checked against it).
CHOICES: dict[str, type] = {LIBTYPE: BlockscaleConfig, torch_impl.LIBTYPE: TorchBlockwise,
                            TileLangConfig.libtype: TileLangConfig, deepgemm_impl.LIBTYPE: DeepGemmFP8}
#: The parameterless choices, by their one kernelName.
NAMED_CHOICES: dict[str, type] = {torch_impl.NAME: TorchBlockwise, deepgemm_impl.NAME: DeepGemmFP8}


def parse_choice(name: str) -> Choice:
    """The choice a ``kernelName`` names (torch's :data:`~aiter_gemm.kernels.a8w8_blockscale_torch.NAME` or
    DeepGEMM's :data:`~aiter_gemm.kernels.a8w8_blockscale_deepgemm.NAME`, a TileLang config name
    ``<type>-BM.._BN.._BK.._S.._T.._SK..``, or a Triton config name ``<variant>-BM.._BN.._BK.._GM..``: the two
    grammars differ after ``BK``); ValueError saying what is wrong."""
    named = NAMED_CHOICES.get(name.strip())
    if named is not None:
        return named()
    return (TileLangConfig if tilelang_impl.is_config_name(name) else BlockscaleConfig).from_name(name)


def choice_of(solution: Solution) -> Choice:
    """The choice a solution names; ValueError if its kernelName does not parse."""
    return parse_choice(solution.kernelName)


def choice_error(choice: Choice, M: int, N: int, K: int, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | None = None) -> str | None:
    """Why ``choice`` cannot run (M, N, K) -> ``dtype`` on ``device``; None if it can. Its backend's rule, asked
    through the dispatcher (:meth:`~aiter_gemm.dispatch.Dispatcher.why_not`) for callers holding a choice rather
    than a solution: with ``device``, that machine's (the backend's availability and ``why_not`` on this
    process's GPU or CPU identity); ``device`` None leaves the machine out (``shape_why_not`` on the reference arch:
    how the tuner checks a candidate or a shipped config)."""
    ident = None if device is None else _DISPATCHER.device(device.type == "cuda")
    return _DISPATCHER.why_not(GemmProblem(M, N, K, False, FP8, dtype), solution_of(choice), ident)


def _row_solution(row: TunedRow) -> Solution:
    """The solution a CSV row names; ConfigError (file, line, column) when the row is malformed: block-scale rows
    must name one of the op's implementations, a parseable kernelName, and the split count it encodes."""
    libtype = row.fields.get("libtype", "")
    if libtype not in LIBTYPES:
        raise ConfigError(row.source, row.line, "libtype", f"{KIND} rows must have libtype in {LIBTYPES}, got "
                          f"{libtype!r}")
    name = row.values["kernelName"]
    try:
        cfg = CHOICES[libtype].from_name(name)
    except ValueError as exc:
        raise ConfigError(row.source, row.line, "kernelName", str(exc)) from None
    split = row.values["splitK"]
    if (split != cfg.NUM_KSPLIT) if cfg.NUM_KSPLIT > 1 else (split not in (0, 1)):
        raise ConfigError(row.source, row.line, "splitK",
                          f"{split} disagrees with kernelName {name!r} (NUM_KSPLIT={cfg.NUM_KSPLIT})")
    return Solution(libtype, row.values["kernelId"], split, name)


#: How :func:`make_inputs` lays x_scale out (option ``x_scale_layout``), as a model's quantizer writes it:
#: ``row_major`` (the default) or ``m_major`` (strides (1, M): :func:`x_scale_m_major`).
X_SCALE_LAYOUTS = ("m_major", "row_major")


def make_inputs(p: GemmProblem, seed: int, device: torch.device, cache: int, options: Mapping[str, Any]) -> Inputs:
    """x ~ N(0, 1), w ~ N(0, 1/K) quantized per (1, 128) group of x and (128, 128) block of w, so the exact product
    is about unit scale; x_scale laid out as ``options["x_scale_layout"]`` says (:data:`X_SCALE_LAYOUTS`); as many
    copies as span twice the last-level cache; each set is (XQ, WQ, x_scale, w_scale)."""
    layout = str(options.get("x_scale_layout", "row_major"))
    if layout not in X_SCALE_LAYOUTS:
        raise ValueError(f"x_scale_layout {layout!r} is not one of {X_SCALE_LAYOUTS}")
    M, N, K = p.M, p.N, p.K
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, K, generator=gen, device=device)
    w = torch.randn(N, K, generator=gen, device=device).mul_(K ** -0.5)
    XQ, WQ, xs, ws = quantize_blockscale(x, w, FP8)
    del x, w
    if layout == "m_major":
        xs = xs.t().contiguous().t()
    xd, wd = dequantize_blockscale(XQ, WQ, xs, ws)
    ref = xd @ wd.t()  # float32 (the tuner's worker turns TF32 off)
    del xd, wd
    kb, nb = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK)
    per_set = M * K + N * K + 4 * (M * kb + nb * kb) + M * N * torch.empty((), dtype=p.otype).element_size()
    return Inputs((), cloned_sets((XQ, WQ, xs, ws), rotating_sets(per_set, cache, free_memory(device))), ref)


def call_runner(runner, inputs: tuple, p: GemmProblem) -> torch.Tensor:
    """``runner`` on one set of :func:`make_inputs`."""
    XQ, WQ, xs, ws = inputs
    return runner(XQ, WQ, xs, ws, p.otype)


GEMM_A8W8_BLOCKSCALE = register_op(OpSpec(
    name="gemm_a8w8_blockscale", kind=KIND, backends="aiter_gemm.backends.a8w8_blockscale",
    row_key=lambda p: (p.M, p.N, p.K), row_solution=_row_solution,
    untuned_columns=BLOCKSCALE_UNTUNED_COLUMNS,
    capture_path=lambda s: str(Path(s.untuned_file).parent / UNTUNED_FILE),
    # Its JSON files are a decision level (entries naming no libtype are Triton configs); SGLang's TileLang files
    # (this device's name) a family below its own.
    json=JsonLevel("GEMM-A8W8_BLOCKSCALE", LIBTYPE, NAMED_BUCKETS, more=(sglang_tilelang.FILES,)),
    source_with_line=True,
    key_problem=lambda key: GemmProblem(*key, False, FP8, torch.bfloat16),
    make_inputs=make_inputs, call_runner=call_runner,
))


# ------------------------------------------------------------------------------------------------ JSON files


def json_config_path(directory: str | os.PathLike, arch: str, N: int, K: int) -> Path:
    """The JSON file of (N, K) on ``arch``: ``{arch}-GEMM-A8W8_BLOCKSCALE-N={N}-K={K}.json``."""
    return Path(directory) / f"{arch}-{GEMM_A8W8_BLOCKSCALE.json.family}-N={N}-K={K}.json"


def read_json_configs(path: str | os.PathLike) -> list[tuple[int | None, str, Choice]]:
    """Buckets of a JSON file as (M bound or None for any M, key, choice), smallest bound first; strict."""
    return [(bound, key, sol and choice_of(sol))
            for bound, key, sol in GEMM_A8W8_BLOCKSCALE.json.read_own(path, _DISPATCHER.backend)]


def write_json_configs(path: str | os.PathLike, buckets: Mapping[str, Choice | None]) -> None:
    """Write ``buckets`` (bucket key -> choice, None for a ``"default"`` bucket) atomically, smallest bound first;
    keys checked as when reading."""
    write_buckets(path, buckets, lambda choice: choice.to_json(), NAMED_BUCKETS)


def buckets_from_tuned(best: Mapping[int, Choice],
                       pad_m_min: Mapping[int, int | None] | None = None) -> dict[str, Choice | None]:
    """JSON buckets from the best config per tuned M: ``M_LEQ_<m>`` for each tuned M (covering M above the previous
    tuned M, so the config was timed at a size at least as large) and ``any`` repeating the largest M's config.
    ``pad_m_min[m]``: the smallest M row m was confirmed for (its CSV ``pad_m_min``); below it, down to the previous
    tuned M, a ``"default"`` bucket ``M_LEQ_<pad_m_min - 1>`` leaves those M to the runtime's default, as the
    padded lookup does (held-out H100 run: the M = 256 row of (10240, 8192), confirmed from 129, ran M = 100 at
    0.81x torch's block-scaled matmul through its bucket)."""
    if not best:
        raise ValueError("buckets_from_tuned: no tuned M")
    ms = sorted(best)
    out: dict[str, Choice | None] = {}
    prev = 0
    for m in ms:
        low = (pad_m_min or {}).get(m)
        if low is not None and prev + 1 < low <= m:
            out[f"M_LEQ_{low - 1}"] = None
        out[f"M_LEQ_{m}"] = best[m]
        prev = m
    out["any"] = best[ms[-1]]
    return out


def csv_row(device: DeviceIdentity, M: int, N: int, K: int, cfg: Choice, us: float,
            err_ratio: float = 0.0, kernel_id: int = -1, pad_m_min: int | None = None,
            timing: str | None = None) -> dict[str, object]:
    """A tuned CSV row (:data:`BLOCKSCALE_TUNED_COLUMNS`) for ``cfg`` timed at ``us`` microseconds (``pad_m_min``:
    the smallest M the row was checked for through padding; ``timing``: graph or eager)."""
    flops = 2.0 * M * N * K
    nbytes = M * K + N * K + M * N * 2 + 4 * (M + -(-N // SCALE_BLOCK)) * -(-K // SCALE_BLOCK)
    return {
        **GEMM_A8W8_BLOCKSCALE.key_row(device, GEMM_A8W8_BLOCKSCALE.key_problem((M, N, K))), "libtype": cfg.libtype,
        "kernelId": kernel_id, "splitK": cfg.NUM_KSPLIT if cfg.NUM_KSPLIT > 1 else 0, "us": round(us, 4),
        "kernelName": cfg.name, "tflops": round(flops / us / 1e6, 2), "bw": round(nbytes / us / 1e3, 2),
        "errRatio": round(err_ratio, 6), "pad_m_min": "" if pad_m_min is None else pad_m_min,
        "timing": timing or "", "device_name": device.device_name,
    }


# ------------------------------------------------------------------------------------------------ the op

_DISPATCHER = dispatcher_for(GEMM_A8W8_BLOCKSCALE)
EAGER_EXT = EXT  # the C++ eager extension (aiter_gemm.op_entry.EXT), or None
#: x_scale_m_major's answers per shape, cleared with the op's decisions on reload.
_LAYOUTS = _DISPATCHER.cache.derived("x_scale_m_major")


def get_GEMM_A8W8_BLOCKSCALE_config(M: int, N: int, K: int, on_gpu: bool | None = None,
                                    dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """The config :func:`gemm_a8w8_blockscale` runs (M, N, K) -> ``dtype`` with on this process's GPU (or CPU), as
    a dict with the kernel parameters, ``kernelName``, ``libtype``, ``matched`` (exact/padded_gl0/padded_gl1/json/
    default) and ``source``."""
    on_gpu = torch.cuda.is_available() if on_gpu is None else on_gpu
    return _DISPATCHER.decide(GemmProblem(int(M), int(N), int(K), False, FP8, dtype), on_gpu).as_config()


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
        if t.dtype != FP8:
            raise TypeError(f"gemm_a8w8_blockscale: {_describe(name, t)} must be fp8 e4m3 (torch.float8_e4m3fn)")
    for name, t in (("x_scale", x_scale), ("w_scale", w_scale)):
        if t.dtype != torch.float32:
            raise TypeError(f"gemm_a8w8_blockscale: {_describe(name, t)} must be torch.float32")
    if dtype not in OUT_DTYPES:
        raise TypeError(f"gemm_a8w8_blockscale: output dtype {dtype} must be one of {list(OUT_DTYPES)}")
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


def _with_config(XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                 dtype: torch.dtype, config: Choice | str) -> torch.Tensor:
    """A call with ``config``: that choice, bypassing the dispatch (the tuner); ValueError when it cannot run."""
    _check_inputs(XQ, WQ, x_scale, w_scale, dtype)
    M, K = XQ.shape
    N = WQ.shape[0]
    if M == 0:
        return torch.empty((M, N), dtype=dtype, device=XQ.device)
    choice = parse_choice(config) if isinstance(config, str) else config
    runner, why = _DISPATCHER.runner_for(GemmProblem(M, N, K, False, FP8, dtype), solution_of(choice),
                                         _DISPATCHER.device(XQ.is_cuda))
    if runner is None:
        raise ValueError(f"gemm_a8w8_blockscale: config {choice.name} cannot run M={M} N={N} K={K} on "
                         f"{XQ.device}: {why}")
    return runner(XQ, WQ, x_scale, w_scale, dtype)


def _decide(XQ, WQ, x_scale, w_scale, dtype: torch.dtype = torch.bfloat16, config=None) -> Decided:
    """Validate a key's first call (errors name the tensor) and decide it: the runner, which the C++ entry calls
    too (its eager plan: the runners are bound per shape, cheap to call)."""
    _check_inputs(XQ, WQ, x_scale, w_scale, dtype)
    M, K = XQ.shape
    N = WQ.shape[0]
    if M == 0:
        return Decided(_empty_runner)
    dec = _DISPATCHER.decide(GemmProblem(M, N, K, False, FP8, dtype), XQ.is_cuda)
    plan = dec.eager_plan()
    return Decided(dec.call_runner, plan.eager, plan.probe)


def _empty_runner(XQ, WQ, x_scale, w_scale, dtype):
    return torch.empty((0, WQ.shape[0]), dtype=dtype, device=XQ.device)


def x_scale_m_major(M: int, N: int, K: int, dtype: torch.dtype, on_gpu: bool) -> bool:
    """Whether the call (M, N, K) -> ``dtype`` on this process's GPU (``on_gpu``) or CPU runs a backend that takes
    x_scale M-major (strides (1, M)): the layout an activation quantizer should write so the runner copies nothing.
    torch's block-scaled matmul wants M-major (else one transposing copy per call: a launch, ~5 us of host time on
    the H100 host); our Triton and TileLang kernels were tuned on row-major. Follows the decision's eager plan
    (eager calls of a Triton decision run torch's), decided once per shape under the op's cache, cleared by
    ``reload_configs``."""
    key = (M, N, K, dtype, on_gpu)
    entry = _LAYOUTS.get(key)
    if entry is None:
        entry = _LAYOUTS[key] = _layout_entry(M, N, K, dtype, on_gpu)
    eager, graph, capturing = entry
    return graph if capturing is not None and capturing() else eager


def _layout_entry(M: int, N: int, K: int, dtype: torch.dtype, on_gpu: bool) -> tuple:
    """(eager layout, capture-time layout, probe or None) of a shape's decision (:meth:`Decision.eager_plan`)."""
    if M < 1 or N < 1 or K < 1:
        return False, False, None
    dec = _DISPATCHER.decide(GemmProblem(M, N, K, False, FP8, dtype), on_gpu)
    graph = _DISPATCHER.backend(dec.solution.libtype).x_scale_m_major
    plan = dec.eager_plan()
    if plan.probe is None:
        return graph, graph, None
    return _DISPATCHER.backend(dec.eager_solution.libtype).x_scale_m_major, graph, plan.probe


#: The op's eager entry (:mod:`aiter_gemm.op_entry`): the key holds every property :func:`_check_inputs` looks at
#: (the four operands' shapes, dtypes and devices, and the output dtype), so a call hits the cache only with
#: operands a validated call had; the C++ entry serves every decision (the runner of its eager plan). Calls with
#: ``config`` bypass the cache.
GEMM_A8W8_BLOCKSCALE_ENTRY = OpEntry(
    "gemm_a8w8_blockscale",
    (Arg("XQ"), Arg("WQ"), Arg("x_scale"), Arg("w_scale"), Arg("dtype", VALUE, torch.bfloat16),
     Arg("config", BYPASS, None)),
    _DISPATCHER.cache, _decide, module=__name__, bypass=_with_config,
    doc="""``(XQ * x_scale) @ (WQ * w_scale).T`` in ``dtype``: XQ (M, K) and WQ (N, K) fp8 e4m3, x_scale
    (M, ceil(K/128)) and w_scale (ceil(N/128), ceil(K/128)) float32; any M, N, K (N and K multiples of 128 are the
    common case; partial last blocks work). x_scale may be row-major or M-major (strides (1, M)): our Triton
    kernels take either, torch's block-scaled matmul needs M-major and copies otherwise. ``config`` (a config,
    :class:`TorchBlockwise`, or a kernelName) bypasses the dispatch, for the tuner; otherwise the tuned CSV row /
    JSON bucket / default decides, once per key (:data:`GEMM_A8W8_BLOCKSCALE_ENTRY`). No gradient: an operand
    requiring grad gets none (docs/fp8_models.md).""")
gemm_a8w8_blockscale_python = GEMM_A8W8_BLOCKSCALE_ENTRY.python
gemm_a8w8_blockscale = GEMM_A8W8_BLOCKSCALE_ENTRY.entry
#: The op's per-call key of a call's arguments (:attr:`aiter_gemm.op_entry.OpEntry.key`).
call_key = GEMM_A8W8_BLOCKSCALE_ENTRY.key
