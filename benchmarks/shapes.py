"""Named shape sets: which problems a benchmark times, as (label, problem) pairs.

A ``--set`` item is a registered name (``shipped``, ``offgrid``, ``heldout``, ``tiny``; for the block-scale op also
``dsv3`` and ``llama3_70b_fp8``; for fused MoE ``moe_qwen3_30b``, ``moe_mixtral``, ``moe_dsv3_ep8``, each with
``:bf16`` or ``:fp8`` for the experts' dtype), a model (a shipped name such as ``llama3_8b`` or a folder with a
``config.json``; ``:tp8`` for a tensor-parallel rank, ``+lm_head`` to keep the head), or a CSV of shapes (an untuned
list: ``M,N,K`` and optional AITER columns; for fused MoE AITER's untuned fmoe columns). ``--m`` replaces the M
values (MoE: token counts) of every set built from (N, K) pairs or a model, and filters the shipped rows and CSVs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from aiter_gemm.backends.base import ACT_TYPES, GemmProblem, MoeProblem, Problem
from aiter_gemm.configs import load_table, load_untuned
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.fileio import file_problem
from aiter_gemm.settings import default_config_dir
from benchmarks.providers import A16W16, BLOCKSCALE, MOE
from gradlib.models import MOE_DTYPES, load_arch, model_problems, moe_experts, moe_problems, projections

log = logging.getLogger(__name__)

Shape = tuple[str, Problem]

#: Linears of models whose shapes are not in the shipped CSV: (N, K) per projection, q/k/v and gate/up fused (vLLM
#: layout, TP 1). Llama-3.2-3B's o / gate_up / down are Phi-3-mini's.
HELDOUT_MODELS: dict[str, list[tuple[int, int]]] = {
    "qwen2_5_7b": [(4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944)],
    "phi3_mini": [(9216, 3072), (3072, 3072), (16384, 3072), (3072, 8192)],
    "gemma2_9b": [(8192, 3584), (3584, 4096), (28672, 3584), (3584, 14336)],
    "llama3_2_3b": [(5120, 3072)],
}
#: M off the tuned grid (1, 2, 4, ..., 8192): padded rows, defaults and JSON buckets serve them.
HELDOUT_MS = (1, 3, 5, 12, 24, 40, 100, 200, 333, 777, 1500, 3000, 6000)
OFFGRID_MS = (3, 24, 100, 333, 777, 1500, 3000)
MODEL_MS = tuple(2 ** i for i in range(14))  # 1 .. 8192, the tuned grid
#: Block-scale op: DeepSeek-V3 dense linears (AITER's a8w8_blockscale_untuned_gemm_ds_v3.csv) and Llama-3-70B (TP1).
DSV3_NK = ((256, 7168), (2112, 7168), (3072, 1536), (4096, 512), (512, 7168), (7168, 2048))
LLAMA70B_FP8_NK = ((10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672))
#: Off-grid FP8 (N, K): DeepSeek-V3 TP8 and Llama-3-70B; (7168, 2304) and (7168, 256) have no torch path (K % 512).
FP8_OFFGRID_NK = ((2112, 7168), (3072, 1536), (4096, 512), (7168, 2048), (4608, 7168), (7168, 2304), (512, 7168),
                  (7168, 256), (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672))
FP8_MS = (1, 16, 64, 256, 1024, 4096, 8192)
#: FP8 checkpoints whose linears no shipped table holds (vLLM layout, TP 1): Qwen3-8B-FP8 and Qwen3-32B-FP8
#: (qkv, o, gate_up, down), at M on and off the tuned grid, 1 to 8192.
HELDOUT_FP8_MODELS: dict[str, list[tuple[int, int]]] = {
    "qwen3_8b_fp8": [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)],
    "qwen3_32b_fp8": [(10240, 5120), (5120, 8192), (51200, 5120), (5120, 25600)],
}
HELDOUT_FP8_MS = (1, 3, 5, 16, 40, 64, 100, 136, 256, 1000, 2500, 4096, 8192)
#: DeepGEMM's published dense-GEMM shapes (N, K) (its README, H800), at M 64, 128 and 4096.
DEEPGEMM_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
TINY = {A16W16: ((1, 96, 80), (17, 64, 200), (3, 128, 256)), BLOCKSCALE: ((16, 128, 256), (3, 256, 512))}
#: Fused MoE: tiny experts for CPU smoke runs (T, H, I, E, k): one expert without a token at T = 1.
TINY_MOE = ((1, 128, 64, 4, 2), (5, 128, 64, 4, 2))
#: The token counts of the MoE sets: decode (1-64), then prefill.
MOE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 512, 1024, 4096)
#: MoE sets: name -> (shipped model config, tp, ep, doc). DeepSeek-V3 EP8 is each rank's 32 of the 256 routed experts
#: with every token routed to k = 8 of them: the rank's work for the tokens it receives (gradlib.models.moe_experts).
MOE_SETS = {
    "moe_qwen3_30b": ("qwen3_30b_a3b", 1, 1, "Qwen3-30B-A3B experts (E 128, k 8, H 2048, I 768)"),
    "moe_mixtral": ("mixtral_8x7b", 1, 1, "Mixtral-8x7B experts (E 8, k 2, H 4096, I 14336)"),
    "moe_dsv3_ep8": ("deepseek_v3", 1, 8, "DeepSeek-V3 EP8: 32 local experts, k 8 over them, H 7168, I 2048"),
}
SHIPPED_FILE = {A16W16: ("GEMM_BF16", "bf16_tuned_gemm.csv"),
                BLOCKSCALE: ("GEMM_A8W8_BLOCKSCALE", "a8w8_blockscale_tuned_gemm.csv")}


@dataclass(frozen=True)
class ShapeSet:
    """A registered set: ``build(op, ms, ident)`` -> (label, problem) pairs; ``ms`` overrides its M values."""

    name: str
    ops: tuple[str, ...]
    doc: str
    build: Callable[..., list[Shape]]
    #: Suffixes ``name:OPTION`` takes (the MoE sets' experts dtype), passed to ``build`` as ``option``.
    options: tuple[str, ...] = ()


_SETS: dict[str, ShapeSet] = {}


def register_set(s: ShapeSet) -> None:
    _SETS[s.name] = s


def sets_for(op: str) -> list[ShapeSet]:
    return [s for s in _SETS.values() if op in s.ops]


def problem(op: str, M: int, N: int, K: int) -> GemmProblem:
    """The op's problem at (M, N, K): bf16 in and out, or fp8 e4m3 in with bf16 out."""
    dtype = torch.float8_e4m3fn if op == BLOCKSCALE else torch.bfloat16
    return GemmProblem(M, N, K, False, dtype, torch.bfloat16)


