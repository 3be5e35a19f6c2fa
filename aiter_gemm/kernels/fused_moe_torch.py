"""``fused_moe`` on torch ops: the safe default of :func:`aiter_gemm.fused_moe` and the ``torch`` backend's two
solutions.

Both sort the (token, slot) pairs by expert on the device (a stable argsort; an id outside [0, E) sorts last and
contributes nothing, so nothing is read out of bounds) and combine the slots of each token with their routing
weights in a fixed order (no atomics: the result does not depend on the run):

- :data:`GROUPED`: ``torch._grouped_mm`` over the sorted rows with the per-expert offsets, for both GEMMs. No host
  sync, so it runs in CUDA graphs; bf16 only, every stride 16-byte aligned (H and I multiples of 8), on CUDA GPUs of
  sm_90 and up (torch's CUTLASS kernels) and on CPU where this torch has its fallback (:func:`grouped_mm_error`).
- :data:`LOOP`: one GEMM per expert that got tokens (experts with none cost nothing), bf16/fp16 with ``@``, FP8
  through the ``fp8_gemm`` the backend hands in (the project's block-scaled matmul) on activations quantized per
  token and 128-wide group. The per-expert counts are read on the host (one sync); while a CUDA graph is being
  captured it runs every expert over all tokens instead (no sync, E times the work: correct in a graph, never fast).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from aiter_gemm import cudagraph
from aiter_gemm.backends.base import MoeProblem
from aiter_gemm.kernels.act_quant import per_token_group_quant_fp8, per_token_group_quant_fp8_ref
from aiter_gemm.kernels.common import INTERPRET

__all__ = ["ACTIVATIONS", "GROUPED", "LIBTYPE", "LOOP", "NAMES", "Routing", "combine", "gated", "grouped_mm_error",
           "launcher", "route"]

LIBTYPE = "torch"
GROUPED = "grouped_mm"
LOOP = "loop"
NAMES = (GROUPED, LOOP)
#: The activations of the gate half (``act(gate) * up``), by the name ``fused_moe`` takes.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"silu": F.silu, "gelu": F.gelu}
#: ``fp8_gemm(XQ, WQ, x_scale, w_scale, dtype) -> (M, N)``: a block-scaled matmul (the FP8 loop's GEMMs).
Fp8Gemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]
_cpu_grouped: list[str | None] = []


def grouped_mm_error(kind: str, capability: tuple[int, int] | None, p: MoeProblem) -> str | None:
    """Why ``torch._grouped_mm`` cannot run ``p`` on a device of ``kind`` (``cuda``, ``hip``, ``cpu``; a CUDA GPU's
    ``capability``); None if it can."""
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm"
    if p.fp8 or p.dtype != torch.bfloat16:
        return f"torch._grouped_mm takes bf16 experts, not {p.q_dtype_w} ({p.q_type})"
    if p.model_dim % 8 or p.inter_dim % 8:
        return (f"torch._grouped_mm needs 16-byte aligned strides: model_dim {p.model_dim} and inter_dim "
                f"{p.inter_dim} must be multiples of 8")
    if kind == "cpu":
        return _cpu_grouped_error()
    if kind != "cuda" or capability is None or capability < (9, 0):
        return f"torch._grouped_mm runs on CUDA GPUs of sm_90 and up, not {kind} {capability}"
    return None


def _cpu_grouped_error() -> str | None:
    """Whether this torch runs ``torch._grouped_mm`` on CPU tensors (a fallback of recent versions), tried once."""
    if not _cpu_grouped:
        a, b = torch.zeros(2, 8, dtype=torch.bfloat16), torch.zeros(1, 8, 8, dtype=torch.bfloat16)
        try:
            torch._grouped_mm(a, b.transpose(1, 2), offs=torch.tensor([2], dtype=torch.int32))
            _cpu_grouped.append(None)
        except (RuntimeError, NotImplementedError) as exc:
            _cpu_grouped.append(f"torch {torch.__version__} has no CPU torch._grouped_mm ({str(exc)[:80]})")
    return _cpu_grouped[0]


class Routing(NamedTuple):
    """The (token, slot) pairs sorted by expert: ``order`` (sorted position -> pair), ``inverse`` (pair -> sorted
    position), ``counts`` (E + 1: pairs per expert, then the invalid ids'), ``offs`` (int32 end of each expert's
    rows) and ``valid`` ((T, k): the id is in [0, E))."""

    order: torch.Tensor
    inverse: torch.Tensor
    counts: torch.Tensor
    offs: torch.Tensor
    valid: torch.Tensor


def route(topk_ids: torch.Tensor, experts: int) -> Routing:
    """Sort the pairs of ``topk_ids`` (T, k) by expert, stably, on the device (no host sync)."""
    flat = topk_ids.reshape(-1).long()
    valid = (flat >= 0) & (flat < experts)
    ids = torch.where(valid, flat, experts)
    order = torch.argsort(ids, stable=True)
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    counts = torch.zeros(experts + 1, dtype=torch.long, device=flat.device).scatter_add_(0, ids, torch.ones_like(ids))
    return Routing(order, inverse, counts, counts[:experts].cumsum(0).to(torch.int32), valid.view(topk_ids.shape))


def gated(h: torch.Tensor, activation: str) -> torch.Tensor:
    """``act(gate) * up`` of h (rows, 2I) = [gate | up], in float32, cast back to h's dtype."""
    inter = h.shape[1] // 2
    return (ACTIVATIONS[activation](h[:, :inter].float()) * h[:, inter:].float()).to(h.dtype)


