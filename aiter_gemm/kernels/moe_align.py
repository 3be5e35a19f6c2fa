"""Token sorting for the fused-MoE kernels: the (token, slot) pairs of ``topk_ids`` grouped by expert, each expert's
run padded to a multiple of the GEMM's ``block_m`` so that every block of rows belongs to one expert.

One Triton program does it in one launch (decode calls it once per MoE layer, where a chain of torch ops would cost
more launches than the GEMMs it feeds), with no host sync, so it can be captured in a CUDA graph:

1. a histogram of the ids; ids outside [0, E) go to a "null" bucket E, placed after the experts;
2. each bucket padded to ``block_m``, an exclusive prefix sum gives its first slot; the total is
   ``num_tokens_post_padded``;
3. every slot gets the sentinel ``T * k``, every block its bucket (``-1`` for the null bucket and past the total);
4. after a barrier, each pair takes the next slot of its bucket with an atomic increment and writes its index there.

The order of pairs inside a bucket is whatever the atomics give: it does not change any output, since each row of a
GEMM tile is computed independently of the others. The null bucket's blocks make the GEMMs write zeros for pairs
with a bad id (so no output row is left unwritten and no weight is read out of bounds).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from aiter_gemm.triton_launch import LaunchSequence

__all__ = ["moe_align_block_size", "moe_align_block_size_ref", "padded_bound"]

# Pairs (and slots) handled per loop step of the one program: 1024 lanes over its 8 warps.
_CHUNK = 1024
# Blocks per step of the expert-id loop: a (32, buckets) comparison matrix.
_BLOCK_CHUNK = 32


def padded_bound(numel: int, num_experts: int, block_m: int) -> int:
    """Slots the sorted ids need for ``numel`` pairs at most: each non-empty bucket (at most ``min(numel, E + 1)``
    counting the null one) adds fewer than ``block_m`` padding slots. Static in the shapes: graph-capturable."""
    return numel + min(numel, num_experts + 1) * (block_m - 1)


# Sizes are not specialized on: one compiled kernel per block_m and expert count serves every token count (none
# compiles during a CUDA-graph capture at a new batch size).
@triton.jit(do_not_specialize=["numel", "num_experts", "bound", "num_blocks"])
def _moe_align_kernel(
    ids_ptr, sorted_ptr, expert_ids_ptr, num_post_ptr, cursor_ptr,
    numel, num_experts, bound, num_blocks,
    BLOCK_M: tl.constexpr, NUM_BINS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_CHUNK: tl.constexpr,
):
    bins = tl.arange(0, NUM_BINS)
    lanes = tl.arange(0, CHUNK)
    # 1. Histogram over the buckets (experts, then the null bucket for ids outside [0, E)).
    counts = tl.zeros((NUM_BINS,), dtype=tl.int32)
    for start in range(0, numel, CHUNK):
        m = start + lanes < numel
        e = tl.load(ids_ptr + start + lanes, mask=m, other=0)
        e = tl.where((e >= 0) & (e < num_experts), e, num_experts).to(tl.int32)
        counts += tl.histogram(e, NUM_BINS, mask=m)
    # 2. Padded runs and their first slots.
    padded = tl.cdiv(counts, BLOCK_M) * BLOCK_M
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    tl.store(num_post_ptr, tl.sum(padded, 0))
    tl.store(cursor_ptr + bins, starts)
    # 3. Sentinel in every slot; each block's bucket = the number of runs ending at or before its first slot.
    for start in range(0, bound, CHUNK):
        tl.store(sorted_ptr + start + lanes, numel, mask=start + lanes < bound)
    for b0 in range(0, num_blocks, BLOCK_CHUNK):
        blocks = b0 + tl.arange(0, BLOCK_CHUNK)
        first = blocks * BLOCK_M
        bucket = tl.sum((ends[None, :] <= first[:, None]).to(tl.int32), 1)
        tl.store(expert_ids_ptr + blocks, tl.where(bucket < num_experts, bucket, -1), mask=blocks < num_blocks)
    # The cursors and sentinels written by other threads must be visible before the scatter reads / overwrites them.
    tl.debug_barrier()
    # 4. Scatter: each pair takes the next free slot of its bucket.
    for start in range(0, numel, CHUNK):
        m = start + lanes < numel
        e = tl.load(ids_ptr + start + lanes, mask=m, other=0)
        e = tl.where((e >= 0) & (e < num_experts), e, num_experts).to(tl.int32)
        slot = tl.atomic_add(cursor_ptr + e, 1, mask=m)
        tl.store(sorted_ptr + slot, start + lanes, mask=m)


def moe_align_block_size(
    topk_ids: torch.Tensor, num_experts: int, block_m: int, launches: LaunchSequence | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_token_ids, expert_ids, num_tokens_post_padded) of ``topk_ids`` (T, k), one launch, no host sync.

    ``sorted_token_ids`` (:func:`padded_bound` slots, int32): flattened pair indices ``t * k + j`` grouped by
    expert in ascending expert order, each expert's run padded with the sentinel ``T * k`` to a multiple of
    ``block_m``; pairs whose id is outside [0, E) come last, in a run of their own. ``expert_ids`` (one int32 per
    ``block_m`` slots): the expert of each block, ``-1`` for the bad-id run and past the end.
    ``num_tokens_post_padded`` (1 int32): the slots in use; experts without a pair have no block. ``launches``: the
    caller's bound launches (:class:`~aiter_gemm.triton_launch.LaunchSequence`; the plan allocates the outputs)."""
    if launches is not None:
        got = launches.run(topk_ids)
        if got is not None:
            return got[0], got[1], got[2]
    if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"moe_align_block_size: topk_ids must be a 2-D int32/int64 tensor (T, k), got shape "
                         f"{tuple(topk_ids.shape)} dtype {topk_ids.dtype}")
    if block_m < 1 or num_experts < 1:
        raise ValueError(f"moe_align_block_size: block_m ({block_m}) and num_experts ({num_experts}) must be >= 1")
    ids = topk_ids.contiguous()
    numel = ids.numel()
    bound = padded_bound(numel, num_experts, block_m)
    num_blocks = triton.cdiv(bound, block_m)
    dev = ids.device
    sorted_ids = torch.empty(bound, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(num_blocks, dtype=torch.int32, device=dev)
    num_post = torch.empty(1, dtype=torch.int32, device=dev)
    num_bins = triton.next_power_of_2(num_experts + 1)
    cursor = torch.empty(num_bins, dtype=torch.int32, device=dev)
    args = {"ids_ptr": ids, "sorted_ptr": sorted_ids, "expert_ids_ptr": expert_ids, "num_post_ptr": num_post,
            "cursor_ptr": cursor, "numel": numel, "num_experts": num_experts, "bound": bound,
            "num_blocks": num_blocks}
    compiled = _moe_align_kernel[(1,)](**args, BLOCK_M=block_m, NUM_BINS=num_bins, CHUNK=_CHUNK,
                                       BLOCK_CHUNK=_BLOCK_CHUNK, num_warps=8)
    if launches is not None:
        launches.made(compiled, (1,), args, (ids,), (sorted_ids, expert_ids, num_post, cursor))
    return sorted_ids, expert_ids, num_post


def moe_align_block_size_ref(
    topk_ids: torch.Tensor, num_experts: int, block_m: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The torch reference of :func:`moe_align_block_size` (host-side; pairs in ascending order within a run)."""
    flat = topk_ids.reshape(-1).to(torch.int64).cpu()
    numel = flat.numel()
    bucket = torch.where((flat >= 0) & (flat < num_experts), flat, torch.full_like(flat, num_experts))
    bound = padded_bound(numel, num_experts, block_m)
    sorted_ids = torch.full((bound,), numel, dtype=torch.int32)
    expert_ids = torch.full((triton.cdiv(bound, block_m),), -1, dtype=torch.int32)
    slot = 0
    for e in range(num_experts + 1):
        pairs = (bucket == e).nonzero().flatten()
        if pairs.numel() == 0:
            continue
        sorted_ids[slot:slot + pairs.numel()] = pairs.to(torch.int32)
        run = triton.cdiv(pairs.numel(), block_m) * block_m
        expert_ids[slot // block_m:(slot + run) // block_m] = e if e < num_experts else -1
        slot += run
    dev = topk_ids.device
    return sorted_ids.to(dev), expert_ids.to(dev), torch.tensor([slot], dtype=torch.int32, device=dev)
