"""The ``--ray`` executor: the tuner's tasks run on Ray actors, one per GPU of a Ray cluster (one machine or many).

Same protocol as the ``--mp`` process pool (:class:`gradlib.pool.Executor`), same worker code: each actor requests
one GPU (``num_gpus=1``; Ray pins it with CUDA_VISIBLE_DEVICES) or, on a CPU-only cluster, one CPU, and wraps a
:class:`~gradlib.tasks.WorkerRuntime`. The driver sends a task's items to its actor one at a time, so it always
knows which candidate is running:

* an item running past the per-candidate timeout: the actor is killed, the candidate recorded failed, a new actor
  is started (anywhere in the cluster) and the task goes on with its next item there;
* an actor that dies (the candidate segfaulted or killed its process, a GPU fault, its node was lost): the running
  candidate is recorded failed and the task's remaining items are retried on a new actor, at most ``max_retries``
  times per task (then the rest are recorded failed: a node that keeps killing actors must not stall the run);
* an actor that cannot start ``MAX_START_FAILURES`` times in a row (or waits longer than ``STARTUP_TIMEOUT_S`` for
  resources): :class:`~gradlib.pool.PoolError`, as in ``--mp``.

Actors never write files: results come back to the driver, which merges them with the same checkpoint, lock and
resume code as ``--mp`` (:mod:`gradlib.results`). Actors are owned by the driver, so a driver killed with SIGKILL
takes its actors with it and leaves the cluster as it was; the tuned file holds every checkpointed shape.

Ray is an optional dependency (``pip install aiter_gemm[ray]``): it is imported only when an executor is built.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from aiter_gemm.device import DeviceIdentity
from aiter_gemm.settings import set_env
from gradlib.pool import (
    MAX_START_FAILURES,
    STARTUP_TIMEOUT_S,
    ItemDone,
    PoolError,
    SlotExecutor,
    SlotState,
    TaskDone,
)
from gradlib.records import ItemResult, Task
from gradlib.tasks import WorkerRuntime

log = logging.getLogger(__name__)

GPU = "GPU"  # the device label of a slot whose actor requests one GPU (Ray chooses which); None: a CPU actor
LOCAL = "local"  # --ray local: start a private single-machine Ray instance for this run
# Actor deaths one task survives before its remaining items are recorded failed. Each death already costs the
# candidate that was running, so the bound only stops a sick node (OOM killer, flaky driver) from turning a 500-
# candidate task into 500 actor restarts of ~10 s each; 16 leaves room for a Triton config space with a few
# faulting configs.
MAX_TASK_RETRIES = 16
INSTALL_HINT = "the --ray executor needs Ray: pip install 'aiter_gemm[ray]' (or pip install 'ray>=2.9')"


def _ray():
    """The ``ray`` module, or ImportError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from None
    return ray


_CONNECTED_HERE = False  # whether connect() made this process's Ray connection (then close() ends it)


def connect(address: str) -> bool:
    """Connect this process to the Ray cluster at ``address`` (``auto``, ``HOST:PORT``, ``ray://HOST:10001``) or
    start a private one (``local``); True if the connection is ours (made by this function, now or before), so
    :meth:`RayExecutor.close` ends it. A process already connected by its own ``ray.init`` (a test) keeps that
    connection, whatever ``address`` says."""
    global _CONNECTED_HERE
    ray = _ray()
    if ray.is_initialized():
        return _CONNECTED_HERE
    if address == LOCAL:
        kwargs = {"logging_level": logging.WARNING, "include_dashboard": False}
    elif address.startswith("ray://"):  # the Ray client takes few of ray.init's options
        kwargs = {"address": address}
    else:
        kwargs = {"address": address, "logging_level": logging.WARNING}
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConnectionError(f"cannot connect to the Ray cluster at {address!r}: {exc}; start one with "
                              "'ray start --head' or pass --ray local") from exc
    _CONNECTED_HERE = True
    return True


def disconnect() -> None:
    """End the connection :func:`connect` made (a cluster we joined keeps running; a ``local`` one stops)."""
    global _CONNECTED_HERE
    ray = _ray()
    if _CONNECTED_HERE and ray.is_initialized():
        ray.shutdown()
    _CONNECTED_HERE = False


def cluster_gpus() -> int:
    """GPUs the connected cluster has in total (Ray's ``GPU`` resource, all nodes)."""
    return int(_ray().cluster_resources().get("GPU", 0))


