"""Triton kernels built ahead in parallel (:mod:`aiter_gemm.backends._triton_precompile`) for the ``fused_moe`` and
``gemm_a8w8_blockscale`` Triton backends: jobs deduplicated (a MoE solution's token counts share kernels unless
GEMM1's ``ZERO_BLOCK`` differs), grouped per solution and split over the build processes, failures and dead
processes named per kernel, nothing done without a GPU, the process count from ``AITER_GEMM_PRECOMPILE_WORKERS``.
The pool is faked in-process, or real spawned processes run a trivial job; the GPU test checks that a candidate's
first launch after ``precompile`` compiles nothing."""

from __future__ import annotations

import multiprocessing as mp
import os
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
from op_tests.runtime_helpers import FakePool

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
def fake_pool(monkeypatch):
    """Builds "compile" here (the GPU check passes) on :class:`FakePool`; the list holds the pools started."""
    pools: list[FakePool] = []

    def start(n: int) -> FakePool:
        pools.append(FakePool(n))
        return pools[-1]

    monkeypatch.setattr(tp, "compiles_here", lambda: True)
    monkeypatch.setattr(tp, "spawn_builders", start)
    return pools


# ---- what is built, where ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("first, second", [(PLAIN, PLAIN), (PLAIN, KSUM), (DIRECT, KSUM)])
@pytest.mark.parametrize("token", [1, 2, 5, 16, 33, 64])
def test_zero_block_is_what_the_launch_passes_gemm1(monkeypatch, first, second, token):
    """:func:`~aiter_gemm.kernels.fused_moe.zero_block`, the token count's one say in the kernels, is the
    ``ZERO_BLOCK`` the launcher gives GEMM1 (and GEMM2 gets 0)."""
    got = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: got.append(kw["ZERO_BLOCK"])

    monkeypatch.setattr(fm, "_fused_moe_kernel", Recorder())
    c1, c2 = MoeConfig.parse(first), MoeConfig.parse(second)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # moe_align runs: interpreted on CPU
    inputs = fm.zero_inputs(token, 128, 64, 4, 2, torch.bfloat16, False, device)
    fm.launch_fused_moe(*inputs, "silu", c1, c2)
    assert got == [fm.zero_block(token, 4, 2, 128, 64, c1, c2), 0]
    assert (got[0] > 0) == (second == KSUM)


def test_moe_jobs_dedupe_token_counts_that_share_kernels(fake_pool, monkeypatch):
    """One build per solution and ZERO_BLOCK: the plain pair's token counts all share one; the KSUM pair's differ
    where ZERO_BLOCK does; a duplicate job is built once; each solution is one group, in first-seen order."""
    built = []
    monkeypatch.setattr(moe_triton, "build_job", lambda p, s: built.append((p.token, s.kernelName)))
    plain, ksum = _pair(PLAIN, PLAIN), _pair(PLAIN, KSUM)
    tokens = [1, 2, 4, 8, 16, 32, 64]
    jobs = [(_moe(t), s) for t in tokens for s in (plain, ksum)] + [(_moe(1), plain)]
    assert moe_triton.BACKEND.precompile(jobs) == {}
    zero = {t: fm.zero_block(t, 4, 2, 128, 64, MoeConfig.parse(PLAIN), MoeConfig.parse(KSUM)) for t in tokens}
    want_ksum = [t for t in tokens if t == min(u for u in tokens if zero[u] == zero[t])]
    assert len(set(zero.values())) > 1  # the case tells the two apart
    assert built == [(1, plain.kernelName)] + [(t, ksum.kernelName) for t in want_ksum]
    (pool,) = fake_pool
    assert pool.n == 2 and [[s for _, s in g] for g in pool.groups] == [[plain], [ksum] * len(want_ksum)]
    assert pool.shut


def test_groups_split_over_at_most_the_workers_asked(fake_pool, monkeypatch):
    """min(workers, solutions) processes (by default min(8, CPUs)); every group submitted once; blockscale jobs of
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
        assert fake_pool[-1].n == want
        assert [[(p.M, s) for p, s in g] for g in fake_pool[-1].groups] == [[(1, s), (16, s)] for s in sols]


def test_failures_and_dead_processes_map_to_kernel_names(fake_pool, monkeypatch):
    """A job that raises is kernelName -> its problem and why; a group whose process died fails as a whole; the
    other groups' builds go on."""
    ran = []

    def build(p, s):
        ran.append(s.kernelName)
        if s.kernelName == "raises":
            raise ValueError("out of shared memory")

    monkeypatch.setattr(tp, "spawn_builders", lambda n: FakePool(n, broken=("dies",)))
    jobs = [(GemmProblem(4, 64, 64), Solution("triton", -1, 0, n)) for n in ("raises", "dies", "fine")]
    failed = tp.precompile_triton(jobs, build, workers=3)
    assert failed == {"raises": "M=4 N=64 K=64: ValueError: out of shared memory",
                      "dies": "M=4 N=64 K=64: its build process failed: BrokenProcessPool: a process in the pool "
                              "was terminated abruptly"}
    assert ran == ["raises", "fine"]


