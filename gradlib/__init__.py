"""gradlib: the GEMM tuner. Times every candidate solution of every registered backend per shape and writes the
winner per shape to a tuned CSV that :mod:`aiter_gemm` replays (AITER's gradlib design; docs/design.md, "Tuner").

Modules: the CLIs :mod:`~gradlib.gemm_tuner` and :mod:`~gradlib.tune_a8w8_blockscale` (argument parsing only) and
their shared pieces :mod:`~gradlib.cli`; one :mod:`~gradlib.driver` (resume, checkpoints, table, summary) over
:mod:`~gradlib.search` (the search of one shape), :mod:`~gradlib.tasks` (picklable tasks and the worker that runs
them), :mod:`~gradlib.pool` / :mod:`~gradlib.ray_executor` (one worker per GPU), :mod:`~gradlib.results` (rows,
checkpoints, resume set); per op, a :class:`~gradlib.tune_ops.TuneOp`: :mod:`~gradlib.a16w16`,
:mod:`~gradlib.blockscale`; shapes from a model's ``config.json``: :mod:`~gradlib.models`,
:mod:`~gradlib.blockscale_shapes`. From the runtime: timing (:mod:`aiter_gemm.timing`), the accuracy check
(:mod:`aiter_gemm.accuracy`), an op's inputs and a candidate's runner (:mod:`aiter_gemm.testbed`).
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point (``gemm-tuner``); imported lazily so ``import gradlib`` stays cheap."""
    from gradlib.gemm_tuner import main as _main

    return _main(argv)
