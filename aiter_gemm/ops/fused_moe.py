"""The ``fused_moe`` op: routed experts (T tokens, each through its top-k of E gated MLPs), AITER's ``fused_moe``, on
the generic dispatcher.

This module is the op's :class:`~aiter_gemm.opspec.OpSpec` (:data:`FUSED_MOE`), its problem from a call and its
public entry points; the implementations are its backends in :mod:`aiter_gemm.backends.fused_moe` (``triton``: our
fused-MoE kernels; ``torch``: ``torch._grouped_mm`` or a loop over the experts; ``deepgemm``: DeepGEMM's grouped
FP8 GEMMs, never a default). A problem is a :class:`~aiter_gemm.backends.base.MoeProblem`, AITER's fmoe key
(``token, model_dim, inter_dim, expert, topk, act_type, dtype, q_dtype_a, q_dtype_w, q_type, use_g1u1,
doweight_stage1``). Which backend runs it is decided once per problem, in the dispatcher's order (docs/design.md):

1. a row of the ``FMOE`` table (``AITER_CONFIG_FMOE``, colon-separated, default the shipped ``configs/tuned_fmoe.csv``)
   keyed on the device (``gfx``, ``cu_num``, ``device_name``) and the problem, at the exact token count first, then
   at AITER's padded one (:func:`~aiter_gemm.backends.base.get_padded_token`: the next power of two...). Outputs are
   AITER's (``block_m, ksplit, kernelName1, kernelName2, us1, us2, err1, err2, us, run_1stage, tflops, bw``) plus
   an optional ``libtype``; without it a row's backend is read off ``kernelName1``: ``grouped_mm`` / ``loop``:
   ``torch``; ``deepgemm_m_grouped_contiguous``: ``deepgemm``; a :class:`~aiter_gemm.kernels.fused_moe.MoeConfig`
   name: ``triton``; anything else names one of AITER's own kernels (CK, asm, FlyDSL: libtype
   :data:`AITER_LIBTYPE`), which cannot run here: a miss, warned once.
2. vLLM's and SGLang's fused-MoE JSON files in the folders of ``AITER_GEMM_FUSED_MOE_CONFIGS`` (:mod:`aiter_gemm.
   moe_json`: ``E=..,N=..,device_name=..[,dtype=fp8_w8a8][,block_shape=[128,128]].json``, nearest M).
3. the default: the Triton kernels' default configs on a GPU, else torch's grouped_mm where it runs, else its loop.

Files are read at first use and again after :func:`aiter_gemm.reload_configs`; the per-call path does one dict
lookup, plus the expert-id check (a host sync) outside CUDA-graph capture. The entry takes AITER's signature
(``aiter.fused_moe.fused_moe``: ``expert_mask``, ``activation``, ``quant_type``, ``doweight_stage1`` after
``topk_ids``, then the scales; :data:`FUSED_MOE_ENTRY`): its expert mask is honoured (:mod:`aiter_gemm.kernels.
moe_expert_mask`), the options it does not run are refused naming them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import torch

from aiter_gemm import cudagraph, moe_json
from aiter_gemm.backends.base import ACT_TYPES, QUANT_ALIASES, QUANT_BLOCK, QUANT_NONE, MoeProblem, Solution
from aiter_gemm.backends.fused_moe import pair_name
from aiter_gemm.configs import ConfigError, TunedRow
from aiter_gemm.dispatch import dispatcher_for
from aiter_gemm.dtypes import parse_dtype
from aiter_gemm.jsonconfigs import JsonLevel
from aiter_gemm.kernels import fused_moe_deepgemm as deepgemm_impl
from aiter_gemm.kernels import fused_moe_torch as torch_impl
from aiter_gemm.kernels.a8w8_blockscale import quantize_weight_blockscale
from aiter_gemm.kernels.blockscale_format import FP8
from aiter_gemm.kernels.fused_moe import MoeConfig, check_expert_ids, check_moe_inputs, fused_moe_ref
from aiter_gemm.kernels.moe_expert_mask import local_expert_ids
from aiter_gemm.op_entry import BYPASS, OPTIONAL_TENSOR, VALUE, Arg, Decided, OpEntry
from aiter_gemm.opspec import OpSpec
from aiter_gemm.registry import register_op
from aiter_gemm.testbed import Inputs, cloned_sets, free_memory
from aiter_gemm.timing import rotating_sets

__all__ = [
    "ACTIVATION_NAMES", "AITER_LIBTYPE", "FMOE_UNTUNED_COLUMNS", "FUSED_MOE", "FUSED_MOE_ENTRY", "KIND",
    "QUANT_FP8", "ROUTINGS", "UNSUPPORTED", "UNTUNED_FILE", "activation_name", "call_key", "call_runner",
    "check_expert_ids", "check_options", "fused_moe", "get_fused_moe_config", "make_inputs", "problem_of",
    "refuse_unsupported", "routing",
]

KIND = "FMOE"
#: AITER's untuned fmoe shape list; captured calls (``AITER_TUNE_GEMM=1``) go to this name in the folder of
#: ``AITER_UNTUNED_GEMM_FILE`` (default: the working directory).
UNTUNED_FILE = "untuned_fmoe.csv"
FMOE_UNTUNED_COLUMNS = ("token", "model_dim", "inter_dim", "expert", "topk", "act_type", "dtype", "q_dtype_a",
                        "q_dtype_w", "q_type", "use_g1u1", "doweight_stage1")
#: The libtype of rows naming AITER's own MoE kernels (CK, asm, FlyDSL), which no backend here runs.
AITER_LIBTYPE = "aiter"
#: How :func:`make_inputs` routes tokens (option ``routing``): every expert equally likely, or Zipf-skewed.
ROUTINGS = ("uniform", "skewed")


# ------------------------------------------------------------------------------------------------ rows


def row_key(p: MoeProblem) -> tuple:
    """The FMOE table key of ``p``, typed as the table parses it (the untuned columns in order)."""
    return (p.token, p.model_dim, p.inter_dim, p.expert, p.topk, p.act_type, p.dtype, p.q_dtype_a, p.q_dtype_w,
            p.q_type, p.use_g1u1, p.doweight_stage1)


def _libtype_of(kernel_name: str) -> str:
    """The backend a row without ``libtype`` names, read off its ``kernelName1``."""
    if kernel_name in torch_impl.NAMES:
        return torch_impl.LIBTYPE
    if kernel_name == deepgemm_impl.NAME:
        return deepgemm_impl.LIBTYPE
    try:
        MoeConfig.parse(kernel_name)
    except ValueError:
        return AITER_LIBTYPE
    return "triton"


def _row_solution(row: TunedRow) -> Solution:
    """The solution a row names; ConfigError (file, line, column) when a row of ours is malformed: a ``triton``
    row's kernel names must parse, its ``block_m`` (0: unset) and ``ksplit`` must be GEMM1's."""
    values = row.values
    name1, name2 = values["kernelName1"].strip(), values["kernelName2"].strip()
    libtype = values["libtype"] or _libtype_of(name1)
    if libtype == "triton":
        configs = []
        for column, name in (("kernelName1", name1), ("kernelName2", name2 or name1)):
            try:
                configs.append(MoeConfig.parse(name))
            except ValueError as exc:
                raise ConfigError(row.source, row.line, column, str(exc)) from None
        if values["block_m"] not in (0, configs[0].block_m):
            raise ConfigError(row.source, row.line, "block_m", f"{values['block_m']} disagrees with kernelName1 "
                              f"{name1!r} (block_m={configs[0].block_m})")
        split = configs[0].split_k
        if (values["ksplit"] != split) if split > 1 else (values["ksplit"] not in (0, 1)):
            raise ConfigError(row.source, row.line, "ksplit", f"{values['ksplit']} disagrees with kernelName1 "
                              f"{name1!r} (split_k={split})")
    return Solution(libtype, -1, values["ksplit"], pair_name(name1, name2))


# ------------------------------------------------------------------------------------------------ inputs


def routing(T: int, E: int, k: int, kind: str = "uniform", generator: torch.Generator | None = None,
            device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weight float32 (T, k), topk_ids int32 (T, k)): each token's k distinct experts, every expert equally
    likely (``uniform``) or with Zipf weights 1/rank^1.2 over a random order of the experts (``skewed``: a few
    experts get most tokens, some none); weights a softmax over the k."""
    if kind not in ROUTINGS:
        raise ValueError(f"routing {kind!r} is not one of {ROUTINGS}")
    if not 1 <= k <= E:
        raise ValueError(f"routing: topk {k} must be in 1..{E} (distinct experts per token)")
    scores = torch.rand(T, E, generator=generator, device=device)
    if kind == "skewed":  # Gumbel top-k: k distinct experts drawn in proportion to the Zipf weights
        popularity = torch.arange(1, E + 1, device=device, dtype=torch.float32).pow(-1.2)
        popularity = popularity[torch.randperm(E, generator=generator, device=device)]
        scores = popularity.log() - (-scores.clamp_min(1e-20).log()).log()
    ids = scores.topk(k, dim=1).indices.to(torch.int32)
    weights = torch.randn(T, k, generator=generator, device=device).softmax(dim=1)
    return weights, ids


