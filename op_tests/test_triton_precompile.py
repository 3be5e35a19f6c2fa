"""Triton kernels built ahead in parallel (:mod:`aiter_gemm.backends._triton_precompile`) for the ``fused_moe`` and
``gemm_a8w8_blockscale`` Triton backends: jobs deduplicated (a MoE solution's token counts share kernels; each GEMM1
config also built in the counter-clearing variant the jobs lack), grouped per solution and split over the build
processes, failures and dead processes named per kernel, nothing done without a GPU, the process count from
``AITER_GEMM_PRECOMPILE_WORKERS``. The build processes are faked in-process, or real ones run a trivial job (and a
caller's ``__main__`` is not run again in them); the GPU test checks that a candidate's first launch after
``precompile`` compiles nothing."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from aiter_gemm.backends import _triton_precompile as tp
from aiter_gemm.backends.a8w8_blockscale import triton as bs_triton
from aiter_gemm.backends.base import ACT_TYPES, QUANT_BLOCK, GemmProblem, MoeProblem, Solution
from aiter_gemm.backends.fused_moe import triton as moe_triton
from aiter_gemm.kernels import fused_moe as fm
from aiter_gemm.kernels.blockscale_format import FP8
from aiter_gemm.kernels.fused_moe import MoeConfig
from op_tests.runtime_helpers import REPO, FakeBuilder, FakeBuilders

PLAIN = "moe_BM16_BN32_BK64_GM1_SK1_W4_S2"
DIRECT = "moe_BM16_BN32_BK64_GM1_SK1_W4_S2_DIRECT"
KSUM = "moe_BM16_BN32_BK64_GM1_SK1_W4_S2_KSUM"
BLOCKSCALE = "swapAB-BM16_BN64_BK128_GM1_SK1_W4_S4"
MARKS = "PRECOMPILE_TEST_DIR"  # where the spawned test job writes what it ran


def _moe(token: int, fp8: bool = False) -> MoeProblem:
    if fp8:
        return MoeProblem(token, 256, 128, 4, 2, ACT_TYPES["silu"], torch.bfloat16, FP8, FP8, QUANT_BLOCK)
    return MoeProblem(token, 128, 64, 4, 2, ACT_TYPES["silu"])


def _pair(first: str, second: str) -> Solution:
    return moe_triton.solution_of(MoeConfig.parse(first), MoeConfig.parse(second))


@pytest.fixture
def fake_builders(monkeypatch):
    """Builds "compile" here (the GPU check passes) in :class:`FakeBuilders`; the list holds one per build."""
    builds: list[FakeBuilders] = []

    def start(*args) -> FakeBuilder:
        if not args[0]:
            builds.append(FakeBuilders())
        return builds[-1](*args)

    monkeypatch.setattr(tp, "compiles_here", lambda: True)
    monkeypatch.setattr(tp, "start_builder", start)
    return builds


# ---- what is built, where ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("first, second", [(PLAIN, PLAIN), (PLAIN, KSUM), (DIRECT, KSUM)])
@pytest.mark.parametrize("token", [1, 2, 5, 16, 33, 64])
def test_gemm1_clears_the_ksum_counters_by_a_runtime_count(monkeypatch, first, second, token):
    """GEMM1's clearing of GEMM2's KSUM counters is a constexpr flag (``ZERO``: where GEMM2 sums the k slots,
    :func:`~aiter_gemm.kernels.fused_moe.uses_ksum`) and a runtime count per program that covers every counter, so
    the token count compiles no kernel of its own; GEMM2 clears nothing."""
    got = []

    class Recorder:
        arg_names = fm._fused_moe_kernel.arg_names

        def __getitem__(self, grid):
            return lambda *args, **kw: got.append((kw["ZERO"], kw["zero_per_program"], kw["num_zero"], grid[0]))

    monkeypatch.setattr(fm, "_fused_moe_kernel", Recorder())
    c1, c2 = MoeConfig.parse(first), MoeConfig.parse(second)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # moe_align runs: interpreted on CPU
    inputs = fm.zero_inputs(token, 128, 64, 4, 2, torch.bfloat16, False, device)
    fm.launch_fused_moe(*inputs, "silu", c1, c2)
    (zero1, per, count, programs), (zero2, per2, count2, _) = got
    assert zero1 == fm.uses_ksum(2, 64, c2) == (second == KSUM)
    assert not zero2 and per2 == count2 == 0
    if zero1:
        assert count == token * 4 and (per - 1) * programs < count <= per * programs
    else:
        assert per == count == 0


def test_moe_jobs_dedupe_token_counts_that_share_kernels(fake_builders, monkeypatch):
    """One build per solution whatever the token counts (and of a duplicate job); each solution one group; a pair
    whose GEMM1 config already has both counter-clearing variants among the jobs adds no build."""
    built = []
    monkeypatch.setattr(moe_triton, "build_job", lambda p, s: built.append((p.token, s.kernelName)))
    plain, ksum = _pair(PLAIN, PLAIN), _pair(PLAIN, KSUM)
    tokens = [1, 2, 4, 8, 16, 32, 64]
    jobs = [(_moe(t), s) for t in tokens for s in (plain, ksum)] + [(_moe(1), plain)]
    assert moe_triton.BACKEND.precompile(jobs) == {}
    assert sorted(built) == sorted([(1, plain.kernelName), (1, ksum.kernelName)])
    (builders,) = fake_builders
    assert sorted(s.kernelName for g in builders.groups for _, s in g) == sorted([plain.kernelName, ksum.kernelName])


def test_each_gemm1_config_is_built_in_both_counter_variants(fake_builders, monkeypatch):
    """The tuner's per-stage rounds pair every GEMM1 config with the GEMM2 winner, KSUM or not: precompile builds
    each GEMM1 config of the jobs with a KSUM GEMM2 and with a plain one (:func:`ksum_partners`), and reports
    failures of the jobs it was given only."""
    built = []

    def build(p, s):
        built.append(s.kernelName)
        if s.kernelName == _pair(DIRECT, PLAIN).kernelName:
            raise RuntimeError("an extra build failed")

    monkeypatch.setattr(moe_triton, "build_job", build)
    jobs = [(_moe(1), _pair(DIRECT, PLAIN)), (_moe(1), _pair(PLAIN, KSUM))]
    extra = moe_triton.ksum_partners(jobs)
    assert [s.kernelName for _, s in extra] == [_pair(DIRECT, KSUM).kernelName, _pair(PLAIN, PLAIN).kernelName]
    assert moe_triton.ksum_partners(jobs + extra) == []
    failed = moe_triton.BACKEND.precompile(jobs)
    assert sorted(built) == sorted(s.kernelName for _, s in jobs + extra)
    assert set(failed) == {_pair(DIRECT, PLAIN).kernelName}  # a job given: its failure is reported
    def extra_fails(p, s):
        if s.kernelName == _pair(PLAIN, PLAIN).kernelName:
            raise RuntimeError("an extra build failed")

    monkeypatch.setattr(moe_triton, "build_job", extra_fails)
    assert moe_triton.BACKEND.precompile(jobs) == {}  # an extra build's failure is not a job's


def test_groups_split_over_at_most_the_workers_asked(fake_builders, monkeypatch):
    """min(workers, solutions) processes (by default min(8, CPUs)); every group started once; blockscale jobs of
    one config at two M stay two jobs (its default variant is the whole problem)."""
    monkeypatch.setattr(bs_triton, "build_job", lambda p, s: None)
    names = [f"swapAB-BM16_BN{n}_BK128_GM1_SK1_W4_S{s}" for n, s in ((64, 4), (64, 6), (128, 4))]
    sols = [Solution("triton", -1, 0, n) for n in names]
    jobs = [(GemmProblem(m, 512, 256, dtype=FP8), s) for s in sols for m in (1, 16)]
    backend = bs_triton.BACKEND
    for cpus, workers, want in ((16, None, 3), (2, None, 2), (16, 2, 2), (16, 1, 1)):
        monkeypatch.setattr(os, "cpu_count", lambda cpus=cpus: cpus)
        monkeypatch.setattr(backend, "precompile_workers", workers)
        assert backend.precompile(jobs) == {}
        assert len(fake_builders[-1].shares) == want
        got = sorted(([(p.M, s) for p, s in g] for g in fake_builders[-1].groups), key=lambda g: sols.index(g[0][1]))
        assert got == [[(1, s), (16, s)] for s in sols]


def test_groups_are_dealt_longest_first_to_the_least_loaded_process():
    """A long group gets a process of its own while the short ones share the other; each keeps first-seen order."""
    sizes = [1, 5, 1, 1, 1, 1]
    groups = [[(GemmProblem(m, 64, 64), Solution("triton", -1, 0, f"g{i}")) for m in range(1, n + 1)]
              for i, n in enumerate(sizes)]
    shares = tp.share(groups, 2)
    assert [[g[0][1].kernelName for g in part] for part in shares] == [["g1"], ["g0", "g2", "g3", "g4", "g5"]]
    assert sorted(map(len, tp.share(groups, 6))) == [1] * 6  # as many processes as groups: one each


def test_failures_and_dead_processes_map_to_kernel_names(fake_builders, monkeypatch):
    """A job that raises is kernelName -> its problem and why; a dead process fails the groups it had not finished
    (the one it died in and those after it), not those it finished nor other processes'."""
    ran = []

    def build(p, s):
        ran.append(s.kernelName)
        if s.kernelName == "raises":
            raise ValueError("out of shared memory")

    jobs = [(GemmProblem(4, 64, 64), Solution("triton", -1, 0, n)) for n in ("raises", "dies", "fine")]
    raised = {"raises": "M=4 N=64 K=64: ValueError: out of shared memory"}
    killed = "M=4 N=64 K=64: its build process was killed by SIGKILL"
    monkeypatch.setattr(tp, "start_builder", FakeBuilders(broken=("dies",)))
    assert tp.precompile_triton(jobs, build, workers=3) == {**raised, "dies": killed}
    assert ran == ["raises", "fine"]
    ran.clear()
    monkeypatch.setattr(tp, "start_builder", FakeBuilders(broken=("dies",)))
    assert tp.precompile_triton(jobs, build, workers=1) == {**raised, "dies": killed, "fine": killed}
    assert ran == ["raises"]


