"""The benchmark harness's one entry point.

    python -m benchmarks.run --bench bf16 --set shipped,heldout --providers flinear,dispatch,maxautotune \\
        --timing graph,eager --out $OUT            # one CSV per benchmark and GPU, plus <csv stem>_env.json
    python -m benchmarks.run --bench fp8 --set shipped --providers torch_blockscale,flinear,dispatch \\
        --baselines torch_blockscale,flinear --out $OUT
    python -m benchmarks.run --bench moe --set moe_qwen3_30b,moe_qwen3_30b:fp8 \\
        --providers grouped_mm,default,dispatch,weight_read --baselines grouped_mm,default,weight_read --out $OUT
    python -m benchmarks.run --bench overhead --out $OUT     # host time the dispatch adds (tiny shapes)
    python -m benchmarks.run --bench layer --set llama3_8b --m 1,8,32,128,2048 --out $OUT
    python -m benchmarks.run --bench roofline --out $OUT     # bf16 matmul peak, copy bandwidth: the ROOFLINES entry
    python -m benchmarks.run report FILE [--table summary|mclass|bym|matrix|overhead|overhead_ab|layer|host|hf|
        hf_pooled] ...
    python -m benchmarks.run plot FILE --out DIR --stem NAME
    python -m benchmarks.run tables BENCHMARKS.md [--write]  # check (or regenerate) every table it quotes
    python -m benchmarks.run list                            # providers and shape sets

``--bench bf16`` / ``fp8`` / ``moe`` time every provider of ``--providers`` on every shape of ``--set`` in each mode of
``--timing`` (``graph``: CUDA-graph replays; ``eager``: loops of calls, host cost included; ``host``: host and GPU
time per call), paired against each of ``--baselines`` (default: the first provider); see
:mod:`benchmarks.providers`, :mod:`benchmarks.shapes` and :mod:`benchmarks.measure`. Arguments are checked before
anything runs (``--out`` a folder that can be written, ``--device`` one this machine has, the providers' arguments,
the sets' files, positive counts): exit 2 with the usage and one line naming the problem.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import shlex
import sys
import time
from pathlib import Path

import torch

import aiter_gemm
from aiter_gemm.cliargs import device_arg, non_negative_float, positive_int
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.fileio import atomic_write_text, file_problem, render_csv, write_error
from aiter_gemm.ops.fused_moe import ROUTINGS
from benchmarks import env as envmod
from benchmarks import report as rep
from benchmarks.measure import COLUMNS, EAGER_PAIRS, GRAPH_PAIRS, DeviceTimer, GemmBench, Timer
from benchmarks.providers import BENCH_OPS, MOE, providers_for, resolve
from benchmarks.shapes import build_sets, sets_for

log = logging.getLogger("benchmarks")
BENCHES = (*BENCH_OPS, "overhead", "layer", "roofline")
MODES = ("graph", "eager", "host")


def _ints(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return out


def _check_roofline(ap: argparse.ArgumentParser, args: argparse.Namespace, device: torch.device,
                    modes: list[str]) -> None:
    """``ap.error`` where ``--bench roofline`` cannot measure: a set it does not have, host timing, or a CPU device
    for the peak set (a GPU's ceilings are timed on that GPU; on CPU only ``--set tiny``, a smoke run)."""
    from benchmarks.roofline import SETS

    if (args.set or "peak") not in SETS:
        ap.error(f"--set {args.set}: --bench roofline has the sets {', '.join(SETS)}")
    if "host" in modes:
        ap.error("--timing host: --bench roofline times GPU work only (graph, or eager)")
    if device.type != "cuda" and (args.set or "peak") != "tiny":
        ap.error("--bench roofline measures a GPU's matmul peak and copy bandwidth: it times on a GPU only "
                 "(on CPU: --set tiny, a smoke run whose numbers are no roofline)")


def bench_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--bench", choices=BENCHES, default="bf16")
    ap.add_argument("--set", default=None, help="comma list of shape sets, models or CSVs (default: shipped; moe: "
                    "moe_qwen3_30b,moe_mixtral,moe_dsv3_ep8; layer: llama3_8b; roofline: peak, or tiny: a smoke run)")
    ap.add_argument("--m", type=_ints, default=None, help="M values replacing the sets' own")
    ap.add_argument("--providers", default=None, help="comma list of provider specs name[:arg] (default: "
                    "flinear,dispatch; fp8: torch_blockscale,flinear,dispatch; moe: grouped_mm,default,dispatch,"
                    "weight_read)")
    ap.add_argument("--baselines", default=None, help="providers every other is paired against (default: the first)")
    ap.add_argument("--timing", default=None, help=f"comma list of {', '.join(MODES)} (default: graph on a GPU, "
                    "eager on CPU)")
    ap.add_argument("--out", default="bench_out", help="output folder (default: ./bench_out)")
    ap.add_argument("--name", default=None, help="file stem: <name>_<gpu>.csv (default: the --bench name)")
    ap.add_argument("--device", type=device_arg, default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--pairs", type=positive_int, default=GRAPH_PAIRS,
                    help=f"graph rounds per shape (default {GRAPH_PAIRS})")
    ap.add_argument("--eager_pairs", type=positive_int, default=EAGER_PAIRS,
                    help=f"eager rounds per shape (default {EAGER_PAIRS})")
    ap.add_argument("--deadline_s", type=non_negative_float, default=math.inf,
                    help="start no new shape after this many seconds")
    ap.add_argument("--compile_budget_s", type=non_negative_float, default=math.inf,
                    help="maxautotune: compile no more after this many seconds of the run")
    ap.add_argument("--calls", type=positive_int, default=20000, help="overhead: calls per loop")
    ap.add_argument("--repeats", type=positive_int, default=21, help="overhead: loops per case")
    ap.add_argument("--routing", choices=ROUTINGS, default="uniform", help="moe: how the tokens pick their experts "
                    "(uniform, or skewed: Zipf, a few experts get most tokens)")
    return ap


#: Per op: (default --providers, default --set).
DEFAULTS = {BENCH_OPS["bf16"]: ("flinear,dispatch", "shipped"),
            BENCH_OPS["fp8"]: ("torch_blockscale,flinear,dispatch", "shipped"),
            MOE: ("grouped_mm,default,dispatch,weight_read", "moe_qwen3_30b,moe_mixtral,moe_dsv3_ep8")}


def bench_plan(ap: argparse.ArgumentParser, args: argparse.Namespace, ident: DeviceIdentity
               ) -> tuple[str, list[str], list[str], list]:
    """(op, providers, baselines, shapes) of a bench's arguments on device ``ident``; ``ap.error`` (exit 2) on a
    provider, baseline or shape set the run cannot use."""
    op = BENCH_OPS[args.bench]
    default, default_set = DEFAULTS[op]
    providers = [p.strip() for p in (args.providers or default).split(",") if p.strip()]
    baselines = [p.strip() for p in (args.baselines or providers[0]).split(",") if p.strip()]
    try:
        for spec in providers:
            resolve(op, spec)
        shapes = build_sets(op, args.set or default_set, args.m, ident)
    except ValueError as exc:
        ap.error(str(exc))
    missing = [b for b in baselines if b not in providers]
    if missing:
        ap.error(f"--baselines {','.join(missing)}: not among --providers")
    return op, providers, baselines, shapes


def run_bench(argv: list[str], timer: Timer | None = None) -> int:
    ap = bench_parser()
    args = ap.parse_args(argv)
    device = args.device
    unwritable = write_error(args.out, folder=True)
    if unwritable is not None:
        ap.error(f"--out {args.out}: {unwritable}")
    modes = (args.timing or ("graph" if device.type == "cuda" else "eager")).split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"--timing {','.join(bad)}: not one of {', '.join(MODES)}")
    if device.type != "cuda" and timer is None and set(modes) & {"graph", "host"}:
        ap.error("--timing graph and host need a CUDA device (CPU runs time eagerly: --timing eager)")
    if args.bench == "roofline":
        _check_roofline(ap, args, device, modes)
    if args.bench in BENCH_OPS:  # providers, baselines and shape sets checked before anything is written
        ident = aiter_gemm.current_device_identity(on_gpu=device.type == "cuda")
        op, providers, baselines, shapes = bench_plan(ap, args, ident)
    torch.backends.cuda.matmul.allow_tf32 = False
    timer = timer or DeviceTimer(device, args.pairs, args.eager_pairs)
    csv_path, env_path = envmod.output_paths(args.out, args.name or args.bench, device)
    env = envmod.environment(device, argv)
    envmod.write_env(env_path, env)  # now, so a run stopped early still says what produced its CSV
    t0 = time.monotonic()
    if args.bench == "overhead":
        from benchmarks.overhead import run_overhead

        rows = run_overhead(device, args.calls, args.repeats)
        atomic_write_text(csv_path, render_csv(COLUMNS, rows))
    elif args.bench == "layer":
        from benchmarks.layer import run_layer

        rows = []
        for item in (args.set or "llama3_8b").split(","):
            name, _, tp = item.partition(":tp")
            rows += run_layer(name, int(tp or 1), args.m or [1, 8, 32, 128, 2048], modes, device, timer)
        atomic_write_text(csv_path, render_csv(COLUMNS, rows))
    elif args.bench == "roofline":
        from benchmarks import roofline

        rows = roofline.run_roofline(args.set or "peak", modes, device, timer)
        atomic_write_text(csv_path, render_csv(COLUMNS, rows))
        ident = aiter_gemm.current_device_identity(on_gpu=device.type == "cuda")
        source = f"benchmarks/results/roofline/{envmod.gpu_slug(device).lower()}_{env['commit']}/{csv_path.name}"
        log.info("%s", roofline.summary(rows, ident, source))
    else:
        inputs = {"routing": args.routing} if op == MOE else {}
        bench = GemmBench(args.bench, op, shapes, providers, baselines, modes, device, ident, timer, str(csv_path),
                          args.deadline_s, {"compile_budget_s": args.compile_budget_s, "inputs": inputs})
        rows = bench.run()
        env["skipped"] = bench.skipped
        env["shapes"] = len(shapes)
    env.update(bench=args.bench, modes=modes, wall_s=round(time.monotonic() - t0, 1),
               pairs={"graph": args.pairs, "eager": args.eager_pairs})
    envmod.write_env(env_path, env)
    log.info("wrote %s (%d rows) and %s", csv_path, len(rows), env_path)
    return 0


