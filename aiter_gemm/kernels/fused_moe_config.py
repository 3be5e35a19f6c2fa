"""Launch configurations of the fused-MoE Triton kernels (:mod:`aiter_gemm.kernels.fused_moe`): :class:`MoeConfig`,
its ``kernelName`` spelling and vLLM / SGLang JSON form, the one rule of what runs (:func:`config_error`), the
tuner's search space (:func:`config_space`) and the built-in default (:func:`default_config`).

Besides the tiles a config may name variants of the call (flags in its ``kernelName``), each one launch fewer at
small T and none the default:

* ``QA``: FP8 only. The GEMM loads its activations in bf16 and quantizes them per row and 128-wide K group in the
  kernel (``block_k`` = 128: one K block is one group), instead of a separate quantization launch before it.
* ``DIRECT``: no token sorting. Block ``b`` of the GEMM is pair ``b`` alone (its expert read from ``topk_ids``), so
  the align launch goes; every pair reads its expert's weights, even when pairs share one (for T * k small against E).
* ``KSUM``: GEMM2 only, without split-K. The program that writes the last of a token's k rows of an output tile sums
  the k rows in slot order into the output (a per-(token, tile) arrival counter, zeroed by GEMM1), instead of a
  separate sum launch; the result is the unfused path's, deterministic.
* ``FUSED``: both GEMMs in one launch for few pairs (:mod:`~aiter_gemm.kernels.fused_moe_fused`), after one memset:
  one program per (pair, ``block_n`` intermediate columns) computes its columns of act(gate) * up and adds their
  share of GEMM2 atomically into a float32 row per token; the last arrival writes the token's output. The same
  config names both GEMMs (:func:`pair_error`); ``block_m`` is unused (16), no split-K, no other flag.
* ``SWAP``: each tile computed transposed, acc^T = W_tile @ X_tile^T, and stored transposed, so the ``block_n``
  weight rows fill the MMA's M side (Hopper's wgmma needs M >= 64) and the block's few pairs its N side (``block_m``
  down to 8, which only ``SWAP`` allows). Internal to a tile: the intermediate is the same, so a ``SWAP`` GEMM pairs
  with any other; it composes with the flags above but ``FUSED``. Offered where an expert's block is mostly padding
  (:func:`expected_rows` <= :data:`SWAP_MAX_ROWS`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import triton

from aiter_gemm.configs import json_int
from aiter_gemm.device import REFERENCE_ARCH, REFERENCE_CU, smem_limit
from aiter_gemm.kernels.blockscale_format import SCALE_BLOCK
from aiter_gemm.kernels.common import (
    MAX_ACC_NUMEL,
    MAX_GROUP_SIZE_M,
    MAX_KSPLIT,
    MAX_STAGES,
    MAX_TILE_NUMEL,
    KernelName,
)

__all__ = ["DIRECT_MAX_PAIRS", "NAME", "PREFILL_TOKENS", "SWAP_MAX_ROWS", "MoeConfig", "active_experts",
           "config_error", "config_space", "default_config", "expected_rows", "pair_error", "usage_error"]

#: The ``kernelName`` grammar of :meth:`MoeConfig.name`.
NAME = KernelName("moe_BM{BM}_BN{BN}_BK{BK}_GM{GM}_SK{SK}_W{W}_S{S}[_QA][_DIRECT][_KSUM][_FUSED][_SWAP]",
                  "fused-MoE Triton kernelName", "; e.g. 'moe_BM16_BN64_BK128_GM1_SK1_W4_S4'")
#: vLLM / SGLang JSON keys -> fields (``SPLIT_K`` optional).
_VLLM_KEYS = {"BLOCK_SIZE_M": "block_m", "BLOCK_SIZE_N": "block_n", "BLOCK_SIZE_K": "block_k",
              "GROUP_SIZE_M": "group_m", "num_warps": "num_warps", "num_stages": "num_stages", "SPLIT_K": "split_k"}
#: Keys of vLLM's ROCm files: AMD compiler hints with no meaning on NVIDIA, accepted and ignored.
_ROCM_HINTS = frozenset({"waves_per_eu", "matrix_instr_nonkdim", "kpack"})
#: The variant flags: field -> kernelName flag (module docstring).
_FLAGS = {"quant_a": "QA", "direct": "DIRECT", "ksum": "KSUM", "fused": "FUSED", "swap": "SWAP"}
#: The search space offers ``DIRECT`` and ``FUSED`` up to this many (token, slot) pairs: one block per pair.
DIRECT_MAX_PAIRS = 64
#: From this many tokens the search space adds the large (prefill) tiles.
PREFILL_TOKENS = 512
#: The search space offers ``SWAP`` up to this many expected rows per active expert (:func:`expected_rows`): where
#: the default's block has 16 rows, an unswapped MMA's M of 16, below wgmma's 64, and mostly padding under 8 rows.
SWAP_MAX_ROWS = 16


@dataclass(frozen=True)
class MoeConfig:
    """One launch configuration of either GEMM: the token-block (``block_m``), output-column (``block_n``) and K
    tiles, the grouped launch order, warps, pipeline stages, K splits and the variant flags (module docstring)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 1
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1
    quant_a: bool = False
    direct: bool = False
    ksum: bool = False
    fused: bool = False
    swap: bool = False

    def __post_init__(self) -> None:
        for field in ("block_m", "block_n", "block_k"):
            v = getattr(self, field)
            least = 8 if field == "block_m" and self.swap else 16
            if isinstance(v, bool) or not isinstance(v, int) or v < least or v & (v - 1):
                raise ValueError(f"MoeConfig {field}={v!r} must be a power of two >= {least}" + (
                    " (8 only with SWAP, where the rows are the MMA's N side)" if field == "block_m" else ""))
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
        for field in _FLAGS:
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"MoeConfig {field}={getattr(self, field)!r} must be a bool")
        if self.ksum and self.split_k > 1:
            raise ValueError(f"MoeConfig ksum with split_k={self.split_k}: split-K adds the k slots already")

    @property
    def plain(self) -> bool:
        """No variant flag: the kernel vLLM's and SGLang's fused MoE run (their JSON files hold only such)."""
        return not any(getattr(self, field) for field in _FLAGS)

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
        """The vLLM / SGLang JSON value (``SPLIT_K`` only when > 1, so files stay readable by vLLM); the variant
        flags have no key there (only :attr:`plain` configs belong in those files: the tuner writes no other)."""
        out = {key: getattr(self, field) for key, field in _VLLM_KEYS.items() if key != "SPLIT_K"}
        if self.split_k > 1:
            out["SPLIT_K"] = self.split_k
        return out

    def name(self) -> str:
        """The ``kernelName`` spelling, e.g. ``moe_BM16_BN64_BK128_GM1_SK1_W4_S4`` (``_QA``, ``_DIRECT``, ``_KSUM``,
        ``_FUSED``, ``_SWAP`` appended for the variants)."""
        return NAME.format({"BM": self.block_m, "BN": self.block_n, "BK": self.block_k, "GM": self.group_m,
                            "SK": self.split_k, "W": self.num_warps, "S": self.num_stages,
                            **{flag: getattr(self, field) for field, flag in _FLAGS.items()}})

    @classmethod
    def parse(cls, name: str) -> MoeConfig:
        """Inverse of :meth:`name`; ValueError saying what is wrong."""
        v = NAME.parse(name)
        return cls(v["BM"], v["BN"], v["BK"], v["GM"], v["W"], v["S"], v["SK"],
                   **{field: v[flag] for field, flag in _FLAGS.items()})


