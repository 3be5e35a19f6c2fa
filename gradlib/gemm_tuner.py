"""``python -m gradlib.gemm_tuner`` / ``gemm-tuner``: tune the shapes of an untuned CSV (or of a model's
``config.json``) over every registered backend and merge the winners into a tuned CSV the runtime replays.

Examples::

    gemm-tuner -i bf16_untuned_gemm.csv -o bf16_tuned_gemm.csv            # captured shapes, all GPUs
    gemm-tuner --model_dir configs/model_configs/llama3_70b --tp 8 --nsets 1,32,512 -o llama70b_tp8.csv
    gemm-tuner --model_dir configs/model_configs/llama3_8b --print_shapes  # derived untuned CSV on stdout

Exit status: 0 every shape tuned or already tuned; 1 some shape had no valid candidate; 2 bad arguments or input;
3 workers could not start; 130 interrupted (what finished is saved).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from aiter_gemm import backends
from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.capture import untuned_row
from aiter_gemm.configs import BF16_UNTUNED_COLUMNS, ConfigError, load_untuned
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.dtypes import FP8_DTYPES, parse_dtype
from aiter_gemm.fileio import read_csv_rows, render_csv
from gradlib.models import ModelConfigError, load_arch, model_problems
from gradlib.pool import Executor, PoolError, ProcessPool, scoped_env
from gradlib.results import CheckpointWriter, Roofline, roofline_for, tuned_problems
from gradlib.search import SearchOptions, ShapeOutcome, ShapeSearch, run_searches
from gradlib.tasks import import_plugins

log = logging.getLogger("gradlib")

# On CPU, "--libtype all" means these: other backends (Triton) run only interpreted there, which is for testing.
CPU_DEFAULT_LIBTYPES = ("torch",)
DEFAULT_NSETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
EXIT_OK, EXIT_FAILED_SHAPES, EXIT_USAGE, EXIT_POOL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class UsageError(ValueError):
    """Bad arguments or input files: exit status 2 with the message."""


def int_list(text: str) -> list[int]:
    """argparse type: comma- or space-separated integers."""
    try:
        return [int(x) for x in text.replace(" ", ",").split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gemm-tuner", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_argument_group("shapes")
    src.add_argument("-i", "--input_file", help="untuned CSV (M,N,K[,bias,dtype,outdtype,scaleAB,bpreshuffle]); "
                     "default bf16_untuned_gemm.csv unless --model_dir is given. Only read, never written.")
    src.add_argument("--model_dir", help="folder with a Hugging Face config.json, or the name of a shipped one "
                     "(llama3_8b, llama3_70b, qwen2_5_7b, mistral_7b): derive qkv, o, gate_up, down and lm_head "
                     "shapes (M = tokens, N = out features per TP rank, K = in features)")
    src.add_argument("--tp", type=int, default=1, help="tensor-parallel degree for --model_dir (default 1)")
    src.add_argument("--nsets", type=int_list, default=list(DEFAULT_NSETS),
                     help="token counts M for --model_dir, comma-separated (default 1,2,4,...,8192)")
    src.add_argument("--batch_size", type=int_list, default=None,
                     help="sequence counts for lm_head's M (it sees one token per sequence; default: --nsets)")
    src.add_argument("--indtype", help="input dtype (bf16, fp16, fp32, fp8); overrides the file's dtype column")
    src.add_argument("--outdtype", help="output dtype; overrides the file's outdtype (default: the input dtype)")
    src.add_argument("--all_bias", action="store_true", help="tune every shape both with and without bias")
    src.add_argument("--print_shapes", action="store_true", help="print the untuned CSV of the shapes and exit")
    out = ap.add_argument_group("output")
    out.add_argument("-o", "--tuned_file", default="bf16_tuned_gemm.csv",
                     help="tuned CSV to merge winners into (created if missing; other rows are kept)")
    out.add_argument("--profile_file", help="CSV receiving every candidate's result (phase, time, err_ratio, error)")
    out.add_argument("--summary_file", help="CSV receiving one row per shape: winner, time, TFLOP/s, %% of roofline, "
                     "torch time and speedup, candidate counts, wall time")
    out.add_argument("--all", action="store_true", help="retune shapes the tuned file already has (and replace them)")
    out.add_argument("--batch", type=int, default=8, help="checkpoint the tuned file every this many shapes (8)")
    srch = ap.add_argument_group("search")
    srch.add_argument("--libtype", default="all", help="backends to tune: comma list or 'all' (default all; on a "
                      "CPU-only machine 'all' is torch only, name triton to time it interpreted)")
    srch.add_argument("--errRatio", type=float, default=0.05, help="max fraction of output elements outside the "
                      "dtype's tolerance for a candidate to win (default 0.05)")
    srch.add_argument("--min_gain", type=float, default=1.02, help="a winner other than torch must be this many "
                      "times faster than F.linear, else torch is kept (default 1.02: H100 timing noise, see "
                      "BENCHMARKS.md); 1.0 keeps the plain fastest")
    srch.add_argument("--screen_top", type=int, default=20, help="BLASLt solutions kept after phase 1 (20)")
    srch.add_argument("--screen_libtypes", default="", help="comma list of non-BLASLt backends to screen in phase 1 "
                      "as well (their --screen_top fastest go to phase 2): faster on large config spaces, off by "
                      "default")
    srch.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    run = ap.add_argument_group("execution")
    run.add_argument("--mp", type=int, default=None, help="worker processes, one per GPU (default: every visible "
                     "GPU; 1 on CPU)")
    add_ray_argument(run)
    run.add_argument("--timeout", type=float, default=60.0, help="seconds one candidate may take, JIT compilation "
                     "included, before its worker is killed and it is recorded failed (60)")
    run.add_argument("--plugin", action="append", default=[], help="module to import in every process before "
                     "tuning (registers extra backends); also GRADLIB_PLUGINS=mod1,mod2")
    run.add_argument("--peak_tflops", type=float, help="peak TFLOP/s for %% of roofline (default: measured table)")
    run.add_argument("--peak_bw", type=float, help="peak GB/s for %% of roofline (default: measured table)")
    run.add_argument("--verbose", "-v", action="store_true", help="log progress and the top candidates per shape")
    return ap


# ---- shapes -------------------------------------------------------------------------------------------------
def load_problems(args: argparse.Namespace) -> list[GemmProblem]:
    """The shapes to tune, from --model_dir or the input file, with dtype overrides and --all_bias applied."""
    try:
        dtype = parse_dtype(args.indtype) if args.indtype else None
        otype = parse_dtype(args.outdtype) if args.outdtype else None
    except KeyError as exc:
        raise UsageError(f"--indtype/--outdtype: {exc.args[0]}") from None
    if args.model_dir:
        if args.input_file:
            raise UsageError("give either --input_file or --model_dir, not both")
        arch = load_arch(args.model_dir)
        problems = [_fp8_scaled(p, has_scale_col=False, otype_given=otype is not None)
                    for p in model_problems(arch, args.tp, args.nsets, args.batch_size, dtype or torch.bfloat16,
                                            otype or dtype or torch.bfloat16)]
    else:
        path = args.input_file or "bf16_untuned_gemm.csv"
        if not os.path.isfile(path):
            raise UsageError(f"input file {path} not found (capture shapes with AITER_TUNE_GEMM=1 or use --model_dir)")
        if os.path.abspath(path) == os.path.abspath(args.tuned_file):
            raise UsageError(f"--input_file and --tuned_file are the same file {path}; the input is never written")
        header = read_csv_rows(path)[0]
        has_out = "outdtype" in header
        problems = []
        for key in load_untuned(path):
            p = GemmProblem(*key)
            new_dtype = dtype or p.dtype
            new_otype = otype or (p.otype if has_out else new_dtype)
            problems.append(_fp8_scaled(replace(p, dtype=new_dtype, otype=new_otype), "scaleAB" in header,
                                        otype is not None or has_out))
    if args.all_bias:
        problems = [replace(p, bias=b) for p in problems for b in (False, True)]
    return list(dict.fromkeys(problems))


def _fp8_scaled(p: GemmProblem, has_scale_col: bool, otype_given: bool) -> GemmProblem:
    """fp8 GEMMs run with per-tensor scales (``gemm_a16w16(xq, wq, otype=bf16, scale_a=, scale_b=)``): unless the
    shape list says otherwise (a ``scaleAB`` / ``outdtype`` column, ``--outdtype``), tune them as the runtime will
    key them, ``scaleAB=True`` with a bf16 output."""
    if p.dtype not in FP8_DTYPES:
        return p
    return replace(p, scaleAB=p.scaleAB if has_scale_col else True,
                   otype=p.otype if otype_given else torch.bfloat16)


def resolve_libtypes(spec: str, on_gpu: bool) -> tuple[str, ...]:
    """``--libtype`` as backend names; an unknown or unavailable name is a usage error naming the reason."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise UsageError("--libtype is empty")
    if names == ["all"]:
        if not on_gpu:
            return CPU_DEFAULT_LIBTYPES
        return tuple(b.name for b in backends.available_backends())
    known = backends.known_backends()
    for n in names:
        if n not in known:
            raise UsageError(f"--libtype {n!r}: no such backend; known: {', '.join(known)}")
        b = backends.get_backend(n)
        if not b.is_available():
            raise UsageError(f"--libtype {n!r} is not available here: {b.unavailable_reason()}")
    return tuple(dict.fromkeys(names))


