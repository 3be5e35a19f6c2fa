"""Layer-level benchmark: the four linears of one Llama-style decoder layer, ``F.linear`` against ``gemm_a16w16``.

qkv -> (the q slice stands in for attention output) -> o (+ residual) -> gate_up -> silu(gate) * up -> down
(+ residual), at the model's real shapes, for decode batches and a prefill, timed eager (launch and Python cost
included) and as a CUDA-graph replay. One layer's weights (434 MB for Llama-3.1-8B) are far above the 50 MB L2, so
one buffer set cannot sit in cache between replays.

    python -m op_tests.op_benchmarks.bench_layer --model_dir configs/model_configs/llama3_8b --nsets 1,8,32,128,2048
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import aiter_gemm
from gradlib.models import load_arch, projections
from gradlib.timing import FULL, interleaved, time_runner

RESULTS = Path(__file__).parent / "results"


class Layer:
    """Weights of one decoder layer on one tensor-parallel rank, and its forward with a chosen GEMM function."""

    def __init__(self, model_dir: str, tp: int, device: torch.device, dtype: torch.dtype) -> None:
        arch = load_arch(model_dir)
        projs = {p.name: p for p in projections(arch, tp)}
        self.q_width = arch.heads // tp * arch.head_dim
        self.hidden = arch.hidden
        self.inter = projs["down"].K
        gen = torch.Generator(device=device).manual_seed(0)

        def weight(p):
            w = torch.randn(p.N, p.K, device=device, dtype=dtype, generator=gen) * p.K**-0.5
            b = torch.randn(p.N, device=device, dtype=dtype, generator=gen) * 0.1 if p.bias else None
            return w, b

        self.w = {name: weight(projs[name]) for name in ("qkv", "o", "gate_up", "down")}

    def forward(self, x: torch.Tensor, gemm) -> torch.Tensor:
        qkv = gemm(x, *self.w["qkv"])
        h = x + gemm(qkv[:, : self.q_width], *self.w["o"])
        gu = gemm(h, *self.w["gate_up"])
        act = F.silu(gu[:, : self.inter]) * gu[:, self.inter:]
        return h + gemm(act, *self.w["down"])


def eager_us(fn, device: torch.device, calls: int = 50) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        fn(0)
    samples = []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(0)
        sync()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model_dir", default=str(Path(__file__).parents[2] / "configs" / "model_configs" / "llama3_8b"))
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--nsets", default="1,8,32,128,2048")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=4, help="timing rounds, alternating the order (median)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16
    layer = Layer(args.model_dir, args.tp, device, dtype)
    gemms = {"F.linear": F.linear, "gemm_a16w16": aiter_gemm.gemm_a16w16}
    rows = []
    for m in (int(x) for x in args.nsets.split(",")):
        x = torch.randn(m, layer.hidden, device=device, dtype=dtype)
        outs = {name: layer.forward(x, g) for name, g in gemms.items()}
        err = (outs["gemm_a16w16"].float() - outs["F.linear"].float()).norm() / outs["F.linear"].float().norm()
        if not err < 2e-2:
            raise AssertionError(f"layer output differs at M={m}: relative error {err:.3g}")
        row = {"M": m, "rel_err": float(err)}
        measures = {}
        for name, g in gemms.items():
            fn = lambda i, g=g, x=x: layer.forward(x, g)
            measures[f"{name}_graph_us"] = lambda fn=fn: time_runner(fn, 1, device, FULL).us
            measures[f"{name}_eager_us"] = lambda fn=fn: eager_us(fn, device)
        # Rounds in alternating order, median: clock drift must not favour whichever is timed first.
        samples = interleaved(measures, args.rounds)
        row.update({k: statistics.median(v) for k, v in samples.items()})
        row["speedup_graph"] = row["F.linear_graph_us"] / row["gemm_a16w16_graph_us"]
        row["speedup_eager"] = row["F.linear_eager_us"] / row["gemm_a16w16_eager_us"]
        rows.append(row)
        print(f"M={m}: graph {row['F.linear_graph_us']:.1f} -> {row['gemm_a16w16_graph_us']:.1f} us "
              f"({row['speedup_graph']:.3f}x); eager {row['F.linear_eager_us']:.1f} -> "
              f"{row['gemm_a16w16_eager_us']:.1f} us ({row['speedup_eager']:.3f}x)", flush=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out = Path(args.out) if args.out else RESULTS / name.replace(" ", "_") / "layer.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    meta = dict(device=name, torch=torch.__version__, date=time.strftime("%Y-%m-%d"), model_dir=args.model_dir,
                tp=args.tp)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
