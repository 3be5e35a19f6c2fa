"""Timing providers on shapes: the project's method, and the rows a GEMM benchmark writes.

Per shape, every provider is built on the same rotating input sets (the tuner's, spanning twice the last-level
cache, :mod:`aiter_gemm.timing`), checked against the op's float32 reference (a provider off by more than its
bound, :func:`~benchmarks.providers.op_tolerance` unless it has its own, is not timed), then timed in paired
rounds: ``graph`` mode by :func:`aiter_gemm.timing.time_paired` (one CUDA-graph replay per provider per round, order
alternating, a fresh capture every round), ``eager`` mode by :func:`eager_paired` (one loop of back-to-back calls
per provider per round, host and launch cost included), ``host`` mode by :func:`aiter_gemm.timing.host_and_gpu_us`
(host time to submit a call, beside its GPU time).
A ratio is the median over rounds of ``baseline / provider`` from the same round: timings taken whole runs apart
drift by a few percent on the H100, samples of one round do not (BENCHMARKS.md, "Method").

The timer is an object (:class:`DeviceTimer` on a real device); tests inject one that returns set times.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

import aiter_gemm
from aiter_gemm.accuracy import rel_error
from aiter_gemm.backends.base import MoeProblem, Problem
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.fileio import atomic_write_text, render_csv
from aiter_gemm.registry import op_spec
from aiter_gemm.timing import TimingConfig, cache_bytes, host_and_gpu_us, time_paired
from benchmarks.providers import A16W16, BLOCKSCALE, MOE, Context, Unavailable, op_tolerance, resolve
from gradlib.results import fp8_peak_for, roofline_for

log = logging.getLogger(__name__)

COLUMNS = ("bench", "set", "label", "M", "N", "K", "bias", "provider", "mode", "us", "vs", "vs_us", "ratio",
           "ratio_q1", "ratio_q3", "rounds", "roofline_us", "roof", "tflops", "libtype", "eager_libtype", "matched",
           "rel_err", "gpu_us", "added_us", "note", "experts", "topk", "gbps")
#: One replay holds ~500 us of calls: identical F.linear calls in 300 us replays ranged 0.960-1.031 over 291 shapes
#: (held-out run 7), 0.991-1.016 with 500 us replays and a fresh capture every round (run 8).
TIMING = TimingConfig(warmup=5, reps=9, target_us=500.0, budget_s=0.4)
GRAPH_PAIRS, EAGER_PAIRS = 41, 21  # odd: the median is one round


class Timer(Protocol):
    """How a benchmark measures: paired samples (us per call) of each named call, and host / GPU us of one call."""

    def paired(self, calls: Mapping[str, Callable[[int], object]], n_sets: int, mode: str) -> dict[str, list[float]]:
        ...

    def host(self, call: Callable[[int], object], n_sets: int) -> tuple[float, float]:
        ...


def _sync(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def eager_paired(calls: Mapping[str, Callable[[int], object]], n_sets: int, est_us: float, pairs: int,
                 device: torch.device) -> dict[str, list[float]]:
    """Per-call wall time of back-to-back eager calls over the rotating sets: ``pairs`` rounds of one loop per call
    (about 1.5 ms each) in alternating order, as :func:`aiter_gemm.timing.time_paired` does for graphs: host timings
    drift too, so only samples of the same round compare."""
    sync = _sync(device)
    n = int(max(10, min(300, 1500 / max(est_us, 1.0))))
    names = list(calls)
    out: dict[str, list[float]] = {k: [] for k in names}
    for name in names:  # warm-up: first calls decide and compile
        for i in range(n_sets):
            calls[name](i)
    for r in range(pairs):
        for name in (names if r % 2 == 0 else names[::-1]):
            fn = calls[name]
            sync()
            t0 = time.perf_counter()
            for i in range(n):
                fn(i % n_sets)
            sync()
            out[name].append((time.perf_counter() - t0) / n * 1e6)
    return out


@dataclass
class DeviceTimer:
    """The real timer: CUDA graphs / eager loops on a GPU; on CPU only eager loops (there is no graph to replay)."""

    device: torch.device
    graph_pairs: int = GRAPH_PAIRS
    eager_pairs: int = EAGER_PAIRS
    cfg: TimingConfig = TIMING

    def paired(self, calls: Mapping[str, Callable[[int], object]], n_sets: int, mode: str) -> dict[str, list[float]]:
        if mode == "graph":
            return time_paired(dict(calls), n_sets, self.cfg, self.graph_pairs, self.graph_pairs)
        est = self._estimate(calls, n_sets)
        return eager_paired(calls, n_sets, est, self.eager_pairs, self.device)

    def host(self, call: Callable[[int], object], n_sets: int) -> tuple[float, float]:
        return host_and_gpu_us(call, n_sets)

    def _estimate(self, calls: Mapping[str, Callable[[int], object]], n_sets: int) -> float:
        """Slowest call's eager us (one pass over the sets each): sizes the eager loops."""
        sync, worst = _sync(self.device), 0.0
        for fn in calls.values():
            for i in range(n_sets):
                fn(i)
            sync()
            t0 = time.perf_counter()
            for i in range(n_sets):
                fn(i)
            sync()
            worst = max(worst, (time.perf_counter() - t0) / n_sets * 1e6)
        return worst


