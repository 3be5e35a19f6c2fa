"""Tuned dispatch against ``F.linear``, ``torch.compile(max-autotune)`` and the roofline, per shape.

Per shape, timed in rounds of alternating order (``--rounds``, median per method, so clock drift biases no method):
``F.linear``; ``gemm_a16w16`` (the whole dispatch path); ``torch.compile(mode="max-autotune-no-cudagraphs")``
of an ``F.linear`` module (``--compile_m`` limits which M get it: each compile autotunes for tens of seconds); and,
from a tuner ``--profile_file``, the best candidate of each backend. GPU times are CUDA-graph replays over rotating
buffer sets spanning 2x the L2 (medians; :mod:`gradlib.timing`), plus eager per-call times that include Python and
launch cost. The peak bf16 matmul rate and copy bandwidth are measured once per run and every time is reported as a
fraction of the roofline max(flops / peak, bytes / bandwidth).

    python -m op_tests.op_benchmarks.bench_tuned_gemm --model_dir configs/model_configs/llama3_8b --nsets 1,16,128
    python -m op_tests.op_benchmarks.bench_tuned_gemm --shapes my_untuned.csv --no_compile
    python -m op_tests.op_benchmarks.bench_tuned_gemm --plot results/NVIDIA_H100_80GB_HBM3/tuned_gemm.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import aiter_gemm
from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.configs import load_untuned
from gradlib.models import load_arch, model_problems, projections
from gradlib.timing import FULL, cache_bytes, interleaved, rotating_sets, time_runner

RESULTS = Path(__file__).parent / "results"
log = logging.getLogger(__name__)
COLUMNS = ("model", "M", "N", "K", "bias", "flinear_us", "tuned_us", "tuned_libtype", "tuned_matched", "compile_us",
           "flinear_eager_us", "tuned_eager_us", "roofline_us", "flinear_roof", "tuned_roof", "compile_roof",
           "speedup_tuned", "speedup_compile", "best_by_backend")


def measure_peaks(device: torch.device) -> dict[str, float]:
    """Peak bf16 matmul rate (8192^3, random data) and device-to-device copy bandwidth (read + write bytes)."""
    if device.type != "cuda":
        return {"peak_flops": 1e11, "peak_bw": 2e10, "peaks_measured": 0.0}  # CPU smoke runs: nominal, not reported
    n = 8192

    def timed(fn, reps=10) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(reps):
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e-3)
        return statistics.median(times)

    def matmul_rate() -> float:
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        return 2 * n**3 / timed(lambda: torch.mm(a, b))

    def copy_rate() -> float:
        src = torch.randn(1 << 28, device=device)  # 1 GiB, random (not zeros)
        dst = torch.empty_like(src)
        return 2 * src.numel() * src.element_size() / timed(lambda: dst.copy_(src))

    flops, bw = matmul_rate(), copy_rate()
    torch.cuda.empty_cache()
    return {"peak_flops": flops, "peak_bw": bw, "peaks_measured": 1.0}


def roofline_us(p: GemmProblem, peaks: dict[str, float]) -> float:
    return max(p.flops / peaks["peak_flops"], p.min_bytes() / peaks["peak_bw"]) * 1e6


def shape_sets(args) -> list[tuple[str, GemmProblem]]:
    """(model label, problem) pairs from ``--shapes`` CSVs and/or ``--model_dir`` directories."""
    dtype = aiter_gemm.dtypes.parse_dtype(args.dtype)
    out: list[tuple[str, GemmProblem]] = []
    for path in args.shapes:
        for M, N, K, bias, dt, ot, sab, bpre in load_untuned(path):
            out.append((Path(path).stem, GemmProblem(M, N, K, bias, dt, ot, sab, bpre)))
    nsets = [int(x) for x in args.nsets.split(",")] if args.nsets else [1, 16, 128, 1024]
    for mdir, tp in zip(args.model_dir, args.tp or [1] * len(args.model_dir)):
        arch = load_arch(mdir)
        probs = model_problems(arch, tp, nsets, dtype=dtype)
        if not args.lm_head:
            head = projections(arch, tp)[-1]
            probs = [p for p in probs if (p.N, p.K) != (head.N, head.K)]
        out.extend((f"{Path(mdir).name}_tp{tp}", p) for p in probs)
    return out


class Inputs:
    """Rotating (x, w, bias) sets for one shape, spanning 2x the last-level cache."""

    def __init__(self, p: GemmProblem, device: torch.device, gen: torch.Generator) -> None:
        set_bytes = p.min_bytes()
        free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
        self.n = rotating_sets(set_bytes, cache_bytes(device), free)
        kw = dict(device=device, dtype=p.dtype)
        self.x = [torch.randn(p.M, p.K, generator=gen, **kw) for _ in range(self.n)]
        self.w = [torch.randn(p.N, p.K, generator=gen, **kw) * p.K**-0.5 for _ in range(self.n)]
        self.b = [torch.randn(p.N, generator=gen, **kw) if p.bias else None for _ in range(self.n)]


def eager_us(fn, inputs: Inputs, device: torch.device, calls: int = 200) -> float:
    """Per-call wall time of back-to-back eager calls (launch and Python cost included), median of 5."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for i in range(inputs.n):
        fn(i)
    samples = []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        for i in range(calls):
            fn(i % inputs.n)
        sync()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def profile_best(path: str | None) -> dict[tuple, dict[str, float]]:
    """Best phase-2 time per backend per (M, N, K, bias) from a tuner ``--profile_file``."""
    best: dict[tuple, dict[str, float]] = {}
    if not path:
        return best
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r.get("phase") != "full" or r.get("status") != "ok":
                continue
            key = (int(r["M"]), int(r["N"]), int(r["K"]), r["bias"] == "True")
            us = float(r["us"])
            d = best.setdefault(key, {})
            d[r["libtype"]] = min(us, d.get(r["libtype"], math.inf))
    return best


