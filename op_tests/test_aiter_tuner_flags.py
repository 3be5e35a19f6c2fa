"""``gemm-tuner`` driven with AITER's flag sets, as AITER's guide and scripts use them (``--tuned_file/--input_file``,
``-i/-o/-o2`` with its common flags, ``GTUNE_*`` defaults, model mode), AITER's flags we refuse, ``--compare`` on a
file with one deliberately slow row, ``--run_config``, and ``-i X -o X --all`` in place.

The driver runs in this process (:class:`~op_tests.runtime_helpers.InlineExecutor`): the fake candidates here can
neither hang nor crash, and the process pool itself is tested in test_gradlib_e2e.py. Times are the fakes' declared
ones on a virtual clock (conftest ``virtual_clock``): a loaded machine once made the slow row's rivals as slow."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import op_tests.gradlib_fakes  # noqa: F401  (registers fakepair)
from aiter_gemm.configs import BF16_TUNED_COLUMNS
from aiter_gemm.fileio import read_csv_rows, render_csv
from gradlib.gemm_tuner import main

PLUGIN = "op_tests.gradlib_fakes"
CPU = ("cpu", str(os.cpu_count()))
FAST = ("--warmup", "1", "--iters", "3")  # AITER's flags, keeping CPU time small


def run(*args) -> int:
    return main([*map(str, args), "--plugin", PLUGIN])


def tuned_row(M, N, libtype, solidx, kernel, us, gfx=CPU[0], cu=CPU[1], K=32) -> dict[str, str]:
    return {"gfx": gfx, "cu_num": cu, "M": str(M), "N": str(N), "K": str(K), "bias": "False",
            "dtype": "torch.bfloat16", "outdtype": "torch.bfloat16", "scaleAB": "False", "bpreshuffle": "False",
            "libtype": libtype, "solidx": str(solidx), "splitK": "0", "us": str(us), "kernelName": kernel,
            "err_ratio": "0.0", "tflops": "1.0", "bw": "1.0", "pad_m_min": "", "timing": "graph"}


def write_tuned(path: Path, rows: list[dict[str, str]]) -> list[str]:
    path.write_text(render_csv(BF16_TUNED_COLUMNS, rows))
    return path.read_text().splitlines()


# ---- AITER's commands ---------------------------------------------------------------------------------------------
def test_aiter_guide_and_tuner_common_flag_sets(inline, tmp_path, monkeypatch, capsys):
    untuned = tmp_path / "bf16_untuned_gemm.csv"
    untuned.write_text("M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle\n"
                       "4,64,32,False,torch.bfloat16,torch.bfloat16,False,False\n")
    # AITER's guide: python3 gradlib/gradlib/gemm_tuner.py --tuned_file ... --input_file ...
    guide = tmp_path / "guide.csv"
    assert run("--tuned_file", guide, "--input_file", untuned, "--libtype", "torch", *FAST) == 0
    assert [(r["M"], r["libtype"]) for r in read_csv_rows(guide)[1]] == [("4", "torch")]
    # The common tuner flags (base_tuner), as AITER's scripts pass them.
    common, prof = tmp_path / "common.csv", tmp_path / "all_results.csv"
    assert run("-i", untuned, "-o", common, "-o2", prof, "--mp", "1", "--errRatio", "0.05", "--batch", "100",
               "--sort", "True", "-k", "--shape_grouped", "--timeout", "100", "--libtype", "torch,fakepair",
               "--post_verify", "--auto_group_small_m", "64", "-v", *FAST) == 0
    (row,) = read_csv_rows(common)[1]
    assert (row["M"], row["N"], row["K"], row["gfx"], row["cu_num"]) == ("4", "64", "32", *CPU)
    assert {r["libtype"] for r in read_csv_rows(prof)[1]} >= {"torch", "fakepair"}  # -o2: every candidate
    # AITER's GTUNE_* variables give the defaults; --untune_file / --tune_file are the long names of -i / -o.
    env_out = tmp_path / "env.csv"
    monkeypatch.setenv("GTUNE_INPUT", str(untuned))
    monkeypatch.setenv("GTUNE_TUNED", str(env_out))
    assert run("--libtype", "torch", *FAST) == 0 and len(read_csv_rows(env_out)[1]) == 1
    assert run("--untune_file", untuned, "--tune_file", env_out, "--libtype", "torch") == 0
    assert "0 tuned, 1 skipped" in capsys.readouterr().out


def test_gtune_model_mode(monkeypatch, capsys):
    monkeypatch.setenv("GTUNE_MODEL", "llama3_70b")
    monkeypatch.setenv("GTUNE_TP", "8")
    monkeypatch.setenv("GTUNE_BATCH_SIZE", "4")
    assert main(["--nsets", "16", "--print_shapes"]) == 0
    got = [tuple(map(int, line.split(",")[:3])) for line in capsys.readouterr().out.splitlines()[1:]]
    # M = tokens (AITER's model mode had them as N), lm_head at GTUNE_BATCH_SIZE sequences
    assert got == [(16, 1280, 8192), (16, 8192, 1024), (16, 7168, 8192), (16, 8192, 3584), (4, 16032, 8192)]


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--fast_tune", "--post_verify"], "--fast_tune is not provided"),
     (["--tune_tie_break_rel_tol", "0.02"], "--tune_tie_break_rel_tol is not provided"),
     (["--rocblas-decode"], "rocBLAS is not a backend here"),
     (["--update_improved"], "--update_improved requires --compare"),
     (["--libtype", "hipblaslt"], "AITER's AMD kernels are not part of this package")],
)
def test_refused_aiter_flags_name_the_difference(tmp_path, capsys, args, message):
    untuned = tmp_path / "u.csv"
    untuned.write_text("M,N,K\n4,64,32\n")
    assert run("-i", untuned, "-o", tmp_path / "t.csv", *args) == 2
    err = capsys.readouterr().err
    assert message in err and ("Differences from AITER" in err or "--update_improved" in message)


# ---- --compare / --update_improved ------------------------------------------------------------------------------
def stale_file(path: Path) -> list[str]:
    """Three rows of this device, the middle one naming the deliberately slow candidate, and another device's."""
    return write_tuned(path, [tuned_row(4, 64, "fakepair", 0, "fast", 30.0),
                              tuned_row(5, 64, "fakepair", 1, "slow", 30.0),
                              tuned_row(6, 64, "fakepair", 0, "fast", 30.0),
                              tuned_row(5, 64, "cublaslt", 3, "v1:ab", 1.0, gfx="sm_90", cu="132")])


