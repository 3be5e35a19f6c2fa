"""CUDA graphs: dispatch inside a capture does no host sync and no file I/O, and the graph replays correctly.

Triton kernels (skinny, triton backends) compile on their first launch, which writes files; like any CUDA graph
user (torch.cuda.graph's own rule), a model warms every shape up before capturing. Shapes whose decision is a
torch or cuBLASLt solution need no warm-up: their first dispatch may happen inside the capture.
"""

from __future__ import annotations

import builtins
import os

import pytest
import torch

import aiter_gemm
from op_tests.runtime_helpers import BF16_HEADER, bf16_row

N = K = 4096
# bf16 outputs against a float32 F.linear: |out| ~ sqrt(K) = 64, half a bf16 ulp there is 0.125 (atol 2x), 2^-9
# relative elsewhere (rtol ~10x, for accumulation order).
TOLERANCE = dict(rtol=2e-2, atol=2.5e-1)


def _no_file_io():
    def forbidden(*args, **kwargs):
        raise AssertionError(f"file I/O during CUDA graph capture: {args[:1]}")

    return forbidden


def _capture(calls):
    """Capture ``calls()`` with open/os.replace forbidden; return the graph and the captured outputs."""
    graph = torch.cuda.CUDAGraph()
    real_open, real_replace = builtins.open, os.replace
    with torch.cuda.stream(torch.cuda.Stream()):
        builtins.open = os.replace = _no_file_io()
        try:
            with torch.cuda.graph(graph):
                outs = calls()
        finally:
            builtins.open, os.replace = real_open, real_replace
    return graph, outs


def _check(graph, xs, outs, w, biases):
    for x in xs:
        x.normal_()
    graph.replay()
    torch.cuda.synchronize()
    for x, b, out in zip(xs, biases, outs):
        ref = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
        torch.testing.assert_close(out.float(), ref, **TOLERANCE)


@pytest.fixture
def tuned_env(clean_runtime, tmp_path):
    ident = aiter_gemm.current_device_identity(on_gpu=True)
    tuned = tmp_path / "tuned.csv"
    tuned.write_text(BF16_HEADER + bf16_row(64, N, K, "torch", gfx=ident.gfx, cu_num=ident.cu_num,
                                           dtype="torch.bfloat16"))
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(tuned))
    clean_runtime.setenv("AITER_TUNE_GEMM", "1")
    clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(tmp_path / "untuned.csv"))
    aiter_gemm.reload_configs()
    # Process-level first uses, on an unrelated shape, as before any capture: cuBLAS creates its handle (which cannot
    # happen inside a capture), and the first default decision imports the backend modules (Triton reads files).
    torch.nn.functional.linear(torch.randn(8, 32, device="cuda"), torch.randn(16, 32, device="cuda"))
    aiter_gemm.gemm_a16w16(torch.randn(8, 32, device="cuda"), torch.randn(16, 32, device="cuda"))
    torch.cuda.synchronize()
    return tmp_path


@pytest.mark.gpu
def test_first_dispatch_inside_capture_for_library_backends(tuned_env):
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    xs = [torch.randn(m, K, device="cuda", dtype=torch.bfloat16) for m in (64, 50, 300)]  # exact, padded, default
    graph, outs = _capture(lambda: [aiter_gemm.gemm_a16w16(x, w) for x in xs])
    _check(graph, xs, outs, w, [None] * len(xs))
    cfgs = [aiter_gemm.get_GEMM_A16W16_config(x.shape[0], N, K, False, torch.bfloat16) for x in xs]
    assert [c["matched"] for c in cfgs] == ["exact", "padded_gl0", "default"]
    assert cfgs[2]["libtype"] in ("torch", "cublaslt")
    aiter_gemm.get_dispatcher().flush_capture()  # outside the capture: the default shape was recorded
    assert "300" in (tuned_env / "untuned.csv").read_text()


@pytest.mark.gpu
def test_warmed_up_shapes_capture_without_io_on_every_backend(tuned_env):
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    xs = [torch.randn(m, K, device="cuda", dtype=torch.bfloat16) for m in (1, 3, 16, 64, 50, 300)]
    biases = [None] * len(xs) + [bias]
    calls = lambda: [aiter_gemm.gemm_a16w16(x, w, b) for x, b in zip([*xs, xs[0]], biases)]  # noqa: E731
    calls()  # warm-up: decisions made, Triton kernels compiled
    torch.cuda.synchronize()
    graph, outs = _capture(calls)
    _check(graph, [*xs, xs[0]], outs, w, biases)


