"""The C++ eager fast path (aiter_gemm/eager_ext.py, csrc/eager_fast.cpp): built here, then exercised in fresh
processes (the extension loads at import) with the extension on and off. The cases: results identical to F.linear
on odd shapes, with and without bias, 2-D and 3-D; what goes to the Python path (first calls, otype and scales,
keywords, tensor subclasses, a TorchFunctionMode, shuffled weights, a capture in progress); reload dropping the
cache; TunedLinear; torch.compile(fullgraph=True) through the C++ entry; import staying light."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from aiter_gemm import eager_ext

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built() -> Path:
    """Build the extension once (a no-op when .ci/run or the user already built it); skip without a toolchain."""
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("no C++ compiler on this machine: the Python eager path is the only one")
    try:
        module = eager_ext.build()
    except Exception as exc:  # ninja missing, headers missing: say why
        pytest.skip(f"the C++ eager extension cannot be built here: {type(exc).__name__}: {exc}")
    return Path(module.__file__)


def run(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter (the extension loads at import); its stdout, or fail with its stderr."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("AITER_")}
    full.update(env)
    full.setdefault("OMP_NUM_THREADS", "1")
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=full, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, f"stdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return res.stdout


# ---- settings ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, expected", [("", "auto"), ("auto", "auto"), ("1", "auto"), ("BUILD", "build"),
                                           ("0", "off"), ("off", "off"), ("false", "off")])
def test_mode_values(raw, expected):
    assert eager_ext.mode({eager_ext.ENV: raw}) == expected


def test_mode_rejects_unknown_value_naming_the_variable():
    with pytest.raises(ValueError, match="AITER_GEMM_EAGER_EXT"):
        eager_ext.mode({eager_ext.ENV: "sometimes"})


def test_name_follows_source_and_versions(tmp_path, monkeypatch):
    name = eager_ext.ext_name()
    assert name.startswith("aiter_gemm_eager_") and name == eager_ext.ext_name()
    changed = tmp_path / "eager_fast.cpp"
    changed.write_bytes(eager_ext.SOURCE.read_bytes() + b"\n// changed\n")
    monkeypatch.setattr(eager_ext, "SOURCE", changed)
    assert eager_ext.ext_name() != name  # a stale build is never loaded under the new source


def test_each_venv_gets_its_own_build_folder(tmp_path, monkeypatch):
    """Two venvs with the same torch and Python shared one folder and rebuilt it in turn: the name follows
    ``sys.prefix`` (stable within one environment)."""
    name = eager_ext.ext_name()
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "other_venv"))
    other = eager_ext.ext_name()
    assert other != name and other == eager_ext.ext_name()
    assert eager_ext.build_dir(other) != eager_ext.build_dir(name)


def test_build_command_says_loaded_or_built(tmp_path, monkeypatch, capsys):
    """``aiter-gemm-build-ext`` says "built" only when it compiled: a build already there is loaded, not rebuilt."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    fake = types.ModuleType(eager_ext.ext_name())
    fake.__file__ = str(tmp_path / "fake.so")
    builds = []
    monkeypatch.setattr(eager_ext, "build", lambda verbose=False: builds.append(verbose) or fake)
    assert eager_ext.main([]) == 0 and builds == [False]  # nothing in the folder: compiled
    assert capsys.readouterr().out.startswith(f"built {fake.__name__}: ")
    monkeypatch.setattr(eager_ext, "_import_built", lambda name, folder: fake if folder.parent == tmp_path else None)
    assert eager_ext.main([]) == 0 and builds == [False]  # found in $TORCH_EXTENSIONS_DIR: loaded, not rebuilt
    assert capsys.readouterr().out.startswith("already built for this source, torch and environment; loaded ")


