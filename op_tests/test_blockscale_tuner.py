"""The A8W8 block-scale tuner (``python -m gradlib.tune_a8w8_blockscale``) on CPU, kernels interpreted: end to end
(CSV rows and JSON files the op replays), faulty candidates isolated by gradlib's worker pool, SIGKILL then resume,
shape sources (--nk, --model_dir Llama / DeepSeek, --shapes) and the JSON bucket rules.

This module is also the tuner's ``--plugin`` in these tests: importing it registers the faulty launchers below
(in the spawned workers too), which only run when a test names them with ``--candidates``."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

import op_tests.gradlib_fakes as fakes
from aiter_gemm.fileio import read_csv_rows
from aiter_gemm.kernels.a8w8_blockscale import BlockscaleConfig, gemm_a8w8_blockscale_ref, quantize_blockscale
from gradlib import gemm_tuner
from gradlib.blockscale import BLOCKSCALE, candidate_solution, register_launcher
from gradlib.records import TIME, ItemResult, Task
from gradlib.tasks import WorkerRuntime
from gradlib.tune_a8w8_blockscale import (
    SEED_BUCKETS,
    deepseek_projections,
    main,
    model_projections,
    seed_buckets,
)
from op_tests.runtime_helpers import kill_then_resume, repo_env

REPO = Path(__file__).resolve().parent.parent
PLUGIN = "op_tests.test_blockscale_tuner"
SWAP16 = "swapAB-BM16_BN64_BK128_GM1_SK1_W4_S4_TMA"  # runs any M <= 16 and N, K >= 64 (interpreted: ~50 ms)
BASE64 = "base-BM64_BN64_BK128_GM1_SK1_W4_S4_TMA"


def _adapt(fn):
    """A gradlib_fakes behaviour (a, b, bias, otype, sa, sb, sc) as a block-scale launcher."""
    return lambda XQ, WQ, xs, ws, out: fn(XQ, WQ, None, out.dtype, None, None, None)


def _slow_exact(XQ, WQ, xs, ws, out):
    """Correct but slow (keeps a run busy long enough to kill it, held by GRADLIB_FAKES_HOLD); not a config, so it
    is never written."""
    fakes.spend(0.2, real=True)
    return out.copy_(gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, out.dtype))


for _name in ("raises", "hangs", "sigkill", "zeros", "nan", "wrong_shape"):
    register_launcher(f"fake_{_name}", _adapt(fakes.FAKE_BEHAVIOURS[_name]))
register_launcher("fake_slow_exact", _slow_exact)


# CPU tuner workers (conftest.cpu_tuner_workers) for every test here but GPU-marked ones.
pytestmark = pytest.mark.usefixtures("cpu_tuner_workers")


def _run(*args) -> int:
    return main([*map(str, args), "--plugin", PLUGIN])


# ---- end to end ----------------------------------------------------------------------------------------------------
def test_tunes_quick_space_and_the_op_replays_csv_and_json(tmp_path, clean_runtime):
    import aiter_gemm
    from aiter_gemm.ops.a8w8_blockscale import gemm_a8w8_blockscale, get_GEMM_A8W8_BLOCKSCALE_config

    tuned, prof, jdir = tmp_path / "tuned.csv", tmp_path / "profile.csv", tmp_path / "json"
    # the quick space without the split-K variants (interpreted kernels are slow; split-K is tested below)
    assert _run("--nk", "256,256", "--m", "1,33", "--quick", "--variants", "swapAB,base", "-o", tuned,
                "--json_dir", jdir, "--profile_file", prof, "--confirm_rounds", "0") == 0
    rows = read_csv_rows(tuned)[1]
    assert [(r["M"], r["N"], r["K"]) for r in rows] == [("1", "256", "256"), ("33", "256", "256")]
    assert all(r["gfx"] == "cpu" and r["cu_num"] == str(os.cpu_count()) and r["libtype"] == "triton" for r in rows)
    assert all(float(r["us"]) > 0 and float(r["errRatio"]) == 0.0 for r in rows)
    profile = read_csv_rows(prof)[1]
    for r in rows:  # the winner is the fastest valid candidate of the profile
        cands = [p for p in profile if p["M"] == r["M"]]
        assert len(cands) >= 4 and all(p["status"] == "ok" for p in cands)
        assert {BlockscaleConfig.from_name(p["kernelName"]).variant for p in cands} <= {"swapAB", "base"}
        assert r["kernelName"] == min(cands, key=lambda p: float(p["us"]))["kernelName"]
        cfg = BlockscaleConfig.from_name(r["kernelName"])
        assert int(r["splitK"]) == (cfg.NUM_KSPLIT if cfg.NUM_KSPLIT > 1 else 0)
    (jpath,) = jdir.iterdir()
    assert jpath.name == "cpu-GEMM-A8W8_BLOCKSCALE-N=256-K=256.json"
    body = json.loads(jpath.read_text())
    assert list(body) == ["M_LEQ_1", "M_LEQ_33", "any"]
    assert BlockscaleConfig.from_json(body["M_LEQ_33"]).name == rows[1]["kernelName"] == \
        BlockscaleConfig.from_json(body["any"]).name

    clean_runtime.setenv("AITER_CONFIG_GEMM_A8W8_BLOCKSCALE", str(tuned))
    clean_runtime.setenv("AITER_GEMM_TRITON_CONFIGS", str(jdir))
    aiter_gemm.reload_configs()
    for r in rows:  # tuned M: the CSV row
        got = get_GEMM_A8W8_BLOCKSCALE_config(int(r["M"]), 256, 256, on_gpu=False)
        assert (got["matched"], got["kernelName"]) == ("exact", r["kernelName"])
        assert got["source"].startswith(str(tuned))
    # M = 20 misses the CSV at every level (20, padded 32, 32): the JSON bucket M_LEQ_33.
    got = get_GEMM_A8W8_BLOCKSCALE_config(20, 256, 256, on_gpu=False)
    assert (got["matched"], got["kernelName"]) == ("json", rows[1]["kernelName"])
    assert got["source"] == f"{jpath}#M_LEQ_33"
    XQ, WQ, xs, ws = quantize_blockscale(torch.randn(20, 256), torch.randn(256, 256) / 16)
    torch.testing.assert_close(gemm_a8w8_blockscale(XQ, WQ, xs, ws).float(),
                               gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws).float(), rtol=1e-2, atol=1e-2)


def test_faulty_candidates_are_recorded_failed_and_a_valid_config_wins(tmp_path):
    tuned, prof = tmp_path / "tuned.csv", tmp_path / "profile.csv"
    # (a worker's os._exit is the same death as its SIGKILL for the pool: test_gradlib_e2e covers both)
    names = ["fake_raises", "fake_hangs", "fake_sigkill", "fake_zeros", "fake_nan", "fake_wrong_shape", SWAP16]
    # --timeout: what fake_hangs costs; SWAP16, the first Triton launch of a restarted worker, took 0.23 s here and
    # 1.05 s with two busy loops on this 2-core machine, so 3 s was a 3x margin against load: 10 s.
    assert _run("--nk", "128,128", "--m", "3", "--candidates", ",".join(names), "-o", tuned,
                "--profile_file", prof, "--timeout", "10") == 0
    (row,) = read_csv_rows(tuned)[1]
    assert row["kernelName"] == SWAP16 and row["kernelId"] == str(names.index(SWAP16))
    status = {p["kernelName"]: (p["status"], p["error"]) for p in read_csv_rows(prof)[1]}
    assert sorted(status) == sorted(names)
    expected = {"fake_raises": "fake kernel launch failure", "fake_hangs": "timed out after 10 s",
                "fake_sigkill": "signal 9", "fake_wrong_shape": "returned (3, 127)"}
    for name, msg in expected.items():
        assert status[name][0] == "failed" and msg in status[name][1], (name, status[name])
    assert status["fake_zeros"][0] == status["fake_nan"][0] == "inaccurate"
    assert status[SWAP16] == ("ok", "")


def test_two_workers_split_one_shape_and_every_candidate_reports_once(tmp_path):
    tuned, prof = tmp_path / "tuned.csv", tmp_path / "profile.csv"
    names = ["fake_raises", SWAP16, "fake_zeros", "swapAB-BM16_BN128_BK128_GM1_SK1_W4_S4_TMA", "fake_nan"]
    assert _run("--nk", "128,128", "--m", "2", "--candidates", ",".join(names), "-o", tuned, "--profile_file", prof,
                "--mp", "2") == 0  # chunks of 3 and 2 candidates, one per worker
    status = {p["kernelName"]: p["status"] for p in read_csv_rows(prof)[1]}
    assert status == {"fake_raises": "failed", SWAP16: "ok", "fake_zeros": "inaccurate", names[3]: "ok",
                      "fake_nan": "inaccurate"}
    (row,) = read_csv_rows(tuned)[1]
    assert row["kernelName"] in (SWAP16, names[3])


def test_ray_flag_follows_the_bf16_tuner():
    """``--ray`` is gemm-tuner's flag, passed to the same executor factory (present once gemm-tuner has it)."""
    from gradlib.tune_a8w8_blockscale import build_parser

    def flags(parser):
        return {s for a in parser._actions for s in a.option_strings}

    assert ("--ray" in flags(build_parser())) == ("--ray" in flags(gemm_tuner.build_parser()))