def make_inputs(p: MoeProblem, seed: int, device: torch.device, cache: int, options: Mapping[str, Any]) -> Inputs:
    """hidden_states ~ N(0, 1), w1 ~ N(0, 1/H), w2 ~ N(0, 1/I) (FP8: quantized per (128, 128) block), routing as
    ``options["routing"]`` says (:data:`ROUTINGS`, default uniform), as many copies as span twice the last-level
    cache (one copy of a model's experts usually does); each set is (hidden_states, w1, w2, topk_weight, topk_ids,
    w1_scale, w2_scale); the reference is :func:`~aiter_gemm.kernels.fused_moe.fused_moe_ref` in float32."""
    T, H, inter, E, k = p.token, p.model_dim, p.inter_dim, p.expert, p.topk
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(T, H, generator=gen, device=device).to(p.dtype)
    w1 = torch.randn(E, 2 * inter, H, generator=gen, device=device).mul_(H ** -0.5)
    w2 = torch.randn(E, H, inter, generator=gen, device=device).mul_(inter ** -0.5)
    topk_weight, topk_ids = routing(T, E, k, str(options.get("routing", "uniform")), gen, device)
    s1 = s2 = None
    if p.fp8:
        q1, q2 = [quantize_weight_blockscale(w) for w in w1], [quantize_weight_blockscale(w) for w in w2]
        w1, s1 = torch.stack([q for q, _ in q1]), torch.stack([s for _, s in q1])
        w2, s2 = torch.stack([q for q, _ in q2]), torch.stack([s for _, s in q2])
    else:
        w1, w2 = w1.to(p.dtype), w2.to(p.dtype)
    ref = fused_moe_ref(x, w1, w2, topk_weight, topk_ids, w1_scale=s1, w2_scale=s2, activation=p.activation).float()
    first = (x, w1, w2, topk_weight, topk_ids, s1, s2)
    per_set = sum(t.numel() * t.element_size() for t in first if t is not None) + x.numel() * x.element_size()
    return Inputs((), cloned_sets(first, rotating_sets(per_set, cache, free_memory(device))), ref)


