"""Typed layer over nvmath-python's raw cuBLASLt bindings (``nvmath.bindings.cublasLt``) for the ``cublaslt`` backend.

Everything that touches the library lives here: the library version and one handle per process, the matmul plan
(operation descriptor plus matrix layouts of one GEMM), heuristic queries, algorithm configuration get/set,
``cublasLtMatmulAlgoCheck`` and runners' per-stream workspaces. An algorithm is carried around as the 64 raw bytes of
its ``cublasLtMatmulAlgo_t`` (immutable, hashable; cuBLASLt documents the struct as trivially serializable for one
library version).

Row-major torch tensors seen as column-major cuBLAS matrices: ``out(M, N) = a(M, K) @ b(N, K).T`` is
``out.T(N, M) = op(b) @ a.T`` with ``A := b`` stored (K, N) ld=K and op(A)=T, ``B := a`` stored (K, M) ld=K and
op(B)=N, ``D := out`` stored (N, M) ld=N. That is the "TN" form cuBLASLt's fp8 kernels require, and the one torch's
``scaled_gemm`` uses for a row-major output (operands and their scales swapped), block-scaled ones included.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.dtypes import HALF_DTYPES, OUT_DTYPES

ALGO_BYTES = 64  # sizeof(cublasLtMatmulAlgo_t): uint64_t data[8]
ALIGN_FALLBACK = 16  # bytes: pointer alignment assumed when the library reports none (what TMA kernels need)

# cudaDataType_t / cublasComputeType_t / cublasOperation_t values (library ABI constants, also in nvmath's enums).
_CUDA_DTYPE: dict[torch.dtype, int] = {torch.float32: 0, torch.float16: 2, torch.bfloat16: 14}
for _name, _code in (("float8_e4m3fn", 28), ("float8_e5m2", 29)):
    if hasattr(torch, _name):
        _CUDA_DTYPE[getattr(torch, _name)] = _code
_FP8_CUDA = frozenset(_CUDA_DTYPE[d] for d in _CUDA_DTYPE if d.itemsize == 1)
COMPUTE_32F = 68
CUDA_R_32F = 0
OP_N, OP_T = 0, 1
#: cublasLtMatmulMatrixScale_t values (cublasLt.h 12.9+, nvmath's ``MatmulMatrixScale``): one float32 per 128
#: elements along K (DeepSeek's 1x128 activation scales), one per 128 x 128 block (weight scales).
SCALE_VEC128_32F, SCALE_BLK128x128_32F = 4, 5
#: The first cuBLASLt with those scale modes (torch's ``_check_deepseek_support`` asks the same).
BLOCK_SCALING_VERSION = 120900
#: The scale pointers a block-scaled plan holds until a call sets its operands' own: cuBLASLt's heuristic refuses a
#: non-scalar scale mode whose pointer is NULL (CUBLAS_STATUS_INVALID_VALUE, "requires a custom pointer";
#: nvmath-python's planner sets its scale pointers first for that reason, torch its operands' scales). The heuristic
#: reads no device memory: any non-NULL address aligned like an allocation serves.
SCALE_PLACEHOLDER = 1 << 12

#: Config attributes that together identify an algorithm (cublasLtMatmulAlgoConfigAttributes_t), in key order.
CONFIG_FIELDS = (
    "ID", "TILE_ID", "SPLITK_NUM", "REDUCTION_SCHEME", "CTA_SWIZZLING", "CUSTOM_OPTION", "STAGES_ID",
    "INNER_SHAPE_ID", "CLUSTER_SHAPE_ID",
)


class LibraryUnavailable(RuntimeError):
    """cuBLASLt cannot be used in this process; the message says why."""


class AlgoRejected(RuntimeError):
    """``cublasLtMatmulAlgoCheck`` (or a config setter) refused an algorithm for a plan."""


def supported_reason(problem: GemmProblem) -> str | None:
    """Why this backend cannot run ``problem`` at all, or None if the dtype combination is one it supports.

    bf16/fp16 in with the same type or fp32 out; fp8 e4m3 in (cuBLASLt has no e5m2 x e5m2 kernels) with
    bf16/fp16/fp32 out. Per-tensor scales only for fp8 (cuBLASLt's A/B scale pointers apply to fp8 operands only).
    """
    if min(problem.M, problem.N, problem.K) < 1:
        return f"empty GEMM M={problem.M} N={problem.N} K={problem.K}"
    din, dout = problem.dtype, problem.otype
    if din in HALF_DTYPES:
        if dout not in (din, torch.float32):
            return f"{din} input supports {din} or torch.float32 output, not {dout}"
        if problem.scaleAB:
            return "per-tensor scales are only supported for fp8 inputs"
        return None
    if din is getattr(torch, "float8_e4m3fn", None):
        if dout not in OUT_DTYPES:
            return f"fp8 input supports bf16/fp16/fp32 output, not {dout}"
        return None
    return f"input dtype {din} is not supported (bf16, fp16, float8_e4m3fn are)"


def load_library() -> "LtLibrary":
    """The process-wide cuBLASLt access object; raises :class:`LibraryUnavailable` with the reason."""
    if torch.version.cuda is None or torch.version.hip is not None:
        raise LibraryUnavailable("this torch build is not a CUDA build (cuBLASLt is NVIDIA-only)")
    if not torch.cuda.is_available():
        raise LibraryUnavailable("no CUDA device is visible to torch")
    try:
        from nvmath.bindings import cublasLt as lt  # noqa: PLC0415 - optional dependency, imported on first use
    except ImportError as exc:
        raise LibraryUnavailable(
            f"nvmath-python is not importable ({exc}); install it with: pip install 'aiter_gemm[cuda]'"
        ) from exc
    try:
        return LtLibrary(lt)
    except Exception as exc:  # driver missing, library not found: nvmath raises several types
        raise LibraryUnavailable(f"cuBLASLt could not be loaded through nvmath-python: {exc!r}") from exc


class LibraryOnce:
    """The cuBLASLt library loaded at most once per process (``loader``: tests pass a fake), or why not: the
    loader's :class:`LibraryUnavailable`, or ``check``'s refusal of the loaded library (what a caller needs of it)."""

    def __init__(self, loader: Callable[[], LtLibrary] = load_library,
                 check: Callable[[LtLibrary], str | None] = lambda lib: None) -> None:
        self._loader = loader
        self._check = check
        self._lib: LtLibrary | None = None
        self._reason: str | None = None
        self._lock = threading.Lock()

    def get(self) -> LtLibrary | None:
        """The loaded library, or None (:meth:`reason` says why)."""
        if self._lib is None and self._reason is None:
            with self._lock:
                if self._lib is None and self._reason is None:
                    try:
                        lib = self._loader()
                        self._reason = self._check(lib)
                        self._lib = lib if self._reason is None else None
                    except LibraryUnavailable as exc:
                        self._reason = str(exc)
        return self._lib

    def reason(self, load: bool = True) -> str | None:
        """Why :meth:`get` gives None; None where it gives the library (or, ``load=False``, was not asked yet)."""
        if load:
            self.get()
        return self._reason


@dataclass(frozen=True)
class AlgoInfo:
    """One algorithm as a heuristic query or a check reports it."""

    raw: bytes  # the 64-byte cublasLtMatmulAlgo_t
    workspace: int  # bytes it needs
    waves: float  # heuristic's waves count (0 when unknown)


class MatmulPlan:
    """Operation descriptor and layouts of one GEMM (see module docstring for the transposed mapping).

    Owned cuBLASLt objects are destroyed when the plan is garbage collected. Per-call pointer attributes
    (bias, A/B scales) are set through :meth:`set_pointer`, which is why a plan belongs to one runner.
    ``block_scaled``: fp8 operands with DeepSeek-style block scales, as torch's ``scaled_gemm`` sets them for
    ``BlockWise1x128`` activations and ``BlockWise128x128`` weights: cuBLAS A (the weight) in 128 x 128 blocks, B (the
    activation) in 1 x 128 vectors; the scale pointers then address those scale matrices (:data:`SCALE_PLACEHOLDER`
    until the first call, so the plan can be queried).
    """

    def __init__(self, lib: "LtLibrary", problem: GemmProblem, block_scaled: bool = False) -> None:
        lt = lib.lt
        self.problem = problem
        self.lib = lib
        tin, tout = _CUDA_DTYPE[problem.dtype], _CUDA_DTYPE[problem.otype]
        M, N, K = problem.M, problem.N, problem.K
        self.desc = lt.matmul_desc_create(COMPUTE_32F, CUDA_R_32F)
        self.a_layout = lt.matrix_layout_create(tin, K, N, K)  # weight b(N, K) row-major
        self.b_layout = lt.matrix_layout_create(tin, K, M, K)  # activation a(M, K) row-major
        self.d_layout = lt.matrix_layout_create(tout, N, M, N)  # out(M, N) row-major
        # Activation layouts for row strides other than K (a column slice of a wider tensor), made on demand; the
        # finalizer holds this list (not the plan), so layouts added later are destroyed too.
        self._strided: dict[int, int] = {}
        self._owned = [self.a_layout, self.b_layout, self.d_layout]
        self._finalizer = weakref.finalize(self, _destroy_plan, lt, self.desc, self._owned)
        A = lt.MatmulDescAttribute
        self._set_desc(A.TRANSA, OP_T)
        self._set_desc(A.TRANSB, OP_N)
        if problem.bias:
            self._set_desc(A.EPILOGUE, int(lt.Epilogue.BIAS))
        # One int64 host cell per pointer attribute, written per call: no allocation on the hot path.
        self._ptr_cells = {name: np.zeros(1, dtype=np.int64) for name in ("BIAS_POINTER", "A_SCALE_POINTER",
                                                                           "B_SCALE_POINTER")}
        self._ptr_attr = {name: int(getattr(A, name)) for name in self._ptr_cells}
        self._ptr_addr = {name: cell.ctypes.data for name, cell in self._ptr_cells.items()}
        if block_scaled:
            self._set_desc(A.A_SCALE_MODE, SCALE_BLK128x128_32F)
            self._set_desc(A.B_SCALE_MODE, SCALE_VEC128_32F)
            self.set_pointer("A_SCALE_POINTER", SCALE_PLACEHOLDER)
            self.set_pointer("B_SCALE_POINTER", SCALE_PLACEHOLDER)
        self.block_scaled = block_scaled
        self.is_fp8 = tin in _FP8_CUDA

    def _set_desc(self, attr: Any, value: int) -> None:
        """Set a descriptor attribute; :class:`AlgoRejected` naming it if this library refuses the value."""
        lt = self.lib.lt
        buf = np.array([value], dtype=lt.get_matmul_desc_attribute_dtype(attr))
        try:
            lt.matmul_desc_set_attribute(self.desc, int(attr), buf.ctypes.data, buf.itemsize)
        except lt.cuBLASLtError as exc:
            raise AlgoRejected(f"cuBLASLt refused matmul descriptor attribute {getattr(attr, 'name', attr)}={value}: "
                               f"{exc}") from None

    def set_pointer(self, name: str, ptr: int) -> None:
        """Set device-pointer attribute ``name`` (BIAS_POINTER, A_SCALE_POINTER, B_SCALE_POINTER); 0 = none."""
        self._ptr_cells[name][0] = ptr
        self.lib.lt.matmul_desc_set_attribute(self.desc, self._ptr_attr[name], self._ptr_addr[name], 8)

    def layouts(self, b_layout: int | None = None) -> tuple[int, int, int, int, int]:
        """(desc, A, B, C, D) handles in the order the cuBLASLt calls take them (C and D share a layout);
        ``b_layout`` replaces the activation's (see :meth:`activation_layout`)."""
        return self.desc, self.a_layout, b_layout or self.b_layout, self.d_layout, self.d_layout

    def activation_layout(self, lda: int) -> int:
        """The activation's layout with row stride ``lda`` (>= K) instead of K: cuBLASLt reads the (M, K) rows of a
        wider row-major tensor in place, as cuBLAS does for F.linear. Created once per stride; callers serialize."""
        layout = self._strided.get(lda)
        if layout is None:
            p = self.problem
            layout = self._strided[lda] = self.lib.lt.matrix_layout_create(_CUDA_DTYPE[p.dtype], p.K, p.M, lda)
            self._owned.append(layout)
        return layout


def _destroy_plan(lt: Any, desc: int, layouts: tuple[int, ...]) -> None:
    for layout in layouts:
        lt.matrix_layout_destroy(layout)
    lt.matmul_desc_destroy(desc)


class LtLibrary:
    """cuBLASLt as loaded by nvmath: its version, one handle, and the queries the backend needs."""

    def __init__(self, lt: Any) -> None:
        self.lt = lt
        self.version = int(lt.get_version())
        self._handle: int | None = None
        self._lock = threading.Lock()
        self._cfg_dtype = {f: lt.get_matmul_algo_config_attribute_dtype(getattr(lt.MatmulAlgoConfigAttribute, f))
                           for f in CONFIG_FIELDS}

    @property
    def handle(self) -> int:
        """One cuBLASLt handle for the process: it holds no device memory and cuBLASLt calls are thread safe."""
        if self._handle is None:
            with self._lock:
                if self._handle is None:
                    self._handle = int(self.lt.create())
        return self._handle

    def plan(self, problem: GemmProblem, block_scaled: bool = False) -> MatmulPlan:
        return MatmulPlan(self, problem, block_scaled)

    def block_scaling_reason(self) -> str | None:
        """Why this library (or nvmath's bindings of it) cannot run block-scaled fp8 plans; None if it can."""
        if self.version < BLOCK_SCALING_VERSION:
            return (f"cuBLASLt {self.version} has no block scaling (1x128 / 128x128 scale modes: "
                    f"{BLOCK_SCALING_VERSION} or newer)")
        if not hasattr(self.lt.MatmulDescAttribute, "A_SCALE_MODE"):
            return "this nvmath-python's cuBLASLt bindings have no A_SCALE_MODE / B_SCALE_MODE attributes"
        return None

    # ---- heuristic and check -------------------------------------------------------------------------------
    def heuristic(self, plan: MatmulPlan, *, workspace: int, reduction_mask: int | None = None,
                  count: int = 32) -> list[AlgoInfo]:
        """``cublasLtMatmulAlgoGetHeuristic`` under one preference: up to ``count`` algorithms, best first; [] when
        there is none or the library refuses the query (:meth:`best` says which)."""
        return self._query(plan, workspace, reduction_mask, count)[0]

    def best(self, plan: MatmulPlan, *, workspace: int) -> AlgoInfo:
        """The heuristic's first algorithm under ``workspace`` bytes; :class:`AlgoRejected` saying why there is none,
        with the library's status when it refused the query (an invalid descriptor reads differently from a shape
        without a kernel)."""
        found, error = self._query(plan, workspace, None, 1)
        if error is not None:
            raise AlgoRejected(f"cublasLtMatmulAlgoGetHeuristic failed: {error}")
        if not found:
            raise AlgoRejected(f"cublasLtMatmulAlgoGetHeuristic returned no algorithm within a {workspace}-byte "
                               "workspace")
        return found[0]

    def _query(self, plan: MatmulPlan, workspace: int, reduction_mask: int | None,
               count: int) -> tuple[list[AlgoInfo], Exception | None]:
        """The heuristic's algorithms, and the library's error if it refused the query (then no algorithms)."""
        lt = self.lt
        pref = lt.matmul_preference_create()
        try:
            P = lt.MatmulPreferenceAttribute
            self._set_pref(pref, P.MAX_WORKSPACE_BYTES, workspace)
            if reduction_mask is not None:
                self._set_pref(pref, P.REDUCTION_SCHEME_MASK, reduction_mask)
            results = np.zeros(count, dtype=lt.matmul_heuristic_result_dtype)
            returned = np.zeros(1, dtype=np.int32)
            try:
                lt.matmul_algo_get_heuristic(self.handle, *plan.layouts(), pref, count, results.ctypes.data,
                                             returned.ctypes.data)
            except lt.cuBLASLtError as exc:  # NOT_SUPPORTED: no algorithm here; others: a refused descriptor
                return [], exc
        finally:
            lt.matmul_preference_destroy(pref)
        out = []
        for r in results[: int(returned[0])]:
            if int(r["state"]) == 0:
                out.append(AlgoInfo(r["algo"].tobytes(), int(r["workspace_size"]), float(r["waves_count"])))
        return out, None

    def _set_pref(self, pref: int, attr: Any, value: int) -> None:
        lt = self.lt
        buf = np.array([value], dtype=lt.get_matmul_preference_attribute_dtype(attr))
        lt.matmul_preference_set_attribute(pref, int(attr), buf.ctypes.data, buf.itemsize)

    def check(self, plan: MatmulPlan, raw: bytes, b_layout: int | None = None) -> AlgoInfo:
        """``cublasLtMatmulAlgoCheck``: the algorithm's workspace need on ``plan`` (with activation layout
        ``b_layout`` if given); :class:`AlgoRejected` if invalid."""
        lt = self.lt
        algo = _algo_array(raw)
        result = np.zeros(1, dtype=lt.matmul_heuristic_result_dtype)
        try:
            lt.matmul_algo_check(self.handle, *plan.layouts(b_layout), algo.ctypes.data, result.ctypes.data)
        except lt.cuBLASLtError as exc:
            raise AlgoRejected(str(exc)) from None
        if int(result[0]["state"]) != 0:
            raise AlgoRejected(f"check state {int(result[0]['state'])}")
        return AlgoInfo(algo.tobytes(), int(result[0]["workspace_size"]), float(result[0]["waves_count"]))

    # ---- algorithm attributes ------------------------------------------------------------------------------
    def config(self, raw: bytes) -> dict[str, int]:
        """The algorithm's configuration attributes (CONFIG_FIELDS) as plain ints."""
        lt = self.lt
        algo = _algo_array(raw)
        out = {}
        for field in CONFIG_FIELDS:
            buf = np.zeros(1, dtype=self._cfg_dtype[field])
            lt.matmul_algo_config_get_attribute(algo.ctypes.data, int(getattr(lt.MatmulAlgoConfigAttribute, field)),
                                                buf.ctypes.data, buf.itemsize, 0)
            out[field] = int(buf[0])
        return out

    def with_config(self, raw: bytes, **changes: int) -> bytes:
        """A copy of the algorithm with some configuration attributes changed (no validity check: see check)."""
        lt = self.lt
        algo = _algo_array(raw)
        for field, value in changes.items():
            buf = np.array([value], dtype=self._cfg_dtype[field])
            try:
                lt.matmul_algo_config_set_attribute(algo.ctypes.data,
                                                    int(getattr(lt.MatmulAlgoConfigAttribute, field)),
                                                    buf.ctypes.data, buf.itemsize)
            except lt.cuBLASLtError as exc:
                raise AlgoRejected(f"cannot set {field}={value}: {exc}") from None
        return algo.tobytes()

    def cap(self, raw: bytes, name: str) -> int:
        """One capability attribute (``cublasLtMatmulAlgoCapAttributes_t`` member ``name``) of the algorithm."""
        lt = self.lt
        attr = getattr(lt.MatmulAlgoCapAttribute, name)
        algo = _algo_array(raw)
        buf = np.zeros(1, dtype=lt.get_matmul_algo_cap_attribute_dtype(attr))
        lt.matmul_algo_cap_get_attribute(algo.ctypes.data, int(attr), buf.ctypes.data, buf.itemsize, 0)
        return int(buf[0])

    def cap_ids(self, raw: bytes, name: str) -> list[int]:
        """An array capability of the algorithm (``TILE_IDS``, ``STAGES_IDS``): its size queried first, then read."""
        lt = self.lt
        attr = int(getattr(lt.MatmulAlgoCapAttribute, name))
        algo = _algo_array(raw)
        written = np.zeros(1, dtype=np.uint64)
        lt.matmul_algo_cap_get_attribute(algo.ctypes.data, attr, 0, 0, written.ctypes.data)
        n = int(written[0]) // 4
        if n == 0:
            return []
        buf = np.zeros(n, dtype=np.uint32)
        lt.matmul_algo_cap_get_attribute(algo.ctypes.data, attr, buf.ctypes.data, buf.nbytes, written.ctypes.data)
        return [int(v) for v in buf]

    def algo_ids(self, problem: GemmProblem, count: int = 256) -> list[int]:
        """``cublasLtMatmulAlgoGetIds``: every algorithm id for the problem's types, not only the heuristic's."""
        tin, tout = _CUDA_DTYPE[problem.dtype], _CUDA_DTYPE[problem.otype]
        got = self.lt.matmul_algo_get_ids(self.handle, COMPUTE_32F, CUDA_R_32F, tin, tin, tout, tout, count)
        flat = list(got[0]) if got and not isinstance(got[0], (int, np.integer)) else list(got)
        return [int(v) for v in flat]

    def init_algo(self, problem: GemmProblem, algo_id: int) -> bytes:
        """``cublasLtMatmulAlgoInit``: algorithm ``algo_id`` for the problem's types, its config at defaults."""
        tin, tout = _CUDA_DTYPE[problem.dtype], _CUDA_DTYPE[problem.otype]
        algo = np.zeros(ALGO_BYTES, dtype=np.uint8)
        try:
            self.lt.matmul_algo_init(self.handle, COMPUTE_32F, CUDA_R_32F, tin, tin, tout, tout, algo_id,
                                     algo.ctypes.data)
        except self.lt.cuBLASLtError as exc:
            raise AlgoRejected(f"algorithm id {algo_id}: {exc}") from None
        return algo.tobytes()

    def tile_dims(self, tile_id: int) -> tuple[int, int] | None:
        """(rows, cols) of a ``cublasLtMatmulTile_t`` id from its enum name (``TILE_128x64``), None if unknown."""
        try:
            name = self.lt.MatmulTile(tile_id).name
        except ValueError:
            return None
        dims = name.removeprefix("TILE_").split("x")
        return (int(dims[0]), int(dims[1])) if len(dims) == 2 and all(d.isdigit() for d in dims) else None

    def cluster_id(self, shape: str) -> int | None:
        """The ``cublasLtClusterShape_t`` id of ``"2x1x1"``-style ``shape``, None if this library lacks it."""
        member = getattr(self.lt.ClusterShape, f"SHAPE_{shape}", None)
        return None if member is None else int(member)


def raw_stream_fn() -> Callable[[int], int]:
    """device index -> the raw handle of torch's current stream there (what Triton/inductor call: no Stream object)."""
    fast = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if fast is not None:
        return fast
    return lambda index: torch.cuda.current_stream(index).cuda_stream


class StreamWorkspaces:
    """A runner's scratch: one buffer of ``nbytes`` per CUDA stream (two streams must not share scratch), made on the
    stream's first call (a capture stream's included) and kept for the runner's life, so a captured graph replays
    with a live address."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self._by_stream: dict[int, torch.Tensor] = {}

    def ptr(self, stream: int, device: torch.device) -> int:
        """The buffer's address for ``stream`` (0 when the algorithm needs none)."""
        if not self.nbytes:
            return 0
        ws = self._by_stream.get(stream)
        if ws is None:
            ws = self._by_stream[stream] = torch.empty(self.nbytes, dtype=torch.uint8, device=device)
        return ws.data_ptr()


def align_mask(lib: LtLibrary, raw: bytes, cap: str) -> int:
    """Pointer bits that must be zero for the algorithm (its MIN_ALIGNMENT cap; 16 bytes if it reports none)."""
    try:
        align = lib.cap(raw, cap)
    except Exception:  # an older library without the cap: TMA kernels need 16 bytes
        align = ALIGN_FALLBACK
    return max(align, 1) - 1


def host_f32(value: float) -> np.ndarray:
    """A float32 host cell whose address cuBLASLt reads alpha / beta from."""
    return np.array([value], dtype=np.float32)


def _algo_array(raw: bytes) -> np.ndarray:
    if len(raw) != ALGO_BYTES:
        raise ValueError(f"a cublasLtMatmulAlgo_t is {ALGO_BYTES} bytes, got {len(raw)}")
    return np.frombuffer(raw, dtype=np.uint8).copy()


def algo_buffer(raw: bytes) -> np.ndarray:
    """A private, writable host copy of the algorithm struct whose address cuBLASLt calls can take."""
    return _algo_array(raw)
