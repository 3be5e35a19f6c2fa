"""Dispatch: AITER's lookup order on AITER's own CSV, padding, defaults, unavailable backends, caching, logging."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import aiter_gemm
from aiter_gemm import get_padded_m
from aiter_gemm import registry as backends
from op_tests.runtime_helpers import BF16_HEADER, FakeBackend, bf16_row

FIXTURE = Path(__file__).parent / "fixtures" / "aiter_bf16_tuned_gemm.csv"
BF16, F32 = torch.bfloat16, torch.float32


@pytest.mark.parametrize(
    ("M", "N", "gl0", "gl1"),
    [(1, 4096, 16, 1), (0, 4096, 0, 1), (16, 4096, 16, 16), (17, 4096, 32, 32), (250, 4096, 256, 256),
     (257, 4096, 288, 512), (1000, 4096, 1024, 1024), (1025, 4096, 1088, 2048), (4096, 4096, 4096, 4096),
     (4097, 4096, 4224, 8192), (9000, 8192, 9088, 8192), (9000, 4096, 9088, 16384), (8193, 4097, 8320, 8192)],
)
def test_get_padded_m_matches_aiter(M, N, gl0, gl1):
    assert get_padded_m(M, N, 64, 0) == gl0
    assert get_padded_m(M, N, 64, 1) == gl1


@pytest.fixture
def aiter_csv(clean_runtime):
    """AITER's gfx950 CSV, the device pretending to be a 256-CU gfx950, fake asm/opus backends (flydsl stays absent)."""
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(FIXTURE))
    clean_runtime.setenv("AITER_GEMM_ARCH", "gfx950")
    clean_runtime.setenv("AITER_GEMM_CU_NUM", "256")
    fakes = {name: FakeBackend(name) for name in ("asm", "opus")}
    for b in fakes.values():
        backends.register_backend(b)
    aiter_gemm.reload_configs()
    yield fakes
    for name in fakes:
        backends.unregister_backend(name)


@pytest.mark.parametrize(
    ("M", "N", "K", "matched", "libtype", "line"),
    [
        (64, 256, 5120, "exact", "asm", 2),
        (256, 256, 5120, "exact", "opus", 8),
        (66, 256, 5120, "padded_gl0", "asm", 3),  # 66 -> 80
        (3, 6144, 2048, "padded_gl0", "asm", 40),  # 3 -> 16
        (33, 256, 5120, "padded_gl1", "asm", 2),  # 33 -> 48 (no row) -> 64
        (133, 2048, 6144, "padded_gl1", "opus", 67),  # 133 -> 144 (no row) -> 256
        (3, 6144, 3072, "default", None, None),  # both padded rows are flydsl: unavailable here -> default
        (5, 777, 5120, "default", None, None),  # no row at all
    ],
)
def test_lookup_on_aiter_csv(aiter_csv, M, N, K, matched, libtype, line):
    cfg = aiter_gemm.get_GEMM_A16W16_config(M, N, K, False, "torch.bfloat16", torch.float32)
    default = aiter_gemm.get_dispatcher().default_decision(aiter_gemm.GemmProblem(M, N, K, False, BF16, F32),
                                                   aiter_gemm.current_device_identity())
    assert (cfg["matched"], cfg["libtype"], cfg["line"]) == (matched, libtype or default.solution.libtype, line)
    assert cfg["gfx"] == "gfx950" and cfg["cu_num"] == 256
    if matched != "default":
        assert cfg["source"] == str(FIXTURE)
        assert isinstance(cfg["solidx"], int) and cfg["us"] > 0


def test_hit_runs_the_row_backend_and_result_is_correct(aiter_csv):
    a, b = torch.randn(66, 5120, dtype=BF16), torch.randn(256, 5120, dtype=BF16)
    out = aiter_gemm.gemm_a16w16(a, b, otype=F32)
    assert out.dtype == F32 and aiter_csv["asm"].calls == 1
    (problem, sol), = aiter_csv["asm"].prepared
    assert (problem.M, sol.solidx, sol.kernelName) == (66, 7, "_ZN5aiter39bf16gemm_fp32bf16_tn_80x64_splitk_cleanE")
    torch.testing.assert_close(out, (a.float() @ b.float().t()), rtol=2e-2, atol=2e-1)


