"""The contract every GEMM backend implements, shared by the runtime dispatcher and the tuner.

A backend is one module ``<op's backend package>/<libtype>.py`` (``aiter_gemm/backends/`` for ``gemm_a16w16``,
``aiter_gemm/backends/a8w8_blockscale/`` for the block-scale op) exposing ``BACKEND``, an instance of a
:class:`Backend` subclass whose ``name`` equals the CSV ``libtype``. The runtime imports it lazily, the first time a
tuned row or the default heuristic needs it, so importing ``aiter_gemm`` never imports an optional backend's
dependencies.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import torch

from aiter_gemm.device import DeviceIdentity, typical_cu
from aiter_gemm.dtypes import dtype_name
from aiter_gemm.kernels.blockscale_format import SCALE_BLOCK

if TYPE_CHECKING:
    from aiter_gemm.settings import Settings

# gemm_a16w16's runner: run(a, b, bias, otype, scale_a, scale_b, scale_c) -> out
#   a: (M, K), b: (N, K) (nn.Linear layout), any strides; bias: (N,) of any stride (a slice, a column of a 2-D
#   tensor, a stride-0 expand: kernels read it by its stride) or None; out: (M, N) of dtype otype.
#   scale_*: per-tensor float32 scalars or None (scale_c multiplies the output, as cuBLASLt's D scale does).
Runner = Callable[
    [torch.Tensor, torch.Tensor, Optional[torch.Tensor], torch.dtype,
     Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]],
    torch.Tensor,
]


def get_padded_m(M: int, N: int, K: int, gl: int) -> int:
    """AITER's getPaddedM. gl=0: round M up to 16 (M<=256), 32 (<=1024), 64 (<=4096), else 128. gl=1: 8192 if
    M > 8192 and N > 4096, else the next power of two (1 for M <= 1)."""
    if gl == 0:
        step = 16 if M <= 256 else 32 if M <= 1024 else 64 if M <= 4096 else 128
        return (M + step - 1) // step * step
    if gl == 1:
        if M > 8192 and N > 4096:
            return 8192
        return 1 if M <= 1 else 1 << (M - 1).bit_length()
    raise ValueError(f"get_padded_m: gl must be 0 or 1, got {gl!r}")


# An op's problem is a frozen dataclass whose fields are named as its untuned CSV columns (``problem_cells`` spells
# them), with what the dispatcher, capture and the tuner read of any problem: ``M`` (the size that padded lookups
# change), ``with_m``, ``padded()`` (the op's padded lookups after the exact key, AITER's rule), ``empty``,
# ``label()`` (warnings, errors), ``describe()`` (the AITER_LOG_TUNED_CONFIG line), ``MISS_SHAPE`` with
# ``miss_args()`` (the start of AITER's INFO line for a shape no row serves), ``config_fields()`` (what
# ``get_*_config`` reports of the problem), ``bpreshuffle`` (a pre-shuffled weight: BLASLt backends only) and, for
# the tuner's % of roofline, ``flops``, ``min_bytes()`` and ``fp8`` (FP8 operands: the FP8 compute peak applies).
@dataclass(frozen=True)
class GemmProblem:
    """One GEMM as the tuned CSVs key it (the untuned columns): out = A @ B.T (+ bias)."""

    M: int
    N: int
    K: int
    bias: bool = False
    dtype: torch.dtype = torch.bfloat16
    otype: torch.dtype = torch.bfloat16
    scaleAB: bool = False
    bpreshuffle: bool = False

    #: AITER's words for a GEMM shape no tuned row serves (aiter/tuned_gemm.py), before the file list.
    MISS_SHAPE: ClassVar[str] = ("shape is M:%d, N:%d, K:%d dtype='%s' otype='%s' bias=%s, scaleAB=%s, "
                                 "bpreshuffle=%s,")

    def with_m(self, m: int) -> "GemmProblem":
        return GemmProblem(m, self.N, self.K, self.bias, self.dtype, self.otype, self.scaleAB, self.bpreshuffle)

    def padded(self) -> tuple[tuple[str, "GemmProblem"], ...]:
        """AITER's padded lookups after the exact M: M at getPaddedM granularity 0, then 1 (:func:`get_padded_m`)."""
        return tuple((f"padded_gl{gl}", self.with_m(get_padded_m(self.M, self.N, self.K, gl))) for gl in (0, 1))

    @property
    def empty(self) -> bool:
        """No work: M, N or K is 0 (no row is looked up, no shape captured)."""
        return self.M < 1 or self.N < 1 or self.K < 1

    def label(self) -> str:
        return f"M={self.M} N={self.N} K={self.K}"

    def describe(self) -> str:
        return (f"M={self.M} N={self.N} K={self.K} bias={self.bias} dtype={dtype_name(self.dtype)} "
                f"otype={dtype_name(self.otype)} scaleAB={self.scaleAB} bpreshuffle={self.bpreshuffle}")

    def miss_args(self) -> tuple:
        return (self.M, self.N, self.K, dtype_name(self.dtype), dtype_name(self.otype), self.bias, self.scaleAB,
                self.bpreshuffle)

    def config_fields(self) -> dict[str, Any]:
        return {"M": self.M, "N": self.N, "K": self.K}

    def inputs_bytes(self) -> tuple[int, str]:
        """A lower bound of what the op's test inputs take (float32 operands and reference), and what they are."""
        return (4 * (self.M * self.K + self.N * self.K + self.M * self.N),
                f"float32 A, B and reference of M={self.M} N={self.N} K={self.K}")

    @property
    def fp8(self) -> bool:
        """FP8 operands (the block-scale op's): its compute peak is the FP8 tensor cores'."""
        return self.dtype.is_floating_point and self.dtype.itemsize == 1

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    def min_bytes(self) -> int:
        """Fewest bytes moved: A and B read once, out written once (bias ignored: N elements)."""
        isz, osz = _itemsize(self.dtype), _itemsize(self.otype)
        return (self.M * self.K + self.N * self.K) * isz + self.M * self.N * osz


