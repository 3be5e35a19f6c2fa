"""Backend registry: (op's backend package, libtype) -> :class:`~aiter_gemm.backends.base.Backend`, imported lazily.

Each op names the package holding its backends (:attr:`aiter_gemm.op.OpSpec.backends`): ``aiter_gemm.backends``
for ``gemm_a16w16``, ``aiter_gemm.backends.a8w8_blockscale`` for the block-scale op. A backend is found by
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

from aiter_gemm.backends.base import Backend, GemmProblem, Runner, Solution

__all__ = [
    "A16W16", "Backend", "GemmProblem", "Runner", "Solution", "UnavailableBackend",
    "get_backend", "known_backends", "loaded_backends", "available_backends", "register_backend",
    "unregister_backend",
]

log = logging.getLogger(__name__)

#: The backend package of ``gemm_a16w16`` (this package); other ops name a sub-package.
A16W16 = __name__
_NOT_BACKENDS = frozenset({"base"})
_lock = threading.Lock()
_loaded: dict[tuple[str, str], Backend] = {}
_registered: dict[tuple[str, str], Backend] = {}


class UnavailableBackend(Backend):
    """Stands in for a libtype this process cannot run (no module, or its import failed)."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self._reason = reason

    def unavailable_reason(self) -> str | None:
        return self._reason

    def prepare(self, problem, solution, device):  # noqa: ANN001 - never called for an unavailable backend
        return None


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
