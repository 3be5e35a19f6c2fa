"""The ``FUSED`` variant of the fused MoE (:mod:`aiter_gemm.kernels.fused_moe`): both GEMMs in one launch after one
memset, for few (token, slot) pairs, where the unfused call's launches cost more than streaming the experts' weights.

One program per (pair p, ``block_n`` intermediate columns [n0, n0 + block_n)), its expert read from ``topk_ids`` (no
sort). GEMM1 for the pair's one activation row (float32 products summed along K with ``tl.sum``: no ``tl.dot``, so
no padding to 16 rows) gives its columns of ``act(gate) * up``, rounded to hidden_states' dtype as the unfused path
stores its intermediate; GEMM2 multiplies them by the same columns of ``w2[e]`` over all of H and adds the routing-
weighted partials atomically into a float32 row per token. Each program then counts its arrival on its token's
counter (a barrier, then an acq_rel atomic, as the ``KSUM`` variant does); the one bringing it to k * cdiv(I, block_n)
writes the token's row into the output. Rows and counters are one zeroed workspace (one memset). The float32 sums'
order is not fixed (atomics): results may differ in the last float32 bit between runs, before the final rounding.

FP8 (block scales): a K block covers one or more whole 128-wide quantization groups (``block_k`` a multiple of 128,
loaded as (groups, 128)); GEMM1's activations are quantized in the kernel per group by the quantizer's rule, as
``QA`` does, and scaled back by its activation and weight scales before the products (one sum along K, as bf16's).
GEMM2's input is not quantized
(a program holds block_n columns of a 128 group): the rounded intermediate times the dequantized ``w2``, more
accurate than the unfused path (its reference: :func:`~aiter_gemm.kernels.fused_moe.fused_moe_ref` with
``quant_inter=False``, the tuner's for these candidates). Expert ids outside [0, E) (unchecked only under graph
capture) read no weight and add nothing, but still arrive.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from aiter_gemm.kernels.act_quant import FP8_MAX_TL, MIN_SCALE_TL, quant_rows
from aiter_gemm.kernels.blockscale_format import SCALE_BLOCK
from aiter_gemm.kernels.common import INTERPRET, gate_activation
from aiter_gemm.kernels.fused_moe_config import MoeConfig
from aiter_gemm.triton_launch import LaunchSequence

__all__ = ["launch_fused"]


@triton.jit
def _fused_moe_one_launch_kernel(
    x_ptr, w1_ptr, w2_ptr, w1_scale_ptr, w2_scale_ptr, topk_weight_ptr, topk_ids_ptr, acc_ptr, counter_ptr, out_ptr,
    H, inter_dim, num_experts,
    stride_xm, stride_w1e, stride_w1n, stride_w2e, stride_w2h, stride_s1e, stride_s1n, stride_s1k,
    stride_s2e, stride_s2h, stride_s2n, stride_om,
    ACTIVATION: tl.constexpr,
    FP8: tl.constexpr,
    TOPK: tl.constexpr,
    SCALE_GROUP: tl.constexpr,  # rows and K of one weight scale block, K of one activation scale group
    UP_SCALAR: tl.constexpr,  # FP8: I % SCALE_GROUP == 0: a tile's up rows share one scale (as its gate rows do)
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,  # H % BLOCK_K == 0: no mask on the last block of H (both GEMMs step over H)
    NUM_STAGES: tl.constexpr,
    OUT_BLOCK: tl.constexpr,  # columns per step of the last arrival's conversion of a token's row
    EMULATE: tl.constexpr,  # the interpreter: fp8 rounding in float32 arithmetic
):
    """Pair ``pid // n_tiles``, intermediate columns tile ``pid % n_tiles``: GEMM1, GEMM2's share, the arrival."""
    n_tiles = tl.cdiv(inter_dim, BLOCK_N)
    pid = tl.program_id(0)
    pair = pid // n_tiles
    pid_n = pid % n_tiles
    token = (pair // TOPK).to(tl.int64)
    expert = tl.load(topk_ids_ptr + pair).to(tl.int64)
    good = (expert >= 0) & (expert < num_experts)
    expert = tl.where(good, expert, 0)
    k_blocks = tl.where(good, tl.cdiv(H, BLOCK_K), 0)  # a bad id runs no block of either GEMM
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_bn = offs_n % inter_dim  # columns past I wrap around (no load mask); their intermediate is zeroed below
    offs_k = tl.arange(0, BLOCK_K)

    # GEMM1: gate rows n and up rows I + n of w1[e] times the token's row, as (block_n, block_k) tiles. FP8 loads the
    # row's K block as its G groups (G, 128), quantizes each and folds its activation and weight scales into the
    # dequantized row (a tile's gate rows share one scale block; so do its up rows when I % 128 == 0, else each up
    # element takes its row's scale): the products then sum along K as bf16's do.
    w_offs = offs_bn[:, None] * stride_w1n + offs_k[None, :]
    if FP8:
        G: tl.constexpr = BLOCK_K // SCALE_GROUP
        offs_g = tl.arange(0, G)
        offs_x = offs_g[:, None] * SCALE_GROUP + tl.arange(0, SCALE_GROUP)[None, :]
        n_groups = tl.cdiv(H, SCALE_GROUP)
        s1_base = w1_scale_ptr + expert * stride_s1e
        sg_ptr = s1_base + (pid_n * BLOCK_N // SCALE_GROUP) * stride_s1n + offs_g * stride_s1k
        if UP_SCALAR:
            su_ptr = s1_base + ((pid_n * BLOCK_N + inter_dim) // SCALE_GROUP) * stride_s1n + offs_g * stride_s1k
        else:
            su_ptr = s1_base + ((offs_bn + inter_dim) // SCALE_GROUP)[:, None] * stride_s1n + \
                (offs_k // SCALE_GROUP)[None, :] * stride_s1k
    else:
        offs_x = offs_k
    x_ptrs = x_ptr + token * stride_xm + offs_x
    g_ptrs = w1_ptr + expert * stride_w1e + w_offs
    u_ptrs = g_ptrs + inter_dim * stride_w1n
    acc_g = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for kb in tl.range(0, k_blocks, num_stages=NUM_STAGES):
        k0 = kb * BLOCK_K
        if EVEN_K:
            x = tl.load(x_ptrs + k0).to(tl.float32)
            wg = tl.load(g_ptrs + k0).to(tl.float32)
            wu = tl.load(u_ptrs + k0).to(tl.float32)
        else:  # zeros past H: the partial last block adds nothing (nor to its groups' amax)
            in_k = offs_k < H - k0
            x = tl.load(x_ptrs + k0, mask=offs_x < H - k0, other=0.0).to(tl.float32)
            wg = tl.load(g_ptrs + k0, mask=in_k[None, :], other=0.0).to(tl.float32)
            wu = tl.load(u_ptrs + k0, mask=in_k[None, :], other=0.0).to(tl.float32)
        if FP8:  # the row's G groups quantized by the quantizer's rule, then scaled back with each group's scales
            xq, xs = quant_rows(x, FP8_MAX_TL, MIN_SCALE_TL, EMULATE)
            xq = xq.to(tl.float32)
            if EVEN_K:
                s_g = tl.load(sg_ptr + kb * G * stride_s1k)
            else:  # groups past H: no scale (their products are zero)
                s_g = tl.load(sg_ptr + kb * G * stride_s1k, mask=kb * G + offs_g < n_groups, other=0.0)
            xg = tl.reshape(xq * (xs * s_g)[:, None], (BLOCK_K,))
            if UP_SCALAR:
                if EVEN_K:
                    s_u = tl.load(su_ptr + kb * G * stride_s1k)
                else:
                    s_u = tl.load(su_ptr + kb * G * stride_s1k, mask=kb * G + offs_g < n_groups, other=0.0)
                xu = tl.reshape(xq * (xs * s_u)[:, None], (BLOCK_K,))
            else:
                s_u = tl.load(su_ptr + kb * G * stride_s1k, mask=(kb * G + offs_k // SCALE_GROUP < n_groups)[None, :],
                              other=0.0)
                wu = wu * s_u
                xu = tl.reshape(xq * xs[:, None], (BLOCK_K,))
            acc_g += tl.sum(wg * xg[None, :], axis=1)
            acc_u += tl.sum(wu * xu[None, :], axis=1)
        else:
            acc_g += tl.sum(wg * x[None, :], axis=1)
            acc_u += tl.sum(wu * x[None, :], axis=1)
    # The intermediate rounded as the unfused path stores it; wrapped columns contribute nothing to GEMM2.
    inter = (gate_activation(acc_g, ACTIVATION) * acc_u).to(out_ptr.dtype.element_ty).to(tl.float32)
    inter = tl.where(offs_n < inter_dim, inter, 0.0)

    # GEMM2's share: w2[e][h, n-tile] @ inter over all of H, routing-weighted, added into the token's float32 row.
    weight = tl.load(topk_weight_ptr + pair).to(tl.float32)
    acc_row = acc_ptr + token * H
    w2_ptrs = w2_ptr + expert * stride_w2e + offs_k[:, None] * stride_w2h + offs_bn[None, :]
    if FP8:
        s2_ptr = w2_scale_ptr + expert * stride_s2e + (pid_n * BLOCK_N // SCALE_GROUP) * stride_s2n
    for hb in tl.range(0, k_blocks, num_stages=NUM_STAGES):
        h0 = hb * BLOCK_K
        if EVEN_K:
            w = tl.load(w2_ptrs + h0 * stride_w2h)
        else:
            w = tl.load(w2_ptrs + h0 * stride_w2h, mask=(offs_k < H - h0)[:, None], other=0.0)
        y = tl.sum(w.to(tl.float32) * inter[None, :], axis=1)
        if FP8:  # row h of H takes scale row h // 128 (a block of H spans G of them)
            s2_rows = s2_ptr + ((h0 + offs_k) // SCALE_GROUP) * stride_s2h
            if EVEN_K:
                y = y * (tl.load(s2_rows) * weight)
            else:
                y = y * (tl.load(s2_rows, mask=offs_k < H - h0, other=0.0) * weight)
        else:
            y = y * weight
        if EVEN_K:
            tl.atomic_add(acc_row + h0 + offs_k, y, sem="relaxed")
        else:
            tl.atomic_add(acc_row + h0 + offs_k, y, mask=offs_k < H - h0, sem="relaxed")

    # Arrival: every thread's adds before the counter's release; the last of the token's programs writes its row.
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr + token, 1, sem="acq_rel")
    tl.debug_barrier()
    if arrived == TOPK * n_tiles - 1:
        for o in range(0, H, OUT_BLOCK):
            offs = o + tl.arange(0, OUT_BLOCK)
            row = tl.load(acc_row + offs, mask=offs < H, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + token * stride_om + offs, row.to(out_ptr.dtype.element_ty), mask=offs < H)


def launch_fused(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weight: torch.Tensor,
                 topk_ids: torch.Tensor, w1_scale: torch.Tensor | None, w2_scale: torch.Tensor | None,
                 activation: str, cfg: MoeConfig, launches: LaunchSequence | None = None) -> torch.Tensor:
    """The call on a ``FUSED`` config (module docstring; inputs checked by the caller, T and k > 0): the workspace's
    memset and one launch, through ``launches`` (:func:`~aiter_gemm.kernels.fused_moe.launch_fused_moe`)."""
    T, H = hidden_states.shape
    E, inter_dim, topk = w1.shape[0], w1.shape[1] // 2, topk_ids.shape[1]
    dev = hidden_states.device
    # One zeroed workspace: the int32 counters, padded to 16 bytes so the float32 rows after them stay aligned.
    n_count = -(-T // 4) * 4
    ws = torch.zeros(n_count + T * H, dtype=torch.float32, device=dev)
    counters, acc = ws[:n_count].view(torch.int32), ws[n_count:]
    out = torch.empty((T, H), dtype=hidden_states.dtype, device=dev)
    fp8 = w1_scale is not None
    pointers = (hidden_states, w1, w2, w1_scale if fp8 else w1, w2_scale if fp8 else w2, topk_weight, topk_ids, acc,
                counters, out)
    if launches is not None and launches.run(*pointers) is not None:
        return out
    grid = (T * topk * -(-inter_dim // cfg.block_n),)
    scales = (*w1_scale.stride(), *w2_scale.stride()) if fp8 else (0,) * 6
    args = dict(zip(_fused_moe_one_launch_kernel.arg_names, (
        *pointers, H, inter_dim, E, hidden_states.stride(0), w1.stride(0), w1.stride(1), w2.stride(0), w2.stride(1),
        *scales, out.stride(0))))
    compiled = _fused_moe_one_launch_kernel[grid](
        **args, ACTIVATION=activation, FP8=fp8, TOPK=topk, SCALE_GROUP=SCALE_BLOCK,
        UP_SCALAR=inter_dim % SCALE_BLOCK == 0, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=H % cfg.block_k == 0,
        NUM_STAGES=cfg.num_stages, OUT_BLOCK=min(1024, triton.next_power_of_2(H)), EMULATE=INTERPRET,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if launches is not None:
        launches.made(compiled, grid, args, pointers)
    return out