def test_unavailable_libtype_warns_once(aiter_csv, caplog):
    with caplog.at_level(logging.WARNING, logger="aiter_gemm"):
        for m in (3, 4, 9):
            aiter_gemm.get_GEMM_A16W16_config(m, 6144, 3072, False, BF16, F32)
    assert caplog.text.count("libtype 'flydsl'") == 1


def test_rejected_solution_is_a_miss_naming_file_and_line(clean_runtime, tmp_path, caplog):
    p = tmp_path / "t.csv"
    p.write_text(BF16_HEADER + bf16_row(16, 96, 80, "rt_fake", 1.0, solidx=13)
                 + bf16_row(32, 96, 80, "rt_fake", 1.0))
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(p))
    backends.register_backend(FakeBackend("rt_fake", reject_solidx=13))
    try:
        aiter_gemm.reload_configs()
        with caplog.at_level(logging.WARNING, logger="aiter_gemm"):
            exact = aiter_gemm.get_GEMM_A16W16_config(16, 96, 80, False, F32)
        # the exact row (solidx 13) is rejected; M=16 pads to 16 at gl0 (same key, skipped) and 16 at gl1 -> default
        assert exact["matched"] == "default"
        assert f"{p}:2" in caplog.text
        padded = aiter_gemm.get_GEMM_A16W16_config(17, 96, 80, False, F32)
        assert (padded["matched"], padded["libtype"], padded["line"]) == ("padded_gl0", "rt_fake", 3)
    finally:
        backends.unregister_backend("rt_fake")


def test_default_prefers_highest_priority_backend_that_accepts(clean_runtime):
    skinny = FakeBackend("fakeskinny", default_max_m=4, priority=10_000)
    backends.register_backend(skinny)
    try:
        aiter_gemm.reload_configs()
        assert aiter_gemm.get_GEMM_A16W16_config(4, 64, 64, False, F32)["libtype"] == "fakeskinny"
        assert aiter_gemm.get_GEMM_A16W16_config(5, 64, 64, False, F32)["libtype"] != "fakeskinny"
    finally:
        backends.unregister_backend("fakeskinny")


def test_preshuffled_weight_needs_blaslt(clean_runtime):
    with pytest.raises(RuntimeError, match="pre-shuffled weight needs a BLASLt backend"):
        aiter_gemm.get_GEMM_A16W16_config(4, 64, 64, False, F32, bpreshuffle=True)
    blaslt = FakeBackend("fakeblaslt", blaslt=True, priority=1)
    backends.register_backend(blaslt)
    try:
        aiter_gemm.reload_configs()
        cfg = aiter_gemm.get_GEMM_A16W16_config(4, 64, 64, False, F32, bpreshuffle=True)
        assert (cfg["libtype"], cfg["solidx"]) == ("fakeblaslt", -1)
        w = torch.randn(64, 64)
        w.is_shuffled = True
        aiter_gemm.gemm_a16w16(torch.randn(4, 64), w)
        assert blaslt.calls == 1
    finally:
        backends.unregister_backend("fakeblaslt")


def test_decision_cached_and_reload_rereads_files(clean_runtime, tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(BF16_HEADER)
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(p))
    fake = FakeBackend("rt_fake")
    backends.register_backend(fake)
    try:
        aiter_gemm.reload_configs()
        a, b = torch.randn(8, 80), torch.randn(96, 80)
        aiter_gemm.gemm_a16w16(a, b)
        p.write_text(BF16_HEADER + bf16_row(8, 96, 80, "rt_fake"))
        aiter_gemm.gemm_a16w16(a, b)
        assert fake.calls == 0, "files are read once: a changed file needs reload_configs()"
        assert len(aiter_gemm.get_dispatcher().cache.calls) == 1
        aiter_gemm.reload_configs()
        aiter_gemm.gemm_a16w16(a, b)
        aiter_gemm.gemm_a16w16(a, b)
        assert fake.calls == 2 and len(fake.prepared) == 1, "prepared once per shape, run per call"
    finally:
        backends.unregister_backend("rt_fake")


