"""DeepGEMM as the ``deepgemm`` backend of ``gemm_a8w8_blockscale``: its support rule, CSV rows and JSON entries,
unavailability without ``deep_gemm``, and (with :mod:`op_tests.fake_deep_gemm` injected as ``deep_gemm``) the
arguments the runner, the warm-up, the tuner and the benchmark provider pass. On an sm_90 GPU with DeepGEMM
installed, the real kernel against the float32 reference at odd M."""

from __future__ import annotations

import argparse
import json
import logging
import sys

import pytest
import torch

import aiter_gemm
import op_tests.fake_deep_gemm as fake
from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.fileio import read_csv_rows
from aiter_gemm.kernels import a8w8_blockscale_deepgemm as dg_impl
from aiter_gemm.kernels.a8w8_blockscale import gemm_a8w8_blockscale_ref
from aiter_gemm.ops.a8w8_blockscale import (
    DeepGemmFP8,
    JSONConfigError,
    gemm_a8w8_blockscale,
    get_GEMM_A8W8_BLOCKSCALE_config,
    parse_choice,
    read_json_configs,
    write_json_configs,
    x_scale_m_major,
)
from aiter_gemm.registry import get_backend
from benchmarks import providers
from gradlib import tune_a8w8_blockscale as tuner
from op_tests.test_blockscale_torch import HEADER, _inputs, _rel_err  # the same operands and header

NAME = dg_impl.NAME
BF16_TOL = 8e-3
FP8 = torch.float8_e4m3fn
BACKEND = get_backend("deepgemm", "aiter_gemm.backends.a8w8_blockscale")




def _problem(M: int, N: int = 256, K: int = 512, otype: torch.dtype = torch.bfloat16) -> GemmProblem:
    return GemmProblem(M, N, K, False, FP8, otype)


def _table(tmp_path, mp, rows: str):
    path = tmp_path / "bs.csv"
    path.write_text(HEADER + rows)
    mp.setenv("AITER_CONFIG_GEMM_A8W8_BLOCKSCALE", str(path))
    mp.setenv("AITER_GEMM_TRITON_CONFIGS", str(tmp_path))  # no JSON there
    aiter_gemm.reload_configs()
    return path


# ---- the support rule and availability ------------------------------------------------------------------------------
@pytest.mark.parametrize("M,N,K,dtype,why", [
    (1, 2112, 7168, torch.bfloat16, None),
    (4100, 576, 1536, torch.bfloat16, None),
    (3, 264, 128, torch.bfloat16, None),  # N a multiple of 8 only
    (0, 256, 512, torch.bfloat16, "empty problem"),
    (16, 256, 512, torch.float16, "writes torch.bfloat16 only"),
    (16, 256, 512, torch.float32, "writes torch.bfloat16 only"),
    (16, 260, 512, torch.bfloat16, "N=260 is not a multiple of 8"),
    (16, 256, 576, torch.bfloat16, "K=576 is not a multiple of 128"),
])
def test_shape_rule_names_what_is_unsupported(M, N, K, dtype, why):
    got = dg_impl.shape_error(M, N, K, dtype)
    assert (got is None) if why is None else (why in got), got
    shape_why = BACKEND.shape_why_not(_problem(max(M, 0), N, K, dtype), BACKEND.candidates(_problem(1), _cpu())[0],
                                      "sm_90")
    assert (shape_why is None) == (why is None)


def _cpu():
    return aiter_gemm.current_device_identity(False)


def test_shape_rule_takes_fp8_inputs_on_sm90_only():
    sol = parse_choice(NAME)
    from aiter_gemm.ops.a8w8_blockscale import solution_of

    s = solution_of(sol)
    assert BACKEND.shape_why_not(GemmProblem(16, 256, 512, False, torch.bfloat16), s, "sm_90").startswith("inputs")
    assert "sm_90a" in BACKEND.shape_why_not(_problem(16), s, "sm_100")
    assert BACKEND.shape_why_not(_problem(16), s, "sm_90") is None


def test_unavailable_without_deep_gemm_says_why(no_deep_gemm):
    why = dg_impl.unavailable_reason()
    assert why.startswith("deep_gemm is not installed") and "docs/deepgemm.md" in why
    assert BACKEND.unavailable_reason() == why
    assert BACKEND.why_not(_problem(16), BACKEND.candidates(_problem(16), _cpu())[0], _cpu()) == why
    assert BACKEND.prepare(_problem(16), BACKEND.candidates(_problem(16), _cpu())[0], _cpu()) is None


