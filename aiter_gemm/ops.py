"""Public GEMM entry points: ``gemm_a16w16``, ``TunedGemm.mm``, and the ``aiter_gemm::gemm_a16w16`` custom op.

Eager calls go straight to the dispatcher (a ``torch.library.custom_op`` costs ~16 us per eager call on CPU, more
than a decode GEMM on an H100); only code being traced by ``torch.compile`` / ``torch.export`` goes through the op,
whose fake implementation lets ``fullgraph=True`` compile a model that calls it.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.configs import ConfigTable
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.dispatch import Dispatcher
from aiter_gemm.dtypes import parse_dtype

_DISPATCHER = Dispatcher()
_run = _DISPATCHER.run
_is_compiling = torch.compiler.is_compiling


@torch.library.custom_op("aiter_gemm::gemm_a16w16", mutates_args=())
def _gemm_a16w16_op(
    A: torch.Tensor, B: torch.Tensor, bias: Optional[torch.Tensor] = None, otype: Optional[torch.dtype] = None,
    scale_a: Optional[torch.Tensor] = None, scale_b: Optional[torch.Tensor] = None,
    scale_c: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    return _run(A, B, bias, otype, scale_a, scale_b, scale_c)


@_gemm_a16w16_op.register_fake
def _gemm_a16w16_fake(A, B, bias=None, otype=None, scale_a=None, scale_b=None, scale_c=None):
    return A.new_empty((*A.shape[:-1], B.shape[0]), dtype=otype or A.dtype)


def _setup_context(ctx, inputs, output):
    A, B, bias, otype, scale_a, scale_b, scale_c = inputs
    if scale_a is not None or scale_b is not None or scale_c is not None:
        raise NotImplementedError("aiter_gemm.gemm_a16w16: no gradient for scaled (fp8) GEMMs")
    ctx.save_for_backward(A, B)
    ctx.has_bias = bias is not None


def _backward(ctx, grad):
    """Gradients of out = A @ B.T + bias (so models with trainable weights still compile), in the input dtypes."""
    A, B = ctx.saved_tensors
    g = grad.to(A.dtype)
    grad_a = g @ B
    grad_b = g.reshape(-1, g.shape[-1]).t() @ A.reshape(-1, A.shape[-1])
    grad_bias = g.reshape(-1, g.shape[-1]).sum(0) if ctx.has_bias else None
    return grad_a, grad_b, grad_bias, None, None, None, None


_gemm_a16w16_op.register_autograd(_backward, setup_context=_setup_context)


def gemm_a16w16(
    A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None = None, otype: torch.dtype | None = None,
    scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None, scale_c: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.linear(A, B, bias)`` through the tuned dispatch: A (..., K), B (N, K) -> (..., N) in ``otype``
    (default A.dtype). fp8 inputs take per-tensor ``scale_a``/``scale_b``; ``scale_c`` multiplies the output."""
    if _is_compiling():
        return torch.ops.aiter_gemm.gemm_a16w16(A, B, bias, otype, scale_a, scale_b, scale_c)
    return _run(A, B, bias, otype, scale_a, scale_b, scale_c)


class TunedGemm:
    """AITER's ``tgemm`` object: ``tgemm.mm(inp, weights, bias, otype, scale_a, scale_b, scale_c)``."""

    def mm(self, inp: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor | None = None,
           otype: torch.dtype | None = None, scale_a: torch.Tensor | None = None,
           scale_b: torch.Tensor | None = None, scale_c: torch.Tensor | None = None) -> torch.Tensor:
        return gemm_a16w16(inp, weights, bias, otype, scale_a, scale_b, scale_c)


tgemm = TunedGemm()


def get_GEMM_A16W16_config(M: int, N: int, K: int, bias: bool, dtype: torch.dtype | str,
                           otype: torch.dtype | str | None = None, scaleAB: bool = False,
                           bpreshuffle: bool = False) -> dict[str, Any]:
    """The config ``gemm_a16w16`` uses for this shape on this process's GPU (or CPU when there is none): the tuned
    row's columns, or the heuristic default, plus ``matched`` (exact/padded_gl0/padded_gl1/default) and ``source``."""
    dt = parse_dtype(dtype)
    problem = GemmProblem(int(M), int(N), int(K), bool(bias), dt, parse_dtype(otype) if otype is not None else dt,
                          bool(scaleAB), bool(bpreshuffle))
    return _DISPATCHER.decide(problem, torch.cuda.is_available()).as_config()


def reload_configs() -> None:
    """Re-read the environment and every config file and drop cached decisions (the tuner and tests use it)."""
    _DISPATCHER.reload()


def get_config_table(kind: str) -> ConfigTable:
    """The merged tuned table of a config kind (``GEMM_BF16``, ``GEMM_A8W8``, ``GEMM_A8W8_BLOCKSCALE``, ...)."""
    return _DISPATCHER.table(kind)


def current_device_identity(on_gpu: bool | None = None) -> DeviceIdentity:
    """``(gfx, cu_num)`` rows are matched against, overrides applied; GPU if present unless ``on_gpu`` says."""
    return _DISPATCHER.device(torch.cuda.is_available() if on_gpu is None else on_gpu)


def get_dispatcher() -> Dispatcher:
    return _DISPATCHER
