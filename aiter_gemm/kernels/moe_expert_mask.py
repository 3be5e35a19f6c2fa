"""AITER's ``expert_mask`` of ``fused_moe`` (expert parallelism): a 0/1 mask over the global experts, 1 for those
this rank holds. ``w1``/``w2`` hold the local experts in global order (as many as the mask's ones), ``topk_ids``
name global experts, and a pair routed to an expert whose mask is 0 contributes nothing (AITER's ``moe_sorting``
takes a local expert's slot as the prefix count of the mask; vLLM passes its 0/1 mask with a trailing sentinel
expert, always 0).

Here the global ids become local ones before the backends run (:func:`local_expert_ids`: a few small device ops,
no host sync, graph-capturable), masked-out pairs becoming -1, an id every backend gives no weight (as it does an id
outside [0, E)).
"""

from __future__ import annotations

import torch

from aiter_gemm.kernels.common import describe_tensor

__all__ = ["MASK_DTYPES", "check_mask_tensor", "check_masked_ids", "local_expert_ids"]

#: The mask's dtypes: AITER's int32, or bool, int64, uint8.
MASK_DTYPES = (torch.int32, torch.int64, torch.uint8, torch.bool)


def check_mask_tensor(expert_mask: object, device: torch.device) -> None:
    """ValueError naming ``expert_mask`` unless it is a 1-D mask tensor on ``device`` (no host sync: its values are
    checked per call by :func:`check_masked_ids`)."""
    if not isinstance(expert_mask, torch.Tensor):
        raise ValueError(f"fused_moe: expert_mask must be a tensor or None, got {type(expert_mask).__name__}")
    if expert_mask.dim() != 1 or expert_mask.numel() == 0 or expert_mask.dtype not in MASK_DTYPES:
        raise ValueError(f"fused_moe: {describe_tensor('expert_mask', expert_mask)} must be a 1-D 0/1 mask over "
                         f"the global experts, one of {[str(d) for d in MASK_DTYPES]} (AITER's order: expert_mask is "
                         "the 6th argument; pass w1_scale= and w2_scale= by name)")
    if expert_mask.device != device:
        raise ValueError(f"fused_moe: {describe_tensor('expert_mask', expert_mask)} is not on hidden_states' device "
                         f"{device}")


def check_masked_ids(topk_ids: torch.Tensor, experts: int, expert_mask: torch.Tensor) -> None:
    """ValueError naming the tensor when ``expert_mask`` holds a value other than 0 and 1, marks other than
    ``experts`` local experts (w1's), or ``topk_ids`` names an expert outside the mask: one host sync (skipped in
    CUDA-graph capture, where such pairs get no weight instead)."""
    mask = expert_mask.to(torch.int64)
    stats = [mask.min(), mask.max(), mask.count_nonzero()]
    if topk_ids.numel():
        stats += list(torch.aminmax(topk_ids.to(torch.int64)))
    lo_mask, hi_mask, local, *ids = torch.stack(stats).tolist()
    if lo_mask < 0 or hi_mask > 1:
        raise ValueError(f"fused_moe: {describe_tensor('expert_mask', expert_mask)} holds values in [{lo_mask}, "
                         f"{hi_mask}]; it must be 0 or 1 per global expert")
    if local != experts:
        raise ValueError(f"fused_moe: {describe_tensor('expert_mask', expert_mask)} marks {local} local experts, "
                         f"but w1 and w2 hold {experts}")
    if ids and (ids[0] < 0 or ids[1] >= expert_mask.numel()):
        raise ValueError(f"fused_moe: {describe_tensor('topk_ids', topk_ids)} holds expert ids in [{ids[0]}, "
                         f"{ids[1]}], outside [0, {expert_mask.numel()}) (expert_mask's global experts)")


def local_expert_ids(topk_ids: torch.Tensor, expert_mask: torch.Tensor) -> torch.Tensor:
    """``topk_ids`` (global) as local expert ids, ``topk_ids``' shape and dtype: the count of local experts before
    each id's, -1 where its mask is 0 or the id is outside the mask (unchecked only under graph capture)."""
    local = expert_mask != 0
    ranks = local.cumsum(0, dtype=topk_ids.dtype) - 1
    table = torch.cat([torch.where(local, ranks, -1), ranks.new_full((1,), -1)])  # the last: ids outside the mask
    g = expert_mask.numel()
    ids = torch.where((topk_ids >= 0) & (topk_ids < g), topk_ids, g)
    return table[ids]
