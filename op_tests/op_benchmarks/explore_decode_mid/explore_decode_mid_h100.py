"""Explore a decode-regime kernel family (``gemm_decode.py`` beside this script) against F.linear on an H100.

Issue 14, item 2: at M = 17..256 the shipped shapes are memory-bound on the weight and F.linear (cuBLAS) reaches
only ~0.77 of the roofline. This script measures, for each shipped (N, K) x M in {17, 32, 64, 128, 256} (and a few
held-out shapes of other models at M in {32, 128}):

* F.linear;
* the existing Triton kernel (``aiter_gemm.kernels.gemm_a16w16.launch_gemm_a16w16``) in a few configs: its untuned
  default, the Hopper persistent TMA kernel with flattened loops, a split-K config;
* every config of ``gemm_decode.config_space(M, N, K, 132)`` plus ``default_config``, and (unless ``--no-extra``)
  pointer-path twins of the default (what TMA buys) and one stream-K probe (kept out of the space).

Per shape: correctness of every candidate against a float32 reference on fresh inputs (output poisoned with NaN
first: an unwritten element fails), then a screening timing of every candidate, then the finalists (F.linear, the
5 fastest new configs, the default config and the best existing one) re-timed in ``--rounds`` (4) rounds of
alternating order (``gradlib.timing.interleaved``); speed-ups compare those final medians, and ``final_spread`` is
(max - min) / median over the rounds (the run's own noise: F.linear moved by up to 6% between two runs on one
shape). Timing is ``gradlib.timing.time_runner``: CUDA-graph replay over rotating (A, B, C) sets spanning >= 2x the
L2 (so the weight comes from HBM each call), median. Roofline: bytes ``(M*K + N*K + M*N) * 2`` over 3.0e12 B/s
(memory-bound regime; the JSON also gives the compute floor at 790 TFLOP/s, which M = 256 approaches).

Kernels are compiled first by worker processes (Triton's disk cache), then timed in this process. A global deadline
(``EXPLORE_DEADLINE_S``, default 500 s from start) stops timing new shapes; results are written after every shape.
A candidate that raises is recorded, not fatal; a CUDA error that poisons the context ends the shape loop with the
results so far written. The most informative shapes come first (every (N, K) and every M is covered early).

GPU (from the repo root). Measured on a fresh H100 machine (Triton 3.6, cold cache), with 2 final rounds: 82 s wall
(12 s of parallel compiles of 188 kernels, 1686 candidates on 48 shapes); 4 rounds add ~30 s. The 500 s deadline is
a guard, not the expected time:

  PYTHONUNBUFFERED=1 python op_tests/op_benchmarks/explore_decode_mid/explore_decode_mid_h100.py --out $OUT 2>&1 \
      | tee $OUT/explore_decode_mid.log

CPU check of the whole flow (interpreter, tiny shapes, correctness only):

  python op_tests/op_benchmarks/explore_decode_mid/explore_decode_mid_h100.py --smoke --out /tmp/explore_smoke
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

if "--smoke" in sys.argv:  # before Triton is imported: kernels read TRITON_INTERPRET at import
    os.environ["TRITON_INTERPRET"] = "1"

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gradlib.timing import TimingConfig, cache_bytes, interleaved, rotating_sets, time_runner  # noqa: E402

# The exploration kernel family beside this script (torch and Triton only; not shipped, see BENCHMARKS.md), as the
# package module the other exploration scripts and the tests import: one copy of its kernels and counters.
from op_tests.op_benchmarks.explore_decode_mid import gemm_decode as gd  # noqa: E402

PEAK_BW = 3.0e12  # B/s, H100 device-to-device copy, bytes read + written (BENCHMARKS.md)
PEAK_FLOPS = 790e12  # bf16 dense, H100 measured
SHIPPED = {  # (N, K) of the shipped H100 rows (configs/bf16_tuned_gemm.csv)
    "llama3.1-8b": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
    "llama3-70b-tp8": [(1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584)],
}
SHIPPED_MS = [17, 32, 64, 128, 256]
HELD_OUT = {  # other models' linears, never used to design the space: does it generalise?
    "qwen2.5-7b": [(4608, 3584), (3584, 18944)],
    "gemma-2-9b": [(3584, 4096), (28672, 3584)],
}
HELD_OUT_MS = [32, 128]
SMOKE_SHAPES = [("smoke", 17, 96, 160), ("smoke", 33, 64, 256), ("smoke", 20, 100, 200)]

SCREEN = dict(warmup=2, reps=7, target_us=300.0, budget_s=0.3)
FINAL = dict(warmup=5, reps=15, target_us=1500.0, budget_s=1.0)
# The exploration scripts beside this one (explore_gemv_mma, probe_*): screening, then paired rounds.
SCREEN_TIMING = TimingConfig(**SCREEN)
PAIRED_TIMING = TimingConfig(warmup=5, reps=11, target_us=600.0, budget_s=0.5)
N_FINAL_NEW = 5  # screening ranks within ~2-3% are noise: re-time the 5 fastest new configs
COLUMNS = ["order", "model", "N", "K", "M", "impl", "config", "in_space", "is_default", "ok", "rel_err", "error",
           "screen_us", "final_us", "final_spread", "us", "speedup", "pct_roof", "floor_us"]


def write_csv(path: Path, rows: list[dict], fieldnames: list[str] | None = None) -> None:
    """Write ``rows`` to ``path`` (columns: ``fieldnames``, else every key in first-seen order, so rows may differ in
    their keys), atomically: a temp file beside it, then a rename; nothing when there are no rows."""
    if not rows:
        return
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fieldnames or list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def floor_us(M: int, N: int, K: int) -> float:
    """Memory roofline: A, B, C (16-bit) each moved once at 3.0 TB/s."""
    return (M * K + N * K + M * N) * 2 / PEAK_BW * 1e6


def paired_medians(samples: dict[str, list[float]], base: str) -> dict[str, tuple[float, float]]:
    """Per method of a ``time_paired`` run: (median us, median over rounds of base / method): the paired ratio, each
    round comparing replays taken within a millisecond of each other."""
    return {name: (statistics.median(v), statistics.median(b / x for b, x in zip(samples[base], v)))
            for name, v in samples.items()}


def compute_floor_us(M: int, N: int, K: int) -> float:
    return 2 * M * N * K / PEAK_FLOPS * 1e6


# ---------------------------------------------------------------------------------------------------------------
# Shapes and candidates
# ---------------------------------------------------------------------------------------------------------------

def shape_order(smoke: bool) -> list[tuple[str, int, int, int]]:
    """(model, M, N, K) in priority order: round r pairs the j-th shipped (N, K) with M index (j + r) % 5, so the
    first 8 shapes already cover all 8 (N, K) and all 5 M, and every round after adds one more M per (N, K);
    held-out shapes come last (they check the default and the space, not the target)."""
    if smoke:
        return list(SMOKE_SHAPES)
    nks = [(model, nk) for model, lst in SHIPPED.items() for nk in lst]
    # Start with M = 256 / 128 on the first (N, K)s: F.linear is furthest from the roofline there.
    ms = [256, 128, 32, 17, 64]
    out = []
    for r in range(len(ms)):
        for j, (model, (N, K)) in enumerate(nks):
            out.append((model, ms[(j + r) % len(ms)], N, K))
    for model, lst in HELD_OUT.items():
        for N, K in lst:
            for M in HELD_OUT_MS:
                out.append((model, M, N, K))
    return out


def a16w16_candidates(M: int, N: int, K: int, cu: int) -> list[str]:
    """A few configs of the existing kernel: its untuned default, the persistent TMA kernel with flattened loops
    (BENCHMARKS.md: what closed the large-M gap), and a split-K config filling ~1-2 waves."""
    try:
        from aiter_gemm.kernels.gemm_a16w16 import GemmConfig, default_config
    except Exception:  # noqa: BLE001  # the existing kernel module is being refactored: compare against F.linear only
        return []
    names = [default_config(M, N, K).name]
    if M <= 64:
        names.append(GemmConfig(64, 128, 64, 8, 1, 4, 4, True, True).name)
    else:
        names.append(GemmConfig(128, 128, 64, 8, 1, 8, 3, True, True).name)
    bm = 32 if M <= 32 else 64
    tiles = -(-M // bm) * -(-N // 64)
    sk = max(1, min(8, round(2 * cu / tiles)))
    while sk > 1 and K // sk < 512:
        sk -= 1
    names.append(GemmConfig(bm, 64, 128, 1, sk, 4, 4).name)
    return list(dict.fromkeys(names))


def decode_candidates(M: int, N: int, K: int, cu: int, arch: str, extra: bool) -> list[tuple[str, bool, bool]]:
    """(name, in_space, is_default) of the new family: the whole space, the default, and with ``extra`` the
    pointer-path twins of the default (what TMA buys) and one stream-K probe (kept out of the space: run 2)."""
    from dataclasses import replace
    space = gd.config_space(M, N, K, cu, arch)
    dflt = gd.default_config(M, N, K, cu, arch)
    names = {c.name: (True, c == dflt) for c in space}
    if dflt.name not in names:
        names[dflt.name] = (False, True)
    if extra:
        probes = [replace(dflt, NUM_KSPLIT=1, REDUCE="2P", STREAM_K=1)]
        if dflt.TMA:
            probes += [replace(dflt, TMA=False), replace(dflt, TMA=False, NUM_KSPLIT=1, REDUCE="2P")]
        for c in probes:
            if gd.config_supported(c, M, N, K, arch) is None and c.name not in names:
                names[c.name] = (False, False)
    return [(n, s, d) for n, (s, d) in names.items()]


def wide_candidates(M: int, N: int, K: int, cu: int, arch: str) -> list[tuple[str, bool, bool]]:
    """``--wide``: a grid around the space that tests three explanations of the family's 0.6-0.8 of the copy
    bandwidth on small weights (diag_decode_ncu run 1): short weight rows per load (BLOCK_SIZE_K 64 / 128 / 256:
    256 B / 512 B of each row per TMA box), one resident program per SM with a deep pipeline against several with
    shallow ones (depths 2, 3, 5, 8 where they fit), and the split-K reduction (splits 2-16 that give 0.5..6
    programs per SM; the in-kernel fix-up where the partials are small, else two-pass)."""
    if M <= 32:
        tiles = [(16, 64, 4, True), (32, 64, 4, True), (16, 128, 4, True), (32, 128, 4, True)]
    elif M <= 64:
        tiles = [(32, 64, 4, True), (64, 64, 4, True), (64, 64, 4, False), (64, 128, 4, False), (32, 128, 4, True)]
    else:
        tiles = [(64, 64, 4, False), (64, 128, 4, False), (128, 64, 4, False), (64, 128, 4, True),
                 (128, 128, 8, False)]
    limit = gd.smem_limit(arch)
    names: dict[str, tuple[bool, bool]] = {}
    for bm, bn, warps, swap in tiles:
        n_tiles = -(-M // bm) * -(-N // bn)
        for bk in (64, 128, 256):
            k_tiles = -(-K // bk)
            per_stage = (bm + bn) * bk * 2
            for st in (2, 3, 5, 8):
                if st * per_stage + 2048 > limit:
                    continue
                for sk in (1, 2, 4, 8, 16):
                    progs = n_tiles * sk
                    if sk > 1 and not 0.5 * cu <= progs <= 6 * cu:
                        continue
                    if sk > k_tiles // 2 and sk > 1:
                        continue
                    reds = ["2P"] if sk == 1 or (sk - 1) * min(bm, M) * bn * 4 > 32768 else ["FX"]
                    for red in reds:
                        c = gd.DecodeConfig(bm, bn, bk, sk, warps, st, swap, red, 0, True)
                        if gd.config_supported(c, M, N, K, arch) is None:
                            names.setdefault(c.name, (False, False))
    dflt = gd.default_config(M, N, K, cu, arch)
    names[dflt.name] = (False, True)
    return [(n, s, d) for n, (s, d) in names.items()]


def smoke_decode_candidates(M: int, N: int, K: int) -> list[tuple[str, bool, bool]]:
    """Interpreter: small tiles of every kind (plain, swap, split 2P/FX, stream-K; TMA and pointer)."""
    cfgs = [gd.DecodeConfig(32, 32, 32, 1, 4, 2), gd.DecodeConfig(32, 32, 32, 1, 4, 2, TMA=True),
            gd.DecodeConfig(16, 32, 64, 1, 4, 2, SWAP_AB=True, TMA=True),
            gd.DecodeConfig(32, 32, 32, 2, 4, 2, REDUCE="2P", TMA=True),
            gd.DecodeConfig(32, 32, 32, 2, 4, 2, SWAP_AB=True, REDUCE="FX"),
            gd.DecodeConfig(16, 32, 32, 1, 4, 2, STREAM_K=2, TMA=True),
            gd.DecodeConfig(32, 32, 32, 1, 4, 2, SWAP_AB=True, STREAM_K=1)]
    return [(c.name, False, False) for c in cfgs if gd.config_supported(c, M, N, K, "cpu") is None]


def make_fn(impl: str, name: str, cu: int, otype: torch.dtype):
    """A callable (a, b, out) -> out for one candidate."""
    if impl == "torch":
        return lambda a, b, out: F.linear(a, b)
    if impl == "a16w16":
        from aiter_gemm.kernels.gemm_a16w16 import GemmConfig, launch_gemm_a16w16
        cfg = GemmConfig.from_name(name)
        return lambda a, b, out: launch_gemm_a16w16(a, b, None, out, cfg, cu if a.is_cuda else 0)
    cfg = gd.DecodeConfig.from_name(name)
    return lambda a, b, out: gd.launch_gemm_decode(a, b, None, out, cfg, cu)


# ---------------------------------------------------------------------------------------------------------------
# Precompile (worker processes)
# ---------------------------------------------------------------------------------------------------------------

def _compile_key(impl: str, name: str, M: int, N: int, K: int) -> tuple:
    """What the compiled kernel depends on besides the name: Triton specialises integer arguments on divisibility
    by 16; the decode kernels take the split factor at run time (one compile for every SK)."""
    base = re.sub(r"_SK\d+", "_SKn", name) if impl == "decode" else name
    if impl == "decode":
        base += "_multi" if not name.split("_SK")[1].startswith("1_") else "_single"
    return (impl, base, M % 16 == 0, N % 16 == 0, K % 16 == 0, K % 256 == 0)


def _compile_task(task: tuple[int, int, int, list[tuple[str, str]]]) -> list[tuple[str, str, str]]:
    """Run each (impl, name) once at (M, N, K) to compile it; return failures (impl, name, error)."""
    M, N, K, cands = task
    torch.cuda.init()
    cu = torch.cuda.get_device_properties(0).multi_processor_count
    a = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(N, K, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    bad = []
    for impl, name in cands:
        try:
            make_fn(impl, name, cu, torch.bfloat16)(a, b, out)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - reported, the candidate is then skipped
            bad.append((impl, name, f"{type(exc).__name__}: {str(exc)[:300]}"))
    return bad


def precompile(plan: list[dict], workers: int, deadline: float) -> dict[tuple[str, str], str]:
    """Compile every distinct kernel of ``plan`` in ``workers`` spawned processes, stopping at ``deadline``; returns
    {(impl, name): error} of candidates that failed to compile or run (they are skipped in the timing loop)."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    seen: dict[tuple, tuple[int, int, int, str, str]] = {}
    for p in plan:
        for impl, name, *_ in p["cands"]:
            if impl == "torch":
                continue
            key = _compile_key(impl, name, p["M"], p["N"], p["K"])
            cur = seen.get(key)
            if cur is None or p["N"] * p["K"] < cur[1] * cur[2]:  # the smallest shape: cheap inputs
                seen[key] = (p["M"], p["N"], p["K"], impl, name)
    # One task per (shape, few kernels): small tasks, so a deadline cancels little work.
    by_shape: dict[tuple[int, int, int], list[tuple[str, str]]] = {}
    for M, N, K, impl, name in seen.values():
        by_shape.setdefault((M, N, K), []).append((impl, name))
    tasks = []
    for (M, N, K), cands in by_shape.items():
        for i in range(0, len(cands), 3):
            tasks.append((M, N, K, cands[i:i + 3]))
    t0 = time.time()
    bad: dict[tuple[str, str], str] = {}
    done = 0
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
    try:
        pending = {pool.submit(_compile_task, t) for t in tasks}
        while pending:
            left = deadline - time.time()
            if left <= 0:
                print(f"precompile: deadline, {len(pending)} tasks cancelled (compiled lazily if timed)", flush=True)
                for f in pending:
                    f.cancel()
                break
            finished, pending = wait(pending, timeout=min(left, 30), return_when=FIRST_COMPLETED)
            for f in finished:
                done += 1
                try:
                    for impl, name, err in f.result():
                        bad[(impl, name)] = err
                except Exception as exc:  # noqa: BLE001 - a worker died: its kernels compile lazily
                    print(f"precompile: a task failed: {type(exc).__name__}: {exc}", flush=True)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    print(f"precompiled {len(seen)} kernels in {len(tasks)} tasks ({done} done) in {time.time() - t0:.1f}s; "
          f"{len(bad)} candidates failed", flush=True)
    for (impl, name), err in sorted(bad.items())[:30]:
        print(f"  FAILED {impl} {name}: {err}", flush=True)
    return bad


