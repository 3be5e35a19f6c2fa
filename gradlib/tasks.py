"""The code that executes one item of a task in a worker (the tasks and results themselves, picklable data, are
:mod:`gradlib.records`).

A :class:`~gradlib.records.Task` is a list of items on one shape of one op: either the backends whose candidates
to enumerate, or the solutions to time. Any executor (the ``--mp`` process pool of :mod:`gradlib.pool`, or Ray
actors) runs a task's items in order through :meth:`WorkerRuntime.run_item` in a process that owns one device, and
must return exactly one :class:`~gradlib.records.ItemResult` per item, synthesising a failed one for an item whose
process died or timed out, then continuing with the items after it. Executors never write files: the driver does.
What differs between ops (inputs, reference, runner call) comes from the op's :class:`~aiter_gemm.opspec.OpSpec`,
the runner and the inputs' size check from :mod:`aiter_gemm.testbed`.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from aiter_gemm.accuracy import err_ratio, rel_error, tolerance_for
from aiter_gemm.backends.base import GemmProblem, Problem, Solution
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.registry import op_spec
from aiter_gemm.testbed import Inputs, inputs_memory, prepare_runner
from aiter_gemm.timing import cache_bytes, time_runner
from gradlib.records import DEFAULT, DEFAULTS, ENUMERATE, ItemResult, Task

log = logging.getLogger(__name__)

def device_identity(device: torch.device) -> DeviceIdentity:
    """This process's identity for ``device``, with AITER_GEMM_ARCH / AITER_GEMM_CU_NUM applied by the runtime's
    settings, so the rows written are the rows the runtime looks up."""
    from aiter_gemm import current_device_identity

    return current_device_identity(device.type == "cuda")


def backend_of(op: str, libtype: str):
    """The op's backend ``libtype`` as the runtime's dispatcher of that op configures it."""
    from aiter_gemm import get_dispatcher

    return get_dispatcher(op).backend(libtype)


def import_plugins(modules: Sequence[str]) -> None:
    """Import modules that register extra backends on import (``--plugin``, ``GRADLIB_PLUGINS``)."""
    for name in modules:
        if name:
            importlib.import_module(name)


@dataclass
class WorkerRuntime:
    """Everything a worker keeps between items: its device, identity and the current shape's buffers."""

    device: torch.device
    identity: DeviceIdentity
    cache: int
    _data: Inputs | None = field(default=None, repr=False)
    #: (inputs key, libtype, reference variant) -> a backend's own reference (None: the op's) of the current inputs
    _own_refs: dict = field(default_factory=dict, repr=False)

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
            if task.kind == DEFAULTS:
                _, ran, _ = self._runner(replace(task, problem=task.problem.with_m(task.items[index])), DEFAULT)
                return ItemResult(task.task_id, index, True, solutions=(ran,))
            return self._time(task, index)
        except Exception as exc:  # the candidate's fault, never the run's
            tb = traceback.extract_tb(exc.__traceback__)
            where = f" at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else ""
            healthy = self.healthy()
            if not healthy:
                self._data = None
                self._own_refs = {}
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
        backend = backend_of(task.op, name)
        if not backend.is_available():
            return ItemResult.failed(task, index, f"backend {name!r} unavailable: {backend.unavailable_reason()}")
        quick = bool(dict(task.options).get("quick", False))
        sols = tuple(enumerate_solutions(backend, task.problem, self.identity, quick))
        bad = [s for s in sols if not isinstance(s, Solution) or s.libtype != name]
        if bad:
            return ItemResult.failed(task, index, f"backend {name!r} returned foreign candidates, e.g. {bad[0]!r}")
        return ItemResult(task.task_id, index, True, solutions=sols, is_blaslt=bool(backend.is_blaslt))

    def _runner(self, task: Task, sol: Solution) -> tuple[object, Solution, str | None]:
        """(runner, the solution it runs, None) or (None, sol, why not): DEFAULT resolves to the runtime's default."""
        eager = task.timing is not None and not task.timing.use_graph
        return prepare_runner(task.op, task.problem, sol, self.identity, eager)

    def _time(self, task: Task, index: int) -> ItemResult:
        p = task.problem
        runner, ran, why = self._runner(task, task.items[index])
        if runner is None:
            return ItemResult.failed(task, index, why)
        spec = op_spec(task.op)
        data = self._inputs(task)
        err = rel = math.nan
        if task.check:
            # Poison the memory the output will most likely be allocated in (the caching allocator hands the same
            # block back), so a kernel that leaves elements unwritten fails instead of reading an older output.
            shape, otype = tuple(data.ref.shape), output_dtype(p)
            torch.full(shape, math.nan, dtype=otype, device=self.device)
            out = spec.call_runner(runner, data.sets[0], p)
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or out.dtype != otype:
                got = f"{tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
                return ItemResult.failed(task, index, f"returned {got}, expected {shape} {otype}")
            ref = self._reference(task, ran, data)
            err = err_ratio(out, ref, tolerance_for(p.dtype, otype))
            rel = rel_error(out, ref)
            del out
            if err > task.max_err:
                return ItemResult(task.task_id, index, False, err_ratio=err, rel_err=rel,
                                  error=f"err_ratio {err:.4f} > {task.max_err} (not timed)")
        sets = data.sets

        def call(i: int) -> object:
            return spec.call_runner(runner, sets[i], p)

        t = time_runner(call, len(sets), self.device, task.timing)
        if not (t.us > 0) or math.isinf(t.us):
            return ItemResult.failed(task, index, f"timing gave {t.us} us")
        return ItemResult(task.task_id, index, True, us=t.us, err_ratio=err, method=f"{t.method}x{t.n_sets}",
                          solutions=(ran,) if ran is not task.items[index] else (), rel_err=rel)

    def _reference(self, task: Task, sol: Solution, data: Inputs) -> torch.Tensor:
        """Set 0's reference for ``sol``: its backend's own for its arithmetic (:meth:`~aiter_gemm.backends.base.
        Backend.reference` of its :meth:`~aiter_gemm.backends.base.Backend.reference_variant`, kept while the
        inputs are), else the op's."""
        backend = backend_of(task.op, sol.libtype)
        key = (data.key, sol.libtype, backend.reference_variant(task.problem, sol))
        if key not in self._own_refs:
            self._own_refs[key] = backend.reference(task.problem, data.sets[0], key[2])
        own = self._own_refs[key]
        return data.ref if own is None else own

    def _inputs(self, task: Task) -> Inputs:
        """The op's inputs for the task's shape, cached while consecutive items share shape, seed and options."""
        key = (task.op, task.problem, task.seed, task.options)
        if self._data is not None and self._data.key == key:
            return self._data
        self._data = None
        self._own_refs = {}
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        p = task.problem
        # A shape that cannot fit (M = 2**31: 137 GB for A alone) fails saying so, on every candidate (the console
        # then shows it), instead of as one allocation error in the profile file.
        fits, too_large = inputs_memory(p, self.device)
        if not fits:
            raise MemoryError(too_large)
        try:
            data = op_spec(task.op).make_inputs(p, task.seed, self.device, self.cache, dict(task.options))
        except (MemoryError, RuntimeError) as exc:  # torch's OutOfMemoryError and CPU allocation errors
            if too_large is None or not _is_allocation_error(exc):
                raise
            raise MemoryError(f"{too_large}; allocating them failed: {str(exc).splitlines()[0][:200]}") from exc
        data.key = key
        self._data = data
        return data


def output_dtype(p: Problem) -> torch.dtype:
    """The dtype a runner of ``p`` must return: a GEMM's ``otype``; an op whose problem names none (fused MoE)
    returns its inputs' ``dtype``. The shape is the float32 reference's."""
    return getattr(p, "otype", p.dtype)


def _is_allocation_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or "out of memory" in text or "not enough memory" in text \
        or "allocate" in text


def enumerate_solutions(backend, problem: GemmProblem, identity: DeviceIdentity, quick: bool = False) -> list:
    """A backend's candidates for ``problem`` (its short list with ``quick``): what the worker's enumerate step
    returns, for callers that list candidates in-process."""
    return list(backend.quick_candidates(problem, identity) if quick else backend.candidates(problem, identity))
