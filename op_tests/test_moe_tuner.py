"""The fused-MoE tuner (``python -m gradlib.tune_moe``) on CPU: the per-stage search (fakes with injected stage times),
AITER's tuned fmoe rows the op replays (real kernels, interpreted), vLLM's JSON files, crashes and hangs recorded as
failures, SIGKILL then resume, and the shapes of ``--model_dir`` (the shipped MoE configs, --tp, --ep) and ``-i``.
No test depends on how fast anything runs: the fakes declare their times on a virtual clock, and the real-kernel test
checks only what the timings cannot change."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

import op_tests.gradlib_fakes as fakes
from aiter_gemm.backends.base import ACT_TYPES, QUANT_NONE, MoeProblem, Solution
from aiter_gemm.fileio import read_csv_rows
from aiter_gemm.kernels.fused_moe import MoeConfig
from gradlib.moe import FMOE_TUNED_COLUMNS, VllmSidecar, stage_refine
from gradlib.records import Candidate, ItemResult, ShapeOutcome
from gradlib.search import pad_probes_of
from gradlib.tune_moe import main
from op_tests.runtime_helpers import kill_then_resume, repo_env

PLUGIN = "op_tests.gradlib_fakes"
SHARED = "moe_BM16_BN32_BK64_GM1_SK1_W4_S2"  # runs GEMM1 and GEMM2 of the tiny model (H 128, I 64)
OTHER = "moe_BM16_BN64_BK64_GM1_SK1_W4_S2"
TINY = {"model_type": "qwen3_moe", "hidden_size": 128, "moe_intermediate_size": 64, "num_experts": 4,
        "num_experts_per_tok": 2, "hidden_act": "silu"}

pytestmark = pytest.mark.usefixtures("cpu_tuner_workers")


@pytest.fixture
def tiny_model(tmp_path) -> Path:
    folder = tmp_path / "tiny_moe"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))
    return folder


def _problem(token: int) -> MoeProblem:
    return MoeProblem(token, 128, 64, 4, 2, ACT_TYPES["silu"])


# ---- the per-stage search -----------------------------------------------------------------------------------------
def test_stage_search_finds_each_gemms_best_config(tmp_path, tiny_model, inline, clean_runtime):
    """fakemoe's best shared config is s2 (10 us) and its best pair s1;s0 (3 us): the per-stage search times GEMM2's
    configs beside s2, then GEMM1's beside s0, and writes s1;s0 in AITER's columns, which the op then runs."""
    from aiter_gemm.ops.fused_moe import get_fused_moe_config

    tuned, prof = tmp_path / "tuned.csv", tmp_path / "prof.csv"
    assert main(["--model_dir", str(tiny_model), "--token", "2", "--libtype", "fakemoe", "--confirm_rounds", "0",
                 "-o", str(tuned), "-o2", str(prof), "--plugin", PLUGIN]) == 0
    header, (row,) = read_csv_rows(tuned)
    assert tuple(header) == FMOE_TUNED_COLUMNS
    assert (row["kernelName1"], row["kernelName2"], row["libtype"], row["run_1stage"]) == ("s1", "s0", "fakemoe", "0")
    assert row["us1"] == row["us2"] == "" and row["err1"] == row["err2"] == "0.000000"
    assert (row["token"], row["model_dim"], row["inter_dim"], row["expert"], row["topk"]) == ("2", "128", "64", "4",
                                                                                                "2")
    us = {r["kernelName"]: float(r["us"]) for r in read_csv_rows(prof)[1]}
    # shared configs, then GEMM2's beside s2 in the shared round's order (s2;s2 already timed), then GEMM1's beside
    # s0 (only s1;s0 is new)
    assert list(us) == ["s0", "s1", "s2", "s2;s1", "s2;s0", "s1;s0"]
    assert float(row["us"]) == us["s1;s0"] and math.isclose(us["s2"] - us["s1;s0"], 7.0, abs_tol=1e-3)

    clean_runtime.setenv("AITER_CONFIG_FMOE", str(tuned))
    import aiter_gemm

    aiter_gemm.reload_configs()
    got = get_fused_moe_config(2, 128, 64, 4, 2, on_gpu=False)
    assert (got["matched"], got["libtype"], got["kernelName"]) == ("exact", "fakemoe", "s1;s0")


def test_shared_stage_search_keeps_one_config_for_both_gemms(tmp_path, tiny_model, inline):
    tuned, prof = tmp_path / "tuned.csv", tmp_path / "prof.csv"
    assert main(["--model_dir", str(tiny_model), "--token", "2", "--libtype", "fakemoe", "--confirm_rounds", "0",
                 "--stage_search", "shared", "-o", str(tuned), "-o2", str(prof), "--plugin", PLUGIN]) == 0
    (row,) = read_csv_rows(tuned)[1]
    assert (row["kernelName1"], row["kernelName2"]) == ("s2", "s2")
    assert [r["kernelName"] for r in read_csv_rows(prof)[1]] == ["s0", "s1", "s2"]


def test_compare_then_run_config_on_moe_rows(tmp_path, tiny_model, inline, capsys):
    """AITER's --compare --update_improved replaces a shared-config row that the per-stage search beats, and
    --run_config times the file's rows: the shared machinery on MoE rows."""
    tuned = tmp_path / "tuned.csv"
    base = ["--model_dir", str(tiny_model), "--token", "2", "--libtype", "fakemoe", "--confirm_rounds", "0", "-o",
            str(tuned), "--plugin", PLUGIN]
    assert main([*base, "--stage_search", "shared"]) == 0
    assert read_csv_rows(tuned)[1][0]["kernelName1"] == "s2"
    capsys.readouterr()
    assert main([*base, "--all", "--compare", "--update_improved"]) == 0
    out = capsys.readouterr().out
    assert "(token=2, H=128, I=64, E=4, k=2, w=bf16)" in out and "UPDATE" in out
    (row,) = read_csv_rows(tuned)[1]
    assert (row["kernelName1"], row["kernelName2"]) == ("s1", "s0")
    assert main(["--run_config", str(tuned), "--libtype", "fakemoe", "--plugin", PLUGIN]) == 0
    out = capsys.readouterr().out
    assert "fakemoe   | s1;s0" in out and "| OK" in out and "nothing written" in out


