"""The fused MoE's bound Triton launches (issue 52): each launch of a call (the token sorts, both GEMMs, a split
GEMM1's epilogue) packed from Triton's signature and checked against its PTX entry (compiled for sm_90 on the CPU);
a bound call's parameters are Triton's for the same tensors, with the call's own pointers (its inputs and every
tensor allocated in the call); the Triton backend's runner, which binds per layout, over plans emulated in Python on
interpreted kernels (results unchanged, re-allocated inputs, what declines); and on a GPU, bit for bit the results
of Triton's own launches, bf16 and FP8, T 1, 3 and 37."""

from __future__ import annotations

import contextlib
import struct
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from aiter_gemm import cudagraph, triton_launch
from aiter_gemm.backends.base import ACT_TYPES, QUANT_BLOCK, QUANT_NONE, MoeProblem
from aiter_gemm.backends.fused_moe import triton as moe_backend
from aiter_gemm.kernels import fused_moe as fm
from aiter_gemm.kernels import fused_moe_fused as fmf
from aiter_gemm.kernels import moe_align
from aiter_gemm.op_entry import EXT
from aiter_gemm.ops.fused_moe import FUSED_MOE
from op_tests.sm90_compile import compiled_cases

REPO = Path(__file__).resolve().parents[1]
FP8 = torch.float8_e4m3fn
ALIGN, GEMM, ACT, FUSED = "_moe_align_kernel", "_fused_moe_kernel", "_act_mul_kernel", "_fused_moe_one_launch_kernel"
#: name -> (fp8, T, H, I, E, k, GEMM1's config, GEMM2's config or "" (the same), the kernels launched in order).
CASES = {
    "bf16_t3": (False, 3, 256, 128, 8, 2, "moe_BM16_BN64_BK64_GM1_SK1_W4_S3", "", (ALIGN, GEMM, GEMM)),
    "fp8_t37_two_sorts": (True, 37, 256, 256, 8, 2, "moe_BM16_BN64_BK128_GM1_SK1_W4_S3",
                          "moe_BM32_BN64_BK128_GM1_SK1_W4_S3", (ALIGN, GEMM, ALIGN, GEMM)),
    "fp8_t1_qa_direct_ksum": (True, 1, 256, 256, 8, 2, "moe_BM16_BN64_BK128_GM1_SK1_W4_S3_QA_DIRECT",
                              "moe_BM16_BN64_BK128_GM1_SK1_W4_S3_QA_DIRECT_KSUM", (GEMM, GEMM)),
    "bf16_t1_split": (False, 1, 512, 256, 8, 2, "moe_BM16_BN64_BK64_GM1_SK2_W4_S3", "", (ALIGN, GEMM, ACT, GEMM)),
    "fp8_t1_fused": (True, 1, 256, 256, 8, 2, "moe_BM16_BN64_BK128_GM1_SK1_W4_S3_FUSED", "", (FUSED,)),
    "bf16_t3_fused": (False, 3, 256, 128, 8, 2, "moe_BM16_BN32_BK256_GM1_SK1_W4_S2_FUSED", "", (FUSED,)),
    "fp8_t1_fused_bk512": (True, 1, 512, 256, 8, 2, "moe_BM16_BN16_BK512_GM1_SK1_W8_S3_FUSED", "", (FUSED,)),
    "fp8_t3_fused_bk256_ragged": (True, 3, 384, 192, 8, 2, "moe_BM16_BN32_BK256_GM1_SK1_W4_S4_FUSED", "", (FUSED,)),
    "fp8_t1_swap_qa_direct_ksum": (True, 1, 256, 256, 8, 2, "moe_BM8_BN64_BK128_GM1_SK1_W4_S3_QA_DIRECT_SWAP",
                                   "moe_BM8_BN64_BK128_GM1_SK1_W4_S3_QA_DIRECT_KSUM_SWAP", (GEMM, GEMM)),
    "bf16_t3_swap_gemm1": (False, 3, 256, 128, 8, 2, "moe_BM8_BN64_BK64_GM1_SK1_W4_S3_SWAP",
                           "moe_BM16_BN64_BK64_GM1_SK1_W4_S3", (ALIGN, GEMM, ALIGN, GEMM)),
}


