"""The benchmark harness (``python -m benchmarks.run``) on CPU: tiny shapes, a timer that returns set times (no test
depends on how fast anything runs), the report's tables from raw files, and BENCHMARKS.md's tables against the
committed raw files they quote."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import torch

from aiter_gemm import triton_launch
from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.kernels.blockscale_format import FP8_ROUNDING
from benchmarks import legacy, providers, report
from benchmarks.providers import A16W16, BLOCKSCALE, Provider
from benchmarks.run import main
from benchmarks.shapes import build_sets, problem

REPO = Path(__file__).resolve().parents[1]
H100 = DeviceIdentity("sm_90", 132, "cuda", "NVIDIA H100 80GB HBM3")
TINY_MODEL = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 1000, "head_dim": 16}


class FakeTimer:
    """Per provider (by its name before ``:``) a base time, three rounds at 1.0 / 1.1 / 0.9 of it: paired ratios are
    exact. Records what it was asked to time."""

    def __init__(self, base: dict[str, float]) -> None:
        self.base, self.seen = base, []

    def paired(self, calls, n_sets, mode):
        self.seen.append((mode, tuple(calls)))
        return {k: [self.base.get(k.partition(":")[0], 10.0) * f for f in (1.0, 1.1, 0.9)] for k in calls}

    def host(self, call, n_sets):
        call(0)
        self.seen.append(("host", call))
        return 7.0, 3.0


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_bf16_bench_pairs_each_provider_with_the_baseline(tmp_path, clean_runtime):
    """Every provider that runs correctly is timed and paired with the baseline; one giving wrong numbers is not
    timed, one that cannot run says why; the CSV and the environment are written."""
    clean_runtime.setitem(providers._REGISTRY, (A16W16, "broken"), Provider(
        "broken", A16W16, "zeros", lambda ctx, arg: (lambda i: torch.zeros(ctx.problem.M, ctx.problem.N))))
    timer = FakeTimer({"flinear": 10.0, "dispatch": 5.0, "torch": 8.0})
    assert main(["--bench", "bf16", "--set", "tiny", "--providers", "flinear,dispatch,torch,broken,maxautotune",
                 "--timing", "graph,eager", "--device", "cpu", "--out", str(tmp_path)], timer) == 0
    rows = _rows(tmp_path / "bf16_cpu.csv")
    env = json.loads((tmp_path / "bf16_cpu_env.json").read_text())
    assert env["bench"] == "bf16" and env["modes"] == ["graph", "eager"] and env["torch"] == torch.__version__
    assert "--providers flinear,dispatch,torch,broken,maxautotune" in env["command"] and env["shapes"] == 3
    assert {(m, names) for m, names in timer.seen} == {(m, ("flinear", "dispatch", "torch")) for m in
                                                        ("graph", "eager")}
    disp = [r for r in rows if r["provider"] == "dispatch"]
    assert len(disp) == 6 and {r["ratio"] for r in disp} == {"2.0000"} and {r["vs"] for r in disp} == {"flinear"}
    assert {r["matched"] for r in disp} == {"default"} and all(float(r["rel_err"]) < 1e-2 for r in disp)
    assert {r["ratio"] for r in rows if r["provider"] == "torch"} == {"1.2500"}
    assert all(r["vs"] == "" and r["us"] == "10.0000" for r in rows if r["provider"] == "flinear")
    broken = [r for r in rows if r["provider"] == "broken"]
    assert len(broken) == 6 and all(r["note"] == "wrong result: not timed" and r["us"] == "" for r in broken)
    assert all(r["note"].startswith("unavailable: max-autotune is timed on a GPU") for r in rows
               if r["provider"] == "maxautotune")


def test_a_failing_provider_or_timing_ends_only_its_rows(tmp_path, clean_runtime):
    """A provider that raises while building, or a timing that raises, is written as a row saying so; the run goes
    on with the other providers, modes and shapes."""
    def explode(ctx, arg):
        raise RuntimeError("no kernel for this shape")

    clean_runtime.setitem(providers._REGISTRY, (A16W16, "explodes"), Provider("explodes", A16W16, "raises", explode))

    class FlakyTimer(FakeTimer):
        def paired(self, calls, n_sets, mode):
            if mode == "eager":
                raise RuntimeError("capture failed")
            return super().paired(calls, n_sets, mode)

    assert main(["--bench", "bf16", "--set", "tiny", "--m", "1,17", "--providers", "flinear,explodes,dispatch",
                 "--timing", "graph,eager", "--device", "cpu", "--out", str(tmp_path)], FlakyTimer({})) == 0
    rows = _rows(tmp_path / "bf16_cpu.csv")
    assert {r["note"] for r in rows if r["provider"] == "explodes"} == {"error: RuntimeError: no kernel for this shape"}
    eager = [r for r in rows if r["mode"] == "eager" and r["provider"] != "explodes"]
    assert len(eager) == 4 and {r["note"] for r in eager} == {"timing failed: RuntimeError: capture failed"}
    assert len([r for r in rows if r["mode"] == "graph" and r["us"]]) == 4


def test_host_mode_and_a_deadline(tmp_path, clean_runtime):
    """``--timing host`` reports host and GPU us per call; past ``--deadline_s`` no shape starts, and the CSV left
    behind is valid (header only) with the skipped shapes named in the environment."""
    assert main(["--bench", "bf16", "--set", "tiny", "--m", "1", "--timing", "host", "--device", "cpu",
                 "--out", str(tmp_path)], FakeTimer({})) == 0
    rows = _rows(tmp_path / "bf16_cpu.csv")
    assert [(r["provider"], r["us"], r["gpu_us"]) for r in rows] == [
        ("flinear", "7.0000", "3.0000"), ("dispatch", "7.0000", "3.0000")]
    assert main(["--bench", "bf16", "--set", "tiny", "--deadline_s", "0", "--device", "cpu", "--out",
                 str(tmp_path / "late")], FakeTimer({})) == 0
    assert _rows(tmp_path / "late" / "bf16_cpu.csv") == []
    assert len(json.loads((tmp_path / "late" / "bf16_cpu_env.json").read_text())["skipped"]) == 3


def test_fp8_bench_against_two_baselines(tmp_path, clean_runtime):
    """The block-scale op against torch's block-scaled matmul (not on CPU: said so) and bf16 F.linear."""
    timer = FakeTimer({"torch_blockscale": 12.0, "flinear": 9.0, "dispatch": 6.0})
    assert main(["--bench", "fp8", "--set", "tiny", "--m", "16", "--baselines", "torch_blockscale,flinear",
                 "--timing", "graph", "--device", "cpu", "--out", str(tmp_path)], timer) == 0
    rows = _rows(tmp_path / "fp8_cpu.csv")
    assert rows[0]["provider"] == "torch_blockscale" and rows[0]["note"].startswith("unavailable:")
    disp = [r for r in rows if r["provider"] == "dispatch"]
    assert [(r["vs"], r["ratio"]) for r in disp] == [("flinear", "1.5000")]
    assert float(disp[0]["rel_err"]) < 1e-2 and disp[0]["libtype"] == "triton"


