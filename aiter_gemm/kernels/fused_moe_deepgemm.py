"""Fused MoE on DeepGEMM's contiguous grouped FP8 GEMM (``m_grouped_fp8_gemm_nt_contiguous``, docs/deepgemm.md): the
``deepgemm`` backend of ``fused_moe`` (one solution, :data:`NAME`) and the ``deepgemm`` provider of ``--bench moe``
(:func:`fused_moe_deepgemm`, as a user of DeepGEMM writes MoE experts).

Per call, all on the device (no host sync, so it runs in CUDA graphs): the (token, slot) pairs sorted by expert
(:func:`~aiter_gemm.kernels.fused_moe_torch.route`), each expert's rows padded to DeepGEMM's alignment inside a buffer
of a bound the routing cannot exceed (:func:`rows_bound`; rows past the experts' are -1 padding, whose blocks
DeepGEMM's SM90 scheduler skips), the activations gathered and quantized per token and 128-wide group (M-major
scales, which DeepGEMM uses as is), GEMM1 with w1 (bf16 out), ``act(gate) * up``, quantized, GEMM2 with w2, then each
pair's row weighted and summed over its token's slots (:func:`~aiter_gemm.kernels.fused_moe_torch.combine`).

What it takes (:func:`shape_error`): bf16 activations and FP8 experts with (128, 128) block scales, ``silu`` /
``gelu``, and both GEMMs' shapes DeepGEMM's FP8 kernel takes (N a multiple of 8, K of 128:
:func:`~aiter_gemm.kernels.a8w8_blockscale_deepgemm.shape_error`), i.e. ``model_dim`` and ``inter_dim`` multiples of
128. DeepGEMM writes bf16 only, so GEMM1's output is rounded to bf16 before the activation (our kernels and the op's
reference keep it float32): :func:`fused_moe_deepgemm_ref` is the op's reference with that rounding, which it
matches as a kernel matches its reference; the op's reference it matches within :data:`MAX_REL_ERR`. DeepGEMM
compiles each kernel on its first call (its JIT, keyed on the rows bound, N, K and the expert count); :func:`warm`
makes that call ahead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch

from aiter_gemm.backends.base import MoeProblem
from aiter_gemm.kernels import a8w8_blockscale_deepgemm as dg_impl
from aiter_gemm.kernels.act_quant import per_token_group_quant_fp8
from aiter_gemm.kernels.fused_moe import fused_moe_ref, zero_inputs
from aiter_gemm.kernels.fused_moe_torch import ACTIVATIONS, Routing, combine, gated, route

__all__ = ["ALIGNMENT", "GROUPED_GEMM", "LIBTYPE", "MAX_REL_ERR", "NAME", "ContiguousLayout", "contiguous_layout",
           "fused_moe_deepgemm", "fused_moe_deepgemm_ref", "launcher", "rows_bound", "shape_error",
           "unavailable_reason", "warm"]

LIBTYPE = dg_impl.LIBTYPE
#: The backend's one solution (a tuned row's ``kernelName1`` and ``kernelName2``).
NAME = "deepgemm_m_grouped_contiguous"
GROUPED_GEMM = "m_grouped_fp8_gemm_nt_contiguous"
ALIGNMENT = "get_mk_alignment_for_contiguous_layout"
#: Relative error (Frobenius norm) against ``fused_moe_ref`` it stays within: GEMM1's output rounded to bf16 before
#: the activation (the reference keeps float32) moves a value across an FP8 rounding boundary of the requantized
#: intermediate now and then, a whole FP8 step (~1.5% on unit inputs).
MAX_REL_ERR = 5e-2
_OUT = torch.bfloat16  # what DeepGEMM's grouped GEMMs write


def unavailable_reason(device: torch.device | None = None) -> str | None:
    """Why DeepGEMM's grouped GEMMs cannot run here (None if they can): no usable ``deep_gemm`` or GPU
    (:func:`~aiter_gemm.kernels.a8w8_blockscale_deepgemm.unavailable_reason`), or a ``deep_gemm`` without the
    contiguous grouped GEMM or its alignment."""
    why = dg_impl.unavailable_reason(device)  # looked up per call: tests replace it
    if why is not None:
        return why
    dg = dg_impl.module()
    missing = [n for n in (GROUPED_GEMM, ALIGNMENT) if not callable(getattr(dg, n, None))]
    if missing:
        return f"deep_gemm {getattr(dg, '__version__', '?')} has no {', '.join(missing)}"
    return None


def shape_error(p: MoeProblem) -> str | None:
    """Why the grouped GEMMs do not run ``p`` whatever the machine (module docstring); None if they do."""
    if not p.fp8:
        return f"DeepGEMM's grouped GEMMs take FP8 experts with 128x128 block scales, not {p.q_dtype_w} ({p.q_type})"
    if p.dtype != _OUT:
        return f"activations {p.dtype}: DeepGEMM's grouped GEMMs write {_OUT} only"
    if p.activation not in ACTIVATIONS:
        return f"activation {p.activation!r} is not one of {sorted(ACTIVATIONS)}"
    for gemm, (n, k) in (("GEMM1", (2 * p.inter_dim, p.model_dim)), ("GEMM2", (p.model_dim, p.inter_dim))):
        why = dg_impl.shape_error(max(p.token * p.topk, 1), n, k, _OUT)
        if why is not None:
            return f"{gemm}: {why}"
    return None


def rows_bound(pairs: int, experts: int, align: int) -> int:
    """The most rows any routing of ``pairs`` (token, slot) pairs over ``experts`` needs, each expert's run padded to
    a multiple of ``align``: ``align * (pairs // align + min(experts, pairs))``."""
    return align * (pairs // align + min(experts, pairs))


class ContiguousLayout(NamedTuple):
    """DeepGEMM's M-grouped contiguous layout of a routing: ``rows`` (M,) the token each row reads (0 on padding
    rows), ``groups`` (M,) int32 its expert (-1 on padding rows), ``pair_rows`` (T*k,) the row of each pair in sorted
    order (0 for an id outside [0, E)) and the ``routing`` it came from."""

    rows: torch.Tensor
    groups: torch.Tensor
    pair_rows: torch.Tensor
    routing: Routing


def contiguous_layout(topk_ids: torch.Tensor, experts: int, align: int) -> ContiguousLayout:
    """The pairs of ``topk_ids`` (T, k) sorted by expert, each expert's run of rows starting at a multiple of
    ``align``, in :func:`rows_bound` rows, on the device (no host sync)."""
    T, k = topk_ids.shape
    pairs = T * k
    m = rows_bound(pairs, experts, align)
    r = route(topk_ids, experts)
    counts = r.counts[:experts]
    padded = (counts + align - 1) // align * align
    pad_start = padded.cumsum(0) - padded
    raw_start = r.offs.long() - counts
    valid = r.valid.reshape(-1)[r.order]
    e = torch.where(valid, topk_ids.reshape(-1).long()[r.order], 0)
    sorted_pos = torch.arange(pairs, device=topk_ids.device)
    dest = torch.where(valid, pad_start[e] + sorted_pos - raw_start[e], m)  # invalid ids: the dropped row m
    rows = torch.zeros(m + 1, dtype=torch.long, device=topk_ids.device).scatter_(0, dest, r.order // k)
    groups = torch.full((m + 1,), -1, dtype=torch.int32, device=topk_ids.device).scatter_(0, dest, e.int())
    return ContiguousLayout(rows[:m], groups[:m], torch.where(valid, dest, 0), r)


def _experts(gemm: Callable, align: int, hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale,
             activation: str) -> torch.Tensor:
    lay = contiguous_layout(topk_ids, w1.shape[0], align)
    m = lay.groups.numel()
    xq, xs = per_token_group_quant_fp8(hidden_states.index_select(0, lay.rows), m_major=True)
    h = torch.empty((m, w1.shape[1]), dtype=_OUT, device=hidden_states.device)
    gemm((xq, xs), (w1, w1_scale), h, lay.groups)
    aq, as_ = per_token_group_quant_fp8(gated(h, activation), m_major=True)
    y = torch.empty((m, w2.shape[1]), dtype=_OUT, device=hidden_states.device)
    gemm((aq, as_), (w2, w2_scale), y, lay.groups)
    return combine(y.index_select(0, lay.pair_rows), lay.routing, topk_weight, hidden_states.dtype)


def fused_moe_deepgemm(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weight: torch.Tensor,
                       topk_ids: torch.Tensor, w1_scale: torch.Tensor, w2_scale: torch.Tensor,
                       activation: str = "silu") -> torch.Tensor:
    """``fused_moe`` of FP8 experts (w1 (E, 2I, H), w2 (E, H, I), 128x128 block scales) by two DeepGEMM contiguous
    grouped GEMMs and torch ops, as a user calls it: ``deep_gemm`` and its alignment looked up per call; out (T, H)
    in hidden_states' dtype."""
    dg = dg_impl.module()
    return _experts(getattr(dg, GROUPED_GEMM), getattr(dg, ALIGNMENT)(), hidden_states, w1, w2, topk_weight,
                    topk_ids, w1_scale, w2_scale, activation)


def launcher(p: MoeProblem) -> Callable[..., torch.Tensor]:
    """The runner ``run(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale) -> out (T, H)`` of ``p``
    (what the backend's ``prepare`` returns): the shape checked and the grouped GEMM and its alignment looked up
    once; ValueError naming what DeepGEMM does not take."""
    why = shape_error(p)
    if why is not None:
        raise ValueError(f"fused_moe ({NAME}): {why}")
    dg = dg_impl.module()
    gemm, align, act = getattr(dg, GROUPED_GEMM), getattr(dg, ALIGNMENT)(), p.activation

    def run(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale=None, w2_scale=None):
        return _experts(gemm, align, hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale, act)

    return run


def warm(problems: Iterable[MoeProblem], device: torch.device | None = None) -> dict[MoeProblem, str]:
    """Run each problem once on zero experts, so DeepGEMM's JIT compiles (or loads from its disk cache) the kernels
    its calls run before any is timed or served; one run per (rows bound, H, I, E), what the kernels are chosen by.
    Returns the problems that failed, with why."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    failed: dict[MoeProblem, str] = {}
    done: set[tuple[int, ...]] = set()
    for p in dict.fromkeys(problems):
        try:
            T, H, inter, E, k = p.token, p.model_dim, p.inter_dim, p.expert, p.topk
            key = (rows_bound(T * k, E, getattr(dg_impl.module(), ALIGNMENT)()), H, inter, E)
            if key in done:
                continue
            run = launcher(p)
            done.add(key)
            run(*zero_inputs(T, H, inter, E, k, p.dtype, True, device))
        except Exception as exc:  # noqa: BLE001 - a shape DeepGEMM cannot build is a failed job, not a crash
            failed[p] = f"{type(exc).__name__}: {exc}"
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return failed


def fused_moe_deepgemm_ref(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weight: torch.Tensor,
                           topk_ids: torch.Tensor, w1_scale: torch.Tensor, w2_scale: torch.Tensor,
                           activation: str = "silu") -> torch.Tensor:
    """The float32 reference of DeepGEMM's arithmetic: :func:`~aiter_gemm.kernels.fused_moe.fused_moe_ref` with
    GEMM1's output rounded to bf16 before the activation (what the runner must return, within bf16 rounding)."""
    return fused_moe_ref(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale=w1_scale, w2_scale=w2_scale,
                         activation=activation, gemm1_dtype=_OUT)
