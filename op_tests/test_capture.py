"""Shape capture: misses recorded once, merged with existing rows, safe across concurrent processes."""

from __future__ import annotations

import csv
import hashlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import aiter_gemm
from aiter_gemm.configs import ConfigError, load_untuned
from op_tests.runtime_helpers import BF16_HEADER, bf16_row

REPO = Path(__file__).resolve().parents[1]
PREEXISTING = ("M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,note\n"
               "7,7,7,False,torch.float32,torch.float32,False,False,mine\n")


def rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_capture_records_every_shape_without_an_exact_row_once(clean_runtime, tmp_path):
    tuned = tmp_path / "tuned.csv"
    tuned.write_text(BF16_HEADER + bf16_row(8, 96, 80))
    out = tmp_path / "untuned.csv"
    out.write_text(PREEXISTING)
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(tuned))
    clean_runtime.setenv("AITER_TUNE_GEMM", "1")
    clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(out))
    aiter_gemm.reload_configs()
    b = torch.randn(96, 80)
    for m in (8, 8, 3, 3, 5, 9, 20):  # 8: exact hit; 5 -> 8 at gl1: padded hit (recorded: AITER records every
        # call, and only a row for M=5 itself can be tuned for it); 3, 9, 20 pad to 4/16/32: misses
        aiter_gemm.gemm_a16w16(torch.randn(m, 80), b)
    assert rows(out)[0]["note"] == "mine", "nothing is written per call"
    aiter_gemm.get_dispatcher().flush_capture()
    got = rows(out)
    assert got[0] == {"M": "7", "N": "7", "K": "7", "bias": "False", "dtype": "torch.float32",
                      "outdtype": "torch.float32", "scaleAB": "False", "bpreshuffle": "False", "note": "mine"}
    assert sorted((r["M"], r["N"], r["K"]) for r in got[1:]) == [("20", "96", "80"), ("3", "96", "80"),
                                                                 ("5", "96", "80"), ("9", "96", "80")]
    keys = load_untuned(out)
    assert len(keys) == 5
    assert tuned.read_text() == BF16_HEADER + bf16_row(8, 96, 80), "tuned input file untouched"


def test_capture_never_writes_inside_package(clean_runtime):
    from aiter_gemm.settings import default_config_dir

    clean_runtime.setenv("AITER_TUNE_GEMM", "1")
    clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(default_config_dir() / "bf16_untuned_gemm.csv"))
    with pytest.raises(ValueError, match="inside the package"):
        aiter_gemm.reload_configs()


def test_capture_flushes_on_timer(clean_runtime, tmp_path):
    import time

    out = tmp_path / "u.csv"
    clean_runtime.setenv("AITER_TUNE_GEMM", "1")
    clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(out))
    clean_runtime.setenv("AITER_TUNE_GEMM_FLUSH_S", "0.2")
    aiter_gemm.reload_configs()
    aiter_gemm.gemm_a16w16(torch.randn(3, 16), torch.randn(8, 16))
    deadline = time.time() + 10
    while not out.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert [r["M"] for r in rows(out)] == ["3"]


def _capture_env(out: Path, tuned: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITER_")}
    env.update(AITER_TUNE_GEMM="1", AITER_UNTUNED_GEMM_FILE=str(out), AITER_CONFIG_GEMM_BF16=str(tuned),
               PYTHONPATH=str(REPO), **extra)
    return env


WORKER = textwrap.dedent("""
    import sys, time, torch, aiter_gemm
    rank = int(sys.argv[1])
    b = torch.randn(8, 16)
    for m in [1, 2, 3] + [1000 * (rank + 1) + i for i in range(1, 13)]:  # M=1, 2, 3 shared by every rank
        aiter_gemm.gemm_a16w16(torch.randn(m, 16), b)
        time.sleep(0.004)  # timer flushes (every 10 ms) start while the other ranks hold the lock
""")
EXPECTED = sorted([1, 2, 3] + [1000 * (r + 1) + i for r in range(4) for i in range(1, 13)])


def test_four_processes_share_one_file_and_lose_no_shape(tmp_path):
    """Ranks capturing at once, flushing every 10 ms into a file large enough that writes overlap: every shape of
    every rank is in the file when they have exited (a timer flush waiting for the lock at exit used to lose its
    shapes), the rows already there are kept, the tuned file is never touched, no temp file is left."""
    tuned = tmp_path / "tuned.csv"
    tuned.write_text(BF16_HEADER)
    before = hashlib.sha256(tuned.read_bytes()).hexdigest()
    filler = "".join(f"{m},7,7,False,torch.float32,torch.float32,False,False,x\n" for m in range(100_000, 102_000))
    for trial in range(2):
        out = tmp_path / f"shared_untuned_{trial}.csv"
        out.write_text(PREEXISTING + filler)
        env = _capture_env(out, tuned, AITER_TUNE_GEMM_FLUSH_S="0.01")
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r)], env=env, cwd=tmp_path,
                                  stderr=subprocess.PIPE, text=True) for r in range(4)]
        errs = [p.communicate(timeout=300)[1] for p in procs]
        assert all(p.returncode == 0 for p in procs), errs
        got = rows(out)
        assert got[0]["note"] == "mine" and len(got) == 1 + 2000 + len(EXPECTED), f"trial {trial}: {errs}"
        assert sorted(int(r["M"]) for r in got[2001:]) == EXPECTED, f"trial {trial}"
        assert not list(tmp_path.glob(f".{out.name}.*.tmp")), "no temp file left behind"
    assert hashlib.sha256(tuned.read_bytes()).hexdigest() == before


