"""Numerics of ``gemm_a16w16`` / ``tgemm.mm`` through the default path, bad input errors, and torch.compile."""

from __future__ import annotations

import pytest
import torch

import aiter_gemm

# Tolerances against a float64 reference, by (input dtype, output dtype). Inputs are N(0, 1), so |out| ~ sqrt(K):
# atol is (per-unit error) * sqrt(K), applied where |out| is small; rtol where it is large.
TOLERANCES = {
    # fp32 accumulate, fp32 out: accumulation-order error ~ sqrt(K) * 2^-24 * |out|; 1e-4 leaves a wide margin.
    (torch.float32, torch.float32): dict(rtol=1e-4, unit_atol=1e-5),
    # 16-bit inputs are exact in fp32 and the output is fp32 (never rounded through 16 bits): order error only.
    (torch.bfloat16, torch.float32): dict(rtol=2e-3, unit_atol=2e-4),
    (torch.float16, torch.float32): dict(rtol=2e-3, unit_atol=2e-4),
    # bf16 out: half-ulp 2^-9 of |out|, plus cuBLAS's reduced-precision (bf16) split-K reductions, which torch
    # allows by default: a few bf16 ulps.
    (torch.bfloat16, torch.bfloat16): dict(rtol=1.6e-2, unit_atol=1.6e-2),
    # fp16 out: half-ulp 2^-12 of |out|, plus reduced-precision split-K reductions (fp16): a few ulps.
    (torch.float16, torch.float16): dict(rtol=4e-3, unit_atol=4e-3),
}


def tolerance(dtype, otype, K) -> dict:
    tol = TOLERANCES[(dtype, otype)]
    return dict(rtol=tol["rtol"], atol=tol["unit_atol"] * K**0.5)


def reference(a, b, bias, otype):
    out = a.double() @ b.double().t()
    if bias is not None:
        out = out + bias.double()
    return out.to(otype)


@pytest.mark.parametrize("M", [1, 3, 17, 129])
@pytest.mark.parametrize(("N", "K"), [(97, 200), (256, 97), (33, 4100)])
@pytest.mark.parametrize(("dtype", "otype"), list(TOLERANCES))
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_reference(device, M, N, K, dtype, otype, with_bias):
    torch.manual_seed(M * 7 + N)
    a = torch.randn(M, K, dtype=dtype, device=device)
    b = torch.randn(N, K, dtype=dtype, device=device)
    bias = torch.randn(N, dtype=dtype, device=device) if with_bias else None
    out = aiter_gemm.gemm_a16w16(a, b, bias, otype=otype if otype != dtype else None)
    assert out.shape == (M, N) and out.dtype == otype
    torch.testing.assert_close(out, reference(a, b, bias, otype), **tolerance(dtype, otype, K))


@pytest.mark.parametrize("lead", [(2, 3), (1, 1, 5), (4,)])
def test_batched_input_flattened_and_reshaped(device, lead):
    a = torch.randn(*lead, 64, device=device)
    b = torch.randn(48, 64, device=device)
    out = aiter_gemm.gemm_a16w16(a, b)
    assert out.shape == (*lead, 48)
    torch.testing.assert_close(out, torch.nn.functional.linear(a, b), rtol=1e-4, atol=1e-4)


def test_non_viewable_and_strided_inputs(device):
    base = torch.randn(6, 4, 64, device=device)
    a = base.transpose(0, 1)  # (4, 6, 64), not viewable as (24, 64)
    b = torch.randn(64, 48, device=device).t()  # (48, 64), column-major
    bias = torch.randn(96, device=device)[::2]  # stride-2 bias
    out = aiter_gemm.tgemm.mm(a, b, bias)
    torch.testing.assert_close(out, torch.nn.functional.linear(a, b, bias), rtol=1e-4, atol=1e-4)


def test_fp8_scaled_fallback_matches_dequantized_reference(device):
    fp8 = torch.float8_e4m3fn
    a = (torch.randn(5, 64, device=device) * 4).to(fp8)
    b = (torch.randn(32, 64, device=device) * 4).to(fp8)
    sa, sb = torch.tensor(0.5, device=device), torch.tensor(0.25, device=device)
    bias = torch.randn(32, dtype=torch.bfloat16, device=device)
    out = aiter_gemm.gemm_a16w16(a, b, bias, otype=torch.bfloat16, scale_a=sa, scale_b=sb)
    ref = (a.float() * 0.5) @ (b.float() * 0.25).t() + bias.float()
    torch.testing.assert_close(out.float(), ref, rtol=1.6e-2, atol=1e-1)
    cfg = aiter_gemm.get_GEMM_A16W16_config(5, 32, 64, True, fp8, torch.bfloat16, scaleAB=True)
    assert cfg["libtype"] == "torch"


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "a_dtype", "b_dtype", "match"),
    [((4, 64), (32, 63), torch.float32, torch.float32, r"K mismatch: A \(4, 64\) torch.float32 has K=64"),
     ((4, 64), (32, 64), torch.float32, torch.float16,
      r"A \(4, 64\) is torch.float32 but B \(32, 64\) is torch.float16"),
     ((4, 64), (32, 64, 1), torch.float32, torch.float32, r"B \(N, K\)"),
     ((4, 64), (32, 64), torch.int32, torch.int32, "expected a floating dtype")],
)
def test_bad_input_errors_name_tensors(a_shape, b_shape, a_dtype, b_dtype, match):
    a = torch.ones(a_shape, dtype=a_dtype)
    b = torch.ones(b_shape, dtype=b_dtype)
    with pytest.raises(ValueError, match=match):
        aiter_gemm.gemm_a16w16(a, b)