def case_inputs(case: str, seed: int = 0, device: str = "cpu") -> tuple:
    """(hidden_states, w1, w2, topk_weight, topk_ids, w1_scale, w2_scale) of a case (the op's tuner inputs: uniform
    routing, so most of the 8 experts get no token at T = 1 and some none at T = 3)."""
    fp8, T, H, inter, E, k = CASES[case][:6]
    q = FP8 if fp8 else torch.bfloat16
    p = MoeProblem(T, H, inter, E, k, ACT_TYPES["silu"], torch.bfloat16, q, q, QUANT_BLOCK if fp8 else QUANT_NONE)
    return tuple(FUSED_MOE.make_inputs(p, seed, torch.device(device), 0, {}).sets[0])


def configs(case: str) -> tuple[fm.MoeConfig, fm.MoeConfig]:
    first, second = CASES[case][6:8]
    return fm.MoeConfig.parse(first), fm.MoeConfig.parse(second or first)


class Recorder:
    """Stands for a JIT kernel: records each ``kernel[grid](**kwargs)``, launches it when ``launch`` (interpreted),
    and returns ``compiled(i)`` (i: the launch's index among the recorded ones)."""

    def __init__(self, kernel, calls: list, compiled, launch: bool) -> None:
        self.kernel, self.arg_names, self.calls, self.compiled, self.launch = kernel, kernel.arg_names, calls, \
            compiled, launch

    def __getitem__(self, grid):
        def launch(**kwargs):
            if self.launch:
                self.kernel[grid](**kwargs)
            self.calls.append((self.kernel, grid, kwargs))
            return self.compiled(len(self.calls) - 1)

        return launch


@contextlib.contextmanager
def recording(compiled=lambda i: None, launch: bool = False):
    """The MoE's JIT kernels replaced by :class:`Recorder`\\ s; yields the recorded (kernel, grid, kwargs) calls."""
    calls: list = []
    saved = fm._fused_moe_kernel, fm._act_mul_kernel, moe_align._moe_align_kernel, fmf._fused_moe_one_launch_kernel
    fm._fused_moe_kernel, fm._act_mul_kernel, moe_align._moe_align_kernel, fmf._fused_moe_one_launch_kernel = (
        Recorder(k, calls, compiled, launch) for k in saved)
    try:
        yield calls
    finally:
        fm._fused_moe_kernel, fm._act_mul_kernel, moe_align._moe_align_kernel, fmf._fused_moe_one_launch_kernel = saved


def launches_of(case: str, compiled, tensors: tuple | None = None) -> list[triton_launch.Launch]:
    """The launches (as bound) of one call of the case through Triton's launcher, the i-th returning
    ``compiled(i)``."""
    seq = triton_launch.LaunchSequence(launches=[])
    with recording(compiled), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # FP8: the interpreter quantizes GEMM1's unwritten output
        fm.launch_fused_moe(*(tensors or case_inputs(case)), "silu", *configs(case), seq)
    return seq.launches


_CALLS = """
from op_tests.test_moe_bound import CASES, recording, case_inputs, configs
from aiter_gemm.kernels import fused_moe as fm
from aiter_gemm.triton_launch import LaunchSequence


def calls_of(case):
    with recording() as calls:
        fm.launch_fused_moe(*case_inputs(case), "silu", *configs(case), LaunchSequence(launches=[]))
    return calls
"""


@pytest.fixture(scope="module")
def compiled_moe():
    """Each case's launches compiled for sm_90 by the installed Triton as its JIT would specialize them (no GPU
    needed), as ``plan_args`` reads a CompiledKernel. In a fresh interpreter: the one these tests run under cannot
    compile."""
    return compiled_cases(_CALLS, "compiling the MoE's launches")