EXIT_WORKER = textwrap.dedent("""
    import time, torch, aiter_gemm
    b = torch.randn(8, 16)
    for m in range(1, 9):
        aiter_gemm.gemm_a16w16(torch.randn(m, 16), b)
    time.sleep(0.5)  # the timer flush has taken the shapes and waits for the lock another rank holds
    print("recorded", flush=True)
""")


def test_exit_waits_for_the_lock_another_rank_holds(tmp_path):
    from filelock import FileLock

    out, tuned = tmp_path / "u.csv", tmp_path / "tuned.csv"
    tuned.write_text(BF16_HEADER)
    lock = FileLock(str(out) + ".lock")
    lock.acquire()
    try:
        proc = subprocess.Popen([sys.executable, "-c", EXIT_WORKER], env=_capture_env(
            out, tuned, AITER_TUNE_GEMM_FLUSH_S="0.05"), cwd=tmp_path, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "recorded"
        time.sleep(1.0)  # the process is exiting
    finally:
        lock.release()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert sorted(int(r["M"]) for r in rows(out)) == list(range(1, 9)), err


def _recorder(path, **kw):
    from aiter_gemm.capture import ShapeRecorder, row_key_of, tuned_columns_of
    from aiter_gemm.configs import BF16_UNTUNED_COLUMNS, SPECS
    from aiter_gemm.ops.a16w16 import GEMM_A16W16

    spec = SPECS["GEMM_BF16"]
    return ShapeRecorder(str(path), BF16_UNTUNED_COLUMNS, GEMM_A16W16.untuned_row,
                         row_key_of(spec, BF16_UNTUNED_COLUMNS), flush_s=3600, tuned_columns=tuned_columns_of(spec),
                         **kw)


def test_shapes_that_cannot_be_written_are_listed_and_saved(tmp_path, monkeypatch, caplog):
    """An unwritable capture path (here its folder is a file) loses nothing at exit: the error lists the shapes
    and saves them (beside the file if possible, else in the temp folder)."""
    import logging

    from aiter_gemm.backends.base import GemmProblem

    (tmp_path / "not_a_dir").write_text("")
    spare = tmp_path / "tmp"
    spare.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(spare))
    rec = _recorder(tmp_path / "not_a_dir" / "u.csv", exit_wait_s=1.0)
    for m in (3, 5):
        rec.record(GemmProblem(m, 96, 80))
    with caplog.at_level(logging.ERROR):
        assert rec.flush(final=True) == 0  # what atexit runs
    (saved,) = spare.glob("u.csv.*.pending.csv")
    assert sorted(int(r["M"]) for r in rows(saved)) == [3, 5]
    assert "could not write 2 captured shape(s)" in caplog.text and str(saved) in caplog.text
    assert "3,96,80,False" in caplog.text and "5,96,80,False" in caplog.text


