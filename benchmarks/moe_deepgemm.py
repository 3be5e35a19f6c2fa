"""Fused MoE on DeepGEMM's contiguous grouped FP8 GEMM (``m_grouped_fp8_gemm_nt_contiguous``, docs/deepgemm.md), as a
user of DeepGEMM writes MoE experts: the ``deepgemm`` provider of ``--bench moe`` (FP8 experts only), a baseline
beside ``fused_moe`` and transformers' grouped_mm, not a backend of the op.

Per call, all on the device (no host sync, so it runs in CUDA graphs): the (token, slot) pairs sorted by expert
(:func:`~aiter_gemm.kernels.fused_moe_torch.route`), each expert's rows padded to DeepGEMM's alignment inside a buffer
of a bound the routing cannot exceed (``align * (T*k // align + min(E, T*k))`` rows; rows past the experts' are -1
padding, whose blocks DeepGEMM's SM90 scheduler skips), the activations gathered and quantized per token and 128-wide
group (M-major scales, which DeepGEMM uses as is), GEMM1 with w1, ``act(gate) * up``, quantized, GEMM2 with w2, then
each pair's row weighted and summed over its token's slots (:func:`~aiter_gemm.kernels.fused_moe_torch.combine`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from aiter_gemm.backends.base import MoeProblem
from aiter_gemm.kernels import a8w8_blockscale_deepgemm as dg_impl
from aiter_gemm.kernels.act_quant import per_token_group_quant_fp8
from aiter_gemm.kernels.fused_moe_torch import ACTIVATIONS, Routing, combine, gated, route

__all__ = ["ALIGNMENT", "GROUPED_GEMM", "ContiguousLayout", "contiguous_layout", "fused_moe_deepgemm",
           "unavailable_reason"]

GROUPED_GEMM = "m_grouped_fp8_gemm_nt_contiguous"
ALIGNMENT = "get_mk_alignment_for_contiguous_layout"


def unavailable_reason(p: MoeProblem, device: torch.device | None = None) -> str | None:
    """Why DeepGEMM's grouped GEMMs cannot run ``p`` here (None if they can): bf16 experts (DeepGEMM's grouped GEMMs
    take FP8 with 128x128 block scales), no usable ``deep_gemm`` (:func:`~aiter_gemm.kernels.a8w8_blockscale_deepgemm.
    unavailable_reason`) or one without the contiguous grouped GEMM, or a GEMM shape its kernel does not take."""
    if not p.fp8:
        return f"DeepGEMM's grouped GEMMs take FP8 experts with 128x128 block scales, not {p.q_dtype_w} ({p.q_type})"
    if p.activation not in ACTIVATIONS:
        return f"activation {p.activation!r} is not one of {sorted(ACTIVATIONS)}"
    why = dg_impl.unavailable_reason(device)
    if why is not None:
        return why
    dg = dg_impl.module()
    missing = [n for n in (GROUPED_GEMM, ALIGNMENT) if not callable(getattr(dg, n, None))]
    if missing:
        return f"deep_gemm {getattr(dg, '__version__', '?')} has no {', '.join(missing)}"
    for gemm, (n, k) in (("GEMM1", (2 * p.inter_dim, p.model_dim)), ("GEMM2", (p.model_dim, p.inter_dim))):
        why = dg_impl.shape_error(max(p.token, 1), n, k, p.dtype)
        if why is not None:
            return f"{gemm}: {why}"
    return None


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
    ``align``, in ``align * (T*k // align + min(E, T*k))`` rows (the most any routing needs), on the device."""
    T, k = topk_ids.shape
    pairs = T * k
    m = align * (pairs // align + min(experts, pairs))
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


def fused_moe_deepgemm(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weight: torch.Tensor,
                       topk_ids: torch.Tensor, w1_scale: torch.Tensor, w2_scale: torch.Tensor,
                       activation: str = "silu") -> torch.Tensor:
    """``fused_moe`` of FP8 experts (w1 (E, 2I, H), w2 (E, H, I), 128x128 block scales) by two DeepGEMM contiguous
    grouped GEMMs and torch ops (module docstring); out (T, H) in hidden_states' dtype."""
    dg = dg_impl.module()
    gemm = getattr(dg, GROUPED_GEMM)
    lay = contiguous_layout(topk_ids, w1.shape[0], getattr(dg, ALIGNMENT)())
    m = lay.groups.numel()
    xq, xs = per_token_group_quant_fp8(hidden_states.index_select(0, lay.rows), m_major=True)
    h = torch.empty((m, w1.shape[1]), dtype=torch.bfloat16, device=hidden_states.device)
    gemm((xq, xs), (w1, w1_scale), h, lay.groups)
    aq, as_ = per_token_group_quant_fp8(gated(h, activation), m_major=True)
    y = torch.empty((m, w2.shape[1]), dtype=torch.bfloat16, device=hidden_states.device)
    gemm((aq, as_), (w2, w2_scale), y, lay.groups)
    return combine(y.index_select(0, lay.pair_rows), lay.routing, topk_weight, hidden_states.dtype)
