"""Per-tensor fp8 (A8W8) GEMMs through the bf16 tuner and table: a scaled fp8 call captured by the runtime is tuned
by ``gemm-tuner`` into a ``scaleAB=True`` row of the bf16 CSV, which ``gemm_a16w16(xq, wq, otype=bf16, scale_a=...,
scale_b=...)`` then replays (the row's backend runs, not the default); ``--indtype fp8`` turns a bf16 shape list
into fp8 rows. AITER's ``AITER_CONFIG_GEMM_A8W8`` table (CK kernels) is parsed on request but never dispatched."""

from __future__ import annotations

import os

import pytest
import torch

import op_tests.gradlib_fakes  # noqa: F401  (registers fakeslow here; workers import it as a plugin)
from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.fileio import read_csv_rows
from gradlib import gemm_tuner

FP8 = torch.float8_e4m3fn
PLUGIN = "op_tests.gradlib_fakes"
# fp8 inputs are exact in the float32 reference; the bf16 output rounding (<= 0.4% relative) dominates: 1e-2.
RTOL = ATOL = 1e-2


# CPU tuner workers (conftest.cpu_tuner_workers) for every test here but GPU-marked ones.
pytestmark = pytest.mark.usefixtures("cpu_tuner_workers")


def _operands(M: int, N: int, K: int, device: str = "cpu"):
    """fp8 x (M, K) and w (N, K) with unit-scale products, per-tensor scales 0.5 and 2, bf16 bias."""
    g = torch.Generator().manual_seed(M * 7 + N)
    xq = torch.randn(M, K, generator=g).to(FP8).to(device)
    wq = (torch.randn(N, K, generator=g) * K ** -0.5).to(FP8).to(device)
    sa = torch.tensor(0.5, device=device)
    sb = torch.tensor(2.0, device=device)
    bias = torch.randn(N, generator=g).to(torch.bfloat16).to(device)
    return xq, wq, sa, sb, bias


def _ref(xq, wq, sa, sb, bias=None) -> torch.Tensor:
    out = (xq.float() @ wq.float().t()) * (sa * sb)
    return out if bias is None else out + bias.float()


def _decision(M, N, K, bias=False, scale_ab=True):
    import aiter_gemm

    p = GemmProblem(M, N, K, bias, FP8, torch.bfloat16, scale_ab)
    return aiter_gemm.get_dispatcher().decide(p, False).as_config()  # CPU tensors, as tuned


@pytest.mark.parametrize("libtype", ["torch", "fakeslow"])
def test_captured_fp8_call_is_tuned_then_replayed_from_the_bf16_csv(tmp_path, clean_runtime, libtype):
    import aiter_gemm

    M, N, K = 5, 64, 96
    untuned, tuned = tmp_path / "untuned.csv", tmp_path / "tuned.csv"
    clean_runtime.setenv("AITER_TUNE_GEMM", "1")
    clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(untuned))
    aiter_gemm.reload_configs()
    xq, wq, sa, sb, _ = _operands(M, N, K)
    aiter_gemm.gemm_a16w16(xq, wq, otype=torch.bfloat16, scale_a=sa, scale_b=sb)  # a miss: captured
    aiter_gemm.get_dispatcher().flush_capture()
    (shape,) = read_csv_rows(untuned)[1]
    assert (shape["dtype"], shape["outdtype"], shape["scaleAB"]) == ("torch.float8_e4m3fn", "torch.bfloat16", "True")

    assert gemm_tuner.main(["-i", str(untuned), "-o", str(tuned), "--libtype", libtype, "--plugin", PLUGIN,
                            "--confirm_rounds", "0"]) == 0
    (row,) = read_csv_rows(tuned)[1]
    assert (row["M"], row["N"], row["K"], row["dtype"], row["outdtype"], row["scaleAB"], row["libtype"]) == \
        (str(M), str(N), str(K), "torch.float8_e4m3fn", "torch.bfloat16", "True", libtype)
    assert float(row["err_ratio"]) <= 0.05 and float(row["us"]) > 0

    clean_runtime.delenv("AITER_TUNE_GEMM")
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(tuned))
    aiter_gemm.reload_configs()
    cfg = _decision(M, N, K)
    assert (cfg["matched"], cfg["libtype"], cfg["kernelName"]) == ("exact", libtype, row["kernelName"])
    assert cfg["source"] == str(tuned)
    out = aiter_gemm.gemm_a16w16(xq, wq, otype=torch.bfloat16, scale_a=sa, scale_b=sb)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), _ref(xq, wq, sa, sb), rtol=RTOL, atol=ATOL)
    # scaleAB is part of the key: the same shape without scales is another GEMM, not tuned here.
    assert _decision(M, N, K, scale_ab=False)["matched"] == "default"


