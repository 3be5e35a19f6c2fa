"""The module call entry: ``module(input)`` without ``nn.Module.__call__``'s two Python frames and eight hook checks
where that would call just ``forward``, for the modules :func:`aiter_gemm.nn.patch_linear` swaps in (TunedLinear, the
FP8Linear twin of :mod:`aiter_gemm.fp8_linear`), and what both of those modules share: :func:`clone_module` (how a
swapped module is made) and :data:`FP8_INTEGRATION`.

The entry is in C++ where the extension is built (:data:`c_call`, which also runs TunedLinear's remembered decision)
and in Python otherwise (:data:`python_call`). Both check the hook stores of the installed torch, enumerated from
torch itself at set-up (:func:`hook_stores`); a torch with a store the entry does not know keeps
``nn.Module.__call__`` (:func:`call_internals_error`), logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from aiter_gemm.op_entry import EXT

log = logging.getLogger("aiter_gemm")

__all__ = ["CALL_HOOKS", "FLAG_HOOKS", "FP8_INTEGRATION", "GLOBAL_CALL_HOOKS", "NOT_CALL_HOOKS", "c_call",
           "call_internals_error", "clone_module", "hook_stores", "python_call", "python_call_entry",
           "setup_call_entry"]

#: transformers' fine-grained FP8 integration (its ``FP8Linear``: fp8 weight, 128x128 block scales), which
#: :func:`aiter_gemm.nn.patch_linear` puts on ``gemm_a8w8_blockscale`` (:mod:`aiter_gemm.fp8_linear`).
FP8_INTEGRATION = "transformers.integrations.finegrained_fp8"

_Module = nn.Module
_is_compiling = torch.compiler.is_compiling
_ABSENT = object()

#: The hook stores of torch's ``nn.Module`` the call entry knows, by what ``Module.__call__`` does with them.
#: ``CALL``: one non-empty makes ``Module.__call__`` run more than ``forward`` (the entry then declines the call);
#: ``FLAG``: read only for hooks of a ``CALL`` store; ``NOT_CALL``: never read by ``Module.__call__``.
CALL_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
FLAG_HOOKS = ("_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs",
              "_is_full_backward_hook")
NOT_CALL_HOOKS = ("_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                  "_load_state_dict_post_hooks", "_buffer_registration_hooks", "_module_registration_hooks",
                  "_parameter_registration_hooks")


def hook_stores(module_impl=None) -> tuple[list[str], dict[str, object]]:
    """The hook stores of the installed torch, from torch itself: the attributes of a fresh ``nn.Module`` whose
    name holds ``hook``, and the module globals ``_global_*hook*`` of ``torch.nn.modules.module`` (name -> object,
    the ``_global`` prefix dropped)."""
    from torch.nn.modules import module as impl

    impl = impl if module_impl is None else module_impl
    own = sorted(name for name in vars(_Module()) if "hook" in name)
    glob = {name[len("_global"):]: value for name, value in vars(impl).items()
            if name.startswith("_global_") and "hook" in name}
    return own, glob


def call_internals_error(own: list[str], glob: dict[str, object]) -> str | None:
    """Why the call entry must not stand in for ``Module.__call__`` on this torch (None: the stores are the ones it
    knows): a hook store it does not know, or one it checks that is missing or not a dict."""
    known = set(CALL_HOOKS) | set(FLAG_HOOKS) | set(NOT_CALL_HOOKS)
    unknown = sorted({*own, *glob} - known)
    if unknown:
        return f"torch's nn.Module has hook stores this entry does not know: {unknown}"
    missing = [n for n in CALL_HOOKS if n not in own or not isinstance(glob.get(n), dict)]
    if missing:
        return f"torch's nn.Module lacks the hook stores {missing} (per module and global) this entry checks"
    if not hasattr(_Module, "_compiled_call_impl") or "_parameters" not in vars(_Module()):
        return "torch's nn.Module has no _compiled_call_impl / _parameters"
    return None


def setup_call_entry() -> tuple[Callable | None, tuple | None]:
    """(the extension's ``call``, torch's global hook stores the entry checks) once the installed torch's hook
    stores are checked to be the ones it knows (:func:`call_internals_error`); the C++ ``call`` is None without the
    extension (the Python form then checks the same stores), both None on a torch whose internals differ
    (``Module.__call__`` then runs every call)."""
    own, glob = hook_stores()
    why = call_internals_error(own, glob)
    stores = None if why is not None else tuple(glob[name] for name in CALL_HOOKS)
    if stores is not None and EXT is not None:
        try:
            EXT.setup_call(CALL_HOOKS, stores)
        except (TypeError, ValueError) as exc:
            why, stores = str(exc), None
    if why is not None:
        log.info("aiter_gemm: TunedLinear calls go through nn.Module.__call__ (%s)", why)
        return None, None
    return (None if EXT is None else EXT.call), stores


def python_call_entry(global_stores: tuple | None) -> Callable | None:
    """The call entry's Python form (a ``__call__`` for nn.Module subclasses: TunedLinear without the extension, the
    FP8Linear twin always), making the C++ entry's checks on the same stores: ``self.forward(input)`` where
    ``nn.Module.__call__`` would call just that, else ``nn.Module.__call__``. None where the set-up check failed."""
    if global_stores is None:
        return None
    g_fwd, g_pre, g_bwd, g_bpre = global_stores  # torch's dicts, filled in place as hooks are registered
    n_fwd, n_pre, n_bwd, n_bpre = CALL_HOOKS
    tracing = torch._C._get_tracing_state

    def __call__(self, *args, **kwargs):
        d = self.__dict__  # a store missing here (not a regular module): _ABSENT is true, Module.__call__ decides
        if (len(args) == 1 and not kwargs and not _is_compiling() and not (g_fwd or g_pre or g_bwd or g_bpre)
                and not (d.get(n_fwd, _ABSENT) or d.get(n_pre, _ABSENT) or d.get(n_bwd, _ABSENT)
                         or d.get(n_bpre, _ABSENT))
                and "forward" not in d and d.get("_compiled_call_impl") is None and not tracing()):
            return self.forward(args[0])
        return _Module.__call__(self, *args, **kwargs)

    return __call__


#: The C++ call entry (``module(input)`` of a bare module whose remembered decision it runs, else None), and torch's
#: global hook stores both forms check; None where the extension is absent or the set-up check failed.
c_call, GLOBAL_CALL_HOOKS = setup_call_entry()
#: The Python call entry, a ``__call__`` for nn.Module subclasses; None where the set-up check failed.
python_call = python_call_entry(GLOBAL_CALL_HOOKS)


def clone_module(module: nn.Module, cls: type, name: str | None) -> nn.Module:
    """A ``cls`` instance sharing ``module``'s Parameter objects, buffers, hooks and attributes (own containers
    holding the same objects: nothing copied), remembering ``module`` for :func:`aiter_gemm.nn.unpatch_linear`;
    ``name`` labels warnings. How every module :func:`aiter_gemm.nn.patch_linear` swaps in is made."""
    new = cls.__new__(cls)
    state = dict(module.__dict__)
    for key, val in state.items():  # own containers (parameter dict, hook dicts, ...) holding the same objects
        if isinstance(val, (dict, set)):
            state[key] = type(val)(val)
    state.pop("_aiter_warned", None)
    new.__dict__.update(state)
    # Plain attributes, not submodules: invisible to named_modules(), state_dict() and .to().
    object.__setattr__(new, "_aiter_original", module)
    object.__setattr__(new, "_aiter_name", name)
    return new