def test_capture_refuses_a_tuned_file(clean_runtime, tmp_path, caplog):
    """Pointing AITER_UNTUNED_GEMM_FILE at a tuned CSV is refused at reload; a file that becomes a tuned one later
    is not written either (the shapes go beside it)."""
    import logging

    from aiter_gemm.backends.base import GemmProblem

    tuned = tmp_path / "tuned.csv"
    tuned.write_text(BF16_HEADER + bf16_row(8, 96, 80))
    before = tuned.read_bytes()
    clean_runtime.setenv("AITER_TUNE_GEMM", "1")
    clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(tuned))
    with pytest.raises(ConfigError, match="tuned config file") as info:
        aiter_gemm.reload_configs()
    assert info.value.path == str(tuned)
    clean_runtime.delenv("AITER_TUNE_GEMM")
    aiter_gemm.reload_configs()
    later = tmp_path / "later.csv"
    rec = _recorder(later)
    rec.record(GemmProblem(3, 96, 80))
    later.write_bytes(before)  # a tuner wrote its table there meanwhile
    with caplog.at_level(logging.ERROR):
        rec.flush(final=True)
    assert later.read_bytes() == before and tuned.read_bytes() == before
    assert "tuned config file" in caplog.text
    assert [r["M"] for r in rows(next(tmp_path.glob("later.csv.*.pending.csv")))] == ["3"]


def test_empty_gemms_are_not_captured(clean_runtime, tmp_path):
    out = tmp_path / "u.csv"
    clean_runtime.setenv("AITER_TUNE_GEMM", "1")
    clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(out))
    aiter_gemm.reload_configs()
    b = torch.randn(8, 16)
    aiter_gemm.gemm_a16w16(torch.randn(0, 16), b)
    aiter_gemm.gemm_a16w16(torch.randn(2, 16), b)
    aiter_gemm.get_dispatcher().flush_capture()
    assert [r["M"] for r in rows(out)] == ["2"]
    assert load_untuned(out)  # the captured file stays loadable (M must be positive)