def test_indtype_fp8_retypes_a_bf16_shape_list_with_and_without_bias(tmp_path, clean_runtime):
    import aiter_gemm

    untuned, tuned = tmp_path / "untuned.csv", tmp_path / "tuned.csv"
    untuned.write_text("M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle\n"
                       "3,48,64,False,torch.bfloat16,torch.bfloat16,True,False\n")
    assert gemm_tuner.main(["-i", str(untuned), "-o", str(tuned), "--indtype", "fp8", "--outdtype", "bf16",
                            "--all_bias", "--libtype", "fakeslow", "--plugin", PLUGIN, "--confirm_rounds", "0"]) == 0
    rows = read_csv_rows(tuned)[1]
    assert sorted(r["bias"] for r in rows) == ["False", "True"]
    assert {(r["dtype"], r["outdtype"], r["scaleAB"], r["libtype"]) for r in rows} == \
        {("torch.float8_e4m3fn", "torch.bfloat16", "True", "fakeslow")}
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(tuned))
    aiter_gemm.reload_configs()
    xq, wq, sa, sb, bias = _operands(3, 48, 64)
    for b in (None, bias):
        assert (_decision(3, 48, 64, bias=b is not None)["matched"], _decision(3, 48, 64, b is not None)["libtype"]) \
            == ("exact", "fakeslow")
        out = aiter_gemm.gemm_a16w16(xq, wq, b, otype=torch.bfloat16, scale_a=sa, scale_b=sb)
        torch.testing.assert_close(out.float(), _ref(xq, wq, sa, sb, b), rtol=RTOL, atol=ATOL)


def test_aiter_a8w8_table_is_parsed_but_not_dispatched(tmp_path, clean_runtime):
    """AITER's a8w8 rows (key M,N,K,q_dtype_w) name CK kernels (``a8w8_rowwise_...``) that do not exist here:
    the table is loaded and validated when asked for, and gemm_a16w16 never consults it."""
    import aiter_gemm
    from aiter_gemm.ops.a16w16 import get_config_table

    a8w8 = tmp_path / "a8w8_tuned_gemm.csv"
    a8w8.write_text("gfx,cu_num,M,N,K,q_dtype_w,kernelId,splitK,us,kernelName,tflops,bw,errRatio\n"
                    f"cpu,{os.cpu_count()},5,64,96,torch.float8_e4m3fn,34,0,20.5,"
                    "a8w8_rowwise_256x16x64x512_16x16_1x1_32x8x1_32x8x1_1x16x1x16_4x4x1_1x1_intrawave_v3,1.0,510.5,0.0\n")
    clean_runtime.setenv("AITER_CONFIG_GEMM_A8W8", str(a8w8))
    aiter_gemm.reload_configs()
    table = get_config_table("GEMM_A8W8")
    (row,) = list(table)
    assert row.key == (5, 64, 96, FP8) and row.values["kernelId"] == 34
    assert _decision(5, 64, 96)["matched"] == "default"


# ---- GPU ------------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_fp8_tuning_with_scaled_mm_and_cublaslt(tmp_path, clean_runtime):
    import aiter_gemm
    from aiter_gemm.registry import get_backend

    untuned, tuned = tmp_path / "untuned.csv", tmp_path / "tuned.csv"
    untuned.write_text("M,N,K,bias,dtype,outdtype,scaleAB\n16,1024,1024,False,fp8,bf16,True\n"
                       "256,2048,1024,False,fp8,bf16,True\n")
    libs = ",".join(n for n in ("torch", "cublaslt") if get_backend(n).is_available())
    prof = tmp_path / "profile.csv"
    assert gemm_tuner.main(["-i", str(untuned), "-o", str(tuned), "--libtype", libs, "--mp", "1",
                            "--profile_file", str(prof)]) == 0
    rows = read_csv_rows(tuned)[1]
    assert len(rows) == 2 and all(r["scaleAB"] == "True" and r["dtype"] == "torch.float8_e4m3fn" for r in rows)
    timed = {r["libtype"] for r in read_csv_rows(prof)[1] if r["status"].startswith("ok")}
    assert "torch" in timed and ("cublaslt" in timed or "cublaslt" not in libs)
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(tuned))
    aiter_gemm.reload_configs()
    for r in rows:
        M, N, K = int(r["M"]), int(r["N"]), int(r["K"])
        cfg = aiter_gemm.get_GEMM_A16W16_config(M, N, K, False, FP8, torch.bfloat16, scaleAB=True)
        assert (cfg["matched"], cfg["libtype"], cfg["solidx"]) == ("exact", r["libtype"], int(r["solidx"]))
        xq, wq, sa, sb, _ = _operands(M, N, K, "cuda")
        out = aiter_gemm.gemm_a16w16(xq, wq, otype=torch.bfloat16, scale_a=sa, scale_b=sb)
        torch.testing.assert_close(out.float(), _ref(xq, wq, sa, sb), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("source", ["model", "mnk_list", "explicit_columns"])
def test_indtype_fp8_keys_shapes_as_scaled_calls(tmp_path, source):
    """--indtype fp8 tunes the key the runtime uses for gemm_a16w16(xq, wq, otype=bf16, scale_a=, scale_b=):
    scaleAB=True with a bf16 output, unless the shape list's own columns say otherwise."""
    from types import SimpleNamespace

    args = SimpleNamespace(indtype="fp8", outdtype=None, model_dir=None, input_file=None,
                           tuned_file=str(tmp_path / "t"), tp=1, nsets=[1], batch_size=None, all_bias=False)
    if source == "model":
        args.model_dir = "llama3_8b"
    else:
        args.input_file = str(tmp_path / "u.csv")
        text = ("M,N,K\n3,48,64\n" if source == "mnk_list" else
                "M,N,K,outdtype,scaleAB\n3,48,64,torch.float32,False\n")
        open(args.input_file, "w").write(text)
    problems = gemm_tuner.load_problems(args)
    assert problems and all(p.dtype == torch.float8_e4m3fn for p in problems)
    if source == "explicit_columns":
        assert [(p.scaleAB, p.otype) for p in problems] == [(False, torch.float32)]
    else:
        assert all(p.scaleAB and p.otype == torch.bfloat16 for p in problems)