def test_unavailable_off_an_nvidia_gpu_and_without_the_api(monkeypatch):
    mod = fake.fake_module()
    monkeypatch.setitem(sys.modules, "deep_gemm", mod)
    assert "NVIDIA" in dg_impl.unavailable_reason(torch.device("cpu"))
    del mod.fp8_gemm_nt
    assert "has no fp8_gemm_nt" in dg_impl.unavailable_reason()


def test_never_the_default():
    from aiter_gemm.device import DeviceIdentity

    h200 = DeviceIdentity("sm_90", 132, "cuda", "NVIDIA H200")
    for M in (1, 64, 4096):
        assert BACKEND.default_for(_problem(M, 7168, 16384), h200) is None
        assert BACKEND.eager_default_for(_problem(M, 7168, 16384), h200) is None


# ---- rows and JSON entries -----------------------------------------------------------------------------------------
def test_kernel_name_parses_strictly():
    assert parse_choice(NAME) == DeepGemmFP8() and parse_choice(f" {NAME} ") == DeepGemmFP8()
    with pytest.raises(ValueError, match="rows name 'deepgemm_fp8_gemm_nt'"):
        DeepGemmFP8.from_name("deepgemm_fp8_gemm_nn")


def test_deepgemm_row_dispatches_to_deep_gemm(tmp_path, clean_runtime, fake_dg):
    cu = _cpu().cu_num
    _table(tmp_path, clean_runtime, f"cpu,{cu},16,256,512,deepgemm,0,0,5.0,{NAME},1,1,0\n")
    got = get_GEMM_A8W8_BLOCKSCALE_config(16, 256, 512, on_gpu=False)
    assert (got["libtype"], got["kernelName"], got["matched"]) == ("deepgemm", NAME, "exact")
    assert x_scale_m_major(16, 256, 512, torch.bfloat16, False)  # its quantizer writes M-major
    XQ, WQ, xs, ws = _inputs(16, 256, 512)
    out = gemm_a8w8_blockscale(XQ, WQ, xs, ws)
    assert len(fake.CALLS) == 1 and _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws)) < BF16_TOL
    # fp16 output is not DeepGEMM's: the row is a miss there, the default serves it
    got16 = get_GEMM_A8W8_BLOCKSCALE_config(16, 256, 512, on_gpu=False, dtype=torch.float16)
    assert got16["matched"] == "default"


def test_deepgemm_row_without_deep_gemm_is_a_warned_miss(tmp_path, clean_runtime, caplog):
    clean_runtime.setitem(sys.modules, "deep_gemm", None)
    cu = _cpu().cu_num
    _table(tmp_path, clean_runtime, f"cpu,{cu},16,256,512,deepgemm,0,0,5.0,{NAME},1,1,0\n")
    got = get_GEMM_A8W8_BLOCKSCALE_config(16, 256, 512, on_gpu=False)
    assert (got["libtype"], got["matched"]) == ("triton", "default")
    assert "deep_gemm is not installed" in caplog.text


@pytest.mark.parametrize("row,column", [
    ("deepgemm,0,0,5.0,scaled_mm_blockwise,1,1,0", "kernelName"),
    (f"torch,0,0,5.0,{NAME},1,1,0", "kernelName"),
    (f"deepgemm,0,4,5.0,{NAME},1,1,0", "splitK"),
    (f"deep_gemm,0,0,5.0,{NAME},1,1,0", "libtype"),
])
def test_malformed_deepgemm_rows_name_file_line_and_column(tmp_path, clean_runtime, caplog, row, column):
    cu = _cpu().cu_num
    path = _table(tmp_path, clean_runtime, f"cpu,{cu},16,256,512,{row}\n")
    with caplog.at_level(logging.WARNING):
        assert get_GEMM_A8W8_BLOCKSCALE_config(16, 256, 512, on_gpu=False)["matched"] == "default"
    warned = [r.getMessage() for r in caplog.records if f"{path}:2, column '{column}'" in r.getMessage()]
    assert len(warned) == 1 and "row ignored" in warned[0], caplog.text


