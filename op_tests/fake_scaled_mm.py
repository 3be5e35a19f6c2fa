"""A CPU stand-in for torch's block-scaled ``F.scaled_mm`` (CPU torch has none): it enforces the layouts cuBLASLt
accepted on the H100 (M a multiple of 4, A row-major, B = WQ.t() column-major, x_scale (M, K/128) M-major,
w_scale passed as (K/128, N/128) K-major, its K blocks padded to a multiple of 4 as torch's own check of the call
asks) and computes the float32 dequantized product, so CPU tests check what
:mod:`aiter_gemm.kernels.a8w8_blockscale_torch` hands cuBLASLt and that the dispatch and tuner route to it.

``install()`` patches ``F.scaled_mm`` and the availability check (callers restore them: monkeypatch); importing
:mod:`op_tests.fake_scaled_mm_plugin` installs it, which is how tuner workers (spawned processes) get it."""

from __future__ import annotations

import torch

from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl
from aiter_gemm.kernels.a8w8_blockscale import gemm_a8w8_blockscale_ref
from aiter_gemm.kernels.blockscale_format import SCALE_BLOCK

#: (M padded, N, K, x_scale data_ptr) of every call, for tests that check copies were (not) made.
CALLS: list[tuple[int, int, int, int]] = []


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise RuntimeError(f"fake F.scaled_mm: {what}")


def fake_scaled_mm(a, b, scale_a, recipe_a, scale_b, recipe_b, swizzle_a=None, swizzle_b=None, bias=None,
                   output_dtype=torch.bfloat16, contraction_dim=(), use_fast_accum=False):
    st = torch.nn.functional.ScalingType
    _need(recipe_a == st.BlockWise1x128 and recipe_b == st.BlockWise128x128, f"recipes {recipe_a}, {recipe_b}")
    _need(not use_fast_accum and bias is None, "block scaling takes no fast accumulation nor bias")
    M, K = a.shape
    N = b.shape[1]
    kb, nb = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK)
    _need(M % 4 == 0, f"M={M} must be a multiple of 4")
    _need(a.is_contiguous(), f"A strides {a.stride()} must be row-major")
    _need(b.shape == (K, N) and b.stride() == (1, K), f"B {tuple(b.shape)} strides {b.stride()} must be (K, N) "
          "column-major")
    _need(scale_a.shape == (M, kb) and scale_a.stride() == (1, M), f"scale_a {tuple(scale_a.shape)} strides "
          f"{scale_a.stride()} must be ({M}, {kb}) M-major")
    l4 = -(-kb // 4) * 4
    _need(scale_b.shape == (l4, nb) and scale_b.stride() == (1, l4), f"scale_b {tuple(scale_b.shape)} strides "
          f"{scale_b.stride()} must be ({l4}, {nb}) K-major")
    CALLS.append((M, N, K, scale_a.data_ptr()))
    return gemm_a8w8_blockscale_ref(a, b.t(), scale_a, scale_b[:kb].t(), output_dtype)


def install() -> None:
    """Route block-scaled F.scaled_mm to the fake and let it run on any device."""
    torch.nn.functional.scaled_mm = fake_scaled_mm
    torch_impl.unavailable_reason = lambda device: None