def _plan_args(launch: triton_launch.Launch) -> triton_launch.PlanArgs:
    return triton_launch.plan_args(launch.compiled, launch.grid, launch.args, launch.inputs, launch.outputs)


_INT = {"u32": "<I", "s32": "<i", "b32": "<i", "u64": "<Q", "s64": "<q", "b64": "<q"}


@pytest.mark.parametrize("case", list(CASES))
def test_moe_plan_args_match_the_ptx_entry(compiled_moe, case):
    """Each launch of a call binds: every parameter of the PTX entry gets its value, pointers the tensor they were
    launched with (an input of the plan, or an output it allocates: the sort's), integers their value, then
    Triton's scratch pointers, null."""
    launches = launches_of(case, lambda i: compiled_moe[case][i])
    assert tuple(launch.compiled.metadata.name for launch in launches) == CASES[case][8]
    for launch in launches:
        pa = _plan_args(launch)
        tensors = [*launch.inputs, *launch.outputs]
        ptx = triton_launch.ptx_params(launch.compiled.asm["ptx"], launch.compiled.metadata.name)
        signature = launch.compiled.src.signature
        want = [launch.args[n] for n in launch.compiled.src.fn.arg_names if signature[n] != "constexpr"]
        assert len(pa.offsets) == len(ptx) and len(ptx) - len(want) in (1, 2)  # scratch pointers: 3.2+, 3.5+
        assert pa.tensor_maps == () and pa.grid == (*launch.grid, 1, 1)[:3]
        pointers = dict(zip(pa.pointers[::2], pa.pointers[1::2]))
        for i, (ty, off) in enumerate(zip(ptx, pa.offsets)):
            value = want[i] if i < len(want) else None
            if isinstance(value, torch.Tensor):
                assert ty == "u64" and tensors[pointers[i]] is value, (case, i)
                continue
            (got,) = struct.unpack_from(_INT[ty], pa.blob, off)
            assert got == (value or 0), (case, launch.compiled.metadata.name, i, ty, value)
        assert len(pointers) == sum(isinstance(v, torch.Tensor) for v in want)


@pytest.mark.parametrize("case, swapped", [("bf16_t3_swap_gemm1", [True, False]),
                                           ("fp8_t1_swap_qa_direct_ksum", [True, True]),
                                           ("fp8_t1_qa_direct_ksum", [False, False])])
def test_swapped_gemms_lower_to_wgmma(compiled_moe, case, swapped):
    """A SWAP config's dots put its 64 weight rows on the MMA's M side: Triton lowers them to Hopper's wgmma on
    sm_90, where an unswapped 16-row block (M below wgmma's 64) gets mma.sync."""
    gemms = [k.asm["ptx"] for k in compiled_moe[case] if k.metadata.name == GEMM]
    assert ["wgmma.mma_async" in ptx for ptx in gemms] == swapped
    assert ["mma.sync" in ptx for ptx in gemms] == [not s for s in swapped]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # FP8: the interpreter quantizes GEMM1's unwritten output
