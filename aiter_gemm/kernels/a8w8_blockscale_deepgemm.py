"""A8W8 block-scale GEMM through DeepGEMM (``import deep_gemm``, an optional package the user builds against their
torch: docs/deepgemm.md): its SM90 FP8 kernel with 1x128 activation and 128x128 weight float32 scales (the "1D2D"
kernel), ``deep_gemm.fp8_gemm_nt((XQ, x_scale), (WQ, w_scale), out)``, which computes ``out = XQ @ WQ.T`` scaled.

A choice of :func:`aiter_gemm.gemm_a8w8_blockscale` (CSV ``libtype=deepgemm``, ``kernelName`` :data:`NAME`; JSON
entry :meth:`DeepGemmFP8.to_json`), like torch's block-scaled matmul (:mod:`aiter_gemm.kernels.a8w8_blockscale_torch`):
kernel-less here, a launcher bound per shape and the plain per-call use (:func:`gemm_a8w8_blockscale_deepgemm`, the
benchmarks' ``deepgemm`` provider). What it takes (:func:`shape_error`, from DeepGEMM's source): bf16 output only
(the 1D2D kernel asserts it), N a multiple of 8 (the kernel asserts ``shape_n % 8 == 0``: 16-byte bf16 output
rows for TMA), K a multiple of 128 (whole 128-wide scale blocks: DeepGEMM's tests hold no other K). Operands are
passed K-major (row-major XQ / WQ, made contiguous where they are not); x_scale as given: DeepGEMM uses an M-major,
TMA-aligned x_scale (strides ``(1, align(M, 4))``) as is and transforms any other layout per call (one launch),
so the backend asks for M-major x_scale (strides (1, M): the same layout wherever M is a multiple of 4).

DeepGEMM compiles each kernel configuration on its first call (NVCC, cached on disk in ``$DG_JIT_CACHE_DIR``, else
``~/.deep_gemm``); :func:`warm` makes that first call ahead (:func:`aiter_gemm.warmup`, the tuner's precompile).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import ClassVar

import torch

from aiter_gemm.kernels.a8w8_blockscale import gemm_a8w8_blockscale_ref
from aiter_gemm.kernels.blockscale_format import SCALE_BLOCK, zero_operands
from aiter_gemm.kernels.common import NamedChoice

__all__ = ["LIBTYPE", "NAME", "DeepGemmFP8", "gemm_a8w8_blockscale_deepgemm", "gemm_a8w8_blockscale_deepgemm_ref",
           "launcher", "module", "shape_error", "unavailable_reason", "warm"]

LIBTYPE = "deepgemm"
NAME = "deepgemm_fp8_gemm_nt"
_OUT_DTYPE = torch.bfloat16
#: N must be a multiple of this (the 1D2D kernel's device assert; bf16 rows of 16 bytes for the TMA store).
N_ALIGN = 8
#: K must be a multiple of this: whole scale blocks (BLOCK_K is 128 in the kernel; DeepGEMM tests no other K).
K_ALIGN = SCALE_BLOCK


@dataclass(frozen=True)
class DeepGemmFP8(NamedChoice):
    """DeepGEMM's FP8 GEMM as a dispatch choice, next to :class:`~aiter_gemm.kernels.a8w8_blockscale_torch.
    TorchBlockwise`: same ``name`` / ``NUM_KSPLIT`` / ``to_json`` surface, no parameters (DeepGEMM picks its own
    tiles per shape)."""

    name: ClassVar[str] = NAME
    libtype: ClassVar[str] = LIBTYPE


def module() -> ModuleType:
    """``deep_gemm``, imported (ImportError, or whatever its import raised, when it cannot be)."""
    return importlib.import_module("deep_gemm")


def unavailable_reason(device: torch.device | None = None) -> str | None:
    """Why DeepGEMM's FP8 block-scale GEMM cannot run here (None if it can): ``deep_gemm`` not importable or
    without ``fp8_gemm_nt``, no NVIDIA GPU (or ``device`` not a CUDA one), or a GPU other than sm_90 (the float32-scale
    kernel is sm_90a's; SM100 takes packed UE8M0 scales instead)."""
    try:
        dg = module()
    except Exception as exc:  # noqa: BLE001 - a broken build (undefined symbols) says why as a missing one does
        return (f"deep_gemm is not installed or does not load ({type(exc).__name__}: {exc}); build DeepGEMM "
                "against this torch (docs/deepgemm.md)")
    if not callable(getattr(dg, "fp8_gemm_nt", None)):
        return f"deep_gemm {getattr(dg, '__version__', '?')} has no fp8_gemm_nt"
    if (device is not None and device.type != "cuda") or getattr(torch.version, "hip", None) \
            or not torch.cuda.is_available():
        return f"DeepGEMM runs on NVIDIA GPUs (sm_90a), not {device or 'this machine'}"
    cap = torch.cuda.get_device_capability(device)
    if cap != (9, 0):
        return (f"DeepGEMM's FP8 kernel with float32 block scales needs sm_90a (Hopper); this GPU is "
                f"sm_{cap[0]}{cap[1]}")
    return None


def shape_error(M: int, N: int, K: int, dtype: torch.dtype = _OUT_DTYPE) -> str | None:
    """Why DeepGEMM's SM90 FP8 kernel is not used for (M, N, K) -> ``dtype``; None if it is (module docstring)."""
    if M < 1 or N < 1 or K < 1:
        return f"empty problem M={M} N={N} K={K}"
    if dtype != _OUT_DTYPE:
        return f"output {dtype}: DeepGEMM's SM90 FP8 kernel writes {_OUT_DTYPE} only"
    if N % N_ALIGN:
        return f"N={N} is not a multiple of {N_ALIGN} (DeepGEMM's FP8 kernel asserts N % 8 == 0)"
    if K % K_ALIGN:
        return f"K={K} is not a multiple of {K_ALIGN} (DeepGEMM's FP8 kernel runs whole 128-wide K blocks)"
    return None


def _k_major(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def gemm_a8w8_blockscale_deepgemm(XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                                  dtype: torch.dtype = _OUT_DTYPE) -> torch.Tensor:
    """``(XQ * x_scale) @ (WQ * w_scale).T`` by ``deep_gemm.fp8_gemm_nt`` as a user calls it: checked, the output
    allocated and the operands passed as given, per call (DeepGEMM transforms x_scale's layout itself)."""
    M, K = XQ.shape
    N = WQ.shape[0]
    why = shape_error(M, N, K, dtype)
    if why is not None:
        raise ValueError(f"gemm_a8w8_blockscale_deepgemm: {why}")
    out = torch.empty((M, N), dtype=dtype, device=XQ.device)
    module().fp8_gemm_nt((XQ, x_scale), (WQ, w_scale), out)
    return out


def launcher(M: int, N: int, K: int, dtype: torch.dtype = _OUT_DTYPE
             ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]:
    """The runner of one shape (what the ``deepgemm`` backend's ``prepare`` returns): the shape checked and
    ``fp8_gemm_nt`` looked up once; per call the output allocated, XQ / WQ / w_scale passed K-major (a copy only
    where the caller's are not contiguous) and x_scale as given (M-major TMA-aligned is used as is)."""
    why = shape_error(M, N, K, dtype)
    if why is not None:
        raise ValueError(f"gemm_a8w8_blockscale_deepgemm: {why}")
    gemm = module().fp8_gemm_nt

    def run(XQ, WQ, x_scale, w_scale, _dtype=dtype):
        out = torch.empty((M, N), dtype=dtype, device=XQ.device)
        gemm((_k_major(XQ), x_scale), (_k_major(WQ), _k_major(w_scale)), out)
        return out

    return run


def warm(jobs: Iterable[tuple[int, int, int, torch.dtype]], device: torch.device | None = None
         ) -> dict[tuple[int, int, int, torch.dtype], str]:
    """Call DeepGEMM once per (M, N, K, out dtype) job on zero operands, so its JIT compiles (or loads from its disk
    cache) the kernels those shapes run before any is timed or served: the GEMM's and, x_scale being row-major
    here, its scale-transposing kernel's (a row-major caller's). Returns the jobs that failed, with why."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    failed = {}
    for job in dict.fromkeys(jobs):
        M, N, K, dtype = job
        try:
            launcher(M, N, K, dtype)(*zero_operands(M, N, K, device), dtype)
        except Exception as exc:  # noqa: BLE001 - a shape DeepGEMM cannot build is a failed job, not a crash
            failed[job] = f"{type(exc).__name__}: {exc}"
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return failed


def gemm_a8w8_blockscale_deepgemm_ref(XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor,
                                      w_scale: torch.Tensor, dtype: torch.dtype = _OUT_DTYPE) -> torch.Tensor:
    """The float32 dequantized reference (:func:`~aiter_gemm.kernels.a8w8_blockscale.gemm_a8w8_blockscale_ref`)
    with DeepGEMM's support rule: what the runner must return, within bf16 rounding."""
    why = shape_error(XQ.shape[0], WQ.shape[0], XQ.shape[1], dtype)
    if why is not None:
        raise ValueError(f"gemm_a8w8_blockscale_deepgemm: {why}")
    return gemm_a8w8_blockscale_ref(XQ, WQ, x_scale, w_scale, dtype)
