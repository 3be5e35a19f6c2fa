"""Ship measured winners as shipped data (``python -m gradlib.ship``): what writes ``configs/`` besides the tuners.

* ``rows``: the fastest ``skinny:``/``triton:`` provider of each shape of a benchmark CSV (``python -m
  benchmarks.run --bench bf16 --timing graph``, paired with ``flinear`` and ``dispatch``) becomes a tuned row, if it
  beat F.linear by ``--min_gain`` (1.02: a smaller win is not worth a Triton launch) and the dispatch as shipped (its
  row may already be a faster cuBLASLt solution). Its ``err_ratio`` is measured here on the GPU with the tuner's
  check (``aiter_gemm.accuracy``: fraction of outputs outside the bf16 tolerance, against float32) and a row with any
  error is not shipped; ``us`` is the paired median, ``pad_m_min`` = M (the benchmark timed this M only).
* ``min-gain``: a tuner run's rows with ``--min_gain`` applied after the fact, from its ``--summary_file``
  (``torch_us``: F.linear timed in the same search): a non-torch winner less than ``--min_gain`` times faster is
  written as a torch row carrying F.linear's time (for runs made before the tuner had the rule).
* ``triton-json``: the per-(N, K) and per-arch Triton JSON configs of ``gemm_a16w16``
  (``configs/triton/{arch}-GEMM-A16W16[-N=..-K=..].json``) from benchmark CSVs timing ``triton:<kernelName>``
  providers: per (N, K, M) the config with the best mean time over the files (configs timed in all of them); the
  arch file takes, per M, the config with the best geometric-mean slowdown over every (N, K).

Rows are merged into ``--out`` under its lock with an atomic rename, replacing rows of the same key; other rows stay.
Inputs, ``--out`` and ``--min_gain`` are checked before anything runs (exit 2 with the usage and one line naming the
problem); ``rows`` needs a CUDA GPU.

    python -m gradlib.ship rows --results bf16_H100.csv --out configs/bf16_tuned_gemm.csv
    python -m gradlib.ship min-gain --tuned run.csv --summary run_summary.csv --out configs/bf16_tuned_gemm.csv
    python -m gradlib.ship triton-json --results run1.csv run2.csv --arch sm_90 --out configs/triton
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from aiter_gemm.configs import BF16_TUNED_COLUMNS, parse_size
from aiter_gemm.fileio import atomic_write_text, file_problem, merge_csv_rows, read_csv_rows, write_error
from gradlib.cli import gain
from gradlib.results import row_key

log = logging.getLogger("gradlib")
SHIPPABLE = ("skinny", "triton")
#: A row's identity as the runtime and the tuner type it (``bf16`` = ``torch.bfloat16``, ``0`` = ``False``).
KEY = row_key("gemm_a16w16")


def _float(x: str | None) -> float:
    try:
        return float(x) if x not in (None, "") else math.nan
    except ValueError:
        return math.nan


def medians(rows: Iterable[dict], mode: str = "graph") -> dict[tuple[int, int, int], dict[str, float]]:
    """Per (M, N, K): each timed provider's median us in ``mode`` (a benchmark CSV has one ``us`` per provider and
    baseline pair; they are the same median)."""
    out: dict[tuple[int, int, int], dict[str, float]] = {}
    for r in rows:
        us = _float(r.get("us"))
        if r.get("mode") != mode or not us > 0 or r.get("bias", "False") not in ("False", "false", "0", ""):
            continue
        out.setdefault((parse_size(r["M"]), parse_size(r["N"]), parse_size(r["K"])), {})[r["provider"]] = us
    return out


def winner(times: dict[str, float], min_gain: float) -> tuple[str, float] | None:
    """(provider, us) of the fastest shippable provider, if ``min_gain`` x faster than ``flinear`` and faster than
    ``dispatch`` (both must have been timed with it); None otherwise."""
    cands = {k: v for k, v in times.items() if k.partition(":")[0] in SHIPPABLE and k.partition(":")[2]}
    if not cands or "flinear" not in times or "dispatch" not in times:
        return None
    name = min(cands, key=cands.get)
    us = cands[name]
    return (name, us) if us * min_gain <= times["flinear"] and us < times["dispatch"] else None


def row_for(M: int, N: int, K: int, provider: str, us: float) -> dict[str, str]:
    """The tuned row of ``provider`` (``skinny:<name>`` / ``triton:<name>``) at (M, N, K) on this GPU, its
    ``err_ratio`` measured by the tuner's check through the backend's own runner."""
    import torch

    from aiter_gemm import current_device_identity
    from aiter_gemm.accuracy import err_ratio, tolerance_for
    from aiter_gemm.backends.base import GemmProblem, Solution
    from aiter_gemm.ops.a16w16 import GEMM_A16W16
    from aiter_gemm.registry import get_backend
    from gradlib.results import metrics

    ident = current_device_identity(on_gpu=True)
    libtype, _, name = provider.partition(":")
    p = GemmProblem(M, N, K)
    backend = get_backend(libtype)
    cfg = backend.select(p, Solution(libtype, -1, 0, name), ident)
    gen = torch.Generator(device="cuda").manual_seed(p.M + p.N + p.K)
    a = torch.randn(p.M, p.K, generator=gen, device="cuda").bfloat16()
    w = (torch.randn(p.N, p.K, generator=gen, device="cuda") / math.sqrt(p.K)).bfloat16()
    out = backend.runner(cfg, ident)(a, w, None, torch.bfloat16)
    err = err_ratio(out, a.float() @ w.float().t(), tolerance_for(torch.bfloat16, torch.bfloat16))
    sol = backend.solution_of(cfg)
    tflops, bw = metrics(p, us)
    return {**GEMM_A16W16.key_row(ident, p), "libtype": sol.libtype, "solidx": str(sol.solidx),
            "splitK": str(sol.splitK), "us": f"{us:.4f}", "kernelName": sol.kernelName, "err_ratio": f"{err:.4f}",
            "tflops": tflops, "bw": bw,
            "pad_m_min": str(p.M), "timing": "graph"}


def ship_rows(results: Sequence[str], out: str, min_gain: float) -> int:
    rows = []
    for (M, N, K), times in medians(r for path in results for r in read_csv_rows(path)[1]).items():
        won = winner(times, min_gain)
        if won is None:
            log.info("M=%d N=%d K=%d: nothing beat F.linear by %sx and the dispatch; nothing shipped", M, N, K,
                     min_gain)
            continue
        row = row_for(M, N, K, *won)
        if float(row["err_ratio"]) > 0:
            log.warning("M=%d N=%d K=%d: %s err_ratio %s: not shipped", M, N, K, won[0], row["err_ratio"])
            continue
        rows.append(row)
        log.info("M=%d N=%d K=%d: %s %.2f us (F.linear %.2f, dispatch %.2f)", M, N, K, won[0], won[1],
                 times["flinear"], times["dispatch"])
    added, replaced = merge_csv_rows(out, BF16_TUNED_COLUMNS, rows, KEY, replace=lambda old, new: True)
    log.info("%s: %d rows replaced, %d added", out, replaced, added)
    return 0


def apply_min_gain(tuned: list[dict], summary: list[dict], min_gain: float) -> tuple[list[dict], int]:
    """(rows, how many became torch rows): see the module docstring, ``min-gain``."""
    torch_us = {KEY(r): float(r["torch_us"]) for r in summary if r.get("torch_us")}
    out, swapped = [], 0
    for r in tuned:
        base = torch_us.get(KEY(r))
        if r["libtype"] != "torch" and base is not None and base < float(r["us"]) * min_gain:
            scale = float(r["us"]) / base  # tflops and bw scale inversely with time
            r = {**r, "libtype": "torch", "solidx": "0", "splitK": "0", "kernelName": "F.linear",
                 "us": f"{base:.4f}", "err_ratio": "0.0", "tflops": f"{float(r['tflops']) * scale:.2f}",
                 "bw": f"{float(r['bw']) * scale:.2f}"}
            swapped += 1
        out.append(r)
    return out, swapped


def triton_json(results: Sequence[str], arch: str) -> dict[str, dict]:
    """File name -> JSON content of the Triton configs (see the module docstring, ``triton-json``)."""
    from aiter_gemm.kernels.gemm_a16w16 import GemmConfig

    runs = [medians(read_csv_rows(path)[1]) for path in results]
    times: dict[tuple[int, int, int], dict[str, float]] = {}
    for shape in set.intersection(*(set(r) for r in runs)) if runs else set():
        names = set.intersection(*({k for k in r[shape] if k.startswith("triton:")} for r in runs))
        times[shape] = {n.partition(":")[2]: sum(r[shape][n] for r in runs) / len(runs) for n in names}

    def entry(name: str) -> dict:
        c = GemmConfig.from_name(name)
        return {"BLOCK_SIZE_M": c.BLOCK_SIZE_M, "BLOCK_SIZE_N": c.BLOCK_SIZE_N, "BLOCK_SIZE_K": c.BLOCK_SIZE_K,
                "GROUP_SIZE_M": c.GROUP_SIZE_M, "NUM_KSPLIT": c.NUM_KSPLIT, "num_warps": c.num_warps,
                "num_stages": c.num_stages, "TMA_PERSISTENT": c.TMA_PERSISTENT, "TMA_FLATTEN": c.FLATTEN}

    def table(best: dict[int, str]) -> dict:  # runs of one config collapse into its largest M; the last is "any"
        ms = sorted(best)
        return {("any" if i == len(ms) - 1 else f"M_LEQ_{m}"): entry(best[m])
                for i, m in enumerate(ms) if i + 1 == len(ms) or best[ms[i + 1]] != best[m]}

    files: dict[str, dict] = {}
    for n, k in sorted({(n, k) for _, n, k in times}):
        best = {m: min(t, key=t.get) for (m, nn, kk), t in times.items() if (nn, kk) == (n, k) and t}
        if best:
            files[f"{arch}-GEMM-A16W16-N={n}-K={k}.json"] = table(best)
    overall = {}
    for m in sorted({m for m, _, _ in times}):
        shapes = [t for (mm, _, _), t in times.items() if mm == m and t]
        common = set.intersection(*(set(t) for t in shapes)) if shapes else set()
        if common:
            slow = {c: math.exp(sum(math.log(t[c] / min(t.values())) for t in shapes) / len(shapes)) for c in common}
            overall[m] = min(sorted(slow), key=slow.get)
    if overall:
        files[f"{arch}-GEMM-A16W16.json"] = table(overall)
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gradlib.ship", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    rows = sub.add_parser("rows", help="benchmark winners -> tuned rows (GPU)")
    rows.add_argument("--results", nargs="+", required=True, help="benchmark CSVs (python -m benchmarks.run)")
    rows.add_argument("--out", required=True, help="tuned CSV to merge into")
    rows.add_argument("--min_gain", type=gain, default=1.02)
    mg = sub.add_parser("min-gain", help="apply --min_gain to a tuner run's rows")
    mg.add_argument("--tuned", required=True)
    mg.add_argument("--summary", required=True, help="the run's --summary_file")
    mg.add_argument("--out", required=True)
    mg.add_argument("--min_gain", type=gain, default=1.02)
    tj = sub.add_parser("triton-json", help="benchmark CSVs of triton:<kernelName> providers -> JSON configs")
    tj.add_argument("--results", nargs="+", required=True)
    tj.add_argument("--arch", default="sm_90")
    tj.add_argument("--out", required=True, help="folder, e.g. configs/triton")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    inputs = [*getattr(args, "results", ()), *(getattr(args, n) for n in ("tuned", "summary") if hasattr(args, n))]
    for path in inputs:
        why = file_problem(path)
        if why is not None:
            ap.error(f"{path}: {why}")
    why = write_error(args.out, folder=args.cmd == "triton-json")
    if why is not None:
        ap.error(f"--out {args.out}: {why}")
    if args.cmd == "rows":
        import torch

        if not torch.cuda.is_available():
            ap.error("rows measures each winner's err_ratio on a CUDA GPU; this machine has none")
    if args.cmd == "rows":
        return ship_rows(args.results, args.out, args.min_gain)
    if args.cmd == "min-gain":
        out, swapped = apply_min_gain(read_csv_rows(args.tuned)[1], read_csv_rows(args.summary)[1], args.min_gain)
        added, replaced = merge_csv_rows(args.out, BF16_TUNED_COLUMNS, out, KEY,
                                         replace=lambda old, new: True)
        log.info("%d rows (%d winners within %sx of F.linear kept as torch): %d added, %d replaced in %s", len(out),
                 swapped, args.min_gain, added, replaced, args.out)
        return 0
    files = triton_json(args.results, args.arch)
    if not files:
        ap.error("no triton:<kernelName> timings common to every --results file")
    for name, content in files.items():
        atomic_write_text(Path(args.out) / name, json.dumps(content, indent=2) + "\n")
        log.info("wrote %s", Path(args.out) / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
