"""GEMM shapes of a dense decoder model, derived from its Hugging Face ``config.json`` (``--model_dir``).

Named as the runtime names them (AITER's model mode swapped M and N, so its rows never matched): ``M`` = tokens in
the batch, ``N`` = output features of the projection on one tensor-parallel rank, ``K`` = input features, i.e.
``out (M, N) = x (M, K) @ W (N, K).T``. With tensor parallelism ``tp`` (Megatron layout, as vLLM shards):

=========  ==============================================  ========================
projection N (out features per rank)                        K (in features per rank)
=========  ==============================================  ========================
qkv        (heads/tp + 2 * kv_heads_per_rank) * head_dim   hidden
o          hidden                                          heads/tp * head_dim
gate_up    2 * intermediate/tp                             hidden
down       hidden                                          intermediate/tp
lm_head    ceil(pad64(vocab) / tp)                         hidden
=========  ==============================================  ========================

``kv_heads_per_rank`` = kv_heads/tp, or 1 when tp > kv_heads (each rank keeps a replica). The vocabulary is padded
to a multiple of 64 first, as vLLM's ParallelLMHead does. lm_head runs on one token per sequence, so its M values
are ``--batch_size`` when given (else the ``--nsets`` values).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.errors import ConfigError
from aiter_gemm.fileio import read_text

# model_type -> whether q/k/v projections carry a bias when config.json does not say (Qwen2 always has one).
_QKV_BIAS_BY_TYPE = {"qwen2": True}
# model types whose o_proj never has a bias even when q/k/v do.
_NO_O_BIAS_TYPES = frozenset({"qwen2"})
VOCAB_PAD = 64


class ModelConfigError(ValueError):
    """A config.json the shape derivation cannot use; names the file and the key."""


@dataclass(frozen=True)
class ModelArch:
    """The architecture numbers the GEMM shapes depend on."""

    model_type: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], source: str = "config.json") -> "ModelArch":
        cfg = cfg.get("text_config", cfg)  # multimodal configs nest the language model's numbers

        def need(key: str) -> int:
            if key not in cfg:
                raise ModelConfigError(f"{source}: missing key {key!r} (needed for the GEMM shapes)")
            val = cfg[key]
            if not isinstance(val, int) or isinstance(val, bool) or val <= 0:
                raise ModelConfigError(f"{source}: key {key!r} must be a positive integer, got {val!r}")
            return val

        hidden, heads = need("hidden_size"), need("num_attention_heads")
        kv = need("num_key_value_heads") if "num_key_value_heads" in cfg else heads
        head_dim = need("head_dim") if cfg.get("head_dim") is not None else hidden // heads
        mtype = str(cfg.get("model_type", ""))
        attn_bias = bool(cfg.get("attention_bias", False))
        qkv_bias = bool(cfg.get("qkv_bias", cfg.get("attention_bias", _QKV_BIAS_BY_TYPE.get(mtype, False))))
        return cls(mtype, hidden, need("intermediate_size"), heads, kv, head_dim, need("vocab_size"), qkv_bias,
                   attn_bias and mtype not in _NO_O_BIAS_TYPES, bool(cfg.get("mlp_bias", False)))


@dataclass(frozen=True)
class Projection:
    """One linear layer of the model on one TP rank: out features ``N``, in features ``K``."""

    name: str
    N: int
    K: int
    bias: bool


def shipped_model_dir(name: str) -> Path | None:
    """``configs/model_configs/<name>`` as shipped with the package (works in an installed copy too)."""
    try:
        from aiter_gemm.settings import default_config_dir

        cand = default_config_dir() / "model_configs" / name
    except FileNotFoundError:
        return None
    return cand if (cand / "config.json").is_file() else None


def load_arch(model_dir: str | Path) -> ModelArch:
    """The architecture in ``model_dir/config.json``; a bare name such as ``llama3_8b`` that is not a folder here
    names a shipped model config."""
    path = Path(model_dir) / "config.json"
    if not path.is_file() and not Path(model_dir).exists():
        shipped = shipped_model_dir(str(model_dir))
        path = shipped / "config.json" if shipped is not None else path
    if not path.is_file():
        raise ModelConfigError(f"--model_dir {model_dir}: no config.json there (shipped models: "
                               f"{', '.join(shipped_models()) or 'none found'})")
    return ModelArch.from_config(read_json(path), str(path))


def read_json(path: Path) -> Any:
    """A model's config.json; ModelConfigError naming the file when it is not UTF-8 JSON."""
    try:
        return json.loads(read_text(path)[0])
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path}: not valid JSON ({exc})") from None
    except ConfigError as exc:
        raise ModelConfigError(str(exc)) from None


def shipped_models() -> list[str]:
    """Names of the shipped model configs (``--model_dir NAME`` works for each)."""
    try:
        from aiter_gemm.settings import default_config_dir

        root = default_config_dir() / "model_configs"
    except FileNotFoundError:
        return []
    return sorted(d.name for d in root.iterdir() if (d / "config.json").is_file()) if root.is_dir() else []


def _split(total: int, tp: int, what: str) -> int:
    if total % tp:
        raise ModelConfigError(f"{what}={total} is not divisible by --tp {tp}")
    return total // tp


def projections(arch: ModelArch, tp: int = 1) -> list[Projection]:
    """The five projections of ``arch`` on one of ``tp`` ranks (see the module table)."""
    if tp < 1:
        raise ModelConfigError(f"--tp must be >= 1, got {tp}")
    heads = _split(arch.heads, tp, "num_attention_heads")
    if arch.kv_heads >= tp:
        kv = _split(arch.kv_heads, tp, "num_key_value_heads")
    elif tp % arch.kv_heads == 0:
        kv = 1
    else:
        raise ModelConfigError(f"--tp {tp} is neither a divisor nor a multiple of num_key_value_heads={arch.kv_heads}")
    inter = _split(arch.intermediate, tp, "intermediate_size")
    vocab = math.ceil(math.ceil(arch.vocab / VOCAB_PAD) * VOCAB_PAD / tp)
    return [
        Projection("qkv", (heads + 2 * kv) * arch.head_dim, arch.hidden, arch.qkv_bias),
        Projection("o", arch.hidden, heads * arch.head_dim, arch.o_bias),
        Projection("gate_up", 2 * inter, arch.hidden, arch.mlp_bias),
        Projection("down", arch.hidden, inter, arch.mlp_bias),
        Projection("lm_head", vocab, arch.hidden, False),
    ]


def model_problems(arch: ModelArch, tp: int, nsets: Iterable[int], batch_sizes: Iterable[int] | None = None,
                   dtype: torch.dtype = torch.bfloat16, otype: torch.dtype | None = None) -> list[GemmProblem]:
    """Every (M, N, K) of the model for M in ``nsets`` (lm_head: M in ``batch_sizes`` if given), without duplicates,
    ordered by M then projection."""
    otype = otype or dtype
    ms = list(nsets)
    if not ms or any(m < 1 for m in ms):
        raise ModelConfigError(f"--nsets must be positive token counts, got {ms}")
    heads_ms = list(batch_sizes) if batch_sizes else ms
    if any(m < 1 for m in heads_ms):
        raise ModelConfigError(f"--batch_size must be positive, got {heads_ms}")
    projs = projections(arch, tp)
    out: dict[GemmProblem, None] = {}
    for m in ms:
        for p in projs[:-1]:
            out[GemmProblem(m, p.N, p.K, p.bias, dtype, otype)] = None
    head = projs[-1]
    for m in heads_ms:
        out[GemmProblem(m, head.N, head.K, head.bias, dtype, otype)] = None
    return list(out)