@pytest.mark.parametrize("case", list(CASES))
def test_bound_call_passes_tritons_arguments_with_its_own_tensors(compiled_moe, case, monkeypatch):
    """A call of a bound layout with re-allocated tensors: each C++ plan packs exactly what Triton's launcher
    packs for the same tensors (every integer; the call's own tensors' pointers; the tensors it allocates, the
    sorts' outputs included, flowing to the launches Triton's call gives them to), never a pointer of the call that
    bound it."""
    if EXT is None or not hasattr(EXT, "triton_plan_params"):
        pytest.skip("the C++ eager extension (with bound launches) is not built")
    compiled = compiled_moe[case]
    first = launches_of(case, lambda i: compiled[i])  # kept: its tensors stay allocated
    hooks = triton_launch.hooks_owner()
    plans = tuple(EXT.triton_plan(1, *_plan_args(launch), launch.compiled, hooks) for launch in first)
    fresh = case_inputs(case, seed=1)
    packed, kept = [], []

    def packing_run(plan, *inputs):  # what a bound launch would pass, without a GPU
        got = EXT.triton_plan_params(plan, *inputs)
        if got is None:
            return None
        packed.append(got[0])
        kept.append((inputs, got[1]))
        return got[1]

    monkeypatch.setattr(triton_launch, "run", packing_run)
    seq = triton_launch.LaunchSequence(plans)
    with recording(lambda i: compiled[i]) as calls:
        fm.launch_fused_moe(*fresh, "silu", *configs(case), seq)
    assert not seq.missed and calls == [] and len(packed) == len(plans)  # every launch bound, none Triton's
    theirs = launches_of(case, lambda i: compiled[i], fresh)
    old = {t.data_ptr() for launch in first for t in (*launch.inputs, *launch.outputs)}
    own = {t.data_ptr() for t in fresh if t is not None}
    ours_seq, theirs_seq = [], []
    for blob, launch in zip(packed, theirs):
        pa = _plan_args(launch)
        tensors = [*launch.inputs, *launch.outputs]
        slots = [(pa.offsets[p], tensors[t]) for p, t in zip(pa.pointers[::2], pa.pointers[1::2])]
        masked = bytearray(blob)
        for off, t in slots:
            (ptr,) = struct.unpack_from("<Q", blob, off)
            ours_seq.append(ptr)
            theirs_seq.append(t.data_ptr())
            masked[off:off + 8] = bytes(8)
            if t.data_ptr() in own:  # one of the call's tensors: its own pointer
                assert ptr == t.data_ptr()
            else:  # a tensor of this call's (its sorts' output, an intermediate): never the bound call's
                assert ptr not in old and ptr not in own
        assert bytes(masked) == pa.blob, (case, launch.compiled.metadata.name)  # the integers: Triton's

    def shape(ptrs: list[int]) -> list[int]:  # which tensor each slot gets, numbered by first use
        first_use: dict[int, int] = {}
        return [first_use.setdefault(p, len(first_use)) for p in ptrs]

    assert shape(ours_seq) == shape(theirs_seq)


@pytest.mark.parametrize("change, reason", [
    (lambda launch: (launch.inputs[:6] + launch.inputs[7:], launch.outputs), "neither an input nor an output"),
    (lambda launch: (launch.inputs, (torch.empty(1, device="meta"),)), "not one device"),
])
def test_moe_plan_args_decline_what_they_cannot_prove(compiled_moe, change, reason):
    """A launch whose tensors are not all the plan's (here GEMM1 without its sorted ids) or on two devices."""
    (gemm1,) = [launch for launch in launches_of("bf16_t3", lambda i: compiled_moe["bf16_t3"][i])][1:2]
    inputs, outputs = change(gemm1)
    with pytest.raises(triton_launch.Unsupported, match=reason):
        triton_launch.plan_args(gemm1.compiled, gemm1.grid, gemm1.args, inputs, outputs)