def test_compare_replaces_exactly_the_slow_row(inline, tmp_path, capsys):
    tuned = tmp_path / "tuned.csv"
    before = stale_file(tuned)
    # Without --update_improved the tuned file is not touched; the report says what would change.
    assert run("-i", tuned, "-o", tuned, "--all", "--compare", "--min_improvement_pct", "90", "--libtype",
               "fakepair", *FAST) == 0
    out = capsys.readouterr().out
    assert tuned.read_text().splitlines() == before
    assert "Would update: 1 (improved: 1, new: 0) | Skipped: 2" in out
    candidate = out.split("all winners in ")[1].split(",")[0].split(";")[0].strip()
    assert [r["kernelName"] for r in read_csv_rows(candidate)[1]][1] != "slow"  # every winner went there
    # AITER's flag set for a stale file: retune in place, write only what improved by the margin.
    assert run("-i", tuned, "-o", tuned, "--all", "--compare", "--update_improved", "--min_improvement_pct", "90",
               "--libtype", "fakepair", *FAST) == 0
    out = capsys.readouterr().out
    after = tuned.read_text().splitlines()
    assert len(after) == len(before)
    assert [i for i, (a, b) in enumerate(zip(before, after)) if a != b] == [2]  # header 0, the slow row is line 2
    new = read_csv_rows(tuned)[1][1]
    # fast ties with F.linear (one tick each): the baseline is kept, as a winner must beat it by --min_gain
    assert (new["M"], new["gfx"], new["kernelName"], new["us"]) == ("5", "cpu", "F.linear", "1.0000")
    assert "Updated: 1 (improved: 1, new: 0) | Skipped: 2" in out and "1 row(s) written" in out
    report = [line.split("|") for line in out.split("Compare Report")[1].splitlines() if line.startswith("(")]
    assert [(r[1].strip(), r[2].strip(), r[4].strip()) for r in report] == [
        ("1.00", "1.00", "KEEP"), ("20001.00", "1.00", "UPDATE"), ("1.00", "1.00", "KEEP")]  # 20 ms + a tick


# ---- --run_config ---------------------------------------------------------------------------------------------
def test_run_config_times_rows_against_f_linear(inline, tmp_path, capsys):
    tuned = tmp_path / "tuned.csv"
    before = write_tuned(tuned, [tuned_row(4, 64, "fakepair", 0, "fast", 30.0),
                                 tuned_row(5, 64, "asm", 7, "_ZN5aiter_bf16gemm", 3.0),  # an AMD row: cannot run
                                 tuned_row(9, 64, "fakepair", 1, "slow", 5000.0, gfx="gfx942", cu="304")])
    assert run("--run_config", tuned, *FAST) == 1  # a row that cannot run is an error
    out = capsys.readouterr().out
    assert tuned.read_text().splitlines() == before
    lines = [line for line in out.splitlines() if line.startswith("(")]
    assert len(lines) == 2  # only this device's rows
    assert "fakepair" in lines[0] and lines[0].rstrip().endswith("| OK") and "x |" in lines[0]
    assert "asm" in lines[1] and "ERROR" in lines[1]
    untuned = tmp_path / "u.csv"
    untuned.write_text("M,N,K\n4,64,32\n")
    assert run("-i", untuned, "--run_config", *FAST) == 0  # no file: the runtime default of each input shape
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("(")]
    assert "torch" in line and line.rstrip().endswith("| OK")


