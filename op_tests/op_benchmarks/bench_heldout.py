"""Held-out benchmark (issue 13): is the tuned dispatch ever slower than the plain library call?

bf16 ``gemm_a16w16`` against ``F.linear`` on three sets, in CUDA-graph mode (GPU time, rotating buffers) and in eager
mode (a loop of calls: Python, dispatch and launch cost included), alternating the order between rounds:

* ``heldout``: the linears of models whose shapes are not in the shipped CSV (Qwen2.5-7B, Phi-3-mini, Gemma-2-9B,
  Llama-3.2-3B's qkv) at M values off the tuned grid;
* ``offgrid``: the shipped (N, K) at M values off the tuned grid (padded rows are what serves them);
* ``tuned``: every row of the shipped CSV on its own shape.

Each ratio is the median over paired rounds (one CUDA-graph replay, or one ~1.5 ms eager loop, per method per round,
the order alternating; graphs captured anew every 5 rounds; ``ratio_q1``/``ratio_q3`` give the spread): runs timed
apart drift by a few percent, and one capture of the same calls can replay steadily slower than another.

FP8 ``gemm_a8w8_blockscale`` against torch's block-scaled matmul (``gemm_a8w8_blockscale_torch``, cuBLASLt) and bf16
``F.linear`` on the DeepSeek-V3 (TP8) and Llama-3-70B shapes at off-grid M, graph and eager.

    python op_tests/op_benchmarks/bench_heldout.py --out $OUT/heldout [--sets heldout,offgrid,tuned,fp8]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import aiter_gemm  # noqa: E402
from aiter_gemm.backends.base import GemmProblem  # noqa: E402
from aiter_gemm.blockscale import gemm_a8w8_blockscale  # noqa: E402
from aiter_gemm.configs import load_table  # noqa: E402
from aiter_gemm.kernels import a8w8_blockscale_torch as torch_bs  # noqa: E402
from aiter_gemm.kernels.a8w8_blockscale import gemm_a8w8_blockscale_ref, quantize_blockscale  # noqa: E402
from aiter_gemm.settings import default_config_dir  # noqa: E402
from gradlib.timing import TimingConfig, cache_bytes, rotating_sets, time_paired  # noqa: E402

BF16 = torch.bfloat16
HELDOUT_MODELS = {  # (name, N, K) per projection: q/k/v fused, o, gate/up fused, down (vLLM layout, TP 1)
    "qwen2_5_7b": [(4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944)],
    "phi3_mini": [(9216, 3072), (3072, 3072), (16384, 3072), (3072, 8192)],
    "gemma2_9b": [(8192, 3584), (3584, 4096), (28672, 3584), (3584, 14336)],
    "llama3_2_3b": [(5120, 3072)],  # its o / gate_up / down are Phi-3-mini's
}
HELDOUT_MS = [1, 3, 5, 12, 24, 40, 100, 200, 333, 777, 1500, 3000, 6000]
OFFGRID_MS = [3, 24, 100, 333, 777, 1500, 3000]
FP8_NK = [(2112, 7168), (3072, 1536), (4096, 512), (7168, 2048), (4608, 7168), (7168, 2304), (512, 7168),
          (7168, 256), (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)]
FP8_MS = [3, 24, 100, 333, 777, 1500, 3000]
# One replay ~500 us of calls: identical F.linear calls in 300 us replays ranged 0.960-1.031 over 291 shapes (run 7),
# per-round quartiles up to 10% apart on 10 us kernels.
TIMING = TimingConfig(warmup=5, reps=9, target_us=500.0, budget_s=0.4)
GRAPH_PAIRS, EAGER_PAIRS = 41, 21  # odd medians over paired rounds: ~40 ms of replays, ~60 ms of eager loops
# Graphs captured anew every round: one capture can replay steadily slower than another (identical F.linear calls,
# run 6: 0.942-1.057 with a capture per 5 rounds), so a capture is a sample and each round takes a fresh one.
GRAPH_CAPTURES = GRAPH_PAIRS
COLUMNS = ("set", "model", "M", "N", "K", "method", "mode", "us", "ref_us", "ratio", "ratio_q1", "ratio_q3", "libtype",
           "eager_libtype", "matched", "rel_err", "rounds")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o = out.double()
    if not bool(torch.isfinite(o).all()):
        return math.inf
    return float(torch.linalg.vector_norm(o - ref.double()) / torch.linalg.vector_norm(ref.double()))


def eager_paired(calls: dict, n_sets: int, est_us: float, pairs: int) -> dict[str, list[float]]:
    """Per-call wall time of back-to-back eager calls (Python, dispatch and launch cost included) over the rotating
    sets, ``pairs`` rounds of one loop per method (about 1.5 ms each) in alternating order, as
    :func:`gradlib.timing.time_paired` does for graphs: host timings drift too, so only same-round samples compare."""
    n = int(max(10, min(300, 1500 / max(est_us, 1.0))))
    names = list(calls)
    out: dict[str, list[float]] = {k: [] for k in names}
    for name in names:  # warm-up: first calls decide and compile
        for i in range(n_sets):
            calls[name](i)
    for r in range(pairs):
        for name in (names if r % 2 == 0 else names[::-1]):
            fn = calls[name]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(n):
                fn(i % n_sets)
            torch.cuda.synchronize()
            out[name].append((time.perf_counter() - t0) / n * 1e6)
    return out


def compare(methods: dict, n_sets: int, eager_pairs: int = EAGER_PAIRS) -> tuple[dict, dict]:
    """(graph samples, eager samples) of every method, in paired rounds of alternating order."""
    g = time_paired(methods, n_sets, TIMING, GRAPH_PAIRS, GRAPH_CAPTURES)
    est = max(statistics.median(v) for v in g.values())
    return g, eager_paired(methods, n_sets, est, eager_pairs)


def paired(ref: list[float], us: list[float]) -> tuple[float, float, float]:
    """Median, 25th and 75th percentile of the per-round ratios ref / us (> 1: ``us`` is faster)."""
    q = statistics.quantiles([a / b for a, b in zip(ref, us)], n=4, method="inclusive")
    return q[1], q[0], q[2]


def result(ref: list[float], us: list[float]) -> dict[str, str]:
    ratio, lo, hi = paired(ref, us)
    return {"us": f"{statistics.median(us):.3f}", "ref_us": f"{statistics.median(ref):.3f}", "ratio": f"{ratio:.4f}",
            "ratio_q1": f"{lo:.4f}", "ratio_q3": f"{hi:.4f}", "rounds": len(us)}


class Bench:
    def __init__(self, out: Path, deadline_s: float, eager_pairs: int = EAGER_PAIRS) -> None:
        self.out, self.deadline, self.t0 = out, deadline_s, time.monotonic()
        self.eager_pairs = eager_pairs
        self.dev = torch.device("cuda")
        self.cache = cache_bytes(self.dev)
        self.rows: list[dict] = []
        self.skipped: list[str] = []

    def left(self) -> float:
        return self.deadline - (time.monotonic() - self.t0)

    def write(self) -> None:
        with open(self.out / "heldout.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
            w.writeheader()
            w.writerows(self.rows)

    def bf16(self, set_name: str, model: str, p: GemmProblem) -> None:
        gen = torch.Generator(device=self.dev).manual_seed(p.M * 31 + p.N + p.K)
        x = torch.randn(p.M, p.K, generator=gen, device=self.dev).to(BF16)
        w = (torch.randn(p.N, p.K, generator=gen, device=self.dev) / p.K ** 0.5).to(BF16)
        b = torch.randn(p.N, generator=gen, device=self.dev).to(BF16) if p.bias else None
        n = rotating_sets(p.min_bytes(), self.cache, torch.cuda.mem_get_info()[0])
        sets = [(x, w, b)] + [(x.clone(), w.clone(), None if b is None else b.clone()) for _ in range(n - 1)]
        ref = x.float() @ w.float().t() + (b.float() if b is not None else 0)
        err = rel_err(aiter_gemm.gemm_a16w16(x, w, b), ref)
        cfg = aiter_gemm.get_GEMM_A16W16_config(p.M, p.N, p.K, p.bias, BF16)
        g, e = compare({"F.linear": lambda i: F.linear(*sets[i]), "gemm_a16w16": lambda i: aiter_gemm.gemm_a16w16(
            *sets[i])}, n, self.eager_pairs)
        for mode, got in (("graph", g), ("eager", e)):
            self.rows.append({"set": set_name, "model": model, "M": p.M, "N": p.N, "K": p.K, "method": "gemm_a16w16",
                              "mode": mode, **result(got["F.linear"], got["gemm_a16w16"]),
                              "libtype": cfg["libtype"], "eager_libtype": cfg["eager_libtype"],
                              "matched": cfg["matched"], "rel_err": f"{err:.2e}"})
        gr, er = float(self.rows[-2]["ratio"]), float(self.rows[-1]["ratio"])
        print(f"{set_name:8} {model:12} M={p.M:5} N={p.N:5} K={p.K:5} {cfg['libtype']:>8}/{cfg['eager_libtype']:<8} "
              f"{cfg['matched']:>10} graph x{gr:.3f} eager x{er:.3f}", flush=True)

    def fp8(self, N: int, K: int, M: int) -> None:
        gen = torch.Generator(device=self.dev).manual_seed(M + N + K)
        x = torch.randn(M, K, generator=gen, device=self.dev)
        w = torch.randn(N, K, generator=gen, device=self.dev) / K ** 0.5
        XQ, WQ, xs, ws = quantize_blockscale(x, w)
        ref = gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)
        xb, wb = x.to(BF16), w.to(BF16)
        del x, w
        n = rotating_sets(M * K + N * K + 2 * M * N, self.cache, torch.cuda.mem_get_info()[0])
        sets = [(XQ, WQ, xs, ws, xb, wb)] + [(XQ.clone(), WQ.clone(), xs.clone(), ws.clone(), xb.clone(), wb.clone())
                                             for _ in range(n - 1)]
        err = rel_err(gemm_a8w8_blockscale(XQ, WQ, xs, ws), ref)
        cfg = aiter_gemm.get_GEMM_A8W8_BLOCKSCALE_config(M, N, K)
        methods = {"op": lambda i: gemm_a8w8_blockscale(*sets[i][:4]),
                   "bf16_F.linear": lambda i: F.linear(sets[i][4], sets[i][5])}
        if torch_bs.shape_error(M, N, K) is None:
            methods["torch_blockwise"] = lambda i: torch_bs.gemm_a8w8_blockscale_torch(*sets[i][:4])
        g, e = compare(methods, n, self.eager_pairs)
        line = []
        for mode, got in (("graph", g), ("eager", e)):
            for ref_name in [k for k in methods if k != "op"]:
                self.rows.append({"set": "fp8", "model": ref_name, "M": M, "N": N, "K": K, "method": "op",
                                  "mode": mode, **result(got[ref_name], got["op"]), "libtype": cfg["libtype"],
                                  "eager_libtype": cfg["eager_libtype"], "matched": cfg["matched"],
                                  "rel_err": f"{err:.2e}"})
                line.append(f"{mode} vs {ref_name} x{float(self.rows[-1]['ratio']):.3f}")
        print(f"fp8 M={M:5} N={N:5} K={K:5} {cfg['libtype']:>6}/{cfg['eager_libtype']:<6} " + ", ".join(line),
              flush=True)


def summary(rows: list[dict]) -> str:
    out = ["| set | vs | mode | shapes | geomean | min (shape) | below bar |", "|---|---|---|---:|---:|---|---:|"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["set"], r["model"] if r["set"] == "fp8" else "F.linear", r["mode"]), []).append(r)
    for (s, vs, mode), rs in sorted(groups.items()):
        ratios = [float(r["ratio"]) for r in rs]
        gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
        worst = min(rs, key=lambda r: float(r["ratio"]))
        # Issue 13's bars: graph 0.98 (FP8: "slower than torch's by more than 2%"), eager 0.97 (FP8 the same rule).
        bar = 0.97 if mode == "eager" else 0.98
        below = sum(float(r["ratio"]) < bar for r in rs)
        out.append(f"| {s} | {vs} | {mode} | {len(rs)} | {gm:.3f} | {float(worst['ratio']):.3f} "
                   f"({worst['M']}, {worst['N']}, {worst['K']}) | {below} < {bar} |")
    # bf16 shapes whose decision is plain F.linear in both modes time F.linear against itself: their spread is the
    # method's noise floor, the yardstick for the bars above.
    out += ["", "| identical calls (plain F.linear decisions) | mode | shapes | geomean | 5% | 95% | min | max |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for mode in ("graph", "eager"):
        aa = sorted(float(r["ratio"]) for r in rows if r["set"] != "fp8" and r["mode"] == mode
                    and r["libtype"] == r["eager_libtype"] == "torch")
        if len(aa) >= 2:
            q = statistics.quantiles(aa, n=20, method="inclusive")
            gm = math.exp(sum(map(math.log, aa)) / len(aa))
            out.append(f"| bf16 | {mode} | {len(aa)} | {gm:.3f} | {q[0]:.3f} | {q[-1]:.3f} | {aa[0]:.3f} | "
                       f"{aa[-1]:.3f} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="heldout_out")
    ap.add_argument("--sets", default="heldout,offgrid,tuned,fp8")
    ap.add_argument("--deadline", type=float, default=520.0)
    ap.add_argument("--eager_pairs", type=int, default=EAGER_PAIRS,
                    help=f"paired eager rounds per shape (default {EAGER_PAIRS}; more narrow a host-noisy median)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    bench = Bench(out, args.deadline, args.eager_pairs)
    ident = aiter_gemm.current_device_identity()
    sets = args.sets.split(",")
    work: list[tuple] = []
    if "heldout" in sets:
        work += [("heldout", m, GemmProblem(M, N, K)) for m, nks in HELDOUT_MODELS.items() for N, K in nks
                 for M in HELDOUT_MS]
    shipped = [r for r in load_table("GEMM_BF16", [default_config_dir() / "bf16_tuned_gemm.csv"])
               if r.gfx in (None, ident.gfx) and r.cu_num == ident.cu_num]
    if "offgrid" in sets:
        nks = sorted({(r.key[1], r.key[2]) for r in shipped})
        work += [("offgrid", "llama", GemmProblem(M, N, K)) for N, K in nks for M in OFFGRID_MS]
    if "tuned" in sets:
        work += [("tuned", "llama", GemmProblem(*r.key[:3], r.key[3], r.key[4], r.key[5])) for r in shipped]
    fp8 = [(N, K, M) for N, K in FP8_NK for M in FP8_MS] if "fp8" in sets else []
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "timing": TIMING.__dict__, "eager_pairs": args.eager_pairs, "bf16_shapes": len(work),
            "fp8_shapes": len(fp8)}
    try:
        for item in work:
            if bench.left() < 60 * (1 if not fp8 else 2):
                bench.skipped.append(str(item))
                continue
            bench.bf16(*item)
        for item in fp8:
            if bench.left() < 5:
                bench.skipped.append(str(item))
                continue
            bench.fp8(*item)
    finally:
        bench.write()
        meta["skipped"] = bench.skipped
        meta["wall_s"] = round(time.monotonic() - bench.t0, 1)
        (out / "heldout_meta.json").write_text(json.dumps(meta, indent=1))
        table = summary(bench.rows)
        (out / "heldout_summary.md").write_text(table + "\n")
        print(table)
        print(f"skipped {len(bench.skipped)}; wall {meta['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
