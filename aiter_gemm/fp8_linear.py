"""transformers' ``FP8Linear`` (fine-grained FP8: DeepSeek-V3, Qwen3-*-FP8 checkpoints) on the tuned block-scale op.

:func:`aiter_gemm.nn.patch_linear` swaps each ``FP8Linear`` whose weight is fp8 e4m3 with float32 ``weight_scale_inv``
of (128, 128) blocks and whose activations are quantized dynamically for a :func:`from_fp8_linear` twin: an instance
of a subclass of the module's own class (``isinstance`` checks, state-dict keys and parameters unchanged: the same
Parameter objects, nothing copied) whose forward quantizes the activation per token and 128-wide K group in one
launch (:func:`~aiter_gemm.kernels.act_quant.per_token_group_quant_fp8`), runs
:func:`aiter_gemm.gemm_a8w8_blockscale` (tuned rows, JSON buckets, defaults: shapes captured under
``AITER_TUNE_GEMM=1`` like every call of the op) and adds the bias. Other block sizes, UE8M0 scales and static
activation scales leave the module alone (:func:`unsupported_reason`, one warning each). Under ``torch.compile`` the
forward is the custom op ``aiter_gemm::fp8_block_linear`` (a fake implementation, no graph break); there is no host
sync, so it runs in CUDA graphs. Calls that want an input gradient, or whose input the op cannot take, run the
module's own forward, warned once per module and reason; so do calls after the weight stopped being fp8 or its scale
float32 (``model.to(torch.bfloat16)`` casts the fp8 weight). With the C++ extension built, an eager call of a
shape whose quantizer launch is bound runs from C++ (``fp8_call``: the same checks, quantizer, op and bias;
docs/eager_path.md). Twins pickle (``torch.save(model)``) and unpickle into
twins of the same class, still undone by :func:`~aiter_gemm.nn.unpatch_linear`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Optional

import torch
from torch import nn

from aiter_gemm.call_entry import FP8_INTEGRATION, c_call, clone_module, python_call
from aiter_gemm.cudagraph import probe as _capture_probe
from aiter_gemm.dtypes import OUT_DTYPES as _OUT_DTYPES
from aiter_gemm.kernels import act_quant
from aiter_gemm.kernels.act_quant import per_token_group_quant_fp8
from aiter_gemm.kernels.blockscale_format import FP8, SCALE_BLOCK
from aiter_gemm.op_entry import EXT
from aiter_gemm.ops.a8w8_blockscale import gemm_a8w8_blockscale, x_scale_m_major

log = logging.getLogger("aiter_gemm")
_capturing = _capture_probe()
# The twin's C++ call (csrc/module_call.cpp fp8_call): the call entry's checks, the quantizer's bound launch (its
# M-major plan table), the op's entry and the bias, once the Python path bound the shape; None: the Python form.
_c_fp8_call = None
if c_call is not None and act_quant.TABLES is not None:
    EXT.setup_fp8(act_quant.TABLES[1], gemm_a8w8_blockscale, _capturing)
    _c_fp8_call = EXT.fp8_call

__all__ = ["BlockGemm", "TunedFP8Mixin", "fp8_block_linear", "fp8_linear_class", "from_fp8_linear",
           "is_fp8_linear", "unsupported_reason"]

#: (XQ, WQ, x_scale, w_scale, out dtype) -> out (M, N): the GEMM a twin runs (default the tuned op).
BlockGemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]
_Tensor = torch.Tensor
_F32 = torch.float32
_is_compiling = torch.compiler.is_compiling


def fp8_linear_class() -> type | None:
    """transformers' ``FP8Linear`` if its integration module is imported (a model can hold one only then)."""
    mod = sys.modules.get(FP8_INTEGRATION)
    return getattr(mod, "FP8Linear", None)


def is_fp8_linear(module: nn.Module) -> bool:
    """Exactly transformers' ``FP8Linear`` (its subclasses, e.g. ``FP8GroupedLinear``, compute something else)."""
    cls = fp8_linear_class()
    return cls is not None and type(module) is cls


