"""The block-scale GEMM's bound Triton launches (issue 53): the kernel's parameters, TMA tensor maps included, packed
from Triton's signature and checked against its PTX entry (compiled for sm_90 on the CPU) for shipped configs at odd
M; what a plan declines; the runner that binds per layout; the eager plan keeping a Triton decision where launches
bind; and on a GPU, bit for bit the results of Triton's own launch, eagerly and in a CUDA graph."""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

import aiter_gemm
from aiter_gemm import triton_launch
from aiter_gemm.backends.a8w8_blockscale import triton as triton_backend
from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.kernels import a8w8_blockscale as bs
from aiter_gemm.kernels import common
from aiter_gemm.op_entry import EXT
from op_tests.sm90_compile import compiled_cases

REPO = Path(__file__).resolve().parents[1]
FP8 = torch.float8_e4m3fn
#: name -> (kernelName, M, N, K, x_scale M-major): configs the shipped H200 rows name (libtype triton) at odd M.
CASES = {
    "swapAB_tma_m1": ("swapAB-BM16_BN64_BK128_GM1_SK1_W4_S6_TMA", 1, 512, 512, False),
    "splitK_swapAB_tma_m3": ("splitK_swapAB-BM16_BN64_BK128_GM1_SK4_W4_S6_TMA", 3, 2112, 1024, True),
    "splitK_tma_m17": ("splitK-BM64_BN64_BK128_GM1_SK4_W4_S4_TMA", 17, 256, 1024, False),
    "base_tma_m97": ("base-BM64_BN128_BK128_GM8_SK1_W4_S4_TMA", 97, 384, 512, True),
    # K = 600: rows of 600 bytes, which TMA cannot address: the TMA config takes pointer loads
    "base_rows_unaligned_m97": ("base-BM64_BN64_BK128_GM8_SK1_W4_S4_TMA", 97, 256, 600, False),
    "base_pointers_m3": ("base-BM64_BN64_BK128_GM8_SK1_W4_S4", 3, 256, 512, False),
}


