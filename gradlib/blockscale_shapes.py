"""Shapes for the A8W8 block-scale tuner (:mod:`gradlib.tune_a8w8_blockscale`): ``--nk`` pairs, a model's fp8
linears from its ``config.json`` (Llama-style through :mod:`gradlib.models`, DeepSeek MLA by
:func:`deepseek_projections`), and untuned CSVs with M, N, K columns, crossed with the batch sizes ``--m``."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiter_gemm.fileio import read_csv_rows
from gradlib.cli import UsageError, int_list
from gradlib.models import ModelArch, ModelConfigError, projections, read_json, shipped_model_dir

__all__ = ["Projection", "UsageError", "deepseek_projections", "load_shapes", "model_projections", "nk_pair",
           "int_list", "read_shapes_csv"]


@dataclass(frozen=True)
class Projection:
    """One fp8 linear layer on one TP rank: ``N`` out features, ``K`` in features."""

    name: str
    N: int
    K: int


def deepseek_projections(cfg: Mapping, tp: int, source: str = "config.json") -> list[Projection]:
    """Dense fp8 linears of a DeepSeek-V2/V3 (MLA) config on one of ``tp`` ranks (vLLM/SGLang sharding), as
    (N, K); ``h`` = heads/tp, ``nope``/``rope``/``v`` the qk_nope/qk_rope/v head dims:

    * with ``q_lora_rank``: qkv_a (q_lora_rank + kv_lora_rank + rope, hidden), replicated on every rank (q_a and
      kv_a fused); q_b (h * (nope + rope), q_lora_rank). Without: q (h * (nope + rope), hidden) and kv_a
      (kv_lora_rank + rope, hidden).
    * kv_b (h * (nope + v), kv_lora_rank); o (hidden, h * v).
    * dense MLP (the first_k_dense_replace layers): gate_up (2 * intermediate/tp, hidden), down (hidden,
      intermediate/tp); shared experts: gate_up (2 * moe_intermediate * n_shared/tp, hidden), down (hidden,
      moe_intermediate * n_shared/tp).

    DeepSeek-V3 at tp 8 gives AITER's ds_v3 list: (2112, 7168), (3072, 1536), (4096, 512), (7168, 2048),
    (4608, 7168), (7168, 2304), (512, 7168), (7168, 256). Routed experts are grouped GEMMs (not this op)."""

    def need(key: str) -> int:
        val = cfg.get(key)
        if not isinstance(val, int) or isinstance(val, bool) or val <= 0:
            raise ModelConfigError(f"{source}: key {key!r} must be a positive integer, got {val!r}")
        return val

    def split(total: int, what: str) -> int:
        if total % tp:
            raise ModelConfigError(f"{source}: {what}={total} is not divisible by --tp {tp}")
        return total // tp

    hidden, heads = need("hidden_size"), split(need("num_attention_heads"), "num_attention_heads")
    nope, rope, v_dim, kv_rank = (need("qk_nope_head_dim"), need("qk_rope_head_dim"), need("v_head_dim"),
                                  need("kv_lora_rank"))
    out = []
    if cfg.get("q_lora_rank"):
        q_rank = need("q_lora_rank")
        out += [Projection("qkv_a", q_rank + kv_rank + rope, hidden),
                Projection("q_b", heads * (nope + rope), q_rank)]
    else:
        out += [Projection("q", heads * (nope + rope), hidden), Projection("kv_a", kv_rank + rope, hidden)]
    out += [Projection("kv_b", heads * (nope + v_dim), kv_rank), Projection("o", hidden, heads * v_dim)]
    if cfg.get("first_k_dense_replace", 0) or not cfg.get("n_routed_experts"):
        inter = split(need("intermediate_size"), "intermediate_size")
        out += [Projection("gate_up", 2 * inter, hidden), Projection("down", hidden, inter)]
    if cfg.get("n_shared_experts"):
        shared = split(need("moe_intermediate_size") * need("n_shared_experts"), "shared expert intermediate")
        out += [Projection("shared_gate_up", 2 * shared, hidden), Projection("shared_down", hidden, shared)]
    return out


def model_projections(model_dir: str, tp: int) -> list[Projection]:
    """The fp8 linears of the model in ``model_dir/config.json`` (or a shipped model config's name)."""
    if tp < 1:
        raise ModelConfigError(f"--tp must be >= 1, got {tp}")
    path = Path(model_dir) / "config.json"
    if not path.is_file() and not Path(model_dir).exists():
        shipped = shipped_model_dir(str(model_dir))
        path = shipped / "config.json" if shipped is not None else path
    if not path.is_file():
        raise ModelConfigError(f"--model_dir {model_dir}: no config.json there")
    cfg = read_json(path)
    cfg = cfg.get("text_config", cfg)
    if "kv_lora_rank" in cfg:
        return deepseek_projections(cfg, tp, str(path))
    arch = ModelArch.from_config(cfg, str(path))
    return [Projection(p.name, p.N, p.K) for p in projections(arch, tp) if p.name != "lm_head"]


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
            m, n, k = (int(str(row[cols[c]]).strip()) for c in ("M", "N", "K"))
        except ValueError:
            raise UsageError(f"{path}:{line}: M, N, K must be integers, got {[row[cols[c]] for c in 'MNK']}") from None
        if min(m, n, k) < 1:
            raise UsageError(f"{path}:{line}: M, N, K must be positive, got {(m, n, k)}")
        out.append((m, n, k))
    return out


def load_shapes(shapes_csv: str | None, nk: Sequence[tuple[int, int]] | None, model_dir: str | None, tp: int,
                ms: Sequence[int]) -> list[tuple[int, int, int]]:
    """Every (M, N, K) to tune, in order, without duplicates: ``shapes_csv`` rows, then (``nk`` + the model's) x
    ``ms``."""
    shapes: list[tuple[int, int, int]] = []
    if shapes_csv:
        shapes += read_shapes_csv(shapes_csv)
    nks = list(nk or [])
    if model_dir:
        nks += [(p.N, p.K) for p in model_projections(model_dir, tp)]
    if any(m < 1 for m in ms):
        raise UsageError(f"--m must be positive batch sizes, got {list(ms)}")
    shapes += [(m, n, k) for n, k in dict.fromkeys(nks) for m in ms]
    if not shapes:
        raise UsageError("no shapes: give --nk N,K ..., --model_dir or --shapes")
    return list(dict.fromkeys(shapes))