def test_stage_refine_rounds():
    """Round 1 varies GEMM2 beside the fastest pair's GEMM1, round 2 GEMM1 beside its GEMM2; other libtypes (torch)
    are left alone, and a search without a staged solution gets no more rounds."""
    refine = stage_refine({"fakemoe": lambda p, a, b: Solution("fakemoe", -1, 0, f"{a};{b}")})
    ranked = [Solution("torch", -1, 0, "grouped_mm"), Solution("fakemoe", -1, 0, "b"),
              Solution("fakemoe", -1, 0, "a;c")]
    p = _problem(2)
    assert [s.kernelName for s in refine(p, ranked, 1)] == ["b;b", "b;a", "b;c"]
    assert [s.kernelName for s in refine(p, ranked, 2)] == ["b;b", "a;b", "c;b"]
    assert refine(p, ranked, 3) == [] and refine(p, ranked[:1], 1) == []


def test_stage_refine_leaves_out_pairs_a_stage_cannot_run():
    """A GEMM2-only config (KSUM) of the ranked Triton solutions is paired as GEMM2 in round 1, never as GEMM1 in
    round 2; vLLM's files take no flagged config."""
    from aiter_gemm.backends.fused_moe import triton as triton_backend
    from gradlib.moe import vllm_runs

    plain, ksum = MoeConfig(16, 32, 32), MoeConfig(16, 32, 32, ksum=True)
    ranked = [triton_backend.solution_of(plain, ksum)]
    p = _problem(2)
    refine = stage_refine()
    assert [s.kernelName for s in refine(p, ranked, 1)] == [plain.name(), f"{plain.name()};{ksum.name()}"]
    assert [s.kernelName for s in refine(p, ranked, 2)] == [f"{plain.name()};{ksum.name()}"]
    direct = MoeConfig(16, 32, 32, direct=True)
    assert vllm_runs(triton_backend.solution_of(plain)) and not vllm_runs(triton_backend.solution_of(direct))