def test_sigkill_then_resume_tunes_each_shape_once_and_completes_the_json(tmp_path):
    ms = [1, 2, 3, 4]
    tuned, jdir = tmp_path / "tuned.csv", tmp_path / "json"
    cmd = [sys.executable, "-m", "gradlib.tune_a8w8_blockscale", "--nk", "128,128", "--m", ",".join(map(str, ms)),
           "--candidates", f"{SWAP16},fake_slow_exact", "-o", str(tuned), "--json_dir", str(jdir), "--batch", "1",
           "--plugin", PLUGIN]

    def no_json_yet():
        assert not jdir.exists()  # the (N, K) never finished: no JSON yet

    env = repo_env(CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1", GRADLIB_FAKES_HOLD=str(tmp_path / "hold"))
    kill_then_resume(cmd, env, tmp_path, tuned, ms, lambda r: int(r["M"]), 1, no_json_yet)
    body = json.loads((jdir / "cpu-GEMM-A8W8_BLOCKSCALE-N=128-K=128.json").read_text())
    assert list(body) == [f"M_LEQ_{m}" for m in ms] + ["any"]  # rows from both runs


def test_seed_buckets_rewrite_from_the_csv_without_retuning(tmp_path, capsys):
    tuned, jdir = tmp_path / "tuned.csv", tmp_path / "json"
    header = "gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName,tflops,bw,errRatio\n"
    lines = [f"cpu,{os.cpu_count()},{m},128,128,triton,0,0,5.0,{name},0,0,0\n"
             for m, name in ((1, SWAP16), (16, SWAP16), (512, BASE64))]
    tuned.write_text(header + "".join(lines))
    assert _run("--nk", "128,128", "--m", "1,16,512", "-o", tuned, "--json_dir", jdir, "--buckets", "seed") == 0
    assert "0 tuned, 3 skipped" in capsys.readouterr().out
    body = json.loads((jdir / "cpu-GEMM-A8W8_BLOCKSCALE-N=128-K=128.json").read_text())
    # no timings in this run: each category takes its largest tuned M's winner; large_M repeats medium_M
    assert {k: BlockscaleConfig.from_json(v).name for k, v in body.items()} == \
        {"small_M": SWAP16, "medium_M": BASE64, "large_M": BASE64}


# ---- pieces ----------------------------------------------------------------------------------------------------------
def test_json_skips_rows_the_runtime_would_not_use(tmp_path):
    """A row with an unusable time or an unknown libtype is not a tuned config: the JSON buckets leave it out."""
    from aiter_gemm.device import DeviceIdentity
    from gradlib.blockscale import JsonSidecar

    tuned = tmp_path / "tuned.csv"
    tuned.write_text("gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName,tflops,bw,errRatio\n"
                     f"cpu,4,1,128,128,triton,0,0,5.0,{SWAP16},0,0,0\n"
                     f"cpu,4,16,128,128,triton,0,0,nan,{SWAP16},0,0,0\n"
                     f"cpu,4,32,128,128,ck,0,0,2.0,{BASE64},0,0,0\n")
    sidecar = JsonSidecar(DeviceIdentity("cpu", 4, "cpu"), tuned, [])
    assert {m: c.name for m, c in sidecar.tuned_configs(128, 128).items()} == {1: SWAP16}


def test_seed_buckets_pick_the_best_geomean_over_each_category():
    a, b, c = SWAP16, BASE64, "base-BM64_BN128_BK128_GM1_SK1_W4_S4_TMA"
    best = {1: BlockscaleConfig.from_name(a), 64: BlockscaleConfig.from_name(b), 4096: BlockscaleConfig.from_name(c)}
    # small_M: a wins M=1 by 10% but loses M=64 by 50%; b is within 5% at both: b. large_M: only c ran.
    times = {1: {a: 10.0, b: 10.5}, 64: {a: 30.0, b: 20.0}, 4096: {c: 100.0}}
    got = {k: v.name for k, v in seed_buckets(best, times).items()}
    assert got == {"small_M": b, "large_M": c}
    assert [k for k, _ in SEED_BUCKETS] == ["small_M", "medium_M", "large_M"]


@pytest.mark.parametrize("name,ok,error", [
    (SWAP16, True, ""),
    ("fake_raises", False, "fake kernel launch failure"),
    ("fake_zeros", False, "> 0.01 (not timed)"),
    ("base-BM64_BN64_BK128_GM1_SK2_W4_S4_TMA", False, "variant base needs NUM_KSPLIT == 1"),
    ("splitK-BM64_BN64_BK128_GM1_SK4_W4_S4_TMA", False, "NUM_KSPLIT=4 exceeds the 2 K blocks"),
    ("splitK_swapAB-BM16_BN64_BK128_GM1_SK2_W4_S4_TMA", True, ""),
    ("splitK-BM64_BN64_BK128_GM1_SK2_W4_S4_TMA", True, ""),
])
def test_job_kind_runs_in_the_worker_runtime(name, ok, error):
    from gradlib.tune_a8w8_blockscale import CPU_TIMING

    rt = WorkerRuntime.create()
    from aiter_gemm.backends.base import GemmProblem

    task = Task(7, 0, TIME, GemmProblem(5, 64, 256, False, torch.float8_e4m3fn, torch.bfloat16),
                (candidate_solution(name),), CPU_TIMING, check=True, max_err=0.01, op=BLOCKSCALE)
    res = rt.run_item(task, 0)
    assert isinstance(res, ItemResult) and (res.task_id, res.index, res.ok) == (7, 0, ok)
    assert error in res.error
    assert (res.us > 0 and math.isfinite(res.us) and res.err_ratio == 0.0) if ok else math.isinf(res.us)


def test_unknown_job_kind_is_rejected():
    from aiter_gemm.backends.base import GemmProblem

    with pytest.raises(ValueError, match="registered kind"):
        Task(0, 0, "no_such_kind", GemmProblem(1, 1, 1), ())


# ---- shapes ----------------------------------------------------------------------------------------------------------
DEEPSEEK_V3 = {  # the numbers of deepseek-ai/DeepSeek-V3's config.json that the projections use
    "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "first_k_dense_replace": 3, "vocab_size": 129280,
}


def _printed(capsys) -> list[tuple[int, int, int]]:
    return _printed_text(capsys.readouterr().out)


def test_model_dir_llama_and_deepseek_shapes(tmp_path, capsys):
    assert main(["--model_dir", str(REPO / "configs/model_configs/llama3_70b"), "--m", "16", "--print_shapes"]) == 0
    assert _printed(capsys) == [(16, 10240, 8192), (16, 8192, 8192), (16, 57344, 8192), (16, 8192, 28672)]
    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK_V3))
    assert main(["--model_dir", str(tmp_path), "--tp", "8", "--m", "1,64", "--print_shapes"]) == 0
    nk = [(2112, 7168), (3072, 1536), (4096, 512), (7168, 2048), (4608, 7168), (7168, 2304), (512, 7168),
          (7168, 256)]
    assert _printed(capsys) == [(m, n, k) for n, k in nk for m in (1, 64)]
    no_lora = {**DEEPSEEK_V3, "q_lora_rank": None, "n_shared_experts": 0}
    names = [(p.name, p.N, p.K) for p in deepseek_projections(no_lora, 1)]
    assert names[:2] == [("q", 128 * 192, 7168), ("kv_a", 576, 7168)]
    assert [n for n, _, _ in names] == ["q", "kv_a", "kv_b", "o", "gate_up", "down"]
    with pytest.raises(ValueError, match="not divisible by --tp 3"):
        model_projections(str(tmp_path), 3)