# ---- the runner (CPU: plans emulated in Python, kernels interpreted) -----------------------------------------------
@pytest.fixture
def emulated(monkeypatch):
    """BoundRunner over plans emulated in Python: ``bind`` keeps the recorded launch (the kernel and every argument,
    constexprs included; None for the kernels named in ``state.unbindable``), ``run`` checks the call's tensors as
    the C++ plan does (dtype, shape, strides), allocates the outputs and launches the kernel interpreted with the
    call's tensors in place of the bound ones (None for the kernels in ``state.declining``). CPU tensors pose as
    CUDA ones. Yields the state; ``state.calls``: Triton's launches."""
    state = SimpleNamespace(bound=[], ran=[], unbindable=(), declining=())

    def bind(compiled, grid, args, inputs, outputs):
        state.bound.append(compiled.metadata.name)
        return None if compiled.metadata.name in state.unbindable else SimpleNamespace(
            launch=compiled, inputs=tuple(inputs), outputs=tuple(outputs))

    def run(plan, *inputs):
        name = plan.launch.metadata.name
        if name in state.declining or len(inputs) != len(plan.inputs) or any(
                (t.dtype, t.shape, t.stride()) != (b.dtype, b.shape, b.stride()) for t, b in zip(inputs, plan.inputs)):
            return None
        outs = tuple(torch.empty_strided(o.shape, o.stride(), dtype=o.dtype) for o in plan.outputs)
        swap = {id(b): t for b, t in zip((*plan.inputs, *plan.outputs), (*inputs, *outs))}
        kwargs = {}
        for key, value in plan.launch.kwargs.items():
            if isinstance(value, torch.Tensor):
                assert id(value) in swap, f"{name}: {key} is not one of the plan's tensors"
                value = swap[id(value)]
            kwargs[key] = value
        plan.launch.kernel[plan.launch.grid](**kwargs)
        state.ran.append(name)
        return outs

    monkeypatch.setattr(triton_launch, "bind", bind)
    monkeypatch.setattr(triton_launch, "run", run)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    with recording(lambda i: SimpleNamespace(kernel=calls[i][0], grid=calls[i][1], kwargs=calls[i][2],
                                             metadata=SimpleNamespace(name=calls[i][0].fn.__name__)),
                   launch=True) as calls:
        state.calls = calls
        yield state


def _triton(case: str, tensors: tuple) -> torch.Tensor:
    """The call through Triton's launcher alone."""
    return fm.launch_fused_moe(*tensors, "silu", *configs(case))


@pytest.mark.interpreted
@pytest.mark.parametrize("case", list(CASES))
def test_runner_binds_a_layout_once_then_runs_its_plans(emulated, case):
    """The first call runs Triton's launches and binds each; a call with re-allocated tensors (other weights, other
    routing) then runs every launch from its plan, with results Triton's launches give for those tensors."""
    runner = moe_backend.BoundRunner(*configs(case), "silu")
    first = case_inputs(case)
    out = runner(*first)
    kernels = CASES[case][8]
    assert emulated.bound == list(kernels) and emulated.ran == []
    assert torch.equal(out, _triton(case, first))
    fresh = case_inputs(case, seed=1)
    launched = len(emulated.calls)
    got = runner(*fresh)
    assert emulated.ran == list(kernels) and len(emulated.calls) == launched  # no Triton launch
    want = _triton(case, fresh)
    assert not torch.equal(want, out) and torch.equal(got, want)
    assert len(emulated.bound) == len(kernels)  # bound once


@pytest.mark.interpreted
def test_runner_falls_back_per_launch_and_binds_another_layout(emulated):
    """A launch that cannot be bound, or whose plan declines, runs Triton's launch (the others their plans) with
    the same results; a call of another layout (hidden_states' rows strided) runs the plans that take it, then binds
    its own on its next call."""
    case = "bf16_t1_split"
    emulated.unbindable = (ACT,)
    runner = moe_backend.BoundRunner(*configs(case), "silu")
    x = case_inputs(case)
    runner(*x)
    launched = len(emulated.calls)
    assert torch.equal(runner(*x), _triton(case, x))
    assert emulated.ran == [ALIGN, GEMM, GEMM] and len(emulated.calls) == launched + 1 + 4  # + act, + _triton's 4
    emulated.declining, emulated.ran = (ALIGN,), []
    assert torch.equal(runner(*x), _triton(case, x)) and emulated.ran == [GEMM, GEMM]
    emulated.declining = ()
    runner(*x)  # after a plan declined, a call looks its layout up (its plans again)
    T, H = x[0].shape
    strided = torch.zeros(T, 2 * H, dtype=x[0].dtype)[:, :H].copy_(x[0])
    other = (strided, *x[1:])
    emulated.ran = []
    assert torch.equal(runner(*other), _triton(case, x)) and emulated.ran == [ALIGN, GEMM]  # GEMM1's plan declines
    assert len(runner._plans) == 1
    assert torch.equal(runner(*other), _triton(case, x)) and len(runner._plans) == 2  # bound on its next call
    emulated.ran = []
    assert torch.equal(runner(*other), _triton(case, x)) and emulated.ran == [ALIGN, GEMM, GEMM]
    assert runner.launch_path(*other) == (f"bound launches: {ALIGN}, {GEMM}, {GEMM}; Triton's launcher: {ACT} (the "
                                          "log says why)")