def test_weight_read_floor_is_timed_not_checked(tmp_path, clean_runtime):
    """``weight_read`` (reading the weight once) is a floor: timed beside the op, its output never compared, and the
    op's ratio against it is the fraction of that floor the op reaches."""
    timer = FakeTimer({"weight_read": 4.0, "dispatch": 5.0})
    assert main(["--bench", "fp8", "--set", "tiny", "--m", "3", "--providers", "dispatch,weight_read", "--baselines",
                 "weight_read", "--timing", "graph", "--device", "cpu", "--out", str(tmp_path)], timer) == 0
    rows = _rows(tmp_path / "fp8_cpu.csv")
    floor = [r for r in rows if r["provider"] == "weight_read"]
    assert floor and all(r["rel_err"] == "" and r["note"] == "" and float(r["us"]) == 4.0 for r in floor)
    assert {(r["vs"], r["ratio"]) for r in rows if r["provider"] == "dispatch"} == {("weight_read", "0.8000")}


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bfloat16])
@pytest.mark.parametrize("N,K", [(1, 128), (3, 256), (17, 384), (97, 4100), (4100, 128)])
def test_weight_read_kernel_reads_every_byte(N, K, dtype):
    from benchmarks.read_floor import read_weight, read_weight_ref

    w = torch.randn(N, K).to(dtype)
    got = read_weight(w)
    assert torch.equal(got, read_weight_ref(w))
    w2 = w.clone()
    w2.view(torch.uint8).view(-1)[-1] ^= 1  # the last byte is read too
    assert not torch.equal(read_weight(w2), got)


def test_weight_read_rejects_what_it_cannot_stream():
    from benchmarks.read_floor import read_weight

    with pytest.raises(ValueError, match=r"shape \(8, 64\) dtype torch.bfloat16 stride \(1, 8\)"):
        read_weight(torch.zeros(64, 8, dtype=torch.bfloat16).t())
    with pytest.raises(ValueError, match="multiple of 4 bytes"):
        read_weight(torch.zeros(3, 1, dtype=torch.float8_e4m3fn))


def test_moe_bench_pairs_the_op_with_grouped_mm_its_default_and_the_floor(tmp_path, clean_runtime):
    """``--bench moe`` on tiny experts (interpreted Triton on CPU): the op, its untuned default, torch's experts, an
    explicit Triton pair and transformers' grouped_mm, each checked against the float32 reference and paired with
    grouped_mm and the weight-read floor; the rows name T as M, I as N, H as K, the experts and topk."""
    pair = "moe_BM16_BN32_BK64_GM1_SK1_W4_S2;moe_BM16_BN64_BK64_GM1_SK1_W4_S2"
    timer = FakeTimer({"grouped_mm": 12.0, "default": 8.0, "dispatch": 6.0, "torch": 9.0, "triton": 5.0,
                       "weight_read": 3.0})
    assert main(["--bench", "moe", "--set", "tiny", "--m", "5", "--providers",
                 f"grouped_mm,default,dispatch,torch,triton:{pair},weight_read", "--baselines",
                 "grouped_mm,weight_read", "--timing", "graph", "--device", "cpu", "--out", str(tmp_path)], timer) == 0
    rows = _rows(tmp_path / "moe_cpu.csv")
    assert {(r["M"], r["N"], r["K"], r["experts"], r["topk"], r["label"]) for r in rows} == {
        ("5", "64", "128", "4", "2", "tiny")}
    assert all(r["note"] == "" for r in rows), [r["note"] for r in rows]
    ratio = {(r["provider"], r["vs"]): r["ratio"] for r in rows}
    assert ratio[("dispatch", "grouped_mm")] == "2.0000" and ratio[("dispatch", "weight_read")] == "0.5000"
    assert ratio[(f"triton:{pair}", "grouped_mm")] == "2.4000" and ratio[("default", "grouped_mm")] == "1.5000"
    assert all(float(r["rel_err"]) < 2e-2 for r in rows if r["provider"] != "weight_read")
    assert all(r["rel_err"] == "" for r in rows if r["provider"] == "weight_read")
    disp = [r for r in rows if r["provider"] == "dispatch"]
    assert {(r["matched"], r["libtype"]) for r in disp} == {("default", "torch")}  # no table: CPU's default