def test_json_holds_deepgemm_entries_and_rejects_malformed_ones(tmp_path):
    path = tmp_path / "cpu-GEMM-A8W8_BLOCKSCALE-N=256-K=512.json"
    write_json_configs(path, {"any": DeepGemmFP8()})
    assert json.loads(path.read_text())["any"] == {"libtype": "deepgemm", "kernelName": NAME}
    assert [(key, cfg) for _, key, cfg in read_json_configs(path)] == [("any", DeepGemmFP8())]
    path.write_text(json.dumps({"any": {"libtype": "deepgemm", "kernelName": NAME, "BLOCK_M": 64}}))
    with pytest.raises(JSONConfigError, match="'any'.*exactly"):
        read_json_configs(path)


# ---- the runner, with the fake deep_gemm ---------------------------------------------------------------------------
@pytest.mark.parametrize("M", [1, 3, 4, 17])
@pytest.mark.parametrize("layout", ["row_major", "m_major"])
def test_runner_passes_the_operands_deep_gemm_takes(fake_dg, M, layout):
    """Scales are handed over as given (DeepGEMM uses M-major ones as is, transforms others itself): no copy here;
    the output is the shape's, bf16; a non-contiguous XQ is made K-major."""
    N, K = 264, 384
    XQ, WQ, xs, ws = _inputs(M, N, K)
    if layout == "m_major":
        xs = xs.t().contiguous().t()
    run = BACKEND.prepare(_problem(M, N, K), BACKEND.candidates(_problem(M, N, K), _cpu())[0], _cpu())
    out = run(XQ, WQ, xs, ws, torch.bfloat16)
    (call,) = fake.CALLS
    assert (call["M"], call["N"], call["K"]) == (M, N, K) and call["sfa_ptr"] == xs.data_ptr()
    assert call["sfa_stride"] == xs.stride() and call["a_ptr"] == XQ.data_ptr() and call["d_ptr"] == out.data_ptr()
    assert out.dtype == torch.bfloat16 and _rel_err(out, dg_impl.gemm_a8w8_blockscale_deepgemm_ref(XQ, WQ, xs, ws)) \
        < BF16_TOL
    wide = torch.zeros(M, 2 * K, dtype=FP8)
    wide[:, :K] = XQ
    out2 = run(wide[:, :K], WQ, xs, ws, torch.bfloat16)
    assert (fake.CALLS[-1]["a_ptr"] != wide.data_ptr()) == (M > 1) and torch.equal(out2, out)  # one row: a view


def test_launcher_refuses_shapes_deep_gemm_does_not_take(fake_dg):
    with pytest.raises(ValueError, match="K=576 is not a multiple of 128"):
        dg_impl.launcher(16, 256, 576)
    with pytest.raises(ValueError, match="bfloat16 only"):
        dg_impl.gemm_a8w8_blockscale_deepgemm(*_inputs(4, 256, 512), torch.float16)


def test_warmup_calls_deep_gemm_once_per_shape(tmp_path, clean_runtime, fake_dg):
    """aiter_gemm.warmup runs each deepgemm row's shape once (DeepGEMM's JIT compiles on a shape's first call),
    with row-major scales so its scale-transposing kernel is built too."""
    cu = _cpu().cu_num
    _table(tmp_path, clean_runtime, "".join(f"cpu,{cu},{M},256,512,deepgemm,0,0,5.0,{NAME},1,1,0\n"
                                            for M in (16, 64)))
    (summary,) = aiter_gemm.warmup(("gemm_a8w8_blockscale",), on_gpu=False)
    assert summary["failed"] == {}
    assert sorted((c["M"], c["N"], c["K"]) for c in fake.CALLS) == [(16, 256, 512), (64, 256, 512)]
    assert all(c["sfa_stride"] == (4, 1) for c in fake.CALLS)


def test_precompile_without_deep_gemm_reports_every_job(no_deep_gemm):
    sol = parse_choice(NAME)
    from aiter_gemm.ops.a8w8_blockscale import solution_of

    failed = BACKEND.precompile([(_problem(16), solution_of(sol))])
    assert list(failed) == [NAME] and "deep_gemm is not installed" in failed[NAME]


