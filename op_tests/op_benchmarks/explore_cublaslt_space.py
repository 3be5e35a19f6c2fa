"""Does cuBLASLt hold faster kernels than its heuristic returns? (issue 14, M 17-256)

The ``cublaslt`` tuner searches what ``cublasLtMatmulAlgoGetHeuristic`` returns under 15 preference variants plus
split-K / swizzle / cluster changes of those (:func:`aiter_gemm.backends.cublaslt.enumerate_candidates`: 33-142
distinct algorithms per shape at M 32-256 on the H100). :func:`~aiter_gemm.backends.cublaslt.enumerate_space` walks
a wider space: the tile x stage-count neighbourhood (x split-K where the tiles leave SMs idle) of every heuristic
candidate and of every algorithm id at its default config, each accepted by ``cublasLtMatmulAlgoCheck``. Per shape
this script checks every candidate of both against float32, screens them with the tuner's CUDA-graph timing over
rotating buffers > 2x L2 (``--screen_max``: at most this many from the space, sampled, plus every heuristic one),
then times F.linear, the dispatch as shipped, the best heuristic candidate and the best ``--top`` of the space in
paired rounds (``gradlib.timing.time_paired``).

    python -m op_tests.op_benchmarks.explore_cublaslt_space --out $OUT --shapes 64x4096x4096,32x1280x8192
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from aiter_gemm import current_device_identity, gemm_a16w16, get_GEMM_A16W16_config
from aiter_gemm.backends import get_backend
from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.backends.cublaslt import enumerate_candidates, enumerate_space
from gradlib.timing import SCREEN, TimingConfig, cache_bytes, rotating_sets, time_paired, time_runner

PAIRED = TimingConfig(warmup=5, reps=9, target_us=500.0, budget_s=0.4)
TOL = 2e-2  # bf16 output vs a float32 reference, relative to the largest |value|


def explore(m: int, n: int, k: int, args: argparse.Namespace, rows: list[dict]) -> dict:
    dev = torch.device("cuda")
    ident = current_device_identity(on_gpu=True)
    backend = get_backend("cublaslt")
    lib = backend.library()
    problem = GemmProblem(m, n, k)
    t0 = time.perf_counter()
    heur = [c.solution for c in enumerate_candidates(lib, problem, ident)]
    space = [c.solution for c in enumerate_space(lib, problem, ident)]
    enum_s = time.perf_counter() - t0
    heur_names = {s.kernelName for s in heur}
    extra = [s for s in space if s.kernelName not in heur_names]
    rng = random.Random(m * 1_000_003 + n * 1009 + k)
    sampled = extra if len(extra) <= args.screen_max else rng.sample(extra, args.screen_max)
    set_bytes = (n * k + m * k + m * n) * 2
    n_sets = rotating_sets(set_bytes, cache_bytes(dev), torch.cuda.mem_get_info(dev)[0])
    A = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _ in range(n_sets)]
    W = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / math.sqrt(k) for _ in range(n_sets)]
    ref = A[0].float() @ W[0].float().t()
    scale = ref.abs().max().item()

    def screen(sols: list[Solution], origin: str) -> list[tuple[float, Solution]]:
        timed = []
        for sol in sols:
            run = backend.prepare(problem, sol, ident)
            if run is None:
                continue
            err = (run(A[0], W[0], None, torch.bfloat16).float() - ref).abs().max().item() / scale
            row = {"M": m, "N": n, "K": k, "origin": origin, "solidx": sol.solidx, "splitK": sol.splitK,
                   "kernelName": sol.kernelName, "rel_err": err, "us": ""}
            if err < TOL:
                row["us"] = time_runner(lambda i, run=run: run(A[i], W[i], None, torch.bfloat16), n_sets, dev,
                                        SCREEN).us
                timed.append((row["us"], sol))
            rows.append(row)
        return sorted(timed, key=lambda x: x[0])

    h = screen(heur, "heuristic")
    s = screen(sampled, "space")
    methods = {"F.linear": lambda i: F.linear(A[i], W[i]), "dispatch": lambda i: gemm_a16w16(A[i], W[i])}
    finalists = {}
    if h:
        finalists["heuristic_best"] = h[0][1]
    for j, (_, sol) in enumerate(s[:args.top]):
        finalists[f"space_{j}"] = sol
    for name, sol in finalists.items():
        methods[name] = lambda i, run=backend.prepare(problem, sol, ident): run(A[i], W[i], None, torch.bfloat16)
    samples = time_paired(methods, n_sets, PAIRED, args.pairs, captures=3)
    med = {name: statistics.median(v) for name, v in samples.items()}
    over = {name: statistics.median([a / b for a, b in zip(samples["F.linear"], v)]) for name, v in samples.items()}
    dispatch = get_GEMM_A16W16_config(m, n, k, False, torch.bfloat16)
    return {"M": m, "N": n, "K": k, "enumerate_s": enum_s, "heuristic": len(heur), "space": len(space),
            "space_new": len(extra), "screened_space": len(sampled), "screen_best_heuristic_us": h[0][0] if h else None,
            "screen_best_space_us": s[0][0] if s else None,
            "finalists": {name: sol.kernelName for name, sol in finalists.items()},
            "dispatch": {c: dispatch.get(c) for c in ("libtype", "kernelName", "us")}, "median_us": med,
            "linear_over": over, "floor_us": set_bytes / 3.0e12 * 1e6}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", required=True, help="MxNxK list")
    ap.add_argument("--screen_max", type=int, default=300, help="space candidates screened per shape (sampled)")
    ap.add_argument("--top", type=int, default=3, help="best screened space candidates in the paired round")
    ap.add_argument("--pairs", type=int, default=21)
    ap.add_argument("--deadline_s", type=float, default=480.0, help="stop starting new shapes after this")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    rows: list[dict] = []
    results = []
    for spec in (s for s in args.shapes.split(",") if s):
        m, n, k = (int(v) for v in spec.lower().split("x"))
        if time.monotonic() - t0 > args.deadline_s:
            print(f"deadline: skipped M={m} N={n} K={k}", flush=True)
            continue
        res = explore(m, n, k, args, rows)
        results.append(res)
        print(f"M={m} N={n} K={k}: {res['heuristic']} heuristic, {res['space']} in the space ({res['space_new']} new, "
              f"{res['screened_space']} screened, {res['enumerate_s']:.1f} s); "
              + "; ".join(f"{name} {us:.2f} us ({res['linear_over'][name]:.3f}x)"
                          for name, us in sorted(res["median_us"].items(), key=lambda x: x[1])), flush=True)
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        with open(out / "screen.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["M", "N", "K", "origin", "solidx", "splitK", "kernelName", "rel_err",
                                              "us"])
            w.writeheader()
            w.writerows(rows)
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cublaslt": get_backend("cublaslt").library().version,
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "seconds": time.monotonic() - t0}
    (out / "env.json").write_text(json.dumps(env, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
