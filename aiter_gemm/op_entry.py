"""An op's eager entry, declared once (:class:`OpEntry`): its arguments (:class:`Arg`), the function that validates
and decides a new key, and what runs a cached one. From the declaration come

- the Python entry: the key (per tensor argument its shape, dtype and device, and its strides where declared, per
  value argument the value), one
  lookup in the op's per-call cache (``DecisionCache.calls``) and the miss path, compiled into one function with
  the op's signature (as ``dataclasses`` compile ``__init__``), so the key costs what a hand-written one did;
- where the C++ extension is built (:mod:`aiter_gemm.eager_ext`), the op's C entry: ``csrc/eager_fast.cpp`` keys a
  call from the same fields and runs what the miss path remembered for it, for any registered op.

Adding an op adds a declaration here and no C++ (docs/design.md, "Adding an op"; docs/eager_path.md).
"""

from __future__ import annotations

import keyword
import linecache
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from aiter_gemm import cudagraph, eager_ext

#: The C++ eager extension (:func:`aiter_gemm.eager_ext.load`), or None: the Python entries do the same work.
EXT = eager_ext.load()
if EXT is not None:
    EXT.setup(cudagraph.capturing, cudagraph.capture_state, torch.nn.functional.linear)

TENSOR = "tensor"
OPTIONAL_TENSOR = "tensor?"
VALUE = "value"
BYPASS = "bypass"
#: The kinds, as the C++ entry numbers them (``Kind`` in csrc/eager_fast.cpp).
KINDS = {TENSOR: 0, OPTIONAL_TENSOR: 1, VALUE: 2, BYPASS: 3}


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of an argument that has none.
REQUIRED: Any = _Required()
#: Names the compiled entry uses itself (its globals start with _).
_RESERVED = frozenset({"key", "value"})


@dataclass(frozen=True)
class Arg:
    """One parameter of an op's entry, in signature order.

    ``kind``: :data:`TENSOR` (its shape, dtype and device are key fields), :data:`OPTIONAL_TENSOR` (the same, or
    None), :data:`VALUE` (a non-tensor key field, hashable: the value itself; the C++ entry keys None, dtypes, bools
    and ints, or with ``choices`` only those values) or :data:`BYPASS` (a call where it is not its default, by
    identity, skips the cache: :attr:`OpEntry.bypass` runs it). ``marks``: attributes of a tensor argument that key
    the call apart (``getattr(t, mark, False) is True``, e.g. ``is_shuffled``); the C++ entry leaves a tensor carrying
    one as an instance attribute to the Python entry. ``strides``: the tensor's strides are key fields too, for an
    op whose ``decide`` checks its layout (contiguity), so a call of another layout is checked as a first call."""

    name: str
    kind: str = TENSOR
    default: Any = REQUIRED
    choices: tuple | None = None
    marks: tuple[str, ...] = ()
    strides: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Arg {self.name!r}: kind must be one of {sorted(KINDS)}, got {self.kind!r}")
        n = self.name
        if not n.isidentifier() or keyword.iskeyword(n) or n in _RESERVED or n.startswith("_"):
            raise ValueError(f"Arg {self.name!r}: not an identifier, or a name the entry uses ({sorted(_RESERVED)}, "
                             "and names starting with _)")
        if (self.marks or self.strides) and self.kind not in (TENSOR, OPTIONAL_TENSOR):
            raise ValueError(f"Arg {self.name!r}: only tensor arguments carry marks or key strides")
        if self.kind == BYPASS and self.default is REQUIRED:
            raise ValueError(f"Arg {self.name!r}: a bypass argument needs a default")

    def key_expr(self) -> str | None:
        """What the Python key holds of this argument (a Python expression), None for a bypass argument."""
        n = self.name
        if self.kind == BYPASS:
            return None
        if self.kind == VALUE:
            return n
        fields = f"{n}.shape, {n}.dtype, {n}.device" + (f", {n}.stride()" if self.strides else "") + "".join(
            f", getattr({n}, {m!r}, False) is True" for m in self.marks)
        return fields if self.kind == TENSOR else f"None if {n} is None else ({fields})"


class Decided(NamedTuple):
    """What an op's ``decide`` returns for a new key: ``value``, what the Python entry caches under the key (and
    hands to ``run``); ``runner``, what the C++ entry may call for the key with the op's first ``runner_args``
    arguments (``torch.nn.functional.linear`` runs there as ``at::linear``), None: not served there; ``probe``: the
    runner serves only while ``probe()`` says no CUDA graph is being captured (:meth:`Decision.eager_plan`)."""

    value: Any
    runner: Callable | None = None
    probe: Callable[[], bool] | None = None


