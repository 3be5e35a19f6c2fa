"""``nn.Linear`` through the tuned dispatch: :class:`TunedLinear` and :func:`patch_linear` / :func:`unpatch_linear`.

Use it on a model you already have (a Hugging Face model, say), without editing its code::

    from aiter_gemm.nn import patch_linear, unpatch_linear

    names = patch_linear(model, exclude=["lm_head"])  # swaps the model's nn.Linear modules in place
    ...                                              # eager, torch.compile(fullgraph=True) or CUDA graphs
    unpatch_linear(model)                            # the original module objects come back

A swapped module is a :class:`TunedLinear` (a subclass of ``nn.Linear``, so ``isinstance`` checks and state dicts are
unchanged) holding the very same ``Parameter`` objects as the module it replaces: nothing is copied, and weight
updates made through either module are seen by both. Its forward is ``aiter_gemm.gemm_a16w16(x, weight, bias)``
(which goes through the ``aiter_gemm::gemm_a16w16`` custom op when ``torch.compile`` traces it). Calls the tuned
dispatch does not cover (activation dtype other than the weight's, autocast, operands on different devices, fp8 or
tensor-subclass weights) run ``F.linear`` instead, with one warning per module and reason on logger ``aiter_gemm``.
Under ``torch.compile`` the ambient autocast state is not visible to the module (dynamo folds the query to False), so
compile a patched model in its own dtype rather than under autocast.
"""

from __future__ import annotations

import fnmatch
import logging
import sys
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from aiter_gemm import gemm_a16w16
from aiter_gemm.call_entry import FP8_INTEGRATION, clone_module, python_call
from aiter_gemm.call_entry import c_call as _c_call
from aiter_gemm.op_entry import EXT as _EXT
from aiter_gemm.ops.a16w16 import GEMM_A16W16_ENTRY
from aiter_gemm.ops.a16w16 import call_key as _call_key
from aiter_gemm.ops.a16w16 import linear_entry as _linear_entry
from aiter_gemm.ops.a16w16 import run_linear_entry as _run_linear_entry

log = logging.getLogger("aiter_gemm")

__all__ = ["TunedLinear", "clone_module", "patch_linear", "patch_moe", "unpatch", "unpatch_linear"]

#: ``include`` / ``exclude`` of :func:`patch_linear`: glob pattern(s), or a predicate on (qualified name, module).
Selector = str | Iterable[str] | Callable[[str, nn.Module], bool] | None

_Tensor = torch.Tensor
_Parameter = nn.Parameter
_is_compiling = torch.compiler.is_compiling
_ABSENT = object()
if _EXT is not None and GEMM_A16W16_ENTRY.c_fn is not None:
    _EXT.setup_linear(GEMM_A16W16_ENTRY.c_fn)  # the op the C++ linear() and call() run: TunedLinear's forward
_c_linear = None if _EXT is None else _EXT.linear
_calls_get = GEMM_A16W16_ENTRY.calls.get  # gemm_a16w16's per-call cache (cleared in place on reload)


# Float dtypes gemm_a16w16 takes without scales (fp8 needs them; integer dtypes are not GEMM inputs here).
_DISPATCH_DTYPES = frozenset({torch.bfloat16, torch.float16, torch.float32, torch.float64})
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (
    lambda: torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled())