def test_stage_refine_keeps_a_fused_config_for_both_gemms():
    """A FUSED config runs both GEMMs in one launch: the per-stage rounds never pair it with another config, whether
    it is the fastest pair or one of the others."""
    from aiter_gemm.backends.fused_moe import triton as triton_backend

    plain, fused = MoeConfig(16, 32, 32), MoeConfig(16, 32, 32, fused=True)
    p = _problem(2)
    refine = stage_refine()
    for ranked in ([triton_backend.solution_of(fused), triton_backend.solution_of(plain)],
                   [triton_backend.solution_of(plain), triton_backend.solution_of(fused)]):
        for round_ in (1, 2):
            names = [s.kernelName for s in refine(p, ranked, round_)]
            assert names and all(";" not in n or "FUSED" not in n for n in names), names


def test_pad_probes_follow_the_moe_padded_token():
    """A row at token 64 serves 33..64 through AITER's padded token (the next power of two): confirmed at 33 and in
    the middle; tokens 1 and 2 serve only themselves."""
    assert pad_probes_of(_problem(64)) == [33, 48]
    assert pad_probes_of(_problem(1)) == [] and pad_probes_of(_problem(2)) == []


# ---- real kernels, rows and vLLM files the op replays -------------------------------------------------------------
def test_real_kernels_rows_and_vllm_files_the_op_replays(tmp_path, tiny_model, clean_runtime):
    """Interpreted Triton pairs and torch's experts on two token counts: each row is the fastest valid candidate of its
    profile, in AITER's columns; vLLM's file holds, per token count, the one candidate vLLM's kernel runs (the shared
    config without split-K); the op replays the rows (exact, padded) and the file (nearest M)."""
    import aiter_gemm
    from aiter_gemm.ops.fused_moe import get_fused_moe_config

    tuned, prof, vdir = tmp_path / "tuned.csv", tmp_path / "prof.csv", tmp_path / "vllm"
    assert main(["--model_dir", str(tiny_model), "--token", "2,8", "--candidates", f"{SHARED},{SHARED};{OTHER},loop",
                 "-o", str(tuned), "-o2", str(prof), "--vllm_dir", str(vdir), "--mp", "1"]) == 0
    rows = read_csv_rows(tuned)[1]
    profile = read_csv_rows(prof)[1]
    assert [r["token"] for r in rows] == ["2", "8"]
    for r in rows:
        cands = [c for c in profile if c["token"] == r["token"]]
        # the named candidates and the baseline, torch's grouped_mm
        assert {c["kernelName"] for c in cands} == {SHARED, f"{SHARED};{OTHER}", "loop", "grouped_mm"}
        assert all(c["status"].startswith("ok") and float(c["err_ratio"]) == 0.0 for c in cands)
        best = min(cands, key=lambda c: float(c["us"]))
        assert (r["libtype"], r["kernelName1"]) == (best["libtype"], best["kernelName"].split(";")[0])
        if r["libtype"] == "triton":
            assert r["block_m"] == "16" and r["ksplit"] == "0"
    (vfile,) = vdir.iterdir()
    assert vfile.name == "E=4,N=64,device_name=cpu.json"
    body = json.loads(vfile.read_text())
    import triton

    assert list(body) == ["triton_version", "2", "8"] and body.pop("triton_version") == triton.__version__  # vLLM's
    assert all(MoeConfig.from_vllm(v).name() == SHARED for v in body.values())

    clean_runtime.setenv("AITER_CONFIG_FMOE", str(tuned))
    clean_runtime.setenv("AITER_GEMM_FUSED_MOE_CONFIGS", str(vdir))
    aiter_gemm.reload_configs()
    for token, matched, row in ((8, "exact", rows[1]), (5, "padded", rows[1])):
        got = get_fused_moe_config(token, 128, 64, 4, 2, on_gpu=False)
        assert (got["matched"], got["kernelName1"]) == (matched, row["kernelName1"])
    got = get_fused_moe_config(16, 128, 64, 4, 2, on_gpu=False)  # no row at 16: vLLM's key 8 is the nearest
    assert (got["matched"], got["kernelName"]) == ("json", SHARED)