def _grid(op: str, label: str, nks: Sequence[tuple[int, int]], ms: Sequence[int]) -> list[Shape]:
    return [(label, problem(op, m, n, k)) for n, k in nks for m in ms]


def shipped_keys(op: str, ident: DeviceIdentity) -> list[tuple[int, int, int]]:
    """(M, N, K) of every shipped tuned row for ``ident``'s device; the rows of every device when it has none (a
    CPU run of the sets keeps their shapes)."""
    kind, name = SHIPPED_FILE[op]
    rows = list(load_table(kind, [default_config_dir() / name]))
    mine = [r for r in rows if r.gfx in (None, ident.gfx) and r.cu_num == ident.cu_num] or rows
    return list(dict.fromkeys(tuple(r.key[:3]) for r in mine))


def nk_labels() -> dict[tuple[int, int], str]:
    """(N, K) -> the shipped model shape list it comes from (``llama3_8b``, ``llama3_70b_tp8``)."""
    out: dict[tuple[int, int], str] = {}
    for path in sorted((default_config_dir() / "model_configs").glob("*_untuned_gemm.csv")):
        for key in load_untuned(path):
            out.setdefault((key[1], key[2]), path.name[: -len("_untuned_gemm.csv")])
    return out


def _shipped(op: str, ms: Sequence[int] | None, ident: DeviceIdentity) -> list[Shape]:
    labels = nk_labels() if op == A16W16 else {nk: "dsv3" for nk in DSV3_NK} | {
        nk: "llama3_70b" for nk in LLAMA70B_FP8_NK}
    return [(labels.get((n, k), "shipped"), problem(op, m, n, k)) for m, n, k in shipped_keys(op, ident)
            if not ms or m in ms]


