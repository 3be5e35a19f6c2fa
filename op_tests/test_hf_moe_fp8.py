"""The FP8 MoE model in the Hugging Face loop (issue 52): a tiny Qwen3-MoE built from its config with random weights
quantized as transformers loads an FP8 checkpoint (attention on ``FP8Linear``, experts on ``FP8Experts``, 128x128
blocks: ``examples.hf_fp8.quantize_model``); its arms (tuned: patch_linear + fused_moe; torch_blockwise: torch's
block-scaled matmul, per expert; bf16: the dequantized model) give the dequantized model's logits within FP8 tolerance,
the torch experts are fused_moe's torch loop on that matmul bit for bit, and hf_decode captures the FP8 fused-MoE
rows and measures the four arms."""

from __future__ import annotations

import csv
import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="needs transformers: pip install '.[hf]'")

import aiter_gemm.ops.fused_moe as fmoe_op  # noqa: E402
from aiter_gemm.backends.base import QUANT_BLOCK  # noqa: E402
from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl  # noqa: E402
from aiter_gemm.kernels import fused_moe_torch  # noqa: E402
from aiter_gemm.kernels.a8w8_blockscale import dequantize_weight_blockscale, gemm_a8w8_blockscale_ref  # noqa: E402
from aiter_gemm.kernels.blockscale_format import FP8  # noqa: E402
from examples import hf_fp8  # noqa: E402

QCFG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
# Attention K = hidden = heads x head_dim = 512 (the torch arm's dense rule: K a multiple of 512); the experts' down
# projection has K = I = 128, one K block, which torch's matmul takes with its scales padded to 4 blocks.
LAYERS, HIDDEN, MOE_INTER, EXPERTS, TOPK, VOCAB = 2, 512, 128, 4, 2, 128
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
EXPERT_NAMES = [f"model.layers.{i}.mlp.experts" for i in range(LAYERS)]
# logits against the dequantized model (F.linear on the dequantized weights, activations unquantized): e4m3 keeps 3
# mantissa bits, so each activation is off by up to 1/16 relative, through two layers (test_fp8_linear's bound)
FP8_TOL = 0.08
INTERPRETED = pytest.mark.interpreted


def tiny_config(layers: int = LAYERS) -> transformers.Qwen3MoeConfig:
    return transformers.Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=384, moe_intermediate_size=MOE_INTER,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=1, head_dim=128, num_experts=EXPERTS,
        num_experts_per_tok=TOPK, max_position_embeddings=128, tie_word_embeddings=False)


def tiny_fp8_moe(device: str = "cpu") -> tuple[torch.nn.Module, list]:
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(tiny_config()).eval().to(device=device, dtype=torch.bfloat16)
    return model, hf_fp8.quantize_model(model, QCFG)


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, use_cache=False).logits.float()


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got - ref).abs().max() / ref.abs().max()).item()


@pytest.fixture
def torch_blockwise(clean_runtime):
    """torch's block-scaled matmul on CPU: the fake F.scaled_mm (it checks the layouts torch asks for); the calls."""
    from op_tests import fake_scaled_mm

    clean_runtime.setattr(torch.nn.functional, "scaled_mm", fake_scaled_mm.fake_scaled_mm, raising=False)
    clean_runtime.setattr(torch_impl, "unavailable_reason", lambda device: None)
    fake_scaled_mm.CALLS.clear()
    return fake_scaled_mm.CALLS


@pytest.fixture
def reference_experts_gemm(clean_runtime):
    """The tuned arm's experts on CPU run fused_moe's default, the torch loop; its per-expert GEMMs on the float32
    reference, not the block-scale op (which the Triton interpreter runs slowly and capture would record: on a GPU
    the default is the fused Triton kernels, which call no other op)."""
    from aiter_gemm.backends.fused_moe import torch as torch_backend

    clean_runtime.setattr(torch_backend, "_fp8_gemm", lambda device: gemm_a8w8_blockscale_ref)


