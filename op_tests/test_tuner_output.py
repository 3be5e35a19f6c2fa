"""What the tuners write and say (issues 31 and 32): ``-o`` through a symlink, outputs that cannot be written (checked
before tuning; a full disk at a checkpoint keeps the rows and prints them), stale rows spelled another way, leftover
``.tmp`` and ``.lock`` files, a shape whose inputs cannot fit, the counts of the summary line, and ``--help``.

The driver runs in this process (the ``inline`` fixture) so that faults can be injected where they happen: root
ignores permissions, so "read-only" is the file system's answer simulated at the call that gets it."""

from __future__ import annotations

import csv
import errno
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import op_tests.gradlib_fakes  # noqa: F401  (registers the fake backends)
from aiter_gemm import fileio
from aiter_gemm.configs import BF16_TUNED_COLUMNS, load_table
from aiter_gemm.fileio import atomic_write_text, locked, merge_csv_rows, read_csv_rows
from gradlib.gemm_tuner import main
from op_tests.runtime_helpers import repo_env

PLUGIN = "op_tests.gradlib_fakes"
CPU = ("cpu", str(os.cpu_count()))
FAST = ("--warmup", "1", "--iters", "3", "--confirm_rounds", "0")
HEADER = ",".join(BF16_TUNED_COLUMNS[:15]) + "\n"


def run(*args) -> int:
    return main([*map(str, args), "--plugin", PLUGIN])


def untuned(tmp_path: Path, ms=(1, 2)) -> Path:
    path = tmp_path / "untuned.csv"
    path.write_text("M,N,K\n" + "".join(f"{m},64,32\n" for m in ms))
    return path


def leftovers(folder: Path) -> list[str]:
    """Lock and temp files in ``folder``: none may stay after a write."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith((".lock", ".tmp")))


# ---- symlinks, locks, temps ----------------------------------------------------------------------------------------
def test_tuned_file_through_a_symlink_updates_its_target(inline, tmp_path):
    shared = tmp_path / "shared" / "tuned.csv"
    shared.parent.mkdir()
    shared.write_text(HEADER)
    link = tmp_path / "tuned.csv"
    link.symlink_to(Path("shared") / "tuned.csv")  # relative, as `ln -s` makes them
    assert run("-i", untuned(tmp_path), "-o", link, "--libtype", "torch", *FAST) == 0
    assert link.is_symlink() and os.readlink(link) == str(Path("shared") / "tuned.csv")
    assert [r["M"] for r in read_csv_rows(shared)[1]] == ["1", "2"]
    assert leftovers(tmp_path) == [] and leftovers(shared.parent) == []  # no empty .lock beside either


def test_atomic_write_follows_a_dangling_link_and_keeps_it(tmp_path):
    link = tmp_path / "a.json"
    link.symlink_to(tmp_path / "real" / "a.json")  # its target's folder does not exist yet
    atomic_write_text(link, "{}")
    assert link.is_symlink() and (tmp_path / "real" / "a.json").read_text() == "{}"
    assert leftovers(tmp_path) == [] and leftovers(tmp_path / "real") == []


def test_lock_files_are_removed_and_a_waiter_on_a_removed_one_locks_again(tmp_path, monkeypatch):
    target = tmp_path / "t.csv"
    merge_csv_rows(target, ("a",), [{"a": "1"}], ("a",))
    assert leftovers(tmp_path) == []
    # A waiter that opened the lock file before its holder removed it wins a flock nobody else will ever see:
    # it must let that one go and lock the file now at the path.
    lock_path = str(target) + ".lock"
    real_flock = fileio.fcntl.flock
    removed = []

    def flock_after_the_holder_removed_it(fd, op):
        real_flock(fd, op)
        if not removed:
            os.unlink(lock_path)
            removed.append(fd)

    monkeypatch.setattr(fileio.fcntl, "flock", flock_after_the_holder_removed_it)
    assert fileio._lock_fd(lock_path) is None and removed
    fd = fileio._lock_fd(lock_path)  # a fresh file at the path this time
    assert fd is not None and os.path.samestat(os.fstat(fd), os.stat(lock_path))
    os.close(fd)


COUNTER = textwrap.dedent("""
    import sys
    from aiter_gemm.fileio import locked
    path = sys.argv[1]
    for _ in range(int(sys.argv[2])):
        with locked(path):
            with open(path) as f:
                n = int(f.read() or 0)
            with open(path, "w") as f:  # a plain read-modify-write: only the lock keeps increments from being lost
                f.write(str(n + 1))