# ---- the tuner -------------------------------------------------------------------------------------------------------
def test_tuner_lists_deepgemm_only_where_it_runs(monkeypatch):
    monkeypatch.setitem(sys.modules, "deep_gemm", None)
    monkeypatch.setattr(tuner.tilelang_impl, "unavailable_reason", lambda device=None: None)
    assert tuner.default_libtypes(True) == ("triton", "torch", "tilelang")
    fake.install(monkeypatch)
    assert tuner.default_libtypes(True) == ("triton", "torch", "tilelang", "deepgemm")
    assert tuner.default_libtypes(False) == ("triton",)
    args = argparse.Namespace(candidates=None, variants=None, quick=True, libtype=["deepgemm"])
    assert tuner.candidate_names(16, 256, 512, args) == [NAME]
    assert tuner.candidate_names(16, 256, 576, args) == []  # K not a multiple of 128
    assert tuner.candidate_names(16, 256, 512, args, torch.float16) == []


def test_libtype_deepgemm_where_it_cannot_run_is_a_usage_error(tmp_path, capsys, cpu_tuner_workers):
    assert tuner.main(["--nk", "256,512", "--libtype", "triton,deepgemm", "-o", str(tmp_path / "t.csv")]) == 2
    assert "--libtype deepgemm: " in capsys.readouterr().err


def test_tuner_writes_deepgemm_winners_the_op_replays(tmp_path, clean_runtime, cpu_tuner_workers, virtual_clock):
    """On the virtual clock the fake (one tick) beats a 50-ms launcher: rows and JSON buckets say libtype deepgemm,
    read back by the one CSV reader, and the op routes there. The plugin also installs the fake F.scaled_mm in this
    process: torch's module state is restored after the test."""
    from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl

    clean_runtime.setattr(torch.nn.functional, "scaled_mm", torch.nn.functional.scaled_mm)
    clean_runtime.setattr(torch_impl, "unavailable_reason", torch_impl.unavailable_reason)
    fake.install(clean_runtime)
    tuned, jdir = tmp_path / "tuned.csv", tmp_path / "json"
    assert tuner.main(["--nk", "256,512", "--m", "1,6", "--candidates", f"fake_slow_blockscale,{NAME}",
                       "-o", str(tuned), "--json_dir", str(jdir), "--plugin", "op_tests.fake_deep_gemm_plugin"]) == 0
    rows = read_csv_rows(tuned)[1]
    assert [(r["M"], r["libtype"], r["kernelName"], r["splitK"]) for r in rows] == \
        [("1", "deepgemm", NAME, "0"), ("6", "deepgemm", NAME, "0")]
    (jpath,) = jdir.iterdir()
    assert {json.dumps(v) for v in json.loads(jpath.read_text()).values()} == {json.dumps(DeepGemmFP8().to_json())}
    clean_runtime.setenv("AITER_CONFIG_GEMM_A8W8_BLOCKSCALE", str(tuned))
    clean_runtime.setenv("AITER_GEMM_TRITON_CONFIGS", str(jdir))
    aiter_gemm.reload_configs()
    assert get_GEMM_A8W8_BLOCKSCALE_config(6, 256, 512, on_gpu=False)["libtype"] == "deepgemm"
    got = get_GEMM_A8W8_BLOCKSCALE_config(5, 256, 512, on_gpu=False)  # no row at 5, 8 (gl0/gl1): the JSON
    assert (got["libtype"], got["matched"]) == ("deepgemm", "json")
    fake.CALLS.clear()
    XQ, WQ, xs, ws = _inputs(5, 256, 512)
    out = gemm_a8w8_blockscale(XQ, WQ, xs, ws)
    assert fake.CALLS and _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws)) < BF16_TOL


# ---- the benchmark provider -----------------------------------------------------------------------------------------
def _ctx(M=16, N=256, K=512):
    from aiter_gemm.device import DeviceIdentity

    p = _problem(M, N, K)
    return providers.Context(p, providers.BLOCKSCALE, [_inputs(M, N, K)], DeviceIdentity("sm_90", 132, "cuda"),
                             torch.device("cpu"), "graph")


def test_provider_says_why_it_is_unavailable(no_deep_gemm):
    provider, arg = providers.resolve(providers.BLOCKSCALE, "deepgemm")
    with pytest.raises(providers.Unavailable, match="deep_gemm is not installed"):
        provider.build(_ctx(), arg)
    with pytest.raises(ValueError, match="takes no argument"):
        providers.resolve(providers.BLOCKSCALE, f"deepgemm:{NAME}")