def test_off_and_bad_value_keep_the_python_path():
    out = run("""
        import types, aiter_gemm
        from aiter_gemm.ops import a16w16 as ops
        from aiter_gemm import eager_ext
        print(ops.EAGER_EXT is None, isinstance(aiter_gemm.gemm_a16w16, types.FunctionType), eager_ext.status)
    """, AITER_GEMM_EAGER_EXT="0")
    assert out.split()[:2] == ["True", "True"] and "off" in out
    out = run("""
        from aiter_gemm.ops import a16w16 as ops
        print(ops.EAGER_EXT is None)
    """, AITER_GEMM_EAGER_EXT="sometimes")
    assert out.strip() == "True"


def test_missing_build_is_reported_not_raised(tmp_path):
    out = run("""
        from aiter_gemm.ops import a16w16 as ops
        from aiter_gemm import eager_ext
        print(ops.EAGER_EXT is None, '|', eager_ext.status)
    """, TORCH_EXTENSIONS_DIR=str(tmp_path))
    assert out.startswith("True |") and "aiter-gemm-build-ext" in out


def test_build_clears_the_lock_a_killed_build_left(tmp_path, monkeypatch, caplog):
    """torch's builder waits for its ``lock`` file to go away; a build killed mid-way leaves it, and the next build
    hung forever (then failed to import). Holding our OS lock, ``build`` removes it and builds."""
    import torch.utils.cpp_extension as cpp

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = eager_ext.build_dir()
    folder.mkdir(parents=True)
    (folder / "lock").write_text("")
    seen: list[bool] = []
    sentinel = types.ModuleType("built")
    monkeypatch.setattr(cpp, "load", lambda **kw: seen.append((Path(kw["build_directory"]) / "lock").exists())
                        or sentinel)
    with caplog.at_level("WARNING", logger="aiter_gemm.eager_ext"):
        assert eager_ext.build() is sentinel
    assert seen == [False] and "did not finish" in caplog.text


# ---- the C++ entry -------------------------------------------------------------------------------------------
def test_entry_matches_f_linear_and_caches_plain_calls(built):
    out = run("""
        import types, torch, torch.nn.functional as F
        import aiter_gemm
        from aiter_gemm.ops import a16w16 as ops
        from aiter_gemm import gemm_a16w16
        ext = ops.EAGER_EXT
        assert ext is not None and not isinstance(gemm_a16w16, types.FunctionType), ops.eager_ext.status
        torch.manual_seed(0)
        n = 0
        for M in (1, 3, 17, 97):
            for lead in ((), (1,), (2,)):
                for dtype in (torch.float32, torch.bfloat16):
                    for with_bias in (False, True):
                        shape = (*lead, M, 24) if lead else (M, 24)
                        a = torch.randn(shape, dtype=dtype)
                        w = torch.randn(40, 24, dtype=dtype)
                        b = torch.randn(40, dtype=dtype) if with_bias else None
                        ref = F.linear(a, w, b)
                        first = gemm_a16w16(a, w, b)          # decides through the Python path, remembers
                        again = gemm_a16w16(a, w, b)          # the C++ entry
                        assert torch.equal(first, ref) and torch.equal(again, ref), (shape, dtype, with_bias)
                        assert again.dtype == dtype and again.shape == ref.shape
                        n += 1
        print(n, ext.cached())
    """)
    calls, cached = map(int, out.split())
    assert cached == calls  # every distinct plain call remembered once


def python_path_spy(entry: str, fallback: str, public: str) -> str:
    """Script lines (indented as the scripts :func:`run` dedents) installing a spy as ``entry``'s Python path,
    around ``fallback``, and ``python_calls(fn)``: (calls of fn that reached the Python path, fn's result)."""
    return f"""
    calls = []
    def spy(*args, **kwargs):
        calls.append(1)
        return {fallback}(*args, **kwargs)
    assert {entry}.install(spy) is {public}          # count Python-path calls
    def python_calls(fn):
        calls.clear()
        out = fn()
        return len(calls), out
"""