def worker_devices(mp: int | None) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES value per worker: the visible GPUs in order (``mp`` of them); [None]*mp on CPU."""
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n_gpu == 0:
        return [None] * (mp or 1)
    mp = mp or n_gpu
    if mp > n_gpu:
        raise UsageError(f"--mp {mp} but only {n_gpu} GPU(s) are visible (one worker per GPU)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else [str(i) for i in range(n_gpu)]
    return ids[:mp]


# ---- reporting ------------------------------------------------------------------------------------------------
def _roofline(args: argparse.Namespace, ident: DeviceIdentity) -> Roofline | None:
    """--peak_tflops / --peak_bw where given, else the measured table's entry for this device (or None)."""
    base = roofline_for(ident)
    flops = args.peak_tflops * 1e12 if args.peak_tflops else (base.flops if base else None)
    bw = args.peak_bw * 1e9 if args.peak_bw else (base.bytes if base else None)
    if flops is None or bw is None:
        return None
    return Roofline(flops, bw, "command line" if args.peak_tflops or args.peak_bw else base.source)


def _describe(sol) -> str:
    name = sol.kernelName if len(sol.kernelName) <= 40 else sol.kernelName[:37] + "..."
    return f"{sol.libtype}[{sol.solidx},{sol.splitK}] {name}".rstrip()