def _unsupported(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> str | None:
    """Why ``gemm_a16w16`` must not run this call (``None``: it can). Only tensor metadata: no sync, graph-safe.
    The slow path of :meth:`TunedLinear.forward`, which checks the same conditions inline first."""
    if type(weight) is not _Parameter and type(weight) is not _Tensor:
        return f"weight is a tensor subclass ({type(weight).__name__}), e.g. a quantized or sharded weight"
    if type(x) is not _Tensor:
        return f"input is a tensor subclass ({type(x).__name__})"
    if _any_autocast():  # first: under autocast, dtypes that differ are normal
        return "autocast is enabled (F.linear applies its casts)"
    wdt = weight.dtype
    if x.dtype != wdt:
        return f"input dtype {x.dtype} differs from weight dtype {wdt}"
    if wdt not in _DISPATCH_DTYPES:
        return f"weight dtype {wdt} is not a 16/32/64-bit float (fp8 needs gemm_a16w16's scales)"
    if bias is not None and (bias.dtype != wdt or bias.device != weight.device):
        return f"bias is {bias.dtype} on {bias.device}, weight {wdt} on {weight.device}"
    if x.device != weight.device:
        return f"input is on {x.device}, weight on {weight.device}"
    if not (x.is_cuda or x.is_cpu):
        return f"device type {x.device.type!r} is not dispatched (cuda and cpu are)"
    return None


class TunedLinear(nn.Linear):
    """``nn.Linear`` whose forward runs ``aiter_gemm.gemm_a16w16``: same parameters, state-dict keys and results (up
    to the chosen kernel's rounding), so models and checkpoints need no change. Build one with :meth:`from_linear`."""

    # nn.Module.__call__ runs _wrapped_call_impl and _call_impl (two Python frames, eight hook checks) before forward,
    # a cost an eager decode step pays on each of its hundreds of linear calls (docs/exploration.md has the figures).
    # The call entry makes the same checks (no hooks here or global, forward not replaced on the instance, no
    # Module.compile(), no JIT trace) and runs forward itself: in C++ where the extension is built (which also runs
    # the cached plain decision; a call it declines, e.g. another decision, goes on to the Python form), else in
    # Python. Every other call is nn.Module.__call__'s (looked up per call: torch.fx patches it).
    if _c_call is not None:
        def __call__(self, *args, **kwargs):
            if len(args) == 1 and not kwargs and not _is_compiling():
                out = _c_call(self, args[0])
                if out is not None:
                    return out
            return python_call(self, *args, **kwargs)
    elif python_call is not None:
        __call__ = python_call

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # The C++ eager fast path (aiter_gemm/eager_ext.py): the cached plain F.linear case of the entry below, or
        # None. Compiling first: dynamo folds it and never traces the extension.
        if _c_linear is not None and not _is_compiling():
            out = _c_linear(self, input)
            if out is not None:
                return out
        # Parameters straight from the parameter dict: ``self.weight`` goes through Module.__getattr__, ~0.55 us
        # each on CPU, which nn.Linear pays twice per call and we need not (host-bound eager decode runs ~200
        # linears per token). A parametrized or re-registered weight is not in the dict: the attribute then.
        params = self._parameters
        weight, bias = params.get("weight"), params.get("bias", _ABSENT)
        if weight is None or bias is _ABSENT:
            weight, bias = self.weight, self.bias
        compiling = _is_compiling()  # first: dynamo folds it, and traces none of the eager-only lookup
        # gemm_a16w16's own cache entry, under its one key (shapes, dtypes and devices of input, weight and bias): an
        # entry exists only for operands that passed its checks, so a hit leaves the checks gemm_a16w16 does not
        # make (tensor subclasses, fp8 weights, device types, autocast). A reload, a converted parameter, another
        # input shape, dtype or device: another key, decided on its first call below. A call wanting gradients
        # runs the entry too: run_linear_entry sends it to the custom op where the decision is not plain F.linear.
        if not compiling and type(input) is _Tensor and (type(weight) is _Parameter or type(weight) is _Tensor):
            entry = _calls_get(_call_key(input, weight, bias))
            if (entry is not None and weight.dtype in _DISPATCH_DTYPES and (input.is_cuda or input.is_cpu)
                    and not _any_autocast()):
                return _run_linear_entry(entry, input, weight, bias)
        # The checks of _unsupported, cheapest form first.
        if ((type(weight) is _Parameter or type(weight) is _Tensor) and type(input) is _Tensor
                and input.dtype == weight.dtype and weight.dtype in _DISPATCH_DTYPES
                and input.device == weight.device and (input.is_cuda or input.is_cpu) and not _any_autocast()
                and (bias is None or (bias.dtype == weight.dtype and bias.device == weight.device))):
            reason = None
        else:
            reason = _unsupported(input, weight, bias)
        if reason is None:
            if compiling:
                return gemm_a16w16(input, weight, bias)
            return _run_linear_entry(_linear_entry(input, weight, bias), input, weight, bias)
        if not compiling:  # logging inside a traced region would break fullgraph=True
            self._warn_fallback(reason)
        return F.linear(input, weight, bias)

    def _warn_fallback(self, reason: str) -> None:
        warned = self.__dict__.setdefault("_aiter_warned", set())
        if reason not in warned:
            warned.add(reason)
            log.warning("aiter_gemm: %s runs F.linear instead of gemm_a16w16: %s (warned once per module and reason)",
                        self.__dict__.get("_aiter_name") or f"TunedLinear({self.in_features}, {self.out_features})",
                        reason)

    @classmethod
    def from_linear(cls, linear: nn.Linear, name: str | None = None) -> TunedLinear:
        """A ``TunedLinear`` sharing ``linear``'s Parameter objects, buffers, hooks and attributes (nothing copied);
        ``linear`` itself is kept (see :func:`unpatch_linear`). ``name`` only labels fallback warnings."""
        if type(linear) is not nn.Linear:
            raise TypeError(f"TunedLinear.from_linear: expected exactly nn.Linear, got {type(linear).__qualname__}")
        return clone_module(linear, cls, name)


def _fp8_integration():
    """:mod:`aiter_gemm.fp8_linear` when transformers' fine-grained FP8 integration is loaded (a model can only hold
    its FP8Linear modules then), else None: ``import aiter_gemm.nn`` imports neither Triton nor transformers."""
    if FP8_INTEGRATION not in sys.modules:
        return None
    from aiter_gemm import fp8_linear

    return fp8_linear


def _is_swapped(module: nn.Module) -> bool:
    """Whether ``module`` is one :func:`patch_linear` made (TunedLinear, or an FP8Linear on the block-scale op)."""
    return isinstance(module, TunedLinear) or getattr(type(module), "_aiter_fp8_swapped", False)


def _matcher(selector: Selector, what: str) -> Callable[[str, nn.Module], bool] | None:
    """``selector`` as a predicate. A pattern matches a qualified name whole or any dotted suffix of it, so
    ``lm_head`` matches ``lm_head`` and ``base_model.model.lm_head``, ``q_proj`` every q_proj."""
    if selector is None:
        return None
    if callable(selector):
        return selector
    patterns = [selector] if isinstance(selector, str) else list(selector)
    for p in patterns:
        if not isinstance(p, str):
            raise TypeError(f"patch_linear: {what} must be glob pattern strings or a callable, got {p!r}")

    def match(name: str, module: nn.Module) -> bool:
        return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, "*." + p) for p in patterns)

    return match


