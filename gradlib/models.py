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

from aiter_gemm.backends.base import ACT_TYPES, QUANT_BLOCK, QUANT_NONE, GemmProblem, MoeProblem
from aiter_gemm.errors import ConfigError
from aiter_gemm.fileio import read_text
from aiter_gemm.kernels.blockscale_format import FP8

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


def config_path(model_dir: str | Path) -> Path:
    """``model_dir/config.json``; a bare name such as ``llama3_8b`` that is not a folder here names a shipped model
    config. ModelConfigError listing the shipped names when there is none."""
    path = Path(model_dir) / "config.json"
    if not path.is_file() and not Path(model_dir).exists():
        shipped = shipped_model_dir(str(model_dir))
        path = shipped / "config.json" if shipped is not None else path
    if not path.is_file():
        raise ModelConfigError(f"--model_dir {model_dir}: no config.json there (shipped models: "
                               f"{', '.join(shipped_models()) or 'none found'})")
    return path


def load_arch(model_dir: str | Path) -> ModelArch:
    """The architecture in ``model_dir/config.json`` (:func:`config_path`)."""
    path = config_path(model_dir)
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


# ---- FP8 block-scale models (python -m gradlib.tune_a8w8_blockscale --model_dir) ------------------------------------
FP8_BLOCK = [128, 128]  # the weight blocks gemm_a8w8_blockscale runs


@dataclass(frozen=True)
class FP8Shapes:
    """The dense fp8 linears of a model on one TP rank, and what its GEMMs include that this op does not cover."""

    source: str
    projections: tuple[Projection, ...]
    not_covered: tuple[str, ...]


def check_fp8_blocks(cfg: Mapping[str, Any], source: str) -> str | None:
    """ModelConfigError naming ``source`` and the field unless ``quantization_config`` says fp8 with 128x128 weight
    blocks; a config without one (a bf16 checkpoint, to be quantized) passes with a note (returned)."""
    q = cfg.get("quantization_config")
    if q is None:
        return (f"{source} has no quantization_config (a bf16 checkpoint): its linears are derived as if quantized "
                f"with {FP8_BLOCK} blocks")
    if not isinstance(q, Mapping):
        raise ModelConfigError(f"{source}: field quantization_config must be an object, got {q!r}")
    method = q.get("quant_method")
    if method != "fp8":
        raise ModelConfigError(f"{source}: field quantization_config.quant_method is {method!r}: only 'fp8' "
                               "checkpoints run on gemm_a8w8_blockscale")
    block = q.get("weight_block_size")
    if block != FP8_BLOCK:
        raise ModelConfigError(f"{source}: field quantization_config.weight_block_size is {block!r}: "
                               f"gemm_a8w8_blockscale runs {FP8_BLOCK} weight blocks only"
                               + (" (none: a per-tensor fp8 checkpoint)" if block is None else ""))
    return None


def deepseek_projections(cfg: Mapping[str, Any], tp: int, source: str = "config.json") -> list[Projection]:
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
        out += [Projection("qkv_a", q_rank + kv_rank + rope, hidden, False),
                Projection("q_b", heads * (nope + rope), q_rank, False)]
    else:
        out += [Projection("q", heads * (nope + rope), hidden, False),
                Projection("kv_a", kv_rank + rope, hidden, False)]
    out += [Projection("kv_b", heads * (nope + v_dim), kv_rank, False),
            Projection("o", hidden, heads * v_dim, False)]
    if cfg.get("first_k_dense_replace", 0) or not cfg.get("n_routed_experts"):
        inter = split(need("intermediate_size"), "intermediate_size")
        out += [Projection("gate_up", 2 * inter, hidden, False), Projection("down", hidden, inter, False)]
    if cfg.get("n_shared_experts"):
        shared = split(need("moe_intermediate_size") * need("n_shared_experts"), "shared expert intermediate")
        out += [Projection("shared_gate_up", 2 * shared, hidden, False),
                Projection("shared_down", hidden, shared, False)]
    return out


_EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")


def fp8_model_shapes(model_dir: str | Path, tp: int) -> FP8Shapes:
    """The dense fp8 linears of the model in ``model_dir/config.json`` (a folder or a shipped name) on one of ``tp``
    ranks: DeepSeek MLA configs by :func:`deepseek_projections`, others by :func:`projections` (fused qkv and
    gate_up, as for gemm-tuner) less lm_head, which FP8 checkpoints keep in bf16. Routed experts (grouped GEMMs)
    are listed in ``not_covered``; a Llama-style MoE's MLP is all experts, so it has no dense MLP here."""
    if tp < 1:
        raise ModelConfigError(f"--tp must be >= 1, got {tp}")
    path = config_path(model_dir)
    full = read_json(path)
    cfg = full.get("text_config", full)
    note = check_fp8_blocks(cfg if "quantization_config" in cfg else full, str(path))
    not_covered = [note] if note else []
    experts = next(((k, cfg[k]) for k in _EXPERT_KEYS if cfg.get(k)), None)
    if experts is not None:
        not_covered.append(f"routed experts ({experts[0]}={experts[1]}, moe_intermediate_size="
                           f"{cfg.get('moe_intermediate_size')}): grouped GEMMs, not covered by this op (python -m "
                           f"gradlib.tune_moe --model_dir {model_dir} tunes them)")
    if "kv_lora_rank" in cfg:
        projs = deepseek_projections(cfg, tp, str(path))
    else:
        skip = {"lm_head"} | ({"gate_up", "down"} if experts is not None else set())
        projs = [p for p in projections(ModelArch.from_config(cfg, str(path)), tp) if p.name not in skip]
    return FP8Shapes(str(path), tuple(projs), tuple(not_covered))


