"""The contract every GEMM backend implements, shared by the runtime dispatcher and the tuner.

A backend is one module ``<op's backend package>/<libtype>.py`` (``aiter_gemm/backends/`` for ``gemm_a16w16``,
``aiter_gemm/backends/a8w8_blockscale/`` for the block-scale op) exposing ``BACKEND``, an instance of a
:class:`Backend` subclass whose ``name`` equals the CSV ``libtype``. The runtime imports it lazily, the first time a
tuned row or the default heuristic needs it, so importing ``aiter_gemm`` never imports an optional backend's
dependencies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch

from aiter_gemm.device import DeviceIdentity, typical_cu

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

    def with_m(self, m: int) -> "GemmProblem":
        return GemmProblem(m, self.N, self.K, self.bias, self.dtype, self.otype, self.scaleAB, self.bpreshuffle)

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    def min_bytes(self) -> int:
        """Fewest bytes moved: A and B read once, out written once (bias ignored: N elements)."""
        isz, osz = _itemsize(self.dtype), _itemsize(self.otype)
        return (self.M * self.K + self.N * self.K) * isz + self.M * self.N * osz


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

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run on this machine at all (dependency missing, wrong vendor); None if it can."""
        return None

    def is_available(self) -> bool:
        return self.unavailable_reason() is None

    def configure(self, settings: Settings) -> None:
        """Take the runtime's settings (read once from the environment) and forget anything derived from the
        previous ones. The dispatcher calls it before a backend's first use and again after every reload."""

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

    def precompile(self, jobs: Sequence[tuple[GemmProblem, Solution]]) -> dict[str, str]:
        """Build, ahead of their first ``prepare``, whatever the (problem, solution) jobs need (JIT kernels into a
        disk cache), in parallel where the backend can; kernelName -> why for those that failed. The tuner calls it
        before timing a batch, :func:`aiter_gemm.warmup` before serving. Default: nothing to build."""
        return {}


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