def test_env_read_once_until_reload(clean_runtime, tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(BF16_HEADER + bf16_row(8, 96, 80, "torch", gfx="sm_test", cu_num=7))
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(p))
    aiter_gemm.reload_configs()
    assert aiter_gemm.get_GEMM_A16W16_config(8, 96, 80, False, F32)["matched"] == "default"
    clean_runtime.setenv("AITER_GEMM_ARCH", "sm_test")
    clean_runtime.setenv("AITER_GEMM_CU_NUM", "7")
    assert aiter_gemm.get_GEMM_A16W16_config(8, 96, 80, False, F32)["matched"] == "default"
    aiter_gemm.reload_configs()
    assert aiter_gemm.get_GEMM_A16W16_config(8, 96, 80, False, F32)["matched"] == "exact"
    assert (aiter_gemm.current_device_identity().gfx, aiter_gemm.current_device_identity().cu_num) == ("sm_test", 7)


def test_log_tuned_config_once_per_shape(clean_runtime, caplog):
    clean_runtime.setenv("AITER_LOG_TUNED_CONFIG", "1")
    aiter_gemm.reload_configs()
    a, b = torch.randn(8, 80), torch.randn(96, 80)
    with caplog.at_level(logging.INFO, logger="aiter_gemm"):
        for _ in range(3):
            aiter_gemm.gemm_a16w16(a, b)
        aiter_gemm.gemm_a16w16(torch.randn(9, 80), b)
    lines = [r.getMessage() for r in caplog.records if "matched=" in r.getMessage()]
    assert len(lines) == 2 and "M=8 N=96 K=80" in lines[0] and "M=9 N=96 K=80" in lines[1]
    assert "source=default heuristic" in lines[0] and "matched=default" in lines[0]


def test_import_loads_no_optional_backend():
    code = ("import sys, aiter_gemm; bad = [m for m in ('triton', 'nvmath', 'ray', 'aiter_gemm.backends.triton', "
            "'aiter_gemm.backends.skinny', 'aiter_gemm.backends.cublaslt') if m in sys.modules]; print(bad); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


def test_unknown_libtype_reports_reason():
    b = backends.get_backend("no_such_lib")
    assert not b.is_available() and "no backend module" in b.unavailable_reason()


# ---- checked padded ranges (pad_m_min) ----------------------------------------------------------------------------
def _rows_with_pad(path, rows: list[tuple[int, int | None]], libtype="rt_fake"):
    """A tuned file of rows (M, pad_m_min) for N=96 K=80, every one naming ``libtype`` with solidx = M."""
    import aiter_gemm as ag

    ident = ag.current_device_identity()
    lines = [BF16_HEADER.strip() + ",pad_m_min\n"]
    for m, pad in rows:
        lines.append(f"{ident.gfx},{ident.cu_num},{m},96,80,False,torch.float32,torch.float32,False,False,{libtype},"
                     f"{m},0,1.0,k{m},{'' if pad is None else pad}\n")
    path.write_text("".join(lines))


@pytest.mark.parametrize(("pad", "M", "matched"), [
    (993, 1024, "exact"),
    (993, 1000, "padded_gl0"),  # 1000 pads (gl0) to 1024: inside the checked range 993..1024
    (993, 777, "default"),  # 777 -> 800 (no row) -> 1024 at gl1: below the checked range, so not used
    (513, 777, "padded_gl1"),  # checked down to 513: used
    (None, 777, "padded_gl1"),  # no pad_m_min (an AITER row): AITER's rule, any M that pads to it
    (None, 1000, "padded_gl0"),
])
def test_padded_row_used_only_inside_its_checked_range(clean_runtime, tmp_path, pad, M, matched):
    path = tmp_path / "t.csv"
    _rows_with_pad(path, [(1024, pad)])
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(path))
    backends.register_backend(FakeBackend("rt_fake"))
    try:
        aiter_gemm.reload_configs()
        cfg = aiter_gemm.get_GEMM_A16W16_config(M, 96, 80, False, F32)
        assert cfg["matched"] == matched
        assert (cfg["libtype"] == "rt_fake") == (matched != "default")
        if matched != "default":
            assert cfg["solidx"] == 1024
    finally:
        backends.unregister_backend("rt_fake")