#: Shared memory kept free beside the pipelined tiles for the epilogue's layout conversion (as the block-scale
#: kernel's budget; docs/exploration.md).
_EPILOGUE_SMEM = 27 * 1024
#: float32 tile registers per thread a GEMM may hold: its accumulators (GEMM1: gate and up; GEMM2: one), with FP8
#: the unscaled K-block products too. At this bound ptxas (Triton 3.9, sm_90) gave no tile a spill, ``QA`` ones
#: included (its activation tile is transient); at twice it, hundreds of bytes (docs/exploration.md).
_MAX_ACC_REGS = 128


def usage_error(cfg: MoeConfig, *, fp8: bool, stage: int | None = None) -> str | None:
    """Why ``cfg`` cannot compute GEMM ``stage`` (1 or 2; None: either) of bf16/fp16 or FP8 experts at all,
    whatever the device; None if it can. FP8 needs ``block_k`` to divide the 128-wide scale group (``FUSED``: a
    multiple of it)."""
    if fp8 and not cfg.fused and SCALE_BLOCK % cfg.block_k:
        return f"block_k={cfg.block_k} must divide the FP8 scale block {SCALE_BLOCK}"
    if cfg.quant_a and not fp8:
        return "QA quantizes the activations of FP8 experts; these experts are not FP8"
    if cfg.quant_a and cfg.block_k != SCALE_BLOCK:
        return f"QA needs block_k={SCALE_BLOCK}: one K block is one quantization group"
    if cfg.ksum and stage != 2:
        return "KSUM sums GEMM2's k slots: a GEMM2 config only"
    if cfg.fused:
        if (cfg.block_m, cfg.group_m, cfg.split_k) != (16, 1, 1) or cfg.quant_a or cfg.direct or cfg.ksum or cfg.swap:
            return ("FUSED runs one pair per program with its own quantization, routing and k-sum: it takes "
                    "block_m=16 (unused), group_m=1, split_k=1 and no QA, DIRECT, KSUM or SWAP")
        if fp8 and cfg.block_k % SCALE_BLOCK:
            return (f"FUSED on FP8 experts needs block_k a multiple of {SCALE_BLOCK} (got {cfg.block_k}): a K block "
                    f"is whole quantization groups")
    return None


