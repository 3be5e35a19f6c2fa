"""transformers' MoE experts on :func:`aiter_gemm.fused_moe`: the ``"aiter_gemm"`` experts implementation.

Importing this module registers :func:`experts_forward` under :data:`IMPLEMENTATION` with transformers' experts
interfaces (``transformers.integrations.moe.ExpertsInterface``, and ``FP8ExpertsInterface`` where the fine-grained
FP8 integration has one), so ``model.set_experts_implementation("aiter_gemm")`` or ``experts_implementation=
"aiter_gemm"`` runs every experts module (``@use_experts_implementation`` classes such as ``Qwen3MoeExperts``: weights
``gate_up_proj`` (E, 2I, H) gate rows then up rows, ``down_proj`` (E, H, I)) on the op; FP8 experts with (128, 128)
float32 block scales and dynamic activations too. :func:`patch_moe` (also ``aiter_gemm.nn.patch_moe``) switches a
model's experts modules in one call. A module or call the op cannot take (:func:`unsupported_reason`: biases, a
transposed or interleaved layout, no gate, its own gating, an activation other than silu/gelu, expert parallelism,
dtypes other than bf16/fp16, ...) runs the implementation the module had before (:func:`patch_moe` records it; else
transformers' eager forward), warned once per cause. Under ``torch.compile`` the op is the ``aiter_gemm::fused_moe``
custom op; it has no host sync in CUDA-graph capture.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from aiter_gemm.dtypes import HALF_DTYPES as _HALF
from aiter_gemm.kernels.blockscale_format import FP8, SCALE_BLOCK
from aiter_gemm.logs import WarnOnce

log = logging.getLogger("aiter_gemm")

__all__ = ["IMPLEMENTATION", "activation_name", "experts_forward", "is_experts_module", "patch_moe", "register",
           "unsupported_reason"]

#: The name the experts implementation is registered under.
IMPLEMENTATION = "aiter_gemm"
_PLAIN = (nn.Parameter, torch.Tensor)
_FALLBACK = "_aiter_moe_fallback"  # instance attribute: the implementation patch_moe replaced
_warn = WarnOnce(log)
_is_compiling = torch.compiler.is_compiling


def _moe():
    import transformers.integrations.moe as moe

    return moe


def _fp8_interface():
    """transformers' FP8 experts interface (None where the installed version has none)."""
    try:
        from transformers.integrations import finegrained_fp8
    except ImportError:
        return None
    return getattr(finegrained_fp8, "ALL_FP8_EXPERTS_FUNCTIONS", None)


def register() -> None:
    """Register :func:`experts_forward` as :data:`IMPLEMENTATION` with transformers' experts interfaces (idempotent)."""
    _moe().ExpertsInterface.register(IMPLEMENTATION, experts_forward)
    fp8 = _fp8_interface()
    if fp8 is not None:
        type(fp8).register(IMPLEMENTATION, experts_forward)


def is_experts_module(module: nn.Module) -> bool:
    """Whether ``module`` is an experts module dispatched through transformers' experts interface (its class went
    through ``@use_experts_implementation``: the instance has ``has_gate`` and a config choosing the implementation)."""
    params = module._parameters
    return (hasattr(getattr(module, "config", None), "_experts_implementation")
            and hasattr(type(module).forward, "__wrapped__")
            and (hasattr(module, "has_gate") or "gate_up_proj" in params or "up_proj" in params))


def activation_name(module: nn.Module) -> str | None:
    """``silu`` / ``gelu`` (exact) when ``module.act_fn`` is one of those, else None."""
    act = getattr(module, "act_fn", None)
    name = type(act).__name__
    if name in ("SiLU", "SiLUActivation"):
        return "silu"
    if name == "GELUActivation" and getattr(act, "act", None) == torch.nn.functional.gelu:
        return "gelu"
    if name == "GELU" and getattr(act, "approximate", "none") == "none":
        return "gelu"
    return None


def _own_gate(module: nn.Module) -> str | None:
    """Why the module's gating is not ``act(gate) * up`` (None: it is)."""
    gate = getattr(type(module), "_apply_gate", None)
    if gate is None or gate is getattr(_moe(), "_default_apply_gate", None):  # older transformers: no _apply_gate
        return None
    if type(module).__name__ == "FP8Experts":  # its _apply_gate is act(gate) * up unless one of these is set
        extras = [a for a in ("gate_softcap", "swiglu_alpha", "limit") if getattr(module, a, None) is not None]
        return f"FP8Experts gating with {', '.join(extras)}" if extras else None
    return f"{type(module).__qualname__}._apply_gate is its own gating"


