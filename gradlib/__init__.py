"""gradlib: the GEMM tuner. Times every candidate solution of every registered backend per shape and writes the
winner per shape to a tuned CSV that :mod:`aiter_gemm` replays (AITER's gradlib design, seed 003 sections 3-4).

Modules: :mod:`~gradlib.gemm_tuner` (CLI), :mod:`~gradlib.search` (two-phase search per shape),
:mod:`~gradlib.tasks` (picklable task model and the code a worker runs), :mod:`~gradlib.pool` (one process per GPU),
:mod:`~gradlib.timing`, :mod:`~gradlib.accuracy`, :mod:`~gradlib.models` (shapes from a HF ``config.json``),
:mod:`~gradlib.results` (checkpointed tuned-CSV writing and resume).
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point (``gemm-tuner``); imported lazily so ``import gradlib`` stays cheap."""
    from gradlib.gemm_tuner import main as _main

    return _main(argv)