def report_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run report", description=rep.__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="harness CSVs, raw files of the replaced scripts, or results.json")
    ap.add_argument("--table", default="summary",
                    choices=("summary", "mclass", "bym", "matrix", "overhead", "overhead_ab", "layer", "host", "hf",
                             "hf_pooled"))
    ap.add_argument("--provider", default="dispatch")
    ap.add_argument("--vs", default="flinear")
    ap.add_argument("--mode", default="graph")
    ap.add_argument("--set", default=None, help="comma list: only these sets")
    ap.add_argument("--max-m", type=int, default=None, help="only shapes with M up to this (e.g. 256: decode)")
    ap.add_argument("--not-lib", default=None, help="only rows whose decision's libtype is not this (torch: the "
                    "shapes where the dispatch runs something other than plain F.linear)")
    ap.add_argument("--cell", choices=("ratio", "ratio+lib", "us", "roof"), default="ratio")
    ap.add_argument("--bars", default="graph=0.98,eager=0.97")
    ap.add_argument("--identical", action="store_true", help="summary: add the identical-calls spread")
    return ap


def render(argv: list[str], root: Path | None = None) -> str:
    """The markdown table ``report`` prints for ``argv`` (file paths relative to ``root`` when given); a file that
    is missing (a folder, for ``overhead_ab``), or that the table cannot read, is a usage error naming it."""
    ap = report_parser()
    args = ap.parse_args(argv)
    files = [str(Path(root, f)) if root is not None else f for f in args.files]
    _check_inputs(ap, files, folders=args.table == "overhead_ab")
    try:
        return _table(args, files)
    except ValueError as exc:  # a file of another kind, or without the rows the table needs
        ap.error(str(exc))


