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
does; ``block_k`` divides 128 so one K block has one scale.

Under ``TRITON_INTERPRET=1`` the dot operands are upcast to float32 (the interpreter mis-computes 8/16-bit dots).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from aiter_gemm.configs import json_int
from aiter_gemm.device import REFERENCE_ARCH, REFERENCE_CU, smem_limit
from aiter_gemm.dtypes import HALF_DTYPES
from aiter_gemm.kernels.a8w8_blockscale import dequantize_weight_blockscale
from aiter_gemm.kernels.act_quant import per_token_group_quant_fp8, per_token_group_quant_fp8_ref
from aiter_gemm.kernels.blockscale_format import FP8, SCALE_BLOCK
from aiter_gemm.kernels.common import (
    INTERPRET,
    MAX_ACC_NUMEL,
    MAX_GROUP_SIZE_M,
    MAX_KSPLIT,
    MAX_STAGES,
    MAX_TILE_NUMEL,
    tile_coords,
)
from aiter_gemm.kernels.moe_align import moe_align_block_size
from aiter_gemm.kernels.names import KernelName

__all__ = ["ACTIVATIONS", "MoeConfig", "check_moe_inputs", "config_error", "config_space", "default_config",
           "fused_moe_ref", "fused_moe_triton", "is_capturing", "k_splits", "moe_align_block_size"]

#: The activations of the gate: SiLU, and GELU in torch's default (erf) form.
ACTIVATIONS = ("silu", "gelu")

# ----------------------------------------------------------------------------------------------------- configs

#: The ``kernelName`` grammar of :meth:`MoeConfig.name`.
NAME = KernelName("moe_BM{BM}_BN{BN}_BK{BK}_GM{GM}_SK{SK}_W{W}_S{S}", "fused-MoE Triton kernelName",
                  "; e.g. 'moe_BM16_BN64_BK128_GM1_SK1_W4_S4'")
#: vLLM / SGLang JSON keys -> fields (``SPLIT_K`` optional).
_VLLM_KEYS = {"BLOCK_SIZE_M": "block_m", "BLOCK_SIZE_N": "block_n", "BLOCK_SIZE_K": "block_k",
              "GROUP_SIZE_M": "group_m", "num_warps": "num_warps", "num_stages": "num_stages", "SPLIT_K": "split_k"}
#: Keys of vLLM's ROCm files: AMD compiler hints with no meaning on NVIDIA, accepted and ignored.
_ROCM_HINTS = frozenset({"waves_per_eu", "matrix_instr_nonkdim", "kpack"})


