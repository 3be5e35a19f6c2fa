"""The FP8Linear twin's C++ call (``csrc/module_call.cpp`` fp8_call, issue 53): ``twin(x)`` quantizes x through the
quantizer's bound launch, runs the block-scale op's entry and adds the bias with no Python frame of ours, and
declines (None: the twin's Python forward runs) every call that forward would treat otherwise. On CPU the plan
table is replaced by a counting quantizer (the torch reference) and the op by a counting reference GEMM."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

pytest.importorskip("transformers", reason="needs transformers: pip install '.[hf]'")

from transformers.integrations.finegrained_fp8 import FP8Linear  # noqa: E402

from aiter_gemm import fp8_linear  # noqa: E402
from aiter_gemm.kernels import act_quant  # noqa: E402
from aiter_gemm.kernels.a8w8_blockscale import gemm_a8w8_blockscale_ref  # noqa: E402
from aiter_gemm.kernels.act_quant import per_token_group_quant_fp8_ref  # noqa: E402
from aiter_gemm.op_entry import EXT  # noqa: E402
from aiter_gemm.ops.a8w8_blockscale import gemm_a8w8_blockscale  # noqa: E402


class Fakes:
    """What fp8_call runs instead of the plan table and the op, and the capture state its probe reports."""

    def __init__(self):
        self.quant, self.gemm, self.capturing, self.bound = [], [], False, True

    def quantize(self, x2):
        self.quant.append(tuple(x2.shape))
        return per_token_group_quant_fp8_ref(x2, True) if self.bound else None

    def run_gemm(self, xq, wq, xs, ws, dtype):
        self.gemm.append(dtype)
        assert xs.stride() == (1, xq.shape[0]), "the twin's eager call hands the op M-major scales"
        return gemm_a8w8_blockscale_ref(xq, wq, xs, ws, dtype)


@pytest.fixture
def fakes():
    if EXT is None:
        pytest.skip("the C++ eager extension is not built")
    f = Fakes()
    EXT.setup_fp8(f.quantize, f.run_gemm, lambda: f.capturing)
    yield f
    if act_quant.TABLES is not None:
        EXT.setup_fp8(act_quant.TABLES[1], gemm_a8w8_blockscale, fp8_linear._capturing)


def twin(bias: bool = True) -> nn.Module:
    torch.manual_seed(0)
    mod = FP8Linear(384, 256, block_size=(128, 128), has_bias=bias)
    mod.weight.data = (torch.randn(256, 384) / 4).to(torch.float8_e4m3fn)
    mod.weight_scale_inv.data = torch.rand(2, 3) + 0.5
    if bias:
        mod.bias.data = torch.randn(256)
    return fp8_linear.from_fp8_linear(mod, "proj")


def reference(mod: nn.Module, x: torch.Tensor) -> torch.Tensor:
    xq, xs = per_token_group_quant_fp8_ref(x.reshape(-1, x.shape[-1]), True)
    out = gemm_a8w8_blockscale_ref(xq, mod.weight, xs, mod.weight_scale_inv, x.dtype)
    if mod.bias is not None:
        out = out.add_(mod.bias)
    return out.view(*x.shape[:-1], -1)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(5, 384), (2, 3, 384)])
def test_fp8_call_runs_the_quantizer_the_op_and_the_bias(fakes, monkeypatch, bias, shape):
    mod = twin(bias)
    x = torch.randn(*shape)
    forwards = []
    forward = fp8_linear.TunedFP8Mixin.forward
    monkeypatch.setattr(fp8_linear.TunedFP8Mixin, "forward", lambda self, i: forwards.append(1) or forward(self, i))
    with torch.no_grad():
        got = EXT.fp8_call(mod, x)
        via_call = mod(x)  # the twin's __call__ takes the C++ call first
    want = reference(mod, x)
    assert got.shape == want.shape and torch.equal(got, want) and torch.equal(via_call, want)
    rows = x.numel() // 384
    assert fakes.quant == [(rows, 384)] * 2 and fakes.gemm == [torch.float32] * 2 and not forwards


def _hooked(mod, x):
    mod.register_forward_pre_hook(lambda m, args: None)


def _override(mod, x):
    object.__setattr__(mod, "_aiter_gemm", gemm_a8w8_blockscale_ref)


def _cast(mod, x):
    mod.weight.data = mod.weight.data.to(torch.bfloat16)


def _double_scales(mod, x):
    mod.weight_scale_inv.data = mod.weight_scale_inv.data.double()


@pytest.mark.parametrize("change, why", [
    (_hooked, "a hook: nn.Module.__call__ runs it"),
    (_override, "the twin's own GEMM (benchmarks)"),
    (_cast, "the weight is no longer fp8: FP8Linear's own forward"),
    (lambda mod, x: x.requires_grad_(), "the input wants a gradient"),
    (_double_scales, "float64 scales"),
])
def test_fp8_call_declines_what_the_forward_treats_otherwise(fakes, change, why):
    mod = twin()
    x = torch.randn(4, 384)
    change(mod, x)
    assert EXT.fp8_call(mod, x) is None, why
    assert not fakes.gemm


def test_fp8_call_declines_inputs_modes_capture_and_unbound_shapes(fakes):
    mod = twin()
    x = torch.randn(4, 384)

    class Sub(torch.Tensor):
        pass

    for bad in (x.double(), x.as_subclass(Sub), torch.randn(4, 256)):
        assert EXT.fp8_call(mod, bad) is None, (bad.dtype, type(bad).__name__, bad.shape)
    with torch.no_grad(), TorchFunctionMode():  # the Python path's torch calls would go to the mode
        assert EXT.fp8_call(mod, x) is None
    fakes.capturing = True  # while capturing the x_scale layout follows the decision: the Python path
    assert EXT.fp8_call(mod, x) is None
    fakes.capturing = False
    assert not fakes.quant
    fakes.bound = False  # no bound launch for this input: the Python path binds it
    with torch.no_grad():
        assert EXT.fp8_call(mod, x) is None
    assert fakes.quant == [(4, 384)] and not fakes.gemm
    fakes.bound = True
    with torch.no_grad():
        assert torch.equal(EXT.fp8_call(mod, x), reference(mod, x))


def test_fp8_call_is_set_up_on_the_quantizers_m_major_table():
    """With the extension built the twin's ``__call__`` is the C++-first one and fp8_call reads the quantizer's
    M-major plan table (a CPU input finds no plan there: the Python path runs and gives the reference's result)."""
    if EXT is None:
        pytest.skip("the C++ eager extension is not built")
    assert fp8_linear._c_fp8_call is EXT.fp8_call
    mod = twin()
    assert type(mod).__call__ is fp8_linear.TunedFP8Mixin.__call__
    x = torch.randn(4, 384)
    with torch.no_grad():
        assert EXT.fp8_call(mod, x) is None
