"""Backend ``triton``: the Triton GEMM of :mod:`aiter_gemm.kernels.gemm_a16w16` with AITER-style JSON configs.

Config selection (AITER's Triton convention), for a GEMM of shape (M, N, K) on arch ``{arch}`` (``sm_90``, ``gfx942``):

1. a tuned CSV row's ``kernelName`` naming a config (``BM128_BN128_BK64_GM8_SK1_W8_S3``; suffix ``_TMA`` for the
   Hopper persistent TMA kernel, ``_TMAF`` for it with flattened loops, ``_SP`` for the classic kernel with N and K
   compiled in; see
   :class:`~aiter_gemm.kernels.gemm_a16w16.GemmConfig`) wins;
2. else (``kernelName`` empty or ``auto``, as AITER writes) the op's JSON level fills the row in before it gets
   here (:attr:`aiter_gemm.ops.a16w16.GEMM_A16W16` ``.json``: ``{arch}-GEMM-A16W16-N={N}-K={K}.json``, then
   ``{arch}-GEMM-A16W16.json``, the first key ``M_LEQ_<x>`` (ascending x) with M <= x, else ``any``), whose entries
   this backend parses (:meth:`TritonBackend.parse_json_entry`, :func:`parse_entry`) and fits to the shape
   (:meth:`TritonBackend.fit`, :func:`fitted`); entries hold ``BLOCK_SIZE_M/N/K``, ``GROUP_SIZE_M``,
   ``NUM_KSPLIT``, ``num_warps``, ``num_stages`` and the optional Hopper key ``TMA_PERSISTENT`` (bool). AMD-only
   keys of AITER's files (``waves_per_eu``, ``kpack``, ``matrix_instr_nonkdim``, ``cache_modifier``) are accepted
   and ignored; ``TMA_FLATTEN`` (bool) flattens the persistent kernel's loops;
3. else (no file answers) a built-in default (:func:`~aiter_gemm.kernels.gemm_a16w16.default_config`).

``solidx`` is unused (candidates write 0); ``splitK`` in a row mirrors the config's ``NUM_KSPLIT`` (informational:
the config decides). The tuner's search space is :func:`config_space`; :func:`config_error` is the single test of what
can run (shared memory, TMA availability, split sizes) used by both ``candidates`` and ``prepare``.
This backend is not a heuristic default: on the H100 it was 0.92-1.15x ``F.linear`` at M <= 64 and 0.69-1.06x above,
never consistently faster over a region (BENCHMARKS.md); tuned rows select it where it wins.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
import triton

from aiter_gemm.backends._triton_common import TritonKernelBackend
from aiter_gemm.backends.base import GemmProblem, Runner, Solution, finish_scaled
from aiter_gemm.configs import json_int
from aiter_gemm.device import DeviceIdentity, has_tma, smem_limit, typical_cu
from aiter_gemm.kernels.common import INTERPRET, tma_usable
from aiter_gemm.kernels.gemm_a16w16 import GemmConfig, default_config, launch_gemm_a16w16, tma_available
from aiter_gemm.logs import WarnOnce

log = logging.getLogger(__name__)

_REQUIRED_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "NUM_KSPLIT", "num_warps",
                  "num_stages")
_OPTIONAL_KEYS = ("TMA_PERSISTENT", "TMA_FLATTEN")
_IGNORED_KEYS = frozenset({"waves_per_eu", "matrix_instr_nonkdim", "cache_modifier", "kpack", "SPLITK_BLOCK_SIZE"})


def config_error(cfg: GemmConfig, M: int, N: int, K: int, arch: str, dtype: torch.dtype = torch.bfloat16
                 ) -> str | None:
    """Why ``cfg`` cannot run (M, N, K) on ``arch`` (None if it can): it must fit shared memory, use TMA only where
    it exists and rows are 16-byte aligned, and give every K split at least one ``BLOCK_SIZE_K`` tile."""
    isz = torch.empty((), dtype=dtype).element_size()
    if cfg.smem_bytes(isz) > smem_limit(arch):
        return f"{cfg.name} needs {cfg.smem_bytes(isz)} B of shared memory, {arch} has {smem_limit(arch)}"
    if cfg.TMA_PERSISTENT:
        if INTERPRET or not has_tma(arch):
            return f"{cfg.name} needs TMA (sm_90+, not the interpreter); {arch} has none here"
        if (K * isz) % 16:
            return f"{cfg.name} needs 16-byte aligned rows for TMA; K={K} rows are {K * isz} bytes"
    if cfg.NUM_KSPLIT > triton.cdiv(K, cfg.BLOCK_SIZE_K):
        return f"{cfg.name} splits K={K} into more parts than it has BLOCK_SIZE_K tiles"
    return None


def config_supported(cfg: GemmConfig, M: int, N: int, K: int, arch: str, dtype: torch.dtype = torch.bfloat16
                     ) -> bool:
    """:func:`config_error` as a predicate."""
    return config_error(cfg, M, N, K, arch, dtype) is None


def _tiles(M: int) -> list[tuple[int, int, int]]:
    """(BM, BN, num_warps) tiles worth trying at M: BM near M (16..256), accumulators <= 128 registers per thread."""
    if M <= 16:
        bms = (16,)
    elif M <= 32:
        bms = (16, 32)
    elif M <= 64:
        bms = (32, 64)
    elif M <= 128:
        bms = (64, 128)
    else:
        bms = (64, 128, 256)
    out = []
    for bm in bms:
        for bn in (32, 64, 128, 256):
            if bm * bn > 128 * 256 or (bm == 256 and bn < 64):
                continue
            out.append((bm, bn, 8 if bm * bn >= 128 * 128 else 4))
    return out


def config_space(M: int, N: int, K: int, arch: str, cu_num: int | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> list[GemmConfig]:
    """The tuner's search space at (M, N, K) on ``arch``, pruned by :func:`config_error` (shared memory first).

    Split-K (2..16) is searched only when the output tiles alone fill less than one wave of ``cu_num`` SMs and each
    split keeps >= 512 of K; the persistent TMA kernel only on TMA archs, for BM >= 64, without split-K."""
    cu = typical_cu(arch, cu_num)
    space: list[GemmConfig] = []
    for bm, bn, warps in _tiles(M):
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        splits = [1] + [s for s in (2, 4, 8, 16) if tiles * s <= 2 * cu and K // s >= 512] if tiles < cu else [1]
        for bk in (64, 128) if bm * bn >= 128 * 128 else (64, 128, 256):
            for stages in (3, 4) if bm >= 64 else (3, 4, 5):
                gm = 8 if M >= 256 else 1
                for sk in splits:
                    space.append(GemmConfig(bm, bn, bk, gm, sk, warps, stages))
                if bm >= 64:
                    space.append(GemmConfig(bm, bn, bk, gm, 1, warps, stages, True))
                    space.append(GemmConfig(bm, bn, bk, gm, 1, warps, stages, True, True))
    return [c for c in dict.fromkeys(space) if config_error(c, M, N, K, arch, dtype) is None]


def parse_entry(value: dict) -> GemmConfig:
    """A JSON entry as a config (AITER's keys; its AMD-only keys are accepted and ignored); ValueError if wrong."""
    unknown = set(value) - set(_REQUIRED_KEYS) - set(_OPTIONAL_KEYS) - _IGNORED_KEYS
    missing = [k for k in _REQUIRED_KEYS if k not in value]
    if unknown or missing:
        raise ValueError(f"unknown fields {sorted(unknown)}, missing fields {missing}")
    ints = {k: json_int(k, value[k]) for k in _REQUIRED_KEYS}
    return GemmConfig(**ints, TMA_PERSISTENT=bool(value.get("TMA_PERSISTENT", False)),
                      FLATTEN=bool(value.get("TMA_FLATTEN", False)))


def fitted(cfg: GemmConfig, problem: GemmProblem, arch: str) -> GemmConfig:
    """A JSON config for ``problem``: the same tile on the classic kernel where its TMA kernel cannot run the shape
    (rows not 16-byte aligned, or the interpreter), rather than a row that fails."""
    if cfg.TMA_PERSISTENT and config_error(cfg, problem.M, problem.N, problem.K, arch, problem.dtype) is not None:
        return replace(cfg, TMA_PERSISTENT=False, FLATTEN=False)
    return cfg


def select_config(problem: GemmProblem, solution: Solution) -> GemmConfig:
    """The config a row names (``kernelName``; ValueError if malformed), else (empty or ``auto``: no JSON bucket
    answered) the built-in default."""
    name = solution.kernelName.strip()
    if name and name != "auto":
        return GemmConfig.from_name(name)
    return default_config(problem.M, problem.N, problem.K)


_TMA_FALLBACK = WarnOnce(log)


def make_runner(cfg: GemmConfig, num_sms: int) -> Runner:
    """A runner launching ``cfg``; per-tensor scales, if a caller passes them, are applied in float32 afterwards. A
    TMA config whose operands TMA cannot read on a call (a misaligned or strided slice) runs the same tile on the
    classic kernel: said once per config, as the row's kernelName names the TMA kernel. A bias of any stride is read
    by its stride."""
    tma_sms = num_sms if cfg.TMA_PERSISTENT and tma_available() else 0

    def run(a, b, bias, otype, scale_a=None, scale_b=None, scale_c=None):
        if tma_sms and not (tma_usable(a) and tma_usable(b)):
            _TMA_FALLBACK(cfg.name, "aiter_gemm: triton %s: operands of M=%d N=%d K=%d are not 16-byte aligned rows "
                          "with a unit K stride that do not overlap (a strides %s, b strides %s): running the classic "
                          "kernel with this tile",
                          cfg.name, a.shape[0], b.shape[0], a.shape[1], tuple(a.stride()), tuple(b.stride()))
        if scale_a is None and scale_b is None and scale_c is None:
            out = torch.empty((a.shape[0], b.shape[0]), dtype=otype, device=a.device)
            return launch_gemm_a16w16(a, b, bias, out, cfg, tma_sms)
        out = torch.empty((a.shape[0], b.shape[0]), dtype=torch.float32, device=a.device)
        return finish_scaled(launch_gemm_a16w16(a, b, None, out, cfg, tma_sms), bias, otype, scale_a, scale_b, scale_c)

    return run


class TritonBackend(TritonKernelBackend):
    name = "triton"
    default_priority = 0

    def select(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> GemmConfig:
        return select_config(problem, solution)

    def config_error(self, cfg: GemmConfig, problem: GemmProblem, device: DeviceIdentity) -> str | None:
        return config_error(cfg, problem.M, problem.N, problem.K, device.gfx, problem.dtype)

    def space(self, problem: GemmProblem, device: DeviceIdentity) -> list[GemmConfig]:
        return config_space(problem.M, problem.N, problem.K, device.gfx, device.cu_num, problem.dtype)

    def runner(self, cfg: GemmConfig, device: DeviceIdentity) -> Runner:
        return make_runner(cfg, device.cu_num if device.is_gpu else 0)

    def solution_of(self, cfg: GemmConfig) -> Solution:
        return Solution(self.name, 0, cfg.NUM_KSPLIT, cfg.name)

    def parse_json_entry(self, entry: Mapping[str, Any]) -> Solution:
        """An entry of AITER's ``{arch}-GEMM-A16W16*.json`` files (:func:`parse_entry`)."""
        return self.solution_of(parse_entry(dict(entry)))

    def fit(self, solution: Solution, problem: GemmProblem, arch: str) -> Solution:
        """The bucket's config :func:`fitted` to the shape."""
        cfg = GemmConfig.from_name(solution.kernelName)
        fit = fitted(cfg, problem, arch)
        return solution if fit is cfg else self.solution_of(fit)


BACKEND = TritonBackend()