@dataclass(frozen=True)
class MoeConfig:
    """One launch configuration of either GEMM: the token-block (``block_m``), output-column (``block_n``) and K
    tiles, the grouped launch order, warps, pipeline stages and K splits."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 1
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1

    def __post_init__(self) -> None:
        for field in ("block_m", "block_n", "block_k"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v < 16 or v & (v - 1):
                raise ValueError(f"MoeConfig {field}={v!r} must be a power of two >= 16 (tl.dot's minimum)")
        if max(self.block_m, self.block_n) * self.block_k > MAX_TILE_NUMEL:
            raise ValueError(f"MoeConfig block_k={self.block_k}: an operand tile of {max(self.block_m, self.block_n)}"
                             f"x{self.block_k} is above Triton's {MAX_TILE_NUMEL} elements")
        if self.block_m * self.block_n > MAX_ACC_NUMEL:
            raise ValueError(f"MoeConfig block_n={self.block_n}: a {self.block_m}x{self.block_n} accumulator is "
                             f"above {MAX_ACC_NUMEL} elements")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"MoeConfig num_warps={self.num_warps!r} must be one of 1, 2, 4, 8, 16")
        for field, most in (("group_m", MAX_GROUP_SIZE_M), ("num_stages", MAX_STAGES), ("split_k", MAX_KSPLIT)):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= most:
                raise ValueError(f"MoeConfig {field}={v!r} must be in 1..{most}")

    @classmethod
    def from_vllm(cls, d: Mapping) -> MoeConfig:
        """A value of a vLLM / SGLang fused-MoE JSON file (``{"BLOCK_SIZE_M": 16, ..., "num_stages": 4}``, optional
        ``SPLIT_K``; ROCm's compiler hints ignored). ValueError naming a missing, unknown or bad field."""
        if not isinstance(d, Mapping):
            raise ValueError(f"fused-MoE config entry must be a JSON object, got {type(d).__name__}")
        unknown = sorted(str(k) for k in d if k not in _VLLM_KEYS and k not in _ROCM_HINTS)
        missing = [k for k in _VLLM_KEYS if k != "SPLIT_K" and k not in d]
        if unknown or missing:
            raise ValueError(f"fused-MoE config entry has unknown keys {unknown} / misses keys {missing}")
        values = {field: json_int(key, d[key]) for key, field in _VLLM_KEYS.items() if key in d}
        try:
            return cls(**values)
        except ValueError as exc:  # name the JSON key, not only the field
            key = next((k for k, f in _VLLM_KEYS.items() if f"{f}=" in str(exc)), None)
            raise ValueError(f"fused-MoE config {key}: {exc}" if key else str(exc)) from None

    def to_vllm(self) -> dict:
        """The vLLM / SGLang JSON value (``SPLIT_K`` only when > 1, so files stay readable by vLLM)."""
        out = {key: getattr(self, field) for key, field in _VLLM_KEYS.items() if key != "SPLIT_K"}
        if self.split_k > 1:
            out["SPLIT_K"] = self.split_k
        return out

    def name(self) -> str:
        """The ``kernelName`` spelling, e.g. ``moe_BM16_BN64_BK128_GM1_SK1_W4_S4``."""
        return NAME.format({"BM": self.block_m, "BN": self.block_n, "BK": self.block_k, "GM": self.group_m,
                            "SK": self.split_k, "W": self.num_warps, "S": self.num_stages})

    @classmethod
    def parse(cls, name: str) -> MoeConfig:
        """Inverse of :meth:`name`; ValueError saying what is wrong."""
        v = NAME.parse(name)
        return cls(v["BM"], v["BN"], v["BK"], v["GM"], v["W"], v["S"], v["SK"])


#: Shared memory kept free beside the pipelined tiles for the epilogue's layout conversion (as the block-scale
#: kernel's budget; docs/exploration.md).
_EPILOGUE_SMEM = 27 * 1024
#: float32 tile registers per thread GEMM1 may hold: its two accumulators, and with FP8 the two unscaled K-block
#: products too. At this bound ptxas (Triton 3.9, sm_90) gave bf16 tiles no spill and FP8 ones at most 64 bytes;
#: at twice it, hundreds of bytes.
_MAX_ACC_REGS = 128


def config_error(cfg: MoeConfig, *, fp8: bool, arch: str = REFERENCE_ARCH) -> str | None:
    """Why ``cfg`` cannot run (or would spill) on ``arch``, for either GEMM; None if it can. FP8 needs ``block_k``
    to divide the 128-wide scale group."""
    if fp8 and SCALE_BLOCK % cfg.block_k:
        return f"block_k={cfg.block_k} must divide the FP8 scale block {SCALE_BLOCK}"
    itemsize = 1 if fp8 else 2
    smem = cfg.num_stages * (cfg.block_m + 2 * cfg.block_n) * cfg.block_k * itemsize  # GEMM1: a, gate and up tiles
    budget = smem_limit(arch) - _EPILOGUE_SMEM
    if smem > budget:
        return f"needs {smem} B of shared memory for {cfg.num_stages} stages (budget {budget} on {arch})"
    tiles = 4 if fp8 else 2  # accumulators (gate, up), and FP8's unscaled products of each K block
    regs = tiles * cfg.block_m * cfg.block_n // (32 * cfg.num_warps)
    if regs > _MAX_ACC_REGS:
        return f"GEMM1's {tiles} float32 tiles need {regs} registers per thread (> {_MAX_ACC_REGS}: spills)"
    return None


def config_space(*, fp8: bool, quick: bool = False) -> list[MoeConfig]:
    """The tuner's search space, every config valid for both GEMMs (:func:`config_error`). ``quick``: a short list
    for decode and prefill; full: tiles x group x warps x stages x splits (splits only with small token blocks)."""
    bks = (64, 128) if fp8 else (64, 128, 256)
    if quick:
        raw = [MoeConfig(bm, bn, bk, 1, 4, st, sk)
               for bm, bn, bk, st, sk in itertools.product((16, 32), (32, 64, 128), (128,), (4,), (1, 2, 4))]
        raw += [MoeConfig(bm, bn, bk, 16, w, 3)
                for bm, bn, bk, w in itertools.product((64, 128), (64, 128), (64, 128), (4, 8))]
    else:
        raw = []
        for bm, bn, bk, gm, w, st, sk in itertools.product(
            (16, 32, 64, 128), (32, 64, 128, 256), bks, (1, 16), (4, 8), (2, 3, 4, 5), (1, 2, 4, 8),
        ):
            if sk > 1 and (bm > 32 or gm > 1):  # split-K is for decode-sized blocks
                continue
            if gm > 1 and bm < 64:  # one block per expert: grouping has nothing to reuse
                continue
            if w == 8 and bm * bn < 64 * 128:  # 8 warps need a large tile to share
                continue
            raw.append(MoeConfig(bm, bn, bk, gm, w, st, sk))
    return [c for c in dict.fromkeys(raw) if config_error(c, fp8=fp8) is None]


def default_config(tokens: int, num_experts: int, topk: int, n: int, k: int, *, fp8: bool,
                   num_sms: int = REFERENCE_CU) -> MoeConfig:
    """The built-in config of one GEMM of ``n`` output columns over ``k`` (GEMM1: n = I, k = H; GEMM2: n = H, k = I)
    when no tuned one exists; a heuristic, not measured. ``block_m`` follows the expected tokens per active expert
    under uniform routing (16 for decode); split-K doubles while the active experts' tiles, doubled, still fit one
    wave of ``num_sms`` programs and each split keeps >= 8 K blocks."""
    pairs = max(tokens, 1) * topk
    active = num_experts * (1.0 - (1.0 - min(topk, num_experts) / num_experts) ** max(tokens, 1))
    per_expert = pairs / max(active, 1.0)
    bm = 16 if per_expert <= 16 else 32 if per_expert <= 32 else 64 if per_expert <= 128 else 128
    bk = 128 if fp8 or bm <= 32 else 64
    if bm <= 32:
        cfg = dict(block_m=bm, block_n=64, block_k=bk, group_m=1, num_warps=4, num_stages=4)
    elif bm == 64:  # FP8 holds twice the float32 tiles (config_error): twice the warps
        cfg = dict(block_m=64, block_n=128 if n >= 1024 else 64, block_k=bk, group_m=16, num_warps=8 if fp8 else 4,
                   num_stages=3)
    else:
        cfg = dict(block_m=128, block_n=64 if fp8 else 128, block_k=bk, group_m=16, num_warps=8, num_stages=3)
    programs = math.ceil(active + pairs / bm) * triton.cdiv(n, cfg["block_n"])
    k_blocks = triton.cdiv(k, bk)
    split = 1
    while programs * split * 2 <= num_sms and k_blocks // (split * 2) >= 8:
        split *= 2
    return MoeConfig(**cfg, split_k=split)


# ----------------------------------------------------------------------------------------------------- kernels


@triton.jit
def _activate(x, ACTIVATION: tl.constexpr):
    """SiLU or exact (erf) GELU of a float32 tile."""
    if ACTIVATION == "silu":
        y = x / (1.0 + tl.exp(-x))
    else:
        y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    return y


@triton.jit(do_not_specialize=["N", "K", "num_pairs", "num_experts", "k_blocks_per_split", "num_m_blocks"])
def _fused_moe_kernel(
    a_ptr, b_ptr, c_ptr, a_scale_ptr, b_scale_ptr, topk_weight_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
    N, K, num_pairs, num_experts, k_blocks_per_split, num_m_blocks,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
    A_ROW_DIV: tl.constexpr,  # pair -> row of a: k for GEMM1 (a = tokens), 1 for GEMM2 (a = pairs)
    C_ROW_DIV: tl.constexpr,  # pair -> row of c: k where GEMM2's split-K adds into a (T, H) buffer, else 1
    GATED: tl.constexpr,  # GEMM1: b rows [n] (gate) and [N + n] (up), two accumulators
    ACTIVATION: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    FP8: tl.constexpr,
    SCALE_GROUP: tl.constexpr,  # rows and K of one weight scale block, K of one activation scale group
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
    if pid_m * BLOCK_M >= tl.load(num_post_ptr):
        return
    offs_sorted = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + offs_sorted).to(tl.int64)
    pair_mask = pair < num_pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_rows = tl.where(pair_mask, pair, 0) // C_ROW_DIV
    c_ptrs = c_ptr + c_rows[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c_mask = pair_mask[:, None] & (offs_n[None, :] < N)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if (expert < 0) | (expert >= num_experts):  # bad ids (only reachable under graph capture): nothing is read
        if SPLIT_K == 1:
            tl.store(c_ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=c_ptr.dtype.element_ty), mask=c_mask)
        return

    # Padding rows read row 0 and columns past N wrap around (the tutorial's trick): loads need no mask but K's.
    a_rows = tl.where(pair_mask, pair // A_ROW_DIV, 0)
    offs_bn = offs_n % N
    offs_k = tl.arange(0, BLOCK_K)
    kb_start = pid_k * k_blocks_per_split
    kb_end = tl.minimum(kb_start + k_blocks_per_split, tl.cdiv(K, BLOCK_K))
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_base = b_ptr + expert * stride_be + offs_k[:, None] * stride_bk
    bg_ptrs = b_base + offs_bn[None, :] * stride_bn
    bu_ptrs = b_base + (offs_bn + N)[None, :] * stride_bn
    if FP8:  # one scale per row (and 128-wide K group) of a, per (128, 128) block of b
        as_ptrs = a_scale_ptr + a_rows * stride_asm
        bs_base = b_scale_ptr + expert * stride_bse
        bgs_ptrs = bs_base + (offs_bn // SCALE_GROUP) * stride_bsn
        bus_ptrs = bs_base + ((offs_bn + N) // SCALE_GROUP) * stride_bsn
        # Scales are loaded one K block ahead (as the block-scale GEMM does): the pipeliner prefetches only the
        # dot operands, and a plain load's latency would stall every iteration.
        g0 = kb_start * BLOCK_K // SCALE_GROUP
        a_s = tl.load(as_ptrs + g0 * stride_ask)
        bg_s = tl.load(bgs_ptrs + g0 * stride_bsk)
        if GATED:
            bu_s = tl.load(bus_ptrs + g0 * stride_bsk)

    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(kb_start, kb_end):
        k0 = kb * BLOCK_K
        if EVEN_K:
            a = tl.load(a_ptrs + k0 * stride_ak)
            bg = tl.load(bg_ptrs + k0 * stride_bk)
        else:  # zeros past K: the partial last block adds nothing
            a = tl.load(a_ptrs + k0 * stride_ak, mask=offs_k[None, :] < K - k0, other=0.0)
            bg = tl.load(bg_ptrs + k0 * stride_bk, mask=offs_k[:, None] < K - k0, other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            bg = bg.to(tl.float32)
        if FP8:
            g_next = tl.minimum(kb + 1, kb_end - 1) * BLOCK_K // SCALE_GROUP  # the last iteration re-reads: harmless
            a_s_next = tl.load(as_ptrs + g_next * stride_ask)
            bg_s_next = tl.load(bgs_ptrs + g_next * stride_bsk)
            acc_g += tl.dot(a, bg) * a_s[:, None] * bg_s[None, :]
            bg_s = bg_s_next
        else:
            acc_g = tl.dot(a, bg, acc_g)
        if GATED:
            if EVEN_K:
                bu = tl.load(bu_ptrs + k0 * stride_bk)
            else:
                bu = tl.load(bu_ptrs + k0 * stride_bk, mask=offs_k[:, None] < K - k0, other=0.0)
            if UPCAST:
                bu = bu.to(tl.float32)
            if FP8:
                bu_s_next = tl.load(bus_ptrs + g_next * stride_bsk)
                acc_u += tl.dot(a, bu) * a_s[:, None] * bu_s[None, :]
                bu_s = bu_s_next
            else:
                acc_u = tl.dot(a, bu, acc_u)
        if FP8:
            a_s = a_s_next

    if MUL_ROUTED_WEIGHT:
        acc_g *= tl.load(topk_weight_ptr + pair, mask=pair_mask, other=0.0).to(tl.float32)[:, None]
    if SPLIT_K > 1:
        tl.atomic_add(c_ptrs, acc_g, mask=c_mask)
        if GATED:
            tl.atomic_add(c_ptrs + N * stride_cn, acc_u, mask=c_mask)
    elif GATED:
        tl.store(c_ptrs, (_activate(acc_g, ACTIVATION) * acc_u).to(c_ptr.dtype.element_ty), mask=c_mask)
    else:
        tl.store(c_ptrs, acc_g.to(c_ptr.dtype.element_ty), mask=c_mask)


@triton.jit
def _act_mul_kernel(ws_ptr, out_ptr, N, stride_wm, stride_om, ACTIVATION: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[m, :N] = act(ws[m, :N]) * ws[m, N:2N]: GEMM1's epilogue after its split-K partials are summed."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    g = tl.load(ws_ptr + row * stride_wm + cols, mask=mask, other=0.0)
    u = tl.load(ws_ptr + row * stride_wm + N + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_om + cols, (_activate(g, ACTIVATION) * u).to(out_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------------- launcher


def is_capturing(t: torch.Tensor) -> bool:
    """Whether a CUDA graph is being captured on ``t``'s device (the driver's answer: any capture, however begun)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _describe(name: str, t: torch.Tensor) -> str:
    return f"{name} (shape {tuple(t.shape)}, dtype {t.dtype}, stride {t.stride()}, device {t.device})"


def check_moe_inputs(
    hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weight: torch.Tensor,
    topk_ids: torch.Tensor, w1_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
    activation: str = "silu",
) -> bool:
    """Validate the fused-MoE arguments (shapes, dtypes, devices, contiguity, scale layouts; ValueError naming the
    tensor with its shape, dtype, stride and device); True for the FP8 block-scale variant. Expert ids outside
    [0, E) raise too, unless a CUDA graph is being captured (the check syncs with the host; the kernels give such
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
            raise ValueError(f"fused_moe: {_describe(name, t)} is not on hidden_states' device {dev}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"fused_moe: activation {activation!r} is not one of {list(ACTIVATIONS)}")
    if hidden_states.dim() != 2 or hidden_states.dtype not in HALF_DTYPES or hidden_states.stride(-1) != 1:
        raise ValueError(f"fused_moe: {_describe('hidden_states', hidden_states)} must be (T, H) bf16/fp16 with "
                         "contiguous rows")
    T, H = hidden_states.shape
    if w1.dim() != 3 or w1.shape[2] != H or w1.shape[1] % 2 or w1.shape[1] == 0:
        raise ValueError(f"fused_moe: {_describe('w1', w1)} must be (E, 2I, H={H}) (gate rows then up rows)")
    E, inter_dim = w1.shape[0], w1.shape[1] // 2
    if w2.dim() != 3 or tuple(w2.shape) != (E, H, inter_dim):
        raise ValueError(f"fused_moe: {_describe('w2', w2)} must be (E, H, I) = ({E}, {H}, {inter_dim}) to match "
                         "w1")
    fp8 = w1.dtype == FP8
    if w1.dtype not in (hidden_states.dtype, FP8) or w2.dtype != w1.dtype:
        raise ValueError(f"fused_moe: {_describe('w1', w1)} and {_describe('w2', w2)} must both have "
                         f"hidden_states' dtype {hidden_states.dtype} or both be {FP8}")
    for name, t in (("w1", w1), ("w2", w2)):
        if not t.is_contiguous():
            raise ValueError(f"fused_moe: {_describe(name, t)} must be contiguous")
    if fp8 != (w1_scale is not None) or fp8 != (w2_scale is not None):
        raise ValueError(f"fused_moe: w1_scale and w2_scale are {'required' if fp8 else 'only for'} FP8 weights "
                         f"(w1 is {w1.dtype})")
    if fp8:
        for name, t, rows, cols in (("w1_scale", w1_scale, 2 * inter_dim, H), ("w2_scale", w2_scale, H, inter_dim)):
            want = (E, triton.cdiv(rows, SCALE_BLOCK), triton.cdiv(cols, SCALE_BLOCK))
            if tuple(t.shape) != want or t.dtype != torch.float32:
                raise ValueError(f"fused_moe: {_describe(name, t)} must be float32 {want}: one scale per "
                                 f"({SCALE_BLOCK}, {SCALE_BLOCK}) block")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != T or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"fused_moe: {_describe('topk_ids', topk_ids)} must be int32/int64 (T={T}, k)")
    if tuple(topk_weight.shape) != tuple(topk_ids.shape) or topk_weight.dtype not in (torch.float32,
                                                                                      hidden_states.dtype):
        raise ValueError(f"fused_moe: {_describe('topk_weight', topk_weight)} must be float32 or "
                         f"{hidden_states.dtype} with topk_ids' shape {tuple(topk_ids.shape)}")
    for name, t in (("topk_weight", topk_weight), ("topk_ids", topk_ids)):
        if not t.is_contiguous():
            raise ValueError(f"fused_moe: {_describe(name, t)} must be contiguous")
    if topk_ids.numel() and not is_capturing(topk_ids):
        lo, hi = (int(v) for v in torch.aminmax(topk_ids))  # one reduction, one sync
        if lo < 0 or hi >= E:
            raise ValueError(f"fused_moe: topk_ids holds expert ids in [{lo}, {hi}], outside [0, {E}) "
                             f"({_describe('topk_ids', topk_ids)})")
    return fp8


def k_splits(K: int, cfg: MoeConfig) -> tuple[int, int]:
    """(K blocks per split, splits) of ``cfg`` over K: no empty trailing split, so a ``split_k`` above the K blocks
    runs fewer splits (one split: the plain, non-atomic path)."""
    k_blocks = triton.cdiv(K, cfg.block_k)
    per_split = triton.cdiv(k_blocks, cfg.split_k)
    return per_split, triton.cdiv(k_blocks, per_split)


def _moe_gemm(a, a_scale, w, w_scale, c, topk_weight, align, n, cfg: MoeConfig, *, a_row_div: int, c_row_div: int,
              gated: bool, activation: str, num_pairs: int) -> None:
    """Launch one grouped GEMM (see :func:`_fused_moe_kernel`) of ``n`` output columns over ``w``'s K."""
    sorted_ids, expert_ids, num_post = align
    K = a.shape[1]
    per_split, splits = k_splits(K, cfg)
    num_m_blocks = expert_ids.numel()
    fp8 = w_scale is not None
    scales = (a_scale.stride(0), a_scale.stride(1), w_scale.stride(0), w_scale.stride(1), w_scale.stride(2)) \
        if fp8 else (0, 0, 0, 0, 0)
    grid = (num_m_blocks * triton.cdiv(n, cfg.block_n), splits)
    _fused_moe_kernel[grid](
        a, w, c, a_scale if fp8 else a, w_scale if fp8 else w, topk_weight if topk_weight is not None else a,
        sorted_ids, expert_ids, num_post,
        n, K, num_pairs, w.shape[0], per_split, num_m_blocks,
        a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2), c.stride(0), c.stride(1), *scales,
        A_ROW_DIV=a_row_div, C_ROW_DIV=c_row_div, GATED=gated, ACTIVATION=activation,
        MUL_ROUTED_WEIGHT=topk_weight is not None, FP8=fp8, SCALE_GROUP=SCALE_BLOCK, SPLIT_K=splits,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        EVEN_K=K % cfg.block_k == 0, UPCAST=INTERPRET, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def fused_moe_triton(
    hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weight: torch.Tensor,
    topk_ids: torch.Tensor, *, w1_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
    activation: str = "silu", config1: MoeConfig | None = None, config2: MoeConfig | None = None,
) -> torch.Tensor:
    """The fused MoE (module docstring) with ``config1`` for GEMM1 and ``config2`` for GEMM2 (None:
    :func:`default_config`); returns (T, H) in hidden_states' dtype. Validates its inputs
    (:func:`check_moe_inputs`); no host sync while a CUDA graph is captured."""
    fp8 = check_moe_inputs(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale, activation)
    T, H = hidden_states.shape
    E, inter_dim, topk = w1.shape[0], w1.shape[1] // 2, topk_ids.shape[1]
    dtype, dev = hidden_states.dtype, hidden_states.device
    config1 = config1 or default_config(T, E, topk, inter_dim, H, fp8=fp8)
    config2 = config2 or default_config(T, E, topk, H, inter_dim, fp8=fp8)
    for name, cfg in (("config1", config1), ("config2", config2)):
        problem = config_error(cfg, fp8=fp8) if fp8 else None
        if problem:
            raise ValueError(f"fused_moe: {name} {cfg.name()}: {problem}")
    if T == 0 or topk == 0:
        return torch.zeros((T, H), dtype=dtype, device=dev)
    num_pairs = T * topk
    align1 = moe_align_block_size(topk_ids, E, config1.block_m)
    align2 = align1 if config2.block_m == config1.block_m else moe_align_block_size(topk_ids, E, config2.block_m)
    common = dict(activation=activation, num_pairs=num_pairs)

    # GEMM1: (T, H) tokens -> (T * k, I) act(gate) * up, one row per pair.
    a1, a1_scale = per_token_group_quant_fp8(hidden_states) if fp8 else (hidden_states, None)
    inter = torch.empty((num_pairs, inter_dim), dtype=dtype, device=dev)
    gemm1 = dict(a_row_div=topk, c_row_div=1, gated=True, **common)
    if k_splits(H, config1)[1] > 1:
        ws = torch.zeros((num_pairs, 2 * inter_dim), dtype=torch.float32, device=dev)
        _moe_gemm(a1, a1_scale, w1, w1_scale, ws, None, align1, inter_dim, config1, **gemm1)
        block = min(1024, triton.next_power_of_2(inter_dim))
        _act_mul_kernel[(num_pairs, triton.cdiv(inter_dim, block))](
            ws, inter, inter_dim, ws.stride(0), inter.stride(0), ACTIVATION=activation, BLOCK_N=block, num_warps=4)
    else:
        _moe_gemm(a1, a1_scale, w1, w1_scale, inter, None, align1, inter_dim, config1, **gemm1)

    # GEMM2: (T * k, I) -> routing-weighted rows, summed over the k slots of each token.
    a2, a2_scale = per_token_group_quant_fp8(inter) if fp8 else (inter, None)
    weights = topk_weight.view(-1)
    if k_splits(inter_dim, config2)[1] > 1:
        acc = torch.zeros((T, H), dtype=torch.float32, device=dev)
        _moe_gemm(a2, a2_scale, w2, w2_scale, acc, weights, align2, H, config2, a_row_div=1, c_row_div=topk,
                  gated=False, **common)
        return acc.to(dtype)
    if topk == 1:
        out = torch.empty((T, H), dtype=dtype, device=dev)
        _moe_gemm(a2, a2_scale, w2, w2_scale, out, weights, align2, H, config2, a_row_div=1, c_row_div=1,
                  gated=False, **common)
        return out
    per_pair = torch.empty((num_pairs, H), dtype=dtype, device=dev)
    _moe_gemm(a2, a2_scale, w2, w2_scale, per_pair, weights, align2, H, config2, a_row_div=1, c_row_div=1,
              gated=False, **common)
    return per_pair.view(T, topk, H).sum(dim=1)


# ----------------------------------------------------------------------------------------------------- reference


def fused_moe_ref(
    hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weight: torch.Tensor,
    topk_ids: torch.Tensor, *, w1_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
    activation: str = "silu",
) -> torch.Tensor:
    """float32 loop over experts, cast to hidden_states' dtype. The intermediate is rounded to that dtype as the
    kernels store it; FP8: weights dequantized, and both GEMMs' activations quantized as the kernels quantize them.
    Pairs with an id outside [0, E) contribute nothing."""
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
        inter = (act(h[:, :inter_dim]) * h[:, inter_dim:]).to(dtype)
        y = quantized(inter) @ w2e.t()
        out.index_add_(0, tok, y * topk_weight[tok, slot].float()[:, None])
    return out.to(dtype)
