"""The tuner's side of ``gemm_a8w8_blockscale``: the tuned-row format (AITER's a8w8-blockscale CSV plus ``gfx`` and
``libtype``), the per-(N, K) JSON files written beside the tuned CSV, and extra launchers tests register to time
beside the op's backends. Its inputs and float32 reference are the op's own
(:func:`aiter_gemm.ops.a8w8_blockscale.make_inputs`); the task option ``x_scale_layout``
(:data:`~aiter_gemm.ops.a8w8_blockscale.X_SCALE_LAYOUTS`) says how x_scale is laid out in memory, as the
model's quantizer writes it: ``row_major`` (the default; torch's candidate then pays a transposing copy per call,
timed) or ``m_major`` (strides (1, M), what vLLM's ``column_major_scales`` and DeepGEMM use, and what torch's
block-scaled matmul needs).

JSON buckets (``--buckets``): ``fine`` (default) writes ``M_LEQ_<m>`` for each tuned M, holding the winner at m, plus
``any`` (the largest M's winner): the best variant changes within the three named categories (on H100: swapAB /
split-K up to M = 16, base with 64-wide tiles up to 256, 128 x 128 tiles on 8 warps from 1024), so one config per
category loses. ``seed`` writes the named categories ``small_M`` (M <= 256), ``medium_M`` (256 < M <= 2048),
``large_M`` (M > 2048): per category, the config with the lowest geometric mean of time / best time over the
category's tuned M (among configs valid at all of them, timed in this run; the winner at the category's largest M
otherwise); ``large_M`` repeats the highest tuned category when no M above 2048 was tuned, so every M has an entry.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from aiter_gemm.backends.base import Backend, GemmProblem, Solution
from aiter_gemm.configs import parse_size
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.fileio import read_csv_rows
from aiter_gemm.jsonconfigs import JSONConfigError
from aiter_gemm.kernels.a8w8_blockscale_tilelang import TileLangConfig
from aiter_gemm.kernels.blockscale_format import FP8
from aiter_gemm.ops.a8w8_blockscale import (
    BLOCKSCALE_TUNED_COLUMNS,
    GEMM_A8W8_BLOCKSCALE,
    Choice,
    buckets_from_tuned,
    choice_error,
    choice_of,
    csv_row,
    json_config_path,
    parse_choice,
    solution_of,
    write_json_configs,
)
from aiter_gemm.registry import register_backend
from aiter_gemm.sglang_tilelang import merge_file, sglang_entry
from gradlib.records import Candidate, ShapeOutcome
from gradlib.results import known_libtypes, row_key, stale_reason
from gradlib.tune_ops import Sidecar, TuneOp, register_tune_op

log = logging.getLogger("gradlib")

BLOCKSCALE = GEMM_A8W8_BLOCKSCALE.name
#: The named categories as (JSON key, largest M); the last is unbounded.
SEED_BUCKETS = (("small_M", 256), ("medium_M", 2048), ("large_M", None))

#: ``launcher(XQ, WQ, x_scale, w_scale, out) -> out``: runs one candidate into the preallocated ``out``.
Launcher = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


# ---- extra launchers: a backend of the op that the tuner times but never writes ---------------------------------
class LauncherBackend(Backend):
    """Candidates that are neither Triton configs nor torch's, by name: timed when named (``--candidates``), never
    written as tuned rows (another implementation to compare with, or a faulty one in tests)."""

    name = "launcher"
    tunable = False

    def __init__(self) -> None:
        self.launchers: dict[str, Launcher] = {}

    def why_not(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> str | None:
        return None if solution.kernelName in self.launchers else f"no launcher named {solution.kernelName!r}"

    def prepare(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity):
        fn = self.launchers.get(solution.kernelName)
        if fn is None:
            return None

        def run(XQ, WQ, x_scale, w_scale, dtype):
            return fn(XQ, WQ, x_scale, w_scale, torch.empty((XQ.shape[0], WQ.shape[0]), dtype=dtype,
                                                            device=XQ.device))

        return run


LAUNCHERS = LauncherBackend()
EXTRA_LAUNCHERS = LAUNCHERS.launchers
register_backend(LAUNCHERS, GEMM_A8W8_BLOCKSCALE.backends)


def register_launcher(name: str, launcher: Launcher) -> None:
    """Register a non-config candidate under ``name`` (which must not parse as a kernelName)."""
    if is_config_name(name):
        raise ValueError(f"launcher name {name!r} would shadow a Triton config name")
    EXTRA_LAUNCHERS[name] = launcher


def is_config_name(name: str) -> bool:
    """Whether ``name`` is a kernelName a tuned row may hold (a Triton config's, or torch's)."""
    try:
        parse_choice(name)
    except ValueError:
        return False
    return True


def candidate_solution(name: str) -> Solution:
    """The solution a ``--candidates`` name stands for: a registered launcher, torch's matmul, or a Triton config
    (a name that does not parse stays a Triton solution: the worker reports why it cannot run)."""
    if name in EXTRA_LAUNCHERS:
        return Solution(LAUNCHERS.name, -1, 0, name)
    try:
        return solution_of(parse_choice(name))
    except ValueError:
        return Solution("triton", -1, 0, name)


def check_candidate(name: str, M: int, N: int, K: int, otype: torch.dtype = torch.bfloat16,
                    device: torch.device | None = None) -> str | None:
    """Why candidate ``name`` cannot be timed on (M, N, K) -> ``otype`` (unknown name, or its backend's why-not:
    :func:`~aiter_gemm.ops.a8w8_blockscale.choice_error`, the shape on the reference arch, or ``device``'s checks
    too when given); None if it can."""
    if name in EXTRA_LAUNCHERS:
        return None
    try:
        choice = parse_choice(name)
    except ValueError as exc:
        return f"not a registered launcher nor a kernelName: {exc}"
    return choice_error(choice, M, N, K, otype, device)


# ---- rows ---------------------------------------------------------------------------------------------------------


def tuned_row(identity: DeviceIdentity, outcome: ShapeOutcome, winner: Candidate) -> dict[str, object]:
    """The winner as a tuned row; ``kernelId`` is its index in the shape's candidate list."""
    p, res = outcome.problem, winner.result
    return csv_row(identity, p.M, p.N, p.K, choice_of(winner.solution), res.us, res.err_ratio, winner.index,
                   outcome.pad_m_min, outcome.timing)


