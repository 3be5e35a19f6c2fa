"""The ``gemm_a16w16`` op (AITER's ``tuned_gemm``): its :class:`~aiter_gemm.opspec.OpSpec`, the public entry points
``gemm_a16w16`` / ``TunedGemm.mm`` / ``get_GEMM_A16W16_config``, the ``aiter_gemm::gemm_a16w16`` custom op, and the
process-wide functions every op shares (``reload_configs``, ``get_config_table``, ``current_device_identity``).

Eager calls go straight to the dispatcher's per-call cache (a ``torch.library.custom_op`` costs ~16 us per eager call
on CPU, more than a decode GEMM on an H100); only code being traced by ``torch.compile`` / ``torch.export`` goes
through the op, whose fake implementation lets ``fullgraph=True`` compile a model that calls it, and eager calls that
want a gradient where the decision is not plain ``F.linear`` (the op's registered backward gives it).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Optional

import torch

from aiter_gemm import jsonconfigs, op_entry
from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.backends.torch import run_plain
from aiter_gemm.configs import BF16_UNTUNED_COLUMNS, ConfigTable, TunedRow
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.dispatch import Dispatcher, dispatcher_for, reload_all
from aiter_gemm.dtypes import FP8_DTYPES, OUT_DTYPES, parse_dtype
from aiter_gemm.jsonconfigs import JsonLevel
from aiter_gemm.op_entry import OPTIONAL_TENSOR, VALUE, Arg, Decided, OpEntry
from aiter_gemm.opspec import OpSpec
from aiter_gemm.registry import A16W16, op_spec, register_op
from aiter_gemm.testbed import Inputs, cloned_sets, free_memory
from aiter_gemm.timing import rotating_sets


def row_key(p: GemmProblem) -> tuple:
    """The GEMM_BF16 table key of a problem (the untuned columns, typed as the table parses them)."""
    return (p.M, p.N, p.K, p.bias, p.dtype, p.otype, p.scaleAB, p.bpreshuffle)


def row_solution(row: TunedRow) -> Solution:
    """The solution a GEMM_BF16 row names (``libtype``, ``solidx``, ``splitK``, ``kernelName``)."""
    v = row.values
    return Solution(v["libtype"], v["solidx"], v["splitK"], v["kernelName"])


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
    return Inputs((), cloned_sets((a, b, bias, sa, sb), rotating_sets(per_set, cache, free_memory(device))), ref)


def call_runner(runner, inputs: tuple, p: GemmProblem) -> torch.Tensor:
    """``runner`` on one set of :func:`make_inputs`."""
    a, b, bias, sa, sb = inputs
    return runner(a, b, bias, p.otype, sa, sb, None)


GEMM_A16W16 = register_op(OpSpec(
    name="gemm_a16w16", kind="GEMM_BF16", backends=A16W16, row_key=row_key, row_solution=row_solution,
    untuned_columns=BF16_UNTUNED_COLUMNS, capture_path=lambda s: s.untuned_file,
    key_problem=lambda key: GemmProblem(*key), make_inputs=make_inputs, call_runner=call_runner,
    # AITER's Triton JSON files (entries the triton backend parses and fits) fill in the triton rows that name no
    # kernel (kernelName empty or "auto").
    json=JsonLevel("GEMM-A16W16", "triton", arch_file=True, fills="triton"),
))


def _config_dirs() -> tuple[Path, ...]:
    """The JSON folders of the process's settings: ``AITER_GEMM_TRITON_CONFIGS`` entries, then ``configs/triton``."""
    return tuple(Path(p) for p in _DISPATCHER.settings.triton_config_dirs)


def json_buckets(path: str | os.PathLike):
    """Every bucket of one ``GEMM-A16W16`` JSON file as (M bound or None, key, Triton config), smallest bound first
    (``any`` last); [] if absent; errors name file and key."""
    level = GEMM_A16W16.json
    return [(bound, key, sol and _triton_config(sol))
            for bound, key, sol in level.buckets_of(level.own, path, _DISPATCHER.backend, strict=True) or []]


def json_config(M: int, N: int, K: int, arch: str, config_dirs: Sequence[str | os.PathLike] | None = None):
    """The Triton config the JSON level gives (M, N, K) on ``arch`` (strict: errors name file and key), fitted to the
    shape (:func:`aiter_gemm.backends.triton.fitted`), or None."""
    sol = _json_solution(GemmProblem(M, N, K), arch, config_dirs)
    return None if sol is None else _triton_config(sol)


