"""The C++ eager fast path (``csrc/eager_fast.cpp``): built once per source, torch and Python version with torch's
extension builder, loaded at import when built; without it the Python path runs (same results, more host time).

Why: a host-bound model (eager decode) pays the Python entry's key and frames on every GEMM call, about what a
decode GEMM takes on the GPU (docs/eager_path.md). Every op declared in :mod:`aiter_gemm.op_entry` gets a C entry
there: the same key fields, looked up in a C++ map per op, and what the Python path remembered for the key runs
(``F.linear`` as ``at::linear``, which autograd records and autocast casts as it does F.linear); anything else goes
to the op's Python entry, unchanged.

``AITER_GEMM_EAGER_EXT`` (read once, at import): ``auto`` (default) loads a built copy and never compiles on a GEMM
call; ``build`` also builds it at import when missing (once, ~30-60 s, g++ and ninja needed); ``0`` / ``off``: the
Python path only. Build ahead of time with ``aiter-gemm-build-ext`` (prints where it went, and "loaded" when a
build for this source, torch and environment was there already). The build folder is ``$TORCH_EXTENSIONS_DIR``
(else torch's ``~/.cache/torch_extensions``) / the versioned name (one per venv).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCE = CSRC / "eager_fast.cpp"  # the extension's module (its init); the other files of csrc/ are built with it


def sources() -> list[Path]:
    """The files the extension is built from (``SOURCE`` first), headers included: its name hashes them all."""
    return [SOURCE, *sorted(p for p in CSRC.iterdir() if p.suffix in (".cpp", ".h") and p.name != SOURCE.name)]
ENV = "AITER_GEMM_EAGER_EXT"
_MODES = {"auto": "auto", "": "auto", "1": "auto", "build": "build", "0": "off", "off": "off", "false": "off",
          "no": "off"}

#: Why the extension is not loaded ("" when it is): what README and the overhead benchmark report.
status = "not loaded yet"


def mode(env: dict[str, str] | None = None) -> str:
    """``auto``, ``build`` or ``off`` from ``AITER_GEMM_EAGER_EXT`` (ValueError naming the variable)."""
    raw = (os.environ if env is None else env).get(ENV, "auto").strip().lower()
    if raw not in _MODES:
        raise ValueError(f"aiter_gemm: {ENV} must be auto, build or off (0), got {raw!r}")
    return _MODES[raw]


def ext_name() -> str:
    """The module name: changes with the source, torch's version and build, the Python ABI and the environment
    (``sys.prefix``: a venv), so a stale build is never loaded (it is rebuilt under a new name instead) and two
    venvs sharing the build root each keep their own folder: torch's builder keys a folder's build on the include
    paths too, so one folder for two venvs was rebuilt by each in turn."""
    h = hashlib.sha256()
    for path in sources():
        h.update(path.read_bytes())
    h.update(f"{torch.__version__}|{torch.version.cuda}|{sys.implementation.cache_tag}|"
             f"{sysconfig.get_config_var('EXT_SUFFIX')}|{os.path.realpath(sys.prefix)}".encode())
    return f"aiter_gemm_eager_{h.hexdigest()[:16]}"


def build_dir(name: str | None = None) -> Path:
    """Where the extension is built and looked for."""
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return Path(root) / (name or ext_name())


def _import_built(name: str, folder: Path) -> ModuleType | None:
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    for cand in (folder / f"{name}{suffix}", folder / f"{name}.so"):
        if cand.is_file():
            loader = importlib.machinery.ExtensionFileLoader(name, str(cand))
            spec = importlib.util.spec_from_file_location(name, str(cand), loader=loader)
            if spec is None:
                return None
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            return module
    return None


def build(verbose: bool = False) -> ModuleType:
    """Compile (if needed) and import the extension; raises what torch's builder raises (no compiler, no ninja)."""
    from filelock import FileLock
    from torch.utils.cpp_extension import load

    name = ext_name()
    folder = build_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    # torch's builder marks a build with a plain file (``lock``) that a killed build leaves behind: the next build
    # then waited for it forever and failed to import (seen: a CI run killed mid-build, the next one hung 22 min).
    # An OS lock, released when its holder dies, serialises our builds; holding it, any ``lock`` file is stale.
    with FileLock(str(folder) + ".build.lock"):
        baton = folder / "lock"
        if baton.exists():
            log.warning("aiter_gemm: removing %s, left by a build of the C++ eager fast path that did not finish",
                        baton)
            baton.unlink(missing_ok=True)
        module = _import_built(name, folder)  # another process may have built it while this one waited
        if module is not None:
            return module
        return load(name=name, sources=[str(p) for p in sources() if p.suffix == ".cpp"],
                    build_directory=str(folder), extra_cflags=["-O2"], extra_ldflags=["-ldl"],
                    with_cuda=False, is_python_module=True, verbose=verbose)


