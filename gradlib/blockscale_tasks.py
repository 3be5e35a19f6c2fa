"""Worker side of the A8W8 block-scale tuner: the ``a8w8_blockscale`` job kind run by gradlib's executors.

The block-scale tuner (:mod:`gradlib.tune_a8w8_blockscale`) reuses the bf16 tuner's crash-isolated process pool
(and any other :class:`~gradlib.pool.Executor`) unchanged: it passes this module as a worker plugin, and importing
it registers :data:`BLOCKSCALE` with :func:`gradlib.tasks.register_job_kind`. A task of that kind has
``problem = GemmProblem(M, N, K, dtype=float8_e4m3fn, otype=<output dtype>)`` and, as items, candidate names: a
:class:`~aiter_gemm.kernels.a8w8_blockscale.BlockscaleConfig` ``kernelName``, torch's block-scaled matmul
(``scaled_mm_blockwise``, :mod:`aiter_gemm.kernels.a8w8_blockscale_torch`), or a name registered with
:func:`register_launcher` (another implementation to compare with, or a faulty one in tests). Each item is checked
against the float32 dequantized reference (``err_ratio`` of :mod:`gradlib.accuracy`) and timed by
:func:`gradlib.timing.time_runner` over rotating input sets larger than twice the last-level cache. The task option
``x_scale_layout`` (:data:`X_SCALE_LAYOUTS`) says how x_scale is laid out in memory, as the model's quantizer writes
it: ``row_major`` (the default; torch's candidate then pays a transposing copy per call, timed) or ``m_major``
(strides (1, M), what vLLM's ``column_major_scales`` and DeepGEMM use, and what torch's block-scaled matmul needs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from aiter_gemm.blockscale import TorchBlockwise, choice_error, parse_choice
from aiter_gemm.kernels.a8w8_blockscale import (
    SCALE_BLOCK,
    dequantize_blockscale,
    gemm_a8w8_blockscale_triton,
    quantize_blockscale,
)
from aiter_gemm.kernels.a8w8_blockscale_torch import gemm_a8w8_blockscale_torch
from gradlib.accuracy import err_ratio, tolerance_for
from gradlib.tasks import ItemResult, Task, WorkerRuntime, register_job_kind
from gradlib.timing import rotating_sets, time_runner

BLOCKSCALE = "a8w8_blockscale"
FP8 = torch.float8_e4m3fn
X_SCALE_LAYOUTS = ("m_major", "row_major")

#: ``launcher(XQ, WQ, x_scale, w_scale, out) -> out``: runs one candidate into the preallocated ``out``.
Launcher = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

#: Candidates that are neither Triton configs nor torch's, by name (timed when named, never written as tuned rows).
EXTRA_LAUNCHERS: dict[str, Launcher] = {}


def register_launcher(name: str, launcher: Launcher) -> None:
    """Register a non-config candidate under ``name`` (which must not parse as a kernelName)."""
    if is_config_name(name):
        raise ValueError(f"launcher name {name!r} would shadow a Triton config name")
    EXTRA_LAUNCHERS[name] = launcher


def is_config_name(name: str) -> bool:
    """Whether ``name`` is a kernelName a tuned row may hold (a Triton config's, or torch's)."""
    try:
        parse_choice(name)
    except ValueError:
        return False
    return True


def check_candidate(name: str, M: int, N: int, K: int, otype: torch.dtype = torch.bfloat16,
                    device: torch.device | None = None) -> str | None:
    """Why candidate ``name`` cannot be timed on (M, N, K) -> ``otype`` (unknown name, config that cannot run it;
    torch's unavailable on ``device`` when given); None if it can."""
    if name in EXTRA_LAUNCHERS:
        return None
    try:
        choice = parse_choice(name)
    except ValueError as exc:
        return f"not a registered launcher nor a kernelName: {exc}"
    return choice_error(choice, M, N, K, otype, device)


def launcher_for(name: str, M: int, N: int, K: int, otype: torch.dtype = torch.bfloat16,
                 device: torch.device | None = None) -> Launcher:
    """The launcher of candidate ``name``; ValueError saying why it cannot run (M, N, K)."""
    fn = EXTRA_LAUNCHERS.get(name)
    if fn is not None:
        return fn
    why = check_candidate(name, M, N, K, otype, device)
    if why is not None:
        raise ValueError(f"{name} cannot run M={M} N={N} K={K}: {why}")
    cfg = parse_choice(name)
    if isinstance(cfg, TorchBlockwise):
        # Returns a new tensor (no out= in F.scaled_mm): the per-call layout work is timed as the runtime pays it.
        return lambda XQ, WQ, x_scale, w_scale, out: gemm_a8w8_blockscale_torch(XQ, WQ, x_scale, w_scale, out.dtype)

    def launch(XQ, WQ, x_scale, w_scale, out):
        return gemm_a8w8_blockscale_triton(XQ, WQ, x_scale, w_scale, cfg, out)

    return launch


@dataclass
class _Inputs:
    """One shape's rotating sets of (XQ, WQ, x_scale, w_scale, out) and set 0's float32 reference."""

    key: tuple
    sets: list[tuple[torch.Tensor, ...]]
    ref: torch.Tensor


_CACHE: dict[str, _Inputs] = {}  # one shape at a time per worker process


def make_inputs(M: int, N: int, K: int, otype: torch.dtype, seed: int, device: torch.device,
                cache: int, x_scale_layout: str = "row_major") -> _Inputs:
    """Quantized inputs whose exact product is about unit scale (x ~ N(0, 1), w ~ N(0, 1/K), amax scaling per
    (1, 128) group and (128, 128) block as the data format prescribes), x_scale in ``x_scale_layout``, cached while
    the shape is the same."""
    if x_scale_layout not in X_SCALE_LAYOUTS:
        raise ValueError(f"x_scale_layout {x_scale_layout!r} is not one of {X_SCALE_LAYOUTS}")
    key = (M, N, K, otype, seed, str(device), x_scale_layout)
    held = _CACHE.get("current")
    if held is not None and held.key == key:
        return held
    _CACHE.clear()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, K, generator=gen, device=device)
    w = torch.randn(N, K, generator=gen, device=device).mul_(K ** -0.5)
    XQ, WQ, xs, ws = quantize_blockscale(x, w, FP8)
    del x, w
    if x_scale_layout == "m_major":
        xs = xs.t().contiguous().t()
    xd, wd = dequantize_blockscale(XQ, WQ, xs, ws)
    ref = xd @ wd.t()  # float32 (the worker turned TF32 off)
    del xd, wd
    kb, nb = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK)
    per_set = M * K + N * K + 4 * (M * kb + nb * kb) + M * N * torch.empty((), dtype=otype).element_size()
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    n = rotating_sets(per_set, cache, free)
    sets = [(XQ, WQ, xs, ws, torch.empty(M, N, dtype=otype, device=device))]
    for _ in range(n - 1):
        sets.append((XQ.clone(), WQ.clone(), xs.clone(memory_format=torch.preserve_format), ws.clone(),
                     torch.empty(M, N, dtype=otype, device=device)))
    held = _CACHE["current"] = _Inputs(key, sets, ref)
    return held