def test_provider_calls_deep_gemm_per_call_with_the_sets_scales(fake_dg):
    provider, arg = providers.resolve(providers.BLOCKSCALE, "deepgemm")
    ctx = _ctx()
    call = provider.build(ctx, arg)
    out = call(0)
    XQ, WQ, xs, ws = ctx.sets[0]
    assert fake.CALLS[-1]["sfa_ptr"] == xs.data_ptr()
    assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws)) < BF16_TOL
    with pytest.raises(providers.Unavailable, match="K=576"):
        provider.build(_ctx(16, 256, 576), arg)


# ---- GPU -----------------------------------------------------------------------------------------------------------
def _gpu_skip():
    why = dg_impl.unavailable_reason(torch.device("cuda")) if torch.cuda.is_available() else "no CUDA GPU"
    if why:
        pytest.skip(why)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 3, 17, 97, 4100])
@pytest.mark.parametrize("N,K", [(2112, 7168), (264, 1536)])
@pytest.mark.parametrize("layout", ["row_major", "m_major"])
def test_gpu_deep_gemm_matches_the_reference_at_odd_shapes(M, N, K, layout):
    _gpu_skip()
    XQ, WQ, xs, ws = _inputs(M, N, K, "cuda")
    if layout == "m_major":
        xs = xs.t().contiguous().t()
    ref = gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws)
    out = dg_impl.launcher(M, N, K)(XQ, WQ, xs, ws, torch.bfloat16)
    assert _rel_err(out, ref) < BF16_TOL
    assert torch.equal(dg_impl.gemm_a8w8_blockscale_deepgemm(XQ, WQ, xs, ws), out)
    assert torch.equal(gemm_a8w8_blockscale(XQ, WQ, xs, ws, config=NAME), out)  # the op with the config


@pytest.mark.gpu
def test_gpu_warm_then_graph_capture():
    """After warm, a captured call replays to the same result (no JIT inside the capture)."""
    _gpu_skip()
    M, N, K = 97, 2112, 7168
    assert dg_impl.warm([(M, N, K, torch.bfloat16)]) == {}
    XQ, WQ, xs, ws = _inputs(M, N, K, "cuda")
    run = dg_impl.launcher(M, N, K)
    want = run(XQ, WQ, xs, ws, torch.bfloat16)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = run(XQ, WQ, xs, ws, torch.bfloat16)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(got, want)


# ---- the device script -----------------------------------------------------------------------------------------------
def test_device_script_commands_parse_for_an_h200(tmp_path):
    """``DRY_RUN=1 fp8_deepgemm.sh`` prints its five steps, each a command its program accepts on an H200 (the
    harness's providers and shape sets included); the warm-up program compiles."""
    import re
    import shlex

    from op_tests.test_record_script import DEVICE, STEP_LINE, bash, check_command

    res = bash(DEVICE / "fp8_deepgemm.sh", {"DRY_RUN": "1", "OUT": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    lines = [m.groups() for m in map(STEP_LINE.match, res.stdout.splitlines()) if m]
    assert [name for name, _, _ in lines] == ["tests", "dg_warm", "bench", "tune", "bench_tuned"]
    assert sum(int(limit) for _, limit, _ in lines) <= 560  # one device call (600 s at most)
    (tmp_path / "tune_shapes.csv").write_text("M,N,K\n4096,2112,7168\n")  # written by the script before "tune"
    (tmp_path / "dg_tuned.csv").write_text(HEADER)  # written by "tune"
    progs = []
    for name, _, cmd in lines:
        if name == "tests":
            assert shlex.split(cmd)[-1] == "op_tests/test_blockscale_deepgemm.py"
        elif name == "dg_warm":  # printed as bash's $'...': its program is read from the script
            text = (DEVICE / "fp8_deepgemm.sh").read_text()
            program = re.search(r'step dg_warm \d+ python -c "(.*?)" "\$SETS"', text, re.S).group(1)
            compile(program, "dg_warm", "exec")
        else:
            progs.append(check_command(shlex.split(cmd), tmp_path))
    assert progs == ["benchmarks.run", "gradlib.tune_a8w8_blockscale", "benchmarks.run"]