def ray_worker_devices(address: str, mp: int | None) -> list[str | None]:
    """The actor slots of a ``--ray`` run: one GPU actor per cluster GPU (``mp`` of them), or ``mp`` (default 1)
    CPU actors on a cluster without GPUs. Connects to the cluster to count its GPUs."""
    connect(address)
    n_gpu = cluster_gpus()
    if n_gpu == 0:
        return [None] * (mp or 1)
    if mp is not None and mp > n_gpu:
        raise ValueError(f"--mp {mp} but the Ray cluster has only {n_gpu} GPU(s) (one actor per GPU)")
    return [GPU] * (mp or n_gpu)


class TunerActor:
    """A Ray actor owning one device: the same :class:`~gradlib.tasks.WorkerRuntime` an ``--mp`` worker runs."""

    def __init__(self, plugins: Sequence[str], env: dict[str, str | None]) -> None:
        # Before anything imports Triton: TRITON_INTERPRET on CPU must be set before a kernel module is defined.
        set_env(env)  # for the actor's whole life (its own process)
        self.rt = WorkerRuntime.create(plugins)

    def hello(self) -> tuple[DeviceIdentity, int, str]:
        """Identity of the device, pid and Ray node id (for logs and the tests)."""
        import ray

        return self.rt.identity, os.getpid(), ray.get_runtime_context().get_node_id()

    def run_item(self, task: Task, index: int) -> ItemResult:
        return self.rt.run_item(task, index)


_REMOTE_ACTOR = None


def _remote_actor():
    """``ray.remote(TunerActor)``, made once (Ray exports the class to the cluster on first use)."""
    global _REMOTE_ACTOR
    if _REMOTE_ACTOR is None:
        _REMOTE_ACTOR = _ray().remote(TunerActor)
    return _REMOTE_ACTOR


@dataclass
class _Slot(SlotState):
    """One device's actor, and the refs of what it is doing."""

    actor: object = None
    hello_ref: object = None  # pending hello: the actor is starting
    where: str = ""  # "pid P on node N", for logs
    task_ref: object = None  # the task in the object store: sent once, referenced by every item call
    ref: object = None  # result of the running item
    deaths: int = 0  # actor deaths during the current task