def test_pad_m_min_above_m_is_a_config_error(clean_runtime, tmp_path, caplog):
    from aiter_gemm.configs import load_table

    path = tmp_path / "t.csv"
    _rows_with_pad(path, [(64, 65)])
    with pytest.raises(aiter_gemm.ConfigError, match=r"t\.csv:2, column 'pad_m_min'"):
        load_table("GEMM_BF16", [path])  # the validating reader
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(path))
    aiter_gemm.reload_configs()  # the runtime skips the file, naming it, and runs on defaults
    assert "t.csv:2, column 'pad_m_min'" in caplog.text and aiter_gemm.get_config_table("GEMM_BF16").sources == ()


# ---- eager calls on GPUs: launch-heavy choices give way to the cheap default ---------------------------------------
class _Launchy(FakeBackend):
    cheap_launch = False


@pytest.fixture
def launchy(clean_runtime):
    """A launch-heavy fake backend that claims M <= 4 as the default, ahead of torch."""
    b = _Launchy("launchy", default_max_m=4, priority=10_000)
    backends.register_backend(b)
    aiter_gemm.reload_configs()
    yield b
    backends.unregister_backend("launchy")


H100 = aiter_gemm.device.DeviceIdentity("sm_90", 132, "cuda", "H100")


def test_gpu_decision_of_a_launch_heavy_backend_runs_the_cheap_default_when_not_capturing(launchy, monkeypatch):
    disp = aiter_gemm.get_dispatcher()
    dec = disp._decide(aiter_gemm.GemmProblem(4, 64, 32, False, F32, F32), H100)
    assert dec.solution.libtype == "launchy" and dec.eager_solution.libtype == "torch"
    cfg = dec.as_config()
    assert (cfg["libtype"], cfg["eager_libtype"]) == ("launchy", "torch")
    capturing = {"on": False}
    monkeypatch.setattr(aiter_gemm.cudagraph, "probe", lambda: lambda: capturing["on"])
    run = dec.call_runner
    a, b = torch.randn(4, 32), torch.randn(64, 32)
    run(a, b, None, F32, None, None, None)  # first eager call: also runs the graph runner once (its warm-up)
    assert launchy.calls == 1
    run(a, b, None, F32, None, None, None)
    assert launchy.calls == 1  # eager: the cheap default ran
    capturing["on"] = True
    out = run(a, b, None, F32, None, None, None)
    assert launchy.calls == 2 and out.shape == (4, 64)  # capture: the tuned choice


class _Graph:
    """Stands in for torch.cuda.CUDAGraph on CPU: capture_begin fails when told to, capture_end may raise."""

    def capture_begin(self, pool=None, capture_error_mode="global"):
        if capture_error_mode == "bad":
            raise RuntimeError("capture could not begin")

    def capture_end(self):
        if getattr(self, "broken", False):
            raise RuntimeError("capture invalidated")


def test_capture_counting_follows_begin_and_end_per_thread():
    import threading

    from aiter_gemm.cudagraph import capturing, count_captures

    class G(_Graph):
        pass

    assert count_captures(G) and count_captures(G)  # the second call wraps nothing again
    g = G()
    assert not capturing()
    with pytest.raises(RuntimeError):
        g.capture_begin(capture_error_mode="bad")
    assert not capturing()  # a capture that did not begin is not counted
    g.capture_begin()
    seen = []
    t = threading.Thread(target=lambda: seen.append(capturing()))
    t.start()
    t.join()
    assert capturing() and seen == [False]  # another thread's eager calls are not in this capture
    g.broken = True
    with pytest.raises(RuntimeError):
        g.capture_end()
    assert not capturing()  # an invalidated capture is over too
    g.broken = False
    g.capture_end()  # an unmatched end does not go below zero
    g.capture_begin()
    assert capturing()
    g.capture_end()
    assert not capturing()
    assert not count_captures(type("NoCapture", (), {}))


