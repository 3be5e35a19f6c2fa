"""torch's block-scaled matmul as the second implementation of ``gemm_a8w8_blockscale``: the layouts the launcher
hands ``F.scaled_mm`` (checked on CPU by :mod:`op_tests.fake_scaled_mm`), CSV rows and JSON entries with
``libtype=torch``, the dispatch falling back where torch's cannot run, and the tuner timing it as a candidate. On a
GPU the real ``F.scaled_mm`` runs against the float32 reference."""

from __future__ import annotations

import argparse
import json
import logging

import pytest
import torch

import aiter_gemm
import op_tests.fake_scaled_mm as fake
from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.fileio import read_csv_rows
from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl
from aiter_gemm.kernels.a8w8_blockscale import BlockscaleConfig, gemm_a8w8_blockscale_ref, quantize_blockscale
from aiter_gemm.ops.a8w8_blockscale import (
    JSONConfigError,
    TorchBlockwise,
    gemm_a8w8_blockscale,
    get_GEMM_A8W8_BLOCKSCALE_config,
    read_json_configs,
    write_json_configs,
)
from gradlib.tune_a8w8_blockscale import candidate_names, main

# Same bound as test_a8w8_blockscale.TOLERANCE[bf16]: bf16 output rounding (2^-9 per element) with margin.
BF16_TOL = 8e-3
SWAP16 = "swapAB-BM16_BN64_BK128_GM1_SK1_W4_S4_TMA"
HEADER = "gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName,tflops,bw,errRatio\n"


def _inputs(M: int, N: int, K: int, device: str = "cpu"):
    gen = torch.Generator().manual_seed(M * 7 + N + K)
    x = torch.randn(M, K, generator=gen)
    w = torch.randn(N, K, generator=gen) / K ** 0.5
    return tuple(t.to(device) for t in quantize_blockscale(x, w))


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.fixture
def fake_torch(monkeypatch):
    """The fake F.scaled_mm and availability, restored after the test."""
    monkeypatch.setattr(torch.nn.functional, "scaled_mm", torch.nn.functional.scaled_mm)
    monkeypatch.setattr(torch_impl, "unavailable_reason", torch_impl.unavailable_reason)
    fake.install()
    fake.CALLS.clear()
    return fake


# ---- the launcher ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("M", [1, 3, 4, 17, 97, 128])
@pytest.mark.parametrize("N", [144, 256])  # 144: a partial last weight block
def test_launcher_prepares_the_layouts_cublaslt_takes(fake_torch, M, N):
    XQ, WQ, xs, ws = _inputs(M, N, 512)
    out = torch_impl.gemm_a8w8_blockscale_torch(XQ, WQ, xs, ws)
    assert out.shape == (M, N) and out.dtype == torch.bfloat16 and out.is_contiguous()
    assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < BF16_TOL
    (call,) = fake.CALLS
    assert call[:3] == (M + (-M % 4), N, 512)


def test_m_major_scales_are_used_without_a_copy(fake_torch):
    XQ, WQ, xs, ws = _inputs(8, 256, 1024)
    xs_mmajor = xs.t().contiguous().t()
    torch_impl.gemm_a8w8_blockscale_torch(XQ, WQ, xs_mmajor, ws)
    torch_impl.gemm_a8w8_blockscale_torch(XQ, WQ, xs, ws)  # row-major: copied into an M-major buffer
    assert fake.CALLS[0][3] == xs_mmajor.data_ptr() and fake.CALLS[1][3] != xs.data_ptr()