""")


def test_removing_lock_files_keeps_writers_exclusive(tmp_path):
    """Processes that each remove the lock file when done still exclude each other: no increment is lost."""
    counter = tmp_path / "n.txt"
    counter.write_text("0")
    procs = [subprocess.Popen([sys.executable, "-c", COUNTER, str(counter), "40"], env=repo_env()) for _ in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert counter.read_text() == "120" and leftovers(tmp_path) == []


WAITER = textwrap.dedent("""
    import sys
    from aiter_gemm.fileio import locked
    try:
        with locked(sys.argv[1], timeout=0.2):
            print("acquired")
    except TimeoutError as exc:
        print(type(exc).__module__, exc)
""")


def test_lock_timeout_names_the_lock_file(tmp_path):
    target = tmp_path / "t.csv"
    with locked(target):
        res = subprocess.run([sys.executable, "-c", WAITER, str(target)], env=repo_env(), capture_output=True,
                             text=True, timeout=120)
    assert res.stdout.startswith("filelock") and f"{target}.lock" in res.stdout, res.stderr
    assert leftovers(tmp_path) == []


KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    from aiter_gemm import fileio
    os.replace = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)  # killed with its temp written
    fileio.merge_csv_rows(sys.argv[1], ("M",), [{"M": "1"}], ("M",))
""")


def test_a_killed_writers_temp_is_removed_by_the_next_write(tmp_path):
    target = tmp_path / "tuned.csv"
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(target)], env=repo_env(), timeout=120)
    assert proc.returncode == -signal.SIGKILL
    (temp,) = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert temp.name.startswith(f".tuned.csv.{socket.gethostname()}.") and temp.stat().st_size
    assert not target.exists()  # the killed write never replaced anything
    merge_csv_rows(target, ("M",), [{"M": "2"}], ("M",))
    assert [r["M"] for r in read_csv_rows(target)[1]] == ["2"] and leftovers(tmp_path) == []


def test_only_temps_whose_writer_is_gone_are_removed(tmp_path):
    target = tmp_path / "t.csv"
    host = socket.gethostname()
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {"dead": f".t.csv.{host}.{done.pid}.abc_123.tmp", "live": f".t.csv.{host}.{live.pid}.abc_123.tmp",
                 "other_host": ".t.csv.node7.example.4242.abc_123.tmp",
                 "other_host_old": ".t.csv.node7.example.4243.abc_123.tmp",
                 "other_file": f".t.csv.bak.{host}.{done.pid}.abc_123.tmp",  # t.csv.bak's, not t.csv's
                 "unrelated": f".u.csv.{host}.{done.pid}.abc_123.tmp"}
        for name in names.values():
            (tmp_path / name).write_text("partial")
        old = time.time() - 2 * fileio.ORPHAN_AGE_S
        os.utime(tmp_path / names["other_host_old"], (old, old))
        atomic_write_text(target, "x")
        left = {k for k, name in names.items() if (tmp_path / name).exists()}
    finally:
        live.kill()
        live.wait()
    # "other_file" reads as t.csv's temp of a writer on host "bak.<host>": alive for all this host can tell
    assert left == {"live", "other_host", "other_file", "unrelated"}


# ---- outputs that cannot be written ----------------------------------------------------------------------------------
class NeverStarted:
    """An executor the tests assert was never started (the check comes before any work)."""

    restarts, slots, identity = 0, 1, None

    def start(self) -> None:
        raise AssertionError("the workers were started before the outputs were checked")

    def close(self) -> None:
        pass


