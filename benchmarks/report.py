"""BENCHMARKS.md's tables, rendered as markdown from committed raw files (``python -m benchmarks.run report``).

Inputs: the harness's CSVs (:data:`benchmarks.measure.COLUMNS`), the raw files of the scripts it replaced (converted
by :mod:`benchmarks.legacy`), and ``hf_decode``'s ``results.json.gz``. Tables (``--table``):

* ``summary``: per (set, baseline, mode) the shapes, geomean ratio, worst shape and how many fall below the bar
  (``--bars``, default issue 13's: graph 0.98, eager 0.97); ``identical`` adds the spread of shapes whose dispatch
  runs the baseline's own kernel in both modes (bf16: plain F.linear; fp8, graph mode: torch's block-scaled matmul):
  the method's own noise.
* ``mclass``: geomean and minimum per M class (<= 16, 17-256, > 256, all); ``bym`` the same per M.
* ``matrix``: one row per (label, N, K), one column per M; the cell is the ratio (``--cell ratio``), the ratio with
  the dispatch's libtype (``ratio+lib``), the time (``us``) or the roofline fraction (``roof``).
* ``overhead``, ``layer``, ``host``: the dispatch-overhead and decoder-layer benchmarks, and host / GPU time per
  eager call, as they are.
* ``hf``: ``hf_decode`` runs (``results.json.gz``): graph and eager speedup with the A/A control, per batch and phase.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import re
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path

from aiter_gemm.fileio import read_csv_rows
from benchmarks import legacy
from benchmarks.hf_summary import arm_times, summarize

LIB = {"cublaslt": "c", "skinny": "s", "triton": "t", "tilelang": "l", "torch": "f", "deepgemm": "d"}
DEFAULT_BARS = {"graph": 0.98, "eager": 0.97}


def read_text(path: str | Path) -> str:
    """A raw file's text, gunzipped where its name ends in ``.gz`` (large raw files are stored compressed)."""
    path = Path(path)
    if path.suffix == ".gz":
        with gzip.open(path, "rt", newline="") as f:
            return f.read()
    return path.read_text()


def load_rows(path: str | Path) -> list[dict]:
    """Rows of a harness CSV (``.csv`` or ``.csv.gz``), or of a raw file the harness replaced (converted); ValueError
    if neither."""
    path = Path(path)
    if path.suffix == ".gz":
        reader = csv.DictReader(io.StringIO(read_text(path)))
        rows = list(reader)
        header = list(reader.fieldnames or [])
    else:
        header, rows = read_csv_rows(path)
    if {"bench", "provider", "mode"} <= set(header):
        return _fill_roof(path, rows)
    conv = legacy.convert(path)
    if conv is None:
        raise ValueError(f"{path}: neither a harness CSV nor a raw file the report knows (header {header[:6]}...)")
    return conv


def _fill_roof(path: Path, rows: list[dict]) -> list[dict]:
    """Rows of a dense run made before its GPU had a :data:`gradlib.results.ROOFLINES` entry get their ``roof`` cells
    from that entry now (the device named by the run's ``<stem>_env.json``; the same roofline_us as at run time)."""
    todo = [r for r in rows if r.get("bench") in ("bf16", "fp8") and not r.get("roof") and num(r.get("us")) > 0]
    env_path = path.with_name(re.sub(r"\.csv(\.gz)?$", "", path.name) + "_env.json")
    if not todo or not env_path.is_file():
        return rows
    import torch

    from aiter_gemm.backends.base import GemmProblem
    from aiter_gemm.device import DeviceIdentity
    from benchmarks.measure import roofline_us
    from benchmarks.providers import BENCH_OPS
    from gradlib.results import ROOFLINES

    name = str(json.loads(env_path.read_text()).get("device", ""))
    ident = next((DeviceIdentity(gfx, cu, "cuda", name) for gfx, cu, part, _ in ROOFLINES if part and part in name),
                 None)
    if ident is None:
        return rows
    for r in todo:
        fp8 = r["bench"] == "fp8"
        p = GemmProblem(int(r["M"]), int(r["N"]), int(r["K"]), r.get("bias") == "True",
                        torch.float8_e4m3fn if fp8 else torch.bfloat16, torch.bfloat16)
        roof = roofline_us(BENCH_OPS[r["bench"]], p, ident)
        if roof is not None:
            r["roofline_us"], r["roof"] = f"{roof:.4f}", f"{roof / num(r['us']):.4f}"
    return rows