class OpEntry:
    """One op's eager entry: :attr:`python` (the Python entry), :attr:`entry` (what the op exports: the C entry where
    the extension is built, else :attr:`python`), :attr:`key` (the per-call key of a call's arguments) and
    :meth:`value_for`.

    ``cache``: the op's :class:`~aiter_gemm.dispatch.DecisionCache` (its ``calls`` hold the values, its
    ``generation`` validates the C++ map). ``decide(*args) -> Decided``: validate the arguments of a key's first call
    (errors name the argument) and decide it. ``run(value, *args)`` runs a cached value with every argument but the
    bypass ones; without ``run`` the value is the runner, called with the first ``runner_args`` arguments (default:
    those before the first bypass one) as in C++. ``compiled``: what runs while ``torch.compile`` traces (the op's
    custom op), with every argument; ``bypass``: what runs a call whose bypass argument is set, with every argument."""

    def __init__(self, name: str, args: Sequence[Arg], cache: Any, decide: Callable[..., Decided], *,
                 module: str, doc: str, run: Callable | None = None, runner_args: int | None = None,
                 compiled: Callable | None = None, bypass: Callable | None = None) -> None:
        self.name, self.args, self.cache, self.decide = name, tuple(args), cache, decide
        self.module, self.doc, self.run, self.compiled, self.bypass = module, doc, run, compiled, bypass
        first_bypass = next((i for i, a in enumerate(self.args) if a.kind == BYPASS), len(self.args))
        self.runner_args = first_bypass if runner_args is None else runner_args
        if first_bypass < len(self.args) and bypass is None:
            raise ValueError(f"OpEntry {name}: a bypass argument needs bypass=")
        if not 0 <= self.runner_args <= first_bypass:
            raise ValueError(f"OpEntry {name}: runner_args {self.runner_args} must be 0..{first_bypass} (the "
                             "arguments before the first bypass one)")
        self.calls: dict = cache.calls
        self.key, self.python = self._compile()
        self.c_fn = None if EXT is None else self.install(self.python)
        self.entry = eager_ext.entry(self.c_fn, self.python)

    # ---- the Python entry ----------------------------------------------------------------------------------
    def source(self) -> str:
        """The source of the key function and the Python entry, made from the declaration."""
        names = [a.name for a in self.args]
        every = ", ".join(names)
        served = ", ".join(a.name for a in self.args if a.kind != BYPASS)
        key = ", ".join(e for a in self.args if (e := a.key_expr()) is not None)
        lines = [f"def key({every}):", f"    return ({key},)", "", f"def {self.name}({every}):"]
        if self.compiled is not None:
            lines += ["    if _compiling():", f"        return _compiled({every})"]
        for a in self.args:
            if a.kind == BYPASS:
                lines += [f"    if {a.name} is not _default_{a.name}:", f"        return _bypass({every})"]
        lines += ["    try:", f"        key = ({key},)", "    except AttributeError:",
                  "        key = None  # not a tensor: decide says which", "    value = _get(key)",
                  "    if value is None:", f"        value = _miss(key, {every})"]
        if self.run is not None:
            lines.append(f"    return _run(value, {served})")
        else:
            lines.append(f"    return value({', '.join(names[:self.runner_args])})")
        return "\n".join(lines) + "\n"

    def _compile(self) -> tuple[Callable, Callable]:
        namespace: dict[str, Any] = {
            "_compiling": torch.compiler.is_compiling, "_compiled": self.compiled, "_bypass": self.bypass,
            "_get": self.calls.get, "_miss": self.miss, "_run": self.run,
            **{f"_default_{a.name}": a.default for a in self.args if a.kind == BYPASS}}
        source, filename = self.source(), f"<aiter_gemm op entry {self.name}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks show it
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 (made from the declaration)
        defaults = [a.default for a in self.args]
        first = next((i for i, d in enumerate(defaults) if d is not REQUIRED), len(defaults))
        if any(d is REQUIRED for d in defaults[first:]):
            raise ValueError(f"OpEntry {self.name}: an argument without a default follows one with a default")
        key, python = namespace["key"], namespace[self.name]
        for fn in (key, python):
            fn.__defaults__ = tuple(defaults[first:]) or None
            fn.__module__ = self.module
        key.__qualname__ = key.__name__ = f"{self.name}_key"
        key.__doc__ = f"The per-call key of {self.name}'s arguments (what the C++ entry keys too)."
        python.__doc__ = self.doc
        return key, python

    def miss(self, key: tuple | None, *args: Any) -> Any:
        """A key's first call: ``decide`` validates and decides it; the value is cached under the key and, where
        the C++ entry may serve it, remembered there too (None: the arguments failed to key, nothing cached)."""
        decided = self.decide(*args)
        if key is not None:
            self.calls[key] = decided.value
            if decided.runner is not None and self.c_fn is not None:
                EXT.remember(self.c_fn, decided.runner, decided.probe, *args)
        return decided.value

    def value_for(self, *args: Any) -> Any:
        """The cached value of a call with these arguments, deciding on a new key (:class:`aiter_gemm.nn.
        TunedLinear` runs it with the op's ``run``)."""
        key = self.key(*args)
        value = self.calls.get(key)
        return value if value is not None else self.miss(key, *args)

    # ---- the C entry ---------------------------------------------------------------------------------------
    def install(self, fallback: Callable) -> Callable:
        """(Re-)register the op with the C++ extension, ``fallback`` running every call it does not serve (the
        Python entry; a spy in tests); its entry function (the same object each time)."""
        params = tuple((a.name, KINDS[a.kind], a.default is not REQUIRED, None if a.default is REQUIRED else a.default,
                        a.choices, a.marks or None, a.strides) for a in self.args)
        signature = ", ".join(a.name if a.default is REQUIRED else f"{a.name}={a.default!r}" for a in self.args)
        summary = (self.doc.strip().splitlines() or [""])[0]
        return EXT.register_op(self.name, self.module, params, self.runner_args, self.cache, fallback,
                               f"{self.name}($self, {signature})\n--\n\n{summary}")