class RayExecutor(SlotExecutor):
    """One actor per entry of ``devices`` (``GPU``: ``num_gpus=1``; None: ``num_cpus=1``) on the Ray cluster at
    ``address``; implements :class:`gradlib.pool.Executor`."""

    def __init__(self, address: str, devices: Sequence[str | None], plugins: Sequence[str] = (),
                 timeout: float = 60.0, extra_env: dict[str, str | None] | None = None,
                 max_retries: int = MAX_TASK_RETRIES) -> None:
        if not devices:
            raise ValueError("RayExecutor needs at least one actor slot")
        self.address = address
        self._slots = [_Slot(i, d) for i, d in enumerate(devices)]
        self._plugins = tuple(plugins)
        self.timeout = timeout
        self.max_retries = max_retries
        self._env = dict(extra_env or {})
        self._events: list[ItemDone | TaskDone] = []
        self._owns_connection = False
        self.identity: DeviceIdentity | None = None
        self.restarts = 0

    # ---- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Connect, start every actor and wait for all hellos; :class:`PoolError` if one cannot start."""
        try:
            self._owns_connection = connect(self.address)
        except ConnectionError as exc:
            raise PoolError(str(exc)) from None
        need = sum(1 for s in self._slots if s.device == GPU)
        have = cluster_gpus()
        if need > have:
            raise PoolError(f"{need} GPU actor(s) requested but the Ray cluster has {have} GPU(s)")
        for s in self._slots:
            self._spawn(s)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not all(s.ready for s in self._slots):
            if time.monotonic() > deadline:
                raise PoolError(f"Ray actors did not start within {STARTUP_TIMEOUT_S:.0f} s")
            self._pump(0.5)
        by_key = {(s.identity.gfx, s.identity.cu_num) for s in self._slots}
        if len(by_key) != 1:  # rows are keyed by (gfx, cu_num): one run must tune one kind of device
            raise PoolError(f"Ray actors run on different devices {sorted(by_key)}; tune each kind in its own run "
                            "(a cluster of one GPU kind, or fewer actors with --mp)")
        self.identity = self._slots[0].identity
        log.info("Ray: %d actor(s) on %s: %s", len(self._slots), self.identity,
                 "; ".join(s.where for s in self._slots))

    def close(self) -> None:
        """Kill the actors; disconnect if :meth:`start` connected (a cluster we joined keeps running)."""
        try:
            ray = _ray()
        except ImportError:
            return
        if ray.is_initialized():
            for s in self._slots:
                self._kill(s)
        for s in self._slots:
            s.actor = s.hello_ref = s.ref = s.task_ref = None
        if self._owns_connection:
            disconnect()
            self._owns_connection = False

    # ---- work --------------------------------------------------------------------------------------------
    def submit(self, task: Task) -> None:
        free = [s for s in self._slots if s.task is None]
        if not free:
            raise RuntimeError("RayExecutor.submit with no free slot (check free_slots() first)")
        slot = next((s for s in free if s.ready), free[0])
        slot.task, slot.task_ref, slot.next_index, slot.running, slot.deaths = task, _ray().put(task), task.first, \
            None, 0
        if slot.ready:
            self._send_next(slot)

    # ---- internals ---------------------------------------------------------------------------------------
    def _spawn(self, s: _Slot) -> None:
        opts = {"num_cpus": 1, "num_gpus": 1 if s.device == GPU else 0, "max_restarts": 0, "max_task_retries": 0}
        s.actor = _remote_actor().options(**opts).remote(self._plugins, self._env)
        s.hello_ref = s.actor.hello.remote()
        s.ready, s.started_at, s.running, s.ref = False, time.monotonic(), None, None

    def _kill(self, s: _Slot) -> None:
        if s.actor is not None:
            try:
                _ray().kill(s.actor, no_restart=True)
            except Exception as exc:  # already gone, or the cluster is: nothing left to kill
                log.debug("slot %d: kill: %s", s.index, exc)
        s.actor = s.hello_ref = s.ref = None

    def _replace(self, s: _Slot) -> None:
        """A new actor for ``s`` (the old one died, timed out or has an unusable device); the task stays."""
        self._kill(s)
        self.restarts += 1
        self._spawn(s)

    def _send_next(self, s: _Slot) -> None:
        if s.next_index >= len(s.task.items):
            self._events.append(TaskDone(s.task))
            s.task = s.task_ref = None
            s.running = s.ref = None
            return
        s.running, s.item_started = s.next_index, time.monotonic()
        s.ref = s.actor.run_item.remote(s.task_ref, s.running)

    def _record(self, s: _Slot, res: ItemResult) -> None:
        self._events.append(ItemDone(s.task, res))
        s.next_index, s.running, s.ref = res.index + 1, None, None

    def _pump(self, timeout: float) -> None:
        """Wait for a hello or an item result (at most ``timeout`` s), handle every one that is ready, then the
        item timeouts and start timeouts."""
        ray = _ray()
        # ref -> (slot, kind). Looked up by equality: the Ray client's wait returns new ref objects, not ours.
        pending = {}
        for s in self._slots:
            if s.hello_ref is not None:
                pending[s.hello_ref] = (s, "hello")
            if s.ref is not None:
                pending[s.ref] = (s, "item")
        wait_s = max(0.0, min(timeout, self._next_deadline()))
        if pending:
            ready, rest = ray.wait(list(pending), num_returns=1, timeout=wait_s)
            if ready and rest:
                ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
            for ref in ready:
                s, kind = pending[ref]
                if kind == "hello" and s.hello_ref is not None and ref == s.hello_ref:
                    self._on_hello(s)
                elif kind == "item" and s.ref is not None and ref == s.ref:
                    self._on_item(s)
                # else: the slot moved on while this batch was handled (its actor was replaced)
        else:
            time.sleep(min(wait_s, 0.05))
        now = time.monotonic()
        for s in self._slots:
            if s.running is not None and now - s.item_started > self.timeout:
                if ray.wait([s.ref], timeout=0)[0]:  # finished since the wait returned
                    self._on_item(s)
                    continue
                item = s.running
                self._kill(s)
                self._record(s, ItemResult.failed(s.task, item, f"timed out after {self.timeout:g} s (actor killed)"))
                self.restarts += 1
                self._spawn(s)
            elif not s.ready and s.actor is not None and now - s.started_at > STARTUP_TIMEOUT_S:
                self._start_failed(s, f"no hello within {STARTUP_TIMEOUT_S:.0f} s (waiting for resources?)")

    def _on_hello(self, s: _Slot) -> None:
        ray = _ray()
        try:
            ident, pid, node = ray.get(s.hello_ref)
        except Exception as exc:  # the constructor raised (a plugin import, CUDA init) or the actor died
            self._start_failed(s, _why(exc))
            return
        s.hello_ref, s.ready, s.identity, s.start_failures = None, True, ident, 0
        s.where = f"pid {pid} on node {node[:12]}"
        log.debug("slot %d (%s) ready: %s", s.index, s.where, ident)
        if s.task is not None and s.running is None:
            self._send_next(s)

    def _on_item(self, s: _Slot) -> None:
        ray = _ray()
        item = s.running
        try:
            res: ItemResult = ray.get(s.ref)
        except _death_errors(ray) as exc:
            self._died(s, item, _why(exc))
            return
        except Exception as exc:  # the call itself failed (e.g. an unpicklable result): the actor still lives
            self._record(s, ItemResult.failed(s.task, item, f"Ray call failed: {_why(exc)}"))
            self._send_next(s)
            return
        self._record(s, res)
        if res.restart:  # the device is unusable after this candidate: a fresh actor continues the task
            log.info("slot %d: candidate %d left the device unusable; replacing the actor", s.index, item)
            self._replace(s)
        else:
            self._send_next(s)

    def _died(self, s: _Slot, item: int, why: str) -> None:
        """The actor died running ``item``: fail it, then retry the rest of the task on a new actor (bounded)."""
        log.warning("slot %d (%s): actor died on item %d of task %d: %s", s.index, s.where, item, s.task.task_id,
                    why)
        self._record(s, ItemResult.failed(s.task, item, f"worker actor ({s.where}) died: {why}"))
        s.deaths += 1
        if s.deaths > self.max_retries:
            reason = f"not run: {s.deaths} actor deaths in this task (more than {self.max_retries} retries)"
            for i in range(s.next_index, len(s.task.items)):
                self._events.append(ItemDone(s.task, ItemResult.failed(s.task, i, reason)))
            s.next_index = len(s.task.items)
        self._replace(s)
        if s.next_index >= len(s.task.items):
            self._send_next(s)  # nothing left to retry: the task is done (the new actor waits for the next one)

    def _start_failed(self, s: _Slot, why: str) -> None:
        s.start_failures += 1
        log.warning("Ray actor %d (device %s) failed to start: %s", s.index, s.device or "cpu", why)
        self._kill(s)
        if s.start_failures >= MAX_START_FAILURES:
            raise PoolError(f"Ray actor {s.index} failed to start {s.start_failures} times; last error: {why}")
        self._spawn(s)