def select_config(problem: GemmProblem, solution: Solution, arch: str):
    """The Triton config a ``triton`` row runs: its kernelName, else the JSON level's, else the backend's built-in
    default: what a decision resolves, for callers holding a row's solution."""
    from aiter_gemm.backends import triton as triton_backend

    if solution.kernelName.strip() in ("", "auto"):
        solution = _json_solution(problem, arch) or solution
    return triton_backend.select_config(problem, solution)


def _json_solution(problem: GemmProblem, arch: str, config_dirs: Sequence[str | os.PathLike] | None = None
                   ) -> Solution | None:
    """The JSON level's hit for ``problem`` on ``arch`` (strict), in ``config_dirs`` or the settings' folders."""
    dirs = _config_dirs() if config_dirs is None else config_dirs
    hits = GEMM_A16W16.json.hits([dirs], DeviceIdentity(arch, 0, "cuda"), problem, _DISPATCHER.backend, strict=True)
    return next((sol for _files, _source, sol in hits), None)


def _triton_config(solution: Solution):
    """The Triton config a ``triton`` solution's kernelName names."""
    from aiter_gemm.kernels.gemm_a16w16 import GemmConfig

    return GemmConfig.from_name(solution.kernelName)


def clear_config_cache() -> None:
    """Forget parsed JSON files (``reload_configs()`` does it too, so edited files are read again)."""
    jsonconfigs.clear_cache()


_DISPATCHER = dispatcher_for(GEMM_A16W16)
_grad_enabled = torch.is_grad_enabled
_linear = torch.nn.functional.linear
#: The C++ eager extension (:data:`aiter_gemm.op_entry.EXT`), or None.
EAGER_EXT = op_entry.EXT


class CallEntry(NamedTuple):
    """What ``gemm_a16w16`` keeps per call key (:func:`call_key`) in the op's :class:`~aiter_gemm.dispatch.
    DecisionCache`: ``runner`` None means plain ``F.linear`` on A as given (no reshape, no extra frame);
    ``capturing`` (a :func:`aiter_gemm.cudagraph.probe`) is set where eager calls run plain ``F.linear`` and only
    capture runs ``runner``: outside capture they then skip the switch and the reshapes too."""

    runner: Any
    otype: torch.dtype
    shape2d: tuple[int, int] | None  # A's 2-D view, or None when A is 2-D
    out_shape: tuple[int, ...] | None
    capturing: Any


def c_servable(otype: torch.dtype | None, scaled: bool, shuffled: bool, entry: CallEntry) -> bool:
    """Whether the C++ entry may serve this key's eager calls: a call without otype, scales or a shuffled weight
    whose eager decision is plain ``F.linear`` (always, or outside capture): what ``at::linear`` does there."""
    return otype is None and not scaled and not shuffled and (entry.runner is None or entry.capturing is not None)


def _decide(A, B, bias=None, otype=None, scale_a=None, scale_b=None, scale_c=None) -> Decided:
    """Validate a call whose key is new (:func:`problem_of`), decide its problem: its :class:`CallEntry`, and
    ``F.linear`` for the C++ entry where :func:`c_servable`."""
    shuffled = getattr(B, "is_shuffled", False) is True
    problem = problem_of(A, B, bias, otype, scale_a, scale_b, scale_c, shuffled)
    dec = _DISPATCHER.decide(problem, A.is_cuda)
    flat = A.dim() == 2
    shape2d = None if flat else (problem.M, problem.K)
    plan = dec.eager_plan()
    runner, capturing = plan.eager, None
    if plan.probe is not None:
        if plan.eager is run_plain:
            runner, capturing = plan.graph, plan.probe
            if not capturing():  # warm the capture-time runner up now (compilation): capture must do no file I/O
                plan.graph(A if flat else A.reshape(shape2d), B, bias, problem.otype, scale_a, scale_b, scale_c)
        else:
            runner = dec.call_runner
    entry = CallEntry(None if runner is run_plain else runner, problem.otype, shape2d,
                      None if flat else (*A.shape[:-1], problem.N), capturing)
    scaled = scale_a is not None or scale_b is not None or scale_c is not None
    return Decided(entry, _linear if c_servable(otype, scaled, shuffled, entry) else None, capturing)


