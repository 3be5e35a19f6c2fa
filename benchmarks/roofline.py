"""The roofline's two measured ceilings (``--bench roofline``): this GPU's bf16 dense matmul rate and its
device-to-device copy bandwidth, the two numbers ``gradlib.results.ROOFLINES`` holds per device.

Matmul: ``torch.mm(a, b)`` and ``F.linear(a, w)`` (no bias, random bf16 operands) on a few large shapes, paired in
rounds of CUDA-graph replays by the benchmarks' timer (:mod:`benchmarks.measure`; median over rounds): TFLOP/s per
shape and provider, the ceiling their max. Copy: ``dst.copy_(src)`` of 256 MiB to 4 GiB buffers, bandwidth counted
as bytes read + written (2 x the buffer), as the H100's entry was measured; the ceiling the max over sizes. Operands
and buffers are far larger than the L2 (rotating sets as the tuner sizes them, :func:`aiter_gemm.timing.rotating_sets`,
one set at these sizes). The run logs the ``ROOFLINES`` entry its rows give (:func:`entry_text`), to be added there
by hand with the raw file it names.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Iterable, Mapping

import torch
import torch.nn.functional as F

from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.timing import cache_bytes, rotating_sets
from benchmarks.measure import Timer

log = logging.getLogger(__name__)

MIB = 1 << 20
#: (M, N, K): square 8192 (the H100 entry's shape), a wide 16384 x 16384 x 8192, 12288 cubed, and Llama-3-8B's
#: gate_up (N 28672, K 4096) at M 8192, the largest bf16 shape the shipped table holds.
PEAK_SHAPES = ((8192, 8192, 8192), (16384, 16384, 8192), (12288, 12288, 12288), (8192, 28672, 4096))
PEAK_COPY_MIB = (256, 1024, 4096)
#: ``--set tiny``: a smoke run of the same code on CPU (its numbers are no roofline).
TINY_SHAPES = ((64, 96, 80), (128, 64, 32))
TINY_COPY_MIB = (1,)
SETS = {"peak": (PEAK_SHAPES, PEAK_COPY_MIB), "tiny": (TINY_SHAPES, TINY_COPY_MIB)}
MATMUL_PROVIDERS = ("mm", "flinear")


def _n_sets(set_bytes: int, device: torch.device) -> int:
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    return rotating_sets(set_bytes, cache_bytes(device), free)


def _matmul_calls(m: int, n: int, k: int, device: torch.device, dtype: torch.dtype
                  ) -> tuple[dict[str, Callable[[int], object]], int]:
    """The two calls (``torch.mm`` of A (M, K) by B (K, N); ``F.linear`` of A by W (N, K)) over rotating sets."""
    p = GemmProblem(m, n, k)
    count = _n_sets(p.min_bytes(), device)
    gen = torch.Generator(device=device).manual_seed(m * 31 + n + k)
    a = [torch.randn(m, k, generator=gen, device=device, dtype=dtype) for _ in range(count)]
    w = [torch.randn(n, k, generator=gen, device=device, dtype=dtype) for _ in range(count)]
    b = [t.t().contiguous() for t in w]
    return {"mm": lambda i: torch.mm(a[i], b[i]), "flinear": lambda i: F.linear(a[i], w[i])}, count


def _copy_call(nbytes: int, device: torch.device) -> tuple[Callable[[int], object], int]:
    """``dst.copy_(src)`` of ``nbytes`` random bytes over rotating (src, dst) sets."""
    count = _n_sets(2 * nbytes, device)
    gen = torch.Generator(device=device).manual_seed(nbytes)
    src = [torch.randint(0, 256, (nbytes,), generator=gen, device=device, dtype=torch.uint8) for _ in range(count)]
    dst = [torch.empty_like(s) for s in src]
    return (lambda i: dst[i].copy_(src[i])), count


def run_roofline(set_name: str, modes: Iterable[str], device: torch.device, timer: Timer) -> list[dict]:
    """Rows of :data:`benchmarks.measure.COLUMNS`: per matmul shape, mode and provider its ``tflops``; per copy size
    and mode its ``gbps`` (read + written)."""
    shapes, sizes = SETS[set_name]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows: list[dict] = []
    for m, n, k in shapes:
        calls, count = _matmul_calls(m, n, k, device, dtype)
        p = GemmProblem(m, n, k)
        for mode in modes:
            got = timer.paired(calls, count, mode)
            rows += [matmul_row(set_name, p, name, mode, times) for name, times in got.items()]
        del calls
        _free(device)
    for mib in sizes:
        call, count = _copy_call(mib * MIB, device)
        for mode in modes:
            rows.append(copy_row(set_name, mib * MIB, mode, timer.paired({"copy": call}, count, mode)["copy"]))
        del call
        _free(device)
    return rows


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def matmul_row(set_name: str, p: GemmProblem, provider: str, mode: str, times: list[float]) -> dict:
    us = statistics.median(times)
    return {"bench": "roofline", "set": f"{set_name}:matmul", "label": f"{p.M}x{p.N}x{p.K}", "M": p.M, "N": p.N,
            "K": p.K, "bias": False, "provider": provider, "mode": mode, "us": f"{us:.4f}", "rounds": len(times),
            "tflops": f"{p.flops / us / 1e6:.3f}", "gbps": f"{p.min_bytes() / us / 1e3:.1f}"}


def copy_row(set_name: str, nbytes: int, mode: str, times: list[float]) -> dict:
    us = statistics.median(times)
    return {"bench": "roofline", "set": f"{set_name}:copy", "label": f"{nbytes // MIB} MiB", "provider": "copy",
            "mode": mode, "us": f"{us:.4f}", "rounds": len(times), "gbps": f"{2 * nbytes / us / 1e3:.1f}",
            "note": f"gbps: bytes read + written (2 x {nbytes})"}


def ceilings(rows: Iterable[Mapping[str, str]], mode: str = "graph") -> tuple[Mapping, Mapping] | None:
    """(the matmul row of the highest TFLOP/s, the copy row of the highest GB/s) among ``mode``'s rows; None
    without both."""
    rows = [r for r in rows if r.get("mode") == mode and r.get("us")]
    mm = [r for r in rows if str(r["set"]).endswith(":matmul")]
    cp = [r for r in rows if str(r["set"]).endswith(":copy")]
    if not mm or not cp:
        return None
    return max(mm, key=lambda r: float(r["tflops"])), max(cp, key=lambda r: float(r["gbps"]))


def entry_text(rows: Iterable[Mapping[str, str]], ident: DeviceIdentity, source: str) -> str | None:
    """The ``gradlib.results.ROOFLINES`` entry the graph rows give on ``ident``'s device (TFLOP/s to the unit,
    TB/s to 0.01; the name without its vendor prefix), its source naming the raw file; None without them."""
    best = ceilings(rows)
    if best is None:
        return None
    mm, cp = best
    name = ident.name.removeprefix("NVIDIA ")
    return (f'("{ident.gfx}", {ident.cu_num}, "{name}", Roofline({float(mm["tflops"]):.0f}e12, '
            f'{float(cp["gbps"]) / 1e3:.2f}e12, "{ident.name}, measured: {source}")),')


def summary(rows: list[dict], ident: DeviceIdentity, source: str) -> str:
    """The one line a run logs: both ceilings and where they were reached, and the entry to add."""
    best = ceilings(rows)
    if best is None:
        return f"roofline {ident.name or 'cpu'}: no graph-timed rows, so no ROOFLINES entry (a GPU run gives one)"
    mm, cp = best
    return (f"roofline {ident.name}: bf16 matmul max {float(mm['tflops']):.1f} TFLOP/s ({mm['provider']} "
            f"{mm['label']}), copy max {float(cp['gbps']):.1f} GB/s read + written ({cp['label']}); "
            f"gradlib.results.ROOFLINES entry: {entry_text(rows, ident, source)}")
