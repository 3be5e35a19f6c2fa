"""Bound Triton launches (aiter_gemm/triton_launch.py, csrc/triton_launch.cpp): the parameters packed from Triton's
signature and the kernel's PTX (compiled for sm_90 on the CPU), the C++ checks of a later call, and on a GPU the
same results as Triton's own launch."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from aiter_gemm import triton_launch
from aiter_gemm.kernels import act_quant
from aiter_gemm.op_entry import EXT

QUANT_ARGS = ("x_ptr", "q_ptr", "s_ptr", "K", "stride_xm", "stride_qm", "stride_sm", "stride_sg")


_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from aiter_gemm.kernels import act_quant
names = %r
out = {}
for one in ((), ("stride_sm",)):
    sig = {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32"}
    sig.update({n: "constexpr" if n in one else "i32" for n in names[3:]})
    sig.update(FP8_MAX="constexpr", EPS="constexpr", GROUP_SIZE="constexpr")
    consts = {"FP8_MAX": 448.0, "EPS": 1e-12, "GROUP_SIZE": 128, **{n: 1 for n in one}}
    k = triton.compile(ASTSource(act_quant._quant_kernel, sig, constexprs=consts, attrs={}),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})
    meta = {f: getattr(k.metadata, f) for f in k.metadata._fields if f != "target"}
    out[",".join(one)] = {"meta": meta, "signature": k.src.signature, "arg_names": k.src.fn.arg_names,
                          "ptx": k.asm["ptx"]}
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def compiled_quant():
    """act_quant's kernel compiled for sm_90 by the installed Triton (no GPU needed), plain and with stride_sm
    specialized as the constant 1 (as Triton's JIT specializes an argument equal to 1): what ``plan_args`` reads of
    a CompiledKernel. In a fresh interpreter: the Triton interpreter these tests run under cannot compile."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _COMPILE % (QUANT_ARGS,)], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).resolve().parents[1], timeout=600)
    if res.returncode != 0:
        pytest.skip(f"Triton cannot compile for sm_90 here: {res.stderr[-500:]}")
    kernels = {}
    for key, k in json.loads(res.stdout).items():
        kernels[key] = SimpleNamespace(metadata=SimpleNamespace(**k["meta"]), asm={"ptx": k["ptx"]},
                                       src=SimpleNamespace(signature=k["signature"],
                                                           fn=SimpleNamespace(arg_names=k["arg_names"])))
    return kernels


def quant_call(M: int, K: int, m_major: bool):
    x = torch.randn(M, K, dtype=torch.bfloat16)
    q = torch.empty(M, K, dtype=torch.float8_e4m3fn)
    s = act_quant._scale_out(M, -(-K // 128), m_major, x.device)
    args = dict(zip(QUANT_ARGS, (x, q, s, K, x.stride(0), q.stride(0), s.stride(0), s.stride(1))))
    return x, q, s, args


def test_ptx_params_reads_the_entry_and_refuses_by_value_arrays_but_tensor_maps():
    ptx = ".entry k(\n .param .u64 .ptr .global .align 1 k_param_0,\n .param .u32 k_param_1,\n .param .f32 k_p2\n)"
    assert triton_launch.ptx_params(ptx, "k") == ["u64", "u32", "f32"]
    # a TMA tensor map by value (a host-side tensor descriptor): 128 bytes aligned to 64
    assert triton_launch.ptx_params(".entry k(\n .param .align 64 .b8 k_param_0[128]\n)", "k") == ["b8[128]"]
    for other in (".param .align 8 .b8 k_param_0[16]", ".param .align 64 .b8 k_param_0[64]"):
        with pytest.raises(triton_launch.Unsupported, match="neither a scalar nor a tensor map"):
            triton_launch.ptx_params(f".entry k(\n {other}\n)", "k")
    with pytest.raises(triton_launch.Unsupported, match="no .entry"):
        triton_launch.ptx_params(ptx, "other")


def test_plan_args_follow_the_signature_and_the_ptx(compiled_quant):
    compiled = compiled_quant[""]
    x, q, s, args = quant_call(3, 1000, m_major=True)
    pa = triton_launch.plan_args(compiled, (3, 8), args, (x,), (q, s))
    ptx = triton_launch.ptx_params(compiled.asm["ptx"], compiled.metadata.name)
    assert ptx[:8] == ["u64"] * 3 + ["u32"] * 5 and all(t == "u64" for t in ptx[8:])  # trailing scratch pointers
    assert pa.grid == (3, 8, 1) and pa.block == 32 and pa.pointers == (0, 0, 1, 1, 2, 2)
    ints = struct.pack("<5i", 1000, 1000, 1000, 1, 3)
    assert pa.blob == bytes(24) + ints + bytes(-(24 + 20) % 8) + bytes(8 * (len(ptx) - 8))
    assert pa.offsets[:8] == (0, 8, 16, 24, 28, 32, 36, 40)
    assert pa.inputs == ((torch.bfloat16, (3, 1000), (1000, 1), x.data_ptr() % 16 == 0),)
    assert pa.outputs[1] == (torch.float32, (3, 8), (1, 3), False)


def test_plan_args_skip_arguments_specialized_as_constants(compiled_quant):
    compiled = compiled_quant["stride_sm"]
    x, q, s, args = quant_call(1, 256, m_major=True)
    pa = triton_launch.plan_args(compiled, (1, 2), args, (x,), (q, s))
    assert pa.blob[24:40] == struct.pack("<4i", 256, 256, 256, 1)  # K, stride_xm, stride_qm, stride_sg
    assert len(pa.offsets) == len(triton_launch.ptx_params(compiled.asm["ptx"], compiled.metadata.name))


@pytest.mark.parametrize("change, reason", [
    (lambda a: a.update(q_ptr=torch.empty(1)), "neither an input nor an output"),
    (lambda a: a.update(K=2 ** 40), "does not fit"),
    (lambda a: a.pop("K"), "was not given"),
])
def test_plan_args_refuse_what_they_cannot_pack(change, reason, compiled_quant):
    compiled = compiled_quant[""]
    x, q, s, args = quant_call(3, 256, m_major=False)
    change(args)
    with pytest.raises(triton_launch.Unsupported, match=reason):
        triton_launch.plan_args(compiled, (3, 2), args, (x,), (q, s))


def test_plan_args_refuse_an_abi_they_do_not_know(monkeypatch, compiled_quant):
    compiled = compiled_quant[""]
    x, q, s, args = quant_call(3, 256, m_major=False)

    class Fewer:  # a PTX entry with one parameter less than the signature's arguments
        metadata, src = compiled.metadata, compiled.src
        asm = {"ptx": compiled.asm["ptx"].replace(",\n\t.param .u32 _quant_kernel_param_7", "", 1)}
    assert Fewer.asm["ptx"] != compiled.asm["ptx"]
    with pytest.raises(triton_launch.Unsupported, match="not the Triton ABI"):
        triton_launch.plan_args(Fewer, (3, 2), args, (x,), (q, s))


@pytest.fixture
def ext():
    if EXT is None or not hasattr(EXT, "triton_plan"):
        pytest.skip("the C++ eager extension (with bound launches) is not built")
    return EXT


def test_cpp_plan_packs_pointers_and_checks_later_calls(ext, compiled_quant):
    compiled = compiled_quant[""]
    x, q, s, args = quant_call(5, 300, m_major=True)
    pa = triton_launch.plan_args(compiled, (5, 3), args, (x,), (q, s))
    plan = ext.triton_plan(0x1234, *pa, compiled, triton_launch.hooks_owner())
    x2 = torch.randn(5, 300, dtype=torch.bfloat16)
    blob, (q2, s2) = ext.triton_plan_params(plan, x2)
    assert q2.dtype == q.dtype and q2.shape == q.shape and s2.stride() == (1, 5)
    want = bytearray(pa.blob)
    for off, t in zip(pa.offsets[:3], (x2, q2, s2)):
        want[off:off + 8] = struct.pack("<Q", t.data_ptr())
    assert blob == bytes(want)
    assert ext.triton_run(plan, x2) is None  # a CPU plan never launches
    class Sub(torch.Tensor):
        pass

    for other in (torch.randn(5, 301, dtype=torch.bfloat16), torch.randn(5, 300),
                  torch.randn(5, 600, dtype=torch.bfloat16)[:, :300], x2.as_subclass(Sub)):
        assert ext.triton_plan_params(plan, other) is None, other.shape
    assert ext.triton_plan_params(plan) is None and ext.triton_plan_params(plan, x2, x2) is None


def test_cpp_plan_refuses_a_misaligned_pointer_the_kernel_assumed_aligned(ext, compiled_quant):
    compiled = compiled_quant[""]
    x, q, s, args = quant_call(2, 256, m_major=False)
    plan = ext.triton_plan(1, *triton_launch.plan_args(compiled, (2, 2), args, (x,), (q, s)), compiled,
                           triton_launch.hooks_owner())
    base = torch.randn(2 * 256 + 1, dtype=torch.bfloat16)
    odd = base[1:].view(2, 256)  # 2-byte offset: same sizes and strides, not 16-byte aligned
    assert odd.data_ptr() % 16 and ext.triton_plan_params(plan, odd) is None
    assert ext.triton_plan_params(plan, base[:512].view(2, 256)) is not None


class _Chain:
    """Triton 3.5+'s HookChain as the launcher and the plan read it: a ``calls`` list."""

    def __init__(self, *calls):
        self.calls = list(calls)


@pytest.mark.parametrize("enter, exit_, taken", [
    (None, None, True),                      # Triton 3.4: no hook
    (_Chain(), _Chain(), True),              # Triton 3.5+: empty chains, never None
    (_Chain(print), _Chain(), False),        # a profiler's hook (proton's): Triton's launcher must call it
    (_Chain(), _Chain(print), False),
    (print, None, False),                    # Triton 3.4: a hook is a callable
    ("missing", None, False),                # no such attribute: not known to be empty
])
def test_cpp_plan_reads_triton_launch_hooks_per_call(ext, compiled_quant, enter, exit_, taken):
    """A plan takes a call only while Triton's launch hooks are empty (Triton's launcher runs the call otherwise, and
    calls them), read per call: a plan bound before a profiler started honours its hooks too."""
    compiled = compiled_quant[""]
    x, q, s, args = quant_call(2, 256, m_major=False)
    owner = SimpleNamespace(launch_exit_hook=exit_)
    if enter != "missing":
        owner.launch_enter_hook = enter
    plan = ext.triton_plan(1, *triton_launch.plan_args(compiled, (2, 2), args, (x,), (q, s)), compiled, owner)
    assert (ext.triton_plan_params(plan, x) is not None) is taken
    owner.launch_enter_hook, owner.launch_exit_hook = _Chain(), _Chain()  # the profiler stopped
    assert ext.triton_plan_params(plan, x) is not None
    owner.launch_enter_hook.calls.append(print)  # ... and started again
    assert ext.triton_plan_params(plan, x) is None


def test_bind_is_not_declined_by_tritons_empty_hook_chains(caplog, compiled_quant, monkeypatch):
    """Triton 3.5+ keeps launch hooks in HookChain objects that are never None: bind took that for a hook and no
    launch was ever bound (the H200's log, Triton 3.6). A loaded kernel on CPU tensors now reaches the device check."""
    if EXT is None:
        pytest.skip("the C++ eager extension is not built")
    owner = triton_launch.hooks_owner()
    assert {"launch_enter_hook", "launch_exit_hook"} <= set(dir(owner))
    compiled = SimpleNamespace(**vars(compiled_quant[""]), function=0x1234)  # "loaded"
    x, q, s, args = quant_call(2, 256, m_major=False)
    with caplog.at_level("INFO", logger="aiter_gemm"):
        assert triton_launch.bind(compiled, (2, 2), args, (x,), (q, s)) is None
    assert "hooks" not in caplog.text and "tensors on cpu" in caplog.text


def test_bind_declines_without_a_loaded_kernel(caplog, compiled_quant):
    compiled = compiled_quant[""]  # never loaded: no CUfunction
    x, q, s, args = quant_call(2, 256, m_major=False)
    with caplog.at_level("INFO", logger="aiter_gemm"):
        assert triton_launch.bind(compiled, (2, 2), args, (x,), (q, s)) is None
    assert "keeps Triton's launcher" in caplog.text


@pytest.mark.parametrize("interpret", ["1", "0"])
def test_launches_bind_only_compiled_with_the_extension(interpret):
    """BINDS (whether runners bind their launches), read at import in a fresh interpreter: never under the Triton
    interpreter; compiling, exactly where the C++ extension is built."""
    env = {**os.environ, "TRITON_INTERPRET": interpret}
    code = "from aiter_gemm import triton_launch as t; print(t.BINDS, t.run is not None)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).resolve().parents[1], timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    binds, built = res.stdout.split()[-2:]
    assert binds == str(interpret == "0" and built == "True")
    if interpret == "0":
        assert built == str(EXT is not None)  # the extension this process loaded: the same answer


def test_plan_cache_keeps_plans_per_layout_and_starts_over_past_its_max(monkeypatch):
    """A layout is UNTRIED until stored; plans stored become the last (a layout that binds nothing is remembered as
    None and leaves the last); past MAX_LAYOUTS the layouts start over, the last plans kept."""
    monkeypatch.setattr(triton_launch.PlanCache, "MAX_LAYOUTS", 3)
    cache = triton_launch.PlanCache()
    untried = triton_launch.UNTRIED
    assert cache._last is None and cache._plans.get("a", untried) is untried
    cache._store("a", ("plan a",))
    assert cache._plans == {"a": ("plan a",)} and cache._last == ("plan a",)
    cache._store("b", None)  # nothing binds: tried, Triton's launch from now on
    assert cache._plans.get("b", untried) is None and cache._last == ("plan a",)
    cache._store("c", ("plan c",))  # another layout: its plans are the last
    assert cache._last == ("plan c",) and list(cache._plans) == ["a", "b", "c"]
    cache._store("d", None)  # full: start over
    assert cache._plans == {"d": None} and cache._last == ("plan c",)
    assert cache._plans.get("a", untried) is untried
    with pytest.raises(AttributeError):
        cache.other = 1  # __slots__: nothing per call beyond the two slots


# ---- GPU: the bound launch gives what Triton's launch gives --------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 3, 17, 97])
@pytest.mark.parametrize("K", [1000, 4096, 7168])
@pytest.mark.parametrize("m_major", [False, True])
def test_quant_bound_launch_is_bit_identical_to_triton(M, K, m_major):
    if EXT is None:
        pytest.skip("the C++ eager extension is not built")
    x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda") * 3
    act_quant.clear_plans()
    q0, s0 = act_quant.per_token_group_quant_fp8(x, m_major)       # Triton's launch, binds the plan
    plan = act_quant._PLANS[(x.shape, x.stride(), x.dtype, x.device, m_major)]
    assert plan is not None
    x2 = x.clone()
    q1, s1 = EXT.triton_run(plan, x2)                                # the bound launch, directly
    q2, s2 = act_quant.per_token_group_quant_fp8(x2, m_major)      # through the cache
    torch.cuda.synchronize()
    for q, s in ((q1, s1), (q2, s2)):
        assert torch.equal(q.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(s, s0)
        assert s.stride() == s0.stride()


@pytest.mark.gpu
def test_quant_bound_launch_on_a_side_stream_and_in_a_graph():
    if EXT is None:
        pytest.skip("the C++ eager extension is not built")
    x = torch.randn(8, 4096, dtype=torch.bfloat16, device="cuda")
    ref = act_quant.per_token_group_quant_fp8(x, True)
    act_quant.per_token_group_quant_fp8(x, True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        q, s = act_quant.per_token_group_quant_fp8(x, True)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(q.view(torch.uint8), ref[0].view(torch.uint8)) and torch.equal(s, ref[1])
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gq, gs = act_quant.per_token_group_quant_fp8(x, True)
    x.mul_(2)
    g.replay()
    want = act_quant.per_token_group_quant_fp8_ref(x, True)
    torch.cuda.synchronize()
    assert torch.equal(gq.view(torch.uint8), want[0].view(torch.uint8)) and torch.allclose(gs, want[1])


# ---- the quantizer's plan cache (CPU: fake plans) --------------------------------------------------------------
def test_quant_runs_a_cached_plan_and_falls_back_when_it_declines(monkeypatch, device):
    x = torch.randn(4, 256, device=device)
    key = (x.shape, x.stride(), x.dtype, x.device, True)
    calls = []
    monkeypatch.setattr(act_quant, "_PLANS", {key: "plan"})  # bound: Triton's launch never binds it again
    monkeypatch.setattr(act_quant, "TABLES", ("row-major", "m-major"))
    monkeypatch.setattr(act_quant, "_run_table", lambda table, t: calls.append((table, t)) or answer)
    monkeypatch.setattr(triton_launch, "bind", lambda *a: None)  # the fake tables take no real plan (GPU runs bind)
    answer = ("q", "s")
    assert act_quant.per_token_group_quant_fp8(x, True) == answer and calls == [("m-major", x)]
    answer = None  # the plan declines (another stream's device, a misaligned view, a launch hook...): Triton's
    q, s = act_quant.per_token_group_quant_fp8(x, True)
    ref_q, ref_s = act_quant.per_token_group_quant_fp8_ref(x, True)
    assert torch.equal(q.float(), ref_q.float()) and torch.allclose(s, ref_s) and s.stride() == (1, 4)
    assert len(calls) == 2 and act_quant.per_token_group_quant_fp8(x, False)[1].stride() == (2, 1)
    assert calls[-1] == ("row-major", x)


def test_quant_binds_a_shape_once_and_never_a_copied_input(monkeypatch, device):
    bound = []
    monkeypatch.setattr(act_quant, "_PLANS", {})
    monkeypatch.setattr(act_quant, "INTERPRET", False)  # binding is for compiled launches; the kernel still runs
    monkeypatch.setattr(act_quant, "TABLES", (None, None))
    monkeypatch.setattr(act_quant, "_run_table", lambda table, t: None)
    monkeypatch.setattr(triton_launch, "bind", lambda compiled, grid, args, inputs, outputs:
                        bound.append((grid, inputs, outputs)) or None)
    x = torch.randn(3, 300, device=device)
    if device == "cpu":  # interpreted: a CPU tensor stands for a GPU one
        monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    act_quant.per_token_group_quant_fp8(x, True)
    act_quant.per_token_group_quant_fp8(x, True)  # cached as None: Triton's launch, no second bind
    assert len(bound) == 1 and bound[0][0] == (3, 3) and bound[0][1] == (x,)
    assert [t.shape for t in bound[0][2]] == [(3, 300), (3, 3)]
    act_quant.per_token_group_quant_fp8(torch.randn(300, 3, device=device).t(), True)  # copied: nothing bound
    assert len(bound) == 1


def test_plan_table_finds_a_plan_by_its_first_input(ext, compiled_quant):
    """The plan table keys a plan by its first input's dtype, device, sizes and strides (the quantizer's per-call
    lookup, in C++); a later plan of the same key replaces it; clear drops them; a CPU plan never launches."""
    compiled = compiled_quant[""]
    table = ext.triton_table()
    x, q, s, args = quant_call(3, 300, m_major=True)
    plan = ext.triton_plan(1, *triton_launch.plan_args(compiled, (3, 3), args, (x,), (q, s)), compiled,
                           triton_launch.hooks_owner())
    assert ext.triton_table_find(table, x) is None
    ext.triton_table_add(table, plan)
    assert ext.triton_table_find(table, torch.randn(3, 300, dtype=torch.bfloat16)) is plan
    for other in (torch.randn(3, 301, dtype=torch.bfloat16), torch.randn(3, 300),
                  torch.randn(3, 600, dtype=torch.bfloat16)[:, :300], torch.randn(1, 3, 300, dtype=torch.bfloat16)):
        assert ext.triton_table_find(table, other) is None, (other.shape, other.stride(), other.dtype)
    assert ext.triton_table_run(table, x) is None  # found, on CPU: not launched
    again = ext.triton_plan(2, *triton_launch.plan_args(compiled, (3, 3), args, (x,), (q, s)), compiled,
                            triton_launch.hooks_owner())
    ext.triton_table_add(table, again)
    assert ext.triton_table_find(table, x) is again
    assert ext.triton_table_clear(table) == 1 and ext.triton_table_find(table, x) is None


@pytest.mark.interpreted  # CPU tensors posing as CUDA ones: the kernel itself runs interpreted
def test_quant_stores_what_it_binds_in_the_table_of_its_layout(monkeypatch, compiled_quant):
    """A bound launch goes to the plan table of its x_scale layout, where the next call (and the FP8Linear twin's
    C++ call) finds it; clear_plans forgets both."""
    if act_quant.TABLES is None:
        pytest.skip("the C++ eager extension is not built")
    compiled = compiled_quant[""]
    monkeypatch.setattr(act_quant, "INTERPRET", False)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))

    def fake_bind(_compiled, grid, args, inputs, outputs):  # the real plan of this call, from the sm_90 kernel
        return EXT.triton_plan(1, *triton_launch.plan_args(compiled, grid, args, inputs, outputs), compiled,
                               triton_launch.hooks_owner())

    monkeypatch.setattr(triton_launch, "bind", fake_bind)
    act_quant.clear_plans()
    try:
        x = torch.randn(3, 300, dtype=torch.bfloat16)
        act_quant.per_token_group_quant_fp8(x, True)
        plan = EXT.triton_table_find(act_quant.TABLES[1], x)
        assert plan is not None and plan is act_quant._PLANS[(x.shape, x.stride(), x.dtype, x.device, True)]
        assert EXT.triton_table_find(act_quant.TABLES[0], x) is None
    finally:
        act_quant.clear_plans()
    assert EXT.triton_table_find(act_quant.TABLES[1], x) is None and not act_quant._PLANS


def test_quant_cpu_tensors_without_the_interpreter_run_the_torch_rule(monkeypatch):
    """Compiled Triton takes no CPU tensor (a GPU machine, where TRITON_INTERPRET is off): the quantizer ran the
    launch anyway ("Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)" on the H200); now CPU
    tensors take the torch reference there, with the same result and layout."""
    monkeypatch.setattr(act_quant, "INTERPRET", False)

    class NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError("a compiled Triton launch of CPU tensors")

    monkeypatch.setattr(act_quant, "_quant_kernel", NoLaunch())
    x = torch.randn(5, 300, dtype=torch.bfloat16)
    for m_major in (False, True):
        q, s = act_quant.per_token_group_quant_fp8(x, m_major)
        qr, sr = act_quant.per_token_group_quant_fp8_ref(x, m_major)
        assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8)) and torch.equal(s, sr)
        assert s.stride() == sr.stride() and q.dtype == torch.float8_e4m3fn


@pytest.mark.gpu
def test_quant_bound_launch_gives_way_to_a_triton_launch_hook():
    """While a launch hook is installed (a profiler's), every call runs Triton's launch, which calls the hook once
    per call; removed, the bound launch runs again (the hook is not called)."""
    if EXT is None:
        pytest.skip("the C++ eager extension is not built")
    import triton

    chain = getattr(getattr(triton, "knobs", None), "runtime", None)
    chain = getattr(chain, "launch_enter_hook", None)
    if not hasattr(chain, "add"):
        pytest.skip("this Triton has no HookChain (Triton 3.5+)")
    x = torch.randn(4, 512, dtype=torch.bfloat16, device="cuda")
    act_quant.clear_plans()
    ref = act_quant.per_token_group_quant_fp8(x, True)  # binds
    assert act_quant._PLANS[(x.shape, x.stride(), x.dtype, x.device, True)] is not None
    seen = []

    def hook(metadata):
        seen.append(metadata)

    chain.add(hook)
    try:
        for _ in range(2):
            q, s = act_quant.per_token_group_quant_fp8(x, True)
            assert torch.equal(q.view(torch.uint8), ref[0].view(torch.uint8)) and torch.equal(s, ref[1])
    finally:
        chain.remove(hook)
    assert len(seen) == 2
    act_quant.per_token_group_quant_fp8(x, True)
    assert len(seen) == 2
