"""The dispatcher: per-shape decision (tuned row, JSON bucket or heuristic default) made once, then a dict lookup.

Written once for every op (:class:`~aiter_gemm.opspec.OpSpec`). Lookup order (AITER's): exact key, M padded at
granularity level 0, then level 1, then (ops with per-(N, K) JSON files) the JSON bucket, then the default: the
highest-priority available backend of the op whose ``default_for`` claims the shape. A row whose backend is
unavailable here, whose solution the backend rejects, or that is malformed (the op's ``row_solution`` raises
ConfigError) is a miss at that level (warned once per cause). Each
dispatcher owns an immutable table and an immutable settings object; :meth:`Dispatcher.reload` swaps them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from aiter_gemm import cudagraph, jsonconfigs, registry
from aiter_gemm.backends.base import Backend, GemmProblem, Problem, Solution
from aiter_gemm.backends.base import get_padded_m as get_padded_m  # AITER's getPaddedM, public here too
from aiter_gemm.capture import ShapeRecorder, row_key_of, row_reader_of, tuned_columns_of
from aiter_gemm.configs import ConfigError, ConfigTable, TunedRow, load_table
from aiter_gemm.device import REFERENCE_ARCH, DeviceIdentity, apply_overrides, probe_cpu, probe_gpu
from aiter_gemm.logs import WarnOnce, ensure_info_handler
from aiter_gemm.opspec import OpSpec
from aiter_gemm.settings import Settings, load_settings

log = logging.getLogger("aiter_gemm")

#: The row levels of GEMM problems (exact, then AITER's getPaddedM levels: ``GemmProblem.padded``); an op's problem
#: names its own padded levels (``MoeProblem``: ``padded``).
MATCH_LEVELS = ("exact", "padded_gl0", "padded_gl1")
DEFAULT_SOURCE = "default heuristic"
#: The end of AITER's INFO line for a shape that no tuned row serves, after the problem's ``MISS_SHAPE``.
MISS_TAIL = " not found tuned config in %s, will use default config! using %s solution:%d"
#: AITER's INFO line for a GEMM shape that no tuned row serves (aiter/tuned_gemm.py), word for word but for the
#: file list (every path of the op's variable, colon-separated).
MISS_MESSAGE = GemmProblem.MISS_SHAPE + MISS_TAIL


@dataclass(frozen=True)
class Decision:
    """What one GEMM key runs: the backend's prepared runner, and why (matched level, row, source)."""

    problem: Problem
    device: DeviceIdentity
    solution: Solution
    matched: str  # exact | padded_gl0 | padded_gl1 (GEMMs) | padded (MoE) | json | default
    row: TunedRow | None
    runner: Any  # the op's runner signature
    source: str = DEFAULT_SOURCE  # the row's file, "<json file>#<bucket>", or "default heuristic"
    extra: tuple[tuple[str, Any], ...] = ()  # its backend's description of the solution (Backend.describe)
    #: What runs when the stream is not capturing a CUDA graph, if not the same (docs/eager_path.md): a
    #: launch-heavy backend's graph-timed choice gives way to the eager default there.
    eager_solution: Solution | None = None
    eager_runner: Any = None

    def eager_plan(self) -> EagerPlan:
        """The eager-path rule, the one place entry functions (and the C++ entry, through them) learn what a call of
        this decision runs: its runner, or where the eager choice differs (:meth:`Dispatcher._eager_choice`) the
        eager runner while ``probe()`` says no CUDA graph is being captured and the decision's runner while one is."""
        if self.eager_runner is None:
            return EagerPlan(self.runner)
        return EagerPlan(self.eager_runner, self.runner, cudagraph.probe())

    @property
    def call_runner(self) -> Any:
        """The runner an entry function calls: the runner itself, or one that asks whether this thread is capturing
        a CUDA graph (:mod:`aiter_gemm.cudagraph`: an attribute read; only decisions whose eager choice differs)."""
        plan = self.eager_plan()
        if plan.probe is None:
            return plan.eager
        graph, eager, capturing = plan.graph, plan.eager, plan.probe
        warmed = []

        def switch(*args: Any) -> Any:
            if capturing():
                return graph(*args)
            if not warmed:  # the first eager call also runs the capture-time runner once, so its kernels are
                warmed.append(graph(*args))  # compiled by the usual warm-up: capture must do no file I/O
                warmed[0] = None
            return eager(*args)

        return switch

    def as_config(self) -> dict[str, Any]:
        """AITER-style config dict: the row's columns (typed where known: bools, ints, floats; unknown columns as
        written) plus ``matched`` and ``source``, and ``eager_libtype`` / ``eager_kernelName``: what runs outside
        CUDA-graph capture."""
        cfg: dict[str, Any] = dict(self.row.typed) if self.row is not None else {}
        sol = self.solution
        eager = self.eager_solution or sol
        cfg.update(self.extra)
        cfg.update(libtype=sol.libtype, solidx=sol.solidx, splitK=sol.splitK, kernelName=sol.kernelName,
                   us=self.row.us if self.row is not None else None, matched=self.matched, source=self.source,
                   line=self.row.line if self.row is not None else None, gfx=self.device.gfx,
                   cu_num=self.device.cu_num, **self.problem.config_fields(),
                   eager_libtype=eager.libtype, eager_kernelName=eager.kernelName)
        return cfg