SPY = """
    import torch, torch.nn.functional as F
    from aiter_gemm.ops import a16w16 as ops
    from aiter_gemm import cudagraph, gemm_a16w16
    ext = ops.EAGER_EXT""" + python_path_spy("ops.GEMM_A16W16_ENTRY", "ops.gemm_a16w16_python", "gemm_a16w16")


def test_what_goes_to_the_python_path(built):
    out = run(SPY + """
    a, w, b = torch.randn(3, 8), torch.randn(16, 8), torch.randn(16)
    assert python_calls(lambda: gemm_a16w16(a, w, b))[0] == 1      # first call decides
    assert python_calls(lambda: gemm_a16w16(a, w, b))[0] == 0      # cached plain decision
    assert python_calls(lambda: gemm_a16w16(a, w, b, None, None, None, None))[0] == 0  # tgemm.mm's form
    n, o = python_calls(lambda: gemm_a16w16(a, w, bias=b))          # keywords bind in C++ too
    assert n == 0 and torch.equal(o, F.linear(a, w, b))
    calls.clear()
    try:
        gemm_a16w16(a, w, b, bias=b)
    except TypeError as exc:                                        # bias twice: the Python entry's own error
        assert "bias" in str(exc) and len(calls) == 1
    else:
        raise AssertionError("bias given twice accepted")
    n, o = python_calls(lambda: gemm_a16w16(a.bfloat16(), w.bfloat16(), None, torch.float32))  # otype
    assert n == 1 and o.dtype == torch.float32

    class Sub(torch.Tensor):
        seen = []
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            cls.seen.append(getattr(func, "__name__", str(func)))
            return super().__torch_function__(func, types, args, kwargs or {})
    n, o = python_calls(lambda: gemm_a16w16(a.as_subclass(Sub), w, b))
    assert n == 1 and "linear" in Sub.seen                           # the subclass saw F.linear

    from torch.overrides import TorchFunctionMode
    class Mode(TorchFunctionMode):
        seen = []
        def __torch_function__(self, func, types, args=(), kwargs=None):
            Mode.seen.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))
    with Mode():
        n, o = python_calls(lambda: gemm_a16w16(a, w, b))
    assert n == 1 and "linear" in Mode.seen and torch.equal(o, F.linear(a, w, b))

    ws = torch.randn(16, 8)
    ws.is_shuffled = True
    for _ in range(2):                                              # never cached in C++: Python each time
        calls.clear()
        try:
            gemm_a16w16(a, ws)
        except RuntimeError as exc:                                 # on CPU: no BLASLt backend for it
            assert "pre-shuffled" in str(exc)
        assert len(calls) == 1

    # Another device for any operand (issue 31: a meta weight hit the CPU entry): the Python path, which refuses it.
    for bad in (lambda: gemm_a16w16(a.to("meta"), w, b), lambda: gemm_a16w16(a, w.to("meta"), b),
                lambda: gemm_a16w16(a, w, b.to("meta"))):
        calls.clear()
        try:
            bad()
        except ValueError as exc:
            assert "on meta" in str(exc) and len(calls) == 1
        else:
            raise AssertionError("operands on two devices accepted")

    for bad in (lambda: gemm_a16w16([1.0], w), lambda: gemm_a16w16(torch.randn(3, 9), w)):
        try:
            bad()
        except (TypeError, ValueError) as exc:
            assert "gemm_a16w16" in str(exc)
        else:
            raise AssertionError("bad operands accepted")

    # A decision that differs under CUDA-graph capture: plain only while the probe says "not capturing".
    x = torch.randn(5, 8)
    gemm_a16w16(x, w)
    assert ext.remember(gemm_a16w16, F.linear, cudagraph.capturing, x, w, None)
    assert python_calls(lambda: gemm_a16w16(x, w))[0] == 0
    cudagraph.capture_state.depth = 1
    assert python_calls(lambda: gemm_a16w16(x, w))[0] == 1
    cudagraph.capture_state.depth = 0
    probe_says = [True]
    assert ext.remember(gemm_a16w16, F.linear, lambda: probe_says[0], x, w)  # any other probe is called
    assert python_calls(lambda: gemm_a16w16(x, w))[0] == 1
    probe_says[0] = False
    assert python_calls(lambda: gemm_a16w16(x, w))[0] == 0
    print("ok")
    """)
    assert out.strip() == "ok"