# ---- in place ------------------------------------------------------------------------------------------------
def test_in_place_retune_keeps_rows_it_could_not_retune(inline, tmp_path, capsys):
    tuned = tmp_path / "tuned.csv"
    write_tuned(tuned, [tuned_row(7, 64, "fakepair", 1, "slow", 99.0),
                        tuned_row(3, 48, "fakepair", 0, "fast", 1.0),  # fakepair cannot run N = 48
                        tuned_row(2, 64, "cublaslt", 3, "v1:ab", 1.0, gfx="sm_90", cu="132"),
                        tuned_row(1, 64, "hand", 0, "by hand", 0)])
    old = read_csv_rows(tuned)[1]
    assert run("-i", tuned, "-o", tuned, "--all", "--libtype", "fakepair", "--sort", "true", *FAST) == 1
    out = capsys.readouterr().out
    assert "2 tuned, 0 skipped" in out and ", 1 failed" in out  # N = 48: no candidate, its row kept
    rows = read_csv_rows(tuned)[1]
    by_key = {(r["gfx"], r["M"], r["N"]): r for r in rows}
    assert len(rows) == 4 and by_key[("cpu", "3", "48")] == old[1] and by_key[("sm_90", "2", "64")] == old[2]
    for M in ("7", "1"):  # retuned: F.linear, as fakepair's fast candidate is not 2% faster (both one tick)
        row = by_key[("cpu", M, "64")]
        assert (row["kernelName"], row["us"]) == ("F.linear", "1.0000")
    # --sort True: AITER's order, N before M (gfx, cu_num first)
    assert [(r["gfx"], r["N"], r["M"]) for r in rows] == [("cpu", "48", "3"), ("cpu", "64", "1"), ("cpu", "64", "7"),
                                                         ("sm_90", "64", "2")]
    assert run("-i", tuned, "-o", tuned, "--all", "--indtype", "fp16") == 2  # keys are the file's
    assert "do not apply" in capsys.readouterr().err


# ---- the block-scale tuner takes the same flags ---------------------------------------------------------------------
def test_blockscale_tuner_with_aiters_flags(inline, tmp_path, capsys):
    """AITER's block-scale tune scripts: -i a8w8_blockscale_untuned_gemm.csv -o ... with the common flags; then the
    file's rows timed (--run_config) and re-timed in place (--compare --update_improved): its row still wins."""
    from gradlib.tune_a8w8_blockscale import main as bs_main

    swap16 = "swapAB-BM16_BN64_BK128_GM1_SK1_W4_S4_TMA"  # any M <= 16 (interpreted: ~50 ms a launch)
    untuned, tuned, prof = tmp_path / "a8w8_blockscale_untuned_gemm.csv", tmp_path / "t.csv", tmp_path / "p.csv"
    untuned.write_text("M,N,K\n3, 128, 128\n")  # AITER's file has spaces after the commas
    common = ("--candidates", swap16, "--warmup", "0", "--iters", "3", "--json_dir", tmp_path)
    assert bs_main(["-i", str(untuned), "--tune_file", str(tuned), "-o2", str(prof), "--shape_grouped", "--sort",
                    "True", *map(str, common)]) == 0
    (row,) = read_csv_rows(tuned)[1]
    assert (row["M"], row["N"], row["K"], row["kernelName"]) == ("3", "128", "128", swap16)
    assert bs_main(["--run_config", str(tuned), "--warmup", "0", "--iters", "3"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("(3, 128, 128)")]
    assert swap16 in line and line.rstrip().endswith("| OK")
    before = tuned.read_text()
    assert bs_main(["-i", str(tuned), "-o", str(tuned), "--all", "--compare", "--update_improved",
                    *map(str, common)]) == 0
    out = capsys.readouterr().out
    assert "KEEP | the row's solution still wins" in out and tuned.read_text() == before


@pytest.mark.parametrize(("winner", "post", "action"), [
    ("library", 99.0, "UPDATE"),   # the library call 1% faster than the row: never slower than the library call
    ("other", 99.0, "KEEP"),       # another kernel 1% faster: under --min_improvement_pct
    ("other", 90.0, "UPDATE"),     # 10% faster: over it
    ("library", 100.5, "KEEP"),    # the row still faster than the library call
])
def test_compare_falls_back_to_the_library_call_by_any_margin(winner, post, action):
    from types import SimpleNamespace as NS

    from gradlib.compare import CompareOptions, verdict

    row, library, other = NS(name="row"), NS(name="F.linear"), NS(name="other")
    ok = NS(ok=True)
    outcome = NS(incumbent=NS(us=100.0, result=ok, solution=row), baseline=NS(us=post, result=ok, solution=library),
                 winner=NS(us=post, result=ok, solution=library if winner == "library" else other))
    if post > 100.0:  # the row would have won: the search's winner is the row itself
        outcome.winner = outcome.incumbent
    v = verdict(outcome, True, CompareOptions(min_improvement_pct=3.0))
    assert v.action == action, v