def pair_error(config1: MoeConfig, config2: MoeConfig) -> str | None:
    """Why GEMM1's ``config1`` and GEMM2's ``config2`` cannot run as one call (None: they can): a ``FUSED``
    config runs both GEMMs in its one launch, so it names both stages or neither."""
    if (config1.fused or config2.fused) and config1 != config2:
        return (f"FUSED runs both GEMMs in one launch: GEMM1's and GEMM2's configs must be the same one (got "
                f"{config1.name()} and {config2.name()})")
    return None


def config_error(cfg: MoeConfig, *, fp8: bool, arch: str = REFERENCE_ARCH, stage: int | None = None) -> str | None:
    """Why ``cfg`` cannot run (:func:`usage_error`) or would spill on ``arch`` as GEMM ``stage`` (1 or 2; None: as
    either); None if it can."""
    why = usage_error(cfg, fp8=fp8, stage=stage)
    if why is not None:
        return why
    if cfg.fused:  # one activation row; GEMM1's gate and up weight tiles, as float32 products, bound registers
        w_bytes = 1 if fp8 else 2
        smem = cfg.num_stages * cfg.block_k * (2 + 2 * cfg.block_n * w_bytes)
        regs = 2 * cfg.block_n * cfg.block_k // (32 * cfg.num_warps)
        if smem > smem_limit(arch) - _EPILOGUE_SMEM:
            return f"needs {smem} B of shared memory for {cfg.num_stages} stages (budget " \
                   f"{smem_limit(arch) - _EPILOGUE_SMEM} on {arch})"
        if regs > _MAX_ACC_REGS:
            return f"FUSED's gate and up weight tiles need {regs} registers per thread (> {_MAX_ACC_REGS}: spills)"
        return None
    gated = stage != 2  # GEMM1 (or either): gate and up tiles, two accumulators
    a_bytes = 2 if cfg.quant_a or not fp8 else 1
    b_tiles = 2 if gated else 1
    smem = cfg.num_stages * cfg.block_k * (cfg.block_m * a_bytes + b_tiles * cfg.block_n * (1 if fp8 else 2))
    budget = smem_limit(arch) - _EPILOGUE_SMEM
    if smem > budget:
        return f"needs {smem} B of shared memory for {cfg.num_stages} stages (budget {budget} on {arch})"
    tiles = b_tiles * (2 if fp8 else 1)  # accumulators, and FP8's unscaled products of each K block
    regs = tiles * cfg.block_m * cfg.block_n // (32 * cfg.num_warps)
    if regs > _MAX_ACC_REGS:
        return f"GEMM{1 if gated else 2}'s float32 tiles need {regs} registers per thread (> {_MAX_ACC_REGS}: spills)"
    return None


def _variants(cfg: MoeConfig, *, fp8: bool, pairs: int | None) -> list[MoeConfig]:
    """``cfg`` and its flagged variants worth timing at ``pairs`` (token, slot) pairs (None: no variant)."""
    if pairs is None:
        return [cfg]
    qa = (False, True) if fp8 and cfg.block_k == SCALE_BLOCK else (False,)
    direct = (False, True) if pairs <= DIRECT_MAX_PAIRS and cfg.block_m <= 16 else (False,)
    ksum = (False, True) if cfg.split_k == 1 else (False,)
    return [replace(cfg, quant_a=q, direct=d, ksum=s) for q, d, s in itertools.product(qa, direct, ksum)]