@dataclass(frozen=True)
class EagerPlan:
    """What calls of a decision run (:meth:`Decision.eager_plan`): ``eager`` outside CUDA-graph capture; ``graph``
    while ``probe()`` says this thread is capturing (both None-free only where they differ: ``probe`` None means
    ``eager`` runs everywhere)."""

    eager: Any
    graph: Any = None
    probe: Callable[[], bool] | None = None


class DecisionCache:
    """One op's decision cache, owned by its dispatcher: ``decisions`` (problem, on_gpu) -> :class:`Decision`, and
    ``calls``, what the op's entry function keeps per call key (the op module's one key definition: everything its
    checks read off the tensors) so a call after the first costs one lookup. :meth:`clear` empties them in place and
    bumps ``generation``; the C++ eager entry accelerates ``calls`` (it stores and looks up the same keys in its own
    map) and drops its map when ``generation`` changes: the one piece of this object it reads. :meth:`derived`: further
    per-shape caches of the op's (the block-scale op's x_scale layouts), cleared with the others."""

    __slots__ = ("_derived", "calls", "decisions", "generation")

    def __init__(self) -> None:
        self.calls: dict[tuple, Any] = {}
        self.decisions: dict[tuple[Problem, bool], Decision] = {}
        self.generation = 0
        self._derived: dict[str, dict] = {}

    def derived(self, name: str) -> dict:
        """The op's cache ``name`` of values derived from its decisions (one dict per name, for the process's life),
        cleared in place with the decisions."""
        return self._derived.setdefault(name, {})

    def clear(self) -> None:
        self.calls.clear()
        self.decisions.clear()
        for cache in self._derived.values():
            cache.clear()
        self.generation += 1


