"""Backend ``skinny``: GEMV-like split-K Triton kernels for M <= 16 (decode), :mod:`aiter_gemm.kernels.skinny`.

``solidx`` selects the variant (0 ``fma``, 1 ``fma_2pass``, 2 ``fma_atomic``, 3 ``dot``, 4 ``dot_2pass``,
5 ``dot_atomic``, 6 ``gemv`` and 7 ``gemv_2pass`` at M <= 8; the kernel module's docstring describes each).
``kernelName`` names the whole launch (``fma_BN16_BK512_SK1_W4_S1``: variant, BLOCK_SIZE_N, BLOCK_SIZE_K, split-K
factor, warps, stages; suffixes ``_EF``: weight loads ``evict_first``, ``_SP``: N and K compiled in, ``_PDL`` /
``_PDLW``: gemv launched with programmatic dependent launch); it must agree with ``solidx``. A row with an empty
``kernelName`` gets the heuristic tile for its ``solidx`` variant (split-K from the row's ``splitK``). ``splitK``
mirrors ``NUM_KSPLIT``.

It is the heuristic default (priority above torch's) on GPUs for the shapes :func:`is_skinny_default_shape` accepts,
computed from the device's SM/CU count; never on the CPU, where it only runs under the Triton interpreter for tests.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch
import triton

from aiter_gemm.backends._triton_common import TritonKernelBackend
from aiter_gemm.backends.base import GemmProblem, Runner, Solution, finish_scaled
from aiter_gemm.device import DeviceIdentity, has_tma, smem_limit
from aiter_gemm.kernels.skinny import (
    GEMV_MAX_M,
    MAX_M,
    VARIANTS,
    SkinnyConfig,
    default_skinny_config,
    launch_skinny,
)

log = logging.getLogger(__name__)

# The FMA variants keep BM*BN*BK float32 accumulators in registers: at most this many per thread (255 is the cap;
# the tile of B in flight and addresses need the rest).
_MAX_ACC_REGS = 64
# Split-K is searched only while the slabs alone give fewer than 2 programs per SM, up to 4 programs per SM with the
# splits: on the H100 no split beat the one-pass kernels once N / BLOCK_SIZE_N >= 2 * SMs, and beyond 4 programs per
# SM splits only add partial-sum traffic (the sweep of docs/exploration.md).
_SPLIT_BELOW_PROGRAMS_PER_CU = 2
_MAX_PROGRAMS_PER_CU = 4


def config_error(cfg: SkinnyConfig, M: int, N: int, K: int, arch: str, dtype: torch.dtype = torch.bfloat16
                 ) -> str | None:
    """Why ``cfg`` cannot run (M, N, K) on ``arch`` (None if it can): M <= 16, FMA accumulators fit registers, dot
    stages fit shared memory, each K split owns at least one BLOCK_SIZE_K tile."""
    isz = torch.empty((), dtype=dtype).element_size()
    if M > MAX_M:
        return f"skinny kernels take M <= {MAX_M}, got M={M}"
    if cfg.variant.gemv and M > GEMV_MAX_M:
        return f"{cfg.name}: the gemv variants take M <= {GEMV_MAX_M}, got M={M}"
    if cfg.pdl and not has_tma(arch):  # programmatic dependent launch: sm_90+, like TMA
        return f"{cfg.name} needs programmatic dependent launch (sm_90+); {arch} has none"
    if cfg.smem_bytes(isz) > smem_limit(arch):
        return f"{cfg.name} needs {cfg.smem_bytes(isz)} B of shared memory, {arch} has {smem_limit(arch)}"
    if not cfg.variant.use_dot and cfg.acc_regs_per_thread(M) > _MAX_ACC_REGS:
        return f"{cfg.name} at M={M} keeps {cfg.acc_regs_per_thread(M)} accumulators per thread (> {_MAX_ACC_REGS})"
    if cfg.NUM_KSPLIT > triton.cdiv(K, cfg.BLOCK_SIZE_K):
        return f"{cfg.name} splits K={K} into more parts than it has BLOCK_SIZE_K tiles"
    return None


def config_space(M: int, N: int, K: int, arch: str, cu_num: int, dtype: torch.dtype = torch.bfloat16
                 ) -> list[SkinnyConfig]:
    """The tuner's skinny space at (M, N, K): every variant, tiles BN 8..64 x BK 128..1024, warps 4/8 (4 with
    split-K), stages; split-K 2..16 only where the slabs underfill the GPU (see above); at M <= 8 also the gemv
    variants (:func:`gemv_space`), at M >= 2 shape-specialised dot tiles (:func:`dot_sp_space`); pruned by
    :func:`config_error`."""
    if M > MAX_M:
        return []
    space: list[SkinnyConfig] = gemv_space(M, N, K, cu_num) if M <= GEMV_MAX_M else []
    if M >= 2:
        space += dot_sp_space()
    for var in VARIANTS.values():
        if var.gemv:
            continue
        bns = (16, 32, 64) if var.use_dot else (8, 16, 32)
        bks = (128, 256, 512) if var.use_dot else (128, 256, 512, 1024)
        stage_opts = ((3, 4) if var.splits_k else (2, 3, 4)) if var.use_dot else (1, 2)
        warp_opts = (4,) if var.splits_k else (4, 8)  # every split-K winner of the sweep ran 4 warps
        for bn in bns:
            programs = triton.cdiv(N, bn)
            if not var.splits_k:
                splits = [1]
            elif programs < _SPLIT_BELOW_PROGRAMS_PER_CU * cu_num:
                splits = [s for s in (2, 4, 8, 16) if programs * s <= _MAX_PROGRAMS_PER_CU * cu_num]
            else:
                splits = []
            for bk in bks:
                for warps in warp_opts:
                    for stages in stage_opts:
                        for sk in splits:
                            space.append(SkinnyConfig(var.solidx, bn, bk, sk, warps, stages))
    return [c for c in space if config_error(c, M, N, K, arch, dtype) is None]


def gemv_space(M: int, N: int, K: int, cu_num: int) -> list[SkinnyConfig]:
    """The gemv variants' tiles: BN 1..16 rows x BK 512..4096 (not past K), one stage, with and without
    ``evict_first``, keeping 2..64 float32 accumulators per thread (:meth:`SkinnyConfig.acc_regs_per_thread`). At
    M == 1 (4..32 warps) it holds every tile Inductor's coordinate descent chose for the 8 shipped M=1 shapes on the
    H100 (XBLOCK 1-8, R0_BLOCK 512-4096, 4-32 warps, 1 stage, evict_first; docs/exploration.md; its choice
    varies between runs). At M >= 2 (BN 1..8, 2..16 warps) only tiles with at least 8 K elements (one 16-byte load)
    per thread: compiled for sm_90, shorter K slices convert the accumulator's layout through shared memory in every
    K step; BN > 1 rows share each load of A. Split-K (two-pass, 2/4/8) as for the other variants."""
    space = []
    for ef in (False, True):
        for bn in (1, 2, 4, 8, 16) if M == 1 else (1, 2, 4, 8):
            programs = triton.cdiv(N, bn)
            splits = [1] + ([s for s in (2, 4, 8) if programs * s <= _MAX_PROGRAMS_PER_CU * cu_num]
                            if programs < _SPLIT_BELOW_PROGRAMS_PER_CU * cu_num else [])
            for bk in (512, 1024, 2048, 4096):
                if bk > max(512, triton.next_power_of_2(K)):
                    continue
                for warps in (4, 8, 16, 32) if M == 1 else (2, 4, 8, 16):
                    if M > 1 and bk // (32 * warps) < 8:  # 16-byte loads, no layout conversion in the loop
                        continue
                    for sk in splits:
                        cfg = SkinnyConfig(6 if sk == 1 else 7, bn, bk, sk, warps, 1, ef)
                        if 2 <= cfg.acc_regs_per_thread(M) <= _MAX_ACC_REGS:
                            space.append(cfg)
    return space


def dot_sp_space() -> list[SkinnyConfig]:
    """M >= 2: whole-K ``dot`` tiles with N and K compiled in (``_SP``), over the range of Inductor's mm templates
    for these M (BLOCK_M 16, BLOCK_N 32-128, BLOCK_K 64-128, 3-5 stages, 2-8 warps: its autotune tables on the H100,
    docs/exploration.md), BK up to 256; :func:`config_error` prunes what exceeds shared memory."""
    return [SkinnyConfig(3, bn, bk, 1, warps, stages, False, True)
            for bn in (16, 32, 64, 128) for bk in (64, 128, 256) for stages in (3, 4, 5) for warps in (2, 4, 8)]


#: Device classes (arch, SM count) the default region below was measured on; elsewhere skinny is never the default.
DEFAULT_MEASURED_ON = frozenset({("sm_90", 132)})


def is_skinny_default_shape(M: int, N: int, K: int, cu_num: int, arch: str = "sm_90") -> bool:
    """Where the skinny default claims a shape from F.linear: only inside what the H100 sweeps measured winning.
    M == 1 (the ``gemv`` default): N >= 1280 and K a multiple of 512 in 1024..18944, the envelope of the 21 shipped
    and held-out (N, K) (Llama-3 8B/70B-TP8, Qwen2.5-7B, Phi-3-mini, Gemma-2-9B, Llama-3.2-3B) where it ran
    1.052-1.44x F.linear (BENCHMARKS.md, Defaults). M >= 2 stays with F.linear: the ``dot``
    default won by 1-3% at best on most shapes of the earlier sweep (BENCHMARKS.md, Defaults) and lost up to 14%
    on others. Other devices: no claim, no data."""
    if (arch, cu_num) not in DEFAULT_MEASURED_ON:
        return False
    return M == 1 and N >= 1280 and 1024 <= K <= 18944 and K % 512 == 0


def select_config(problem: GemmProblem, solution: Solution, cu_num: int) -> SkinnyConfig:
    """The config a row names, else the heuristic tile for its ``solidx`` variant; ValueError if inconsistent."""
    name = solution.kernelName.strip()
    if name and name != "auto":
        cfg = SkinnyConfig.from_name(name)
        if solution.solidx >= 0 and solution.solidx != cfg.solidx:
            raise ValueError(f"solidx {solution.solidx} ({VARIANTS.get(solution.solidx)}) disagrees with kernelName "
                             f"variant {cfg.variant.name} (solidx {cfg.solidx})")
        return cfg
    cfg = default_skinny_config(problem.M, problem.N, problem.K, cu_num)
    if solution.solidx < 0 or solution.solidx == cfg.solidx:
        return cfg
    if solution.solidx not in VARIANTS:
        raise ValueError(f"skinny solidx {solution.solidx} is not one of {sorted(VARIANTS)}")
    var = VARIANTS[solution.solidx]
    split = max(2, solution.splitK, cfg.NUM_KSPLIT) if var.splits_k else 1
    # dot: the dot default's tile (32 rows, BK 128 x 4 stages). FMA and gemv: 8 rows and BK so that BM * 8 * BK /
    # 128 threads = 64 accumulators per thread (BK 1024 at M=1, 64 at M=16); gemv with evict_first, as Inductor.
    bk = 128 if var.use_dot else 1024 // triton.next_power_of_2(problem.M)
    while var.splits_k and bk > 16 and triton.cdiv(problem.K, bk) < split:  # every split needs a BK tile
        bk //= 2
    split = min(split, triton.cdiv(problem.K, bk))
    if var.splits_k and split < 2:
        raise ValueError(f"K={problem.K} is too short to split for variant {var.name}")
    return replace(cfg, solidx=var.solidx, NUM_KSPLIT=split, BLOCK_SIZE_N=32 if var.use_dot else 8, BLOCK_SIZE_K=bk,
                   num_warps=4, num_stages=4 if var.use_dot else 1, evict_first=var.gemv)


def make_runner(cfg: SkinnyConfig) -> Runner:
    """A runner launching ``cfg``; per-tensor scales, if a caller passes them, are applied in float32 afterwards."""

    def run(a, b, bias, otype, scale_a=None, scale_b=None, scale_c=None):
        if scale_a is None and scale_b is None and scale_c is None:
            return launch_skinny(a, b, bias, otype, cfg)
        return finish_scaled(launch_skinny(a, b, None, torch.float32, cfg), bias, otype, scale_a, scale_b, scale_c)

    return run


class SkinnyBackend(TritonKernelBackend):
    name = "skinny"
    default_priority = 10
    max_m = MAX_M

    def select(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> SkinnyConfig:
        return select_config(problem, solution, device.cu_num)

    def config_error(self, cfg: SkinnyConfig, problem: GemmProblem, device: DeviceIdentity) -> str | None:
        return config_error(cfg, problem.M, problem.N, problem.K, device.gfx, problem.dtype)

    def space(self, problem: GemmProblem, device: DeviceIdentity) -> list[SkinnyConfig]:
        return config_space(problem.M, problem.N, problem.K, device.gfx, device.cu_num, problem.dtype)

    def runner(self, cfg: SkinnyConfig, device: DeviceIdentity) -> Runner:
        return make_runner(cfg)

    def solution_of(self, cfg: SkinnyConfig) -> Solution:
        return Solution(self.name, cfg.solidx, cfg.NUM_KSPLIT, cfg.name)

    def default_for(self, problem: GemmProblem, device: DeviceIdentity) -> Solution | None:
        if not device.is_gpu or not self.supports(problem):
            return None
        if not is_skinny_default_shape(problem.M, problem.N, problem.K, device.cu_num, device.gfx):
            return None
        cfg = default_skinny_config(problem.M, problem.N, problem.K, device.cu_num)
        return Solution(self.name, cfg.solidx, cfg.NUM_KSPLIT, cfg.name)


BACKEND = SkinnyBackend()
