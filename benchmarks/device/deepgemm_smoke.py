"""DeepGEMM smoke run on one sm_90 GPU (docs/deepgemm.md): import a built deep_gemm, then its FP8 block-scale GEMM
(1x128 activation / 128x128 weight float32 scales), bf16 GEMM and grouped FP8 GEMMs (contiguous, masked) against
float32 dequantized references. One JSON line per case on stdout; a failing case prints its error and the run goes on.

    python benchmarks/device/deepgemm_smoke.py --path /tmp/dg [--m 1,64,4096] [--iters 10]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

FP8_NK = ((7168, 16384), (24576, 1536), (2112, 7168))
BLOCK = 128


def emit(case: str, **fields: Any) -> None:
    """One JSON line for a case."""
    print(json.dumps({"case": case, **fields}), flush=True)


def guarded(case: str, fn: Callable[[], dict], **fields: Any) -> None:
    """Run one case; its result or its error (with the traceback's tail) becomes its JSON line."""
    try:
        emit(case, ok=True, **fields, **fn())
    except Exception as e:  # noqa: BLE001 - every failure is a printed line, never the end of the run
        tail = traceback.format_exc().strip().splitlines()[-6:]
        emit(case, ok=False, **fields, error=f"{type(e).__name__}: {e}"[:500], traceback=tail)


def per_token_fp8(x, torch):
    """(M, K) -> fp8 (M, K), float32 scales (M, ceil(K/128)): one scale per row and 128 columns."""
    m, k = x.shape
    kp = -(-k // BLOCK) * BLOCK
    xp = torch.zeros(m, kp, dtype=torch.float32, device=x.device)
    xp[:, :k] = x.float()
    v = xp.view(m, kp // BLOCK, BLOCK)
    s = v.abs().amax(dim=2).clamp(min=1e-4) / 448.0
    q = (v / s.unsqueeze(2)).to(torch.float8_e4m3fn).view(m, kp)[:, :k].contiguous()
    return q, s


def per_block_fp8(w, torch):
    """(N, K) -> fp8 (N, K), float32 scales (ceil(N/128), ceil(K/128)): one scale per 128x128 block."""
    n, k = w.shape
    npad, kp = -(-n // BLOCK) * BLOCK, -(-k // BLOCK) * BLOCK
    wp = torch.zeros(npad, kp, dtype=torch.float32, device=w.device)
    wp[:n, :k] = w.float()
    v = wp.view(npad // BLOCK, BLOCK, kp // BLOCK, BLOCK)
    s = v.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-4) / 448.0
    q = (v / s).to(torch.float8_e4m3fn).view(npad, kp)[:n, :k].contiguous()
    return q, s.view(npad // BLOCK, kp // BLOCK)


def dequant_rows(q, s):
    """fp8 (M, K) with (M, K/128) scales -> float32."""
    return q.float() * s.repeat_interleave(BLOCK, dim=1)[:, : q.shape[1]]


def dequant_blocks(q, s):
    """fp8 (N, K) with (N/128, K/128) scales -> float32."""
    n, k = q.shape
    return q.float() * s.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)[:n, :k]


def errors(out, ref) -> dict:
    """Relative Frobenius error, max abs error over max |ref|, and DeepGEMM's calc_diff (1 - cosine-like)."""
    o, r = out.double(), ref.double()
    denom = float((o * o + r * r).sum())
    return {
        "rel_err": float((o - r).norm() / r.norm().clamp(min=1e-30)),
        "max_abs_rel": float((o - r).abs().max() / r.abs().max().clamp(min=1e-30)),
        "calc_diff": 1.0 - 2.0 * float((o * r).sum()) / denom if denom else 0.0,
    }


def timed(fn: Callable[[], None], iters: int, torch) -> dict:
    """First call's wall time (includes the JIT compile or a disk-cache load), then the mean of `iters` calls after 3
    untimed ones (aiter_gemm.timing.ms_per_call: CUDA events)."""
    from aiter_gemm.timing import ms_per_call

    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = time.perf_counter() - t
    if iters <= 0:
        return {"first_call_s": round(first, 3)}
    return {"first_call_s": round(first, 3), "us": round(ms_per_call(fn, iters, True, warmup=3) * 1e3, 2)}


def fp8_dense(dg, torch, m: int, n: int, k: int, iters: int, pretransform: bool) -> dict:
    """fp8_gemm_nt((x, x_scale), (w, w_scale), out): out = x @ w.T in bf16, recipe (1, 128, 128) by default."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    (xq, xs), (wq, ws) = per_token_fp8(x, torch), per_block_fp8(w, torch)
    ref = dequant_rows(xq, xs) @ dequant_blocks(wq, ws).T
    if pretransform:  # the TMA-aligned MN-major activation scales the kernel reads, made once here
        xs = dg.transform_sf_into_required_layout(xs, m, k, (1, BLOCK, BLOCK), is_sfa=True)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    t = timed(lambda: dg.fp8_gemm_nt((xq, xs), (wq, ws), out), iters, torch)
    res = {**errors(out, ref), **t, "xs_stride": list(xs.stride())}
    if "us" in t:
        res["tflops"] = round(2.0 * m * n * k / (t["us"] * 1e-6) / 1e12, 1)
    return res


def bf16_dense(dg, torch, m: int, n: int, k: int, iters: int) -> dict:
    """bf16_gemm_nt(a, b, out): out = a @ b.T."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    t = timed(lambda: dg.bf16_gemm_nt(a, b, out), iters, torch)
    return {**errors(out, a.float() @ b.float().T), **t}


def grouped_contiguous(dg, torch, groups: int, m_per_group: int, n: int, k: int) -> dict:
    """m_grouped_fp8_gemm_nt_contiguous((a, a_scale), (b, b_scale), out, m_indices): rows of a sorted by group, each
    group padded to get_mk_alignment_for_contiguous_layout() rows; m_indices (M,) int32 = group of a row, -1 padding."""
    align = dg.get_mk_alignment_for_contiguous_layout()
    sizes = [max(1, int(m_per_group * f)) for f in (0.7, 1.0, 1.3, 0.9)[:groups]] + [m_per_group] * (groups - 4)
    padded = [-(-s // align) * align for s in sizes]
    m = sum(padded)
    a = torch.zeros(m, k, device="cuda", dtype=torch.bfloat16)
    idx = torch.full((m,), -1, device="cuda", dtype=torch.int32)
    start = 0
    for g, (s, p) in enumerate(zip(sizes, padded)):
        a[start:start + s] = torch.randn(s, k, device="cuda", dtype=torch.bfloat16)
        idx[start:start + s] = g
        start += p
    b = torch.randn(groups, n, k, device="cuda", dtype=torch.bfloat16)
    aq, as_ = per_token_fp8(a, torch)
    bq = torch.empty(groups, n, k, device="cuda", dtype=torch.float8_e4m3fn)
    bs = torch.empty(groups, -(-n // BLOCK), -(-k // BLOCK), device="cuda", dtype=torch.float32)
    for g in range(groups):
        bq[g], bs[g] = per_block_fp8(b[g], torch)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    dg.m_grouped_fp8_gemm_nt_contiguous((aq, as_), (bq, bs), out, idx)
    torch.cuda.synchronize()
    ad = dequant_rows(aq, as_)
    ref = torch.zeros(m, n, device="cuda", dtype=torch.float32)
    rows = idx >= 0
    for g in range(groups):
        sel = idx == g
        ref[sel] = ad[sel] @ dequant_blocks(bq[g], bs[g]).T
    return {**errors(out[rows], ref[rows]), "align": align, "m": m, "group_rows": sizes}


def grouped_masked(dg, torch, groups: int, max_m: int, n: int, k: int) -> dict:
    """m_grouped_fp8_gemm_nt_masked((a, a_scale), (b, b_scale), out, masked_m, expected_m): a (G, max_m, K) with
    (G, max_m, K/128) scales, b (G, N, K) with (G, N/128, K/128), out (G, max_m, N); rows >= masked_m[g] untouched."""
    masked = [max(1, int(max_m * f)) for f in (0.5, 1.0, 0.25, 0.75)[:groups]] + [max_m] * (groups - 4)
    a = torch.randn(groups, max_m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(groups, n, k, device="cuda", dtype=torch.bfloat16)
    aq = torch.empty(groups, max_m, k, device="cuda", dtype=torch.float8_e4m3fn)
    as_ = torch.empty(groups, max_m, -(-k // BLOCK), device="cuda", dtype=torch.float32)
    bq = torch.empty(groups, n, k, device="cuda", dtype=torch.float8_e4m3fn)
    bs = torch.empty(groups, -(-n // BLOCK), -(-k // BLOCK), device="cuda", dtype=torch.float32)
    for g in range(groups):
        aq[g], as_[g] = per_token_fp8(a[g], torch)
        bq[g], bs[g] = per_block_fp8(b[g], torch)
    out = torch.zeros(groups, max_m, n, device="cuda", dtype=torch.bfloat16)
    mm = torch.tensor(masked, device="cuda", dtype=torch.int32)
    dg.m_grouped_fp8_gemm_nt_masked((aq, as_), (bq, bs), out, mm, sum(masked) // groups)
    torch.cuda.synchronize()
    outs, refs = [], []
    for g, s in enumerate(masked):
        outs.append(out[g, :s])
        refs.append(dequant_rows(aq[g, :s], as_[g, :s]) @ dequant_blocks(bq[g], bs[g]).T)
    return {**errors(torch.cat(outs), torch.cat(refs)), "masked_m": masked}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--path", default=os.environ.get("DG_PATH", "/tmp/dg"), help="folder holding deep_gemm/")
    p.add_argument("--m", default="1,64,4096", help="M values of the dense FP8 cases")
    p.add_argument("--iters", type=int, default=10, help="timed calls a dense case (0: the first call only)")
    args = p.parse_args()
    sys.path[:0] = [args.path, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]  # + repo
    try:
        import deep_gemm as dg
        import torch
    except Exception as e:  # noqa: BLE001
        emit("import", ok=False, path=args.path, error=f"{type(e).__name__}: {e}",
             traceback=traceback.format_exc().strip().splitlines()[-6:])
        return 1
    home = os.environ.get("HOME", "~")
    emit("import", ok=True, version=getattr(dg, "__version__", "?"), file=dg.__file__,
         torch=torch.__version__, cuda=torch.version.cuda,
         gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None,
         jit_cache_dir=os.environ.get("DG_JIT_CACHE_DIR") or os.path.join(home, ".deep_gemm"),
         cuda_home=os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"),
         jit_compiler="NVRTC" if os.environ.get("DG_JIT_USE_NVRTC", "0") not in ("", "0") else "NVCC",
         include=os.path.join(os.path.dirname(dg.__file__), "include"),
         apis=[n for n in ("fp8_gemm_nt", "bf16_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous",
                           "m_grouped_fp8_gemm_nt_masked", "transform_sf_into_required_layout",
                           "get_mn_major_tma_aligned_tensor", "get_mk_alignment_for_contiguous_layout")
               if hasattr(dg, n)])
    torch.manual_seed(0)
    for m in (int(v) for v in args.m.split(",")):
        for n, k in FP8_NK:
            guarded("fp8_gemm_nt", lambda m=m, n=n, k=k: fp8_dense(dg, torch, m, n, k, args.iters, False),
                    m=m, n=n, k=k)
    guarded("fp8_gemm_nt_pretransformed_sf", lambda: fp8_dense(dg, torch, 64, 2112, 7168, args.iters, True),
            m=64, n=2112, k=7168)
    guarded("bf16_gemm_nt", lambda: bf16_dense(dg, torch, 256, 2112, 7168, args.iters), m=256, n=2112, k=7168)
    guarded("m_grouped_fp8_gemm_nt_contiguous", lambda: grouped_contiguous(dg, torch, 4, 192, 4096, 7168),
            groups=4, n=4096, k=7168)
    guarded("m_grouped_fp8_gemm_nt_masked", lambda: grouped_masked(dg, torch, 4, 128, 4096, 7168),
            groups=4, max_m=128, n=4096, k=7168)
    return 0


if __name__ == "__main__":
    sys.exit(main())
