"""transformers' ``FP8Linear`` on the block-scale op (``aiter_gemm.fp8_linear``, through ``patch_linear``): the fused
per-token-group activation quantizer against its torch reference, a tiny FP8 Qwen3 built from its config (random
weights quantized to 128x128 blocks) patched and compared with its dequantized twin, the swap count, what is left
alone (with one warning), no copies, unpatch, capture of the op's shapes, torch.compile(fullgraph=True), fallbacks."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers", reason="needs transformers: pip install '.[hf]'")

from transformers.integrations.finegrained_fp8 import FP8Linear  # noqa: E402

import aiter_gemm  # noqa: E402
from aiter_gemm import fp8_linear  # noqa: E402
from aiter_gemm.kernels.a8w8_blockscale import gemm_a8w8_blockscale_ref  # noqa: E402
from aiter_gemm.kernels.act_quant import per_token_group_quant_fp8, per_token_group_quant_fp8_ref  # noqa: E402
from aiter_gemm.nn import patch_linear, unpatch_linear  # noqa: E402
from examples.hf_fp8 import quantize_linears  # noqa: E402

QCFG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
LAYERS = 2
PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj")
FP8_NAMES = [f"model.layers.{i}.{p}" for i in range(LAYERS) for p in PROJ]
# (N, K) per projection of the tiny model: q 4 heads x 64, k/v 2 x 64, hidden 256, intermediate 384 (3 K blocks).
SHAPES = {"q_proj": (256, 256), "k_proj": (128, 256), "v_proj": (128, 256), "o_proj": (256, 256),
          "gate_proj": (384, 256), "up_proj": (384, 256), "down_proj": (256, 384)}
# The block-scale op has no CPU backend but the Triton kernels under TRITON_INTERPRET=1: tests that run a model's CPU
# tensors through it are for machines without a GPU (the quantizer's tests run on the device, compiled there).
INTERPRETED = pytest.mark.interpreted
# Tolerances, relative to the largest |value|:
TOL = {
    # one module against the float32 reference fed the same quantized activation: only summation order differs
    "same_quantization": 1e-5,
    # logits of the patched model against its dequantized twin (F.linear on the dequantized weights, activations
    # unquantized): e4m3 keeps 3 mantissa bits, so each activation is off by up to 1/16 relative, through two layers
    "fp8_activations": 0.08,
    # a bf16 output against the float32 reference of the same quantization: one bf16 rounding (8 bits)
    "bf16_output": 2.0**-8,
}


def tiny_fp8_model(dtype: torch.dtype = torch.float32, bias: bool = False) -> tuple[nn.Module, list]:
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(hidden_size=256, intermediate_size=384, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=64, num_hidden_layers=LAYERS, vocab_size=128,
                                   max_position_embeddings=256, tie_word_embeddings=False, attention_bias=bias)
    model = transformers.Qwen3ForCausalLM(cfg).eval().to(dtype)
    if bias:
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, nn.Linear) and m.bias is not None:
                    m.bias.normal_(0, 0.5)
    swapped = quantize_linears(model, QCFG)
    return model, swapped


def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, use_cache=False).logits.float()


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got - ref).abs().max() / ref.abs().max()).item()


# ---- the quantizer ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m_major", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,K", [(1, 128), (3, 300), (17, 1000), (0, 256)])
def test_quantizer_matches_reference(M, K, dtype, m_major, device):
    x = torch.randn(M, K, dtype=dtype, device=device) * 3
    if M:
        x[0, :40] = 0  # an all-zero group (K = 128: the first group is partly zero) and a large one
        x[-1, -5:] = 900
    q, s = per_token_group_quant_fp8(x, m_major)
    qr, sr = per_token_group_quant_fp8_ref(x, m_major)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert s.shape == (M, -(-K // 128)) and s.stride() == ((1, M) if m_major else (s.shape[1], 1))
    assert torch.equal(q.float(), qr.float()) and torch.equal(s, sr)
    if M:
        scale = s.repeat_interleave(128, 1)[:, :K]
        # e4m3 rounding: half a step, 1/16 of the value, or 2^-10 of the scale in the subnormal range
        assert ((q.float() * scale - x.float()).abs() <= x.float().abs() / 16 + scale * 2.0 ** -10).all()


def test_quantizer_takes_strided_rows_and_rejects_bad_input(device):
    x = torch.randn(4, 512, device=device)[:, :300]
    q, s = per_token_group_quant_fp8(x)
    qr, sr = per_token_group_quant_fp8_ref(x.contiguous())
    assert torch.equal(q.float(), qr.float()) and torch.equal(s, sr)
    with pytest.raises(TypeError, match=r"x \(shape \(2, 128\), dtype torch.int32\)"):
        per_token_group_quant_fp8(torch.zeros(2, 128, dtype=torch.int32))
    with pytest.raises(ValueError, match="2-D"):
        per_token_group_quant_fp8(torch.zeros(2, 3, 128))


# ---- patch_linear on FP8Linear ----------------------------------------------------------------------------------


def test_patch_swaps_fp8_linears_sharing_parameters(clean_runtime):
    model, swapped = tiny_fp8_model()
    assert [n for n, _, _ in swapped] == FP8_NAMES
    before = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    params = {n: p for n, p in model.named_parameters()}
    keys = list(model.state_dict())
    names = patch_linear(model)
    assert names == FP8_NAMES + ["lm_head"], "14 FP8Linear and the bf16 lm_head"
    for n in FP8_NAMES:
        m = model.get_submodule(n)
        assert isinstance(m, FP8Linear) and isinstance(m, fp8_linear.TunedFP8Mixin) and m is not before[n]
    assert all(p is params[n] for n, p in model.named_parameters()), "the same Parameter objects: nothing copied"
    assert list(model.state_dict()) == keys
    assert unpatch_linear(model) == names
    assert all(model.get_submodule(n) is m for n, m in before.items())


@INTERPRETED
@pytest.mark.parametrize("bias", [False, True])
def test_patched_fp8_model_matches_dequantized_reference(clean_runtime, bias):
    model, swapped = tiny_fp8_model(bias=bias)
    ids = torch.randint(0, 128, (2, 5))
    for arm in (2, 1):  # the dequantized twin (nn.Linear in each slot), then the FP8Linear modules back
        for entry in swapped:
            parent, attr = entry[0].rsplit(".", 1)
            model.get_submodule(parent)._modules[attr] = entry[arm]
        if arm == 2:
            ref = logits(model, ids)
    patch_linear(model, exclude=["lm_head"])
    got = logits(model, ids)
    assert rel_err(got, ref) <= TOL["fp8_activations"]


@INTERPRETED
@pytest.mark.parametrize("shape", [(3, 256), (2, 5, 384)])
def test_one_module_against_the_quantized_reference(clean_runtime, shape):
    model, _ = tiny_fp8_model(bias=True)
    name = "model.layers.0.mlp.down_proj" if shape[-1] == 384 else "model.layers.0.self_attn.q_proj"
    patch_linear(model)
    mod = model.get_submodule(name)
    x = torch.randn(*shape)
    with torch.no_grad():
        got = mod(x)
    xq, xs = per_token_group_quant_fp8_ref(x.reshape(-1, shape[-1]))
    ref = gemm_a8w8_blockscale_ref(xq, mod.weight, xs, mod.weight_scale_inv, torch.float32)
    ref = (ref + (mod.bias if mod.bias is not None else 0)).view(*shape[:-1], -1)
    assert got.shape == ref.shape and rel_err(got, ref) <= TOL["same_quantization"]


def _fp8(block=(128, 128), scheme="dynamic", scale_dtype=torch.float32) -> nn.Module:
    m = FP8Linear(256, 128, block_size=block, activation_scheme=scheme)
    if scale_dtype != torch.float32:
        m.weight_scale_inv = nn.Parameter(m.weight_scale_inv.data.to(scale_dtype), requires_grad=False)
    return m


@pytest.mark.parametrize("module,why", [
    (lambda: _fp8(block=(64, 64)), "block_size [64, 64]"),
    (lambda: _fp8(block=None), "block_size None"),
    (lambda: _fp8(scheme="static"), "static activation scales"),
    (lambda: _fp8(scale_dtype=getattr(torch, "float8_e8m0fnu", torch.bfloat16)), "UE8M0"),
])
def test_other_fp8_layouts_are_left_alone_with_one_warning(caplog, module, why):
    model = nn.Sequential(nn.Sequential(module()), _fp8())
    with caplog.at_level(logging.WARNING, logger="aiter_gemm"):
        assert patch_linear(model) == ["1"]
    msgs = [r.getMessage() for r in caplog.records if "leaves" in r.getMessage()]
    assert len(msgs) == 1 and "0.0 (FP8Linear)" in msgs[0] and why in msgs[0]
    assert type(model[0][0]) is FP8Linear


@INTERPRETED
def test_fp8_shapes_are_captured(clean_runtime, tmp_path):
    captured = tmp_path / "bf16_untuned_gemm.csv"
    clean_runtime.setenv("AITER_TUNE_GEMM", "1")
    clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(captured))
    aiter_gemm.reload_configs()
    model, _ = tiny_fp8_model()
    patch_linear(model, exclude=["lm_head"])
    logits(model, torch.randint(0, 128, (3, 2)))
    aiter_gemm.get_dispatcher("gemm_a8w8_blockscale").flush_capture()
    from aiter_gemm.fileio import read_csv_rows

    _, rows = read_csv_rows(str(tmp_path / "a8w8_blockscale_untuned_gemm.csv"))
    assert {(int(r["M"]), int(r["N"]), int(r["K"])) for r in rows} == {(6, n, k) for n, k in SHAPES.values()}


@INTERPRETED
def test_torch_compile_fullgraph(clean_runtime):
    model, _ = tiny_fp8_model()
    patch_linear(model)
    ids = torch.randint(0, 128, (2, 3))
    ref = logits(model, ids)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    got = logits(torch.compile(model, fullgraph=True, backend=backend), ids)
    torch._dynamo.reset()
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert len(graphs) == 1 and sum("aiter_gemm.fp8_block_linear" in t for t in targets) == len(FP8_NAMES)
    assert rel_err(got, ref) <= TOL["same_quantization"]


def test_calls_the_op_cannot_take_run_fp8linears_forward_warned_once(clean_runtime, caplog, monkeypatch):
    model, _ = tiny_fp8_model()
    patch_linear(model)
    mod = model.get_submodule("model.layers.0.self_attn.q_proj")
    ran = []
    monkeypatch.setattr(FP8Linear, "forward", lambda self, x: ran.append(x.dtype) or x.new_zeros(3, 256))
    x = torch.randn(3, 256, requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="aiter_gemm"):
        mod(x)
        mod(x)
        mod(x.detach().double())
    msgs = [r.getMessage() for r in caplog.records]
    assert ran == [torch.float32, torch.float32, torch.float64]
    assert len(msgs) == 2 and all("model.layers.0.self_attn.q_proj runs FP8Linear's own forward" in m for m in msgs)
    assert "wants a gradient" in msgs[0] and "torch.float64" in msgs[1]


# ---- the x_scale layout the runner takes ---------------------------------------------------------------------
TABLE_HEADER = "gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName,tflops,bw,errRatio\n"


def _block_table(clean_runtime, tmp_path, rows: str) -> None:
    """A block-scale table of ``rows`` (no JSON), torch's block-scaled matmul available (the CPU fake)."""
    import op_tests.fake_scaled_mm as fake

    clean_runtime.setattr(torch.nn.functional, "scaled_mm", torch.nn.functional.scaled_mm, raising=False)
    clean_runtime.setattr(fake.torch_impl, "unavailable_reason", fake.torch_impl.unavailable_reason)
    fake.install()
    fake.CALLS.clear()
    (tmp_path / "bs.csv").write_text(TABLE_HEADER + rows)
    clean_runtime.setenv("AITER_CONFIG_GEMM_A8W8_BLOCKSCALE", str(tmp_path / "bs.csv"))
    clean_runtime.setenv("AITER_GEMM_TRITON_CONFIGS", str(tmp_path))
    aiter_gemm.reload_configs()


