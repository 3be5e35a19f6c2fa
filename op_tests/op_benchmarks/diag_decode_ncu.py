"""Where does a decode GEMM's time go at M = 1..256? CUDA-graph time per call against Nsight Compute's in-kernel time.

Issue 14: at M 17-256 every tensor-core kernel measured here (cuBLAS, the Triton GEMM, the decode family under
``explore_decode_mid/``) spends ~3-5 us per call beyond weight bytes / 3.0 TB/s, the M = 1 ``gemv`` ~1.2-1.7 us.
This script separates the two parts of that overhead for a few (M, N, K) and methods:

* ``--mode time``: per shape, every method in paired CUDA-graph replays over rotating buffers > 2x L2
  (``gradlib.timing.time_paired``): the per-call time a served model sees, launch gaps included;
* ``--mode ncu``: the same methods once each (after a warm-up), between ``cudaProfilerStart/Stop``, every group
  preceded by a ``spin_kernel`` marker (``torch.cuda._sleep``) so that the kernels can be assigned to methods; run it
  under ``ncu --profile-from-start off`` (see ``run_diag_decode_ncu.sh``), which flushes the caches before each
  kernel and reports its duration, DRAM bytes, occupancy and launch shape;
* ``--mode join``: joins the two into one table (graph us, kernel us, their difference, DRAM bytes over the weight).

Methods: ``flinear`` (cuBLAS), ``copy`` (``out.copy_(src)`` moving as many bytes as the weight, read + write: the
simplest memory-bound kernel), ``gemv`` (the M <= 8 skinny kernel, shipped tile), and decode-family configs by name
(``dec:<name>``), the tensor-core gemv exploration (``tc:<name>``, cubins from ``.tccubins`` when present) and the
cluster split-K gemv (``cl:<name>``, cubins from ``.tccubins/cl``) and the weight-stream probe (``ws:<name>``,
``probe_wstream.py``: no product, wrong output, profile only).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gradlib.timing import TimingConfig, cache_bytes, rotating_sets, time_paired  # noqa: E402

PEAK_BW = 3.0e12
# (M, N, K, methods): the small weights where every tensor-core kernel sits at 0.55-0.8 of the floor, one large one.
DEFAULT_PLAN = [
    (1, 1280, 8192, ["flinear", "copy", "gemv_BN1_BK2048_SK1_W4_S1_EF"]),
    (1, 4096, 4096, ["flinear", "copy", "gemv_BN1_BK2048_SK1_W4_S1_EF"]),
    (32, 1280, 8192, ["flinear", "dec:BM16_BN64_BK128_SK3_W4_S6_SW_FX_TMA", "dec:BM16_BN64_BK128_SK3_W4_S6_SW_TMA",
                      "dec:BM16_BN64_BK128_SK1_W4_S6_SW_TMA", "dec:BM32_BN64_BK128_SK6_W4_S5_SW_TMA"]),
    (64, 1280, 8192, ["flinear", "copy", "dec:BM16_BN64_BK128_SK3_W4_S5_SW_FX_TMA",
                      "dec:BM64_BN64_BK128_SK3_W4_S6_TMA"]),
    (64, 4096, 4096, ["flinear", "copy", "dec:BM32_BN64_BK128_SK1_W4_S6_SW_TMA", "dec:BM64_BN64_BK128_SK1_W4_S6_TMA",
                      "dec:BM64_BN64_BK128_SK2_W4_S4_TMA"]),
    (64, 8192, 1024, ["flinear", "copy", "dec:BM32_BN64_BK128_SK1_W4_S4_SW_TMA",
                      "dec:BM64_BN64_BK128_SK1_W4_S4_TMA"]),
    (64, 7168, 8192, ["flinear", "copy", "dec:BM64_BN64_BK128_SK1_W4_S5_TMA"]),
    (128, 1280, 8192, ["flinear", "dec:BM64_BN64_BK128_SK3_W4_S6_TMA"]),
    (256, 4096, 4096, ["flinear", "dec:BM128_BN64_BK64_SK1_W4_S8_TMA"]),
]


class Shape:
    """Rotating (A, B, C, copy-src, copy-dst) sets for one (M, N, K) spanning >= 2x the L2."""

    def __init__(self, M: int, N: int, K: int, n_sets: int | None = None):
        dev = torch.device("cuda")
        set_bytes = (M * K + N * K + M * N) * 2 * 2
        self.n = n_sets or rotating_sets(set_bytes, cache_bytes(dev), torch.cuda.mem_get_info(dev)[0])
        half = N * K // 2  # copy: half the weight's elements read + written = the weight's bytes moved
        self.sets = [(torch.randn(M, K, dtype=torch.bfloat16, device=dev),
                      torch.randn(N, K, dtype=torch.bfloat16, device=dev),
                      torch.empty(M, N, dtype=torch.bfloat16, device=dev),
                      torch.randn(half, dtype=torch.bfloat16, device=dev),
                      torch.empty(half, dtype=torch.bfloat16, device=dev)) for _ in range(self.n)]


def method_fn(name: str, M: int, N: int, K: int, cu: int):
    """(a, b, out, src, dst) -> None for one method."""
    if name == "flinear":
        return lambda a, b, out, src, dst: F.linear(a, b)
    if name == "copy":
        return lambda a, b, out, src, dst: dst.copy_(src)
    if name.startswith("tc:"):
        from op_tests.op_benchmarks.explore_decode_mid import tcgemv as tc
        if tc.CUBIN_DIR is None and (ROOT / ".tccubins").is_dir():
            tc.CUBIN_DIR = ROOT / ".tccubins"
        cfg = tc.TcGemvConfig.from_name(name[3:])
        return lambda a, b, out, src, dst: tc.launch_tcgemv(a, b, None, out, cfg)
    if name.startswith("cl:"):
        from op_tests.op_benchmarks.explore_decode_mid import clgemv as cl
        if cl.CUBIN_DIR is None and (ROOT / ".tccubins" / "cl").is_dir():
            cl.CUBIN_DIR = ROOT / ".tccubins" / "cl"
        ccfg = cl.ClGemvConfig.from_name(name[3:])
        return lambda a, b, out, src, dst: cl.launch_clgemv(a, b, None, out, ccfg)
    if name.startswith("ws:"):  # weight stream only (probe_wstream): a sink output, no product
        from op_tests.op_benchmarks.explore_decode_mid import probe_wstream as pw
        if pw.CUBIN_DIR is None and (ROOT / ".tccubins" / "ws").is_dir():
            pw.CUBIN_DIR = ROOT / ".tccubins" / "ws"
        wcfg = pw.WsConfig.from_name(name[3:])
        sink = torch.empty(1 << 22, dtype=torch.int32, device="cuda")
        return lambda a, b, out, src, dst: pw.launch(wcfg, b, sink)
    if name.startswith("dec:"):
        from op_tests.op_benchmarks.explore_decode_mid import gemm_decode as gd
        cfg = gd.DecodeConfig.from_name(name[4:])
        return lambda a, b, out, src, dst: gd.launch_gemm_decode(a, b, None, out, cfg, cu)
    from aiter_gemm.kernels.skinny import SkinnyConfig, launch_skinny
    cfg = SkinnyConfig.from_name(name)
    return lambda a, b, out, src, dst: launch_skinny(a, b, None, torch.bfloat16, cfg)


def check(fn, M: int, N: int, K: int) -> float:
    """Relative error of a GEMM method against float32 (``explore_decode_mid_h100.check``: fresh inputs, output
    poisoned with NaN)."""
    from op_tests.op_benchmarks.explore_decode_mid.explore_decode_mid_h100 import check as check_gemm
    return check_gemm(lambda a, b, out: fn(a, b, out, None, None), M, N, K, "cuda", torch.bfloat16)[1]


def parse_plan(text: str | None):
    if not text:
        return DEFAULT_PLAN
    return [tuple(x) for x in json.loads(Path(text).read_text())]


def mode_time(plan, out: Path, pairs: int) -> None:
    cu = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for M, N, K, methods in plan:
        shape = Shape(M, N, K)
        fns = {m: method_fn(m, M, N, K, cu) for m in methods}
        errs = {m: (check(f, M, N, K) if m != "copy" else 0.0) for m, f in fns.items()}
        calls = {m: (lambda i, f=f, s=shape: f(*s.sets[i])) for m, f in fns.items()}
        cfg = TimingConfig(warmup=5, reps=11, target_us=600.0, budget_s=0.5)
        samples = time_paired(calls, shape.n, cfg, pairs, captures=2)
        floor = N * K * 2 / PEAK_BW * 1e6
        for m in methods:
            us = statistics.median(samples[m])
            rows.append(dict(M=M, N=N, K=K, method=m, graph_us=round(us, 3), floor_us=round(floor, 3),
                             frac_floor=round(floor / us, 4), rel_err=f"{errs[m]:.2e}",
                             spread=round((max(samples[m]) - min(samples[m])) / us, 4)))
            print(f"M={M:4d} N={N:6d} K={K:6d} {m:45s} {us:8.2f} us  floor {floor:7.2f}  "
                  f"frac {floor / us:.3f}  err {errs[m]:.1e}", flush=True)
        shape = None
        torch.cuda.empty_cache()
    with open(out / "graph_times.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def mode_ncu(plan, out: Path) -> None:
    cu = torch.cuda.get_device_properties(0).multi_processor_count
    order = []
    jobs = []
    for M, N, K, methods in plan:
        shape = Shape(M, N, K, n_sets=2)
        for m in methods:
            fn = method_fn(m, M, N, K, cu)
            for i in range(3):  # compile, autotune caches, cuBLAS handles
                fn(*shape.sets[i % 2])
            jobs.append((fn, shape))
            order.append(dict(M=M, N=N, K=K, method=m))
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for fn, shape in jobs:
        torch.cuda._sleep(100)  # marker: spin_kernel starts each group
        fn(*shape.sets[1])
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    (out / "ncu_order.json").write_text(json.dumps(order, indent=1))


def _num(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return math.nan


def mode_join(out: Path) -> None:
    order = json.loads((out / "ncu_order.json").read_text())
    with open(out / "ncu_raw.csv") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    reader = list(csv.reader(lines))
    header, units, data = reader[0], reader[1], reader[2:]
    col = {h: i for i, h in enumerate(header)}
    groups: list[list[list[str]]] = []
    for row in data:
        if "spin_kernel" in row[col["Kernel Name"]]:
            groups.append([])
        elif groups:
            groups[-1].append(row)
    graph = {}
    gpath = out / "graph_times.csv"
    if gpath.exists():
        for r in csv.DictReader(open(gpath)):
            graph[(int(r["M"]), int(r["N"]), int(r["K"]), r["method"])] = float(r["graph_us"])
    rows = []
    for meta, kernels in zip(order, groups):
        dur = sum(_num(k[col["gpu__time_duration.sum"]]) for k in kernels)  # ns (unit row says)
        unit = units[col["gpu__time_duration.sum"]]
        dur_us = dur * {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[unit]
        read = sum(_num(k[col["dram__bytes_read.sum"]]) * _scale(units[col["dram__bytes_read.sum"]]) for k in kernels)
        key = (meta["M"], meta["N"], meta["K"], meta["method"])
        g = graph.get(key, math.nan)
        first = kernels[0] if kernels else None

        def get(name, first=first):
            return first[col[name]] if first is not None and name in col else ""

        rows.append(dict(**meta, kernels=len(kernels), names=";".join(k[col["Kernel Name"]][:40] for k in kernels),
                         kernel_us=round(dur_us, 3), graph_us=g, gap_us=round(g - dur_us, 3),
                         dram_read_MB=round(read / 1e6, 2), weight_MB=round(meta["N"] * meta["K"] * 2 / 1e6, 2),
                         kernel_TBps=round(read / (dur_us * 1e-6) / 1e12, 3) if dur_us else math.nan,
                         grid=get("launch__grid_size"), block=get("launch__block_size"),
                         regs=get("launch__registers_per_thread"),
                         smem=get("launch__shared_mem_per_block_dynamic"),
                         occ=get("sm__warps_active.avg.pct_of_peak_sustained_active"),
                         dram_pct=get("dram__throughput.avg.pct_of_peak_sustained_elapsed")))
    with open(out / "joined.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"{'M':>4} {'N':>6} {'K':>6} {'method':44s} {'krn':>3} {'kern_us':>8} {'graph_us':>8} {'gap':>6} "
          f"{'MB rd':>7} {'TB/s':>6} {'grid':>7} {'occ%':>6} {'dram%':>6}")
    for r in rows:
        print(f"{r['M']:4d} {r['N']:6d} {r['K']:6d} {r['method'][:44]:44s} {r['kernels']:3d} {r['kernel_us']:8.2f} "
              f"{r['graph_us']:8.2f} {r['gap_us']:6.2f} {r['dram_read_MB']:7.1f} {r['kernel_TBps']:6.2f} "
              f"{r['grid']:>7} {r['occ']:>6} {r['dram_pct']:>6}")


def _scale(unit: str) -> float:
    return {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}.get(unit, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["time", "ncu", "join"], required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--plan", help="JSON file: [[M, N, K, [methods...]], ...] (default: DEFAULT_PLAN)")
    p.add_argument("--pairs", type=int, default=16)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    plan = parse_plan(args.plan)
    if args.mode == "time":
        mode_time(plan, args.out, args.pairs)
    elif args.mode == "ncu":
        mode_ncu(plan, args.out)
    else:
        mode_join(args.out)


if __name__ == "__main__":
    main()