@pytest.mark.parametrize("M", [3, 8])
def test_bound_runner_calls_the_op_as_f_scaled_mm_does(monkeypatch, M):
    """The shape-bound runner calls torch's op behind F.scaled_mm directly, with the arguments torch's own wrapper
    would pass (checked against the installed torch's wrapper: a recorder stands in for the op)."""
    recorded = []

    def op(*args):
        recorded.append(args)
        return torch.zeros((args[0].shape[0], args[1].shape[1]), dtype=args[9])

    monkeypatch.setattr(torch, "_scaled_mm_v2", op)
    if torch_impl.direct_op() is None:
        pytest.skip(f"torch {torch.__version__}: F.scaled_mm is not the wrapper the runner knows; it calls F.scaled_mm")
    XQ, WQ, xs, ws = _inputs(M, 256, 1024)  # 8 K blocks: no operand but A and its scales has M + pad rows
    torch_impl.gemm_a8w8_blockscale_torch(XQ, WQ, xs, ws)  # through torch's F.scaled_mm
    out = torch_impl.launcher(M, 256, 1024)(XQ, WQ, xs, ws, torch.bfloat16)
    assert out.shape == (M, 256)
    (wrapped, direct) = recorded

    def flat(args):
        for arg in args:
            yield from (flat(arg) if isinstance(arg, list) else [arg])

    for w, d in zip(flat(wrapped), flat(direct), strict=True):
        if isinstance(w, torch.Tensor):
            assert (w.shape, w.stride(), w.dtype) == (d.shape, d.stride(), d.dtype)
            rows = M if w.shape[0] == M + -M % 4 else w.shape[0]  # pad rows are left uninitialised
            assert torch.equal(w[:rows].float(), d[:rows].float())
        else:
            assert w == d and type(w) is type(d)


def test_runner_calls_a_replaced_f_scaled_mm(fake_torch):
    assert torch_impl.direct_op() is None  # a test's (or a user's) F.scaled_mm is respected
    XQ, WQ, xs, ws = _inputs(5, 256, 512)
    out = torch_impl.launcher(5, 256, 512)(XQ, WQ, xs, ws, torch.bfloat16)
    assert len(fake.CALLS) == 1 and _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < BF16_TOL
    with pytest.raises(ValueError, match="multiple of 512"):
        torch_impl.launcher(5, 256, 384)


@pytest.mark.parametrize("K", [128, 384, 640, 1024])
def test_padded_scales_take_any_whole_block_k(fake_torch, K):
    """Outside the dispatcher (the HF loop's torch arm, e.g. Qwen3-30B-A3B's experts: K 768), w_scale's K blocks
    padded to a multiple of 4 let torch's matmul run K that is not a multiple of 512, in the layout torch's own check
    of F.scaled_mm asks for (the fake enforces it); the op's own rule is unchanged."""
    XQ, WQ, xs, ws = _inputs(5, 256, K)
    padded = torch_impl.pad_scale_blocks(ws)
    assert padded.shape == (2, -(-K // 512) * 4) and torch.equal(padded[:, :K // 128], ws)
    assert (padded is ws) == (K % 512 == 0)
    out = torch_impl.launcher(5, 256, K, padded_scales=True)(XQ, WQ, xs, padded, torch.bfloat16)
    assert fake.CALLS[-1][:3] == (8, 256, K)
    assert torch.equal(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.bfloat16))
    assert (torch_impl.shape_error(5, 256, K) is None) == (K % 512 == 0)
    assert "multiple of 128" in torch_impl.shape_error(5, 256, K + 64, padded_scales=True)


@pytest.mark.parametrize("shape,dtype,why", [
    ((16, 256, 384), torch.bfloat16, "multiple of 512"),
    ((16, 200, 512), torch.bfloat16, "multiple of 16"),
    ((16, 256, 512), torch.float16, "only torch.bfloat16"),
])
def test_shape_rule_names_what_is_unsupported(shape, dtype, why):
    assert why in torch_impl.shape_error(*shape, dtype)
    assert torch_impl.shape_error(16, 256, 512) is None


def test_unavailable_on_cpu_says_why():
    assert "NVIDIA" in torch_impl.unavailable_reason(torch.device("cpu")) or \
        "no F.scaled_mm" in torch_impl.unavailable_reason(torch.device("cpu"))


# ---- CSV rows and JSON entries -------------------------------------------------------------------------------------
def _table(tmp_path, clean_runtime, rows: str):
    path = tmp_path / "bs.csv"
    path.write_text(HEADER + rows)
    clean_runtime.setenv("AITER_CONFIG_GEMM_A8W8_BLOCKSCALE", str(path))
    clean_runtime.setenv("AITER_GEMM_TRITON_CONFIGS", str(tmp_path))  # no JSON there
    aiter_gemm.reload_configs()
    return path


def test_torch_row_dispatches_to_scaled_mm(tmp_path, clean_runtime, fake_torch):
    cu = aiter_gemm.current_device_identity(False).cu_num
    _table(tmp_path, clean_runtime, f"cpu,{cu},16,256,512,torch,0,0,5.0,scaled_mm_blockwise,1,1,0\n")
    got = get_GEMM_A8W8_BLOCKSCALE_config(16, 256, 512, on_gpu=False)
    assert (got["libtype"], got["kernelName"], got["matched"]) == ("torch", "scaled_mm_blockwise", "exact")
    XQ, WQ, xs, ws = _inputs(16, 256, 512)
    out = gemm_a8w8_blockscale(XQ, WQ, xs, ws)
    assert len(fake.CALLS) == 1 and _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws)) < BF16_TOL
    # fp16 output is not torch's: the same shape falls through to our kernel's default
    got16 = get_GEMM_A8W8_BLOCKSCALE_config(16, 256, 512, on_gpu=False, dtype=torch.float16)
    assert (got16["libtype"], got16["matched"]) == ("triton", "default")