@pytest.mark.parametrize("row,eager,captured", [
    ("", True, False),  # the Triton default: captured calls run it (row-major), eager calls torch's (M-major)
    ("sm_90,132,16,512,1024,torch,0,0,5.0,scaled_mm_blockwise,1,1,0\n", True, True),
    ("sm_90,132,16,512,1024,triton,0,0,5.0,swapAB-BM16_BN64_BK128_GM1_SK1_W4_S6_TMA,1,1,0\n", True, False),
])
def test_x_scale_layout_follows_the_decisions_eager_plan(clean_runtime, tmp_path, row, eager, captured):
    """M-major exactly where the call's runner is torch's block-scaled matmul (which copies row-major scales per
    call), row-major where it is our Triton kernel (tuned that way), per capture mode; a reload forgets it. Triton's
    launches unbound here: eager calls of a Triton decision run torch's (bound: test_blockscale_bound.py)."""
    from aiter_gemm import cudagraph, triton_launch
    from aiter_gemm.device import DeviceIdentity
    from aiter_gemm.ops.a8w8_blockscale import x_scale_m_major

    clean_runtime.setattr(triton_launch, "BINDS", False)
    _block_table(clean_runtime, tmp_path, row)
    disp = aiter_gemm.get_dispatcher("gemm_a8w8_blockscale")
    clean_runtime.setattr(disp, "device", lambda on_gpu: DeviceIdentity("sm_90", 132, "cuda", "H100"))
    cuda = True  # a GPU call: only the decision is made, no tensor is created
    assert x_scale_m_major(16, 512, 1024, torch.bfloat16, cuda) is eager
    clean_runtime.setattr(cudagraph.capture_state, "depth", 1)
    assert x_scale_m_major(16, 512, 1024, torch.bfloat16, cuda) is captured
    clean_runtime.setattr(cudagraph.capture_state, "depth", 0)
    assert x_scale_m_major(0, 512, 1024, torch.bfloat16, cuda) is False
    (tmp_path / "bs.csv").write_text(TABLE_HEADER)
    aiter_gemm.reload_configs()
    assert x_scale_m_major(16, 512, 1024, torch.bfloat16, cuda) is True and x_scale_m_major(
        16, 512, 1024, torch.bfloat16, cuda) is True  # decided again: the default's eager plan


