"""torch's block-scaled matmul with its cuBLASLt plan made once (issue 53, item 4a): on CPU, through a fake nvmath
bindings module, the descriptor attributes and layouts the plan sets (torch's ``scaled_gemm`` ones), one heuristic
query per shape under torch's workspace limit, the four pointers a call passes, the padding, the checks, and the
fallback to torch's op (no nvmath-python, no block scaling, no algorithm, misaligned operands); on a GPU, the same
bits as ``F.scaled_mm``, eagerly and under CUDA-graph capture."""

from __future__ import annotations

import ctypes
import logging
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from aiter_gemm.backends import _cublaslt_lib as ltlib
from aiter_gemm.backends.a8w8_blockscale import torch as torch_backend
from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl
from aiter_gemm.kernels.a8w8_blockscale import gemm_a8w8_blockscale_ref
from op_tests.test_blockscale_torch import BF16_TOL, _inputs, _rel_err
from op_tests.test_cublaslt_backend import FakeLt

FP8, BF16, CODE_FP8, CODE_BF16 = torch.float8_e4m3fn, torch.bfloat16, 28, 14
ATTR = FakeLt.MatmulDescAttribute
H100 = DeviceIdentity("sm_90", 132, "cuda", "H100")


class FakeBlockLib:
    """The LtLibrary surface LtBlockwiseRunner uses, over :class:`FakeLt`: real plans, a recorded heuristic."""

    def __init__(self, version: int = 130100, found: int = 1, workspace: int = 0, align: int = 16) -> None:
        self.lt, self.handle, self.version = FakeLt(), 77, version
        self.found, self.workspace, self.align = found, workspace, align
        self.queries: list[dict] = []

    def plan(self, problem, block_scaled=False):
        return ltlib.MatmulPlan(self, problem, block_scaled)

    best = ltlib.LtLibrary.best

    def _query(self, plan, workspace, reduction_mask, count):
        self.queries.append({"problem": plan.problem, "workspace": workspace, "count": count,
                             "block_scaled": plan.block_scaled})
        return [ltlib.AlgoInfo(bytes(64), self.workspace, 1.0)] * self.found, None

    def cap(self, raw, name):
        return self.align

    def block_scaling_reason(self):
        return None


def lt_runner(M, N, K, lib=None, fallback=None):
    lib = lib or FakeBlockLib()
    runner = torch_impl.LtBlockwiseRunner(lib, M, N, K, BF16, torch.device("cpu"),
                                          fallback or torch_impl.launcher(M, N, K))
    runner._stream_of = lambda index: 0  # CPU tensors: no CUDA stream
    return runner, lib


@pytest.fixture
def fake_plans(monkeypatch):
    """:data:`torch_impl.LT` over a fake library, restored after the test."""
    lib = FakeBlockLib()
    plans = torch_impl.LtPlans(loader=lambda: lib)
    monkeypatch.setattr(torch_impl, "LT", plans)
    return plans, lib


# ---- the plan: torch's descriptor, layouts and scale modes ------------------------------------------------------
@pytest.mark.parametrize("M,pad", [(8, 0), (3, 1), (17, 3)])
def test_plan_sets_torch_scaled_gemm_attributes_and_layouts(M, pad):
    """cuBLAS A = the weight (K, N) ld K op T with 128x128 block scales, B = the activation (K, M + pad) ld K op N with
    1x128 scales, D = out (N, M + pad) ld N: torch's scaled_gemm for a row-major output, operands swapped."""
    runner, lib = lt_runner(M, 256, 1024)
    lt = lib.lt
    assert lt.layouts == [(CODE_FP8, 1024, 256, 1024), (CODE_FP8, 1024, M + pad, 1024), (CODE_BF16, 256, M + pad, 256)]
    assert lt.attrs[ATTR.TRANSA] == ltlib.OP_T and lt.attrs[ATTR.TRANSB] == ltlib.OP_N
    assert lt.attrs[ATTR.A_SCALE_MODE] == ltlib.SCALE_BLK128x128_32F == 5
    assert lt.attrs[ATTR.B_SCALE_MODE] == ltlib.SCALE_VEC128_32F == 4
    assert ATTR.EPILOGUE not in lt.attrs
    # non-NULL scale pointers before the heuristic query (cuBLASLt refuses a block scale mode without one)
    assert lt.attrs[ATTR.A_SCALE_POINTER] == lt.attrs[ATTR.B_SCALE_POINTER] == ltlib.SCALE_PLACEHOLDER
    assert ltlib.SCALE_PLACEHOLDER % 256 == 0