@pytest.mark.interpreted
def test_runner_starts_over_past_its_layouts_with_their_kernel_names(emulated, monkeypatch):
    """Past MAX_LAYOUTS layouts the runner's plans start over (:class:`~aiter_gemm.triton_launch.PlanCache`), and
    the kernel names launch_path reads go with them."""
    monkeypatch.setattr(triton_launch.PlanCache, "MAX_LAYOUTS", 1)
    case = "bf16_t3"
    runner = moe_backend.BoundRunner(*configs(case), "silu")
    x = case_inputs(case)
    runner(*x)
    T, H = x[0].shape
    other = (torch.zeros(T, 2 * H, dtype=x[0].dtype)[:, :H].copy_(x[0]), *x[1:])  # hidden_states' rows strided
    runner(*other)  # x's GEMM1 plan declines
    assert torch.equal(runner(*other), _triton(case, x))  # binds its own, starting over
    assert list(runner._plans) == list(runner._kernels) == [runner.layout(*other)]
    assert runner.launch_path(*x) == "Triton's launcher (not called yet with this layout)"
    assert runner.launch_path(*other) == f"bound launches: {ALIGN}, {GEMM}, {GEMM}"


@pytest.mark.interpreted
def test_runner_binds_no_misaligned_tensor_and_tries_an_unbindable_layout_once(emulated):
    case = "bf16_t3"
    runner = moe_backend.BoundRunner(*configs(case), "silu")
    x = case_inputs(case)
    T, H = x[0].shape
    odd = torch.empty(T * H + 1, dtype=x[0].dtype)[1:].view(T, H).copy_(x[0])  # 2 bytes off: not 16-byte aligned
    assert torch.equal(runner(odd, *x[1:]), _triton(case, x))
    assert emulated.bound == [] and runner._plans == {}
    assert runner.launch_path(*x) == "Triton's launcher (not called yet with this layout)"
    emulated.unbindable = (ALIGN, GEMM)  # nothing binds (logged once each): Triton's launches, no second try
    runner(*x)
    runner(*x)
    assert emulated.bound == [ALIGN, GEMM, GEMM] and emulated.ran == [] and runner._plans == {
        runner.layout(*x): None}
    assert runner.launch_path(*x) == "Triton's launcher (nothing bound: the log says why)"


@pytest.mark.interpreted
def test_runner_under_capture_runs_tritons_launches(emulated, monkeypatch):
    """CUDA-graph capture (a graph has no host cost per call to save) runs Triton's launches: no plan, no binding,
    before and after the layout is bound."""
    case = "fp8_t1_qa_direct_ksum"
    runner = moe_backend.BoundRunner(*configs(case), "silu")
    x = case_inputs(case)
    monkeypatch.setattr(cudagraph.capture_state, "depth", 1)
    runner._capturing = cudagraph.capturing
    runner(*x)
    assert emulated.bound == [] and runner._plans == {}
    monkeypatch.setattr(cudagraph.capture_state, "depth", 0)
    runner(*x)
    assert emulated.bound == [GEMM, GEMM]
    monkeypatch.setattr(cudagraph.capture_state, "depth", 1)
    assert torch.equal(runner(*x), _triton(case, x)) and emulated.ran == []


