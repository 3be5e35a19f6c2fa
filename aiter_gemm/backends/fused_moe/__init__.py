"""Backends of the ``fused_moe`` op (:mod:`aiter_gemm.ops.fused_moe`): ``torch`` (``torch._grouped_mm`` or a loop
over the experts: :mod:`aiter_gemm.kernels.fused_moe_torch`) and ``triton`` (our fused-MoE kernels).

Same contract as every op's backends (:class:`aiter_gemm.backends.base.Backend`), on a
:class:`~aiter_gemm.backends.base.MoeProblem`; the runner signature is ``run(hidden_states, w1, w2, topk_weight,
topk_ids, w1_scale, w2_scale) -> out (T, H)`` (the activation is the problem's). A solution names the kernels of
both stages (AITER's ``kernelName1`` and ``kernelName2``) in one ``kernelName``: :func:`pair_name`.
"""

from __future__ import annotations

__all__ = ["PAIR", "pair_name", "stage_names"]

#: Between the two stages' kernel names in a solution's ``kernelName`` (no kernel name holds it).
PAIR = ";"


def pair_name(name1: str, name2: str) -> str:
    """The ``kernelName`` of a solution running ``name1`` then ``name2``: one name when both stages are the same."""
    return name1 if name2 in ("", name1) else f"{name1}{PAIR}{name2}"


def stage_names(kernel_name: str) -> tuple[str, str]:
    """(stage 1's kernel, stage 2's kernel) of a solution's ``kernelName`` (:func:`pair_name`'s inverse)."""
    first, _, second = kernel_name.partition(PAIR)
    return first.strip(), (second or first).strip()
