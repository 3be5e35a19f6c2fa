"""The device scripts (``benchmarks/device/``) on CPU: they parse (and pass shellcheck where it is installed);
``record.sh``'s calls hold every step once and, with DRY_RUN=1, print commands that their programs' own argument
parsers accept for an H200; docs/benchmarks.md names a step for every table BENCHMARKS.md renders; common.sh's
``step`` goes on after a failing step and keeps to the call's budget; the CPU-capable step runs for real."""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from aiter_gemm.device import DeviceIdentity

REPO = Path(__file__).resolve().parents[1]
DEVICE = REPO / "benchmarks" / "device"
RECORD = DEVICE / "record.sh"
H200 = DeviceIdentity("sm_90", 132, "cuda", "NVIDIA H200")
CALLS = ("1", "2", "3", "4")
STEP_LINE = re.compile(r"^== (\w+) \((\d+) s\): (.*)$")
SCRIPTS = sorted(p.name for p in DEVICE.glob("*.sh"))


def bash(script: str | Path, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``bash script`` from the repository root, with only the record variables ``env`` gives."""
    full = {k: v for k, v in os.environ.items()
            if k not in ("CALL", "STEPS", "DRY_RUN", "CALL_DEADLINE", "CALL_BUDGET_S", "BENCH_ARGS")}
    return subprocess.run(["bash", str(script)], cwd=REPO, env={**full, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


def record_steps() -> list[str]:
    """record.sh's steps, in its order (``step NAME ...`` and ``sub NAME ...`` lines)."""
    return re.findall(r"^(?:step|sub) (\w+) ", RECORD.read_text(), re.M)


def dry_run(out: Path, **env: str) -> list[tuple[str, int, list[str]]]:
    """(step, limit, command words) of every line ``DRY_RUN=1 record.sh`` prints, the sub-scripts' steps included."""
    res = bash(RECORD, {"DRY_RUN": "1", "OUT": str(out), **env})
    assert res.returncode == 0, res.stderr
    # (a ``python -c`` program prints as bash's $'...', which shlex does not read)
    return [(m.group(1), int(m.group(2)), ["python", "-c"] if m.group(3).startswith("python -c ")
             else shlex.split(m.group(3))) for m in map(STEP_LINE.match, res.stdout.splitlines()) if m]


@pytest.mark.parametrize("script", SCRIPTS)
def test_device_scripts_parse(script):
    res = subprocess.run(["bash", "-n", str(DEVICE / script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    if shutil.which("shellcheck"):
        res = subprocess.run(["shellcheck", "-x", f"benchmarks/device/{script}"], cwd=REPO, capture_output=True,
                             text=True)
        assert res.returncode == 0, res.stdout


def steps_only() -> list[str]:
    """The steps record.sh's header lists as run by STEPS only (no CALL group)."""
    text = RECORD.read_text()
    block = text[text.index("#   STEPS only"):]
    block = block[:block.index("\n#\n")]
    return re.findall(r"(\w+) \d+", block)


def test_record_calls_hold_every_step_once(tmp_path):
    """CALL=1..4 and the header's STEPS-only list partition record.sh's steps; each call runs them in the file's
    order, every limit within the budget."""
    steps = record_steps()
    seen: list[str] = list(steps_only())
    assert seen
    for call in CALLS:
        lines = dry_run(tmp_path / call, CALL=call)
        top = [name for name, _, _ in lines if name in steps]
        assert top and top == [s for s in steps if s in top], call
        assert all(limit <= 540 for _, limit, _ in lines)
        seen += top
    assert sorted(seen) == sorted(steps) and len(set(seen)) == len(seen)


@pytest.mark.parametrize("env, message", [
    ({"CALL": "1", "STEPS": "overhead"}, "give CALL or STEPS, not both"),
    ({"CALL": "7"}, "CALL must be 1-4, got 7"),
    ({"CALL": "one"}, "CALL must be 1-4, got one"),
    ({}, "set CALL (1-4) or STEPS"),
    ({"STEPS": "bf16 fp9"}, "unknown step 'fp9'"),
])
def test_record_rejects_bad_calls_and_steps(tmp_path, env, message):
    res = bash(RECORD, {"DRY_RUN": "1", "OUT": str(tmp_path), **env})
    assert res.returncode == 2 and message in res.stderr and not res.stdout, (res.stdout, res.stderr)


def _placeholders(words: list[str], out: Path) -> None:
    """Small files for the inputs an earlier step of the same call writes (a CSV of shapes the next step reads)."""
    for w in words:
        if w.startswith(str(out)) and Path(w).suffix == ".csv" and not Path(w).exists():
            Path(w).parent.mkdir(parents=True, exist_ok=True)
            Path(w).write_text("M,N,K\n1,128,128\n")


def check_command(words: list[str], out: Path) -> str:
    """Parse one printed command with its program's own argument parser (and, for the harness, its check of the
    providers, baselines and shape sets on an H200), before anything would run; returns the program's name."""
    while words and (words[0] == "env" or re.match(r"^[A-Z][A-Z0-9_]*=", words[0])):
        if words[0].startswith("AITER_CONFIG"):
            for path in words[0].split("=", 1)[1].split(":"):
                assert (REPO / path).is_file(), path
        words = words[1:]
    assert words[:2] in (["python", "-m"], ["python", "-c"]), words
    if words[1] == "-c":
        return "python -c"
    prog, argv = words[2], words[3:]
    _placeholders(argv, out)
    if prog == "benchmarks.run":
        from benchmarks.providers import BENCH_OPS
        from benchmarks.run import bench_parser, bench_plan

        ap = bench_parser()
        args = ap.parse_args(argv)
        if args.bench in BENCH_OPS:
            assert bench_plan(ap, args, H200)[3]
    elif prog in ("gradlib.gemm_tuner", "gradlib.tune_a8w8_blockscale", "gradlib.tune_moe"):
        args = importlib.import_module(prog).build_parser().parse_args(argv)
        src = getattr(args, "input_file", None) or getattr(args, "shapes", None)
        if src is None:  # shapes derived from a model's config.json (--model_dir)
            from gradlib.models import load_arch

            assert load_arch(args.model_dir)
        else:
            src = Path(src)
            assert (src if src.is_absolute() else REPO / src).is_file(), src
    elif prog == "examples.hf_decode":
        from examples.hf_decode import build_parser, resolve_config

        args = build_parser().parse_args(argv)
        resolve_config(args.config)
        for path in f"{args.tuned or ''}:{args.tuned_fmoe or ''}".split(":"):
            assert not path or path.startswith(str(out)) or (REPO / path).is_file(), path
    else:
        raise AssertionError(f"unexpected program {prog}")
    return prog


@pytest.mark.parametrize("call", [*CALLS, "steps only"])
def test_record_commands_parse_for_an_h200(call, tmp_path):
    """Every command a call (or the STEPS-only list) prints is one its program accepts: flags, providers, shape sets
    (built for an H200), the committed files it reads; the sub-scripts' commands too."""
    lines = dry_run(tmp_path, **({"CALL": call} if call in CALLS else {"STEPS": " ".join(steps_only())}))
    progs = {check_command(words, tmp_path) for _, _, words in lines if words[-2:-1] != ["bash"]}
    assert progs


@pytest.mark.parametrize("dtype, config, tuner, table", [
    (None, "qwen3_30b_a3b", "gradlib.gemm_tuner", "tuned_gemm.csv"),
    ("fp8", "qwen3_30b_a3b_fp8", "gradlib.tune_a8w8_blockscale", "a8w8_blockscale_tuned_gemm.csv"),
])
def test_hf_moe_commands_parse(tmp_path, dtype, config, tuner, table):
    """``DRY_RUN=1 hf_moe.sh`` (not a record.sh call; DTYPE=fp8: the FP8 model) prints its four steps, each a
    command its program accepts, the GEMM tuner the one of the model's linears; the four fit one device call of 600 s
    with time left for the eager-path build."""
    res = bash(DEVICE / "hf_moe.sh", {"DRY_RUN": "1", "OUT": str(tmp_path), **({"DTYPE": dtype} if dtype else {})})
    assert res.returncode == 0, res.stderr
    lines = [m.groups() for m in map(STEP_LINE.match, res.stdout.splitlines()) if m]
    assert [name for name, _, _ in lines] == ["capture", "tune_gemm", "tune_moe", "measure"]
    progs = [check_command(shlex.split(cmd), tmp_path) for _, _, cmd in lines]
    assert progs == ["examples.hf_decode", tuner, "gradlib.tune_moe", "examples.hf_decode"]
    folder = tmp_path / ("hf_moe_fp8" if dtype == "fp8" else "hf_moe")
    capture, tune_gemm, tune_moe, measure = (shlex.split(cmd) for _, _, cmd in lines)
    assert capture[capture.index("--config") + 1] == config and measure[:measure.index("--mode")] == \
        capture[:capture.index("--mode")]
    assert tune_gemm[tune_gemm.index("-o") + 1] == measure[measure.index("--tuned") + 1] == str(folder / table)
    assert tune_moe[tune_moe.index("-o") + 1] == measure[measure.index("--tuned-fmoe") + 1]
    limits = [int(limit) for _, limit, _ in lines]
    assert sum(limits) <= 600 - 40


def test_hf_moe_rejects_an_unknown_dtype(tmp_path):
    res = bash(DEVICE / "hf_moe.sh", {"DRY_RUN": "1", "OUT": str(tmp_path), "DTYPE": "fp4"})
    assert res.returncode == 2 and "DTYPE must be bf16 or fp8, got fp4" in res.stderr and not res.stdout


def docs_table() -> tuple[dict[str, set[str]], list[str]]:
    """docs/benchmarks.md's table: {marker's file: the steps named}, and the new files' names."""
    mapping: dict[str, set[str]] = {}
    new_files: list[str] = []
    for line in (REPO / "docs" / "benchmarks.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| `") or len(cells) != 4:
            continue
        for f in re.findall(r"`([^`]+)`", cells[0]):
            mapping[f] = {s.strip() for s in cells[1].split(",")}
        new_files += re.findall(r"`([^`]+)`", cells[2])
    return mapping, new_files


def test_docs_name_a_step_for_every_table_of_benchmarks_md():
    """Each file a <!-- report: --> marker of BENCHMARKS.md reads is in docs/benchmarks.md's table with record.sh's
    steps that re-record it (or 'none'), or is already a file record.sh writes."""
    mapping, new_files = docs_table()
    steps = set(record_steps())
    assert mapping and all(named and named <= steps | {"none"} for named in mapping.values()), mapping
    written = [re.compile(re.escape(Path(f).name).replace("<GPU>", "[^/]+") + "$") for f in new_files]
    markers = re.findall(r"^<!-- report: (.*) -->$", (REPO / "BENCHMARKS.md").read_text(), re.M)
    assert markers
    for marker in markers:
        for word in shlex.split(marker):
            if word.startswith("benchmarks/results/") and not word.startswith("benchmarks/results/fp8/configs_"):
                key = word.removeprefix("benchmarks/results/")
                assert key in mapping or any(w.search(key) for w in written), f"{key}: not in docs/benchmarks.md"


def _step_script(tmp_path: Path, body: str, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "steps.sh"
    script.write_text(f'set -u\nLOG="{tmp_path}/log"\n. benchmarks/device/common.sh\n{body}\n')
    return bash(script, env)


def test_step_goes_on_after_a_failing_step(tmp_path):
    """common.sh's step: each step's rc and wall time logged; a failing step and one stopped at its limit (rc 124)
    do not stop the next; STEPS selects."""
    res = _step_script(tmp_path, "step fails 5 false\nstep stopped 1 sleep 30\nstep ok 5 echo out\nstep other 5 true",
                       STEPS="fails stopped ok")
    assert res.returncode == 0, res.stderr
    log = (tmp_path / "log").read_text()
    assert re.search(r"^== fails rc=1 \d+ s$", log, re.M) and re.search(r"^== stopped rc=124 \d+ s$", log, re.M)
    assert re.search(r"^== ok rc=0 \d+ s$", log, re.M) and "\nout\n" in log and "other" not in log


def test_step_keeps_to_the_call_deadline(tmp_path):
    """A step with < 10 s of CALL_DEADLINE left is skipped and logged; one with more is cut to the time left."""
    res = _step_script(tmp_path, 'CALL_DEADLINE=$(( $(date +%s) + 5 ))\nstep late 100 true\n'
                       'CALL_DEADLINE=$(( $(date +%s) + 60 ))\nDRY_RUN=1 step cut 100 echo "a b"')
    log = (tmp_path / "log").read_text()
    assert re.search(r"^== late skipped: \d+ s left of the call's budget$", log, re.M) and "== late:" not in log
    (line,) = res.stdout.splitlines()
    m = re.match(r"^== cut \((\d+) s\): echo 'a b'$", line)
    assert m and 50 <= int(m.group(1)) <= 60


def test_record_sub_scripts_end_within_their_step(tmp_path):
    """A sub-script's own steps are cut to its step's limit and to the call's budget."""
    lines = dict((name, limit) for name, limit, _ in dry_run(tmp_path, CALL="3", CALL_BUDGET_S="100"))
    assert lines["hf"] <= 100 and lines["measure"] < lines["hf"]
    lines = dict((name, limit) for name, limit, _ in dry_run(tmp_path, CALL="3"))
    assert lines["hf"] == 260 and lines["measure"] < 260


def test_record_runs_the_overhead_step_on_cpu(tmp_path):
    """A real run on CPU (tiny counts, no C++ build): the CPU-capable step writes its CSV where record.sh's header
    says, a GPU-only one fails (graph timing needs CUDA) and is logged; the env header and the exit status say so."""
    out = tmp_path / "out"
    res = bash(RECORD, {"OUT": str(out), "STEPS": "overhead layer", "BUILD_EXT": "0",
                        "BENCH_ARGS": "--calls 20 --repeats 3", "COMMIT": "abc1234"})
    assert res.returncode == 1, res.stderr
    log = (out / "record.log").read_text()
    assert "steps overhead layer; budget 540 s; BENCH_ARGS --calls 20 --repeats 3" in log and "commit abc1234" in log
    assert re.search(r"^== overhead rc=0 \d+ s$", log, re.M) and re.search(r"^== layer rc=2 \d+ s$", log, re.M)
    assert (out / "overhead" / "overhead_cpu.csv").is_file() and (out / "overhead" / "overhead_cpu_env.json").is_file()
    assert "== layer rc=2" in res.stdout


def test_moe_device_script_commands_parse(tmp_path):
    """``DRY_RUN=1 moe.sh`` (issue 51's call) prints its five steps within one device call, each a command its program
    accepts (the MoE shape sets and providers of the harness included)."""
    res = bash(DEVICE / "moe.sh", {"DRY_RUN": "1", "OUT": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    lines = [m.groups() for m in map(STEP_LINE.match, res.stdout.splitlines()) if m]
    assert [name for name, _, _ in lines] == ["tests", "tune_qwen3", "tune_mixtral", "tune_dsv3", "bench"]
    assert sum(int(limit) for _, limit, _ in lines) <= 560
    progs = [check_command(shlex.split(cmd), tmp_path) for name, _, cmd in lines if name != "tests"]
    assert progs == ["gradlib.tune_moe"] * 3 + ["benchmarks.run"]