def test_an_interrupt_ends_the_build_processes(fake_builders, monkeypatch):
    """Ctrl-C (SIGTERM as KeyboardInterrupt) while builds run: every started process is killed and reaped, the
    interrupt goes on."""

    class Interrupted(FakeBuilder):
        def wait(self) -> int:
            self.waits = getattr(self, "waits", 0) + 1
            if not self.killed:
                raise KeyboardInterrupt
            return -signal.SIGKILL

    procs: list[Interrupted] = []
    monkeypatch.setattr(tp, "start_builder", lambda *args: procs.append(Interrupted(0)) or procs[-1])
    jobs = [(GemmProblem(4, 64, 64), Solution("triton", -1, 0, n)) for n in ("a", "b")]
    with pytest.raises(KeyboardInterrupt):
        tp.precompile_triton(jobs, lambda p, s: None)
    assert len(procs) == 2 and all(p.killed == 1 and p.waits >= 1 for p in procs)
    assert procs[1].waits == 1  # only reaped: the interrupt came while waiting on the first


def test_processes_that_cannot_start_fail_every_job_without_a_crash(fake_builders, monkeypatch, caplog):
    """The second process cannot start: the first is killed, every job fails saying why, a warning, no crash."""
    started: list[FakeBuilder] = []

    def start(index, build, groups, result) -> FakeBuilder:
        if index:
            raise OSError("cannot fork")
        started.append(FakeBuilder(0))
        return started[-1]

    monkeypatch.setattr(tp, "start_builder", start)
    jobs = [(GemmProblem(4, 64, 64), Solution("triton", -1, 0, n)) for n in ("a", "b")]
    assert tp.precompile_triton(jobs, lambda p, s: None) == {n: "not built ahead: OSError: cannot fork"
                                                             for n in ("a", "b")}
    assert "cannot build ahead (OSError: cannot fork)" in caplog.text
    assert len(started) == 1 and started[0].killed == 1


