"""A8W8 block-scale GEMM in Triton: ``out = (XQ * x_scale) @ (WQ * w_scale).T`` with DeepSeek-style scales.

XQ (M, K) and WQ (N, K) are fp8 e4m3; x_scale (M, ceil(K/128)) holds one float32 per row and 128-wide K group (the
activation's (1, 128) groups), w_scale (ceil(N/128), ceil(K/128)) one per (128, 128) weight block; the last blocks
may be partial (DeepSeek-V3 has N = 2112 and 576). The K tile is fixed at 128 by the quantization, so each K step
multiplies one fp8 tile product by one column of scales and accumulates in fp32.

Four variants (docs/design.md, "Ops"; one kernel with different launch geometry, not four code copies):

* ``base``: tiles (BLOCK_SIZE_M over M) x (BLOCK_SIZE_N over N).
* ``swapAB``: computes out.T = W @ X.T so that a small M sits on the MMA's N side, whose minimum is 16 (the MMA's M
  side wants 64 rows per warpgroup on Hopper: M = 1..16 would waste 75% or more of it).
* ``splitK`` / ``splitK_swapAB``: the K blocks are cut into NUM_KSPLIT ranges run by separate programs that write
  float32 partial tiles to a workspace; :func:`~aiter_gemm.kernels.common.splitk_reduce` sums them in a fixed
  order (deterministic, no atomics) and casts. This fills the GPU when M x N gives fewer tiles than it has SMs
  (132 on H100).

Options every variant takes (named in ``kernelName``): TMA tile loads (``_TMA``, Hopper's bulk tensor copy engine;
zero-fills rows past M / N), two column subtiles per K block (``_NS2``, halving the registers of the unscaled
product), Triton's warp specialization (``_WS``). The scales cost one multiply per product element (the weight
scale is a scalar per tile and K block whenever the tile lies in one 128-row block) and are loaded one K block
ahead: what made the kernel fast (docs/exploration.md, "The block-scale kernel").

Contents: the config (:class:`BlockscaleConfig`, whose ``name`` is the ``kernelName`` written in tuned CSVs), the
one function that decides which configs a shape supports (:func:`config_error`, :func:`config_space`), the kernels,
the launcher :func:`gemm_a8w8_blockscale_triton` and the float32 reference :func:`gemm_a8w8_blockscale_ref`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from aiter_gemm.configs import json_int
from aiter_gemm.device import REFERENCE_ARCH, REFERENCE_CU, smem_limit
from aiter_gemm.kernels.act_quant import per_token_group_quant_fp8_ref
from aiter_gemm.kernels.blockscale_format import FP8, FP8_MAX, MIN_SCALE, SCALE_BLOCK
from aiter_gemm.kernels.common import (
    INTERPRET,
    MAX_GROUP_SIZE_M,
    MAX_KSPLIT,
    MAX_STAGES,
    KernelName,
    splitk_reduce,
    tile_coords,
    tma_usable,
)
from aiter_gemm.triton_launch import Launch

BLOCK_SIZE_K = SCALE_BLOCK  # the K tile: one quantization group


#: Shared memory the epilogue's layout conversion needs beside the pipelined tiles (27 KiB of Hopper's 227: the
#: largest tiles that ran without a shared-memory launch failure on the H100 left this much).
_EPILOGUE_SMEM = 27 * 1024
#: fp32 registers per thread for the accumulator plus one K block's unscaled product (as large, or half with
#: N_SUBTILES=2) above which the kernel spills, out of 255 that also hold addresses and scales (the H100
#: measurements behind it: docs/exploration.md, "The block-scale kernel").
_MAX_ACC_REGS_PER_THREAD = 192


# ----------------------------------------------------------------------------------------------------- configs


@dataclass(frozen=True)
class Variant:
    """A launch geometry: whether X and W trade MMA sides, and whether K is split across programs."""

    name: str
    swap_ab: bool
    split_k: bool


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("base", swap_ab=False, split_k=False),
        Variant("swapAB", swap_ab=True, split_k=False),
        Variant("splitK", swap_ab=False, split_k=True),
        Variant("splitK_swapAB", swap_ab=True, split_k=True),
    )
}

#: The ``kernelName`` grammar (:attr:`BlockscaleConfig.name`).
NAME = KernelName("{variant:" + "|".join(VARIANTS) + "}-BM{BM}_BN{BN}_BK{BK}_GM{GM}_SK{SK}_W{W}_S{S}"
                  "[_NS{NS:2}][_TMA][_WS]", "block-scale Triton kernelName", f"; variants: {', '.join(VARIANTS)}")
_POW2_TILES = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class BlockscaleConfig:
    """One kernel configuration. BLOCK_SIZE_M / BLOCK_SIZE_N tile the problem's M and N (the output's rows and
    columns) whatever the variant; swapAB only changes which of them the MMA puts on its M side."""

    #: The tuned-CSV ``libtype`` of every config (the other block-scale implementation is torch's).
    libtype: ClassVar[str] = "triton"
    variant: str = "base"
    BLOCK_SIZE_M: int = 128
    BLOCK_SIZE_N: int = 128
    BLOCK_SIZE_K: int = BLOCK_SIZE_K
    GROUP_SIZE_M: int = 8
    NUM_KSPLIT: int = 1
    num_warps: int = 4
    num_stages: int = 3
    #: Load tiles through tensor descriptors (Hopper's bulk tensor copy engine) instead of pointer arithmetic; the
    #: launcher falls back to pointers for tensors a descriptor cannot address (K not contiguous, misaligned).
    TMA: bool = False
    #: Triton's automatic warp specialization of the K loop (producer / consumer warps).
    WARP_SPECIALIZE: bool = False
    #: 2: compute each K block's product in two column halves of the tile, so the unscaled product needs half the
    #: registers and a 128 x 256 tile fits on 8 warps (accumulator 128 + product 64 registers per thread).
    N_SUBTILES: int = 1

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError(f"invalid A8W8 block-scale config {self.name}: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Reasons this config is malformed on any shape (empty when it is well formed)."""
        out = []
        if self.variant not in VARIANTS:
            out.append(f"variant {self.variant!r} is not one of {sorted(VARIANTS)}")
        elif VARIANTS[self.variant].split_k != (self.NUM_KSPLIT > 1):
            out.append(f"variant {self.variant} needs NUM_KSPLIT {'> 1' if VARIANTS[self.variant].split_k else '== 1'}")
        if self.BLOCK_SIZE_K != BLOCK_SIZE_K:
            out.append(f"BLOCK_SIZE_K must be {BLOCK_SIZE_K} (the quantization group), not {self.BLOCK_SIZE_K}")
        for field in ("BLOCK_SIZE_M", "BLOCK_SIZE_N"):
            if getattr(self, field) not in _POW2_TILES:
                out.append(f"{field} must be one of {_POW2_TILES}")
        if not 1 <= self.GROUP_SIZE_M <= MAX_GROUP_SIZE_M:
            out.append(f"GROUP_SIZE_M must be in 1..{MAX_GROUP_SIZE_M}")
        if not 1 <= self.NUM_KSPLIT <= MAX_KSPLIT:
            out.append(f"NUM_KSPLIT must be in 1..{MAX_KSPLIT}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            out.append("num_warps must be a power of two <= 16")
        if not 1 <= self.num_stages <= MAX_STAGES:
            out.append(f"num_stages must be in 1..{MAX_STAGES}")
        if self.N_SUBTILES not in (1, 2):
            out.append("N_SUBTILES must be 1 or 2")
        elif self.variant in VARIANTS and self.kernel_tiles()[1] // self.N_SUBTILES < 16:
            out.append("N_SUBTILES=2 needs a tile of >= 32 on the MMA's N side")
        return out

    @property
    def name(self) -> str:
        """The ``kernelName`` spelling, e.g. ``splitK_swapAB-BM16_BN128_BK128_GM1_SK4_W4_S3`` (then ``_NS2``,
        ``_TMA`` and ``_WS`` when those are on)."""
        return NAME.format({
            "variant": self.variant, "BM": self.BLOCK_SIZE_M, "BN": self.BLOCK_SIZE_N, "BK": self.BLOCK_SIZE_K,
            "GM": self.GROUP_SIZE_M, "SK": self.NUM_KSPLIT, "W": self.num_warps, "S": self.num_stages,
            "NS": str(self.N_SUBTILES) if self.N_SUBTILES > 1 else None, "TMA": self.TMA, "WS": self.WARP_SPECIALIZE,
        })

    @classmethod
    def from_name(cls, name: str) -> "BlockscaleConfig":
        """Parse a ``kernelName`` strictly (exact grammar, valid values); ValueError saying what is wrong."""
        v = NAME.parse(name)
        return cls(v["variant"], v["BM"], v["BN"], v["BK"], v["GM"], v["SK"], v["W"], v["S"], v["TMA"], v["WS"],
                   int(v["NS"] or 1))

    def to_json(self) -> dict[str, object]:
        """The entry written in per-(N, K) JSON files (AITER's key names plus ``variant``)."""
        return {
            "variant": self.variant, "BLOCK_SIZE_M": self.BLOCK_SIZE_M, "BLOCK_SIZE_N": self.BLOCK_SIZE_N,
            "BLOCK_SIZE_K": self.BLOCK_SIZE_K, "GROUP_SIZE_M": self.GROUP_SIZE_M, "NUM_KSPLIT": self.NUM_KSPLIT,
            "num_warps": self.num_warps, "num_stages": self.num_stages, "TMA": self.TMA,
            "WARP_SPECIALIZE": self.WARP_SPECIALIZE, "N_SUBTILES": self.N_SUBTILES,
        }

    @classmethod
    def from_json(cls, entry: dict[str, object]) -> "BlockscaleConfig":
        """Inverse of :meth:`to_json`; unknown or missing keys are errors (ValueError naming them). ``TMA`` and
        ``WARP_SPECIALIZE`` (false) and ``N_SUBTILES`` (1) are optional, as AITER-style files do not have them."""
        fields = ("variant", "BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "NUM_KSPLIT",
                  "num_warps", "num_stages")
        flags = ("TMA", "WARP_SPECIALIZE")
        unknown = sorted(set(entry) - set(fields) - set(flags) - {"N_SUBTILES"})
        missing = [f for f in fields if f not in entry]
        if unknown or missing:
            raise ValueError(f"config entry has unknown keys {unknown} / misses keys {missing}")
        values: dict[str, object] = {"variant": str(entry["variant"])}
        for f in fields[1:]:
            values[f] = json_int(f, entry[f])
        for f in flags:
            if not isinstance(entry.get(f, False), bool):
                raise ValueError(f"{f} must be true or false, got {entry[f]!r}")
            values[f] = entry.get(f, False)
        values["N_SUBTILES"] = json_int("N_SUBTILES", entry.get("N_SUBTILES", 1))
        return cls(**values)  # type: ignore[arg-type]

    def kernel_tiles(self) -> tuple[int, int]:
        """(tile over the MMA's M side, tile over its N side): swapped for swapAB variants."""
        if VARIANTS[self.variant].swap_ab:
            return self.BLOCK_SIZE_N, self.BLOCK_SIZE_M
        return self.BLOCK_SIZE_M, self.BLOCK_SIZE_N


def config_error(cfg: BlockscaleConfig, M: int, N: int, K: int, arch: str = REFERENCE_ARCH) -> str | None:
    """Why ``cfg`` cannot run (M, N, K) here (shared memory over budget, NUM_KSPLIT over the K blocks) or would
    spill registers; None if it can. The one rule shared by the runtime (rows naming such a config are misses) and
    the tuner (it never times them)."""
    if M < 1 or N < 1 or K < 1:
        return f"empty problem M={M} N={N} K={K}"
    kbm, kbn = cfg.kernel_tiles()
    # Pipelined fp8 tiles: num_stages copies of an (kbm x 128) and a (kbn x 128) one-byte tile in shared memory.
    smem = cfg.num_stages * (kbm + kbn) * BLOCK_SIZE_K
    budget = smem_limit(arch) - _EPILOGUE_SMEM
    if smem > budget:
        return f"needs {smem} B of shared memory for {cfg.num_stages} stages (budget {budget} on {arch})"
    acc_regs = kbm * kbn // (32 * cfg.num_warps)
    live = acc_regs + acc_regs // cfg.N_SUBTILES
    if live > _MAX_ACC_REGS_PER_THREAD:
        return (f"accumulator and K block product need {live} registers per thread "
                f"(> {_MAX_ACC_REGS_PER_THREAD}: spills)")
    k_blocks = triton.cdiv(K, BLOCK_SIZE_K)
    if cfg.NUM_KSPLIT > k_blocks:
        return f"NUM_KSPLIT={cfg.NUM_KSPLIT} exceeds the {k_blocks} K blocks"
    return None


def config_space(M: int, N: int, K: int, quick: bool = False, num_sms: int = REFERENCE_CU,
                 arch: str = REFERENCE_ARCH) -> list[BlockscaleConfig]:
    """Every config the tuner should time for (M, N, K), pruned by :func:`config_error` and by rules that only
    remove configs that lose (:func:`_worth_timing`). Full: variant x tiles x GROUP_SIZE_M x split-K x warps x
    stages x N subtiles, all with TMA loads (on H100 they matched or beat pointer loads on every shape explored)
    and warp specialization tried on 8-warp tiles. ``quick``: a short list per M class (benchmarks, quick tuning)."""
    if quick:
        raw = _quick_space(M)
    else:
        k_blocks = triton.cdiv(K, BLOCK_SIZE_K)
        raw = []
        for variant in VARIANTS.values():
            # swapAB helps only while M is below the MMA's 64-row minimum on its M side (small M only).
            if variant.swap_ab and M > 128:
                continue
            splits = [s for s in (2, 3, 4, 6, 8, 12, 16) if s <= k_blocks // 2] if variant.split_k else [1]
            for bm, bn, gm, sk, warps, stages, ns in itertools.product(
                _POW2_TILES, (32, 64, 128, 256), (1,) if variant.swap_ab else (1, 8), splits, (4, 8), (3, 4, 5, 6),
                (1, 2),
            ):
                if ns == 2 and (bm if variant.swap_ab else bn) < 32:
                    continue
                for ws in (False, True) if warps == 8 else (False,):
                    raw.append(BlockscaleConfig(variant.name, bm, bn, BLOCK_SIZE_K, gm, sk, warps, stages, True, ws,
                                                ns))
    return [c for c in dict.fromkeys(raw)
            if config_error(c, M, N, K, arch) is None and _worth_timing(c, M, N, num_sms)]


def _grid(variant: str, bms, bns, gm: int, sks, warps, stages, ws=(False,), ns=1) -> list[BlockscaleConfig]:
    return [BlockscaleConfig(variant, bm, bn, BLOCK_SIZE_K, gm, sk, w, st, True, x, ns)
            for bm, bn, sk, w, st, x in itertools.product(bms, bns, sks, warps, stages, ws)]


def _quick_space(M: int) -> list[BlockscaleConfig]:
    """Hand-picked lists per M class from the H100 exploration (docs/exploration.md)."""
    if M <= 16:
        return (_grid("swapAB", [16], [64, 128], 1, [1], [4], [4, 6])
                + _grid("splitK_swapAB", [16], [64, 128], 1, [2, 4, 8], [4], [4]))
    if M <= 64:
        bm = triton.next_power_of_2(M)
        return (_grid("swapAB", [bm], [64, 128], 1, [1], [4], [3, 4])
                + _grid("base", [64], [64, 128], 1, [1], [4], [3, 4])
                + _grid("splitK", [64], [64, 128], 1, [2, 4], [4], [4])
                + _grid("splitK_swapAB", [bm], [64, 128], 1, [2, 4], [4], [4]))
    if M <= 256:
        return (_grid("base", [64, 128], [64, 128], 8, [1], [4], [3, 4])
                + _grid("base", [128], [128], 8, [1], [8], [3, 4])
                + _grid("splitK", [64, 128], [64, 128], 8, [2, 4], [4], [4])
                + _grid("splitK", [128], [128], 8, [2, 4], [8], [3])
                + _grid("base", [64, 128], [256, 128], 8, [1], [4], [4], ns=2)
                + _grid("base", [128], [256], 8, [1], [8], [4], ns=2))
    return (_grid("base", [128], [128], 8, [1], [8], [3, 4]) + _grid("base", [128], [128], 8, [1], [8], [3], [True])
            + _grid("base", [128, 64], [64, 128], 8, [1], [4], [4, 5])
            + _grid("splitK", [128], [128], 8, [2], [8], [3]) + _grid("splitK", [128], [64], 8, [2], [4], [4])
            + _grid("base", [128], [256], 8, [1], [8], [3, 4], ns=2)
            + _grid("base", [256], [128], 8, [1], [8], [3, 4], ns=2)
            + _grid("base", [128, 64], [128, 256], 8, [1], [4], [4], ns=2))


def _worth_timing(cfg: BlockscaleConfig, M: int, N: int, num_sms: int) -> bool:
    """Prune configs that cannot win: tiles larger than the padded problem, split-K when M x N already fills 2 waves
    of ``num_sms`` SMs, 8 warps on tiles below 128 x 64 (no work for the second warpgroup), GROUP_SIZE_M on one tile
    row."""
    if cfg.BLOCK_SIZE_M > max(16, triton.next_power_of_2(M)) or cfg.BLOCK_SIZE_N > N:
        return False
    tiles = triton.cdiv(M, cfg.BLOCK_SIZE_M) * triton.cdiv(N, cfg.BLOCK_SIZE_N)
    if cfg.NUM_KSPLIT > 1 and tiles >= 2 * num_sms:
        return False
    kbm, kbn = cfg.kernel_tiles()
    if cfg.num_warps == 8 and kbm * kbn < 128 * 64:
        return False
    if cfg.GROUP_SIZE_M > 1 and triton.cdiv(M, cfg.BLOCK_SIZE_M) == 1:
        return False
    return True


#: GPUs (``DeviceIdentity.name``) :func:`decode_config`'s tiles were measured on; elsewhere it gives no tile.
DECODE_MEASURED_ON = frozenset({"NVIDIA H200"})


def decode_config(M: int, N: int, K: int, device_name: str) -> BlockscaleConfig | None:
    """The decode tile (16 < M <= 128) of shape classes where one fixed tile beat torch's block-scaled matmul on
    every measured shape of the class, paired CUDA-graph timing on an H200: 9 tiles over 18 weights of 5 models and
    M 17-256, checked on 14 weights of 4 other models (docs/exploration.md, "The FP8 decode default on the H200").
    None outside those classes and on GPUs not in :data:`DECODE_MEASURED_ON` (the default rules below apply)."""
    if device_name not in DECODE_MEASURED_ON or not 16 < M <= 128 or min(N, K) < 3072:  # the measured range
        return None

    def tile(variant: str, bm: int, bn: int, split: int = 1, stages: int = 4) -> BlockscaleConfig:
        return BlockscaleConfig(variant=variant, BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, GROUP_SIZE_M=1,
                                NUM_KSPLIT=split, num_warps=4, num_stages=stages, TMA=True)

    if K >= 64 * BLOCK_SIZE_K:  # long K, narrow N: few output tiles, so split K
        if N <= 4096:
            return tile("splitK", 64, 64, 4 if M <= 64 else 2)
        return tile("splitK", 64, 64, 4) if N <= 5120 and 32 <= M <= 64 else None
    if M > 64:
        return None
    if N >= 16384:  # wide N: enough output tiles without a split
        return tile("swapAB", 32, 64, stages=6) if M <= 20 else tile("base", 64, 128)
    if M <= 32:
        return tile("swapAB", 32, 64, stages=6)
    return tile("splitK", 64, 64, 2) if N <= 8192 else None


def default_config(M: int, N: int, K: int, num_sms: int = REFERENCE_CU, device_name: str = "") -> BlockscaleConfig:
    """Built-in choice when neither a tuned row nor a JSON entry exists. Rules read off the H100 quick search over
    DeepSeek-V3 and Llama-3-70B shapes (docs/exploration.md, the block-scale kernel):

    * M <= 16: swapAB, 16 x 64 tiles, 6 stages; 16 < M <= 64: 64 x 64 tiles.
    * 64 < M <= 256: 64 x 64 tiles up to N = 4096, 64 x 128 above, 128 x 128 on 8 warps for weights >= 128 MiB.
    * M > 256: 64 x 128 on 4 warps when K <= 2048 or N <= 256 (few K blocks per tile); else 128 x 128 on 8 warps,
      or 128 x 64 on 4 when that wastes less of the last wave of ``num_sms`` programs.
    * split-K doubles while the programs, doubled, still fit one wave and each split keeps >= 8 K blocks; then once
      more when the programs fill under 3/4 of the SMs and each split keeps >= 24 K blocks (a partial second wave
      of streaming programs beats idle SMs there: H100 grid of 132 off-model shapes, M 1-256, the 44 it changes
      1.01-1.39x faster, geomean 1.15x; at 8-16 K blocks a split the same doubling ran 0.90-1.11x: one wave there).
    * Where :func:`decode_config` has a tile for ``device_name``, that tile.
    """
    decode = decode_config(M, N, K, device_name)
    if decode is not None:
        return decode
    k_blocks = triton.cdiv(K, BLOCK_SIZE_K)

    def tile(bm: int, bn: int, warps: int = 4, stages: int = 4, gm: int = 8) -> dict[str, object]:
        return dict(variant="base", BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, GROUP_SIZE_M=gm, num_warps=warps,
                    num_stages=stages)

    def wave_use(bm: int, bn: int) -> float:
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        return tiles / (triton.cdiv(tiles, num_sms) * num_sms)

    if M <= 16:
        cfg = dict(tile(16, 64, stages=6, gm=1), variant="swapAB")
    elif M <= 64:
        cfg = tile(64, 64, gm=1)
    elif M <= 256:
        cfg = tile(128, 128, 8) if N * K >= 2**27 else tile(64, 64) if N <= 4096 else tile(64, 128)
    elif K <= 2048 or N <= 256:
        cfg = tile(64, 128)
    elif wave_use(128, 128) < 0.75 and wave_use(128, 64) > wave_use(128, 128):
        cfg = tile(128, 64)
    else:
        cfg = tile(128, 128, 8)
    tiles = triton.cdiv(M, cfg["BLOCK_SIZE_M"]) * triton.cdiv(N, cfg["BLOCK_SIZE_N"])
    split = 1
    while tiles * split * 2 <= num_sms and k_blocks // (split * 2) >= 8:
        split *= 2
    if tiles * split < 0.75 * num_sms and k_blocks // (split * 2) >= 24:
        split *= 2
    if split > 1:
        cfg["variant"] = "splitK_swapAB" if cfg["variant"] == "swapAB" else "splitK"
    return BlockscaleConfig(**cfg, NUM_KSPLIT=split, TMA=True)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------------- kernels


@triton.jit
def _apply_scales(p, a_s, b_s, A_SCALAR: tl.constexpr, B_SCALAR: tl.constexpr):
    """One K block's product times its scales: one multiply per element when either side's scale is a scalar
    (the other is a per-row or per-column vector), two when both are vectors."""
    if A_SCALAR:
        out = p * (a_s * b_s)[None, :]
    elif B_SCALAR:
        out = p * (a_s * b_s)[:, None]
    else:
        out = p * (a_s[:, None] * b_s[None, :])
    return out


@triton.jit(do_not_specialize=[
    "M", "N", "K", "K_BLOCKS_PER_SPLIT", "stride_cs", "stride_asm", "stride_ask", "stride_bsn", "stride_bsk",
])
def _gemm_a8w8_blockscale_kernel(
    a_ptr, b_ptr, c_ptr, a_scale_ptr, b_scale_ptr, a_desc, b_desc,
    M, N, K, K_BLOCKS_PER_SPLIT,
    stride_am, stride_ak, stride_bn, stride_bk,
    stride_cs, stride_cm, stride_cn,
    stride_asm, stride_ask, stride_bsn, stride_bsk,
    A_SCALE_GROUP: tl.constexpr,  # rows of a sharing one scale: 1 for activations, 128 for weights (swapAB)
    B_SCALE_GROUP: tl.constexpr,
    A_SCALAR: tl.constexpr,  # the a tile lies in one scale block: one scalar scale per K block
    B_SCALAR: tl.constexpr,  # likewise for each b subtile
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    N_SUBTILES: tl.constexpr,  # 1 or 2 products of SUB_N columns per K block (2: half the product's registers)
    SUB_N: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % 128 == 0: no mask on the last K block
    USE_TMA: tl.constexpr,  # a_desc / b_desc are tensor descriptors (Hopper's bulk copy engine) instead of pointers
    WARP_SPECIALIZE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """c[s] = sum over K blocks of split s of (a_blk @ b_blk.T) * a_scale[:, kb] * b_scale[:, kb].

    a (M, K) and b (N, K) are the MMA's sides (X and W, or W and X for swapAB); c may be the output (one split,
    cast to its dtype) or a float32 (splits, M, N) workspace; strides map it to the output's layout either way.
    M, N, K and the scale strides are not specialized on, so one compiled kernel serves every shape of a config."""
    pid = tl.program_id(axis=0)
    pid_k = tl.program_id(axis=1)
    # Grouped ordering: GROUP_SIZE_M tile rows share each b tile column while it is in L2.
    pid_m, pid_n = tile_coords(pid, tl.cdiv(M, BLOCK_SIZE_M), tl.cdiv(N, BLOCK_SIZE_N), GROUP_SIZE_M)

    # Rows past M / N wrap around (the tutorial's trick): loads need no mask, the store masks them off.
    n0 = pid_n * BLOCK_SIZE_N
    n1 = n0 + SUB_N  # second subtile (N_SUBTILES == 2)
    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn0 = (n0 + tl.arange(0, SUB_N)) % N
    offs_bn1 = (n1 + tl.arange(0, SUB_N)) % N
    kb_start = pid_k * K_BLOCKS_PER_SPLIT
    kb_end = min(kb_start + K_BLOCKS_PER_SPLIT, tl.cdiv(K, BLOCK_SIZE_K))
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs0 = b_ptr + offs_k[:, None] * stride_bk + offs_bn0[None, :] * stride_bn
    b_ptrs1 = b_ptr + offs_k[:, None] * stride_bk + offs_bn1[None, :] * stride_bn
    if A_SCALAR:
        a_s_ptrs = a_scale_ptr + (pid_m * BLOCK_SIZE_M // A_SCALE_GROUP) * stride_asm
    else:
        a_s_ptrs = a_scale_ptr + (offs_am // A_SCALE_GROUP) * stride_asm
    if B_SCALAR:
        b_s_ptrs0 = b_scale_ptr + (n0 // B_SCALE_GROUP) * stride_bsn
        b_s_ptrs1 = b_scale_ptr + ((n1 % N) // B_SCALE_GROUP) * stride_bsn
    else:
        b_s_ptrs0 = b_scale_ptr + (offs_bn0 // B_SCALE_GROUP) * stride_bsn
        b_s_ptrs1 = b_scale_ptr + (offs_bn1 // B_SCALE_GROUP) * stride_bsn
    # Scales are loaded one K block ahead: a plain load's latency (~600 cycles from L2) would otherwise stall every
    # iteration, as the pipeliner only prefetches the MMA operands.
    a_s = tl.load(a_s_ptrs + kb_start * stride_ask)
    b_s0 = tl.load(b_s_ptrs0 + kb_start * stride_bsk)
    if N_SUBTILES == 2:
        b_s1 = tl.load(b_s_ptrs1 + kb_start * stride_bsk)

    acc0 = tl.zeros((BLOCK_SIZE_M, SUB_N), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_SIZE_M, SUB_N), dtype=tl.float32)
    for kb in tl.range(kb_start, kb_end, warp_specialize=WARP_SPECIALIZE):
        k0 = kb * BLOCK_SIZE_K
        if USE_TMA:  # out-of-range rows of the box are zero-filled by the copy engine
            a = a_desc.load([pid_m * BLOCK_SIZE_M, k0])
            b0 = b_desc.load([n0, k0]).T
        elif EVEN_K:
            a = tl.load(a_ptrs + k0 * stride_ak)
            b0 = tl.load(b_ptrs0 + k0 * stride_bk)
        else:  # zeros past K: the partial last block adds nothing beyond K
            a = tl.load(a_ptrs + k0 * stride_ak, mask=offs_k[None, :] < K - k0, other=0.0)
            b0 = tl.load(b_ptrs0 + k0 * stride_bk, mask=offs_k[:, None] < K - k0, other=0.0)
        kb_next = tl.minimum(kb + 1, kb_end - 1)  # the last iteration re-reads its own block: harmless
        a_s_next = tl.load(a_s_ptrs + kb_next * stride_ask)
        b_s0_next = tl.load(b_s_ptrs0 + kb_next * stride_bsk)
        if UPCAST:
            a = a.to(tl.float32)
            b0 = b0.to(tl.float32)
        # Scales change every 128 K: each K block's product is scaled before it is accumulated.
        acc0 += _apply_scales(tl.dot(a, b0), a_s, b_s0, A_SCALAR, B_SCALAR)
        if N_SUBTILES == 2:
            if USE_TMA:
                b1 = b_desc.load([n1, k0]).T
            elif EVEN_K:
                b1 = tl.load(b_ptrs1 + k0 * stride_bk)
            else:
                b1 = tl.load(b_ptrs1 + k0 * stride_bk, mask=offs_k[:, None] < K - k0, other=0.0)
            b_s1_next = tl.load(b_s_ptrs1 + kb_next * stride_bsk)
            if UPCAST:
                b1 = b1.to(tl.float32)
            acc1 += _apply_scales(tl.dot(a, b1), a_s, b_s1, A_SCALAR, B_SCALAR)
            b_s1 = b_s1_next
        a_s = a_s_next
        b_s0 = b_s0_next

    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn0 = n0 + tl.arange(0, SUB_N)
    c_ptrs = c_ptr + pid_k * stride_cs + offs_cm[:, None] * stride_cm + offs_cn0[None, :] * stride_cn
    tl.store(c_ptrs, acc0.to(c_ptr.dtype.element_ty), mask=(offs_cm[:, None] < M) & (offs_cn0[None, :] < N))
    if N_SUBTILES == 2:
        offs_cn1 = n1 + tl.arange(0, SUB_N)
        c_ptrs = c_ptr + pid_k * stride_cs + offs_cm[:, None] * stride_cm + offs_cn1[None, :] * stride_cn
        tl.store(c_ptrs, acc1.to(c_ptr.dtype.element_ty), mask=(offs_cm[:, None] < M) & (offs_cn1[None, :] < N))


# ----------------------------------------------------------------------------------------------------- launcher

def gemm_a8w8_blockscale_triton(
    XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
    config: BlockscaleConfig, out: torch.Tensor, launches: list[Launch] | None = None,
) -> torch.Tensor:
    """Run ``config`` writing into ``out`` (M, N). Inputs are assumed validated (see
    :func:`aiter_gemm.ops.a8w8_blockscale.gemm_a8w8_blockscale`); this only sets up the launch geometry of the
    variant. ``launches``: each launch made is appended, for :mod:`aiter_gemm.triton_launch` to bind (the GEMM of
    inputs XQ, WQ, x_scale, w_scale into ``out`` or the split-K workspace, then the reduction)."""
    M, K = XQ.shape
    N = WQ.shape[0]
    variant = VARIANTS[config.variant]
    k_blocks = triton.cdiv(K, BLOCK_SIZE_K)
    per_split = triton.cdiv(k_blocks, config.NUM_KSPLIT)
    splits = triton.cdiv(k_blocks, per_split)  # no empty trailing split (e.g. 7 blocks / 4 -> 2,2,2,1)
    if variant.swap_ab:  # MMA's M side is N: a = W with (128, 128) scales, b = X with per-row scales.
        a, b, a_s, b_s, km, kn = WQ, XQ, w_scale, x_scale, N, M
        a_group, b_group = SCALE_BLOCK, 1
    else:
        a, b, a_s, b_s, km, kn = XQ, WQ, x_scale, w_scale, M, N
        a_group, b_group = 1, SCALE_BLOCK
    bm, bn = config.kernel_tiles()
    sub_n = bn // config.N_SUBTILES
    a_desc = b_desc = None
    if config.TMA and tma_usable(a) and tma_usable(b):
        a_desc = TensorDescriptor.from_tensor(a, [bm, BLOCK_SIZE_K])
        b_desc = TensorDescriptor.from_tensor(b, [sub_n, BLOCK_SIZE_K])
    if splits > 1:
        target = torch.empty((splits, M, N), dtype=torch.float32, device=out.device)
    else:
        target = out
    # Kernel rows index km (= N for swapAB): map (kernel row, kernel col) onto out[m, n].
    t_sm, t_sn = (target.stride(-1), target.stride(-2)) if variant.swap_ab else (target.stride(-2), target.stride(-1))
    grid = (triton.cdiv(km, bm) * triton.cdiv(kn, bn), splits)
    args = dict(zip(_gemm_a8w8_blockscale_kernel.arg_names, (  # the runtime arguments, by name: what a plan packs
        a, b, target, a_s, b_s, a_desc, b_desc, km, kn, K, per_split,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), target.stride(0) if splits > 1 else 0, t_sm, t_sn,
        a_s.stride(0), a_s.stride(1), b_s.stride(0), b_s.stride(1))))
    compiled = _gemm_a8w8_blockscale_kernel[grid](
        **args, A_SCALE_GROUP=a_group, B_SCALE_GROUP=b_group, A_SCALAR=a_group >= bm, B_SCALAR=b_group >= sub_n,
        BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=BLOCK_SIZE_K, GROUP_SIZE_M=config.GROUP_SIZE_M,
        N_SUBTILES=config.N_SUBTILES, SUB_N=sub_n,
        EVEN_K=K % BLOCK_SIZE_K == 0, USE_TMA=a_desc is not None, WARP_SPECIALIZE=config.WARP_SPECIALIZE,
        UPCAST=INTERPRET,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if launches is not None:
        launches.append(Launch(compiled, grid, args, (XQ, WQ, x_scale, w_scale), (target,)))
    if splits > 1:
        splitk_reduce(target, None, out, launches)
    return out


# ----------------------------------------------------------------------------------------------------- reference


def dequantize_blockscale(
    XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 X (M, K) and W (N, K) with the scales applied: each x_scale column covers 128 K, each w_scale
    element a (128, 128) block (the last block may be partial)."""
    K = XQ.shape[1]
    xs = x_scale.float().repeat_interleave(SCALE_BLOCK, dim=1)[:, :K]
    return XQ.float() * xs, dequantize_weight_blockscale(WQ, w_scale)


def dequantize_weight_blockscale(WQ: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """float32 W (N, K) = WQ with each w_scale element applied to its (128, 128) block (the last may be partial)."""
    N, K = WQ.shape
    ws = w_scale.float().repeat_interleave(SCALE_BLOCK, dim=0).repeat_interleave(SCALE_BLOCK, dim=1)[:N, :K]
    return WQ.float() * ws


def gemm_a8w8_blockscale_ref(
    XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """float32 dequantize-then-multiply reference, cast to ``dtype``."""
    x, w = dequantize_blockscale(XQ, WQ, x_scale, w_scale)
    return (x @ w.t()).to(dtype)


def quantize_weight_blockscale(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(WQ, w_scale) of a float weight (N, K): amax per (128, 128) block mapped to the fp8 e4m3 maximum (448), as
    DeepSeek-V3 / Qwen3-FP8 checkpoints store it (``weight``, ``weight_scale_inv``)."""
    N, K = w.shape
    kb, nb = triton.cdiv(K, SCALE_BLOCK), triton.cdiv(N, SCALE_BLOCK)
    wp = torch.nn.functional.pad(w.float(), (0, kb * SCALE_BLOCK - K, 0, nb * SCALE_BLOCK - N))
    wp = wp.view(nb, SCALE_BLOCK, kb, SCALE_BLOCK)
    w_scale = (wp.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=MIN_SCALE)
    WQ = (wp / w_scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).view(nb * SCALE_BLOCK, -1)[:N, :K]
    WQ = WQ.to(FP8).contiguous()
    return WQ, w_scale.contiguous()


def quantize_blockscale(
    x: torch.Tensor, w: torch.Tensor, fp8: torch.dtype = FP8,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(XQ, WQ, x_scale, w_scale) from float x (M, K) and w (N, K): amax per (1, 128) group of x and per (128, 128)
    block of w mapped to the fp8 maximum (448 for e4m3fn). For tests and benchmarks."""
    if fp8 != FP8:
        raise TypeError(f"quantize_blockscale: fp8 dtype {fp8} is not supported (only {FP8})")
    XQ, x_scale = per_token_group_quant_fp8_ref(x.float())
    WQ, w_scale = quantize_weight_blockscale(w)
    return XQ, WQ, x_scale, w_scale