def _offgrid(op: str, ms: Sequence[int] | None, ident: DeviceIdentity) -> list[Shape]:
    if op == BLOCKSCALE:
        return _grid(op, "fp8", FP8_OFFGRID_NK, ms or OFFGRID_MS)
    labels = nk_labels()
    nks = sorted({(n, k) for _, n, k in shipped_keys(op, ident)})
    return [(labels.get(nk, "shipped"), problem(op, m, *nk)) for nk in nks for m in (ms or OFFGRID_MS)]


def _heldout(op: str, ms: Sequence[int] | None, ident: DeviceIdentity) -> list[Shape]:
    return [s for model, nks in HELDOUT_MODELS.items() for s in _grid(op, model, nks, ms or HELDOUT_MS)]


def _tiny(op: str, ms: Sequence[int] | None, ident: DeviceIdentity) -> list[Shape]:
    if op == MOE:
        return [("tiny", MoeProblem(t, h, i, e, k, ACT_TYPES["silu"])) for t, h, i, e, k in TINY_MOE
                if not ms or t in ms]
    return [("tiny", problem(op, m, n, k)) for m, n, k in TINY[op] if not ms or m in ms]


def _moe(op: str, ms: Sequence[int] | None, ident: DeviceIdentity, option: str | None = None, *, name: str
         ) -> list[Shape]:
    """A shipped model's routed experts on one rank (:data:`MOE_SETS`) at ``ms`` (default :data:`MOE_TOKENS`), in
    ``option``'s dtype (default the checkpoint's); labelled ``<set>_<dtype>``."""
    model, tp, ep, _ = MOE_SETS[name]
    m = moe_experts(model, tp, ep)
    dtype = option or ("fp8" if m.fp8 else "bf16")
    return [(f"{name}_{dtype}", p) for p in moe_problems(m, ms or MOE_TOKENS, dtype)]


register_set(ShapeSet("shipped", (A16W16, BLOCKSCALE), "every row of the shipped tuned CSV for this device",
                      _shipped))
register_set(ShapeSet("offgrid", (A16W16, BLOCKSCALE), "the shipped (N, K) at M off the tuned grid (bf16); "
                      "DeepSeek-V3 TP8 and Llama-3-70B (N, K) at off-grid M (fp8)", _offgrid))
register_set(ShapeSet("heldout", (A16W16,), "Qwen2.5-7B, Phi-3-mini, Gemma-2-9B, Llama-3.2-3B linears (none "
                      "shipped) at off-grid M", _heldout))
register_set(ShapeSet("tiny", (A16W16, BLOCKSCALE, MOE), "tiny shapes: CPU smoke runs", _tiny))
for _name, (_model, _tp, _ep, _doc) in MOE_SETS.items():
    register_set(ShapeSet(_name, (MOE,), f"{_doc}, T {MOE_TOKENS[0]}..{MOE_TOKENS[-1]}; :bf16 / :fp8 for the "
                          "experts' dtype (default the checkpoint's)", partial(_moe, name=_name),
                          options=tuple(MOE_DTYPES)))
register_set(ShapeSet("heldout_fp8", (BLOCKSCALE,), "Qwen3-8B-FP8 and Qwen3-32B-FP8 linears (none shipped), M 1..8192 "
                      "on and off the grid", lambda op, ms, ident: [
                          s for model, nks in HELDOUT_FP8_MODELS.items()
                          for s in _grid(op, model, nks, ms or HELDOUT_FP8_MS)]))