def load(env: dict[str, str] | None = None) -> ModuleType | None:
    """The extension per ``AITER_GEMM_EAGER_EXT``, or None (``status`` says why). Never raises for a missing or
    broken build: the Python path is always there."""
    global status
    try:
        how = mode(env)
    except ValueError as exc:
        log.warning("%s; using the Python eager path", exc)
        status = str(exc)
        return None
    if how == "off":
        status = f"{ENV}=off"
        return None
    name = ext_name()
    try:
        module = _import_built(name, build_dir(name))
        if module is None and how == "build":
            log.info("aiter_gemm: building the C++ eager fast path %s (once)", name)
            module = build()
    except Exception as exc:  # a broken build or a missing compiler must not stop the runtime
        log.warning("aiter_gemm: the C++ eager fast path could not be loaded (%s: %s); using the Python path",
                    type(exc).__name__, exc)
        status = f"failed: {type(exc).__name__}: {exc}"
        return None
    if module is None:
        log.info("aiter_gemm: the C++ eager fast path is not built; eager calls use the Python path "
                 "(build it with: aiter-gemm-build-ext)")
        status = "not built (aiter-gemm-build-ext builds it)"
        return None
    status = ""
    return module


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs callbacks once ``torch._dynamo`` has been imported (one-shot: it leaves ``sys.meta_path`` at once)."""

    def __init__(self, callbacks: list[Callable[[], None]]) -> None:
        self.callbacks = callbacks

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001 (importlib's protocol)
        if fullname != "torch._dynamo":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            log.warning("aiter_gemm: cannot follow the import of torch._dynamo; compiled code calling the C++ "
                        "gemm_a16w16 will break the graph there")
            return spec
        run, callbacks = spec.loader.exec_module, self.callbacks

        def exec_module(module: ModuleType) -> None:
            run(module)
            for callback in callbacks:
                callback()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def when_dynamo_loads(callback: Callable[[], None]) -> None:
    """Call ``callback`` once ``torch._dynamo`` is imported (now, if it is). Importing it here would cost every
    ``import aiter_gemm`` seconds and import Triton (``test_dispatch``'s light-import test); registering a
    ``substitute_in_graph`` needs it."""
    if "torch._dynamo" in sys.modules:
        callback()
        return
    for finder in sys.meta_path:
        if isinstance(finder, _AfterImport):
            finder.callbacks.append(callback)
            return
    sys.meta_path.insert(0, _AfterImport([callback]))


def entry(c_fn: Callable | None, python_entry: Callable) -> Callable:
    """An op's public entry: its C entry function ``c_fn`` (it runs remembered decisions and calls ``python_entry``
    for everything else), with ``python_entry`` registered as what ``torch.compile`` traces in its place;
    ``python_entry`` itself where the extension is absent or this torch has no ``torch.compiler.substitute_in_graph``
    (compiled code must never trace a C function). A Python wrapper around the C call would add back its own frame
    and a compiling check to every call, the host time the entry exists to save."""
    if c_fn is None or not hasattr(torch.compiler, "substitute_in_graph"):
        return python_entry

    def register() -> None:
        try:
            torch.compiler.substitute_in_graph(c_fn)(python_entry)
        except Exception as exc:  # compiled code then breaks its graph at the entry (eager is unaffected)
            log.warning("aiter_gemm: torch.compile cannot trace the C++ %s entry (%s: %s)", c_fn.__name__,
                        type(exc).__name__, exc)

    when_dynamo_loads(register)
    return c_fn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aiter-gemm-build-ext",
                                     description="Build the C++ eager fast path of aiter_gemm and say where it is.")
    parser.add_argument("--verbose", action="store_true", help="show the compiler's commands")
    args = parser.parse_args(argv)
    name = ext_name()
    module = _import_built(name, build_dir(name))
    if module is not None:
        print(f"already built for this source, torch and environment; loaded {name}: {module.__file__}")
        return 0
    module = build(verbose=args.verbose)
    print(f"built {module.__name__}: {module.__file__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
