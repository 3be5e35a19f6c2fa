"""What makes a GEMM op: its table, its problem key, its JSON level, its backends. The dispatcher and the tuner are
written once over this description; adding an op is one module under :mod:`aiter_gemm.ops` registering an
:class:`OpSpec` (:data:`aiter_gemm.registry.OPS`) plus its backend files (docs/design.md, "Adding an op").
"""

from __future__ import annotations

import glob
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import torch

from aiter_gemm import jsonconfigs
from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.configs import SPECS, TableSpec, TunedRow
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.dtypes import dtype_name
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


def row_solution(row: TunedRow) -> Solution:
    """The solution a ``gemm_a16w16``-style row names (``libtype``, ``solidx``, ``splitK``, ``kernelName``)."""
    v = row.values
    return Solution(v["libtype"], v["solidx"], v["splitK"], v["kernelName"])


@dataclass(frozen=True)
class JsonLevel:
    """An op's JSON level: per-(N, K) files of M buckets (:mod:`aiter_gemm.jsonconfigs`), the op's own family first
    (``{arch}-{family}-N={N}-K={K}.json`` in the settings' JSON folders, ``AITER_GEMM_TRITON_CONFIGS`` then the
    shipped ``configs/triton``; then ``{arch}-{family}.json`` where ``arch_file``), then the ``more`` families
    (SGLang's TileLang files for the block-scale op), each a :class:`~aiter_gemm.jsonconfigs.JSONFiles`.
    ``fills`` None: a decision level between the tuned rows and the default; a libtype: the files fill in that
    libtype's rows whose kernelName is empty or ``auto`` (AITER's ``gemm_a16w16`` Triton rows), which the backend's
    own default config serves where no file answers."""

    family: str  # "GEMM-A16W16", "GEMM-A8W8_BLOCKSCALE"
    parse: Callable[[Mapping[str, Any]], Any]  # an own-family entry as the op's config (parsed once per file)
    solution: Callable[[Any, GemmProblem, str], Solution]  # (config, problem, arch) -> what runs
    buckets: Mapping[str, int | None] = field(default_factory=lambda: dict(jsonconfigs.AITER_BUCKETS))
    arch_file: bool = False
    fills: str | None = None
    #: Further file families read after the op's own (entries already solutions), in order.
    more: tuple[jsonconfigs.JSONFiles, ...] = ()

    @cached_property
    def own(self) -> jsonconfigs.JSONFiles:
        """The op's own file family, as every family is described."""
        family = self.family
        return jsonconfigs.JSONFiles(
            label="JSON config", folders=lambda settings: settings.triton_config_dirs,
            file_name=lambda device, N, K: f"{device.gfx}-{family}-N={N}-K={K}.json",
            glob=lambda device: f"{glob.escape(device.gfx)}-{family}-N=*-K=*.json",
            nk=re.compile(r".*-N=([0-9]+)-K=([0-9]+)\.json"),
            read=partial(jsonconfigs.read_buckets, parse_entry=self.parse, named=self.buckets))

    @property
    def families(self) -> tuple[jsonconfigs.JSONFiles, ...]:
        return (self.own, *self.more)

    def file_names(self, files: jsonconfigs.JSONFiles, device: DeviceIdentity, N: int, K: int) -> tuple[str, ...]:
        name = files.file_name(device, N, K)
        return (name, f"{device.gfx}-{self.family}.json") if files is self.own and self.arch_file else (name,)

    def hits(self, folders: Sequence[Sequence[str | Path]], device: DeviceIdentity, problem: GemmProblem,
             strict: bool = False) -> Iterator[tuple[jsonconfigs.JSONFiles, str, Solution]]:
        """``(family, "<file>#<bucket>", solution)`` per family (``folders``: each family's, in order): the first of
        its files (names in order, each over its folders) with a bucket covering ``problem.M`` that is not a
        ``"default"`` one (nothing confirmed there: the next family). Not ``strict`` (the dispatcher), a broken file
        is warned once and skipped; strict, JSONConfigError naming file and key. The one search of JSON files."""
        for files, dirs in zip(self.families, folders):
            found = None
            for name in self.file_names(files, device, problem.N, problem.K):
                for folder in dirs:
                    path = Path(folder) / name
                    hit = jsonconfigs.select_bucket(
                        jsonconfigs.cached_file(path, files.read, strict=strict) or [], problem.M)
                    if hit is not None:
                        found = path, hit
                        break
                if found is not None:
                    break
            if found is None or found[1][1] is None:
                continue
            path, (key, entry) = found
            sol = self.solution(entry, problem, device.gfx) if files is self.own else entry
            yield files, f"{path}#{key}", sol


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
    #: Where captured shapes go (``AITER_TUNE_GEMM=1``): a path from the settings, or None (not captured).
    capture_path: Callable[[Settings], str | None] | None = None
    #: The op's JSON M-bucket files (:class:`JsonLevel`); None: the op has none.
    json: JsonLevel | None = None
    #: Extra fields ``get_*_config`` reports for a solution (e.g. the kernel's parameters).
    describe: Callable[[Solution], dict[str, Any]] | None = None
    #: A row's ``source`` as ``path:line`` (True) or the path with ``line`` beside it (AITER's config dict).
    source_with_line: bool = False
    #: The problem of a table key (:attr:`row_key`'s inverse), for :meth:`~aiter_gemm.dispatch.Dispatcher.warm_up`.
    key_problem: Callable[[tuple], GemmProblem] | None = None

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
