"""Tests of the ``cublaslt`` backend: row encoding, stale-row rejection, unavailability (CPU, with a fake library),
and on a GPU: every enumerated solution correct, CSV replay bit-identical, heuristic #0, fp8 scales, graph capture."""

from __future__ import annotations

import logging
import struct
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from aiter_gemm.backends import _cublaslt_lib as ltlib
from aiter_gemm.backends import cublaslt
from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.device import DeviceIdentity

H100 = DeviceIdentity("sm_90", 132, "cuda", "fake H100")
CPU = DeviceIdentity("cpu", 2, "cpu", "cpu")
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
FP8 = getattr(torch, "float8_e4m3fn", None)

# ‖out − ref‖ / ‖ref‖ against a float64 reference, by output dtype. Inputs are rounded to the input dtype before
# the reference, so the error is accumulation order plus the output rounding: bf16 output 2^-8 relative per element
# (~4e-3 worst, ~2e-3 norm-wise), fp16 2^-11, fp32 output from fp32 accumulation (~1e-5; split-K partials included).
TOL = {BF16: 8e-3, F16: 2e-3, F32: 1e-4}
FP8_TOL = 8e-3  # fp8 inputs are exact in the reference (dequantized); the rest is the bf16 output rounding


# ---- row encoding ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [0, 120904, 130100, 999999999999])
@pytest.mark.parametrize("raw", [bytes(64), bytes(range(64)), bytes([255] * 64)])
def test_encode_decode_round_trip(version, raw):
    name = cublaslt.encode_algo(version, raw)
    assert name == f"v{version}:{raw.hex()}"
    assert cublaslt.decode_algo(name) == (version, raw)


@pytest.mark.parametrize("bad", [
    "", "v130100", "130100:" + "00" * 64, "v130100:" + "00" * 63, "v130100:" + "00" * 65, "v130100:" + "AB" * 64,
    "v13.1:" + "00" * 64, "v130100:" + "0g" * 64, "v130100:" + "00" * 64 + ":x", "hipblaslt_kernel_name",
])
def test_decode_rejects_malformed(bad):
    with pytest.raises(ValueError, match="kernelName"):
        cublaslt.decode_algo(bad)


@pytest.mark.parametrize("n", [0, 63, 65])
def test_encode_rejects_wrong_size(n):
    with pytest.raises(ValueError, match="64 bytes"):
        cublaslt.encode_algo(1, bytes(n))


