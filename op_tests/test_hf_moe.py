"""transformers' MoE experts on ``fused_moe`` (aiter_gemm.hf_moe): a tiny random Qwen3-MoE gives transformers' own
eager experts' logits on the op, ``patch_moe`` names what it switched, layouts the op cannot take fall back with one
warning, and the patched model compiles."""

from __future__ import annotations

import logging

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="needs transformers: pip install '.[hf]'")

import aiter_gemm.ops.fused_moe as fmoe_op  # noqa: E402
from aiter_gemm import hf_moe  # noqa: E402
from aiter_gemm.accuracy import TOLERANCES  # noqa: E402
from aiter_gemm.nn import patch_moe  # noqa: E402

LAYERS, HIDDEN, MOE_INTER, EXPERTS, TOPK, VOCAB = 2, 64, 32, 8, 2, 64
EXPERT_NAMES = [f"model.layers.{i}.mlp.experts" for i in range(LAYERS)]


def tiny_moe(dtype: torch.dtype = torch.bfloat16, **kw) -> torch.nn.Module:
    kw.setdefault("experts_implementation", "eager")
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, moe_intermediate_size=MOE_INTER,
        num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=EXPERTS,
        num_experts_per_tok=TOPK, max_position_embeddings=128, **kw)
    torch.manual_seed(0)
    return transformers.Qwen3MoeForCausalLM(cfg).eval().to(dtype)


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, use_cache=False).logits.float()


@pytest.fixture
def op_calls(monkeypatch):
    """The (T, H) of every fused_moe call the experts make (the op still runs)."""
    calls: list[tuple[int, ...]] = []
    real = fmoe_op.fused_moe

    def counting(hidden_states, *args, **kw):
        calls.append(tuple(hidden_states.shape))
        return real(hidden_states, *args, **kw)

    monkeypatch.setattr(fmoe_op, "fused_moe", counting)
    return calls


@pytest.fixture(autouse=True)
def fresh_warnings():
    """Each test sees hf_moe's once-per-cause warnings afresh."""
    hf_moe._warn.clear()
    yield
    hf_moe._warn.clear()


@pytest.fixture
def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))


def assert_close_logits(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOLERANCES[dtype]  # relative to the logits' scale: a tiny random model's logits are well below 1
    torch.testing.assert_close(got, ref, rtol=tol.rtol, atol=tol.atol * float(ref.abs().max()))


@pytest.mark.parametrize("route", ["set_experts_implementation", "patch_moe", "config"])
def test_logits_match_transformers_eager_experts(route, ids, op_calls):
    ref = logits(tiny_moe(), ids)
    if route == "config":
        model = tiny_moe(experts_implementation=hf_moe.IMPLEMENTATION)
    else:
        model = tiny_moe()
        if route == "patch_moe":
            assert patch_moe(model) == EXPERT_NAMES
        else:
            model.set_experts_implementation(hf_moe.IMPLEMENTATION)
    assert model.config._experts_implementation == hf_moe.IMPLEMENTATION
    got = logits(model, ids)
    assert op_calls == [(ids.numel(), HIDDEN)] * LAYERS, "every layer's experts ran on fused_moe, all tokens at once"
    assert_close_logits(got, ref, torch.bfloat16)


def test_patch_moe_names_and_fallback_recorded():
    model = tiny_moe(experts_implementation="grouped_mm")
    assert patch_moe(model) == EXPERT_NAMES
    for name in EXPERT_NAMES:
        experts = model.get_submodule(name)
        assert experts.__dict__[hf_moe._FALLBACK] == "grouped_mm"
        assert hf_moe._fallback(experts) is transformers.integrations.moe.grouped_mm_experts_forward
    assert patch_moe(model) == EXPERT_NAMES, "patching again keeps the recorded fallback"
    assert model.get_submodule(EXPERT_NAMES[0]).__dict__[hf_moe._FALLBACK] == "grouped_mm"
    dense = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=1, vocab_size=32))
    assert patch_moe(dense) == [], "a model without experts modules: nothing switched"


