"""End-to-end tuner runs on CPU with real worker processes: fault isolation (fake backends that raise, hang, return
wrong numbers, kill their process), phase-1 screening, CLI flag semantics, SIGKILL of the driver then resume,
and the runtime replaying the rows written."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch

import op_tests.gradlib_fakes  # noqa: F401  (registers fake, fakelt, fakeslow in this process too)
from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.fileio import read_csv_rows
from aiter_gemm.timing import TimingConfig
from gradlib.a16w16 import tuned_problems
from gradlib.gemm_tuner import main
from gradlib.pool import ItemDone, ProcessPool, TaskDone
from gradlib.records import TIME, Task
from op_tests.runtime_helpers import kill_then_resume, repo_env

REPO = Path(__file__).resolve().parent.parent
PLUGIN = "op_tests.gradlib_fakes"
QUICK = TimingConfig(warmup=1, reps=3, target_us=0, budget_s=0.2)
UNTUNED = "M,N,K\n1,64,32\n17,96,64\n"


# CPU tuner workers (conftest.cpu_tuner_workers) for every test here but GPU-marked ones, timing on the virtual
# clock (conftest.virtual_clock): the fakes' declared times, whatever the machine's load.
pytestmark = pytest.mark.usefixtures("cpu_tuner_workers", "virtual_clock")


def _untuned(tmp_path: Path, text: str = UNTUNED) -> Path:
    path = tmp_path / "untuned.csv"
    path.write_text(text)
    return path


def _run(*args: str) -> int:
    return main([*map(str, args), "--plugin", PLUGIN])


def _profile(path: Path) -> dict[tuple, dict]:
    return {(r["M"], r["phase"], r["libtype"], int(r["solidx"])): r for r in read_csv_rows(path)[1]}


# ---- the pool on its own ---------------------------------------------------------------------------------------
def test_pool_isolates_sleep_raise_exit_kill_and_timeout():
    behaviours = ["good_fast", "raises", "exits", "hangs", "sigkill", "good_slow"]
    names = list(op_tests.gradlib_fakes.FAKE_BEHAVIOURS)
    sols = tuple(Solution("fake", names.index(b), 0, b) for b in behaviours)
    task = Task(0, 0, TIME, GemmProblem(3, 16, 8), sols, QUICK, check=False)
    results, done = {}, []
    with ProcessPool([None], [PLUGIN], timeout=3.0) as pool:
        pool.submit(task)
        deadline = time.monotonic() + 120
        while not done and time.monotonic() < deadline:
            for ev in pool.poll(0.5):
                if isinstance(ev, ItemDone):
                    assert ev.result.index not in results  # exactly one result per item
                    results[ev.result.index] = ev.result
                elif isinstance(ev, TaskDone):
                    done.append(ev.task)
        restarts = pool.restarts
    assert done and sorted(results) == list(range(len(sols)))
    by_name = {b: results[i] for i, b in enumerate(behaviours)}
    assert by_name["good_fast"].ok and by_name["good_slow"].ok
    assert by_name["good_slow"].us == pytest.approx(5000 + 1)  # its 5 ms and the tick, on the worker's virtual clock
    assert "fake kernel launch failure" in by_name["raises"].error
    assert "exit code 7" in by_name["exits"].error
    assert "timed out after 3 s" in by_name["hangs"].error
    assert "signal 9" in by_name["sigkill"].error
    assert not any(by_name[b].ok for b in ("raises", "exits", "hangs", "sigkill"))
    assert restarts == 3  # exit, hang, SIGKILL; a raise on a healthy (CPU) device needs no restart


# ---- tuner runs ----------------------------------------------------------------------------------------------------
def test_end_to_end_torch_rows_and_runtime_replay(tmp_path, clean_runtime):
    import aiter_gemm

    untuned = _untuned(tmp_path)
    before = untuned.read_bytes()
    tuned = tmp_path / "tuned.csv"
    summary = tmp_path / "summary.csv"
    assert _run("-i", untuned, "-o", tuned, "--libtype", "torch,fakeslow", "--summary_file", summary) == 0
    assert untuned.read_bytes() == before  # the input is never written
    summ = read_csv_rows(summary)[1]
    assert [s["status"] for s in summ] == ["tuned", "tuned"] and all(s["timed"] == "2" for s in summ)
    assert all(float(s["speedup"]) >= 1.0 for s in summ)  # the winner is never slower than the torch baseline
    rows = read_csv_rows(tuned)[1]
    assert [(r["M"], r["N"], r["K"]) for r in rows] == [("1", "64", "32"), ("17", "96", "64")]
    assert all(r["gfx"] == "cpu" and r["cu_num"] == str(os.cpu_count()) for r in rows)
    assert all(float(r["us"]) > 0 and float(r["err_ratio"]) <= 0.05 for r in rows)
    assert all(r["libtype"] in ("torch", "fakeslow") for r in rows)
    # The runtime replays exactly these rows.
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(tuned))
    aiter_gemm.reload_configs()
    for r in rows:
        p = GemmProblem(int(r["M"]), int(r["N"]), int(r["K"]))
        # CPU tensors, as tuned (get_GEMM_A16W16_config would ask about the GPU on a GPU machine)
        cfg = aiter_gemm.get_dispatcher().decide(p, False).as_config()
        assert cfg["matched"] == "exact" and cfg["libtype"] == r["libtype"] and cfg["solidx"] == int(r["solidx"])
        assert cfg["kernelName"] == r["kernelName"]
        a = torch.randn(int(r["M"]), int(r["K"])).bfloat16()
        b = torch.randn(int(r["N"]), int(r["K"])).bfloat16()
        torch.testing.assert_close(aiter_gemm.gemm_a16w16(a, b), torch.nn.functional.linear(a, b),
                                   rtol=1e-2, atol=1e-2)


def test_faulty_candidates_fail_and_the_right_one_wins(tmp_path):
    tuned, prof = tmp_path / "tuned.csv", tmp_path / "profile.csv"
    code = _run("-i", _untuned(tmp_path, "M,N,K\n3,64,32\n"), "-o", tuned, "--libtype", "fake", "--confirm_rounds", 0,
                "--profile_file", prof, "--timeout", "3")
    assert code == 0
    (row,) = read_csv_rows(tuned)[1]
    assert (row["libtype"], row["solidx"], row["kernelName"]) == ("fake", "0", "good_fast")
    p = {key[3]: r for key, r in _profile(prof).items() if key[2] == "fake"}
    names = list(op_tests.gradlib_fakes.FAKE_BEHAVIOURS)
    status = {names[i]: (r["status"], r["error"]) for i, r in p.items()}
    assert status["good_fast"][0] == "ok" and status["good_slow"][0] == "ok"
    assert status["nan"] == ("inaccurate", "err_ratio 1.0000 > 0.05 (not timed)")  # one NaN: the whole output
    assert status["zeros"][0] == "inaccurate" and float(p[names.index("zeros")]["err_ratio"]) > 0.9
    expected = {"raises": "fake kernel launch failure", "hangs": "timed out after 3 s", "exits": "exit code 7",
                "sigkill": "signal 9", "wrong_shape": "returned (3, 63)", "unpreparable": "prepare() returned None"}
    for name, msg in expected.items():
        assert status[name][0] == "failed" and msg in status[name][1], (name, status[name])
    assert all(r["us"] == "inf" for i, r in p.items() if names[i] in expected)


def test_blaslt_screening_keeps_top20_of_those_that_ran(tmp_path):
    tuned, prof = tmp_path / "tuned.csv", tmp_path / "profile.csv"
    assert _run("-i", _untuned(tmp_path, "M,N,K\n4,64,32\n"), "-o", tuned, "--libtype", "fakelt",
                "--profile_file", prof, "--confirm_rounds", 0) == 0
    rows = _profile(prof)
    screen = {k[3]: r for k, r in rows.items() if k[1] == "screen"}
    full = {k[3]: r for k, r in rows.items() if k[1] == "full" and k[2] == "fakelt"}
    assert sorted(screen) == list(range(27)) and screen[1]["status"] == "failed"
    assert screen[0]["err_ratio"] == ""  # phase 1 checks no accuracy
    assert sorted(full) == [0, *range(2, 21)]  # the failed one dropped, the 20-ms ones screened out
    assert full[0]["status"] == "inaccurate"
    (row,) = read_csv_rows(tuned)[1]
    ok = {k: float(r["us"]) for k, r in full.items() if r["status"] == "ok"}
    assert row["libtype"] == "fakelt" and int(row["solidx"]) == min(ok, key=ok.get)  # fastest valid, not lt0
    assert 2 <= int(row["solidx"]) <= 20
    assert ("4", "full", "torch", 0) in rows  # baseline timed, not eligible
    assert rows[("4", "full", "torch", 0)]["status"] == "ok,baseline"


def test_resume_all_and_foreign_rows(tmp_path, capsys):
    untuned = _untuned(tmp_path)
    tuned = tmp_path / "tuned.csv"
    foreign = ("gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,kernelName,"
               "err_ratio,tflops,bw\n"
               "sm_90,132,1,64,32,False,torch.bfloat16,torch.bfloat16,False,False,cublaslt,5,0,1.5,k,0,0,0\n"
               f"cpu,{os.cpu_count()},1,64,32,False,torch.bfloat16,torch.bfloat16,False,False,fakeslow,0,0,"
               "99999.0,slow,0,0,0\n")
    tuned.write_text(foreign)
    assert _run("-i", untuned, "-o", tuned, "--libtype", "torch") == 0
    out = capsys.readouterr().out
    assert "1 tuned, 1 skipped" in out
    rows = read_csv_rows(tuned)[1]
    assert len(rows) == 3 and rows[0]["libtype"] == "cublaslt" and rows[1]["libtype"] == "fakeslow"
    assert _run("-i", untuned, "-o", tuned, "--libtype", "torch") == 0  # nothing left: all skipped
    assert "0 tuned, 2 skipped" in capsys.readouterr().out
    assert read_csv_rows(tuned)[1] == rows
    assert _run("-i", untuned, "-o", tuned, "--libtype", "torch", "--all") == 0  # retune and replace ours
    assert "2 tuned, 0 skipped" in capsys.readouterr().out
    new = read_csv_rows(tuned)[1]
    assert len(new) == 3 and new[0] == rows[0]  # another device's row is never touched
    assert new[1]["libtype"] == "torch" and float(new[1]["us"]) < 99999.0


def test_all_bias_dtype_flags_and_identity_overrides(tmp_path, monkeypatch):
    monkeypatch.setenv("AITER_GEMM_ARCH", "gfx_test")  # the runtime's overrides key the rows written
    monkeypatch.setenv("AITER_GEMM_CU_NUM", "7")
    tuned = tmp_path / "tuned.csv"
    assert _run("-i", _untuned(tmp_path, "M,N,K\n5,48,32\n"), "-o", tuned, "--libtype", "torch", "--all_bias",
                "--indtype", "fp16", "--batch", "1") == 0
    rows = read_csv_rows(tuned)[1]
    assert sorted(r["bias"] for r in rows) == ["False", "True"]
    assert {(r["dtype"], r["outdtype"]) for r in rows} == {("torch.float16", "torch.float16")}
    assert {(r["gfx"], r["cu_num"]) for r in rows} == {("gfx_test", "7")}


def test_libtype_selection_and_errors(tmp_path, capsys):
    untuned = _untuned(tmp_path, "M,N,K\n2,32,32\n")
    tuned = tmp_path / "tuned.csv"
    assert _run("-i", untuned, "-o", tuned, "--libtype", "nosuch") == 2
    assert "no such backend" in capsys.readouterr().err
    assert _run("-i", untuned, "-o", tuned, "--libtype", "fakeslow", "--confirm_rounds", 0) == 0
    (row,) = read_csv_rows(tuned)[1]
    assert row["libtype"] == "fakeslow"  # the only requested backend wins even though torch is faster
    assert _run("-i", untuned, "-o", untuned) == 2  # the input file is never the output
    assert "same file" in capsys.readouterr().err
    assert _run("-i", tmp_path / "missing.csv", "-o", tuned) == 2
    assert "not found" in capsys.readouterr().err


def test_model_dir_print_shapes(capsys):
    assert main(["--model_dir", str(REPO / "configs/model_configs/llama3_70b"), "--tp", "8", "--nsets", "1,32",
                 "--print_shapes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle"
    got = [tuple(map(int, line.split(",")[:3])) for line in lines[1:]]
    assert got == [(1, 1280, 8192), (1, 8192, 1024), (1, 7168, 8192), (1, 8192, 3584),
                   (32, 1280, 8192), (32, 8192, 1024), (32, 7168, 8192), (32, 8192, 3584),
                   (1, 16032, 8192), (32, 16032, 8192)]


def test_sigkill_driver_then_resume_gives_each_shape_once(tmp_path):
    shapes = [(m, 32, 32) for m in range(1, 9)]
    untuned = _untuned(tmp_path, "M,N,K\n" + "".join(f"{m},{n},{k}\n" for m, n, k in shapes))
    tuned = tmp_path / "tuned.csv"
    cmd = [sys.executable, "-m", "gradlib.gemm_tuner", "-i", str(untuned), "-o", str(tuned), "--libtype",
           "fakeslow", "--batch", "1", "--plugin", PLUGIN]
    kill_then_resume(cmd, repo_env(GRADLIB_FAKES_HOLD=str(tmp_path / "hold")), tmp_path, tuned, shapes,
                     lambda r: (int(r["M"]), int(r["N"]), int(r["K"])), 2)


@pytest.mark.parametrize("mp", [2])
def test_two_workers_tune_every_shape_once(tmp_path, mp):
    tuned = tmp_path / "tuned.csv"
    text = "M,N,K\n" + "".join(f"{m},40,24\n" for m in (1, 3, 17, 97))
    assert _run("-i", _untuned(tmp_path, text), "-o", tuned, "--libtype", "torch", "--mp", mp) == 0
    assert sorted(int(r["M"]) for r in read_csv_rows(tuned)[1]) == [1, 3, 17, 97]


# ---- GPU ------------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_graph_timing_with_l2_sized_rotation():
    from aiter_gemm.timing import cache_bytes, rotating_sets, time_runner
    from gradlib.search import FULL

    dev = torch.device("cuda", torch.cuda.current_device())
    l2 = cache_bytes(dev)
    assert l2 == torch.cuda.get_device_properties(dev).L2_cache_size > 0
    a = torch.randn(16, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    n = rotating_sets(b.numel() * 2, l2, torch.cuda.mem_get_info(dev)[0])
    assert n * b.numel() * 2 >= 2 * l2
    sets = [(a.clone(), b.clone()) for _ in range(n)]
    t = time_runner(lambda i: torch.nn.functional.linear(*sets[i]), n, dev, FULL)
    assert t.method == "graph" and t.n_sets == n and 0 < t.us < 10_000


@pytest.mark.gpu
def test_gpu_tuner_writes_sm_rows(tmp_path):
    from aiter_gemm.registry import get_backend

    tuned = tmp_path / "tuned.csv"
    # torch plus the BLASLt backend (phase-1 screening on real solutions); the Triton config spaces compile
    # hundreds of kernels, which is the GPU tuning run's job, not a test's.
    real = ",".join(n for n in ("torch", "cublaslt", "hipblaslt") if get_backend(n).is_available())
    assert main(["-i", str(_untuned(tmp_path, "M,N,K\n1,4096,4096\n97,1280,8192\n")), "-o", str(tuned), "--mp", "1",
                 "--libtype", real]) == 0
    rows = read_csv_rows(tuned)[1]
    props = torch.cuda.get_device_properties(0)
    assert len(rows) == 2 and all(r["cu_num"] == str(props.multi_processor_count) for r in rows)
    assert all(r["gfx"].startswith(("sm_", "gfx")) and float(r["err_ratio"]) <= 0.05 for r in rows)


# ---- bad input, misuse, signals, progress (issue 17) ------------------------------------------------------------
@pytest.mark.parametrize("flag,value", [("--mp", "-1"), ("--mp", "0"), ("--batch", "0"), ("--timeout", "0"),
                                        ("--timeout", "nan"), ("--nsets", "0,4"), ("--tp", "0"),
                                        ("--errRatio", "2"), ("--min_gain", "0.5"), ("--screen_top", "0"),
                                        ("--iters", "0"), ("--warmup", "-1"), ("--confirm_rounds", "-1"),
                                        ("--min_improvement_pct", "-3")])
def test_cli_misuse_exits_2_naming_the_flag(tmp_path, capsys, flag, value):
    tuned = tmp_path / "tuned.csv"
    with pytest.raises(SystemExit) as info:
        _run("-i", _untuned(tmp_path), "-o", tuned, "--libtype", "torch", f"{flag}={value}")
    assert info.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err and not tuned.exists()


def test_blockscale_cli_misuse_exits_2_naming_the_flag(tmp_path, capsys):
    from gradlib.tune_a8w8_blockscale import main as bs_main

    for flag, value in (("--mp", "0"), ("--m", "-1"), ("--batch", "0"), ("--timeout", "-5"), ("--tp", "0")):
        with pytest.raises(SystemExit) as info:
            bs_main(["--nk", "128,128", "-o", str(tmp_path / "t.csv"), "--print_shapes", f"{flag}={value}"])
        assert info.value.code == 2 and f"argument {flag}" in capsys.readouterr().err


def test_unsupported_dtype_is_refused_and_nothing_written(tmp_path, capsys):
    tuned = tmp_path / "tuned.csv"
    assert _run("-i", _untuned(tmp_path), "-o", tuned, "--libtype", "torch", "--indtype", "int8") == 2
    err = capsys.readouterr().err
    assert "--indtype int8" in err and "no backend can tune it" in err and not tuned.exists()
    assert _run("-i", _untuned(tmp_path), "-o", tuned, "--libtype", "torch", "--outdtype", "int32") == 2
    assert "--outdtype int32" in capsys.readouterr().err and not tuned.exists()
    untuned = _untuned(tmp_path, "M,N,K,dtype\n4,32,32,torch.int8\n")
    assert _run("-i", untuned, "-o", tuned, "--libtype", "torch") == 2
    assert str(untuned) in capsys.readouterr().err and not tuned.exists()


def test_input_encodings(tmp_path, capsys):
    """A BOM input (Excel's "CSV UTF-8") loads; bytes that are not UTF-8 are a usage error naming the file."""
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbfM,N,K\n2,32,32\n")
    assert _run("-i", bom, "--print_shapes") == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("2,32,32,False")
    latin = tmp_path / "latin1.csv"
    latin.write_bytes(b"M,N,K,note\n2,32,32,caf\xe9\n")
    assert _run("-i", latin, "-o", tmp_path / "tuned.csv", "--libtype", "torch") == 2
    assert f"{latin}:2" in capsys.readouterr().err and not (tmp_path / "tuned.csv").exists()


def rows_identity(row: dict):
    from aiter_gemm.device import DeviceIdentity

    return DeviceIdentity(row["gfx"], int(row["cu_num"]), "cpu", row.get("device_name", ""))


def test_unusable_rows_in_the_tuned_file_are_retuned_and_replaced(tmp_path, capsys, caplog):
    cu = os.cpu_count()
    tuned = tmp_path / "tuned.csv"
    tuned.write_text("gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,kernelName\n"
                     f"cpu,{cu},1,64,32,False,torch.bfloat16,torch.bfloat16,False,False,torch,0,0,nan,F.linear\n"
                     f"cpu,{cu},17,96,64,False,torch.bfloat16,torch.bfloat16,False,False,nosuch,0,0,1.0,x\n")
    assert _run("-i", _untuned(tmp_path), "-o", tuned, "--libtype", "torch") == 0
    out = capsys.readouterr().out
    assert "2 tuned, 0 skipped" in out and "(2 unusable row(s) replaced)" in out
    # --batch 1 (AITER's default): one checkpoint per shape, each replacing its row
    assert caplog.text.count("replaced 1 row(s) that were not usable") == 2
    assert "us 'nan'" in caplog.text and "unknown libtype 'nosuch'" in caplog.text
    rows = read_csv_rows(tuned)[1]
    assert [(r["M"], r["libtype"]) for r in rows] == [("1", "torch"), ("17", "torch")]
    assert all(float(r["us"]) > 0 for r in rows)
    assert tuned_problems(tuned, rows_identity(rows[0])) == {GemmProblem(1, 64, 32), GemmProblem(17, 96, 64)}


def test_tuner_runs_with_a_broken_config_env_var(tmp_path, clean_runtime):
    """AITER_CONFIG_GEMM_BF16 naming a missing or malformed file must not stop the tool that regenerates it: its
    processes import aiter_gemm with that environment (a warning, not a traceback)."""
    import subprocess

    broken, missing = tmp_path / "broken.csv", tmp_path / "missing.csv"
    broken.write_text("M,N\n1\n")
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", f"{missing}:{broken}")
    res = subprocess.run([sys.executable, "-m", "gradlib.gemm_tuner", "--model_dir", "llama3_8b", "--nsets", "1",
                          "--print_shapes"], env=repo_env(), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("M,N,K,bias") and str(missing) in res.stderr and str(broken) in res.stderr
    tuned = tmp_path / "tuned.csv"  # the workers import aiter_gemm under the broken variable too
    assert _run("-i", _untuned(tmp_path, "M,N,K\n2,32,32\n"), "-o", tuned, "--libtype", "torch") == 0
    assert len(read_csv_rows(tuned)[1]) == 1


def test_sigterm_checkpoints_like_ctrl_c_with_progress_lines(tmp_path):
    """SIGTERM (a scheduler, kill) saves the shapes that finished since the last checkpoint, says so and exits 143;
    off a terminal, each finished shape prints a progress line."""
    import signal
    import subprocess

    shapes = [(m, 32, 32) for m in range(1, 9)]
    untuned = _untuned(tmp_path, "M,N,K\n" + "".join(f"{m},{n},{k}\n" for m, n, k in shapes))
    tuned = tmp_path / "tuned.csv"
    cmd = [sys.executable, "-m", "gradlib.gemm_tuner", "-i", str(untuned), "-o", str(tuned), "--libtype",
           "fakeslow", "--batch", "100", "--plugin", PLUGIN]  # no checkpoint before the end
    hold = tmp_path / "hold"  # while it exists the run's fakeslow calls wait: it cannot finish before the signal
    proc = subprocess.Popen(cmd, env=repo_env(GRADLIB_FAKES_HOLD=str(hold)), cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if "[gradlib] shape 2/8 M=2 N=32 K=32:" in line:
                hold.touch()
                proc.send_signal(signal.SIGTERM)
                break
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        hold.unlink(missing_ok=True)
    err = "".join(seen) + err
    assert proc.returncode == 143, err
    assert "interrupted (SIGTERM)" in err and "rerun the same command" in err
    got = [int(r["M"]) for r in read_csv_rows(tuned)[1]]
    assert 2 <= len(got) < 8 and got == sorted(got)


def test_keep_class_rows_writes_this_devices_row_beside_the_class_row(tmp_path, capsys):
    """A row naming no device serves every device of its class (the H100's rows on an H200): ``--keep_class_rows``
    tunes its shape on this device and writes the result beside it, with or without ``--all``; ``--all`` alone
    replaces it, as AITER's tuner does."""
    cu = os.cpu_count()
    tuned = tmp_path / "tuned.csv"
    tuned.write_text("gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,kernelName,"
                     f"device_name\ncpu,{cu},1,64,32,False,torch.bfloat16,torch.bfloat16,False,False,torch,0,0,"
                     "5.0,F.linear,\n")
    untuned = _untuned(tmp_path, "M,N,K\n1,64,32\n")

    def rows() -> list[tuple[str, str]]:
        return [(r["device_name"], r["us"] if not r["device_name"] else "timed") for r in read_csv_rows(tuned)[1]]

    assert _run("-i", untuned, "-o", tuned, "--libtype", "torch") == 0  # the class row serves this device
    assert "0 tuned, 1 skipped" in capsys.readouterr().out and rows() == [("", "5.0")]
    assert _run("-i", untuned, "-o", tuned, "--libtype", "torch", "--keep_class_rows") == 0
    assert "1 tuned, 0 skipped" in capsys.readouterr().out and rows() == [("", "5.0"), ("cpu", "timed")]
    assert _run("-i", untuned, "-o", tuned, "--libtype", "torch", "--keep_class_rows") == 0  # this device's row: resume
    assert "0 tuned, 1 skipped" in capsys.readouterr().out
    assert _run("-i", untuned, "-o", tuned, "--libtype", "torch", "--keep_class_rows", "--all") == 0
    assert rows() == [("", "5.0"), ("cpu", "timed")]
    assert _run("-i", untuned, "-o", tuned, "--libtype", "torch", "--all") == 0
    assert rows() == [("cpu", "timed")]


def test_recheck_writes_this_devices_row_where_the_class_row_loses(tmp_path, capsys):
    """``--recheck``: every row serving this device re-timed, no search, against the library call and the runtime
    default; where the class row loses (the fake's slow solution against F.linear), this device's row is written
    beside it and the class row stays for the other devices of the class; a row that holds and another device's row
    are left alone, and a second check writes nothing."""
    cu = os.cpu_count()
    tuned = tmp_path / "tuned.csv"
    rows = (("cpu", cu, 4, 1, "slow"), ("cpu", cu, 5, 0, "fast"), ("sm_90", 132, 4, 1, "slow"))
    tuned.write_text("gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,kernelName,"
                     "device_name\n" + "".join(f"{gfx},{n},{m},64,32,False,torch.bfloat16,torch.bfloat16,False,False,"
                                               f"fakepair,{i},0,5.0,{kernel},\n" for gfx, n, m, i, kernel in rows))
    before = read_csv_rows(tuned)[1]
    assert _run("-o", tuned, "--recheck", "--libtype", "torch") == 0
    out = capsys.readouterr().out
    assert "Updated: 1 (improved: 1, new: 0) | Skipped: 1" in out and "1 row(s) written" in out
    rows = read_csv_rows(tuned)[1]
    assert [{k: r[k] for k in before[0]} for r in rows[:3]] == before
    (new,) = rows[3:]
    assert (new["M"], new["device_name"], new["libtype"], new["kernelName"]) == ("4", "cpu", "torch", "F.linear")
    after = tuned.read_text()
    assert _run("-o", tuned, "--recheck", "--libtype", "torch") == 0  # this device's rows now hold
    assert "Updated: 0" in capsys.readouterr().out and tuned.read_text() == after
    # What serves this device is its own row wherever the file has one, listed before the class row or after it.
    lines = after.splitlines()
    tuned.write_text("\n".join([lines[0], lines[4], *lines[1:4]]) + "\n")
    after = tuned.read_text()
    assert _run("-o", tuned, "--recheck", "--libtype", "torch") == 0
    assert "Updated: 0" in capsys.readouterr().out and tuned.read_text() == after


@pytest.mark.parametrize("tuner", ["gemm_tuner", "tune_a8w8_blockscale"])
@pytest.mark.parametrize("args, message", [
    (("--run_config",), "--run_config only times rows"),
    (("-i", "other.csv"), "-i other.csv is another file"),
    (("--candidates_from", "other.csv"), "--candidates_from other.csv is another file"),
    (("-o", "missing.csv"), "the tuned file -o missing.csv does not exist"),
])
def test_recheck_misuse_exits_2_naming_the_flag(tmp_path, capsys, monkeypatch, tuner, args, message):
    import importlib

    monkeypatch.chdir(tmp_path)
    Path("tuned.csv").write_text("M,N,K\n")
    Path("other.csv").write_text("M,N,K\n4,64,32\n")
    assert importlib.import_module(f"gradlib.{tuner}").main(["-o", "tuned.csv", "--recheck", *args]) == 2
    assert message in capsys.readouterr().err and Path("tuned.csv").read_text() == "M,N,K\n"
