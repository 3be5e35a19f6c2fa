"""The tuner's side of ``gemm_a16w16``: its tuned-row format (AITER's bf16 tuned CSV); its inputs and reference are
the op's own (:func:`aiter_gemm.ops.a16w16.make_inputs`)."""

from __future__ import annotations

import os

from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.configs import BF16_TUNED_COLUMNS
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.ops.a16w16 import GEMM_A16W16
from gradlib.records import Candidate, ShapeOutcome
from gradlib.results import fmt, metrics, tuned_keys
from gradlib.tune_ops import TuneOp, register_tune_op

OP = GEMM_A16W16.name


def tuned_row(identity: DeviceIdentity, outcome: ShapeOutcome, winner: Candidate | None = None) -> dict[str, str]:
    """The winner of ``outcome`` as a tuned-CSV row (BF16_TUNED_COLUMNS)."""
    w = winner if winner is not None else outcome.winner
    if w is None:
        raise ValueError(f"shape {outcome.problem} has no winner to write")
    p, sol, res = outcome.problem, w.solution, w.result
    tflops, bw = metrics(p, res.us)
    return {**GEMM_A16W16.key_row(identity, p), "libtype": sol.libtype, "solidx": str(sol.solidx),
            "splitK": str(sol.splitK), "us": f"{res.us:.4f}", "kernelName": sol.kernelName,
            "err_ratio": fmt(res.err_ratio, 4), "tflops": tflops, "bw": bw,
            "pad_m_min": "" if outcome.pad_m_min is None else str(outcome.pad_m_min), "timing": outcome.timing,
            "device_name": identity.device_name}


def tuned_problems(path: str | os.PathLike, identity: DeviceIdentity) -> set[GemmProblem]:
    """Shapes ``path`` already has a usable row for on ``identity`` (the resume set)."""
    return {GemmProblem(*key) for key in tuned_keys(path, identity, OP)}


TUNE_OP = register_tune_op(TuneOp(
    op=OP, tuned_columns=BF16_TUNED_COLUMNS, tuned_row=tuned_row,
    err_column="err_ratio", baseline="torch", show_bias=True,
))