@pytest.mark.parametrize("case", ["activation", "float32"])
def test_layout_the_op_cannot_take_falls_back_once(case, ids, op_calls, caplog):
    kw = {"hidden_act": "gelu_pytorch_tanh"} if case == "activation" else {}
    dtype = torch.float32 if case == "float32" else torch.bfloat16
    ref = logits(tiny_moe(dtype, **kw), ids)
    model = tiny_moe(dtype, **kw)
    with caplog.at_level(logging.WARNING, logger="aiter_gemm"):
        assert patch_moe(model) == [], "nothing the op can take"
        model.set_experts_implementation(hf_moe.IMPLEMENTATION)  # forced: every call falls back
        got = logits(model, ids)
        got2 = logits(model, ids)
    assert op_calls == []
    assert torch.equal(got, ref) and torch.equal(got2, ref), "the fallback is the model's own eager experts"
    warned = [r.getMessage() for r in caplog.records if "fused_moe" in r.getMessage()]
    assert len(warned) == 1, warned
    assert ("activation" in warned[0]) if case == "activation" else ("float32" in warned[0])


def test_unsupported_reasons_name_the_cause():
    experts = tiny_moe().get_submodule(EXPERT_NAMES[0])
    assert hf_moe.unsupported_reason(experts) is None
    for attr, value, word in (("has_bias", True, "biases"), ("is_transposed", True, "transposed"),
                              ("has_gate", False, "no gate"), ("is_concatenated", False, "interleaved"),
                              ("_is_expert_parallel", True, "expert parallel")):
        old = getattr(experts, attr)
        setattr(experts, attr, value)
        assert word in hf_moe.unsupported_reason(experts), attr
        setattr(experts, attr, old)
    x = torch.randn(3, HIDDEN, dtype=torch.float16)
    assert "float16" in hf_moe.unsupported_reason(experts, x)