def call_runner(runner, inputs: tuple, p: MoeProblem) -> torch.Tensor:
    """``runner`` on one set of :func:`make_inputs`."""
    return runner(*inputs)


FUSED_MOE = register_op(OpSpec(
    name="fused_moe", kind=KIND, backends="aiter_gemm.backends.fused_moe", row_key=row_key,
    row_solution=_row_solution, untuned_columns=FMOE_UNTUNED_COLUMNS,
    capture_path=lambda s: str(Path(s.untuned_file).parent / UNTUNED_FILE),
    # vLLM's and SGLang's files are a decision level; entries are Triton configs.
    json=JsonLevel("FUSED-MOE", moe_json.LIBTYPE, own_files=False,
                   more=(moe_json.VLLM_FILES, moe_json.SGLANG_FILES)),
    source_with_line=True, key_problem=lambda key: MoeProblem(*key),
    make_inputs=make_inputs, call_runner=call_runner,
))

# ------------------------------------------------------------------------------------------------ the op

_DISPATCHER = dispatcher_for(FUSED_MOE)

#: The activations the op runs by each spelling it takes: ours (``silu``) and AITER's (``str()`` of its
#: ActivationType member, ``ActivationType.Silu``; the member itself is read as that).
ACTIVATION_NAMES: dict[str, str] = {**{name: name for name in ACT_TYPES}, **{t: name for name, t in ACT_TYPES.items()}}
#: AITER's quant types the op runs, each with whether it names FP8 experts ((128, 128) block scales, activations
#: quantized per token and 128-wide group inside the op); any other is refused naming ``quant_type``.
QUANT_FP8: dict[str, bool] = {QUANT_NONE: False, QUANT_BLOCK: True}
QUANT_FP8.update({alias: QUANT_FP8[target] for alias, target in QUANT_ALIASES.items()})
#: AITER's arguments the op cannot honour, with what each asks for (at its default, None or 0, it is accepted).
UNSUPPORTED = {
    "a1_scale": "given activation scales (the op quantizes the activations per token and 128-wide group itself)",
    "a2_scale": "given activation scales (the op quantizes the activations per token and 128-wide group itself)",
    "block_size_M": "a forced tile M (the dispatch picks the kernels: the FMOE table, JSON files; config= names one)",
    "num_local_tokens": "a device count of valid rows (pass those rows and their routing)",
    "hidden_pad": "padded weights", "intermediate_pad": "padded weights", "bias1": "expert biases",
    "bias2": "expert biases",
}


