"""``python -m aiter_gemm.kernel_check``: the verify / bench / Nsight Compute contract of one kernel config. CPU:
the exact output lines and exit statuses over odd shapes and every way of naming a config (kernelName, JSON, solidx,
default), a forced failure (a runner made wrong), argument errors naming the argument, and the ncu command lines
(ncu absent: an error; a fake ncu on PATH: the profiled re-run and the CSV export). GPU: ``--bench``'s line.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

import pytest
import torch

from aiter_gemm import kernel_check, testbed
from aiter_gemm.kernels.a8w8_blockscale import BlockscaleConfig

ROOT = Path(__file__).resolve().parents[1]
PASS = "VERIFY: PASS\n"
FAIL = re.compile(r"VERIFY: FAIL max_abs_err=(\S+)\n")
BENCH = re.compile(r"TFLOPS: (\d+\.\d+) time_ms: (\d+\.\d+)\n")
#: Odd sizes: remainders against every tile (interpreted Triton on CPU: kept small).
ODD_A16W16 = [(1, 48, 64), (5, 40, 72), (17, 33, 96)]
ODD_BLOCKSCALE = [(1, 256, 256), (7, 136, 384)]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = kernel_check.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def runtime(clean_runtime):
    return clean_runtime


@pytest.mark.parametrize("shape", ODD_A16W16, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("libtype,config", [
    ("torch", "default"), ("torch", "F.linear"), ("triton", "default"), ("triton", "BM16_BN32_BK32_GM1_SK2_W4_S1"),
    ("triton", '{"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1, '
               '"NUM_KSPLIT": 1, "num_warps": 4, "num_stages": 1}'),
    ("skinny", "3"), ("skinny", '{"solidx": 0}'),
])
def test_a16w16_verify_passes(runtime, capsys, shape, libtype, config):
    if libtype == "skinny" and shape[0] > 16:
        pytest.skip("skinny kernels serve M <= 16")
    rc, out, err = run(capsys, "--op", "a16w16", "--libtype", libtype, "--shape", ",".join(map(str, shape)),
                       "--config", config, "--verify")
    assert (rc, out, err) == (0, PASS, "")


@pytest.mark.parametrize("shape", ODD_BLOCKSCALE, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("config", [
    "default", "swapAB-BM16_BN128_BK128_GM1_SK1_W4_S2", "splitK_swapAB-BM16_BN64_BK128_GM1_SK2_W4_S2",
    json.dumps(BlockscaleConfig("base", 16, 64, 128, 1, 1, 4, 2).to_json()),
])
def test_blockscale_triton_verify_passes(runtime, capsys, shape, config):
    rc, out, err = run(capsys, "--op", "a8w8_blockscale", "--libtype", "triton", "--shape",
                       ",".join(map(str, shape)), "--config", config, "--verify")
    assert (rc, out, err) == (0, PASS, "")


@pytest.mark.parametrize("op,libtype,shape", [("a16w16", "torch", "5,40,72"), ("a16w16", "triton", "5,40,72"),
                                              ("a8w8_blockscale", "triton", "7,136,384")])
def test_a_wrong_runner_fails_verification(runtime, capsys, monkeypatch, op, libtype, shape):
    """The runner the backend prepared, made wrong by 0.5 on one element: exit 1 and its error."""
    real = kernel_check.prepare_runner

    def broken(*a, **kw):
        runner, sol, why = real(*a, **kw)

        def wrong(*args):
            out = runner(*args)
            out[-1, -1] += 0.5
            return out

        return wrong, sol, why

    monkeypatch.setattr(kernel_check, "prepare_runner", broken)
    rc, out, err = run(capsys, "--op", op, "--libtype", libtype, "--shape", shape, "--verify")
    m = FAIL.fullmatch(out)
    assert rc == 1 and m is not None and err == ""
    assert 0.45 <= float(m[1]) <= 0.55


def test_library_output_goes_to_stderr(runtime, capsys, monkeypatch):
    """What a kernel's library prints while the runner is built or run (TileLang logs each compile to stdout) lands
    on stderr: stdout holds the result lines alone."""
    real = kernel_check.prepare

    def noisy(check, seed=0):
        print("compiling kernel ...")
        return real(check, seed)

    monkeypatch.setattr(kernel_check, "prepare", noisy)
    rc, out, err = run(capsys, "--op", "a16w16", "--libtype", "torch", "--shape", "5,48,64", "--verify")
    assert (rc, out, err) == (0, PASS, "compiling kernel ...\n")


@pytest.mark.parametrize("argv,field", [
    (["--op", "a16w16", "--libtype", "torch", "--shape", "5,48", "--verify"], "--shape"),
    (["--op", "a16w16", "--libtype", "torch", "--shape", "0,48,64", "--verify"], "--shape"),
    (["--op", "a16w16", "--libtype", "torch", "--shape", "5,4x,64", "--verify"], "--shape"),
    (["--op", "a16w16", "--libtype", "rocblas", "--shape", "5,48,64", "--verify"], "--libtype"),
    (["--op", "a8w8_blockscale", "--libtype", "skinny", "--shape", "5,256,256", "--verify"], "--libtype"),
    (["--op", "a8w8_blockscale", "--libtype", "tilelang", "--shape", "5,256,256", "--verify"], "--libtype"),
    (["--op", "a16w16", "--libtype", "triton", "--shape", "5,48,64", "--config", "BM16_nonsense", "--verify"],
     "--config"),
    (["--op", "a16w16", "--libtype", "triton", "--shape", "5,48,64", "--config", "{bad json", "--verify"],
     "--config"),
    (["--op", "a16w16", "--libtype", "torch", "--shape", "5,48,64", "--config", '{"BLOCK_SIZE_M": 16}',
      "--verify"], "--config"),
    (["--op", "a8w8_blockscale", "--libtype", "triton", "--shape", "5,256,256", "--config",
      "scaled_mm_blockwise", "--verify"], "--config"),
    (["--op", "a8w8_blockscale", "--libtype", "triton", "--shape", "5,256,256", "--config",
      "swapAB-BM16_BN128_BK128_GM1_SK3_W4_S2", "--verify"], "--config"),
    (["--op", "a16w16", "--libtype", "torch", "--shape", "5,48,64", "--dtype", "int3", "--verify"], "--dtype"),
    (["--op", "a16w16", "--libtype", "torch", "--shape", "5,48,64"], "nothing to do"),
])
def test_bad_arguments_exit_2_naming_the_field(runtime, capsys, argv, field):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == "" and field in err and err.startswith(f"{kernel_check.PROG}: error:")


A16 = ["--op", "a16w16", "--shape", "5,48,64", "--verify"]
BS = ["--op", "a8w8_blockscale", "--libtype", "triton", "--shape", "5,256,256", "--verify"]


@pytest.mark.parametrize("argv,expected", [
    ([*A16, "--libtype", "torch", "--dtype", "int8"], "--dtype/--outdtype: torch.int8 inputs are not supported"),
    ([*BS, "--outdtype", "int8"], "--dtype/--outdtype: torch.int8 output is not supported"),
    ([*A16, "--libtype", "skinny", "--config", '{"solidx": "x"}'], "solidx must be a JSON integer, got 'x'"),
    ([*A16, "--libtype", "triton", "--config", '{"kernelName": 5}'], "kernelName must be a JSON string, got 5"),
    ([*BS, "--config", '{"kernelName": 5}'], "kernelName must be a JSON string, got 5"),
    (["--op", "a16w16", "--libtype", "torch", "--shape", f"{2 ** 40},16,16", "--verify"],
     f"--shape {2 ** 40},16,16: inputs need at least 140737.5 GB (float32 A, B and reference of M={2 ** 40} N=16 "
     "K=16), "),
])
def test_arguments_that_used_to_raise_exit_2_with_one_line(runtime, capsys, monkeypatch, argv, expected):
    """Issue 47: an integer dtype (a KeyError from the tolerance table), JSON solution fields of the wrong type (a
    TypeError / AttributeError in the backend) and a shape no memory holds (an allocation error) were tracebacks."""
    monkeypatch.setattr(testbed, "device_memory", lambda device: (64 * 10 ** 9, "in total"))
    rc, out, err = run(capsys, *argv)
    assert (rc, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith(f"{kernel_check.PROG}: error: ") and expected in err, err


@pytest.mark.parametrize("where", ["resolve", "prepare"])
def test_a_parsers_config_error_exits_2_with_its_message(runtime, capsys, monkeypatch, where):
    """A kernelName the shared parsers reject (out of range, malformed) raises ConfigError / ValueError wherever
    the config is parsed: the CLI reports the parser's message as a --config usage error, not a traceback."""
    from aiter_gemm.configs import ConfigError
    from aiter_gemm.registry import get_backend

    def refuse(*args, **kwargs):
        raise ConfigError("<kernelName>", 0, "kernelName", "num_stages=99 out of range 1..8")

    if where == "resolve":
        monkeypatch.setattr(type(get_backend("triton")), "candidates", refuse)
    else:
        monkeypatch.setattr(kernel_check, "prepare_runner", refuse)
    rc, out, err = run(capsys, *A16, "--libtype", "triton", "--config", "BM16_BN32_BK32_GM1_SK1_W4_S99")
    assert (rc, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith(f"{kernel_check.PROG}: error: --config ") and "num_stages=99 out of range 1..8" in err


def test_ncu_into_a_file_exits_2_before_anything_runs(runtime, capsys, tmp_path, monkeypatch):
    called = []
    monkeypatch.setattr(kernel_check, "prepare", lambda *a: called.append(a))
    (tmp_path / "report").write_text("not a folder")
    rc, out, err = run(capsys, *A16, "--libtype", "torch", "--ncu", str(tmp_path / "report"))
    assert (rc, out, called) == (2, "", []) and err.count("\n") == 1 and "--ncu" in err and "not a folder" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answer to --verify --bench")
def test_verify_and_bench_on_cpu_verifies_and_says_why_bench_is_skipped(runtime, capsys):
    rc, out, err = run(capsys, *A16, "--libtype", "torch", "--bench")
    assert (rc, out) == (0, PASS)
    assert err == f"{kernel_check.PROG}: skipping {kernel_check.NO_CUDA}\n"


_ENTRY = '{"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": %s, "NUM_KSPLIT": 1, ' \
    '"num_warps": 4, "num_stages": 1}'


@pytest.mark.parametrize("op,libtype,config,why", [  # issue 47: out-of-range values reached the compiler
    ("a16w16", "triton", "BM16_BN32_BK32_GM2147483648_SK1_W4_S1", "GROUP_SIZE_M=2147483648 must be in 1..1024"),
    ("a16w16", "triton", _ENTRY % "1e23", "GROUP_SIZE_M must be an integer, got 1e+23"),
    ("a16w16", "triton", _ENTRY % "2147483648", "GROUP_SIZE_M=2147483648 must be in 1..1024"),
    ("a16w16", "skinny", "fma_BN16_BK512_SK1_W4_S2147483648", "num_stages=2147483648 in 1..8"),
    ("a8w8_blockscale", "triton", "swapAB-BM16_BN128_BK128_GM2147483648_SK1_W4_S2", "GROUP_SIZE_M must be in 1..1024"),
])
def test_out_of_range_config_exits_2_saying_why(runtime, capsys, op, libtype, config, why):
    shape = "5,48,64" if op == "a16w16" else "5,256,256"
    rc, out, err = run(capsys, "--op", op, "--libtype", libtype, "--shape", shape, "--config", config, "--verify")
    assert (rc, out) == (2, "") and why in err and err.startswith(f"{kernel_check.PROG}: error: --config")


def test_unknown_op_is_argparses_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        kernel_check.main(["--op", "a4w4", "--libtype", "torch", "--shape", "1,2,3", "--verify"])
    assert exc.value.code == 2 and "--op" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answer to --bench")
def test_bench_needs_cuda(runtime, capsys):
    rc, out, err = run(capsys, "--op", "a16w16", "--libtype", "torch", "--shape", "5,48,64", "--bench")
    assert rc == 2 and "--bench" in err and "CUDA" in err


def test_ncu_absent_is_an_error(runtime, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no ncu there
    rc, out, err = run(capsys, "--op", "a16w16", "--libtype", "torch", "--shape", "5,48,64", "--verify",
                       "--ncu", str(tmp_path / "prof"))
    assert rc == 2 and out == "" and "--ncu" in err and "not on PATH" in err
    assert not (tmp_path / "prof").exists()


def test_ncu_command_lines():
    argv = ["--op", "a16w16", "--libtype", "torch", "--shape", "5,48,64", "--verify", "--ncu", "d", "--bench"]
    profile, export, report, csv_path = kernel_check.ncu_commands(argv, "d", "x", "/opt/ncu")
    assert profile == ["/opt/ncu", "--target-processes", "all", "--set", "full", "--profile-from-start", "off",
                       "--export", str(Path("d/x.ncu-rep")), "--force-overwrite", sys.executable, "-m",
                       "aiter_gemm.kernel_check", "--op", "a16w16", "--libtype", "torch", "--shape", "5,48,64",
                       "--profile_calls", "1"]
    assert export == ["/opt/ncu", "--import", str(Path("d/x.ncu-rep")), "--csv", "--page", "raw"]
    assert (report, csv_path) == (Path("d/x.ncu-rep"), Path("d/x.csv"))


FAKE_NCU = """#!{python}
import subprocess, sys
argv = sys.argv[1:]
with open({log!r}, "a") as log:
    log.write(" ".join(argv) + "\\n")
if argv[0] == "--import":
    print('"ID","Kernel Name","gpu__time_duration.sum"')
    print('"0","fake_kernel","1.0"')
    sys.exit(0)
rc = subprocess.call(argv[argv.index("--force-overwrite") + 1:])
open(argv[argv.index("--export") + 1], "w").write("report")
sys.exit(rc)
"""


def test_ncu_reruns_itself_and_exports_csv(runtime, capsys, monkeypatch, tmp_path):
    """A stand-in ``ncu`` on PATH runs the profiled command (the profiler window runs on CPU without a profiler)
    and answers ``--import`` with CSV: verify runs first in this process, then the report and its CSV land in DIR."""
    bindir, log = tmp_path / "bin", tmp_path / "ncu.log"
    bindir.mkdir()
    fake = bindir / "ncu"
    fake.write_text(FAKE_NCU.format(python=sys.executable, log=str(log)))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    rc, out, err = run(capsys, "--op", "a16w16", "--libtype", "torch", "--shape", "5,48,64", "--verify",
                       "--ncu", str(tmp_path / "prof"))
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "VERIFY: PASS" and lines[1].startswith("NCU: ")
    reports = sorted(p.name for p in (tmp_path / "prof").iterdir())
    assert len(reports) == 2 and reports[0].endswith(".csv") and reports[1].endswith(".ncu-rep")
    assert "fake_kernel" in (tmp_path / "prof" / reports[0]).read_text()
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and "--profile_calls 1" in calls[0] and "--verify" not in calls[0]
    assert calls[1].startswith("--import ")


# ------------------------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("argv", [
    ["--op", "a16w16", "--libtype", "torch", "--shape", "16,4096,4096"],
    ["--op", "a16w16", "--libtype", "triton", "--shape", "16,4096,4096"],
    ["--op", "a16w16", "--libtype", "skinny", "--shape", "4,4096,4096", "--config", "3"],
    ["--op", "a8w8_blockscale", "--libtype", "triton", "--shape", "16,4096,7168"],
    ["--op", "a8w8_blockscale", "--libtype", "torch", "--shape", "256,4096,7168"],
])
def test_gpu_verify_and_bench_lines(runtime, capsys, argv):
    rc, out, err = run(capsys, *argv, "--verify", "--bench")
    lines = out.splitlines(keepends=True)
    assert rc == 0, err
    assert lines[0] == PASS and BENCH.fullmatch(lines[1]) is not None
    tflops, ms = (float(v) for v in BENCH.fullmatch(lines[1]).groups())
    M, N, K = (int(v) for v in argv[argv.index("--shape") + 1].split(","))
    assert ms > 0 and tflops == pytest.approx(2 * M * N * K / ms / 1e9, rel=0.01, abs=0.01)