class Dispatcher:
    """One op's decisions: owns the settings, the op's tables, the :class:`DecisionCache` and the shape recorder;
    :meth:`reload` rebuilds them all and clears the cache (the same object for the process's life)."""

    def __init__(self, op: OpSpec, settings: Settings | None = None) -> None:
        self.op = op
        self.cache = DecisionCache()
        self._lock = threading.RLock()
        self._recorder: ShapeRecorder | None = None
        self.warn_once = WarnOnce(log)
        self.reload(settings)

    # ---- state -------------------------------------------------------------------------------------------
    def reload(self, settings: Settings | None = None) -> None:
        """Re-read the environment (unless ``settings`` is given) and every config file; drop cached decisions."""
        with self._lock:
            self.settings = settings if settings is not None else load_settings()
            self._tables: dict[str, ConfigTable] = {}
            self.cache.clear()
            self._devices: dict[bool, DeviceIdentity] = {}
            self._defaults: list[Backend] | None = None
            self._configured: set[int] = set()
            for backend in registry.loaded_backends(self.op.backends):  # the rest are configured on first use
                backend.configure(self.settings)
                self._configured.add(id(backend))
            # The JSON level: each file family's folders, in the level's lookup order (JsonLevel.families).
            self._json_folders = self.op.json.folders(self.settings) if self.op.json is not None else ()
            self.warn_once.clear()
            jsonconfigs.clear_cache()
            if self._recorder is not None:
                self._recorder.close()
                self._recorder = None
            path = self.op.capture_path(self.settings) if self.settings.tune_gemm and self.op.capture_path else None
            if path:  # a capture target inside the package or holding a tuned table raises here
                spec = self.op.table_spec
                self._recorder = ShapeRecorder(path, self.op.untuned_columns, self.op.untuned_row,
                                               row_key_of(spec, self.op.untuned_columns),
                                               self.settings.capture_flush_s, tuned_columns_of(spec),
                                               read_key=row_reader_of(spec))
            # The op's table loads now, not at the first GEMM, so a first GEMM inside CUDA graph capture does no
            # file I/O. A config file that cannot be used is skipped with a warning naming file, line and column
            # (load_table strict=False): `import aiter_gemm`, and so gemm-tuner, must survive a broken one.
            self.table()
            if self.settings.log_tuned_config:
                ensure_info_handler()

    def table(self, kind: str | None = None) -> ConfigTable:
        """The merged table of a config kind (default: the op's), loaded on first use."""
        kind = kind or self.op.kind
        table = self._tables.get(kind)
        if table is None:
            with self._lock:
                table = self._tables.get(kind)
                if table is None:
                    table = self._tables[kind] = load_table(kind, self.settings.config_paths[kind], strict=False)
        return table

    def device(self, on_gpu: bool) -> DeviceIdentity:
        """This process's identity for GPU or CPU tensors, with AITER_GEMM_ARCH / _CU_NUM / _DEVICE_NAME applied."""
        ident = self._devices.get(on_gpu)
        if ident is None:
            probed = probe_gpu() if on_gpu else probe_cpu()
            if probed is None:
                raise RuntimeError("aiter_gemm: a GPU tensor was given but torch sees no GPU")
            ident = self._devices[on_gpu] = apply_overrides(probed, self.settings.arch, self.settings.cu_num,
                                                            self.settings.device_name)
        return ident

    def backend(self, libtype: str) -> Backend:
        """The op's backend ``libtype``, configured with this dispatcher's settings."""
        backend = registry.get_backend(libtype, self.op.backends)
        if id(backend) not in self._configured:
            with self._lock:
                if id(backend) not in self._configured:
                    backend.configure(self.settings)
                    self._configured.add(id(backend))
        return backend

    def warm_up(self, on_gpu: bool = True, problems: Iterable[Problem] = ()) -> dict[str, Any]:
        """Build and load, ahead of the first GEMM, what this device's rows need: every backend's
        :meth:`~aiter_gemm.backends.base.Backend.precompile` over the op's tuned rows and JSON buckets for this
        device (TileLang: kernels compiled in parallel into its disk cache, loaded from it after a restart), plus
        the decisions of ``problems`` (a model's shapes: their rows or defaults), then each of those shapes decided.
        A server calls it once at start-up so its first requests do not wait on a compiler. Returns counts, the
        failures (kernelName -> why) and the seconds taken."""
        t0 = time.monotonic()
        device = self.device(on_gpu)
        jobs: dict[str, list[tuple[Problem, Solution]]] = {}
        exact: list[Problem] = list(problems)
        for problem in exact:  # what no row serves runs its default: build that ahead too
            for _backend, sol in self._default_solutions(problem, device):
                jobs.setdefault(sol.libtype, []).append((problem, sol))
                break
        if self.op.key_problem is not None:
            for row in self.table():
                if not row.serves(device.gfx, device.cu_num, device.device_name):
                    continue
                try:
                    sol = self.op.row_solution(row)
                except ConfigError:
                    continue  # the decision warns about it, naming file and line
                problem = self.op.key_problem(row.key)
                exact.append(problem)
                jobs.setdefault(sol.libtype, []).append((problem, sol))
        level = self.op.json
        if level is not None and level.fills is None and self.op.key_problem is not None:  # (M, N, K) rows
            for problem, sol in level.entries(self._json_folders, device, self.backend, self.op.key_problem):
                jobs.setdefault(sol.libtype, []).append((problem, sol))
        failed: dict[str, str] = {}
        for libtype, todo in jobs.items():
            backend = self.backend(libtype)
            if backend.is_available():
                failed.update(backend.precompile(todo))
        for problem in exact:
            self.decide(problem, on_gpu)
        return {"op": self.op.name, "shapes": len(exact), "jobs": sum(map(len, jobs.values())), "failed": failed,
                "seconds": round(time.monotonic() - t0, 3)}

    def flush_capture(self) -> None:
        if self._recorder is not None:
            self._recorder.flush()

    # ---- deciding ----------------------------------------------------------------------------------------
    def decide(self, problem: Problem, on_gpu: bool) -> Decision:
        """The (cached) decision for ``problem`` on this process's GPU (``on_gpu``) or CPU."""
        key = (problem, on_gpu)
        decisions = self.cache.decisions
        dec = decisions.get(key)
        if dec is None:
            with self._lock:
                dec = decisions.get(key)
                if dec is None:
                    dec = decisions[key] = self._decide(problem, self.device(on_gpu))
        return dec

    def _decide(self, problem: Problem, device: DeviceIdentity) -> Decision:
        dec = None
        if not problem.empty:
            table = self.table()
            for level, padded in (("exact", problem), *problem.padded()):
                if level != "exact" and padded.M == problem.M:
                    continue  # same key as the exact lookup: already a miss
                # The best row of this level that runs here: a device-exact row whose backend is missing (TileLang
                # not installed) gives way to the class row of its key, not to the next level.
                for row in table.rows_for(device.gfx, device.cu_num, self.op.row_key(padded), device.device_name):
                    pad_min = row.values.get("pad_m_min")
                    if level != "exact" and pad_min is not None and problem.M < pad_min:
                        # The tuner checked this row for padded use only from pad_m_min up (docs/configs.md).
                        log.debug("%s:%d serves M >= %d through padding, not M=%d", row.source, row.line, pad_min,
                                  problem.M)
                        continue
                    dec = self._from_row(problem, device, row, level)
                    if dec is not None:
                        break
                if dec is not None:
                    break
            if dec is None and self.op.json is not None and self.op.json.fills is None:
                dec = self._from_json(problem, device)
        if dec is None:
            dec = self.default_decision(problem, device)
            self._log_miss(problem, dec)
        if self._recorder is not None and dec.matched != "exact":
            self._recorder.record(problem)  # padded and JSON hits too: the tuner can then tune the exact M
        if self.settings.log_tuned_config:
            log.info("%s: %s -> matched=%s libtype=%s solidx=%d kernelName=%s source=%s", self.op.name,
                     problem.describe(), dec.matched, dec.solution.libtype, dec.solution.solidx,
                     dec.solution.kernelName or "-",
                     dec.source + (f":{dec.row.line}" if dec.row is not None and not self.op.source_with_line
                                   else ""))
        return dec

    def _log_miss(self, problem: Problem, dec: Decision) -> None:
        """AITER's INFO line for a shape no tuned row serves (once per shape: decisions are cached), visible even
        when the application set no logging up, so that logs can be scraped for untuned shapes as with AITER."""
        ensure_info_handler()
        log.info(problem.MISS_SHAPE + MISS_TAIL, *problem.miss_args(),
                 ":".join(self.settings.config_paths[self.op.kind]), dec.solution.libtype, dec.solution.solidx)

    def runner_for(self, problem: Problem, solution: Solution, device: DeviceIdentity) -> tuple[Any, str | None]:
        """Public: ``(runner, None)`` if ``solution`` runs ``problem`` on ``device``, else ``(None, why not)``: the
        backend's availability, ``why_not`` and ``prepare``, the one rule the runtime's levels and the tuner share."""
        why = self.why_not(problem, solution, device)
        runner = self.backend(solution.libtype).prepare(problem, solution, device) if why is None else None
        return runner, (why or "prepare() returned None") if runner is None else None

    def why_not(self, problem: Problem, solution: Solution, device: DeviceIdentity | None) -> str | None:
        """Public: why ``solution`` cannot run ``problem`` on ``device`` (the backend's availability, then its
        ``why_not``: :meth:`runner_for` without preparing anything), None if it can. ``device`` None leaves this
        machine out: the backend's ``shape_why_not`` on the reference arch (the tuner's check of a shape)."""
        backend = self.backend(solution.libtype)
        if device is None:
            return backend.shape_why_not(problem, solution, REFERENCE_ARCH)
        unavailable = backend.unavailable_reason()
        if unavailable is not None:
            return f"backend {solution.libtype!r} unavailable: {unavailable}"
        return backend.why_not(problem, solution, device)

    def _runner(self, problem: Problem, device: DeviceIdentity, sol: Solution,
                warn_unavailable: bool = True) -> tuple[Any, str | None]:
        """:meth:`runner_for` for a decision level: a libtype that cannot run here at all is warned once per libtype
        and returns (None, None), so callers need not say more (with ``warn_unavailable`` False: (None, why) and no
        warning, the caller says it)."""
        unavailable = self.backend(sol.libtype).unavailable_reason()
        if unavailable is not None and not warn_unavailable:
            return None, unavailable
        if unavailable is not None:
            self.warn_once(("libtype", sol.libtype), "aiter_gemm: %s rows with libtype %r cannot run here (%s); "
                           "treating them as misses", self.op.name, sol.libtype, unavailable)
            return None, None
        return self.runner_for(problem, sol, device)

    def _decision(self, problem: Problem, device: DeviceIdentity, sol: Solution, matched: str,
                  row: TunedRow | None, runner: Any, source: str) -> Decision:
        extra = tuple(self.backend(sol.libtype).describe(sol).items())
        eager = self._eager_choice(problem, device, sol, row)
        eager_sol, eager_runner = eager if eager is not None else (None, None)
        return Decision(problem, device, sol, matched, row, runner, source, extra, eager_sol, eager_runner)

    def _eager_choice(self, problem: Problem, device: DeviceIdentity, sol: Solution,
                      row: TunedRow | None) -> tuple[Solution, Any] | None:
        """What eager (non-capturing) calls run instead of ``sol``, or None for ``sol`` itself: on a GPU, a backend
        whose launches cost more host time than the library call's (``launch_is_cheap`` False, a row faster than the
        backend's ``eager_min_us``, or M above its ``eager_max_m``) keeps only rows timed eagerly; otherwise the
        default among cheap-launch backends runs (docs/eager_path.md)."""
        if not device.is_gpu:
            return None
        backend = self.backend(sol.libtype)
        if (backend.launch_is_cheap(problem, sol, device) and (row is None or row.us >= backend.eager_min_us)
                and not (backend.eager_max_m and problem.M > backend.eager_max_m)):
            return None
        if row is not None and row.values.get("timing") == "eager":
            return None
        choice = self._default_choice(problem, device, cheap_only=True)
        if choice is None or choice[0] == sol:
            return None
        return choice

    def _from_row(self, problem: Problem, device: DeviceIdentity, row: TunedRow, level: str) -> Decision | None:
        try:
            sol = self.op.row_solution(row)
        except ConfigError as exc:  # a malformed row (a kernelName that does not parse): a miss, said once
            self.warn_once(("row", row.source, row.line), "aiter_gemm: %s; row ignored: a miss at this level", exc)
            return None
        sol = self._filled(problem, device, sol)
        runner, why = self._runner(problem, device, sol)
        if runner is None:
            if why is not None:
                self.warn_once(("row", row.source, row.line), "aiter_gemm: %s:%d: %s %s cannot run %s here (%s); "
                               "row ignored: a miss at this level", row.source, row.line, sol.libtype, _label(sol),
                               problem.label(), why)
            return None
        source = f"{row.source}:{row.line}" if self.op.source_with_line else row.source
        return self._decision(problem, device, sol, level, row, runner, source)

    def _from_json(self, problem: Problem, device: DeviceIdentity) -> Decision | None:
        """The JSON level's first bucket covering M that runs here (:meth:`~aiter_gemm.jsonconfigs.JsonLevel.hits`:
        the op's own files, then e.g. SGLang's), else None (the default)."""
        for files, source, sol in self.op.json.hits(self._json_folders, device, problem, self.backend):
            runner, why = self._runner(problem, device, sol, warn_unavailable=not files.warn_per_file)
            if runner is not None:
                return self._decision(problem, device, sol, "json", None, runner, source)
            path, key = source.rsplit("#", 1)
            if files.warn_per_file:
                self.warn_once(("json", path), "aiter_gemm: %s %s: %s (M=%d, bucket %s) cannot run here (%s); "
                               "its entries that cannot run are misses, said once per file", files.label, path,
                               _label(sol), problem.M, key, why)
            elif why is not None:
                self.warn_once(("json", source, why), "aiter_gemm: %s bucket %s: %s cannot run M=%d (%s); "
                               "using the next level", path, key, _label(sol), problem.M, why)
        return None

    def _filled(self, problem: Problem, device: DeviceIdentity, sol: Solution) -> Solution:
        """A row naming no kernel (kernelName empty or ``auto``) of the libtype the op's JSON files fill in, with the
        JSON bucket's kernel where one answers (:attr:`~aiter_gemm.jsonconfigs.JsonLevel.fills`)."""
        level = self.op.json
        if level is None or level.fills != sol.libtype or sol.kernelName.strip() not in ("", "auto"):
            return sol
        return next((hit for _files, _source, hit in level.hits(self._json_folders, device, problem, self.backend)),
                    sol)

    def default_decision(self, problem: Problem, device: DeviceIdentity, eager: bool = False) -> Decision:
        """Public (the tuner's baseline, benchmarks): the default decision, uncached. AITER's order: pre-shuffled
        weights -> a BLASLt heuristic solution; else the highest-priority available backend whose ``default_for``
        accepts the shape (skinny for small M on a GPU); torch last. ``eager``: the decision as eager calls see it
        (what the tuner confirms ``--timing eager`` winners against)."""
        choice = self._default_choice(problem, device)
        if choice is not None:
            dec = self._decision(problem, device, choice[0], "default", None, choice[1], DEFAULT_SOURCE)
            if eager and dec.eager_solution is not None:
                return replace(dec, solution=dec.eager_solution, runner=dec.eager_runner, eager_solution=None,
                               eager_runner=None)
            return dec
        raise RuntimeError(
            f"aiter_gemm: no available {self.op.name} backend can run {problem.describe()} on {device.gfx}"
            + (" (a pre-shuffled weight needs a BLASLt backend: cublaslt or hipblaslt)" if problem.bpreshuffle else "")
        )


    def _default_solutions(self, problem: Problem, device: DeviceIdentity, cheap_only: bool = False
                           ) -> Iterator[tuple[Backend, Solution]]:
        """The backends that claim the shape as its default and can run it, highest priority first, with their
        solutions (nothing prepared)."""
        if self._defaults is None:
            found = [self.backend(b.name) for b in registry.available_backends(self.op.backends)]
            self._defaults = sorted(found, key=lambda b: -b.default_priority)
        for backend in self._defaults:
            if problem.bpreshuffle and not backend.is_blaslt:
                continue
            sol = backend.eager_default_for(problem, device) if cheap_only else backend.default_for(problem, device)
            if sol is None or (cheap_only and not backend.launch_is_cheap(problem, sol, device)):
                continue
            if backend.why_not(problem, sol, device) is None:
                yield backend, sol

    def _default_choice(self, problem: Problem, device: DeviceIdentity, cheap_only: bool = False
                        ) -> tuple[Solution, Any] | None:
        """(solution, runner) of the default: the highest-priority backend that claims the shape and can run it."""
        for backend, sol in self._default_solutions(problem, device, cheap_only):
            runner = backend.prepare(problem, sol, device)
            if runner is not None:
                return sol, runner
        return None


def _label(sol: Solution) -> str:
    name = sol.kernelName if len(sol.kernelName) <= 48 else sol.kernelName[:45] + "..."
    return name or f"solidx={sol.solidx}"


# ---- one dispatcher per op, reloaded together ----------------------------------------------------------------
_DISPATCHERS: dict[str, Dispatcher] = {}
_registry_lock = threading.Lock()


def dispatcher_for(op: OpSpec) -> Dispatcher:
    """The process's dispatcher of ``op`` (created on first use, with the settings the others hold)."""
    disp = _DISPATCHERS.get(op.name)
    if disp is None:
        with _registry_lock:
            disp = _DISPATCHERS.get(op.name)
            if disp is None:
                first = next(iter(_DISPATCHERS.values()), None)
                disp = _DISPATCHERS[op.name] = Dispatcher(op, first.settings if first is not None else None)
    return disp


def reload_all(settings: Settings | None = None) -> None:
    """Re-read the environment once and reload every op's dispatcher with it."""
    settings = settings if settings is not None else load_settings()
    with _registry_lock:
        for disp in _DISPATCHERS.values():
            disp.reload(settings)