def test_torch_row_where_torch_cannot_run_is_a_warned_miss(tmp_path, clean_runtime, caplog):
    cu = aiter_gemm.current_device_identity(False).cu_num
    _table(tmp_path, clean_runtime, f"cpu,{cu},16,256,512,torch,0,0,5.0,scaled_mm_blockwise,1,1,0\n")
    got = get_GEMM_A8W8_BLOCKSCALE_config(16, 256, 512, on_gpu=False)  # CPU torch has no block-scaled matmul
    assert (got["libtype"], got["matched"]) == ("triton", "default")
    assert "scaled_mm_blockwise cannot run" in caplog.text


@pytest.mark.parametrize("row,column", [
    ("torch,0,0,5.0,base-BM64_BN64_BK128_GM1_SK1_W4_S4_TMA,1,1,0", "kernelName"),
    ("cuda,0,0,5.0,scaled_mm_blockwise,1,1,0", "libtype"),
])
def test_malformed_torch_rows_name_line_and_column(tmp_path, clean_runtime, caplog, row, column):
    """A malformed row is a miss warned once naming file, line and column (issue 47: every call raised)."""
    cu = aiter_gemm.current_device_identity(False).cu_num
    path = _table(tmp_path, clean_runtime, f"cpu,{cu},16,256,512,{row}\n")
    with caplog.at_level(logging.WARNING):
        for M in (16, 13):  # exact, then padded to the same row
            assert get_GEMM_A8W8_BLOCKSCALE_config(M, 256, 512, on_gpu=False)["matched"] == "default"
    warned = [r.getMessage() for r in caplog.records if f"{path}:2, column '{column}'" in r.getMessage()]
    assert len(warned) == 1 and "row ignored" in warned[0], caplog.text


def test_json_holds_torch_entries_and_rejects_malformed_ones(tmp_path):
    path = tmp_path / "cpu-GEMM-A8W8_BLOCKSCALE-N=256-K=512.json"
    base = BlockscaleConfig.from_name(SWAP16)
    write_json_configs(path, {"M_LEQ_16": base, "any": TorchBlockwise()})
    assert json.loads(path.read_text())["any"] == {"libtype": "torch", "kernelName": "scaled_mm_blockwise"}
    assert [(key, cfg) for _, key, cfg in read_json_configs(path)] == [("M_LEQ_16", base), ("any", TorchBlockwise())]
    path.write_text(json.dumps({"any": {"libtype": "torch", "kernelName": "cublas"}}))
    with pytest.raises(JSONConfigError, match="'any'.*exactly"):
        read_json_configs(path)


# ---- the tuner ---------------------------------------------------------------------------------------------------
def test_candidates_include_torch_only_where_it_applies():
    args = argparse.Namespace(candidates=None, variants=["swapAB"], quick=True, libtype=["triton", "torch"])
    assert candidate_names(16, 256, 512, args)[-1] == "scaled_mm_blockwise"
    assert "scaled_mm_blockwise" not in candidate_names(16, 256, 384, args)  # K not a multiple of 512
    assert "scaled_mm_blockwise" not in candidate_names(16, 256, 512, args, torch.float16)
    assert candidate_names(16, 256, 512, argparse.Namespace(**{**vars(args), "libtype": ["torch"]})) == \
        ["scaled_mm_blockwise"]
    assert "scaled_mm_blockwise" not in candidate_names(16, 256, 512, argparse.Namespace(**{**vars(args),
                                                                                              "libtype": ["triton"]}))