@pytest.mark.gpu
def test_gpu_tilelang_verify_and_bench(runtime, capsys):
    from aiter_gemm.kernels import a8w8_blockscale_tilelang as tl

    if tl.unavailable_reason() is not None:
        pytest.skip(tl.unavailable_reason())
    rc, out, err = run(capsys, "--op", "a8w8_blockscale", "--libtype", "tilelang", "--shape", "16,4096,7168",
                       "--config", "splitK_swapAB-BM64_BN16_BK128_S4_T128_SK4", "--verify", "--bench")
    assert rc == 0, err
    assert out.splitlines(keepends=True)[0] == PASS and BENCH.fullmatch(out.splitlines(keepends=True)[1])


@pytest.mark.parametrize("shape", ["5,4_8,64", "5,\u0664\u0668,64", "5,48", "5,48,64,1", "+5,48,64"])
def test_shape_integers_are_ascii_digits(runtime, capsys, shape):
    """Issue 47: ``int()`` read ``4_8`` as 48 and Arabic-Indic digits as digits; --shape takes ASCII digits only."""
    rc, out, err = run(capsys, "--op", "a16w16", "--libtype", "torch", "--shape", shape, "--verify")
    assert (rc, out) == (2, "") and "--shape" in err and "three positive integers" in err, err
