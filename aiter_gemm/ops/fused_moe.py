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
lookup, plus the expert-id check (a host sync) outside CUDA-graph capture.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import torch

from aiter_gemm import cudagraph, moe_json
from aiter_gemm.backends.base import ACT_TYPES, QUANT_BLOCK, QUANT_NONE, MoeProblem, Solution
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
from aiter_gemm.op_entry import BYPASS, OPTIONAL_TENSOR, VALUE, Arg, Decided, OpEntry
from aiter_gemm.opspec import OpSpec
from aiter_gemm.registry import register_op
from aiter_gemm.testbed import Inputs, cloned_sets, free_memory
from aiter_gemm.timing import rotating_sets

__all__ = [
    "AITER_LIBTYPE", "FMOE_UNTUNED_COLUMNS", "FUSED_MOE", "FUSED_MOE_ENTRY", "KIND", "ROUTINGS", "UNTUNED_FILE",
    "call_key", "call_runner", "check_expert_ids", "fused_moe", "get_fused_moe_config", "make_inputs", "problem_of",
    "routing",
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


def problem_of(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weight: torch.Tensor,
               topk_ids: torch.Tensor, w1_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
               activation: str = "silu") -> MoeProblem:
    """The problem of a call, its inputs checked (:func:`~aiter_gemm.kernels.fused_moe.check_moe_inputs`:
    ValueError naming the tensor with its shape, dtype, stride and device; expert ids outside [0, E) too, outside
    CUDA-graph capture)."""
    fp8 = check_moe_inputs(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale, activation)
    T, H = hidden_states.shape
    q_dtype = FP8 if fp8 else hidden_states.dtype
    return MoeProblem(T, H, w2.shape[2], w1.shape[0], topk_ids.shape[1], ACT_TYPES[activation], hidden_states.dtype,
                      q_dtype, q_dtype, QUANT_BLOCK if fp8 else QUANT_NONE)


def _checked(runner, experts: int):
    """``runner`` with the expert-id check first, outside CUDA-graph capture (:mod:`aiter_gemm.cudagraph`)."""
    capturing = cudagraph.probe()

    def run(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale=None, w2_scale=None):
        if not capturing():
            check_expert_ids(topk_ids, experts)
        return runner(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale)

    return run


def _empty(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale=None, w2_scale=None):
    """No token, or no expert per token: zeros (T, H)."""
    return hidden_states.new_zeros(hidden_states.shape)


def _decide(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale=None, w2_scale=None, activation="silu",
            config=None) -> Decided:
    """Validate a key's first call and decide it: the decision's runner behind the expert-id check, cached in
    Python and served by the C++ entry too."""
    p = problem_of(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale, activation)
    if p.token == 0 or p.topk == 0:
        return Decided(_empty, _empty)
    run = _checked(_DISPATCHER.decide(p, hidden_states.is_cuda).call_runner, p.expert)
    return Decided(run, run)


def _with_config(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale=None, w2_scale=None, activation="silu",
                 config=None) -> torch.Tensor:
    """A call with ``config`` (a :class:`~aiter_gemm.backends.base.Solution`): that solution, bypassing the
    dispatch (the tuner); ValueError when it cannot run."""
    p = problem_of(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale, activation)
    if p.token == 0 or p.topk == 0:
        return _empty(hidden_states, w1, w2, topk_weight, topk_ids)
    if not isinstance(config, Solution):
        raise TypeError(f"fused_moe: config must be a Solution (libtype, kernelName), got {type(config).__name__}")
    runner, why = _DISPATCHER.runner_for(p, config, _DISPATCHER.device(hidden_states.is_cuda))
    if runner is None:
        raise ValueError(f"fused_moe: {config.libtype} {config.kernelName!r} cannot run {p.label()} on "
                         f"{hidden_states.device}: {why}")
    return _checked(runner, p.expert)(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale)


# ---- the custom op (torch.compile / export) ------------------------------------------------------------------
@torch.library.custom_op("aiter_gemm::fused_moe", mutates_args=())
def _fused_moe_op(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weight: torch.Tensor,
                  topk_ids: torch.Tensor, w1_scale: Optional[torch.Tensor] = None,
                  w2_scale: Optional[torch.Tensor] = None, activation: str = "silu") -> torch.Tensor:
    return fused_moe(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale, activation)  # not compiling


@_fused_moe_op.register_fake
def _fused_moe_fake(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale=None, w2_scale=None, activation="silu"):
    return hidden_states.new_empty(hidden_states.shape)


def _compiled(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale=None, w2_scale=None, activation="silu",
              config=None) -> torch.Tensor:
    """What ``torch.compile`` traces: the custom op (a ``config`` is the tuner's, not a compiled model's)."""
    if config is not None:
        raise ValueError("fused_moe: config= bypasses the dispatch eagerly; it is not traced by torch.compile")
    return torch.ops.aiter_gemm.fused_moe(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale, activation)


#: The op's eager entry (:mod:`aiter_gemm.op_entry`): the key holds what :func:`problem_of` checks but the expert
#: ids (checked per call): the seven tensors' shapes, dtypes and devices, the activation, and the strides of the
#: five whose layout it checks (hidden_states' rows contiguous, the other four contiguous), so a call of another
#: layout is checked as a first call; the C++ entry serves every decision. Calls with ``config`` bypass the cache.
FUSED_MOE_ENTRY = OpEntry(
    "fused_moe",
    (*(Arg(name, strides=True) for name in ("hidden_states", "w1", "w2", "topk_weight", "topk_ids")),
     Arg("w1_scale", OPTIONAL_TENSOR, None), Arg("w2_scale", OPTIONAL_TENSOR, None),
     Arg("activation", VALUE, "silu", choices=tuple(ACT_TYPES)), Arg("config", BYPASS, None)),
    _DISPATCHER.cache, _decide, module=__name__, runner_args=7, compiled=_compiled, bypass=_with_config,
    doc="""AITER's ``fused_moe``: out (T, H) = sum over each token's k experts of ``topk_weight`` x
    ``w2[e] @ (act(gate) * up)``, with ``hidden_states`` (T, H) bf16/fp16, ``w1`` (E, 2I, H) gate rows then up
    rows, ``w2`` (E, H, I), ``topk_weight`` (T, k) float32 (or hidden_states' dtype), ``topk_ids`` (T, k)
    int32/int64, ``activation`` ``silu`` or ``gelu``. FP8 experts: ``w1``/``w2`` float8_e4m3fn with (128, 128)
    block scales ``w1_scale`` (E, 2I/128, H/128) and ``w2_scale`` (E, H/128, I/128) float32; the activations are
    quantized per token and 128-wide group inside the op. Decided once per key (the FMOE table, vLLM/SGLang JSON
    files, the default); an expert id outside [0, E) raises naming topk_ids (checked per call outside CUDA-graph
    capture: a host sync). ``config`` (a Solution) bypasses the dispatch, for the tuner. ``torch.compile`` traces
    the ``aiter_gemm::fused_moe`` custom op.""")
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
    qt = QUANT_BLOCK if qt == "QuantType.per_128x128" else qt
    p = MoeProblem(int(token), int(model_dim), int(inter_dim), int(expert), int(topk),
                   ACT_TYPES.get(act_type, act_type), dt, qa, qw, qt, bool(use_g1u1), bool(doweight_stage1))
    on_gpu = torch.cuda.is_available() if on_gpu is None else on_gpu
    return _DISPATCHER.decide(p, on_gpu).as_config()