# ---- routed experts (python -m gradlib.tune_moe --model_dir) ---------------------------------------------------------
#: ``hidden_act`` -> the activation ``fused_moe`` takes.
_MOE_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu"}


@dataclass(frozen=True)
class MoeExperts:
    """The routed experts of an MoE model on one rank, as ``fused_moe`` sees them: ``hidden`` (model_dim), ``inter``
    (inter_dim, per rank), ``experts`` (local experts), ``topk`` (experts per token), and whether the checkpoint is
    FP8 with (128, 128) weight blocks; ``notes``: what else the model runs that these shapes leave out."""

    source: str
    hidden: int
    inter: int
    experts: int
    topk: int
    activation: str
    fp8: bool
    notes: tuple[str, ...] = ()


def moe_experts(model_dir: str | Path, tp: int = 1, ep: int = 1) -> MoeExperts:
    """The routed experts of the model in ``model_dir/config.json`` (a folder or a shipped name: Qwen3-MoE's
    ``num_experts``/``moe_intermediate_size``, DeepSeek's ``n_routed_experts``, Mixtral's ``num_local_experts`` with
    ``intermediate_size``) on one rank: expert parallelism ``ep`` keeps E/ep experts per rank, tensor parallelism
    ``tp`` splits each expert's intermediate size (vLLM's and SGLang's sharding). The rank's tokens are routed to
    ``topk`` of its own experts (k over E/ep: the rank's work for the tokens that reach it, not the ~k/ep local hits
    of a token routed over every expert); ModelConfigError naming the file and key when the model has no routed
    experts or a key does not divide."""
    if tp < 1 or ep < 1:
        raise ModelConfigError(f"--tp and --ep must be >= 1, got {tp} and {ep}")
    path = config_path(model_dir)
    full = read_json(path)
    cfg = full.get("text_config", full)
    source = str(path)
    found = next(((k, cfg[k]) for k in _EXPERT_KEYS if cfg.get(k)), None)
    if found is None:
        raise ModelConfigError(f"{source}: no routed experts (none of {', '.join(_EXPERT_KEYS)}): not an MoE model")

    def need(key: str) -> int:
        val = cfg.get(key)
        if not isinstance(val, int) or isinstance(val, bool) or val <= 0:
            raise ModelConfigError(f"{source}: key {key!r} must be a positive integer, got {val!r}")
        return val

    def split(total: int, by: int, what: str, flag: str) -> int:
        if total % by:
            raise ModelConfigError(f"{source}: {what}={total} is not divisible by {flag} {by}")
        return total // by

    experts = split(need(found[0]), ep, found[0], "--ep")
    inter_key = "moe_intermediate_size" if "moe_intermediate_size" in cfg else "intermediate_size"
    inter = split(need(inter_key), tp, inter_key, "--tp")
    act = cfg.get("hidden_act", "silu")
    if act not in _MOE_ACTIVATIONS:
        raise ModelConfigError(f"{source}: key 'hidden_act' is {act!r}: fused_moe runs {sorted(_MOE_ACTIVATIONS)}")
    quant = cfg.get("quantization_config", full.get("quantization_config"))
    fp8 = isinstance(quant, Mapping) and quant.get("quant_method") == "fp8" and quant.get("weight_block_size") == \
        FP8_BLOCK
    notes = []
    if quant is not None and not fp8:
        notes.append(f"{source}: quantization_config {quant!r} is not FP8 with {FP8_BLOCK} blocks: its experts are "
                     "tuned as bf16 unless --dtype says fp8")
    if cfg.get("n_shared_experts"):
        notes.append(f"{source}: shared experts (n_shared_experts={cfg['n_shared_experts']}) are dense GEMMs: "
                     "python -m gradlib.tune_a8w8_blockscale --model_dir tunes them")
    topk = need("num_experts_per_tok")
    if topk > experts:  # a token reaches at most every local expert once
        notes.append(f"{source}: num_experts_per_tok={topk} is above the {experts} local experts of --ep {ep}: "
                     f"topk {experts} (each token reaches every local expert)")
        topk = experts
    return MoeExperts(source, need("hidden_size"), inter, experts, topk, _MOE_ACTIVATIONS[act], fp8, tuple(notes))


#: ``--dtype`` of MoE experts -> (dtype, q_dtype_a, q_dtype_w, q_type) of their problem: fp8 is e4m3 with (128, 128)
#: block scales (AITER's per_1x128: activations quantized per token and 128-wide group).
MOE_DTYPES: dict[str, tuple[torch.dtype, torch.dtype, torch.dtype, str]] = {
    "bf16": (torch.bfloat16, torch.bfloat16, torch.bfloat16, QUANT_NONE),
    "fp16": (torch.float16, torch.float16, torch.float16, QUANT_NONE),
    "fp8": (torch.bfloat16, FP8, FP8, QUANT_BLOCK),
}


def moe_problems(m: MoeExperts, tokens: Iterable[int], dtype: str | None = None) -> list[MoeProblem]:
    """``m``'s problem at each token count, its experts in ``dtype`` (a :data:`MOE_DTYPES` name; default the
    checkpoint's: fp8 for FP8 with (128, 128) blocks, else bf16); ModelConfigError naming an unknown dtype."""
    name = dtype or ("fp8" if m.fp8 else "bf16")
    if name not in MOE_DTYPES:
        raise ModelConfigError(f"--dtype {name}: not one of {', '.join(MOE_DTYPES)}")
    return [MoeProblem(t, m.hidden, m.inter, m.experts, m.topk, ACT_TYPES[m.activation], *MOE_DTYPES[name])
            for t in tokens]