# ---- JSON files beside the tuned CSV --------------------------------------------------------------------------------
def _geomean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return math.exp(sum(map(math.log, xs)) / len(xs))


def seed_buckets(best: Mapping[int, Choice], times: Mapping[int, Mapping[str, float]]) -> dict[str, Choice]:
    """The three named categories from the winners per M (``best``) and this run's valid timings per M
    (``times[M][kernelName]``); see the module docstring for the rule."""
    out: dict[str, Choice] = {}
    lower = 0
    for key, upper in SEED_BUCKETS:
        ms = sorted(m for m in best if m > lower and (upper is None or m <= upper))
        lower = upper or lower
        if not ms:
            continue
        pick = best[ms[-1]]
        if all(m in times for m in ms):
            common = set.intersection(*(set(times[m]) for m in ms))
            if common:
                name = min(sorted(common), key=lambda n: _geomean(times[m][n] / min(times[m].values()) for m in ms))
                pick = parse_choice(name)
        out[key] = pick
    if "large_M" not in out:
        out["large_M"] = out[next(k for k, _ in reversed(SEED_BUCKETS) if k in out)]
    return out


def best_tilelang(outcome: ShapeOutcome) -> Candidate | None:
    """The config for SGLang's file of the shape: the winner when SGLang's kernels run it (as confirmed), else the
    fastest correct candidate of the full search they run (SGLang runs only TileLang, and of it only its four types
    with one scale group a stage: :attr:`TileLangConfig.runs_in_sglang`), also where torch's, Triton or this
    project's own TileLang kernels won here."""
    def sglang_runs(c: Candidate) -> bool:
        if c.solution.libtype != TileLangConfig.libtype:
            return False
        try:
            return TileLangConfig.from_name(c.solution.kernelName).runs_in_sglang
        except ValueError:
            return False

    if outcome.winner is not None and sglang_runs(outcome.winner):
        return outcome.winner
    found = [c for c in outcome.candidates if c.phase == "full" and c.result.ok and c.eligible and sglang_runs(c)]
    return min(found, key=lambda c: c.us, default=None)


