"""Gradients through every entry of ``gemm_a16w16`` (issue 47): the public function (the C++ entry where it is built)
and its Python form, ``tgemm.mm`` and ``TunedLinear``, over tuned rows of every backend that runs here (Triton rows
interpreted on CPU). A call wanting a gradient of a decision other than plain F.linear runs the custom op, whose
backward gives F.linear's gradients; calls wanting none (no_grad, inference_mode, operands not requiring grad) never
go through the op."""

from __future__ import annotations

import csv
import math

import pytest
import torch
import torch.nn.functional as F

import aiter_gemm
from aiter_gemm.configs import BF16_TUNED_COLUMNS
from aiter_gemm.nn import TunedLinear
from aiter_gemm.ops import a16w16 as ops

N, K = 40, 64
BF16, FP32 = torch.bfloat16, torch.float32
# (M, libtype, solidx, kernelName): a row per backend kind that runs on CPU. The torch row of a bf16 output is plain
# F.linear (autograd records it); its fp32-output row and every Triton and skinny row are runners of their own.
ROWS = [(1, "skinny", 6, "gemv_BN4_BK64_SK1_W4_S1"), (2, "skinny", 2, "fma_atomic_BN8_BK32_SK2_W4_S1"),
        (5, "triton", 0, "BM16_BN32_BK32_GM1_SK1_W4_S2"), (6, "triton", 0, "BM16_BN32_BK32_GM1_SK2_W4_S2"),
        (3, "torch", 0, "F.linear")]


def tolerance(x: torch.Tensor, w: torch.Tensor) -> dict:
    """bf16 gradients against float64 ones: they sum N (x.grad) or M (w.grad, b.grad) products of N(0, 1) values, so
    |grad| ~ sqrt(N or M); a few bf16 ulps there (reduced-precision split-K reductions on a GPU) and 2^-9 elsewhere."""
    m, n = x.numel() // x.shape[-1], w.shape[0]
    return dict(rtol=2e-2, atol=2.0**-6 * math.sqrt(max(m, n)))


def write_rows(path, rows, n: int, k: int, otypes=(BF16, FP32)) -> None:
    """Eager-timed tuned rows (``timing=eager``: eager calls run them on a GPU too) for this process's device, one per
    (row, output dtype), bf16 inputs with a bias."""
    ident = aiter_gemm.current_device_identity()
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, BF16_TUNED_COLUMNS, restval="")
        w.writeheader()
        for m, lib, idx, name in rows:
            for otype in otypes:
                w.writerow({"gfx": ident.gfx, "cu_num": ident.cu_num, "M": m, "N": n, "K": k, "bias": True,
                            "dtype": str(BF16), "outdtype": str(otype), "scaleAB": False, "bpreshuffle": False,
                            "libtype": lib, "solidx": idx, "splitK": 0, "us": 10.0, "kernelName": name,
                            "timing": "eager"})


@pytest.fixture
def tuned(clean_runtime, tmp_path):
    path = tmp_path / "tuned.csv"
    write_rows(path, ROWS, N, K)
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(path))
    aiter_gemm.reload_configs()
    for m, lib, _, name in ROWS:
        for otype in (BF16, FP32):
            got = aiter_gemm.get_GEMM_A16W16_config(m, N, K, True, BF16, otype)
            assert (got["matched"], got["libtype"], got["kernelName"], got["eager_libtype"]) == \
                ("exact", lib, name, lib), got
    return path


def operands(shape, n, k, device, bias_dtype=BF16):
    torch.manual_seed(sum(shape) * 31 + n)
    x = torch.randn(*shape, k, dtype=BF16, device=device, requires_grad=True)
    w = torch.randn(n, k, dtype=BF16, device=device, requires_grad=True)
    b = torch.randn(n, dtype=bias_dtype, device=device, requires_grad=True)
    return x, w, b


def check_gradients(call, x, w, b, otype, what: str) -> None:
    """``call(x, w, b)`` carries an autograd graph whose gradients are F.linear's (float64 reference)."""
    for attempt in ("first call", "cached call"):
        for t in (x, w, b):
            t.grad = None
        y = call(x, w, b)
        assert y.requires_grad and y.grad_fn is not None, f"{what}, {attempt}: no autograd graph"
        assert y.dtype == otype
        g = torch.randn_like(y)
        y.backward(g)
        refs = [t.detach().double().requires_grad_() for t in (x, w, b)]
        F.linear(*refs).backward(g.double())
        for name, t, ref in zip("xwb", (x, w, b), refs):
            assert t.grad is not None, f"{what}, {attempt}: {name}.grad is None"
            torch.testing.assert_close(t.grad.double(), ref.grad, **tolerance(x, w),
                                       msg=lambda m, n=name, a=attempt: f"{what}, {a}, {n}.grad: {m}")


ENTRIES = {
    "gemm_a16w16": lambda x, w, b, otype: aiter_gemm.gemm_a16w16(x, w, b, otype),  # the C++ entry where built
    "python": lambda x, w, b, otype: ops.gemm_a16w16_python(x, w, b, otype),
    "tgemm.mm": lambda x, w, b, otype: aiter_gemm.tgemm.mm(x, w, b, otype),
}