def unsupported_reason(module: nn.Module) -> str | None:
    """Why the block-scale op cannot run this ``FP8Linear`` (None: it can): only tensor metadata is read."""
    block = getattr(module, "block_size", None)
    if block is None or [int(b) for b in block] != [SCALE_BLOCK, SCALE_BLOCK]:
        return (f"block_size {None if block is None else list(block)}: only [{SCALE_BLOCK}, {SCALE_BLOCK}] weight "
                "blocks run on gemm_a8w8_blockscale")
    scheme = getattr(module, "activation_scheme", "dynamic")
    if scheme != "dynamic" or getattr(module, "activation_scale", None) is not None:
        return f"activation_scheme {scheme!r}: static activation scales are not supported (dynamic per-token only)"
    weight, scale = module._parameters.get("weight"), module._parameters.get("weight_scale_inv")
    if weight is None or type(weight) not in (nn.Parameter, torch.Tensor) or weight.dtype != FP8:
        return f"weight is {getattr(weight, 'dtype', None)} ({type(weight).__name__}), not a plain {FP8} tensor"
    if scale is None or scale.dtype != torch.float32:
        return (f"weight_scale_inv is {getattr(scale, 'dtype', None)}: only float32 scales (UE8M0 scales, "
                "scale_fmt='ue8m0', are not supported)")
    N, K = weight.shape
    want = (-(-N // SCALE_BLOCK), -(-K // SCALE_BLOCK))
    if tuple(scale.shape) != want:
        return f"weight_scale_inv shape {tuple(scale.shape)} is not (ceil(N/128), ceil(K/128)) = {want}"
    if weight.device != scale.device:
        return f"weight on {weight.device}, weight_scale_inv on {scale.device}"
    return None


def fp8_block_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                     bias: torch.Tensor | None = None, gemm: BlockGemm | None = None,
                     m_major: bool | None = None) -> torch.Tensor:
    """``FP8Linear``'s result for x (..., K): x quantized per token and 128-K group (one launch), the block-scale
    GEMM (``gemm``, default :func:`aiter_gemm.gemm_a8w8_blockscale`) in x's dtype, then + bias. ``m_major``: write
    x_scale M-major (what torch's block-scaled matmul takes without a copy); None: for the op, M-major outside
    CUDA-graph capture and, while capturing, the layout its runner for this shape takes
    (:func:`~aiter_gemm.ops.a8w8_blockscale.x_scale_m_major`); row-major for another ``gemm``."""
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    if m_major is None:
        # Eager calls run torch's matmul (torch rows; TileLang rows above M = 4, and Triton rows where Triton's
        # launches are not bound, give way to it), a TileLang kernel at M <= 4, which has an M-major variant, or a
        # Triton kernel through its bound launch, which takes either layout: M-major serves them all without a copy,
        # and skips the per-call layout lookup, a measurable share of an eager decode step (docs/exploration.md).
        m_major = gemm is None and (not _capturing() or x_scale_m_major(x2.shape[0], weight.shape[0], K, x.dtype,
                                                                        x.is_cuda))
    xq, xs = per_token_group_quant_fp8(x2, m_major)
    out = (gemm or gemm_a8w8_blockscale)(xq, weight, xs, weight_scale_inv, x.dtype)
    if bias is not None:
        out = out.add_(bias)
    return out.view(*x.shape[:-1], weight.shape[0])


@torch.library.custom_op("aiter_gemm::fp8_block_linear", mutates_args=())
def _fp8_block_linear_op(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                         bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    return fp8_block_linear(x, weight, weight_scale_inv, bias)


@_fp8_block_linear_op.register_fake
def _fp8_block_linear_fake(x, weight, weight_scale_inv, bias=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _input_reason(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> str | None:
    """Why this call must run the module's own forward (None: the op takes it). Metadata only: graph-safe."""
    if type(x) is not _Tensor:
        return f"input is a tensor subclass ({type(x).__name__})"
    if x.dtype not in _OUT_DTYPES:
        return f"input dtype {x.dtype} is not one of {list(_OUT_DTYPES)}"
    if x.device != weight.device:
        return f"input is on {x.device}, weight on {weight.device}"
    if not (x.is_cuda or x.is_cpu):
        return f"device type {x.device.type!r} is not dispatched (cuda and cpu are)"
    if bias is not None and bias.device != weight.device:
        return f"bias is on {bias.device}, weight on {weight.device}"
    if torch.is_grad_enabled() and x.requires_grad:
        return "the input wants a gradient (FP8Linear's own autograd function has the backward)"
    return None


class TunedFP8Mixin:
    """Mixed in front of transformers' ``FP8Linear`` by :func:`from_fp8_linear`: the forward on the block-scale op.
    ``_aiter_gemm`` / ``_aiter_m_major`` (instance attributes, default the tuned op and the layout its runner takes)
    pick another GEMM, as benchmarks do to put every layer on one implementation."""

    _aiter_fp8_swapped = True  # aiter_gemm.nn recognises the modules it made by this class attribute
    _aiter_base: type  # the FP8Linear class the twin class derives from (set by _twin_class)
    _aiter_gemm: BlockGemm | None = None
    _aiter_m_major: bool | None = None
    if _c_fp8_call is not None:  # the whole call in C++ where it can run there (a bound shape), else as below
        def __call__(self, *args, **kwargs):
            if len(args) == 1 and not kwargs and not _is_compiling():
                out = _c_fp8_call(self, args[0])
                if out is not None:
                    return out
            return python_call(self, *args, **kwargs)
    elif python_call is not None:  # aiter_gemm.call_entry: forward without nn.Module.__call__'s two frames
        __call__ = python_call

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        params = self._parameters
        weight, scale, bias = params["weight"], params["weight_scale_inv"], params.get("bias")
        # The dtypes patch_linear checked can change under the twin (``model.to(torch.bfloat16)`` casts the fp8
        # weight): FP8Linear's own forward then runs, as it would unpatched. Two dtype reads per call.
        if weight.dtype == FP8 and scale.dtype == _F32:
            gemm = self.__dict__.get("_aiter_gemm")
            if _is_compiling() and gemm is None:  # first: dynamo folds it and traces only the custom op
                return torch.ops.aiter_gemm.fp8_block_linear(input, weight, scale, bias)
            reason = _input_reason(input, weight, bias)
            if reason is None:
                return fp8_block_linear(input, weight, scale, bias, gemm, self.__dict__.get("_aiter_m_major"))
        else:
            reason = unsupported_reason(self)
        if not _is_compiling():
            warned = self.__dict__.setdefault("_aiter_warned", set())
            if reason not in warned:
                warned.add(reason)
                log.warning("aiter_gemm: %s runs FP8Linear's own forward instead of gemm_a8w8_blockscale: %s "
                            "(warned once per module and reason)", self.__dict__.get("_aiter_name") or "FP8Linear",
                            reason)
        return super().forward(input)

    def __reduce_ex__(self, protocol: int):
        # The twin class is made at run time (no module attribute names it), so pickle finds it by its base class:
        # unpickling makes the same twin class of the base and restores the state (the original module included,
        # so unpatch_linear still puts it back).
        return _new_twin, (self._aiter_base,), self.__getstate__()


_CLASSES: dict[type, type] = {}


def _twin_class(base: type) -> type:
    """``Tuned<base>``, the one twin class of an ``FP8Linear`` class (made once per base)."""
    cls = _CLASSES.get(base)
    if cls is None:
        cls = _CLASSES[base] = type(f"Tuned{base.__name__}", (TunedFP8Mixin, base),
                                    {"__module__": __name__, "_aiter_base": base})
    return cls


def _new_twin(base: type) -> nn.Module:
    """An empty twin of ``base``, whose state unpickling then sets (``TunedFP8Mixin.__reduce_ex__``)."""
    cls = _twin_class(base)
    return cls.__new__(cls)


def from_fp8_linear(module: nn.Module, name: str | None = None, gemm: BlockGemm | None = None,
                    m_major: bool = False) -> nn.Module:
    """The block-scale twin of an ``FP8Linear`` (sharing its parameters; ``module`` is kept for
    :func:`aiter_gemm.nn.unpatch_linear`); ValueError saying why when the op cannot run it. ``gemm`` / ``m_major``:
    see :func:`fp8_block_linear`."""
    if not is_fp8_linear(module):
        raise TypeError(f"from_fp8_linear: expected transformers' FP8Linear, got {type(module).__qualname__}")
    why = unsupported_reason(module)
    if why is not None:
        raise ValueError(f"from_fp8_linear: {name or 'module'}: {why}")
    new = clone_module(module, _twin_class(type(module)), name)
    if gemm is not None:
        object.__setattr__(new, "_aiter_gemm", gemm)
    if m_major:
        object.__setattr__(new, "_aiter_m_major", True)
    return new