def test_the_tuner_builds_the_triton_candidates_before_timing_any(tmp_path, tiny_model, inline, monkeypatch):
    """The driver hands the triton backend's precompile every (token, candidate) job before the first item is timed;
    its builds (a GPU check that passes, in-process build processes) run once per distinct kernel set: the token
    counts of a pair without KSUM share theirs."""
    from aiter_gemm.backends import _triton_precompile as tp
    from aiter_gemm.backends.fused_moe import triton as triton_backend
    from gradlib.tasks import WorkerRuntime
    from op_tests.runtime_helpers import FakeBuilders

    events = []
    monkeypatch.setattr(tp, "compiles_here", lambda: True)
    monkeypatch.setattr(tp, "start_builder", FakeBuilders())
    monkeypatch.setattr(triton_backend, "build_job", lambda p, s: events.append(("build", p.token, s.kernelName)))
    run_item = WorkerRuntime.run_item
    monkeypatch.setattr(WorkerRuntime, "run_item",
                        lambda self, task, i: events.append(("time", task.kind)) or run_item(self, task, i))
    pair = f"{SHARED};{OTHER}"
    assert main(["--model_dir", str(tiny_model), "--token", "2,8", "--candidates", f"{SHARED},{pair}",
                 "--confirm_rounds", "0", "-o", str(tmp_path / "tuned.csv")]) == 0
    assert events[:2] == [("build", 2, SHARED), ("build", 2, pair)]
    assert events[2:] and all(kind == "time" for kind, _ in events[2:])


def test_an_unreadable_vllm_file_is_left_alone(tmp_path, caplog):
    """A vLLM file that does not read as one keeps its text; the error names it."""
    from aiter_gemm.device import DeviceIdentity

    vdir = tmp_path / "vllm"
    vdir.mkdir()
    bad = vdir / "E=4,N=64,device_name=cpu.json"
    bad.write_text('{"1": {"BLOCK_SIZE_M": "sixteen"}}')
    sidecar = VllmSidecar(DeviceIdentity("cpu", 4, "cpu", "cpu"), tmp_path / "tuned.csv", [], vdir)
    sol = Solution("triton", -1, 0, SHARED)
    win = Candidate(sol, "confirm", ItemResult(0, 0, True, us=5.0, err_ratio=0.0), True)
    sidecar.add(ShapeOutcome(0, _problem(2), win, None, [], [], 0.0))
    sidecar.flush()
    assert bad.read_text() == '{"1": {"BLOCK_SIZE_M": "sixteen"}}' and str(bad) in caplog.text


def test_a_vllm_file_keeps_its_triton_version_and_other_keys(tmp_path, monkeypatch):
    """A file of vLLM's benchmark_moe.py (``triton_version`` first) takes this run's token counts; its version and
    its other M keys stay as written."""
    from aiter_gemm import moe_json
    from aiter_gemm.device import DeviceIdentity

    monkeypatch.setattr(moe_json, "triton_version", lambda: "3.9.0", raising=False)
    vdir = tmp_path / "vllm"
    vdir.mkdir()
    theirs = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8, "num_warps": 4,
              "num_stages": 3}
    path = vdir / "E=4,N=64,device_name=cpu.json"
    path.write_text(json.dumps({"triton_version": "3.4.0", "1": theirs, "64": theirs}, indent=4))
    sidecar = VllmSidecar(DeviceIdentity("cpu", 4, "cpu", "cpu"), tmp_path / "tuned.csv", [], vdir)
    win = Candidate(Solution("triton", -1, 0, SHARED), "confirm", ItemResult(0, 0, True, us=5.0, err_ratio=0.0), True)
    sidecar.add(ShapeOutcome(0, _problem(2), win, None, [], [], 0.0))
    sidecar.flush()
    data = json.loads(path.read_text())
    assert list(data) == ["triton_version", "1", "2", "64"] and data["triton_version"] == "3.4.0"
    assert data["1"] == data["64"] == theirs and MoeConfig.from_vllm(data["2"]).name() == SHARED
    assert sidecar.written == {path}


