"""Timing GEMM runners, the one place CUDA events and graph replays are timed (the tuner, ``kernel_check --bench``,
the benchmarks and the examples): warm-up, rotating input buffers larger than the last-level cache, CUDA-graph replay
(or CUDA events, or ``perf_counter`` on CPU), median over repetitions; paired and interleaved timings of several
methods; a fixed number of back-to-back calls between two events.

Why rotating buffers: a weight that stays in the H100's 50 MB L2 between calls is read at L2 speed, which no model
sees (each layer's weight is evicted by the other layers). The sets of (A, B, bias, out) cycled through occupy at
least twice the cache (the cache is not a perfect LRU: with 2x, at most about half of one set can survive).
The cache size is measured from the device (``torch.cuda.get_device_properties().L2_cache_size``; on CPU the largest
cache level in sysfs), never assumed.
"""

from __future__ import annotations

import glob
import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

# Without a readable cache size on CPU: 32 MiB, the LLC of a typical server socket slice (only sizes buffers).
_CPU_CACHE_FALLBACK = 32 << 20
# Rotating sets per shape at most: enough for 2x a 50 MB L2 with 1 MB sets; more only costs memory and setup time.
MAX_SETS = 128
# Rotating buffers may use at most this fraction of the free device memory (the reference and outputs need the rest).
MEMORY_FRACTION = 0.25
#: The clock CPU timings read (seconds). Read through this module attribute on every timing, so a test can put a
#: virtual clock here (op_tests/gradlib_fakes.py) on which fake backends take the time they declare, whatever the
#: machine's load: a loaded 2-core machine reordered fakes 20 ms apart on the real clock.
cpu_clock: Callable[[], float] = time.perf_counter


@dataclass(frozen=True)
class TimingConfig:
    """How hard to time a candidate. ``target_us`` sets how many calls one timed repetition runs, so the event
    timer's ~0.5 us resolution stays under 1% (GPU); ``budget_s`` cuts the repetitions (to no fewer than 3) of a
    candidate whose repetitions would take longer than that."""

    warmup: int
    reps: int
    target_us: float
    use_graph: bool = True
    budget_s: float = 2.0
    #: > 0: size the calls per repetition from this time (one for every candidate of a comparison) instead of the
    #: candidate's own warm-up estimate, which is eager time, host cost included. A graph replay's fixed start-up is
    #: spread over its calls, so a candidate with a costlier host launch (Triton's) got fewer calls and read slower:
    #: on the H100 the confirmation passed (5, 10240, 5120)'s TileLang row by 2% twice, paired replays of equal
    #: length (the benchmark's method) timed it 3.5% slower than the Triton default, and re-confirmed with equal
    #: lengths it lost to that default (BENCHMARKS.md, held-out FP8 shapes).
    per_call_us: float = 0.0


@dataclass(frozen=True)
class Timing:
    """Median microseconds per call, how they were measured, and the rotating-set count used."""

    us: float
    method: str  # "graph", "events" or "cpu"
    n_sets: int
    samples: int


def cache_bytes(device: torch.device) -> int:
    """Last-level cache size of ``device``: the GPU's L2 from its properties, the CPU's largest cache from sysfs."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        size = int(getattr(props, "L2_cache_size", 0) or 0)
        if size <= 0:
            raise RuntimeError(f"torch reports no L2_cache_size for {props.name}; cannot size rotating buffers")
        return size
    best = 0
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            text = open(path).read().strip().upper()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * mult)
        except (OSError, ValueError):
            continue
    return best or _CPU_CACHE_FALLBACK


def rotating_sets(set_bytes: int, cache: int, free_bytes: int | None) -> int:
    """How many buffer sets of ``set_bytes`` to cycle so they span 2x ``cache``, within the memory budget."""
    want = max(1, math.ceil(2 * cache / max(set_bytes, 1)))
    if free_bytes is not None:
        want = min(want, max(1, int(free_bytes * MEMORY_FRACTION) // max(set_bytes, 1)))
    return min(want, MAX_SETS)


def time_runner(call: Callable[[int], object], n_sets: int, device: torch.device, cfg: TimingConfig) -> Timing:
    """Median time of ``call(i)`` (runs the candidate on buffer set ``i``), on ``device``'s stream or CPU."""
    if device.type == "cuda":
        return _time_cuda(call, n_sets, cfg)
    return _time_cpu(call, n_sets, cfg)