def _spelled(value: object, enum: str) -> object:
    """``value`` as ``str()`` of AITER's ``enum`` member spells it (``ActivationType.Silu``) when it is one (AITER's
    pybind enums, or an Enum of that name), else ``value``."""
    name = getattr(value, "name", None)
    return f"{enum}.{name}" if type(value).__name__ == enum and isinstance(name, str) else value


def activation_name(activation: object) -> str:
    """The op's name (``silu``, ``gelu``) of ``activation`` in any of its spellings (:data:`ACTIVATION_NAMES`, AITER's
    ActivationType member); ValueError naming ``activation`` otherwise."""
    spelled = _spelled(activation, "ActivationType")
    name = ACTIVATION_NAMES.get(spelled) if isinstance(spelled, str) else None
    if name is None and isinstance(activation, torch.Tensor):  # a scale in AITER's activation slot
        raise ValueError(f"fused_moe: activation (a tensor of shape {tuple(activation.shape)}) is not one of "
                         f"{list(ACTIVATION_NAMES)} (AITER's order: expert_mask, activation, quant_type, "
                         "doweight_stage1, w1_scale, w2_scale follow topk_ids; pass the scales by name)")
    if name is None:
        raise ValueError(f"fused_moe: activation {spelled!r} is not one of {list(ACTIVATION_NAMES)}")
    return name