def run_blockscale_item(rt: WorkerRuntime, task: Task, index: int) -> ItemResult:
    """Check item ``index`` (a candidate name) against the reference, then time it; exceptions are the caller's
    (:meth:`WorkerRuntime.run_item` turns them into failed results and restarts a poisoned worker)."""
    name = task.items[index]
    p = task.problem
    launch = launcher_for(name, p.M, p.N, p.K, p.otype, rt.device)
    data = make_inputs(p.M, p.N, p.K, p.otype, task.seed, rt.device, rt.cache,
                       str(dict(task.options).get("x_scale_layout", "row_major")))
    err = math.nan
    if task.check:
        XQ, WQ, xs, ws, out = data.sets[0]
        out.fill_(float("nan"))  # a candidate that writes nothing must not inherit an earlier candidate's output
        got = launch(XQ, WQ, xs, ws, out)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (p.M, p.N) or got.dtype != p.otype:
            desc = f"{tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor) else type(got).__name__
            return ItemResult.failed(task, index, f"returned {desc}, expected ({p.M}, {p.N}) {p.otype}")
        err = err_ratio(got, data.ref, tolerance_for(FP8, p.otype))
        if err > task.max_err:
            return ItemResult(task.task_id, index, False, err_ratio=err,
                              error=f"err_ratio {err:.4f} > {task.max_err} (not timed)")
    sets = data.sets

    def call(i: int) -> object:
        return launch(*sets[i])

    t = time_runner(call, len(sets), rt.device, task.timing)
    if not (t.us > 0) or math.isinf(t.us):
        return ItemResult.failed(task, index, f"timing gave {t.us} us")
    return ItemResult(task.task_id, index, True, us=t.us, err_ratio=err, method=f"{t.method}x{t.n_sets}")


register_job_kind(BLOCKSCALE, run_blockscale_item)

__all__ = ["BLOCKSCALE", "EXTRA_LAUNCHERS", "X_SCALE_LAYOUTS", "Launcher", "check_candidate", "is_config_name",
           "launcher_for", "make_inputs", "register_launcher", "run_blockscale_item"]
