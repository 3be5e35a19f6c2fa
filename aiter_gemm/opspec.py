"""What makes a GEMM op: its table, its problem key, its JSON level, its backends. The dispatcher and the tuner are
written once over this description; adding an op is one module under :mod:`aiter_gemm.ops` registering an
:class:`OpSpec` (:data:`aiter_gemm.registry.OPS`) plus its backend files (docs/design.md, "Adding an op").

It sits below the dispatcher: it imports the table, JSON, settings and backend-contract modules and nothing of
:mod:`aiter_gemm.dispatch` or :mod:`aiter_gemm.ops`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.configs import SPECS, TableSpec, TunedRow
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.dtypes import dtype_name
from aiter_gemm.jsonconfigs import JsonLevel
from aiter_gemm.settings import Settings

#: The GemmProblem field a CSV key column holds, where the names differ.
_FIELDS = {"outdtype": "otype"}


def problem_cells(p: GemmProblem, columns: Sequence[str]) -> dict[str, str]:
    """``p``'s key cells under ``columns`` as AITER's CSVs spell them (``str()`` of ints and bools, ``torch.<dtype>``
    of dtypes; ``outdtype`` holds ``otype``): the one spelling of a problem that captured shape lists, the tuner's
    rows and its print-outs share."""
    out = {}
    for c in columns:
        value = getattr(p, _FIELDS.get(c, c))
        out[c] = dtype_name(value) if isinstance(value, torch.dtype) else str(value)
    return out


@dataclass(frozen=True)
class OpSpec:
    """One op as the generic :class:`~aiter_gemm.dispatch.Dispatcher` and the tuner see it.

    Problems are :class:`GemmProblem` for every op (an op keys rows on the fields it needs: :attr:`row_key`);
    runners have the op's own signature, which only the op's entry function, its backends and its
    :attr:`call_runner` know."""

    name: str  # "gemm_a16w16": also the tuner's task field naming the op
    kind: str  # config kind: table spec, environment variable and shipped file name (settings.CONFIG_KINDS)
    backends: str  # package holding the op's backend modules (aiter_gemm.backends registry namespace)
    row_key: Callable[[GemmProblem], tuple]  # the table key of a problem, typed as the table parses it
    row_solution: Callable[[TunedRow], Solution]  # what a row names; may raise ConfigError for a malformed row
    untuned_columns: tuple[str, ...] = ("M", "N", "K")
    #: Where captured shapes go (``AITER_TUNE_GEMM=1``): a path from the settings, or None (not captured).
    capture_path: Callable[[Settings], str | None] | None = None
    #: The op's JSON M-bucket files (:class:`~aiter_gemm.jsonconfigs.JsonLevel`); None: the op has none.
    json: JsonLevel | None = None
    #: A row's ``source`` as ``path:line`` (True) or the path with ``line`` beside it (AITER's config dict).
    source_with_line: bool = False
    #: The problem of a table key (:attr:`row_key`'s inverse), for :meth:`~aiter_gemm.dispatch.Dispatcher.warm_up`.
    key_problem: Callable[[tuple], GemmProblem] | None = None
    #: Random inputs of a problem and their float32 reference, as rotating sets spanning twice ``cache`` bytes:
    #: (problem, seed, device, cache bytes, options) -> :class:`~aiter_gemm.testbed.Inputs` (the tuner, kernel_check
    #: and the benchmarks run solutions on them).
    make_inputs: Callable[[GemmProblem, int, Any, int, Mapping[str, Any]], Any] | None = None
    #: Run a runner on one input set: (runner, set, problem) -> output.
    call_runner: Callable[[Callable, tuple, GemmProblem], Any] | None = None

    @property
    def table_spec(self) -> TableSpec:
        return SPECS[self.kind]

    @property
    def key_columns(self) -> tuple[str, ...]:
        """The columns naming a tuned row: the device's (``gfx``, ``cu_num``), then the problem's."""
        return ("gfx", "cu_num", *self.untuned_columns)

    def untuned_row(self, p: GemmProblem) -> dict[str, str]:
        """``p`` as a row of the op's untuned CSV (:func:`problem_cells` of :attr:`untuned_columns`)."""
        return problem_cells(p, self.untuned_columns)

    def key_row(self, device: DeviceIdentity, p: GemmProblem) -> dict[str, str]:
        """The :attr:`key_columns` cells of ``p`` on ``device``, as tuned rows spell them."""
        return {"gfx": device.gfx, "cu_num": str(device.cu_num), **self.untuned_row(p)}