def test_a_plain_plan_sets_no_scale_mode():
    lib = FakeBlockLib()
    ltlib.MatmulPlan(lib, GemmProblem(8, 256, 512, False, FP8, BF16, True))
    assert ATTR.A_SCALE_MODE not in lib.lt.attrs and ATTR.B_SCALE_MODE not in lib.lt.attrs
    assert ATTR.A_SCALE_POINTER not in lib.lt.attrs and ATTR.B_SCALE_POINTER not in lib.lt.attrs


class RulesLt(FakeLt):
    """:class:`FakeLt` with the heuristic surface a real :class:`ltlib.LtLibrary` calls, following cuBLASLt's rules:
    a non-scalar scale mode whose scale pointer is NULL is refused with CUBLAS_STATUS_INVALID_VALUE ("The scaling
    mode for A scale ... requires a custom pointer for A scale"); ``status`` refuses every query with that status."""

    class cuBLASLtError(Exception):  # noqa: N801 - nvmath's name
        def __init__(self, status):
            self.status = status
            super().__init__(f"{ {7: 'INVALID_VALUE', 15: 'NOT_SUPPORTED'}[status]} ({status})")

    class MatmulPreferenceAttribute:
        MAX_WORKSPACE_BYTES, REDUCTION_SCHEME_MASK = 1, 3

    MatmulAlgoConfigAttribute = SimpleNamespace(**{f: i for i, f in enumerate(ltlib.CONFIG_FIELDS)})
    matmul_heuristic_result_dtype = np.dtype([("algo", np.uint8, 64), ("workspace_size", np.uint64),
                                              ("state", np.int32), ("waves_count", np.float32),
                                              ("reserved", np.int32, 4)])

    def __init__(self, status=None, refuse=None):
        super().__init__()
        self.status, self.refuse = status, refuse

    def matmul_desc_set_attribute(self, desc, attr, ptr, size):
        if attr == self.refuse:
            raise self.cuBLASLtError(7)
        super().matmul_desc_set_attribute(desc, attr, ptr, size)

    def get_version(self):
        return 130100

    def get_matmul_algo_config_attribute_dtype(self, attr):
        return np.uint32

    def create(self):
        return 77

    def matmul_preference_create(self):
        return 3000

    def matmul_preference_destroy(self, pref):
        pass

    def get_matmul_preference_attribute_dtype(self, attr):
        return np.uint64

    def matmul_preference_set_attribute(self, pref, attr, ptr, size):
        pass

    def matmul_algo_get_heuristic(self, handle, desc, a, b, c, d, pref, count, results, returned):
        A = self.MatmulDescAttribute
        for mode, ptr in ((A.A_SCALE_MODE, A.A_SCALE_POINTER), (A.B_SCALE_MODE, A.B_SCALE_POINTER)):
            if self.attrs.get(mode, 0) and not self.attrs.get(ptr):
                raise self.cuBLASLtError(7)
        if self.status is not None:
            raise self.cuBLASLtError(self.status)
        ctypes.c_int32.from_address(returned).value = 1  # one algorithm: the zeroed result (state 0, no workspace)


def test_block_scaled_plan_passes_cublaslt_heuristic_rules(monkeypatch):
    """The H200 failure: every shape fell back to F.scaled_mm because the heuristic was asked with NULL scale
    pointers under block scale modes (INVALID_VALUE, swallowed as "no algorithm"); a real LtLibrary over a module
    with cuBLASLt's rule now gets its algorithm."""
    monkeypatch.setattr(torch_impl, "LT", torch_impl.LtPlans(loader=lambda: ltlib.LtLibrary(RulesLt())))
    runner = torch_impl.launcher(8, 256, 512, BF16, torch.device("cuda", 0))
    assert isinstance(runner, torch_impl.LtBlockwiseRunner), torch_impl.LT.reason(8, 256, 512)
    assert torch_impl.LT.reason(8, 256, 512) is None