def check_options(hidden_states: torch.Tensor, w1: torch.Tensor, quant_type: object = None,
                  doweight_stage1: object = False, dtype: torch.dtype | None = None) -> None:
    """AITER's options the op takes as it runs them: ``quant_type`` None (read off w1) or the one w1's dtype runs
    (:data:`QUANT_FP8`), ``doweight_stage1`` False, ``dtype`` None or hidden_states'; ValueError naming the
    argument otherwise."""
    if quant_type is not None:
        spelled = _spelled(quant_type, "QuantType")
        fp8 = QUANT_FP8.get(spelled) if isinstance(spelled, str) else None
        if fp8 is None:
            raise ValueError(f"fused_moe: quant_type {spelled!r} is not supported: the op runs {QUANT_NONE} (bf16/"
                             f"fp16 experts) and {QUANT_BLOCK} (FP8 experts with (128, 128) block scales, AITER's "
                             "per_128x128 too); None reads it off w1")
        if fp8 != (w1.dtype == FP8):
            raise ValueError(f"fused_moe: quant_type {spelled} does not match w1's dtype {w1.dtype}: {QUANT_BLOCK} "
                             f"for {FP8} experts, {QUANT_NONE} for hidden_states' dtype")
    if doweight_stage1:
        raise ValueError("fused_moe: doweight_stage1=True (the routing weight applied in the first GEMM) is not "
                         "supported: the op applies it after the second")
    if dtype is not None and dtype != hidden_states.dtype:
        raise ValueError(f"fused_moe: dtype {dtype} is not supported: the output has hidden_states' dtype "
                         f"{hidden_states.dtype}")


def refuse_unsupported(**given: Any) -> None:
    """ValueError naming the first of AITER's :data:`UNSUPPORTED` arguments set (``block_size_M`` 0 or -1 is
    AITER's unset)."""
    for name, value in given.items():
        unset = value is None or (not isinstance(value, (bool, torch.Tensor)) and (
            value in (0, -1) if name == "block_size_M" else name.endswith("_pad") and value == 0))
        if not unset:
            shown = (f"{name} (a tensor of shape {tuple(value.shape)})" if isinstance(value, torch.Tensor)
                     else f"{name}={value!r}")
            raise ValueError(f"fused_moe: {shown} is not supported: AITER's {UNSUPPORTED[name]}")


def problem_of(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weight: torch.Tensor,
               topk_ids: torch.Tensor, w1_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
               activation: object = "silu", expert_mask: torch.Tensor | None = None) -> MoeProblem:
    """The problem of a call, its inputs checked (:func:`~aiter_gemm.kernels.fused_moe.check_moe_inputs`:
    ValueError naming the tensor with its shape, dtype, stride and device; expert ids outside [0, E), or outside
    ``expert_mask``, too, outside CUDA-graph capture). E is w1's: the local experts under a mask."""
    name = activation_name(activation)
    fp8 = check_moe_inputs(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale, name, expert_mask)
    T, H = hidden_states.shape
    q_dtype = FP8 if fp8 else hidden_states.dtype
    return MoeProblem(T, H, w2.shape[2], w1.shape[0], topk_ids.shape[1], ACT_TYPES[name], hidden_states.dtype,
                      q_dtype, q_dtype, QUANT_BLOCK if fp8 else QUANT_NONE)


def _runner(runner, experts: int, masked: bool):
    """``runner`` with the entry's leading arguments (AITER's, through ``w2_scale``), behind the expert-id check
    outside CUDA-graph capture (:mod:`aiter_gemm.cudagraph`); ``masked``: the global ids made local first
    (:func:`~aiter_gemm.kernels.moe_expert_mask.local_expert_ids`). The key holds whether there is a mask, so the
    unmasked call pays no test for it."""
    capturing = cudagraph.probe()

    def run(hidden_states, w1, w2, topk_weight, topk_ids, expert_mask=None, activation=None, quant_type=None,
            doweight_stage1=None, w1_scale=None, w2_scale=None):
        if not capturing():
            check_expert_ids(topk_ids, experts)
        return runner(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale)

    def run_masked(hidden_states, w1, w2, topk_weight, topk_ids, expert_mask=None, activation=None, quant_type=None,
                   doweight_stage1=None, w1_scale=None, w2_scale=None):
        if not capturing():
            check_expert_ids(topk_ids, experts, expert_mask)
        return runner(hidden_states, w1, w2, topk_weight, local_expert_ids(topk_ids, expert_mask), w1_scale, w2_scale)

    return run_masked if masked else run


def _empty(hidden_states, *_args):
    """No token, or no expert per token: zeros (T, H)."""
    return hidden_states.new_zeros(hidden_states.shape)