def test_capture_writes_only_rows_the_tuner_reads(clean_runtime, tmp_path, caplog, capsys):
    """Issue 47: a float64 call (the runtime runs it: F.linear) was captured as a ``torch.float64`` row, which the
    tuner refuses (no CSV dtype name: exit 2), blocking every other captured shape. Capture now writes only rows the
    table's key parser reads, as the tuner reads them, and warns once per refused value; the file tunes."""
    from gradlib import gemm_tuner

    out = tmp_path / "u.csv"
    clean_runtime.setenv("AITER_TUNE_GEMM", "1")
    clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(out))
    aiter_gemm.reload_configs()
    b64 = torch.randn(8, 16, dtype=torch.float64)
    for m in (3, 4):
        assert aiter_gemm.gemm_a16w16(torch.randn(m, 16, dtype=torch.float64), b64).dtype == torch.float64
    aiter_gemm.gemm_a16w16(torch.randn(3, 16), torch.randn(8, 16))
    aiter_gemm.get_dispatcher().flush_capture()
    assert [(r["M"], r["dtype"]) for r in rows(out)] == [("3", "torch.float32")]
    refused = [r.getMessage() for r in caplog.records if "not capturing" in r.getMessage()]
    assert len(refused) == 1 and "dtype torch.float64" in refused[0] and "unknown dtype name" in refused[0]
    capsys.readouterr()
    assert gemm_tuner.main(["-i", str(out), "-o", str(tmp_path / "t.csv"), "--print_shapes"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["3,8,16,False,torch.float32,torch.float32,False,False"]


def test_a_hand_written_row_the_tuner_cannot_read_stops_it_naming_the_row(tmp_path, capsys):
    """The same rule for a row capture did not write: the tuner exits 2 naming file, line and column (docs/tuner.md)
    rather than tuning a file other than the one given."""
    from gradlib import gemm_tuner

    shapes = tmp_path / "u.csv"
    shapes.write_text("M,N,K,dtype\n3,8,16,torch.float32\n4,8,16,torch.float64\n")
    assert gemm_tuner.main(["-i", str(shapes), "-o", str(tmp_path / "t.csv"), "--print_shapes"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{shapes}:3, column 'dtype': bad value 'torch.float64'" in err


RAGGED = ("M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,note\n"
          "7,7,7\n"  # short: three cells
          '8,8,8,False,torch.float32,torch.float32,False,False,mine,"extra, cells",more\n'  # long
          "9,9,9,False,torch.float32,torch.float32,False,False,plain\n")


def test_ragged_rows_are_kept_as_written(tmp_path):
    """Issue 31: rows with fewer or more cells than the header were rewritten padded or cut; rows the recorder did
    not write stay byte for byte, its own are appended."""
    from aiter_gemm.backends.base import GemmProblem

    out = tmp_path / "u.csv"
    out.write_text(RAGGED)
    rec = _recorder(out)
    rec.record(GemmProblem(3, 96, 80))
    assert rec.flush() == 1
    assert out.read_text() == RAGGED + "3,96,80,False,torch.bfloat16,torch.bfloat16,False,False,\n"


def test_ragged_row_with_extra_cells_blocks_new_columns_naming_its_line(tmp_path, caplog):
    """A long row kept as written would read as the values of columns the merge adds: the file is left alone, the
    error names the line, the shapes are saved beside it; a short row does not get in the way."""
    import logging

    from aiter_gemm.backends.base import GemmProblem

    out = tmp_path / "u.csv"
    out.write_text("M,N,K\n1,2\n")
    rec = _recorder(out)
    rec.record(GemmProblem(3, 96, 80))
    assert rec.flush() == 1
    assert out.read_text().startswith("M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle\n1,2\n3,96,80,False,")
    text = "M,N,K\n1,2,3,4\n"
    out.write_text(text)
    rec = _recorder(out, exit_wait_s=1.0)
    rec.record(GemmProblem(5, 96, 80))
    with caplog.at_level(logging.ERROR):
        assert rec.flush(final=True) == 0
    assert out.read_text() == text
    assert f"{out}:2: 4 cells for the 3 columns of the header" in caplog.text
    assert [r["M"] for r in rows(next(tmp_path.glob("u.csv.*.pending.csv")))] == ["5"]


@pytest.mark.parametrize("what", ["directory", "symlink loop"])
def test_capture_path_that_is_no_file_is_refused_naming_it(clean_runtime, tmp_path, what):
    """Issue 31: a directory or a symlink loop as AITER_UNTUNED_GEMM_FILE killed `import aiter_gemm` with a raw
    IsADirectoryError / RuntimeError; the error now says what the path is and which variable to change."""
    path = tmp_path / "u.csv"
    if what == "directory":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "v.csv")
        (tmp_path / "v.csv").symlink_to(path)
    clean_runtime.setenv("AITER_TUNE_GEMM", "1")
    clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(path))
    with pytest.raises(ValueError, match=f"capture file {path} is a {what}: .*AITER_UNTUNED_GEMM_FILE"):
        aiter_gemm.reload_configs()


@pytest.mark.skipif(not os.path.isfile("/proc/version"), reason="needs Linux's /proc")
def test_lock_file_that_cannot_be_created_fails_at_once(tmp_path, monkeypatch, caplog):
    """Issue 31: a capture file whose lock cannot be created (``/proc/version``) held process exit for the whole exit
    wait and the wait for a lock beside it (66 s), retrying, before saving the shapes in the temp folder. Now taking
    the lock fails at once with an OSError naming the lock file, not a timeout (the waits here are 2 s, so retrying
    until they end fails the test rather than holding it)."""
    import logging

    from aiter_gemm.backends.base import GemmProblem
    from aiter_gemm.fileio import locked

    with pytest.raises(OSError) as info, locked("/proc/version", timeout=2.0):
        pass
    assert not isinstance(info.value, TimeoutError) and "/proc/version.lock" in str(info.value)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    rec = _recorder("/proc/version", exit_wait_s=2.0)
    rec.record(GemmProblem(3, 96, 80))
    with caplog.at_level(logging.ERROR):
        assert rec.flush(final=True) == 0
    assert "/proc/version.lock" in caplog.text and "could not be acquired" not in caplog.text
    assert [r["M"] for r in rows(next(tmp_path.glob("version.*.pending.csv")))] == ["3"]


def test_capture_message_has_one_prefix(tmp_path):
    """With no logging set up, the runtime's own handler prints its INFO lines as ``[aiter_gemm] ...``: the capture
    line (whose message names the package for bare handlers) used to read ``[aiter_gemm] aiter_gemm: captured``."""
    out, tuned = tmp_path / "u.csv", tmp_path / "tuned.csv"
    tuned.write_text(BF16_HEADER)
    code = "import torch, aiter_gemm; aiter_gemm.gemm_a16w16(torch.randn(3, 16), torch.randn(8, 16))"
    res = subprocess.run([sys.executable, "-c", code], env=_capture_env(out, tuned), cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert f"[aiter_gemm] captured 1 new untuned shape(s) into {out}" in lines, res.stderr
    assert "[aiter_gemm] shape is M:3, N:8, K:16" in res.stderr  # AITER's miss line, unchanged
    assert "aiter_gemm: " not in res.stderr.replace("[aiter_gemm] ", "")