@INTERPRETED
def test_twin_quantizes_m_major_outside_capture_and_per_decision_while_capturing(clean_runtime, tmp_path,
                                                                              monkeypatch):
    """Eager calls quantize x_scale M-major whatever the row (every eager runner takes it without a copy, and the
    layout lookup costs host time); while a CUDA graph is captured the twin follows x_scale_m_major (a Triton row:
    row-major, what its kernel was tuned on). Both give the reference's result."""
    from aiter_gemm import cudagraph

    cu = aiter_gemm.current_device_identity(False).cu_num
    _block_table(clean_runtime, tmp_path,
                 f"cpu,{cu},8,128,512,triton,0,0,5.0,swapAB-BM16_BN64_BK128_GM1_SK1_W4_S6_TMA,1,1,0\n")
    seen = []
    quant = fp8_linear.per_token_group_quant_fp8

    def spy(x, m_major=False):
        seen.append(m_major)
        return quant(x, m_major)

    monkeypatch.setattr(fp8_linear, "per_token_group_quant_fp8", spy)
    mod = fp8_linear.from_fp8_linear(FP8Linear(512, 128, block_size=(128, 128)), "m")
    mod.weight.data = (torch.randn(128, 512) / 4).to(torch.float8_e4m3fn)
    mod.weight_scale_inv.data = torch.rand(1, 4) + 0.5
    x = torch.randn(8, 512)
    xq, xs = per_token_group_quant_fp8_ref(x)
    ref = gemm_a8w8_blockscale_ref(xq, mod.weight, xs, mod.weight_scale_inv, torch.float32)
    assert aiter_gemm.get_GEMM_A8W8_BLOCKSCALE_config(8, 128, 512)["libtype"] == "triton"
    with torch.no_grad():
        eager = mod(x)
        monkeypatch.setattr(cudagraph.capture_state, "depth", 1)
        captured = mod(x)
    assert seen == [True, False]
    assert rel_err(eager, ref) <= TOL["same_quantization"] and rel_err(captured, ref) <= TOL["same_quantization"]


