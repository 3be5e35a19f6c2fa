"""DeepGEMM as the ``deepgemm`` backend of ``fused_moe`` (:mod:`aiter_gemm.backends.fused_moe.deepgemm`): its support
rule, unavailability without ``deep_gemm`` (and its rows then warned misses), never a default, and (with
:mod:`op_tests.fake_deep_gemm` as ``deep_gemm``) the runner against the float32 references at T 1, 3, 37, 129 and
k 1, 2, 8 with experts that get no token, tuned rows that name it, the warm-up, and the tuner timing it. On an sm_90
GPU with DeepGEMM installed, the real kernels against the references, in a CUDA graph and through the op."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch

import aiter_gemm
import op_tests.fake_deep_gemm as fake
from aiter_gemm.backends.base import ACT_TYPES, QUANT_BLOCK, MoeProblem, Solution
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.fileio import read_csv_rows
from aiter_gemm.kernels import a8w8_blockscale_deepgemm as dg_impl
from aiter_gemm.kernels import fused_moe_deepgemm as impl
from aiter_gemm.kernels.act_quant import per_token_group_quant_fp8_ref
from aiter_gemm.kernels.blockscale_format import FP8
from aiter_gemm.kernels.fused_moe import fused_moe_ref
from aiter_gemm.ops.fused_moe import FUSED_MOE, get_fused_moe_config
from aiter_gemm.registry import get_backend
from gradlib import tune_moe
from op_tests.runtime_helpers import moe_call
from op_tests.test_fused_moe import HEADER, aiter_row, use_table

NAME = impl.NAME
BACKEND = get_backend("deepgemm", FUSED_MOE.backends)
SOLUTION = Solution("deepgemm", -1, 0, NAME)
H200 = DeviceIdentity("sm_90", 132, "cuda", "NVIDIA H200")
H, INTER = 256, 128
BF16_TOL = 8e-3  # the runner against DeepGEMM's own reference: bf16 rounding of GEMM1's output and of the result


def _problem(T: int, k: int = 2, E: int = 4, *, H_: int = H, I_: int = INTER, fp8: bool = True,
             dtype: torch.dtype = torch.bfloat16, act: str = "silu", **kw) -> MoeProblem:
    q = FP8 if fp8 else dtype
    return MoeProblem(T, H_, I_, E, k, ACT_TYPES.get(act, act), dtype, q, q, QUANT_BLOCK if fp8 else "QuantType.No",
                      **kw)


def _cpu() -> DeviceIdentity:
    return aiter_gemm.current_device_identity(False)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


# ---- the support rule and availability ------------------------------------------------------------------------------
@pytest.mark.parametrize("p,why", [
    (_problem(1, 1), None),
    (_problem(3, 8, E=8, act="gelu"), None),
    (_problem(3, fp8=False), "take FP8 experts"),
    (_problem(3, dtype=torch.float16), "write torch.bfloat16 only"),
    (_problem(3, I_=64), "GEMM2: K=64 is not a multiple of 128"),
    (_problem(3, H_=192), "GEMM1: K=192 is not a multiple of 128"),
    (_problem(3, act="ActivationType.Relu"), "act_type 'ActivationType.Relu'"),
    (_problem(3, doweight_stage1=True), "doweight_stage1 True"),
])
def test_support_rule_names_what_is_unsupported(p, why):
    got = BACKEND.shape_why_not(p, SOLUTION, "sm_90")
    assert (got is None) if why is None else (why in got), got
    assert BACKEND.candidates(p, _cpu()) == ([SOLUTION] if why is None else [])


def test_support_rule_takes_its_one_kernel_name_on_sm90_only():
    p = _problem(3)
    assert "sm_90a's, not sm_100's" in BACKEND.shape_why_not(p, SOLUTION, "sm_100")
    assert f"runs {NAME!r}, not 'grouped_mm'" in BACKEND.shape_why_not(p, Solution("deepgemm", -1, 0, "grouped_mm"),
                                                                        "sm_90")
    with pytest.raises(ValueError, match="GEMM2: K=64"):
        impl.launcher(_problem(3, I_=64))


def test_unavailable_without_deep_gemm_says_why(no_deep_gemm):
    why = impl.unavailable_reason()
    assert why.startswith("deep_gemm is not installed") and "docs/deepgemm.md" in why
    assert BACKEND.unavailable_reason() == why
    assert BACKEND.why_not(_problem(3), SOLUTION, _cpu()) == why
    assert BACKEND.prepare(_problem(3), SOLUTION, _cpu()) is None
    failed = BACKEND.precompile([(_problem(3), SOLUTION), (_problem(5), SOLUTION)])
    assert list(failed) == [NAME] and failed[NAME] == why


def test_unavailable_without_the_grouped_gemm_or_off_an_nvidia_gpu(monkeypatch):
    mod = fake.fake_module()
    monkeypatch.setitem(sys.modules, "deep_gemm", mod)
    assert "NVIDIA" in impl.unavailable_reason(torch.device("cpu"))  # the dense module's rule
    monkeypatch.setattr(dg_impl, "unavailable_reason", lambda device=None: None)
    assert impl.unavailable_reason() is None
    del mod.m_grouped_fp8_gemm_nt_contiguous, mod.get_mk_alignment_for_contiguous_layout
    assert impl.unavailable_reason() == ("deep_gemm fake has no m_grouped_fp8_gemm_nt_contiguous, "
                                         "get_mk_alignment_for_contiguous_layout")


def test_never_the_default(fake_dg):
    for T in (1, 64, 4096):
        p = _problem(T, 8, E=256, H_=7168, I_=2048)
        assert BACKEND.candidates(p, H200) == [SOLUTION]
        assert BACKEND.default_for(p, H200) is None and BACKEND.eager_default_for(p, H200) is None


# ---- the runner, with the fake deep_gemm ---------------------------------------------------------------------------
def _routed_inputs(T: int, k: int, E: int, seed: int):
    """FP8 inputs whose tokens pick k distinct experts of all but experts 1 and E - 1 (which get none)."""
    p = _problem(T, k, E)
    x, w1, w2, tw, _, s1, s2 = FUSED_MOE.make_inputs(p, seed, torch.device("cpu"), 0, {}).sets[0]
    allowed = torch.tensor([e for e in range(E) if e not in (1, E - 1)])
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([allowed[torch.randperm(len(allowed), generator=gen)[:k]] for _ in range(T)]).to(torch.int32)
    return p, (x, w1, w2, tw, ids, s1, s2)


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the fake's NaN padding rows, quantized: not used
@pytest.mark.parametrize("T", [1, 3, 37, 129])
@pytest.mark.parametrize("k", [1, 2, 8])
def test_runner_matches_the_references(fake_dg, monkeypatch, T, k):
    """DeepGEMM's own reference to bf16 rounding, the op's within the provider's tolerance; each expert's rows in
    one aligned run, experts 1 and 9 of 10 none; the two grouped GEMMs on one layout."""
    # the interpreted quantizer is slow on a thousand rows; its torch rule gives the same values (the quantizer's
    # own tests), and the op's path below runs it
    monkeypatch.setattr(impl, "per_token_group_quant_fp8", per_token_group_quant_fp8_ref)
    E = 10
    p, args = _routed_inputs(T, k, E, seed=T * 10 + k)
    run = BACKEND.prepare(p, SOLUTION, _cpu())
    out = run(*args)
    assert out.shape == (T, H) and out.dtype == torch.bfloat16
    assert _rel(out, impl.fused_moe_deepgemm_ref(*args)) < BF16_TOL
    x, w1, w2, tw, ids, s1, s2 = args
    assert _rel(out, fused_moe_ref(x, w1, w2, tw, ids, w1_scale=s1, w2_scale=s2)) < impl.MAX_REL_ERR / 2
    assert [(c["N"], c["K"], c["G"]) for c in fake.CALLS] == [(2 * INTER, H, E), (H, INTER, E)]
    layout = fake.CALLS[0]["layout"]
    assert torch.equal(layout, fake.CALLS[1]["layout"]) and layout.numel() == impl.rows_bound(T * k, E, fake.ALIGNMENT)
    assert [(layout == e).sum().item() for e in range(E)] == [(ids == e).sum().item() for e in range(E)]
    assert (layout == 1).sum().item() == (layout == E - 1).sum().item() == 0


def test_layout_rows_read_their_tokens():
    """Each row of an expert's run reads a token routed to that expert, in the tokens' order."""
    ids = torch.tensor([[2, 0], [0, 1], [2, 1]], dtype=torch.int32)
    lay = impl.contiguous_layout(ids, 4, 4)
    assert lay.groups.tolist() == [0, 0, -1, -1, 1, 1, -1, -1, 2, 2, -1, -1] + [-1] * 8
    assert lay.rows[lay.groups >= 0].tolist() == [0, 1, 1, 2, 0, 2]
    assert lay.pair_rows.tolist() == [0, 1, 4, 5, 8, 9]


def test_own_reference_rounds_gemm1_only():
    """DeepGEMM's reference is the op's with GEMM1's output in bf16: the same where that rounding is exact, within
    MAX_REL_ERR otherwise."""
    p, args = _routed_inputs(5, 2, 4, seed=3)
    x, w1, w2, tw, ids, s1, s2 = args
    ref = fused_moe_ref(x, w1, w2, tw, ids, w1_scale=s1, w2_scale=s2, activation="gelu")
    own = impl.fused_moe_deepgemm_ref(*args, activation="gelu")
    assert 0 < _rel(own, ref) < impl.MAX_REL_ERR / 2
    assert torch.equal(BACKEND.reference(_problem(5, act="gelu"), args), own.float())


# ---- rows, the op, the warm-up -------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:All-NaN slice")
@pytest.mark.parametrize("with_libtype", [True, False])
def test_a_row_naming_deepgemm_dispatches_to_it(tmp_path, clean_runtime, fake_dg, with_libtype):
    """By libtype, or read off kernelName1 where the row has none (AITER's columns); the op's call runs the fake."""
    clean_runtime.setattr(fake, "ALIGNMENT", 8)  # few padding rows for the interpreted quantizer
    p, args = _routed_inputs(3, 2, 4, seed=1)
    row = aiter_row(p, NAME, cu_num=_cpu().cu_num)
    use_table(clean_runtime, tmp_path, (HEADER + ",libtype\n" + row + ",deepgemm\n") if with_libtype
              else (HEADER + "\n" + row + "\n"))
    got = get_fused_moe_config(3, H, INTER, 4, 2, q_dtype_w=FP8, on_gpu=False)
    assert (got["matched"], got["libtype"], got["kernelName"], got["kernelName1"], got["kernelName2"]) == \
        ("exact", "deepgemm", NAME, NAME, NAME)
    out = moe_call(args)
    assert len(fake.CALLS) == 2 and _rel(out, impl.fused_moe_deepgemm_ref(*args)) < BF16_TOL


def test_a_row_without_deep_gemm_is_a_miss_warned_once(tmp_path, clean_runtime, caplog):
    clean_runtime.setitem(sys.modules, "deep_gemm", None)
    use_table(clean_runtime, tmp_path, HEADER + ",libtype\n" + "".join(
        aiter_row(_problem(T), NAME, cu_num=_cpu().cu_num) + ",deepgemm\n" for T in (3, 5)))
    with caplog.at_level(logging.WARNING, logger="aiter_gemm"):
        for T in (3, 5):
            got = get_fused_moe_config(T, H, INTER, 4, 2, q_dtype_w=FP8, on_gpu=False)
            assert (got["matched"], got["libtype"]) == ("default", "torch")
    warned = [r.getMessage() for r in caplog.records if "deep_gemm is not installed" in r.getMessage()]
    assert len(warned) == 1 and "'deepgemm'" in warned[0], caplog.text


@pytest.mark.filterwarnings("ignore:All-NaN slice")
def test_warmup_runs_each_kernel_shape_once(tmp_path, clean_runtime, fake_dg):
    """aiter_gemm.warmup runs each deepgemm row's problem once (DeepGEMM's JIT compiles on a shape's first call);
    T 4 and 5 (k 2, E 4) need the same rows bound, so one run serves both."""
    clean_runtime.setattr(fake, "ALIGNMENT", 8)
    use_table(clean_runtime, tmp_path, HEADER + ",libtype\n" + "".join(
        aiter_row(_problem(T), NAME, cu_num=_cpu().cu_num) + ",deepgemm\n" for T in (3, 4, 5)))
    (summary,) = aiter_gemm.warmup(("fused_moe",), on_gpu=False)
    assert summary["failed"] == {}
    assert [c["M"] for c in fake.CALLS] == [impl.rows_bound(6, 4, 8)] * 2 + [impl.rows_bound(8, 4, 8)] * 2


# ---- the tuner ------------------------------------------------------------------------------------------------------
def test_tuner_times_deepgemm_only_when_named(monkeypatch):
    """Opt-in: checked against its own reference (GEMM1's output in bf16), it is never timed unasked."""
    monkeypatch.setitem(sys.modules, "deep_gemm", None)
    assert tune_moe.default_libtypes(True) == ("triton", "torch")
    fake.install(monkeypatch)
    assert tune_moe.default_libtypes(True) == ("triton", "torch")
    assert tune_moe.default_libtypes(False) == ("triton", "torch")
    assert tune_moe.candidate_solution(NAME) == SOLUTION


def test_libtype_deepgemm_where_it_cannot_run_is_a_usage_error(tmp_path, capsys, no_deep_gemm, cpu_tuner_workers):
    args = ["--model_dir", "qwen3_30b_a3b", "--token", "1", "--libtype", "triton,deepgemm", "-o",
            str(tmp_path / "t.csv")]
    assert tune_moe.main(args) == 2
    assert "--libtype deepgemm: deep_gemm is not installed" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:All-NaN slice")
def test_tuner_times_deepgemm_against_its_own_reference_and_writes_its_row(tmp_path, clean_runtime, inline):
    """On the virtual clock the fake (one tick) beats fakemoe's pairs (3 us and more). Its candidate is checked
    against DeepGEMM's arithmetic (err_ratio 0), not the op's reference (a few percent of outputs a whole FP8 step
    off); the row names it in AITER's columns and the op replays it."""
    fake.install(clean_runtime)
    clean_runtime.setattr(fake, "ALIGNMENT", 8)
    clean_runtime.setattr(impl, "per_token_group_quant_fp8", per_token_group_quant_fp8_ref)  # as above
    model = tmp_path / "tiny_fp8_moe"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "qwen3_moe", "hidden_size": 256, "moe_intermediate_size": 128, "num_experts": 4,
        "num_experts_per_tok": 2, "hidden_act": "silu"}))
    tuned, prof = tmp_path / "tuned.csv", tmp_path / "prof.csv"
    assert tune_moe.main(["--model_dir", str(model), "--token", "16", "--dtype", "fp8", "--libtype",
                          "deepgemm,fakemoe", "--confirm_rounds", "0", "-o", str(tuned), "-o2", str(prof),
                          "--plugin", "op_tests.gradlib_fakes"]) == 0
    (cand,) = [r for r in read_csv_rows(prof)[1] if r["libtype"] == "deepgemm"]
    assert cand["kernelName"] == NAME and float(cand["err_ratio"]) == 0.0, cand
    (row,) = read_csv_rows(tuned)[1]
    assert (row["libtype"], row["kernelName1"], row["kernelName2"], row["block_m"], row["ksplit"]) == \
        ("deepgemm", NAME, NAME, "0", "0")
    clean_runtime.setenv("AITER_CONFIG_FMOE", str(tuned))
    aiter_gemm.reload_configs()
    got = get_fused_moe_config(16, H, INTER, 4, 2, q_dtype_w=FP8, on_gpu=False)
    assert (got["matched"], got["libtype"], got["kernelName"]) == ("exact", "deepgemm", NAME)