def _table(args: argparse.Namespace, files: list[str]) -> str:
    if args.table == "hf":
        return rep.hf(files)
    if args.table == "hf_pooled":
        return rep.hf_pooled(files)
    if args.table == "overhead_ab":
        return rep.overhead_ab(files)
    rows = [r for f in files for r in rep.load_rows(f)]
    if args.set:
        keep = set(args.set.split(","))
        rows = [r for r in rows if r["set"] in keep]
    if args.max_m is not None:
        rows = [r for r in rows if int(r["M"]) <= args.max_m]
    if args.not_lib:
        rows = [r for r in rows if r.get("libtype") != args.not_lib]
    if args.table == "summary":
        bars = {k: float(v) for k, v in (b.split("=") for b in args.bars.split(",") if b)}
        return rep.summary(rows, args.provider, bars, args.identical)
    if args.table in ("mclass", "bym"):
        return (rep.mclass if args.table == "mclass" else rep.by_m)(rows, args.provider, args.vs, args.mode)
    if args.table == "matrix":
        return rep.matrix(rows, args.provider, args.vs, args.mode, args.cell)
    return {"overhead": rep.overhead, "layer": rep.layer, "host": rep.host}[args.table](rows)


def _check_inputs(ap: argparse.ArgumentParser, paths: list[str], folders: bool = False) -> None:
    """``ap.error`` naming the first of ``paths`` that is not a readable file (a folder, with ``folders``)."""
    for path in paths:
        why = (None if Path(path).is_dir() else "is not a folder") if folders else file_problem(path)
        if why is not None:
            ap.error(f"{path}: {why}")