def test_reload_drops_the_cache(built):
    out = run(SPY + """
    import aiter_gemm
    a, w = torch.randn(3, 8), torch.randn(16, 8)
    gemm_a16w16(a, w)
    assert python_calls(lambda: gemm_a16w16(a, w))[0] == 0
    aiter_gemm.reload_configs()
    assert python_calls(lambda: gemm_a16w16(a, w))[0] == 1          # decided again, under the new tables
    assert ext.cached() == 1                                         # the old entries went with the old token
    assert python_calls(lambda: gemm_a16w16(a, w))[0] == 0
    print("ok")
    """)
    assert out.strip() == "ok"


def test_tuned_linear_and_gradients(built):
    out = run("""
        import torch, torch.nn.functional as F
        from aiter_gemm.ops import a16w16 as ops
        from aiter_gemm.nn import TunedLinear
        ext = ops.EAGER_EXT
        lin = torch.nn.Linear(8, 16)
        tl = TunedLinear.from_linear(lin)
        x = torch.randn(2, 3, 8)
        with torch.no_grad():
            assert ext.linear(tl, x) is None                           # nothing decided yet
            ref = lin(x)
            assert torch.equal(tl(x), ref)
            fast = ext.linear(tl, x)
            assert fast is not None and torch.equal(fast, ref)
            assert ext.linear(tl, torch.randn(4, 8)) is None           # another shape: not decided
            tl.weight = torch.nn.Parameter(torch.randn(16, 8, dtype=torch.float64))
            assert ext.linear(tl, x) is None                           # other dtype: not this decision
        # With gradients: the cached plain call is at::linear, which autograd records like F.linear.
        tl2 = TunedLinear.from_linear(torch.nn.Linear(8, 16))
        ref_lin = torch.nn.Linear(8, 16)
        ref_lin.load_state_dict(tl2.state_dict())
        xg = torch.randn(2, 3, 8)
        with torch.no_grad():
            tl2(xg)
        out, ref = tl2(xg), ref_lin(xg)
        out.square().sum().backward()
        ref.square().sum().backward()
        assert torch.allclose(tl2.weight.grad, ref_lin.weight.grad) and torch.allclose(tl2.bias.grad, ref_lin.bias.grad)
        print("ok")
    """)
    assert out.strip() == "ok"


def test_module_call_entry_only_where_module_call_goes_straight_to_forward(built):
    """ext.call (TunedLinear.__call__'s C++ half) runs a cached plain decision only while nn.Module.__call__ would go
    straight to forward; with a hook anywhere, a forward on the instance or Module.compile() it declines (None)."""
    out = run("""
        import torch, torch.nn.functional as F
        from aiter_gemm.ops import a16w16 as ops
        import aiter_gemm.nn as agnn
        from aiter_gemm.nn import TunedLinear
        ext = ops.EAGER_EXT
        assert agnn._c_call is ext.call
        tl = TunedLinear.from_linear(torch.nn.Linear(8, 16))
        x = torch.randn(2, 3, 8)
        with torch.no_grad():
            assert ext.call(tl, x) is None                                # nothing decided yet
            ref = F.linear(x, tl.weight, tl.bias)
            assert torch.equal(tl(x), ref)
            assert torch.equal(ext.call(tl, x), ref)
            assert ext.call(tl, [1, 2]) is None and ext.call(object(), x) is None
            declined = []
            for add in (lambda: tl.register_forward_hook(lambda m, a, o: None),
                        lambda: tl.register_forward_pre_hook(lambda m, a: None),
                        lambda: tl.register_full_backward_hook(lambda m, gi, go: None),
                        lambda: tl.register_full_backward_pre_hook(lambda m, go: None),
                        lambda: torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: None),
                        lambda: torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: None),
                        lambda: torch.nn.modules.module.register_module_full_backward_hook(lambda m, gi, go: None),
                        lambda: torch.nn.modules.module.register_module_full_backward_pre_hook(lambda m, go: None)):
                handle = add()
                declined.append(ext.call(tl, x) is None)
                handle.remove()
                assert ext.call(tl, x) is not None
            assert all(declined), declined
            tl.forward = tl.forward
            assert ext.call(tl, x) is None
            del tl.forward
            tl._compiled_call_impl = lambda *a: None
            assert ext.call(tl, x) is None
            del tl._compiled_call_impl
            assert ext.call(tl, x) is not None
        print("ok")
    """)
    assert out.strip() == "ok"


