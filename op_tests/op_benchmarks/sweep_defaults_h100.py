"""Where should the heuristic defaults claim a shape? The measurements behind them (issue 13: "a default claims a shape
for a backend only where measurement shows it wins over the library call on this device class, with margin").

A. gemm_a16w16, M <= 16: the skinny default config (``default_skinny_config``) against F.linear, CUDA-graph timing,
   on the shipped Llama (N, K) and on held-out models' (Qwen2.5-7B, Phi-3-mini, Gemma-2-9B, Llama-3.2-3B),
   M in 1, 2, 3, 4, 5, 8, 12, 16.
B. Eager per-call wall time (a loop of calls on one input set, host-bound at small M): F.linear, gemm_a16w16 (the
   runtime as configured: its eager choice) and the skinny kernel launched directly (Triton's Python launcher).
C. gemm_a8w8_blockscale: our Triton default config against torch's block-scaled F.scaled_mm (cuBLASLt) on the shipped
   DeepSeek-V3 / Llama-3-70B (N, K), M in 1 .. 4096 (on- and off-grid), CUDA-graph timing; eager at a few M.

Every method is checked against the float32 reference first (rel err printed), then timed over rotating input sets
larger than twice the L2, in alternating order between methods (gradlib.timing.interleaved), median of rounds.

    python op_tests/op_benchmarks/sweep_defaults_h100.py --out $OUT [--parts A,B,C]
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
from aiter_gemm.blockscale import TorchBlockwise, solution_of  # noqa: E402
from aiter_gemm.kernels import a8w8_blockscale_torch as torch_bs  # noqa: E402
from aiter_gemm.kernels.a8w8_blockscale import (  # noqa: E402
    default_config,
    gemm_a8w8_blockscale_ref,
    quantize_blockscale,
)
from aiter_gemm.kernels.skinny import default_skinny_config, launch_skinny  # noqa: E402
from gradlib.timing import TimingConfig, cache_bytes, interleaved, rotating_sets, time_runner  # noqa: E402

BF16 = torch.bfloat16
SHIPPED_NK = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (1280, 8192), (8192, 1024), (7168, 8192),
              (8192, 3584)]
HELDOUT_NK = [  # qkv, o, gate_up, down of four other models (none of them in the shipped CSV)
    (4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944),  # Qwen2.5-7B
    (9216, 3072), (3072, 3072), (16384, 3072), (3072, 8192),  # Phi-3-mini
    (8192, 3584), (3584, 4096), (28672, 3584), (3584, 14336),  # Gemma-2-9B
    (5120, 3072),  # Llama-3.2-3B qkv (its o / gate_up / down equal Phi-3-mini's)
]
SKINNY_MS = [1, 2, 3, 4, 5, 8, 12, 16]
BS_NK = [(2112, 7168), (3072, 1536), (4096, 512), (7168, 2048), (256, 7168), (512, 7168), (10240, 8192),
         (8192, 8192), (57344, 8192), (8192, 28672)]
BS_MS = [1, 4, 16, 33, 64, 100, 256, 500, 1024, 2000, 4096]
TIMING = TimingConfig(warmup=5, reps=9, target_us=300.0, budget_s=0.4)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o = out.double()
    if not bool(torch.isfinite(o).all()):
        return math.inf
    return float(torch.linalg.vector_norm(o - ref.double()) / torch.linalg.vector_norm(ref.double()))


class Sweep:
    def __init__(self, out: Path, deadline: float) -> None:
        self.out, self.deadline, self.rows = out, deadline, []
        self.dev = torch.device("cuda")
        self.cache = cache_bytes(self.dev)
        self.t0 = time.monotonic()

    def left(self) -> float:
        return self.deadline - (time.monotonic() - self.t0)

    def record(self, **row) -> None:
        self.rows.append(row)

    def graph_compare(self, part: str, M: int, N: int, K: int, sets: list, ref: torch.Tensor,
                      methods: dict) -> dict[str, float]:
        """Check every method on set 0, then time them over the rotating sets in alternating rounds."""
        n = len(sets)
        timed = {}
        for name, fn in methods.items():
            try:
                err = rel_err(fn(*sets[0]), ref)
            except Exception as exc:  # noqa: BLE001 - a method that cannot run is recorded, not fatal
                self.record(part=part, M=M, N=N, K=K, method=name, mode="graph", us="", rel_err="",
                            error=f"{type(exc).__name__}: {exc}"[:200])
                continue
            timed[name] = (fn, err)
        got = interleaved({k: (lambda f=f: time_runner(lambda i: f(*sets[i]), n, self.dev, TIMING).us)
                           for k, (f, _) in timed.items()}, 2)
        med = {}
        for k, (_, err) in timed.items():
            med[k] = statistics.median(got[k])
            self.record(part=part, M=M, N=N, K=K, method=k, mode="graph", us=f"{med[k]:.3f}", rel_err=f"{err:.2e}",
                        rounds=";".join(f"{v:.3f}" for v in got[k]), error="")
        return med

    def write(self) -> None:
        keys = ["part", "M", "N", "K", "method", "mode", "us", "rel_err", "rounds", "error"]
        with open(self.out / "sweep_defaults.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
            w.writeheader()
            for r in self.rows:
                w.writerow({k: r.get(k, "") for k in keys})


def part_a(s: Sweep) -> None:
    cu = torch.cuda.get_device_properties(0).multi_processor_count
    for nk_list, tag in ((SHIPPED_NK, "shipped"), (HELDOUT_NK, "heldout")):
        for N, K in nk_list:
            if s.left() < 60:
                print("part A: deadline, stopping", flush=True)
                return
            gen = torch.Generator(device=s.dev).manual_seed(N + K)
            w = (torch.randn(N, K, generator=gen, device=s.dev) / K ** 0.5).to(BF16)
            nsets = rotating_sets(N * K * 2, s.cache, torch.cuda.mem_get_info()[0])
            ws = [w] + [w.clone() for _ in range(nsets - 1)]
            for M in SKINNY_MS:
                x = torch.randn(M, K, generator=gen, device=s.dev).to(BF16)
                sets = [(x, wi) for wi in ws]
                ref = x.float() @ w.float().t()
                cfg = default_skinny_config(M, N, K, cu)
                med = s.graph_compare(f"A-{tag}", M, N, K, sets, ref, {
                    "F.linear": lambda a, b: F.linear(a, b),
                    f"skinny_default:{cfg.name}": lambda a, b, c=cfg: launch_skinny(a, b, None, BF16, c),
                })
                vals = list(med.values())
                if len(vals) == 2:
                    print(f"A {tag:7} M={M:2} N={N:5} K={K:5} F.linear {vals[0]:8.2f} skinny {vals[1]:8.2f} "
                          f"x{vals[0] / vals[1]:.3f} {cfg.name}", flush=True)
            del ws, w


def eager_us(fn, calls: int = 200) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def part_b(s: Sweep) -> None:
    cu = torch.cuda.get_device_properties(0).multi_processor_count
    for M, N, K in ((1, 4096, 4096), (8, 4096, 4096), (1, 1280, 8192), (1, 28672, 4096), (16, 8192, 3584),
                    (1, 4608, 3584)):
        x = torch.randn(M, K, device=s.dev, dtype=BF16)
        w = torch.randn(N, K, device=s.dev, dtype=BF16) / K ** 0.5
        cfg = default_skinny_config(M, N, K, cu)
        dec = aiter_gemm.get_GEMM_A16W16_config(M, N, K, False, BF16)
        methods = {"F.linear": lambda x=x, w=w: F.linear(x, w),
                   "gemm_a16w16": lambda x=x, w=w: aiter_gemm.gemm_a16w16(x, w),
                   f"skinny_direct:{cfg.name}": lambda x=x, w=w, c=cfg: launch_skinny(x, w, None, BF16, c)}
        for f in methods.values():
            f()
        got = interleaved({k: (lambda f=f: eager_us(f)) for k, f in methods.items()}, 4)
        line = []
        for k, v in got.items():
            s.record(part="B", M=M, N=N, K=K, method=k, mode="eager", us=f"{statistics.median(v):.3f}",
                     rounds=";".join(f"{u:.3f}" for u in v), error="")
            line.append(f"{k.split(':')[0]} {statistics.median(v):.2f}")
        print(f"B M={M} N={N} K={K} [{dec['libtype']} graph / {dec['eager_libtype']} eager]: " + ", ".join(line),
              flush=True)


def part_c(s: Sweep) -> None:
    if torch_bs.unavailable_reason(s.dev):
        print("part C skipped:", torch_bs.unavailable_reason(s.dev))
        return
    disp = aiter_gemm.get_dispatcher("gemm_a8w8_blockscale")
    ident = disp.device(True)
    torch_sol = solution_of(TorchBlockwise())
    for N, K in BS_NK:
        for M in BS_MS:
            if s.left() < 30:
                print("part C: deadline, stopping", flush=True)
                return
            gen = torch.Generator(device=s.dev).manual_seed(M + N + K)
            x = torch.randn(M, K, generator=gen, device=s.dev)
            w = torch.randn(N, K, generator=gen, device=s.dev) / K ** 0.5
            XQ, WQ, xs, ws = quantize_blockscale(x, w)
            ref = gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)
            per = M * K + N * K + 2 * M * N
            n = rotating_sets(per, s.cache, torch.cuda.mem_get_info()[0])
            sets = [(XQ, WQ, xs, ws)] + [(XQ.clone(), WQ.clone(), xs.clone(), ws.clone()) for _ in range(n - 1)]
            cfg = default_config(M, N, K)
            problem = GemmProblem(M, N, K, False, torch.float8_e4m3fn, BF16)
            methods = {}
            for name, sol in ((f"triton_default:{cfg.name}", solution_of(cfg)), ("torch_blockwise", torch_sol)):
                runner = disp.backend(sol.libtype).prepare(problem, sol, ident)
                if runner is not None:  # prepared once, as the runtime does
                    methods[name] = lambda a, b, c, d, r=runner: r(a, b, c, d, BF16)
            med = s.graph_compare("C", M, N, K, sets, ref, methods)
            print(f"C M={M:5} N={N:5} K={K:5} " + " ".join(f"{k.split(':')[0]} {v:9.2f}" for k, v in med.items()),
                  flush=True)
            if M in (1, 16, 1024) and "torch_blockwise" in methods:
                args0 = sets[0]
                got = interleaved({k: (lambda f=f, a=args0: eager_us(lambda: f(*a), 100))
                                   for k, f in methods.items()}, 2)
                for k, v in got.items():
                    s.record(part="C", M=M, N=N, K=K, method=k, mode="eager", us=f"{statistics.median(v):.3f}",
                             rounds=";".join(f"{u:.3f}" for u in v), error="")
            del sets, XQ, WQ, xs, ws, x, w, ref


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--parts", default="A,B,C")
    ap.add_argument("--deadline", type=float, default=330.0, help="seconds; later parts stop early")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    s = Sweep(out, args.deadline)
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "timing": TIMING.__dict__}
    parts = set(args.parts.split(","))
    try:
        for name, fn in (("A", part_a), ("B", part_b), ("C", part_c)):
            if name in parts:
                t = time.monotonic()
                fn(s)
                meta[f"part_{name}_s"] = round(time.monotonic() - t, 1)
                s.write()
    finally:
        s.write()
        (out / "sweep_defaults_meta.json").write_text(json.dumps(meta, indent=1))
    print(f"wall {time.monotonic() - s.t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