@pytest.fixture
def no_workers(cpu_tuner_workers, monkeypatch):
    from gradlib import cli

    monkeypatch.setattr(cli, "build_executor", lambda *args: NeverStarted())


def _read_only_folder(monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(fileio.tempfile, "mkstemp", refuse)


@pytest.mark.parametrize("case", ["folder", "missing_parent", "read_only_file", "read_only_folder", "profile",
                                  "summary"])
def test_unwritable_output_exits_2_naming_it_before_tuning(no_workers, tmp_path, monkeypatch, capsys, case):
    out, flags = tmp_path / "tuned.csv", []
    flag, bad, why = "-o", out, None
    if case == "folder":
        out.mkdir()
        why = "is a folder"
    elif case == "missing_parent":
        bad = out = tmp_path / "no_such_dir" / "tuned.csv"
        why = f"its folder {tmp_path / 'no_such_dir'} does not exist"
    elif case == "read_only_file":
        out.write_text(HEADER)
        real_access = os.access
        monkeypatch.setattr(fileio.os, "access", lambda p, mode: False if Path(p) == out else real_access(p, mode))
        why = "is read-only"
    elif case == "read_only_folder":
        _read_only_folder(monkeypatch)
        why = f"cannot create files in {tmp_path}: Read-only file system"
    else:
        flag, bad = f"--{case}_file", tmp_path / case
        bad.mkdir()
        flags, why = [flag, bad], "is a folder"
    assert run("-i", untuned(tmp_path), "-o", out, "--libtype", "torch", *flags) == 2
    err = capsys.readouterr().err
    assert f"{flag} {bad}: {why}" in err and "nothing was tuned" in err
    assert not os.path.isfile(out) or out.read_text() == HEADER


def test_blockscale_json_dir_and_tuned_file_are_checked(no_workers, tmp_path, capsys):
    from gradlib.tune_a8w8_blockscale import main as bs_main

    not_a_dir = tmp_path / "json"
    not_a_dir.write_text("")
    assert bs_main(["--nk", "128,128", "--m", "1", "-o", str(tmp_path / "t.csv"), "--json_dir", str(not_a_dir)]) == 2
    assert f"--json_dir {not_a_dir}: {not_a_dir} is not a folder" in capsys.readouterr().err
    assert bs_main(["--nk", "128,128", "--m", "1", "-o", str(tmp_path)]) == 2
    assert f"-o {tmp_path}: is a folder" in capsys.readouterr().err
    # a --json_dir that does not exist yet is created when the first JSON is written: it passes the check
    assert fileio.write_error(tmp_path / "new" / "json", folder=True) is None


@pytest.mark.parametrize("module", ["gradlib.gemm_tuner", "gradlib.tune_a8w8_blockscale"])
def test_a_missing_candidates_from_file_exits_2_when_parsed(no_workers, tmp_path, capsys, module):
    """Issue 47: ``--candidates_from missing.csv`` ran every shape to "no winner" (exit 1) instead of saying so."""
    import importlib

    main_ = importlib.import_module(module).main
    with pytest.raises(SystemExit) as e:
        main_(["--candidates_from", str(tmp_path / "missing.csv"), "-o", str(tmp_path / "t.csv")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.splitlines()[-1].endswith(
        f"error: argument --candidates_from: {tmp_path / 'missing.csv'}: not found")
    assert not (tmp_path / "t.csv").exists()


def _disk_full_for(monkeypatch, failures: int | None, after: int = 0):
    """``fsync`` of a temp file fails with ENOSPC (as a write to a full disk does) ``failures`` times (None: always)
    once ``after`` calls went through."""
    real = os.fsync
    calls = []

    def fsync(fd):
        calls.append(fd)
        if len(calls) > after and (failures is None or len(calls) <= after + failures):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(fileio.os, "fsync", fsync)
    return calls


def test_disk_full_error_names_the_file_and_leaves_no_temp(tmp_path, monkeypatch):
    _disk_full_for(monkeypatch, None)
    with pytest.raises(OSError, match=f"No space left on device: '{tmp_path / 't.csv'}'"):
        atomic_write_text(tmp_path / "t.csv", "x" * 100)
    assert leftovers(tmp_path) == [] and not (tmp_path / "t.csv").exists()


def test_disk_full_at_a_checkpoint_keeps_the_rows_for_the_next(inline, tmp_path, monkeypatch, capsys, caplog):
    out = tmp_path / "tuned.csv"
    _disk_full_for(monkeypatch, 1)  # the first checkpoint fails, the disk then has room again
    assert run("-i", untuned(tmp_path, (1, 2, 3)), "-o", out, "--libtype", "torch", "--batch", "1", *FAST) == 0
    assert sorted(r["M"] for r in read_csv_rows(out)[1]) == ["1", "2", "3"]  # M=1's row waited for M=2's checkpoint
    assert f"could not write {out}: [Errno 28] No space left on device: '{out}'" in caplog.text
    assert "3 row(s) written" in capsys.readouterr().out and leftovers(tmp_path) == []


def test_disk_full_to_the_end_prints_the_rows_and_exits_4(inline, tmp_path, monkeypatch, capsys):
    out = tmp_path / "tuned.csv"
    _disk_full_for(monkeypatch, None)
    assert run("-i", untuned(tmp_path, (1, 2)), "-o", out, "--libtype", "torch", "--batch", "1", *FAST) == 4
    std = capsys.readouterr()
    assert f"could not write {out}: [Errno 28] No space left on device: '{out}'; its 2 tuned row(s)" in std.err
    lines = std.out.splitlines()
    start = lines.index(",".join(BF16_TUNED_COLUMNS))
    rows = list(csv.DictReader(lines[start:start + 3]))
    assert [(r["M"], r["libtype"]) for r in rows] == [("1", "torch"), ("2", "torch")] and float(rows[0]["us"]) > 0
    assert not out.exists() and leftovers(tmp_path) == []


def test_sort_that_cannot_rewrite_the_file_exits_4_with_the_rows_kept(inline, tmp_path, monkeypatch, capsys):
    out = tmp_path / "tuned.csv"
    _disk_full_for(monkeypatch, None, after=2)  # both checkpoints are written, --sort's rewrite is not
    assert run("-i", untuned(tmp_path, (2, 1)), "-o", out, "--libtype", "torch", "--sort", "true", *FAST) == 4
    assert f"--sort: could not rewrite {out}: [Errno 28] No space left on device" in capsys.readouterr().err
    assert [r["M"] for r in read_csv_rows(out)[1]] == ["2", "1"]


def test_json_that_cannot_be_written_stays_pending_until_it_can(tmp_path, monkeypatch, caplog):
    from aiter_gemm.backends.base import GemmProblem
    from aiter_gemm.device import DeviceIdentity
    from gradlib.blockscale import FP8, JsonSidecar
    from gradlib.results import CheckpointWriter
    from gradlib.tune_ops import tune_op

    ident = DeviceIdentity("cpu", 4, "cpu")
    tuned = tmp_path / "t.csv"
    tuned.write_text("gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName,tflops,bw,errRatio\n"
                     "cpu, 4,1,0128,128,triton,0,0,5.0,swapAB-BM16_BN64_BK128_GM1_SK1_W4_S4_TMA,0,0,0\n")
    p = GemmProblem(1, 128, 128, False, FP8)
    sidecar = JsonSidecar(ident, tuned, [p], json_dir=tmp_path / "json")
    writer = CheckpointWriter(tuned, ident, 1, False, spec=tune_op("gemm_a8w8_blockscale"), sidecar=sidecar)
    sidecar.skipped(p)  # already tuned: its JSON is due at the next checkpoint
    calls = _disk_full_for(monkeypatch, 1)
    writer.flush()
    json_path = tmp_path / "json" / "cpu-GEMM-A8W8_BLOCKSCALE-N=128-K=128.json"
    assert not json_path.exists() and f"No space left on device: '{json_path}'" in caplog.text
    assert [str(exc) for _, _, exc in writer.unsaved()] == [f"[Errno 28] No space left on device: '{json_path}'"]
    writer.flush()  # retried: the row spelled " 4" / "0128" is this device's (128, 128), as the runtime reads it
    assert len(calls) == 2 and "M_LEQ_1" in json_path.read_text() and writer.unsaved() == []


def test_an_interrupted_blockscale_run_writes_the_json_of_the_shapes_that_finished(inline, tmp_path, monkeypatch,
                                                                                     capsys):
    """SIGTERM after the first of two M of (128, 128): its row is saved and the (N, K)'s JSON file is built from
    it (the JSON waited for every M of the (N, K), so an interrupted run left none); (256, 128), not started, gets
    none."""
    from gradlib import cli
    from gradlib.tune_a8w8_blockscale import main as bs_main
    from op_tests.runtime_helpers import InlineExecutor

    class TermAtShape1(InlineExecutor):
        def poll(self, timeout: float) -> list:
            if self._task is not None and self._task.shape_id == 1:
                raise cli.Terminated()
            return super().poll(timeout)

    monkeypatch.setattr(cli, "build_executor", lambda devices, plugins, timeout, ray, env: TermAtShape1(plugins))
    swap16 = "swapAB-BM16_BN64_BK128_GM1_SK1_W4_S4_TMA"
    tuned, folder = tmp_path / "t.csv", tmp_path / "json"
    assert bs_main(["--nk", "128,128", "256,128", "--m", "1,2", "-o", str(tuned), "--json_dir", str(folder),
                    "--candidates", swap16, "--warmup", "0", "--iters", "3"]) == 143
    assert [(r["M"], r["N"]) for r in read_csv_rows(tuned)[1]] == [("1", "128")]
    assert sorted(p.name for p in folder.iterdir()) == ["cpu-GEMM-A8W8_BLOCKSCALE-N=128-K=128.json"]
    assert "M_LEQ_1" in (folder / "cpu-GEMM-A8W8_BLOCKSCALE-N=128-K=128.json").read_text()
    assert f"1 JSON file(s) in {folder}" in capsys.readouterr().out


# ---- stale rows spelled another way ------------------------------------------------------------------------------
def test_a_stale_row_spelled_0_and_bf16_is_replaced_not_duplicated(inline, tmp_path, capsys, caplog):
    out = tmp_path / "tuned.csv"
    cpu, cu = CPU
    out.write_text(HEADER + f"{cpu},{cu},1,64,32,0,bf16,bf16,0,0,nosuch,0,0,0.5,x\n"
                   f"{cpu},{cu},1,64,32,False,torch.bfloat16,bf16,False,False,gone,0,0,0.7,y\n"  # the same shape again
                   f"{cpu},{cu},2,64,32,0,bf16,bf16,0,0,torch,0,0,9.0,F.linear\n")  # usable: never retuned
    assert run("-i", untuned(tmp_path, (1, 2)), "-o", out, "--libtype", "torch", *FAST) == 0
    assert "1 tuned, 1 skipped" in capsys.readouterr().out and "tuned meanwhile" not in caplog.text
    rows = read_csv_rows(out)[1]
    assert [(r["M"], r["libtype"]) for r in rows] == [("1", "torch"), ("2", "torch")]
    assert rows[1]["us"] == "9.0" and rows[1]["bias"] == "0"  # the usable row kept as written
    # The runtime serves the new row, and the next run has nothing to do.
    table = load_table("GEMM_BF16", [out])
    assert {row.values["libtype"] for row in table} == {"torch"}
    assert run("-i", untuned(tmp_path, (1, 2)), "-o", out, "--libtype", "torch", *FAST) == 0
    assert "0 tuned, 2 skipped" in capsys.readouterr().out and len(read_csv_rows(out)[1]) == 2


@pytest.mark.parametrize("timing", [[], ["--timing", "graph"], ["--timing", "eager"]])
def test_cpu_tuned_rows_say_they_were_timed_eagerly(inline, tmp_path, timing):
    """Issue 47: CPU rows were written ``timing=graph``, though a CPU has no CUDA graphs (each call is timed on its
    own, host cost included): the honest value of the ``timing`` column, which the runtime reads, is ``eager``."""
    out = tmp_path / "tuned.csv"
    assert run("-i", untuned(tmp_path, (1, 2)), "-o", out, "--libtype", "torch", *FAST, *timing) == 0
    rows = read_csv_rows(out)[1]
    assert [(r["gfx"], r["timing"]) for r in rows] == [("cpu", "eager"), ("cpu", "eager")]
    assert {row.values["timing"] for row in load_table("GEMM_BF16", [out])} == {"eager"}


# ---- what the console says -----------------------------------------------------------------------------------------
def test_a_shape_too_large_for_memory_says_so(inline, tmp_path, monkeypatch, capsys):
    from aiter_gemm import testbed

    monkeypatch.setattr(testbed, "device_memory", lambda device: (64 * 10 ** 9, "in total"))
    shapes = tmp_path / "u.csv"
    shapes.write_text(f"M,N,K\n{2 ** 31},16,16\n")
    assert run("-i", shapes, "-o", tmp_path / "t.csv", "--libtype", "torch", *FAST) == 1
    out = capsys.readouterr().out
    assert (f"M={2 ** 31} N=16 K=16: no winner: MemoryError: inputs need at least 274.9 GB (float32 A, B and "
            f"reference of M={2 ** 31} N=16 K=16), cpu has 64.0 GB in total") in out
    assert "(all 1 of 1 candidate(s))" in out


def test_an_allocation_failure_says_how_much_the_inputs_need(monkeypatch):
    from dataclasses import replace

    from aiter_gemm import testbed
    from aiter_gemm.backends.base import GemmProblem, Solution
    from aiter_gemm.timing import TimingConfig
    from gradlib import records, tasks

    def make_inputs(*args):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory: you tried to "
                           "allocate 137438953472 bytes.")

    real = tasks.op_spec
    monkeypatch.setattr(tasks, "op_spec", lambda op: replace(real(op), make_inputs=make_inputs))
    monkeypatch.setattr(testbed, "device_memory", lambda device: (10 ** 15, "in total"))
    rt = tasks.WorkerRuntime.create()
    task = records.Task(0, 0, records.TIME, GemmProblem(2 ** 31, 16, 16), (Solution("torch", 0, 0, "F.linear"),),
                      TimingConfig(1, 3, 0.0, False, 0.05))
    res = rt.run_item(task, 0)
    assert not res.ok and res.error.startswith("MemoryError: inputs need at least 274.9 GB")
    assert "allocating them failed: [enforce fail" in res.error


def test_summary_line_counts_what_ran(inline, tmp_path, capsys):
    """Torch-only CPU tuning: one candidate per shape is timed, and nothing is confirmed: the winner, the default and
    F.linear are one solution there, which is never timed against itself (a confirmation run would be counted apart,
    as ``, N confirmation run(s)``)."""
    assert run("-i", untuned(tmp_path, (1, 2, 3)), "-o", tmp_path / "t.csv", "--libtype", "torch", "--warmup", "0",
               "--iters", "3", "--confirm_rounds", "1") == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert "; 3 candidate(s) timed (0 failed); " in line
    assert "confirmation" not in line and "screened" not in line


@pytest.mark.parametrize("module, prog", [("gradlib.gemm_tuner", "gemm-tuner"),
                                          ("gradlib.tune_a8w8_blockscale", "python -m gradlib.tune_a8w8_blockscale")])
def test_help_is_plain_text_with_examples(module, prog):
    import importlib

    text = importlib.import_module(module).build_parser().format_help()
    assert not any(markup in text for markup in ("``", ":mod:", ":func:", ":class:", ":data:"))
    examples = text.split("examples:\n")[1].split("\n\n")[0].splitlines()
    assert 3 <= len(examples) <= 4 and all(e.startswith(f"  {prog} ") for e in examples)
    flat = " ".join(text.split())
    assert "exit status: 0 every shape tuned" in flat and "4 an output could not be written" in flat
