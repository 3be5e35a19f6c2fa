"""Unit tests of the tuner's parts that need no worker process: accuracy, timing helpers, model shapes, the
two-phase search state machine and the checkpoint writer."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from aiter_gemm.accuracy import TOLERANCES, err_ratio, tolerance_for
from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.configs import BF16_TUNED_COLUMNS
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.fileio import read_csv_rows
from aiter_gemm.timing import MAX_SETS, TimingConfig, cache_bytes, rotating_sets, time_runner
from gradlib.a16w16 import tuned_problems, tuned_row
from gradlib.models import ModelArch, ModelConfigError, load_arch, model_problems, projections
from gradlib.records import DEFAULTS, ENUMERATE, TIME, ItemResult
from gradlib.results import CheckpointWriter, roofline_for
from gradlib.search import SearchOptions, ShapeSearch

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "configs" / "model_configs"
CPU = DeviceIdentity("cpu", 2, "cpu", "cpu")
BF16 = torch.bfloat16


# ---- accuracy -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (97, 33)])
def test_err_ratio_zero_for_output_rounding(dtype, shape):
    ref = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    assert err_ratio(ref.to(dtype), ref, tolerance_for(dtype, dtype)) == 0.0


@pytest.mark.parametrize("bad", [0, 1, 5, 50])
def test_err_ratio_counts_elements_outside_tolerance(bad):
    ref = torch.randn(10, 10, generator=torch.Generator().manual_seed(2))
    out = ref.clone()
    out.view(-1)[:bad] += 1.0  # 1.0 >> atol + rtol*|ref| for unit-scale values
    assert err_ratio(out.to(BF16), ref, TOLERANCES[BF16]) == pytest.approx(bad / 100)


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_err_ratio_nonfinite_is_one(poison):
    ref = torch.randn(64, 64)
    out = ref.clone()
    out[3, 5] = poison
    assert err_ratio(out, ref, TOLERANCES[torch.float32]) == 1.0


def test_err_ratio_wrong_shape_is_one():
    assert err_ratio(torch.zeros(3, 4), torch.zeros(3, 5), TOLERANCES[BF16]) == 1.0


def test_tolerance_uses_looser_dtype():
    assert tolerance_for(BF16, torch.float32) == TOLERANCES[BF16]
    assert tolerance_for(torch.float32, BF16) == TOLERANCES[BF16]
    with pytest.raises(KeyError, match="tolerance"):
        tolerance_for(torch.int32, BF16)


# ---- timing -------------------------------------------------------------------------------------------------
def test_rotating_sets_span_twice_the_cache():
    assert rotating_sets(10 << 20, 50 << 20, None) == 10
    assert rotating_sets(200 << 20, 50 << 20, None) == 1  # one set already exceeds 2x L2
    assert rotating_sets(1, 50 << 20, None) == MAX_SETS
    assert rotating_sets(10 << 20, 50 << 20, free_bytes=80 << 20) == 2  # 25% of free memory: 20 MB


def test_cpu_cache_size_is_read():
    assert cache_bytes(torch.device("cpu")) >= 1 << 16


def test_cpu_timing_median_and_budget(virtual_clock):
    """On the virtual clock (a call costs what it spends plus one 1-us tick): the median of the repetitions, buffer
    sets in turn, and the budget cutting repetitions to no fewer than 3."""
    cfg = TimingConfig(warmup=1, reps=5, target_us=0, budget_s=1.0)
    seen, costs = [], iter([0.001, 0.009, 0.003, 0.007, 0.005, 0.002])  # the warm-up call, then 5 repetitions

    def call(i):
        seen.append(i)
        virtual_clock.spend(next(costs))

    t = time_runner(call, 3, torch.device("cpu"), cfg)
    assert (t.method, t.samples, seen) == ("cpu", 5, [0, 1, 2, 0, 1, 2])
    assert t.us == pytest.approx(5000 + 1)  # median of 9, 3, 7, 5, 2 ms
    slow = time_runner(lambda i: virtual_clock.spend(0.004), 3, torch.device("cpu"), replace(cfg, budget_s=0.01))
    assert slow.samples == 3 and slow.us == pytest.approx(4000 + 1)  # 0.01 s / 4 ms: 2 repetitions, raised to 3


# ---- model shapes -------------------------------------------------------------------------------------------
def _shapes(model: str, tp: int) -> dict[str, tuple[int, int, bool]]:
    return {p.name: (p.N, p.K, p.bias) for p in projections(load_arch(MODELS / model), tp)}


def test_llama3_70b_tp8_hand_computed():
    # 64 heads / 8 = 8 q heads, 8 kv heads / 8 = 1 per rank, head_dim 8192 / 64 = 128.
    assert _shapes("llama3_70b", 8) == {
        "qkv": ((8 + 2 * 1) * 128, 8192, False),  # 1280: AITER's llama70B list has N=1280, K=8192
        "o": (8192, 8 * 128, False),
        "gate_up": (2 * 28672 // 8, 8192, False),  # 7168
        "down": (8192, 28672 // 8, False),  # 3584
        "lm_head": (128256 // 8, 8192, False),  # 16032 (128256 is already a multiple of 64)
    }


def test_llama3_8b_and_qwen_bias_and_kv_replication():
    assert _shapes("llama3_8b", 1)["qkv"] == ((32 + 2 * 8) * 128, 4096, False)
    qwen = _shapes("qwen2_5_7b", 4)  # 28 heads, 4 kv heads, head_dim 128, q/k/v have a bias, o does not
    assert qwen["qkv"] == ((7 + 2) * 128, 3584, True)
    assert qwen["o"] == (3584, 7 * 128, False)
    assert qwen["down"] == (3584, 18944 // 4, False)
    assert qwen["lm_head"] == (152064 // 4, 3584, False)
    # tp 16 > 8 kv heads: every rank keeps one kv head replica
    assert _shapes("llama3_70b", 16)["qkv"] == ((4 + 2) * 128, 8192, False)


@pytest.mark.parametrize("tp,key", [(3, "num_attention_heads"), (0, "--tp")])
def test_bad_tp_is_named(tp, key):
    with pytest.raises(ModelConfigError, match=key):
        projections(load_arch(MODELS / "llama3_8b"), tp)


def test_shipped_model_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no such folder here: the name means the shipped config
    assert load_arch("llama3_70b") == load_arch(MODELS / "llama3_70b")
    with pytest.raises(ModelConfigError, match="shipped models: .*llama3_8b"):
        load_arch("no_such_model")


def test_missing_key_names_file_and_key():
    with pytest.raises(ModelConfigError, match="config.json: missing key 'intermediate_size'"):
        ModelArch.from_config({"hidden_size": 8, "num_attention_heads": 2, "vocab_size": 10})


def test_model_problems_m_is_tokens_and_lm_head_uses_batch_size():
    arch = load_arch(MODELS / "llama3_8b")
    probs = model_problems(arch, 1, [1, 64], batch_sizes=[4])
    assert [(p.M, p.N, p.K) for p in probs] == [
        (1, 6144, 4096), (1, 4096, 4096), (1, 28672, 4096), (1, 4096, 14336),
        (64, 6144, 4096), (64, 4096, 4096), (64, 28672, 4096), (64, 4096, 14336),
        (4, 128256, 4096),
    ]
    assert all(p.dtype == BF16 and p.otype == BF16 for p in probs)


@pytest.mark.parametrize("model,tp,csv", [("llama3_8b", 1, "llama3_8b"), ("llama3_70b", 8, "llama3_70b_tp8"),
                                          ("qwen2_5_7b", 1, "qwen2_5_7b"), ("mistral_7b", 1, "mistral_7b")])
def test_shipped_shape_lists_match_derivation(model, tp, csv):
    from gradlib.gemm_tuner import DEFAULT_NSETS

    _, rows = read_csv_rows(MODELS / f"{csv}_untuned_gemm.csv")
    got = [(int(r["M"]), int(r["N"]), int(r["K"]), r["bias"] == "True") for r in rows]
    want = [(p.M, p.N, p.K, p.bias) for p in model_problems(load_arch(MODELS / model), tp, DEFAULT_NSETS)]
    assert got == want


# ---- search state machine -----------------------------------------------------------------------------------
P = GemmProblem(17, 96, 64)


def _drive(search: ShapeSearch, results_by_phase: dict) -> list:
    """Run ``search`` with canned item results: results_by_phase[phase](task) -> list[ItemResult]."""
    tasks = []
    while not search.done:
        task = search.next_task(len(tasks))
        assert task is not None
        tasks.append(task)
        phase = task.kind if task.kind == ENUMERATE else ("screen" if not task.check else "full")
        for res in results_by_phase[phase](task):
            search.on_item(res)
        search.on_task_done()
    return tasks


def _enum(lt: int, others: int):
    def results(task):
        out = []
        for i, name in enumerate(task.items):
            if name == "lt":
                sols = tuple(Solution("lt", k) for k in range(lt))
            elif name == "torch":
                sols = (Solution("torch", 0, 0, "F.linear"),)
            else:
                sols = tuple(Solution(name, k) for k in range(others))
            out.append(ItemResult(task.task_id, i, True, solutions=sols, is_blaslt=name == "lt"))
        return out
    return results


def test_screen_drops_failures_before_keeping_top():
    # lt solidx k takes 100 - k us except every 5th fails with a (bogus) negative time: never ranked, never kept.
    def screen(task):
        return [ItemResult(task.task_id, i, s.solidx % 5 != 0, us=(100.0 - s.solidx) if s.solidx % 5 else -1.0)
                for i, s in enumerate(task.items)]

    def full(task):
        return [ItemResult(task.task_id, i, True, us=50.0 + i, err_ratio=0.0) for i, _ in enumerate(task.items)]

    s = ShapeSearch(0, P, SearchOptions(("lt", "tri"), screen_top=20))
    tasks = _drive(s, {ENUMERATE: _enum(40, 3), "screen": screen, "full": full})
    assert [t.kind for t in tasks] == [ENUMERATE, TIME, TIME]
    assert len(tasks[1].items) == 40 and tasks[1].check is False
    kept = [sol.solidx for sol in tasks[2].items if sol.libtype == "lt"]
    assert kept == sorted((k for k in range(40) if k % 5), reverse=True)[:20]  # fastest first, failures out
    assert sum(sol.libtype == "tri" for sol in tasks[2].items) == 3
    assert tasks[2].items[-1] == Solution("torch", 0, 0, "F.linear")  # baseline always timed


def test_screen_libtypes_screens_other_backends_top_per_backend():
    def screen(task):
        return [ItemResult(task.task_id, i, True, us=1000.0 - 10 * s.solidx - (s.libtype == "lt"))
                for i, s in enumerate(task.items)]

    def full(task):
        return [ItemResult(task.task_id, i, True, us=5.0, err_ratio=0.0) for i, _ in enumerate(task.items)]

    s = ShapeSearch(0, P, SearchOptions(("lt", "sk", "tri"), screen_top=4, screen_libtypes=("sk",)))
    tasks = _drive(s, {ENUMERATE: _enum(6, 30), "screen": screen, "full": full})
    assert {sol.libtype for sol in tasks[1].items} == {"lt", "sk"} and len(tasks[1].items) == 36
    kept = [(sol.libtype, sol.solidx) for sol in tasks[2].items]
    assert sorted(k for k in kept if k[0] == "sk") == [("sk", k) for k in range(26, 30)]  # its own top 4
    assert sorted(k for k in kept if k[0] == "lt") == [("lt", k) for k in range(2, 6)]
    assert sum(k[0] == "tri" for k in kept) == 30 and kept[-1][0] == "torch"


def test_failed_candidates_never_win():
    # the failed ones report -1 / 0 us (AITER's failure sentinel sorted first); the inaccurate one is fastest.
    timings = {0: (False, -1.0, math.nan), 1: (True, 9.0, 0.0), 2: (True, 1.0, 0.5), 3: (False, 0.0, math.nan),
               4: (True, 7.0, 0.04)}

    def full(task):
        return [ItemResult(task.task_id, i, *timings.get(s.solidx, (True, 20.0, 0.0))) for i, s in
                enumerate(task.items)]

    s = ShapeSearch(0, P, SearchOptions(("tri",), err_ratio=0.05))
    _drive(s, {ENUMERATE: _enum(0, 5), "full": full})
    assert s.outcome.winner.solution == Solution("tri", 4)
    assert [c.solution.solidx for c in s.outcome.ranked()][-2:] in ([0, 3], [3, 0])
    assert s.outcome.baseline.solution.libtype == "torch" and not s.outcome.baseline.eligible


def test_torch_baseline_wins_only_when_requested():
    def full(task):
        return [ItemResult(task.task_id, i, True, us=1.0 if s.libtype == "torch" else 5.0, err_ratio=0.0)
                for i, s in enumerate(task.items)]

    s = ShapeSearch(0, P, SearchOptions(("tri",)))
    _drive(s, {ENUMERATE: _enum(0, 2), "full": full})
    assert s.outcome.winner.solution.libtype == "tri"
    s = ShapeSearch(0, P, SearchOptions(("tri", "torch")))
    _drive(s, {ENUMERATE: _enum(0, 2), "full": full})
    assert s.outcome.winner.solution.libtype == "torch"


@pytest.mark.parametrize(("tri_us", "min_gain", "winner"),
                         [(9.9, 1.02, "torch"), (9.7, 1.02, "tri"), (9.9, 1.0, "tri"), (9.9, 1.005, "tri")])
def test_min_gain_keeps_torch_unless_the_win_is_real(tri_us, min_gain, winner):
    def full(task):
        return [ItemResult(task.task_id, i, True, us=10.0 if s.libtype == "torch" else tri_us, err_ratio=0.0)
                for i, s in enumerate(task.items)]

    s = ShapeSearch(0, P, SearchOptions(("tri", "torch"), min_gain=min_gain))
    _drive(s, {ENUMERATE: _enum(0, 1), "full": full})
    assert s.outcome.winner.solution.libtype == winner
    s = ShapeSearch(0, P, SearchOptions(("tri",), min_gain=min_gain))  # torch not eligible: never substituted
    _drive(s, {ENUMERATE: _enum(0, 1), "full": full})
    assert s.outcome.winner.solution.libtype == "tri"


def test_no_valid_candidate_fails_shape():
    def full(task):
        return [ItemResult.failed(task, i, "boom") for i in range(len(task.items))]

    s = ShapeSearch(0, P, SearchOptions(("tri",)))
    _drive(s, {ENUMERATE: _enum(0, 2), "full": full})
    assert s.outcome.winner is None and not s.outcome.tuned


# ---- results ------------------------------------------------------------------------------------------------
def _outcome(p: GemmProblem, us: float, lib: str = "tri"):
    def full(task):
        return [ItemResult(task.task_id, i, True, us=us if s.libtype == lib else us * 2, err_ratio=0.001)
                for i, s in enumerate(task.items)]

    s = ShapeSearch(0, p, SearchOptions((lib,)))
    _drive(s, {ENUMERATE: _enum(0, 1), "full": full})
    return s.outcome


def test_tuned_row_format():
    row = tuned_row(CPU, _outcome(GemmProblem(4, 8, 16, True), 2.5))
    assert list(row) == list(BF16_TUNED_COLUMNS)
    assert row["gfx"] == "cpu" and row["cu_num"] == "2" and row["bias"] == "True"
    assert row["dtype"] == "torch.bfloat16" and row["libtype"] == "tri" and row["us"] == "2.5000"
    assert float(row["tflops"]) == pytest.approx(2 * 4 * 8 * 16 / 2.5e-6 / 1e12, abs=0.01)


def test_checkpoint_every_batch_keeps_foreign_rows(tmp_path):
    path = tmp_path / "tuned.csv"
    foreign = ("gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,kernelName\n"
               "sm_90,132,4,8,16,False,torch.bfloat16,torch.bfloat16,False,False,cublaslt,3,0,1.0,x\n")
    path.write_text(foreign)
    w = CheckpointWriter(path, CPU, batch=2, replace_existing=False)
    w.add(_outcome(GemmProblem(1, 8, 16), 3.0, "triton"))  # a known libtype: rows naming none do not count
    assert len(read_csv_rows(path)[1]) == 1  # not yet: batch is 2
    w.add(_outcome(GemmProblem(2, 8, 16), 3.0, "triton"))
    assert len(read_csv_rows(path)[1]) == 3
    w.add(_outcome(GemmProblem(3, 8, 16), 3.0, "triton"))
    w.flush()
    rows = read_csv_rows(path)[1]
    assert [r["M"] for r in rows] == ["4", "1", "2", "3"] and rows[0]["libtype"] == "cublaslt"
    assert tuned_problems(path, CPU) == {GemmProblem(m, 8, 16) for m in (1, 2, 3)}
    assert tuned_problems(path, DeviceIdentity("cpu", 3, "cpu")) == set()  # other cu_num: not tuned
    # without --all a row already there is kept; with --all it is replaced
    CheckpointWriter(path, CPU, 1, replace_existing=False).add(_outcome(GemmProblem(1, 8, 16), 9.0))
    assert read_csv_rows(path)[1][1]["us"] == "3.0000"
    CheckpointWriter(path, CPU, 1, replace_existing=True).add(_outcome(GemmProblem(1, 8, 16), 9.0))
    assert read_csv_rows(path)[1][1]["us"] == "9.0000" and len(read_csv_rows(path)[1]) == 4


def test_roofline_matches_device_name():
    h100 = roofline_for(DeviceIdentity("sm_90", 132, "cuda", "NVIDIA H100 80GB HBM3"))
    h200 = roofline_for(DeviceIdentity("sm_90", 132, "cuda", "NVIDIA H200"))  # same class, its own measured entry
    assert h100 is not None and h200 is not None and h200 is not h100 and h200.bytes > h100.bytes
    assert roofline_for(DeviceIdentity("sm_90", 114, "cuda", "NVIDIA H100 PCIe")) is None  # another class
    p = GemmProblem(8192, 8192, 8192)  # compute-bound: 1.1 TFLOP at 790 TFLOP/s = 1392 us
    assert h100.fraction(p, 2 * 1391.8) == pytest.approx(0.5, rel=1e-3)
    p = GemmProblem(1, 8192, 8192)  # memory-bound: 134 MB at 3 TB/s = 44.7 us
    assert h100.fraction(p, 44.74) == pytest.approx(1.0, rel=1e-3)


@pytest.mark.parametrize("peak_tflops", [None, 1000.0])
def test_roof_of_fp8_problems_is_the_fp8_peak(peak_tflops, monkeypatch):
    """The block-scale tuner's %roof: an FP8 problem's compute roof is the FP8 peak (the datasheet's, or
    --peak_tflops), a bf16 one's the measured bf16 peak; the bandwidth is the same; an FP8 peak not known: no %."""
    from aiter_gemm.kernels.blockscale_format import FP8
    from gradlib import results
    from gradlib.driver import TuneJob, format_table, roofline
    from gradlib.results import fp8_peak_for, summary_row
    from gradlib.tune_ops import tune_op

    h200 = DeviceIdentity("sm_90", 132, "cuda", "NVIDIA H200")
    spec = tune_op("gemm_a8w8_blockscale")
    job = TuneJob("t", spec, [], SearchOptions(("triton",)), "t.csv", peak_tflops=peak_tflops)
    fp8 = replace(_outcome(GemmProblem(4096, 7168, 16384, False, FP8), 700.0), shape_id=0)
    bf16 = replace(_outcome(GemmProblem(4096, 7168, 16384), 700.0), shape_id=1)
    measured = roofline_for(h200)

    def pct(o, peak: float) -> str:
        p = o.problem
        return f"{100 * max(p.flops / peak, p.min_bytes() / measured.bytes) / 700e-6:.1f}"

    given = peak_tflops * 1e12 if peak_tflops else None
    want = {0: pct(fp8, given or fp8_peak_for(h200)), 1: pct(bf16, given or measured.flops)}
    if peak_tflops is None:  # the bf16 peak reads this FP8 row above 100%
        assert float(want[1]) > 100.0 > float(want[0])
    roof = roofline(job, h200)
    lines = format_table(spec, [fp8, bf16], roof).splitlines()[2:]
    for o, line in zip((fp8, bf16), lines):
        assert f" {want[o.shape_id]}% " in line
        assert summary_row(spec, h200, o, roof)["pct_roofline"] == want[o.shape_id]
    monkeypatch.setattr(results, "FP8_PEAKS", ())  # a device whose FP8 peak is not known
    roof = roofline(job, h200)
    fp8_line = format_table(spec, [fp8, bf16], roof).splitlines()[2]
    if peak_tflops is None:
        assert f"{want[0]}%" not in fp8_line and " - " in fp8_line
        assert summary_row(spec, h200, fp8, roof)["pct_roofline"] == ""


