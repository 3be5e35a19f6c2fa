"""Backend ``triton`` of ``fused_moe``: the Triton fused-MoE kernels of :mod:`aiter_gemm.kernels.fused_moe`.

A solution's ``kernelName`` names the two GEMMs' :class:`~aiter_gemm.kernels.fused_moe.MoeConfig` (``moe_BM16_BN64_
BK128_GM1_SK1_W4_S4``, with the variants' flags ``_QA`` / ``_DIRECT`` / ``_KSUM`` / ``_FUSED`` / ``_SWAP``; two
joined by ``;`` when they differ: :func:`~aiter_gemm.backends.fused_moe.pair_name`; a ``FUSED`` config names both
GEMMs alone), as a tuned row's ``kernelName1`` / ``kernelName2`` do; ``splitK`` mirrors GEMM1's split count
(AITER's ``ksplit``). ``SWAP`` configs are offered at small T only (:data:`~aiter_gemm.kernels.fused_moe_config.
SWAP_MAX_ROWS`, over the problem's expert count).
vLLM's and SGLang's JSON values (one config for both GEMMs) read as such a pair (:meth:`parse_json_entry`).
:func:`~aiter_gemm.kernels.fused_moe.config_error` is the one rule of what runs, for the tuner and the runtime; the
default on a GPU (no row, no JSON bucket) is :func:`~aiter_gemm.kernels.fused_moe.default_config` of each GEMM.

Where the C++ extension is built and Triton compiles, the runner binds its launches (the token sorts, both GEMMs,
a split GEMM1's epilogue: :mod:`aiter_gemm.triton_launch`) on the first call of each layout of its tensors, after
Triton's own launches, and later eager calls launch them from C++, each plan checking the call's tensors; calls
under CUDA-graph capture run Triton's launches as before (a graph has no per-call host cost to save).
:meth:`~FusedMoeTritonBackend.precompile` builds the kernels of (problem, solution) jobs in parallel build processes
into Triton's disk cache (:mod:`aiter_gemm.backends._triton_precompile`; the tuner before timing, :func:`aiter_gemm.
warmup`), one build per solution for every token count (GEMM1's counter clearing is a runtime count).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from aiter_gemm import cudagraph, triton_launch
from aiter_gemm.backends._triton_common import triton_unavailable_reason
from aiter_gemm.backends.base import Backend, MoeProblem, Solution
from aiter_gemm.backends.fused_moe import pair_name, stage_names
from aiter_gemm.backends.fused_moe import problem_error as moe_problem_error
from aiter_gemm.device import REFERENCE_ARCH, DeviceIdentity
from aiter_gemm.kernels import fused_moe as fm
from aiter_gemm.kernels.common import INTERPRET
from aiter_gemm.kernels.fused_moe import MoeConfig
from aiter_gemm.triton_launch import UNTRIED

NAME = "triton"
#: :meth:`FusedMoeTritonBackend.reference_variant` of a ``FUSED`` solution of FP8 experts.
UNQUANTIZED_INTER = "unquantized intermediate"


def solution_of(config1: MoeConfig, config2: MoeConfig | None = None) -> Solution:
    """The solution running ``config1`` for GEMM1 and ``config2`` (default: the same) for GEMM2."""
    config2 = config2 or config1
    return Solution(NAME, -1, config1.split_k if config1.split_k > 1 else 0, pair_name(config1.name(), config2.name()))


def configs_of(solution: Solution) -> tuple[MoeConfig, MoeConfig]:
    """(GEMM1's config, GEMM2's config) a solution names; ValueError saying what is wrong."""
    first, second = stage_names(solution.kernelName)
    return MoeConfig.parse(first), MoeConfig.parse(second)


def problem_error(p: MoeProblem) -> str | None:
    """Why the kernels cannot run ``p`` whatever the configs (the op's shared rule, :func:`~aiter_gemm.backends.
    fused_moe.problem_error`)."""
    return moe_problem_error(p, NAME, fm.ACTIVATIONS, "the kernels")


def make_runner(config1: MoeConfig, config2: MoeConfig, activation: str):
    """The runner of one problem's configs: a :class:`BoundRunner` where launches bind (:data:`~aiter_gemm.
    triton_launch.BINDS`), else Triton's launches."""
    if triton_launch.BINDS:
        return BoundRunner(config1, config2, activation)

    def run(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale=None, w2_scale=None):
        # The op checked this key's inputs (its strides included) at its first call, the expert ids per call.
        return fm.launch_fused_moe(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale, activation,
                                   config1, config2)

    return run


def _kernel_name(compiled: Any) -> str:
    return getattr(getattr(compiled, "metadata", None), "name", type(compiled).__name__)


class BoundRunner(triton_launch.PlanCache):
    """One problem's runner with bound launches: per layout of its tensors (dtypes, shapes, strides, device) the
    first call runs Triton's launches and binds each (:func:`~aiter_gemm.triton_launch.bind_each`); later calls run
    the plans of the last layout bound, each launch falling back to Triton's where its plan declines (another
    layout, a misaligned tensor, another current device, a launch hook), after which the next call looks its layout
    up. A launch that cannot be bound is logged once (:func:`~aiter_gemm.triton_launch.bind`) and keeps Triton's
    launch; CUDA-graph capture runs Triton's launches. The problem (token count, sizes, expert count, top-k) is the
    runner's, so a plan's checks of its tensors cover every integer it fixed. A layout's plans (a tuple, None
    entries: Triton's launch) are kept in the :class:`~aiter_gemm.triton_launch.PlanCache` this runner is."""

    __slots__ = ("_capturing", "_kernels", "activation", "config1", "config2")

    def __init__(self, config1: MoeConfig, config2: MoeConfig, activation: str) -> None:
        super().__init__()
        self.config1, self.config2, self.activation = config1, config2, activation
        self._capturing = cudagraph.probe()
        self._kernels: dict[tuple, tuple[str, ...]] = {}  # layout -> the kernel of each launch (launch_path)

    def __call__(self, hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weight: torch.Tensor,
                 topk_ids: torch.Tensor, w1_scale: torch.Tensor | None = None,
                 w2_scale: torch.Tensor | None = None) -> torch.Tensor:
        tensors = (hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale)
        if self._capturing():
            return self._launch(tensors, None)
        last = self._last
        if last is not None:  # every eager call after the first
            launches = triton_launch.LaunchSequence(last)
            out = self._launch(tensors, launches)
            if launches.missed:  # another layout (or a hook...): the next call looks its own up
                self._last = None
            return out
        key = self.layout(*tensors)
        plans = self._plans.get(key, UNTRIED)
        if plans is UNTRIED:
            # A misaligned tensor is not bound (Triton specializes the kernels on aligned pointers): a later aligned
            # call of the layout binds it.
            if not hidden_states.is_cuda or any(t.data_ptr() % 16 for t in tensors if t is not None):
                return self._launch(tensors, None)
            launches = triton_launch.LaunchSequence(launches=[])
            out = self._launch(tensors, launches)
            self._store(key, triton_launch.bind_each(launches.launches))  # _last is None here: none bound, it stays
            self._kernels[key] = tuple(_kernel_name(launch.compiled) for launch in launches.launches)
            return out
        if plans is None:
            return self._launch(tensors, None)
        self._last = plans
        return self._launch(tensors, triton_launch.LaunchSequence(plans))

    def _start_over(self) -> None:
        """Forget the plans and each layout's kernel names with them."""
        super()._start_over()
        self._kernels.clear()

    def _launch(self, tensors: tuple, launches: triton_launch.LaunchSequence | None) -> torch.Tensor:
        # The op checked this key's inputs (its strides included) at its first call, the expert ids per call.
        return fm.launch_fused_moe(*tensors, self.activation, self.config1, self.config2, launches)

    @staticmethod
    def layout(*tensors: torch.Tensor | None) -> tuple:
        """A call's layout: each tensor's dtype, shape and strides (None for an absent scale), and the device."""
        return (*((t.dtype, t.shape, t.stride()) if t is not None else None for t in tensors), tensors[0].device)

    def launch_path(self, *tensors: torch.Tensor | None) -> str:
        """Which launches a call with these tensors takes now (benchmarks' notes): the kernels bound, in launch
        order, and those left to Triton's launcher; or why none is bound. Runs the call once."""
        key = self.layout(*tensors)
        plans = self._plans.get(key, UNTRIED)
        if plans is UNTRIED:
            return "Triton's launcher (not called yet with this layout)"
        if plans is None:
            return "Triton's launcher (nothing bound: the log says why)"
        launches = triton_launch.LaunchSequence(plans)
        self._launch(tensors, launches)
        if launches.missed:
            return "Triton's launcher (a plan declines: a launch hook, another device current, a misaligned view)"
        names = self._kernels.get(key, ())
        bound = [n for n, p in zip(names, plans) if p is not None]
        unbound = [n for n, p in zip(names, plans) if p is None]
        return f"bound launches: {', '.join(bound)}" + (f"; Triton's launcher: {', '.join(unbound)} (the log says "
                                                         "why)" if unbound else "")


class FusedMoeTritonBackend(Backend):
    name = NAME
    default_priority = 10  # above torch's grouped_mm / loop on a GPU (default_for)

    def unavailable_reason(self) -> str | None:
        return triton_unavailable_reason(f"{NAME} (fused_moe)")

    def why_not(self, problem: MoeProblem, solution: Solution, device: DeviceIdentity) -> str | None:
        if device.kind == "cpu" and not INTERPRET:
            return "Triton kernels run on CPU tensors only under TRITON_INTERPRET=1"
        return self.shape_why_not(problem, solution, device.gfx if device.is_gpu else REFERENCE_ARCH)

    def shape_why_not(self, problem: MoeProblem, solution: Solution, arch: str) -> str | None:
        why = problem_error(problem)
        if why is not None:
            return why
        try:
            configs = configs_of(solution)
        except ValueError as exc:
            return str(exc)
        for stage, cfg in zip((1, 2), configs):
            why = fm.config_error(cfg, fp8=problem.fp8, arch=arch, stage=stage)
            if why is not None:
                return f"GEMM{stage} {cfg.name()}: {why}"
        return fm.pair_error(*configs)

    def prepare(self, problem: MoeProblem, solution: Solution, device: DeviceIdentity):
        if self.why_not(problem, solution, device) is not None:
            return None
        return make_runner(*configs_of(solution), problem.activation)

    def default_for(self, problem: MoeProblem, device: DeviceIdentity) -> Solution | None:
        """Each GEMM's :func:`~aiter_gemm.kernels.fused_moe.default_config`, on a GPU (on CPU the interpreter is no
        default: torch's experts run there)."""
        if not device.is_gpu or problem_error(problem) is not None:
            return None
        return solution_of(*self._defaults(problem, device.heuristic_cu))

    @staticmethod
    def _defaults(p: MoeProblem, num_sms: int) -> tuple[MoeConfig, MoeConfig]:
        return (fm.default_config(p.token, p.expert, p.topk, p.inter_dim, p.model_dim, fp8=p.fp8, num_sms=num_sms),
                fm.default_config(p.token, p.expert, p.topk, p.model_dim, p.inter_dim, fp8=p.fp8, num_sms=num_sms))

    def describe(self, solution: Solution) -> dict[str, Any]:
        """Each GEMM's config as vLLM's JSON value holds it."""
        config1, config2 = configs_of(solution)
        first, second = stage_names(solution.kernelName)
        return {"kernelName1": first, "kernelName2": second, "block_m": config1.block_m,
                "config1": config1.to_vllm(), "config2": config2.to_vllm()}

    def parse_json_entry(self, entry: Mapping[str, Any]) -> Solution:
        """A vLLM / SGLang fused-MoE value (:meth:`~aiter_gemm.kernels.fused_moe.MoeConfig.from_vllm`): one config
        for both GEMMs."""
        return solution_of(MoeConfig.from_vllm(entry))

    def _space(self, problem: MoeProblem, device: DeviceIdentity, quick: bool) -> list[Solution]:
        if problem_error(problem) is not None:
            return []
        # Configs for both GEMMs (FUSED ones only so: pair_error), then those for one stage only (GEMM2's KSUM, its
        # one-accumulator FP8 tiles) beside the other stage's default; the per-stage search (gradlib.moe) pairs them
        # with the winners.
        space = dict(fp8=problem.fp8, quick=quick, tokens=problem.token, topk=problem.topk, experts=problem.expert)
        both = fm.config_space(**space)
        default1, default2 = self._defaults(problem, device.heuristic_cu)
        pairs = [(c, c) for c in both]
        pairs += [(c, default2) for c in fm.config_space(**space, stage=1) if c not in both]
        pairs += [(default1, c) for c in fm.config_space(**space, stage=2) if c not in both]
        pairs.append((default1, default2))  # never worse than no row
        arch = device.gfx if device.is_gpu else REFERENCE_ARCH
        return [s for s in dict.fromkeys(solution_of(*p) for p in pairs)
                if self.shape_why_not(problem, s, arch) is None]

    def candidates(self, problem: MoeProblem, device: DeviceIdentity) -> list[Solution]:
        return self._space(problem, device, quick=False)

    def quick_candidates(self, problem: MoeProblem, device: DeviceIdentity) -> list[Solution]:
        return self._space(problem, device, quick=True)

    def reference_variant(self, problem: MoeProblem, solution: Solution) -> Hashable:
        """:data:`UNQUANTIZED_INTER` for a ``FUSED`` solution of FP8 experts (its GEMM2 takes the intermediate
        unquantized), else None (the op's reference); a name that does not parse: None."""
        try:
            fused = configs_of(solution)[0].fused
        except ValueError:
            return None
        return UNQUANTIZED_INTER if fused and problem.fp8 else None

    def reference(self, problem: MoeProblem, inputs: tuple, variant: Hashable = None) -> torch.Tensor | None:
        """:data:`UNQUANTIZED_INTER`: :func:`~aiter_gemm.kernels.fused_moe.fused_moe_ref` with ``quant_inter=False``
        (closer to exact math than the op's reference, which quantizes the intermediate as the unfused kernels
        do; their distance is bounded in test_moe_kernel)."""
        if variant != UNQUANTIZED_INTER:
            return None
        x, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale = inputs
        return fm.fused_moe_ref(x, w1, w2, topk_weight, topk_ids, w1_scale=w1_scale, w2_scale=w2_scale,
                                activation=problem.activation, quant_inter=False).float()

    def precompile(self, jobs: Sequence[tuple[MoeProblem, Solution]]) -> dict[str, str]:
        """Build the jobs' kernels in parallel into Triton's disk cache (:func:`~aiter_gemm.backends.
        _triton_precompile.precompile_triton`: each distinct job run once, :func:`build_job`; the token counts of one
        :func:`kernel_variant` share kernels), with each GEMM1 config's other counter-clearing variant too
        (:func:`ksum_partners`: the tuner's per-stage rounds pair every GEMM1 config with the GEMM2 winner);
        kernelName -> why for the jobs' that failed. No GPU: {}."""
        from aiter_gemm.backends._triton_precompile import precompile_triton  # the tuner's and warmup's only

        names = {sol.kernelName for _, sol in jobs}
        failed = precompile_triton([*jobs, *ksum_partners(jobs)], build_job, kernel_variant, self.precompile_workers)
        return {name: why for name, why in failed.items() if name in names}


def kernel_variant(problem: MoeProblem, solution: Solution) -> Hashable:
    """What of ``problem`` the kernels of ``solution`` depend on: everything but the token count, and whether GEMM1
    clears GEMM2's KSUM counters (:func:`~aiter_gemm.kernels.fused_moe.uses_ksum`; a name that does not parse: the
    whole problem)."""
    try:
        _, config2 = configs_of(solution)
    except ValueError:
        return problem
    return replace(problem, token=0), fm.uses_ksum(problem.topk, problem.inter_dim, config2)


def ksum_partners(jobs: Sequence[tuple[MoeProblem, Solution]]) -> list[tuple[MoeProblem, Solution]]:
    """Jobs that build each GEMM1 config of ``jobs`` (per problem) in the counter-clearing variant it lacks: paired
    with the first GEMM2 config of that problem's jobs that sums the k slots itself (KSUM), or with the first that
    does not. ``FUSED`` pairs have one kernel and no partner (:func:`~aiter_gemm.kernels.fused_moe.pair_error`)."""
    by_problem: dict[MoeProblem, dict[str, tuple[MoeConfig, MoeConfig]]] = {}
    for problem, sol in jobs:
        try:
            configs = configs_of(sol)
        except ValueError:
            continue
        if not any(c.fused for c in configs):
            by_problem.setdefault(problem, {})[sol.kernelName] = configs
    extra: dict[tuple[MoeProblem, Solution], None] = {}
    for p, pairs in by_problem.items():
        ksum = {c2: fm.uses_ksum(p.topk, p.inter_dim, c2) for _, c2 in pairs.values()}
        partner = {flag: next((c2 for c2, f in ksum.items() if f == flag), None) for flag in (True, False)}
        have = {(c1, ksum[c2]) for c1, c2 in pairs.values()}
        for c1, c2 in pairs.values():
            other = partner[not ksum[c2]]
            if other is not None and (c1, not ksum[c2]) not in have:
                extra[(p, solution_of(c1, other))] = None
    return list(extra)


def build_job(problem: MoeProblem, solution: Solution) -> None:
    """Run ``solution`` once on ``problem``'s sizes on zero experts (:func:`~aiter_gemm.kernels.fused_moe.
    zero_inputs`) on this process's GPU, so Triton builds (or loads) what its calls launch: a build process's job."""
    from aiter_gemm.backends._triton_precompile import run_once

    p = problem
    run_once(BACKEND, p, solution, lambda device: fm.zero_inputs(p.token, p.model_dim, p.inter_dim, p.expert, p.topk,
                                                                 p.dtype, p.fp8, device))


BACKEND = FusedMoeTritonBackend()