def test_bad_libtype_is_a_usage_error(tmp_path, capsys, cpu_tuner_workers):
    assert main(["--nk", "256,512", "--libtype", "triton,cublas", "-o", str(tmp_path / "t.csv")]) == 2
    assert "--libtype ['cublas']" in capsys.readouterr().err
    assert main(["--nk", "256,512", "--libtype", "torch", "-o", str(tmp_path / "t.csv")]) == 2
    assert "--libtype torch: " in capsys.readouterr().err  # with the reason (no GPU; or no block-wise recipe)


def test_tuner_writes_torch_winners_the_op_replays(tmp_path, clean_runtime, fake_torch, cpu_tuner_workers,
                                                   virtual_clock):
    """On the virtual clock the fake (one tick) beats a 50-ms launcher, so torch wins every shape: its rows and JSON
    buckets say libtype torch and the op routes there."""
    tuned, jdir = tmp_path / "tuned.csv", tmp_path / "json"
    assert main(["--nk", "256,512", "--m", "1,6", "--candidates", "fake_slow_blockscale,scaled_mm_blockwise",
                 "-o", str(tuned),
                 "--json_dir", str(jdir), "--plugin", "op_tests.fake_scaled_mm_plugin"]) == 0
    rows = read_csv_rows(tuned)[1]
    assert [(r["M"], r["libtype"], r["kernelName"], r["splitK"]) for r in rows] == \
        [("1", "torch", "scaled_mm_blockwise", "0"), ("6", "torch", "scaled_mm_blockwise", "0")]
    (jpath,) = jdir.iterdir()
    assert set(map(json.dumps, json.loads(jpath.read_text()).values())) == \
        {json.dumps(TorchBlockwise().to_json())}
    clean_runtime.setenv("AITER_CONFIG_GEMM_A8W8_BLOCKSCALE", str(tuned))
    clean_runtime.setenv("AITER_GEMM_TRITON_CONFIGS", str(jdir))
    aiter_gemm.reload_configs()
    got = get_GEMM_A8W8_BLOCKSCALE_config(5, 256, 512, on_gpu=False)  # no row at 5, 8 (gl0/gl1): the JSON
    assert (got["libtype"], got["matched"]) == ("torch", "json")
    XQ, WQ, xs, ws = _inputs(5, 256, 512)
    fake.CALLS.clear()
    out = gemm_a8w8_blockscale(XQ, WQ, xs, ws)
    assert fake.CALLS and _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws)) < BF16_TOL


# ---- GPU -----------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 3, 64, 1000])
@pytest.mark.parametrize("N,K", [(2112, 7168), (4096, 512)])
def test_gpu_scaled_mm_blockwise_matches_the_reference(M, N, K):
    if torch_impl.unavailable_reason(torch.device("cuda")):
        pytest.skip(torch_impl.unavailable_reason(torch.device("cuda")))
    XQ, WQ, xs, ws = _inputs(M, N, K, "cuda")
    out = gemm_a8w8_blockscale(XQ, WQ, xs, ws, config="scaled_mm_blockwise")
    assert out.shape == (M, N) and out.dtype == torch.bfloat16
    assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < BF16_TOL
    xs_mmajor = xs.t().contiguous().t()
    torch.testing.assert_close(gemm_a8w8_blockscale(XQ, WQ, xs_mmajor, ws, config="scaled_mm_blockwise"), out,
                               rtol=0, atol=0)


def test_candidates_include_the_runtime_default_config():
    from aiter_gemm.kernels.a8w8_blockscale import default_config

    args = argparse.Namespace(candidates=None, variants=None, quick=True, libtype=["triton"])
    for M, N, K in ((1024, 256, 7168), (1, 4096, 512), (8192, 57344, 8192)):
        names = candidate_names(M, N, K, args, num_sms=132)
        assert default_config(M, N, K, 132).name in names and len(names) == len(set(names))


@pytest.mark.parametrize("layout,strides", [("m_major", (1, 8)), ("row_major", (4, 1))])
def test_worker_inputs_lay_out_x_scale_as_asked(layout, strides):
    from aiter_gemm.ops.a8w8_blockscale import make_inputs

    p = GemmProblem(8, 256, 512, False, torch.float8_e4m3fn, torch.bfloat16)
    data = make_inputs(p, 0, torch.device("cpu"), 1 << 20, {"x_scale_layout": layout})
    assert all(s[2].stride() == strides for s in data.sets) and len(data.sets) >= 2
    with pytest.raises(ValueError, match="x_scale_layout 'col'"):
        make_inputs(p, 0, torch.device("cpu"), 1 << 20, {"x_scale_layout": "col"})