def _launch_torch_op(monkeypatch, caplog, loader) -> torch_impl.LtPlans:
    """Plans over ``loader`` as the process's; (M, 256, 512) launched for M 8 and 16, each getting torch's op."""
    plans = torch_impl.LtPlans(loader=loader)
    monkeypatch.setattr(torch_impl, "LT", plans)
    with caplog.at_level(logging.INFO, logger=torch_impl.__name__):
        for M in (8, 16):
            runner = torch_impl.launcher(M, 256, 512, BF16, torch.device("cuda", 0))
            assert not isinstance(runner, torch_impl.LtBlockwiseRunner), M
    return plans


@pytest.mark.parametrize("lt,why", [
    (RulesLt(status=7), "cublasLtMatmulAlgoGetHeuristic failed: INVALID_VALUE (7)"),
    (RulesLt(status=15), "cublasLtMatmulAlgoGetHeuristic failed: NOT_SUPPORTED (15)"),
    (RulesLt(refuse=ATTR.A_SCALE_MODE), "refused matmul descriptor attribute 31=5: INVALID_VALUE (7)"),
])
def test_a_refused_plan_keeps_the_library_status(monkeypatch, caplog, lt, why):
    """The reason of a shape's fallback names cuBLASLt's status and call (what the overhead bench's note and the GPU
    tests print), and is logged once per cause; a refused descriptor attribute falls back too, not a crash."""
    _launch_torch_op(monkeypatch, caplog, lambda: ltlib.LtLibrary(lt))
    for M in (8, 16):
        assert torch_impl.LT.reason(M, 256, 512).endswith(why)
    assert torch_impl.LT.unavailable_reason() is None and torch_impl.LT.reason(8, 256, 1024) is None
    logged = [r.getMessage() for r in caplog.records if "F.scaled_mm" in r.getMessage()]
    assert len(logged) == 1 and "first M=8" in logged[0] and why in logged[0]


@pytest.mark.parametrize("env,limit", [(None, 1 << 20), ("4096", 4 << 20), ("lots", 1 << 20)])
def test_one_heuristic_query_per_shape_under_torch_workspace_limit(monkeypatch, env, limit):
    """Heuristic #0 under torch's CUBLASLT_WORKSPACE_SIZE limit (torch's algorithm), asked once at prepare; calls
    make none."""
    if env is None:
        monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    else:
        monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", env)
    runner, lib = lt_runner(8, 256, 512)
    XQ, WQ, xs, ws = _inputs(8, 256, 512)
    for _ in range(3):
        runner(XQ, WQ, xs, ws, BF16)
    assert lib.queries == [{"problem": GemmProblem(8, 256, 512, False, FP8, BF16, True), "workspace": limit,
                            "count": 1, "block_scaled": True}]
    assert len(lib.lt.calls) == 3


# ---- the call: four pointers, padding, checks ------------------------------------------------------------------
def test_call_passes_operands_scales_and_output_in_place():
    runner, lib = lt_runner(8, 256, 1024, lib=FakeBlockLib(workspace=4096))
    XQ, WQ, xs, ws = _inputs(8, 256, 1024)
    xs_m = xs.t().contiguous().t()  # M-major, as the FP8 models' quantizer writes it in eager calls
    out = runner(XQ, WQ, xs_m, ws, BF16)
    call = lib.lt.calls[-1]
    assert out.shape == (8, 256) and out.dtype == BF16 and torch.equal(out, torch.ones(8, 256, dtype=BF16))
    assert (call["A"], call["B"], call["D"], call["C"]) == (WQ.data_ptr(), XQ.data_ptr(), out.data_ptr(),
                                                            out.data_ptr())
    assert (call["scale_A"], call["scale_B"]) == (ws.data_ptr(), xs_m.data_ptr())  # cuBLAS A is the weight
    assert call["ws"] == 4096  # the algorithm's need, allocated once per stream
    XQ2, WQ2, xs2, ws2 = _inputs(8, 256, 1024)
    runner(XQ2, WQ2, xs2.t().contiguous().t(), ws2, BF16)  # another layer of the shape: new pointers every call
    assert (lib.lt.calls[-1]["A"], lib.lt.calls[-1]["scale_A"]) == (WQ2.data_ptr(), ws2.data_ptr())