@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("otype", [None, FP32], ids=["bf16_out", "fp32_out"])
@pytest.mark.parametrize("lead", [(), (1,)], ids=["2d", "3d"])
def test_functional_entries_give_linears_gradients(tuned, device, entry, otype, lead):
    """Issue 47: Triton and skinny rows ran their kernels directly, so the output had no graph and w.grad stayed
    None (the plain torch row was right)."""
    fn = ENTRIES[entry]
    for m, lib, _, _ in ROWS:
        x, w, b = operands((*lead, m), N, K, device, bias_dtype=otype or BF16)
        check_gradients(lambda x, w, b: fn(x, w, b, otype), x, w, b, otype or BF16, f"{entry} {lib} M={m}")


def test_tuned_linear_gives_linears_gradients(tuned, device):
    for m, lib, _, _ in ROWS:
        lin = torch.nn.Linear(K, N, dtype=BF16, device=device)
        tl = TunedLinear.from_linear(lin)
        x = torch.randn(1, m, K, dtype=BF16, device=device, requires_grad=True)
        check_gradients(lambda x, w, b, tl=tl: tl(x), x, tl.weight, tl.bias, BF16, f"TunedLinear {lib} M={m}")


@pytest.fixture
def op_runs(monkeypatch):
    """How many times the custom op's implementation ran (it calls the module's ``gemm_a16w16``)."""
    runs = []
    real = ops.gemm_a16w16

    def counting(*args):
        runs.append(1)
        return real(*args)

    monkeypatch.setattr(ops, "gemm_a16w16", counting)
    return runs


@pytest.mark.parametrize("entry", ["gemm_a16w16", "python"])
def test_calls_without_gradient_skip_the_custom_op(tuned, device, op_runs, entry):
    """No grad mode, inference mode, or no operand requiring grad: the decision's runner directly, never the op (its
    dispatch costs ~16 us per call on CPU); a call wanting a gradient runs the op exactly once (its implementation
    calls gemm_a16w16 again with grad mode off: no recursion)."""
    fn = ENTRIES[entry]
    x, w, b = operands((5,), N, K, device)  # the triton row
    ref = fn(x.detach(), w.detach(), b.detach(), None)
    with torch.no_grad():
        out = fn(x, w, b, None)
    assert not out.requires_grad and torch.equal(out, ref)
    with torch.inference_mode():
        out = fn(x, w, b, None)
    assert torch.equal(out, ref)
    out = fn(x.detach(), w.detach(), b.detach(), None)
    assert not out.requires_grad and torch.equal(out, ref)
    assert op_runs == []
    out = fn(x, w, b, None)
    assert out.requires_grad and op_runs == [1]
    torch.testing.assert_close(out.detach(), ref)


def test_tuned_linear_without_gradient_skips_the_custom_op(tuned, device, op_runs):
    tl = TunedLinear.from_linear(torch.nn.Linear(K, N, dtype=BF16, device=device))
    x = torch.randn(1, 5, K, dtype=BF16, device=device)  # the triton row
    with torch.no_grad():
        ref = tl(x)
        tl(x)
    with torch.inference_mode():
        tl(x)
    tl.requires_grad_(False)
    assert not tl(x).requires_grad and op_runs == []
    tl.requires_grad_(True)
    assert tl(x).requires_grad and op_runs == [1]
    torch.testing.assert_close(tl(x).detach(), ref)


@pytest.mark.gpu
def test_gradients_of_eager_timed_gemv_and_triton_rows_on_the_gpu(clean_runtime, tmp_path):
    """Issue 47 as seen on the H200: an eager-timed gemv row (M = 1) and triton row (M = 64) of 6144 x 4096 ran
    their kernels in eager calls with no autograd graph."""
    n, k = 6144, 4096
    rows = [(1, "skinny", 6, "gemv_BN1_BK4096_SK1_W4_S1_EF"), (64, "triton", 0, "BM64_BN128_BK64_GM8_SK1_W4_S3")]
    path = tmp_path / "tuned.csv"
    write_rows(path, rows, n, k, otypes=(BF16,))
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(path))
    aiter_gemm.reload_configs()
    for m, lib, _, name in rows:
        got = aiter_gemm.get_GEMM_A16W16_config(m, n, k, True, BF16)
        assert (got["libtype"], got["kernelName"], got["eager_libtype"]) == (lib, name, lib), got
        for entry, fn in ENTRIES.items():
            x, w, b = operands((m,), n, k, "cuda")
            check_gradients(lambda x, w, b, fn=fn: fn(x, w, b, None), x, w, b, BF16, f"{entry} {lib} M={m}")
        tl = TunedLinear.from_linear(torch.nn.Linear(k, n, dtype=BF16, device="cuda"))
        x = torch.randn(1, m, k, dtype=BF16, device="cuda", requires_grad=True)
        check_gradients(lambda x, w, b, tl=tl: tl(x), x, tl.weight, tl.bias, BF16, f"TunedLinear {lib} M={m}")