# ---- the default: torch's matmul where the H100 sweep found it faster than our Triton default ------------------
@pytest.mark.parametrize("M,N,K,torch_default", [
    (1, 8192, 8192, False), (16, 8192, 8192, False), (17, 8192, 8192, True), (4096, 57344, 8192, True),
    (256, 7168, 2048, False), (257, 7168, 2048, True),  # 14.7M-element weight: Triton up to M = 256
    (500, 4096, 512, False), (501, 4096, 512, True),  # 2.1M elements: up to M = 500
])
def test_torch_blockwise_is_the_default_above_the_measured_crossover(M, N, K, torch_default):
    from aiter_gemm.backends.a8w8_blockscale import torch as torch_backend
    from aiter_gemm.device import DeviceIdentity

    h100 = DeviceIdentity("sm_90", 132, "cuda", "H100")
    got = torch_backend.BACKEND.default_for(GemmProblem(M, N, K, False, torch.float8_e4m3fn, torch.bfloat16), h100)
    assert (got is not None) == torch_default
    other = DeviceIdentity("sm_100", 148, "cuda", "B200")  # no sweep there: torch's wherever it runs
    assert torch_backend.BACKEND.default_for(GemmProblem(M, N, K, False, torch.float8_e4m3fn), other) is not None


@pytest.mark.parametrize("M,N,K,tile", [
    (32, 4096, 14336, "splitK-BM64_BN64_BK128_GM1_SK4_W4_S4_TMA"),  # long K, narrow N: torch's above M = 16 before
    (100, 4096, 14336, "splitK-BM64_BN64_BK128_GM1_SK2_W4_S4_TMA"),
    (17, 28672, 4096, "swapAB-BM32_BN64_BK128_GM1_SK1_W4_S6_TMA"),
    (40, 28672, 4096, "base-BM64_BN128_BK128_GM1_SK1_W4_S4_TMA"),
    (24, 6144, 4096, "swapAB-BM32_BN64_BK128_GM1_SK1_W4_S6_TMA"),
    (64, 6144, 4096, "splitK-BM64_BN64_BK128_GM1_SK2_W4_S4_TMA"),
    (17, 5120, 14336, None), (100, 28672, 4096, None), (16, 4096, 14336, None), (129, 4096, 14336, None),
    (32, 2048, 14336, None), (48, 10240, 5120, None),  # outside the measured classes
])
def test_h200_decode_tiles_take_their_classes_from_torch(M, N, K, tile):
    """On an H200 a measured decode tile is the default of its shape class (the Triton backend's default config,
    which torch's path then leaves alone); on an H100, the same class (sm_90, 132), nothing changes."""
    from aiter_gemm.backends.a8w8_blockscale import torch as torch_backend
    from aiter_gemm.backends.a8w8_blockscale import triton as triton_backend
    from aiter_gemm.device import DeviceIdentity
    from aiter_gemm.kernels.a8w8_blockscale import config_error, decode_config

    p = GemmProblem(M, N, K, False, torch.float8_e4m3fn, torch.bfloat16)
    h200 = DeviceIdentity("sm_90", 132, "cuda", "NVIDIA H200")
    h100 = DeviceIdentity("sm_90", 132, "cuda", "NVIDIA H100 80GB HBM3")
    cfg = decode_config(M, N, K, h200.name)
    assert (cfg.name if cfg else None) == tile and decode_config(M, N, K, h100.name) is None
    if tile is None:
        return
    assert config_error(cfg, M, N, K, "sm_90") is None
    assert triton_backend.BACKEND.default_for(p, h200).kernelName == tile
    assert torch_backend.BACKEND.default_for(p, h200) is None
    assert triton_backend.BACKEND.default_for(p, h100).kernelName != tile