def test_an_interrupt_ends_the_build_processes(fake_pool, monkeypatch):
    """Ctrl-C (SIGTERM as KeyboardInterrupt) while builds run: what has not started is cancelled, the processes are
    killed, the interrupt goes on."""
    killed = []

    class Proc:
        def kill(self) -> None:
            killed.append(self)

    class Interrupted(FakePool):
        def submit(self, fn, build, group):
            raise KeyboardInterrupt

        def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
            self.stopped = (wait, cancel_futures)
            self._processes = None  # as ProcessPoolExecutor.shutdown forgets them

    pool = Interrupted(2)
    pool._processes = {1: Proc(), 2: Proc()}
    monkeypatch.setattr(tp, "spawn_builders", lambda n: pool)
    jobs = [(GemmProblem(4, 64, 64), Solution("triton", -1, 0, n)) for n in ("a", "b")]
    with pytest.raises(KeyboardInterrupt):
        tp.precompile_triton(jobs, lambda p, s: None)
    assert pool.stopped == (False, True) and len(killed) == 2


def test_processes_that_cannot_start_fail_every_job_without_a_crash(fake_pool, monkeypatch, caplog):
    class NoProcesses(FakePool):
        def submit(self, fn, build, group):
            raise OSError("cannot fork")

    monkeypatch.setattr(tp, "spawn_builders", NoProcesses)
    jobs = [(GemmProblem(4, 64, 64), Solution("triton", -1, 0, n)) for n in ("a", "b")]
    assert tp.precompile_triton(jobs, lambda p, s: None) == {n: "not built ahead: OSError: cannot fork"
                                                             for n in ("a", "b")}
    assert "cannot build ahead (OSError: cannot fork)" in caplog.text


def test_a_job_the_backend_refuses_is_a_failure_saying_why(monkeypatch):
    """run_once raises the backend's why_not (here: no GPU in the process), never runs a None runner."""
    monkeypatch.setattr(tp, "probe_gpu", lambda: None)
    with pytest.raises(RuntimeError, match="no GPU in this build process"):
        moe_triton.build_job(_moe(2), _pair(PLAIN, PLAIN))


# ---- no GPU, the setting --------------------------------------------------------------------------------------------
def test_without_a_gpu_nothing_is_built(monkeypatch):
    """Interpreted (the CPU tests) or without CUDA there is nothing to compile: {} at once, no process started."""
    monkeypatch.setattr(tp, "spawn_builders", lambda n: pytest.fail("a build process was started"))
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
    """A build process's trivial job: marks (kernelName, M, pid) in $PRECOMPILE_TEST_DIR, or raises for "bad"."""
    if solution.kernelName == "bad":
        raise ValueError("cannot build")
    Path(os.environ[MARKS], f"{solution.kernelName}-{problem.M}-{os.getpid()}").touch()


def test_spawned_processes_run_each_distinct_job_once(tmp_path, monkeypatch):
    """Two real spawned processes: each distinct job runs once, in a process other than this one, a group's jobs in
    one process; a raising job is named."""
    monkeypatch.setenv(MARKS, str(tmp_path))
    sols = [Solution("triton", -1, 0, n) for n in ("a", "b", "bad")]
    jobs = [(GemmProblem(m, 64, 64), s) for s in sols for m in (1, 2, 1)]
    failed = tp.build_in_processes(tp.plan(jobs), spawned_job, workers=2)
    assert failed == {"bad": "M=1 N=64 K=64: ValueError: cannot build"}
    marks = sorted(p.name.rsplit("-", 1) for p in tmp_path.iterdir())
    assert [m for m, _ in marks] == ["a-1", "a-2", "b-1", "b-2"]
    pids = {m: pid for m, pid in marks}
    assert str(os.getpid()) not in pids.values()
    assert pids["a-1"] == pids["a-2"] and pids["b-1"] == pids["b-2"]


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
