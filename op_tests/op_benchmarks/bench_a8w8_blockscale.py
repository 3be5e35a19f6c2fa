"""Benchmark the A8W8 block-scale GEMM on a GPU: quick config search per shape, against torch's block-scaled matmul
and bf16 ``F.linear`` of the dequantized weights, with TFLOPS and % of the measured FP8 roofline.

Shapes: DeepSeek-V3 dense linears (the (N, K) pairs of AITER's ``a8w8_blockscale_untuned_gemm_ds_v3.csv``) and
Llama-3-70B FP8 linears, each at several M. Timing (METHOD.md): warm-up, then CUDA-graph replays of one launch per
rotating input set, the sets together larger than 3x the 50 MB L2 so weights are read from HBM; median of the
replays, divided by the launches per replay. Every timed config is first checked against the float32 dequantized
reference (||out - ref|| / ||ref|| < 1e-2) and dropped if wrong.

With ``--op``, each shape is also timed through ``aiter_gemm.gemm_a8w8_blockscale`` itself: the dispatch as the
environment configures it (``AITER_CONFIG_GEMM_A8W8_BLOCKSCALE`` rows, which may name torch's block-scaled matmul,
then JSON, then the default), per-call work included; ``--markdown`` then reports the targets on those times.
``--x_scale_layout`` (``row_major``, the default, or ``m_major``: strides (1, M), as vLLM's ``column_major_scales``
quantizer writes it and torch's block-scaled matmul needs it) lays out x_scale for every timed kernel and the op.

Roofline: time_floor = max(flops / fp8_peak, bytes / bw), with fp8_peak the best of ``torch._scaled_mm`` on an
8192^3 per-tensor fp8 GEMM (fast accumulation on and off), measured in the same run, and bw = ``--bw`` (default
3.0 TB/s, the project's H100 figure: KINDS.md's device-to-device copy; this script's own 1 GiB copy is logged too);
% of roofline = time_floor / time.

    python op_tests/op_benchmarks/bench_a8w8_blockscale.py --out results_dir [--explore] [--ms 1,16,...]
    python op_tests/op_benchmarks/bench_a8w8_blockscale.py --emit-json results_dir/best.json --json-dir configs/triton
    python op_tests/op_benchmarks/bench_a8w8_blockscale.py --markdown results_dir
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from aiter_gemm.blockscale import (
    buckets_from_tuned,
    gemm_a8w8_blockscale,
    get_GEMM_A8W8_BLOCKSCALE_config,
    json_config_path,
    write_json_configs,
)
from aiter_gemm.kernels.a8w8_blockscale import (
    BlockscaleConfig,
    config_error,
    config_space,
    default_config,
    dequantize_blockscale,
    gemm_a8w8_blockscale_triton,
    quantize_blockscale,
)
from gradlib.timing import interleaved

log = logging.getLogger("bench_a8w8_blockscale")

# (N, K) of AITER's a8w8_blockscale_untuned_gemm_ds_v3.csv (DeepSeek-V3 dense linears).
DSV3_NK = [(256, 7168), (2112, 7168), (3072, 1536), (4096, 512), (512, 7168), (7168, 2048)]
# Llama-3-70B (TP1): fused QKV, o_proj, fused gate+up, down_proj.
LLAMA70B_NK = [(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)]
ROUNDS = 2  # alternating rounds of the summary comparisons (median per method)
DEFAULT_MS = [1, 16, 64, 256, 1024, 4096, 8192]
L2_BYTES = 50 * 2**20
MAX_ERR = 1e-2


# ------------------------------------------------------------------------------------------------ candidates


def candidates(M: int, N: int, K: int, explore: bool) -> list[BlockscaleConfig]:
    """The quick-search list of :func:`config_space` (explore: each also with pointer loads and, on 8 warps, with
    warp specialization, to re-check those choices)."""
    out = config_space(M, N, K, quick=True)
    if explore:
        out += [dataclasses.replace(c, TMA=False) for c in out]
        out += [dataclasses.replace(c, WARP_SPECIALIZE=True) for c in out if c.num_warps == 8]
    return [c for c in dict.fromkeys(out) if config_error(c, M, N, K) is None]


# ------------------------------------------------------------------------------------------------ timing


def graph_time_us(launch: Callable[[int], object], n_sets: int, min_ms: float = 25.0) -> float:
    """Median per-launch time (us) over CUDA-graph replays of ``launch(0..n_sets-1)``."""
    for i in range(n_sets):
        launch(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n_sets):
            launch(i)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g.replay()
    start.record()
    g.replay()
    end.record()
    end.synchronize()
    reps = max(5, min(100, int(min_ms / max(start.elapsed_time(end), 1e-3))))
    times = []
    for _ in range(reps):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / n_sets)
    del g
    return statistics.median(times)


def measure_ceilings() -> dict[str, float]:
    """FP8 dense peak (torch._scaled_mm, per-tensor, 8192^3) and device-to-device copy bandwidth."""
    n = 8192
    a = [torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn) for _ in range(2)]
    b = [torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn) for _ in range(2)]
    one = torch.ones((), device="cuda")
    out = {}
    for fast in (True, False):
        us = graph_time_us(lambda i, f=fast: torch._scaled_mm(a[i], b[i].t(), one, one, out_dtype=torch.bfloat16,
                                                              use_fast_accum=f), 2)
        out[f"fp8_tflops_fast_accum_{fast}"] = 2 * n**3 / us / 1e6
    for dtype in (torch.uint8, torch.float32):  # the better of byte and word copies of 1 GiB
        src = torch.empty(2**30 // torch.empty((), dtype=dtype).element_size(), dtype=dtype, device="cuda")
        dst = torch.empty_like(src)
        us = graph_time_us(lambda i, d=dst, s=src: d.copy_(s), 1)
        out[f"copy_TBps_{str(dtype)[6:]}"] = 2 * 2**30 / us / 1e6
        del src, dst
    out["copy_TBps"] = max(out["copy_TBps_uint8"], out["copy_TBps_float32"])
    out["fp8_peak_tflops"] = max(out["fp8_tflops_fast_accum_True"], out["fp8_tflops_fast_accum_False"])
    return out


# ------------------------------------------------------------------------------------------------ baselines


def torch_blockscale(XQ, WQ, xs, ws) -> tuple[Callable[[], torch.Tensor] | None, str]:
    """torch's own block-scaled matmul (cuBLASLt VEC128 / BLK128x128 scales) if this torch runs it here, with the
    layouts it asks for prepared up front (M padded to 4, x_scale M-major, w_scale's K blocks padded to 4)."""
    F = torch.nn.functional
    M = XQ.shape[0]
    m4 = -M % 4
    XQp = torch.cat([XQ, XQ.new_zeros(m4, XQ.shape[1])]) if m4 else XQ
    xsp = torch.cat([xs, xs.new_ones(m4, xs.shape[1])]) if m4 else xs
    xs_mmajor = xsp.t().contiguous().t()
    kb = ws.shape[1]
    wsp = torch.cat([ws, ws.new_ones(ws.shape[0], -kb % 4)], 1) if kb % 4 else ws
    attempts = []
    if hasattr(F, "scaled_mm") and hasattr(F, "ScalingType"):
        st = F.ScalingType
        attempts.append(("F.scaled_mm", lambda: F.scaled_mm(XQp, WQ.t(), xs_mmajor, st.BlockWise1x128, wsp.t(),
                                                            st.BlockWise128x128, output_dtype=torch.bfloat16)[:M]))
    attempts.append(("torch._scaled_mm", lambda: torch._scaled_mm(XQp, WQ.t(), xs_mmajor, wsp.t(),
                                                                  out_dtype=torch.bfloat16)[:M]))
    reasons = []
    for name, fn in attempts:
        try:
            fn()
            torch.cuda.synchronize()
            return fn, name
        except Exception as exc:  # unsupported build/device/shape: record why and try the next spelling
            reasons.append(f"{name}: {str(exc).splitlines()[0][:160]}")
    return None, "; ".join(reasons)


# ------------------------------------------------------------------------------------------------ compile pool


def precompile(configs: list[BlockscaleConfig], workers: int) -> dict[str, str]:
    """Compile configs in parallel subprocesses (they fill Triton's on-disk cache, which this process then hits).
    Returns kernelName -> "ok" or the failure; configs whose worker died are marked so and not timed."""
    names = [c.name for c in configs]
    chunks = [names[i::workers] for i in range(workers) if names[i::workers]]
    procs = [subprocess.Popen([sys.executable, __file__, "--compile-worker", *chunk], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for chunk in chunks]
    status: dict[str, str] = {}
    for chunk, p in zip(chunks, procs):
        try:
            text, _ = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
        for line in text.splitlines():
            if line.startswith(("OK ", "FAIL ")):
                kind, name, *why = line.split(" ", 2)
                status[name] = "ok" if kind == "OK" else "fail: " + (why[0] if why else "")
        for name in chunk:
            status.setdefault(name, f"worker exited {p.returncode} before reporting")
    return status


def compile_worker(names: list[str]) -> None:
    # Same argument divisibility as the benchmark shapes (K, N multiples of 16; M, N, K, scale strides unspecialized).
    XQ, WQ, xs, ws = (t.cuda() for t in quantize_blockscale(torch.randn(64, 1024), torch.randn(256, 1024)))
    for name in names:
        try:
            out = torch.empty(64, 256, dtype=torch.bfloat16, device="cuda")
            gemm_a8w8_blockscale_triton(XQ, WQ, xs, ws, BlockscaleConfig.from_name(name), out)
            torch.cuda.synchronize()
            print("OK", name, flush=True)
        except Exception as exc:
            print("FAIL", name, str(exc).replace("\n", " ")[:300], flush=True)


# ------------------------------------------------------------------------------------------------ main loop


def bench_shape(M: int, N: int, K: int, cands: list[BlockscaleConfig], status: dict[str, str],
                peak: float, bw: float, op: bool = False, m_major: bool = False) -> tuple[dict, list[dict]]:
    """Time every candidate and the baselines on one shape; returns (summary row, per-candidate rows)."""
    set_bytes = M * K + N * K + 2 * M * N
    n_sets = max(1, min(64, math.ceil(3 * L2_BYTES / set_bytes)))
    sets = []
    for _ in range(n_sets):
        x = torch.randn(M, K, device="cuda")
        w = torch.randn(N, K, device="cuda") * 0.05
        XQ, WQ, xs, ws = quantize_blockscale(x, w)
        sets.append((XQ, WQ, xs.t().contiguous().t() if m_major else xs, ws))
    XQ, WQ, xs, ws = sets[0]
    xd, wd = dequantize_blockscale(XQ, WQ, xs, ws)
    ref = xd @ wd.t()
    ref_norm = ref.norm().item()
    del xd, wd
    flops = 2.0 * M * N * K
    nbytes = M * K + N * K + 2 * M * N + 4 * (M + -(-N // 128)) * -(-K // 128)
    floor_us = max(flops / peak, nbytes / bw) * 1e6

    def run_cfg(cfg: BlockscaleConfig) -> Callable[[int], torch.Tensor]:
        def launch(i: int) -> torch.Tensor:
            a, b, sa, sb = sets[i]
            return gemm_a8w8_blockscale_triton(a, b, sa, sb, cfg, torch.empty(M, N, dtype=torch.bfloat16,
                                                                                 device="cuda"))
        return launch

    rows = []
    dflt = default_config(M, N, K, torch.cuda.get_device_properties(0).multi_processor_count)
    for cfg in dict.fromkeys([*cands, dflt]):
        row = {"M": M, "N": N, "K": K, "config": cfg.name, "us": None, "err": None, "note": ""}
        why = config_error(cfg, M, N, K) or (None if status.get(cfg.name, "ok") == "ok" else status[cfg.name])
        if why:
            row["note"] = why
            rows.append(row)
            continue
        try:
            out = run_cfg(cfg)(0)
            row["err"] = ((out.float() - ref).norm().item() / ref_norm)
            if not row["err"] < MAX_ERR:
                row["note"] = "wrong result"
            else:
                row["us"] = graph_time_us(run_cfg(cfg), n_sets)
        except Exception as exc:
            row["note"] = "error: " + str(exc).splitlines()[0][:200]
        rows.append(row)
    timed = [r for r in rows if r["us"] is not None]
    best = min(timed, key=lambda r: r["us"])
    default_row = next(r for r in rows if r["config"] == dflt.name)

    # The comparisons the summary reports are timed again together, in rounds of alternating order (as every
    # benchmark here: a fixed order biased identical kernels by up to 10% on the H100): the best and the default
    # config, bf16 F.linear of the dequantized weights and activations (what FP8 must beat), torch's block-scaled
    # matmul and, with --op, the dispatched op.
    bf = [tuple(t.to(torch.bfloat16) for t in dequantize_blockscale(*s)) for s in sets]
    measures = {"best": lambda: graph_time_us(run_cfg(BlockscaleConfig.from_name(best["config"])), n_sets),
                "bf16": lambda: graph_time_us(lambda i: torch.nn.functional.linear(bf[i][0], bf[i][1]), n_sets)}
    if default_row["us"] is not None:
        measures["default"] = lambda: graph_time_us(run_cfg(dflt), n_sets)
    tfn, tname = torch_blockscale(*sets[0])
    torch_us, torch_err, prepared = None, None, []
    if tfn is not None:
        torch_err = (tfn().float() - ref).norm().item() / ref_norm
        prepared = [torch_blockscale(*s)[0] for s in sets]
        measures["torch"] = lambda: graph_time_us(lambda i: prepared[i](), n_sets)
    if op:
        op_out = gemm_a8w8_blockscale(*sets[0])
        measures["op"] = lambda: graph_time_us(lambda i: gemm_a8w8_blockscale(*sets[i]), n_sets)
    medians = {k: statistics.median(v) for k, v in interleaved(measures, ROUNDS).items()}
    bf.clear()
    prepared.clear()
    best["us"], bf16_us, torch_us = medians["best"], medians["bf16"], medians.get("torch")
    if "default" in medians:
        default_row["us"] = medians["default"]
    summary = {
        "M": M, "N": N, "K": K, "best_config": best["config"], "us": best["us"], "err": best["err"],
        "tflops": flops / best["us"] / 1e6, "pct_roofline": 100 * floor_us / best["us"], "floor_us": floor_us,
        "default_config": dflt.name, "default_us": default_row["us"],
        "bf16_linear_us": bf16_us, "speedup_vs_bf16": bf16_us / best["us"],
        "torch_blockscale": tname, "torch_blockscale_us": torch_us, "torch_blockscale_err": torch_err,
        "n_sets": n_sets, "n_timed": len(timed),
    }
    if op:  # the dispatched op, as a model calls it
        choice = get_GEMM_A8W8_BLOCKSCALE_config(M, N, K, on_gpu=True)
        op_us = medians["op"]
        summary.update(op_choice=f"{choice['libtype']}:{choice['kernelName']}", op_matched=choice["matched"],
                       op_us=op_us, op_err=(op_out.float() - ref).norm().item() / ref_norm,
                       op_pct_roofline=100 * floor_us / op_us, op_speedup_vs_bf16=bf16_us / op_us)
    sets.clear()
    torch.cuda.empty_cache()
    return summary, rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="folder for results (CSV, JSON, log)")
    ap.add_argument("--ms", default=",".join(map(str, DEFAULT_MS)))
    ap.add_argument("--models", default="dsv3,llama70b", help="comma list of dsv3, llama70b")
    ap.add_argument("--nk", default="", help="explicit N:K pairs, comma separated (overrides --models)")
    ap.add_argument("--explore", action="store_true", help="wider candidate lists (TMA on/off, warp specialization)")
    ap.add_argument("--op", action="store_true", help="also time the dispatched gemm_a8w8_blockscale per shape")
    ap.add_argument("--x_scale_layout", choices=("m_major", "row_major"), default="row_major")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--time-limit", type=float, default=1e9, help="stop starting new shapes after this many s")
    ap.add_argument("--compile-worker", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--emit-json", type=Path, help="best.json of a run: write per-(N, K) JSON configs and exit")
    ap.add_argument("--json-dir", type=Path, default=Path("configs/triton"))
    ap.add_argument("--markdown", type=Path, help="a run's folder: print its BENCHMARKS.md table and exit")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--bw", type=float, default=3.0e12, help="memory roofline in bytes/s")
    args = ap.parse_args(argv)
    if args.compile_worker is not None:
        compile_worker(args.compile_worker)
        return 0
    if args.emit_json:
        return emit_json(args.emit_json, args.json_dir, args.arch)
    if args.markdown:
        return markdown(args.markdown, args.bw)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    t0 = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    ms = [int(m) for m in args.ms.split(",")]
    if args.nk:
        nks = [tuple(map(int, p.split(":"))) for p in args.nk.split(",")]
    else:
        nks = [nk for m in args.models.split(",") for nk in {"dsv3": DSV3_NK, "llama70b": LLAMA70B_NK}[m]]
    props = torch.cuda.get_device_properties(0)
    arch = f"sm_{props.major}{props.minor}"
    log.info("device %s (%s, %d SMs), torch %s", props.name, arch, props.multi_processor_count, torch.__version__)
    ceilings = measure_ceilings()
    log.info("ceilings %s", json.dumps({k: round(v, 2) for k, v in ceilings.items()}))
    all_cands = list(dict.fromkeys(c for n, k in nks for m in ms for c in candidates(m, n, k, args.explore)))
    status = precompile(all_cands, args.workers)
    bad = {k: v for k, v in status.items() if v != "ok"}
    log.info("compiled %d configs in %.0f s; %d failed: %s", len(status), time.time() - t0, len(bad),
             json.dumps(bad)[:3000])
    summaries, all_rows, best = [], [], {}
    for N, K in nks:
        for M in ms:
            if time.time() - t0 > args.time_limit:
                log.info("time limit: skipping M=%d N=%d K=%d", M, N, K)
                continue
            s, rows = bench_shape(M, N, K, candidates(M, N, K, args.explore), status,
                                  ceilings["fp8_peak_tflops"] * 1e12, args.bw, args.op,
                                  args.x_scale_layout == "m_major")
            summaries.append(s)
            all_rows += rows
            best.setdefault(f"{N},{K}", {})[str(M)] = s["best_config"]
            tb = s["torch_blockscale_us"]
            log.info("M=%5d N=%5d K=%5d best %-45s %9.1f us %7.1f TF %5.1f%% roof | bf16 %9.1f us (x%.2f) | "
                     "torch-bs %s | default %s us", M, N, K, s["best_config"], s["us"], s["tflops"],
                     s["pct_roofline"], s["bf16_linear_us"], s["speedup_vs_bf16"],
                     f"{tb:.1f} us" if tb else "n/a", f"{s['default_us']:.1f}" if s["default_us"] else "n/a")
            if args.op:
                log.info("    op %s (%s) %9.1f us, err %.2g", s["op_choice"], s["op_matched"], s["op_us"],
                         s["op_err"])
    _write_csv(args.out / "summary.csv", summaries)
    _write_csv(args.out / "candidates.csv", all_rows)
    meta = {"device": props.name, "arch": arch, "torch": torch.__version__, "triton": _triton_version(),
            "ceilings": ceilings, "bw_roofline": args.bw, "explore": args.explore,
            "x_scale_layout": args.x_scale_layout, "torch_blockscale_reasons":
            sorted({s["torch_blockscale"] for s in summaries if s["torch_blockscale_us"] is None})}
    (args.out / "best.json").write_text(json.dumps({"meta": meta, "best": best}, indent=1))
    _print_report(summaries, ceilings)
    log.info("total %.0f s", time.time() - t0)
    return 0


def _triton_version() -> str:
    import triton

    return triton.__version__


def _write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()})


def _print_report(summaries: list[dict], ceilings: dict) -> None:
    big = [s["pct_roofline"] for s in summaries if s["M"] >= 1024]
    slow = [s for s in summaries if s["M"] >= 64 and s["speedup_vs_bf16"] <= 1.0]
    print(f"\nFP8 peak {ceilings['fp8_peak_tflops']:.0f} TFLOP/s, measured copy {ceilings['copy_TBps']:.2f} TB/s")
    if big:
        print(f"geomean % of roofline, M >= 1024: {math.exp(statistics.mean(map(math.log, big))):.1f}% "
              f"({len(big)} shapes)")
    print(f"M >= 64 shapes not faster than bf16 F.linear: {len(slow)} "
          + " ".join(f"({s['M']},{s['N']},{s['K']})" for s in slow))


def markdown(run_dir: Path, bw: float) -> int:
    """Print a run's summary.csv as a BENCHMARKS.md table, % of roofline recomputed from the raw times with the
    run's measured FP8 peak and ``bw`` (runs before 06:06 UTC 2026-11-21 logged it with other constants). A run made
    with ``--op`` is reported on the dispatched op's times (the best Triton config's beside them)."""
    meta = json.loads((run_dir / "best.json").read_text())["meta"]
    peak = meta["ceilings"]["fp8_peak_tflops"] * 1e12
    rows = list(csv.DictReader(open(run_dir / "summary.csv")))
    op = bool(rows) and "op_us" in rows[0]
    model = {nk: "DeepSeek-V3" for nk in DSV3_NK} | {nk: "Llama-3-70B" for nk in LLAMA70B_NK}
    print(f"{meta['device']}, torch {meta['torch']}, triton {meta['triton']}; FP8 peak {peak / 1e12:.0f} TFLOP/s "
          f"(torch._scaled_mm 8192^3 per-tensor), memory roofline {bw / 1e12:.1f} TB/s\n")
    if op:
        print("| model | M | N | K | gemm_a8w8_blockscale runs (matched) | us | TFLOP/s | % roofline | bf16 F.linear "
              "us | speed-up vs bf16 | best Triton config us | torch blockwise us |")
    else:
        print("| model | M | N | K | block-scale config | us | TFLOP/s | % roofline | bf16 F.linear us | speed-up vs "
              "bf16 | torch blockwise us | ours / torch |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    pct_big, slow, per_model = [], [], {}
    tf_fmt = lambda tf: f"{tf:.0f}" if tf >= 100 else f"{tf:.1f}"  # noqa: E731
    for r in rows:
        M, N, K = int(r["M"]), int(r["N"]), int(r["K"])
        us, bf16 = float(r["op_us" if op else "us"]), float(r["bf16_linear_us"])
        nbytes = M * K + N * K + 2 * M * N + 4 * (M + -(-N // 128)) * -(-K // 128)
        pct = 100 * max(2.0 * M * N * K / peak, nbytes / bw) * 1e6 / us
        tb = float(r["torch_blockscale_us"]) if r["torch_blockscale_us"] else None
        if M >= 1024:
            pct_big.append(pct)
            per_model.setdefault(model.get((N, K), "other"), []).append(pct)
        if M >= 64 and bf16 <= us:
            slow.append(f"({M}, {N}, {K})")
        what = f"`{r['op_choice']}` ({r['op_matched']})" if op else f"`{r['best_config']}`"
        tail = (f"{float(r['us']):.1f} | {f'{tb:.1f}' if tb else 'n/a'}" if op
                else f"{f'{tb:.1f}' if tb else 'n/a'} | {f'{us / tb:.2f}' if tb else 'n/a'}")
        print(f"| {model.get((N, K), '')} | {M} | {N} | {K} | {what} | {us:.1f} | {tf_fmt(2.0 * M * N * K / us / 1e6)} "
              f"| {pct:.0f}% | {bf16:.1f} | {bf16 / us:.2f}x | {tail} |")
    geo = math.exp(statistics.mean(map(math.log, pct_big))) if pct_big else float("nan")
    print(f"\nGeomean % of roofline over the {len(pct_big)} shapes with M >= 1024: {geo:.1f}% (target >= 85%); "
          + "; ".join(f"{m}: {math.exp(statistics.mean(map(math.log, v))):.1f}% ({len(v)} shapes)"
                      for m, v in per_model.items()) + ".")
    print(f"M >= 64 shapes not faster than bf16 F.linear: {len(slow)} of "
          f"{sum(int(r['M']) >= 64 for r in rows)}: {', '.join(slow) or 'none'}.")
    return 0


def emit_json(best_path: Path, json_dir: Path, arch: str) -> int:
    """Per-(N, K) JSON files from a run's best.json (bucket per tuned M, see aiter_gemm.blockscale)."""
    best = json.loads(best_path.read_text())["best"]
    for nk, per_m in best.items():
        N, K = map(int, nk.split(","))
        tuned = {int(m): BlockscaleConfig.from_name(name) for m, name in per_m.items()}
        path = json_config_path(json_dir, arch, N, K)
        write_json_configs(path, buckets_from_tuned(tuned))
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

