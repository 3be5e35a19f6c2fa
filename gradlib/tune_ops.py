"""The tuner's side of an op (:class:`~aiter_gemm.opspec.OpSpec` is the runtime's, with the op's inputs, reference
and runner call): how a winner becomes a tuned row, the op's baseline and sidecar files. The search, the worker, the
checkpoint writer and the driver are written once over this (docs/design.md, "Adding an op").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiter_gemm.backends.base import Problem, Solution
from aiter_gemm.configs import TunedRow
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.registry import LazyRegistry, op_spec
from gradlib.records import Candidate, ShapeOutcome


class Sidecar:
    """Files an op writes beside its tuned CSV (the block-scale op's JSON buckets): told about every finished or
    skipped shape, flushed with each checkpoint, summarised in the final line."""

    def skipped(self, problem: Problem) -> None: ...
    def add(self, outcome: ShapeOutcome) -> None: ...
    def flush(self) -> None: ...

    def finish(self) -> None:
        """The run is over, finished or interrupted: the next flush writes everything it was told of, files that
        wait for shapes that will not come now included."""

    def summary(self) -> str:
        return ""


@dataclass(frozen=True)
class TuneOp:
    """How the tuner handles one op."""

    op: str  # the runtime op's name (aiter_gemm.registry.op_spec)
    tuned_columns: tuple[str, ...]
    #: The winner as a tuned row: (device, outcome, winner) -> row of :attr:`tuned_columns`.
    tuned_row: Callable[[DeviceIdentity, ShapeOutcome, Candidate], dict[str, Any]]
    err_column: str = "err_ratio"  # the error column's name in tuned and profile rows
    #: Libtype timed for every shape as the reference the winner must beat (F.linear for gemm_a16w16); None: none.
    baseline: str | None = None
    show_bias: bool = False  # the printed table has a bias column
    sidecar: Callable[..., Sidecar] | None = None  # (device, tuned_file, problems, **options) -> Sidecar
    #: The candidate a tuned row names, equal to the search's own solution for that kernel (``--compare``,
    #: ``--run_config``); None: the runtime's ``OpSpec.row_solution``.
    row_candidate: Callable[[TunedRow], Solution] | None = None
    #: A problem's cells in the printed tables (header -> text); None: M, N, K (and bias with :attr:`show_bias`).
    table_cells: Callable[[Problem], dict[str, str]] | None = None

    def shape_cells(self, p: Problem) -> dict[str, str]:
        """``p`` as the printed tables show it (:attr:`table_cells`)."""
        if self.table_cells is not None:
            return self.table_cells(p)
        return {"M": str(p.M), "N": str(p.N), "K": str(p.K), **({"bias": str(p.bias)} if self.show_bias else {})}

    @property
    def key_columns(self) -> tuple[str, ...]:
        """The columns naming a row: gfx, cu_num and the op's key (the runtime op's :attr:`OpSpec.key_columns`)."""
        return op_spec(self.op).key_columns

    @property
    def key_problem(self) -> Callable[[tuple], Problem] | None:
        """The problem a table key names (a tuned file's rows as shapes to retune or time; the runtime op's
        :attr:`OpSpec.key_problem`); None: not supported."""
        return op_spec(self.op).key_problem

    def key_of(self, identity: DeviceIdentity, p: Problem) -> dict[str, str]:
        """``p``'s key cells on ``identity`` as the op's tuned rows spell them (:meth:`OpSpec.key_row`)."""
        return op_spec(self.op).key_row(identity, p)


def shape_label(p: Problem) -> str:
    """A problem as the tuner's console lines name it: its label, `` bias`` for a GEMM with a bias."""
    return p.label() + (" bias" if getattr(p, "bias", False) else "")


#: Op name -> module defining its TuneOp (imported on first use: a worker loads only its op's).
TUNE_OPS: LazyRegistry[TuneOp] = LazyRegistry("tuner spec", {"gemm_a16w16": "gradlib.a16w16",
                                                              "gemm_a8w8_blockscale": "gradlib.blockscale",
                                                              "fused_moe": "gradlib.moe"},
                                               lambda spec: spec.op)
register_tune_op = TUNE_OPS.register
tune_op = TUNE_OPS.get