def bench_shape(label: str, p: GemmProblem, device: torch.device, peaks, args, best) -> dict:
    gen = torch.Generator(device=device).manual_seed(p.M * 31 + p.N)
    inp = Inputs(p, device, gen)
    lin = lambda i: F.linear(inp.x[i], inp.w[i], inp.b[i])
    tuned = lambda i: aiter_gemm.gemm_a16w16(inp.x[i], inp.w[i], inp.b[i])
    ref = F.linear(inp.x[0].float(), inp.w[0].float(), None if inp.b[0] is None else inp.b[0].float())
    err = (tuned(0).float() - ref).norm() / ref.norm().clamp_min(1e-30)
    if not err < 2e-2:
        raise AssertionError(f"gemm_a16w16 wrong on M={p.M} N={p.N} K={p.K}: relative error {err:.3g}")
    cfg = aiter_gemm.get_GEMM_A16W16_config(p.M, p.N, p.K, p.bias, p.dtype, p.otype)
    row = dict(model=label, M=p.M, N=p.N, K=p.K, bias=p.bias, tuned_libtype=cfg["libtype"],
               tuned_matched=cfg["matched"])
    fns = {"flinear": lin, "tuned": tuned}
    want_compile = not args.no_compile and device.type == "cuda" and (not args.compile_m or p.M in args.compile_m)
    if want_compile and time.monotonic() - args.started > args.compile_budget_s:
        log.warning("compile budget (%s s) spent: no max-autotune for M=%d N=%d K=%d", args.compile_budget_s,
                    p.M, p.N, p.K)
    elif want_compile:
        torch._dynamo.reset()
        compiled = torch.compile(lambda x, w, b: F.linear(x, w, b), mode="max-autotune-no-cudagraphs",
                                 dynamic=False)
        fns["compile"] = lambda i: compiled(inp.x[i], inp.w[i], inp.b[i])
    # Round-robin rounds, median per method: a GPU that heats up and clocks down over a shape's measurements (seen
    # on H100: the same F.linear kernel measured 5-10% slower when timed second on M >= 512, N = 28672) would
    # otherwise bias whichever method is timed later.
    # The order alternates between rounds (gradlib.timing.interleaved), so no method is always timed first.
    measures = {k: (lambda fn=fn: time_runner(fn, inp.n, device, FULL).us) for k, fn in fns.items()}
    measures.update({f"eager_{k}": (lambda k=k: eager_us(fns[k], inp, device)) for k in ("flinear", "tuned")})
    timed = interleaved(measures, args.rounds)
    samples = {k: timed[k] for k in fns}
    eager = {k: timed[f"eager_{k}"] for k in ("flinear", "tuned")}
    row["compile_us"] = math.nan
    for k, v in samples.items():
        row[f"{k}_us"] = statistics.median(v)
    for k, v in eager.items():
        row[f"{k}_eager_us"] = statistics.median(v)
    roof = roofline_us(p, peaks)
    row["roofline_us"] = roof
    for k in ("flinear", "tuned", "compile"):
        row[f"{k}_roof"] = roof / row[f"{k}_us"] if row[f"{k}_us"] == row[f"{k}_us"] else math.nan
    row["speedup_tuned"] = row["flinear_us"] / row["tuned_us"]
    row["speedup_compile"] = row["flinear_us"] / row["compile_us"]
    row["best_by_backend"] = json.dumps({k: round(v, 3) for k, v in best.get((p.M, p.N, p.K, p.bias), {}).items()})
    return row


def write_rows(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()})