# ---- crashes, hangs, SIGKILL ----------------------------------------------------------------------------------------
def test_faulty_candidates_are_recorded_failed_and_a_valid_one_wins(tmp_path, tiny_model):
    """A candidate that raises, hangs past --timeout, SIGKILLs its worker or returns a wrong shape is a failed profile
    row (the worker replaced where it died); the correct one is written."""
    tuned, prof = tmp_path / "tuned.csv", tmp_path / "prof.csv"
    assert main(["--model_dir", str(tiny_model), "--token", "2", "--libtype", "fakemoebad", "--confirm_rounds", "0",
                 "--timeout", "5", "-o", str(tuned), "-o2", str(prof), "--plugin", PLUGIN]) == 0
    (row,) = read_csv_rows(tuned)[1]
    assert row["kernelName1"] == "good"
    status = {r["kernelName"]: (r["status"], r["error"]) for r in read_csv_rows(prof)[1]}
    assert status["good"][0] == "ok"
    assert all(status[n][0] == "failed" for n in fakes.FakeMoeFaultyBackend.FAULTS)
    assert "fake kernel launch failure" in status["raises"][1] and "returned (2, 127)" in status["wrong_shape"][1]
    assert "signal 9" in status["sigkill"][1] and "timed out after 5 s" in status["hangs"][1]


