"""The one registry: ops by name, their public entry points, and their backends, each imported on first use.

Ops: :data:`OPS` maps an op's name to the module under :mod:`aiter_gemm.ops` that defines and registers its
:class:`~aiter_gemm.opspec.OpSpec` (the block-scale op's module imports Triton, which ``import aiter_gemm`` must
not); :data:`PUBLIC` names the entry points ``aiter_gemm`` exposes from each op module, imported on first access.

Backends: (op's backend package, libtype) -> :class:`~aiter_gemm.backends.base.Backend`. Each op names the package
holding its backends (:attr:`aiter_gemm.opspec.OpSpec.backends`): ``aiter_gemm.backends`` for ``gemm_a16w16``,
``aiter_gemm.backends.a8w8_blockscale`` for the block-scale op. A backend is found by
convention as module ``<package>.<libtype>`` exposing ``BACKEND``; adding one is adding that file (modules named
``base`` or starting with ``_``, and sub-packages, are not backends). :func:`register_backend` adds or replaces one
at run time (tests, third-party backends). A module that fails to import (missing optional dependency) yields an
:class:`UnavailableBackend` carrying the reason.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from aiter_gemm.backends.base import Backend, UnavailableBackend

if TYPE_CHECKING:
    from aiter_gemm.opspec import OpSpec

__all__ = [
    "A16W16", "OPS", "PUBLIC", "LazyRegistry", "UnavailableBackend", "available_backends", "get_backend",
    "known_backends", "loaded_backends", "op_spec", "public_attribute", "register_backend", "register_op",
    "unregister_backend",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


class LazyRegistry(Generic[T]):
    """Named entries registered by the modules that define them, imported on first lookup by name (``modules``: name
    -> module), so a process loads only what it uses. ``name_of`` gives an entry's name."""

    def __init__(self, what: str, modules: Mapping[str, str], name_of: Callable[[T], str]) -> None:
        self.what, self.modules, self.name_of = what, dict(modules), name_of
        self._entries: dict[str, T] = {}

    def register(self, entry: T) -> T:
        """Make ``entry`` findable by its name (its module calls this at import; plugins may add more)."""
        self._entries[self.name_of(entry)] = entry
        return entry

    def get(self, name: str) -> T:
        """The entry called ``name`` (importing its module if needed); KeyError listing the known names."""
        if name not in self._entries and name in self.modules:
            importlib.import_module(self.modules[name])
        try:
            return self._entries[name]
        except KeyError:
            known = sorted(set(self.modules) | set(self._entries))
            raise KeyError(f"no {self.what} named {name!r}; known: {known}") from None


# ---- ops -----------------------------------------------------------------------------------------------------
#: Ops this package defines: name -> the module under aiter_gemm/ops/ that defines and registers it.
OPS: LazyRegistry[OpSpec] = LazyRegistry("op", {"gemm_a16w16": "aiter_gemm.ops.a16w16",
                                                 "gemm_a8w8_blockscale": "aiter_gemm.ops.a8w8_blockscale",
                                                 "fused_moe": "aiter_gemm.ops.fused_moe"},
                                          lambda spec: spec.name)
register_op = OPS.register
op_spec = OPS.get
#: Public names of ``aiter_gemm`` that an op module defines, imported on first access (``aiter_gemm.__getattr__``).
PUBLIC: dict[str, str] = {"gemm_a8w8_blockscale": "gemm_a8w8_blockscale",
                          "get_GEMM_A8W8_BLOCKSCALE_config": "gemm_a8w8_blockscale",
                          "fused_moe": "fused_moe", "get_fused_moe_config": "fused_moe"}


def public_attribute(name: str) -> Any:
    """``aiter_gemm.<name>`` for a name an op module defines (:data:`PUBLIC`); AttributeError otherwise."""
    op = PUBLIC.get(name)
    if op is None:
        raise AttributeError(f"module 'aiter_gemm' has no attribute {name!r}")
    return getattr(importlib.import_module(OPS.modules[op]), name)


# ---- backends ------------------------------------------------------------------------------------------------
#: The backend package of ``gemm_a16w16``; other ops name a sub-package of it.
A16W16 = "aiter_gemm.backends"
_NOT_BACKENDS = frozenset({"base"})
_lock = threading.Lock()
_loaded: dict[tuple[str, str], Backend] = {}
_registered: dict[tuple[str, str], Backend] = {}



def _module_names(package: str) -> list[str]:
    path = importlib.import_module(package).__path__
    return sorted(m.name for m in pkgutil.iter_modules(path)
                  if not m.ispkg and m.name not in _NOT_BACKENDS and not m.name.startswith("_"))


def _load(package: str, name: str) -> Backend:
    if (package, name) in _registered:
        return _registered[(package, name)]
    if name not in _module_names(package):
        return UnavailableBackend(name, f"no backend module {package}.{name}")
    try:
        module = importlib.import_module(f"{package}.{name}")
    except Exception as exc:  # an optional dependency missing or broken must not break dispatch
        return UnavailableBackend(name, f"import of {package}.{name} failed: {exc!r}")
    backend = getattr(module, "BACKEND", None)
    if not isinstance(backend, Backend) or backend.name != name:
        return UnavailableBackend(name, f"{package}.{name} defines no BACKEND named {name!r}")
    return backend


def get_backend(name: str, package: str = A16W16) -> Backend:
    """The backend for ``libtype`` ``name`` of the op whose backends live in ``package`` (an
    :class:`UnavailableBackend` if there is none here)."""
    backend = _loaded.get((package, name))
    if backend is None:
        with _lock:
            backend = _loaded.get((package, name))
            if backend is None:
                backend = _loaded[(package, name)] = _load(package, name)
    return backend


def loaded_backends(package: str = A16W16) -> list[Backend]:
    """The backends of ``package`` imported so far, through the registry or directly (imports nothing)."""
    found = {id(b): b for (p, _), b in (*_loaded.items(), *_registered.items()) if p == package}
    for name in _module_names(package):
        backend = getattr(sys.modules.get(f"{package}.{name}"), "BACKEND", None)
        if isinstance(backend, Backend):
            found[id(backend)] = backend
    return list(found.values())


def known_backends(package: str = A16W16) -> list[str]:
    """Every libtype of ``package`` with a module or a run-time registration (imports no backend module)."""
    return sorted(set(_module_names(package)) | {n for p, n in _registered if p == package})


def available_backends(package: str = A16W16) -> list[Backend]:
    """Every backend of ``package`` that can run here (imports all its modules: not for the hot path)."""
    return [b for b in (get_backend(n, package) for n in known_backends(package)) if b.is_available()]


def register_backend(backend: Backend, package: str = A16W16) -> None:
    """Add or replace a backend under ``backend.name``; dispatchers must ``reload()`` to see it in cached decisions."""
    if not backend.name:
        raise ValueError("backend.name must be a non-empty libtype string")
    with _lock:
        _registered[(package, backend.name)] = backend
        _loaded[(package, backend.name)] = backend


def unregister_backend(name: str, package: str = A16W16) -> None:
    with _lock:
        _registered.pop((package, name), None)
        _loaded.pop((package, name), None)
