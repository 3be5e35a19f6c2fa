"""The tuner's side of ``gemm_a16w16``: its tuned-row format (AITER's bf16 tuned CSV); its inputs and reference are
the op's own (:func:`aiter_gemm.ops.a16w16.make_inputs`)."""

from __future__ import annotations

import os

from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.configs import BF16_TUNED_COLUMNS, BF16_UNTUNED_COLUMNS
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.dtypes import dtype_name
from gradlib.results import fmt, metrics, tuned_keys
from gradlib.search import Candidate, ShapeOutcome
from gradlib.tune_ops import TuneOp, register_tune_op

KEY_COLUMNS = ("gfx", "cu_num", *BF16_UNTUNED_COLUMNS)
OP = "gemm_a16w16"


def problem_key(identity: DeviceIdentity, p: GemmProblem) -> dict[str, str]:
    """The key columns of ``p`` on ``identity`` as the tuned CSV spells them."""
    return {"gfx": identity.gfx, "cu_num": str(identity.cu_num), "M": str(p.M), "N": str(p.N), "K": str(p.K),
            "bias": str(p.bias), "dtype": dtype_name(p.dtype), "outdtype": dtype_name(p.otype),
            "scaleAB": str(p.scaleAB), "bpreshuffle": str(p.bpreshuffle)}


def tuned_row(identity: DeviceIdentity, outcome: ShapeOutcome, winner: Candidate | None = None) -> dict[str, str]:
    """The winner of ``outcome`` as a tuned-CSV row (BF16_TUNED_COLUMNS)."""
    w = winner if winner is not None else outcome.winner
    if w is None:
        raise ValueError(f"shape {outcome.problem} has no winner to write")
    p, sol, res = outcome.problem, w.solution, w.result
    tflops, bw = metrics(p, res.us)
    return {**problem_key(identity, p), "libtype": sol.libtype, "solidx": str(sol.solidx), "splitK": str(sol.splitK),
            "us": f"{res.us:.4f}", "kernelName": sol.kernelName, "err_ratio": fmt(res.err_ratio, 4),
            "tflops": tflops, "bw": bw, "pad_m_min": "" if outcome.pad_m_min is None else str(outcome.pad_m_min),
            "timing": outcome.timing, "device_name": identity.device_name}


def tuned_problems(path: str | os.PathLike, identity: DeviceIdentity) -> set[GemmProblem]:
    """Shapes ``path`` already has a usable row for on ``identity`` (the resume set)."""
    return {GemmProblem(*key) for key in tuned_keys(path, identity, OP)}


TUNE_OP = register_tune_op(TuneOp(
    op=OP, tuned_columns=BF16_TUNED_COLUMNS, key_columns=KEY_COLUMNS, key_of=problem_key, tuned_row=tuned_row,
    err_column="err_ratio", baseline="torch", show_bias=True,
    key_problem=lambda key: GemmProblem(*key),
))
