"""The ``kernelName`` grammar of a config family: one template both spells a config's name (the tuned CSVs'
``kernelName``) and parses it back, so that writer and parser cannot drift apart.

A template is literal text with fields:

* ``{name}``: an unsigned integer in ASCII digits (:func:`~aiter_gemm.configs.parse_int`'s rule);
* ``{name:a|b}``: one of the listed words;
* ``[...]``: an optional part holding literal text and at most one field; absent, its field reads as None. A part
  without a field is a flag named by its text without the leading ``_`` (``[_TMA]``: ``TMA``, True or False).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiter_gemm.configs import parse_int, shown

__all__ = ["KernelName"]

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
