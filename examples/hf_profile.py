"""The profile half of :mod:`examples.hf_decode`: a few decode steps under ``torch.profiler`` per arm,
and what the trace says (GPU busy time, GEMM share, launch gaps between kernels)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from examples.hf_model import PatchState

# ---------------------------------------------------------------------------------------------------------------
# profile


GEMM_WORDS = ("gemm", "gemv", "xmma", "cutlass", "nvjet", "splitk", "skinny", "matmul", "cublas", "_mm_")
NOT_GEMM_WORDS = ("fmha", "flash", "attention", "softmax", "reduce_kernel", "elementwise")


def is_gemm_kernel(name: str) -> bool:
    low = name.lower()
    return any(w in low for w in GEMM_WORDS) and not any(w in low for w in NOT_GEMM_WORDS)


def kernel_stats(trace: dict[str, Any], steps: int) -> dict[str, Any]:
    """Per step: GPU busy time, GEMM kernel time and share, and the idle gaps between the first and last kernel
    (launch gaps: a host-bound step shows them, a replayed graph should not)."""
    evs = [e for e in trace.get("traceEvents", []) if str(e.get("cat", "")).lower() in
           ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    if not evs:
        return {"kernels": 0, "note": "no GPU activity in the trace (kernels inside graphs need CUPTI graph tracing)"}
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in evs)
    busy, cur_s, cur_e = 0.0, *spans[0]
    for s, e in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = spans[-1][1] - spans[0][0]
    total = sum(float(e["dur"]) for e in evs)
    gemm: dict[str, float] = {}
    for e in evs:
        if str(e.get("cat", "")).lower() == "kernel" and is_gemm_kernel(str(e.get("name", ""))):
            gemm[e["name"]] = gemm.get(e["name"], 0.0) + float(e["dur"])
    other: dict[str, float] = {}
    for e in evs:
        if e.get("name") not in gemm:
            other[e["name"]] = other.get(e["name"], 0.0) + float(e["dur"])
    gemm_us = sum(gemm.values())
    top = sorted(gemm.items(), key=lambda kv: -kv[1])[:5]
    top_other = sorted(other.items(), key=lambda kv: -kv[1])[:5]
    return {"kernels_per_step": len(evs) / steps, "gpu_busy_us": busy / steps, "span_us": span / steps,
            "gaps_us": (span - busy) / steps, "kernel_us": total / steps, "gemm_us": gemm_us / steps,
            "gemm_share": gemm_us / total if total else 0.0,
            "top_gemm_kernels": [{"name": k[:120], "us_per_step": v / steps} for k, v in top],
            "top_other_kernels": [{"name": k[:120], "us_per_step": v / steps} for k, v in top_other]}


def profile_decode(state: PatchState, step: Callable[[], object], graphs: list, batch: int, mode: str,
                   out: Path, steps: int = 5) -> list[dict[str, Any]]:
    from torch.profiler import ProfilerActivity, profile

    res = []
    for i, arm in enumerate(state.arms[:2]):
        if mode == "graph":
            fn = graphs[i].replay
        else:
            state.set_arm(arm)
            fn = step
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                fn()
            torch.cuda.synchronize()
        path = out / f"trace_decode_b{batch}_{mode}_{arm}.json"
        prof.export_chrome_trace(str(path))
        stats = kernel_stats(json.loads(path.read_text()), steps)
        res.append({"batch": batch, "mode": mode, "arm": arm, "trace": str(path), **stats})
        if "gemm_share" in stats:
            print(f"profile: batch {batch:>3} {mode:<5} {arm:<7}: {stats['kernels_per_step']:.0f} kernels/step, "
                  f"GPU busy {stats['gpu_busy_us']:.0f} us, GEMMs {stats['gemm_us']:.0f} us "
                  f"({100 * stats['gemm_share']:.0f}% of kernel time), launch gaps {stats['gaps_us']:.0f} us "
                  f"of a {stats['span_us']:.0f} us span; top other kernel "
                  + (f"{stats['top_other_kernels'][0]['name'][:60]} ({stats['top_other_kernels'][0]['us_per_step']:.0f}"
                     " us)" if stats["top_other_kernels"] else "-"))
        else:
            print(f"profile: batch {batch} {mode} {arm}: {stats['note']}")
    state.set_arm(state.arms[0])
    return res