@pytest.mark.parametrize("M", [1, 3, 17])
def test_call_pads_m_and_lays_x_scale_out_m_major(M):
    """M + pad rows (a multiple of 4) of A and of M-major x_scale, as torch's runner makes them; out is the first M
    rows of the (M + pad, N) result."""
    pad = -M % 4
    runner, lib = lt_runner(M, 256, 512)
    XQ, WQ, xs, ws = _inputs(M, 256, 512)
    seen = {}

    def matmul(handle, desc, alpha, A, la, B, lb, beta, C, lc, D, ld, algo, ws_ptr, ws_size, stream):
        seen["a"] = torch.frombuffer(_view(B, (M + pad) * 512), dtype=torch.uint8).clone()
        seen["sa"] = torch.frombuffer(_view(lib.lt.attrs[ATTR.B_SCALE_POINTER], (M + pad) * 4 * 4),
                                      dtype=torch.float32).clone()
        FakeLt.matmul(lib.lt, handle, desc, alpha, A, la, B, lb, beta, C, lc, D, ld, algo, ws_ptr, ws_size, stream)

    lib.lt.matmul = runner._matmul = matmul
    out = runner(XQ, WQ, xs, ws, BF16)  # row-major x_scale: copied into an M-major buffer
    assert out.shape == (M, 256) and out.data_ptr() == lib.lt.calls[-1]["D"]
    assert (lib.lt.calls[-1]["B"] == XQ.data_ptr()) is (pad == 0)
    assert torch.equal(seen["a"].view(M + pad, 512)[:M], XQ.view(torch.uint8))
    assert torch.equal(seen["sa"].view(4, M + pad)[:, :M], xs.t())  # (K blocks, M + pad): M-major


def _view(ptr: int, nbytes: int):
    import ctypes

    return (ctypes.c_uint8 * nbytes).from_address(ptr)


@pytest.mark.parametrize("bad,what", [
    (lambda o: (o[0][:4], *o[1:]), "XQ shape (4, 512)"),
    (lambda o: (o[0], o[1][:128], *o[2:]), "WQ shape (128, 512)"),
    (lambda o: (*o[:2], o[2].double(), o[3]), "x_scale dtype torch.float64"),
    (lambda o: (*o[:3], o[3][:1]), "w_scale shape (1, 4)"),
])
def test_call_rejects_operands_the_runner_was_not_bound_to(bad, what):
    runner, lib = lt_runner(8, 256, 512)
    with pytest.raises(ValueError, match=re.escape(f"M=8 N=256 K=512: {what} (bound: ")):
        runner(*bad(_inputs(8, 256, 512)), BF16)
    with pytest.raises(ValueError, match="output dtype torch.float16"):
        runner(*_inputs(8, 256, 512), torch.float16)
    assert lib.lt.calls == []


def test_misaligned_operands_run_torch_op():
    called = []
    runner, lib = lt_runner(8, 256, 512, fallback=lambda *a: called.append(a) or "torch")
    XQ, WQ, xs, ws = _inputs(8, 256, 512)
    flat = torch.empty(8 * 512 + 8, dtype=torch.uint8)
    misaligned = flat[8:].view(FP8).view(8, 512)  # 8 bytes off: the algorithm asks for 16
    misaligned.copy_(XQ)
    assert runner(misaligned, WQ, xs, ws, BF16) == "torch" and len(called) == 1 and lib.lt.calls == []


# ---- where the plan is made, and where torch's op runs instead ------------------------------------------------
def test_launcher_makes_a_plan_on_cuda_devices_only(fake_plans):
    plans, lib = fake_plans
    assert isinstance(torch_impl.launcher(8, 256, 512, BF16, torch.device("cuda", 0)), torch_impl.LtBlockwiseRunner)
    assert not isinstance(torch_impl.launcher(8, 256, 512, BF16, torch.device("cpu")), torch_impl.LtBlockwiseRunner)
    assert not isinstance(torch_impl.launcher(8, 256, 512), torch_impl.LtBlockwiseRunner)
    with pytest.raises(ValueError, match="multiple of 512"):  # one support rule: torch's shapes, plan or not
        torch_impl.launcher(8, 256, 384, BF16, torch.device("cuda", 0))
    assert len(lib.queries) == 1