def _time_cpu(call: Callable[[int], object], n_sets: int, cfg: TimingConfig) -> Timing:
    clock = cpu_clock
    t0 = clock()
    for i in range(cfg.warmup):
        call(i % n_sets)
    est = (clock() - t0) / max(cfg.warmup, 1)
    reps = max(3, min(cfg.reps, int(cfg.budget_s / max(est, 1e-9))))  # >= 3: a median of fewer means little
    samples = []
    for i in range(reps):
        t = clock()
        call((cfg.warmup + i) % n_sets)
        samples.append((clock() - t) * 1e6)
    return Timing(statistics.median(samples), "cpu", n_sets, len(samples))


def _warm_up(call: Callable[[int], object], n_sets: int, cfg: TimingConfig, stream: torch.cuda.Stream
             ) -> tuple[float, int]:
    """Warm ``call`` up on ``stream`` (JIT compilation, cuBLAS workspaces, every buffer set touched once) and return
    (estimated us per call, calls per repetition): enough to last ``target_us`` (<= 2000), a multiple of ``n_sets``
    so every set is read equally."""
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        for i in range(max(cfg.warmup, n_sets)):
            call(i % n_sets)
    stream.synchronize()
    start, end = _events()
    with torch.cuda.stream(stream):
        start.record(stream)
        for i in range(n_sets):
            call(i)
        end.record(stream)
    end.synchronize()
    est_us = max(start.elapsed_time(end) * 1e3 / n_sets, 0.1)
    return est_us, calls_per_rep(est_us, n_sets, cfg)


def _events() -> tuple[torch.cuda.Event, torch.cuda.Event]:
    """A (start, end) pair of CUDA events that record time."""
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def ms_per_call(fn: Callable[[], object], n: int, cuda: bool, warmup: int = 0) -> float:
    """Milliseconds per call of ``fn`` over ``n`` back-to-back calls after ``warmup`` untimed ones: between two CUDA
    events on a GPU (after synchronizing the device), on :data:`cpu_clock` otherwise."""
    for _ in range(warmup):
        fn()
    if not cuda:
        t0 = cpu_clock()
        for _ in range(n):
            fn()
        return (cpu_clock() - t0) * 1e3 / n
    torch.cuda.synchronize()
    start, end = _events()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n


def host_and_gpu_us(call: Callable[[int], object], n_sets: int, burst: int = 20, bursts: int = 41
                    ) -> tuple[float, float]:
    """(median host us to submit one call, median GPU us per call) over ``bursts`` bursts of ``burst`` calls without
    synchronizing: what a host-bound eager model pays per GEMM beside what the GPU spends on it."""
    start, end = _events()
    for i in range(max(3, n_sets)):
        call(i % n_sets)
    torch.cuda.synchronize()
    host, gpu = [], []
    for b in range(bursts):
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        for i in range(burst):
            call((b + i) % n_sets)
        t1 = time.perf_counter()
        end.record()
        end.synchronize()
        host.append((t1 - t0) / burst * 1e6)
        gpu.append(start.elapsed_time(end) * 1e3 / burst)
    return statistics.median(host), statistics.median(gpu)


def calls_per_rep(est_us: float, n_sets: int, cfg: TimingConfig) -> int:
    """Calls one timed repetition runs: enough to last ``target_us`` at ``cfg.per_call_us`` if set, else at the
    candidate's estimate ``est_us`` (at most 2000), a multiple of ``n_sets`` so every set is read equally."""
    basis = cfg.per_call_us if cfg.per_call_us > 0 else est_us
    calls = max(1, min(2000, math.ceil(cfg.target_us / max(basis, 0.1))))
    return max(n_sets, calls - calls % n_sets)