# ---- a fake library: the struct is CONFIG_FIELDS packed as uint32, the rest zero -------------------------------
class FakeLib:
    """Stands in for LtLibrary on CPU: heuristic lists per (workspace, mask), a check rule, caps per config."""

    def __init__(self, version=130100, lists=None, reject=lambda cfg: False, reject_layout=lambda layout: False):
        self.version = version
        self.lists = lists or {}
        self.reject = reject
        self.reject_layout = reject_layout  # activation layouts (by handle) the check refuses
        self.checked = []

    @staticmethod
    def make(**cfg):
        vals = [cfg.get(f, 0) for f in ltlib.CONFIG_FIELDS]
        return struct.pack("<9I", *vals) + bytes(64 - 36)

    def config(self, raw):
        return dict(zip(ltlib.CONFIG_FIELDS, struct.unpack("<9I", raw[:36]), strict=True))

    def with_config(self, raw, **changes):
        cfg = self.config(raw)
        cfg.update(changes)
        return self.make(**cfg)

    def plan(self, problem):
        return ("plan", problem)

    def heuristic(self, plan, *, workspace, reduction_mask=None, count=32):
        return [ltlib.AlgoInfo(r, workspace // 2, 1.0) for r in self.lists.get((workspace, reduction_mask), [])]

    def check(self, plan, raw, b_layout=None):
        self.checked.append(raw)
        if self.reject(self.config(raw)) or (b_layout is not None and self.reject_layout(b_layout)):
            raise ltlib.AlgoRejected("CUBLAS_STATUS_NOT_SUPPORTED")
        return ltlib.AlgoInfo(raw, 0, 1.0)

    def cap(self, raw, name):
        return {"CTA_SWIZZLING_SUPPORT": 1, "SPLITK_SUPPORT": 1, "REDUCTION_SCHEME_MASK": 7}.get(name, 16)

    def tile_dims(self, tile_id):
        return {1: (128, 64), 2: (256, 128), 3: (64, 16), 4: (128, 256)}.get(tile_id)

    def cap_ids(self, raw, name):
        return {"TILE_IDS": [1, 3, 4], "STAGES_IDS": [7, 9]}[name]

    def algo_ids(self, problem, count=256):
        return [1, 6]

    def init_algo(self, problem, algo_id):
        if algo_id == 6:
            raise ltlib.AlgoRejected("algorithm id 6: CUBLAS_STATUS_NOT_SUPPORTED")
        return self.make(ID=algo_id)

    def cluster_id(self, shape):
        return {"1x1x1": 2, "2x1x1": 3, "1x2x1": 5}[shape]


def fake_backend(lib):
    return cublaslt.CublasLtBackend(loader=lambda: lib)


def sol_for(lib, raw, version=None):
    cfg = lib.config(raw)
    return Solution("cublaslt", cfg["ID"], cfg["SPLITK_NUM"] if cfg["SPLITK_NUM"] > 1 else 0,
                    cublaslt.encode_algo(lib.version if version is None else version, raw))


PROBLEM = GemmProblem(64, 4096, 4096, False, BF16, BF16)


def test_solution_for_row_fields():
    lib = FakeLib()
    raw = lib.make(ID=21, SPLITK_NUM=4, TILE_ID=1)
    assert cublaslt.solution_for(lib, raw) == Solution("cublaslt", 21, 4, f"v130100:{raw.hex()}")
    assert cublaslt.solution_for(lib, lib.make(ID=7, SPLITK_NUM=1)).splitK == 0


@pytest.mark.parametrize("row_version", [120904, 130000, 130101])
def test_version_mismatch_is_a_miss_with_one_warning(row_version, caplog):
    lib = FakeLib(version=130100)
    backend = fake_backend(lib)
    sol = sol_for(lib, lib.make(ID=21), version=row_version)
    with caplog.at_level(logging.WARNING, logger=cublaslt.__name__):
        assert backend.prepare(PROBLEM, sol, H100) is None
        assert backend.prepare(PROBLEM, sol, H100) is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert f"cuBLASLt {row_version}" in msg and "130100" in msg and "solidx=21" in msg
    assert lib.checked == []  # rejected before any library call


def test_algo_failing_check_is_a_miss(caplog):
    lib = FakeLib(reject=lambda cfg: cfg["TILE_ID"] == 2)
    with caplog.at_level(logging.WARNING, logger=cublaslt.__name__):
        assert fake_backend(lib).prepare(PROBLEM, sol_for(lib, lib.make(ID=5, TILE_ID=2)), H100) is None
    assert "cublasLtMatmulAlgoCheck" in caplog.text


@pytest.mark.parametrize("field,value", [("solidx", 22), ("splitK", 2)])
def test_row_fields_must_match_struct(field, value, caplog):
    lib = FakeLib()
    sol = sol_for(lib, lib.make(ID=21))
    sol = Solution(sol.libtype, value if field == "solidx" else sol.solidx, value if field == "splitK" else 0,
                   sol.kernelName)
    with caplog.at_level(logging.WARNING, logger=cublaslt.__name__):
        assert fake_backend(lib).prepare(PROBLEM, sol, H100) is None
    assert "encodes algo id 21" in caplog.text


@pytest.mark.parametrize("kernel", ["", "F.linear", "v130100:zz"])
def test_malformed_row_is_a_miss(kernel, caplog):
    with caplog.at_level(logging.WARNING, logger=cublaslt.__name__):
        assert fake_backend(FakeLib()).prepare(PROBLEM, Solution("cublaslt", 3, 0, kernel), H100) is None
    assert "kernelName" in caplog.text


def test_prepare_refuses_non_cuda_device():
    lib = FakeLib()
    assert fake_backend(lib).prepare(PROBLEM, sol_for(lib, lib.make(ID=1)), CPU) is None


# ---- dtype support: one function for tuner and runtime ----------------------------------------------------------
@pytest.mark.parametrize("dtype,otype,scale,ok", [
    (BF16, BF16, False, True), (BF16, F32, False, True), (F16, F16, False, True), (F16, F32, False, True),
    (BF16, F16, False, False), (F32, F32, False, False), (BF16, BF16, True, False),
    *([(FP8, BF16, True, True), (FP8, F32, False, True), (FP8, FP8, True, False)] if FP8 is not None else []),
])
def test_supported_reason(dtype, otype, scale, ok):
    why = ltlib.supported_reason(GemmProblem(8, 16, 32, False, dtype, otype, scale))
    assert (why is None) is ok, why


# ---- default and enumeration logic ------------------------------------------------------------------------------
def test_default_only_for_bpreshuffle_on_cuda():
    backend = fake_backend(FakeLib())
    shuffled = GemmProblem(64, 4096, 4096, bpreshuffle=True)
    assert backend.default_for(shuffled, H100) == Solution("cublaslt", -1, 0, "")
    assert backend.default_for(PROBLEM, H100) is None
    assert backend.default_for(shuffled, CPU) is None
    assert backend.default_for(GemmProblem(64, 4096, 4096, dtype=F32, otype=F32, bpreshuffle=True), H100) is None
    assert backend.is_blaslt and backend.default_priority > 0


def test_enumeration_union_dedup_and_checked_variations():
    lib = FakeLib(reject=lambda cfg: cfg["SPLITK_NUM"] == 8 or cfg["CLUSTER_SHAPE_ID"] == 5)
    a = lib.make(ID=1, TILE_ID=2, CLUSTER_SHAPE_ID=2)  # 256x128 tiles: 16 x 1 = 16 tiles < 132 SMs
    b = lib.make(ID=2, TILE_ID=1, CLUSTER_SHAPE_ID=3, CTA_SWIZZLING=1)
    lib.lists = {(32 << 20, None): [a, b], (4 << 20, None): [b, a], (0, 0): [a]}
    found = cublaslt.enumerate_candidates(lib, PROBLEM, H100)
    keys = [tuple(lib.config(cublaslt.decode_algo(c.solution.kernelName)[1]).values()) for c in found]
    assert len(keys) == len(set(keys))  # unique by config
    assert [c.origin for c in found[:2]] == ["heuristic[ws=32MiB,mask=None]#0", "heuristic[ws=32MiB,mask=None]#1"]
    cfgs = [lib.config(cublaslt.decode_algo(c.solution.kernelName)[1]) for c in found]
    assert not any(c["SPLITK_NUM"] == 8 or c["CLUSTER_SHAPE_ID"] == 5 for c in cfgs)  # rejected by the check
    split_a = [c for c in cfgs if c["ID"] == 1 and c["SPLITK_NUM"] in (2, 4)]
    assert len(split_a) == 2 and all(c["REDUCTION_SCHEME"] == 2 for c in split_a)
    assert any(c["ID"] == 2 and c["CTA_SWIZZLING"] == 0 for c in cfgs)  # swizzle flipped
    assert any(c["ID"] == 1 and c["CLUSTER_SHAPE_ID"] == 3 for c in cfgs)  # 2x1x1 cluster tried on a 1x1x1 algo
    for c in found:  # every candidate replays through prepare's resolution
        assert not isinstance(fake_backend(lib).resolve(PROBLEM, c.solution), str)


def test_no_split_k_when_tiles_fill_the_gpu():
    lib = FakeLib()
    raw = lib.make(ID=1, TILE_ID=1)  # 128x64 tiles over N=4096 x M=4096: 2048 tiles
    lib.lists = {(32 << 20, None): [raw]}
    big = GemmProblem(4096, 4096, 4096)
    assert not any(c.solution.splitK for c in cublaslt.enumerate_candidates(lib, big, H100))


def test_space_is_the_tile_stage_neighbourhood_checked_and_unique():
    lib = FakeLib(reject=lambda cfg: cfg["TILE_ID"] == 3 and cfg["STAGES_ID"] == 9)
    lib.lists = {(32 << 20, None): [lib.make(ID=2, TILE_ID=1, STAGES_ID=7, CLUSTER_SHAPE_ID=3)]}
    found = cublaslt.enumerate_space(lib, PROBLEM, H100)  # M=64: tiles wider than 128 along M are skipped
    cfgs = [lib.config(cublaslt.decode_algo(c.solution.kernelName)[1]) for c in found]
    keys = [tuple(c.values()) for c in cfgs]
    assert len(keys) == len(set(keys)) and {c["ID"] for c in cfgs} == {1, 2}  # the heuristic's and AlgoInit's
    assert all(c["TILE_ID"] in (1, 3) for c in cfgs)  # tile 4 (128 x 256) is wider than 2 * M along M
    assert not any(c["TILE_ID"] == 3 and c["STAGES_ID"] == 9 for c in cfgs)  # refused by the check
    # the heuristic pick's cluster (and its cluster variations) kept; AlgoInit's default config has none set
    assert 3 in {c["CLUSTER_SHAPE_ID"] for c in cfgs if c["ID"] == 2}
    assert {c["CLUSTER_SHAPE_ID"] for c in cfgs if c["ID"] == 1} == {0}
    # 128 x 64 tiles: 32 x 1 = 32 < 132 SMs, so split-K 2 and 4 (K >= 256 * split, <= 2 x SMs of tiles); 64 x 16
    # tiles: 64 x 4 = 256 fill the GPU, no split.
    assert {c["SPLITK_NUM"] for c in cfgs if c["TILE_ID"] == 1} == {1, 2, 4, 8}
    assert {c["SPLITK_NUM"] for c in cfgs if c["TILE_ID"] == 3} == {1}
    assert len(cublaslt.enumerate_space(lib, PROBLEM, H100, max_checks=3)) <= 3


# ---- the call path on CPU, through a fake nvmath module: pointer mapping, copies, per-call attributes --------------
class FakeLt:
    """The subset of nvmath.bindings.cublasLt MatmulPlan and LtRunner use; records attribute writes and matmuls."""

    class MatmulDescAttribute:
        TRANSA, TRANSB, EPILOGUE, BIAS_POINTER, A_SCALE_POINTER, B_SCALE_POINTER = 3, 4, 7, 8, 17, 18
        A_SCALE_MODE, B_SCALE_MODE = 31, 32

    class Epilogue:
        BIAS = 4

    def __init__(self):
        self.attrs: dict[int, int] = {}
        self.calls: list[dict] = []
        self.layouts: list[tuple] = []

    def matmul_desc_create(self, compute, scale):
        return 1000

    def matrix_layout_create(self, dtype, rows, cols, ld):
        self.layouts.append((dtype, rows, cols, ld))
        return 2000 + len(self.layouts)

    def get_matmul_desc_attribute_dtype(self, attr):
        import numpy as np

        return np.int64 if attr in (8, 17, 18) else np.int32

    def matmul_desc_set_attribute(self, desc, attr, ptr, size):
        import ctypes

        self.attrs[int(attr)] = (ctypes.c_int64 if size == 8 else ctypes.c_int32).from_address(ptr).value

    def matrix_layout_destroy(self, layout):
        pass

    def matmul_desc_destroy(self, desc):
        pass

    def matmul(self, handle, desc, alpha, A, la, B, lb, beta, C, lc, D, ld, algo, ws, ws_size, stream):
        import ctypes

        dtype, rows, cols, _ = self.layouts[ld - 2001]
        if dtype == 14:  # bf16 output: write 1.0 (0x3F80) everywhere, so tests can see D is the returned tensor
            cells = (ctypes.c_uint16 * (rows * cols)).from_address(D)
            cells[:] = [0x3F80] * (rows * cols)
        self.calls.append({"A": A, "B": B, "C": C, "D": D, "la": la, "lb": lb, "ld": ld, "ws": ws_size,
                           "bias": self.attrs.get(8), "scale_A": self.attrs.get(17), "scale_B": self.attrs.get(18)})


def fake_runner(problem, align=16, lib=None):
    lib = lib or FakeLib()
    lib.lt = FakeLt()
    lib.handle = 77
    lib.cap = lambda raw, name: align if name.startswith("MIN_ALIGNMENT") else 1
    plan = ltlib.MatmulPlan(lib, problem)
    runner = cublaslt.LtRunner(lib, plan, ltlib.AlgoInfo(lib.make(ID=1), 0, 1.0), 0)
    runner._stream_of = lambda index: 0  # CPU tensors: no CUDA stream
    return runner, lib.lt


def test_call_maps_row_major_to_column_major():
    runner, lt = fake_runner(GemmProblem(5, 48, 64, False, BF16, BF16))
    assert lt.layouts == [(14, 64, 48, 64), (14, 64, 5, 64), (14, 48, 5, 48)]  # b (K,N) ld=K, a (K,M), out (N,M)
    assert lt.attrs[3] == 1 and lt.attrs[4] == 0 and 7 not in lt.attrs  # op(A)=T on the weight, op(B)=N, no bias
    a, b = torch.randn(5, 64, dtype=BF16), torch.randn(48, 64, dtype=BF16)
    out = runner(a, b, None, BF16, None, None, None)
    call = lt.calls[-1]
    assert out.shape == (5, 48) and out.dtype == BF16
    assert (call["A"], call["B"], call["D"], call["C"]) == (b.data_ptr(), a.data_ptr(), out.data_ptr(), out.data_ptr())
    assert call["ws"] == 0


def test_call_copies_misaligned_and_unreadable_strided_inputs():
    runner, lt = fake_runner(GemmProblem(4, 32, 64, False, BF16, BF16), align=16)
    flat = torch.randn(4 * 64 + 1, dtype=BF16)
    misaligned = flat[1:].view(4, 64)  # 2-byte offset: breaks the 16-byte alignment the algorithm asks for
    odd_stride = torch.randn(4, 70, dtype=BF16)[:, :64]  # rows 140 bytes apart: not a multiple of 16
    col_major = torch.randn(64, 4, dtype=BF16).t()  # column stride 4: no row-major layout reads it
    b = torch.randn(32, 64, dtype=BF16)
    for a in (misaligned, odd_stride, col_major):
        runner(a, b, None, BF16, None, None, None)
        call = lt.calls[-1]
        assert call["A"] == b.data_ptr() and call["B"] != a.data_ptr() and call["B"] % 16 == 0
        assert lt.layouts[call["lb"] - 2001] == (14, 64, 4, 64)  # the contiguous copy, ld = K
    assert len(lt.layouts) == 3  # no layout made for strides that cannot be read in place


def test_call_reads_strided_rows_in_place_with_a_checked_layout():
    """A column slice of a wider tensor (row stride 80 >= K = 64) is passed as is with an ld = 80 layout, made and
    checked once per stride; a stride the algorithm rejects is copied instead."""
    lib = FakeLib(reject_layout=lambda layout: layout == 2005)  # the second strided layout made below
    runner, lt = fake_runner(GemmProblem(4, 32, 64, False, BF16, BF16), lib=lib)
    b = torch.randn(32, 64, dtype=BF16)
    wide = torch.randn(4, 80, dtype=BF16)
    for _ in range(2):
        runner(wide[:, :64], b, None, BF16, None, None, None)
        call = lt.calls[-1]
        assert call["B"] == wide.data_ptr() and lt.layouts[call["lb"] - 2001] == (14, 64, 4, 80)
    assert len(lt.layouts) == 4 and len(lib.checked) == 1  # one layout, one check, for stride 80
    wider = torch.randn(4, 96, dtype=BF16)  # layout 2005: rejected by the check -> copied, ld = K
    runner(wider[:, 16:80], b, None, BF16, None, None, None)
    call = lt.calls[-1]
    assert call["B"] != wider.data_ptr() and lt.layouts[call["lb"] - 2001] == (14, 64, 4, 64)
    runner(wider[:, 16:80], b, None, BF16, None, None, None)
    assert len(lib.checked) == 2  # the rejection is remembered


def test_call_bias_pointer_set_every_call():
    runner, lt = fake_runner(GemmProblem(4, 32, 64, True, BF16, BF16))
    assert lt.attrs[7] == 4  # CUBLASLT_EPILOGUE_BIAS
    a, b = torch.randn(4, 64, dtype=BF16), torch.randn(32, 64, dtype=BF16)
    for _ in range(2):
        bias = torch.randn(32, dtype=BF16)
        runner(a, b, bias, BF16, None, None, None)
        assert lt.calls[-1]["bias"] == bias.data_ptr()
    runner(a, b, torch.randn(32, dtype=F32), BF16, None, None, None)  # converted to the output dtype
    assert runner._bias_keep.dtype == BF16 and lt.calls[-1]["bias"] == runner._bias_keep.data_ptr()
    with pytest.raises(ValueError, match="bias=None"):
        runner(a, b, None, BF16, None, None, None)
    with pytest.raises(ValueError, match=r"shape \(32,\)"):
        runner(a, b, torch.randn(31, dtype=BF16), BF16, None, None, None)


@pytest.mark.skipif(FP8 is None, reason="this torch has no float8_e4m3fn")
def test_call_fp8_scale_pointers_swap_and_reset():
    runner, lt = fake_runner(GemmProblem(4, 32, 64, False, FP8, BF16, True))
    a, b = torch.randn(4, 64).to(FP8), torch.randn(32, 64).to(FP8)
    sa, sb = torch.tensor(0.5), torch.tensor(2.0)
    runner(a, b, None, BF16, sa, sb, None)
    assert (lt.calls[-1]["scale_A"], lt.calls[-1]["scale_B"]) == (sb.data_ptr(), sa.data_ptr())  # cuBLAS A = b
    runner(a, b, None, BF16, None, None, None)  # no stale pointer from the previous call
    assert (lt.calls[-1]["scale_A"], lt.calls[-1]["scale_B"]) == (0, 0)
    with pytest.raises(ValueError, match="one float32"):
        runner(a, b, None, BF16, torch.ones(2), None, None)


def test_call_rejects_mismatched_operands():
    runner, _ = fake_runner(GemmProblem(4, 32, 64, False, BF16, BF16))
    a, b = torch.randn(4, 64, dtype=BF16), torch.randn(32, 64, dtype=BF16)
    with pytest.raises(ValueError, match=r"a \(5, 64\)"):
        runner(torch.randn(5, 64, dtype=BF16), b, None, BF16, None, None, None)
    with pytest.raises(ValueError, match="float16"):
        runner(a.half(), b.half(), None, BF16, None, None, None)
    with pytest.raises(ValueError, match="otype"):
        runner(a, b, None, F32, None, None, None)
    with pytest.raises(ValueError, match="without bias"):
        runner(a, b, torch.randn(32, dtype=BF16), BF16, None, None, None)
    assert torch.equal(runner(a, b, None, BF16, None, None, None), torch.ones(4, 32, dtype=BF16))
    out = runner(a, b, None, BF16, None, None, torch.tensor(3.0))  # scale_c multiplies the output in place
    assert torch.equal(out, torch.full((4, 32), 3.0, dtype=BF16))


# ---- unavailability ---------------------------------------------------------------------------------------------
def test_unavailable_here_is_clean():
    backend = cublaslt.CublasLtBackend()
    if torch.cuda.is_available() and torch.version.cuda is not None and backend.is_available():
        pytest.skip("cuBLASLt is available here; the GPU tests cover it")
    assert backend.unavailable_reason()
    assert backend.default_for(GemmProblem(8, 16, 32, bpreshuffle=True), H100) is None
    assert backend.candidates(PROBLEM, H100) == []
    assert backend.prepare(PROBLEM, Solution("cublaslt", -1, 0, ""), H100) is None


def test_no_nvmath_reason(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for mod in ("nvmath", "nvmath.bindings", "nvmath.bindings.cublasLt"):
        monkeypatch.setitem(sys.modules, mod, None)
    backend = cublaslt.CublasLtBackend()
    assert not backend.is_available()
    assert "nvmath-python" in backend.unavailable_reason() and "[cuda]" in backend.unavailable_reason()


def test_library_load_failure_reason():
    class BrokenLt:
        def get_version(self):
            raise OSError("libcublasLt.so.13: cannot open shared object file")

    def loader():
        try:
            return ltlib.LtLibrary(BrokenLt())
        except OSError as exc:
            raise ltlib.LibraryUnavailable(f"cuBLASLt could not be loaded: {exc}") from exc

    backend = cublaslt.CublasLtBackend(loader=loader)
    assert not backend.is_available() and "libcublasLt" in backend.unavailable_reason()


def test_module_imports_without_nvmath():
    code = textwrap.dedent("""
        import sys
        sys.modules["nvmath"] = None
        from aiter_gemm.registry import get_backend
        b = get_backend("cublaslt")
        print(type(b).__name__, b.is_available(), b.is_blaslt)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["CublasLtBackend", "False", "True"]


def test_dispatch_falls_back_from_unusable_row(tmp_path, clean_runtime):
    """A cublaslt row this process cannot replay (CPU here; a stale version on a GPU) runs the default instead."""
    import aiter_gemm

    on_gpu = torch.cuda.is_available()
    dev = "cuda" if on_gpu else "cpu"
    ident = aiter_gemm.current_device_identity() if hasattr(aiter_gemm, "current_device_identity") else None
    gfx = "sm_90" if on_gpu else "cpu"
    cu = ident.cu_num if ident is not None else 2
    dtype = BF16 if on_gpu else F32
    row = (f"{gfx},{cu},5,48,64,False,{dtype},{dtype},False,False,cublaslt,21,0,1.0,v1:{'00' * 64}\n")
    path = tmp_path / "tuned.csv"
    path.write_text(",".join(aiter_gemm.configs.BF16_TUNED_COLUMNS[:15]) + "\n" + row)
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(path))
    clean_runtime.setenv("AITER_GEMM_ARCH", gfx)
    clean_runtime.setenv("AITER_GEMM_CU_NUM", str(cu))
    aiter_gemm.reload_configs()
    a = torch.randn(5, 64, dtype=dtype, device=dev)
    b = torch.randn(48, 64, dtype=dtype, device=dev)
    out = aiter_gemm.gemm_a16w16(a, b)
    torch.testing.assert_close(out, F.linear(a, b))
    cfg = aiter_gemm.get_GEMM_A16W16_config(5, 48, 64, False, dtype, dtype)
    assert cfg["matched"] == "default" and cfg["libtype"] != "cublaslt"


# ---- GPU ----------------------------------------------------------------------------------------------------------
def _gpu_backend():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    backend = cublaslt.BACKEND
    if not backend.is_available():
        pytest.skip(f"cublaslt unavailable: {backend.unavailable_reason()}")
    from aiter_gemm.device import probe_gpu

    return backend, probe_gpu()


def _rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _poisoned_run(runner, a, b, bias, otype, *scales):
    """Run with NaN left in the allocator block the output will most likely reuse: unwritten output shows."""
    junk = torch.full((a.shape[0], b.shape[0]), float("nan"), dtype=otype, device=a.device)
    del junk
    return runner(a, b, bias, otype, *scales)


GPU_SHAPES = [(1, 256, 512), (3, 1280, 8192), (17, 4096, 4096), (97, 4100, 1024), (4100, 512, 256), (64, 97, 136)]


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", GPU_SHAPES)
@pytest.mark.parametrize("dtype,otype,bias", [(BF16, BF16, False), (BF16, BF16, True), (F16, F32, False)])
def test_every_enumerated_solution_is_correct(M, N, K, dtype, otype, bias):
    backend, dev = _gpu_backend()
    problem = GemmProblem(M, N, K, bias, dtype, otype)
    sols = backend.candidates(problem, dev)
    assert sols, f"no cublaslt candidate for {problem}"
    a = torch.randn(M, K, dtype=dtype, device="cuda")
    b = torch.randn(N, K, dtype=dtype, device="cuda") / K ** 0.5
    bvec = torch.randn(N, dtype=otype, device="cuda") if bias else None
    ref = a.double() @ b.double().t() + (bvec.double() if bias else 0)
    bad = []
    for sol in sols:
        runner = backend.prepare(problem, sol, dev)
        assert runner is not None, sol
        out = _poisoned_run(runner, a, b, bvec, otype, None, None, None)
        assert out.shape == (M, N) and out.dtype == otype
        err = _rel_err(out, ref)
        if not err <= TOL[otype]:
            bad.append((sol.solidx, sol.splitK, err))
    assert not bad, f"{len(bad)}/{len(sols)} wrong: {bad[:5]}"


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (33, 6144, 4096), (512, 1280, 8192)])
def test_csv_replay_is_bit_identical(M, N, K, tmp_path):
    from aiter_gemm.fileio import read_csv_rows, render_csv

    backend, dev = _gpu_backend()
    problem = GemmProblem(M, N, K, True, BF16, BF16)
    sols = backend.candidates(problem, dev)
    a = torch.randn(M, K, dtype=BF16, device="cuda")
    b = torch.randn(N, K, dtype=BF16, device="cuda")
    bias = torch.randn(N, dtype=BF16, device="cuda")
    picks = [sols[0], sols[-1], max(sols, key=lambda s: s.splitK)]
    firsts = [backend.prepare(problem, s, dev)(a, b, bias, BF16, None, None, None) for s in picks]
    path = tmp_path / "tuned.csv"
    path.write_text(render_csv(("libtype", "solidx", "splitK", "kernelName"),
                               [{"libtype": s.libtype, "solidx": s.solidx, "splitK": s.splitK,
                                 "kernelName": s.kernelName} for s in picks]))
    _, rows = read_csv_rows(path)
    for row, first in zip(rows, firsts, strict=True):
        sol = Solution(row["libtype"], int(row["solidx"]), int(row["splitK"]), row["kernelName"])
        fresh = cublaslt.CublasLtBackend()  # a new process's view: nothing cached
        again = fresh.prepare(problem, sol, dev)(a, b, bias, BF16, None, None, None)
        assert torch.equal(first, again), sol


@pytest.mark.gpu
def test_dispatch_replays_cublaslt_row(tmp_path, clean_runtime):
    import aiter_gemm

    backend, dev = _gpu_backend()
    M, N, K = 48, 2048, 1024
    problem = GemmProblem(M, N, K, False, BF16, BF16)
    sol = backend.candidates(problem, dev)[-1]
    row = (f"{dev.gfx},{dev.cu_num},{M},{N},{K},False,torch.bfloat16,torch.bfloat16,False,False,cublaslt,"
           f"{sol.solidx},{sol.splitK},1.0,{sol.kernelName}\n")
    path = tmp_path / "tuned.csv"
    path.write_text(",".join(aiter_gemm.configs.BF16_TUNED_COLUMNS[:15]) + "\n" + row)
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(path))
    aiter_gemm.reload_configs()
    cfg = aiter_gemm.get_GEMM_A16W16_config(M, N, K, False, BF16, BF16)
    assert (cfg["libtype"], cfg["kernelName"], cfg["matched"]) == ("cublaslt", sol.kernelName, "exact")
    a = torch.randn(M, K, dtype=BF16, device="cuda")
    b = torch.randn(N, K, dtype=BF16, device="cuda")
    direct = backend.prepare(problem, sol, dev)(a, b, None, BF16, None, None, None)
    assert torch.equal(aiter_gemm.gemm_a16w16(a, b), direct)


@pytest.mark.gpu
def test_stale_and_foreign_rows_rejected_on_gpu(caplog):
    backend, dev = _gpu_backend()
    lib = backend.library()
    big = GemmProblem(256, 4096, 4096, False, BF16, BF16)
    sols = backend.candidates(big, dev)
    ver, raw = cublaslt.decode_algo(sols[0].kernelName)
    stale = Solution("cublaslt", sols[0].solidx, sols[0].splitK, cublaslt.encode_algo(ver + 1, raw))
    with caplog.at_level(logging.WARNING, logger=cublaslt.__name__):
        assert backend.prepare(big, stale, dev) is None
    assert f"cuBLASLt {ver + 1}" in caplog.text
    odd = GemmProblem(7, 97, 131, False, BF16, BF16)  # 262-byte rows: no TMA (16-byte) kernel can take them
    verdicts = [backend.prepare(odd, s, dev) for s in sols]
    assert any(v is None for v in verdicts), "expected some 4096x4096 algorithms to fail the check on K=131"
    a = torch.randn(7, 131, dtype=BF16, device="cuda")
    b = torch.randn(97, 131, dtype=BF16, device="cuda")
    ref = a.double() @ b.double().t()
    for runner in filter(None, verdicts):  # those that pass the check must be right
        assert _rel_err(runner(a, b, None, BF16, None, None, None), ref) <= TOL[BF16]
    assert lib.version == ver


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (17, 97, 64), (4096, 1280, 8192)])
@pytest.mark.parametrize("bpreshuffle", [False, True])
def test_heuristic_zero(M, N, K, bpreshuffle):
    backend, dev = _gpu_backend()
    problem = GemmProblem(M, N, K, False, BF16, BF16, bpreshuffle=bpreshuffle)
    sol = Solution("cublaslt", -1, 0, "")
    assert (backend.default_for(problem, dev) == sol) is bpreshuffle
    runner = backend.prepare(problem, sol, dev)
    a = torch.randn(M, K, dtype=BF16, device="cuda")
    b = torch.randn(N, K, dtype=BF16, device="cuda")
    assert _rel_err(_poisoned_run(runner, a, b, None, BF16), a.double() @ b.double().t()) <= TOL[BF16]
    assert torch.equal(runner(a, b, None, BF16, None, None, None),
                       backend.prepare(problem, backend.candidates(problem, dev)[0], dev)(a, b, None, BF16, None,
                                                                                           None, None))


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (32, 1280, 8192), (1024, 7168, 8192)])
@pytest.mark.parametrize("otype,bias", [(BF16, False), (BF16, True), (F32, False)])
def test_fp8_per_tensor_scales(M, N, K, otype, bias):
    backend, dev = _gpu_backend()
    if FP8 is None or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs sm_89+")
    problem = GemmProblem(M, N, K, bias, FP8, otype, True)
    sols = backend.candidates(problem, dev)
    assert sols
    a = (torch.randn(M, K, device="cuda") * 2).to(FP8)
    b = (torch.randn(N, K, device="cuda") * 2).to(FP8)
    sa = torch.tensor(0.5, device="cuda")
    sb = torch.tensor(0.03, device="cuda")
    bvec = torch.randn(N, dtype=otype, device="cuda") if bias else None
    ref = (a.double() @ b.double().t()) * 0.5 * 0.03 + (bvec.double() if bias else 0)
    for sol in sols[:: max(1, len(sols) // 6)]:
        out = _poisoned_run(backend.prepare(problem, sol, dev), a, b, bvec, otype, sa, sb, None)
        assert _rel_err(out, ref) <= FP8_TOL, sol


@pytest.mark.gpu
@pytest.mark.parametrize("bias", [False, True])
def test_cuda_graph_capture_and_replay(bias):
    backend, dev = _gpu_backend()
    M, N, K = 16, 4096, 4096
    problem = GemmProblem(M, N, K, bias, BF16, BF16)
    sols = backend.candidates(problem, dev)
    sol = max(sols, key=lambda s: s.splitK)  # a split-K one when there is one: it uses the workspace
    runner = backend.prepare(problem, sol, dev)
    a = torch.randn(M, K, dtype=BF16, device="cuda")
    b = torch.randn(N, K, dtype=BF16, device="cuda")
    bvec = torch.randn(N, dtype=BF16, device="cuda") if bias else None
    runner(a, b, bvec, BF16, None, None, None)  # warm up on the capture's side stream semantics
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = runner(a, b, bvec, BF16, None, None, None)
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, runner(a, b, bvec, BF16, None, None, None))


@pytest.mark.gpu
def test_strided_and_misaligned_inputs_on_gpu():
    """Strided rows read in place (row stride 600 >= K), a misaligned weight and bias copied, against the real
    library."""
    backend, dev = _gpu_backend()
    problem = GemmProblem(17, 256, 512, True, BF16, BF16)
    runner = backend.prepare(problem, backend.candidates(problem, dev)[0], dev)
    a = torch.randn(17, 600, dtype=BF16, device="cuda")[:, :512]
    b = torch.randn(256 * 512 + 1, dtype=BF16, device="cuda")[1:].view(256, 512)
    bias = torch.randn(257, dtype=BF16, device="cuda")[1:]
    ref = a.double() @ b.double().t() + bias.double()
    assert _rel_err(runner(a, b, bias, BF16, None, None, None), ref) <= TOL[BF16]
