"""Dtype names as they appear in AITER CSV files, parsed through an explicit table (never `eval`)."""

from __future__ import annotations

import torch

# Every spelling AITER files use (str(torch.dtype)) plus short aliases. fp8 dtypes only where this torch has them.
_ALIASES: dict[str, tuple[str, ...]] = {
    "bfloat16": ("torch.bfloat16", "bf16", "bfloat16"),
    "float16": ("torch.float16", "torch.half", "f16", "fp16", "float16", "half"),
    "float32": ("torch.float32", "torch.float", "f32", "fp32", "float32", "float"),
    "float8_e4m3fn": ("torch.float8_e4m3fn", "fp8", "fp8_e4m3", "float8_e4m3fn"),
    "float8_e4m3fnuz": ("torch.float8_e4m3fnuz", "fp8_e4m3fnuz", "float8_e4m3fnuz"),
    "float8_e5m2": ("torch.float8_e5m2", "fp8_e5m2", "float8_e5m2"),
    "float8_e5m2fnuz": ("torch.float8_e5m2fnuz", "float8_e5m2fnuz"),
    "int8": ("torch.int8", "i8", "int8"),
    "int32": ("torch.int32", "i32", "int32"),
    "uint8": ("torch.uint8", "u8", "uint8"),
    "float4_e2m1fn_x2": ("torch.float4_e2m1fn_x2", "fp4x2", "float4_e2m1fn_x2"),
}

DTYPE_BY_NAME: dict[str, torch.dtype] = {
    alias: getattr(torch, attr) for attr, aliases in _ALIASES.items() if hasattr(torch, attr) for alias in aliases
}

FP8_DTYPES: frozenset[torch.dtype] = frozenset(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
    if hasattr(torch, n)
)

#: The 16-bit float dtypes of the GEMMs' bf16/fp16 inputs (Triton, skinny, cuBLASLt, torch's bias-fused path).
HALF_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
#: The dtypes every GEMM here writes (and so the float activations an FP8 linear quantizes and writes back).
OUT_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)


def parse_dtype(value: str | torch.dtype) -> torch.dtype:
    """A CSV dtype string (``torch.bfloat16``, ``bf16``, ...) or a torch dtype as a torch dtype; KeyError if unknown."""
    if isinstance(value, torch.dtype):
        return value
    try:
        return DTYPE_BY_NAME[value.strip()]
    except KeyError:
        raise KeyError(f"unknown dtype name {value!r}; known: {sorted(DTYPE_BY_NAME)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    """The CSV spelling AITER writes: ``str(torch.bfloat16)`` == ``'torch.bfloat16'``."""
    return str(dtype)