def test_quantize_model_builds_transformers_fp8_experts():
    """Attention linears become FP8Linear, each experts module transformers' FP8Experts (dispatched through its FP8
    experts interface) with per-expert (128, 128) float32 block scales; the bf16 twins hold the dequantized weights;
    the router and lm_head stay bf16."""
    from transformers.integrations import finegrained_fp8

    model, swapped = tiny_fp8_moe()
    names = [n for n, _, _ in swapped]
    assert names == [f"model.layers.{i}.self_attn.{p}" for i in range(LAYERS) for p in ATTN] + EXPERT_NAMES
    for name in EXPERT_NAMES:
        fp8 = model.get_submodule(name)
        assert type(fp8) is finegrained_fp8.FP8Experts and fp8.block_size == (128, 128) and fp8.has_gate
        assert hasattr(type(fp8).forward, "__wrapped__"), "dispatched through the FP8 experts interface"
        twin = dict((n, b) for n, _, b in swapped)[name]
        for pname, shape in (("gate_up_proj", (EXPERTS, 2 * MOE_INTER, HIDDEN)),
                             ("down_proj", (EXPERTS, HIDDEN, MOE_INTER))):
            w, s = getattr(fp8, pname), getattr(fp8, pname + "_scale_inv")
            assert w.shape == shape and w.dtype == FP8 and s.dtype == torch.float32
            assert s.shape == (EXPERTS, shape[1] // 128, shape[2] // 128)
            for e in range(EXPERTS):
                deq = dequantize_weight_blockscale(w[e], s[e]).to(torch.bfloat16)
                assert torch.equal(getattr(twin, pname)[e], deq), (name, pname, e)
    assert model.model.layers[0].mlp.gate.weight.dtype == torch.bfloat16
    assert type(model.lm_head) is torch.nn.Linear


def test_torch_experts_are_the_torch_loop_on_torch_blockwise_bit_for_bit(torch_blockwise):
    """The torch_blockwise arm's experts: fused_moe's torch loop, every per-expert GEMM torch's block-scaled matmul
    (down_proj's one K block with its scales padded to 4, as torch takes them), bf16 out: bit for bit the loop on the
    reference GEMM writing bf16, and within an fp8 step of the op's float32 reference."""
    from aiter_gemm.kernels.fused_moe import fused_moe_ref

    model, _ = tiny_fp8_moe()
    experts = model.get_submodule(EXPERT_NAMES[0])
    hf_fp8.register_torch_experts()
    experts.config._experts_implementation = hf_fp8.TORCH_EXPERTS
    x = torch.randn(6, HIDDEN, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(3))
    weights, top = fmoe_op.routing(6, EXPERTS, TOPK, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got = experts(x, top, weights)
    assert {(n, k) for _, n, k, _ in torch_blockwise} == {(2 * MOE_INTER, HIDDEN), (HIDDEN, MOE_INTER)}

    def bf16_ref_gemm(XQ, WQ, x_scale, w_scale, dtype):  # torch's matmul writes bf16: the first GEMM's out widened
        return gemm_a8w8_blockscale_ref(XQ, WQ, x_scale, w_scale, torch.bfloat16).to(dtype)

    p = fmoe_op.problem_of(x, experts.gate_up_proj, experts.down_proj, weights, top, experts.gate_up_proj_scale_inv,
                           experts.down_proj_scale_inv)
    loop = fused_moe_torch.launcher(p, fused_moe_torch.LOOP, bf16_ref_gemm)
    want = loop(x, experts.gate_up_proj, experts.down_proj, weights, top, experts.gate_up_proj_scale_inv,
                experts.down_proj_scale_inv)
    assert torch.equal(got, want)
    ref = fused_moe_ref(x, experts.gate_up_proj, experts.down_proj, weights, top,
                        w1_scale=experts.gate_up_proj_scale_inv, w2_scale=experts.down_proj_scale_inv).float()
    # the first GEMM's output rounded to bf16 before the activation: the intermediate's fp8 quantization can land
    # one e4m3 step (up to 1/16 relative) away from the reference's on some elements
    assert rel_err(got.float(), ref) < 2 ** -4


@INTERPRETED
def test_arms_give_the_dequantized_models_logits(torch_blockwise, reference_experts_gemm, monkeypatch):
    """Each arm of the tiny FP8 Qwen3-MoE: tuned (FP8Linear twins on the block-scale op, experts on fused_moe),
    torch_blockwise (torch's matmul, per-expert torch loop) and control (the same) against bf16 (the dequantized
    model, grouped_mm experts): within FP8 tolerance; control and torch_blockwise bit for bit; switching back and
    forth changes nothing."""
    model, swapped = tiny_fp8_moe()
    state = hf_fp8.ArmState(model, swapped, None, None)
    assert state.experts == EXPERT_NAMES and state.fp8_suffixes == frozenset(ATTN)
    assert state.experts_implementations == {"tuned": "aiter_gemm", "torch_blockwise": hf_fp8.TORCH_EXPERTS,
                                             "bf16": "grouped_mm"}
    ids = torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(1))
    op_calls: list[int] = []
    real = fmoe_op.fused_moe
    monkeypatch.setattr(fmoe_op, "fused_moe", lambda x, *a, **kw: op_calls.append(x.shape[0]) or real(x, *a, **kw))
    out = {}
    for arm in ("bf16", "torch_blockwise", "tuned", "control", "bf16"):
        state.set_arm(arm)
        experts = model.get_submodule(EXPERT_NAMES[0])
        assert type(experts).__name__ == ("Qwen3MoeExperts" if arm == "bf16" else "FP8Experts"), arm
        calls, op_calls[:] = len(torch_blockwise), []
        got = logits(model, ids)
        assert (len(torch_blockwise) > calls) == (arm in ("torch_blockwise", "control")), arm
        assert op_calls == ([4] * LAYERS if arm == "tuned" else []), arm
        if arm in out:
            assert torch.equal(got, out[arm]), f"{arm} again after the other arms"
        out[arm] = got
    ref = out["bf16"]
    for arm in ("torch_blockwise", "tuned"):
        assert 0 < rel_err(out[arm], ref) < FP8_TOL, arm
    assert torch.equal(out["control"], out["torch_blockwise"])
    assert rel_err(out["tuned"], out["torch_blockwise"]) < FP8_TOL


@INTERPRETED
def test_hf_decode_fp8_moe_loop_on_cpu(torch_blockwise, reference_experts_gemm, tmp_path, capsys):
    """hf_decode on an FP8 Qwen3-MoE config: capture writes the attention's block-scale GEMMs and every experts call
    as AITER's untuned fmoe row with FP8 weights (q_dtype_w float8_e4m3fn, per_1x128), each matching what the model
    ran and what tune_moe --model_dir derives; measure times torch_blockwise, tuned, bf16 and the control."""
    from aiter_gemm.ops.fused_moe import FMOE_UNTUNED_COLUMNS
    from examples import hf_decode

    cfg_dir = tmp_path / "tiny_fp8_moe"
    cfg_dir.mkdir()
    cfg = {**tiny_config(1).to_dict(), "quantization_config": QCFG}
    cfg.pop("experts_implementation", None)
    (cfg_dir / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    tuned_fmoe = tmp_path / "tuned_fmoe.csv"
    tuned_fmoe.write_text("")
    common = ["--config", str(cfg_dir), "--device", "cpu", "--batch", "2", "--prompt-len", "2", "--out", str(out)]
    assert hf_decode.main([*common, "--mode", "capture", "--new-tokens", "2"]) == 0, capsys.readouterr().out
    text = capsys.readouterr().out
    assert "4 linears and 1 experts modules FP8 (128x128 blocks; arms torch_blockwise, tuned, bf16)" in text
    cap = json.loads((out / "capture_check.json").read_text())
    assert cap["captured_vs_ran"]["match"] and cap["captured_vs_hf_layout"]["match"]
    assert cap["moe"]["captured_vs_ran"]["match"] and cap["moe"]["captured_vs_gradlib_moe"]["match"]
    with open(out / "untuned_fmoe.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == FMOE_UNTUNED_COLUMNS
    assert sorted(int(r["token"]) for r in rows) == [2, 4], "decode (batch) and prefill (batch x 2) tokens"
    assert {(r["model_dim"], r["inter_dim"], r["expert"], r["topk"], r["dtype"], r["q_dtype_a"], r["q_dtype_w"],
             r["q_type"]) for r in rows} == {(str(HIDDEN), str(MOE_INTER), str(EXPERTS), str(TOPK), "torch.bfloat16",
                                              str(FP8), str(FP8), QUANT_BLOCK)}
    fp8_rows = {tuple(map(int, line.split(",")))
                for line in (out / "a8w8_blockscale_untuned_gemm.csv").read_text().split()[1:]}
    assert fp8_rows == {(m, n, k) for m in (2, 4) for n, k in ((512, 512), (128, 512))}, "q/o, k/v"

    rc = hf_decode.main([*common, "--mode", "measure", "--rounds", "2", "--eager-rounds", "2", "--control",
                         "--tuned-fmoe", str(tuned_fmoe)])
    text = capsys.readouterr().out
    assert rc == 0, text
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["experts_implementation"] == {"tuned": "aiter_gemm", "torch_blockwise": hf_fp8.TORCH_EXPERTS,
                                                     "bf16": "grouped_mm"}
    assert {r["arm"] for r in res["rounds"]} == {"torch_blockwise", "tuned", "bf16", "control"}
    assert len(res["rounds"]) == 2 * 2 * 4, "(prefill, decode) x 2 eager rounds x 4 arms"
    for r in res["summary"]:
        assert (r["arm_without"], r["arm_with"]) == ("torch_blockwise", "tuned") and r["ms_bf16"] > 0
    assert all(c["max_abs_diff_over_max_abs"] < FP8_TOL for c in res["agreement"])


@pytest.mark.gpu
def test_gpu_fp8_moe_arms_agree_eager_and_in_a_cuda_graph():
    """On a GPU (sm_90: torch's block-scaled matmul): the tuned arm (fused_moe's Triton kernels) and the
    torch_blockwise arm (its padded-scale down projection included) give the dequantized model's logits within FP8
    tolerance; a CUDA graph of the torch_blockwise arm (every expert over every token) replays its eager logits."""
    if not torch.cuda.is_available() or torch_impl.unavailable_reason(torch.device("cuda")) is not None:
        pytest.skip("needs a GPU with torch's block-scaled matmul (sm_90, torch >= 2.10)")
    model, swapped = tiny_fp8_moe("cuda")
    state = hf_fp8.ArmState(model, swapped, None, None)
    ids = torch.randint(0, VOCAB, (2, 5), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    out = {}
    for arm in ("bf16", "tuned", "torch_blockwise"):
        state.set_arm(arm)
        out[arm] = logits(model, ids)
    for arm in ("tuned", "torch_blockwise"):
        assert rel_err(out[arm], out["bf16"]) < FP8_TOL, arm
    from examples.hf_model import capture_graph

    with torch.no_grad():
        graph, static = capture_graph(lambda: model(ids, use_cache=False).logits)
        graph.replay()
    torch.cuda.synchronize()
    assert rel_err(static.float(), out["torch_blockwise"]) < 2 ** -6  # a sum over all experts, weights 0 off-route