def _children(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module, str, nn.Module]]:
    """(qualified name, parent, attribute name, child) for every place a module sits, in ``named_modules`` order,
    a module shared by two parents at both places. The caller may replace the child just yielded."""
    for cname, child in list(module._modules.items()):
        if child is not None:
            yield prefix + cname, module, cname, child
            yield from _children(child, f"{prefix}{cname}.")


def patch_linear(model: nn.Module, include: Selector = None, exclude: Selector = None) -> list[str]:
    """Replace, in place, every module of ``model`` whose type is exactly ``nn.Linear`` (other subclasses such as
    quantized linears are left alone) by a :class:`TunedLinear` sharing its parameters, and every transformers
    ``FP8Linear`` with 128x128 float32 block scales and dynamic activations by its block-scale twin
    (:mod:`aiter_gemm.fp8_linear`; other FP8 layouts are left alone with one warning each); return the qualified
    names swapped. ``include`` / ``exclude``: glob patterns (see :func:`_matcher`) or a ``(name, module) -> bool``
    predicate; exclude wins. A module reached by two names is swapped once and stays shared."""
    if type(model) is nn.Linear:
        raise ValueError("patch_linear: the root module is an nn.Linear and cannot be replaced in place; "
                         "use TunedLinear.from_linear(module)")
    inc, exc = _matcher(include, "include"), _matcher(exclude, "exclude")
    swapped: list[str] = []
    made: dict[int, TunedLinear] = {}
    skipped: dict[str, int] = {}
    fp8 = _fp8_integration()
    for name, parent, attr, child in _children(model):
        is_fp8 = fp8 is not None and fp8.is_fp8_linear(child)
        if type(child) is not nn.Linear and not is_fp8:
            if isinstance(child, nn.Linear) and not _is_swapped(child):
                kind = type(child).__qualname__
                skipped[kind] = skipped.get(kind, 0) + 1
            continue
        if (inc is not None and not inc(name, child)) or (exc is not None and exc(name, child)):
            continue
        if "forward" in child.__dict__:  # an instance-level forward wrapper (accelerate offload hooks, ...)
            log.warning("aiter_gemm: patch_linear leaves %s alone: its forward is replaced on the instance", name)
            continue
        new = made.get(id(child))
        if new is None and is_fp8:
            why = fp8.unsupported_reason(child)
            if why is not None:
                log.warning("aiter_gemm: patch_linear leaves %s (FP8Linear) alone: %s", name, why)
                continue
            new = made[id(child)] = fp8.from_fp8_linear(child, name)
        elif new is None:
            new = made[id(child)] = TunedLinear.from_linear(child, name)
        parent._modules[attr] = new
        swapped.append(name)
    if skipped:
        log.info("aiter_gemm: patch_linear left nn.Linear subclasses alone: %s",
                 ", ".join(f"{k} x{v}" for k, v in sorted(skipped.items())))
    return swapped


def unpatch_linear(model: nn.Module) -> list[str]:
    """Put back the original modules that :func:`patch_linear` replaced (the identical objects); returns the
    qualified names restored. If a parameter of a patched module was reassigned meanwhile, the original gets it."""
    restored: list[str] = []
    for name, parent, attr, child in _children(model):
        original = child.__dict__.get("_aiter_original") if _is_swapped(child) else None
        if original is None:
            continue
        for store in ("_parameters", "_buffers"):
            mine, theirs = getattr(child, store), getattr(original, store)
            if any(theirs.get(k) is not v for k, v in mine.items()):
                theirs.update(mine)
        parent._modules[attr] = original
        restored.append(name)
    return restored


unpatch = unpatch_linear


def patch_moe(model: nn.Module) -> list[str]:
    """Run ``model``'s transformers experts modules on ``aiter_gemm.fused_moe`` (:func:`aiter_gemm.hf_moe.patch_moe`,
    imported here on first use: it imports transformers); returns the qualified names switched."""
    from aiter_gemm import hf_moe

    return hf_moe.patch_moe(model)