def test_h200_decode_tile_is_the_dispatchers_graph_default(clean_runtime, fake_torch):
    """Through the dispatcher: an untuned decode shape on an H200 runs the measured tile under graphs; eager calls
    still run torch's matmul where Triton's launches are not bound (the Triton launcher's host cost; bound:
    test_blockscale_bound.py), and the H100 keeps torch's path."""
    from aiter_gemm import triton_launch

    clean_runtime.setattr(triton_launch, "BINDS", False)
    clean_runtime.setenv("AITER_GEMM_ARCH", "sm_90")
    clean_runtime.setenv("AITER_GEMM_CU_NUM", "132")
    aiter_gemm.reload_configs()
    disp = aiter_gemm.get_dispatcher("gemm_a8w8_blockscale")
    p = GemmProblem(32, 4096, 14336, False, torch.float8_e4m3fn, torch.bfloat16)
    h200 = aiter_gemm.device.DeviceIdentity("sm_90", 132, "cuda", "NVIDIA H200")
    h100 = aiter_gemm.device.DeviceIdentity("sm_90", 132, "cuda", "NVIDIA H100 80GB HBM3")
    dec = disp._decide(p, h200)
    assert (dec.solution.libtype, dec.solution.kernelName) == ("triton", "splitK-BM64_BN64_BK128_GM1_SK4_W4_S4_TMA")
    assert dec.eager_solution.libtype == "torch"
    assert disp._decide(p, h100).solution.libtype == "torch"


@pytest.fixture
def h100_blockscale(clean_runtime, fake_torch):
    """The block-scale dispatcher on an sm_90 / 132-SM identity, torch's matmul available (the fake)."""
    clean_runtime.setenv("AITER_GEMM_ARCH", "sm_90")
    clean_runtime.setenv("AITER_GEMM_CU_NUM", "132")
    aiter_gemm.reload_configs()
    return aiter_gemm.get_dispatcher("gemm_a8w8_blockscale"), aiter_gemm.device.DeviceIdentity("sm_90", 132, "cuda",
                                                                                                   "H100")


def test_default_dispatch_prefers_torch_blockwise_where_it_claims_and_can_run(h100_blockscale):
    """With torch's matmul available (the fake), an untuned large-M shape defaults to it; small M keeps Triton."""
    disp, ident = h100_blockscale
    big = disp.default_decision(GemmProblem(1024, 4096, 512, False, torch.float8_e4m3fn, torch.bfloat16), ident)
    small = disp.default_decision(GemmProblem(16, 4096, 512, False, torch.float8_e4m3fn, torch.bfloat16), ident)
    assert big.solution.libtype == "torch" and small.solution.libtype == "triton"


def test_eager_calls_of_a_triton_default_run_torch_blockwise(h100_blockscale, monkeypatch):
    """Where the Triton config stays the graph-mode default (small M on the H100) and its launches are not bound
    (bound: test_blockscale_bound.py), eager calls run torch's matmul: the Triton launcher's host cost (median
    114 us per eager call on the H100 host, torch's 85 us) loses wherever torch's runs."""
    from aiter_gemm import triton_launch

    monkeypatch.setattr(triton_launch, "BINDS", False)
    disp, h100 = h100_blockscale
    small = disp._decide(GemmProblem(16, 4096, 512, False, torch.float8_e4m3fn, torch.bfloat16), h100)
    assert (small.solution.libtype, small.eager_solution.libtype) == ("triton", "torch")
    assert small.as_config()["eager_libtype"] == "torch"
    big = disp._decide(GemmProblem(1024, 4096, 512, False, torch.float8_e4m3fn, torch.bfloat16), h100)
    assert big.solution.libtype == "torch" and big.eager_solution is None  # cheap already: nothing to switch
    cpu = aiter_gemm.device.DeviceIdentity("cpu", 2, "cpu")
    assert disp._decide(GemmProblem(16, 4096, 512, False, torch.float8_e4m3fn, torch.bfloat16), cpu
                        ).eager_solution is None  # no graphs on a CPU


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 3, 64, 1000])
def test_gpu_bound_runner_equals_f_scaled_mm(M):
    """The dispatcher's shape-bound runner (torch's op called directly where :func:`direct_op` allows) gives the
    same bits as the plain F.scaled_mm call."""
    if torch_impl.unavailable_reason(torch.device("cuda")):
        pytest.skip(torch_impl.unavailable_reason(torch.device("cuda")))
    XQ, WQ, xs, ws = _inputs(M, 2112, 7168, "cuda")
    ref = torch_impl.gemm_a8w8_blockscale_torch(XQ, WQ, xs, ws)
    got = torch_impl.launcher(M, 2112, 7168)(XQ, WQ, xs, ws, torch.bfloat16)
    assert torch.equal(got, ref)
    print("direct op:", torch_impl.direct_op() is not None, torch.__version__)
