"""Fused mixture-of-experts in Triton: ``out[t] = sum_j w[t, j] * W2[e] @ (act(W1g[e] @ x[t]) * (W1u[e] @ x[t]))``
with ``e = topk_ids[t, j]``, in AITER's layouts (``w1`` (E, 2I, H): gate rows then up rows; ``w2`` (E, H, I)).

How it runs (as vLLM's and SGLang's Triton fused MoE do, with the activation fused into the first GEMM):

1. :func:`~aiter_gemm.kernels.moe_align.moe_align_block_size` sorts the T * k (token, slot) pairs by expert and pads
   each expert's run to ``block_m`` rows, so each block of rows is one expert's grouped GEMM tile.
2. GEMM1: each program loads one block of tokens, and the gate and up weight tiles of the same ``block_n`` columns
   of its expert, keeps two float32 accumulators and writes ``act(gate) * up`` to the (T * k, I) intermediate.
3. GEMM2: the same kernel over ``w2``, multiplying each row by its routing weight in the epilogue and writing row
   ``t * k + j`` of a (T, k, H) buffer that ``sum(dim=1)`` reduces (deterministic: each pair's row is written by one
   program; for k = 1 straight into ``out``).

``split_k > 1`` (small T, where M x N tiles cannot fill the GPU) cuts the K loop across programs that add their
float32 partials with atomics into a zeroed float32 buffer (summation order not fixed: results may differ in the last
float32 bit between runs): GEMM2 then adds its k contributions into one (T, H) buffer; GEMM1 adds raw gate / up sums
and a small kernel applies the activation. Blocks past ``num_tokens_post_padded`` exit at once, so experts without a
token cost one early-exiting program per tile; nothing here syncs with the host (CUDA-graph capturable).

FP8 (``w1``/``w2`` float8_e4m3fn with (128, 128) block scales): the activations of both GEMMs are quantized per token
and 128-wide K group (:func:`~aiter_gemm.kernels.act_quant.per_token_group_quant_fp8`), and each K block's product is
scaled by its activation and weight scales before it is accumulated, as :mod:`~aiter_gemm.kernels.a8w8_blockscale`
does; ``block_k`` divides 128 so one K block has one scale, and a ``block_n`` dividing 128 one weight scale per K
block (a scalar: no per-column scale tile in registers).

The configs (:mod:`~aiter_gemm.kernels.fused_moe_config`) may name variants that save launches: ``QA`` (the
quantizations done in the GEMMs' activation loads), ``DIRECT`` (no sorting: one block per pair) and ``KSUM`` (the
k-sum in GEMM2). At T = 1 on FP8 experts all three make the call two launches instead of six; ``FUSED``
(:mod:`~aiter_gemm.kernels.fused_moe_fused`) makes it one, after a memset. ``SWAP`` computes each tile transposed
(weights @ rows^T, the scales along the swapped axes) so that the weight rows, not a block's few rows, fill the MMA's
M side (on Hopper: wgmma, which needs M >= 64, instead of mma.sync), and transposes the accumulator for the epilogue.

Under ``TRITON_INTERPRET=1`` the dot operands are upcast to float32 (the interpreter mis-computes 8/16-bit dots) and
``QA`` rounds to e4m3 in float32 arithmetic (the interpreter's cast is wrong).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from aiter_gemm.dtypes import HALF_DTYPES
from aiter_gemm.kernels.a8w8_blockscale import dequantize_weight_blockscale
from aiter_gemm.kernels.act_quant import (
    FP8_MAX_TL,
    MIN_SCALE_TL,
    per_token_group_quant_fp8,
    per_token_group_quant_fp8_ref,
    quant_rows,
)
from aiter_gemm.kernels.blockscale_format import FP8, SCALE_BLOCK
from aiter_gemm.kernels.common import INTERPRET, describe_tensor, gate_activation, tile_coords
from aiter_gemm.kernels.fused_moe_config import (
    MoeConfig,
    config_error,
    config_space,
    default_config,
    pair_error,
    usage_error,
)
from aiter_gemm.kernels.fused_moe_fused import launch_fused
from aiter_gemm.kernels.moe_align import moe_align_block_size
from aiter_gemm.kernels.moe_expert_mask import check_mask_tensor, check_masked_ids
from aiter_gemm.triton_launch import LaunchSequence

__all__ = ["ACTIVATIONS", "MoeConfig", "check_moe_inputs", "config_error", "config_space", "default_config",
           "fused_moe_ref", "fused_moe_triton", "is_capturing", "k_splits", "moe_align_block_size", "pair_error",
           "uses_ksum", "zero_inputs"]

#: The activations of the gate: SiLU, and GELU in torch's default (erf) form.
ACTIVATIONS = ("silu", "gelu")
# KSUM counters GEMM1's programs clear per store (their count per program is a runtime argument).
ZERO_CHUNK = tl.constexpr(32)


# ----------------------------------------------------------------------------------------------------- kernels


@triton.jit(do_not_specialize=["N", "K", "num_pairs", "num_experts", "k_blocks_per_split", "num_m_blocks",
                             "num_zero", "zero_per_program"])
def _fused_moe_kernel(
    a_ptr, b_ptr, c_ptr, a_scale_ptr, b_scale_ptr, topk_weight_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr, counter_ptr, out_ptr,
    N, K, num_pairs, num_experts, k_blocks_per_split, num_m_blocks, num_zero, zero_per_program,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn, stride_om,
    stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
    A_ROW_DIV: tl.constexpr,  # pair -> row of a: k for GEMM1 (a = tokens), 1 for GEMM2 (a = pairs)
    C_ROW_DIV: tl.constexpr,  # pair -> row of c: k where GEMM2's split-K adds into a (T, H) buffer, else 1
    GATED: tl.constexpr,  # GEMM1: b rows [n] (gate) and [N + n] (up), two accumulators
    ACTIVATION: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    FP8: tl.constexpr,
    QUANT_A: tl.constexpr,  # FP8: a is bf16/fp16, quantized here per row and K block (BLOCK_K = SCALE_GROUP)
    DIRECT: tl.constexpr,  # block pid_m is pair pid_m alone; expert_ids_ptr is topk_ids (no sorting)
    SWAP: tl.constexpr,  # tiles computed transposed: weight rows on the MMA's M side, the block's pairs on its N side
    KSUM: tl.constexpr,  # GEMM2 into per-pair rows c: the last of a token's TOPK arrivals sums them into out
    TOPK: tl.constexpr,
    ZERO: tl.constexpr,  # each program first zeroes zero_per_program of counter_ptr's num_zero (for KSUM)
    SCALE_GROUP: tl.constexpr,  # rows and K of one weight scale block, K of one activation scale group
    B_SCALAR: tl.constexpr,  # FP8: each b tile lies in one scale block (one scale per K block, not per column)
    SPLIT_K: tl.constexpr,  # > 1: atomically add float32 partials (raw gate / up sums when GATED) into c
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no mask on the last K block
    UPCAST: tl.constexpr,
):
    """One (block of sorted pairs) x (BLOCK_N columns) tile over one K split of one expert's grouped GEMM.

    a (rows, K) are the activations (tokens or pairs), b (E, N or 2N, K) the experts' weights with K contiguous, c
    the output rows (pair or token) x N. The tile's pairs come from ``sorted_ids`` (sentinel ``num_pairs`` for
    padding); its expert from ``expert_ids`` (-1: pairs with a bad id, whose rows get zeros)."""
    pid_m, pid_n = tile_coords(tl.program_id(0), num_m_blocks, tl.cdiv(N, BLOCK_N), GROUP_M)
    pid_k = tl.program_id(1)
    if ZERO:  # GEMM1 clears GEMM2's KSUM counters (GEMM2 runs after it on the stream)
        if pid_k == 0:  # a runtime count in fixed chunks: the token count compiles no new kernel
            first = tl.program_id(0) * zero_per_program
            for z in range(0, zero_per_program, ZERO_CHUNK):
                offs_z = z + tl.arange(0, ZERO_CHUNK)
                tl.store(counter_ptr + first + offs_z, tl.zeros((ZERO_CHUNK,), dtype=tl.int32),
                         mask=(offs_z < zero_per_program) & (first + offs_z < num_zero))
    if DIRECT:
        pair = tl.where(tl.arange(0, BLOCK_M) == 0, pid_m, num_pairs).to(tl.int64)
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    else:
        if pid_m * BLOCK_M >= tl.load(num_post_ptr):
            return
        pair = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    pair_mask = pair < num_pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_rows = tl.where(pair_mask, pair, 0) // C_ROW_DIV
    c_ptrs = c_ptr + c_rows[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c_mask = pair_mask[:, None] & (offs_n[None, :] < N)
    # Bad ids (only reachable under graph capture): no K block runs, nothing is read, the rows get zeros.
    good = (expert >= 0) & (expert < num_experts)
    expert = tl.where(good, expert, 0)

    # Padding rows read row 0 and columns past N wrap around (the tutorial's trick): loads need no mask but K's.
    a_rows = tl.where(pair_mask, pair // A_ROW_DIV, 0)
    offs_bn = offs_n % N
    offs_k = tl.arange(0, BLOCK_K)
    if SWAP:  # weight tiles (BLOCK_N, BLOCK_K), the MMA's left operand
        b_k, b_n = offs_k[None, :], offs_bn[:, None]
    else:  # (BLOCK_K, BLOCK_N)
        b_k, b_n = offs_k[:, None], offs_bn[None, :]
    kb_start = pid_k * k_blocks_per_split
    kb_end = tl.where(good, tl.minimum(kb_start + k_blocks_per_split, tl.cdiv(K, BLOCK_K)), kb_start)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_base = b_ptr + expert * stride_be + b_k * stride_bk
    bg_ptrs = b_base + b_n * stride_bn
    bu_ptrs = b_base + (b_n + N) * stride_bn
    if FP8:  # one scale per row (and 128-wide K group) of a, per (128, 128) block of b
        as_ptrs = a_scale_ptr + a_rows * stride_asm
        bs_base = b_scale_ptr + expert * stride_bse
        if B_SCALAR:  # columns past N (wrapped) take the tile's scale: they are not stored
            bgs_ptrs = bs_base + (pid_n * BLOCK_N // SCALE_GROUP) * stride_bsn
            bus_ptrs = bs_base + ((pid_n * BLOCK_N + N) // SCALE_GROUP) * stride_bsn
        else:
            bgs_ptrs = bs_base + (offs_bn // SCALE_GROUP) * stride_bsn
            bus_ptrs = bs_base + ((offs_bn + N) // SCALE_GROUP) * stride_bsn
        # Scales are loaded one K block ahead (as the block-scale GEMM does): the pipeliner prefetches only the
        # dot operands, and a plain load's latency would stall every iteration.
        g0 = kb_start * BLOCK_K // SCALE_GROUP
        if not QUANT_A:
            a_s = tl.load(as_ptrs + g0 * stride_ask)
        bg_s = tl.load(bgs_ptrs + g0 * stride_bsk)
        if GATED:
            bu_s = tl.load(bus_ptrs + g0 * stride_bsk)

    if SWAP:  # acc^T: the epilogue transposes it back
        acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros_like(acc_g)
    for kb in range(kb_start, kb_end):
        k0 = kb * BLOCK_K
        if EVEN_K:
            a = tl.load(a_ptrs + k0 * stride_ak)
            bg = tl.load(bg_ptrs + k0 * stride_bk)
        else:  # zeros past K: the partial last block adds nothing (nor to a quantized group's amax)
            a = tl.load(a_ptrs + k0 * stride_ak, mask=offs_k[None, :] < K - k0, other=0.0)
            bg = tl.load(bg_ptrs + k0 * stride_bk, mask=b_k < K - k0, other=0.0)
        if QUANT_A:
            a, a_s = quant_rows(a.to(tl.float32), FP8_MAX_TL, MIN_SCALE_TL, UPCAST)
        elif UPCAST:
            a = a.to(tl.float32)
        if UPCAST:
            bg = bg.to(tl.float32)
        if FP8:
            g_next = tl.minimum(kb + 1, kb_end - 1) * BLOCK_K // SCALE_GROUP  # the last iteration re-reads: harmless
            if not QUANT_A:
                a_s_next = tl.load(as_ptrs + g_next * stride_ask)
            bg_s_next = tl.load(bgs_ptrs + g_next * stride_bsk)
            acc_g += _scaled(_mma(a, bg, None, SWAP), a_s, bg_s, B_SCALAR, SWAP)
            bg_s = bg_s_next
        else:
            acc_g = _mma(a, bg, acc_g, SWAP)
        if GATED:
            if EVEN_K:
                bu = tl.load(bu_ptrs + k0 * stride_bk)
            else:
                bu = tl.load(bu_ptrs + k0 * stride_bk, mask=b_k < K - k0, other=0.0)
            if UPCAST:
                bu = bu.to(tl.float32)
            if FP8:
                bu_s_next = tl.load(bus_ptrs + g_next * stride_bsk)
                acc_u += _scaled(_mma(a, bu, None, SWAP), a_s, bu_s, B_SCALAR, SWAP)
                bu_s = bu_s_next
            else:
                acc_u = _mma(a, bu, acc_u, SWAP)
        if FP8 and not QUANT_A:
            a_s = a_s_next

    if SWAP:  # a layout change (the store converts the MMA's layout anyway)
        acc_g = tl.trans(acc_g)
        acc_u = tl.trans(acc_u)
    if MUL_ROUTED_WEIGHT:
        acc_g *= tl.load(topk_weight_ptr + pair, mask=pair_mask, other=0.0).to(tl.float32)[:, None]
    if SPLIT_K > 1:
        tl.atomic_add(c_ptrs, acc_g, mask=c_mask)
        if GATED:
            tl.atomic_add(c_ptrs + N * stride_cn, acc_u, mask=c_mask)
    elif GATED:
        tl.store(c_ptrs, (gate_activation(acc_g, ACTIVATION) * acc_u).to(c_ptr.dtype.element_ty), mask=c_mask)
    else:
        tl.store(c_ptrs, acc_g.to(c_ptr.dtype.element_ty), mask=c_mask)
        if KSUM:
            _ksum_arrive(c_ptr, out_ptr, counter_ptr, pair, pair_mask, offs_n, pid_n, tl.cdiv(N, BLOCK_N), N,
                         stride_cm, stride_cn, stride_om, TOPK, BLOCK_M, BLOCK_N)


@triton.jit
def _mma(a, b, acc, SWAP: tl.constexpr):
    """``acc`` (None: zeros) plus one K block's product of the rows ``a`` (BLOCK_M, BLOCK_K) and the weight tile
    ``b``: a @ b, or with ``SWAP`` its transpose b @ a^T (``b`` is then (BLOCK_N, BLOCK_K))."""
    if SWAP:
        out = tl.dot(b, tl.trans(a), acc)
    else:
        out = tl.dot(a, b, acc)
    return out


@triton.jit
def _scaled(p, a_s, b_s, B_SCALAR: tl.constexpr, SWAP: tl.constexpr):
    """One K block's product times its row scales ``a_s`` and its column scales ``b_s`` (one scale when
    ``B_SCALAR``): one multiply per element with a scalar, as the block-scale GEMM's ``_apply_scales`` does. With
    ``SWAP`` the product is transposed: rows' scales go along its columns, weight scales along its rows."""
    if SWAP:
        if B_SCALAR:
            out = p * (a_s * b_s)[None, :]
        else:
            out = p * (b_s[:, None] * a_s[None, :])
    elif B_SCALAR:
        out = p * (a_s * b_s)[:, None]
    else:
        out = p * (a_s[:, None] * b_s[None, :])
    return out


