"""What every kernel file here shares: the interpreter flag, how input checks name a tensor, grouped tile ordering,
the fused-MoE gate activation, the deterministic split-K reduction, the TMA alignment rule, the bounds every config
is checked against, and the ``kernelName`` grammar (:class:`KernelName`) each config family spells and parses its
names with.

The grammar: one template both spells a config's name (the tuned CSVs' ``kernelName``) and parses it back, so
writer and parser cannot drift apart.

A template is literal text with fields:

* ``{name}``: an unsigned integer in ASCII digits (:func:`~aiter_gemm.configs.parse_int`'s rule);
* ``{name:a|b}``: one of the listed words;
* ``[...]``: an optional part holding literal text and at most one field; absent, its field reads as None. A part
  without a field is a flag named by its text without the leading ``_`` (``[_TMA]``: ``TMA``, True or False).
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
import triton
import triton.language as tl

from aiter_gemm.configs import parse_int, shown

# Whether Triton interprets the kernels, read as this Triton reads TRITON_INTERPRET (its knob, where it has one:
# "true" and "on" count too), once at import: kernels are specialised on it, and runners must not read the
# environment per call. Interpreted (CPU tests), Triton 3.9 returns garbage for tl.dot on 8/16-bit float operands, so
# every kernel upcasts its dot operands to float32 when this is set.
INTERPRET: bool = (bool(triton.knobs.runtime.interpret) if hasattr(triton, "knobs")
                   else os.environ.get("TRITON_INTERPRET") == "1")


class Launch(NamedTuple):
    """One Triton launch as a launcher records it for :func:`aiter_gemm.triton_launch.bind`: what
    ``kernel[grid](**args)`` returned, and which tensors of ``args`` a later call gives (``inputs``) or the plan
    allocates (``outputs``). Here, beside the kernels that record it, so that they need not load the binder."""

    compiled: Any
    grid: tuple
    args: Mapping[str, Any]
    inputs: tuple
    outputs: tuple


# Bounds every Triton config here is checked against where it is parsed (its class's validity check, so a kernelName
# or JSON entry past them is malformed, a miss, rather than a kernel that fails to compile on every call; issue 47).
# Shared memory and registers depend on the arch and are the backends' ``config_error``'s to judge.
#: Rows of tiles per L2 group: :func:`tile_coords` multiplies it by the tiles along N in int32.
MAX_GROUP_SIZE_M = 1024
#: K splits: one program per split along a grid axis, one unrolled load per split in :func:`splitk_reduce`.
MAX_KSPLIT = 256
#: Software-pipeline stages.
MAX_STAGES = 8
#: Elements of one operand tile (a block of A or of B): Triton compiles no larger tensor.
MAX_TILE_NUMEL = tl.TRITON_MAX_TENSOR_NUMEL
#: Elements of one float32 accumulator tile: 256x256 (AITER's largest) and 1024x64 tiles compiled on the H200, a
#: 1024x1024 one did not finish compiling in minutes.
MAX_ACC_NUMEL = 256 * 256


@triton.jit
def tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    """Grouped ordering: GROUP_SIZE_M row-tiles share each column sweep so B tiles are reused from L2."""
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((tile_id % num_pid_in_group) % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def gate_activation(x, ACTIVATION: tl.constexpr):
    """SiLU or exact (erf) GELU of a float32 tile (``ACTIVATION`` "silu" / "gelu"): the fused-MoE kernels' gate."""
    if ACTIVATION == "silu":
        y = x / (1.0 + tl.exp(-x))
    else:
        y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    return y


def bias_agnostic(*names: str) -> dict[str, list[str]]:
    """``triton.jit`` arguments compiling one variant for every bias view (and ``names``, left unspecialized too):
    neither ``stride_bias``'s value nor ``bias_ptr``'s 16-byte alignment is specialized (see
    :func:`bias_stride_of`; a column of a 2-D tensor starts off alignment). Triton releases without
    ``do_not_specialize_on_alignment`` keep the alignment specialization."""
    out = {"do_not_specialize": [*names, "stride_bias"]}
    if "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters:
        out["do_not_specialize_on_alignment"] = ["bias_ptr"]
    return out


