"""Benchmark ``torch`` (F.linear) vs the ``triton`` and ``skinny`` backends on Llama-3 decode/prefill GEMM shapes.

Timing: every candidate is checked against a float32 reference on fresh random inputs, then captured in a CUDA graph
that cycles through rotating (A, B) buffer sets whose B alone totals >= 2x the L2 (so weights come from HBM), replayed
15 times; the median replay time over the calls in the graph is the per-GEMM time. % of roofline =
max(flops / 790e12, bytes / 3.0e12) / time (H100 measured peaks: common.md), bytes = A + B + C once each.

Modes (GPU):
  explore  time (most of) each backend's config space on a subset of shapes to find good configs (writes every row);
  full     the issue's table: 8 shapes x 12 M; torch, triton (best of a short list from explore + JSON/default config),
           skinny (M <= 16: heuristic default + best of a short list).
Modes (offline, on CSVs written by ``full``; the first --csv is the primary run):
  table    print the BENCHMARKS.md markdown table;
  json     write configs/triton/{arch}-GEMM-A16W16[-N=..-K=..].json from the best mean time over all --csv runs.
Kernels are compiled first in parallel worker processes (Triton's disk cache), then timed in the main process.

  python op_tests/op_benchmarks/bench_triton_skinny.py --mode full --out results_dir [--shortlist file.json]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

PEAK_FLOPS = 790e12  # bf16 dense, measured on the H100 (common.md)
PEAK_BW = 3.0e12  # device-to-device copy, bytes read + written (common.md)
SHAPES = {  # (N, K) of nn.Linear weights
    "llama3.1-8b": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
    "llama3-70b-tp8": [(1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584)],
}
MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096]
COLUMNS = ["mode", "model", "M", "N", "K", "impl", "config", "us", "rel_err", "tflops", "gbps", "pct_roofline",
           "floor_us"]


def floor_us(M: int, N: int, K: int) -> float:
    return max(2 * M * N * K / PEAK_FLOPS, ((M * K + N * K) * 2 + M * N * 2) / PEAK_BW) * 1e6


def make_runner(impl: str, name: str, cu: int):
    """A callable (a, b) -> out for one implementation/config."""
    if impl == "torch":
        return lambda a, b: F.linear(a, b)
    if impl == "read":  # streams B once (a float32 sum): the bandwidth a GEMV can hope for, launch cost included
        return lambda a, b: b.sum(dtype=torch.float32)
    if impl == "triton":
        from aiter_gemm.backends.triton import make_runner as mk
        from aiter_gemm.kernels.gemm_a16w16 import GemmConfig
        run = mk(GemmConfig.from_name(name), cu)
    else:
        from aiter_gemm.backends.skinny import make_runner as mk
        from aiter_gemm.kernels.skinny import SkinnyConfig
        run = mk(SkinnyConfig.from_name(name))
    return lambda a, b: run(a, b, None, torch.bfloat16, None, None, None)


def _warm_worker(tasks: list[tuple[int, int, int, str, str]]) -> list[tuple[str, str, str]]:
    """Compile (run once) each task's kernel; return (impl, name, error) for those that fail."""
    torch.cuda.init()
    cu = torch.cuda.get_device_properties(0).multi_processor_count
    bad, cache = [], {}
    for M, N, K, impl, name in tasks:
        key = (M, N, K)
        if key not in cache:
            cache.clear()
            cache[key] = (torch.randn(M, K, dtype=torch.bfloat16, device="cuda"),
                          torch.randn(N, K, dtype=torch.bfloat16, device="cuda"))
        try:
            make_runner(impl, name, cu)(*cache[key])
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a config that cannot compile is reported and skipped
            bad.append((impl, name, f"{type(exc).__name__}: {str(exc)[:200]}"))
    return bad