def test_bad_bias_shape():
    with pytest.raises(ValueError, match=r"bias must be \(N,\) = \(32,\), got \(31,\)"):
        aiter_gemm.gemm_a16w16(torch.ones(4, 64), torch.ones(32, 64), torch.ones(31))


def test_bias_checked_on_every_call_not_only_the_first():
    """A (1, N) or (M, N) bias must not broadcast silently because a (N,) bias validated the shape before."""
    a, b = torch.randn(4, 64), torch.randn(32, 64)
    aiter_gemm.gemm_a16w16(a, b, torch.randn(32))  # caches this shape's decision
    for bad in (torch.randn(1, 32), torch.randn(4, 32)):
        with pytest.raises(ValueError, match=r"bias must be \(N,\) = \(32,\)"):
            aiter_gemm.gemm_a16w16(a, b, bad)
    with pytest.raises(ValueError, match=r"bias \(32,\) has dtype torch.float16; it must be torch.float32"):
        aiter_gemm.gemm_a16w16(a, b, torch.randn(32, dtype=torch.float16))
    # bf16 in, fp32 out: a bias in either dtype is fine
    a16, b16 = a.bfloat16(), b.bfloat16()
    for dt in (torch.bfloat16, torch.float32):
        out = aiter_gemm.gemm_a16w16(a16, b16, torch.ones(32, dtype=dt), otype=torch.float32)
        assert out.dtype == torch.float32


@pytest.mark.parametrize("name", ["A", "B", "bias"])
def test_operand_devices_checked_on_every_call(name):
    """Issue 31: after a CPU call, the same shapes with a ``meta`` weight (or A, or bias) returned a CPU tensor of
    uninitialised values from the cached entry (the C++ one included): every call's devices are checked."""
    args = {"A": torch.randn(4, 64), "B": torch.randn(32, 64), "bias": torch.randn(32)}
    aiter_gemm.gemm_a16w16(args["A"], args["B"], args["bias"])  # caches this shape's decision
    aiter_gemm.gemm_a16w16(args["A"], args["B"], args["bias"])  # and its plain entry (the C++ one where built)
    args[name] = args[name].to("meta")
    with pytest.raises(ValueError, match=r"is on meta|on meta"):
        aiter_gemm.gemm_a16w16(args["A"], args["B"], args["bias"])


@pytest.mark.parametrize("bad,match", [
    (torch.tensor([0.5, 0.5]), r"scale_a \(shape \(2,\), dtype torch.float32, on cpu\) must be a per-tensor scale"),
    (torch.tensor(0.5, dtype=torch.float64), r"scale_a \(shape \(\), dtype torch.float64, on cpu\)"),
    (torch.tensor(0.5, device="meta"), r"scale_a \(shape \(\), dtype torch.float32, on meta\)"),
])
def test_fp8_scales_checked_naming_the_scale(bad, match):
    """Issue 31: a per-tensor fp8 scale of the wrong shape gave torch's broadcasting error; wrong dtype or device
    went to the kernels. Checked on every call, after a valid one of the same shapes too."""
    fp8 = torch.float8_e4m3fn
    a, b = torch.randn(5, 64).to(fp8), torch.randn(32, 64).to(fp8)
    good = torch.tensor(0.5)
    aiter_gemm.gemm_a16w16(a, b, otype=torch.bfloat16, scale_a=good, scale_b=good)
    with pytest.raises(ValueError, match=match):
        aiter_gemm.gemm_a16w16(a, b, otype=torch.bfloat16, scale_a=bad, scale_b=good)


@pytest.mark.parametrize("name", ["A", "B", "bias", "scale_a"])
def test_non_tensor_arguments_are_type_errors_naming_them(name):
    args = {"A": torch.randn(4, 64), "B": torch.randn(32, 64), "bias": None, "scale_a": None}
    aiter_gemm.gemm_a16w16(args["A"], args["B"])  # a cached entry for the tensors' shape must not hide the error
    args[name] = [[1.0] * 64] * 4 if name in "AB" else 0.5
    with pytest.raises(TypeError, match=f"gemm_a16w16: {name} must be a torch.Tensor"):
        aiter_gemm.gemm_a16w16(args["A"], args["B"], args["bias"], scale_a=args["scale_a"])