def test_twin_hands_torch_its_quantized_scales_without_a_copy(clean_runtime, tmp_path, monkeypatch):
    """A patched FP8Linear whose shape runs torch's block-scaled matmul quantizes x_scale M-major, so the matmul
    gets the quantizer's own buffer (no transposing copy); the result matches the reference. An explicit
    ``_aiter_m_major`` (benchmarks) wins."""
    import op_tests.fake_scaled_mm as fake

    cu = aiter_gemm.current_device_identity(False).cu_num
    _block_table(clean_runtime, tmp_path, f"cpu,{cu},8,128,512,torch,0,0,5.0,scaled_mm_blockwise,1,1,0\n")
    seen = []
    quant = fp8_linear.per_token_group_quant_fp8

    def spy(x, m_major=False):
        q, s = quant(x, m_major)
        seen.append((m_major, s.data_ptr()))
        return q, s

    monkeypatch.setattr(fp8_linear, "per_token_group_quant_fp8", spy)
    mod = fp8_linear.from_fp8_linear(FP8Linear(512, 128, block_size=(128, 128)), "m")
    mod.weight.data = (torch.randn(128, 512) / 4).to(torch.float8_e4m3fn)
    mod.weight_scale_inv.data = torch.rand(1, 4) + 0.5
    x = torch.randn(2, 4, 512, dtype=torch.bfloat16)  # torch's block-scaled matmul writes bf16 only
    with torch.no_grad():
        got = mod(x)
    ((m_major, ptr),) = seen
    assert m_major is True and fake.CALLS[-1][3] == ptr
    xq, xs = per_token_group_quant_fp8_ref(x.reshape(8, 512))
    ref = gemm_a8w8_blockscale_ref(xq, mod.weight, xs, mod.weight_scale_inv, torch.float32).view(2, 4, 128)
    assert rel_err(got.float(), ref) <= TOL["bf16_output"]
    object.__setattr__(mod, "_aiter_m_major", False)
    with torch.no_grad():
        mod(x)
    assert seen[-1][0] is False and fake.CALLS[-1][3] != seen[-1][1]  # row-major: torch's runner copied it