@triton.jit
def _ksum_arrive(c_ptr, out_ptr, counter_ptr, pair, pair_mask, offs_n, pid_n, n_tiles, N, stride_cm, stride_cn,
                 stride_om, TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """After a tile's per-pair rows are stored: count each row's token's arrival at this column tile; the program
    bringing a count to TOPK sums that token's TOPK rows in slot order (fixed: deterministic) into ``out``. The
    barrier orders every thread's stores before the counters' release (as CUTLASS's semaphores do)."""
    token = tl.where(pair_mask, pair, 0) // TOPK
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr + token * n_tiles + pid_n, 1, mask=pair_mask, sem="acq_rel")
    last = pair_mask & (arrived == TOPK - 1)
    tl.debug_barrier()
    mask = last[:, None] & (offs_n[None, :] < N)
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        rows = c_ptr + (token * TOPK + j)[:, None] * stride_cm + offs_n[None, :] * stride_cn
        total += tl.load(rows, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    tl.store(out_ptr + token[:, None] * stride_om + offs_n[None, :], total.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _act_mul_kernel(ws_ptr, out_ptr, N, stride_wm, stride_om, ACTIVATION: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[m, :N] = act(ws[m, :N]) * ws[m, N:2N]: GEMM1's epilogue after its split-K partials are summed."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    g = tl.load(ws_ptr + row * stride_wm + cols, mask=mask, other=0.0)
    u = tl.load(ws_ptr + row * stride_wm + N + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_om + cols, (gate_activation(g, ACTIVATION) * u).to(out_ptr.dtype.element_ty),
             mask=mask)


# ----------------------------------------------------------------------------------------------------- launcher


def is_capturing(t: torch.Tensor) -> bool:
    """Whether a CUDA graph is being captured on ``t``'s device (the driver's answer: any capture, however begun)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()



def check_moe_inputs(
    hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weight: torch.Tensor,
    topk_ids: torch.Tensor, w1_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
    activation: str = "silu", expert_mask: torch.Tensor | None = None,
) -> bool:
    """Validate the fused-MoE arguments (shapes, dtypes, devices, contiguity, scale layouts, AITER's
    ``expert_mask``; ValueError naming the tensor with its shape, dtype, stride and device); True for the FP8
    block-scale variant. Expert ids outside [0, E) (with a mask: outside it, or a mask marking other than E local
    experts) raise too, unless a CUDA graph is being captured (the check syncs with the host; the kernels give such
    pairs a zero contribution instead)."""
    named = {"hidden_states": hidden_states, "w1": w1, "w2": w2, "topk_weight": topk_weight, "topk_ids": topk_ids}
    if w1_scale is not None:
        named["w1_scale"] = w1_scale
    if w2_scale is not None:
        named["w2_scale"] = w2_scale
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"fused_moe: {name} must be a tensor, got {type(t).__name__}")
    dev = hidden_states.device
    for name, t in named.items():
        if t.device != dev:
            raise ValueError(f"fused_moe: {describe_tensor(name, t)} is not on hidden_states' device {dev}")
    if expert_mask is not None:
        check_mask_tensor(expert_mask, dev)
    if activation not in ACTIVATIONS:
        raise ValueError(f"fused_moe: activation {activation!r} is not one of {list(ACTIVATIONS)}")
    if hidden_states.dim() != 2 or hidden_states.dtype not in HALF_DTYPES or hidden_states.stride(-1) != 1:
        raise ValueError(f"fused_moe: {describe_tensor('hidden_states', hidden_states)} must be (T, H) bf16/fp16 with "
                         "contiguous rows")
    T, H = hidden_states.shape
    if w1.dim() != 3 or w1.shape[2] != H or w1.shape[1] % 2 or w1.shape[1] == 0:
        raise ValueError(f"fused_moe: {describe_tensor('w1', w1)} must be (E, 2I, H={H}) (gate rows then up rows)")
    E, inter_dim = w1.shape[0], w1.shape[1] // 2
    if w2.dim() != 3 or tuple(w2.shape) != (E, H, inter_dim):
        raise ValueError(f"fused_moe: {describe_tensor('w2', w2)} must be (E, H, I) = ({E}, {H}, {inter_dim}) to match "
                         "w1")
    fp8 = w1.dtype == FP8
    if w1.dtype not in (hidden_states.dtype, FP8) or w2.dtype != w1.dtype:
        raise ValueError(f"fused_moe: {describe_tensor('w1', w1)} and {describe_tensor('w2', w2)} must both have "
                         f"hidden_states' dtype {hidden_states.dtype} or both be {FP8}")
    for name, t in (("w1", w1), ("w2", w2)):
        if not t.is_contiguous():
            raise ValueError(f"fused_moe: {describe_tensor(name, t)} must be contiguous")
    if fp8 != (w1_scale is not None) or fp8 != (w2_scale is not None):
        raise ValueError(f"fused_moe: w1_scale and w2_scale are {'required for' if fp8 else 'only for'} FP8 weights "
                         f"(w1 is {w1.dtype})")
    if fp8:
        for name, t, rows, cols in (("w1_scale", w1_scale, 2 * inter_dim, H), ("w2_scale", w2_scale, H, inter_dim)):
            want = (E, triton.cdiv(rows, SCALE_BLOCK), triton.cdiv(cols, SCALE_BLOCK))
            if tuple(t.shape) != want or t.dtype != torch.float32:
                raise ValueError(f"fused_moe: {describe_tensor(name, t)} must be float32 {want}: one scale per "
                                 f"({SCALE_BLOCK}, {SCALE_BLOCK}) block")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != T or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"fused_moe: {describe_tensor('topk_ids', topk_ids)} must be int32/int64 (T={T}, k)")
    if tuple(topk_weight.shape) != tuple(topk_ids.shape) or topk_weight.dtype not in (torch.float32,
                                                                                      hidden_states.dtype):
        raise ValueError(f"fused_moe: {describe_tensor('topk_weight', topk_weight)} must be float32 or "
                         f"{hidden_states.dtype} with topk_ids' shape {tuple(topk_ids.shape)}")
    for name, t in (("topk_weight", topk_weight), ("topk_ids", topk_ids)):
        if not t.is_contiguous():
            raise ValueError(f"fused_moe: {describe_tensor(name, t)} must be contiguous")
    if not is_capturing(topk_ids):
        check_expert_ids(topk_ids, E, expert_mask)
    return fp8


def check_expert_ids(topk_ids: torch.Tensor, experts: int, expert_mask: torch.Tensor | None = None) -> None:
    """ValueError naming ``topk_ids`` when one of its ids is outside [0, ``experts``) (with ``expert_mask``:
    :func:`~aiter_gemm.kernels.moe_expert_mask.check_masked_ids`): one reduction and one host sync (skipped in
    CUDA-graph capture, where the kernels give such pairs no weight instead)."""
    if expert_mask is not None:
        check_masked_ids(topk_ids, experts, expert_mask)
    elif topk_ids.numel():
        lo, hi = (int(v) for v in torch.aminmax(topk_ids))
        if lo < 0 or hi >= experts:
            raise ValueError(f"fused_moe: {describe_tensor('topk_ids', topk_ids)} holds expert ids in [{lo}, {hi}], "
                             f"outside [0, {experts})")


def k_splits(K: int, cfg: MoeConfig) -> tuple[int, int]:
    """(K blocks per split, splits) of ``cfg`` over K: no empty trailing split, so a ``split_k`` above the K blocks
    runs fewer splits (one split: the plain, non-atomic path)."""
    k_blocks = -(-K // cfg.block_k)  # ceil divisions: per call, where triton.cdiv (3.9: a constexpr function) costs
    per_split = -(-k_blocks // cfg.split_k)
    return per_split, -(-k_blocks // per_split)


def uses_ksum(topk: int, inter_dim: int, config2: MoeConfig) -> bool:
    """Whether GEMM2 sums each token's k slots itself (``KSUM``) into counters GEMM1 clears: a ``KSUM`` config
    with k > 1 and one K split."""
    return config2.ksum and topk > 1 and k_splits(inter_dim, config2)[1] == 1




def zero_inputs(T: int, H: int, inter_dim: int, E: int, topk: int, dtype: torch.dtype, fp8: bool,
                device: torch.device) -> tuple:
    """A call's inputs on zero experts (FP8: unit block scales), each token routed to k consecutive experts with
    weight 1/k, int32 ids and float32 weights as the tuner's routing gives them: what a call that only builds or
    warms the kernels of these sizes runs on (shapes, dtypes and layouts matter, values do not)."""
    wtype = FP8 if fp8 else dtype
    w1 = torch.zeros((E, 2 * inter_dim, H), dtype=wtype, device=device)
    w2 = torch.zeros((E, H, inter_dim), dtype=wtype, device=device)
    s1 = s2 = None
    if fp8:
        s1 = torch.ones((E, triton.cdiv(2 * inter_dim, SCALE_BLOCK), triton.cdiv(H, SCALE_BLOCK)), device=device)
        s2 = torch.ones((E, triton.cdiv(H, SCALE_BLOCK), triton.cdiv(inter_dim, SCALE_BLOCK)), device=device)
    ids = (torch.arange(T * topk, device=device) % E).view(T, topk).to(torch.int32)
    return (torch.zeros((T, H), dtype=dtype, device=device), w1, w2,
            torch.full((T, topk), 1.0 / topk, device=device), ids, s1, s2)


def _moe_gemm(a, a_scale, w, w_scale, c, topk_weight, rows, n, cfg: MoeConfig, *, a_row_div: int, c_row_div: int,
              gated: bool, activation: str, num_pairs: int, topk: int, zero: torch.Tensor | None = None,
              ksum: tuple[torch.Tensor, torch.Tensor] | None = None, launches: LaunchSequence | None = None) -> None:
    """Launch one grouped GEMM (see :func:`_fused_moe_kernel`) of ``n`` output columns over ``w``'s K. ``rows``:
    the align triple, or ``topk_ids`` for a ``DIRECT`` config; ``a_scale`` None with FP8 weights: ``cfg`` is ``QA``
    and ``a`` is quantized in the kernel. ``zero``: counters to clear first; ``ksum``: (counters, out) of GEMM2's
    fused k-sum into ``out`` (c then holds the per-pair rows). ``launches``: the call's bound launches, whose plan
    takes the pointer arguments (every tensor of the launch, given per call)."""
    if cfg.direct:
        sorted_ids = expert_ids = num_post = rows
    else:
        sorted_ids, expert_ids, num_post = rows
    counters, out = ksum if ksum is not None else (zero, None)
    fp8 = w_scale is not None
    # The kernel's pointer arguments in order; an unused one takes a tensor of the launch (never read).
    pointers = (a, w, c, a_scale if a_scale is not None else a, w_scale if fp8 else w,
                topk_weight if topk_weight is not None else a, sorted_ids, expert_ids, num_post,
                counters if counters is not None else a, out if out is not None else c)
    if launches is not None and launches.run(*pointers) is not None:
        return
    K = a.shape[1]
    per_split, splits = k_splits(K, cfg)
    num_m_blocks = num_pairs if cfg.direct else expert_ids.numel()
    scales = (0, 0) if a_scale is None else (a_scale.stride(0), a_scale.stride(1))
    scales += (w_scale.stride(0), w_scale.stride(1), w_scale.stride(2)) if fp8 else (0, 0, 0)
    grid = (num_m_blocks * triton.cdiv(n, cfg.block_n), splits)
    args = dict(zip(_fused_moe_kernel.arg_names, (  # the runtime arguments, by name: what a plan packs
        *pointers, n, K, num_pairs, w.shape[0], per_split, num_m_blocks, 0 if zero is None else zero.numel(),
        0 if zero is None else -(-zero.numel() // grid[0]),
        a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2), c.stride(0), c.stride(1),
        0 if out is None else out.stride(0), *scales)))
    compiled = _fused_moe_kernel[grid](
        **args,
        A_ROW_DIV=a_row_div, C_ROW_DIV=c_row_div, GATED=gated, ACTIVATION=activation,
        MUL_ROUTED_WEIGHT=topk_weight is not None, FP8=fp8, QUANT_A=cfg.quant_a, DIRECT=cfg.direct, SWAP=cfg.swap,
        KSUM=ksum is not None, TOPK=topk,
        ZERO=zero is not None,
        SCALE_GROUP=SCALE_BLOCK, B_SCALAR=SCALE_BLOCK % cfg.block_n == 0 and (not gated or n % SCALE_BLOCK == 0),
        SPLIT_K=splits, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, EVEN_K=K % cfg.block_k == 0, UPCAST=INTERPRET, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if launches is not None:
        launches.made(compiled, grid, args, pointers)


def fused_moe_triton(
    hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weight: torch.Tensor,
    topk_ids: torch.Tensor, *, w1_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
    activation: str = "silu", config1: MoeConfig | None = None, config2: MoeConfig | None = None,
) -> torch.Tensor:
    """The fused MoE (module docstring) with ``config1`` for GEMM1 and ``config2`` for GEMM2 (None:
    :func:`default_config`; ``config1`` where that is ``FUSED``); returns (T, H) in hidden_states' dtype. Validates
    its inputs (:func:`check_moe_inputs`); no host sync while a CUDA graph is captured."""
    fp8 = check_moe_inputs(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale, activation)
    T, H = hidden_states.shape
    E, inter_dim, topk = w1.shape[0], w1.shape[1] // 2, topk_ids.shape[1]
    config1 = config1 or default_config(T, E, topk, inter_dim, H, fp8=fp8)
    config2 = config2 or (config1 if config1.fused else default_config(T, E, topk, H, inter_dim, fp8=fp8))
    for stage, cfg in ((1, config1), (2, config2)):  # bf16 tiles past the register bound spill but run
        problem = (config_error if fp8 else usage_error)(cfg, fp8=fp8, stage=stage)
        if problem:
            raise ValueError(f"fused_moe: config{stage} {cfg.name()}: {problem}")
    problem = pair_error(config1, config2)
    if problem:
        raise ValueError(f"fused_moe: {problem}")
    return launch_fused_moe(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale, activation, config1,
                            config2)


def launch_fused_moe(
    hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weight: torch.Tensor,
    topk_ids: torch.Tensor, w1_scale: torch.Tensor | None, w2_scale: torch.Tensor | None, activation: str,
    config1: MoeConfig, config2: MoeConfig, launches: LaunchSequence | None = None,
) -> torch.Tensor:
    """:func:`fused_moe_triton` without its checks, for callers that validated this key's inputs and configs already
    (the op's runners: once per key, the expert ids per call). ``launches``
    (:class:`~aiter_gemm.triton_launch.LaunchSequence`): the plans of this call's layout, one per launch in the
    order made (the sorts, GEMM1, its split-K epilogue, GEMM2; ``FUSED``: its one launch), or the record of Triton's
    launches to bind; the intermediate, outputs and workspaces stay torch allocations made here, given to each plan
    with the call's tensors (a sort's plan allocates its outputs)."""
    fp8 = w1_scale is not None
    T, H = hidden_states.shape
    E, inter_dim, topk = w1.shape[0], w1.shape[1] // 2, topk_ids.shape[1]
    dtype, dev = hidden_states.dtype, hidden_states.device
    if T == 0 or topk == 0:
        return torch.zeros((T, H), dtype=dtype, device=dev)
    if config1.fused:  # config2 is the same (pair_error)
        return launch_fused(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale, activation, config1,
                            launches)
    num_pairs = T * topk
    aligned: dict[int, tuple] = {}

    def rows_of(cfg: MoeConfig):  # DIRECT: the ids; else the sort at this block_m, once per call
        if cfg.direct:
            return topk_ids
        if cfg.block_m not in aligned:
            aligned[cfg.block_m] = moe_align_block_size(topk_ids, E, cfg.block_m, launches)
        return aligned[cfg.block_m]

    # GEMM2 sums the k slots itself (KSUM) into per-(token, column tile) counters that GEMM1 clears.
    ksum = uses_ksum(topk, inter_dim, config2)
    counters = torch.empty(T * -(-H // config2.block_n), dtype=torch.int32, device=dev) if ksum else None
    common = dict(activation=activation, num_pairs=num_pairs, topk=topk, launches=launches)

    # GEMM1: (T, H) tokens -> (T * k, I) act(gate) * up, one row per pair.
    a1, a1_scale = per_token_group_quant_fp8(hidden_states) if fp8 and not config1.quant_a else (hidden_states, None)
    inter = torch.empty((num_pairs, inter_dim), dtype=dtype, device=dev)
    gemm1 = dict(a_row_div=topk, c_row_div=1, gated=True, zero=counters, **common)
    if k_splits(H, config1)[1] > 1:
        ws = torch.zeros((num_pairs, 2 * inter_dim), dtype=torch.float32, device=dev)
        _moe_gemm(a1, a1_scale, w1, w1_scale, ws, None, rows_of(config1), inter_dim, config1, **gemm1)
        if launches is None or launches.run(ws, inter) is None:
            block = min(1024, triton.next_power_of_2(inter_dim))
            grid = (num_pairs, triton.cdiv(inter_dim, block))
            args = {"ws_ptr": ws, "out_ptr": inter, "N": inter_dim, "stride_wm": ws.stride(0),
                    "stride_om": inter.stride(0)}
            compiled = _act_mul_kernel[grid](**args, ACTIVATION=activation, BLOCK_N=block, num_warps=4)
            if launches is not None:
                launches.made(compiled, grid, args, (ws, inter))
    else:
        _moe_gemm(a1, a1_scale, w1, w1_scale, inter, None, rows_of(config1), inter_dim, config1, **gemm1)

    # GEMM2: (T * k, I) -> routing-weighted rows, summed over the k slots of each token.
    a2, a2_scale = per_token_group_quant_fp8(inter) if fp8 and not config2.quant_a else (inter, None)
    weights = topk_weight.view(-1)
    gemm2 = dict(a_row_div=1, c_row_div=1, gated=False, **common)
    if k_splits(inter_dim, config2)[1] > 1:
        acc = torch.zeros((T, H), dtype=torch.float32, device=dev)
        _moe_gemm(a2, a2_scale, w2, w2_scale, acc, weights, rows_of(config2), H, config2, **{**gemm2,
                  "c_row_div": topk})
        return acc.to(dtype)
    out = torch.empty((T, H), dtype=dtype, device=dev) if topk == 1 or ksum else None
    if topk == 1:
        _moe_gemm(a2, a2_scale, w2, w2_scale, out, weights, rows_of(config2), H, config2, **gemm2)
        return out
    per_pair = torch.empty((num_pairs, H), dtype=dtype, device=dev)
    _moe_gemm(a2, a2_scale, w2, w2_scale, per_pair, weights, rows_of(config2), H, config2,
              ksum=(counters, out) if ksum else None, **gemm2)
    return out if ksum else per_pair.view(T, topk, H).sum(dim=1)


# ----------------------------------------------------------------------------------------------------- reference


def fused_moe_ref(
    hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weight: torch.Tensor,
    topk_ids: torch.Tensor, *, w1_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
    activation: str = "silu", gemm1_dtype: torch.dtype | None = None, quant_inter: bool = True,
) -> torch.Tensor:
    """float32 loop over experts, cast to hidden_states' dtype. The intermediate is rounded to that dtype as the
    kernels store it; FP8: weights dequantized, and both GEMMs' activations quantized as the kernels quantize them.
    Pairs with an id outside [0, E) contribute nothing. ``gemm1_dtype``: GEMM1's output rounded to it before the
    activation, as a library that writes it only so (DeepGEMM: bf16); None keeps it float32, as our kernels do.
    ``quant_inter=False``: FP8's intermediate enters GEMM2 unquantized, as the ``FUSED`` kernel takes it."""
    T, H = hidden_states.shape
    E, inter_dim = w1.shape[0], w1.shape[1] // 2
    fp8 = w1_scale is not None
    dtype = hidden_states.dtype

    def quantized(x: torch.Tensor) -> torch.Tensor:  # x as the kernels see it: per (token, 128) group fp8
        if not fp8:
            return x.float()
        q, s = per_token_group_quant_fp8_ref(x)
        return q.float() * s.repeat_interleave(SCALE_BLOCK, dim=1)[:, :x.shape[1]]

    act = torch.nn.functional.silu if activation == "silu" else torch.nn.functional.gelu
    x = quantized(hidden_states)
    out = torch.zeros((T, H), dtype=torch.float32, device=hidden_states.device)
    for e in range(E):
        tok, slot = (topk_ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        w1e = dequantize_weight_blockscale(w1[e], w1_scale[e]) if fp8 else w1[e].float()
        w2e = dequantize_weight_blockscale(w2[e], w2_scale[e]) if fp8 else w2[e].float()
        h = x[tok] @ w1e.t()
        if gemm1_dtype is not None:
            h = h.to(gemm1_dtype).float()
        inter = (act(h[:, :inter_dim]) * h[:, inter_dim:]).to(dtype)
        y = (quantized(inter) if quant_inter else inter.float()) @ w2e.t()
        out.index_add_(0, tok, y * topk_weight[tok, slot].float()[:, None])
    return out.to(dtype)
