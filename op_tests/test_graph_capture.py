"""CUDA graphs: shapes first seen inside a capture dispatch with no host sync and no file I/O, and replay right."""

from __future__ import annotations

import builtins
import os

import pytest
import torch

import aiter_gemm
from op_tests.runtime_helpers import BF16_HEADER, bf16_row


@pytest.mark.gpu
@pytest.mark.parametrize("capture_shapes", [False, True])
def test_first_dispatch_inside_graph_capture(clean_runtime, tmp_path, capture_shapes):
    ident = aiter_gemm.current_device_identity(on_gpu=True)
    tuned = tmp_path / "tuned.csv"
    tuned.write_text(BF16_HEADER + bf16_row(64, 4096, 4096, "torch", gfx=ident.gfx, cu_num=ident.cu_num,
                                           dtype="torch.bfloat16"))
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(tuned))
    if capture_shapes:
        clean_runtime.setenv("AITER_TUNE_GEMM", "1")
        clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(tmp_path / "untuned.csv"))
    aiter_gemm.reload_configs()

    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    xs = [torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16) for m in (64, 50, 1, 3, 300)]
    # cuBLAS creates its handle on first use, which cannot happen inside a capture: warm it up (as any real
    # capture does) on an unrelated shape, so every shape below is still first seen inside the capture.
    torch.nn.functional.linear(torch.randn(8, 32, device="cuda"), torch.randn(16, 32, device="cuda"))
    torch.cuda.synchronize()

    def forbidden(*args, **kwargs):
        raise AssertionError(f"file I/O during CUDA graph capture: {args[:1]}")

    graph = torch.cuda.CUDAGraph()
    real_open, real_replace = builtins.open, os.replace
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        builtins.open, os.replace = forbidden, forbidden
        try:
            with torch.cuda.graph(graph):
                outs = [aiter_gemm.gemm_a16w16(x, w) for x in xs] + [aiter_gemm.gemm_a16w16(xs[0], w, bias)]
        finally:
            builtins.open, os.replace = real_open, real_replace
    for x in xs:
        x.normal_()
    graph.replay()
    torch.cuda.synchronize()
    for x, b, out in zip([*xs, xs[0]], [None] * len(xs) + [bias], outs):
        ref = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
        torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2.5e-1)
    matched = [aiter_gemm.get_GEMM_A16W16_config(x.shape[0], 4096, 4096, False, torch.bfloat16)["matched"] for x in xs]
    assert matched[:2] == ["exact", "padded_gl0"]  # 50 -> 64 at gl0
    if capture_shapes:
        aiter_gemm.get_dispatcher().flush_capture()
        assert (tmp_path / "untuned.csv").exists()