def test_fp8_experts_may_keep_the_intermediate_unquantized_but_not_be_wrong(tmp_path, clean_runtime):
    """FP8 experts against the op's reference (intermediate quantized): a path keeping the intermediate unquantized
    (``FUSED``'s arithmetic, one fp8 rounding off) is timed; one a further rounding off is not."""
    from aiter_gemm.backends.base import ACT_TYPES, QUANT_BLOCK, MoeProblem
    from aiter_gemm.kernels.blockscale_format import FP8
    from aiter_gemm.kernels.fused_moe import fused_moe_ref
    from benchmarks.measure import GemmBench
    from benchmarks.providers import MOE

    def unquantized(scale):
        def build(ctx, arg):
            x, w1, w2, tw, ti, s1, s2 = ctx.sets[0]
            out = fused_moe_ref(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2, quant_inter=False)
            return lambda i: out * scale
        return build

    for name, scale in (("inter", 1.0), ("off", 1.0 + 2 * FP8_ROUNDING)):
        clean_runtime.setitem(providers._REGISTRY, (MOE, name), Provider(name, MOE, "", unquantized(scale)))
    p = MoeProblem(2, 256, 256, 4, 2, ACT_TYPES["silu"], torch.bfloat16, FP8, FP8, QUANT_BLOCK)
    bench = GemmBench("moe", MOE, [("fp8", ("fp8", p))], ["inter", "off"], ["inter"], ["graph"],
                      torch.device("cpu"), H100, FakeTimer({}), str(tmp_path / "moe.csv"))
    rows = {r["provider"]: r for r in bench.run()}
    assert rows["inter"]["us"] and float(rows["inter"]["rel_err"]) > providers.MAX_REL_ERR, rows["inter"]
    assert rows["off"]["note"] == "wrong result: not timed"


def test_moe_sets_and_the_floors_bytes():
    """The MoE sets of record (T 1..4096) with their dtype option; the floor reads the reached experts' bytes."""
    from aiter_gemm.ops.fused_moe import make_inputs
    from benchmarks.providers import MOE, reached_bytes

    sets = {name: build_sets(MOE, name, None, H100) for name in
            ("moe_qwen3_30b", "moe_mixtral:fp8", "moe_dsv3_ep8", "moe_dsv3_ep8:bf16")}
    assert all(len(v) == 11 for v in sets.values())
    got = {name: {(lab, p.model_dim, p.inter_dim, p.expert, p.topk, p.fp8) for _, (lab, p) in v}
           for name, v in sets.items()}
    assert got == {"moe_qwen3_30b": {("moe_qwen3_30b_bf16", 2048, 768, 128, 8, False)},
                   "moe_mixtral:fp8": {("moe_mixtral_fp8", 4096, 14336, 8, 2, True)},
                   "moe_dsv3_ep8": {("moe_dsv3_ep8_fp8", 7168, 2048, 32, 8, True)},
                   "moe_dsv3_ep8:bf16": {("moe_dsv3_ep8_bf16", 7168, 2048, 32, 8, False)}}
    assert [p.token for _, (_, p) in sets["moe_qwen3_30b"]] == [1, 2, 4, 8, 16, 32, 64, 128, 512, 1024, 4096]
    with pytest.raises(ValueError, match="moe_mixtral takes one of :bf16, :fp16, :fp8"):
        build_sets(MOE, "moe_mixtral:int4", None, H100)
    with pytest.raises(ValueError, match="no gemm_a16w16 shapes"):
        build_sets(A16W16, "moe_mixtral", None, H100)
    (_, (_, p)), = build_sets(MOE, "tiny", [1], H100)
    inputs = make_inputs(p, 0, torch.device("cpu"), 0, {}).sets[0]
    per_expert = (2 * 64 * 128 + 128 * 64) * 2  # w1 (2I, H) and w2 (H, I) in bf16
    assert reached_bytes(inputs) == len(set(inputs[4].flatten().tolist())) * per_expert == 2 * per_expert


def test_bad_arguments_exit_2_naming_the_problem(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--bench", "bf16", "--providers", "flinear,nosuch", "--device", "cpu", "--out", str(tmp_path)])
    assert e.value.code == 2 and "no provider 'nosuch'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--bench", "bf16", "--timing", "graph", "--device", "cpu", "--out", str(tmp_path)])
    assert e.value.code == 2 and "need a CUDA device" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--bench", "bf16", "--baselines", "torch", "--set", "tiny", "--device", "cpu", "--out", str(tmp_path)])
    assert e.value.code == 2 and "not among --providers" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--bench", "bf16", "--set", "nosuchset", "--device", "cpu", "--out", str(tmp_path)])
    assert e.value.code == 2 and "not a registered set" in capsys.readouterr().err