def _death_errors(ray) -> tuple[type[BaseException], ...]:
    """Ray's exceptions meaning "the process or node running the call is gone" (those this Ray version has)."""
    names = ("RayActorError", "WorkerCrashedError", "ObjectLostError", "NodeDiedError")
    return tuple(getattr(ray.exceptions, n) for n in names if hasattr(ray.exceptions, n))


def _why(exc: BaseException) -> str:
    """A one-line reason from a Ray exception (their messages span lines, with ids, tracebacks and advice): for a
    dead actor the worker's exit type and detail, for a remote exception its last line, else 200 characters."""
    raw = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # Ray colours the remote function's name
    lines = [ln.strip() for ln in raw.splitlines() if ln.strip()]
    if len(lines) > 1 and re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b", lines[-1]):
        return f"{type(exc).__name__}: {lines[-1]}"[:300]  # the remote traceback's final line: the cause
    text = " ".join(raw.split())
    text = re.sub(r"class_name: \S+ actor_id: \S+ (pid: \d+ )?(name: \S+ )?namespace: \S+ (ip: \S+ ?)?", "", text)
    exit_type = re.search(r"Worker exit type: (\w+)", text)
    detail = re.search(r"Worker exit detail: (.*?\.)(?: |$)", text)
    if exit_type:
        return f"{type(exc).__name__}, {exit_type.group(1)}" + (f": {detail.group(1)}" if detail else "")
    because = re.search(r"(The actor is dead because [^.]*\.)", text)  # e.g. its node died
    if because:
        return f"{type(exc).__name__}: {because.group(1)}"[:300]
    return f"{type(exc).__name__}: {text}"[:200]


__all__ = ["GPU", "LOCAL", "MAX_TASK_RETRIES", "RayExecutor", "TunerActor", "connect", "cluster_gpus",
           "ray_worker_devices"]
