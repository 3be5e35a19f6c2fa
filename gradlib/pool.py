"""The ``--mp`` executor: one spawned worker process per GPU (pinned with CUDA_VISIBLE_DEVICES), one task at a time.

A worker announces each item before running it, so when its process dies (segfault, GPU fault, ``os._exit``,
SIGKILL) or an item runs past the timeout (the driver SIGKILLs it), the driver knows which item was running: that
item gets a failed :class:`~gradlib.tasks.ItemResult`, a fresh process is spawned on the same device and the task
continues with the next item. Each worker talks over its own pipe, so a process killed mid-message corrupts only a
pipe that is thrown away with it. Workers never touch files; only the driver writes.

:class:`Executor` is the interface the search loop drives; a Ray-based executor (issue 8) implements the same four
methods with one actor per GPU running :class:`~gradlib.tasks.WorkerRuntime`.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from typing import Protocol

from aiter_gemm.device import DeviceIdentity
from aiter_gemm.settings import scoped_env
from gradlib.records import ItemResult, Task
from gradlib.tasks import WorkerRuntime

log = logging.getLogger(__name__)

# A worker that has not said hello after this long is treated as failed to start (imports torch, maybe Triton,
# initialises CUDA: seconds normally, minutes on a cold cache).
STARTUP_TIMEOUT_S = 300.0
# Consecutive failed starts of one slot before the pool gives up (a broken environment, not a bad candidate).
MAX_START_FAILURES = 3


class PoolError(RuntimeError):
    """The executor cannot go on (workers fail to start)."""


@dataclass(frozen=True)
class ItemDone:
    """Event: one item of ``task`` finished (or failed)."""

    task: Task
    result: ItemResult


@dataclass(frozen=True)
class TaskDone:
    """Event: every item of ``task`` has an :class:`ItemDone`; the slot is free."""

    task: Task


class Executor(Protocol):
    """What the search loop needs from an executor (process pool here, Ray actors in issue 8).

    ``start`` brings the workers up and sets ``identity`` (the device rows are keyed by); ``submit`` gives a task
    to a free slot; ``poll`` returns events, exactly one :class:`ItemDone` per item from ``task.first`` on and then
    one :class:`TaskDone`, failing the items whose process died or timed out; ``restarts`` counts replaced workers.
    """

    identity: DeviceIdentity | None
    restarts: int

    @property
    def slots(self) -> int: ...

    def start(self) -> None: ...
    def free_slots(self) -> int: ...
    def submit(self, task: Task) -> None: ...
    def poll(self, timeout: float) -> list[ItemDone | TaskDone]: ...
    def close(self) -> None: ...


def _exit_with_parent(poll_s: float = 1.0) -> None:
    """Leave as soon as the driver is gone (SIGKILLed), even in the middle of a hanging candidate."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="gradlib-parent-watch", daemon=True).start()


def worker_main(conn: Connection, plugins: Sequence[str]) -> None:
    """Worker process: say hello with the device identity, then run tasks item by item until told to stop."""
    # The driver handles Ctrl-C; a worker must not die of the terminal's SIGINT in the middle of an item.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent()
    try:
        try:
            rt = WorkerRuntime.create(plugins)
        except BaseException as exc:  # report anything, including a failing plugin import, then exit
            conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
            return
        conn.send(("hello", rt.identity, os.getpid()))
        while True:
            task = conn.recv()
            if task is None:
                return
            for i in range(task.first, len(task.items)):
                conn.send(("start", task.task_id, i))
                res = rt.run_item(task, i)
                conn.send(("item", res))
                if res.restart:
                    return  # the driver sees the exit and starts a fresh process
            conn.send(("done", task.task_id))
    except (EOFError, OSError):  # the driver is gone: nobody to report to
        return


@dataclass
class SlotState:
    """What every executor tracks about one worker slot (subclasses add the process or actor handles)."""

    index: int
    device: str | None  # CUDA_VISIBLE_DEVICES value (pool) or GPU (Ray); None: a CPU worker
    ready: bool = False
    started_at: float = 0.0
    start_failures: int = 0
    identity: DeviceIdentity | None = None
    task: Task | None = None
    next_index: int = 0  # first item of self.task without a result
    running: int | None = None  # index of the item in flight (announced or sent), without a result yet
    item_started: float = 0.0