def run_linear_entry(entry: CallEntry, A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None,
                     otype: torch.dtype | None = None, scale_a: torch.Tensor | None = None,
                     scale_b: torch.Tensor | None = None, scale_c: torch.Tensor | None = None) -> torch.Tensor:
    """``gemm_a16w16(A, B, bias, ...)`` through its cache entry (the hot path of gemm_a16w16 and TunedLinear; the
    entry holds the output dtype ``otype`` gave). A plain decision is ``F.linear``, which autograd records; the other
    runners (Triton, skinny, ...) record nothing, so a call that wants a gradient of A, B or bias runs the custom op,
    whose backward is registered (its implementation calls back here with grad mode off)."""
    runner, out_dtype, shape2d, out_shape, capturing = entry
    if runner is None or (capturing is not None and not capturing()):
        return _linear(A, B, bias)
    if _grad_enabled() and (A.requires_grad or B.requires_grad or (bias is not None and bias.requires_grad)):
        return _gemm_a16w16_op(A, B, bias, None if out_dtype == A.dtype else out_dtype, scale_a, scale_b, scale_c)
    if shape2d is None:
        return runner(A, B, bias, out_dtype, scale_a, scale_b, scale_c)
    return runner(A.reshape(shape2d), B, bias, out_dtype, scale_a, scale_b, scale_c).reshape(out_shape)



def dtype_error(dtype: torch.dtype, otype: torch.dtype) -> str | None:
    """Why ``gemm_a16w16`` cannot take ``dtype`` inputs to an ``otype`` output, or None: inputs are floating (bf16,
    fp16, fp32, fp8), the output bf16, fp16, fp32 or the input dtype. The runtime and the tuner share the rule."""
    if not dtype.is_floating_point:
        return f"{dtype} inputs are not supported: expected a floating dtype (bf16, fp16, fp32, fp8)"
    if otype not in OUT_DTYPES and otype != dtype:
        return f"{otype} output is not supported (bf16, fp16, fp32 or the input dtype {dtype})"
    return None


def problem_of(A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None, otype: torch.dtype | None,
               scale_a: torch.Tensor | None, scale_b: torch.Tensor | None, scale_c: torch.Tensor | None = None,
               bpreshuffle: bool = False) -> GemmProblem:
    """Validate the operands of ``gemm_a16w16`` and return their :class:`GemmProblem` (errors name the argument,
    with the tensor's shape, dtype and device). Every property checked here is part of the eager cache key."""
    for name, t in (("A", A), ("B", B), ("bias", bias), ("scale_a", scale_a), ("scale_b", scale_b),
                    ("scale_c", scale_c)):
        required = name in ("A", "B")
        if not isinstance(t, torch.Tensor) and (t is not None or required):
            raise TypeError(f"gemm_a16w16: {name} must be a torch.Tensor{'' if required else ' or None'}, got "
                            f"{type(t).__name__}")
    if A.dim() < 1 or B.dim() != 2:
        raise ValueError(f"gemm_a16w16: A must be (..., K) and B (N, K); got A {tuple(A.shape)} {A.dtype}, "
                         f"B {tuple(B.shape)} {B.dtype}")
    K = A.shape[-1]
    N = B.shape[0]
    if B.shape[1] != K:
        raise ValueError(f"gemm_a16w16: K mismatch: A {tuple(A.shape)} {A.dtype} has K={K} but B {tuple(B.shape)} "
                         f"{B.dtype} has K={B.shape[1]} (B is (N, K), nn.Linear weight layout)")
    if A.dtype != B.dtype:
        raise ValueError(f"gemm_a16w16: A {tuple(A.shape)} is {A.dtype} but B {tuple(B.shape)} is {B.dtype}; "
                         "both operands must have one dtype")
    if A.device != B.device:
        raise ValueError(f"gemm_a16w16: A is on {A.device} but B {tuple(B.shape)} is on {B.device}")
    if otype is not None and not isinstance(otype, torch.dtype):
        raise TypeError(f"gemm_a16w16: otype must be a torch.dtype or None, got {otype!r}")
    out = otype or A.dtype
    why = dtype_error(A.dtype, out)
    if why is not None:
        raise ValueError(f"gemm_a16w16: A {tuple(A.shape)} {A.dtype}, otype {otype}: {why}")
    if bias is not None:
        if bias.dim() != 1 or bias.shape[0] != N:
            raise ValueError(f"gemm_a16w16: bias must be (N,) = ({N},), got {tuple(bias.shape)} {bias.dtype}")
        allowed = (out,) if A.dtype in FP8_DTYPES or A.dtype == out else (A.dtype, out)
        if bias.dtype not in allowed:
            raise ValueError(f"gemm_a16w16: bias {tuple(bias.shape)} has dtype {bias.dtype}; it must be "
                             f"{' or '.join(map(str, allowed))} (A is {A.dtype}, the output {out})")
        if bias.device != A.device:
            raise ValueError(f"gemm_a16w16: bias {tuple(bias.shape)} {bias.dtype} is on {bias.device} but A is on "
                             f"{A.device}")
    for name, scale in (("scale_a", scale_a), ("scale_b", scale_b), ("scale_c", scale_c)):
        if scale is not None and (scale.numel() != 1 or scale.dtype != torch.float32 or scale.device != A.device):
            raise ValueError(f"gemm_a16w16: {name} (shape {tuple(scale.shape)}, dtype {scale.dtype}, on "
                             f"{scale.device}) must be a per-tensor scale: one torch.float32 element on A's device "
                             f"{A.device}")
    return GemmProblem(M=math.prod(A.shape[:-1]), N=N, K=K, bias=bias is not None, dtype=A.dtype,
                       otype=out,
                       scaleAB=scale_a is not None or scale_b is not None or scale_c is not None,
                       bpreshuffle=bpreshuffle)