class JsonSidecar(Sidecar):
    """Rewrites the JSON file of each (N, K) once every shape of that (N, K) in this run is finished (or skipped), or
    at the end of an interrupted run (:meth:`finish`), from every row of the tuned file for that (N, K) on this
    device (``class_only``: from the rows naming no device alone, since the JSON file is read by every device of the
    arch); with ``sglang_dir``, also merges this run's TileLang configs (:func:`best_tilelang`) into SGLang's file of
    that (N, K) for this device's name."""

    def __init__(self, identity: DeviceIdentity, tuned_file: str | os.PathLike, problems: Sequence[GemmProblem],
                 json_dir: str | os.PathLike | None = None, bucket_mode: str = "fine",
                 sglang_dir: str | os.PathLike | None = None, class_only: bool = False) -> None:
        self.identity, self.tuned_file, self.bucket_mode = identity, str(tuned_file), bucket_mode
        self.class_only = class_only
        self.json_dir = Path(json_dir or Path(tuned_file).resolve().parent)
        self.sglang_dir = Path(sglang_dir) if sglang_dir else None
        self._sglang: dict[tuple[int, int], dict[int, dict[str, Any]]] = {}
        self.sglang_written: list[Path] = []
        self._left: dict[tuple[int, int], int] = {}
        self._started: set[tuple[int, int]] = set()  # (N, K) with a shape finished or skipped
        for p in problems:
            self._left[(p.N, p.K)] = self._left.get((p.N, p.K), 0) + 1
        self._times: dict[tuple[int, int], dict[int, dict[str, float]]] = {}
        self._ready: list[tuple[int, int]] = []
        self.written: list[Path] = []

    def _done_one(self, n: int, k: int) -> None:
        self._left[(n, k)] -= 1
        self._started.add((n, k))
        if self._left[(n, k)] == 0:
            self._ready.append((n, k))

    def finish(self) -> None:
        """An (N, K) whose shapes did not all finish (an interrupted run) is written too, from the tuned file's rows:
        the rerun, which skips the finished shapes, rewrites it once the rest are tuned."""
        self._ready += [nk for nk in sorted(self._started) if self._left[nk] > 0 and nk not in self._ready]

    def skipped(self, problem: GemmProblem) -> None:
        self._done_one(problem.N, problem.K)

    def add(self, outcome: ShapeOutcome) -> None:
        p = outcome.problem
        self._times.setdefault((p.N, p.K), {})[p.M] = {
            c.solution.kernelName: c.us for c in outcome.candidates
            if c.phase == "full" and c.result.ok and c.eligible}
        best = best_tilelang(outcome) if self.sglang_dir is not None else None
        if best is not None:
            us = best.result.us
            self._sglang.setdefault((p.N, p.K), {})[p.M] = sglang_entry(
                TileLangConfig.from_name(best.solution.kernelName), us / 1e3, p.flops / us / 1e6)
        self._done_one(p.N, p.K)

    def flush(self) -> None:
        """Write the JSON (and SGLang) file of every (N, K) that is ready; one that cannot be written stays ready for
        the next flush (the error, naming the file, is raised after the others were tried). An SGLang file that does
        not read as SGLang's is left alone, with an error naming it and the key."""
        ready, self._ready, error = self._ready, [], None
        for n, k in ready:
            try:
                self.write_json(n, k)
                if self._sglang.get((n, k)):
                    self.sglang_written.append(merge_file(self.sglang_dir, self.identity.device_name, n, k,
                                                          self._sglang[(n, k)]))
                    log.info("wrote %s (%d M from this run)", self.sglang_written[-1], len(self._sglang[(n, k)]))
                    del self._sglang[(n, k)]
            except JSONConfigError as exc:
                log.error("SGLang file not written, this run's TileLang configs for N=%d K=%d dropped: %s", n, k,
                          exc)
                del self._sglang[(n, k)]
            except OSError as exc:
                self._ready.append((n, k))
                error = error or exc
        if error is not None:
            raise error

    def summary(self) -> str:
        return f"; {len(self.written)} JSON file(s) in {self.json_dir}" + (
            f"; {len(self.sglang_written)} SGLang file(s) in {self.sglang_dir}" if self.sglang_dir else "")

    def tuned_configs(self, n: int, k: int) -> dict[int, Choice]:
        """Config per M of the tuned file's rows for (n, k) on this device (see :meth:`tuned_rows`)."""
        return {m: choice for m, (choice, _) in self.tuned_rows(n, k).items()}

    def tuned_rows(self, n: int, k: int) -> dict[int, tuple[Choice, int | None]]:
        """(config, pad_m_min) per M of the tuned file's rows for (n, k) on this device (rows naming no config, and
        rows the runtime would not use (:func:`gradlib.results.stale_reason`), are skipped)."""
        if not os.path.isfile(self.tuned_file):
            return {}
        out, exact = {}, set()
        known = known_libtypes(BLOCKSCALE)
        key_of = row_key(BLOCKSCALE)  # typed as the runtime reads the file: " 132" or "0128" match
        for r in read_csv_rows(self.tuned_file)[1]:
            key = key_of(r)
            if key[0] == "unparsed":
                log.warning("%s: row %s skipped for the JSON: its key does not parse", self.tuned_file, key[1])
                continue
            gfx, cu_num, name, (m, row_n, row_k) = key[0]
            if (gfx or self.identity.gfx) != self.identity.gfx or cu_num != self.identity.cu_num \
                    or name not in (None, self.identity.device_name) or (row_n, row_k) != (n, k):
                continue
            if name is not None and self.class_only:
                continue  # --keep_class_rows: this device's rows stay out of the arch's file
            if name is None and m in exact:
                continue  # this device's own row for M wins, as at run time
            stale = stale_reason(BLOCKSCALE, r, known)
            if stale is not None:
                log.warning("%s: row M=%s N=%d K=%d skipped for the JSON: %s", self.tuned_file, r["M"], n, k, stale)
                continue
            try:
                pad = str(r.get("pad_m_min", "") or "").strip()
                out[m] = (parse_choice(r["kernelName"]), parse_size(pad) if pad else None)
                if name is not None:
                    exact.add(m)
            except ValueError as exc:
                log.warning("%s: row M=%s N=%d K=%d skipped for the JSON: %s", self.tuned_file, r["M"], n, k, exc)
        return out

    def write_json(self, n: int, k: int) -> None:
        rows = self.tuned_rows(n, k)
        if not rows:
            return
        best = {m: choice for m, (choice, _) in rows.items()}
        if self.bucket_mode == "seed":
            buckets = seed_buckets(best, self._times.get((n, k), {}))
        else:
            buckets = buckets_from_tuned(best, {m: pad for m, (_, pad) in rows.items()})
        self.json_dir.mkdir(parents=True, exist_ok=True)
        path = json_config_path(self.json_dir, self.identity.gfx, n, k)
        write_json_configs(path, buckets)
        self.written.append(path)
        log.info("wrote %s (%d bucket(s) from %d tuned M)", path, len(buckets), len(best))


TUNE_OP = register_tune_op(TuneOp(
    op=BLOCKSCALE, tuned_columns=BLOCKSCALE_TUNED_COLUMNS,
    tuned_row=tuned_row, err_column="errRatio", baseline=None,
    show_bias=False, sidecar=JsonSidecar,
    row_candidate=lambda row: candidate_solution(row.values["kernelName"]),  # kernelId is only the listing index
))

__all__ = ["BLOCKSCALE", "EXTRA_LAUNCHERS", "FP8", "SEED_BUCKETS", "JsonSidecar", "Launcher",
           "LauncherBackend", "TUNE_OP", "best_tilelang", "candidate_solution", "check_candidate", "is_config_name",
           "register_launcher", "seed_buckets"]
