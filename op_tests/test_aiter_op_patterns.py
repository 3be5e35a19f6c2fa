"""AITER's own ``op_tests/test_gemm_a16w16.py`` call patterns run against this package on CPU: ``tgemm.mm(x, weight,
bias, otype, scaleA, scaleB)`` over dtype x otype x its shapes (the default ``-mnk`` list and the skinny list's
fixed shapes), with bias (``-b``) and per-tensor scales (``-sa/-sb``), fp8 with scales, and 3-D / 4-D inputs; with
the shipped configs, and as a 256-CU gfx950 reading AITER's own tuned CSV (whose asm/opus rows cannot run
here: warned misses that must still give the right result) for the shapes AITER's CSV has."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import aiter_gemm
from aiter_gemm import tgemm

AITER_CSV = Path(__file__).parent / "fixtures" / "aiter_bf16_tuned_gemm.csv"
FP16, BF16, FP32, FP8 = torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn
# AITER's test: ``-mnk`` default (the second is in AITER's tuned CSV), then the fixed part of test_skinny_gemm's list
# (K kept; N = 132, an H100's SM count, where AITER's has 7424: CPU time).
MNK = [(128, 32, 8192), (64, 256, 5120), (3, 1, 8192), (4, 32, 9216), (16, 132, 8192), (48, 132, 512)]
OTYPES = [None, FP16, BF16, FP32]


@pytest.fixture
def shipped(clean_runtime):
    aiter_gemm.reload_configs()


@pytest.fixture(params=["shipped", "aiter_gfx950"])
def config(request, clean_runtime):
    if request.param == "aiter_gfx950":
        clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(AITER_CSV))
        clean_runtime.setenv("GPU_ARCHS", "gfx950")
        clean_runtime.setenv("CU_NUM", "256")
    aiter_gemm.reload_configs()
    return request.param


def reference(x, weight, bias, otype, scale_a, scale_b) -> torch.Tensor:
    """AITER's run_torch in float32: scales applied to the operands, bias added, cast to the output dtype."""
    out = F.linear(x.float(), weight.float())
    if scale_a is not None:
        out = out * scale_a
    if scale_b is not None:
        out = out * scale_b
    if bias is not None:
        out = out + bias.float()
    return out.to(otype or x.dtype)


def check(out: torch.Tensor, ref: torch.Tensor, otype: torch.dtype | None, dtype: torch.dtype) -> None:
    assert out.dtype == (otype or dtype), f"output {out.dtype}, expected {otype or dtype} (input {dtype})"
    assert out.shape == ref.shape
    scale = ref.float().abs().amax().clamp(min=1.0)
    torch.testing.assert_close(out.float(), ref.float(), rtol=1e-2, atol=2e-2 * float(scale))


def aiter_case(dtype, m, n, k, bias, otype, scale, gen):
    """The tensors AITER's test_gemm builds: x ~ randn, weight ~ rand, bias ~ rand (in the output dtype), scales as
    0-d float32 tensors."""
    make = otype if otype is not None and otype != FP8 else FP32
    x = torch.randn(m, k, dtype=make, generator=gen).to(dtype)
    weight = torch.rand(n, k, dtype=make, generator=gen).to(dtype)
    b = torch.rand(n, dtype=FP32, generator=gen).to(otype or dtype) if bias else None
    sa = sb = torch.tensor(scale, dtype=FP32) if scale is not None else None
    return x, weight, b, sa, sb


@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_dtype_otype_shapes(shipped, dtype):
    gen = torch.Generator().manual_seed(0)
    for m, n, k in MNK:
        for otype in OTYPES:
            x, w, _, _, _ = aiter_case(dtype, m, n, k, False, otype, None, gen)
            check(tgemm.mm(x, w, None, otype), reference(x, w, None, otype, None, None), otype, dtype)


@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_bias_and_scales(shipped, dtype):
    """``-b`` and ``-sa 0.5 -sb 0.5`` on the default shapes; bias in the output dtype (AITER's test makes it there),
    where that is the input dtype or float32."""
    gen = torch.Generator().manual_seed(1)
    for m, n, k in MNK[:2]:
        for otype in (None, dtype, FP32):
            for bias, scale in ((True, None), (False, 0.5), (True, 0.5)):
                x, w, b, sa, sb = aiter_case(dtype, m, n, k, bias, otype, scale, gen)
                check(tgemm.mm(x, w, b, otype, sa, sb), reference(x, w, b, otype, sa, sb), otype, dtype)


def test_fp8_with_scales(shipped):
    """``-d fp8 -sa 0.5 -sb 2`` into bf16 / fp16 / fp32 (torch._scaled_mm's float32 fallback on CPU)."""
    gen = torch.Generator().manual_seed(2)
    for m, n, k in MNK[:2]:
        for otype in (BF16, FP16, FP32):
            x, w, _, _, _ = aiter_case(FP8, m, n, k, False, otype, None, gen)
            sa, sb = torch.tensor(0.5), torch.tensor(2.0)
            check(tgemm.mm(x, w, None, otype, sa, sb), reference(x, w, None, otype, sa, sb), otype, FP8)


@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_3d_and_4d_inputs(shipped, dtype):
    """AITER views a >= 3-D input as (-1, K) and the output back to (..., N); a non-viewable (transposed) input
    gives the same result."""
    gen = torch.Generator().manual_seed(3)
    w = torch.rand(256, 5120, generator=gen).to(dtype)
    bias = torch.rand(256, generator=gen).to(dtype)
    for shape in ((2, 32, 5120), (2, 2, 16, 5120)):
        x = torch.randn(*shape, generator=gen).to(dtype)
        out = tgemm.mm(x, w, bias)
        assert out.shape == (*shape[:-1], 256)
        check(out, reference(x.reshape(-1, 5120), w, bias, None, None, None).reshape(out.shape), None, dtype)
    x = torch.randn(32, 2, 5120, generator=gen).to(dtype).transpose(0, 1)  # (2, 32, K), not contiguous
    check(tgemm.mm(x, w, bias), reference(x.reshape(-1, 5120), w, bias, None, None, None).reshape(2, 32, 256),
          None, dtype)


def test_aiter_rows_under_aiter_identity(config):
    """Under AITER's identity the (64, 256, 5120) bf16 -> fp32 row of AITER's CSV is found (and, being asm, falls
    back here) and the results are right, with and without bias; with the shipped configs it is the default."""
    gen = torch.Generator().manual_seed(4)
    for m in (64, 66):  # exact row, and 66 -> 80 padded
        for bias in (False, True):
            x, w, b, _, _ = aiter_case(BF16, m, 256, 5120, bias, FP32, None, gen)
            check(tgemm.mm(x, w, b, FP32), reference(x, w, b, FP32, None, None), FP32, BF16)
    cfg = aiter_gemm.get_GEMM_A16W16_config(64, 256, 5120, False, "torch.bfloat16", "torch.float32")
    if config == "aiter_gfx950":
        table = aiter_gemm.get_config_table("GEMM_BF16")
        row = table.lookup("gfx950", 256, (64, 256, 5120, False, BF16, FP32, False, False))
        assert row is not None and row.values["libtype"] == "asm" and row.line == 2
    assert cfg["matched"] == "default" and cfg["libtype"] == "torch"