def run_report(argv: list[str]) -> int:
    print(render(argv))
    return 0


TABLE_OPEN = re.compile(r"^<!-- report: (.*) -->$")
TABLE_CLOSE = "<!-- /report -->"


def run_tables(argv: list[str]) -> int:
    """Regenerate every ``<!-- report: ARGS -->`` ... ``<!-- /report -->`` block of a markdown file from its raw files
    (paths relative to the file's folder). Without ``--write``: exit 1 naming each block that differs."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run tables", description=run_tables.__doc__)
    ap.add_argument("markdown", help="e.g. BENCHMARKS.md")
    ap.add_argument("--write", action="store_true", help="rewrite the blocks in place (atomically)")
    args = ap.parse_args(argv)
    _check_inputs(ap, [args.markdown])
    path = Path(args.markdown)
    lines = path.read_text().split("\n")
    out, stale, i = [], [], 0
    while i < len(lines):
        m = TABLE_OPEN.match(lines[i])
        out.append(lines[i])
        i += 1
        if not m:
            continue
        end = lines.index(TABLE_CLOSE, i)
        fresh = render(shlex.split(m.group(1)), path.parent).split("\n")
        if lines[i:end] != fresh:
            stale.append(m.group(1))
        out += fresh
        i = end
    if args.write:
        atomic_write_text(path, "\n".join(out))
        return 0
    for s in stale:
        log.error("%s: the table of 'report %s' differs from what its raw files give", path, s)
    return 1 if stale else 0


def run_plot(argv: list[str]) -> int:
    from benchmarks.plot import plot

    ap = argparse.ArgumentParser(prog="python -m benchmarks.run plot", description="PNG figures from a result file")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--stem", required=True, help="file names: <stem>_speedup.png, <stem>_roofline.png")
    ap.add_argument("--provider", default="dispatch")
    ap.add_argument("--vs", default="flinear")
    ap.add_argument("--mode", default="graph")
    ap.add_argument("--set", default=None, help="comma list: only these sets")
    args = ap.parse_args(argv)
    _check_inputs(ap, args.files)
    rows = [r for f in args.files for r in rep.load_rows(f)
            if not args.set or r["set"] in args.set.split(",")]
    for path in plot(rows, args.out, args.provider, args.vs, args.mode, args.stem):
        print(path)
    return 0


def run_list() -> int:
    for bench, op in BENCH_OPS.items():
        print(f"--bench {bench} ({op}) providers:")
        for p in providers_for(op):
            print(f"  {p.name:18} {p.doc}")
        print(f"--bench {bench} sets:")
        for s in sets_for(op):
            print(f"  {s.name:18} {s.doc}")
    print("a --set item may also be a model (llama3_8b, llama3_70b:tp8, a folder with config.json; +lm_head) or a CSV")
    return 0


def main(argv: list[str] | None = None, timer: Timer | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("aiter_gemm").setLevel(logging.WARNING)  # AITER's per-shape miss lines: noise here
    if argv[:1] == ["report"]:
        return run_report(argv[1:])
    if argv[:1] == ["plot"]:
        return run_plot(argv[1:])
    if argv[:1] == ["tables"]:
        return run_tables(argv[1:])
    if argv[:1] == ["list"]:
        return run_list()
    return run_bench(argv, timer)


if __name__ == "__main__":
    sys.exit(main())