def _decide(hidden_states, w1, w2, topk_weight, topk_ids, expert_mask, activation, quant_type, doweight_stage1,
            w1_scale, w2_scale, a1_scale, a2_scale, block_size_M, num_local_tokens, moe_sorting_dispatch_policy,
            dtype, *_defaults) -> Decided:
    """Validate a key's first call and decide it (the rarer AITER arguments are at their defaults here, or the
    call went to :func:`_special`): the decision's runner behind the expert-id check, cached in Python and served
    by the C++ entry too."""
    p = problem_of(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale, activation, expert_mask)
    check_options(hidden_states, w1, quant_type, doweight_stage1, dtype)
    if p.token == 0 or p.topk == 0:
        return Decided(_empty, _empty)
    run = _runner(_DISPATCHER.decide(p, hidden_states.is_cuda).call_runner, p.expert, expert_mask is not None)
    return Decided(run, run)


def _with_config(config, hidden_states, w1, w2, topk_weight, topk_ids, expert_mask=None, activation="silu",
                 quant_type=None, doweight_stage1=False, w1_scale=None, w2_scale=None,
                 dtype=None) -> torch.Tensor:
    """A call with ``config`` (a :class:`~aiter_gemm.backends.base.Solution`): that solution, bypassing the
    dispatch (the tuner); ValueError when it cannot run."""
    p = problem_of(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale, activation, expert_mask)
    check_options(hidden_states, w1, quant_type, doweight_stage1, dtype)
    args = (hidden_states, w1, w2, topk_weight, topk_ids, expert_mask, activation, quant_type, doweight_stage1,
            w1_scale, w2_scale)
    if p.token == 0 or p.topk == 0:
        return _empty(*args)
    if not isinstance(config, Solution):
        raise TypeError(f"fused_moe: config must be a Solution (libtype, kernelName), got {type(config).__name__}")
    runner, why = _DISPATCHER.runner_for(p, config, _DISPATCHER.device(hidden_states.is_cuda))
    if runner is None:
        raise ValueError(f"fused_moe: {config.libtype} {config.kernelName!r} cannot run {p.label()} on "
                         f"{hidden_states.device}: {why}")
    return _runner(runner, p.expert, expert_mask is not None)(*args)


def _special(hidden_states, w1, w2, topk_weight, topk_ids, expert_mask=None, activation="silu", quant_type=None,
             doweight_stage1=False, w1_scale=None, w2_scale=None, a1_scale=None, a2_scale=None, block_size_M=None,
             num_local_tokens=None, moe_sorting_dispatch_policy=0, dtype=None, hidden_pad=0, intermediate_pad=0,
             bias1=None, bias2=None, splitk=0, config=None) -> torch.Tensor:
    """A call with one of AITER's rarer arguments off its default, or the tuner's ``config``: ValueError naming an
    :data:`UNSUPPORTED` one; AITER's knobs of its own sorting kernel and split-K (``moe_sorting_dispatch_policy``,
    ``splitk``, which AITER itself ignores) and an unset ``block_size_M`` have no effect."""
    refuse_unsupported(a1_scale=a1_scale, a2_scale=a2_scale, block_size_M=block_size_M,
                       num_local_tokens=num_local_tokens, hidden_pad=hidden_pad, intermediate_pad=intermediate_pad,
                       bias1=bias1, bias2=bias2)
    args = (hidden_states, w1, w2, topk_weight, topk_ids, expert_mask, activation, quant_type, doweight_stage1,
            w1_scale, w2_scale)
    if config is None:
        return fused_moe(*args, dtype=dtype)
    return _with_config(config, *args, dtype=dtype)