def test_eager_timed_rows_and_cpu_decisions_keep_their_backend(launchy, clean_runtime, tmp_path):
    disp = aiter_gemm.get_dispatcher()
    assert disp._decide(aiter_gemm.GemmProblem(4, 64, 32, False, F32, F32),
                        aiter_gemm.current_device_identity(False)).eager_solution is None  # CPU: no graphs
    path = tmp_path / "t.csv"
    path.write_text(BF16_HEADER.strip() + ",timing\n" + bf16_row(8, 64, 32, "launchy", gfx="sm_90", cu_num=132,
                                                                  solidx=3).strip() + ",eager\n"
                    + bf16_row(16, 64, 32, "launchy", gfx="sm_90", cu_num=132, solidx=4).strip() + ",graph\n")
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(path))
    aiter_gemm.reload_configs()
    disp = aiter_gemm.get_dispatcher()
    eager_row = disp._decide(aiter_gemm.GemmProblem(8, 64, 32, False, F32, F32), H100)
    graph_row = disp._decide(aiter_gemm.GemmProblem(16, 64, 32, False, F32, F32), H100)
    assert eager_row.matched == "exact" and eager_row.eager_solution is None  # timed eagerly: used eagerly
    assert graph_row.matched == "exact" and graph_row.eager_solution.libtype == "torch"


class _HostCostly(FakeBackend):
    eager_min_us = 30.0  # as cublaslt: cheap enough to launch, but not on calls this short


def test_short_rows_of_a_host_costly_backend_run_the_cheap_default_eagerly(clean_runtime, tmp_path):
    """Rows faster than the backend's eager_min_us are host-bound when called eagerly: the default runs there;
    longer rows, eager-timed rows and CUDA-graph capture keep the tuned choice."""
    backends.register_backend(_HostCostly("costly"))
    try:
        path = tmp_path / "t.csv"
        path.write_text(BF16_HEADER.strip() + ",timing\n"
                        + bf16_row(8, 64, 32, "costly", 12.0, gfx="sm_90", cu_num=132).strip() + ",graph\n"
                        + bf16_row(16, 64, 32, "costly", 45.0, gfx="sm_90", cu_num=132).strip() + ",graph\n"
                        + bf16_row(32, 64, 32, "costly", 12.0, gfx="sm_90", cu_num=132).strip() + ",eager\n")
        clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(path))
        aiter_gemm.reload_configs()
        disp = aiter_gemm.get_dispatcher()
        got = {M: disp._decide(aiter_gemm.GemmProblem(M, 64, 32, False, F32, F32), H100) for M in (8, 16, 32)}
        assert all(d.matched == "exact" and d.solution.libtype == "costly" for d in got.values())
        assert got[8].eager_solution.libtype == "torch"  # 12 us: host-bound eagerly
        assert got[16].eager_solution is None and got[32].eager_solution is None  # 45 us; timed eagerly
        assert disp._decide(aiter_gemm.GemmProblem(8, 64, 32, False, F32, F32),
                            aiter_gemm.current_device_identity(False)).eager_solution is None  # CPU: no graphs
    finally:
        backends.unregister_backend("costly")


@pytest.mark.parametrize("shape", [(4, 32), (2, 2, 32)])
def test_eager_plain_calls_skip_the_switch_but_capture_runs_the_tuned_choice(launchy, monkeypatch, shape):
    """gemm_a16w16 itself: where eager calls run plain F.linear, they call it on A as given (no switch, no reshape);
    the first call warms the capture-time runner up; a capturing call runs it."""
    from aiter_gemm.ops import a16w16 as ops

    disp = aiter_gemm.get_dispatcher()
    monkeypatch.setitem(disp._devices, False, H100)  # decide as on a GPU, run on CPU tensors
    capturing = {"on": False}
    monkeypatch.setattr(aiter_gemm.cudagraph, "probe", lambda: lambda: capturing["on"])
    a, b = torch.randn(*shape), torch.randn(64, 32)
    out = ops.gemm_a16w16(a, b)
    assert launchy.calls == 1 and torch.equal(out, F.linear(a, b))  # warm-up ran the tuned runner once
    out = ops.gemm_a16w16(a, b)
    assert launchy.calls == 1 and out.shape == (*shape[:-1], 64)  # eager: plain F.linear
    key = next(k for k in disp.cache.calls if k[0] == a.shape)
    assert disp.cache.calls[key][4] is not None
    capturing["on"] = True
    out = ops.gemm_a16w16(a, b)
    assert launchy.calls == 2 and torch.allclose(out, F.linear(a, b))