def test_a_job_the_backend_refuses_is_a_failure_saying_why(monkeypatch):
    """run_once raises the backend's why_not (here: no GPU in the process), never runs a None runner."""
    monkeypatch.setattr(tp, "probe_gpu", lambda: None)
    with pytest.raises(RuntimeError, match="no GPU in this build process"):
        moe_triton.build_job(_moe(2), _pair(PLAIN, PLAIN))


# ---- no GPU, the setting --------------------------------------------------------------------------------------------
def test_without_a_gpu_nothing_is_built(monkeypatch):
    """Interpreted (the CPU tests) or without CUDA there is nothing to compile: {} at once, no process started."""
    monkeypatch.setattr(tp, "start_builder", lambda *args: pytest.fail("a build process was started"))
    for interpret, cuda in ((True, True), (True, False), (False, False)):
        monkeypatch.setattr(tp, "INTERPRET", interpret)
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        assert not tp.compiles_here()
        assert moe_triton.BACKEND.precompile([(_moe(2), _pair(PLAIN, PLAIN))]) == {}
        assert bs_triton.BACKEND.precompile([(GemmProblem(4, 512, 256, dtype=FP8),
                                              Solution("triton", -1, 0, BLOCKSCALE))]) == {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert tp.compiles_here()


@pytest.mark.parametrize("raw, want", [("", None), ("3", 3), (" 16 ", 16), ("0", "positive integer"),
                                       ("-2", "positive integer"), ("four", "ASCII digits")])
def test_precompile_workers_setting(clean_runtime, raw, want):
    import aiter_gemm
    from aiter_gemm import get_dispatcher
    from aiter_gemm.settings import load_settings

    if isinstance(want, str):
        with pytest.raises(ValueError, match=f"AITER_GEMM_PRECOMPILE_WORKERS .*{want}"):
            load_settings({"AITER_GEMM_PRECOMPILE_WORKERS": raw})
        return
    clean_runtime.setenv("AITER_GEMM_PRECOMPILE_WORKERS", raw)
    aiter_gemm.reload_configs()
    assert get_dispatcher("fused_moe").backend("triton").precompile_workers == want


# ---- real processes ------------------------------------------------------------------------------------------------
def spawned_job(problem: GemmProblem, solution: Solution) -> None:
    """A build process's trivial job: marks (kernelName, M, pid) in $PRECOMPILE_TEST_DIR, the mark holding the file
    this process imported aiter_gemm from; raises for "bad", exits with status 3 for "exits", sleeps for "sleeps"."""
    import aiter_gemm

    if solution.kernelName == "bad":
        raise ValueError("cannot build")
    if solution.kernelName == "exits":
        os._exit(3)
    Path(os.environ[MARKS], f"{solution.kernelName}-{problem.M}-{os.getpid()}").write_text(aiter_gemm.__file__)
    if solution.kernelName == "sleeps":
        time.sleep(60)


def _marks(where: Path) -> list[list[str]]:
    return sorted(p.name.rsplit("-", 1) for p in where.iterdir())


def test_build_processes_run_each_distinct_job_once(tmp_path, monkeypatch):
    """Two real build processes: each distinct job runs once, in a process other than this one, a group's jobs in
    one process; a raising job is named."""
    monkeypatch.setenv(MARKS, str(tmp_path))
    sols = [Solution("triton", -1, 0, n) for n in ("a", "b", "bad")]
    jobs = [(GemmProblem(m, 64, 64), s) for s in sols for m in (1, 2, 1)]
    failed = tp.build_in_processes(tp.plan(jobs), spawned_job, workers=2)
    assert failed == {"bad": "M=1 N=64 K=64: ValueError: cannot build"}
    marks = _marks(tmp_path)
    assert [m for m, _ in marks] == ["a-1", "a-2", "b-1", "b-2"]
    pids = {m: pid for m, pid in marks}
    assert str(os.getpid()) not in pids.values()
    assert pids["a-1"] == pids["a-2"] and pids["b-1"] == pids["b-2"]


def test_a_build_process_that_exits_fails_only_its_unfinished_groups(tmp_path, monkeypatch):
    """A real build process exiting in its second group: its first group stays built, the second and third fail
    naming its exit status."""
    monkeypatch.setenv(MARKS, str(tmp_path))
    jobs = [(GemmProblem(1, 64, 64), Solution("triton", -1, 0, n)) for n in ("a", "exits", "b")]
    why = "M=1 N=64 K=64: its build process exited with status 3 before building it (its stderr says why)"
    assert tp.build_in_processes(tp.plan(jobs), spawned_job, workers=1) == {"exits": why, "b": why}
    assert [m for m, _ in _marks(tmp_path)] == ["a-1"]


def test_an_interrupt_kills_real_build_processes(tmp_path, monkeypatch):
    """SIGINT reaching this process while a real build process runs a job: KeyboardInterrupt goes on, and the build
    process is gone (killed and reaped), not left building."""
    monkeypatch.setenv(MARKS, str(tmp_path))
    done = threading.Event()

    def interrupt_once_building() -> None:
        while not done.is_set() and not any(tmp_path.iterdir()):
            done.wait(0.05)
        if not done.is_set():
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    # Python's own SIGINT handler for the test: an earlier test or library may have left another (or SIG_IGN).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    watcher = threading.Thread(target=interrupt_once_building)
    watcher.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            tp.build_in_processes([[(GemmProblem(1, 64, 64), Solution("triton", -1, 0, "sleeps"))]], spawned_job)
    finally:
        done.set()
        watcher.join()
        signal.signal(signal.SIGINT, previous)
    ((_, pid),) = _marks(tmp_path)
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid), 0)