# ---- the custom op (torch.compile / export) ------------------------------------------------------------------
@torch.library.custom_op("aiter_gemm::fused_moe", mutates_args=())
def _fused_moe_op(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weight: torch.Tensor,
                  topk_ids: torch.Tensor, w1_scale: Optional[torch.Tensor] = None,
                  w2_scale: Optional[torch.Tensor] = None, activation: str = "silu",
                  expert_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    return fused_moe(hidden_states, w1, w2, topk_weight, topk_ids, expert_mask, activation, None, False, w1_scale,
                     w2_scale)  # not compiling


@_fused_moe_op.register_fake
def _fused_moe_fake(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale=None, w2_scale=None, activation="silu",
                    expert_mask=None):
    return hidden_states.new_empty(hidden_states.shape)


def _compiled(hidden_states, w1, w2, topk_weight, topk_ids, expert_mask=None, activation="silu", quant_type=None,
              doweight_stage1=False, w1_scale=None, w2_scale=None, a1_scale=None, a2_scale=None, block_size_M=None,
              num_local_tokens=None, moe_sorting_dispatch_policy=0, dtype=None, hidden_pad=0, intermediate_pad=0,
              bias1=None, bias2=None, splitk=0, config=None) -> torch.Tensor:
    """What ``torch.compile`` traces: AITER's options checked while tracing, then the custom op (a ``config`` is
    the tuner's, not a compiled model's)."""
    if config is not None:
        raise ValueError("fused_moe: config= bypasses the dispatch eagerly; it is not traced by torch.compile")
    refuse_unsupported(a1_scale=a1_scale, a2_scale=a2_scale, block_size_M=block_size_M,
                       num_local_tokens=num_local_tokens, hidden_pad=hidden_pad, intermediate_pad=intermediate_pad,
                       bias1=bias1, bias2=bias2)
    check_options(hidden_states, w1, quant_type, doweight_stage1, dtype)
    return torch.ops.aiter_gemm.fused_moe(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale,
                                          activation_name(activation), expert_mask)


#: The op's eager entry (:mod:`aiter_gemm.op_entry`) in AITER's signature (``aiter.fused_moe.fused_moe``), then
#: ``config``: the key holds the tensors' shapes, dtypes and devices, ``expert_mask``'s too (or None), the strides
#: of the five whose layout :func:`problem_of` checks (hidden_states' rows contiguous, the other four contiguous: a
#: call of another layout is checked as a first call) and the values ``activation``, ``quant_type``,
#: ``doweight_stage1``, ``dtype``, what the decision depends on; AITER's rarer arguments and ``config`` are bypass
#: arguments: at their defaults they cost an identity test, otherwise :func:`_special` takes the call. The C++ entry
#: serves every decision (AITER's enum members key in Python only).
FUSED_MOE_ENTRY = OpEntry(
    "fused_moe",
    (*(Arg(name, strides=True) for name in ("hidden_states", "w1", "w2", "topk_weight", "topk_ids")),
     Arg("expert_mask", OPTIONAL_TENSOR, None), Arg("activation", VALUE, "silu", choices=tuple(ACTIVATION_NAMES)),
     Arg("quant_type", VALUE, None, choices=(None, *QUANT_FP8)), Arg("doweight_stage1", VALUE, False),
     Arg("w1_scale", OPTIONAL_TENSOR, None), Arg("w2_scale", OPTIONAL_TENSOR, None),
     *(Arg(name, BYPASS, None) for name in ("a1_scale", "a2_scale", "block_size_M", "num_local_tokens")),
     Arg("moe_sorting_dispatch_policy", BYPASS, 0), Arg("dtype", VALUE, None),
     Arg("hidden_pad", BYPASS, 0), Arg("intermediate_pad", BYPASS, 0), Arg("bias1", BYPASS, None),
     Arg("bias2", BYPASS, None), Arg("splitk", BYPASS, 0), Arg("config", BYPASS, None)),
    _DISPATCHER.cache, _decide, module=__name__, runner_args=11, compiled=_compiled, bypass=_special,
    doc="""AITER's ``fused_moe`` (its signature, ``aiter.fused_moe.fused_moe``): out (T, H) = sum over each token's k
    experts of ``topk_weight`` x ``w2[e] @ (act(gate) * up)``, with ``hidden_states`` (T, H) bf16/fp16, ``w1``
    (E, 2I, H) gate rows then up rows, ``w2`` (E, H, I), ``topk_weight`` (T, k) float32 (or hidden_states' dtype),
    ``topk_ids`` (T, k) int32/int64. ``expert_mask`` (expert parallelism): a 0/1 mask over the global experts,
    ``w1``/``w2`` holding the mask's ones in order and ``topk_ids`` global ids; pairs of masked experts add nothing.
    ``activation`` ``silu``/``gelu`` or AITER's ``ActivationType.Silu``/``Gelu`` (its member too). FP8 experts:
    ``w1``/``w2`` float8_e4m3fn with (128, 128) block scales ``w1_scale`` (E, 2I/128, H/128) and ``w2_scale``
    (E, H/128, I/128) float32, pass them by name or in AITER's positions; the activations are quantized per token
    and 128-wide group inside the op. ``quant_type`` None (read off w1) or what w1 runs: ``QuantType.No``,
    ``QuantType.per_1x128`` (``per_128x128``). ``doweight_stage1=True``, ``a1_scale``/``a2_scale``,
    ``block_size_M``, ``num_local_tokens``, ``hidden_pad``/``intermediate_pad``, ``bias1``/``bias2`` and a
    ``dtype`` other than hidden_states' raise naming the argument; ``moe_sorting_dispatch_policy`` and ``splitk``
    have no effect. Decided once per key (the FMOE table, vLLM/SGLang JSON files, the default); an expert id
    outside [0, E) (or the mask) raises naming topk_ids (checked per call outside CUDA-graph capture: a host
    sync). ``config`` (a Solution) bypasses the dispatch, for the tuner. ``torch.compile`` traces the
    ``aiter_gemm::fused_moe`` custom op.""")
fused_moe_python = FUSED_MOE_ENTRY.python
fused_moe = FUSED_MOE_ENTRY.entry
#: The op's per-call key of a call's arguments (:attr:`aiter_gemm.op_entry.OpEntry.key`).
call_key = FUSED_MOE_ENTRY.key


def get_fused_moe_config(token: int, model_dim: int, inter_dim: int, expert: int, topk: int,
                         act_type: str = "silu", dtype: torch.dtype | str = torch.bfloat16,
                         q_dtype_a: torch.dtype | str | None = None, q_dtype_w: torch.dtype | str | None = None,
                         q_type: str | None = None, use_g1u1: bool = True, doweight_stage1: bool = False,
                         on_gpu: bool | None = None) -> dict[str, Any]:
    """The config :func:`fused_moe` runs this problem with on this process's GPU (or CPU), as a dict: the row's
    columns (or the JSON bucket's / default's kernels), ``libtype``, ``kernelName`` (both stages, :func:`~aiter_gemm.
    backends.fused_moe.pair_name`), ``matched`` (exact/padded/json/default) and ``source``. The key as AITER's fmoe
    table spells it (``act_type`` also as ``silu``/``gelu``; ``q_dtype_w`` defaults to ``dtype``, ``q_dtype_a`` to
    ``q_dtype_w``, ``q_type`` to FP8 block scales for fp8 weights, AITER's ``per_128x128`` read as ``per_1x128``)."""
    dt = parse_dtype(dtype)
    qw = parse_dtype(q_dtype_w) if q_dtype_w is not None else dt
    qa = parse_dtype(q_dtype_a) if q_dtype_a is not None else qw
    qt = q_type if q_type is not None else QUANT_BLOCK if qw == FP8 else QUANT_NONE
    qt = QUANT_ALIASES.get(qt, qt)
    act = _spelled(act_type, "ActivationType")
    p = MoeProblem(int(token), int(model_dim), int(inter_dim), int(expert), int(topk),
                   ACT_TYPES.get(ACTIVATION_NAMES.get(act, act), act), dt, qa, qw, qt, bool(use_g1u1),
                   bool(doweight_stage1))
    on_gpu = torch.cuda.is_available() if on_gpu is None else on_gpu
    return _DISPATCHER.decide(p, on_gpu).as_config()
