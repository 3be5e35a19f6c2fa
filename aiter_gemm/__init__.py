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

__all__ = [
    "ConfigError", "GemmProblem", "Solution", "TunedGemm", "current_device_identity", "gemm_a16w16",
    "get_GEMM_A16W16_config", "get_config_table", "get_dispatcher", "get_padded_m", "reload_configs", "tgemm",
]
