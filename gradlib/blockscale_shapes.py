"""Shapes for the A8W8 block-scale tuner (:mod:`gradlib.tune_a8w8_blockscale`): ``--nk`` pairs, a model's fp8
linears from its ``config.json`` (:func:`gradlib.models.fp8_model_shapes`: Llama-style and DeepSeek MLA), and untuned
CSVs with M, N, K columns, crossed with the batch sizes ``--m``."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from aiter_gemm.configs import parse_int
from aiter_gemm.fileio import read_csv_rows
from gradlib.cli import UsageError, int_list
from gradlib.models import Projection, deepseek_projections, fp8_model_shapes

__all__ = ["Projection", "UsageError", "deepseek_projections", "load_shapes", "model_projections", "nk_pair",
           "int_list", "read_shapes_csv"]


def model_projections(model_dir: str, tp: int) -> list[Projection]:
    """The fp8 linears of the model in ``model_dir/config.json`` (or a shipped model config's name):
    :func:`gradlib.models.fp8_model_shapes`."""
    return list(fp8_model_shapes(model_dir, tp).projections)


def nk_pair(text: str) -> tuple[int, int]:
    parts = int_list(text)
    if len(parts) != 2 or min(parts) < 1:
        raise argparse.ArgumentTypeError(f"--nk takes N,K pairs of positive integers, got {text!r}")
    return parts[0], parts[1]


def read_shapes_csv(path: str) -> list[tuple[int, int, int]]:
    """(M, N, K) of an untuned CSV (columns M, N, K; others ignored; cells may have spaces, as AITER's do)."""
    if not os.path.isfile(path):
        raise UsageError(f"--shapes file {path} not found")
    header, rows = read_csv_rows(path)
    cols = {h.strip(): h for h in header}
    missing = [c for c in ("M", "N", "K") if c not in cols]
    if missing:
        raise UsageError(f"{path}: missing column(s) {missing} (header {header})")
    out = []
    for line, row in enumerate(rows, start=2):
        try:
            m, n, k = (parse_int(str(row[cols[c]]).strip()) for c in ("M", "N", "K"))
        except ValueError:
            raise UsageError(f"{path}:{line}: M, N, K must be integers, got {[row[cols[c]] for c in 'MNK']}") from None
        if min(m, n, k) < 1:
            raise UsageError(f"{path}:{line}: M, N, K must be positive, got {(m, n, k)}")
        out.append((m, n, k))
    return out


def load_shapes(shapes_csv: str | None, nk: Sequence[tuple[int, int]] | None, model_dir: str | None, tp: int,
                ms: Sequence[int], notes: list[str] | None = None) -> list[tuple[int, int, int]]:
    """Every (M, N, K) to tune, in order, without duplicates: ``shapes_csv`` rows, then (``nk`` + the model's) x
    ``ms``. ``notes`` receives what the model runs that these shapes do not cover (routed experts)."""
    shapes: list[tuple[int, int, int]] = []
    if shapes_csv:
        shapes += read_shapes_csv(shapes_csv)
    nks = list(nk or [])
    if model_dir:
        model = fp8_model_shapes(model_dir, tp)
        nks += [(p.N, p.K) for p in model.projections]
        if notes is not None:
            notes += [f"{model.source}: {n}" if not n.startswith(model.source) else n for n in model.not_covered]
    if any(m < 1 for m in ms):
        raise UsageError(f"--m must be positive batch sizes, got {list(ms)}")
    shapes += [(m, n, k) for n, k in dict.fromkeys(nks) for m in ms]
    if not shapes:
        raise UsageError("no shapes: give --nk N,K ..., --model_dir or --shapes")
    return list(dict.fromkeys(shapes))