def _fp8_reason(module: nn.Module, w1: torch.Tensor, w2: torch.Tensor) -> str | None:
    """Why the op cannot take these FP8 experts (None: 128x128 float32 block scales, dynamic activations)."""
    block = getattr(module, "block_size", None)
    if block is None or [int(b) for b in block] != [SCALE_BLOCK, SCALE_BLOCK]:
        return f"FP8 block_size {None if block is None else list(block)}, not [{SCALE_BLOCK}, {SCALE_BLOCK}]"
    if getattr(module, "activation_scheme", "dynamic") != "dynamic":
        return f"FP8 activation_scheme {module.activation_scheme!r} (only dynamic)"
    for name, w in (("gate_up_proj", w1), ("down_proj", w2)):
        scale = module._parameters.get(name + "_scale_inv")
        want = (w.shape[0], -(-w.shape[1] // SCALE_BLOCK), -(-w.shape[2] // SCALE_BLOCK))
        if scale is None or scale.dtype != torch.float32 or tuple(scale.shape) != want:
            return (f"{name}_scale_inv is {getattr(scale, 'dtype', None)} {tuple(getattr(scale, 'shape', ()))}, not "
                    f"float32 {want} (one scale per {SCALE_BLOCK}x{SCALE_BLOCK} block)")
    return None


def unsupported_reason(module: nn.Module, hidden_states: torch.Tensor | None = None) -> str | None:
    """Why ``fused_moe`` cannot run this experts module (and this ``hidden_states``, if given); None: it can. Only
    module attributes and tensor metadata are read (no sync: graph-safe)."""
    for flag, why in (("has_bias", "biases"), ("is_transposed", "a transposed weight layout (E, H, 2I)"),
                      ("has_post_expert_norm", "a post-expert norm"), ("_is_expert_parallel", "expert parallelism")):
        if getattr(module, flag, False):
            return why
    if not getattr(module, "has_gate", True):
        return "no gate (up_proj only)"
    if not getattr(module, "is_concatenated", True):
        return "gate and up interleaved, not [gate; up] rows"
    why = _own_gate(module)
    if why is not None:
        return why
    if activation_name(module) is None:
        return f"activation {type(getattr(module, 'act_fn', None)).__name__} (fused_moe runs silu and exact gelu)"
    w1, w2 = module._parameters.get("gate_up_proj"), module._parameters.get("down_proj")
    if w1 is None or w2 is None or type(w1) not in _PLAIN or type(w2) not in _PLAIN:
        return f"weights are {type(w1).__name__}/{type(w2).__name__}, not plain gate_up_proj/down_proj tensors"
    if not (w1.is_contiguous() and w2.is_contiguous()):
        return "gate_up_proj or down_proj is not contiguous"
    if w1.dtype == FP8:
        why = _fp8_reason(module, w1, w2)
        if why is not None:
            return why
    elif w1.dtype not in _HALF or w2.dtype != w1.dtype:
        return f"weights are {w1.dtype}/{w2.dtype}, not both bf16 or fp16"
    if hidden_states is not None:
        if type(hidden_states) is not torch.Tensor or hidden_states.dim() != 2:
            return f"hidden_states is a {type(hidden_states).__name__} of {hidden_states.dim()} dims, not (T, H)"
        if hidden_states.dtype not in _HALF or (w1.dtype != FP8 and hidden_states.dtype != w1.dtype):
            return f"hidden_states dtype {hidden_states.dtype} with {w1.dtype} weights"
        if hidden_states.device != w1.device or hidden_states.device.type not in ("cuda", "cpu"):
            return f"hidden_states on {hidden_states.device}, weights on {w1.device}"
    return None


def _fallback(module: nn.Module) -> Callable:
    """The implementation the module falls back to: the one :func:`patch_moe` replaced, else the eager forward."""
    eager = type(module).forward.__wrapped__
    name = module.__dict__.get(_FALLBACK) or "eager"
    if name in ("eager", IMPLEMENTATION):
        return eager
    fp8 = _fp8_interface()
    interface = fp8 if fp8 is not None and type(module).__name__ == "FP8Experts" else _moe().ALL_EXPERTS_FUNCTIONS
    return interface.get_interface(name, eager)


def experts_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' experts-forward signature on :func:`aiter_gemm.fused_moe`; calls it cannot take run the
    module's previous implementation (:func:`unsupported_reason`), warned once per cause."""
    why = unsupported_reason(self, hidden_states)
    if why is not None:
        if not _is_compiling():  # logging in a traced region would break the graph
            _warn(why, "aiter_gemm: %s (%s) runs its own experts forward, not fused_moe: %s (warned once per cause)",
                  type(self).__qualname__, module_label(self), why)
        return _fallback(self)(self, hidden_states, top_k_index, top_k_weights)
    from aiter_gemm.ops.fused_moe import fused_moe

    params = self._parameters
    w1, w2 = params["gate_up_proj"], params["down_proj"]
    s1 = s2 = None
    if w1.dtype == FP8:
        s1, s2 = params["gate_up_proj_scale_inv"], params["down_proj_scale_inv"]
    if top_k_weights.dtype not in (torch.float32, hidden_states.dtype):
        top_k_weights = top_k_weights.float()
    # AITER's positional order (expert_mask, activation, quant_type, doweight_stage1, w1_scale, w2_scale): a
    # positional call keys fastest in the C++ entry
    return fused_moe(hidden_states.contiguous(), w1, w2, top_k_weights.contiguous(), top_k_index.contiguous(), None,
                     activation_name(self), None, False, s1, s2)


def module_label(module: nn.Module) -> str:
    """``E=.., I=.., H=..`` of an experts module, for warnings."""
    w = module._parameters.get("down_proj")
    return "no down_proj" if w is None else f"E={w.shape[0]}, H={w.shape[1]}, I={w.shape[2]}"


def patch_moe(model: nn.Module) -> list[str]:
    """Run every experts module of ``model`` that the op can take on :func:`aiter_gemm.fused_moe` (sets its config's
    experts implementation to :data:`IMPLEMENTATION`, recording the one it replaces as the fallback); return their
    qualified names. Modules it cannot take keep their implementation, warned once per cause; one that shares a
    config with a switched module runs its recorded implementation through :func:`experts_forward`'s fallback."""
    register()
    switched: list[str] = []
    for name, module in model.named_modules():
        if not is_experts_module(module):
            continue
        current = module.config._experts_implementation
        if current != IMPLEMENTATION:
            module.__dict__[_FALLBACK] = current
        why = unsupported_reason(module)
        if why is not None:
            _warn(why, "aiter_gemm: patch_moe leaves %s (%s) on its own experts forward, not fused_moe: %s "
                  "(warned once per cause)", name, type(module).__qualname__, why)
            continue
        switched.append(name)
    for name in switched:
        model.get_submodule(name).config._experts_implementation = IMPLEMENTATION
    return switched


register()
