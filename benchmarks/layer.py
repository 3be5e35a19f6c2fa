"""The four linears of one decoder layer (``--bench layer``), with ``F.linear`` or ``gemm_a16w16`` as the GEMM.

qkv -> (the q slice stands in for attention's output) -> o (+ residual) -> gate_up -> silu(gate) * up -> down
(+ residual), at a model's shapes on one tensor-parallel rank, for the M of ``--m``. One layer's weights (434 MB for
Llama-3.1-8B) are far above the 50 MB L2, so one input set is enough: nothing stays in cache between replays.
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

import aiter_gemm
from aiter_gemm.accuracy import rel_error
from benchmarks.measure import Timer, ratio_stats
from benchmarks.providers import MAX_REL_ERR
from gradlib.models import load_arch, projections

GEMMS = {"flinear": F.linear, "dispatch": aiter_gemm.gemm_a16w16}


class Layer:
    """Weights of one decoder layer on one rank, and its forward with a chosen GEMM function."""

    def __init__(self, model: str, tp: int, device: torch.device, dtype: torch.dtype = torch.bfloat16) -> None:
        arch = load_arch(model)
        projs = {p.name: p for p in projections(arch, tp)}
        self.q_width = arch.heads // tp * arch.head_dim
        self.hidden, self.inter = arch.hidden, projs["down"].K
        gen = torch.Generator(device=device).manual_seed(0)

        def weight(p):
            w = torch.randn(p.N, p.K, device=device, dtype=dtype, generator=gen) * p.K ** -0.5
            b = torch.randn(p.N, device=device, dtype=dtype, generator=gen) * 0.1 if p.bias else None
            return w, b

        self.w = {name: weight(projs[name]) for name in ("qkv", "o", "gate_up", "down")}

    def forward(self, x: torch.Tensor, gemm) -> torch.Tensor:
        qkv = gemm(x, *self.w["qkv"])
        h = x + gemm(qkv[:, : self.q_width], *self.w["o"])
        gu = gemm(h, *self.w["gate_up"])
        act = F.silu(gu[:, : self.inter]) * gu[:, self.inter:]
        return h + gemm(act, *self.w["down"])


def run_layer(model: str, tp: int, ms: list[int], modes: list[str], device: torch.device, timer: Timer) -> list[dict]:
    """Rows per (M, mode, provider): the layer's us with each GEMM, ``dispatch`` against ``flinear`` in paired
    rounds; the two layers' outputs must agree to bf16 rounding first."""
    layer = Layer(model, tp, device)
    rows = []
    for m in ms:
        x = torch.randn(m, layer.hidden, device=device, dtype=torch.bfloat16)
        outs = {k: layer.forward(x, g) for k, g in GEMMS.items()}
        err = rel_error(outs["dispatch"], outs["flinear"].float())
        if not err <= MAX_REL_ERR:
            raise AssertionError(f"{model} layer at M={m}: gemm_a16w16 differs from F.linear by {err:.3g}")
        calls = {k: (lambda i, g=g, x=x: layer.forward(x, g)) for k, g in GEMMS.items()}
        for mode in modes:
            samples = timer.paired(calls, 1, mode)
            base = {"bench": "layer", "set": f"{model}:tp{tp}", "label": "layer", "M": m, "N": layer.hidden,
                    "K": layer.hidden, "bias": False, "mode": mode, "rel_err": f"{err:.2e}"}
            f_us = statistics.median(samples["flinear"])
            rows.append({**base, "provider": "flinear", "us": f"{f_us:.3f}", "rounds": len(samples["flinear"])})
            med, q1, q3 = ratio_stats(samples["flinear"], samples["dispatch"])
            rows.append({**base, "provider": "dispatch", "us": f"{statistics.median(samples['dispatch']):.3f}",
                         "vs": "flinear", "vs_us": f"{f_us:.3f}", "ratio": f"{med:.4f}", "ratio_q1": f"{q1:.4f}",
                         "ratio_q3": f"{q3:.4f}", "rounds": len(samples["dispatch"])})
    return rows
