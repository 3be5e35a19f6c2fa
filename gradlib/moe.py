"""The tuner's side of ``fused_moe`` (:mod:`aiter_gemm.ops.fused_moe`): AITER's tuned fmoe row, the per-stage search
of the Triton kernels' config pairs, and vLLM's / SGLang's fused-MoE JSON files written beside the tuned CSV. Its
inputs (rotating copies of the experts spanning twice the L2, uniform or skewed routing) and float32 reference are the
op's own (:func:`aiter_gemm.ops.fused_moe.make_inputs`).

Stages: a solution names GEMM1's and GEMM2's configs (``kernelName1;kernelName2``). The op runs both stages in one
call, so a stage is never timed alone; the search times whole calls, stage by stage (:func:`stage_refine`): first
every config for both GEMMs (the backends' own candidates), then GEMM2's configs beside the winner's GEMM1 config,
then GEMM1's beside the new GEMM2 winner: about three times the configs instead of their square, as AITER's 2-stage
tuner searches each stage on its own. A tuned row's ``us`` is the whole call's; ``us1`` and ``us2`` stay empty
(the stages are not timed apart) and ``err1`` = ``err2`` = the call's ``err_ratio`` (only the output is checked).

vLLM files (``--vllm_dir``): per tuned token count, the fastest config vLLM's kernel runs (one config for both
GEMMs, no split-K: :func:`vllm_runs`), the winner when it is one, else the fastest such candidate the search timed;
merged into ``E=..,N=..,device_name=..[,dtype=fp8_w8a8][,block_shape=[128,128]].json`` (other M keys kept; its
``triton_version`` this run's Triton where every M key is this run's, else the file's: :func:`aiter_gemm.moe_json.
version_header`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from aiter_gemm.backends.base import MoeProblem, Problem, Solution
from aiter_gemm.backends.fused_moe import stage_names
from aiter_gemm.backends.fused_moe import triton as triton_backend
from aiter_gemm.configs import EXTRA_TUNED_COLUMNS, ConfigError
from aiter_gemm.device import REFERENCE_ARCH, DeviceIdentity
from aiter_gemm.jsonconfigs import JSONConfigError
from aiter_gemm.kernels.fused_moe import MoeConfig
from aiter_gemm.moe_json import merge_file
from aiter_gemm.ops.fused_moe import FMOE_UNTUNED_COLUMNS, FUSED_MOE
from gradlib.records import Candidate, ShapeOutcome
from gradlib.results import device_rows, fmt, metrics
from gradlib.tune_ops import Sidecar, TuneOp, register_tune_op

log = logging.getLogger("gradlib")

OP = FUSED_MOE.name
#: AITER's tuned fmoe columns, then ours (``libtype``; ``pad_m_min``, ``timing``, ``device_name`` as every op's).
FMOE_TUNED_COLUMNS = ("gfx", "cu_num", *FMOE_UNTUNED_COLUMNS, "block_m", "ksplit", "us1", "kernelName1", "err1",
                      "us2", "kernelName2", "err2", "us", "run_1stage", "tflops", "bw", "libtype",
                      *EXTRA_TUNED_COLUMNS)
#: ``(problem, kernelName1, kernelName2)`` -> the solution of a libtype running that stage pair on the problem, or
#: None where one of the names cannot run as its stage (a GEMM2-only config as GEMM1, ...).
PairMaker = Callable[[Problem, str, str], "Solution | None"]


def _triton_pair(problem: Problem, first: str, second: str) -> Solution | None:
    sol = triton_backend.solution_of(MoeConfig.parse(first), MoeConfig.parse(second))
    return sol if triton_backend.BACKEND.shape_why_not(problem, sol, REFERENCE_ARCH) is None else None


#: The libtypes whose solutions are searched stage by stage, and how each makes a pair.
STAGED: dict[str, PairMaker] = {triton_backend.NAME: _triton_pair}


# ---- rows ---------------------------------------------------------------------------------------------------------
def tuned_row(identity: DeviceIdentity, outcome: ShapeOutcome, winner: Candidate) -> dict[str, str]:
    """The winner as a row of :data:`FMOE_TUNED_COLUMNS`: ``block_m`` and ``ksplit`` are GEMM1's (0 for torch's
    experts), the kernel names each stage's."""
    p, sol, res = outcome.problem, winner.solution, winner.result
    name1, name2 = stage_names(sol.kernelName)
    block_m = triton_backend.configs_of(sol)[0].block_m if sol.libtype == triton_backend.NAME else 0
    tflops, bw = metrics(p, res.us)
    err = fmt(res.err_ratio, 6)
    return {**FUSED_MOE.key_row(identity, p), "block_m": str(block_m), "ksplit": str(sol.splitK), "us1": "",
            "kernelName1": name1, "err1": err, "us2": "", "kernelName2": name2, "err2": err, "us": f"{res.us:.4f}",
            "run_1stage": "0", "tflops": tflops, "bw": bw, "libtype": sol.libtype,
            "pad_m_min": "" if outcome.pad_m_min is None else str(outcome.pad_m_min), "timing": outcome.timing,
            "device_name": identity.device_name}


_SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def table_cells(p: Problem) -> dict[str, str]:
    """A MoE problem in the printed tables: tokens, H, I, E, k and the experts' type."""
    assert isinstance(p, MoeProblem)
    return {"token": str(p.token), "H": str(p.model_dim), "I": str(p.inter_dim), "E": str(p.expert),
            "k": str(p.topk), "w": "fp8" if p.fp8 else _SHORT.get(p.q_dtype_w, str(p.q_dtype_w))}


