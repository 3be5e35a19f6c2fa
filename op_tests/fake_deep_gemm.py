"""A CPU stand-in for ``deep_gemm`` (DeepGEMM is built for sm_90 GPUs only): ``fp8_gemm_nt`` checks what DeepGEMM's
SM90 FP8 GEMM asserts (K-major fp8 A and B, a row-major bf16 output of (M, N), float32 scales of (M, K/128) and
(N/128, K/128)), records each call and writes the float32 dequantized reference, so CPU tests check the arguments
the ``deepgemm`` backend, its warm-up and the benchmark provider pass. ``m_grouped_fp8_gemm_nt_contiguous`` does the
same for the contiguous grouped GEMM (rows grouped in runs aligned to :data:`ALIGNMENT`, -1 padding rows written NaN
so a padding row that leaks into a result shows). ``install(monkeypatch)`` puts it in
``sys.modules`` and makes the backend available on any device; importing :mod:`op_tests.fake_deep_gemm_plugin` does
so in tuner workers."""

from __future__ import annotations

import sys
import types

import torch

from aiter_gemm.kernels import a8w8_blockscale_deepgemm as dg_impl
from aiter_gemm.kernels.a8w8_blockscale import gemm_a8w8_blockscale_ref
from aiter_gemm.kernels.blockscale_format import FP8, SCALE_BLOCK

#: One dict per call: M, N, K, x_scale's strides and data pointer, the output's data pointer.
CALLS: list[dict] = []
#: What ``get_mk_alignment_for_contiguous_layout`` returns (DeepGEMM's SM90 constant; tests may set another).
ALIGNMENT = 128


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise RuntimeError(f"fake deep_gemm: {what}")


def fp8_gemm_nt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="nk",
                disable_ue8m0_cast=False):
    (xq, sfa), (wq, sfb) = a, b
    M, K = xq.shape
    N = wq.shape[0]
    kb, nb = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK)
    _need(xq.dtype == FP8 and wq.dtype == FP8, f"A {xq.dtype}, B {wq.dtype} must be float8_e4m3fn")
    _need(xq.stride(-1) == 1 and wq.stride(-1) == 1, f"A strides {xq.stride()}, B {wq.stride()} must be K-major")
    _need(wq.shape[1] == K and tuple(d.shape) == (M, N), f"A {tuple(xq.shape)}, B {tuple(wq.shape)}, D "
          f"{tuple(d.shape)}")
    _need(d.dtype == torch.bfloat16 and d.stride(-1) == 1 and c is None, "D must be row-major bf16, no C")
    _need(sfa.dtype == sfb.dtype == torch.float32, "scales must be float32")
    _need(tuple(sfa.shape) == (M, kb) and tuple(sfb.shape) == (nb, kb), f"sfa {tuple(sfa.shape)}, sfb "
          f"{tuple(sfb.shape)}")
    CALLS.append({"M": M, "N": N, "K": K, "sfa_stride": sfa.stride(), "sfa_ptr": sfa.data_ptr(),
                  "d_ptr": d.data_ptr(), "a_ptr": xq.data_ptr()})
    d.copy_(gemm_a8w8_blockscale_ref(xq, wq, sfa, sfb, d.dtype))


def get_mk_alignment_for_contiguous_layout() -> int:
    return ALIGNMENT


def m_grouped_fp8_gemm_nt_contiguous(a, b, d, grouped_layout, recipe=None, compiled_dims="nk",
                                     disable_ue8m0_cast=False, use_psum_layout=False, expected_m_for_psum_layout=None):
    """d[rows of group g] = a[rows] @ b[g].T scaled, checked as DeepGEMM reads the layout: each aligned block of rows
    holds one group's rows first, then -1 padding (the kernel takes a block's group from its first row)."""
    (xq, sfa), (wq, sfb) = a, b
    M, K = xq.shape
    G, N = wq.shape[:2]
    kb, nb = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK)
    _need(not use_psum_layout, "the fake takes the per-row layout only")
    _need(xq.dtype == FP8 and wq.dtype == FP8, f"A {xq.dtype}, B {wq.dtype} must be float8_e4m3fn")
    _need(xq.stride(-1) == 1 and wq.stride(-1) == 1, f"A strides {xq.stride()}, B {wq.stride()} must be K-major")
    _need(wq.dim() == 3 and wq.shape[2] == K and tuple(d.shape) == (M, N), f"A {tuple(xq.shape)}, B "
          f"{tuple(wq.shape)}, D {tuple(d.shape)}")
    _need(d.dtype == torch.bfloat16 and d.stride(-1) == 1, "D must be row-major bf16")
    _need(sfa.dtype == sfb.dtype == torch.float32, "scales must be float32")
    _need(tuple(sfa.shape) == (M, kb) and tuple(sfb.shape) == (G, nb, kb), f"sfa {tuple(sfa.shape)}, sfb "
          f"{tuple(sfb.shape)}")
    _need(grouped_layout.dtype == torch.int32 and tuple(grouped_layout.shape) == (M,), "grouped_layout must be int32 "
          f"(M,), got {grouped_layout.dtype} {tuple(grouped_layout.shape)}")
    _need(M % ALIGNMENT == 0, f"M={M} is not a multiple of the alignment {ALIGNMENT}")
    layout = grouped_layout.long()
    _need(bool(((layout >= -1) & (layout < G)).all()), f"grouped_layout values must be in [-1, {G})")
    for block in layout.view(-1, ALIGNMENT).tolist():
        n = sum(v >= 0 for v in block)
        _need(len(set(block[:n])) <= 1 and all(v == -1 for v in block[n:]), f"an aligned block holds {block}: one "
              "group's rows first, then -1 padding")
    CALLS.append({"M": M, "N": N, "K": K, "G": G, "sfa_stride": sfa.stride(), "layout": layout.clone()})
    d.fill_(float("nan"))
    for g in range(G):
        rows = (layout == g).nonzero().flatten()
        if rows.numel():
            d[rows] = gemm_a8w8_blockscale_ref(xq[rows], wq[g], sfa[rows], sfb[g], d.dtype)


def fake_module() -> types.ModuleType:
    mod = types.ModuleType("deep_gemm")
    mod.__version__ = "fake"
    mod.fp8_gemm_nt = fp8_gemm_nt
    mod.m_grouped_fp8_gemm_nt_contiguous = m_grouped_fp8_gemm_nt_contiguous
    mod.get_mk_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout
    return mod


def install(monkeypatch=None) -> None:
    """The fake as ``deep_gemm``, and the backend available on any device (restored by ``monkeypatch`` if given)."""
    CALLS.clear()
    if monkeypatch is None:
        sys.modules["deep_gemm"] = fake_module()
        dg_impl.unavailable_reason = lambda device=None: None
        return
    monkeypatch.setitem(sys.modules, "deep_gemm", fake_module())
    monkeypatch.setattr(dg_impl, "unavailable_reason", lambda device=None: None)