def test_compile_traces_the_custom_op_and_import_stays_light(built):
    out = run("""
        import sys, torch, torch.nn.functional as F
        import aiter_gemm
        from aiter_gemm import gemm_a16w16
        from aiter_gemm.nn import TunedLinear
        light = [m for m in ("torch._dynamo", "triton") if m in sys.modules]
        a, w, b = torch.randn(3, 8), torch.randn(16, 8), torch.randn(16)
        gemm_a16w16(a, w, b); gemm_a16w16(a, w, b)                    # cached in C++ before compiling
        graphs = []
        def backend(gm, inputs):
            graphs.append(str(gm.graph))
            return gm.forward
        f = torch.compile(lambda a, w, b: gemm_a16w16(a, w, b) * 2, fullgraph=True, backend=backend)
        assert torch.equal(f(a, w, b), 2 * F.linear(a, w, b))
        assert any("aiter_gemm.gemm_a16w16" in g for g in graphs), graphs
        m = TunedLinear.from_linear(torch.nn.Linear(8, 16))
        with torch.no_grad():
            m(a); m(a)
            g = torch.compile(m, fullgraph=True)
            assert torch.allclose(g(a), F.linear(a, m.weight, m.bias))
        print("light", light)
    """)
    assert "light []" in out, out


def test_python_path_suite_without_the_extension(built):
    """The dispatch, module and gradient tests, again with the extension off: the Python hot path stays tested."""
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                          "op_tests/test_gemm_a16w16.py", "op_tests/test_hf_patch.py", "op_tests/test_gradients.py"],
                         cwd=ROOT, env={**os.environ, "AITER_GEMM_EAGER_EXT": "0"}, capture_output=True, text=True,
                         timeout=1800)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


BLOCKSCALE = """
    import torch
    import op_tests.fake_scaled_mm as fake
    fake.install()                                      # F.scaled_mm on CPU (the layouts cuBLASLt takes)
    import aiter_gemm
    from aiter_gemm import cudagraph, eager_ext
    from aiter_gemm.ops import a8w8_blockscale as bs
    from aiter_gemm.kernels.a8w8_blockscale import gemm_a8w8_blockscale_ref, quantize_blockscale
    ext = bs.EAGER_EXT
    op = bs.gemm_a8w8_blockscale
    assert ext is not None and op is bs.GEMM_A8W8_BLOCKSCALE_ENTRY.c_fn, eager_ext.status
    calls = []
    def spy(*args, **kwargs):
        calls.append(1)
        return bs.gemm_a8w8_blockscale_python(*args, **kwargs)
    assert bs.GEMM_A8W8_BLOCKSCALE_ENTRY.install(spy) is op  # count Python-path calls
    def python_calls(fn):
        calls.clear()
        out = fn()
        return len(calls), out
    torch.manual_seed(0)
    ops = {M: quantize_blockscale(torch.randn(M, 512), torch.randn(256, 512) / 512 ** 0.5) for M in (3, 16)}
"""