def combine(y_sorted: torch.Tensor, r: Routing, topk_weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """out (T, H) = sum over slots of weight x the slot's row, in float32 (rows of invalid ids count as 0)."""
    T, k = r.valid.shape
    y = y_sorted.index_select(0, r.inverse).view(T, k, -1).float()
    w = topk_weight.float()[..., None]
    return torch.where(r.valid[..., None], y * w, 0.0).sum(dim=1).to(dtype)


def _quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations per token and 128-wide group: the one-launch Triton quantizer where Triton runs, else torch's."""
    return per_token_group_quant_fp8(x) if x.is_cuda or INTERPRET else per_token_group_quant_fp8_ref(x)


def launcher(p: MoeProblem, name: str, fp8_gemm: Fp8Gemm | None = None) -> Callable[..., torch.Tensor]:
    """A runner ``run(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale) -> out (T, H)`` of solution
    ``name`` bound to ``p``'s activation and dtype (``fp8_gemm``: the block-scaled matmul of FP8 experts)."""
    act, dtype, experts = p.activation, p.dtype, p.expert
    if name == GROUPED:
        def run_grouped(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale=None, w2_scale=None):
            r = route(topk_ids, experts)
            x = hidden_states.index_select(0, r.order // topk_ids.shape[1])
            h = torch._grouped_mm(x, w1.transpose(1, 2), offs=r.offs)
            y = torch._grouped_mm(gated(h, act).contiguous(), w2.transpose(1, 2), offs=r.offs)
            return combine(y, r, topk_weight, dtype)

        return run_grouped
    if p.fp8 and fp8_gemm is None:
        raise ValueError("fused_moe: the loop of FP8 experts needs a block-scaled matmul (fp8_gemm)")
    capturing = cudagraph.probe()

    def expert(e: int, x: torch.Tensor, w1, w2, w1_scale, w2_scale) -> torch.Tensor:
        if not p.fp8:
            return gated(x @ w1[e].t(), act) @ w2[e].t()
        xq, xs = _quant(x)
        a = gated(fp8_gemm(xq, w1[e], xs, w1_scale[e], torch.float32), act).to(dtype)  # act on float32, as fused
        aq, as_ = _quant(a)
        return fp8_gemm(aq, w2[e], as_, w2_scale[e], dtype)

    def run_loop(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale=None, w2_scale=None):
        T, k = topk_ids.shape
        if hidden_states.is_cuda and capturing():
            return _dense(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale)
        r = route(topk_ids, experts)
        x = hidden_states.index_select(0, r.order // k)
        y = torch.zeros((T * k, w2.shape[1]), dtype=dtype, device=hidden_states.device)
        start = 0
        for e, n in enumerate(r.counts[:experts].tolist()):  # the host sync: which experts got tokens
            if n:
                y[start:start + n] = expert(e, x[start:start + n], w1, w2, w1_scale, w2_scale)
                start += n
        return combine(y, r, topk_weight, dtype)

    def _dense(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale):
        """Every expert over every token, weighted by the token's total weight on it (0 for most): no host sync."""
        T = hidden_states.shape[0]
        ids = topk_ids.long()
        valid = (ids >= 0) & (ids < experts)
        weight = torch.zeros((T, experts + 1), dtype=torch.float32, device=hidden_states.device)
        weight.scatter_add_(1, torch.where(valid, ids, experts), torch.where(valid, topk_weight.float(), 0.0))
        out = torch.zeros((T, w2.shape[1]), dtype=torch.float32, device=hidden_states.device)
        for e in range(experts):
            out += weight[:, e:e + 1] * expert(e, hidden_states, w1, w2, w1_scale, w2_scale).float()
        return out.to(dtype)

    return run_loop