@INTERPRETED
def test_twin_call_entry_matches_module_call_for_every_hook_store(clean_runtime):
    """The twin's call entry (aiter_gemm.call_entry's Python one): with one entry in any hook store torch's nn.Module
    has (enumerated from torch, per module and global) the twin's call and ``nn.Module.__call__`` give the same output
    and run the hook as often; with every store empty it runs forward without ``nn.Module.__call__``."""
    from aiter_gemm import call_entry
    from op_tests.hook_stores import every_store, hook_in

    entry = call_entry.python_call if fp8_linear._c_fp8_call is None else fp8_linear.TunedFP8Mixin.__call__
    assert type(fp8_linear.from_fp8_linear(_fp8(), "m")).__call__ is entry  # C++ first where it is built
    model, _ = tiny_fp8_model()
    patch_linear(model)
    mod = model.get_submodule("model.layers.0.self_attn.q_proj")
    x = torch.randn(3, 256)
    module_call, calls = nn.Module.__call__, []

    def counting(*args, **kwargs):
        calls.append(1)
        return module_call(*args, **kwargs)

    with torch.no_grad():
        ref = mod(x)
        nn.Module.__call__ = counting
        try:
            assert torch.equal(mod(x), ref)
        finally:
            nn.Module.__call__ = module_call
        assert not calls
        for name, holder, attr in every_store(mod):
            results = []
            for call in (mod, lambda xi: module_call(mod, xi)):
                hits = []
                with hook_in(holder, attr, lambda *args, _hits=hits, **kwargs: _hits.append(1)):
                    results.append((call(x), len(hits)))
            (ya, na), (yb, nb) = results
            assert torch.equal(ya, yb) and na == nb, (name, na, nb)


