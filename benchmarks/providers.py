"""Providers: the things a benchmark times on a shape, registered per op (``gemm_a16w16``, ``gemm_a8w8_blockscale``,
``fused_moe``).

A provider spec is ``name`` or ``name:arg`` (``skinny:gemv_BN1_BK2048_SK1_W4_S1_EF``, ``cublaslt:v130100:<hex>``). Each
provider builds, once per shape, a call ``call(i)`` that runs it on the op's rotating input set ``i`` (the sets the
tuner times on: :attr:`aiter_gemm.opspec.OpSpec.make_inputs`), or raises :class:`Unavailable` saying why it cannot run
that shape here; an ``arg`` no shape can use (an argument to a provider taking none, a ``configs:`` folder without the
op's table) is refused by :func:`resolve`, before anything runs. Registered for both ops: ``flinear`` (bf16
``F.linear``; for the block-scale op, of the dequantized operands: what FP8 must beat), ``dispatch`` (the op's public
function: the whole dispatch path), ``default`` (the runtime's heuristic default, tuned tables ignored),
``baseline:<DIR>`` / ``configs:<DIR>`` (the op as another copy of ``configs/`` decides it, without / with TileLang) and
one provider per backend of the op (``torch``, ``cublaslt``, ``triton``, ``skinny``; the block-scale op's ``triton`` and
``torch``) taking a kernelName as ``arg`` (without one: the backend's own default for the shape). Besides:
``maxautotune`` (``torch.compile(mode="max-autotune-no-cudagraphs")`` of ``F.linear``, GPU only), ``torch_blockscale``
(the plain per-call ``F.scaled_mm`` with block scales, torch's block-scaled matmul as a user calls it), ``deepgemm``
(DeepGEMM's ``fp8_gemm_nt`` as a user calls it; it takes the name of the op's ``deepgemm`` backend, which runs
through ``dispatch`` where a tuned row names it) and, for both
ops, ``weight_read`` (a floor, not the op: reading the weight once; ``ratio`` against it is the fraction of that floor).
``fused_moe`` has ``dispatch``, ``default``, its backends (``triton:<kernelName1;kernelName2>``, ``torch:grouped_mm``,
``torch:loop``), ``grouped_mm`` (transformers' grouped_mm experts forward, the baseline of record), ``deepgemm``
(DeepGEMM's contiguous grouped FP8 GEMMs as a user writes MoE experts with them: :mod:`aiter_gemm.kernels.
fused_moe_deepgemm`; the op's ``deepgemm`` backend runs through ``dispatch`` where a tuned row names it) and
``weight_read`` (the bytes of the experts the set's tokens reach, read once).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import aiter_gemm
from aiter_gemm.backends.base import MoeProblem, Problem, Solution
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.fileio import file_problem
from aiter_gemm.registry import get_backend, known_backends, op_spec

A16W16 = "gemm_a16w16"
BLOCKSCALE = "gemm_a8w8_blockscale"
MOE = "fused_moe"
#: Benchmark name -> op it times.
BENCH_OPS = {"bf16": A16W16, "fp8": BLOCKSCALE, "moe": MOE}

Call = Callable[[int], object]
#: The shipped tuned CSV of each op, by file name (``baseline:<DIR>`` reads it from DIR).
SHIPPED_FILE_NAMES = {A16W16: "bf16_tuned_gemm.csv", BLOCKSCALE: "a8w8_blockscale_tuned_gemm.csv"}


class Unavailable(Exception):
    """A provider cannot run this shape here; the message says why (it goes to the row's ``note``)."""


@dataclass
class Context:
    """What a provider builds from: the shape, its rotating input sets, where it runs and how it is timed."""

    problem: Problem
    op: str
    sets: list[tuple]
    ident: DeviceIdentity
    device: torch.device
    mode: str  # "graph", "eager" or "host"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Provider:
    """One registered provider: ``build(ctx, arg)`` returns ``call(i)`` or raises :class:`Unavailable`."""

    name: str
    op: str
    doc: str
    build: Callable[[Context, str], Call]
    #: Times a floor, not the op (``weight_read``): its output is not a GEMM's and is not compared.
    floor: bool = False
    #: ``(op, arg) -> why no shape can use arg`` (None: it may), asked by :func:`resolve`; None: any arg.
    check: Callable[[str, str], str | None] | None = None
    #: The largest ||out - ref|| / ||ref|| its output may have on a problem (None: :func:`op_tolerance`).
    max_rel_err: Callable[[Problem], float] | None = None


_REGISTRY: dict[tuple[str, str], Provider] = {}


def register_provider(provider: Provider) -> None:
    """Add (or replace) ``provider`` for its op."""
    _REGISTRY[(provider.op, provider.name)] = provider


def providers_for(op: str) -> list[Provider]:
    """Every provider of ``op``, the op's backends included, by name."""
    _register_backends(op)
    return sorted((p for (o, _), p in _REGISTRY.items() if o == op), key=lambda p: p.name)


def resolve(op: str, spec: str) -> tuple[Provider, str]:
    """(provider, arg) of a spec ``name[:arg]``; ValueError naming the known providers if there is none, or saying
    why its ``arg`` cannot be used (:attr:`Provider.check`)."""
    name, _, arg = spec.partition(":")
    _register_backends(op)
    provider = _REGISTRY.get((op, name))
    if provider is None:
        known = ", ".join(p.name for p in providers_for(op))
        raise ValueError(f"no provider {name!r} for {op} (known: {known})")
    why = provider.check(op, arg) if provider.check is not None else None
    if why is not None:
        raise ValueError(f"provider {spec!r}: {why}")
    return provider, arg


def _no_argument(op: str, arg: str) -> str | None:
    return f"takes no argument (got {arg!r})" if arg else None


# ---- shared by both ops ----------------------------------------------------------------------------------------------
def _dispatch(ctx: Context, arg: str) -> Call:
    sets, p = ctx.sets, ctx.problem
    if ctx.op == A16W16:
        # As model code calls it: no otype where it is the input's (the C++ eager entry serves only such calls).
        otype = None if p.otype == p.dtype else p.otype
        return lambda i: aiter_gemm.gemm_a16w16(sets[i][0], sets[i][1], sets[i][2], otype, sets[i][3], sets[i][4])
    if ctx.op == MOE:  # as model code calls it, in AITER's order: the problem's activation, scales for FP8 experts
        act = p.activation

        def moe(i: int):
            x, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale = sets[i]
            return aiter_gemm.fused_moe(x, w1, w2, topk_weight, topk_ids, None, act, None, False, w1_scale, w2_scale)

        return moe
    from aiter_gemm.ops.a8w8_blockscale import gemm_a8w8_blockscale

    return lambda i: gemm_a8w8_blockscale(*sets[i], p.otype)


def _default(ctx: Context, arg: str) -> Call:
    """The runtime's heuristic default for the shape (tuned rows and JSON ignored), as eager calls see it in eager
    timing: what a shape without a row runs."""
    dec = aiter_gemm.get_dispatcher(ctx.op).default_decision(ctx.problem, ctx.ident, eager=ctx.mode != "graph")
    return _runner_call(ctx, dec.runner)


def configs_dispatcher(op: str, folder: str | Path, name: str, tilelang: bool) -> Any:
    """A dispatcher of ``op`` deciding from a copy of ``configs/`` in ``folder`` (its tuned CSV and ``triton/`` JSON
    files) instead of the runtime's tables; ``tilelang`` unavailable on it unless ``tilelang``."""
    from aiter_gemm.backends.base import UnavailableBackend
    from aiter_gemm.dispatch import Dispatcher
    from aiter_gemm.settings import CONFIG_KINDS, load_settings

    folder = Path(folder)
    spec = op_spec(op)
    why = configs_error(op, str(folder), name)
    if why is not None:
        raise Unavailable(f"{name}: {why}")
    shipped = folder / SHIPPED_FILE_NAMES[op]
    env = {CONFIG_KINDS[spec.kind][0]: str(shipped), "AITER_GEMM_TRITON_CONFIGS": str(folder / "triton")}

    class Copy(Dispatcher):
        def backend(self, libtype: str):
            if libtype == "tilelang" and not tilelang:
                return UnavailableBackend(libtype, f"not in the {name}")
            return super().backend(libtype)

    return Copy(spec, load_settings(env))


def configs_error(op: str, folder: str, name: str) -> str | None:
    """Why ``folder`` is no ``configs/`` copy a ``baseline:`` / ``configs:`` provider can decide from (no folder
    given, or no op's tuned CSV in it), or None."""
    if not folder:
        return f"needs the folder of a configs/ copy ({name}:<DIR>)"
    shipped = Path(folder) / SHIPPED_FILE_NAMES[op]
    problem = file_problem(shipped)
    return None if problem is None else f"{shipped} {problem}"


def _from_configs(ctx: Context, arg: str, name: str, tilelang: bool) -> Call:
    """The op as the ``configs/`` copy in the folder ``arg`` decides it (:func:`configs_dispatcher`). Graph timing runs
    the decision's runner, as ``dispatch`` does inside a captured graph."""
    dec = configs_dispatcher(ctx.op, arg, name, tilelang).decide(ctx.problem, ctx.device.type == "cuda")
    runner = dec.call_runner if ctx.mode != "graph" else dec.runner
    return _runner_call(ctx, runner)


def _runner_call(ctx: Context, runner: Callable) -> Call:
    call, sets, p = op_spec(ctx.op).call_runner, ctx.sets, ctx.problem
    return lambda i: call(runner, sets[i], p)


def _backend_provider(op: str, libtype: str) -> Provider:
    def build(ctx: Context, arg: str) -> Call:
        backend = get_backend(libtype, op_spec(op).backends)
        why = backend.unavailable_reason()
        if why is not None:
            raise Unavailable(why)
        aiter_gemm.get_dispatcher(op).backend(libtype)  # configured with the runtime's settings (JSON folders)
        sol = _solution(backend, ctx, arg)
        why = backend.why_not(ctx.problem, sol, ctx.ident)
        runner = backend.prepare(ctx.problem, sol, ctx.ident) if why is None else None
        if runner is None:
            raise Unavailable(why or f"{libtype} prepare() returned None")
        return _runner_call(ctx, runner)

    doc = f"backend {libtype!r} of {op}: ``{libtype}:<kernelName>``, or its own default for the shape"
    return Provider(libtype, op, doc, build)


def _solution(backend, ctx: Context, arg: str) -> Solution:
    """The solution ``arg`` names (a kernelName), else the backend's default claim, else its unnamed solution
    (cuBLASLt's heuristic #0, Triton's JSON or built-in config, skinny's heuristic tile), else its first candidate."""
    if arg:
        if ctx.op == BLOCKSCALE:
            from gradlib.blockscale import candidate_solution

            return candidate_solution(arg)
        return Solution(backend.name, -1, 0, arg)
    sol = backend.default_for(ctx.problem, ctx.ident)
    if sol is not None:
        return sol
    plain = Solution(backend.name, -1, 0, "")
    if backend.why_not(ctx.problem, plain, ctx.ident) is None:
        return plain
    first = next(iter(backend.quick_candidates(ctx.problem, ctx.ident)), None)
    if first is None:
        raise Unavailable(f"{backend.name} has no solution for this shape")
    return first


def _register_backends(op: str) -> None:
    for libtype in known_backends(op_spec(op).backends):
        if libtype != "launcher" and (op, libtype) not in _REGISTRY:
            register_provider(_backend_provider(op, libtype))


def _weight_read(ctx: Context, arg: str) -> Call:
    """Streaming the shape's weight once, no math (:mod:`benchmarks.read_floor`): the attainable floor of a
    memory-bound call at this weight size."""
    from benchmarks.read_floor import bind, folds

    out = folds(ctx.device)  # one output for every input set
    try:
        reads = [bind(s[1], out) for s in ctx.sets]  # both ops' input sets hold the weight second
    except ValueError as exc:
        raise Unavailable(str(exc)) from None
    return lambda i: reads[i]()


# ---- fused_moe -----------------------------------------------------------------------------------------------------
def _bf16_experts(ctx: Context) -> list[tuple]:
    """Each input set with bf16 experts: FP8 ones dequantized once (not timed), as a bf16 model holds them."""
    from aiter_gemm.kernels.a8w8_blockscale import dequantize_weight_blockscale

    if not ctx.problem.fp8:
        return ctx.sets

    def dequant(w, scale):
        return torch.stack([dequantize_weight_blockscale(w[e], scale[e]).to(torch.bfloat16) for e in range(len(w))])

    return [(x, dequant(w1, s1), dequant(w2, s2), tw, ti, None, None) for x, w1, w2, tw, ti, s1, s2 in ctx.sets]


def _grouped_mm(ctx: Context, arg: str) -> Call:
    """transformers' experts forward ``grouped_mm`` (``transformers.integrations.moe.grouped_mm_experts_forward``, what
    ``experts_implementation="grouped_mm"`` runs) on a Qwen3-MoE experts module holding the set's experts (FP8 ones
    dequantized to bf16: the bf16 path FP8 must beat), routing weights in the hidden dtype and int64 ids as the
    model's router gives them."""
    try:
        from transformers import Qwen3MoeConfig
        from transformers.integrations import moe as hf_moe
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts
    except ImportError as exc:
        raise Unavailable(f"transformers has no grouped_mm experts here: {exc}") from None
    if "grouped_mm" not in hf_moe.ALL_EXPERTS_FUNCTIONS:
        raise Unavailable("transformers' ExpertsInterface has no 'grouped_mm'")
    p = ctx.problem
    cfg = Qwen3MoeConfig(num_experts=p.expert, hidden_size=p.model_dim, moe_intermediate_size=p.inter_dim,
                         num_experts_per_tok=p.topk, hidden_act="silu" if p.activation == "silu" else "gelu")
    cfg._experts_implementation = "grouped_mm"
    calls = []
    for x, w1, w2, tw, ti, _, _ in _bf16_experts(ctx):
        with torch.device("meta"):  # no (E, 2I, H) float32 allocation: the set's experts are put in
            experts = Qwen3MoeExperts(cfg)
        experts.gate_up_proj = torch.nn.Parameter(w1, requires_grad=False)
        experts.down_proj = torch.nn.Parameter(w2, requires_grad=False)
        calls.append(partial(experts, x, ti.long(), tw.to(x.dtype)))
    return lambda i: calls[i]()


def _moe_weight_read(ctx: Context, arg: str) -> Call:
    """Streaming the bytes of the experts the set's tokens reach (their w1 and w2 rows, and block scales), once, as
    one contiguous read (:mod:`benchmarks.read_floor`): the floor of a memory-bound MoE call at this T."""
    from benchmarks.read_floor import bind, folds

    out = folds(ctx.device)
    reads = [bind(torch.empty(-(-reached_bytes(s) // 4), dtype=torch.int32, device=ctx.device), out)
             for s in ctx.sets]
    return lambda i: reads[i]()


def _moe_deepgemm(ctx: Context, arg: str) -> Call:
    """DeepGEMM's contiguous grouped FP8 GEMMs as a user writes MoE experts with them (:func:`aiter_gemm.kernels.
    fused_moe_deepgemm.fused_moe_deepgemm`, ``deep_gemm`` looked up per call; the op's ``deepgemm`` backend runs
    through ``dispatch``): FP8 sets only, deep_gemm installed, sm_90."""
    from aiter_gemm.kernels import fused_moe_deepgemm as impl

    why = impl.shape_error(ctx.problem) or impl.unavailable_reason(ctx.device)
    if why is not None:
        raise Unavailable(why)
    sets, act = ctx.sets, ctx.problem.activation
    return lambda i: impl.fused_moe_deepgemm(*sets[i], activation=act)


def _moe_deepgemm_tolerance(p: Problem) -> float:
    """DeepGEMM's grouped GEMM writes bf16 only, so GEMM1's output is rounded to bf16 before the activation (the
    reference keeps float32): :data:`aiter_gemm.kernels.fused_moe_deepgemm.MAX_REL_ERR`, more than
    :data:`MAX_REL_ERR` leaves room for."""
    from aiter_gemm.kernels import fused_moe_deepgemm

    return fused_moe_deepgemm.MAX_REL_ERR


def reached_bytes(inputs: tuple) -> int:
    """Bytes of the experts a fused-MoE input set's tokens reach: their w1 and w2 (and block scales), each once."""
    _, w1, w2, _, topk_ids, s1, s2 = inputs
    per_expert = sum(t[0].numel() * t.element_size() for t in (w1, w2, s1, s2) if t is not None)
    return int(torch.unique(topk_ids).numel()) * per_expert


def _grouped_mm_tolerance(p: Problem) -> float:
    """bf16 experts match the reference as the op does; dequantized FP8 experts on unquantized activations differ
    from the FP8 reference (which quantizes both GEMMs' activations) by that quantization, ~4% on unit inputs."""
    return 0.1 if isinstance(p, MoeProblem) and p.fp8 else MAX_REL_ERR


def op_tolerance(p: Problem) -> float:
    """The bound of a provider without its own ``max_rel_err`` (the op's paths): :data:`MAX_REL_ERR`, and for FP8
    experts one fp8 rounding more (:data:`~aiter_gemm.kernels.blockscale_format.FP8_ROUNDING`): their GEMM2 may take
    the intermediate quantized, as the reference does, or not (``FUSED``)."""
    from aiter_gemm.kernels.blockscale_format import FP8_ROUNDING

    return MAX_REL_ERR + FP8_ROUNDING if isinstance(p, MoeProblem) and p.fp8 else MAX_REL_ERR


#: The benchmark's bound on ||out - ref|| / ||ref|| against the float32 reference (bf16 rounding is ~2e-3).
MAX_REL_ERR = 2e-2


# ---- gemm_a16w16 -----------------------------------------------------------------------------------------------------
def _flinear(ctx: Context, arg: str) -> Call:
    sets, p = ctx.sets, ctx.problem
    if ctx.op == BLOCKSCALE:  # bf16 F.linear of the dequantized operands: the baseline FP8 must beat
        from aiter_gemm.kernels.a8w8_blockscale import dequantize_blockscale

        bf = [tuple(t.to(torch.bfloat16) for t in dequantize_blockscale(*s)) for s in sets]
        return lambda i: F.linear(bf[i][0], bf[i][1])
    if p.scaleAB or p.dtype != p.otype:
        raise Unavailable("F.linear runs same-dtype GEMMs without scales")
    return lambda i: F.linear(sets[i][0], sets[i][1], sets[i][2])


def _maxautotune(ctx: Context, arg: str) -> Call:
    """``torch.compile(mode="max-autotune-no-cudagraphs")`` of an ``F.linear`` for this shape; each compile
    autotunes for tens of seconds, so ``options['compile_budget_s']`` (from the run's start) stops compiling."""
    if ctx.device.type != "cuda":
        raise Unavailable("max-autotune is timed on a GPU only")
    opts = ctx.options
    if time.monotonic() - opts.get("started", time.monotonic()) > opts.get("compile_budget_s", float("inf")):
        raise Unavailable(f"compile budget ({opts['compile_budget_s']} s) spent")
    _flinear(ctx, arg)  # the same shapes as F.linear, or Unavailable
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w, b: F.linear(x, w, b), mode="max-autotune-no-cudagraphs", dynamic=False)
    sets = ctx.sets
    return lambda i: compiled(sets[i][0], sets[i][1], sets[i][2])


# ---- gemm_a8w8_blockscale --------------------------------------------------------------------------------------------
def _library_call(module: str, function: str) -> Callable[[Context, str], Call]:
    """A block-scale library called as a user calls it: ``module``'s ``function`` per call, its layouts made per call
    (``torch_blockscale``: torch's ``F.scaled_mm``; ``deepgemm``: DeepGEMM's ``fp8_gemm_nt``, which transforms
    x_scale itself where it needs to); Unavailable with the module's reason where it cannot run the shape."""
    def build(ctx: Context, arg: str) -> Call:
        impl = importlib.import_module(module)
        p = ctx.problem
        why = impl.unavailable_reason(ctx.device) or impl.shape_error(p.M, p.N, p.K, p.otype)
        if why is not None:
            raise Unavailable(why)
        fn, sets = getattr(impl, function), ctx.sets
        return lambda i: fn(*sets[i], p.otype)
    return build


for _op in (A16W16, BLOCKSCALE, MOE):
    register_provider(Provider("dispatch", _op, f"aiter_gemm.{_op}: the whole dispatch path", _dispatch,
                               check=_no_argument))
    register_provider(Provider("default", _op, "the runtime's heuristic default, tuned tables ignored", _default,
                               check=_no_argument))
register_provider(Provider("grouped_mm", MOE, "transformers' grouped_mm experts forward (FP8 experts dequantized to "
                           "bf16): the baseline of record", _grouped_mm, check=_no_argument,
                           max_rel_err=_grouped_mm_tolerance))
register_provider(Provider("deepgemm", MOE, "DeepGEMM's contiguous grouped FP8 GEMMs with torch routing, as a user "
                           "writes MoE experts (FP8 sets; deep_gemm installed, sm_90)", _moe_deepgemm,
                           check=_no_argument, max_rel_err=_moe_deepgemm_tolerance))
register_provider(Provider("weight_read", MOE, "streaming the reached experts' bytes once, no math: the memory-bound "
                           "floor", _moe_weight_read, floor=True, check=_no_argument))
for _op in (A16W16, BLOCKSCALE):
    register_provider(Provider("flinear", _op, "bf16 F.linear (block-scale op: of the dequantized operands)", _flinear,
                               check=_no_argument))
    # baseline: an earlier commit's configs/ before the TileLang backend; configs: any copy (the rows a device ran
    # before its own were added).
    for _name, _tilelang, _doc in (("baseline", False, "an earlier configs/ copy decides it, without TileLang"),
                                   ("configs", True, "another configs/ copy decides it, every backend")):
        register_provider(Provider(_name, _op, f"the op as {_doc} ({_name}:<DIR>)",
                                   partial(_from_configs, name=_name, tilelang=_tilelang),
                                   check=partial(configs_error, name=_name)))
    register_provider(Provider("weight_read", _op, "streaming the weight's bytes once, no math: the memory-bound "
                               "floor", _weight_read, floor=True, check=_no_argument))
register_provider(Provider("maxautotune", A16W16, "torch.compile max-autotune-no-cudagraphs of F.linear (GPU)",
                           _maxautotune, check=_no_argument))
register_provider(Provider("torch_blockscale", BLOCKSCALE, "plain per-call F.scaled_mm with block scales",
                           _library_call("aiter_gemm.kernels.a8w8_blockscale_torch", "gemm_a8w8_blockscale_torch"),
                           check=_no_argument))
# The user's call of DeepGEMM, under the backend's name: the op's deepgemm backend runs through ``dispatch``.
register_provider(Provider("deepgemm", BLOCKSCALE,
                           "DeepGEMM's fp8_gemm_nt as a user calls it, per call (deep_gemm installed, sm_90)",
                           _library_call("aiter_gemm.kernels.a8w8_blockscale_deepgemm",
                                         "gemm_a8w8_blockscale_deepgemm"),
                           check=_no_argument))