def test_tuned_problems_of_missing_file_is_empty(tmp_path):
    assert tuned_problems(tmp_path / "none.csv", CPU) == set()
    assert not os.path.exists(tmp_path / "none.csv")


def test_interleaved_rounds_alternate_the_order():
    from aiter_gemm.timing import interleaved

    order = []
    got = interleaved({k: (lambda k=k: order.append(k) or float(len(order))) for k in "abc"}, 4)
    assert order == list("abccbaabccba")
    assert got == {"a": [1.0, 6.0, 7.0, 12.0], "b": [2.0, 5.0, 8.0, 11.0], "c": [3.0, 4.0, 9.0, 10.0]}


def test_ms_per_call_times_n_calls_after_the_untimed_warm_up(virtual_clock):
    """The one fixed-count timing (kernel_check --bench, hf_decode's steps; CUDA events on a GPU): on CPU the
    warm-up calls stay outside the clock reads, and the time is per call, in milliseconds."""
    from aiter_gemm.timing import ms_per_call

    calls = []

    def call():
        calls.append(virtual_clock.now)
        virtual_clock.spend(0.004)

    ms = ms_per_call(call, 5, cuda=False, warmup=3)
    assert len(calls) == 8
    assert ms == pytest.approx(4.0 + virtual_clock.tick_s * 1e3 / 5)


