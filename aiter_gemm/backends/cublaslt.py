"""Backend ``cublaslt``: cuBLASLt algorithms on NVIDIA GPUs, enumerated, serialized into tuned rows, and replayed.

This is the role hipBLASLt solution indices play in AITER. The tuner asks :func:`find_solutions` for a shape's
candidates: the de-duplicated union of ``cublasLtMatmulAlgoGetHeuristic`` lists under several preferences
(workspace 0 / 4 MiB / 32 MiB crossed with reduction-scheme masks), plus targeted variations of those algorithms
(CTA swizzle flipped, split-K where the tiling fills less than a wave, cluster shape on sm_90+) that pass
``cublasLtMatmulAlgoCheck``. An exhaustive sweep of algo ids x tiles x stages was measured slower than the
heuristic lists on Hopper (it misses Hopper-specific attributes), so it is not attempted.

Row encoding (a tuned CSV row with ``libtype == "cublaslt"``):
  - ``kernelName`` = ``v<cublasLt version>:<128 lowercase hex digits>``, the 64-byte ``cublasLtMatmulAlgo_t``
    (documented as trivially serializable for one library version), e.g. ``v130100:1a00...``;
  - ``solidx`` = the algorithm id (``CUBLASLT_ALGO_CONFIG_ID``) and ``splitK`` = its split-K count (0 when not
    split), both checked against the struct on load;
  - ``solidx == -1`` with an empty ``kernelName``: cuBLASLt's heuristic #0 for the shape, chosen at prepare time
    (AITER's ``solidx -1``). It is the default for ``bpreshuffle`` problems (see :meth:`default_for`).
A row whose version is not the loaded library's, that does not parse, or whose algorithm fails
``cublasLtMatmulAlgoCheck`` for the shape makes :meth:`~CublasLtBackend.prepare` return None (the dispatcher treats
it as a miss and names the file and row) after one warning naming the solution and the reason.

Call path: descriptors, layouts, the algorithm struct and a workspace are prepared once per (shape, solution);
a call allocates the output only and makes one ``cublasLtMatmul`` on torch's current stream (no sync; safe in
CUDA-graph capture: the runner keeps its workspaces referenced). Bias goes through the BIAS epilogue, fp8 per-tensor
``scale_a``/``scale_b`` through the A/B scale pointers; ``scale_c`` (non-fp8 output) is applied in place after.
There is no weight pre-shuffle on NVIDIA: a ``bpreshuffle`` problem's weight is the plain (N, K) matrix.

ROCm: a ``hipblaslt`` sibling module keeps this public contract and must
  1. expose ``BACKEND`` with ``name = "hipblaslt"``, ``is_blaslt = True``, and ``find_solutions(problem, device)``
     returning ``Solution("hipblaslt", solution_index, splitK, kernel_name)`` from
     ``hipblaslt_ext::getAllAlgos`` / ``hipblasLtMatmulAlgoGetHeuristic`` (hipBLASLt solutions ARE indexable, so
     ``solidx`` alone replays them, as in AITER's CSVs; ``kernelName`` is the kernel name, compared on load);
  2. on prepare, recover the algorithm with ``hipblaslt_ext::getAlgosFromIndex``, run
     ``hipblasLtMatmulAlgoCheck`` (``isAlgoSupported``), and return None with one warning when the index is gone
     or the kernel name changed (hipBLASLt version drift is the stale-index problem AITER users hit);
  3. handle ``bpreshuffle`` (weights in hipBLASLt's pre-shuffled layout, ``HIPBLASLT_ORDER_COL16_4R8``-style) and
     treat ``solidx -1`` as hipBLASLt's heuristic #0, like this module; use the same row-major mapping and the
     same per-call rules (one library call on the current stream, workspace preallocated, no sync).
No ROCm code is shipped here: none of it could be tested on this project's hardware.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch

from aiter_gemm.backends._cublaslt_lib import (
    ALGO_BYTES,
    ALIGN_FALLBACK,
    AlgoInfo,
    AlgoRejected,
    LibraryOnce,
    LtLibrary,
    MatmulPlan,
    StreamWorkspaces,
    algo_buffer,
    align_mask,
    host_f32,
    load_library,
    raw_stream_fn,
    supported_reason,
)
from aiter_gemm.backends.base import Backend, GemmProblem, Runner, Solution
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.logs import WarnOnce

log = logging.getLogger(__name__)

NAME = "cublaslt"
MiB = 1 << 20
#: Workspace limits the enumeration queries under: 0 (no scratch: only in-place or no split-K), 4 MiB, 32 MiB.
#: 32 MiB is also the limit of heuristic #0 (solidx -1); a runner allocates only what its algorithm reports needing.
WORKSPACE_VARIANTS = (32 * MiB, 4 * MiB, 0)
DEFAULT_WORKSPACE = 32 * MiB
#: Reduction-scheme masks (cublasLtReductionScheme_t bits: 1 in place, 2 compute type, 4 output type); None keeps
#: the library default (all schemes), 0 asks for algorithms without a split-K reduction.
REDUCTION_MASKS: tuple[int | None, ...] = (None, 0, 1, 2, 4)
HEURISTIC_COUNT = 32  # per query; cuBLASLt 13.1 on H100 returned 8 per query, 8-37 distinct over the 15 queries
SPLITK_VARIANTS = (2, 4, 8)  # tried on algorithms whose tiling gives fewer tiles than SMs
CLUSTER_VARIANTS = ("1x1x1", "2x1x1", "1x2x1")  # sm_90+: thread-block cluster shapes worth a look for GEMMs

_KERNEL_NAME = re.compile(rf"v(\d{{1,12}}):([0-9a-f]{{{2 * ALGO_BYTES}}})")


# ---- row encoding (pure: no library needed) -------------------------------------------------------------------
def encode_algo(version: int, raw: bytes) -> str:
    """``kernelName`` of an algorithm: ``v<version>:<hex of the 64-byte struct>``."""
    if len(raw) != ALGO_BYTES:
        raise ValueError(f"cublasLtMatmulAlgo_t is {ALGO_BYTES} bytes, got {len(raw)}")
    return f"v{int(version)}:{raw.hex()}"


def decode_algo(kernel_name: str) -> tuple[int, bytes]:
    """(version, struct bytes) of a ``kernelName`` written by :func:`encode_algo`; ValueError if malformed."""
    m = _KERNEL_NAME.fullmatch(kernel_name.strip())
    if m is None:
        raise ValueError(
            f"cublaslt kernelName {kernel_name[:40]!r}{'...' if len(kernel_name) > 40 else ''} is not "
            f"'v<version>:<{2 * ALGO_BYTES} lowercase hex digits>'"
        )
    return int(m.group(1)), bytes.fromhex(m.group(2))


def solution_for(lib: LtLibrary, raw: bytes) -> Solution:
    """The tuned-row solution replaying ``raw``: solidx = algo id, splitK = split count (0 when unsplit)."""
    cfg = lib.config(raw)
    split = cfg["SPLITK_NUM"]
    return Solution(NAME, cfg["ID"], split if split > 1 else 0, encode_algo(lib.version, raw))


# ---- enumeration ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EnumeratedAlgo:
    """One enumerated solution and where it came from (``heuristic[ws=..,mask=..]#i`` or ``<base>+<change>``)."""

    solution: Solution
    origin: str
    workspace: int


def _config_key(cfg: dict[str, int]) -> tuple[int, ...]:
    return tuple(cfg.values())


def _variations(lib: LtLibrary, raw: bytes, cfg: dict[str, int], problem: GemmProblem,
                device: DeviceIdentity) -> list[tuple[str, dict[str, int]]]:
    """Targeted config changes to try on one heuristic algorithm (validity is decided by the check)."""
    out: list[tuple[str, dict[str, int]]] = []
    if lib.cap(raw, "CTA_SWIZZLING_SUPPORT"):
        out.append((f"swizzle={1 - min(cfg['CTA_SWIZZLING'], 1)}", {"CTA_SWIZZLING": 1 - min(cfg["CTA_SWIZZLING"], 1)}))
    dims = lib.tile_dims(cfg["TILE_ID"])
    if lib.cap(raw, "SPLITK_SUPPORT") and cfg["SPLITK_NUM"] <= 1 and dims is not None:
        # cuBLAS sees out.T (N rows, M cols): split K only where the output tiles leave SMs idle.
        tiles = -(-problem.N // dims[0]) * -(-problem.M // dims[1])
        schemes = lib.cap(raw, "REDUCTION_SCHEME_MASK")
        scheme = next((s for s in (2, 1, 4) if schemes & s), 0)  # compute-type reduction first: fp32 partials
        for s in SPLITK_VARIANTS:
            if scheme and tiles < device.cu_num and tiles * s <= 2 * device.cu_num and problem.K >= 256 * s:
                out.append((f"splitK={s}", {"SPLITK_NUM": s, "REDUCTION_SCHEME": scheme}))
    if _sm_major(device) >= 9:
        for shape in CLUSTER_VARIANTS:
            cid = lib.cluster_id(shape)
            if cid is not None and cid != cfg["CLUSTER_SHAPE_ID"]:
                out.append((f"cluster={shape}", {"CLUSTER_SHAPE_ID": cid}))
    return out


def _sm_major(device: DeviceIdentity) -> int:
    m = re.fullmatch(r"sm_(\d+?)(\d)a?", device.gfx)
    return int(m.group(1)) if m else 0


def enumerate_candidates(lib: LtLibrary, problem: GemmProblem, device: DeviceIdentity) -> list[EnumeratedAlgo]:
    """Heuristic lists under every preference variant, then checked variations; unique by algorithm config."""
    plan = lib.plan(problem)
    seen: set[tuple[int, ...]] = set()
    heur: list[tuple[AlgoInfo, dict[str, int], str]] = []
    for ws in WORKSPACE_VARIANTS:
        for mask in REDUCTION_MASKS:
            for i, info in enumerate(lib.heuristic(plan, workspace=ws, reduction_mask=mask, count=HEURISTIC_COUNT)):
                cfg = lib.config(info.raw)
                if _config_key(cfg) not in seen:
                    seen.add(_config_key(cfg))
                    heur.append((info, cfg, f"heuristic[ws={ws // MiB}MiB,mask={mask}]#{i}"))
    out = [EnumeratedAlgo(solution_for(lib, info.raw), origin, info.workspace) for info, _, origin in heur]
    for info, cfg, origin in heur:
        for label, change in _variations(lib, info.raw, cfg, problem, device):
            try:
                checked = lib.check(plan, lib.with_config(info.raw, **change))
            except AlgoRejected:
                continue
            new_cfg = lib.config(checked.raw)
            if checked.workspace > DEFAULT_WORKSPACE or _config_key(new_cfg) in seen:
                continue
            seen.add(_config_key(new_cfg))
            out.append(EnumeratedAlgo(solution_for(lib, checked.raw), f"{origin}+{label}", checked.workspace))
    return out


def enumerate_space(lib: LtLibrary, problem: GemmProblem, device: DeviceIdentity,
                    max_tile_cols: int | None = None, max_checks: int = 40000) -> list[EnumeratedAlgo]:
    """The tile x stage-count neighbourhood (x split-K 2..16 where the output tiles leave SMs idle) of every
    heuristic candidate (:func:`enumerate_candidates`, whose inner shape, cluster and swizzle it keeps) and of every
    algorithm id at its default config (``cublasLtMatmulAlgoInit``), each checked on the plan; unique by config.
    ``max_tile_cols``: skip tiles wider than this along M (cuBLAS sees out.T: tile columns run over M), default
    2 * max(M, 8); at most ``max_checks`` checks."""
    plan = lib.plan(problem)
    cols_cap = max_tile_cols or 2 * max(problem.M, 8)
    bases = [(decode_algo(c.solution.kernelName)[1], c.origin) for c in enumerate_candidates(lib, problem, device)]
    for algo_id in lib.algo_ids(problem):
        try:
            bases.append((lib.init_algo(problem, algo_id), f"init{algo_id}"))
        except AlgoRejected:
            continue
    seen: set[tuple[int, ...]] = set()
    out: list[EnumeratedAlgo] = []
    checks = 0
    for base, origin in bases:
        split_ok = lib.cap(base, "SPLITK_SUPPORT")
        schemes = lib.cap(base, "REDUCTION_SCHEME_MASK")
        scheme = next((s for s in (2, 1, 4) if schemes & s), 0)
        stages = lib.cap_ids(base, "STAGES_IDS") or [lib.config(base)["STAGES_ID"]]
        for tile in lib.cap_ids(base, "TILE_IDS") or [lib.config(base)["TILE_ID"]]:
            dims = lib.tile_dims(tile)
            if dims is not None and dims[1] > cols_cap:
                continue
            tiles = -(-problem.N // dims[0]) * -(-problem.M // dims[1]) if dims else device.cu_num
            splits = [1] + [s for s in (2, 4, 8, 16) if split_ok and scheme and tiles < device.cu_num
                            and tiles * s <= 2 * device.cu_num and problem.K >= 256 * s]
            for stage in stages:
                for split in splits:
                    checks += 1
                    if checks > max_checks:
                        log.warning("cublaslt space of %s: stopped after %d checks", problem, max_checks)
                        return out
                    change = {"TILE_ID": tile, "STAGES_ID": stage, "SPLITK_NUM": split}
                    if split > 1:
                        change["REDUCTION_SCHEME"] = scheme
                    try:
                        checked = lib.check(plan, lib.with_config(base, **change))
                    except AlgoRejected:
                        continue
                    key = _config_key(lib.config(checked.raw))
                    if checked.workspace > DEFAULT_WORKSPACE or key in seen:
                        continue
                    seen.add(key)
                    out.append(EnumeratedAlgo(solution_for(lib, checked.raw),
                                              f"{origin}/tile{tile}/stages{stage}/sk{split}", checked.workspace))
    return out


# ---- the runner -----------------------------------------------------------------------------------------------
class LtRunner:
    """One prepared (shape, algorithm): ``__call__`` allocates the output and makes one cublasLtMatmul."""

    def __init__(self, lib: LtLibrary, plan: MatmulPlan, info: AlgoInfo, device_index: int) -> None:
        p = plan.problem
        self.problem, self.lib, self.plan = p, lib, plan
        self._algo = algo_buffer(info.raw)  # cuBLASLt reads the struct through this address on every call
        self._algo_ptr = self._algo.ctypes.data
        # Workspace: the algorithm's need, +16 bytes when an epilogue is set (nvmath's workaround for a library
        # issue). One buffer per stream; the first is made here.
        self._ws_bytes = info.workspace + (16 if info.workspace and p.bias else 0)
        self._workspaces = StreamWorkspaces(self._ws_bytes)
        self._stream_of = raw_stream_fn()
        if self._ws_bytes:
            self._workspaces.ptr(self._stream_of(device_index), torch.device("cuda", device_index))
        self._alpha = host_f32(1.0)
        self._beta = host_f32(0.0)
        self._lock = threading.Lock()  # pointer attributes live in the shared descriptor
        self._mask_a = align_mask(lib, info.raw, "MIN_ALIGNMENT_B_BYTES")  # cuBLAS "B" is the activation a
        self._mask_b = align_mask(lib, info.raw, "MIN_ALIGNMENT_A_BYTES")  # cuBLAS "A" is the weight b
        self._per_call_pointers = p.bias or plan.is_fp8
        self._bias_keep: Optional[torch.Tensor] = None
        self._shape_a, self._shape_b = (p.M, p.K), (p.N, p.K)
        self._desc, self._la, self._lb, self._lc, self._ld = plan.layouts()
        self._raw = info.raw
        # Activation layout per row stride: K's is the plan's; others are checked against this algorithm once
        # (None: rejected, copy instead). F.linear reads strided rows in place; copying them cost the Llama-3.1-8B
        # layer 6% at M = 2048, where the o projection reads a column slice of the qkv output (BENCHMARKS.md).
        self._lb_by_stride: dict[int, Optional[int]] = {p.K: self._lb}
        self._handle = lib.handle
        self._matmul = lib.lt.matmul

    def __call__(self, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], otype: torch.dtype,
                 scale_a: Optional[torch.Tensor] = None, scale_b: Optional[torch.Tensor] = None,
                 scale_c: Optional[torch.Tensor] = None) -> torch.Tensor:
        p = self.problem
        if a.shape != self._shape_a or b.shape != self._shape_b or a.dtype != p.dtype or b.dtype != p.dtype:
            raise ValueError(f"cublaslt runner for M={p.M} N={p.N} K={p.K} {p.dtype} got a {tuple(a.shape)} "
                             f"{a.dtype} and b {tuple(b.shape)} {b.dtype}")
        if otype != p.otype:
            raise ValueError(f"cublaslt runner prepared for otype {p.otype}, called with {otype}")
        lb = self._lb
        if not a.is_contiguous():
            lb = self._strided_layout(a)
            if lb is None or a.data_ptr() & self._mask_a:
                a, lb = a.contiguous(), self._lb  # rows cuBLASLt cannot read in place: copy into row-major
        elif a.data_ptr() & self._mask_a:
            a = a.clone()  # rare: misaligned row-major, copy into an aligned buffer
        if not b.is_contiguous() or b.data_ptr() & self._mask_b:
            b = b.contiguous() if not b.is_contiguous() else b.clone()
        dev = a.device
        out = torch.empty(self._shape_a[0], self._shape_b[0], dtype=otype, device=dev)
        stream = self._stream_of(dev.index)
        ws_ptr = self._workspaces.ptr(stream, dev)
        if self._per_call_pointers:
            with self._lock:  # bias/scale pointers live in the descriptor this runner owns: set on every call
                self._set_bias(bias)
                self._set_scales(scale_a, scale_b)
                self._call(a, b, out, ws_ptr, stream, lb)
        else:
            if bias is not None or scale_a is not None or scale_b is not None:
                raise ValueError("cublaslt runner was prepared without bias/scales but called with them")
            self._call(a, b, out, ws_ptr, stream, lb)
        if scale_c is not None:
            out.mul_(scale_c)
        return out

    def _call(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, ws_ptr: int, stream: int,
              lb: int) -> None:
        d = out.data_ptr()
        self._matmul(self._handle, self._desc, self._alpha.ctypes.data, b.data_ptr(), self._la, a.data_ptr(),
                     lb, self._beta.ctypes.data, d, self._lc, d, self._ld, self._algo_ptr, ws_ptr,
                     self._ws_bytes, stream)

    def _strided_layout(self, a: torch.Tensor) -> Optional[int]:
        """The activation layout for ``a``'s row stride if cuBLASLt can read its rows in place with this algorithm
        (unit column stride, row stride >= K and a multiple of 16 bytes, the algorithm accepting the layout with no
        more workspace than it has); None otherwise."""
        lda = a.stride(0)
        if lda in self._lb_by_stride:
            return self._lb_by_stride[lda]
        layout = None
        if a.stride(1) == 1 and lda >= self.problem.K and (lda * a.element_size()) % 16 == 0:
            with self._lock:
                candidate = self.plan.activation_layout(lda)
                try:
                    info = self.lib.check(self.plan, self._raw, candidate)
                    if info.workspace + (16 if info.workspace and self.problem.bias else 0) <= self._ws_bytes:
                        layout = candidate
                except AlgoRejected:
                    pass
        self._lb_by_stride[lda] = layout
        return layout

    def _set_bias(self, bias: Optional[torch.Tensor]) -> None:
        p = self.problem
        if bias is None:
            if p.bias:
                raise ValueError("cublaslt runner was prepared with a bias epilogue but called with bias=None")
            return
        if not p.bias:
            raise ValueError("cublaslt runner was prepared without bias but called with one: re-key the problem")
        if bias.shape != (p.N,):
            raise ValueError(f"bias must have shape ({p.N},), got {tuple(bias.shape)} {bias.dtype}")
        if bias.dtype != p.otype or not bias.is_contiguous() or bias.data_ptr() % ALIGN_FALLBACK:
            bias = bias.to(p.otype).contiguous().clone()  # the epilogue reads bias in the output type
        self._bias_keep = bias  # cuBLASLt only holds the address until the launch
        self.plan.set_pointer("BIAS_POINTER", bias.data_ptr())

    def _set_scales(self, scale_a: Optional[torch.Tensor], scale_b: Optional[torch.Tensor]) -> None:
        if not self.plan.is_fp8:
            if scale_a is not None or scale_b is not None:
                raise ValueError("cublaslt: scale_a/scale_b apply to fp8 inputs only")
            return
        for name, s in (("A_SCALE_POINTER", scale_b), ("B_SCALE_POINTER", scale_a)):  # cuBLAS A is the weight
            if s is not None and (s.dtype != torch.float32 or s.numel() != 1):
                raise ValueError(f"per-tensor scale must be one float32, got {tuple(s.shape)} {s.dtype}")
            self.plan.set_pointer(name, 0 if s is None else s.data_ptr())


# ---- the backend ----------------------------------------------------------------------------------------------
class CublasLtBackend(Backend):
    """cuBLASLt through nvmath-python; available on CUDA builds with a GPU and ``nvmath-python`` installed."""

    name = NAME
    is_blaslt = True
    # Above torch (0), but the default only where torch cannot run (bpreshuffle): heuristic #0 timed the same as
    # F.linear on 96 Llama shapes on an H100 (speedup geomean 1.001, range 0.987-1.020; docs/exploration.md).
    default_priority = 10
    # Eager calls through nvmath cost 8-11 us more host time than F.linear on the H100 host (BENCHMARKS.md: 40-41
    # us against 29-33 us per call on (M, 4096, 14336)), more than rows of 45-55 us gain on the GPU (1.6-7 us): in a
    # host-bound eager model (HF decode, batch 8) such rows made the step 0.92x; run plain, 1.00x. Rows of 150 us
    # and more gained 12-25 us (M 1024 down_proj, lm_head at M 32-64). Below it eager calls run the cheap default;
    # CUDA-graph capture keeps the row. (An earlier 30 us came from loops of one GEMM, which are GPU-bound.)
    eager_min_us = 150.0

    def __init__(self, loader: Callable[[], LtLibrary] = load_library) -> None:
        self._lib = LibraryOnce(loader)
        self._warn = WarnOnce(log)

    def library(self) -> LtLibrary | None:
        """The loaded library, or None (reason in :meth:`unavailable_reason`); loaded once per process."""
        return self._lib.get()

    def unavailable_reason(self) -> str | None:
        return self._lib.reason()

    def resolve(self, problem: GemmProblem, solution: Solution) -> tuple[LtLibrary, MatmulPlan, AlgoInfo]:
        """Library, plan and checked algorithm for a row; :class:`AlgoRejected` saying why it cannot be replayed."""
        lib = self.library()
        if lib is None:
            raise AlgoRejected(f"cublaslt unavailable: {self._lib.reason()}")
        why = supported_reason(problem)
        if why:
            raise AlgoRejected(why)
        if solution.solidx == -1 and not solution.kernelName:
            plan = lib.plan(problem)
            return lib, plan, lib.best(plan, workspace=DEFAULT_WORKSPACE)
        try:
            version, raw = decode_algo(solution.kernelName)
        except ValueError as exc:
            raise AlgoRejected(str(exc)) from None
        if version != lib.version:
            raise AlgoRejected(f"row was tuned with cuBLASLt {version}, this process loaded {lib.version}: re-tune "
                               "the shape")
        cfg = lib.config(raw)
        split = cfg["SPLITK_NUM"] if cfg["SPLITK_NUM"] > 1 else 0
        if (cfg["ID"], split) != (solution.solidx, solution.splitK):
            raise AlgoRejected(f"row says solidx={solution.solidx} splitK={solution.splitK} but its kernelName "
                               f"encodes algo id {cfg['ID']} splitK {split}")
        plan = lib.plan(problem)
        try:
            info = lib.check(plan, raw)
        except AlgoRejected as exc:
            raise AlgoRejected(f"cublasLtMatmulAlgoCheck rejects it for this shape: {exc}") from None
        return lib, plan, info

    def why_not(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> str | None:
        if device.kind != "cuda":
            return f"cuBLASLt runs on NVIDIA GPUs, not {device.kind}"
        try:
            self.resolve(problem, solution)
        except AlgoRejected as exc:
            return str(exc)
        return None

    def prepare(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity) -> Runner | None:
        if device.kind != "cuda":
            return None
        try:
            lib, plan, info = self.resolve(problem, solution)
        except AlgoRejected as exc:
            self._warn((solution, str(exc)), "cublaslt solution solidx=%s splitK=%s kernelName=%r rejected for M=%d "
                       "N=%d K=%d: %s", solution.solidx, solution.splitK, solution.kernelName[:24], problem.M,
                       problem.N, problem.K, exc)
            return None
        return LtRunner(lib, plan, info, torch.cuda.current_device())

    def default_for(self, problem: GemmProblem, device: DeviceIdentity) -> Solution | None:
        if not problem.bpreshuffle or device.kind != "cuda" or supported_reason(problem) or not self.is_available():
            return None
        return Solution(NAME, -1, 0, "")

    def candidates(self, problem: GemmProblem, device: DeviceIdentity) -> list[Solution]:
        return find_solutions(problem, device, backend=self)


def find_solutions(problem: GemmProblem, device: DeviceIdentity | None = None,
                   backend: CublasLtBackend | None = None) -> list[Solution]:
    """The tuner's candidate list for ``problem`` (heuristic #0 of the default preference first); [] if none here."""
    backend = BACKEND if backend is None else backend
    lib = backend.library()
    if lib is None or supported_reason(problem):
        return []
    if device is None:
        from aiter_gemm.device import probe_gpu  # noqa: PLC0415

        device = probe_gpu()
    found = enumerate_candidates(lib, problem, device)
    n_heur = sum("+" not in c.origin for c in found)
    log.info("cublaslt M=%d N=%d K=%d %s->%s bias=%s: %d candidates (%d heuristic, %d variations)", problem.M,
             problem.N, problem.K, problem.dtype, problem.otype, problem.bias, len(found), n_heur, len(found) - n_heur)
    return [c.solution for c in found]


BACKEND = CublasLtBackend()
