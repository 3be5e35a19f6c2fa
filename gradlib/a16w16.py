"""The tuner's side of ``gemm_a16w16``: its inputs, reference and tuned-row format (AITER's bf16 tuned CSV)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.configs import BF16_TUNED_COLUMNS
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.dtypes import FP8_DTYPES
from aiter_gemm.ops.a16w16 import GEMM_A16W16
from gradlib.records import Candidate, ShapeOutcome
from gradlib.results import fmt, metrics, tuned_keys
from gradlib.timing import rotating_sets
from gradlib.tune_ops import Inputs, TuneOp, cloned_sets, register_tune_op

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


def make_inputs(p: GemmProblem, seed: int, device: torch.device, cache: int, options: Mapping[str, Any]) -> Inputs:
    """A ~ N(0,1), B ~ N(0,1/K) so outputs are about unit scale (what the tolerance table assumes), bias ~ N(0,1),
    fp8 scales 0.5 and 2; as many copies as span twice the last-level cache."""
    gen = torch.Generator(device=device).manual_seed(seed)  # on the device: a 1 GB weight in milliseconds
    a32 = torch.randn(p.M, p.K, generator=gen, device=device)
    b32 = torch.randn(p.N, p.K, generator=gen, device=device).mul_(p.K ** -0.5)
    bias_dtype = p.otype if p.dtype in FP8_DTYPES else p.dtype
    bias = torch.randn(p.N, generator=gen, device=device).to(bias_dtype) if p.bias else None
    a, b = a32.to(p.dtype), b32.to(p.dtype)
    del a32, b32
    sa = sb = None
    if p.scaleAB:
        sa = torch.tensor(0.5, dtype=torch.float32, device=device)
        sb = torch.tensor(2.0, dtype=torch.float32, device=device)
    ref = a.float() @ b.float().t()
    if sa is not None:
        ref = ref * (sa * sb)
    if bias is not None:
        ref = ref + bias.float()
    per_set = (p.M * p.K + p.N * p.K) * a.element_size() + p.M * p.N * torch.empty((), dtype=p.otype).element_size()
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    return Inputs((), cloned_sets((a, b, bias, sa, sb), rotating_sets(per_set, cache, free)), ref)


def call(runner, inputs: tuple, p: GemmProblem) -> torch.Tensor:
    a, b, bias, sa, sb = inputs
    return runner(a, b, bias, p.otype, sa, sb, None)


def tuned_problems(path: str | os.PathLike, identity: DeviceIdentity) -> set[GemmProblem]:
    """Shapes ``path`` already has a usable row for on ``identity`` (the resume set)."""
    return {GemmProblem(*key) for key in tuned_keys(path, identity, OP)}


TUNE_OP = register_tune_op(TuneOp(
    op=OP, tuned_columns=BF16_TUNED_COLUMNS, tuned_row=tuned_row,
    make_inputs=make_inputs, call=call, err_column="err_ratio", baseline="torch", show_bias=True,
))