@dataclass
class _Slot(SlotState):
    """One device's worker process and its pipe."""

    proc: mp.process.BaseProcess | None = None
    conn: Connection | None = None


class SlotExecutor:
    """What every executor with one slot per worker shares: context management and slot counting (``_slots``:
    objects with a ``task`` attribute, None when free) and event polling (``_events``, filled by ``_pump``)."""

    _slots: list
    _events: list
    timeout: float

    def start(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def slots(self) -> int:
        return len(self._slots)

    def free_slots(self) -> int:
        return sum(1 for s in self._slots if s.task is None)

    def poll(self, timeout: float) -> list[ItemDone | TaskDone]:
        """Events since the last poll, waiting up to ``timeout`` s for one (``_pump`` handles deaths, timeouts)."""
        if not self._events:
            self._pump(timeout)
        events, self._events = self._events, []
        return events

    def _pump(self, timeout: float) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _next_deadline(self) -> float:
        """Seconds until the earliest running item times out (so the wait wakes up for it)."""
        now = time.monotonic()
        left = [s.item_started + self.timeout - now for s in self._slots if s.running is not None]
        return max(0.0, min(left)) + 0.01 if left else 3600.0


class ProcessPool(SlotExecutor):
    """``len(devices)`` worker processes; ``devices[i]`` is slot i's CUDA_VISIBLE_DEVICES (None: CPU)."""

    def __init__(self, devices: Sequence[str | None], plugins: Sequence[str] = (), timeout: float = 60.0,
                 extra_env: dict[str, str | None] | None = None) -> None:
        if not devices:
            raise ValueError("ProcessPool needs at least one device slot")
        self._ctx = mp.get_context("spawn")  # fork after CUDA init is undefined behaviour; spawn always
        self._slots = [_Slot(i, d) for i, d in enumerate(devices)]
        self._plugins = tuple(plugins)
        self.timeout = timeout
        self._extra_env = dict(extra_env or {})
        self._events: list[ItemDone | TaskDone] = []
        self.identity: DeviceIdentity | None = None
        self.restarts = 0

    # ---- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn every worker and wait for all hellos; raise :class:`PoolError` if a slot cannot start."""
        for s in self._slots:
            self._spawn(s)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not all(s.ready for s in self._slots):
            if time.monotonic() > deadline:
                raise PoolError(f"workers did not start within {STARTUP_TIMEOUT_S:.0f} s")
            self._pump(0.5)
        idents = {s.identity for s in self._slots}
        if len(idents) != 1:
            log.warning("workers report different devices %s; rows are keyed by the first", sorted(map(str, idents)))
        self.identity = self._slots[0].identity

    def close(self) -> None:
        for s in self._slots:
            if s.conn is not None:
                with contextlib.suppress(OSError, BrokenPipeError):
                    s.conn.send(None)
        for s in self._slots:
            if s.proc is not None:
                s.proc.join(timeout=5)
                if s.proc.is_alive():
                    s.proc.kill()
                    s.proc.join()
            if s.conn is not None:
                s.conn.close()
            s.proc, s.conn = None, None

    # ---- work --------------------------------------------------------------------------------------------
    def submit(self, task: Task) -> None:
        slot = next((s for s in self._slots if s.task is None), None)
        if slot is None:
            raise RuntimeError("ProcessPool.submit with no free slot (check free_slots() first)")
        slot.task, slot.next_index, slot.running = task, task.first, None
        if slot.ready:
            self._send(slot)

    # ---- internals ---------------------------------------------------------------------------------------
    def _spawn(self, s: _Slot) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        env = dict(self._extra_env)
        if s.device is not None:
            env["CUDA_VISIBLE_DEVICES"] = s.device
        proc = self._ctx.Process(target=worker_main, args=(child, self._plugins), daemon=True,
                                 name=f"gradlib-worker-{s.index}")
        with scoped_env(env):
            proc.start()
        child.close()  # so the driver sees EOF when the worker dies
        s.proc, s.conn, s.ready, s.started_at, s.running = proc, parent, False, time.monotonic(), None

    def _send(self, s: _Slot) -> None:
        task = s.task
        if s.next_index >= len(task.items):
            self._finish(s)
            return
        cont = task if s.next_index == task.first else replace(task, first=s.next_index)
        try:
            s.conn.send(cont)
        except (OSError, BrokenPipeError):
            pass  # the death is noticed through the process sentinel

    def _finish(self, s: _Slot) -> None:
        self._events.append(TaskDone(s.task))
        s.task, s.running = None, None

    def _pump(self, timeout: float) -> None:
        """Wait for messages or deaths (at most ``timeout`` s), then handle them and any item timeouts."""
        waitables = {}
        for s in self._slots:
            if s.conn is not None:
                waitables[s.conn] = s
            if s.proc is not None:
                waitables[s.proc.sentinel] = s
        ready = wait(list(waitables), timeout=max(0.0, min(timeout, self._next_deadline())))
        dead: list[_Slot] = []
        for w in ready:
            s = waitables[w]
            if w is s.conn:
                if not self._drain(s) and s not in dead:
                    dead.append(s)
            elif s.proc is not None and w == s.proc.sentinel and s not in dead:
                dead.append(s)
            # else: a handle of a process this pump already replaced
        for s in dead:
            if s.conn is not None:
                self._drain(s)
            self._died(s)
        now = time.monotonic()
        for s in self._slots:
            if s.running is not None and now - s.item_started > self.timeout:
                if s.conn is not None:
                    self._drain(s)  # the result may have arrived since the wait returned
                if s.running is None:
                    continue
                self._kill(s)
                self._fail_running(s, f"timed out after {self.timeout:g} s (worker killed)")
                self._restart(s)
            elif not s.ready and s.proc is not None and now - s.started_at > STARTUP_TIMEOUT_S:
                self._kill(s)
                self._start_failed(s, f"no hello within {STARTUP_TIMEOUT_S:.0f} s")

    def _drain(self, s: _Slot) -> bool:
        """Handle every pending message of ``s``; False when its pipe is closed or broken (the process is gone)."""
        conn = s.conn
        while True:
            try:
                if not conn.poll():
                    return True
                msg = conn.recv()
            except (EOFError, OSError):
                return False
            except Exception as exc:  # a message cut off by a kill: unpicklable garbage
                log.debug("worker %d: unreadable message (%s)", s.index, exc)
                return False
            self._handle(s, msg)
            if s.conn is not conn:  # handling it replaced the process (a fatal start)
                return True

    def _handle(self, s: _Slot, msg: tuple) -> None:
        kind = msg[0]
        if kind == "hello":
            s.ready, s.identity, s.start_failures = True, msg[1], 0
            log.debug("worker %d (pid %d, device %s) ready: %s", s.index, msg[2], s.device, msg[1])
            if s.task is not None:
                self._send(s)
        elif kind == "fatal":
            self._kill(s)
            self._start_failed(s, msg[1])
        elif kind == "start":
            s.running, s.item_started = msg[2], time.monotonic()
        elif kind == "item":
            res: ItemResult = msg[1]
            s.running = None
            s.next_index = res.index + 1
            self._events.append(ItemDone(s.task, res))
        elif kind == "done":
            self._finish(s)

    def _died(self, s: _Slot) -> None:
        """Worker process ended: fail its announced item (if any) and restart it."""
        if s.proc is None:
            return
        s.proc.join(timeout=5)
        if s.proc.is_alive():  # pipe broken but the process lingers: it cannot be talked to any more
            s.proc.kill()
            s.proc.join()
        code = s.proc.exitcode
        if not s.ready:
            self._start_failed(s, f"exited with code {code} before saying hello")
            return
        if s.running is not None:
            why = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            self._fail_running(s, f"worker process died ({why})")
        self._restart(s)

    def _fail_running(self, s: _Slot, error: str) -> None:
        res = ItemResult.failed(s.task, s.running, error)
        self._events.append(ItemDone(s.task, res))
        s.next_index, s.running = s.running + 1, None

    def _kill(self, s: _Slot) -> None:
        if s.proc is not None and s.proc.is_alive():
            s.proc.kill()
        if s.proc is not None:
            s.proc.join(timeout=10)

    def _restart(self, s: _Slot) -> None:
        if s.conn is not None:
            s.conn.close()
        self.restarts += 1
        self._spawn(s)

    def _start_failed(self, s: _Slot, why: str) -> None:
        s.start_failures += 1
        log.warning("worker %d (device %s) failed to start: %s", s.index, s.device, why)
        if s.start_failures >= MAX_START_FAILURES:
            raise PoolError(f"worker {s.index} (device {s.device}) failed to start {s.start_failures} times; "
                            f"last error: {why}")
        if s.conn is not None:
            s.conn.close()
        self._spawn(s)