# ---------------------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------------------

def check(fn, M: int, N: int, K: int, device: str, otype: torch.dtype) -> tuple[bool, float, str]:
    """Fresh N(0,1) inputs, output poisoned with NaN, relative Frobenius error against float32 (TF32 off)."""
    a = torch.randn(M, K, dtype=torch.bfloat16, device=device)
    b = torch.randn(N, K, dtype=torch.bfloat16, device=device)
    out = torch.full((M, N), float("nan"), dtype=otype, device=device)
    res = fn(a, b, out)
    if res is None:
        res = out
    ref = a.float() @ b.float().t()
    if device == "cuda":
        torch.cuda.synchronize()
    if not torch.isfinite(res).all():
        return False, float("inf"), "non-finite output (unwritten or overflow)"
    err = ((res.float() - ref).norm() / ref.norm()).item()
    return err < 1e-2, err, "" if err < 1e-2 else f"rel_err {err:.3e} >= 1e-2"


class Rotating:
    """Rotating (A, B, C) sets spanning >= 2x the L2 for one shape."""

    def __init__(self, M: int, N: int, K: int, device: torch.device):
        set_bytes = (M * K + N * K + M * N) * 2
        free = torch.cuda.mem_get_info(device)[0]
        self.n = rotating_sets(set_bytes, cache_bytes(device), free)
        self.sets = [(torch.randn(M, K, dtype=torch.bfloat16, device=device),
                      torch.randn(N, K, dtype=torch.bfloat16, device=device),
                      torch.empty(M, N, dtype=torch.bfloat16, device=device)) for _ in range(self.n)]

    def time(self, fn, cfg) -> float:
        sets = self.sets
        return time_runner(lambda i: fn(*sets[i]), self.n, sets[0][0].device, cfg).us