# The shipped FP8 model configs (configs only) against shapes written out independently: DeepSeek-V3 at TP 8 is
# AITER's ds_v3 list (above); the Qwen3 FP8 checkpoints are benchmarks.shapes' held-out set.
SHIPPED_FP8 = {("qwen3_8b_fp8", 1): [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)],
               ("qwen3_32b_fp8", 1): [(10240, 5120), (5120, 8192), (51200, 5120), (5120, 25600)],
               ("qwen3_32b_fp8", 4): [(2560, 5120), (5120, 2048), (12800, 5120), (5120, 6400)],
               ("deepseek_v3", 8): [(2112, 7168), (3072, 1536), (4096, 512), (7168, 2048), (4608, 7168),
                                    (7168, 2304), (512, 7168), (7168, 256)]}


@pytest.mark.parametrize("name,tp", sorted(SHIPPED_FP8))
def test_shipped_fp8_model_configs(name, tp, capsys):
    assert main(["--model_dir", name, "--tp", str(tp), "--m", "16", "--print_shapes"]) == 0
    out = capsys.readouterr()
    assert _printed_text(out.out) == [(16, n, k) for n, k in SHIPPED_FP8[name, tp]]
    assert ("routed experts (n_routed_experts=256" in out.err) == (name == "deepseek_v3")
    assert "not covered" in out.err if name == "deepseek_v3" else out.err == ""
    cfg = json.loads((REPO / "configs/model_configs" / name / "config.json").read_text())
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128]
    assert not list((REPO / "configs/model_configs" / name).glob("*.csv")), "config folders hold no tuned table"