def operands(M: int, N: int, K: int, m_major: bool, device: str = "cpu") -> tuple:
    """(XQ, WQ, x_scale, w_scale) of the shape, x_scale laid out row-major or M-major (strides (1, M))."""
    kb, nb = -(-K // 128), -(-N // 128)
    xs = torch.empty_strided((M, kb), (1, M) if m_major else (kb, 1), device=device)
    return (torch.zeros(M, K, device=device).to(FP8), torch.zeros(N, K, device=device).to(FP8), xs.fill_(1.0),
            torch.ones(nb, kb, device=device))


class Recorder:
    """Stands for a JIT kernel in the launcher: records each ``kernel[grid](**kwargs)`` and returns ``compiled``."""

    def __init__(self, kernel, compiled, calls: list) -> None:
        self.kernel, self.arg_names, self.compiled, self.calls = kernel, kernel.arg_names, compiled, calls

    def __getitem__(self, grid):
        def launch(**kwargs):
            self.calls.append((self.kernel, grid, kwargs))
            return self.compiled(len(self.calls) - 1)

        return launch


@contextlib.contextmanager
def recording(compiled):
    """The launcher's kernels replaced by recorders (``compiled(i)``: what the i-th launch returns); yields the
    calls."""
    calls: list = []
    saved = bs._gemm_a8w8_blockscale_kernel, common._splitk_reduce_kernel
    bs._gemm_a8w8_blockscale_kernel = Recorder(saved[0], compiled, calls)
    common._splitk_reduce_kernel = Recorder(saved[1], compiled, calls)
    try:
        yield calls
    finally:
        bs._gemm_a8w8_blockscale_kernel, common._splitk_reduce_kernel = saved


def launches_of(case: str, compiled) -> tuple[tuple, list, list]:
    """(operands, launches, the recorded (kernel, grid, kwargs) calls) of one case's launcher call, each launch
    returning ``compiled(i)``."""
    name, M, N, K, m_major = CASES[case]
    ops = operands(M, N, K, m_major)
    launches: list = []
    with recording(compiled) as calls:
        bs.gemm_a8w8_blockscale_triton(*ops, bs.BlockscaleConfig.from_name(name),
                                       torch.empty(M, N, dtype=torch.bfloat16), launches)
    return ops, launches, calls


_CALLS = """
from op_tests.test_blockscale_bound import CASES, launches_of


def calls_of(case):
    return launches_of(case, lambda i: None)[2]
"""


@pytest.fixture(scope="module")
def compiled_gemm():
    """Each case's launches (the GEMM, then a split config's reduction) compiled for sm_90 by the installed Triton as
    its JIT would specialize them (no GPU needed), as ``plan_args`` reads a CompiledKernel. In a fresh interpreter:
    the interpreter these tests run under cannot compile."""
    return compiled_cases(_CALLS, "capturing the launcher's launches")


def expected_params(launch) -> list:
    """The values Triton's launcher passes, in order: each non-constexpr argument; a tensor descriptor as ``MAP``,
    its shape and its strides (Triton's expand_signature)."""
    out = []
    for name in launch.compiled.src.fn.arg_names:
        ty, value = launch.compiled.src.signature[name], launch.args.get(name)
        if ty == "constexpr":
            continue
        out += ["MAP", *value.shape, *value.strides] if ty.startswith("tensordesc") else [value]
    return out


_INT = {"u32": "<I", "s32": "<i", "b32": "<i", "u64": "<Q", "s64": "<q", "b64": "<q"}


@pytest.mark.parametrize("case", list(CASES))
def test_gemm_plan_args_match_the_ptx_entry(compiled_gemm, case):
    """Every parameter of the PTX entry gets its value: pointers name the operand (or output) they were launched
    with, integers their value, a TMA descriptor a 64-byte aligned 128-byte map slot (with cuTensorMapEncodeTiled's
    arguments as Triton derives them) then its shape and strides; then Triton's scratch pointers, null."""
    ops, launches, _ = launches_of(case, lambda i: compiled_gemm[case][i])
    name, M, N, K, _ = CASES[case]
    cfg = bs.BlockscaleConfig.from_name(name)
    assert len(launches) == (2 if cfg.NUM_KSPLIT > 1 else 1)
    uses_tma = cfg.TMA and K % 16 == 0
    for launch in launches:
        pa = triton_launch.plan_args(launch.compiled, launch.grid, launch.args, launch.inputs, launch.outputs)
        tensors = [*launch.inputs, *launch.outputs]
        ptx = triton_launch.ptx_params(launch.compiled.asm["ptx"], launch.compiled.metadata.name)
        want = expected_params(launch)
        assert len(pa.offsets) == len(ptx) and len(ptx) - len(want) in (1, 2)  # scratch pointers: 3.2+, 3.5+
        pointers = dict(zip(pa.pointers[::2], pa.pointers[1::2]))
        maps = {m[0]: m for m in pa.tensor_maps}
        assert len(maps) == (2 if uses_tma and launch is launches[0] else 0)
        for i, (ty, off) in enumerate(zip(ptx, pa.offsets)):
            value = want[i] if i < len(want) else None
            if value == "MAP":
                assert ty == "b8[128]" and off % 64 == 0 and pa.blob[off:off + 128] == bytes(128) and i in maps
                continue
            if isinstance(value, torch.Tensor):
                assert ty == "u64" and tensors[pointers[i]] is value, (case, i)
                continue
            (got,) = struct.unpack_from(_INT[ty], pa.blob, off)
            assert off % struct.calcsize(_INT[ty]) == 0 and got == (value or 0), (case, i, ty, value)
        for (param, index, dtype, dims, strides, box, estrides, interleave, swizzle, l2, fill, keep) in maps.values():
            desc = launch.args["a_desc" if param == min(maps) else "b_desc"]
            assert launch.inputs[index] is desc.base and dims == tuple(reversed(desc.shape))
            assert strides == (desc.strides[0],) and box == tuple(reversed(desc.block_shape))  # fp8: 1-byte elements
            assert (dtype, estrides, interleave, swizzle, l2, fill, keep) == (0, (1, 1), 0, 3, 2, 0, None)
        if cfg.variant.endswith("swapAB") and maps:
            assert launch.inputs[maps[min(maps)][1]] is ops[1]  # swapAB: the MMA's a side is the weight


@pytest.mark.parametrize("case", ["splitK_swapAB_tma_m3", "base_pointers_m3"])
def test_cpp_gemm_plan_writes_a_later_calls_pointers(compiled_gemm, case):
    """The C++ plan of a launch takes a later call of the same layout (its pointers written, tensor maps left to the
    launch, outputs allocated like the bound ones) and declines another layout."""
    if EXT is None or not hasattr(EXT, "tensormap_encode"):
        pytest.skip("the C++ eager extension (with tensor maps) is not built")
    ops, launches, _ = launches_of(case, lambda i: compiled_gemm[case][i])
    launch = launches[0]
    pa = triton_launch.plan_args(launch.compiled, launch.grid, launch.args, launch.inputs, launch.outputs)
    plan = EXT.triton_plan(1, *pa, launch.compiled, triton_launch.hooks_owner())
    _, M, N, K, m_major = CASES[case]
    fresh = operands(M, N, K, m_major)
    blob, (target,) = EXT.triton_plan_params(plan, *fresh)
    assert target.shape == launch.outputs[0].shape and target.stride() == launch.outputs[0].stride()
    assert target.dtype == launch.outputs[0].dtype
    for param, index in zip(pa.pointers[::2], pa.pointers[1::2]):
        t = [*fresh, target][index]
        assert blob[pa.offsets[param]:pa.offsets[param] + 8] == struct.pack("<Q", t.data_ptr())
    for m in pa.tensor_maps:
        assert blob[pa.offsets[m[0]]:pa.offsets[m[0]] + 128] == bytes(128)
    other = operands(M, N, K, not m_major)
    assert EXT.triton_plan_params(plan, *other) is None and EXT.triton_plan_params(plan, *fresh[:3]) is None


def _without(compiled, **meta):
    return SimpleNamespace(metadata=SimpleNamespace(**{**vars(compiled.metadata), **meta}), asm=compiled.asm,
                           src=compiled.src)


@pytest.mark.parametrize("change, reason", [
    (lambda c, a, ops: (_without(c, tensordesc_meta=None), a), "no TMA metadata"),
    (lambda c, a, ops: (c, {**a, "a_desc": TensorDescriptor.from_tensor(ops[1].clone(), [64, 128])}),
     "not a TensorDescriptor of one of the plan's inputs"),
    (lambda c, a, ops: (c, {**a, "a_desc": TensorDescriptor(ops[1], [256, 512], [512, 1], [64, 128])}),
     "is not its whole input"),
    (lambda c, a, ops: (_without(c, tensordesc_meta=[{**c.metadata.tensordesc_meta[0], "is_im2col": True},
                                                     c.metadata.tensordesc_meta[1]]), a), "im2col"),
    (lambda c, a, ops: (_without(c, global_scratch_size=64), a), "global scratch"),
    (lambda c, a, ops: (SimpleNamespace(metadata=c.metadata, src=c.src, asm={"ptx": c.asm["ptx"].replace(
        ".param .align 64 .b8 _gemm_a8w8_blockscale_kernel_param_5[128]",
        ".param .u64 _gemm_a8w8_blockscale_kernel_param_5", 1)}), a), "not the Triton ABI"),
])
def test_gemm_plan_args_decline_what_they_cannot_prove(compiled_gemm, change, reason):
    ops, (launch,), _ = launches_of("base_tma_m97", lambda i: compiled_gemm["base_tma_m97"][i])
    compiled, args = change(launch.compiled, dict(launch.args), ops)
    with pytest.raises(triton_launch.Unsupported, match=reason):
        triton_launch.plan_args(compiled, launch.grid, args, launch.inputs, launch.outputs)


def test_map_keep_allows_only_tritons_small_tensor_fix():
    """Triton 3.9 clears bit 21 of a small tensor's map (word 1) on drivers up to 13.1: the plan learns that as an
    AND-mask from Triton's own map of the bound call; any other difference declines."""
    def words(second: int) -> bytes:
        return struct.pack("<16Q", 7, second, *range(2, 16))

    ours = words(2 | 1 << 21)
    assert triton_launch._map_keep(ours, ours) is None
    keep = triton_launch._map_keep(ours, words(2))
    assert keep is not None and bytes(a & b for a, b in zip(ours, keep)) == words(2)
    for other in (words(3 | 1 << 21), words(3), words(2)[:-1] + b"\1"):
        with pytest.raises(triton_launch.Unsupported, match="differs from Triton's"):
            triton_launch._map_keep(ours, other)


def test_checked_maps_compare_with_tritons_own_map(compiled_gemm, monkeypatch):
    """bind encodes each map for the bound call's address and compares it with the map Triton's launcher makes of the
    same descriptor (make_tensordesc_arg): equal, the plan keeps it; Triton's small-tensor fix, the plan applies it."""
    import triton.backends.nvidia.driver as nv

    ops, (launch,), _ = launches_of("base_tma_m97", lambda i: compiled_gemm["base_tma_m97"][i])
    pa = triton_launch.plan_args(launch.compiled, launch.grid, launch.args, launch.inputs, launch.outputs)
    encoded = []
    mine = bytes(8) + struct.pack("<Q", 1 << 21) + bytes(112)
    fake = SimpleNamespace(tensormap_encode=lambda spec, address: encoded.append((spec, address)) or mine,
                           tensormap_bytes=lambda obj: obj)
    monkeypatch.setattr(triton_launch, "EXT", fake)
    monkeypatch.setattr(nv, "make_tensordesc_arg", lambda desc, meta, _: [theirs, *desc.shape, *desc.strides])
    theirs = mine
    assert triton_launch._checked_maps(launch.compiled, launch.args, pa) == pa.tensor_maps
    assert [a for _, a in encoded] == [launch.args["a_desc"].base.data_ptr(), launch.args["b_desc"].base.data_ptr()]
    theirs = bytes(128)
    maps = triton_launch._checked_maps(launch.compiled, launch.args, pa)
    assert [m[:-1] for m in maps] == [m[:-1] for m in pa.tensor_maps] and all(m[-1] is not None for m in maps)
    theirs = b"\1" + bytes(127)
    with pytest.raises(triton_launch.Unsupported, match="differs"):
        triton_launch._checked_maps(launch.compiled, launch.args, pa)
    held = torch.zeros(192, dtype=torch.uint8)  # Triton before 3.5: an object holding the map in host memory
    start = -held.data_ptr() % 64
    held[start + 8 + 2] = 1 << 5  # bit 21 of word 1 clear... in ``mine``; theirs here holds it: differs
    theirs = SimpleNamespace(tma_desc_cpu_ptr=lambda: held.data_ptr() + start)
    assert triton_launch._map_bytes(theirs) == mine
    assert triton_launch._checked_maps(launch.compiled, launch.args, pa) == pa.tensor_maps

    def broken(desc, meta, _):
        raise RuntimeError("no driver")

    monkeypatch.setattr(nv, "make_tensordesc_arg", broken)
    with pytest.raises(triton_launch.Unsupported, match="could not be read"):
        triton_launch._checked_maps(launch.compiled, launch.args, pa)


def test_cpp_tensor_map_specs_are_checked(compiled_gemm):
    """The C++ side takes a map spec only of rank 1-5 with 128-byte ``keep``, at a 64-byte aligned 128-byte parameter
    addressing an input; without a CUDA driver it encodes nothing, with one it encodes the 128-byte map."""
    if EXT is None or not hasattr(EXT, "tensormap_encode"):
        pytest.skip("the C++ eager extension (with tensor maps) is not built")
    ops, (launch,), _ = launches_of("base_tma_m97", lambda i: compiled_gemm["base_tma_m97"][i])
    pa = triton_launch.plan_args(launch.compiled, launch.grid, launch.args, launch.inputs, launch.outputs)
    spec = pa.tensor_maps[0]
    encoded = EXT.tensormap_encode(spec, ops[0].data_ptr())
    if torch.cuda.is_available():
        assert isinstance(encoded, bytes) and len(encoded) == 128
    else:
        assert encoded is None  # no libcuda loaded here
    for bad in ((*spec[:3], (1,) * 6, *spec[4:]), (*spec[:-1], b"short")):
        with pytest.raises(ValueError):
            EXT.tensormap_encode(bad, 0)
    hooks = triton_launch.hooks_owner()
    for bad in ((spec[0] + 2, *spec[1:]), (spec[0], 9, *spec[2:])):  # a u32 parameter (offset 196); no input 9
        with pytest.raises(ValueError, match="tensor maps"):
            EXT.triton_plan(1, *pa._replace(tensor_maps=(bad,)), launch.compiled, hooks)
    with pytest.raises(TypeError, match="PyCUtensorMap"):
        EXT.tensormap_bytes(b"x" * 200)


# ---- the runner (CPU: fake plans) ---------------------------------------------------------------------------------
@pytest.fixture
def fake_binding(monkeypatch):
    """BoundRunner over fake plans: ``bind_all`` returns ``state.plans`` (recording the launches), ``run`` answers
    ``state.answer(plan, *inputs)``; CPU tensors pose as CUDA ones (the kernel itself runs interpreted)."""
    state = SimpleNamespace(plans=("gemm",), bound=[], ran=[], answer=lambda plan, *t: None)
    monkeypatch.setattr(triton_launch, "bind_all", lambda launches: state.bound.append(list(launches)) or state.plans)
    monkeypatch.setattr(triton_launch, "run", lambda plan, *t: state.ran.append(plan) or state.answer(plan, *t))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    return state


@pytest.mark.interpreted
def test_runner_binds_a_layout_once_then_runs_its_plan(fake_binding):
    cfg = bs.BlockscaleConfig.from_name(CASES["base_tma_m97"][0])
    runner = triton_backend.BoundRunner(cfg)
    ops = operands(5, 256, 512, False)
    ref = runner(*ops, torch.bfloat16)  # Triton's launch, bound after it
    (launches,) = fake_binding.bound
    assert [tuple(launch.inputs) for launch in launches] == [ops] and launches[0].outputs[0].shape == (5, 256)
    fake_binding.answer = lambda plan, *t: ("bound out",)
    assert runner(*ops, torch.bfloat16) == "bound out" and fake_binding.ran == ["gemm"]
    fake_binding.answer = lambda plan, *t: None  # the plan declines (a launch hook, another device...): Triton's
    assert torch.equal(runner(*ops, torch.bfloat16), ref) and len(fake_binding.bound) == 1
    m_major = operands(5, 256, 512, True)  # another layout: bound on its own first call
    runner(*m_major, torch.bfloat16)
    assert len(fake_binding.bound) == 2 and len(runner._plans) == 2


@pytest.mark.interpreted
def test_runner_never_binds_a_misaligned_operand_nor_an_unbindable_layout(fake_binding):
    runner = triton_backend.BoundRunner(bs.BlockscaleConfig.from_name(CASES["base_tma_m97"][0]))
    XQ, WQ, xs, ws = operands(4, 256, 512, False)
    odd = torch.empty(4 * 512 + 1, dtype=torch.uint8)[1:].view(FP8).view(4, 512)  # 1-byte offset
    runner(odd, WQ, xs, ws, torch.bfloat16)
    assert fake_binding.bound == [] and runner._plans == {}
    fake_binding.plans = None  # bind declined (logged once): Triton's launch from now on, no second try
    runner(XQ, WQ, xs, ws, torch.bfloat16)
    runner(XQ, WQ, xs, ws, torch.bfloat16)
    assert len(fake_binding.bound) == 1 and fake_binding.ran == []


@pytest.mark.interpreted
def test_runner_chains_a_split_configs_reduction(fake_binding):
    """A split config binds two launches: the GEMM into a float32 workspace, whose output the reduction's plan
    takes; a reduction that declines runs Triton's (the same sum)."""
    name, M, N, K, m_major = CASES["splitK_tma_m17"]
    runner = triton_backend.BoundRunner(bs.BlockscaleConfig.from_name(name))
    ops = operands(M, N, K, m_major)
    fake_binding.plans = ("gemm", "reduce")
    runner(*ops, torch.float32)  # float32: the interpreter's bf16 cast is not round-to-nearest
    (launches,) = fake_binding.bound
    assert len(launches) == 2 and launches[1].inputs == launches[0].outputs
    ws = torch.arange(4 * M * N, dtype=torch.float32).view(4, M, N)
    fake_binding.answer = lambda plan, *t: (ws,) if plan == "gemm" else ("reduced",)
    assert runner(*ops, torch.float32) == "reduced" and fake_binding.ran == ["gemm", "reduce"]
    fake_binding.answer = lambda plan, *t: (ws,) if plan == "gemm" else None
    assert torch.equal(runner(*ops, torch.float32), ws.sum(0))


def test_runners_bind_only_compiled_launches_with_the_extension(monkeypatch):
    """The runner is a BoundRunner exactly where launches bind (``triton_launch.BINDS``: the extension built, Triton
    compiling; that rule: test_triton_launch.py)."""
    cfg = bs.BlockscaleConfig.from_name(CASES["base_tma_m97"][0])
    monkeypatch.setattr(triton_launch, "BINDS", False)
    assert not isinstance(triton_backend.make_runner(cfg), triton_backend.BoundRunner)
    monkeypatch.setattr(triton_launch, "BINDS", True)
    assert isinstance(triton_backend.make_runner(cfg), triton_backend.BoundRunner)


# ---- the eager switch ----------------------------------------------------------------------------------------------
H200 = DeviceIdentity("sm_90", 132, "cuda", "NVIDIA H200")


@pytest.mark.parametrize("bound, kind, eager", [(True, "cuda", "triton"), (False, "cuda", "torch"),
                                                (True, "hip", "torch")])
def test_eager_plan_keeps_a_triton_decision_where_its_launch_binds(clean_runtime, bound, kind, eager):
    """A shipped H200 Triton row (and the Triton default) runs eagerly as decided where runners bind their launches
    (C++ extension built, compiled Triton, a CUDA GPU); elsewhere eager calls give way to torch's matmul."""
    import op_tests.fake_scaled_mm as fake

    clean_runtime.setattr(torch.nn.functional, "scaled_mm", torch.nn.functional.scaled_mm, raising=False)
    clean_runtime.setattr(fake.torch_impl, "unavailable_reason", fake.torch_impl.unavailable_reason)
    fake.install()
    clean_runtime.setattr(triton_launch, "BINDS", bound)
    aiter_gemm.reload_configs()
    disp = aiter_gemm.get_dispatcher("gemm_a8w8_blockscale")
    ident = DeviceIdentity("sm_90", 132, kind, H200.name)
    for M, N, K in ((1, 512, 7168), (17, 4096, 512)):  # the shipped row; an untuned shape (the Triton default)
        dec = disp._decide(GemmProblem(M, N, K, False, FP8, torch.bfloat16), ident)
        assert dec.solution.libtype == "triton"
        assert dec.as_config()["eager_libtype"] == eager and (dec.eager_solution is None) == (eager == "triton")
        assert dec.eager_plan().probe is None if eager == "triton" else dec.eager_plan().probe is not None


@pytest.mark.parametrize("bound", [True, False])
def test_x_scale_layout_of_an_eager_triton_row(clean_runtime, bound):
    """x_scale_m_major follows the eager plan: a Triton row kept eagerly (its launch bound) takes its kernel's
    row-major layout, one giving way to torch's matmul M-major; captured calls run the Triton kernel either way."""
    from aiter_gemm import cudagraph
    from aiter_gemm.ops.a8w8_blockscale import x_scale_m_major

    clean_runtime.setattr(triton_launch, "BINDS", bound)
    clean_runtime.setattr(aiter_gemm.get_dispatcher("gemm_a8w8_blockscale"), "device", lambda on_gpu: H200)
    import op_tests.fake_scaled_mm as fake

    clean_runtime.setattr(torch.nn.functional, "scaled_mm", torch.nn.functional.scaled_mm, raising=False)
    clean_runtime.setattr(fake.torch_impl, "unavailable_reason", fake.torch_impl.unavailable_reason)
    fake.install()
    aiter_gemm.reload_configs()
    assert x_scale_m_major(1, 512, 7168, torch.bfloat16, True) is not bound
    clean_runtime.setattr(cudagraph.capture_state, "depth", 1)
    assert x_scale_m_major(1, 512, 7168, torch.bfloat16, True) is False


# ---- GPU: the bound launch gives what Triton's launch gives ------------------------------------------------------
def _shipped_triton_configs() -> list[str]:
    from aiter_gemm.fileio import read_csv_rows

    _, rows = read_csv_rows(REPO / "configs" / "a8w8_blockscale_tuned_gemm.csv")
    return sorted({r["kernelName"] for r in rows if r["gfx"] == "sm_90" and r["libtype"] == "triton"})


def _gpu_operands(M: int, N: int, K: int, m_major: bool, seed: int = 0) -> tuple:
    from aiter_gemm.kernels.act_quant import per_token_group_quant_fp8_ref

    gen = torch.Generator().manual_seed(M + N + K + seed)
    XQ, xs = per_token_group_quant_fp8_ref(torch.randn(M, K, generator=gen), m_major)
    WQ, ws = bs.quantize_weight_blockscale(torch.randn(N, K, generator=gen) / K ** 0.5)
    return tuple(t.cuda() for t in (XQ, WQ, xs, ws))


@pytest.mark.gpu
@pytest.mark.parametrize("name", _shipped_triton_configs())
@pytest.mark.parametrize("M", [1, 3, 17, 97])
@pytest.mark.parametrize("m_major", [False, True])
def test_gpu_bound_gemm_is_bit_identical_to_triton(name, M, m_major):
    if EXT is None or not triton_launch.BINDS:
        pytest.skip("the C++ eager extension is not built")
    cfg = bs.BlockscaleConfig.from_name(name)
    N, K = 2112, 7168
    if bs.config_error(cfg, M, N, K, "sm_90") is not None:
        pytest.skip(bs.config_error(cfg, M, N, K, "sm_90"))
    ops = _gpu_operands(M, N, K, m_major)
    ref = bs.gemm_a8w8_blockscale_triton(*ops, cfg, torch.empty(M, N, dtype=torch.bfloat16, device="cuda"))
    runner = triton_backend.BoundRunner(cfg)
    first = runner(*ops, torch.bfloat16)  # Triton's launch, then bound
    plans = next(iter(runner._plans.values()))
    assert plans is not None, "not bound: the log says why"
    again = [runner(*[t.clone() for t in ops], torch.bfloat16) for _ in range(2)]  # bound launches
    assert runner.launch_path(*ops, torch.bfloat16) == "bound launch"
    torch.cuda.synchronize()
    for got in (first, *again):
        assert torch.equal(got.view(torch.int16), ref.view(torch.int16)), name
    static = [t.clone() for t in ops]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = runner(*static, torch.bfloat16)
    new = _gpu_operands(M, N, K, m_major, seed=1)
    for s, t in zip(static, new):
        s.copy_(t)
    g.replay()
    want = bs.gemm_a8w8_blockscale_triton(*new, cfg, torch.empty(M, N, dtype=torch.bfloat16, device="cuda"))
    torch.cuda.synchronize()
    assert torch.equal(captured.view(torch.int16), want.view(torch.int16)), name


@pytest.mark.gpu
def test_gpu_op_eager_calls_of_a_triton_row_take_the_bound_launch(clean_runtime):
    """Through the op's entry: a shipped H200 Triton row keeps its decision eagerly, binds on its first call and
    later eager calls give Triton's bits."""
    if EXT is None or not triton_launch.BINDS:
        pytest.skip("the C++ eager extension is not built")
    from aiter_gemm.ops.a8w8_blockscale import _DISPATCHER, gemm_a8w8_blockscale, get_GEMM_A8W8_BLOCKSCALE_config

    M, N, K = 1, 2112, 7168
    cfg = get_GEMM_A8W8_BLOCKSCALE_config(M, N, K)
    if cfg["libtype"] != "triton":
        pytest.skip(f"this GPU's decision for {(M, N, K)} is {cfg['libtype']}")
    assert cfg["eager_libtype"] == "triton"
    ops = _gpu_operands(M, N, K, True)
    ref = bs.gemm_a8w8_blockscale_triton(*ops, bs.BlockscaleConfig.from_name(cfg["kernelName"]),
                                         torch.empty(M, N, dtype=torch.bfloat16, device="cuda"))
    outs = [gemm_a8w8_blockscale(*ops) for _ in range(3)]
    runner = _DISPATCHER.decide(GemmProblem(M, N, K, False, FP8, torch.bfloat16), True).runner
    assert runner.launch_path(*ops, torch.bfloat16) == "bound launch"
    torch.cuda.synchronize()
    assert all(torch.equal(o.view(torch.int16), ref.view(torch.int16)) for o in outs)
