"""aiter_gemm: tuned-GEMM dispatch for LLM inference (AITER-compatible configs; cuBLASLt, Triton, skinny, torch),
FP8 block-scale GEMMs and fused MoE experts."""

from __future__ import annotations

from aiter_gemm.backends.base import GemmProblem, MoeProblem, Solution
from aiter_gemm.configs import ConfigError
from aiter_gemm.dispatch import get_padded_m
from aiter_gemm.ops.a16w16 import (
    TunedGemm,
    current_device_identity,
    gemm_a16w16,
    get_config_table,
    get_dispatcher,
    get_GEMM_A16W16_config,
    reload_configs,
    tgemm,
)

__version__ = "0.1.0"


def __getattr__(name: str):
    """The op entry points imported on first use (:data:`aiter_gemm.registry.PUBLIC`): they import Triton and define
    kernels, which a plain ``import aiter_gemm`` must not do."""
    from aiter_gemm.registry import public_attribute

    return public_attribute(name)


def warmup(ops: tuple[str, ...] = ("gemm_a16w16", "gemm_a8w8_blockscale"), on_gpu: bool | None = None,
           shapes: dict[str, list[GemmProblem]] | None = None) -> list[dict]:
    """Compile and load, before serving, every kernel this device's tuned rows and JSON buckets name, plus what
    ``shapes`` (op name -> a model's problems) run where no row serves them (TileLang kernels: compiled in parallel
    into TileLang's disk cache the first time, loaded from it after a restart), and decide those shapes, so no
    request waits on a compiler. One summary dict per op (shapes, jobs, failed, seconds). Call it once at start-up,
    after setting the config variables."""
    import torch

    gpu = torch.cuda.is_available() if on_gpu is None else on_gpu
    return [get_dispatcher(op).warm_up(gpu, (shapes or {}).get(op, ())) for op in ops]


__all__ = [
    "ConfigError", "GemmProblem", "MoeProblem", "Solution", "TunedGemm", "current_device_identity", "fused_moe",
    "gemm_a16w16", "gemm_a8w8_blockscale", "get_GEMM_A8W8_BLOCKSCALE_config", "get_fused_moe_config",
    "get_GEMM_A16W16_config", "get_config_table", "get_dispatcher", "get_padded_m", "reload_configs", "tgemm",
    "warmup",
]