@pytest.mark.parametrize("qcfg,field", [
    ({"quant_method": "fp8", "weight_block_size": [64, 64]}, "quantization_config.weight_block_size is [64, 64]"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, "weight_block_size is None"),
    ({"quant_method": "awq", "bits": 4}, "quantization_config.quant_method is 'awq'"),
    ("fp8", "quantization_config must be an object"),
])
def test_model_dir_rejects_other_fp8_layouts(tmp_path, capsys, qcfg, field):
    cfg = json.loads((REPO / "configs/model_configs/qwen3_8b_fp8/config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "quantization_config": qcfg}))
    assert main(["--model_dir", str(tmp_path), "--m", "1", "--print_shapes"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "config.json") in err and field in err


def test_model_dir_llama_style_moe_has_no_dense_mlp(tmp_path, capsys):
    cfg = {**json.loads((REPO / "configs/model_configs/qwen3_8b_fp8/config.json").read_text()),
           "model_type": "qwen3_moe", "num_experts": 128, "moe_intermediate_size": 768}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["--model_dir", str(tmp_path), "--m", "2", "--print_shapes"]) == 0
    out = capsys.readouterr()
    assert _printed_text(out.out) == [(2, 6144, 4096), (2, 4096, 4096)], "attention only: the MLP is all experts"
    assert "routed experts (num_experts=128, moe_intermediate_size=768)" in out.err


def _printed_text(text: str) -> list[tuple[int, int, int]]:
    lines = text.splitlines()
    assert lines[0] == "M,N,K"
    return [tuple(map(int, line.split(","))) for line in lines[1:]]


def test_shapes_csv_nk_and_usage_errors(tmp_path, capsys):
    untuned = tmp_path / "untuned.csv"
    untuned.write_text("M,N,K\n16, 1536, 7168\n16, 576, 7168\n32, 1536, 7168\n")  # AITER's spacing
    assert main(["--shapes", str(untuned), "--nk", "576,7168", "--m", "16,1", "--print_shapes"]) == 0
    assert _printed(capsys) == [(16, 1536, 7168), (16, 576, 7168), (32, 1536, 7168), (1, 576, 7168)]
    assert main(["--print_shapes"]) == 2
    assert "no shapes" in capsys.readouterr().err
    untuned.write_text("M,N\n1,2\n")
    assert main(["--shapes", str(untuned), "--print_shapes"]) == 2
    assert "missing column(s) ['K']" in capsys.readouterr().err
    for loose in ("1_6", "\u0661\u0666"):  # issue 47: int() read 16 from both
        untuned.write_text(f"M,N,K\n{loose},1536,7168\n")
        assert main(["--shapes", str(untuned), "--print_shapes"]) == 2
        assert f"{untuned}:2: M, N, K must be integers" in capsys.readouterr().err
    assert main(["--nk", "128,128", "--variants", "nosuch", "-o", str(tmp_path / "t.csv")]) == 2
    assert "--variants ['nosuch']" in capsys.readouterr().err
    assert main(["--nk", "128,128", "--candidates", "bogus", "-o", str(tmp_path / "t.csv")]) == 2
    assert "neither kernelNames nor registered launchers" in capsys.readouterr().err


# ---- GPU ------------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_tuner_writes_rows_the_op_replays(tmp_path, clean_runtime):
    import aiter_gemm
    from aiter_gemm.ops.a8w8_blockscale import get_GEMM_A8W8_BLOCKSCALE_config

    tuned, jdir = tmp_path / "tuned.csv", tmp_path / "json"
    assert main(["--nk", "1024,1024", "--m", "16,256", "--quick", "-o", str(tuned), "--json_dir", str(jdir),
                 "--mp", "1"]) == 0
    rows = read_csv_rows(tuned)[1]
    props = torch.cuda.get_device_properties(0)
    assert len(rows) == 2 and all(r["cu_num"] == str(props.multi_processor_count) for r in rows)
    clean_runtime.setenv("AITER_CONFIG_GEMM_A8W8_BLOCKSCALE", str(tuned))
    aiter_gemm.reload_configs()
    for r in rows:
        got = get_GEMM_A8W8_BLOCKSCALE_config(int(r["M"]), 1024, 1024, on_gpu=True)
        assert (got["matched"], got["kernelName"]) == ("exact", r["kernelName"])
    assert len(list(jdir.glob(f"{rows[0]['gfx']}-GEMM-A8W8_BLOCKSCALE-N=1024-K=1024.json"))) == 1


def test_keep_class_rows_tunes_beside_the_class_row(tmp_path, capsys):
    """The block-scale tuner's ``--keep_class_rows``: a shape served by a row naming no device is tuned on this
    device and written beside it; the (N, K)'s JSON file, which every device of the arch reads, is built from the
    class rows alone (without the flag, ``--all`` replaces the row and the JSON follows this device's winner)."""
    tuned, jdir = tmp_path / "tuned.csv", tmp_path / "json"
    tuned.write_text("gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName,tflops,bw,errRatio,pad_m_min,timing,"
                     f"device_name\ncpu,{os.cpu_count()},1,128,128,triton,0,0,5.0,{BASE64},0,0,0.0,1,graph,\n")
    args = ("--nk", "128,128", "--m", "1", "--candidates", SWAP16, "-o", tuned, "--json_dir", jdir)

    def state() -> tuple[list[tuple[str, str]], str]:
        rows = [(r["device_name"], r["kernelName"]) for r in read_csv_rows(tuned)[1]]
        body = json.loads((jdir / "cpu-GEMM-A8W8_BLOCKSCALE-N=128-K=128.json").read_text())
        return rows, body["M_LEQ_1"]["variant"]

    assert _run(*args) == 0 and "0 tuned, 1 skipped" in capsys.readouterr().out
    assert _run(*args, "--keep_class_rows") == 0 and "1 tuned, 0 skipped" in capsys.readouterr().out
    assert state() == ([("", BASE64), ("cpu", SWAP16)], "base")
    assert _run(*args, "--all") == 0
    assert state() == ([("cpu", SWAP16)], "swapAB")
