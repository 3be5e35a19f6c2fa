"""What makes a GEMM op: its table, its problem key, its backends. The dispatcher and the tuner are written once over
this description; adding an op is one :class:`OpSpec` plus its backend files (docs/design.md shows the block-scale
op as the example).
"""

from __future__ import annotations

import glob
import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any, Generic, TypeVar

from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.configs import SPECS, TableSpec, TunedRow
from aiter_gemm.jsonconfigs import JSONFiles, read_buckets
from aiter_gemm.settings import Settings

T = TypeVar("T")


def row_solution(row: TunedRow) -> Solution:
    """The solution a ``gemm_a16w16``-style row names (``libtype``, ``solidx``, ``splitK``, ``kernelName``)."""
    v = row.values
    return Solution(v["libtype"], v["solidx"], v["splitK"], v["kernelName"])


@dataclass(frozen=True)
class OpSpec:
    """One op as the generic :class:`~aiter_gemm.dispatch.Dispatcher` and the tuner see it.

    Problems are :class:`GemmProblem` for every op (an op keys rows on the fields it needs: :attr:`row_key`);
    runners have the op's own signature, which only the op's entry function and its backends know."""

    name: str  # "gemm_a16w16": also the tuner's task field naming the op
    kind: str  # config kind: table spec, environment variable and shipped file name (settings.CONFIG_KINDS)
    backends: str  # package holding the op's backend modules (aiter_gemm.backends registry namespace)
    row_key: Callable[[GemmProblem], tuple]  # the table key of a problem, typed as the table parses it
    row_solution: Callable[[TunedRow], Solution] = row_solution  # may raise ConfigError for a malformed row
    untuned_columns: tuple[str, ...] = ("M", "N", "K")
    untuned_row: Callable[[GemmProblem], dict[str, str]] | None = None  # a problem as an untuned-CSV row
    #: Where captured shapes go (``AITER_TUNE_GEMM=1``): a path from the settings, or None (not captured).
    capture_path: Callable[[Settings], str | None] | None = None
    #: File family of per-(N, K) JSON configs consulted between the tuned rows and the defaults
    #: (``{arch}-{json_family}-N={N}-K={K}.json``), and how an entry becomes a solution; None: no such level.
    json_family: str | None = None
    json_solution: Callable[[Mapping[str, Any]], Solution] | None = None
    json_buckets: Mapping[str, int | None] | None = None  # named bucket keys the files may use
    #: Further JSON file families read at the same level after the op's own (the block-scale op: SGLang's).
    json_more: tuple[JSONFiles, ...] = ()
    #: Extra fields ``get_*_config`` reports for a solution (e.g. the kernel's parameters).
    describe: Callable[[Solution], dict[str, Any]] | None = None
    #: A row's ``source`` as ``path:line`` (True) or the path with ``line`` beside it (AITER's config dict).
    source_with_line: bool = False
    #: The problem of a table key (:attr:`row_key`'s inverse), for :meth:`~aiter_gemm.dispatch.Dispatcher.warm_up`.
    key_problem: Callable[[tuple], GemmProblem] | None = None

    @property
    def table_spec(self) -> TableSpec:
        return SPECS[self.kind]

    @cached_property
    def json_files(self) -> tuple[JSONFiles, ...]:
        """Every JSON file family of the op's JSON level, in lookup order: its own (:attr:`json_family`, in the
        ``AITER_GEMM_TRITON_CONFIGS`` folders and the shipped ``configs/triton``), then :attr:`json_more`."""
        if not self.json_family or self.json_solution is None:
            return self.json_more
        family = self.json_family
        own = JSONFiles(
            label="JSON config", folders=lambda s: s.triton_config_dirs,
            file_name=lambda device, N, K: f"{device.gfx}-{family}-N={N}-K={K}.json",
            glob=lambda device: f"{glob.escape(device.gfx)}-{family}-N=*-K=*.json",
            nk=re.compile(r".*-N=(\d+)-K=(\d+)\.json"),
            read=partial(read_buckets, parse_entry=self.json_solution, named=self.json_buckets or {}))
        return (own, *self.json_more)


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


#: Ops this package defines: name -> module that defines and registers it (the block-scale op's module imports
#: Triton, which ``import aiter_gemm`` must not).
OPS: LazyRegistry[OpSpec] = LazyRegistry("op", {"gemm_a16w16": "aiter_gemm.ops",
                                                 "gemm_a8w8_blockscale": "aiter_gemm.blockscale"},
                                          lambda spec: spec.name)
register_op = OPS.register
op_spec = OPS.get