def format_table(outcomes: list[ShapeOutcome], roof: Roofline | None) -> str:
    """One line per shape: winner, time, TFLOP/s, % of roofline, speedup over the torch baseline."""
    head = (f"{'M':>6} {'N':>6} {'K':>6} {'bias':>5}  {'winner':<52} {'us':>10} {'TFLOPS':>8} {'%roof':>6} "
            f"{'torch us':>10} {'speedup':>7} {'ok/cands':>8} {'wall s':>7}")
    lines = [head, "-" * len(head)]
    for o in sorted(outcomes, key=lambda o: o.shape_id):  # input order
        p, w, b = o.problem, o.winner, o.baseline
        full = [c for c in o.candidates if c.phase == "full"]
        ok = sum(1 for c in full if c.result.ok)
        base_us = b.us if b is not None else math.inf
        if w is None:
            why = "; ".join(o.errors)[:52] or "no valid candidate"
            lines.append(f"{p.M:>6} {p.N:>6} {p.K:>6} {p.bias!s:>5}  {'FAILED: ' + why:<52} {'-':>10} {'-':>8} "
                         f"{'-':>6} {base_us:>10.3f} {'-':>7} {ok:>3}/{len(full):<4} {o.wall_s:>7.1f}")
            continue
        roof_s = f"{100 * roof.fraction(p, w.us):>5.1f}%" if roof else f"{'-':>6}"
        speed = f"{base_us / w.us:>6.2f}x" if math.isfinite(base_us) else f"{'-':>7}"
        lines.append(f"{p.M:>6} {p.N:>6} {p.K:>6} {p.bias!s:>5}  {_describe(w.solution):<52} {w.us:>10.3f} "
                     f"{p.flops / w.us / 1e6:>8.2f} {roof_s} {base_us:>10.3f} {speed} {ok:>3}/{len(full):<4} "
                     f"{o.wall_s:>7.1f}")
    return "\n".join(lines)


def _top(o: ShapeOutcome, n: int = 5) -> str:
    rows = [f"  {_describe(c.solution):<52} {c.us:>10.3f} us  err {c.result.err_ratio:.4f}"
            + ("" if c.result.ok else f"  ({c.result.error[:60]})") for c in o.ranked()[:n]]
    p = o.problem
    return f"M={p.M} N={p.N} K={p.K} bias={p.bias}: top {len(rows)}\n" + "\n".join(rows)