# ---- the benchmark provider calls the library's function ---------------------------------------------------------
def test_the_benchmark_provider_runs_the_librarys_function(fake_dg, monkeypatch):
    from benchmarks import providers

    calls = []
    monkeypatch.setattr(impl, "fused_moe_deepgemm", lambda *a, **kw: calls.append(kw) or a[0])
    p = _problem(3)
    provider, arg = providers.resolve(providers.MOE, "deepgemm")
    sets = [(torch.zeros(3, H, dtype=torch.bfloat16),) + (None,) * 6]
    ctx = providers.Context(p, providers.MOE, sets, H200, torch.device("cpu"), "graph")
    provider.build(ctx, arg)(0)
    assert calls == [{"activation": "silu"}]
    assert provider.max_rel_err(p) == impl.MAX_REL_ERR


# ---- GPU -------------------------------------------------------------------------------------------------------------
def _gpu_skip():
    why = impl.unavailable_reason(torch.device("cuda")) if torch.cuda.is_available() else "no CUDA GPU"
    if why:
        pytest.skip(why)


def _gpu_inputs(T: int, k: int, E: int, H_: int, I_: int, act: str = "silu"):
    p = _problem(T, k, E, H_=H_, I_=I_, act=act)
    made = FUSED_MOE.make_inputs(p, T + k, torch.device("cuda"), 0, {})
    return p, made.sets[0], made.ref


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 3, 37, 129, 1024])
@pytest.mark.parametrize("k,E,H_,I_,act", [(8, 128, 2048, 768, "silu"), (2, 8, 4096, 1536, "gelu")])
def test_gpu_deep_gemm_matches_the_references(clean_runtime, T, k, E, H_, I_, act):
    _gpu_skip()
    p, args, ref = _gpu_inputs(T, k, E, H_, I_, act)
    out = BACKEND.prepare(p, SOLUTION, aiter_gemm.current_device_identity(True))(*args)
    assert _rel(out, BACKEND.reference(p, args)) < BF16_TOL
    assert _rel(out, ref) < impl.MAX_REL_ERR / 2
    assert torch.equal(moe_call(args, activation=act, config=SOLUTION), out)  # the op with the config


@pytest.mark.gpu
def test_gpu_warm_then_graph_capture_through_a_row(clean_runtime, tmp_path):
    """After warm, a captured call of the op through a deepgemm row replays to the eager result (no JIT and no host
    sync inside the capture); torch.compile goes through the op's custom op to the same runner."""
    _gpu_skip()
    p, args, _ = _gpu_inputs(97, 8, 128, 2048, 768)
    assert impl.warm([p]) == {}
    use_table(clean_runtime, tmp_path, HEADER + ",libtype\n" + aiter_row(p, NAME) + ",deepgemm\n")
    assert get_fused_moe_config(97, 2048, 768, 128, 8, q_dtype_w=FP8)["libtype"] == "deepgemm"
    want = moe_call(args)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = moe_call(args)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(got, want)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: moe_call(a), fullgraph=True)
    assert torch.equal(compiled(*args), want)
    torch._dynamo.reset()