def ratio_stats(ref: Sequence[float], us: Sequence[float]) -> tuple[float, float, float]:
    """(median, 25th, 75th percentile) of the per-round ratios ref / us (> 1: ``us`` is faster)."""
    ratios = [a / b for a, b in zip(ref, us)]
    if len(ratios) < 2:
        return ratios[0], ratios[0], ratios[0]
    q = statistics.quantiles(ratios, n=4, method="inclusive")
    return q[1], q[0], q[2]


def shape_cells(p: Problem) -> dict[str, object]:
    """A problem's cells of :data:`COLUMNS`: a GEMM's M, N, K and bias; a fused MoE's token count as M, its
    ``inter_dim`` as N, ``model_dim`` as K, its experts and topk."""
    if isinstance(p, MoeProblem):
        return {"M": p.token, "N": p.inter_dim, "K": p.model_dim, "experts": p.expert, "topk": p.topk}
    return {"M": p.M, "N": p.N, "K": p.K, "bias": p.bias}


def op_bytes(op: str, p: Problem) -> int:
    """Fewest bytes a call of ``op`` moves: operands read once, output written once (block scales included); a fused
    MoE's, the experts its tokens can reach (:meth:`~aiter_gemm.backends.base.MoeProblem.min_bytes`)."""
    if op == BLOCKSCALE:
        kb, nb = -(-p.K // 128), -(-p.N // 128)
        return p.M * p.K + p.N * p.K + 2 * p.M * p.N + 4 * (p.M * kb + nb * kb)
    return p.min_bytes()


def roofline_us(op: str, p: Problem, ident: DeviceIdentity) -> float | None:
    """max(flops / peak, bytes / copy bandwidth) in us on ``ident``'s device, if its roofline is known (FP8: the
    datasheet's peak, the measured bandwidth)."""
    roof = roofline_for(ident)
    if roof is None:
        return None
    peak = roof.flops
    if op == BLOCKSCALE or (isinstance(p, MoeProblem) and p.fp8):
        peak = fp8_peak_for(ident)  # the datasheet's (gradlib.results.FP8_PEAKS)
        if peak is None:
            return None
    return max(p.flops / peak, op_bytes(op, p) / roof.bytes) * 1e6


def decision_columns(op: str, p: Problem) -> dict[str, str]:
    """What the dispatch runs for ``p`` (graph / eager libtype, how it matched)."""
    if op == A16W16:
        cfg = aiter_gemm.get_GEMM_A16W16_config(p.M, p.N, p.K, p.bias, p.dtype, p.otype, p.scaleAB, p.bpreshuffle)
    elif op == MOE:
        cfg = aiter_gemm.get_fused_moe_config(**p.config_fields())
    else:
        from aiter_gemm.ops.a8w8_blockscale import get_GEMM_A8W8_BLOCKSCALE_config

        cfg = get_GEMM_A8W8_BLOCKSCALE_config(p.M, p.N, p.K)
    return {"libtype": cfg.get("libtype", ""), "eager_libtype": cfg.get("eager_libtype", ""),
            "matched": cfg.get("matched", "")}


def _err_text(err: float) -> str:
    """The ``rel_err`` cell: blank for a floor provider (its output is not compared)."""
    return "" if math.isnan(err) else f"{err:.2e}"


@dataclass
class GemmBench:
    """One GEMM benchmark run: ``shapes`` x ``providers`` x ``modes``, ratios against each of ``baselines``."""

    bench: str
    op: str
    shapes: list[tuple[str, tuple[str, Problem]]]
    providers: list[str]
    baselines: list[str]
    modes: list[str]
    device: torch.device
    ident: DeviceIdentity
    timer: Timer
    out_csv: str
    deadline_s: float = math.inf
    options: dict = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def run(self) -> list[dict]:
        t0 = time.monotonic()
        self.options.setdefault("started", t0)
        for s in self.providers:  # unknown names fail before anything runs
            resolve(self.op, s)
        cache = cache_bytes(self.device)
        spec = op_spec(self.op)
        for set_name, (label, p) in self.shapes:
            cells = shape_cells(p)
            if time.monotonic() - t0 > self.deadline_s:
                self.skipped.append(f"{set_name}:{cells['M']}x{cells['N']}x{cells['K']}")
                continue
            data = spec.make_inputs(p, cells["M"] * 31 + cells["N"] + cells["K"], self.device, cache,
                                    self.options.get("inputs", {}))
            built: dict[str, Callable[[int], object]] = {}
            for mode in self.modes:
                self._shape(set_name, label, p, mode, data.sets, data.ref, built)
            del data, built
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            atomic_write_text(self.out_csv, render_csv(COLUMNS, self.rows))  # a run cut short keeps its shapes
        atomic_write_text(self.out_csv, render_csv(COLUMNS, self.rows))
        return self.rows

    def _shape(self, set_name: str, label: str, p: Problem, mode: str, sets: list[tuple], ref: torch.Tensor,
               built: dict[str, Callable[[int], object]]) -> None:
        base = {"bench": self.bench, "set": set_name, "label": label, **shape_cells(p), "mode": mode}
        roof = roofline_us(self.op, p, self.ident)
        calls, errs = {}, {}
        for s in self.providers:
            provider, arg = resolve(self.op, s)
            key = s if provider.name != "default" else f"{s}@{mode}"  # the default differs between graph and eager
            try:
                if key not in built:
                    ctx = Context(p, self.op, sets, self.ident, self.device, mode, self.options)
                    built[key] = provider.build(ctx, arg)
                call = built[key]
                out = call(0)
                err = math.nan if provider.floor else rel_error(out, ref)  # a floor's output is not the op's
            except Unavailable as exc:
                self.rows.append({**base, "provider": s, "note": f"unavailable: {exc}"})
                continue
            except Exception as exc:  # one provider failing on one shape (a compile, a launch) ends only its row
                log.warning("%s on %s: %s: %s", s, p.label(), type(exc).__name__, exc)
                self.rows.append({**base, "provider": s, "note": f"error: {type(exc).__name__}: {exc}"[:300]})
                continue
            bound = (provider.max_rel_err or op_tolerance)(p)
            if not provider.floor and not err <= bound:
                self.rows.append({**base, "provider": s, "rel_err": f"{err:.2e}", "note": "wrong result: not timed"})
                continue
            calls[s], errs[s] = call, err
        if not calls:
            return
        n_sets = len(sets)
        gpu: dict[str, float] = {}
        if mode == "host":
            samples: dict[str, list[float]] = {k: [] for k in calls}
            for rep in range(2):  # two alternating passes; the second (warm) is reported
                for k in (list(calls) if rep == 0 else list(calls)[::-1]):
                    host_us, gpu[k] = self.timer.host(calls[k], n_sets)
                    samples[k] = [host_us]
        else:
            try:
                samples = self.timer.paired(calls, n_sets, mode)
            except Exception as exc:  # e.g. a capture that fails: say so for every provider of this shape and mode
                log.warning("timing %s %s failed: %s: %s", p.label(), mode, type(exc).__name__, exc)
                note = f"timing failed: {type(exc).__name__}: {exc}"[:300]
                self.rows += [{**base, "provider": k, "rel_err": _err_text(errs[k]), "note": note} for k in calls]
                return
        info = decision_columns(self.op, p)
        for s, got in samples.items():
            us = statistics.median(got)
            row = {**base, "provider": s, "us": f"{us:.4f}", "rounds": len(got), "rel_err": _err_text(errs[s]),
                   **(info if s == "dispatch" else {})}
            if s in gpu:
                row["gpu_us"] = f"{gpu[s]:.4f}"
            if roof is not None:
                row.update(roofline_us=f"{roof:.4f}", roof=f"{roof / us:.4f}")
            row["tflops"] = f"{p.flops / us / 1e6:.3f}"
            row["gbps"] = f"{op_bytes(self.op, p) / us / 1e3:.1f}"
            refs = [b for b in self.baselines if b in samples and b != s]
            if not refs:
                self.rows.append(row)
            for b in refs:
                med, q1, q3 = ratio_stats(samples[b], got)
                self.rows.append({**row, "vs": b, "vs_us": f"{statistics.median(samples[b]):.4f}",
                                  "ratio": f"{med:.4f}", "ratio_q1": f"{q1:.4f}", "ratio_q3": f"{q3:.4f}"})
        log.info("%s %s %s %s: %s", set_name, label, p.label(), mode,
                 ", ".join(f"{k} {statistics.median(v):.2f} us" for k, v in samples.items()))