def test_blockscale_entry_runs_remembered_decisions(built, tmp_path):
    """gemm_a8w8_blockscale's C++ entry: torch rows (the fake F.scaled_mm) run from C++ after the first call of a
    key, with dtype positional or keyword; a config, other dtypes or devices of any operand, and a capture in progress
    for a decision that differs there go to the Python path (which names bad operands); reload drops the map."""
    from aiter_gemm import current_device_identity

    table = tmp_path / "bs.csv"
    cu = current_device_identity(False).cu_num
    table.write_text("gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName,tflops,bw,errRatio\n"
                     + "".join(f"cpu,{cu},{m},256,512,torch,0,0,5.0,scaled_mm_blockwise,1,1,0\n" for m in (3, 16)))
    out = run(BLOCKSCALE + """
    for M, (XQ, WQ, xs, ws) in ops.items():
        ref = gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws)
        n, first = python_calls(lambda: op(XQ, WQ, xs, ws))
        assert n == 1 and bs.get_GEMM_A8W8_BLOCKSCALE_config(M, 256, 512, on_gpu=False)["libtype"] == "torch"
        for call in (lambda: op(XQ, WQ, xs, ws), lambda: op(XQ, WQ, xs, ws, torch.bfloat16),
                     lambda: op(XQ, WQ, xs, ws, dtype=torch.bfloat16), lambda: op(XQ, WQ, xs, ws, config=None)):
            n, again = python_calls(call)
            assert n == 0 and torch.equal(again, first) and again.shape == (M, 256), M
        assert ((first.float() - ref.float()).norm() / ref.float().norm()).item() < 8e-3
    XQ, WQ, xs, ws = ops[16]
    assert python_calls(lambda: op(XQ, WQ, xs, ws, config="scaled_mm_blockwise"))[0] == 1
    for bad, what in ((lambda: op(XQ, WQ, xs.double(), ws), "x_scale"),
                      (lambda: op(XQ, WQ, xs, ws.to("meta")), "w_scale"),
                      (lambda: op(XQ, WQ[:128], xs, ws), "w_scale"),
                      (lambda: op(XQ, WQ, xs, ws, torch.int8), "output dtype")):
        calls.clear()
        try:
            bad()
        except (TypeError, ValueError) as exc:
            assert what in str(exc) and len(calls) == 1, (what, exc)
        else:
            raise AssertionError(f"bad {what} accepted")
    # A decision that differs under capture: its eager runner from C++ only while the probe says "not capturing".
    seen, capturing = [], [True]
    def runner(*args):
        seen.append(args[4])
        return args[0]
    assert ext.remember(op, runner, lambda: capturing[0], XQ, WQ, xs, ws, torch.bfloat16)
    assert python_calls(lambda: op(XQ, WQ, xs, ws))[0] == 1 and not seen
    capturing[0] = False
    n, got = python_calls(lambda: op(XQ, WQ, xs, ws))
    assert n == 0 and got is XQ and seen == [torch.bfloat16]  # the default dtype handed over
    assert ext.remember(op, runner, cudagraph.capturing, XQ, WQ, xs, ws)
    cudagraph.capture_state.depth = 1
    assert python_calls(lambda: op(XQ, WQ, xs, ws))[0] == 1
    cudagraph.capture_state.depth = 0
    assert python_calls(lambda: op(XQ, WQ, xs, ws))[0] == 0
    aiter_gemm.reload_configs()
    assert python_calls(lambda: op(XQ, WQ, xs, ws))[0] == 1     # decided again, under the new tables
    assert python_calls(lambda: op(XQ, WQ, xs, ws))[0] == 0
    # A runner that reloads (dropping the map, and the map's reference to it) while C++ is calling it.
    assert ext.remember(op, lambda *a: (aiter_gemm.reload_configs(), a[0])[1], None, XQ, WQ, xs, ws,
                        torch.bfloat16)
    n, got = python_calls(lambda: op(XQ, WQ, xs, ws))
    assert n == 0 and got is XQ
    assert python_calls(lambda: op(XQ, WQ, xs, ws))[0] == 1     # the reload dropped it
    print("ok")
    """, AITER_CONFIG_GEMM_A8W8_BLOCKSCALE=str(table), AITER_GEMM_TRITON_CONFIGS=str(tmp_path))
    assert out.strip() == "ok"