@triton.jit(**bias_agnostic("M", "N", "stride_ws"))
def _splitk_reduce_kernel(
    ws_ptr, bias_ptr, c_ptr, M, N,
    stride_ws, stride_wm, stride_wn, stride_cm, stride_cn, stride_bias,
    NUM_KSPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
):
    """c = sum over splits of the float32 workspace in split order (deterministic), plus bias, cast to c's dtype."""
    offs_m = tl.program_id(0) * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = tl.program_id(1) * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ws_ptrs = ws_ptr + offs_m[:, None] * stride_wm + offs_n[None, :] * stride_wn
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for s in tl.static_range(NUM_KSPLIT):
        acc += tl.load(ws_ptrs + s * stride_ws, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


# Elements per reduce program: 1024 float32 partials per split (4 KiB), as one row of 1024 at M = 1 (decode) or
# 16 rows of 64 at M >= 16: wide enough for coalesced rows, enough programs to fill the GPU.
_REDUCE_ELEMS = 1024


def splitk_reduce(ws: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                  launches: list[Launch] | None = None) -> torch.Tensor:
    """Sum float32 partials ``ws`` (S, M, N) (any strides) into ``out`` (M, N) (any strides) in split order, adding
    ``bias`` (N,) (any stride); returns ``out``. ``launches``: the launch is appended (inputs ws and bias, output
    ``out``), for :mod:`aiter_gemm.triton_launch` to bind."""
    num_splits, m, n = ws.shape
    bm = min(16, triton.next_power_of_2(max(m, 1)))
    bn = max(64, _REDUCE_ELEMS // bm)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    args = dict(zip(_splitk_reduce_kernel.arg_names, (
        ws, bias if bias is not None else ws, out, m, n, ws.stride(0), ws.stride(1), ws.stride(2), out.stride(0),
        out.stride(1), bias_stride_of(bias))))
    compiled = _splitk_reduce_kernel[grid](**args, NUM_KSPLIT=num_splits, HAS_BIAS=bias is not None,
                                           BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, num_warps=4)
    if launches is not None:
        launches.append(Launch(compiled, grid, args, (ws,) if bias is None else (ws, bias), (out,)))
    return out


def bias_stride_of(bias: torch.Tensor | None) -> int:
    """The element stride kernels step a (N,) bias by: its own (a slice ``b[::2]``, a column of a 2-D tensor, a
    stride-0 ``expand``), 1 without a bias. Every kernel taking it marks it ``do_not_specialize``: one compiled
    variant serves every stride, so a bias stride first seen inside CUDA-graph capture compiles nothing there (on the
    H100 a stride-0 bias after a contiguous one did, and capture forbids the compiler's file I/O). The bias is read
    once per output tile (N values, against the K-long operand streams), so its loads are not what the unit-stride
    specialization sped up."""
    return 1 if bias is None else bias.stride(0)


def describe_tensor(name: str, t: torch.Tensor) -> str:
    """How the kernels' input checks name a tensor in an error: its name, shape, dtype, stride and device."""
    return f"{name} (shape {tuple(t.shape)}, dtype {t.dtype}, stride {t.stride()}, device {t.device})"


def tma_usable(t: torch.Tensor) -> bool:
    """A 2-D TMA descriptor needs a unit stride along K and a 16-byte aligned base and row stride
    (cuTensorMapEncodeTiled's rules; the interpreter emulates descriptors on CPU tensors under the same rules), and
    here rows that do not overlap (a stride-0 ``expand`` or overlapping view runs the pointer kernels instead)."""
    return (t.stride(1) == 1 and t.stride(0) >= t.shape[1] and (t.stride(0) * t.element_size()) % 16 == 0
            and t.data_ptr() % 16 == 0)


# ---------------------------------------------------------------------------------------------- kernelName grammar

_TOKEN = re.compile(r"\[|\]|\{[^{}]*\}|[^\[\]{}]+")


@dataclass(frozen=True)
class _Part:
    text: str  # literal text before the field ("" for none)
    field: str | None  # the field's name (a flag's name for an optional part without a field)
    words: tuple[str, ...] | None  # a word field's words; None: an integer field
    optional: bool
    after: str = ""  # literal text after the field (optional parts only)