def config_space(*, fp8: bool, quick: bool = False, stage: int | None = None, tokens: int | None = None,
                 topk: int = 1, experts: int | None = None) -> list[MoeConfig]:
    """The tuner's search space, every config valid for GEMM ``stage`` (None: for both; :func:`config_error`).
    ``quick``: a short list for decode and prefill; full: tiles x group x warps x stages x splits (splits only with
    small token blocks). With ``tokens`` (and ``topk``): the variants of the decode tiles, from
    :data:`PREFILL_TOKENS` the large tiles (FP8's with one accumulator fit GEMM2 only), and the ``SWAP`` tiles up to
    :data:`SWAP_MAX_ROWS` rows per expert (:func:`expected_rows` over ``experts``; without them: every pair on one)."""
    bks = (64, 128) if fp8 else (64, 128, 256)
    pairs = None if tokens is None else tokens * topk
    if quick:
        raw = [MoeConfig(bm, bn, bk, 1, 4, st, sk)
               for bm, bn, bk, st, sk in itertools.product((16, 32), (32, 64, 128), (128,), (4,), (1, 2, 4))]
        raw = [v for c in raw for v in (_variants(c, fp8=fp8, pairs=pairs) if c.block_n > 32 else [c])]
        raw += [MoeConfig(bm, bn, bk, 16, w, 3)
                for bm, bn, bk, w in itertools.product((64, 128), (64, 128), (64, 128), (4, 8))]
        if tokens is not None and tokens >= PREFILL_TOKENS:
            bk = 128 if fp8 else 64
            raw += [v for bm, bn, st in ((128, 128, 3), (128, 128, 4), (128, 256, 3), (256, 128, 3))
                    for v in _variants(MoeConfig(bm, bn, bk, 16, 8, st), fp8=fp8, pairs=pairs)]
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
            cfg = MoeConfig(bm, bn, bk, gm, w, st, sk)
            raw += _variants(cfg, fp8=fp8, pairs=pairs) if bm <= 32 else [cfg]
    if pairs is not None and pairs <= DIRECT_MAX_PAIRS:
        raw += _fused_space()
    rows = None if tokens is None else expected_rows(tokens, experts, topk) if experts else pairs
    if rows is not None and rows <= SWAP_MAX_ROWS:
        raw += _swap_space(fp8=fp8, quick=quick, pairs=pairs)
    return [c for c in dict.fromkeys(raw) if config_error(c, fp8=fp8, stage=stage) is None]


def _fused_space() -> list[MoeConfig]:
    """The ``FUSED`` configs worth timing (for few pairs): narrow column tiles (many programs per pair), K steps of
    one to four 128-wide groups (fewer dependent steps), 3 or 4 stages; each thread holds 32 to 64 weight elements of
    a step (fewer leaves warps idle, more spills: :func:`config_error` drops those) and a K step spans at most 64
    columns per warp; the same for bf16 and FP8 (whose block_k covers whole scale groups)."""
    return [MoeConfig(16, bn, bk, 1, w, st, fused=True)
            for bn, bk, w, st in itertools.product((16, 32, 64), (128, 256, 512), (2, 4, 8), (3, 4))
            if bn * bk >= 1024 * w and bk <= 64 * w]


def _swap_space(*, fp8: bool, quick: bool, pairs: int) -> list[MoeConfig]:
    """The ``SWAP`` configs worth timing at ``pairs`` pairs: 64 or 128 weight rows (a wgmma's M of 64, 4 warps: one
    warp group) by 8 to 32 pairs. Quick: five tiles (one split in two; bf16's block_k 64, so that GEMM1's gate and up
    tiles of 128 rows fit 4 stages), FP8's quantizing in the kernel (``QA``, a launch fewer), ``DIRECT`` for 8 rows
    and few pairs; full: 3 or 4 stages, one or two splits, with :func:`_variants`."""
    if quick:
        tiles = [MoeConfig(bm, bn, 128 if fp8 else 64, 1, 4, 4, sk, quant_a=fp8, swap=True)
                 for bm, bn, sk in ((8, 64, 1), (8, 64, 2), (8, 128, 1), (16, 64, 1), (16, 128, 1))]
        return tiles + [replace(c, direct=True) for c in tiles if c.block_m == 8 and pairs <= DIRECT_MAX_PAIRS]
    return [v for bm, bn, bk, st, sk in itertools.product((8, 16, 32), (64, 128), (128,) if fp8 else (64, 128),
                                                          (3, 4), (1, 2))
            for v in _variants(MoeConfig(bm, bn, bk, 1, 4, st, sk, swap=True), fp8=fp8, pairs=pairs)]


def active_experts(tokens: int, num_experts: int, topk: int) -> float:
    """Experts expected to get at least one of ``tokens`` tokens' ``topk`` slots under uniform routing."""
    return num_experts * (1.0 - (1.0 - min(topk, num_experts) / num_experts) ** max(tokens, 1))


def expected_rows(tokens: int, num_experts: int, topk: int) -> float:
    """Rows (token, slot pairs) expected per expert that gets any, under uniform routing: what one expert's sorted
    block holds before padding."""
    return max(tokens, 1) * topk / max(active_experts(tokens, num_experts, topk), 1.0)


def default_config(tokens: int, num_experts: int, topk: int, n: int, k: int, *, fp8: bool,
                   num_sms: int = REFERENCE_CU) -> MoeConfig:
    """The built-in config of one GEMM of ``n`` output columns over ``k`` (GEMM1: n = I, k = H; GEMM2: n = H, k = I)
    when no tuned one exists; a heuristic, not measured. ``block_m`` follows the expected tokens per active expert
    under uniform routing (16 for decode); split-K doubles while the active experts' tiles, doubled, still fit one
    wave of ``num_sms`` programs and each split keeps >= 8 K blocks."""
    pairs = max(tokens, 1) * topk
    active = active_experts(tokens, num_experts, topk)
    per_expert = expected_rows(tokens, num_experts, topk)
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
