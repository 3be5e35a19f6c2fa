"""Backend registry: libtype name -> :class:`~aiter_gemm.backends.base.Backend`, imported lazily.

A backend is found by convention as module ``aiter_gemm.backends.<libtype>`` exposing ``BACKEND``; adding one is
adding that file (modules named ``base`` or starting with ``_`` are not backends). :func:`register_backend`
adds or replaces one at run time (tests, third-party backends). A module
that fails to import (missing optional dependency) yields an :class:`UnavailableBackend` carrying the reason.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys
import threading

from aiter_gemm.backends.base import Backend, GemmProblem, Runner, Solution

__all__ = [
    "Backend", "GemmProblem", "Runner", "Solution", "UnavailableBackend",
    "get_backend", "known_backends", "loaded_backends", "available_backends", "register_backend", "unregister_backend",
]

log = logging.getLogger(__name__)

_NOT_BACKENDS = frozenset({"base"})
_lock = threading.Lock()
_loaded: dict[str, Backend] = {}
_registered: dict[str, Backend] = {}


class UnavailableBackend(Backend):
    """Stands in for a libtype this process cannot run (no module, or its import failed)."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self._reason = reason

    def is_available(self) -> bool:
        return False

    def unavailable_reason(self) -> str:
        return self._reason

    def prepare(self, problem, solution, device):  # noqa: ANN001 - never called for an unavailable backend
        return None


def _module_names() -> list[str]:
    return sorted(
        m.name for m in pkgutil.iter_modules(__path__) if m.name not in _NOT_BACKENDS and not m.name.startswith("_")
    )


def _load(name: str) -> Backend:
    if name in _registered:
        return _registered[name]
    if name not in _module_names():
        return UnavailableBackend(name, f"no backend module aiter_gemm.backends.{name}")
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except Exception as exc:  # an optional dependency missing or broken must not break dispatch
        return UnavailableBackend(name, f"import of aiter_gemm.backends.{name} failed: {exc!r}")
    backend = getattr(module, "BACKEND", None)
    if not isinstance(backend, Backend) or backend.name != name:
        return UnavailableBackend(name, f"aiter_gemm.backends.{name} defines no BACKEND named {name!r}")
    return backend


def get_backend(name: str) -> Backend:
    """The backend for ``libtype`` ``name`` (an :class:`UnavailableBackend` if there is none here)."""
    backend = _loaded.get(name)
    if backend is None:
        with _lock:
            backend = _loaded.get(name)
            if backend is None:
                backend = _loaded[name] = _load(name)
    return backend


def loaded_backends() -> list[Backend]:
    """The backends imported so far, through the registry or directly (imports nothing)."""
    found = {id(b): b for b in (*_loaded.values(), *_registered.values())}
    for name in _module_names():
        module = sys.modules.get(f"{__name__}.{name}")
        backend = getattr(module, "BACKEND", None)
        if isinstance(backend, Backend):
            found[id(backend)] = backend
    return list(found.values())


def known_backends() -> list[str]:
    """Every libtype with a module or a run-time registration (imports nothing)."""
    return sorted(set(_module_names()) | set(_registered))


def available_backends() -> list[Backend]:
    """Every backend that can run here (imports all backend modules: not for the hot path)."""
    return [b for b in map(get_backend, known_backends()) if b.is_available()]


def register_backend(backend: Backend) -> None:
    """Add or replace a backend under ``backend.name``; dispatchers must ``reload()`` to see it in cached decisions."""
    if not backend.name:
        raise ValueError("backend.name must be a non-empty libtype string")
    with _lock:
        _registered[backend.name] = backend
        _loaded[backend.name] = backend


def unregister_backend(name: str) -> None:
    with _lock:
        _registered.pop(name, None)
        _loaded.pop(name, None)