@pytest.mark.gpu
def test_rows_of_every_backend_warm_up_eagerly_then_capture_without_io(clean_runtime, tmp_path):
    """Tuned rows naming skinny, triton (classic and TMA), cuBLASLt and torch: an eager warm-up (whose calls run the
    cheap-launch choice but also compile the capture-time kernels once), then a capture with no file I/O, correct."""
    from aiter_gemm.registry import get_backend

    ident = aiter_gemm.current_device_identity(on_gpu=True)
    rows = [(1, "skinny", 0, "fma_BN8_BK1024_SK1_W4_S1"), (32, "triton", 0, "BM32_BN64_BK128_GM1_SK1_W4_S4"),
            (128, "triton", 0, "BM128_BN128_BK64_GM8_SK1_W8_S3_TMA"), (64, "torch", 0, "F.linear")]
    if get_backend("cublaslt").is_available():
        rows.append((256, "cublaslt", -1, ""))  # cuBLASLt's heuristic #0
    tuned = tmp_path / "tuned.csv"
    tuned.write_text(BF16_HEADER + "".join(bf16_row(m, N, K, lib, gfx=ident.gfx, cu_num=ident.cu_num,
                                                    dtype="torch.bfloat16", solidx=idx, kernel=name)
                                           for m, lib, idx, name in rows))
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(tuned))
    aiter_gemm.reload_configs()
    got = {m: aiter_gemm.get_GEMM_A16W16_config(m, N, K, False, torch.bfloat16) for m, *_ in rows}
    assert all(got[m]["matched"] == "exact" and got[m]["libtype"] == lib for m, lib, *_ in rows)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    xs = [torch.randn(m, K, device="cuda", dtype=torch.bfloat16) for m, *_ in rows]
    calls = lambda: [aiter_gemm.gemm_a16w16(x, w) for x in xs]  # noqa: E731
    calls()  # warm-up
    torch.cuda.synchronize()
    graph, outs = _capture(calls)
    _check(graph, xs, outs, w, [None] * len(xs))


@pytest.mark.gpu
def test_capture_is_seen_without_asking_the_driver():
    """Decisions that switch between a graph and an eager choice learn of a capture from torch.cuda.graph itself."""
    from aiter_gemm import cudagraph

    assert cudagraph.probe() is cudagraph.capturing
    x = torch.randn(8, 8, device="cuda")
    torch.cuda.synchronize()
    seen = []
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(torch.cuda.Stream()):
        with torch.cuda.graph(graph):
            seen.append((cudagraph.capturing(), torch.cuda.is_current_stream_capturing()))
            x.mul_(2)
    seen.append((cudagraph.capturing(), torch.cuda.is_current_stream_capturing()))
    assert seen == [(True, True), (False, False)]



# Rows naming every Triton kernel that reads a bias: the classic kernel, split-K (the reduce adds the bias), the TMA
# persistent kernel (and flattened), and the skinny variants (one-pass store, atomic split 0, two-pass reduce, gemv).
BIAS_ROWS = [(64, "triton", 0, "BM64_BN64_BK64_GM8_SK1_W4_S3"), (48, "triton", 0, "BM16_BN64_BK128_GM1_SK4_W4_S4"),
             (128, "triton", 0, "BM128_BN128_BK64_GM8_SK1_W8_S3_TMA"),
             (256, "triton", 0, "BM128_BN128_BK64_GM8_SK1_W8_S3_TMAF"),
             (1, "skinny", 6, "gemv_BN1_BK2048_SK1_W4_S1_EF"), (2, "skinny", 7, "gemv_2pass_BN4_BK512_SK2_W4_S1"),
             (3, "skinny", 2, "fma_atomic_BN8_BK128_SK4_W4_S1"), (4, "skinny", 3, "dot_BN32_BK128_SK1_W4_S4"),
             (8, "skinny", 5, "dot_atomic_BN32_BK128_SK4_W4_S3"), (16, "skinny", 1, "fma_2pass_BN8_BK64_SK4_W4_S1")]


@pytest.mark.gpu
@pytest.mark.parametrize("timing", ["graph", "eager"])
def test_strided_biases_on_every_triton_kernel_eager_and_captured(clean_runtime, tmp_path, timing):
    """Issue 31: a strided, column-of-2-D or stride-0 bias through tuned triton and skinny rows (graph-timed, as
    shipped, and eager-timed), called eagerly and captured in a CUDA graph, gives F.linear's result; read as
    contiguous it was off by 5.6-5.9 on the H100 (54 for stride 0)."""
    import csv

    from aiter_gemm.configs import BF16_TUNED_COLUMNS
    from op_tests.runtime_helpers import BIAS_LAYOUTS, strided_bias

    n, k = 512, 1024
    ident = aiter_gemm.current_device_identity(on_gpu=True)
    tuned = tmp_path / "tuned.csv"
    with open(tuned, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(BF16_TUNED_COLUMNS)
        for m, lib, idx, name in BIAS_ROWS:
            w.writerow([ident.gfx, ident.cu_num, m, n, k, True, "torch.bfloat16", "torch.bfloat16", False, False, lib,
                        idx, 0, 10.0, name, 0.0, 0.0, 0.0, "", timing, ""])
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(tuned))
    aiter_gemm.reload_configs()
    for m, lib, _, name in BIAS_ROWS:
        got = aiter_gemm.get_GEMM_A16W16_config(m, n, k, True, torch.bfloat16)
        assert (got["matched"], got["libtype"], got["kernelName"]) == ("exact", lib, name), got
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for m, *_ in BIAS_ROWS]
    for layout in BIAS_LAYOUTS:
        # Not decided afresh: each layout's capture runs kernels compiled for the first layout's bias (one variant
        # serves every bias stride), as a model's differently strided biases of one shape do.
        bias = strided_bias(layout, n, torch.bfloat16, "cuda")
        biases = [bias] * len(xs)
        calls = lambda: [aiter_gemm.gemm_a16w16(x, weight, bias) for x in xs]  # noqa: E731, B023
        eager = calls()  # also the warm-up of the capture-time kernels
        torch.cuda.synchronize()
        for x, out in zip(xs, eager):
            ref = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
            torch.testing.assert_close(out.float(), ref, **TOLERANCE, msg=lambda m, lay=layout: f"{lay}: {m}")
        graph, outs = _capture(calls)
        _check(graph, xs, outs, weight, biases)