def get_padded_token(token: int) -> int:
    """AITER's ``get_padded_M`` of ``fused_moe`` (aiter/fused_moe.py): the token count its fmoe table is looked up
    at: the next power of two (1 for 0 or 1) below 32768, then 32768 below 131072, then 131072."""
    if token < 32768:
        return 1 if token <= 1 else 1 << (token - 1).bit_length()
    return 131072 if token >= 131072 else 32768


#: AITER's ``act_type`` spelling (str of its ActivationType) of each activation ``fused_moe`` takes.
ACT_TYPES: dict[str, str] = {"silu": "ActivationType.Silu", "gelu": "ActivationType.Gelu"}
#: AITER's ``q_type`` of unquantized experts and of FP8 (128, 128) block scales (its per_128x128 is looked up as
#: per_1x128: activations per token and 128-wide group).
QUANT_NONE = "QuantType.No"
QUANT_BLOCK = "QuantType.per_1x128"
#: AITER's other spellings of these (its ``quant_remap``: per_128x128 runs as per_1x128).
QUANT_ALIASES: dict[str, str] = {"QuantType.per_128x128": QUANT_BLOCK}


@dataclass(frozen=True)
class MoeProblem:
    """One fused-MoE call as AITER's fmoe tables key it (its untuned columns): ``token`` (T) rows of ``model_dim``
    (H), ``expert`` (E) experts of ``inter_dim`` (I) with gate and up fused (``use_g1u1``), ``topk`` experts per
    token, the routing weight applied in the second GEMM (``doweight_stage1`` False). ``M`` is the token count, as
    AITER's ``fused_moe`` calls it: the size padded lookups change."""

    token: int
    model_dim: int
    inter_dim: int
    expert: int
    topk: int
    act_type: str = ACT_TYPES["silu"]
    dtype: torch.dtype = torch.bfloat16
    q_dtype_a: torch.dtype = torch.bfloat16
    q_dtype_w: torch.dtype = torch.bfloat16
    q_type: str = QUANT_NONE
    use_g1u1: bool = True
    doweight_stage1: bool = False

    bpreshuffle: ClassVar[bool] = False
    MISS_SHAPE: ClassVar[str] = ("[fused_moe] shape is token:%d, model_dim:%d, inter_dim:%d, expert:%d, topk:%d "
                                 "act_type='%s' dtype='%s' q_dtype_a='%s' q_dtype_w='%s' q_type='%s' use_g1u1=%s, "
                                 "doweight_stage1=%s,")

    @property
    def M(self) -> int:
        return self.token

    def with_m(self, m: int) -> "MoeProblem":
        return replace(self, token=m)

    def padded(self) -> tuple[tuple[str, "MoeProblem"], ...]:
        """AITER's one padded lookup: the token count at :func:`get_padded_token`."""
        return (("padded", self.with_m(get_padded_token(self.token))),)

    @property
    def empty(self) -> bool:
        return min(self.token, self.model_dim, self.inter_dim, self.expert, self.topk) < 1

    @property
    def fp8(self) -> bool:
        """FP8 weights with (128, 128) block scales, activations quantized per token and 128-wide group."""
        return self.q_type == QUANT_BLOCK

    @property
    def activation(self) -> str:
        """The activation's name as ``fused_moe`` takes it (``silu``), from AITER's ``act_type``."""
        return next((name for name, text in ACT_TYPES.items() if text == self.act_type), self.act_type)

    def label(self) -> str:
        return (f"token={self.token} model_dim={self.model_dim} inter_dim={self.inter_dim} expert={self.expert} "
                f"topk={self.topk}")

    def describe(self) -> str:
        return (f"{self.label()} act_type={self.act_type} dtype={dtype_name(self.dtype)} "
                f"q_dtype_a={dtype_name(self.q_dtype_a)} q_dtype_w={dtype_name(self.q_dtype_w)} q_type={self.q_type} "
                f"use_g1u1={self.use_g1u1} doweight_stage1={self.doweight_stage1}")

    def miss_args(self) -> tuple:
        return (self.token, self.model_dim, self.inter_dim, self.expert, self.topk, self.act_type,
                dtype_name(self.dtype), dtype_name(self.q_dtype_a), dtype_name(self.q_dtype_w), self.q_type,
                self.use_g1u1, self.doweight_stage1)

    def config_fields(self) -> dict[str, Any]:
        return {"token": self.token, "model_dim": self.model_dim, "inter_dim": self.inter_dim,
                "expert": self.expert, "topk": self.topk, "act_type": self.act_type, "dtype": dtype_name(self.dtype),
                "q_dtype_a": dtype_name(self.q_dtype_a), "q_dtype_w": dtype_name(self.q_dtype_w),
                "q_type": self.q_type, "use_g1u1": self.use_g1u1, "doweight_stage1": self.doweight_stage1}

    def inputs_bytes(self) -> tuple[int, str]:
        up = 2 if self.use_g1u1 else 1
        return (4 * (self.expert * (up + 1) * self.inter_dim * self.model_dim + 2 * self.token * self.model_dim),
                f"float32 experts, hidden states and reference of {self.label()}")

    @property
    def flops(self) -> int:
        """Both GEMMs over every (token, expert) pair: gate and up (2I x H), then down (H x I)."""
        up = 2 if self.use_g1u1 else 1
        return 2 * self.token * self.topk * (up + 1) * self.inter_dim * self.model_dim

    def min_bytes(self) -> int:
        """Fewest bytes moved: the weights of the experts the tokens can reach (at most T * k of them, with their
        block scales), the input read and the output written once."""
        up = 2 if self.use_g1u1 else 1
        experts = min(self.expert, self.token * self.topk)
        per_expert = (up + 1) * self.inter_dim * self.model_dim
        weights = experts * per_expert * _itemsize(self.q_dtype_w)
        if self.fp8:
            weights += experts * 4 * -(-per_expert // (SCALE_BLOCK * SCALE_BLOCK))
        return weights + 2 * self.token * self.model_dim * _itemsize(self.dtype)


#: An op's problem (see the comment above :class:`GemmProblem`).
Problem = GemmProblem | MoeProblem


def finish_scaled(out: torch.Tensor, bias: torch.Tensor | None, otype: torch.dtype, scale_a: torch.Tensor | None,
                  scale_b: torch.Tensor | None, scale_c: torch.Tensor | None) -> torch.Tensor:
    """A GEMM result without scales -> times the per-tensor scales (scale_c multiplies too, as cuBLASLt's D scale
    does), plus bias, in float32, cast to ``otype``: the scaled path of backends whose kernels take no scales."""
    out = out.float()
    for s in (scale_a, scale_b, scale_c):
        if s is not None:
            out = out * s.to(torch.float32)
    if bias is not None:
        out = out + bias.float()
    return out.to(otype)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class Solution:
    """What a tuned row names: backend ``libtype``, its ``solidx``, ``splitK`` and ``kernelName`` (backend-defined)."""

    libtype: str
    solidx: int = -1
    splitK: int = 0
    kernelName: str = ""


class Backend:
    """Base class: subclasses set ``name`` and override what they support. One contract for every op: the op's
    dispatcher and the tuner call the same methods (docs/design.md, "Backends")."""

    name: str = ""
    #: True for vendor BLASLt libraries (cublaslt, hipblaslt): screened first by the tuner, and the default for
    #: pre-shuffled weights (AITER's ``solidx -1``: the library's own heuristic choice).
    is_blaslt: bool = False
    #: Among backends whose ``default_for`` accepts a shape, the highest priority is the heuristic default.
    default_priority: int = 0
    #: False: the tuner times this backend's candidates as comparison points but never writes them as rows.
    tunable: bool = True
    #: False for backends whose per-call host cost exceeds the library call's by more than ~3 us (Triton's Python
    #: launcher: +12-18 us on the H100 host, BENCHMARKS.md): outside CUDA-graph capture, on a GPU, their graph-timed
    #: choices give way to the default among cheap backends (docs/eager_path.md).
    cheap_launch: bool = True
    #: For cheap-launch backends that still cost some host time more than the library call: on a GPU, their rows
    #: whose (graph-timed) ``us`` is below this give way to the cheap default in eager calls too, since a call that
    #: short is host-bound and the extra host time shows (0: never).
    eager_min_us: float = 0.0
    #: For cheap-launch backends: on a GPU, calls with M above this give way to the cheap default in eager calls
    #: (0: never), where a whole model's eager step measured slower with this backend's launches among the
    #: library's than with the library's alone.
    eager_max_m: int = 0
    #: Processes or compiler threads :meth:`precompile` builds with (``AITER_GEMM_PRECOMPILE_WORKERS``, set by
    #: :meth:`configure`); None: the backend's default.
    precompile_workers: int | None = None

    def launch_is_cheap(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> bool:
        """Whether an eager call of ``solution`` on ``device`` costs about the library call's host time (the
        dispatcher's eager switch, docs/eager_path.md): :attr:`cheap_launch`, unless a backend knows better per
        solution and device (the block-scale Triton backend where its launches are bound)."""
        return self.cheap_launch

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run on this machine at all (dependency missing, wrong vendor); None if it can."""
        return None

    def is_available(self) -> bool:
        return self.unavailable_reason() is None

    def configure(self, settings: Settings) -> None:
        """Take the runtime's settings (read once from the environment) and forget anything derived from the
        previous ones. The dispatcher calls it before a backend's first use and again after every reload. An
        override calls this one (it takes :attr:`precompile_workers`)."""
        self.precompile_workers = settings.precompile_workers

    def why_not(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> str | None:
        """Why ``solution`` cannot run ``problem`` on ``device`` (malformed name, shape or dtype unsupported, stale
        library version, ...); None if it can. The one rule the runtime (a row it rejects is a miss) and the tuner
        (it never times such a candidate) share; ``prepare`` returns None exactly when this says why."""
        return None

    def shape_why_not(self, problem: GemmProblem, solution: Solution, arch: str) -> str | None:
        """:meth:`why_not` with this machine left out: why ``solution`` cannot run ``problem`` on a GPU of arch
        ``arch`` (malformed name, shape, dtypes, that arch's limits), whatever this process has (the backend's
        availability, the device kind, this GPU's capability). For checks of a candidate or a shipped config on the
        reference arch, where the machine is not the one it will run on. Backends whose ``why_not`` looks at the
        machine override it (``why_not`` is then the machine's checks, then this on the device's arch); the default
        asks ``why_not`` about a nominal GPU of ``arch``."""
        kind = "hip" if arch.startswith("gfx") else "cuda"
        return self.why_not(problem, solution, DeviceIdentity(arch, typical_cu(arch), kind))

    def prepare(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> Callable | None:
        """A runner for ``solution`` on ``problem``, with everything per-shape prepared once; None if this solution
        cannot run here (:meth:`why_not` says why). Called once per (shape, solution); the runner is called per GEMM
        and must be cheap, do no host sync and no file I/O (it may run inside CUDA graph capture). Its signature is
        the op's (:data:`Runner` for ``gemm_a16w16``)."""
        raise NotImplementedError

    def parse_json_entry(self, entry: Mapping[str, Any]) -> Solution:
        """The solution an entry of the op's JSON files names, for entries of this libtype (:class:`~aiter_gemm.
        jsonconfigs.JsonLevel`: parsed once per file); ValueError saying what is wrong (the reader names file and
        bucket). Default: this backend's solutions are not written in JSON files."""
        raise ValueError(f"libtype {self.name!r} has no JSON config entries (its solutions are given by solidx / "
                         "kernelName)")

    def describe(self, solution: Solution) -> dict[str, Any]:
        """Fields ``get_*_config`` reports for one of this backend's solutions beside the row's (e.g. its kernel's
        parameters). Default: none."""
        return {}

    def fit(self, solution: Solution, problem: GemmProblem, arch: str) -> Solution:
        """A JSON bucket's ``solution`` as it should run ``problem`` on ``arch`` (a bucket serves many shapes: e.g.
        the same tile without TMA where TMA cannot read the rows). Default: unchanged."""
        return solution

    def default_for(self, problem: GemmProblem, device: DeviceIdentity) -> Solution | None:
        """The solution the heuristic default path would use for ``problem`` when no tuned row matches, or None if
        this backend should not be the default for it."""
        return None

    def eager_default_for(self, problem: GemmProblem, device: DeviceIdentity) -> Solution | None:
        """The default for ``problem`` when the call is eager and only cheap-launch backends are considered (the
        dispatcher asks only those); the same as :meth:`default_for` unless a backend claims more there."""
        return self.default_for(problem, device)

    def candidates(self, problem: GemmProblem, device: DeviceIdentity) -> Sequence[Solution]:
        """Every solution the tuner should time for ``problem`` on ``device`` (the config space, pruned of what
        cannot run). Must be the same set ``prepare`` accepts, so tuner and runtime agree."""
        return ()

    def quick_candidates(self, problem: GemmProblem, device: DeviceIdentity) -> Sequence[Solution]:
        """A short list for quick tuning runs (default: every candidate)."""
        return self.candidates(problem, device)

    def reference_variant(self, problem: GemmProblem, solution: Solution) -> Hashable:
        """Which arithmetic of this backend ``solution`` computes ``problem`` by, where its solutions differ in it by
        design (:meth:`reference`'s ``variant``; solutions of one variant share one reference). Default None."""
        return None

    def reference(self, problem: GemmProblem, inputs: tuple, variant: Hashable = None) -> torch.Tensor | None:
        """The float32 reference of this backend's own arithmetic (of solutions of :meth:`reference_variant`
        ``variant``) on one input set of the op, where it differs from the op's reference by design (a library that
        writes an intermediate in bf16 only); the tuner checks those candidates against it (``err_ratio``,
        ``rel_err``). Its distance to the op's reference is the backend's tests' to bound. Default None: the op's
        reference."""
        return None

    def precompile(self, jobs: Sequence[tuple[GemmProblem, Solution]]) -> dict[str, str]:
        """Build, ahead of their first ``prepare``, whatever the (problem, solution) jobs need (JIT kernels into a
        disk cache), in parallel where the backend can; kernelName -> why for those that failed. The tuner calls it
        before timing a batch, :func:`aiter_gemm.warmup` before serving. Default: nothing to build."""
        return {}


class LibraryCallBackend(Backend):
    """A backend whose one solution is a library's call (torch's block-scaled matmul, DeepGEMM's GEMMs): the name
    check, the library's availability on the decision's device and the problem rule composed once. A subclass sets
    :attr:`solution` and defines :meth:`library_why` and :meth:`problem_why`."""

    solution: ClassVar[Solution]

    def library_why(self, device: torch.device | None) -> str | None:
        """Why the library cannot run on ``device`` (None: on this machine at all); None where it can."""
        return None

    def problem_why(self, problem: Problem, arch: str) -> str | None:
        """Why the call does not take ``problem`` (``arch``: the GPU arch it would run on, or a reference arch)."""
        raise NotImplementedError

    def unavailable_reason(self) -> str | None:
        return self.library_why(None)

    def name_error(self, solution: Solution) -> str | None:
        """Why ``solution`` is not this backend's one (a row naming another kernel under its libtype)."""
        if solution.kernelName != self.solution.kernelName:
            return f"libtype {self.name!r} runs {self.solution.kernelName!r}, not {solution.kernelName!r}"
        return None

    def why_not(self, problem: Problem, solution: Solution, device: DeviceIdentity) -> str | None:
        # The library is asked at every decision: its answer depends on the device (and tests replace it).
        return (self.name_error(solution) or self.library_why(device.torch_device())
                or self.shape_why_not(problem, solution, device.gfx))

    def shape_why_not(self, problem: Problem, solution: Solution, arch: str) -> str | None:
        return self.name_error(solution) or self.problem_why(problem, arch)

    def candidates(self, problem: Problem, device: DeviceIdentity) -> list[Solution]:
        """The one solution where the call takes the problem (whether this process can run it is the tuner's
        ``--libtype`` check and the worker's ``why_not``)."""
        return [self.solution] if self.problem_why(problem, device.gfx) is None else []

    #: A library that compiles its kernels on first use (a JIT): the arch its ahead-of-time build checks problems
    #: for, and :meth:`warm` runs them; "" (default): nothing to build.
    build_arch: ClassVar[str] = ""

    def warm(self, problems: list[Problem]) -> dict[Problem, str]:
        """Run the call once per distinct kernel shape of ``problems`` so the library builds (or loads from its disk
        cache) what they run; the problems that failed, with why."""
        return {}

    def precompile(self, jobs: Sequence[tuple[Problem, Solution]]) -> dict[str, str]:
        """:meth:`warm` over the jobs the call takes (``build_arch``'s rule), before they are timed or served;
        kernelName -> why for what failed (the library unavailable here: every job)."""
        if not self.build_arch:
            return {}
        why = self.unavailable_reason()
        if why is not None:
            return {sol.kernelName: why for _, sol in jobs}
        todo, failed = [], {}
        for problem, sol in jobs:
            bad = self.shape_why_not(problem, sol, self.build_arch)
            if bad is not None:
                failed[sol.kernelName] = bad
            else:
                todo.append(problem)
        for problem, msg in self.warm(todo).items():
            failed[self.solution.kernelName] = f"{problem.label()}: {msg}"
        return failed


class UnavailableBackend(Backend):
    """Stands in for a libtype this process cannot run (no module, or its import failed)."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self._reason = reason

    def unavailable_reason(self) -> str | None:
        return self._reason

    def parse_json_entry(self, entry: Mapping[str, Any]) -> Solution:
        raise ValueError(f"libtype {self.name!r} cannot be read here: {self._reason}")

    def prepare(self, problem, solution, device):  # noqa: ANN001 - never called for an unavailable backend
        return None