def cuda_alive() -> bool:
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return True
    except Exception:  # noqa: BLE001
        return False


def measure_shape(order: int, model: str, M: int, N: int, K: int, cands: list, bad: dict, cu: int,
                  device: str, smoke: bool, rounds: int = 4) -> tuple[list[dict], bool]:
    """Check, screen and re-time one shape's candidates; returns (rows, context_still_usable)."""
    rows = []
    fl = floor_us(M, N, K)
    otype = torch.bfloat16
    rot = None if smoke else Rotating(M, N, K, torch.device(device))
    screen_cfg = None if smoke else TimingConfig(**SCREEN)
    for impl, name, in_space, is_default in cands:
        row = {"order": order, "model": model, "N": N, "K": K, "M": M, "impl": impl, "config": name,
               "in_space": int(in_space), "is_default": int(is_default), "ok": 0, "rel_err": "", "error": "",
               "screen_us": "", "final_us": "", "final_spread": "", "us": "", "speedup": "", "pct_roof": "",
               "floor_us": round(fl, 3)}
        rows.append(row)
        if (impl, name) in bad:
            row["error"] = "compile/run: " + bad[(impl, name)]
            continue
        try:
            fn = make_fn(impl, name, cu, otype)
            ok, err, why = check(fn, M, N, K, device, otype)
            row.update(ok=int(ok), rel_err=f"{err:.2e}", error=why)
            if ok and not smoke:
                row["screen_us"] = round(rot.time(fn, screen_cfg), 3)
        except Exception as exc:  # noqa: BLE001 - recorded; a poisoned context ends the run
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            print(f"  ERROR {impl} {name} M={M} N={N} K={K}: {row['error']}", flush=True)
            if device == "cuda" and not cuda_alive():
                print("  CUDA context unusable: stopping", flush=True)
                return rows, False
    if smoke:
        return rows, True
    # Finalists, re-timed in alternating order.
    timed = [r for r in rows if r["screen_us"] != ""]
    fin = [r for r in timed if r["impl"] == "torch"]
    new = sorted((r for r in timed if r["impl"] == "decode"), key=lambda r: r["screen_us"])
    fin += new[:N_FINAL_NEW]
    fin += [r for r in new if r["is_default"] and r not in fin]
    old = sorted((r for r in timed if r["impl"] == "a16w16"), key=lambda r: r["screen_us"])
    fin += old[:1]
    final_cfg = TimingConfig(**FINAL)
    try:
        fns = {r["impl"] + ":" + r["config"]: make_fn(r["impl"], r["config"], cu, otype) for r in fin}
        res = interleaved({k: (lambda f=f: rot.time(f, final_cfg)) for k, f in fns.items()}, rounds=rounds)
        for r in fin:
            vals = res[r["impl"] + ":" + r["config"]]
            med = statistics.median(vals)
            r["final_us"] = round(med, 3)
            r["final_spread"] = round((max(vals) - min(vals)) / med, 4)
    except Exception as exc:  # noqa: BLE001
        print(f"  ERROR in the final round M={M} N={N} K={K}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        if not cuda_alive():
            return rows, False
    base = next((r for r in rows if r["impl"] == "torch"), None)
    for r in rows:
        us = r["final_us"] if r["final_us"] != "" else r["screen_us"]
        if us == "":
            continue
        r["us"] = us
        r["pct_roof"] = round(100 * fl / us, 1)
        if base is None:
            continue
        # Like with like: the alternating final round where both have it, else both screening times.
        if r["final_us"] != "" and base["final_us"] != "":
            r["speedup"] = round(base["final_us"] / r["final_us"], 4)
        elif base["screen_us"] != "" and r["screen_us"] != "":
            r["speedup"] = round(base["screen_us"] / r["screen_us"], 4)
    torch.cuda.empty_cache()
    return rows, True


# ---------------------------------------------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------------------------------------------

def summarize(rows: list[dict]) -> list[dict]:
    """Per shape: F.linear, the best new config, the default config, the best existing Triton config."""
    out = []
    keys = []
    for r in rows:
        k = (r["model"], r["M"], r["N"], r["K"])
        if k not in keys:
            keys.append(k)
    for model, M, N, K in keys:
        g = [r for r in rows if (r["model"], r["M"], r["N"], r["K"]) == (model, M, N, K) and r["us"] != ""]
        base = next((r for r in g if r["impl"] == "torch"), None)
        new = [r for r in g if r["impl"] == "decode" and r["ok"]]
        # The best is chosen among the finalists (alternating-order final round against F.linear's final time):
        # a screening time is biased by its order and noise, and must not win on that.
        rank = lambda rs: max(rs, key=lambda x: x["speedup"] or 0, default=None)  # noqa: E731
        best = rank([r for r in new if r["final_us"] != ""]) or rank(new)
        dflt = next((r for r in new if r["is_default"]), None)
        old_rows = [r for r in g if r["impl"] == "a16w16" and r["ok"]]
        old = rank([r for r in old_rows if r["final_us"] != ""]) or rank(old_rows)
        n_fail = sum(1 for r in rows if (r["model"], r["M"], r["N"], r["K"]) == (model, M, N, K)
                     and r["impl"] == "decode" and not r["ok"])
        out.append({
            "model": model, "M": M, "N": N, "K": K, "floor_us": round(floor_us(M, N, K), 3),
            "compute_floor_us": round(compute_floor_us(M, N, K), 3),
            "flinear_us": base["us"] if base else None, "flinear_roof": base["pct_roof"] if base else None,
            "best_new": best["config"] if best else None, "best_new_us": best["us"] if best else None,
            "best_new_speedup": best["speedup"] if best else None, "best_new_roof": best["pct_roof"] if best else None,
            "default": dflt["config"] if dflt else None, "default_speedup": dflt["speedup"] if dflt else None,
            "best_a16w16": old["config"] if old else None, "best_a16w16_speedup": old["speedup"] if old else None,
            "new_failed": n_fail,
        })
    return out


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def aggregate(summary: list[dict]) -> dict:
    shipped = [s for s in summary if s["model"] in SHIPPED]
    held = [s for s in summary if s["model"] in HELD_OUT]
    agg = {}
    for label, ss in (("shipped", shipped), ("held_out", held)):
        # What a tuner choosing between this family and F.linear would give (it keeps F.linear where we lose).
        vals = [max(1.0, s["best_new_speedup"]) for s in ss if s["best_new_speedup"]]
        agg[f"{label}_tuned_new_or_flinear_geomean"] = geomean(vals)
        for key in ("best_new_speedup", "default_speedup", "best_a16w16_speedup"):
            vals = [s[key] for s in ss if s[key]]
            agg[f"{label}_{key}_geomean"] = geomean(vals)
            agg[f"{label}_{key}_min"] = min(vals) if vals else None
            agg[f"{label}_{key}_below_0.98"] = sum(1 for v in vals if v < 0.98)
            agg[f"{label}_{key}_n"] = len(vals)
    return agg


def table(summary: list[dict], agg: dict) -> str:
    lines = [f"{'model':15s} {'N':>6} {'K':>6} {'M':>4} | {'F.lin us':>8} {'roof':>5} | {'new us':>8} {'roof':>5} "
             f"{'x':>6} {'best new config':40s} | {'dflt x':>6} | {'a16w16 x':>8}"]
    f = lambda v, fmt: (fmt % v) if v not in (None, "") else "-"  # noqa: E731
    for s in sorted(summary, key=lambda s: (s["model"] not in SHIPPED, s["N"], s["K"], s["M"])):
        lines.append(f"{s['model']:15s} {s['N']:6d} {s['K']:6d} {s['M']:4d} | {f(s['flinear_us'], '%8.2f')} "
                     f"{f(s['flinear_roof'], '%5.1f')} | {f(s['best_new_us'], '%8.2f')} "
                     f"{f(s['best_new_roof'], '%5.1f')} "
                     f"{f(s['best_new_speedup'], '%6.3f')} {str(s['best_new'] or '-'):40s} | "
                     f"{f(s['default_speedup'], '%6.3f')} | {f(s['best_a16w16_speedup'], '%8.3f')}")
    for label in ("shipped", "held_out"):
        g = agg.get(f"{label}_best_new_speedup_geomean")
        if g:
            lines.append(f"{label}: best new / F.linear geomean {g:.3f} "
                         f"(min {agg[f'{label}_best_new_speedup_min']:.3f},"
                         f" {agg[f'{label}_best_new_speedup_below_0.98']} of {agg[f'{label}_best_new_speedup_n']} "
                         f"below 0.98); default {f(agg[f'{label}_default_speedup_geomean'], '%.3f')}; "
                         f"best a16w16 {f(agg[f'{label}_best_a16w16_speedup_geomean'], '%.3f')}; "
                         f"max(new, F.linear) {f(agg[f'{label}_tuned_new_or_flinear_geomean'], '%.3f')}")
    return "\n".join(lines)


def environment(smoke: bool) -> dict:
    import triton
    env = {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda, "smoke": smoke}
    if not smoke:
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, sms=props.multi_processor_count, l2_bytes=getattr(props, "L2_cache_size", None))
        try:
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,power.limit", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            env["nvidia_smi"] = "unavailable"
    return env


