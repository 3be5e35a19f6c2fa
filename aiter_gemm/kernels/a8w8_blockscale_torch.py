"""A8W8 block-scale GEMM through torch's own block-scaled matmul: ``F.scaled_mm`` with ``BlockWise1x128``
activation scales and ``BlockWise128x128`` weight scales, which torch runs with cuBLASLt on Hopper.

The second implementation :func:`aiter_gemm.gemm_a8w8_blockscale` can dispatch to (CSV ``libtype=torch``,
``kernelName`` :data:`NAME`; JSON entry :meth:`TorchBlockwise.to_json`). On the H100 it ran 1.2-1.4x faster than our
Triton kernel at M >= 1024 and slower at M <= 256 (docs/exploration.md),
so the tuner times both and the table decides per shape.

cuBLASLt wants, and the launchers prepare per call: M padded to a multiple of 4 (a copy of XQ when it is not),
x_scale M-major (strides ``(1, M)``; a transposing copy of M * K/128 floats unless the caller's quantizer already
writes it that way, as vLLM's ``column_major_scales`` does) and w_scale passed K-major (a view). Only the layouts
verified on the H100 are claimed (:func:`shape_error`): K a multiple of 512 (K blocks a multiple of 4: no scale
padding), N a multiple of 16, bf16 output. :func:`gemm_a8w8_blockscale_torch` is the plain per-call use of torch's
public API (the benchmarks' baseline); :func:`launcher` binds a runner to one shape for the dispatcher, as the
Triton and cuBLASLt backends do: on a CUDA device :class:`LtBlockwiseRunner`, torch's own cuBLASLt call (the same
descriptor, layouts, scale modes and heuristic #0 under torch's workspace limit, so the same algorithm) with the plan
made once through nvmath-python, so a call makes no heuristic query and no descriptor; where nvmath-python or a
cuBLASLt with block scaling (12.9+) is missing or no plan can be made for the shape, torch's op bound to the shape,
the reason kept (:meth:`LtPlans.reason`) and logged once. Outside the dispatcher (the HF loop's torch arm),
``launcher(..., padded_scales=True)`` takes any K multiple of 128 with w_scale's K blocks padded to a multiple of 4
(:func:`pad_scale_blocks`), the layout torch's own check of ``F.scaled_mm`` asks for there, and always runs torch's
op (the plan binds w_scale to K/128 blocks); the op's backend does not claim it (not verified on a GPU).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from aiter_gemm.backends._cublaslt_lib import (
    AlgoInfo,
    AlgoRejected,
    LibraryOnce,
    LtLibrary,
    StreamWorkspaces,
    algo_buffer,
    align_mask,
    host_f32,
    load_library,
    raw_stream_fn,
)
from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.kernels.blockscale_format import FP8, SCALE_BLOCK
from aiter_gemm.kernels.common import NamedChoice
from aiter_gemm.logs import WarnOnce

log = logging.getLogger(__name__)

__all__ = ["LIBTYPE", "LT", "NAME", "LtBlockwiseRunner", "LtPlans", "TorchBlockwise", "direct_op",
           "gemm_a8w8_blockscale_torch", "launcher", "pad_scale_blocks", "shape_error", "torch_lt_workspace",
           "unavailable_reason"]

LIBTYPE = "torch"
NAME = "scaled_mm_blockwise"
_OUT_DTYPE = torch.bfloat16


@dataclass(frozen=True)
class TorchBlockwise(NamedChoice):
    """The torch implementation as a dispatch choice, next to :class:`~aiter_gemm.kernels.a8w8_blockscale.
    BlockscaleConfig`: same ``name`` / ``NUM_KSPLIT`` / ``to_json`` surface, no parameters."""

    name: ClassVar[str] = NAME
    libtype: ClassVar[str] = LIBTYPE


def unavailable_reason(device: torch.device) -> str | None:
    """Why this torch cannot run block-scaled fp8 matmuls on ``device``; None when it can (CUDA, sm_90 or newer,
    ``F.scaled_mm`` with block-wise recipes: torch >= 2.10)."""
    F = torch.nn.functional
    if not (hasattr(F, "scaled_mm") and hasattr(F, "ScalingType")
            and hasattr(F.ScalingType, "BlockWise128x128")):
        return f"torch {torch.__version__} has no F.scaled_mm with BlockWise128x128 scaling"
    if device.type != "cuda" or getattr(torch.version, "hip", None):
        return f"block-scaled F.scaled_mm runs on NVIDIA GPUs (device {device})"
    if not torch.cuda.is_available():  # e.g. a CUDA device identity forced on a CPU-only build
        return f"torch {torch.__version__} sees no CUDA device"
    if torch.cuda.get_device_capability(device) < (9, 0):
        return f"block-scaled F.scaled_mm needs sm_90 or newer, {torch.cuda.get_device_name(device)} is older"
    return None


def shape_error(M: int, N: int, K: int, dtype: torch.dtype = _OUT_DTYPE, padded_scales: bool = False) -> str | None:
    """Why this implementation is not used for (M, N, K) -> ``dtype``; None if it is. ``padded_scales``: w_scale
    comes with its K blocks padded to a multiple of 4 (:func:`pad_scale_blocks`), so K need only be whole blocks."""
    if M < 1:
        return f"empty problem M={M}"
    if dtype != _OUT_DTYPE:
        return f"output {dtype}: only {_OUT_DTYPE} is supported"
    if K % (SCALE_BLOCK if padded_scales else 4 * SCALE_BLOCK):
        return (f"K={K} is not a multiple of 128" if padded_scales else
                f"K={K} is not a multiple of 512 (K blocks a multiple of 4: the layout verified on the H100)")
    if N % 16:
        return f"N={N} is not a multiple of 16"
    return None


def _operands(XQ: torch.Tensor, x_scale: torch.Tensor, M: int, K: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """XQ and x_scale as cuBLASLt takes them: M + ``pad`` rows (a multiple of 4), A row-major, x_scale M-major.
    Pad rows are left uninitialised: each output row depends only on its own A row and scales, and pad rows are
    sliced off (zeros and ones there cost two fill launches per call, ~5 us each on the H100 host)."""
    if pad:
        a = XQ.new_empty((M + pad, K))
        a[:M].copy_(XQ)
        sa = x_scale.new_empty((x_scale.shape[1], M + pad)).t()  # M-major
        sa[:M].copy_(x_scale)
        return a, sa
    a = XQ if XQ.is_contiguous() else XQ.contiguous()
    if x_scale.stride() == (1, M):
        return a, x_scale
    return a, torch.empty_strided(x_scale.shape, (1, M), dtype=x_scale.dtype, device=x_scale.device).copy_(x_scale)


def _weights(WQ: torch.Tensor, w_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """B = WQ.t() column-major and w_scale K-major, as views of contiguous operands."""
    b = WQ if WQ.is_contiguous() else WQ.contiguous()
    sb = w_scale if w_scale.is_contiguous() else w_scale.contiguous()
    return b.t(), sb.t()


def gemm_a8w8_blockscale_torch(XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                               dtype: torch.dtype = _OUT_DTYPE) -> torch.Tensor:
    """``(XQ * x_scale) @ (WQ * w_scale).T`` by ``F.scaled_mm`` (shapes as :func:`aiter_gemm.gemm_a8w8_blockscale`
    validated them); returns a new (M, N) tensor (rows of a padded one when M is not a multiple of 4). The plain call
    of torch's public API, checked per call; the dispatched op runs :func:`launcher`'s runner, bound once per shape."""
    F = torch.nn.functional
    M, K = XQ.shape
    N = WQ.shape[0]
    why = shape_error(M, N, K, dtype)
    if why is not None:
        raise ValueError(f"gemm_a8w8_blockscale_torch: {why}")
    pad = -M % 4
    a, sa = _operands(XQ, x_scale, M, K, pad)
    b, sb = _weights(WQ, w_scale)
    st = F.ScalingType
    out = F.scaled_mm(a, b, sa, st.BlockWise1x128, sb, st.BlockWise128x128, output_dtype=dtype)
    return out[:M] if pad else out


def direct_op() -> Callable[..., torch.Tensor] | None:
    """``torch._scaled_mm_v2`` when ``F.scaled_mm`` is torch's own wrapper of it (torch 2.10-2.13: it turns single
    scales and recipes into lists and recipes into ints, then calls the op), else None (an older or newer torch, or
    an ``F.scaled_mm`` replaced by a test or a user: it is then called as is). Calling the op with arguments built
    once per shape saves the wrapper's ten helper calls per call (2.4 us on a CPU host)."""
    F = torch.nn.functional
    fn, op = getattr(F, "scaled_mm", None), getattr(torch, "_scaled_mm_v2", None)
    code = getattr(fn, "__code__", None)
    if op is None or code is None or getattr(fn, "__module__", None) != F.__name__:
        return None
    if "_scaled_mm_v2" not in code.co_names or code.co_varnames[:code.co_argcount + code.co_kwonlyargcount] != (
            "mat_a", "mat_b", "scale_a", "scale_recipe_a", "scale_b", "scale_recipe_b", "swizzle_a", "swizzle_b",
            "bias", "output_dtype", "contraction_dim", "use_fast_accum"):
        return None
    return op