class KernelName:
    """One family's grammar (see the module docstring). ``what`` names the family in errors ("triton kernelName"),
    ``hint`` is appended to them (valid words, an example)."""

    def __init__(self, template: str, what: str, hint: str = "") -> None:
        self.template, self.what, self.hint = template, what, hint
        self._parts = _parse_template(template)
        names = [p.field for p in self._parts if p.field is not None]
        if len(set(names)) != len(names):
            raise ValueError(f"kernelName template {template!r} repeats a field")
        self._regex = re.compile("".join(_regex(p) for p in self._parts))

    @property
    def spelling(self) -> str:
        """The grammar as errors show it: ``<name>`` for a number or a word of several, a flag's or an optional
        field's words as they are written."""
        out = []
        for p in self._parts:
            if p.field is None or _is_flag(p):
                shown = ""
            elif p.words is not None and (p.optional or len(p.words) == 1):
                shown = "|".join(p.words)
            else:
                shown = f"<{p.field}>"
            body = p.text + shown + p.after
            out.append(f"[{body}]" if p.optional else body)
        return "".join(out)

    def matches(self, name: str) -> bool:
        """Whether ``name`` (blanks around it ignored) has this grammar; its values are not checked."""
        return self._regex.fullmatch(name.strip()) is not None

    def parse(self, name: str) -> dict[str, Any]:
        """The fields of ``name`` (blanks around it ignored): integers as int, words as str, flags as bool, absent
        optional fields as None. ValueError saying what the grammar is, or why an integer is not one."""
        m = self._regex.fullmatch(name.strip())
        if m is None:
            raise ValueError(f"{shown(name, 100)} is not a {self.what} ('{self.spelling}'{self.hint})")
        out: dict[str, Any] = {}
        for p in self._parts:
            if p.field is None:
                continue
            raw = m.group(p.field)
            if _is_flag(p):
                out[p.field] = raw is not None
            elif raw is None or p.words is not None:
                out[p.field] = raw
            else:
                try:
                    out[p.field] = parse_int(raw, signed=False)
                except ValueError as exc:
                    raise ValueError(f"{self.what} {shown(name, 100)}: {p.field} {exc}") from None
        return out

    def format(self, values: Mapping[str, Any]) -> str:
        """The name of ``values`` (field -> value): an optional part is left out where its value is None or False;
        a flag or one-word field is written where its value is true. Values are written as given, unchecked (a
        value the grammar refuses gives a name :meth:`parse` refuses, saying why)."""
        out = []
        for p in self._parts:
            if p.field is None:
                out.append(p.text)
                continue
            v = values.get(p.field)
            if v is None or v is False:
                if not p.optional:
                    raise ValueError(f"{self.what}: field {p.field!r} is required")
                continue
            if _is_flag(p):
                out.append(p.text)
            elif p.words is not None:
                out.append(p.text + (p.words[0] if v is True and len(p.words) == 1 else str(v)) + p.after)
            else:
                out.append(f"{p.text}{v}{p.after}")
        return "".join(out)


def _is_flag(p: _Part) -> bool:
    return p.optional and p.words == () and p.field is not None


def _parse_template(template: str) -> list[_Part]:
    parts: list[_Part] = []
    tokens = _TOKEN.findall(template)
    if "".join(tokens) != template:
        raise ValueError(f"kernelName template {template!r}: unbalanced braces")
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "[":
            end = tokens.index("]", i)
            inner = tokens[i + 1:end]
            fields = [t for t in inner if t.startswith("{")]
            if len(fields) > 1 or any(t in "[]" for t in inner):
                raise ValueError(f"kernelName template {template!r}: an optional part holds at most one field")
            if fields:
                at = inner.index(fields[0])
                name, words = _field(fields[0])
                parts.append(_Part("".join(inner[:at]), name, words, True, "".join(inner[at + 1:])))
            else:
                text = "".join(inner)
                parts.append(_Part(text, text.lstrip("_"), (), True))
            i = end + 1
            continue
        if tok.startswith("{"):
            name, words = _field(tok)
            parts.append(_Part("", name, words, False))
        else:
            parts.append(_Part(tok, None, None, False))
        i += 1
    return parts


def _field(token: str) -> tuple[str, tuple[str, ...] | None]:
    name, _, words = token[1:-1].partition(":")
    return name, tuple(words.split("|")) if words else None


def _regex(p: _Part) -> str:
    if p.field is None:
        return re.escape(p.text)
    if _is_flag(p):
        return f"(?P<{p.field}>{re.escape(p.text)})?"
    # Integers: any script's digits, so that parse_int says why non-ASCII ones are refused. Words: longest first.
    value = r"\d+" if p.words is None else "|".join(map(re.escape, sorted(p.words, key=len, reverse=True)))
    body = f"{re.escape(p.text)}(?P<{p.field}>{value}){re.escape(p.after)}"
    return f"(?:{body})?" if p.optional else body


@dataclass(frozen=True)
class NamedChoice:
    """A dispatch choice with no parameters, one ``kernelName`` per ``libtype`` (a library's own kernel selection:
    torch's block-scaled matmul, DeepGEMM): the ``name`` / ``NUM_KSPLIT`` / ``to_json`` surface of a tunable config,
    parsed strictly from a CSV name or a JSON entry. Subclasses set ``name`` and ``libtype``."""

    name: ClassVar[str] = ""
    libtype: ClassVar[str] = ""
    variant: ClassVar[str] = ""
    NUM_KSPLIT: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.variant = cls.libtype

    def to_json(self) -> dict[str, object]:
        return {"libtype": self.libtype, "kernelName": self.name}

    @classmethod
    def from_name(cls, name: str) -> "NamedChoice":
        if name.strip() != cls.name:
            raise ValueError(f"libtype {cls.libtype!r} rows name {cls.name!r}, got {name!r}")
        return cls()

    @classmethod
    def from_json(cls, entry: dict[str, object]) -> "NamedChoice":
        if entry != {"libtype": cls.libtype, "kernelName": cls.name}:
            raise ValueError(f"a libtype {cls.libtype!r} entry must be exactly {{'libtype': {cls.libtype!r}, "
                             f"'kernelName': {cls.name!r}}}, got {entry!r}")
        return cls()
