"""What makes a GEMM op: its table, its problem key, its JSON level, its backends. The dispatcher and the tuner are
written once over this description; adding an op is one module under :mod:`aiter_gemm.ops` registering an
:class:`OpSpec` (:data:`aiter_gemm.registry.OPS`) plus its backend files (docs/design.md, "Adding an op").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.configs import SPECS, TableSpec, TunedRow
from aiter_gemm.settings import Settings


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
    #: Extra fields ``get_*_config`` reports for a solution (e.g. the kernel's parameters).
    describe: Callable[[Solution], dict[str, Any]] | None = None
    #: A row's ``source`` as ``path:line`` (True) or the path with ``line`` beside it (AITER's config dict).
    source_with_line: bool = False
    #: The problem of a table key (:attr:`row_key`'s inverse), for :meth:`~aiter_gemm.dispatch.Dispatcher.warm_up`.
    key_problem: Callable[[tuple], GemmProblem] | None = None

    @property
    def table_spec(self) -> TableSpec:
        return SPECS[self.kind]