def test_relative_error_twice_the_library_calls_rejects_a_candidate():
    def full(task):
        return [ItemResult(task.task_id, i, True, us={"torch": 10.0}.get(s.libtype, 1.0 + s.solidx), err_ratio=0.0,
                           rel_err=1e-2 if (s.libtype, s.solidx) == ("tri", 0) else 2e-3)
                for i, s in enumerate(task.items)]

    s = ShapeSearch(0, P, SearchOptions(("tri",)))
    _drive(s, {ENUMERATE: _enum(0, 2), "full": full})
    assert s.outcome.winner.solution == Solution("tri", 1)  # solidx 0 is faster but 5x the library call's error


def test_worker_resolves_the_default_and_reports_what_it_ran():
    from gradlib.records import DEFAULT, Task
    from gradlib.tasks import WorkerRuntime

    rt = WorkerRuntime.create()
    task = Task(0, 0, TIME, GemmProblem(3, 64, 32), (DEFAULT,), TimingConfig(1, 3, 0.0, False, 0.05), check=True)
    res = rt.run_item(task, 0)
    assert res.ok and res.solutions == (Solution("torch", 0, 0, "F.linear"),)
    assert 0 < res.rel_err < 1e-2  # bf16 output against the float32 reference


def test_worker_resolves_the_default_at_each_m_without_timing(clean_runtime):
    """A DEFAULTS task (items: M values) says what the runtime's default runs at each M of the task's shape."""
    import aiter_gemm
    from aiter_gemm import registry as backends
    from gradlib.records import DEFAULTS, Task
    from gradlib.tasks import WorkerRuntime
    from op_tests.runtime_helpers import FakeBackend

    backends.register_backend(FakeBackend("smallm", default_max_m=4, priority=10_000))
    try:
        aiter_gemm.reload_configs()
        rt = WorkerRuntime.create()
        task = Task(0, 0, DEFAULTS, GemmProblem(16, 64, 32), (3, 16), TimingConfig(1, 3, 0.0, False, 0.05))
        got = [rt.run_item(task, i) for i in range(2)]
        f_linear = Solution("torch", 0, 0, "F.linear")
        assert [r.solutions for r in got] == [(Solution("smallm", -1, 0, "fake-default"),), (f_linear,)]
        assert all(r.ok and math.isinf(r.us) for r in got)  # nothing was timed
    finally:
        backends.unregister_backend("smallm")