CALLER = """
import os
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[2])  # the checkout, on this process's sys.path only
Path(sys.argv[1], f"main-{os.getpid()}").write_text("")  # top-level side effect, no __main__ guard
from aiter_gemm.backends import _triton_precompile as tp
from aiter_gemm.backends.base import GemmProblem, Solution
from op_tests.test_triton_precompile import spawned_job

groups = [[(GemmProblem(1, 64, 64), Solution("triton", -1, 0, n))] for n in ("a", "b")]
print("failed:", tp.build_in_processes(groups, spawned_job, workers=2))
"""


def test_a_callers_main_is_not_run_again_in_the_build_processes(tmp_path):
    """A script whose top level has a side effect and calls the build, without an ``if __name__ == "__main__":``
    guard: its top level runs once (the build processes never import its ``__main__``), the jobs run in two other
    processes, which import aiter_gemm from the checkout the script put on its sys.path, not from an ``aiter_gemm``
    in the working directory (not on the script's sys.path)."""
    marks, script, decoy = tmp_path / "marks", tmp_path / "bin" / "serve.py", tmp_path / "aiter_gemm" / "__init__.py"
    for path in (marks, script.parent, decoy.parent):
        path.mkdir()
    script.write_text(CALLER)
    decoy.write_text("raise ImportError('the working directory was put on sys.path')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {MARKS: str(marks)}
    res = subprocess.run([sys.executable, str(script), str(marks), str(REPO)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "failed: {}" in res.stdout, res.stderr
    got = _marks(marks)
    assert [m for m, _ in got] == ["a-1", "b-1", "main"]
    assert len({pid for _, pid in got}) == 3
    assert all((marks / f"{m}-{pid}").read_text().startswith(str(REPO / "aiter_gemm")) for m, pid in got[:2])


# ---- on a GPU: the first launch after precompile is a cache load --------------------------------------------------
def first_launch_hits(op: str, problem, solution: Solution) -> list[bool]:
    """In a fresh process: the tuner's inputs for ``problem``, then the backend's runner once with a compilation
    listener; each kernel Triton got: loaded from its cache (True) or compiled (False)."""
    import triton

    from aiter_gemm.device import probe_gpu
    from aiter_gemm.registry import get_backend, op_spec

    spec = op_spec(op)
    ident = probe_gpu()
    runner = get_backend(solution.libtype, spec.backends).prepare(problem, solution, ident)
    data = spec.make_inputs(problem, 0, ident.torch_device(), 0, {})
    hits: list[bool] = []
    triton.knobs.compilation.listener = lambda *, cache_hit, **_: hits.append(cache_hit)
    spec.call_runner(runner, data.sets[0], problem)
    torch.cuda.synchronize()
    return hits


GPU_CASES = [
    ("fused_moe", moe_triton.BACKEND, _moe(3), _moe(5), _pair(PLAIN, PLAIN)),
    ("fused_moe", moe_triton.BACKEND, _moe(3), _moe(7), _pair(DIRECT, KSUM)),
    ("fused_moe", moe_triton.BACKEND, _moe(3, fp8=True), _moe(6, fp8=True),
     _pair("moe_BM16_BN64_BK128_GM1_SK1_W4_S3_QA", "moe_BM16_BN64_BK128_GM1_SK1_W4_S3")),
    ("gemm_a8w8_blockscale", bs_triton.BACKEND, GemmProblem(16, 512, 256, dtype=FP8),
     GemmProblem(16, 512, 256, dtype=FP8), Solution("triton", -1, 0, f"{BLOCKSCALE}_TMA")),
]


@pytest.mark.gpu
@pytest.mark.parametrize("op, backend, built, launched, sol", GPU_CASES)
def test_after_precompile_the_first_launch_compiles_nothing(tmp_path, monkeypatch, op, backend, built, launched, sol):
    """With a fresh TRITON_CACHE_DIR, the first launch compiles (the check can fail); after precompile of ``built``
    (a MoE token count with ``launched``'s kernels), every kernel of ``launched``'s first launch is a cache load."""
    import triton

    if not hasattr(getattr(getattr(triton, "knobs", None), "compilation", None), "listener"):
        pytest.skip("this Triton has no compilation listener (Triton >= 3.4 has)")
    ctx = mp.get_context("spawn")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cold"))
    with ctx.Pool(1) as pool:
        assert False in pool.apply(first_launch_hits, (op, launched, sol))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "warm"))
    if op == "fused_moe":
        assert moe_triton.kernel_variant(built, sol) == moe_triton.kernel_variant(launched, sol)
    assert backend.precompile([(built, sol)]) == {}
    with ctx.Pool(1) as pool:
        hits = pool.apply(first_launch_hits, (op, launched, sol))
    assert hits and all(hits)