# CUDA-graph replay of a patched FP8 model: test_hf_patch.py::test_cuda_graph_replay_of_a_patched_decode_step[fp8]


# ---- the FP8 loop of hf_decode, on CPU ------------------------------------------------------------------------


@INTERPRETED
def test_hf_decode_fp8_loop_on_cpu(clean_runtime, tmp_path, capsys):
    """An FP8 Qwen3 config runs capture and the three arms (torch's block-scaled matmul through the CPU fake of
    F.scaled_mm, which checks cuBLASLt's layouts), with the bf16 loop's report plus the bf16 arm's columns."""
    import json

    from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl
    from examples import hf_decode
    from op_tests.fake_scaled_mm import fake_scaled_mm

    clean_runtime.setattr(torch.nn.functional, "scaled_mm", fake_scaled_mm, raising=False)
    clean_runtime.setattr(torch_impl, "unavailable_reason", lambda device: None)
    cfg = transformers.Qwen3Config(hidden_size=512, intermediate_size=1024, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=128, num_hidden_layers=1, vocab_size=128,
                                   max_position_embeddings=256, tie_word_embeddings=False).to_dict()
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps({**cfg, "quantization_config": QCFG}))
    out = tmp_path / "out"
    rc = hf_decode.main(["--config", str(tmp_path / "cfg"), "--device", "cpu", "--batch", "2", "--prompt-len", "3",
                         "--new-tokens", "2", "--rounds", "2", "--eager-rounds", "2", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "7 linears FP8 (128x128 blocks; arms torch_blockwise, tuned, bf16)" in text
    cap = json.loads((out / "capture_check.json").read_text())
    assert cap["captured_vs_ran"]["match"] and cap["captured_vs_hf_layout"]["match"]
    assert cap["fp8_file"] == str(out / "a8w8_blockscale_untuned_gemm.csv")
    fp8_rows = {tuple(map(int, line.split(",")))
                for line in (out / "a8w8_blockscale_untuned_gemm.csv").read_text().split()[1:]}
    assert fp8_rows == {(m, n, k) for m in (2, 6) for n, k in ((512, 512), (256, 512), (1024, 512), (512, 1024))}
    res = json.loads((out / "results.json").read_text())
    assert {r["arm"] for r in res["rounds"]} == {"torch_blockwise", "tuned", "bf16"}
    assert len(res["rounds"]) == 2 * 2 * 3, "(prefill, decode) x 2 eager rounds x 3 arms"
    for r in res["summary"]:
        assert (r["arm_without"], r["arm_with"]) == ("torch_blockwise", "tuned")
        assert r["vs_bf16_min"] <= r["vs_bf16"] <= r["vs_bf16_max"] and r["ms_bf16"] > 0
    agree = {(c["arm"], c["phase"]): c["max_abs_diff_over_max_abs"] for c in res["agreement"]}
    # bf16 model: two GEMMs' different bf16 rounding re-quantizes the next layer's activations differently, so even
    # tuned vs torch_blockwise differ by up to an fp8 step
    assert all(0 < agree[(arm, p)] <= TOL["fp8_activations"] for arm in ("tuned", "bf16")
               for p in ("prefill", "decode"))
    table = (out / "results.md").read_text()
    assert "median ms torch_blockwise" in table and "bf16/tuned: median per-round ratio" in table
    assert {d["libtype"] for d in res["decisions"] if d["N"] != 128} == {"triton"}, "CPU: the op's Triton default"


# ---- conversions and pickling (issue 47) -------------------------------------------------------------------------


def test_twin_runs_fp8linears_forward_once_its_weight_is_cast(clean_runtime, caplog):
    """``model.to(torch.bfloat16)`` casts the fp8 weights: the twins ran the block-scale op anyway, which raised a
    TypeError naming no module; now each runs FP8Linear's own forward (its bf16 fallback, as unpatched), warned
    once per module with the reason."""
    ref_model, _ = tiny_fp8_model()
    ref_model.to(torch.bfloat16)
    model, _ = tiny_fp8_model()
    patch_linear(model)
    model.to(torch.bfloat16)
    ids = torch.randint(0, 128, (2, 5))
    ref = logits(ref_model, ids)
    with caplog.at_level(logging.WARNING, logger="aiter_gemm"):
        got = logits(model, ids)
        logits(model, ids)
    assert torch.equal(got, ref)
    msgs = [r.getMessage() for r in caplog.records if "own forward" in r.getMessage()]
    assert sorted(m.split()[1] for m in msgs) == sorted(FP8_NAMES), "one warning per module, naming it"
    assert all("weight is torch.bfloat16" in m for m in msgs)


def test_twin_runs_fp8linears_forward_once_its_scale_is_not_float32(clean_runtime, caplog, monkeypatch):
    mod = fp8_linear.from_fp8_linear(_fp8(), "proj")
    ran = []
    monkeypatch.setattr(FP8Linear, "forward", lambda self, x: ran.append(x.shape) or x.new_zeros(3, 128))
    mod.weight_scale_inv.data = mod.weight_scale_inv.data.double()
    with caplog.at_level(logging.WARNING, logger="aiter_gemm"), torch.no_grad():
        mod(torch.randn(3, 256))
    assert ran == [(3, 256)]
    assert [r.getMessage() for r in caplog.records if "proj runs FP8Linear's own forward" in r.getMessage()
            and "weight_scale_inv is torch.float64" in r.getMessage()]


@INTERPRETED
def test_patched_fp8_model_pickles(clean_runtime):
    """The twin classes are made at run time: torch.save(model) failed (no attribute names the class). Saved and
    loaded, the patched model runs as before, and unpatch_linear still puts the FP8Linear modules back."""
    import copy
    import io
    import pickle

    model, _ = tiny_fp8_model()
    names = patch_linear(model)
    ids = torch.randint(0, 128, (2, 5))
    ref = logits(model, ids)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    twins = {n: m for n, m in loaded.named_modules() if n in FP8_NAMES}
    assert all(type(m) is type(model.get_submodule(n)) for n, m in twins.items())
    assert torch.equal(logits(loaded, ids), ref)
    assert torch.equal(logits(copy.deepcopy(model), ids), ref)
    assert unpatch_linear(loaded) == names
    for n, twin in twins.items():
        back = loaded.get_submodule(n)
        assert type(back) is FP8Linear and back.weight is twin.weight and back.weight_scale_inv is twin.weight_scale_inv
    # pickle itself: torch's own unpickling of fp8 tensors fails (UntypedStorage has no dtype), so a model whose
    # weights were cast (no fp8 tensor left) makes the plain-pickle round trip
    model.to(torch.bfloat16)
    again = pickle.loads(pickle.dumps(model))
    assert type(again.get_submodule(FP8_NAMES[0])) is type(model.get_submodule(FP8_NAMES[0]))
    assert torch.equal(logits(again, ids), logits(model, ids))
    assert unpatch_linear(again) == names
