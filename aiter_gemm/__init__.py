"""aiter_gemm: tuned-GEMM dispatch for LLM inference (AITER-compatible configs; cuBLASLt, Triton, skinny, torch)."""

from __future__ import annotations

from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.configs import ConfigError
from aiter_gemm.dispatch import get_padded_m
from aiter_gemm.ops import (
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

# Imported on first use: they import Triton and define kernels, which a plain `import aiter_gemm` must not do.
_LAZY = {"gemm_a8w8_blockscale": "aiter_gemm.blockscale", "get_GEMM_A8W8_BLOCKSCALE_config": "aiter_gemm.blockscale"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'aiter_gemm' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)

__all__ = [
    "ConfigError", "GemmProblem", "Solution", "TunedGemm", "current_device_identity", "gemm_a16w16",
    "gemm_a8w8_blockscale", "get_GEMM_A8W8_BLOCKSCALE_config",
    "get_GEMM_A16W16_config", "get_config_table", "get_dispatcher", "get_padded_m", "reload_configs", "tgemm",
]
