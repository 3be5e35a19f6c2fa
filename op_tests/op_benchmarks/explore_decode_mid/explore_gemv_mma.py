"""Time an exploration kernel family against F.linear, the tuned dispatch as shipped and the M = 1 gemv streaming the
same weight. Families: ``gmma`` (``gemv_mma.py``: the gemv kernel's structure in Triton with tensor-core products),
``tc`` (``tcgemv.cu``: mma.sync fed by the weight straight from global memory), ``cl`` (``clgemv.cu``: the same
products with the activation slice resident in shared memory and the K splits reduced inside a thread-block
cluster), ``ws`` (``wsgemm.py``: a warp-specialised Gluon kernel, TMA or cp.async producer warps feeding wgmma
consumer warpgroups, one tile per CTA or persistent).

Per shape: every config of the family's ``grid_configs`` (gmma, ws: compiled first in parallel worker processes into
Triton's cache, gmma with N, K, M constexpr, a binary per config and shape; tc, cl: cubins built ahead with nvcc,
``--cubins``, else NVRTC on first use), checked against float32 on fresh inputs with the output poisoned with NaN
(``explore_decode_mid_h100.check``), screened with ``gradlib.timing`` (CUDA-graph replay over rotating buffers > 2x
L2), then the 5 fastest, the M = 1 ``gemv`` streaming the same weight (a bandwidth reference), the shipped dispatch
(``gemm_a16w16``) and F.linear in paired rounds (``time_paired``).

  python op_tests/op_benchmarks/explore_decode_mid/explore_gemv_mma.py --out $OUT --shapes 32x1280x8192,64x4096x4096
  python -c "from op_tests.op_benchmarks.explore_decode_mid import tcgemv as tc; ..."   # tc.build_cubins(cfgs, dir)
  python op_tests/op_benchmarks/explore_decode_mid/explore_gemv_mma.py --family tc --cubins .tccubins --out $OUT ...
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gradlib.timing import time_paired  # noqa: E402
from op_tests.op_benchmarks.explore_decode_mid import clgemv as cl  # noqa: E402
from op_tests.op_benchmarks.explore_decode_mid import gemv_mma as gm  # noqa: E402
from op_tests.op_benchmarks.explore_decode_mid import tcgemv as tc  # noqa: E402
from op_tests.op_benchmarks.explore_decode_mid import wsgemm as ws  # noqa: E402
from op_tests.op_benchmarks.explore_decode_mid.explore_decode_mid_h100 import (  # noqa: E402
    PAIRED_TIMING,
    SCREEN_TIMING,
    Rotating,
    check,
    floor_us,
    paired_medians,
    write_csv,
)


class Family:
    """The kernel family under test: its grid, config parser and launcher (out = a @ b.T)."""

    def __init__(self, name: str, cluster: bool = False):
        self.name = name
        self.mod = {"gmma": gm, "tc": tc, "cl": cl, "ws": ws}[name]
        self.cluster = cluster  # ws: the grid with wsgemm_cluster's configs (--cluster)

    def grid(self, M, N, K, cu):
        if self.name == "ws":
            return ws.grid_configs(M, N, K, cu, cluster=self.cluster)
        return self.mod.grid_configs(M, N, K, cu)

    def launcher(self, cfg_name):
        if self.name == "gmma":
            cfg = gm.GemvMmaConfig.from_name(cfg_name)
            return lambda a, b, out: gm.launch_gemv_mma(a, b, out, cfg)
        if self.name == "ws":
            wcfg = ws.WsGemmConfig.from_name(cfg_name)
            return lambda a, b, out: ws.launch_wsgemm(a, b, None, out, wcfg)
        if self.name == "cl":
            ccfg = cl.ClGemvConfig.from_name(cfg_name)
            return lambda a, b, out: cl.launch_clgemv(a, b, None, out, ccfg)
        cfg = tc.TcGemvConfig.from_name(cfg_name)
        return lambda a, b, out: tc.launch_tcgemv(a, b, None, out, cfg)




def _compile(task):
    family, M, N, K, names = task
    torch.cuda.init()
    a = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(N, K, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    bad = []
    for n in names:
        try:
            Family(family).launcher(n)(a, b, out)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001
            bad.append((n, f"{type(exc).__name__}: {str(exc)[:200]}"))
    return bad


def diag_stream_configs(M, N, K, cu) -> list[str]:
    """ws --stream: the weight stream alone over the wide grid, with the epilogue and split-K fix-up (D3: no wgmma,
    no activation copies) and without (D4)."""
    return [ws.WsGemmConfig(**{**c.__dict__, "D": d}).name for c in ws.grid_configs(M, N, K, cu, wide=True)
            if not c.PS for d in (3, 4)]


def precompile(fam: Family, shapes, cu, workers, stream: bool = False):
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    tasks = []
    for M, N, K in shapes:
        names = [c.name for c in fam.grid(M, N, K, cu)]
        if stream and fam.name == "ws":
            names += diag_stream_configs(M, N, K, cu)
        tasks += [(fam.name, M, N, K, names[i:i + 4]) for i in range(0, len(names), 4)]
    bad = {}
    t0 = time.time()
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        for (_, M, N, K, _), res in zip(tasks, pool.map(_compile, tasks)):
            for n, err in res:
                bad[(M, N, K, n)] = err
    print(f"precompiled {sum(len(t[4]) for t in tasks)} kernels in {time.time() - t0:.0f}s, {len(bad)} failed",
          flush=True)
    for key, err in list(bad.items())[:5]:
        print(f"   {key}: {err}", flush=True)
    return bad


def measure(fam: Family, M: int, N: int, K: int, cu: int, bad: dict, pairs: int, rows: list, summary: list,
            diag: bool = False, stream: bool = False) -> None:
    """Check and screen every grid config of one shape, then pair the 5 fastest with F.linear and the M = 1 gemv."""
    from aiter_gemm.kernels.skinny import SkinnyConfig, launch_skinny
    gemv_cfg = SkinnyConfig.from_name("gemv_BN1_BK2048_SK1_W4_S1_EF")
    dev = torch.device("cuda")
    rot = Rotating(M, N, K, dev)
    nset, sets = rot.n, rot.sets
    cands = {}
    for c in fam.grid(M, N, K, cu):
        if (M, N, K, c.name) in bad:
            rows.append(dict(M=M, N=N, K=K, config=c.name, err="compile: " + bad[(M, N, K, c.name)]))
            continue
        fn = fam.launcher(c.name)
        try:
            ok, e, why = check(fn, M, N, K, "cuda", torch.bfloat16)
        except Exception as exc:  # noqa: BLE001 - recorded, skipped
            rows.append(dict(M=M, N=N, K=K, config=c.name, err=f"{type(exc).__name__}: {str(exc)[:200]}"))
            continue
        if not ok:
            rows.append(dict(M=M, N=N, K=K, config=c.name, err=why))
            continue
        us = rot.time(fn, SCREEN_TIMING)
        rows.append(dict(M=M, N=N, K=K, config=c.name, err=f"{e:.1e}", screen_us=round(us, 3)))
        cands[c.name] = (us, fn)
    best = sorted(cands, key=lambda n: cands[n][0])[:5]
    clusters = sorted((n for n in cands if "_CL" in n), key=lambda n: cands[n][0])
    if fam.cluster and clusters:  # the fastest cluster config in the paired rounds too, and the one diagnosed
        best = [clusters[0]] + [n for n in best if n != clusters[0]]
    if stream and fam.name == "ws":  # the weight stream alone (D3: no wgmma, no activation) over the wide grid
        streams = {}
        for n in diag_stream_configs(M, N, K, cu):
            if (M, N, K, n) in bad:
                continue
            try:
                streams[n] = rot.time(fam.launcher(n), SCREEN_TIMING)
            except Exception as exc:  # noqa: BLE001 - recorded, skipped
                rows.append(dict(M=M, N=N, K=K, config=n, err=f"{type(exc).__name__}: {str(exc)[:200]}"))
                continue
            rows.append(dict(M=M, N=N, K=K, config=n, err="diag, unchecked", screen_us=round(streams[n], 3)))
        for d in (3, 4):
            top = sorted((n for n in streams if f"_D{d}" in n), key=streams.get)[:8]
            print(f"M={M} N={N} K={K}: weight stream alone (D{d}), {len(streams)} configs, fastest: "
                  + ", ".join(f"{n} {streams[n]:.2f}" for n in top), flush=True)
    from aiter_gemm import gemm_a16w16
    for i in range(nset):  # the dispatch decides (and compiles) each shape on its first eager call
        gemm_a16w16(sets[i][0], sets[i][1])
    calls = {"F.linear": lambda i: F.linear(sets[i][0], sets[i][1]),
             "gemv@M1": lambda i: launch_skinny(sets[i][0][:1], sets[i][1], None, torch.bfloat16, gemv_cfg),
             "dispatch": lambda i: gemm_a16w16(sets[i][0], sets[i][1])}
    for n in best:
        calls[n] = (lambda i, f=cands[n][1]: f(*sets[i]))
    if diag and fam.name == "cl" and best:  # where the best config's time goes (clgemv.cu's CL_DIAG)
        base_cfg = cl.ClGemvConfig.from_name(best[0])
        for d in (2, 3, 4, 5):
            if d == 2 and base_cfg.S == 1:
                continue
            n = cl.ClGemvConfig(**{**base_cfg.__dict__, "D": d}).name
            calls[n + " (diag, unchecked)"] = (lambda i, f=fam.launcher(n): f(*sets[i]))
    base_ws = ws.WsGemmConfig.from_name(best[0]) if fam.name == "ws" and best else None
    if diag and base_ws is not None and not base_ws.PS:  # without its products, activation copies, both, epilogue
        for d in (1, 2, 3, 4, 6, 7):
            dcfg = ws.WsGemmConfig(**{**base_ws.__dict__, "D": d})
            if ws.config_error(dcfg, M, N, K) is None:  # a cluster config: D 4, 6, 7 (wsgemm_cluster; D 8
                # faulted: a CTA exiting while a bulk copy still read its shared memory)
                calls[dcfg.name + " (diag, unchecked)"] = (lambda i, f=fam.launcher(dcfg.name): f(*sets[i]))
    samples = time_paired(calls, nset, PAIRED_TIMING, pairs, captures=2)
    floor = floor_us(M, N, K)
    print(f"M={M} N={N} K={K}: floor {floor:.2f} us, {len(cands)} configs timed", flush=True)
    for n, (med, ratio) in paired_medians(samples, "F.linear").items():
        print(f"   {n:36s} {med:8.2f} us  x{ratio:.3f} F.linear  {floor / med:.3f} of floor", flush=True)
        summary.append(dict(M=M, N=N, K=K, method=n, us=round(med, 3), vs_flinear=round(ratio, 4),
                            frac_floor=round(floor / med, 4)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", required=True, help="MxNxK,...")
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--deadline_s", type=float, default=480)
    ap.add_argument("--family", choices=["gmma", "tc", "cl", "ws"], default="gmma")
    ap.add_argument("--diag", action="store_true", help="cl: also time the best config without its cluster "
                    "reduction, its products, its activation copies, its ldmatrix reads (clgemv.cu's CL_DIAG 2-5); "
                    "ws: without its wgmma, its activation copies, both, and its epilogue (wsgemm D 1-4); wrong "
                    "results: timing only")
    ap.add_argument("--stream", action="store_true", help="ws: also screen the weight stream alone (D3, D4) over "
                    "the wide grid (timing only)")
    ap.add_argument("--cluster", action="store_true", help="ws: the grid with epilogue layout 0 only plus the "
                    "cluster configs whose K splits are summed through DSMEM (wsgemm_cluster.py, Triton >= 3.9)")
    ap.add_argument("--cubins", type=Path, help="tc, cl: folder of cubins built ahead (tcgemv/clgemv.build_cubins)")
    args = ap.parse_args()
    t0 = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    cu = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    fam = Family(args.family, args.cluster)
    if args.family in ("gmma", "ws"):
        bad = precompile(fam, shapes, cu, args.workers, args.stream)
    else:
        tc.CUBIN_DIR = cl.CUBIN_DIR = args.cubins
        bad = {}
    rows: list[dict] = []
    summary: list[dict] = []
    for M, N, K in shapes:
        if time.time() - t0 > args.deadline_s:
            print("deadline", flush=True)
            break
        measure(fam, M, N, K, cu, bad, args.pairs, rows, summary, args.diag, args.stream)
        torch.cuda.empty_cache()
    write_csv(args.out / "screen.csv", rows)
    write_csv(args.out / "paired.csv", summary)
    print(f"done in {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