# ---- the per-stage search -----------------------------------------------------------------------------------------
def stage_refine(makers: Mapping[str, PairMaker] = STAGED) -> Callable[[Problem, list[Solution], int], list[Solution]]:
    """:attr:`gradlib.search.SearchOptions.refine` for staged solutions (``makers``' libtypes): round 1 pairs the
    fastest such solution's GEMM1 config with every config that ran correctly so far (GEMM2 varies), round 2 pairs
    every such config with round 1's GEMM2 winner (GEMM1 varies); then nothing. Configs come from the fastest
    solution's libtype only; pairs its maker refuses (a config that runs only as the other stage) are left out."""

    def refine(problem: Problem, ranked: list[Solution], round_: int) -> list[Solution]:
        best = next((s for s in ranked if s.libtype in makers), None)
        if best is None or round_ > 2:
            return []
        make = makers[best.libtype]
        names = list(dict.fromkeys(n for s in ranked if s.libtype == best.libtype for n in stage_names(s.kernelName)))
        first, second = stage_names(best.kernelName)
        made = [make(problem, first, n) if round_ == 1 else make(problem, n, second) for n in names]
        return [sol for sol in made if sol is not None]

    return refine


# ---- vLLM / SGLang files --------------------------------------------------------------------------------------------
def vllm_runs(sol: Solution) -> bool:
    """Whether vLLM's and SGLang's fused-MoE kernel runs ``sol``: a Triton config, the same for both GEMMs, without
    split-K or variant flags (their kernel has neither)."""
    if sol.libtype != triton_backend.NAME:
        return False
    first, second = stage_names(sol.kernelName)
    try:
        cfg = MoeConfig.parse(first)
    except ValueError:
        return False
    return first == second and cfg.split_k == 1 and cfg.plain


def best_vllm(outcome: ShapeOutcome) -> Solution | None:
    """The config for vLLM's file of the shape: the winner when vLLM runs it (as confirmed), else the fastest correct
    candidate of the search that vLLM runs (None: none ran)."""
    if outcome.winner is not None and vllm_runs(outcome.winner.solution):
        return outcome.winner.solution
    found = [c for c in outcome.candidates
             if c.phase == "full" and c.result.ok and c.eligible and vllm_runs(c.solution)]
    return min(found, key=lambda c: c.us).solution if found else None


class VllmSidecar(Sidecar):
    """Merges, at each checkpoint, this run's vLLM configs (:func:`best_vllm`) into vLLM's file of each problem in
    ``vllm_dir`` for this device's name (the tuned file's row for a shape it skips, when vLLM runs that row)."""

    def __init__(self, identity: DeviceIdentity, tuned_file: str | os.PathLike, problems: Sequence[Problem],
                 vllm_dir: str | os.PathLike) -> None:
        self.identity, self.tuned_file, self.dir = identity, str(tuned_file), Path(vllm_dir)
        self._pending: dict[MoeProblem, dict[int, dict[str, Any]]] = {}
        self._rows: dict[tuple, Solution] | None = None
        self.written: set[Path] = set()

    def _add(self, p: MoeProblem, sol: Solution) -> None:
        file_key = p.with_m(1)  # one file per (E, N, dtype): its problems' token counts are its keys
        self._pending.setdefault(file_key, {})[p.token] = MoeConfig.parse(stage_names(sol.kernelName)[0]).to_vllm()

    def skipped(self, problem: Problem) -> None:
        if self._rows is None:
            self._rows = {}
            try:
                for row in device_rows(self.tuned_file, self.identity, OP):
                    try:
                        self._rows[row.key] = FUSED_MOE.row_solution(row)
                    except ConfigError as exc:
                        log.warning("vLLM file: %s", exc)
            except ConfigError as exc:
                log.warning("vLLM file: the tuned file's rows are not used: %s", exc)
        sol = self._rows.get(FUSED_MOE.row_key(problem))
        if sol is not None and vllm_runs(sol):
            self._add(problem, sol)

    def add(self, outcome: ShapeOutcome) -> None:
        sol = best_vllm(outcome)
        if sol is not None:
            self._add(outcome.problem, sol)

    def flush(self) -> None:
        """Merge what is pending into its files; a file that cannot be written keeps its entries for the next flush
        (the error, naming it, is raised after the others were tried); one that does not read as vLLM's is left
        alone, with an error naming it (its entries from this run dropped)."""
        error = None
        for p in list(self._pending):
            try:
                self.written.add(merge_file(self.dir, self.identity.device_name, p, self._pending[p],
                                            MoeConfig.from_vllm))
                del self._pending[p]
            except JSONConfigError as exc:
                log.error("vLLM file not written, this run's configs for E=%d N=%d dropped: %s", p.expert,
                          p.inter_dim, exc)
                del self._pending[p]
            except OSError as exc:
                error = error or exc
        if error is not None:
            raise error

    def summary(self) -> str:
        return f"; {len(self.written)} vLLM fused-MoE file(s) in {self.dir}"


def vllm_sidecar(identity: DeviceIdentity, problems: list[Problem], tuned_file: str, vllm_dir: str) -> VllmSidecar:
    return VllmSidecar(identity, tuned_file, problems, vllm_dir)


TUNE_OP = register_tune_op(TuneOp(
    op=OP, tuned_columns=FMOE_TUNED_COLUMNS, tuned_row=tuned_row, err_column="err_ratio", baseline="torch",
    table_cells=table_cells,
))

__all__ = ["FMOE_TUNED_COLUMNS", "OP", "STAGED", "TUNE_OP", "VllmSidecar", "best_vllm", "stage_refine", "table_cells",
           "tuned_row", "vllm_runs", "vllm_sidecar"]
