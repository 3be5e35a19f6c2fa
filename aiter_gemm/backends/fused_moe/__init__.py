"""Backends of the ``fused_moe`` op (:mod:`aiter_gemm.ops.fused_moe`): ``torch`` (``torch._grouped_mm`` or a loop
over the experts: :mod:`aiter_gemm.kernels.fused_moe_torch`), ``triton`` (our fused-MoE kernels) and ``deepgemm``
(FP8 experts on DeepGEMM's contiguous grouped GEMMs, where ``deep_gemm`` is installed: :mod:`aiter_gemm.kernels.
fused_moe_deepgemm`).

Same contract as every op's backends (:class:`aiter_gemm.backends.base.Backend`), on a
:class:`~aiter_gemm.backends.base.MoeProblem`; the runner signature is ``run(hidden_states, w1, w2, topk_weight,
topk_ids, w1_scale, w2_scale) -> out (T, H)`` (the activation is the problem's). A solution names the kernels of
both stages (AITER's ``kernelName1`` and ``kernelName2``) in one ``kernelName``: :func:`pair_name`.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiter_gemm.backends.base import QUANT_BLOCK, QUANT_NONE, MoeProblem
from aiter_gemm.dtypes import HALF_DTYPES
from aiter_gemm.kernels.blockscale_format import FP8

__all__ = ["PAIR", "pair_name", "problem_error", "stage_names"]

#: Between the two stages' kernel names in a solution's ``kernelName`` (no kernel name holds it).
PAIR = ";"


def pair_name(name1: str, name2: str) -> str:
    """The ``kernelName`` of a solution running ``name1`` then ``name2``: one name when both stages are the same."""
    return name1 if name2 in ("", name1) else f"{name1}{PAIR}{name2}"


def stage_names(kernel_name: str) -> tuple[str, str]:
    """(stage 1's kernel, stage 2's kernel) of a solution's ``kernelName`` (:func:`pair_name`'s inverse)."""
    first, _, second = kernel_name.partition(PAIR)
    return first.strip(), (second or first).strip()


def problem_error(p: object, libtype: str, activations: Iterable[str], runs: str) -> str | None:
    """Why backend ``libtype`` (whose kernels ``runs`` names in messages) cannot run ``p`` whatever its configs: the
    layouts every backend of the op takes (gate and up fused in w1, the routing weight in the second GEMM, bf16/fp16
    activations, experts unquantized in their dtype or FP8 with (128, 128) block scales) and ``activations``."""
    if not isinstance(p, MoeProblem):
        return f"libtype {libtype!r} of fused_moe runs MoE problems, not {p!r}"
    if p.activation not in activations:
        return f"act_type {p.act_type!r}: {runs} run {sorted(activations)}"
    if p.dtype not in HALF_DTYPES or not p.use_g1u1 or p.doweight_stage1:
        return (f"dtype {p.dtype}, use_g1u1 {p.use_g1u1}, doweight_stage1 {p.doweight_stage1}: {runs} run bf16/fp16 "
                "with gate and up fused and the weight applied in the second GEMM")
    quant = {QUANT_NONE: (p.dtype, p.dtype), QUANT_BLOCK: (FP8, FP8)}.get(p.q_type)
    if quant != (p.q_dtype_a, p.q_dtype_w):
        return (f"q_type {p.q_type} with q_dtype_a {p.q_dtype_a}, q_dtype_w {p.q_dtype_w}: {runs} run {QUANT_NONE} in "
                f"the activations' dtype or {QUANT_BLOCK} with {FP8}")
    return None