def pad_scale_blocks(w_scale: torch.Tensor) -> torch.Tensor:
    """``w_scale`` (..., N/128, K/128) with its K blocks padded to a multiple of 4 (ones; ``w_scale`` itself when
    they already are), contiguous: what torch's block-scaled matmul reads when K/128 is not a multiple of 4."""
    kb = w_scale.shape[-1]
    if kb % 4 == 0 and w_scale.is_contiguous():
        return w_scale
    out = w_scale.new_ones((*w_scale.shape[:-1], -(-kb // 4) * 4))
    out[..., :kb] = w_scale
    return out


BlockRunner = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]


def launcher(M: int, N: int, K: int, dtype: torch.dtype = _OUT_DTYPE, device: torch.device | None = None, *,
             padded_scales: bool = False) -> BlockRunner:
    """The runner of one shape (what the ``torch`` backend's ``prepare`` returns). On a CUDA ``device``, torch's
    cuBLASLt call with its plan made here (:class:`LtBlockwiseRunner`, through :data:`LT`) where it can be made;
    otherwise (``device`` None or not CUDA, no nvmath-python, no block scaling, no plan: :meth:`LtPlans.reason`)
    torch's op with the shape check, the padding and the scaled_mm arguments decided here, once: per call only the
    operands' layouts are made and the op called. Either gives the same result as
    :func:`gemm_a8w8_blockscale_torch` (GPU tests compare them bit for bit). ``padded_scales``: the runner is handed
    :func:`pad_scale_blocks`' w_scale, and K need only be whole blocks; such a runner is always torch's op (the
    plan's operand check and scale layout take w_scale's K/128 blocks unpadded)."""
    scaled_mm = _scaled_mm_launcher(M, N, K, dtype, padded_scales)
    if padded_scales or device is None or device.type != "cuda":
        return scaled_mm
    return LT.runner(M, N, K, dtype, device, scaled_mm) or scaled_mm


def _scaled_mm_launcher(M: int, N: int, K: int, dtype: torch.dtype, padded_scales: bool = False) -> BlockRunner:
    """torch's op bound to the shape (see :func:`launcher`)."""
    why = shape_error(M, N, K, dtype, padded_scales)
    if why is not None:
        raise ValueError(f"gemm_a8w8_blockscale_torch: {why}")
    F = torch.nn.functional
    st = F.ScalingType
    pad = -M % 4
    op = direct_op()
    if op is None:
        scaled_mm, ra, rb = F.scaled_mm, st.BlockWise1x128, st.BlockWise128x128

        def run(XQ, WQ, x_scale, w_scale, dtype):
            a, sa = _operands(XQ, x_scale, M, K, pad)
            b, sb = _weights(WQ, w_scale)
            out = scaled_mm(a, b, sa, ra, sb, rb, output_dtype=dtype)
            return out[:M] if pad else out
        return run
    ra, rb, none = [st.BlockWise1x128.value], [st.BlockWise128x128.value], []

    def run_direct(XQ, WQ, x_scale, w_scale, dtype):
        a, sa = _operands(XQ, x_scale, M, K, pad)
        b, sb = _weights(WQ, w_scale)
        out = op(a, b, [sa], ra, none, [sb], rb, none, None, dtype, (), False)
        return out[:M] if pad else out
    return run_direct


# ---- torch's cuBLASLt call with its plan made once ---------------------------------------------------------------
def torch_lt_workspace() -> int:
    """The workspace limit torch's ``scaled_gemm`` asks cuBLASLt's heuristic under (``getCUDABlasLtWorkspaceSize``:
    ``CUBLASLT_WORKSPACE_SIZE`` KiB, 1024 when unset or unreadable), so the plan's heuristic #0 is torch's algorithm.
    torch's cap at the cuBLAS workspace (``CUBLAS_WORKSPACE_CONFIG``, 32 MiB on Hopper) binds only above that."""
    try:
        return int(os.environ.get("CUBLASLT_WORKSPACE_SIZE", "1024")) * 1024
    except ValueError:
        return 1024 * 1024


class LtBlockwiseRunner:
    """torch's block-scaled cuBLASLt call for one (M, N, K) with the plan made once: M padded to a multiple of 4
    (:func:`_operands`, as torch's runner pads), cuBLAS A = the weight (N, K) with 128 x 128 block scales, B = the
    activation with 1 x 128 scales M-major, D = out (M + pad, N) row-major; the algorithm is the heuristic's first
    under :func:`torch_lt_workspace`, the one torch's call picks. A call checks the operands, sets the two scale
    pointers and makes one ``cublasLtMatmul`` on torch's current stream (safe under CUDA-graph capture: the
    workspaces stay referenced). Operands misaligned for the algorithm go to ``fallback`` (torch's op)."""

    def __init__(self, lib: LtLibrary, M: int, N: int, K: int, dtype: torch.dtype, device: torch.device,
                 fallback: BlockRunner) -> None:
        self.M, self.N, self.K, self._pad = M, N, K, -M % 4
        problem = GemmProblem(M + self._pad, N, K, False, FP8, dtype, True)
        self.lib, self.plan = lib, lib.plan(problem, block_scaled=True)
        self.info: AlgoInfo = lib.best(self.plan, workspace=torch_lt_workspace())
        self._algo = algo_buffer(self.info.raw)
        self._algo_ptr = self._algo.ctypes.data
        self._mask = (align_mask(lib, self.info.raw, "MIN_ALIGNMENT_A_BYTES")
                      | align_mask(lib, self.info.raw, "MIN_ALIGNMENT_B_BYTES") | 15)  # 15: scales, TMA
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
        self._device = device
        self._workspaces = StreamWorkspaces(self.info.workspace)
        self._stream_of = raw_stream_fn()
        self._alpha, self._beta = host_f32(1.0), host_f32(0.0)
        self._lock = threading.Lock()  # the scale pointers live in the plan's descriptor
        self._fallback = fallback
        kb = -(-K // SCALE_BLOCK)
        self._expect = ((M, K), (N, K), (M, kb), (-(-N // SCALE_BLOCK), kb), FP8, FP8, torch.float32, torch.float32,
                        self._device, dtype)
        self._out_shape = (M + self._pad, N)
        self._desc, self._la, self._lb, self._lc, self._ld = self.plan.layouts()
        self._handle, self._matmul = lib.handle, lib.lt.matmul

    def __call__(self, XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                 dtype: torch.dtype) -> torch.Tensor:
        got = (XQ.shape, WQ.shape, x_scale.shape, w_scale.shape, XQ.dtype, WQ.dtype, x_scale.dtype, w_scale.dtype,
               XQ.device, dtype)
        if got != self._expect:
            raise ValueError(self._mismatch(got))
        a, sa = _operands(XQ, x_scale, self.M, self.K, self._pad)
        b = WQ if WQ.is_contiguous() else WQ.contiguous()
        sb = w_scale if w_scale.is_contiguous() else w_scale.contiguous()
        pa, pb, psa, psb = a.data_ptr(), b.data_ptr(), sa.data_ptr(), sb.data_ptr()
        if (pa | pb | psa | psb) & self._mask:
            return self._fallback(XQ, WQ, x_scale, w_scale, dtype)
        dev = self._device
        out = torch.empty(self._out_shape, dtype=dtype, device=dev)
        stream = self._stream_of(dev.index)
        ws = self._workspaces.ptr(stream, dev)
        d = out.data_ptr()
        with self._lock:
            self.plan.set_pointer("A_SCALE_POINTER", psb)  # cuBLAS A is the weight
            self.plan.set_pointer("B_SCALE_POINTER", psa)
            self._matmul(self._handle, self._desc, self._alpha.ctypes.data, pb, self._la, pa, self._lb,
                         self._beta.ctypes.data, d, self._lc, d, self._ld, self._algo_ptr, ws,
                         self._workspaces.nbytes, stream)
        return out[:self.M] if self._pad else out


    def _mismatch(self, got: tuple) -> str:
        names = ("XQ shape", "WQ shape", "x_scale shape", "w_scale shape", "XQ dtype", "WQ dtype", "x_scale dtype",
                 "w_scale dtype", "XQ device", "output dtype")
        bad = [f"{n} {tuple(g) if isinstance(g, torch.Size) else g} (bound: {e})"
               for n, g, e in zip(names, got, self._expect, strict=True) if g != e]
        return f"block-scaled cuBLASLt runner for M={self.M} N={self.N} K={self.K}: " + "; ".join(bad)


class LtPlans:
    """cuBLASLt through nvmath-python for :class:`LtBlockwiseRunner`, loaded once per process (``loader``: tests
    pass a fake). Why a shape gets torch's op instead (no nvmath-python, no block scaling, the heuristic's refusal or
    no algorithm) is kept per shape (:meth:`reason`: what the overhead bench's note and the GPU tests print) and
    logged once per cause."""

    def __init__(self, loader: Callable[[], LtLibrary] = load_library) -> None:
        self._lib = LibraryOnce(loader, check=LtLibrary.block_scaling_reason)
        self._refused: dict[tuple[int, int, int, torch.dtype], str] = {}
        self._log = WarnOnce(log, logging.INFO)

    def library(self) -> LtLibrary | None:
        """The loaded library if it can run block-scaled plans, else None (:meth:`unavailable_reason` says why)."""
        return self._lib.get()

    def unavailable_reason(self) -> str | None:
        return self._lib.reason()

    def reason(self, M: int, N: int, K: int, dtype: torch.dtype = _OUT_DTYPE) -> str | None:
        """Why :meth:`runner` gave (M, N, K) -> ``dtype`` no plan: the library's reason or the shape's; None when it
        made one or was not asked."""
        return self._lib.reason(load=False) or self._refused.get((M, N, K, dtype))

    def runner(self, M: int, N: int, K: int, dtype: torch.dtype, device: torch.device,
               fallback: BlockRunner) -> LtBlockwiseRunner | None:
        """The shape's runner, or None (reason kept for :meth:`reason`, logged once per cause) where torch's op must
        run it."""
        lib = self.library()
        if lib is None:
            why = self._lib.reason()
            self._log(why, "torch's block-scaled matmul runs through F.scaled_mm (a cuBLASLt heuristic query "
                      "per call): %s", why)
            return None
        try:
            runner = LtBlockwiseRunner(lib, M, N, K, dtype, device, fallback)
        except AlgoRejected as exc:
            why = str(exc)
            self._refused[(M, N, K, dtype)] = why
            self._log(why, "torch's block-scaled matmul runs through F.scaled_mm for shapes with no cached cuBLASLt "
                      "plan, first M=%d N=%d K=%d: %s", M, N, K, why)
            return None
        self._refused.pop((M, N, K, dtype), None)
        return runner


#: The process's block-scaled plans (tests replace it with one over a fake library).
LT = LtPlans()