BAD_ROWS = "".join(f"cpu,2,{m},8,16,False,torch.bfloat16,torch.bfloat16,False,False,{lib},0,0,{us},k\n"
                   for m, lib, us in ((1, "torch", "nan"), (2, "torch", "0"), (3, "torch", "-1"), (4, "torch", ""),
                                      (5, "nosuch", "1.0"), (6, "torch", "5.0")))


def test_unusable_rows_are_retuned_and_replaced(tmp_path, caplog):
    """Rows with a bad time or a libtype no backend has are not tuned shapes: resumed, and replaced when measured."""
    import logging

    path = tmp_path / "tuned.csv"
    path.write_text(BF16_TUNED_COLUMNS[0] + "," + ",".join(BF16_TUNED_COLUMNS[1:15]) + "\n" + BAD_ROWS)
    assert tuned_problems(path, CPU) == {GemmProblem(6, 8, 16)}
    w = CheckpointWriter(path, CPU, batch=10, replace_existing=False)
    for m in range(1, 7):
        w.add(_outcome(GemmProblem(m, 8, 16), 3.0, "torch"))
    with caplog.at_level(logging.WARNING):
        w.flush()
    rows = read_csv_rows(path)[1]
    assert [(r["M"], r["libtype"], r["us"]) for r in rows] == [(str(m), "torch", "3.0000") for m in range(1, 6)] + [
        ("6", "torch", "5.0")], "bad rows replaced in place, the usable one kept"
    assert w.stale_replaced == 5 and "replaced 5 row(s) that were not usable" in caplog.text
    assert "unknown libtype 'nosuch'" in caplog.text and "us 'nan'" in caplog.text
    assert "tuned meanwhile" in caplog.text  # M=6: a usable row is never overwritten without --all
    assert tuned_problems(path, CPU) == {GemmProblem(m, 8, 16) for m in range(1, 7)}