def test_sigkill_then_resume_keeps_finished_rows(tmp_path, tiny_model):
    tokens = [1, 2, 3, 4]
    tuned = tmp_path / "tuned.csv"
    cmd = [sys.executable, "-m", "gradlib.tune_moe", "--model_dir", str(tiny_model), "--token",
           ",".join(map(str, tokens)), "--libtype", "fakemoeslow", "--confirm_rounds", "0", "-o", str(tuned),
           "--batch", "1", "--plugin", PLUGIN]
    env = repo_env(CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1", GRADLIB_FAKES_HOLD=str(tmp_path / "hold"))
    kill_then_resume(cmd, env, tmp_path, tuned, tokens, lambda r: int(r["token"]), 1)


# ---- shapes -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, expected", [
    (["--model_dir", "qwen3_30b_a3b"], ("2048", "768", "128", "8", "torch.bfloat16", QUANT_NONE)),
    (["--model_dir", "qwen3_235b_a22b", "--tp", "4"], ("4096", "384", "128", "8", "torch.bfloat16", QUANT_NONE)),
    (["--model_dir", "mixtral_8x7b"], ("4096", "14336", "8", "2", "torch.bfloat16", QUANT_NONE)),
    (["--model_dir", "deepseek_v3", "--ep", "8"], ("7168", "2048", "32", "8", "torch.float8_e4m3fn",
                                                   "QuantType.per_1x128")),
    (["--model_dir", "deepseek_v3", "--tp", "8"], ("7168", "256", "256", "8", "torch.float8_e4m3fn",
                                                   "QuantType.per_1x128")),
    (["--model_dir", "qwen3_30b_a3b", "--dtype", "fp8"], ("2048", "768", "128", "8", "torch.float8_e4m3fn",
                                                          "QuantType.per_1x128")),
])
def test_model_shapes_in_aiters_untuned_columns(args, expected, capsys):
    assert main([*args, "--token", "1,64", "--print_shapes"]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header == ("token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,use_g1u1,"
                      "doweight_stage1")
    assert len(lines) == 2 and [line.split(",")[0] for line in lines] == ["1", "64"]
    cells = lines[0].split(",")
    assert tuple(cells[1:5]) + (cells[8], cells[9]) == expected
    assert cells[5] == "ActivationType.Silu" and cells[10:] == ["True", "False"]


@pytest.mark.parametrize("args, needle", [
    (["--model_dir", "llama3_8b"], "no routed experts"),
    (["--model_dir", "mixtral_8x7b", "--ep", "3"], "num_local_experts=8 is not divisible by --ep 3"),
    (["--model_dir", "qwen3_30b_a3b", "--tp", "5"], "moe_intermediate_size=768 is not divisible by --tp 5"),
    (["--model_dir", "qwen3_30b_a3b", "--dtype", "int4"], "--dtype int4"),
    (["--tp", "2"], "no --model_dir"),
    (["--last"], "no -i given"),
])
def test_bad_shape_arguments_exit_2_naming_the_problem(args, needle, capsys):
    assert main([*args, "--print_shapes"]) == 2
    assert needle in capsys.readouterr().err


def test_untuned_csv_last_shape_and_aiters_block_scale_spelling(tmp_path, capsys):
    """-i reads AITER's untuned fmoe file; --last keeps its last shape; per_128x128 is read as the op's per_1x128."""
    src = tmp_path / "untuned_fmoe.csv"
    cols = "token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,use_g1u1,doweight_stage1"
    src.write_text(cols + "\n"
                   "16,7168,256,257,9,ActivationType.Silu,torch.bfloat16,torch.bfloat16,torch.bfloat16,QuantType.No,"
                   "1,0\n"
                   "32,7168,2048,32,8,ActivationType.Silu,torch.bfloat16,torch.float8_e4m3fn,torch.float8_e4m3fn,"
                   "QuantType.per_128x128,1,0\n")
    assert main(["-i", str(src), "--last", "--print_shapes"]) == 0
    (line,) = capsys.readouterr().out.splitlines()[1:]
    assert line == ("32,7168,2048,32,8,ActivationType.Silu,torch.bfloat16,torch.float8_e4m3fn,torch.float8_e4m3fn,"
                    "QuantType.per_1x128,True,False")
    assert main(["-i", str(src), "--print_shapes"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3



def test_fp8_fused_candidates_are_checked_against_their_own_reference(monkeypatch):
    """A FUSED solution of FP8 experts is checked against the reference whose intermediate enters GEMM2 unquantized,
    as its kernel takes it (the backend's reference variant); a non-FUSED one against the op's; each reference is
    made once per inputs, whatever order the candidates come in."""
    import torch

    from aiter_gemm.backends.base import QUANT_BLOCK
    from aiter_gemm.backends.fused_moe import triton as triton_backend
    from aiter_gemm.kernels.fused_moe import fused_moe_ref
    from aiter_gemm.ops.fused_moe import FUSED_MOE
    from gradlib import records, tasks

    fp8 = torch.float8_e4m3fn
    p = MoeProblem(4, 256, 128, 8, 2, ACT_TYPES["silu"], torch.bfloat16, fp8, fp8, QUANT_BLOCK)
    fused = triton_backend.solution_of(MoeConfig(16, 32, 256, num_warps=8, fused=True))
    plain = triton_backend.solution_of(MoeConfig(16, 64, 128))
    made = []
    reference = triton_backend.BACKEND.reference
    monkeypatch.setattr(triton_backend.BACKEND, "reference", lambda *a: made.append(a[2]) or reference(*a))
    rt = tasks.WorkerRuntime.create()
    task = records.Task(0, 0, records.TIME, p, (fused, plain), op=FUSED_MOE.name)
    data = rt._inputs(task)
    x, w1, w2, tw, ti, s1, s2 = data.sets[0]
    unquantized = fused_moe_ref(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2, quant_inter=False).float()
    assert not torch.equal(unquantized, data.ref)  # the two references differ here
    for sol in (fused, plain, fused, plain):
        want = unquantized if sol is fused else data.ref
        assert torch.equal(rt._reference(task, sol, data), want), sol.kernelName
    assert made == [triton_backend.UNQUANTIZED_INTER, None]
    bf16 = MoeProblem(4, 256, 128, 8, 2, ACT_TYPES["silu"])  # no quantized intermediate: the op's reference
    assert triton_backend.BACKEND.reference_variant(bf16, fused) is None
