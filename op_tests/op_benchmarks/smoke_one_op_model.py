"""GPU smoke run of the one-op-model redesign (issue 12): both ops through the new dispatcher on every shipped row,
numerics against the float32 reference, and CUDA-graph time against the previous code on the same shapes.

The previous code is the package as of the commit before the redesign, copied to ``.base_old/aiter_gemm_old`` with
its imports renamed (``aiter_gemm`` -> ``aiter_gemm_old``), so both run in one process on the same inputs, in
alternating order per shape (new, old, old, new): the comparison sees the same GPU state. Both read the same shipped
CSVs; the decisions they make should be the same rows, so the times should agree within noise (dispatch cost is host
time, which CUDA-graph replay does not see; the CPU per-call cost is bench_dispatch_overhead's job).

    python op_tests/op_benchmarks/smoke_one_op_model.py --out $OUT/smoke.csv [--old .base_old]
"""

from __future__ import annotations

import argparse
import csv
import importlib
import math
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.double(), ref.double()
    if not bool(torch.isfinite(o).all()):
        return math.inf
    return float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--old", default=str(REPO / ".base_old"), help="folder holding aiter_gemm_old (skip if absent)")
    ap.add_argument("--limit", type=int, default=0, help="at most this many rows per op (0: all)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import aiter_gemm as new
    from aiter_gemm.blockscale import gemm_a8w8_blockscale, get_GEMM_A8W8_BLOCKSCALE_config
    from aiter_gemm.configs import load_table
    from aiter_gemm.kernels.a8w8_blockscale import gemm_a8w8_blockscale_ref, quantize_blockscale
    from aiter_gemm.settings import default_config_dir
    from gradlib.timing import TimingConfig, cache_bytes, interleaved, rotating_sets, time_runner

    old = old_bs = None
    if Path(args.old, "aiter_gemm_old").is_dir():
        sys.path.insert(0, args.old)
        old = importlib.import_module("aiter_gemm_old")
        old_bs = importlib.import_module("aiter_gemm_old.blockscale")
    dev = torch.device("cuda")
    ident = new.current_device_identity()
    cache = cache_bytes(dev)
    timing = TimingConfig(warmup=5, reps=9, target_us=300.0, budget_s=0.5)
    torch.backends.cuda.matmul.allow_tf32 = False
    cfgdir = default_config_dir()
    rows_out = []
    t0 = time.monotonic()

    def run_case(op: str, M: int, N: int, K: int, sets: list, ref: torch.Tensor, new_fn, old_fn, cfg: dict) -> None:
        out = new_fn(*sets[0])
        err = rel_err(out, ref)
        err_old = rel_err(old_fn(*sets[0]), ref) if old_fn else math.nan
        n = len(sets)
        measures = {"new": lambda: time_runner(lambda i: new_fn(*sets[i]), n, dev, timing).us}
        if old_fn:
            measures["old"] = lambda: time_runner(lambda i: old_fn(*sets[i]), n, dev, timing).us
        got = interleaved(measures, 2)
        us_new = statistics.median(got["new"])
        us_old = statistics.median(got["old"]) if old_fn else math.nan
        rows_out.append({"op": op, "M": M, "N": N, "K": K, "libtype": cfg["libtype"], "kernelName": cfg["kernelName"],
                         "matched": cfg["matched"], "rel_err_new": f"{err:.3e}", "rel_err_old": f"{err_old:.3e}",
                         "us_new": f"{us_new:.3f}", "us_old": f"{us_old:.3f}",
                         "ratio_old_over_new": f"{us_old / us_new:.4f}" if old_fn else ""})
        print(f"{op:>20} {M:>6} {N:>6} {K:>6} {cfg['libtype']:>9} {cfg['matched']:>10} err {err:.2e} "
              f"new {us_new:9.3f} old {us_old:9.3f} us", flush=True)

    # ---- gemm_a16w16: every shipped bf16 row on this device ----
    bf16 = [r for r in load_table("GEMM_BF16", [cfgdir / "bf16_tuned_gemm.csv"])
            if r.gfx in (None, ident.gfx) and r.cu_num == ident.cu_num]
    for row in bf16[: args.limit or None]:
        M, N, K, bias, dtype, otype = row.key[:6]
        gen = torch.Generator(device=dev).manual_seed(M + N + K)
        a = torch.randn(M, K, generator=gen, device=dev).to(dtype)
        b = (torch.randn(N, K, generator=gen, device=dev) / K ** 0.5).to(dtype)
        bv = torch.randn(N, generator=gen, device=dev).to(dtype) if bias else None
        ref = a.float() @ b.float().t() + (bv.float() if bv is not None else 0)
        per = (M * K + N * K) * 2 + M * N * 2
        n = rotating_sets(per, cache, torch.cuda.mem_get_info()[0])
        sets = [(a, b, bv)] + [(a.clone(), b.clone(), bv) for _ in range(n - 1)]
        cfg = new.get_GEMM_A16W16_config(M, N, K, bias, dtype, otype)
        ot = otype if otype != dtype else None
        run_case("gemm_a16w16", M, N, K, sets, ref, lambda x, w, bb, ot=ot: new.gemm_a16w16(x, w, bb, ot),
                 (lambda x, w, bb, ot=ot: old.gemm_a16w16(x, w, bb, ot)) if old else None, cfg)
        del sets, a, b, ref
    # ---- gemm_a8w8_blockscale: every shipped block-scale row ----
    bs = [r for r in load_table("GEMM_A8W8_BLOCKSCALE", [cfgdir / "a8w8_blockscale_tuned_gemm.csv"])
          if r.gfx in (None, ident.gfx) and r.cu_num == ident.cu_num]
    for row in bs[: args.limit or None]:
        M, N, K = row.key
        gen = torch.Generator(device=dev).manual_seed(M + N + K)
        x = torch.randn(M, K, generator=gen, device=dev)
        w = torch.randn(N, K, generator=gen, device=dev) / K ** 0.5
        XQ, WQ, xs, ws = quantize_blockscale(x, w)
        ref = gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)
        per = M * K + N * K + M * N * 2
        n = rotating_sets(per, cache, torch.cuda.mem_get_info()[0])
        sets = [(XQ, WQ, xs, ws)] + [(XQ.clone(), WQ.clone(), xs.clone(), ws.clone()) for _ in range(n - 1)]
        cfg = get_GEMM_A8W8_BLOCKSCALE_config(M, N, K)
        run_case("gemm_a8w8_blockscale", M, N, K, sets, ref, gemm_a8w8_blockscale,
                 old_bs.gemm_a8w8_blockscale if old_bs else None, cfg)
        del sets, x, w, ref
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows_out[0]))
        writer.writeheader()
        writer.writerows(rows_out)
    for op in ("gemm_a16w16", "gemm_a8w8_blockscale"):
        rs = [r for r in rows_out if r["op"] == op]
        ratios = [float(r["ratio_old_over_new"]) for r in rs if r["ratio_old_over_new"]]
        errs = [float(r["rel_err_new"]) for r in rs]
        if ratios:
            gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
            print(f"{op}: {len(rs)} rows, old/new time geomean {gm:.4f} (min {min(ratios):.3f}, max "
                  f"{max(ratios):.3f}), max rel err {max(errs):.2e}")
    print(f"wall {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