def geomean(xs) -> float:
    xs = [x for x in xs if x == x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"GPU {meta['device']}, driver {meta.get('driver', '-')}, torch {meta['torch']}, triton "
             f"{meta['triton']}, {meta['date']}; peak {meta['peak_flops'] / 1e12:.0f} TFLOP/s, "
             f"{meta['peak_bw'] / 1e12:.2f} TB/s "
             f"({'measured' if meta['peaks_measured'] else 'nominal: CPU smoke run'}). Times in us (CUDA-graph "
             "replay, rotating buffers > 2x L2, median); roof = roofline time / time.", "",
             "| model | M | N | K | F.linear | tuned (libtype) | max-autotune | tuned/F.linear | F.linear roof "
             "| tuned roof |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        comp = f"{r['compile_us']:.2f}" if r["compile_us"] == r["compile_us"] else "-"
        lines.append(f"| {r['model']} | {r['M']} | {r['N']} | {r['K']} | {r['flinear_us']:.2f} | "
                     f"{r['tuned_us']:.2f} ({r['tuned_libtype']}) | {comp} | {r['speedup_tuned']:.3f}x | "
                     f"{r['flinear_roof']:.2f} | {r['tuned_roof']:.2f} |")
    comp_rows = [r for r in rows if r["compile_us"] == r["compile_us"]]
    lines += ["", f"Geomean speedup over F.linear: tuned {geomean(r['speedup_tuned'] for r in rows):.3f}x over "
              f"{len(rows)} shapes (min {min(r['speedup_tuned'] for r in rows):.3f}x); "
              f"on the {len(comp_rows)} shapes with max-autotune: tuned "
              f"{geomean(r['speedup_tuned'] for r in comp_rows):.3f}x, max-autotune "
              f"{geomean(r['speedup_compile'] for r in comp_rows):.3f}x. Geomean fraction of roofline: F.linear "
              f"{geomean(r['flinear_roof'] for r in rows):.3f}, tuned {geomean(r['tuned_roof'] for r in rows):.3f}."]
    return "\n".join(lines) + "\n"


def plot(csv_path: Path) -> list[Path]:
    """Speedup over F.linear by M per (N, K), and fraction of roofline by M, as PNGs beside the CSV."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path, newline="") as f:
        rows = [r for r in csv.DictReader(f)]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], int(r["N"]), int(r["K"])), []).append(r)
    outs = []
    for fname, ykey, ylabel in (("speedup.png", "speedup_tuned", "speedup of gemm_a16w16 over F.linear"),
                                ("roofline.png", "tuned_roof", "gemm_a16w16: fraction of roofline")):
        fig, ax = plt.subplots(figsize=(9, 5.5))
        for (model, n, k), rs in sorted(groups.items()):
            rs.sort(key=lambda r: int(r["M"]))
            ax.plot([int(r["M"]) for r in rs], [float(r[ykey]) for r in rs], marker="o", label=f"{model} N={n} K={k}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel(ylabel)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        out = csv_path.parent / fname
        fig.savefig(out, dpi=110)
        plt.close(fig)
        outs.append(out)
    return outs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", default=[], help="untuned shape CSVs")
    ap.add_argument("--model_dir", nargs="*", default=[], help="model folders with config.json")
    ap.add_argument("--tp", nargs="*", type=int, default=None, help="tensor parallel size per --model_dir")
    ap.add_argument("--nsets", default=None, help="token counts M for --model_dir (default 1,16,128,1024)")
    ap.add_argument("--lm_head", action="store_true", help="include the lm_head projection")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no_compile", action="store_true", help="skip torch.compile max-autotune")
    ap.add_argument("--compile_m", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="only these M get max-autotune (each compile takes tens of seconds)")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds per shape, alternating the order (median)")
    ap.add_argument("--compile_budget_s", type=float, default=math.inf,
                    help="stop compiling max-autotune candidates once the run has lasted this long (seconds)")
    ap.add_argument("--profile_file", default=None, help="tuner profile CSV: best time of each backend per shape")
    ap.add_argument("--out_dir", default=None, help="default: results/<gpu name>/")
    ap.add_argument("--plot", default=None, help="only draw the PNGs of an existing result CSV")
    args = ap.parse_args(argv)
    if args.plot:
        for p in plot(Path(args.plot)):
            print(f"wrote {p}")
        return 0
    args.started = time.monotonic()
    device = torch.device(args.device)
    shapes = shape_sets(args)
    if not shapes:
        ap.error("no shapes: give --shapes and/or --model_dir")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    import triton

    driver = "-"
    if device.type == "cuda":
        import subprocess

        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True).stdout.strip().splitlines()[0:1] or ["-"]
        driver = driver[0]
    meta = dict(device=name, driver=driver, torch=torch.__version__, triton=triton.__version__,
                date=time.strftime("%Y-%m-%d"),
                python=platform.python_version(), cuda=torch.version.cuda or "-",
                **measure_peaks(device))
    best = profile_best(args.profile_file)
    out_dir = Path(args.out_dir) if args.out_dir else RESULTS / name.replace(" ", "_")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tuned_gemm_meta.json").write_text(json.dumps(meta, indent=1))
    rows = []
    for i, (label, p) in enumerate(shapes):
        rows.append(bench_shape(label, p, device, meta, args, best))
        r = rows[-1]
        print(f"[{i + 1}/{len(shapes)}] {label} M={p.M} N={p.N} K={p.K}: F.linear {r['flinear_us']:.2f} us, "
              f"tuned {r['tuned_us']:.2f} us ({r['tuned_libtype']}, {r['tuned_matched']}), compile "
              f"{r['compile_us']:.2f} us, tuned roof {r['tuned_roof']:.2f}", flush=True)
        write_rows(out_dir / "tuned_gemm.csv", rows)  # after every shape: a run cut short keeps what it measured
    md = markdown(rows, meta)
    (out_dir / "tuned_gemm.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