def _time_cuda(call: Callable[[int], object], n_sets: int, cfg: TimingConfig) -> Timing:
    stream = torch.cuda.Stream()
    est_us, calls = _warm_up(call, n_sets, cfg, stream)
    start, end = _events()
    # A very slow candidate (a bad config on a big shape) gets fewer repetitions: it cannot win anyway.
    reps = max(3, min(cfg.reps, int(cfg.budget_s * 1e6 / (calls * est_us))))
    if cfg.use_graph:
        try:
            return _time_graph(call, n_sets, calls, stream, reps)
        except RuntimeError as exc:  # a runner that syncs or allocates host memory cannot be captured
            log.debug("CUDA graph capture failed (%s); timing with events", exc)
            torch.cuda.synchronize()
    samples = []
    with torch.cuda.stream(stream):
        for _ in range(reps):
            start.record(stream)
            for i in range(calls):
                call(i % n_sets)
            end.record(stream)
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3 / calls)
    return Timing(statistics.median(samples), "events", n_sets, len(samples))


def _time_graph(call: Callable[[int], object], n_sets: int, calls: int, stream: torch.cuda.Stream,
                reps: int) -> Timing:
    """Capture ``calls`` launches in one graph and time its replays: no Python or launch overhead in the result,
    as in a served model captured with CUDA graphs."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(calls):
            call(i % n_sets)
    graph.replay()  # first replay uploads the graph
    torch.cuda.synchronize()
    start, end = _events()
    samples = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return Timing(statistics.median(samples), "graph", n_sets, len(samples))


def interleaved(measures: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Each measurement ``rounds`` times, in rounds that alternate the order (forward, then reversed), so no method
    is always measured first: a GPU that clocks down over a long measurement biases whichever comes second (on the
    H100 two timings of the *same* kernels, a Llama-3.1-8B layer at M = 2048 in fixed order, differed by 10%)."""
    names = list(measures)
    out: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for k in (names if r % 2 == 0 else names[::-1]):
            out[k].append(measures[k]())
    return out


def time_paired(calls: dict[str, Callable[[int], object]], n_sets: int, cfg: TimingConfig, pairs: int,
                captures: int = 1) -> dict[str, list[float]]:
    """Microseconds per call of each of ``calls`` (each runs its method on buffer set ``i``) in ``pairs`` rounds of
    CUDA-graph replays, one replay per method per round, the order reversed every round: samples of the same round
    were taken within a millisecond of each other, so ``median(a[r] / b[r])`` compares like with like. Timings of
    whole runs apart drift by a few percent on the H100 (identical F.linear calls 0.93-1.11x in two-round medians,
    BENCHMARKS.md, held-out benchmark); paired replays are what a 2% bar needs. The graphs are captured again
    ``captures`` times (rounds split evenly, capture order alternating): one capture of identical F.linear calls
    replayed up to 9% slower than another, steadily over its replays (same run), so one capture per method is a
    sample of one. Every method's graph holds the same number of calls (the most any method's warm-up asked for):
    the warm-up estimate is eager time, host cost included, so a wrapper with more host time would otherwise get a
    shorter graph, its replay overhead spread over fewer calls."""
    stream = torch.cuda.Stream()
    start, end = _events()
    names = list(calls)
    common = max(_warm_up(call, n_sets, cfg, stream)[1] for call in calls.values())
    counts = dict.fromkeys(names, common)
    out: dict[str, list[float]] = {k: [] for k in names}
    blocks = max(1, min(captures, pairs))
    r = 0
    for block in range(blocks):
        graphs: dict[str, torch.cuda.CUDAGraph] = {}
        for name in (names if block % 2 == 0 else names[::-1]):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for i in range(counts[name]):
                    calls[name](i % n_sets)
            graph.replay()  # the first replay uploads the graph
            graphs[name] = graph
        torch.cuda.synchronize()
        for _ in range(pairs * (block + 1) // blocks - pairs * block // blocks):
            for name in (names if r % 2 == 0 else names[::-1]):
                start.record()
                graphs[name].replay()
                end.record()
                end.synchronize()
                out[name].append(start.elapsed_time(end) * 1e3 / counts[name])
            r += 1
        del graphs
    return out