@pytest.mark.gpu
def test_cuda_entry_eager_and_under_capture(built):
    """On the GPU: eager calls through the C++ entry equal F.linear where the eager decision is torch, and a
    CUDA-graph capture of the same calls runs the graph-time decision (the probe) and replays correctly."""
    out = run("""
        import torch, torch.nn.functional as F
        from aiter_gemm.ops import a16w16 as ops
        from aiter_gemm import gemm_a16w16
        torch.manual_seed(0)
        for m, n, k in ((1, 4096, 4096), (4, 1280, 8192), (17, 6144, 4096), (97, 4096, 14336)):
            a = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
            ref = F.linear(a, w)
            cfg = ops.get_GEMM_A16W16_config(m, n, k, False, torch.bfloat16)
            gemm_a16w16(a, w)
            eager = gemm_a16w16(a, w)
            if cfg["eager_libtype"] == "torch":
                assert torch.equal(eager, ref), (m, n, k)
            assert torch.allclose(eager.float(), ref.float(), rtol=2e-2, atol=2e-2), (m, n, k)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                gemm_a16w16(a, w)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                captured = gemm_a16w16(a, w)
            g.replay()
            torch.cuda.synchronize()
            assert torch.allclose(captured.float(), ref.float(), rtol=2e-2, atol=2e-2), (m, n, k)
            print(m, n, k, cfg["libtype"], cfg["eager_libtype"])
        print("cached", ops.EAGER_EXT.cached())
    """)
    assert "cached" in out, out


@pytest.mark.gpu
def test_cuda_blockscale_entry_eager_and_under_capture(built):
    """On the GPU: gemm_a8w8_blockscale's C++ entry runs the eager choice (torch's block-scaled matmul) bit for bit
    as the plain call, and a capture of a Triton-decided shape runs the Triton kernel (the probe) and replays."""
    out = run("""
        import torch
        from aiter_gemm.ops import a8w8_blockscale as bs
        from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl
        from aiter_gemm.kernels.a8w8_blockscale import gemm_a8w8_blockscale_ref, quantize_blockscale
        assert bs.gemm_a8w8_blockscale is bs.GEMM_A8W8_BLOCKSCALE_ENTRY.c_fn
        torch.manual_seed(0)
        for m, n, k in ((3, 2112, 7168), (100, 4096, 512), (1000, 7168, 2048)):
            XQ, WQ, xs, ws = (t.cuda() for t in quantize_blockscale(torch.randn(m, k), torch.randn(n, k) / k ** 0.5))
            ref = gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)
            cfg = bs.get_GEMM_A8W8_BLOCKSCALE_config(m, n, k)
            bs.gemm_a8w8_blockscale(XQ, WQ, xs, ws)
            eager = bs.gemm_a8w8_blockscale(XQ, WQ, xs, ws)
            if cfg["eager_libtype"] == "torch":
                assert torch.equal(eager, torch_impl.gemm_a8w8_blockscale_torch(XQ, WQ, xs, ws)), (m, n, k)
            err = lambda out: ((out.float() - ref).norm() / ref.norm()).item()
            assert err(eager) < 8e-3, (m, n, k)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                captured = bs.gemm_a8w8_blockscale(XQ, WQ, xs, ws)
            g.replay()
            torch.cuda.synchronize()
            assert err(captured) < 8e-3, (m, n, k)
            print(m, n, k, cfg["libtype"], cfg["eager_libtype"])
        print("cached", bs.EAGER_EXT.cached())
    """)
    assert "cached" in out, out