def test_checkpoint_into_bom_file_keeps_its_header(tmp_path):
    """A tuned file saved by Excel ("CSV UTF-8") starts with a BOM: merging must neither duplicate its first column
    nor drop the BOM."""
    path = tmp_path / "tuned.csv"
    header = ",".join(BF16_TUNED_COLUMNS[:15]) + "\n"
    path.write_bytes(b"\xef\xbb\xbf" + (header + BAD_ROWS.splitlines(keepends=True)[-1]).encode())
    assert tuned_problems(path, CPU) == {GemmProblem(6, 8, 16)}
    CheckpointWriter(path, CPU, batch=1, replace_existing=False).add(_outcome(GemmProblem(1, 8, 16), 3.0, "torch"))
    data = path.read_bytes()
    assert data.startswith(b"\xef\xbb\xbf" + header.strip().encode()
                           + b",err_ratio,tflops,bw,pad_m_min,timing,device_name\n")
    assert data.count(b"\xef\xbb\xbf") == 1
    assert [r["M"] for r in read_csv_rows(path)[1]] == ["6", "1"]
    assert tuned_problems(path, CPU) == {GemmProblem(m, 8, 16) for m in (1, 6)}


def test_progress_lines_off_a_terminal():
    """Off a terminal tqdm draws nothing: a line per finished shape, and a line while shapes run long."""
    import io

    from gradlib.driver import describe
    from gradlib.progress import Progress

    stream = io.StringIO()
    search = ShapeSearch(0, P, SearchOptions(("tri",)))
    with Progress(2, describe, stream=stream, tty=False, heartbeat_s=0.0) as progress:
        progress.tick([search])
        progress.shape(_outcome(GemmProblem(4, 8, 16, True), 2.5))
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("[gradlib] 0/2 shapes done") and "running M=17 N=96 K=64" in lines[0]
    assert lines[1].startswith("[gradlib] shape 1/2 M=4 N=8 K=16 bias: tri[0,0]") and "2.500 us" in lines[1]