@pytest.mark.interpreted
def test_launches_that_cannot_bind_keep_tritons_launcher_with_the_reason_logged(compiled_moe, monkeypatch, caplog):
    """Through the real ``bind``: kernels compiled but not loaded (no CUfunction here) are declined, each logged
    once with its reason, and the call's launches stay Triton's."""
    monkeypatch.setattr(triton_launch, "_warned", set())
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    case = "bf16_t3"
    runner = moe_backend.BoundRunner(*configs(case), "silu")
    x = case_inputs(case)
    with caplog.at_level("INFO", logger="aiter_gemm"), recording(lambda i: compiled_moe[case][i], launch=True):
        out = runner(*x)
    assert runner._plans == {runner.layout(*x): None} and torch.equal(out, _triton(case, x))
    reason = "the C++ eager extension is not built" if EXT is None else "the kernel is not loaded (no CUfunction)"
    for kernel in (ALIGN, GEMM):
        assert f"{kernel} keeps Triton's launcher: {reason}" in caplog.text


def test_runners_bind_only_compiled_launches_with_the_extension(monkeypatch):
    """The backend's runner is a BoundRunner where launches bind (the block-scale runner's rule: the extension
    built, Triton compiling); elsewhere (CPU tests: the interpreter) Triton's launches, as before."""
    c1, c2 = configs("bf16_t3")
    monkeypatch.setattr(triton_launch, "BINDS", False)
    assert not isinstance(moe_backend.make_runner(c1, c2, "silu"), moe_backend.BoundRunner)
    monkeypatch.setattr(triton_launch, "BINDS", True)
    runner = moe_backend.make_runner(c1, c2, "gelu")
    assert isinstance(runner, moe_backend.BoundRunner) and (runner.config1, runner.activation) == (c1, "gelu")


@pytest.mark.interpreted
def test_overhead_bench_moe_rows_time_the_runner_against_tritons_launcher(emulated, monkeypatch):
    """The overhead bench's MoE rows (bf16, FP8): Triton's launches of the default configs against the backend's
    runner of the same configs, the note naming the launches bound (here over emulated plans)."""
    from benchmarks import overhead

    monkeypatch.setattr(triton_launch, "BINDS", True)
    timed = []

    def measure(ref, ours, n, repeats, sync):
        outs = [ours(), ours(), ref()]  # binds, runs bound; Triton's launches
        timed.append(all(torch.equal(o, outs[2]) for o in outs[:2]))
        return 30.0, 10.0, -20.0

    monkeypatch.setattr(overhead, "measure", measure)
    rows = overhead._moe_rows(torch.device("cpu"), 40, 3, lambda: None)
    assert timed == [True, True]
    assert [(r["label"], r["provider"], r["vs"], r["added_us"]) for r in rows] == [
        ("fused_moe_bf16", "moe_runner_bound", "triton_launcher", "-20.000"),
        ("fused_moe_fp8", "moe_runner_bound", "triton_launcher", "-20.000")]
    for r in rows:
        assert r["note"].endswith(f": bound launches: {ALIGN}, {GEMM}, {GEMM}") and r["note"].startswith("E=8 topk=2")


# ---- GPU: the bound launches give what Triton's launches give ----------------------------------------------------
#: name -> (GEMM1's config, GEMM2's config) on (E 16, k 4, H 512, I 256); None: the default configs.
GPU_CONFIGS = {
    "default": None,
    "two_sorts": ("moe_BM16_BN64_BK128_GM1_SK1_W4_S4", "moe_BM32_BN64_BK128_GM1_SK1_W4_S4"),
    "direct_ksum": ("moe_BM16_BN64_BK128_GM1_SK1_W4_S4_DIRECT", "moe_BM16_BN64_BK128_GM1_SK1_W4_S4_DIRECT_KSUM"),
    "qa": ("moe_BM16_BN64_BK128_GM1_SK1_W4_S4_QA", "moe_BM16_BN64_BK128_GM1_SK1_W4_S4_QA_KSUM"),
    "split": ("moe_BM16_BN64_BK128_GM1_SK2_W4_S4", "moe_BM16_BN64_BK128_GM1_SK2_W4_S4"),
    "fused": ("moe_BM16_BN64_BK128_GM1_SK1_W4_S4_FUSED", "moe_BM16_BN64_BK128_GM1_SK1_W4_S4_FUSED"),
}