@pytest.mark.parametrize("otype", [torch.int32, torch.bool, torch.int8])
def test_non_floating_otype_refused(otype):
    with pytest.raises(ValueError, match=f"otype {otype}: {otype} output is not supported"):
        aiter_gemm.gemm_a16w16(torch.randn(4, 64), torch.randn(32, 64), otype=otype)


class TinyMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 96)
        self.down = torch.nn.Linear(96, 64, bias=False)

    def forward(self, x):
        h = aiter_gemm.gemm_a16w16(x, self.up.weight, self.up.bias)
        return aiter_gemm.gemm_a16w16(torch.relu(h), self.down.weight)


def test_torch_compile_fullgraph(device):
    torch._dynamo.reset()
    model = TinyMLP().to(device)
    x = torch.randn(2, 7, 64, device=device)
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), eager, rtol=1e-4, atol=1e-4)
    # the op is in the graph (not traced through): its fake impl gave dynamo the output shape
    gm = torch._dynamo.export(model)(x).graph_module  # noqa: SLF001 - public enough for a test
    assert "aiter_gemm.gemm_a16w16" in gm.code


def test_custom_op_registered_with_fake():
    a, b = torch.randn(3, 16), torch.randn(8, 16)
    torch.library.opcheck(torch.ops.aiter_gemm.gemm_a16w16.default, (a, b, None, None, None, None, None))


def test_op_gradients_match_linear():
    a = torch.randn(2, 3, 16, dtype=torch.float64, requires_grad=True)
    b = torch.randn(8, 16, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(8, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda *t: torch.ops.aiter_gemm.gemm_a16w16(*t), (a, b, bias))


def _expanded(t: torch.Tensor) -> torch.Tensor:
    """``t``'s first row repeated by a stride-0 ``expand`` (one row of storage read M times)."""
    return t[:1].expand(t.shape)


# Tuned rows on this machine's identity for every backend (on CPU, the Triton ones run under the interpreter):
# torch, the classic and split-K Triton kernels, and skinny's one-pass, atomic, two-pass and gemv variants.
STRIDE_ROWS = [(3, "torch", 0, "F.linear"), (5, "triton", 0, "BM16_BN32_BK32_GM1_SK1_W4_S2"),
               (6, "triton", 0, "BM16_BN32_BK32_GM1_SK2_W4_S2"), (1, "skinny", 6, "gemv_BN4_BK64_SK1_W4_S1"),
               (2, "skinny", 2, "fma_atomic_BN8_BK32_SK2_W4_S1"), (4, "skinny", 4, "dot_2pass_BN16_BK32_SK2_W4_S2")]


@pytest.mark.parametrize("layout", ["strided", "column", "expand0"])
@pytest.mark.parametrize("operands", ["contiguous", "strided", "expanded"])
def test_every_backend_reads_bias_and_operands_by_stride(clean_runtime, tmp_path, device, operands, layout):
    """Issue 31: tuned rows of every backend that runs on CPU give F.linear's result for any bias layout (strided,
    a column of a 2-D tensor, stride 0) and A / B that are transposed views, column slices or stride-0 expands. (On
    a GPU the Triton rows, graph-timed, run the eager default here: test_graph_capture covers them there.)"""
    from op_tests.runtime_helpers import BF16_HEADER, bf16_row, strided_bias

    n, k = 40, 64
    tuned = tmp_path / "tuned.csv"
    tuned.write_text(BF16_HEADER + "".join(bf16_row(m, n, k, lib, bias=True, dtype="torch.bfloat16",
                                                    outdtype="torch.float32", solidx=idx, kernel=name)
                                           for m, lib, idx, name in STRIDE_ROWS))
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(tuned))
    aiter_gemm.reload_configs()
    torch.manual_seed(0)
    for m, lib, _, name in STRIDE_ROWS:
        assert aiter_gemm.get_GEMM_A16W16_config(m, n, k, True, torch.bfloat16, torch.float32)["kernelName"] == name
        a = torch.randn(k, m, dtype=torch.bfloat16, device=device).t() if operands == "strided" else \
            torch.randn(m, k, dtype=torch.bfloat16, device=device)
        b = torch.randn(n, 2 * k, dtype=torch.bfloat16, device=device)[:, ::2] if operands == "strided" else \
            torch.randn(n, k, dtype=torch.bfloat16, device=device)
        if operands == "expanded":
            a, b = _expanded(a), _expanded(b)
        bias = strided_bias(layout, n, torch.float32, device)
        out = aiter_gemm.gemm_a16w16(a, b, bias, otype=torch.float32)
        torch.testing.assert_close(out, reference(a, b, bias, torch.float32),
                                   **tolerance(torch.bfloat16, torch.float32, k), msg=lambda s, r=lib: f"{r}: {s}")