def write_results(out_dir: Path, rows: list[dict], env: dict, args: dict, status: str) -> tuple[list, dict]:
    summary = summarize(rows)
    agg = aggregate(summary)
    write_csv(out_dir / "explore_decode_mid.csv", rows, COLUMNS)
    (out_dir / "explore_decode_mid.json").write_text(json.dumps(
        {"env": env, "args": args, "status": status, "aggregate": agg, "summary": summary}, indent=1))
    return summary, agg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")),
                    help="folder for explore_decode_mid.csv / .json (default $OUT)")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes, correctness only")
    ap.add_argument("--deadline-s", type=float, default=float(os.environ.get("EXPLORE_DEADLINE_S", 500)),
                    help="stop timing new shapes this many seconds after start (env EXPLORE_DEADLINE_S)")
    ap.add_argument("--precompile-frac", type=float, default=0.45,
                    help="fraction of the deadline the parallel precompile may use")
    ap.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--shapes", default="", help="only these, e.g. '4096x14336:128,256;1280x8192:32'")
    ap.add_argument("--no-extra", action="store_true",
                    help="skip the pointer-path twins of the default config and the stream-K probe")
    ap.add_argument("--rounds", type=int, default=4, help="alternating-order rounds of the final timing")
    ap.add_argument("--wide", action="store_true",
                    help="time wide_candidates (BK 64-256, every depth 2-8, splits to 6 programs per SM) instead "
                         "of the space")
    args = ap.parse_args()
    t0 = time.time()
    deadline = t0 + args.deadline_s
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment(args.smoke)
    print(json.dumps(env), flush=True)
    device = "cpu" if args.smoke else "cuda"
    cu = 4 if args.smoke else env["sms"]
    arch = "cpu" if args.smoke else "sm_{}{}".format(*torch.cuda.get_device_capability())

    shapes = shape_order(args.smoke)
    if args.shapes:
        want = set()
        for part in args.shapes.split(";"):
            nk, ms = part.split(":")
            N, K = (int(x) for x in nk.split("x"))
            want |= {(int(m), N, K) for m in ms.split(",")}
        shapes = [s for s in shapes if (s[1], s[2], s[3]) in want]
        known = {(s[1], s[2], s[3]) for s in shapes}
        shapes += [("custom", M, N, K) for M, N, K in sorted(want - known)]
    plan = []
    for i, (model, M, N, K) in enumerate(shapes):
        if args.smoke:
            cands = [("torch", "F.linear", False, False), ("a16w16", "BM32_BN32_BK32_GM1_SK1_W4_S2", False, False)]
            cands += [("decode", n, s, d) for n, s, d in smoke_decode_candidates(M, N, K)]
        else:
            cands = [("torch", "F.linear", False, False)]
            cands += [("a16w16", n, False, False) for n in a16w16_candidates(M, N, K, cu)]
            if args.wide:
                cands += [("decode", n, s, d) for n, s, d in wide_candidates(M, N, K, cu, arch)]
            else:
                cands += [("decode", n, s, d) for n, s, d in decode_candidates(M, N, K, cu, arch,
                                                                                not args.no_extra)]
        plan.append({"order": i, "model": model, "M": M, "N": N, "K": K, "cands": cands})
    print(f"{len(plan)} shapes, {sum(len(p['cands']) for p in plan)} candidates", flush=True)

    bad = {} if args.smoke else precompile(plan, args.workers, t0 + args.precompile_frac * args.deadline_s)
    rows: list[dict] = []
    status = "complete"
    summary, agg = [], {}
    for p in plan:
        if time.time() > deadline:
            status = f"deadline after {p['order']} of {len(plan)} shapes"
            print(f"deadline reached: {len(plan) - p['order']} shapes not timed", flush=True)
            break
        ts = time.time()
        try:
            shape_rows, alive = measure_shape(p["order"], p["model"], p["M"], p["N"], p["K"], p["cands"], bad, cu,
                                              device, args.smoke, args.rounds)
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory for the rotating sets: skip the shape
            traceback.print_exc()
            print(f"shape M={p['M']} N={p['N']} K={p['K']} failed: {type(exc).__name__}: {exc}", flush=True)
            if not args.smoke and not cuda_alive():
                status = "CUDA context lost"
                break
            continue
        rows += shape_rows
        summary, agg = write_results(args.out, rows, env, vars(args) | {"out": str(args.out)}, status)
        s = next((x for x in summary if (x["M"], x["N"], x["K"]) == (p["M"], p["N"], p["K"])), {})
        if args.smoke:
            oks = sum(r["ok"] for r in shape_rows if r["impl"] != "torch")
            print(f"[{p['order']}] M={p['M']} N={p['N']} K={p['K']}: {oks}/{len(shape_rows) - 1} kernels correct",
                  flush=True)
        else:
            print(f"[{p['order']}] {p['model']} M={p['M']} N={p['N']} K={p['K']}: F.linear {s.get('flinear_us')} us "
                  f"({s.get('flinear_roof')}%), best new {s.get('best_new_us')} us x{s.get('best_new_speedup')} "
                  f"({s.get('best_new')}), default x{s.get('default_speedup')}, {s.get('new_failed')} new failed; "
                  f"{time.time() - ts:.1f}s, {time.time() - t0:.0f}s total", flush=True)
        if not alive:
            status = "CUDA context lost"
            break
    summary, agg = write_results(args.out, rows, env, vars(args) | {"out": str(args.out)}, status)
    failures = [r for r in rows if r["impl"] != "torch" and not r["ok"]]
    if args.smoke:
        for r in failures:
            print(f"FAILED {r['impl']} {r['config']} M={r['M']} N={r['N']} K={r['K']}: {r['error']}", flush=True)
        print(f"smoke: {len(rows)} candidates, {len(failures)} failed; {time.time() - t0:.1f}s", flush=True)
        return 1 if failures or not rows else 0
    print(f"status: {status}; {len(rows)} rows, {len(failures)} failed candidates; {time.time() - t0:.0f}s")
    print(table(summary, agg), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