register_set(ShapeSet("deepgemm", (BLOCKSCALE,), "DeepGEMM's published dense shapes at M 64, 128, 4096",
                      lambda op, ms, ident: _grid(op, "deepgemm", DEEPGEMM_NK, ms or (64, 128, 4096))))
register_set(ShapeSet("dsv3", (BLOCKSCALE,), "DeepSeek-V3 dense linears, M 1..8192",
                      lambda op, ms, ident: _grid(op, "dsv3", DSV3_NK, ms or FP8_MS)))
register_set(ShapeSet("llama3_70b_fp8", (BLOCKSCALE,), "Llama-3-70B (TP1) FP8 linears, M 1..8192",
                      lambda op, ms, ident: _grid(op, "llama3_70b", LLAMA70B_FP8_NK, ms or FP8_MS)))


def _model(op: str, spec: str, ms: Sequence[int] | None) -> list[Shape]:
    """``name[:tpN][+lm_head]``: a model's projections on one rank at ``ms`` (default the tuned grid)."""
    if op == MOE:
        raise ValueError(f"a model's dense linears are no {MOE} shapes (its sets: {', '.join(MOE_SETS)})")
    head = spec.endswith("+lm_head")
    spec = spec.removesuffix("+lm_head")
    name, _, tp_s = spec.partition(":tp")
    tp = int(tp_s) if tp_s else 1
    arch = load_arch(name)
    probs = model_problems(arch, tp, ms or MODEL_MS)
    if not head:
        last = projections(arch, tp)[-1]
        probs = [p for p in probs if (p.N, p.K) != (last.N, last.K)]
    label = f"{Path(name).name}_tp{tp}"
    return [(label, problem(op, p.M, p.N, p.K) if op == BLOCKSCALE else p) for p in probs]


def _csv(op: str, path: str, ms: Sequence[int] | None) -> list[Shape]:
    missing = file_problem(path)
    if missing is not None:
        raise ValueError(f"set {path!r}: CSV {missing}")
    label = Path(path).stem
    if op == MOE:  # AITER's untuned fmoe columns
        return [(label, MoeProblem(*key)) for key in load_untuned(path, "FMOE") if not ms or key[0] in ms]
    return [(label, problem(op, *key[:3]) if op == BLOCKSCALE else GemmProblem(*key)) for key in load_untuned(path)
            if not ms or key[0] in ms]


def build_sets(op: str, spec: str, ms: Sequence[int] | None, ident: DeviceIdentity) -> list[tuple[str, Shape]]:
    """(set name, (label, problem)) for each item of the comma list ``spec``, duplicates within a set dropped."""
    out: list[tuple[str, Shape]] = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        name, _, option = item.partition(":")
        if name in _SETS and (option or item == name):
            found = _SETS[name]
            if op not in found.ops:
                raise ValueError(f"set {name!r} has no {op} shapes (it serves {', '.join(found.ops)})")
            if option and option not in found.options:
                raise ValueError(f"set {item!r}: {name} takes " + (f"one of :{', :'.join(found.options)}"
                                                                    if found.options else "no option"))
            shapes = found.build(op, ms, ident, **({"option": option} if option else {}))
        elif item.endswith(".csv") or Path(item).is_file():
            shapes = _csv(op, item, ms)
        else:
            try:
                shapes = _model(op, item, ms)
            except (ValueError, OSError) as exc:
                known = ", ".join(sorted(_SETS))
                raise ValueError(f"set {item!r}: not a registered set ({known}), a CSV, or a model ({exc})") from None
        seen: set[Problem] = set()
        for label, p in shapes:
            if p not in seen:
                seen.add(p)
                out.append((Path(item).stem if item.endswith(".csv") else item, (label, p)))
    return out
