"""The tuner's task model: picklable descriptions of work (never tensors), and the code that executes one item.

A :class:`Task` is a list of items on one shape: either the backends whose candidates to enumerate, or the
solutions to time. Any executor (the ``--mp`` process pool of :mod:`gradlib.pool`, or a Ray actor pool) runs a
task's items in order through :meth:`WorkerRuntime.run_item` in a process that owns one device, and must return
exactly one :class:`ItemResult` per item, synthesising a failed one for an item whose process died or timed out,
then continuing with the items after it. Executors never write files: the driver does.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from aiter_gemm import backends
from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.dtypes import FP8_DTYPES
from gradlib.accuracy import err_ratio, tolerance_for
from gradlib.timing import TimingConfig, cache_bytes, rotating_sets, time_runner

log = logging.getLogger(__name__)

ENUMERATE = "enumerate"
TIME = "time"

#: Further job kinds, ``kind -> handler(runtime, task, index) -> ItemResult``, registered on import by modules that
#: workers import as plugins (e.g. :mod:`gradlib.blockscale_tasks`), so other tuners reuse the executors as they are.
JOB_KINDS: dict[str, Callable[["WorkerRuntime", "Task", int], "ItemResult"]] = {}


def register_job_kind(kind: str, handler: Callable[["WorkerRuntime", "Task", int], "ItemResult"]) -> None:
    """Make ``Task(kind=kind)`` run ``handler`` for each item; the module registering it must be a worker plugin."""
    if kind in (ENUMERATE, TIME):
        raise ValueError(f"job kind {kind!r} is built in")
    JOB_KINDS[kind] = handler


@dataclass(frozen=True)
class Task:
    """Work on one shape for one executor slot. ``first`` > 0 continues a task after its process was restarted."""

    task_id: int
    shape_id: int
    kind: str  # ENUMERATE: items are libtype names; TIME: items are Solutions
    problem: GemmProblem
    items: tuple
    timing: TimingConfig | None = None
    check: bool = True  # compare with the float32 reference (phase 2) or not (phase 1 screening)
    max_err: float = 1.0  # a candidate above this err_ratio is not timed (it cannot win)
    seed: int = 0
    first: int = 0
    #: Settings of a registered job kind as (name, value) pairs (picklable, hashable), e.g. the block-scale
    #: tuner's ``("x_scale_layout", "m_major")``.
    options: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in (ENUMERATE, TIME) and self.kind not in JOB_KINDS:
            raise ValueError(f"Task.kind must be {ENUMERATE!r}, {TIME!r} or a registered kind "
                             f"{sorted(JOB_KINDS)}, got {self.kind!r}")


@dataclass(frozen=True)
class ItemResult:
    """What one item produced. Failed items have ``ok`` False, ``us`` inf and an ``error``; ``restart`` asks the
    executor to replace the process (its device may be unusable after the failure)."""

    task_id: int
    index: int
    ok: bool
    us: float = math.inf
    err_ratio: float = math.nan  # NaN: not checked
    method: str = ""
    error: str = ""
    solutions: tuple[Solution, ...] = ()  # ENUMERATE results
    is_blaslt: bool = False  # ENUMERATE: the backend wants phase-1 screening
    restart: bool = False

    @staticmethod
    def failed(task: Task, index: int, error: str, restart: bool = False) -> "ItemResult":
        return ItemResult(task.task_id, index, False, error=error, restart=restart)


def device_identity(device: torch.device) -> DeviceIdentity:
    """This process's identity for ``device``, with AITER_GEMM_ARCH / AITER_GEMM_CU_NUM applied by the runtime's
    settings, so the rows written are the rows the runtime looks up."""
    from aiter_gemm import current_device_identity

    return current_device_identity(device.type == "cuda")


def import_plugins(modules: Sequence[str]) -> None:
    """Import modules that register extra backends on import (``--plugin``, ``GRADLIB_PLUGINS``)."""
    for name in modules:
        if name:
            importlib.import_module(name)


@dataclass
class _Data:
    """One shape's inputs: ``sets`` rotating copies of (a, b, bias, scale_a, scale_b), and set 0's reference."""

    key: tuple
    sets: list[tuple]
    ref: torch.Tensor
    scale_c: torch.Tensor | None = None  # the output scale (cuBLASLt's D scale): unused by a16w16 tuning


@dataclass
class WorkerRuntime:
    """Everything a worker keeps between items: its device, identity and the current shape's buffers."""

    device: torch.device
    identity: DeviceIdentity
    cache: int
    _data: _Data | None = field(default=None, repr=False)

    @classmethod
    def create(cls, plugins: Sequence[str] = ()) -> "WorkerRuntime":
        """Set up this process: plugins, device 0 of what CUDA_VISIBLE_DEVICES shows (or CPU), exact fp32 matmul."""
        import_plugins(plugins)
        if torch.cuda.is_available():
            torch.cuda.set_device(0)
            device = torch.device("cuda", 0)
        else:
            device = torch.device("cpu")
        # The float32 reference must be float32, not TF32.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        return cls(device, device_identity(device), cache_bytes(device))

    # ---- items ---------------------------------------------------------------------------------------------
    def run_item(self, task: Task, index: int) -> ItemResult:
        """Run item ``index`` of ``task``. An exception becomes a failed result; it asks for a restart only if the
        device is unusable afterwards (a sticky CUDA error), so a Triton config that fails to compile costs no
        restart while an illegal memory access does."""
        try:
            if task.kind == ENUMERATE:
                return self._enumerate(task, index)
            if task.kind == TIME:
                return self._time(task, index)
            handler = JOB_KINDS.get(task.kind)
            if handler is None:
                return ItemResult.failed(task, index, f"job kind {task.kind!r} is not registered in this worker "
                                                      "(its module must be one of the plugins)")
            return handler(self, task, index)
        except Exception as exc:  # the candidate's fault, never the run's
            tb = traceback.extract_tb(exc.__traceback__)
            where = f" at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else ""
            healthy = self.healthy()
            if not healthy:
                self._data = None
            return ItemResult.failed(task, index, f"{type(exc).__name__}: {exc}{where}"[:500], restart=not healthy)

    def healthy(self) -> bool:
        """Whether the device still runs work correctly after a failure (always true on CPU)."""
        if self.device.type != "cuda":
            return True
        try:
            torch.cuda.synchronize()
            return float((torch.ones(1, device=self.device) + 1).item()) == 2.0
        except Exception:  # any error here means the context is poisoned
            return False

    def _enumerate(self, task: Task, index: int) -> ItemResult:
        name = task.items[index]
        backend = backends.get_backend(name)
        if not backend.is_available():
            return ItemResult.failed(task, index, f"backend {name!r} unavailable: {backend.unavailable_reason()}")
        sols = tuple(backend.candidates(task.problem, self.identity))
        bad = [s for s in sols if not isinstance(s, Solution) or s.libtype != name]
        if bad:
            return ItemResult.failed(task, index, f"backend {name!r} returned foreign candidates, e.g. {bad[0]!r}")
        return ItemResult(task.task_id, index, True, solutions=sols, is_blaslt=bool(backend.is_blaslt))

    def _time(self, task: Task, index: int) -> ItemResult:
        sol: Solution = task.items[index]
        p = task.problem
        backend = backends.get_backend(sol.libtype)
        if not backend.is_available():
            why = backend.unavailable_reason()
            return ItemResult.failed(task, index, f"backend {sol.libtype!r} unavailable: {why}")
        runner = backend.prepare(p, sol, self.identity)
        if runner is None:
            return ItemResult.failed(task, index, "prepare() returned None: solution cannot run this shape here")
        data = self._inputs(p, task.seed)
        sc = data.scale_c
        err = math.nan
        if task.check:
            a, b, bias, sa, sb = data.sets[0]
            out = runner(a, b, bias, p.otype, sa, sb, sc)
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != (p.M, p.N) or out.dtype != p.otype:
                got = f"{tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
                return ItemResult.failed(task, index, f"returned {got}, expected ({p.M}, {p.N}) {p.otype}")
            err = err_ratio(out, data.ref, tolerance_for(p.dtype, p.otype))
            del out
            if err > task.max_err:
                return ItemResult(task.task_id, index, False, err_ratio=err,
                                  error=f"err_ratio {err:.4f} > {task.max_err} (not timed)")
        sets = data.sets

        def call(i: int) -> object:
            a, b, bias, sa, sb = sets[i]
            return runner(a, b, bias, p.otype, sa, sb, sc)

        t = time_runner(call, len(sets), self.device, task.timing)
        if not (t.us > 0) or math.isinf(t.us):
            return ItemResult.failed(task, index, f"timing gave {t.us} us")
        return ItemResult(task.task_id, index, True, us=t.us, err_ratio=err, method=f"{t.method}x{t.n_sets}")

    # ---- inputs ----------------------------------------------------------------------------------------------
    def _inputs(self, p: GemmProblem, seed: int) -> _Data:
        """Inputs for ``p`` (cached while consecutive items share the shape): A ~ N(0,1), B ~ N(0,1/K) so outputs
        are about unit scale (what the tolerance table assumes), bias ~ N(0,1), fp8 scales 0.5 and 2."""
        key = (p, seed)
        if self._data is not None and self._data.key == key:
            return self._data
        self._data = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        dev = self.device
        gen = torch.Generator(device=dev).manual_seed(seed)  # on the device: a 1 GB weight in milliseconds
        a32 = torch.randn(p.M, p.K, generator=gen, device=dev)
        b32 = torch.randn(p.N, p.K, generator=gen, device=dev).mul_(p.K ** -0.5)
        bias_dtype = p.otype if p.dtype in FP8_DTYPES else p.dtype
        bias = torch.randn(p.N, generator=gen, device=dev).to(bias_dtype) if p.bias else None
        a, b = a32.to(p.dtype), b32.to(p.dtype)
        sa = sb = None
        if p.scaleAB:
            sa = torch.tensor(0.5, dtype=torch.float32, device=dev)
            sb = torch.tensor(2.0, dtype=torch.float32, device=dev)
        ref = a.float() @ b.float().t()
        if sa is not None:
            ref = ref * (sa * sb)
        if bias is not None:
            ref = ref + bias.float()
        del a32, b32
        isz = a.element_size()
        per_set = (p.M * p.K + p.N * p.K) * isz + p.M * p.N * torch.empty((), dtype=p.otype).element_size()
        free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else None
        n = rotating_sets(per_set, self.cache, free)
        sets = [(a, b, bias, sa, sb)]
        for _ in range(n - 1):
            sets.append((a.clone(), b.clone(), None if bias is None else bias.clone(), sa, sb))
        self._data = _Data(key, sets, ref)
        return self._data
