"""Per-call cost that ``gemm_a16w16`` adds over calling torch directly, on tiny tensors (host time dominates).

For an exact hit, a padded hit and a default decision (2-D A), an exact hit with a 3-D A, and ``TunedLinear``
against the ``nn.Linear`` it replaces, time N calls of the torch call and N calls of ours back to back, R times,
and report the median of the per-call differences (interleaving cancels drift from other load on the machine).
Also times the ``torch.ops`` custom-op path that compiled graphs use, and on a GPU ``gemm_a8w8_blockscale`` against
the plain call of torch's block-scaled matmul.

    python -m op_tests.op_benchmarks.bench_dispatch_overhead [--device cuda] [--out results/dispatch_overhead.csv]
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import aiter_gemm
from aiter_gemm.configs import BF16_TUNED_COLUMNS

N, K = 64, 64


def per_call_us(fn, n: int, sync) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n * 1e6


def measure(fn_ref, fn, n: int, repeats: int, sync) -> tuple[float, float, float]:
    for _ in range(3):  # warm-up: decisions made, caches filled
        per_call_us(fn_ref, n // 10 + 1, sync)
        per_call_us(fn, n // 10 + 1, sync)
    refs, outs, diffs = [], [], []
    for _ in range(repeats):
        r = per_call_us(fn_ref, n, sync)
        o = per_call_us(fn, n, sync)
        refs.append(r)
        outs.append(o)
        diffs.append(o - r)
    return statistics.median(refs), statistics.median(outs), statistics.median(diffs)


def blockscale_rows(calls: int, repeats: int, sync) -> list[dict]:
    """``gemm_a8w8_blockscale`` against the plain call of torch's block-scaled matmul (F.scaled_mm with the layouts
    cuBLASLt takes) on small shapes: torch-decided (M a multiple of 4, and M padded), and a Triton-decided shape
    whose eager calls run torch's (the eager switch)."""
    from aiter_gemm.blockscale import gemm_a8w8_blockscale, get_GEMM_A8W8_BLOCKSCALE_config
    from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl
    from aiter_gemm.kernels.a8w8_blockscale import quantize_blockscale

    if torch_impl.unavailable_reason(torch.device("cuda")) is not None:
        return []
    n, k, rows = 256, 512, []
    for case, m in (("torch", 1024), ("torch_padded", 1027), ("eager_switch", 128)):
        XQ, WQ, xs, ws = (t.cuda() for t in quantize_blockscale(torch.randn(m, k), torch.randn(n, k)))
        cfg = get_GEMM_A8W8_BLOCKSCALE_config(m, n, k)
        assert cfg["eager_libtype"] == "torch" and (cfg["libtype"] == "torch") == (case != "eager_switch"), cfg
        ops = (XQ, WQ, xs, ws)
        ref, ours, added = measure(lambda ops=ops: torch_impl.gemm_a8w8_blockscale_torch(*ops),
                                   lambda ops=ops: gemm_a8w8_blockscale(*ops), calls // 4, repeats, sync)
        rows.append(dict(path="eager gemm_a8w8_blockscale", case=case, M=m, N=n, K=k, torch_us=ref, call_us=ours,
                         added_us=added))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--out", default=None, help="CSV to write (default: results/dispatch_overhead_<device>.csv)")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    ident = aiter_gemm.current_device_identity(on_gpu=dev.type == "cuda")
    tmp = Path(tempfile.mkdtemp()) / "overhead_tuned.csv"
    dname = str(dtype)
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(BF16_TUNED_COLUMNS)
        for m in (8, 16):  # M=8: exact hit; M=13 pads to 16 at gl0
            w.writerow([ident.gfx, ident.cu_num, m, N, K, False, dname, dname, False, False, "torch", 0, 0, 1.0,
                        "F.linear", 0.0, 0.0, 0.0, "", ""])  # pad_m_min, timing: not set
        if dev.type == "cuda":  # a graph-timed skinny row: eager calls run plain F.linear (the eager switch)
            w.writerow([ident.gfx, ident.cu_num, 4, N, K, False, dname, dname, False, False, "skinny", 0, 1, 1.0,
                        "fma_BN8_BK64_SK1_W4_S1", 0.0, 0.0, 0.0, "", "graph"])
    os.environ["AITER_CONFIG_GEMM_BF16"] = str(tmp)
    aiter_gemm.reload_configs()

    b = torch.randn(N, K, device=dev, dtype=dtype)
    cases = {"exact": 8, "padded_gl0": 13, "default": 100}  # 100 pads to 112 / 128: no row
    rows = []
    for case, m in cases.items():
        a = torch.randn(m, K, device=dev, dtype=dtype)
        cfg = aiter_gemm.get_GEMM_A16W16_config(m, N, K, False, dtype, dtype)
        assert cfg["matched"] == case and cfg["libtype"] == "torch", cfg
        ref, ours, added = measure(lambda a=a: F.linear(a, b), lambda a=a: aiter_gemm.gemm_a16w16(a, b),
                                   args.calls, args.repeats, sync)
        rows.append(dict(path="eager gemm_a16w16", case=case, M=m, N=N, K=K, torch_us=ref, call_us=ours,
                         added_us=added))
    # A 3-D activation, as a model's linear layers get one (batch, tokens, K); and the module path: patch_linear's
    # TunedLinear against the nn.Linear it replaces (both pay the module call machinery).
    a3 = torch.randn(1, 8, K, device=dev, dtype=dtype)
    ref, ours, added = measure(lambda: F.linear(a3, b), lambda: aiter_gemm.gemm_a16w16(a3, b), args.calls,
                               args.repeats, sync)
    rows.append(dict(path="eager gemm_a16w16", case="exact_3d", M=8, N=N, K=K, torch_us=ref, call_us=ours,
                     added_us=added))
    from aiter_gemm.nn import TunedLinear

    linear = torch.nn.Linear(K, N, bias=False, device=dev, dtype=dtype)
    tuned = TunedLinear.from_linear(linear)
    with torch.no_grad():
        ref, ours, added = measure(lambda: linear(a3), lambda: tuned(a3), args.calls, args.repeats, sync)
    rows.append(dict(path="TunedLinear module", case="exact_3d", M=8, N=N, K=K, torch_us=ref, call_us=ours,
                     added_us=added))
    if dev.type == "cuda":  # decode through a skinny row outside capture: the eager switch's cost
        a4 = torch.randn(1, 4, K, device=dev, dtype=dtype)
        cfg = aiter_gemm.get_GEMM_A16W16_config(4, N, K, False, dtype, dtype)
        assert (cfg["libtype"], cfg["eager_libtype"]) == ("skinny", "torch"), cfg
        ref, ours, added = measure(lambda: F.linear(a4, b), lambda: aiter_gemm.gemm_a16w16(a4, b), args.calls,
                                   args.repeats, sync)
        rows.append(dict(path="eager gemm_a16w16", case="eager_switch_3d", M=4, N=N, K=K, torch_us=ref,
                         call_us=ours, added_us=added))
        with torch.no_grad():
            ref, ours, added = measure(lambda: linear(a4), lambda: tuned(a4), args.calls, args.repeats, sync)
        rows.append(dict(path="TunedLinear module", case="eager_switch_3d", M=4, N=N, K=K, torch_us=ref,
                         call_us=ours, added_us=added))
    if dev.type == "cuda":
        rows += blockscale_rows(args.calls, args.repeats, sync)
    a = torch.randn(8, K, device=dev, dtype=dtype)
    op = torch.ops.aiter_gemm.gemm_a16w16
    ref, ours, added = measure(lambda: F.linear(a, b), lambda: op(a, b), args.calls // 4, args.repeats, sync)
    rows.append(dict(path="torch.ops custom op", case="exact", M=8, N=N, K=K, torch_us=ref, call_us=ours,
                     added_us=added))

    name = torch.cuda.get_device_name() if dev.type == "cuda" else platform.processor() or platform.machine()
    from aiter_gemm import eager_ext, ops

    meta = dict(device=name, torch=torch.__version__, python=platform.python_version(),
                date=time.strftime("%Y-%m-%d"), calls=args.calls, repeats=args.repeats,
                eager_ext="loaded" if ops.EAGER_EXT is not None else eager_ext.status)
    out = Path(args.out or Path(__file__).parent / "results" / f"dispatch_overhead_{dev.type}.csv")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*meta, *rows[0]])
        w.writeheader()
        for r in rows:
            w.writerow({**meta, **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}})
    print(f"# {meta}")
    print(f"{'path':22} {'case':11} {'torch us':>9} {'ours us':>9} {'added us':>9}")
    for r in rows:
        print(f"{r['path']:22} {r['case']:11} {r['torch_us']:9.3f} {r['call_us']:9.3f} {r['added_us']:9.3f}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