def num(x: object) -> float:
    """A CSV cell as a float; NaN for an empty or non-numeric cell."""
    try:
        return float(x) if x not in (None, "") else math.nan
    except (TypeError, ValueError):
        return math.nan


def geomean(xs: Iterable[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan


def select(rows: Sequence[dict], provider: str | None = None, vs: str | None = None, mode: str | None = None,
           sets: Sequence[str] | None = None) -> list[dict]:
    """Rows with a ratio for ``provider`` against ``vs`` in ``mode`` (None: any), in ``sets`` if given."""
    return [r for r in rows if (provider is None or r["provider"] == provider) and (vs is None or r.get("vs") == vs)
            and (mode is None or r["mode"] == mode) and (not sets or r["set"] in sets)
            and not math.isnan(num(r.get("ratio")))]


def _shape(r: dict) -> str:
    return f"({r['M']}, {r['N']}, {r['K']})"


def _table(header: Sequence[str], align: str, body: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def summary(rows: Sequence[dict], provider: str = "dispatch", bars: dict[str, float] | None = None,
            identical: bool = False) -> str:
    """Per (benchmark, set, baseline, mode): shapes, geomean, worst shape, shapes below the bar."""
    bars = bars or DEFAULT_BARS
    groups: dict[tuple, list[dict]] = {}
    for r in select(rows, provider):
        groups.setdefault((r["bench"], r["set"], r["vs"], r["mode"]), []).append(r)
    body = []
    for (bench, s, vs, mode), rs in groups.items():
        ratios = [num(r["ratio"]) for r in rs]
        worst = min(rs, key=lambda r: num(r["ratio"]))
        bar = bars.get(mode, math.nan)
        below = sum(x < bar for x in ratios)
        body.append((bench, s, vs, mode, len(rs), f"{geomean(ratios):.3f}",
                     f"{num(worst['ratio']):.3f} {_shape(worst)}", f"{below} < {bar}"))
    out = _table(("bench", "set", "vs", "mode", "shapes", "geomean", "min (M, N, K)", "below bar"),
                 ("---", "---", "---", "---", "---:", "---:", "---", "---:"), body)
    if identical:
        out += "\n\n" + identical_calls(rows)
    return out


#: Per benchmark, (the baseline whose own kernel the dispatch runs where its libtype is ``torch`` in both modes, the
#: modes where that is identical work): bf16 plain F.linear; fp8 torch's block-scaled matmul, the same copies and
#: kernel on the GPU, graph mode only (eagerly the dispatch's runner skips F.scaled_mm's wrapper: less host time).
IDENTICAL_BASELINES = {"bf16": ("flinear", ("graph", "eager")), "fp8": ("torch_blockscale", ("graph",))}


def identical_calls(rows: Sequence[dict]) -> str:
    """The spread of dispatch / baseline where the dispatch runs the baseline's own kernel in both modes
    (:data:`IDENTICAL_BASELINES`): identical work, so whatever the ratios show is the method's resolution."""
    body = []
    for bench, (vs, modes) in IDENTICAL_BASELINES.items():
        for mode in modes:
            aa = sorted(num(r["ratio"]) for r in select(rows, "dispatch", vs, mode)
                        if r.get("bench") == bench and r.get("libtype") == r.get("eager_libtype") == "torch")
            if len(aa) >= 2:
                q = statistics.quantiles(aa, n=20, method="inclusive")
                body.append((f"{bench} vs {vs}", mode, len(aa), f"{geomean(aa):.3f}", f"{q[0]:.3f}", f"{q[-1]:.3f}",
                             f"{aa[0]:.3f}", f"{aa[-1]:.3f}"))
    return _table(("identical calls (the dispatch runs the baseline's kernel)", "mode", "shapes", "geomean", "5%",
                   "95%", "min", "max"), ("---", "---", "---:", "---:", "---:", "---:", "---:", "---:"), body)


M_CLASSES = (("M <= 16", 1, 16), ("M 17-256", 17, 256), ("M > 256", 257, 1 << 40), ("all", 1, 1 << 40))


def mclass(rows: Sequence[dict], provider: str, vs: str, mode: str) -> str:
    """Geomean and minimum of ``provider`` / ``vs`` per M class."""
    rs = select(rows, provider, vs, mode)
    body = []
    for name, lo, hi in M_CLASSES:
        part = [r for r in rs if lo <= int(r["M"]) <= hi]
        if part:
            worst = min(part, key=lambda r: num(r["ratio"]))
            body.append((name, len(part), f"{geomean(num(r['ratio']) for r in part):.3f}",
                         f"{num(worst['ratio']):.3f} {_shape(worst)}"))
    return _table(("shapes", "count", f"{provider} / {vs} (geomean)", "min (M, N, K)"),
                  ("---", "---:", "---:", "---"), body)


def by_m(rows: Sequence[dict], provider: str, vs: str, mode: str) -> str:
    """Per M: how many shapes, the geomean, the worst and the best shape of ``provider`` / ``vs``."""
    groups: dict[int, list[dict]] = {}
    for r in select(rows, provider, vs, mode):
        groups.setdefault(int(r["M"]), []).append(r)
    body = []
    for m, part in sorted(groups.items()):
        lo = min(part, key=lambda r: num(r["ratio"]))
        hi = max(part, key=lambda r: num(r["ratio"]))
        body.append((m, len(part), f"{geomean(num(r['ratio']) for r in part):.3f}",
                     f"{num(lo['ratio']):.3f} ({lo['N']}, {lo['K']})",
                     f"{num(hi['ratio']):.3f} ({hi['N']}, {hi['K']})"))
    return _table(("M", "shapes", f"{provider} / {vs} (geomean)", "min (N, K)", "max (N, K)"),
                  ("---:", "---:", "---:", "---", "---"), body)


def _cell(r: dict, cell: str) -> str:
    if cell == "us":
        return f"{num(r['us']):.2f}"
    if cell == "roof":
        return f"{num(r.get('roof')):.2f}"
    text = f"{num(r['ratio']):.3f}"
    if cell == "ratio+lib" and r.get("libtype"):
        text += f" {LIB.get(r['libtype'], r['libtype'][:1])}"
    return text


def matrix(rows: Sequence[dict], provider: str, vs: str, mode: str, cell: str = "ratio") -> str:
    """Rows (label, N, K), columns M, cells per ``cell``; an empty cell: not measured."""
    rs = select(rows, provider, vs, mode)
    ms = sorted({int(r["M"]) for r in rs})
    grid: dict[tuple, dict[int, str]] = {}
    for r in rs:
        grid.setdefault((r["label"], int(r["N"]), int(r["K"])), {})[int(r["M"])] = _cell(r, cell)
    body = [(label, n, k, *(cells.get(m, "") for m in ms)) for (label, n, k), cells in grid.items()]
    out = _table(("label", "N", "K", *(f"M={m}" for m in ms)), ("---", "---:", "---:", *("---:",) * len(ms)), body)
    if cell == "ratio+lib":
        out += ("\n\nc = cublaslt, s = skinny, t = triton, l = tilelang, f = torch (F.linear itself; for the "
                "block-scale op, torch's block-scaled matmul)")
    return out


def overhead(rows: Sequence[dict]) -> str:
    body = [(r["label"], r["provider"], r["vs"], f"{num(r['vs_us']):.3f}", f"{num(r['us']):.3f}",
             f"{num(r['added_us']):+.3f}") for r in rows if r["bench"] == "overhead"]
    return _table(("case", "ours", "vs", "vs us", "ours us", "added us"),
                  ("---", "---", "---", "---:", "---:", "---:"), body)


_AB_FILE = re.compile(r"^([AB])_(ext|python)_(\d+)_")


def overhead_ab(folders: Sequence[str | Path]) -> str:
    """The A/B of ``benchmarks/overhead_ab.sh``: per path (C++ ``ext`` / ``python``) and case, the median over the
    rounds of the host time added over the library call, [min-max], for checkout A and checkout B."""
    added: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for folder in folders:
        for path in sorted(Path(folder).glob("[AB]_*.csv")):
            m = _AB_FILE.match(path.name)
            if m is None:
                continue
            side, mode = m.group(1), m.group(2)
            for r in load_rows(path):
                if r["bench"] == "overhead":
                    added.setdefault((mode, r["label"], r["provider"]), {}).setdefault(side, []).append(
                        num(r["added_us"]))
    if not added:
        raise ValueError(f"no <A|B>_<ext|python>_<round>_*.csv overhead files in {', '.join(map(str, folders))}")

    def cell(xs: list[float] | None) -> str:
        return "" if not xs else f"{statistics.median(xs):+.2f} [{min(xs):+.2f} {max(xs):+.2f}]"

    order = {"ext": 0, "python": 1}
    body = [(mode, label, provider, len(sides.get("A", [])), cell(sides.get("A")), cell(sides.get("B")))
            for (mode, label, provider), sides in sorted(added.items(), key=lambda kv: order[kv[0][0]])]
    return _table(("path", "case", "ours", "rounds", "A: added us", "B: added us"),
                  ("---", "---", "---", "---:", "---:", "---:"), body)


def layer(rows: Sequence[dict]) -> str:
    by: dict[tuple, dict] = {}
    for r in select(rows, "dispatch", "flinear"):
        by[(int(r["M"]), r["mode"])] = r
    body = [(m, mode, f"{num(r['vs_us']):.1f}", f"{num(r['us']):.1f}", f"{num(r['ratio']):.3f}")
            for (m, mode), r in sorted(by.items())]
    return _table(("M", "mode", "F.linear layer us", "gemm_a16w16 layer us", "speedup"),
                  ("---:", "---", "---:", "---:", "---:"), body)


def host(rows: Sequence[dict]) -> str:
    """Per shape: what the dispatch decided (graph / eager), host us to submit one call and GPU us per call, F.linear
    against the dispatch."""
    by: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r["mode"] == "host" and r["provider"] in ("flinear", "dispatch") and r.get("us"):
            by.setdefault((int(r["M"]), int(r["N"]), int(r["K"])), {})[r["provider"]] = r
    body = [(f"{m}, {n}, {k}", f"{d.get('libtype', '')}/{d.get('eager_libtype', '')}", f"{num(f['us']):.1f}",
             f"{num(d['us']):.1f}", f"{num(f['gpu_us']):.1f}", f"{num(d['gpu_us']):.1f}")
            for (m, n, k), pair in by.items() if len(pair) == 2 for f, d in [(pair["flinear"], pair["dispatch"])]]
    return _table(("M, N, K", "decision (graph/eager)", "host us F.linear", "host us ours", "GPU us F.linear",
                   "GPU us ours"), ("---", "---", "---:", "---:", "---:", "---:"), body)


def hf(paths: Sequence[str | Path]) -> str:
    """One row per (batch, phase): graph and eager speedup (median of per-round without / with) and A/A, each run
    of ``paths`` a column group; a run with a bf16 arm (the FP8 loop's ``vs_bf16``) adds bf16 / with per mode."""
    runs = [json.loads(read_text(p))["summary"] for p in paths]
    keys = list(dict.fromkeys((s["batch"], s["phase"]) for s in runs[0]))
    header = ["batch", "phase"]
    bf16 = [any("vs_bf16" in s for s in run) for run in runs]
    for i in range(len(runs)):
        tag = f" ({i + 1})" if len(runs) > 1 else ""
        header += [f"graph{tag}", f"graph A/A{tag}", f"eager{tag}", f"eager A/A{tag}"]
        header += [f"graph bf16/with{tag}", f"eager bf16/with{tag}"] if bf16[i] else []
    body = []
    for batch, phase in keys:
        row: list[object] = [batch, phase]
        for run, has_bf16 in zip(runs, bf16):
            by_mode = {mode: next((s for s in run if (s["batch"], s["phase"], s["mode"]) == (batch, phase, mode)),
                                  None) for mode in ("graph", "eager")}
            for s in by_mode.values():
                row += ["", ""] if s is None else [_ranged(s, "speedup", "round_ratio"), _aa(s)]
            if has_bf16:
                row += ["" if s is None or "vs_bf16" not in s else _ranged(s, "vs_bf16", "vs_bf16")
                        for s in by_mode.values()]
        body.append(row)
    return _table(header, ("---:", "---", *("---:",) * (len(header) - 2)), body)


def _ranged(s: dict, key: str, prefix: str) -> str:
    return f"{s[key]:.3f} [{s[prefix + '_min']:.3f}-{s[prefix + '_max']:.3f}]"


def hf_rounds(path: str | Path) -> list[dict]:
    """The per-round timings of an ``hf_decode`` results.json.gz: inline (``rounds``) or in the gzipped CSV it names
    (``rounds_file``, beside it)."""
    path = Path(path)
    res = json.loads(read_text(path))
    if "rounds" in res:
        return res["rounds"]
    with gzip.open(path.parent / res["rounds_file"], "rt", newline="") as f:
        return [{**r, "batch": int(r["batch"]), "ms": float(r["ms"])} for r in csv.DictReader(f)]


def median_ci(xs: Sequence[float], level: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A bootstrap confidence interval of the median of ``xs`` (percentile method, fixed seed: the same table every
    time): how far a pooled per-round ratio can be trusted when single rounds swing by 0.2-4x."""
    import numpy as np

    a = np.asarray(xs, dtype=float)
    rng = np.random.default_rng(seed)
    meds = np.median(a[rng.integers(0, len(a), (resamples, len(a)))], axis=1)
    lo, hi = np.percentile(meds, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def _round_ratios(runs: Sequence[Sequence[dict]], base: str = "without", main: str = "with"
                  ) -> dict[tuple, list[float]]:
    """Per (batch, phase, mode) the per-round ratios ``base`` / ``main`` of every run, paired within each run."""
    out: dict[tuple, list[float]] = {}
    for run in runs:
        for (_, b, mode, phase), a in arm_times(run).items():
            out.setdefault((b, phase, mode), []).extend(x / y for x, y in zip(a[base], a[main]))
    return out


def hf_pooled(paths: Sequence[str | Path]) -> str:
    """Runs of the same ``hf_decode`` configurations pooled: per (batch, phase, mode) the median per-round ratio over
    the rounds of every run (each run's rounds paired as in that run) with its 95% bootstrap interval, its A/A, and
    each run's own median."""
    runs = [hf_rounds(p) for p in paths]
    pooled = {(s["batch"], s["phase"], s["mode"]): s for s in summarize([r for run in runs for r in run], 1)}
    each = [{(s["batch"], s["phase"], s["mode"]): s for s in summarize(run, 1)} for run in runs]
    ratios = _round_ratios(runs)
    body = [(b, phase, mode, s["rounds"], f"{s['speedup']:.4f}", "[{:.4f}, {:.4f}]".format(*median_ci(ratios[k])),
             "" if "aa_ratio" not in s else f"{s['aa_ratio']:.4f}",
             " / ".join(f"{e[k]['speedup']:.3f}" if k in e else "-" for e in each))
            for k, s in sorted(pooled.items(), key=lambda kv: (kv[0][0], kv[0][1] != "prefill", kv[0][2]))
            for b, phase, mode in [k]]
    return _table(("batch", "phase", "mode", "rounds", "pooled speedup", "95% interval", "pooled A/A", "per run"),
                  ("---:", "---", "---", "---:", "---:", "---", "---:", "---"), body)


def _aa(s: dict) -> str:
    v = s.get("aa_ratio")
    return "" if v is None else f"{v:.3f}"