def test_fp8_experts_block_scales_on_the_op(op_calls):
    """transformers' FP8Experts (128x128 float32 block scales, dynamic activations): the op runs it, matching the
    op's float32 reference on the same quantized weights."""
    fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
    from aiter_gemm.kernels.a8w8_blockscale import quantize_weight_blockscale
    from aiter_gemm.kernels.fused_moe import fused_moe_ref

    H, inter, E = 256, 128, 4
    cfg = transformers.Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=inter, num_experts=E,
                                      experts_implementation=hf_moe.IMPLEMENTATION)
    cls = transformers.integrations.moe.use_experts_implementation(
        fp8.FP8Experts, experts_interface=fp8.ALL_FP8_EXPERTS_FUNCTIONS)
    experts = cls(cfg, block_size=(128, 128))
    torch.manual_seed(0)
    for name, shape in (("gate_up_proj", (E, 2 * inter, H)), ("down_proj", (E, H, inter))):
        q = [quantize_weight_blockscale(w) for w in torch.randn(shape).mul_(shape[2] ** -0.5)]
        getattr(experts, name).data = torch.stack([w for w, _ in q])
        getattr(experts, name + "_scale_inv").data = torch.stack([s for _, s in q])
    assert hf_moe.unsupported_reason(experts) is None
    x = torch.randn(5, H, dtype=torch.bfloat16)
    weights, top = fmoe_op.routing(5, E, 2, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = experts(x, top, weights)
    assert op_calls == [(5, H)]
    with torch.no_grad():
        ref = fused_moe_ref(x, experts.gate_up_proj, experts.down_proj, weights, top,
                            w1_scale=experts.gate_up_proj_scale_inv, w2_scale=experts.down_proj_scale_inv).float()
    tol = TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(out.float(), ref, rtol=tol.rtol, atol=tol.atol * float(ref.abs().max()))
    experts.block_size = (1, 128)
    assert "block_size" in hf_moe.unsupported_reason(experts)


def test_compiled_patched_model(ids, op_calls):
    """torch.compile(fullgraph=False) of the patched model (aot_eager: the fake kernel and the traced graph; inductor's
    C++ build is too slow for this machine's CPU budget): the experts trace the aiter_gemm::fused_moe custom op."""
    ref = logits(tiny_moe(), ids)
    model = tiny_moe()
    assert patch_moe(model) == EXPERT_NAMES
    traced: list[str] = []
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def recording(gm, example_inputs):
        traced.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return aot_eager(gm, example_inputs)

    torch._dynamo.reset()
    got = logits(torch.compile(model, backend=recording, fullgraph=False), ids)
    torch._dynamo.reset()
    assert sum("aiter_gemm.fused_moe" in t for t in traced) == LAYERS, "each layer's experts: one custom-op node"
    assert len(op_calls) == LAYERS, "the custom op ran the op once per layer"
    assert_close_logits(got, ref, torch.bfloat16)


@pytest.mark.gpu
def test_gpu_patched_model_under_a_cuda_graph_matches_eager(ids):
    """On a GPU the patched model's experts run the op's Triton kernels; a CUDA graph of the whole forward (no host
    sync in the experts' path: the expert-id check is skipped in capture) replays the eager logits, and both match
    transformers' own eager experts."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ref = logits(tiny_moe().cuda(), ids.cuda())
    model = tiny_moe().cuda()
    assert patch_moe(model) == EXPERT_NAMES
    static = ids.cuda()
    eager = logits(model, static)
    assert_close_logits(eager, ref, torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(2):  # warm up on the side stream (decisions made, kernels compiled) before capture
            model(static, use_cache=False)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = model(static, use_cache=False).logits
    graph.replay()
    torch.cuda.synchronize()
    assert_close_logits(out.float(), eager, torch.bfloat16)  # split-K's float32 atomics may reorder sums


# ---- examples.hf_decode's loop on an MoE model, on CPU --------------------------------------------------------------


def test_hf_decode_loop_on_a_tiny_moe(clean_runtime, tmp_path, capsys):
    """Capture writes the attention / lm_head GEMMs to the GEMM CSV and every experts call to AITER's untuned_fmoe.csv
    (its columns), each matching what the model ran; measure times the tuned arm (patch_linear + patch_moe) against
    transformers' grouped_mm experts and the A/A control, with --tuned-fmoe in front of AITER_CONFIG_FMOE."""
    import csv
    import json

    from aiter_gemm.ops.fused_moe import FMOE_UNTUNED_COLUMNS
    from examples import hf_decode

    cfg_dir = tmp_path / "tiny_moe"
    cfg_dir.mkdir()
    tiny_moe().config.to_json_file(str(cfg_dir / "config.json"))
    cfg = json.loads((cfg_dir / "config.json").read_text())
    cfg.pop("experts_implementation", None)  # transformers' default (grouped_mm) for the unpatched arm
    (cfg_dir / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    tuned_fmoe = tmp_path / "tuned_fmoe.csv"
    tuned_fmoe.write_text("")
    common = ["--config", str(cfg_dir), "--device", "cpu", "--batch", "1,3", "--prompt-len", "5", "--out", str(out)]
    assert hf_decode.main([*common, "--mode", "capture", "--new-tokens", "3"]) == 0, capsys.readouterr().out
    cap = json.loads((out / "capture_check.json").read_text())
    assert cap["captured_vs_ran"]["match"] and cap["captured_vs_hf_layout"]["match"]
    moe = cap["moe"]
    assert moe["modules_patched"] == LAYERS and moe["captured_vs_ran"]["match"]
    assert moe["captured_vs_gradlib_moe"]["match"], "the shapes tune_moe --model_dir derives are those the model ran"
    with open(out / "untuned_fmoe.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == FMOE_UNTUNED_COLUMNS
    assert sorted(int(r["token"]) for r in rows) == [1, 3, 5, 15], "decode (batch) and prefill (batch x 5) tokens"
    assert {(r["model_dim"], r["inter_dim"], r["expert"], r["topk"]) for r in rows} == {
        (str(HIDDEN), str(MOE_INTER), str(EXPERTS), str(TOPK))}
    with open(out / "captured_gemm.csv", newline="") as f:
        assert {"M", "N", "K", "bias", "dtype"} <= set(next(csv.DictReader(f)))

    rc = hf_decode.main([*common, "--mode", "measure", "--decode-steps", "2", "--prefill-steps", "1", "--rounds", "2",
                         "--eager-rounds", "2", "--control", "--tuned-fmoe", str(tuned_fmoe)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert f"AITER_CONFIG_FMOE={tuned_fmoe}:" in text, "--tuned-fmoe goes in front of the configured table"
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["experts_implementation"] == "grouped_mm"
    assert {(r["batch"], r["mode"], r["phase"]) for r in res["summary"]} == {
        (b, "eager", p) for b in (1, 3) for p in ("prefill", "decode")}
    assert {r["arm"] for r in res["rounds"]} == {"without", "with", "control"} and len(res["rounds"]) == 4 * 2 * 3
    assert all(c["max_abs_diff_over_max_abs"] < TOLERANCES[torch.bfloat16].atol for c in res["agreement"])


def test_patch_state_switches_the_experts_implementation(clean_runtime):
    """hf_decode's arms: "with" runs the experts on fused_moe, "without" on the model's own implementation again."""
    from examples.hf_model import PatchState

    model = tiny_moe(experts_implementation="grouped_mm")
    state = PatchState(model, None, None)
    for _ in range(2):
        state.set_arm("with")
        assert state.experts == EXPERT_NAMES and model.config._experts_implementation == hf_moe.IMPLEMENTATION
        state.set_arm("without")
        assert model.config._experts_implementation == "grouped_mm"