@pytest.mark.parametrize("argv,expected", [
    (["--out", "{file}"], "--out {file}: {file} is not a folder"),
    (["--set", "{tmp}/missing.csv"], "set '{tmp}/missing.csv': CSV not found"),
    (["--device", "cuda:99"], "argument --device: cuda:99: this "),
    (["--device", "tpu"], "argument --device: expected cpu, cuda or cuda:N, got 'tpu'"),
    (["--eager_pairs", "0"], "argument --eager_pairs: must be an integer >= 1, got '0'"),
    (["--pairs", "0"], "argument --pairs: must be an integer >= 1, got '0'"),
    (["--deadline_s", "-1"], "argument --deadline_s: must be a number >= 0, got '-1'"),
    (["--providers", "flinear,configs:{tmp}/nonexistent"],
     "provider 'configs:{tmp}/nonexistent': {tmp}/nonexistent/bf16_tuned_gemm.csv not found"),
    (["--providers", "flinear,configs"], "provider 'configs': needs the folder of a configs/ copy (configs:<DIR>)"),
    (["--providers", "flinear,dispatch:x"], "provider 'dispatch:x': takes no argument (got 'x')"),
    (["--bench", "overhead", "--calls", "0"], "argument --calls: must be an integer >= 1, got '0'"),
])
def test_bad_arguments_exit_2_before_anything_runs(tmp_path, capsys, argv, expected):
    """Issue 47: each of these was a traceback (or, for the providers, a run whose every row read "unavailable",
    exit 0) after the environment file was written; now argparse's usage and one line, and nothing written."""
    file = tmp_path / "a_file"
    file.write_text("x")
    fmt = {"file": file, "tmp": tmp_path}
    base = ["--bench", "bf16", "--set", "tiny", "--device", "cpu", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as e:
        main([*base, *(a.format(**fmt) for a in argv)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: ")
    assert err.splitlines()[-1].startswith(f"python -m benchmarks.run: error: {expected.format(**fmt)}"), err
    assert not (tmp_path / "out").exists() and file.read_text() == "x"


@pytest.mark.parametrize("argv,expected", [
    (["report", "{tmp}/missing.csv"], "python -m benchmarks.run report: error: {tmp}/missing.csv: not found"),
    (["report", "{tmp}/empty.csv"], "python -m benchmarks.run report: error: {tmp}/empty.csv: neither a harness CSV"),
    (["report", "{tmp}/empty.csv", "--table", "overhead_ab"],
     "python -m benchmarks.run report: error: {tmp}/empty.csv: is not a folder"),
    (["plot", "{tmp}/missing.csv", "--out", "{tmp}", "--stem", "s"],
     "python -m benchmarks.run plot: error: {tmp}/missing.csv: not found"),
    (["tables", "{tmp}/missing.md"], "python -m benchmarks.run tables: error: {tmp}/missing.md: not found"),
])
def test_report_of_a_missing_file_says_not_found(tmp_path, capsys, argv, expected):
    """``report missing.csv`` said "neither a harness CSV ... (header [])" in a traceback."""
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(SystemExit) as e:
        main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.splitlines()[-1].startswith(expected.format(tmp=tmp_path)), err


def test_shape_sets(tmp_path):
    """The sets of record have the shapes BENCHMARKS.md counts (on the H100's identity)."""
    counts = {(op, s): len(build_sets(op, s, None, H100)) for op, s in
              ((A16W16, "shipped"), (A16W16, "offgrid"), (A16W16, "heldout"), (BLOCKSCALE, "shipped"),
               (BLOCKSCALE, "offgrid"), (BLOCKSCALE, "dsv3"), (BLOCKSCALE, "llama3_70b_fp8"))}
    assert counts == {(A16W16, "shipped"): 112, (A16W16, "offgrid"): 56, (A16W16, "heldout"): 169,
                      (BLOCKSCALE, "shipped"): 70, (BLOCKSCALE, "offgrid"): 84, (BLOCKSCALE, "dsv3"): 42,
                      (BLOCKSCALE, "llama3_70b_fp8"): 28}
    model = build_sets(A16W16, "llama3_8b", [1, 16], H100)
    assert [(s, lab, p.M, p.N, p.K) for s, (lab, p) in model][:2] == [
        ("llama3_8b", "llama3_8b_tp1", 1, 6144, 4096), ("llama3_8b", "llama3_8b_tp1", 1, 4096, 4096)]
    assert len(model) == 8 and len(build_sets(A16W16, "llama3_70b:tp8+lm_head", [1], H100)) == 5
    (tmp_path / "mine.csv").write_text("M,N,K\n5,64,96\n5,64,96\n7,32,32\n")
    assert [(s, p.M) for s, (_, p) in build_sets(A16W16, str(tmp_path / "mine.csv"), None, H100)] == [
        ("mine", 5), ("mine", 7)]
    labels = {lab for _, (lab, _) in build_sets(A16W16, "shipped", None, H100)}
    assert labels == {"llama3_8b", "llama3_70b_tp8"}


def test_overhead_bench_cpu_restores_the_environment(tmp_path, clean_runtime):
    assert main(["--bench", "overhead", "--calls", "200", "--repeats", "3", "--device", "cpu",
                 "--out", str(tmp_path)]) == 0
    rows = _rows(tmp_path / "overhead_cpu.csv")
    assert [(r["label"], r["provider"], r["vs"]) for r in rows] == [
        ("exact", "dispatch", "flinear"), ("padded_gl0", "dispatch", "flinear"), ("default", "dispatch", "flinear"),
        ("exact_3d", "dispatch", "flinear"), ("exact_3d", "TunedLinear", "nn.Linear"),
        ("exact", "custom_op", "flinear")]
    assert "AITER_CONFIG_GEMM_BF16" not in os.environ


def test_overhead_ab_table(tmp_path):
    """``--table overhead_ab``: medians [min max] over the rounds of overhead_ab.sh's files, per path and side; other
    files in the folder are ignored, an empty folder is an error naming it."""
    head = "bench,mode,label,provider,vs,vs_us,us,added_us\n"
    for side, mode, rnd, added in [("A", "ext", 1, 0.5), ("A", "ext", 2, 0.1), ("A", "ext", 3, 0.3),
                                   ("B", "ext", 1, -0.2), ("B", "ext", 2, 0.0), ("B", "python", 1, 1.5)]:
        row = f"overhead,host,exact,dispatch,flinear,5,5,{added}\n"
        (tmp_path / f"{side}_{mode}_{rnd}_cpu.csv").write_text(head + row)
    (tmp_path / "A_ext_1_cpu_env.json").write_text("{}")
    assert report.overhead_ab([tmp_path]).splitlines()[2:] == [
        "| ext | exact | dispatch | 3 | +0.30 [+0.10 +0.50] | -0.10 [-0.20 +0.00] |",
        "| python | exact | dispatch | 0 |  | +1.50 [+1.50 +1.50] |"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty"):
        report.overhead_ab([tmp_path / "empty"])


def test_layer_bench(tmp_path, clean_runtime):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(TINY_MODEL))
    timer = FakeTimer({"flinear": 100.0, "dispatch": 80.0})
    assert main(["--bench", "layer", "--set", str(tmp_path / "m"), "--m", "1,5", "--timing", "graph,eager",
                 "--device", "cpu", "--out", str(tmp_path / "o")], timer) == 0
    rows = _rows(tmp_path / "o" / "layer_cpu.csv")
    assert [(r["M"], r["mode"], r["provider"], r["ratio"]) for r in rows] == [
        (m, mode, p, ratio) for m in ("1", "5") for mode in ("graph", "eager")
        for p, ratio in (("flinear", ""), ("dispatch", "1.2500"))]
    assert report.layer(rows).splitlines()[2] == "| 1 | eager | 100.0 | 80.0 | 1.250 |"


ROWS = [  # two shapes, graph and eager, the dispatch against F.linear
    {"bench": "bf16", "set": "heldout", "label": "m", "M": "1", "N": "64", "K": "32", "provider": "dispatch",
     "mode": "graph", "us": "5", "vs": "flinear", "vs_us": "6", "ratio": "1.2", "libtype": "skinny",
     "eager_libtype": "torch", "roof": "0.5"},
    {"bench": "bf16", "set": "heldout", "label": "m", "M": "300", "N": "64", "K": "32", "provider": "dispatch",
     "mode": "graph", "us": "5", "vs": "flinear", "vs_us": "4.85", "ratio": "0.97", "libtype": "torch",
     "eager_libtype": "torch", "roof": "0.8"},
    {"bench": "bf16", "set": "heldout", "label": "m", "M": "1", "N": "64", "K": "32", "provider": "dispatch",
     "mode": "eager", "us": "5", "vs": "flinear", "vs_us": "5", "ratio": "0.99", "libtype": "skinny",
     "eager_libtype": "torch"},
]


def test_report_tables():
    assert report.summary(ROWS).splitlines() == [
        "| bench | set | vs | mode | shapes | geomean | min (M, N, K) | below bar |",
        "|---|---|---|---|---:|---:|---|---:|",
        "| bf16 | heldout | flinear | graph | 2 | 1.079 | 0.970 (300, 64, 32) | 1 < 0.98 |",
        "| bf16 | heldout | flinear | eager | 1 | 0.990 | 0.990 (1, 64, 32) | 0 < 0.97 |"]
    assert report.mclass(ROWS, "dispatch", "flinear", "graph").splitlines()[2:] == [
        "| M <= 16 | 1 | 1.200 | 1.200 (1, 64, 32) |", "| M > 256 | 1 | 0.970 | 0.970 (300, 64, 32) |",
        "| all | 2 | 1.079 | 0.970 (300, 64, 32) |"]
    assert report.matrix(ROWS, "dispatch", "flinear", "graph", "ratio+lib").splitlines()[:3] == [
        "| label | N | K | M=1 | M=300 |", "|---|---:|---:|---:|---:|", "| m | 64 | 32 | 1.200 s | 0.970 f |"]
    assert report.identical_calls(ROWS + [{**ROWS[1], "M": "400", "ratio": "1.01"}]).splitlines()[2] == (
        "| bf16 vs flinear | graph | 2 | 0.990 | 0.972 | 1.008 | 0.970 | 1.010 |")


def test_identical_calls_cover_fp8_torch_decisions_in_graph_mode():
    """FP8 cells whose dispatch runs torch's block-scaled matmul in both modes are torch's kernel against itself
    (same copies, same kernel) in graph mode: the spread a default's ratio there is read against. Eagerly the
    dispatch's runner skips F.scaled_mm's wrapper (not identical host work); Triton decisions are not identical."""
    fp8 = {**ROWS[1], "bench": "fp8", "set": "third", "vs": "torch_blockscale"}
    rows = [{**fp8, "M": "17", "ratio": "0.97"}, {**fp8, "M": "24", "ratio": "1.05"},
            {**fp8, "M": "32", "ratio": "1.5", "libtype": "triton"},
            {**fp8, "M": "40", "ratio": "1.2", "mode": "eager"}]
    assert report.identical_calls(rows).splitlines()[2:] == [
        "| fp8 vs torch_blockscale | graph | 2 | 1.009 | 0.974 | 1.046 | 0.970 | 1.050 |"]


def test_fp8_default_provider_runs_the_ops_call(clean_runtime):
    """On an H200 the ``default`` provider runs what an untuned call of the op runs (graph and eager): at a padded M
    where the default is torch's kernel (issue 49's (17, 6144, 16384) class: M % 4 != 0, a row-major x_scale), the
    same operations with the same operands as ``dispatch`` and ``torch_blockscale``; at a decode tile, the op's
    capture-time choice under graphs and its eager choice eagerly."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import aiter_gemm
    from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl

    class Ops(TorchDispatchMode):  # every aten op of a call, with its tensors' shapes and strides
        def __init__(self) -> None:
            super().__init__()
            self.ops: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append((str(func), [(tuple(a.shape), a.stride()) for a in args if isinstance(a, torch.Tensor)]))
            return func(*args, **(kwargs or {}))

    def scaled_mm(a, b, sa, ra, sb, rb, *rest, output_dtype=torch.bfloat16, **kw):  # what cuBLASLt would be handed
        return torch.zeros(a.shape[0], b.shape[1], dtype=output_dtype)

    clean_runtime.setattr(torch.nn.functional, "scaled_mm", scaled_mm)
    clean_runtime.setattr(torch_impl, "unavailable_reason", lambda device: None)
    clean_runtime.setattr(triton_launch, "BINDS", False)  # Triton's launcher: eager calls run torch's
    h200 = DeviceIdentity("sm_90", 132, "cuda", "NVIDIA H200")
    disp = aiter_gemm.get_dispatcher(BLOCKSCALE)
    clean_runtime.setitem(disp._devices, False, h200)  # CPU tensors decided as on an H200
    for M, N, K, graph, eager in ((97, 4096, 4608, "torch", "torch"), (32, 4096, 14336, "triton", "torch")):
        p = GemmProblem(M, N, K, False, torch.float8_e4m3fn, torch.bfloat16)
        dec = disp.decide(p, False)
        assert (dec.matched, dec.solution.libtype, (dec.eager_solution or dec.solution).libtype) == (
            "default", graph, eager)
        for mode, want in (("graph", dec.solution), ("eager", dec.eager_solution or dec.solution)):
            assert disp.default_decision(p, h200, eager=mode == "eager").solution == want
    M, N, K = 97, 4096, 4608
    sets = [(torch.randn(M, K).to(torch.float8_e4m3fn), torch.randn(N, K).to(torch.float8_e4m3fn),
             torch.rand(M, K // 128), torch.rand(N // 128, K // 128))]
    p = GemmProblem(M, N, K, False, torch.float8_e4m3fn, torch.bfloat16)
    seen = {}
    for mode in ("graph", "eager"):
        for name in ("torch_blockscale", "default", "dispatch"):
            provider, arg = providers.resolve(BLOCKSCALE, name)
            call = provider.build(providers.Context(p, BLOCKSCALE, sets, h200, torch.device("cpu"), mode), arg)
            call(0)
            with Ops() as ops:
                call(0)
            seen[mode, name] = ops.ops
    first = seen["graph", "torch_blockscale"]
    assert sum(op == "aten.copy_.default" for op, _ in first) == 2  # XQ into 100 rows, x_scale M-major
    assert all(ops == first for ops in seen.values())


LEGACY = {  # header + one line of each raw format the harness replaced
    "heldout.csv": "set,model,M,N,K,method,mode,us,ref_us,ratio,ratio_q1,ratio_q3,libtype,eager_libtype,matched,"
                   "rel_err,rounds\nfp8,torch_blockwise,3,2112,7168,op,graph,10.0,11.0,1.1000,1.0,1.2,torch,torch,"
                   "json,1e-3,41\n",
    "tuned_gemm.csv": "model,M,N,K,bias,flinear_us,tuned_us,tuned_libtype,tuned_matched,compile_us,flinear_eager_us,"
                      "tuned_eager_us,roofline_us,flinear_roof,tuned_roof,compile_roof,speedup_tuned,speedup_compile,"
                      "best_by_backend\nllama3_8b_tp1,1,4096,4096,False,16,12,skinny,exact,14,20,21,11,0.69,0.92,"
                      "0.79,1.333,1.143,{}\n",
    "summary.csv": "M,N,K,best_config,us,bf16_linear_us,torch_blockscale_us,op_choice,op_matched,op_us\n"
                   "1,256,7168,base-BM16,7.5,6.0,15.0,triton:splitK-BM16,exact,7.5\n",
    "overhead.csv": "device,path,case,M,N,K,torch_us,call_us,added_us\nH100,TunedLinear module,exact_3d,8,64,64,"
                    "19.6,17.1,-2.269\n",
}


def test_legacy_raw_files_convert(tmp_path):
    out = {}
    for name, text in LEGACY.items():
        (tmp_path / name).write_text(text)
        out[name] = report.load_rows(tmp_path / name)
    assert [(r["set"], r["provider"], r["vs"], r["ratio"]) for r in out["heldout.csv"]] == [
        ("fp8", "dispatch", "torch_blockscale", "1.1000")]
    tuned = {(r["provider"], r.get("vs", ""), r["mode"]): r.get("ratio", "") for r in out["tuned_gemm.csv"]}
    assert tuned == {("flinear", "", "graph"): "", ("dispatch", "flinear", "graph"): "1.3333",
                     ("maxautotune", "flinear", "graph"): "1.1429", ("dispatch", "maxautotune", "graph"): "1.1667",
                     ("flinear", "", "eager"): "", ("dispatch", "flinear", "eager"): "0.9524"}
    bs = {(r["provider"], r.get("vs", "")): r.get("ratio", "") for r in out["summary.csv"]}
    assert bs[("dispatch", "flinear")] == "0.8000" and bs[("dispatch", "torch_prepared")] == "2.0000"
    assert [(r["label"], r["provider"], r["vs"], r["added_us"]) for r in out["overhead.csv"]] == [
        ("exact_3d", "TunedLinear", "nn.Linear", "-2.269")]
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="neither a harness CSV nor a raw file"):
        report.load_rows(tmp_path / "x.csv")
    assert legacy.convert(tmp_path / "x.csv") is None


def test_plot_writes_pngs(tmp_path):
    from benchmarks.plot import plot

    paths = plot(ROWS, tmp_path, "dispatch", "flinear", "graph", "t")
    assert [p.name for p in paths] == ["t_speedup.png", "t_roofline.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_tables_check_and_rewrite(tmp_path, capsys):
    """``tables`` regenerates each ``<!-- report: ... -->`` block from its raw file: a table edited by hand is found
    (exit 1), ``--write`` puts the generated one back."""
    (tmp_path / "r.csv").write_text(",".join(ROWS[0]) + "\n" + "\n".join(",".join(r.get(k, "") for k in ROWS[0])
                                                                        for r in ROWS) + "\n")
    table = report.summary(ROWS)
    md = tmp_path / "B.md"
    md.write_text(f"# B\n<!-- report: r.csv --table summary -->\n{table.replace('1.079', '1.080')}\n"
                  "<!-- /report -->\ntext\n")
    assert main(["tables", str(md)]) == 1
    assert main(["tables", str(md), "--write"]) == 0
    assert md.read_text() == f"# B\n<!-- report: r.csv --table summary -->\n{table}\n<!-- /report -->\ntext\n"
    assert main(["tables", str(md)]) == 0


def test_report_max_m_keeps_decode_shapes(tmp_path):
    """``--max-m 256`` drops the prefill columns (a floor meant for decode says nothing about M = 300)."""
    from benchmarks.run import render

    (tmp_path / "r.csv").write_text(",".join(ROWS[0]) + "\n" + "\n".join(",".join(r.get(k, "") for k in ROWS[0])
                                                                        for r in ROWS) + "\n")
    assert "M=300" in render([str(tmp_path / "r.csv"), "--table", "matrix"])
    assert render([str(tmp_path / "r.csv"), "--table", "matrix", "--max-m", "256"]).splitlines()[::2] == [
        "| label | N | K | M=1 |", "| m | 64 | 32 | 1.200 |"]


def test_benchmarks_md_tables_come_from_the_committed_raw_files():
    """Every table BENCHMARKS.md quotes is what ``report`` renders from the committed raw file it names."""
    text = (REPO / "BENCHMARKS.md").read_text()
    assert text.count("<!-- report: ") >= 10
    assert main(["tables", str(REPO / "BENCHMARKS.md")]) == 0


def test_hf_pooled_table(tmp_path):
    """``--table hf_pooled``: the rounds of two runs (one inline in results.json, one in its gzipped rounds file)
    paired within each run and pooled: medians over all rounds, and each run's own."""
    import csv
    import gzip

    def rounds(ratios):
        out = []
        for i, ratio in enumerate(ratios):
            out += [{"model": "m", "batch": 8, "mode": "eager", "phase": "decode", "arm": arm, "round": i,
                     "ms": ms} for arm, ms in (("without", 10.0 * ratio), ("with", 10.0), ("control", 10.0))]
        return out

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.json").write_text(json.dumps({"rounds": rounds([0.9, 1.0, 1.1])}))
    (tmp_path / "b").mkdir()
    with gzip.open(tmp_path / "b" / "r.csv.gz", "wt", newline="") as f:
        w = csv.DictWriter(f, ["model", "batch", "mode", "phase", "arm", "round", "ms"])
        w.writeheader()
        w.writerows(rounds([1.2, 1.3]))
    (tmp_path / "b" / "results.json").write_text(json.dumps({"rounds_file": "r.csv.gz"}))
    table = report.hf_pooled([tmp_path / "a" / "results.json", tmp_path / "b" / "results.json"])
    cells = table.splitlines()[2].split(" | ")
    assert cells[:5] + cells[6:] == ["| 8", "decode", "eager", "5", "1.1000", "1.1000", "1.000 / 1.250 |"]
    lo, hi = (float(x) for x in cells[5].strip("[]").split(", "))
    assert 0.9 <= lo < 1.1 < hi <= 1.3  # the median's bootstrap interval brackets it, within the data


def test_hf_table_bf16_columns(tmp_path):
    """``--table hf``: speedup and A/A per mode; a run whose summary has the FP8 loop's bf16 arm (``vs_bf16``) gains
    bf16 / with columns, and a run without it does not."""
    def entry(mode, speedup, vs_bf16=None):
        s = {"batch": 1, "phase": "decode", "mode": mode, "speedup": speedup, "round_ratio_min": speedup - 0.1,
             "round_ratio_max": speedup + 0.1, "aa_ratio": 1.0}
        if vs_bf16 is not None:
            s.update(vs_bf16=vs_bf16, vs_bf16_min=vs_bf16 - 0.01, vs_bf16_max=vs_bf16 + 0.01)
        return s

    (tmp_path / "fp8.json").write_text(json.dumps({"summary": [entry("graph", 2.0, 1.27), entry("eager", 1.5, 0.86)]}))
    (tmp_path / "bf16.json").write_text(json.dumps({"summary": [entry("graph", 1.33), entry("eager", 1.08)]}))
    header, _, row = report.hf([tmp_path / "fp8.json"]).splitlines()
    assert "graph bf16/with" in header and "eager bf16/with" in header
    assert row.split(" | ")[-2:] == ["1.270 [1.260-1.280]", "0.860 [0.850-0.870] |"]
    header, _, row = report.hf([tmp_path / "bf16.json"]).splitlines()
    assert "bf16" not in header
    assert row.split(" | ")[2] == "1.330 [1.230-1.430]"


def test_median_interval():
    assert report.median_ci([1.0] * 9) == (1.0, 1.0)
    assert report.median_ci([0.9, 1.1] * 50) == report.median_ci([0.9, 1.1] * 50)  # a fixed seed: one table
    xs = list(range(1, 102))
    lo, hi = report.median_ci(xs)
    assert 40 <= lo < 51 < hi <= 62
    wide = report.median_ci(xs[::10])  # the same spread in 11 rounds: a wider interval
    assert wide[1] - wide[0] > hi - lo


@pytest.mark.parametrize("name,tilelang", [("configs", True), ("baseline", False)])
def test_configs_copy_decides_from_its_folder(tmp_path, name, tilelang):
    """``configs:<DIR>`` / ``baseline:<DIR>`` decide from the copy of ``configs/`` in DIR: a row naming the H200 serves
    the H200 only and the class row the H100; ``baseline`` runs without TileLang, ``configs`` keeps it."""
    head = ("gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName,tflops,bw,errRatio,pad_m_min,timing,device_name\n")
    (tmp_path / "triton").mkdir()
    (tmp_path / providers.SHIPPED_FILE_NAMES[BLOCKSCALE]).write_text(
        head + "sm_90,132,64,8192,8192,torch,-1,0,32.4,scaled_mm_blockwise,0,0,0.0,64,graph,\n"
        "sm_90,132,64,8192,8192,tilelang,5,0,20.8,ws_swapAB-BM64_BN64_BK128_S8_T384_SK1,0,0,0.0,33,graph,NVIDIA_H200\n")
    disp = providers.configs_dispatcher(BLOCKSCALE, tmp_path, name, tilelang)
    key = disp.op.row_key(problem(BLOCKSCALE, 64, 8192, 8192))
    h200 = disp.table().lookup("sm_90", 132, key, "NVIDIA H200")
    h100 = disp.table().lookup("sm_90", 132, key, H100.device_name)
    assert (h200.fields["libtype"], h200.line) == ("tilelang", 3)
    assert (h100.fields["libtype"], h100.line) == ("torch", 2)
    why = disp.backend("tilelang").unavailable_reason()
    assert (why == f"not in the {name}") is not tilelang
    with pytest.raises(providers.Unavailable, match=f"{name}: .* not found"):
        providers.configs_dispatcher(BLOCKSCALE, tmp_path / "missing", name, tilelang)


@pytest.mark.parametrize("otype,passed", [(torch.bfloat16, None), (torch.float32, torch.float32)])
def test_dispatch_provider_calls_as_model_code_does(monkeypatch, otype, passed):
    """The ``dispatch`` provider passes ``otype`` only where it differs from the input's dtype, as model code calls
    ``gemm_a16w16``: an explicit same-dtype otype is a call the C++ eager entry leaves to the Python path, so its
    eager rows timed that path (the H200 decode run of 2026-11-29)."""
    seen = []
    monkeypatch.setattr(providers.aiter_gemm, "gemm_a16w16", lambda *args: seen.append(args[3]))
    p = GemmProblem(4, 8, 16, False, torch.bfloat16, otype)
    ctx = providers.Context(p, A16W16, [(None, None, None, None, None)], None, torch.device("cpu"), "eager")
    provider, arg = providers.resolve(A16W16, "dispatch")
    provider.build(ctx, arg)(0)
    assert seen == [passed]


def test_report_reads_gzipped_raw_files_as_the_plain_ones(tmp_path):
    """Large raw files are stored gzipped: a ``.csv.gz`` harness file and a ``.json.gz`` results file read as the
    plain ones do."""
    import gzip

    text = "bench,set,label,M,N,K,provider,mode,us\nbf16,s,l,1,64,64,flinear,graph,2.5\n"
    (tmp_path / "a.csv").write_text(text)
    with gzip.open(tmp_path / "b.csv.gz", "wt") as f:
        f.write(text)
    assert report.load_rows(tmp_path / "b.csv.gz") == report.load_rows(tmp_path / "a.csv")
    with gzip.open(tmp_path / "r.json.gz", "wt") as f:
        f.write(json.dumps({"rounds": [{"batch": 1, "ms": 2.0}]}))
    assert report.hf_rounds(tmp_path / "r.json.gz") == [{"batch": 1, "ms": 2.0}]