def _gpu_case(fp8: bool, T: int, seed: int = 0) -> tuple:
    q = FP8 if fp8 else torch.bfloat16
    p = MoeProblem(T, 512, 256, 16, 4, ACT_TYPES["silu"], torch.bfloat16, q, q, QUANT_BLOCK if fp8 else QUANT_NONE)
    return tuple(FUSED_MOE.make_inputs(p, seed, torch.device("cuda"), 0, {"routing": "skewed"}).sets[0])


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("T", [1, 3, 37])
@pytest.mark.parametrize("name", list(GPU_CONFIGS))
def test_gpu_bound_moe_is_bit_identical_to_triton(fp8, T, name):
    """Skewed routing (experts without a token); after the binding call, calls with re-allocated tensors (clones,
    then other values) run every launch bound and give Triton's launches' bits (split-K, FUSED: their atomics order
    float32 sums freely, so within a few ulps)."""
    if not triton_launch.BINDS:
        pytest.skip("the C++ eager extension is not built")
    if name == "qa" and not fp8:
        pytest.skip("QA quantizes FP8 experts' activations")
    x = _gpu_case(fp8, T)
    E, inter, H, k = x[1].shape[0], x[2].shape[2], x[0].shape[1], x[4].shape[1]
    if GPU_CONFIGS[name] is None:
        c1, c2 = (fm.default_config(T, E, k, inter, H, fp8=fp8), fm.default_config(T, E, k, H, inter, fp8=fp8))
    else:
        c1, c2 = (fm.MoeConfig.parse(n) for n in GPU_CONFIGS[name])
    runner = moe_backend.BoundRunner(c1, c2, "silu")
    runner(*x)  # Triton's launches, then bound
    plans = runner._plans[runner.layout(*x)]
    assert plans is not None and all(p is not None for p in plans), runner.launch_path(*x)
    for tensors in ([t if t is None else t.clone() for t in x], _gpu_case(fp8, T, seed=1)):
        got = runner(*tensors)
        want = fm.launch_fused_moe(*tensors, "silu", c1, c2)
        torch.cuda.synchronize()
        if name in ("split", "fused"):
            torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
        else:
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (name, fp8, T)
    assert runner.launch_path(*x).startswith("bound launches: ")


@pytest.mark.gpu
def test_gpu_op_eager_calls_take_the_bound_launches(clean_runtime):
    """Through the op: the default decision's runner binds on the key's first call; later eager calls run bound
    and give Triton's bits."""
    if not triton_launch.BINDS:
        pytest.skip("the C++ eager extension is not built")
    from aiter_gemm.ops.fused_moe import _DISPATCHER, problem_of
    from op_tests.runtime_helpers import moe_call

    x = _gpu_case(True, 3)
    outs = [moe_call(x) for _ in range(3)]
    runner = _DISPATCHER.decide(problem_of(*x), True).runner
    if not isinstance(runner, moe_backend.BoundRunner):
        pytest.skip(f"this GPU's decision is {_DISPATCHER.decide(problem_of(*x), True).as_config()['libtype']}")
    assert runner.launch_path(*x).startswith("bound launches: ")
    want = fm.launch_fused_moe(*x, "silu", runner.config1, runner.config2)
    torch.cuda.synchronize()
    assert all(torch.equal(o.view(torch.int16), want.view(torch.int16)) for o in outs)
