"""The package's programs as a newcomer meets them: ``--help`` that parses and says every default, the demo's table
printed whole, the harness installed (the layering of the runtime, the tuner and the examples: test_layering.py)."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from op_tests.runtime_helpers import BF16_HEADER, bf16_row

REPO = Path(__file__).resolve().parent.parent


def _defaults_shown(parser: argparse.ArgumentParser) -> list[str]:
    """Options with a default whose help does not say it (empty: every default is shown)."""
    missing = []
    for action in parser._actions:
        if action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            continue
        text = parser._get_formatter()._expand_help(action) if action.help else ""
        if "default" not in text:
            missing.append(action.option_strings[-1])
    return missing


# ---- --help ---------------------------------------------------------------------------------------------------
def test_demo_help_shows_every_default(capsys):
    from aiter_gemm import demo

    parser = demo.build_parser()
    assert _defaults_shown(parser) == []
    with pytest.raises(SystemExit) as info:
        demo.main(["--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "(default: 64)" in out and "llama3_8b_untuned_gemm.csv)" in out


def test_hf_decode_help_is_whole_sentences_with_defaults_and_the_example(capsys):
    from examples import hf_decode

    parser = hf_decode.build_parser()
    assert _defaults_shown(parser) == []
    with pytest.raises(SystemExit) as info:
        hf_decode.parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert info.value.code == 0
    # the description used to stop after "check them against the" (the docstring's first line)
    assert "check them against the shapes gradlib.models derives, (tune them,) and time prefill and per-token " \
           "decode with and without the patch." in out
    assert "example (capture, tune, measure):" in out and "gemm-tuner -i hf_out/captured_gemm.csv" in out
    assert "--mode measure --out hf_out \\ --tuned hf_out/tuned_gemm.csv" in out


# ---- the demo ---------------------------------------------------------------------------------------------------
def test_demo_prints_its_table_whole_and_counts_the_misses(tmp_path, clean_runtime, capsys, caplog):
    """The runtime's per-shape "not found tuned config" INFO lines (AITER's, kept for library users) used to
    interleave with the table; the demo now prints the table, then how many shapes missed, with one example."""
    from aiter_gemm import demo
    from aiter_gemm.dispatch import MISS_MESSAGE

    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K\n1,64,32\n2,64,32\n16,48,32\n")
    tuned = tmp_path / "tuned.csv"
    tuned.write_text(BF16_HEADER + bf16_row(16, 48, 32, dtype="torch.bfloat16"))
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(tuned))
    import aiter_gemm

    aiter_gemm.reload_configs()
    logger = logging.getLogger("aiter_gemm")
    before = (logger.handlers[:], logger.level, logger.propagate)
    with caplog.at_level(logging.INFO, logger="aiter_gemm"):
        assert demo.main(["--shapes", str(shapes), "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("3 shapes from") and lines[1].split()[:3] == ["M", "N", "K"]
    rows = [line.split() for line in lines[2:5]]
    assert [(r[0], r[6]) for r in rows] == [("1", "default"), ("2", "default"), ("16", "exact")]
    assert lines[5].startswith("2 shape(s) matched no tuned row and ran the default")
    assert "shape is M:1, N:64, K:32" in lines[6] and len(lines) == 7
    assert "not found tuned config" not in err  # not printed a second time
    assert not [r for r in caplog.records if r.msg == MISS_MESSAGE], "the demo's handler was the only one"
    assert (logger.handlers, logger.level, logger.propagate) == before  # the library's logging left as it was


@pytest.mark.parametrize("argv,expected", [
    (["--shapes", "{tmp}/missing.csv"], "--shapes {tmp}/missing.csv: not found"),
    (["--shapes", "{tmp}/bad.csv"], "--shapes {tmp}/bad.csv:2, column 'dtype': bad value 'torch.float64'"),
    (["--max-m", "0"], "argument --max-m: must be an integer >= 1, got '0'"),
    (["--device", "cuda:99"], "argument --device: cuda:99: this "),
])
def test_demo_bad_arguments_exit_2_with_one_line(tmp_path, capsys, argv, expected):
    """Issue 47: a missing or malformed shape list and a GPU this machine lacks were tracebacks."""
    from aiter_gemm import demo

    (tmp_path / "bad.csv").write_text("M,N,K,dtype\n1,64,32,torch.float64\n")
    with pytest.raises(SystemExit) as e:
        demo.main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: ")
    assert err.splitlines()[-1].startswith(f"python -m aiter_gemm.demo: error: {expected.format(tmp=tmp_path)}")


@pytest.mark.parametrize("argv,expected", [
    (["--config", "nosuch"], "--config nosuch: no config.json there and no shipped model of that name"),
    (["--out", "{tmp}/a_file"], "--out {tmp}/a_file: {tmp}/a_file is not a folder"),
    (["--tuned", "{tmp}/missing.csv:@shipped"], "--tuned {tmp}/missing.csv: not found"),
    (["--device", "cuda:99"], "argument --device: cuda:99: this "),
    (["--layers", "0"], "argument --layers: must be an integer >= 1, got '0'"),
    (["--rounds", "0"], "argument --rounds: must be an integer >= 1, got '0'"),
])
def test_hf_decode_bad_arguments_exit_2_before_the_model_is_built(tmp_path, capsys, argv, expected):
    """A missing model config exited 1 after the output folder was made; a file as --out, a missing --tuned file, a
    GPU this machine lacks were tracebacks (or, --tuned, a measurement without the table); --layers 0 ran on."""
    from examples import hf_decode

    (tmp_path / "a_file").write_text("x")
    with pytest.raises(SystemExit) as e:
        hf_decode.parse_args([*(a.format(tmp=tmp_path) for a in argv), "--out", str(tmp_path / "out")]
                             if "--out" not in argv else [a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: ")
    assert err.splitlines()[-1].startswith(f"python -m examples.hf_decode: error: "
                                           f"{expected.format(tmp=tmp_path)}"), err
    assert not (tmp_path / "out").exists()


# ---- installed ------------------------------------------------------------------------------------------------
def test_readme_installs_what_ci_installs():
    """Issue 47: README installed ``.[test]`` and .ci/run ``.[test,ray,hf,tilelang]``, so a newcomer following the
    README skipped the tests of three extras; README's test command now installs CI's extras and says what they add."""
    import re

    extras = re.search(r'pip install -q "\.\[([a-z,]+)\]"', (REPO / ".ci" / "run").read_text()).group(1)
    readme = (REPO / "README.md").read_text()
    assert f'pip install -e ".[{extras}]"' in readme
    for extra in extras.split(","):
        assert extra == "test" or f"`{extra}` (" in readme, extra


def test_the_benchmark_harness_runs_from_another_folder_once_installed(tmp_path):
    """Issue 47: ``benchmarks`` was not installed, so ``python -m benchmarks.run`` worked only from the checkout's
    root. The package installed (a non-editable copy of this tree in a temp folder) runs it from anywhere."""
    import shutil

    src, site, elsewhere = tmp_path / "src", tmp_path / "site", tmp_path / "elsewhere"
    skip = shutil.ignore_patterns("__pycache__", "results", "*.egg-info", "build")
    for name in ("aiter_gemm", "gradlib", "benchmarks", "configs"):
        shutil.copytree(REPO / name, src / name, ignore=skip)
    shutil.copy(REPO / "setup.py", src / "setup.py")
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--no-compile", "--target", str(site), str(src)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    res = subprocess.run([sys.executable, "-m", "benchmarks.run", "list"], cwd=elsewhere, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "--bench bf16 (gemm_a16w16) providers:" in lines and any(line.split()[:1] == ["shipped"] for line in lines)
    where = subprocess.run([sys.executable, "-c", "import benchmarks; print(benchmarks.__file__)"], cwd=elsewhere,
                           env=env, capture_output=True, text=True, timeout=60).stdout.strip()
    assert Path(where).is_relative_to(site)  # the installed copy ran, not this checkout


# ---- hf_decode's report -------------------------------------------------------------------------------------------
def test_hf_decode_table_names_each_statistic_when_medians_and_speedup_disagree():
    """Rounds whose medians say "slower" (12.65 vs 12.85 ms) while the median per-round ratio says "faster" (1.053,
    the method's number): each column says which statistic it is, and the ratio of the medians is there too."""
    from benchmarks.hf_summary import TABLE_LEGEND, markdown, summarize

    times = {"without": [10.0, 12.65, 20.0], "with": [12.85, 12.0, 19.0]}
    rounds = [{"model": "m", "batch": 1, "mode": "eager", "phase": "decode", "arm": arm, "round": r, "ms": ms}
              for arm, values in times.items() for r, ms in enumerate(values)]
    (row,) = summarize(rounds, prompt_len=8)
    assert row["ms_without"] < row["ms_with"] and row["speedup"] == pytest.approx(20 / 19)
    assert row["ratio_of_medians"] == pytest.approx(12.65 / 12.85)
    header, _, line, _, legend = markdown([row]).splitlines()
    cells = [c.strip() for c in line.strip("|").split("|")]
    named = dict(zip([c.strip() for c in header.strip("|").split("|")], cells))
    assert named["median ms without [min-max]"] == "12.650 [10.000-20.000]"
    assert named["median ms with [min-max]"] == "12.850 [12.000-19.000]"
    assert named["speedup: median per-round ratio [min-max]"] == "1.053 [0.778-1.054]"
    assert named["ratio of medians"] == "0.984"
    assert legend == TABLE_LEGEND and "adjacent timings" in legend


@pytest.mark.parametrize("text", ["1_6", "\u0661\u0666", "16,+"])
def test_integer_flags_take_ascii_digits(text):
    """Issue 47: the programs' integer flags (``int()``) read ``1_6`` as 16 and other scripts' digits as digits."""
    import argparse

    from aiter_gemm import cliargs

    for parse in (cliargs.positive_int, cliargs.positive_int_list):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)