@pytest.mark.parametrize("K", [384, 512])
def test_padded_scale_runners_are_torch_op_on_cuda_devices(fake_plans, K):
    """The HF loop's torch arm binds ``padded_scales=True`` runners (w_scale's K blocks padded to 4): the plan checks
    and lays out K/128 blocks unpadded, so those runners are torch's op on a CUDA device too, and ask no plan."""
    plans, lib = fake_plans
    run = torch_impl.launcher(8, 256, K, BF16, torch.device("cuda", 0), padded_scales=True)
    assert not isinstance(run, torch_impl.LtBlockwiseRunner) and lib.queries == []
    with pytest.raises(ValueError, match="multiple of 128"):
        torch_impl.launcher(8, 256, K + 64, BF16, torch.device("cuda", 0), padded_scales=True)


@pytest.mark.parametrize("libtype", ["torch", "triton"])
def test_overhead_note_names_the_plan_of_a_torch_eager_gemm(fake_plans, monkeypatch, libtype):
    """The overhead bench's GEMM note for a shape whose eager calls run torch's matmul says whether its runner has the
    cached cuBLASLt plan, or why not (the eager runner's, for an eager switch)."""
    import aiter_gemm
    from benchmarks import overhead

    plans, _ = fake_plans
    cached = torch_impl.launcher(8, 256, 512, BF16, torch.device("cuda", 0))
    plain = torch_impl.launcher(8, 256, 512)
    dec = SimpleNamespace(runner=object(), eager_runner=cached) if libtype == "triton" else \
        SimpleNamespace(runner=cached, eager_runner=None)
    monkeypatch.setattr(aiter_gemm, "get_dispatcher", lambda op: SimpleNamespace(decide=lambda problem, gpu: dec))
    ops = _inputs(8, 256, 512)
    note = overhead._gemm_path({"libtype": libtype, "eager_libtype": "torch"}, ops)
    assert note.startswith("torch") and note.endswith("cached cuBLASLt plan")
    plans._refused[(8, 256, 512, BF16)] = "no algorithm"
    dec.runner, dec.eager_runner = (object(), plain) if libtype == "triton" else (plain, None)
    assert overhead._gemm_path({"libtype": libtype, "eager_libtype": "torch"}, ops).endswith(
        "F.scaled_mm (no cached plan: no algorithm)")


def test_backend_prepares_the_plan_for_a_gpu_identity(fake_plans, monkeypatch):
    monkeypatch.setattr(torch_impl, "unavailable_reason", lambda device: None)
    problem = GemmProblem(8, 256, 512, False, FP8, BF16)
    backend = torch_backend.BACKEND
    assert isinstance(backend.prepare(problem, torch_backend.SOLUTION, H100), torch_impl.LtBlockwiseRunner)
    assert backend.candidates(problem, H100) == [torch_backend.SOLUTION]  # the tuner times the same solution
    assert backend.prepare(GemmProblem(8, 256, 384, False, FP8, BF16), torch_backend.SOLUTION, H100) is None


def _broken(exc):
    def load():
        raise exc
    return load


@pytest.mark.parametrize("check,why", [(lambda lib: None, None), (lambda lib: "no block scaling", "no block scaling")])
@pytest.mark.parametrize("fails", [False, True])
def test_library_once_loads_on_first_ask_only(check, why, fails):
    """One load per process whatever it answered (the cuBLASLt backend's and the block-scaled plans' loader); a
    reason asked without loading is None until the library was asked for."""
    loads = []

    def loader():
        loads.append(1)
        if fails:
            raise ltlib.LibraryUnavailable("no nvmath")
        return _lib_with()

    once = ltlib.LibraryOnce(loader, check=check)
    assert once.reason(load=False) is None and not loads
    want = "no nvmath" if fails else why
    assert [once.reason(), once.reason(load=False), once.reason()] == [want] * 3
    assert (once.get() is None) == (want is not None) and once.get() is once.get() and len(loads) == 1


@pytest.mark.parametrize("loader,why", [
    (_broken(ltlib.LibraryUnavailable("nvmath-python is not importable")), "nvmath-python is not importable"),
    (lambda: _lib_with(version=120800), "cuBLASLt 120800 has no block scaling"),
    (lambda: _lib_with(attrs=()), "no A_SCALE_MODE"),
])
def test_torch_op_runs_where_no_plan_can_be_made_logged_once(monkeypatch, caplog, loader, why):
    plans = _launch_torch_op(monkeypatch, caplog, loader)
    assert why in plans.unavailable_reason() and why in plans.reason(8, 256, 512)
    logged = [r.getMessage() for r in caplog.records if "F.scaled_mm" in r.getMessage()]
    assert len(logged) == 1 and why in logged[0]


