"""``aiter_gemm.nn.patch_linear`` on a real Hugging Face model (a tiny random Llama): what is swapped, that weights are
shared, that logits, gradients, capture, ``torch.compile`` and fallbacks behave, and the ``hf_decode`` example on CPU.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

transformers = pytest.importorskip("transformers", reason="needs transformers: pip install '.[hf]'")

import aiter_gemm  # noqa: E402
import aiter_gemm.nn as agnn  # noqa: E402
from aiter_gemm.nn import TunedLinear, patch_linear, unpatch_linear  # noqa: E402
from op_tests.runtime_helpers import BF16_HEADER, bf16_row  # noqa: E402

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB, LAYERS = 64, 160, 4, 2, 16, 100, 2
PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj")
ALL_NAMES = [f"model.layers.{i}.{p}" for i in range(LAYERS) for p in PROJ] + ["lm_head"]
# (N, K) per projection of the tiny model, written out by hand (q: 4 heads x 16, k/v: 2 x 16); vocab 100 unpadded.
SHAPES = {"q_proj": (64, 64), "k_proj": (32, 64), "v_proj": (32, 64), "o_proj": (64, 64), "gate_proj": (160, 64),
          "up_proj": (160, 64), "down_proj": (64, 160), "lm_head": (100, 64)}
TOKENS = (1, 3, 17)
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # relative to the largest |logit|


def tiny_config(bias: bool = False, **kw) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        hidden_size=HIDDEN, intermediate_size=INTER, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM, num_hidden_layers=LAYERS, vocab_size=VOCAB, max_position_embeddings=256,
        attention_bias=bias, mlp_bias=bias, tie_word_embeddings=False, **kw)


def tiny_model(dtype: torch.dtype = torch.float32, bias: bool = False, device: str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(tiny_config(bias)).eval().to(device=device, dtype=dtype)
    if bias:  # HF initializes biases to zero, which would not test them
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, nn.Linear) and m.bias is not None:
                    m.bias.normal_(0, 0.5)
    return model


def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, use_cache=False).logits.float()


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got - ref).abs().max() / ref.abs().max()).item()


@pytest.fixture
def spy(monkeypatch):
    """Counts the (M, N, K) of every call TunedLinear makes through the tuned dispatch (gemm_a16w16, or the dispatch
    entry it keeps per input shape), and still runs it."""
    calls: list[tuple[int, int, int]] = []
    real, real_entry = agnn.gemm_a16w16, agnn._run_linear_entry

    def counting(a, b, bias=None, *args, **kw):
        calls.append((a.numel() // a.shape[-1], b.shape[0], b.shape[1]))
        return real(a, b, bias, *args, **kw)

    def counting_entry(entry, a, b, bias):
        calls.append((a.numel() // a.shape[-1], b.shape[0], b.shape[1]))
        return real_entry(entry, a, b, bias)

    monkeypatch.setattr(agnn, "gemm_a16w16", counting)
    monkeypatch.setattr(agnn, "_run_linear_entry", counting_entry)
    for name in ("_c_linear", "_c_call"):  # the C++ eager entries (aiter_gemm/eager_ext.py): counted when they ran
        real_c = getattr(agnn, name)
        if real_c is None:
            continue

        def counting_c(module, a, real_c=real_c):
            out = real_c(module, a)
            if out is not None:
                w = module._parameters["weight"]
                calls.append((a.numel() // a.shape[-1], w.shape[0], w.shape[1]))
            return out

        monkeypatch.setattr(agnn, name, counting_c)
    return calls


# ---- swapping ---------------------------------------------------------------------------------------------------


def test_patch_swaps_exactly_the_linears_sharing_parameters():
    model = tiny_model()
    before = {n: m for n, m in model.named_modules()}
    params = {n: p for n, p in model.named_parameters()}
    keys = list(model.state_dict())
    names = patch_linear(model)
    assert names == ALL_NAMES
    for n in names:
        new, old = model.get_submodule(n), before[n]
        assert type(new) is TunedLinear and isinstance(new, nn.Linear) and new is not old
        assert new.weight is old.weight and new.weight.data_ptr() == old.weight.data_ptr()
        assert new.bias is None and (new.in_features, new.out_features) == (old.in_features, old.out_features)
    assert {n: p for n, p in model.named_parameters()} == params, "the very same Parameter objects, nothing copied"
    sd = model.state_dict()
    assert list(sd) == keys
    assert all(sd[k].data_ptr() == params[k].data_ptr() for k in keys)
    assert sum(isinstance(m, TunedLinear) for m in model.modules()) == len(ALL_NAMES)
    assert patch_linear(model) == [], "already patched modules are not swapped again"

    assert unpatch_linear(model) == ALL_NAMES
    after = {n: m for n, m in model.named_modules()}
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)
    assert not any(isinstance(m, TunedLinear) for m in model.modules())


def test_include_exclude_and_shared_modules():
    model = tiny_model()
    assert patch_linear(model, exclude="lm_head") == ALL_NAMES[:-1]
    assert type(model.lm_head) is nn.Linear
    unpatch_linear(model)
    assert patch_linear(model, include=["*.mlp.*"]) == [n for n in ALL_NAMES if ".mlp." in n]
    unpatch_linear(model)
    # a bare module name matches it at any depth; exclude wins over include
    assert patch_linear(model, include=["q_proj", "k_proj"], exclude=["layers.1.*"]) == [
        "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj"]
    unpatch_linear(model)
    assert patch_linear(model, include=lambda name, m: m.out_features == KV_HEADS * HEAD_DIM) == [
        n for n in ALL_NAMES if n.endswith(("k_proj", "v_proj"))]
    unpatch_linear(model)
    with pytest.raises(TypeError, match="glob pattern"):
        patch_linear(model, include=[3])

    shared = nn.Linear(8, 8)
    net = nn.Sequential(shared, nn.ReLU(), shared)
    assert patch_linear(net) == ["0", "2"]
    assert net[0] is net[2] and type(net[0]) is TunedLinear, "a module used twice stays one module"
    assert unpatch_linear(net) == ["0", "2"] and net[0] is shared and net[2] is shared
    with pytest.raises(ValueError, match="root module"):
        patch_linear(shared)


def test_subclasses_are_left_alone():
    class QuantLinear(nn.Linear):  # stands for bitsandbytes' Linear4bit / Linear8bitLt and friends
        pass

    net = nn.Sequential(QuantLinear(8, 8), nn.Linear(8, 8))
    assert patch_linear(net) == ["1"]
    assert type(net[0]) is QuantLinear


def test_unpatch_keeps_reassigned_parameters():
    model = tiny_model()
    original = model.lm_head
    patch_linear(model)
    new_w = nn.Parameter(torch.randn_like(original.weight))
    model.lm_head.weight = new_w
    unpatch_linear(model)
    assert model.lm_head is original and original.weight is new_w


def test_state_dict_round_trip():
    plain, patched = tiny_model(), tiny_model()
    patch_linear(patched)
    with torch.no_grad():
        for p in plain.parameters():
            p.add_(1.0)
    patched.load_state_dict(plain.state_dict())  # strict: same keys
    ids = torch.randint(0, VOCAB, (2, 5))
    assert torch.equal(logits(plain, ids), logits(patched, ids))
    plain.load_state_dict(patched.state_dict())


# ---- numerics ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_patched_logits_match(clean_runtime, spy, device, tokens, dtype):
    model = tiny_model(dtype, device=device)
    ids = torch.randint(0, VOCAB, (2, tokens), device=device)
    ref = logits(model, ids)
    patch_linear(model)
    got = logits(model, ids)
    assert len(spy) == len(ALL_NAMES), "every linear went through gemm_a16w16"
    assert sorted(spy) == sorted((2 * tokens, *SHAPES[n.rsplit(".", 1)[-1]]) for n in ALL_NAMES)
    assert got.dtype == ref.dtype and got.shape == (2, tokens, VOCAB)
    assert rel_err(got, ref) <= TOL[dtype]


@pytest.mark.parametrize("tokens", TOKENS)
def test_logits_through_triton_rows(clean_runtime, tmp_path, device, tokens):
    """Tuned rows send every GEMM (with bias) to the Triton kernel (interpreted on CPU): real kernel numerics."""
    model = tiny_model(torch.bfloat16, bias=True, device=device)
    ids = torch.randint(0, VOCAB, (1, tokens), device=device)
    ref = logits(model, ids)
    rows = "".join(bf16_row(tokens, n, k, "triton", bias=name != "lm_head", dtype="torch.bfloat16",
                            kernel="BM16_BN32_BK32_GM1_SK1_W4_S1") for name, (n, k) in SHAPES.items())
    (tmp_path / "tuned.csv").write_text(BF16_HEADER + rows)
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(tmp_path / "tuned.csv"))
    aiter_gemm.reload_configs()
    for name, (n, k) in SHAPES.items():
        cfg = aiter_gemm.get_GEMM_A16W16_config(tokens, n, k, name != "lm_head", torch.bfloat16)
        assert (cfg["libtype"], cfg["matched"]) == ("triton", "exact"), name
    patch_linear(model)
    got = logits(model, ids)
    assert rel_err(got, ref) <= TOL[torch.bfloat16]
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("backend", ["default", "triton"])
def test_3d_and_noncontiguous_inputs(clean_runtime, tmp_path, spy, device, tokens, backend):
    """(..., K) inputs of any strides; ``triton``: tuned rows send them to the (interpreted) Triton kernel."""
    torch.manual_seed(1)
    dtype = torch.float32 if backend == "default" else torch.bfloat16
    lin = nn.Linear(48, 40).to(device=device, dtype=dtype)
    if backend == "triton":
        rows = "".join(bf16_row(m, 40, 48, "triton", bias=True, dtype="torch.bfloat16",
                                kernel="BM16_BN32_BK32_GM1_SK1_W4_S1") for m in sorted({1, 3, 3 * tokens}))
        (tmp_path / "tuned.csv").write_text(BF16_HEADER + rows)
        clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(tmp_path / "tuned.csv"))
        aiter_gemm.reload_configs()
        assert aiter_gemm.get_GEMM_A16W16_config(3 * tokens, 40, 48, True, dtype)["libtype"] == "triton"
    tl = TunedLinear.from_linear(lin)
    base = torch.randn(tokens, 3, 96, dtype=dtype, device=device)
    inputs = {"3-D": torch.randn(3, tokens, 48, dtype=dtype, device=device),
              "transposed": base[..., :48].transpose(0, 1), "strided": base[..., ::2],
              "last token of each sequence": base[:, :, :48].transpose(0, 1)[:, -1:, :],
              "1-D": torch.randn(48, dtype=dtype, device=device)}
    tol = {} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}
    with torch.no_grad():
        for what, x in inputs.items():
            got = tl(x)
            assert got.shape == F.linear(x, lin.weight, lin.bias).shape, what
            torch.testing.assert_close(got, F.linear(x, lin.weight, lin.bias), msg=what, **tol)
    assert len(spy) == len(inputs)
    assert not inputs["transposed"].is_contiguous() and not inputs["strided"].is_contiguous()


def test_gradients_flow_through_the_custom_op():
    plain, patched = tiny_model(), tiny_model()
    patch_linear(patched)
    ids = torch.randint(0, VOCAB, (2, 5))
    for m in (plain, patched):
        m.requires_grad_(True)
        m(ids, use_cache=False).logits.float().square().mean().backward()
    for (n, p), q in zip(plain.named_parameters(), patched.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=n)


# ---- capture --------------------------------------------------------------------------------------------------


def test_generate_captures_the_model_shapes(clean_runtime, tmp_path, device):
    from examples.hf_capture import hf_expected, read_untuned
    from gradlib.models import ModelArch

    out = tmp_path / "captured.csv"
    (tmp_path / "empty.csv").write_text("")
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(tmp_path / "empty.csv"))
    clean_runtime.setenv("AITER_TUNE_GEMM", "1")
    clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(out))
    aiter_gemm.reload_configs()
    model = tiny_model(torch.bfloat16, device=device)
    patch_linear(model)
    batch, prompt = 2, 5
    ids = torch.randint(0, VOCAB, (batch, prompt), device=device)
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, min_new_tokens=3, do_sample=False,
                   pad_token_id=0)
    aiter_gemm.get_dispatcher().flush_capture()
    # prefill runs batch * prompt tokens, decode batch; lm_head only the last position of each sequence
    want = {(m, n, k, False, "torch.bfloat16") for name, (n, k) in SHAPES.items()
            for m in ((batch,) if name == "lm_head" else (batch * prompt, batch))}
    assert read_untuned(out) == want
    arch = ModelArch.from_config(tiny_config().to_dict())
    assert hf_expected(arch, set(SHAPES), {batch * prompt, batch}, {batch}, torch.bfloat16) == want


# ---- compile, fallbacks ---------------------------------------------------------------------------------------


def test_torch_compile_fullgraph(clean_runtime):
    """fullgraph=True: no graph break, and every linear is the aiter_gemm custom op in the traced graph. (The
    recording backend runs the graph eagerly; inductor takes ~25 s to compile this on 2 CPU cores.)"""
    model = tiny_model()
    ids = torch.randint(0, VOCAB, (2, 7))
    ref = logits(model, ids)
    patch_linear(model)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    got = logits(compiled, ids)
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("aiter_gemm.gemm_a16w16" in t for t in targets) == len(ALL_NAMES)
    assert not any("linear" in t for t in targets)
    assert rel_err(got, ref) <= TOL[torch.float32]
    torch._dynamo.reset()
    got = logits(torch.compile(model, fullgraph=True, backend="aot_eager"), ids)  # fake impl + functionalization
    assert rel_err(got, ref) <= TOL[torch.float32]
    torch._dynamo.reset()


def test_kept_dispatch_entry_is_dropped_when_anything_it_assumed_changes(clean_runtime, monkeypatch):
    """TunedLinear keeps gemm_a16w16's entry per input shape; a reload, a converted parameter (same object, new
    dtype) or another input dtype do not reuse it; a call that wants gradients gets them (issue 47: through the entry,
    which sends a non-plain decision to the custom op)."""
    made = []
    real = agnn._linear_entry
    monkeypatch.setattr(agnn, "_linear_entry", lambda *a: made.append(a[0].shape) or real(*a))
    lin = TunedLinear.from_linear(nn.Linear(32, 16))
    x = torch.randn(2, 3, 32)
    with torch.no_grad():
        assert torch.allclose(lin(x), F.linear(x, lin.weight, lin.bias), atol=1e-6)
        lin(x)
        assert len(made) == 1, "the second call of a shape reuses the entry"
        lin(torch.randn(5, 32))
        assert len(made) == 2, "another shape: another entry"
        aiter_gemm.reload_configs()
        lin(x)
        assert len(made) == 3, "reload_configs drops kept entries"
        lin.double()  # converts parameters in place: same objects, new dtype
        xd = x.double()
        out = lin(xd)
        assert len(made) == 4 and out.dtype == torch.float64, "float64 input and weight: a new entry"
        assert torch.allclose(out, F.linear(xd, lin.weight, lin.bias))
    xg = xd.clone().requires_grad_()
    lin(xg).sum().backward()  # the kept plain entry is F.linear, which autograd records
    assert xg.grad is not None and xg.grad.shape == xg.shape


@pytest.mark.parametrize("change", ["meta input", "bias dtype"])
def test_kept_entry_not_reused_for_another_input_device_or_bias_dtype(clean_runtime, monkeypatch, caplog, change):
    """Issue 31: the per-shape entry was reused for a ``meta`` input after a CPU one (get_device() is -1 for both)
    and for a bias whose dtype changed in place (``bias.data = ...``: the same Parameter object). Such calls now
    take the checks, fall back to F.linear as nn.Linear would and say why."""
    used = []
    real = agnn._run_linear_entry
    monkeypatch.setattr(agnn, "_run_linear_entry",
                        lambda entry, x, w, b: used.append((x.device.type, b.dtype)) or real(entry, x, w, b))
    tl = TunedLinear.from_linear(nn.Linear(32, 16), "proj")
    x = torch.randn(3, 32)
    with torch.no_grad():
        tl(x)
        tl(x)
        if change == "meta input":
            x = x.to("meta")
        else:
            tl.bias.data = tl.bias.data.double()
        with caplog.at_level(logging.WARNING, logger="aiter_gemm"):
            try:
                tl(x)
            except RuntimeError:  # F.linear's own refusal of the mixed devices or dtypes, as nn.Linear gives it
                pass
    assert used and all(call == ("cpu", torch.float32) for call in used), used
    assert "proj runs F.linear instead" in caplog.text and ("meta" if change == "meta input" else "float64") in \
        caplog.text


def test_module_call_keeps_hooks_forward_overrides_and_tracing(clean_runtime):
    """TunedLinear.__call__ skips nn.Module.__call__ only where that would go straight to forward: module and global
    hooks (pre, forward, backward), a forward replaced on the instance, Module.compile() and torch.fx still apply."""
    lin = nn.Linear(8, 16)
    tl = TunedLinear.from_linear(lin)
    x = torch.randn(3, 8)
    with torch.no_grad():
        ref = lin(x)
        assert torch.equal(tl(x), ref) and torch.equal(tl(x), ref)  # decided, then the fast path
        seen = []
        pre = tl.register_forward_pre_hook(lambda m, args: seen.append("pre"))
        post = tl.register_forward_hook(lambda m, args, out: out * 2)
        assert torch.equal(tl(x), 2 * ref) and seen == ["pre"]
        pre.remove()
        post.remove()
        assert torch.equal(tl(x), ref)
        glob = torch.nn.modules.module.register_module_forward_hook(lambda m, args, out: out + 1)
        try:
            assert torch.equal(tl(x), ref + 1)
        finally:
            glob.remove()
        tl.forward = lambda inp: torch.zeros(inp.shape[0], 16)  # what accelerate's hooks do
        assert torch.equal(tl(x), torch.zeros(3, 16))
        del tl.forward
        assert torch.equal(tl(x), ref)
        assert torch.equal(tl(input=x), ref)  # a keyword call takes nn.Module.__call__
        traced = torch.fx.symbolic_trace(nn.Sequential(tl))
        assert torch.equal(traced(x), ref)
    compiled = TunedLinear.from_linear(lin)
    compiled.compile(backend="eager", fullgraph=True)
    with torch.no_grad():
        assert torch.allclose(compiled(x), ref) and compiled.__dict__.get("_compiled_call_impl") is not None
    torch._dynamo.reset()
    grads = []
    tl.register_full_backward_hook(lambda m, grad_in, grad_out: grads.append(tuple(grad_out[0].shape)))
    tl(x.clone().requires_grad_()).sum().backward()
    assert grads == [(3, 16)]


def test_autocast_falls_back_with_one_warning(spy, caplog):
    model = tiny_model()
    ids = torch.randint(0, VOCAB, (1, 4))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model(ids, use_cache=False).logits
    patch_linear(model)
    with caplog.at_level(logging.WARNING, logger="aiter_gemm"):
        for _ in range(3):
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                got = model(ids, use_cache=False).logits
    assert spy == [], "autocast: F.linear, not gemm_a16w16"
    assert torch.equal(got, ref)
    msgs = [r.getMessage() for r in caplog.records if r.name == "aiter_gemm"]
    assert len(msgs) == len(ALL_NAMES), "one warning per module and reason, not per call"
    assert all("autocast" in m for m in msgs) and any("model.layers.1.mlp.down_proj" in m for m in msgs)


def test_dtype_mismatch_falls_back_like_nn_linear(spy, caplog):
    lin = nn.Linear(16, 8).to(torch.bfloat16)
    tl = TunedLinear.from_linear(lin, "proj")
    x = torch.randn(2, 16)  # float32 activation, bf16 weight
    with pytest.raises(RuntimeError) as plain:
        lin(x)
    with caplog.at_level(logging.WARNING, logger="aiter_gemm"):
        for _ in range(2):
            with pytest.raises(RuntimeError) as tuned:
                tl(x)
    assert str(tuned.value) == str(plain.value), "the fallback is F.linear: same error as nn.Linear"
    assert spy == []
    msgs = [r.getMessage() for r in caplog.records if r.name == "aiter_gemm"]
    assert len(msgs) == 1 and "proj" in msgs[0] and "dtype" in msgs[0]
    with torch.no_grad():
        tl(x.bfloat16())
    assert len(spy) == 1, "a supported call afterwards goes through gemm_a16w16"


# ---- the example, on CPU ----------------------------------------------------------------------------------------


def test_hf_decode_example_on_cpu(clean_runtime, tmp_path, capsys):
    import json

    from examples import hf_decode

    cfg_dir = tmp_path / "tiny"
    cfg_dir.mkdir()
    tiny_config().to_json_file(str(cfg_dir / "config.json"))
    out = tmp_path / "out"
    tuned = tmp_path / "tuned.csv"
    tuned.write_text(BF16_HEADER)
    rc = hf_decode.main(["--config", str(cfg_dir), "--device", "cpu", "--batch", "1,3", "--prompt-len", "5",
                         "--new-tokens", "3", "--decode-steps", "2", "--prefill-steps", "1", "--rounds", "2",
                         "--eager-rounds", "2", "--eager-steps", "2", "--out", str(out), "--tuned", str(tuned),
                         "--control"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "CUDA-graph measurements skipped" in text
    assert f"AITER_CONFIG_GEMM_BF16={tuned}:" in text, "--tuned goes in front of the configured table"
    cap = json.loads((out / "capture_check.json").read_text())
    assert cap["captured_vs_ran"]["match"] and cap["captured_vs_hf_layout"]["match"]
    assert cap["lm_head_m_seen"] == [1, 3] and cap["token_counts_seen"] == [1, 3, 5, 15]
    assert not cap["captured_vs_gradlib_models"]["match"], "gradlib fuses qkv / gate_up: a real difference"
    res = json.loads((out / "results.json").read_text())
    assert {(r["batch"], r["mode"], r["phase"]) for r in res["summary"]} == {
        (b, "eager", p) for b in (1, 3) for p in ("prefill", "decode")}
    assert len(res["rounds"]) == 4 * 2 * 3, "4 configurations x 2 rounds x 3 arms (without, with, control)"
    assert {r["arm"] for r in res["rounds"]} == {"without", "with", "control"}
    assert all(r["ms"] > 0 for r in res["rounds"])
    assert all(r["aa_ratio_min"] <= r["aa_ratio"] <= r["aa_ratio_max"] for r in res["summary"])
    assert all(c["max_abs_diff_over_max_abs"] < TOL[torch.bfloat16] for c in res["agreement"])
    table = (out / "results.md").read_text()
    assert (out / "rounds.csv").is_file() and "| speedup" in table and "A/A without/control" in table


def test_patch_state_switches_the_same_modules_back_and_forth(clean_runtime):
    """hf_decode's arms alternate step by step: after the first patch a switch puts the very same module objects
    back, and the model computes what each arm computed before."""
    from examples.hf_decode import PatchState

    model, ids = tiny_model(), torch.randint(0, VOCAB, (2, 5))
    originals = {n: m for n, m in model.named_modules() if type(m) is nn.Linear}
    state = PatchState(model, None, ["lm_head"])
    ref = logits(model, ids)
    state.set(True)
    assert sorted(state.names) == sorted(n for n in originals if n != "lm_head")
    patched = {n: model.get_submodule(n) for n in state.names}
    assert all(type(m) is TunedLinear for m in patched.values())
    got = logits(model, ids)
    for _ in range(2):
        state.set(False)
        assert all(model.get_submodule(n) is m for n, m in originals.items())
        torch.testing.assert_close(logits(model, ids), ref, rtol=0, atol=0)
        state.set(True)
        assert all(model.get_submodule(n) is m for n, m in patched.items())
        assert model.get_submodule("lm_head") is originals["lm_head"]
        torch.testing.assert_close(logits(model, ids), got, rtol=0, atol=0)


def _graph_model(kind: str) -> nn.Module:
    """A tiny Llama on the GPU: bf16 linears, or transformers' FP8Linear (the block-scale op's path)."""
    if kind == "fp8":
        from op_tests.test_fp8_linear import tiny_fp8_model

        return tiny_fp8_model(torch.bfloat16)[0].cuda()
    return tiny_model(torch.bfloat16, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_cuda_graph_replay_of_a_patched_decode_step(clean_runtime, kind):
    from examples.hf_model import StaticSteps, capture_graph

    model = _graph_model(kind)
    patch_linear(model)
    with torch.no_grad():
        steps = StaticSteps(model, 3, 9, torch.device("cuda"))
        eager = steps.decode().clone()
        graph, out = capture_graph(steps.decode)
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
        assert int(steps.cache.get_seq_length()) == 10, "each replay resets the write position"
        torch.testing.assert_close(out, eager)


def test_hf_decode_phases_option():
    """``--phases decode`` measures decode steps only (the cache is filled at set-up); anything else is refused."""
    from examples.hf_decode import build_parser

    ap = build_parser()
    assert ap.parse_args([]).phases == ["prefill", "decode"]
    assert ap.parse_args(["--phases", "decode"]).phases == ["decode"]
    assert ap.parse_args(["--phases", "decode,prefill,decode"]).phases == ["decode", "prefill"]
    with pytest.raises(SystemExit):
        ap.parse_args(["--phases", "warmup"])