# ---- main -----------------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="[gradlib] %(levelname)s %(message)s")
    plugins = [*args.plugin, *[m.strip() for m in os.environ.get("GRADLIB_PLUGINS", "").split(",") if m.strip()]]
    try:
        problems = load_problems(args)
        if args.print_shapes:
            sys.stdout.write(render_csv(BF16_UNTUNED_COLUMNS, [untuned_row(p) for p in problems]))
            return EXIT_OK
        if args.min_gain < 1.0:
            raise UsageError("--min_gain must be >= 1.0")
        if args.batch < 1 or args.timeout <= 0 or not (0 <= args.errRatio <= 1) or args.screen_top < 1:
            raise UsageError("--batch and --screen_top must be >= 1, --timeout > 0, 0 <= --errRatio <= 1")
        devices = executor_devices(args)
        on_gpu = devices[0] is not None
        # CPU: Triton kernels run only interpreted, and the variable must be set before a kernel module is imported
        # (in the workers, and here for the availability check, without leaking into a caller's process).
        env = {} if on_gpu else {"TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1")}
        with scoped_env(env):
            import_plugins(plugins)
            libtypes = resolve_libtypes(args.libtype, on_gpu)
    except (UsageError, ConfigError, ModelConfigError, ImportError) as exc:
        print(f"gemm-tuner: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return tune(args, problems, libtypes, build_executor(args, devices, plugins, env))


def add_ray_argument(group: argparse._ArgumentGroup) -> None:
    """``--ray ADDRESS``: shared by every tuner CLI that builds its executor with :func:`build_executor`."""
    group.add_argument("--ray", metavar="ADDRESS", default=None,
                       help="run on a Ray cluster instead of local processes: 'auto' (the cluster 'ray start' "
                       "started on this machine), HOST:6379, ray://HOST:10001 (Ray client), or 'local' (a private "
                       "one-machine Ray instance); one actor per cluster GPU (--mp caps it). Needs "
                       "pip install 'aiter_gemm[ray]' on the driver and every node")


def executor_devices(args: argparse.Namespace) -> list[str | None]:
    """One entry per worker slot (None: a CPU worker): the local GPUs for ``--mp``, the cluster's with ``--ray``."""
    if not getattr(args, "ray", None):
        return worker_devices(args.mp)
    from gradlib.ray_executor import ray_worker_devices  # ImportError (no Ray) -> exit 2 with the install hint

    try:
        devices = ray_worker_devices(args.ray, args.mp)
    except (ConnectionError, ValueError) as exc:
        raise UsageError(f"--ray {args.ray}: {exc}") from None
    if devices[0] is not None and not torch.cuda.is_available():
        # --libtype is resolved against the backends this process can load: here that would silently be torch only.
        raise UsageError(f"--ray {args.ray}: the cluster's actors run on GPUs but this driver sees none; run the "
                         "tuner on a GPU node of the cluster (backend availability is checked on the driver)")
    return devices


def build_executor(args: argparse.Namespace, devices: list[str | None], plugins: list[str],
                   env: dict[str, str | None]) -> Executor:
    """The executor of this run: Ray actors with ``--ray``, else the ``--mp`` process pool (one worker per
    device). ``devices`` comes from :func:`executor_devices`."""
    if getattr(args, "ray", None):
        from gradlib.ray_executor import RayExecutor

        return RayExecutor(args.ray, devices, plugins, args.timeout, extra_env=env)
    return ProcessPool(devices, plugins, args.timeout, extra_env=env)


def start_executor(pool: Executor, prog: str) -> int | None:
    """Start ``pool``; if that fails, close it, say why and return the exit status (None: it started)."""
    try:
        pool.start()
    except PoolError as exc:
        pool.close()
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_POOL
    except KeyboardInterrupt:
        pool.close()
        return EXIT_INTERRUPTED
    return None


def drive(pool: Executor, searches: list, on_outcome, on_item, writer) -> tuple[bool, PoolError | None]:
    """Run the searches to the end, or until Ctrl-C or a pool failure; the checkpoint is written and the pool
    closed either way. Returns (interrupted, pool error)."""
    try:
        run_searches(pool, searches, on_outcome, on_item)
    except KeyboardInterrupt:
        return True, None
    except PoolError as exc:
        return False, exc
    finally:
        writer.flush()
        pool.close()
    return False, None


def exit_status(prog: str, pool_error: PoolError | None, interrupted: bool, failed: int) -> int:
    """The tuners' exit status (README): pool failure 3, interrupted 130, some shape without a winner 1, else 0."""
    if pool_error is not None:
        print(f"{prog}: error: {pool_error}", file=sys.stderr)
        return EXIT_POOL
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED_SHAPES if failed else EXIT_OK


def tune(args: argparse.Namespace, problems: list[GemmProblem], libtypes: tuple[str, ...], pool: Executor) -> int:
    """Start the executor, skip tuned shapes, run the searches with checkpoints, print the table and summary.
    ``pool`` is any :class:`~gradlib.pool.Executor` (the ``--mp`` process pool; a Ray actor pool plugs in here)."""
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    t0 = time.monotonic()
    failed = start_executor(pool, "gemm-tuner")
    if failed is not None:
        return failed
    ident = pool.identity
    try:
        done = set() if args.all else tuned_problems(args.tuned_file, ident)
    except ConfigError as exc:
        pool.close()
        print(f"gemm-tuner: error: tuned file unusable: {exc}", file=sys.stderr)
        return EXIT_USAGE
    todo = [p for p in problems if p not in done]
    skipped = len(problems) - len(todo)
    log.info("device %s (gfx=%s cu_num=%d), %d worker(s), libtypes %s: %d shape(s), %d already tuned",
             ident.name, ident.gfx, ident.cu_num, pool.slots, ",".join(libtypes), len(problems), skipped)
    screen_libs = tuple(n.strip() for n in args.screen_libtypes.split(",") if n.strip())
    opts = SearchOptions(libtypes, err_ratio=args.errRatio, screen_top=args.screen_top, seed=args.seed,
                         screen_libtypes=screen_libs, min_gain=args.min_gain)
    searches = [ShapeSearch(i, p, opts) for i, p in enumerate(todo)]
    roof = _roofline(args, ident)
    writer = CheckpointWriter(args.tuned_file, ident, args.batch, args.all, args.profile_file, args.summary_file, roof)
    outcomes: list[ShapeOutcome] = []
    counts = {"items": 0, "failed_items": 0}
    with logging_redirect_tqdm(), \
            tqdm(total=len(todo), desc="shapes", unit="shape", position=0, disable=None) as shape_bar, \
            tqdm(total=0, desc="candidates", unit="cand", position=1, leave=False, disable=None) as cand_bar:

        items_of: dict[int, int] = {}  # items done per shape
        current = {"shape": -1}

        def on_item(search: ShapeSearch, res) -> None:
            counts["items"] += 1
            counts["failed_items"] += not res.ok
            done_here = items_of[search.shape_id] = items_of.get(search.shape_id, 0) + 1
            if current["shape"] != search.shape_id:  # the bar follows the shape last heard of
                current["shape"] = search.shape_id
                p = search.problem
                cand_bar.set_description(f"M={p.M} N={p.N} K={p.K}{' bias' if p.bias else ''}", refresh=False)
            cand_bar.total = search.planned
            cand_bar.n = done_here
            cand_bar.refresh()

        def on_outcome(o: ShapeOutcome) -> None:
            outcomes.append(o)
            writer.add(o)
            shape_bar.update(1)
            if args.verbose:
                tqdm.write(_top(o))

        interrupted, pool_error = drive(pool, searches, on_outcome, on_item, writer)
    if outcomes:
        print(format_table(outcomes, roof))
    tuned = sum(o.tuned for o in outcomes)
    failed = len(outcomes) - tuned
    unfinished = len(todo) - len(outcomes)
    print(f"gemm-tuner: {tuned} tuned, {skipped} skipped (already in {args.tuned_file}), {failed} failed"
          + (f", {unfinished} not finished" if unfinished else "")
          + f"; {counts['items']} items run ({counts['failed_items']} failed), {pool.restarts} worker restart(s); "
          f"{pool.slots} worker(s) on {ident.gfx}/{ident.cu_num}; wall {time.monotonic() - t0:.1f} s; "
          f"rows written to {args.tuned_file}" + (f", all candidates in {args.profile_file}" if args.profile_file
                                                   else ""))
    return exit_status("gemm-tuner", pool_error, interrupted, failed)


if __name__ == "__main__":
    sys.exit(main())