def test_shape_without_an_algorithm_runs_torch_op(monkeypatch, caplog):
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    lib = FakeBlockLib(found=0)
    _launch_torch_op(monkeypatch, caplog, lambda: lib)
    assert torch_impl.LT.unavailable_reason() is None and len(lib.queries) == 2
    assert [r.getMessage() for r in caplog.records if "first M=8" in r.getMessage()] and \
        not [r for r in caplog.records if "M=16" in r.getMessage()]
    assert "returned no algorithm within a 1048576-byte workspace" in torch_impl.LT.reason(16, 256, 512)


def _lib_with(version=130100, attrs=("A_SCALE_MODE", "B_SCALE_MODE")):
    """A real LtLibrary over a minimal fake module (version, config attribute dtypes, descriptor attributes)."""
    fields = SimpleNamespace(**{f: i for i, f in enumerate(ltlib.CONFIG_FIELDS)})
    lt = SimpleNamespace(get_version=lambda: version, MatmulAlgoConfigAttribute=fields,
                         get_matmul_algo_config_attribute_dtype=lambda attr: np.uint32,
                         MatmulDescAttribute=SimpleNamespace(**{a: 31 + i for i, a in enumerate(attrs)}))
    return ltlib.LtLibrary(lt)


@pytest.mark.parametrize("version,attrs,ok", [(130100, True, True), (120900, True, True), (120805, True, False),
                                              (130100, False, False)])
def test_block_scaling_reason(version, attrs, ok):
    lib = _lib_with(version, ("A_SCALE_MODE", "B_SCALE_MODE") if attrs else ())
    assert (lib.block_scaling_reason() is None) is ok


# ---- GPU: the same bits as F.scaled_mm ---------------------------------------------------------------------------
def _gpu_runner(M, N, K):
    pytest.importorskip("nvmath")
    dev = torch.device("cuda", torch.cuda.current_device())
    if torch_impl.unavailable_reason(dev):
        pytest.skip(torch_impl.unavailable_reason(dev))
    assert torch_impl.LT.unavailable_reason() is None, torch_impl.LT.unavailable_reason()
    runner = torch_impl.launcher(M, N, K, BF16, dev)
    assert isinstance(runner, torch_impl.LtBlockwiseRunner), f"no cached plan: {torch_impl.LT.reason(M, N, K)}"
    return runner


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 3, 17, 97, 4100])
@pytest.mark.parametrize("N,K", [(512, 512), (576, 7168), (4096, 2048)])
def test_gpu_plan_equals_f_scaled_mm(M, N, K):
    """Heuristic #0 under torch's workspace limit is torch's algorithm: bit for bit F.scaled_mm's result, with
    M-major and row-major x_scale, within the bf16 tolerance of the float32 reference."""
    runner = _gpu_runner(M, N, K)
    XQ, WQ, xs, ws = _inputs(M, N, K, "cuda")
    ref = torch_impl.gemm_a8w8_blockscale_torch(XQ, WQ, xs, ws)
    for x_scale in (xs.t().contiguous().t(), xs):
        out = runner(XQ, WQ, x_scale, ws, BF16)
        assert out.shape == (M, N) and torch.equal(out, ref), "not torch's algorithm: compare the heuristic's limit"
    assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < BF16_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("M", [3, 97])
def test_gpu_plan_under_cuda_graph_capture(M):
    N, K = 576, 7168
    runner = _gpu_runner(M, N, K)
    XQ, WQ, xs, ws = _inputs(M, N, K, "cuda")
    xs = xs.t().contiguous().t()
    runner(XQ, WQ, xs, ws, BF16)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = runner(XQ, WQ, xs, ws, BF16)
    for seed in range(3):
        XQ2, _, xs2, _ = _inputs(M + seed, N, K, "cuda")
        XQ.copy_(XQ2[:M])
        xs.copy_(xs2[:M])
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, torch_impl.gemm_a8w8_blockscale_torch(XQ, WQ, xs, ws))