# ---- the custom op (torch.compile / export) ------------------------------------------------------------------
@torch.library.custom_op("aiter_gemm::gemm_a16w16", mutates_args=())
def _gemm_a16w16_op(
    A: torch.Tensor, B: torch.Tensor, bias: Optional[torch.Tensor] = None, otype: Optional[torch.dtype] = None,
    scale_a: Optional[torch.Tensor] = None, scale_b: Optional[torch.Tensor] = None,
    scale_c: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    return gemm_a16w16(A, B, bias, otype, scale_a, scale_b, scale_c)  # not compiling when a compiled graph runs


@_gemm_a16w16_op.register_fake
def _gemm_a16w16_fake(A, B, bias=None, otype=None, scale_a=None, scale_b=None, scale_c=None):
    return A.new_empty((*A.shape[:-1], B.shape[0]), dtype=otype or A.dtype)


def _setup_context(ctx, inputs, output):
    A, B, bias, otype, scale_a, scale_b, scale_c = inputs
    if scale_a is not None or scale_b is not None or scale_c is not None:
        raise NotImplementedError("aiter_gemm.gemm_a16w16: no gradient for scaled (fp8) GEMMs")
    ctx.save_for_backward(A, B)
    ctx.has_bias = bias is not None


def _backward(ctx, grad):
    """Gradients of out = A @ B.T + bias (so models with trainable weights still compile), in the input dtypes."""
    A, B = ctx.saved_tensors
    g = grad.to(A.dtype)
    grad_a = g @ B
    grad_b = g.reshape(-1, g.shape[-1]).t() @ A.reshape(-1, A.shape[-1])
    grad_bias = g.reshape(-1, g.shape[-1]).sum(0) if ctx.has_bias else None
    return grad_a, grad_b, grad_bias, None, None, None, None


_gemm_a16w16_op.register_autograd(_backward, setup_context=_setup_context)


# ---- public API ----------------------------------------------------------------------------------------------
#: The op's eager entry (:mod:`aiter_gemm.op_entry`): the key holds everything :func:`problem_of` validates (shapes,
#: dtypes and devices of every tensor, otype) and the weight's ``is_shuffled`` mark, so a call finds an entry only if
#: that entry's first call had operands passing the same checks (issue 31: a ``meta`` weight hit the entry of a CPU
#: one). The C++ entry serves the keys :func:`c_servable` allows (plain ``F.linear``, as ``at::linear``).
GEMM_A16W16_ENTRY = OpEntry(
    "gemm_a16w16",
    (Arg("A"), Arg("B", marks=("is_shuffled",)), Arg("bias", OPTIONAL_TENSOR, None), Arg("otype", VALUE, None),
     Arg("scale_a", OPTIONAL_TENSOR, None), Arg("scale_b", OPTIONAL_TENSOR, None),
     Arg("scale_c", OPTIONAL_TENSOR, None)),
    _DISPATCHER.cache, _decide, module=__name__, run=run_linear_entry, runner_args=3,
    compiled=torch.ops.aiter_gemm.gemm_a16w16,
    doc="""``F.linear(A, B, bias)`` through the tuned dispatch: A (..., K), B (N, K) -> (..., N) in ``otype``
    (default A.dtype). fp8 inputs take per-tensor ``scale_a``/``scale_b``; ``scale_c`` multiplies the output.

    Eager calls cost one lookup after a key's first call (:data:`GEMM_A16W16_ENTRY`); a plain-torch decision then
    calls ``F.linear`` on A as given. ``torch.compile`` traces the ``aiter_gemm::gemm_a16w16`` custom op.""")
gemm_a16w16_python = GEMM_A16W16_ENTRY.python
gemm_a16w16 = GEMM_A16W16_ENTRY.entry
#: The op's per-call key of a call's arguments (:attr:`aiter_gemm.op_entry.OpEntry.key`).
call_key = GEMM_A16W16_ENTRY.key
#: The cache entry of ``gemm_a16w16(A, B, bias)``, deciding on a new key (:class:`aiter_gemm.nn.TunedLinear`).
linear_entry = GEMM_A16W16_ENTRY.value_for


class TunedGemm:
    """AITER's ``tgemm`` object: ``tgemm.mm(inp, weights, bias, otype, scale_a, scale_b, scale_c)``, with AITER's
    attributes read from the current settings: ``save_gemm`` (1 when ``AITER_TUNE_GEMM`` captures shapes),
    ``untune_path`` (where they go) and ``tune_path`` (the tuned file(s) read, colon-separated)."""

    @property
    def save_gemm(self) -> int:
        return int(_DISPATCHER.settings.tune_gemm)

    @property
    def untune_path(self) -> str:
        return os.path.abspath(_DISPATCHER.settings.untuned_file)

    @property
    def tune_path(self) -> str:
        return ":".join(_DISPATCHER.settings.config_paths[GEMM_A16W16.kind])

    def mm(self, inp: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor | None = None,
           otype: torch.dtype | None = None, scale_a: torch.Tensor | None = None,
           scale_b: torch.Tensor | None = None, scale_c: torch.Tensor | None = None) -> torch.Tensor:
        return gemm_a16w16(inp, weights, bias, otype, scale_a, scale_b, scale_c)


tgemm = TunedGemm()


def get_GEMM_A16W16_config(M: int, N: int, K: int, bias: bool, dtype: torch.dtype | str,
                           otype: torch.dtype | str | None = None, scaleAB: bool = False,
                           bpreshuffle: bool = False) -> dict[str, Any]:
    """The config ``gemm_a16w16`` uses for this shape on this process's GPU (or CPU when there is none): the tuned
    row's columns, or the heuristic default, plus ``matched`` (exact/padded_gl0/padded_gl1/default) and ``source``."""
    dt = parse_dtype(dtype)
    problem = GemmProblem(int(M), int(N), int(K), bool(bias), dt, parse_dtype(otype) if otype is not None else dt,
                          bool(scaleAB), bool(bpreshuffle))
    return _DISPATCHER.decide(problem, torch.cuda.is_available()).as_config()


def _clear_a16w16_cache() -> None:
    """AITER's ``get_GEMM_A16W16_config.cache_clear()``: drop this op's cached decisions and re-read the environment
    and its config files (what AITER's tuners expect after pointing ``AITER_CONFIG_GEMM_BF16`` elsewhere)."""
    _DISPATCHER.reload()


get_GEMM_A16W16_config.cache_clear = _clear_a16w16_cache  # type: ignore[attr-defined]


def reload_configs() -> None:
    """Re-read the environment and every config file of every op and drop cached decisions (tuner, tests)."""
    reload_all()


def get_config_table(kind: str) -> ConfigTable:
    """The merged tuned table of a config kind (``GEMM_BF16``, ``GEMM_A8W8``, ``GEMM_A8W8_BLOCKSCALE``, ...)."""
    return _DISPATCHER.table(kind)


def current_device_identity(on_gpu: bool | None = None) -> DeviceIdentity:
    """``(gfx, cu_num)`` rows are matched against, overrides applied; GPU if present unless ``on_gpu`` says."""
    return _DISPATCHER.device(torch.cuda.is_available() if on_gpu is None else on_gpu)


def get_dispatcher(op: str | OpSpec = GEMM_A16W16) -> Dispatcher:
    """The process's dispatcher of an op (default ``gemm_a16w16``; e.g. ``"gemm_a8w8_blockscale"``)."""
    return dispatcher_for(op if isinstance(op, OpSpec) else op_spec(op))