def precompile(tasks, workers: int) -> set[tuple[str, str]]:
    """Compile all (M, N, K, impl, name) tasks in ``workers`` processes; the set of (impl, name) that failed."""
    tasks = sorted(set(t for t in tasks if t[3] in ("triton", "skinny")), key=lambda t: (t[0], t[1], t[2]))
    if not tasks:
        return set()
    # One config's compiles (all its M specialisations) go to one worker, so no two workers compile the same kernel.
    chunks: list[list] = [[] for _ in range(workers)]
    for t in tasks:
        chunks[zlib.crc32(f"{t[3]}:{t[4]}".encode()) % workers].append(t)
    t0 = time.time()
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        bad = [b for res in pool.map(_warm_worker, chunks) for b in res]
    print(f"precompiled {len(tasks)} tasks in {time.time() - t0:.1f}s; {len(bad)} failed", flush=True)
    for impl, name, err in sorted(set(bad))[:20]:
        print(f"  FAILED {impl} {name}: {err}", flush=True)
    return {(i, n) for i, n, _ in bad}


class Bench:
    """Rotating input sets per shape, correctness check and CUDA-graph timing."""

    def __init__(self) -> None:
        props = torch.cuda.get_device_properties(0)
        self.cu = props.multi_processor_count
        self.l2 = getattr(props, "L2_cache_size", 50 * 2**20) or 50 * 2**20
        self.key = None
        self.sets: list[tuple[torch.Tensor, torch.Tensor]] = []

    def use_shape(self, M: int, N: int, K: int) -> None:
        if self.key == (M, N, K):
            return
        self.sets = []
        torch.cuda.empty_cache()
        nbuf = max(2, math.ceil(2 * self.l2 / (N * K * 2)))
        self.sets = [(torch.randn(M, K, dtype=torch.bfloat16, device="cuda"),
                      torch.randn(N, K, dtype=torch.bfloat16, device="cuda")) for _ in range(nbuf)]
        self.key = (M, N, K)

    def check(self, fn, M: int, N: int, K: int) -> float:
        """Relative Frobenius error on fresh inputs against a float32 reference (TF32 off)."""
        a = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(N, K, dtype=torch.bfloat16, device="cuda")
        out = fn(a, b)
        ref = a.float() @ b.float().t()
        if not torch.isfinite(out).all():
            return float("inf")
        return ((out.float() - ref).norm() / ref.norm()).item()

    def time(self, fn, M: int, N: int, K: int) -> float:
        """Median microseconds per GEMM from CUDA-graph replays over the rotating sets."""
        sets = self.sets
        reps = max(1, min(64 // len(sets), math.ceil(1000 / (floor_us(M, N, K) * len(sets)))))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for a, b in sets:
                fn(a, b)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                for a, b in sets:
                    fn(a, b)
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(15):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / (reps * len(sets)))
        del graph
        return statistics.median(times)


def row(mode, model, M, N, K, impl, name, us, err) -> dict:
    fl = floor_us(M, N, K)
    return {"mode": mode, "model": model, "M": M, "N": N, "K": K, "impl": impl, "config": name,
            "us": round(us, 3), "rel_err": f"{err:.2e}", "tflops": round(2 * M * N * K / us / 1e6, 1),
            "gbps": round(((M * K + N * K) * 2 + M * N * 2) / us / 1e3, 1),
            "pct_roofline": round(100 * fl / us, 1), "floor_us": round(fl, 3)}


def run_points(mode: str, points, out_csv: Path, workers: int, deadline: float) -> list[dict]:
    """points: list of (model, M, N, K, [(impl, name), ...]); time all, append rows to out_csv as they come."""
    bad = precompile([(M, N, K, impl, name) for _, M, N, K, cands in points for impl, name in cands], workers)
    bench = Bench()
    rows: list[dict] = []
    new = not out_csv.exists()
    with out_csv.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, COLUMNS)
        if new:
            writer.writeheader()
        for model, M, N, K, cands in sorted(points, key=lambda p: (p[4][-1][0] != "skinny", p[2], p[3], p[1])):
            if time.time() > deadline:
                print(f"deadline reached; skipping remaining points from {model} M={M} N={N} K={K}", flush=True)
                break
            bench.use_shape(M, N, K)
            for impl, name in cands:
                if (impl, name) in bad:
                    continue
                fn = make_runner(impl, name, bench.cu)
                try:
                    err = 0.0 if impl == "read" else bench.check(fn, M, N, K)
                    us = bench.time(fn, M, N, K)
                except Exception as exc:  # noqa: BLE001 - record and go on
                    print(f"ERROR {impl} {name} M={M} N={N} K={K}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                r = row(mode, model, M, N, K, impl, name, us, err)
                if err > 1e-2:
                    r["config"] += "!WRONG"
                    print(f"WRONG RESULT {impl} {name} M={M} N={N} K={K}: rel_err {err:.3e}", flush=True)
                writer.writerow(r)
                rows.append(r)
            fh.flush()
    return rows


def _skinny_default(M, N, K, cu) -> str:
    from aiter_gemm.kernels.skinny import default_skinny_config
    return default_skinny_config(M, N, K, cu).name


def _triton_json(M, N, K) -> str:
    from aiter_gemm.backends.base import GemmProblem, Solution
    from aiter_gemm.backends.triton import select_config
    return select_config(GemmProblem(M, N, K), Solution("triton"), "sm_90").name


def _explore_skinny(c) -> bool:
    """The part of the skinny space explored on the GPU: all one-pass tiles, a slice of the split-K ones."""
    if not c.variant.splits_k:
        return c.num_warps == 4 or not c.variant.use_dot
    return c.num_warps == 4 and c.NUM_KSPLIT <= 8 and c.BLOCK_SIZE_K in (256, 512) and c.num_stages in (1, 3)


EXPLORE_TRITON_SHAPES = [(4096, 4096), (28672, 4096), (1280, 8192)]


def explore_points(cu: int, skinny_ms, triton_ms) -> list:
    from aiter_gemm.backends import skinny as sb
    from aiter_gemm.backends import triton as tb
    points = []
    shapes = [(m, nk) for m, lst in SHAPES.items() for nk in lst]
    for model, (N, K) in shapes:
        for M in skinny_ms:
            space = [c for c in sb.config_space(M, N, K, "sm_90", cu) if _explore_skinny(c)]
            points.append((model, M, N, K, [("torch", "F.linear")] + [("skinny", c.name) for c in space]))
        if (N, K) not in EXPLORE_TRITON_SHAPES:
            continue
        for M in triton_ms:
            cands = [("torch", "F.linear")] + [("triton", c.name) for c in tb.config_space(M, N, K, "sm_90", cu)]
            points.append((model, M, N, K, cands))
    return points


def full_points(cu: int, shortlist: dict) -> list:
    """Every shape x M: torch; triton JSON/default + the shortlist of its space for that M; for M <= 16 skinny
    heuristic default + the shortlist of its space; at M=1 also a plain read of B (bandwidth reference)."""
    from aiter_gemm.backends import skinny as sb
    from aiter_gemm.backends import triton as tb
    points = []
    for model, lst in SHAPES.items():
        for N, K in lst:
            for M in MS:
                cands = [("torch", "F.linear"), ("triton", _triton_json(M, N, K))]
                space = {c.name for c in tb.config_space(M, N, K, "sm_90", cu)}
                cands += [("triton", n) for n in shortlist.get("triton", {}).get(str(M), []) if n in space]
                if M <= 16:
                    cands.append(("skinny", _skinny_default(M, N, K, cu)))
                    space = {c.name for c in sb.config_space(M, N, K, "sm_90", cu)}
                    cands += [("skinny", n) for n in shortlist.get("skinny", {}).get(str(M), []) if n in space]
                if M == 1:
                    cands.append(("read", "b.sum"))
                points.append((model, M, N, K, list(dict.fromkeys(cands))))
    # A GEMM too small to matter (256 KiB of weight read from L2 after the first call): its time is the fixed cost of
    # one GEMM in this harness (graph node launch, ramp, tail), which the large shapes also pay.
    points.append(("probe", 1, 256, 256, [("torch", "F.linear"), ("triton", _triton_json(1, 256, 256)),
                                          ("skinny", _skinny_default(1, 256, 256, cu))]))
    return points


def environment() -> dict:
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        smi = "nvidia-smi unavailable"
    import triton
    props = torch.cuda.get_device_properties(0)
    return {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": props.name, "sms": props.multi_processor_count,
            "l2_bytes": getattr(props, "L2_cache_size", None), "nvidia_smi": smi, "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton.__version__, "peak_flops": PEAK_FLOPS, "peak_bw": PEAK_BW}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("explore", "full", "table", "json"), required=True)
    ap.add_argument("--out", type=Path, help="directory for the CSV and environment JSON (GPU modes)")
    ap.add_argument("--csv", type=Path, nargs="+", help="full-mode CSVs (table/json modes)")
    ap.add_argument("--arch", default="sm_90", help="json mode: arch of the written files")
    ap.add_argument("--shortlist", type=Path, help="JSON {triton: {M: [names]}, skinny: {M: [names]}} (full mode)")
    ap.add_argument("--skinny-ms", default="1,4,16", help="explore: M values for the skinny space")
    ap.add_argument("--triton-ms", default="16,64,256,1024,4096", help="explore: M values for the triton space")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop timing new points after this many seconds")
    ap.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--tag", default="", help="suffix of the output file names (e.g. the GPU name)")
    args = ap.parse_args()
    if args.mode == "table":
        print(markdown_table(args.csv))
        return
    if args.mode == "json":
        write_json_configs(args.csv, args.arch)
        return
    t0 = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment()
    model = re.search(r"\b([A-Z]+\d{2,4}[A-Z]?)\b", env["gpu"])  # "NVIDIA H100 80GB HBM3" -> "H100"
    tag = args.tag or (model.group(1) if model else env["gpu"].replace(" ", "_"))
    (args.out / f"triton_skinny_{args.mode}_{tag}_env.json").write_text(json.dumps(env, indent=1))
    print(json.dumps(env), flush=True)
    cu = env["sms"]
    if args.mode == "explore":
        ms = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
        points = explore_points(cu, ms(args.skinny_ms), ms(args.triton_ms))
    else:
        shortlist = json.loads(args.shortlist.read_text()) if args.shortlist else {}
        points = full_points(cu, shortlist)
    print(f"{len(points)} points, {sum(len(p[4]) for p in points)} timings", flush=True)
    rows = run_points(args.mode, points, args.out / f"triton_skinny_{args.mode}_{tag}.csv", args.workers,
                      t0 + args.budget_s)
    summarize(rows)
    print(f"total {time.time() - t0:.1f}s", flush=True)


def summarize(rows: list[dict]) -> None:
    """Per (shape, M): torch, best triton, best skinny (us and % roofline)."""
    best: dict = {}
    for r in rows:
        if r["config"].endswith("!WRONG"):
            continue
        k = (r["N"], r["K"], r["M"])
        cur = best.setdefault(k, {}).get(r["impl"])
        if cur is None or r["us"] < cur["us"]:
            best[k][r["impl"]] = r
    print(f"{'N':>6} {'K':>6} {'M':>5} | {'torch':>9} | {'triton':>9} {'%':>5} | {'skinny':>9} {'%':>5} | best")
    for (N, K, M), d in sorted(best.items()):
        t = d.get("torch")
        tr = d.get("triton")
        sk = d.get("skinny")
        f = lambda r: f"{r['us']:9.2f} {r['pct_roofline']:5.1f}" if r else f"{'-':>9} {'-':>5}"  # noqa: E731
        print(f"{N:6d} {K:6d} {M:5d} | {t['us'] if t else float('nan'):9.2f} | {f(tr)} | {f(sk)} | "
              f"{(tr or {}).get('config', '')} {(sk or {}).get('config', '')}", flush=True)


def _runs(paths: list[Path]):
    import pandas as pd
    runs = [pd.read_csv(p) for p in paths]
    return [r[~r.config.str.endswith("!WRONG")] for r in runs]


def markdown_table(paths: list[Path]) -> str:
    """Per (shape, M): F.linear, best triton of the short list, skinny heuristic default and best of its short
    list (us, and % of roofline), from the first CSV; speed-ups are torch time / backend time."""
    from aiter_gemm.backends.skinny import is_skinny_default_shape
    from aiter_gemm.kernels.skinny import default_skinny_config
    d = _runs(paths)[0]
    d = d[d.model != "probe"]
    lines = ["| model | N | K | M | F.linear us (roof %) | triton best us (x F.linear) | skinny default us "
             "(x F.linear, roof %) | skinny best us (roof %) | runtime default |",
             "|---|---|---|---|---|---|---|---|---|"]
    order = {nk: i for i, nk in enumerate(nk for lst in SHAPES.values() for nk in lst)}
    keys = sorted(d.groupby(["model", "N", "K", "M"]).groups, key=lambda k: (order.get((k[1], k[2]), 99), k[3]))
    for model, N, K, M in keys:
        g = d[(d.model == model) & (d.N == N) & (d.K == K) & (d.M == M)]
        t = g[g.impl == "torch"].iloc[0]
        tr = g[g.impl == "triton"].sort_values("us").iloc[0]
        cells = [model, N, K, M, f"{t.us:.2f} ({t.pct_roofline:.0f})", f"{tr.us:.2f} ({t.us / tr.us:.2f})"]
        sk = g[g.impl == "skinny"]
        if len(sk):
            dflt = sk[sk.config == default_skinny_config(M, N, K, 132).name]
            best = sk.sort_values("us").iloc[0]
            cells += [f"{dflt.us.iloc[0]:.2f} ({t.us / dflt.us.iloc[0]:.2f}, {dflt.pct_roofline.iloc[0]:.0f})"
                      if len(dflt) else "not timed",
                      f"{best.us:.2f} ({best.pct_roofline:.0f})",
                      "skinny" if is_skinny_default_shape(M, N, K, 132) else "torch"]
        else:
            cells += ["-", "-", "torch"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def write_json_configs(paths: list[Path], arch: str) -> None:
    """Best triton config per (N, K, M) by mean time over the runs (configs timed in every run) into the per-shape
    files; the arch file takes, per M, the config with the best geometric-mean slowdown over all shapes."""
    import numpy as np
    import pandas as pd

    from aiter_gemm.kernels.gemm_a16w16 import GemmConfig
    from aiter_gemm.settings import default_config_dir
    runs = _runs(paths)
    d = pd.concat(r[r.impl == "triton"] for r in runs)
    agg = d.groupby(["N", "K", "M", "config"]).us.agg(["mean", "count"]).reset_index()
    tr = agg[agg["count"] == len(runs)].rename(columns={"mean": "us"})

    def entry(name: str) -> dict:
        c = GemmConfig.from_name(name)
        return {"BLOCK_SIZE_M": c.BLOCK_SIZE_M, "BLOCK_SIZE_N": c.BLOCK_SIZE_N, "BLOCK_SIZE_K": c.BLOCK_SIZE_K,
                "GROUP_SIZE_M": c.GROUP_SIZE_M, "NUM_KSPLIT": c.NUM_KSPLIT, "num_warps": c.num_warps,
                "num_stages": c.num_stages, "TMA_PERSISTENT": c.TMA_PERSISTENT, "TMA_FLATTEN": c.FLATTEN}

    def table(best: dict[int, str]) -> dict:  # runs of one config collapse into its largest M; the last is "any"
        ms = sorted(best)
        return {("any" if i == len(ms) - 1 else f"M_LEQ_{m}"): entry(best[m])
                for i, m in enumerate(ms) if i + 1 == len(ms) or best[ms[i + 1]] != best[m]}

    out = default_config_dir() / "triton"
    for (N, K), g in tr.groupby(["N", "K"]):
        best = {int(M): gg.sort_values("us").config.iloc[0] for M, gg in g.groupby("M")}
        (out / f"{arch}-GEMM-A16W16-N={N}-K={K}.json").write_text(json.dumps(table(best), indent=2) + "\n")
    tr = tr.assign(r=tr.us / tr.groupby(["N", "K", "M"]).us.transform("min"))
    best = {}
    for M, g in tr.groupby("M"):
        shapes = g[["N", "K"]].drop_duplicates().shape[0]
        counts = g.groupby("config").r.count()
        full = g[g.config.isin(counts[counts == shapes].index)]
        best[int(M)] = full.groupby("config").r.apply(lambda r: float(np.exp(np.log(r).mean()))).idxmin()
    (out / f"{arch}-GEMM-A16W16.json").write_text(json.dumps(table(best), indent=2) + "\n")
    print(f"wrote {out}: {best}")


if __name__ == "__main__":
    main()
