"""Which single ``gemv`` config should be the skinny default at M = 1 (and 2, 3, 4), and where may it claim a shape
from F.linear?

Per M of ``--m``, on the shipped Llama (N, K) and the held-out models' of ``sweep_defaults_h100.py`` (Qwen2.5-7B,
Phi-3-mini, Gemma-2-9B, Llama-3.2-3B): F.linear, the current default (``default_skinny_config``) and a few gemv
candidates (M = 1: the best single configs of ``explore_skinny_inductor`` run 3 across its 8 shapes; M >= 2: the
winners of its gemv runs at M = 2 and 4, results/skinny_inductor_h100/gemv_m2_m8*), each checked against float32,
then timed in paired rounds (``gradlib.timing.time_paired``: CUDA-graph replays over rotating buffers > 2x L2, order
alternating, fresh captures). Ratios are medians of per-round F.linear / method.

    python -m op_tests.op_benchmarks.sweep_gemv_default_h100 --out $OUT [--m 1,2,3,4]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from aiter_gemm.kernels.skinny import SkinnyConfig, default_skinny_config, launch_skinny
from gradlib.timing import TimingConfig, cache_bytes, rotating_sets, time_paired
from op_tests.op_benchmarks.sweep_defaults_h100 import HELDOUT_NK, SHIPPED_NK

CANDIDATES = ("gemv_BN1_BK512_SK1_W4_S1_EF", "gemv_BN1_BK1024_SK1_W4_S1_EF", "gemv_BN1_BK2048_SK1_W4_S1_EF",
              "gemv_BN2_BK1024_SK1_W4_S1_EF", "gemv_BN1_BK2048_SK1_W8_S1_EF")
# M >= 2: the tiles that won a shape at M = 2 or 4 in the gemv explorations (BK up to 2048: K is 3072 and up here).
CANDIDATES_ROWS = ("gemv_BN1_BK2048_SK1_W8_S1_EF", "gemv_BN1_BK2048_SK1_W4_S1_EF", "gemv_BN2_BK2048_SK1_W8_S1_EF",
                   "gemv_BN2_BK1024_SK1_W4_S1_EF", "gemv_BN1_BK512_SK1_W2_S1_EF", "gemv_BN2_BK2048_SK1_W8_S1")
TIMING = TimingConfig(warmup=5, reps=9, target_us=500.0, budget_s=0.4)
TOL = 2e-2  # bf16 output vs float32, relative to the largest |value|


def candidates(m: int) -> tuple[str, ...]:
    return CANDIDATES if m == 1 else CANDIDATES_ROWS


def sweep_shape(m: int, n: int, k: int, dev: torch.device, sms: int, pairs: int) -> list[dict]:
    n_sets = rotating_sets((n * k + m * k + m * n) * 2, cache_bytes(dev), torch.cuda.mem_get_info(dev)[0])
    gen = torch.Generator(device=dev).manual_seed(n + k)
    A = [torch.randn(m, k, device=dev, generator=gen).bfloat16() for _ in range(n_sets)]
    W = [(torch.randn(n, k, device=dev, generator=gen) / math.sqrt(k)).bfloat16() for _ in range(n_sets)]
    ref = A[0].float() @ W[0].float().t()
    scale = ref.abs().max().item()
    default = default_skinny_config(m, n, k, sms)
    configs = {"default": default, **{c: SkinnyConfig.from_name(c) for c in candidates(m)}}
    methods = {"F.linear": lambda i: F.linear(A[i], W[i])}
    errs = {"F.linear": (F.linear(A[0], W[0]).float() - ref).abs().max().item() / scale}
    for name, cfg in configs.items():
        errs[name] = (launch_skinny(A[0], W[0], None, torch.bfloat16, cfg).float() - ref).abs().max().item() / scale
        if errs[name] < TOL:
            methods[name] = lambda i, cfg=cfg: launch_skinny(A[i], W[i], None, torch.bfloat16, cfg)
    samples = time_paired(methods, n_sets, TIMING, pairs, captures=3)
    base = samples["F.linear"]
    rows = []
    for name in configs | {"F.linear": None}:
        if name not in samples:
            rows.append({"M": m, "N": n, "K": k, "method": name, "config": configs[name].name, "rel_err": errs[name],
                         "us": "", "speedup": "", "q1": "", "q3": ""})
            continue
        ratios = [a / b for a, b in zip(base, samples[name])]
        q1, q2, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
        rows.append({"M": m, "N": n, "K": k, "method": name,
                     "config": configs[name].name if name in configs else "F.linear", "rel_err": errs[name],
                     "us": statistics.median(samples[name]), "speedup": q2, "q1": q1, "q3": q3})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--m", default="1", help="comma list of M (default 1)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    t0 = time.monotonic()
    rows: list[dict] = []
    ms = [int(v) for v in args.m.split(",")]
    sets = (("shipped", SHIPPED_NK), ("heldout", HELDOUT_NK))
    for m, (label, shapes) in ((mm, st) for mm in ms for st in sets):
        for n, k in shapes:
            got = sweep_shape(m, n, k, dev, sms, args.pairs)
            for r in got:
                r["set"] = label
            rows += got
            print(f"{label} M={m} N={n} K={k}: " + "; ".join(
                f"{r['method']} {r['us']:.2f} us ({r['speedup']:.3f}x)" for r in got if r["us"] != ""), flush=True)
    with open(out / "sweep_gemv_default.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["set", "M", "N", "K", "method", "config", "rel_err", "us", "speedup", "q1",
                                          "q3"])
        w.writeheader()
        w.writerows(rows)
    for m, name in ((mm, name) for mm in ms for name in ("default", *candidates(mm))):
        sp = [r["speedup"] for r in rows if r["M"] == m and r["method"] == name and r["speedup"] != ""]
        if sp:
            print(f"M={m} {name}: geomean {math.exp(sum(map(math.log, sp)) / len(sp)):.3f}x F.linear over {len(sp)} "
                  f"shapes, min {min(sp):.3f}")
    env = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "seconds": time.monotonic() - t0}
    (out / "env.json").write_text(json.dumps(env, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