def test_heartbeat_counts_the_running_phase_and_never_passes_its_total():
    """Torch-only CPU tuning (the baseline is the only candidate, then the confirmation re-times it): the heartbeat
    said "(17/2 candidates)", counting listing and confirmation items against a plan of two."""
    import io
    import re

    from gradlib.driver import describe
    from gradlib.progress import Progress

    search = ShapeSearch(0, P, SearchOptions(("torch",), confirm_rounds=2))
    stream = io.StringIO()
    with Progress(1, describe, stream=stream, tty=False, heartbeat_s=0.0) as progress:
        while not search.done:
            task = search.next_task(0)
            if task.kind == ENUMERATE:
                results = _enum(0, 0)(task)
            else:  # the default runs another solution, so the winner is confirmed against it (not against itself)
                sol = Solution("torch", 1 if task.kind == DEFAULTS else 0, 0, "default" if task.kind == DEFAULTS
                               else "F.linear")
                results = [ItemResult(task.task_id, i, True, us=5.0, err_ratio=0.0, solutions=(sol,))
                           for i in range(len(task.items))]
            for res in results:
                search.on_item(res)
                progress.item(search, res)
                progress.tick([search])
            search.on_task_done(task)
    counts = re.findall(r"\((listing candidates|timing (\d+)/(\d+) candidates|confirming (\d+)/(\d+) runs)\)",
                        stream.getvalue())
    phases = [c[0].split()[0] for c in counts]
    assert phases[0] == "listing" and phases.count("timing") == 1 and phases.count("confirming") >= 4
    assert all(int(c[1] or c[3]) <= int(c[2] or c[4]) for c in counts if c[0] != "listing candidates")
    assert "timing 1/1 candidates" in stream.getvalue()
