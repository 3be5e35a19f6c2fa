"""``python -m gradlib.gemm_tuner`` / ``gemm-tuner``: tune the shapes of an untuned CSV (or of a model's
``config.json``) over every registered backend and merge the winners into a tuned CSV the runtime replays.

Examples: :data:`EXAMPLES` (``gemm-tuner --help`` prints them).

AITER's flags work too (:mod:`gradlib.aiter_flags`): ``--untune_file``/``--tune_file``/``-o2``, ``--sort``,
``--compare``, ``--run_config``, ``--warmup``/``--iters``, ``GTUNE_INPUT``/``GTUNE_TUNED``/``GTUNE_MODEL``/
``GTUNE_TP``/``GTUNE_BATCH_SIZE``; docs/aiter.md lists what differs.

Exit status: :mod:`gradlib.cli` (0 all tuned, 1 some shape had no valid candidate, 2 bad arguments or input or an
output that cannot be written, 3 workers could not start, 4 an output could not be written at the end, 130/143
interrupted; what finished is saved).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace

import torch

from aiter_gemm import registry as backends
from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.configs import BF16_UNTUNED_COLUMNS, ConfigError, load_untuned
from aiter_gemm.dtypes import FP8_DTYPES, parse_dtype
from aiter_gemm.fileio import read_csv_rows, render_csv
from aiter_gemm.ops.a16w16 import GEMM_A16W16, dtype_error
from aiter_gemm.settings import scoped_env
from gradlib import cli
from gradlib.aiter_flags import (
    DIFFERENCES,
    add_aiter_flags,
    check_aiter_flags,
    compare_options,
    env_default,
    with_iterations,
)
from gradlib.cli import EXIT_OK, EXIT_USAGE, UsageError, fraction, gain, positive_float, positive_int, positive_int_list
from gradlib.driver import TuneJob, run
from gradlib.models import ModelConfigError, load_arch, model_problems
from gradlib.search import SearchOptions
from gradlib.tasks import import_plugins
from gradlib.tune_ops import tune_op

PROG = "gemm-tuner"
# On CPU, "--libtype all" means these: other backends (Triton) run only interpreted there, which is for testing.
CPU_DEFAULT_LIBTYPES = ("torch",)
#: AITER's AMD-only libtypes (its --libtype choices): named in the error when asked for here.
AITER_AMD_LIBTYPES = ("asm", "hipblaslt", "flydsl", "opus", "ck")
DEFAULT_NSETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
DESCRIPTION = ("Tune the GEMM shapes of an untuned CSV (or of a model's config.json) over every registered backend "
               "and merge the winners into a tuned CSV the runtime replays.")
EXAMPLES = (
    "gemm-tuner -i bf16_untuned_gemm.csv -o bf16_tuned_gemm.csv            # captured shapes, all GPUs",
    "gemm-tuner --model_dir llama3_70b --tp 8 --nsets 1,32,512 -o llama70b_tp8.csv",
    "gemm-tuner -i tuned.csv -o tuned.csv --all --compare --update_improved  # re-time a stale file in place",
    "gemm-tuner --run_config tuned.csv                                      # its rows against F.linear",
)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=cli.help_epilog(EXAMPLES),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_argument_group("shapes")
    src.add_argument("-i", "--input_file", "--untune_file", default=env_default("GTUNE_INPUT"),
                     help="untuned CSV (M,N,K[,bias,dtype,outdtype,scaleAB,bpreshuffle]); default $GTUNE_INPUT, "
                     "else bf16_untuned_gemm.csv unless --model_dir is given. Only read, never written, except "
                     "by -i X -o X --all (X's rows for this device retuned in place)")
    src.add_argument("--model_dir", default=env_default("GTUNE_MODEL"), help="folder with a Hugging Face "
                     "config.json, or the name of a shipped one (llama3_8b, llama3_70b, qwen2_5_7b, mistral_7b): "
                     "derive qkv, o, gate_up, down and lm_head shapes (M = tokens, N = out features per TP rank, "
                     "K = in features); default $GTUNE_MODEL")
    src.add_argument("--tp", type=positive_int, default=env_default("GTUNE_TP", "1"),
                     help="tensor-parallel degree for --model_dir (default $GTUNE_TP, else 1)")
    src.add_argument("--nsets", type=positive_int_list, default=list(DEFAULT_NSETS),
                     help="token counts M for --model_dir, comma-separated (default 1,2,4,...,8192)")
    src.add_argument("--batch_size", type=positive_int_list, default=env_default("GTUNE_BATCH_SIZE"),
                     help="sequence counts for lm_head's M (it sees one token per sequence; default "
                     "$GTUNE_BATCH_SIZE, else --nsets); unlike AITER it does not multiply --nsets")
    src.add_argument("--indtype", help="input dtype (bf16, fp16, fp32, fp8); overrides the file's dtype column")
    src.add_argument("--outdtype", help="output dtype; overrides the file's outdtype (default: the input dtype)")
    src.add_argument("--all_bias", action="store_true", help="tune every shape both with and without bias")
    src.add_argument("--print_shapes", action="store_true", help="print the untuned CSV of the shapes and exit")
    out = ap.add_argument_group("output")
    out.add_argument("-o", "--tuned_file", "--tune_file", default=env_default("GTUNE_TUNED", "bf16_tuned_gemm.csv"),
                     help="tuned CSV to merge winners into (created if missing; other rows are kept); default "
                     "$GTUNE_TUNED, else ./bf16_tuned_gemm.csv")
    out.add_argument("-o2", "--profile_file",
                     help="CSV receiving every candidate's result (phase, time, err_ratio, error)")
    out.add_argument("--summary_file", help="CSV receiving one row per shape: winner, time, TFLOP/s, %% of roofline, "
                     "torch time and speedup, candidate counts, wall time")
    cli.add_output_arguments(out, "retune shapes the tuned file already has (and replace them); with -i and -o the "
                             "same file: retune its rows for this device in place")
    out.add_argument("--batch", type=positive_int, default=1, help="write the tuned file after every this many "
                     "shapes (1, as AITER's gemm tuner; it never limits how many shapes run at once)")
    srch = ap.add_argument_group("search")
    srch.add_argument("--libtype", default="all", help="backends to tune: comma list or 'all' (default all; on a "
                      "CPU-only machine 'all' is torch only, name triton to time it interpreted)")
    srch.add_argument("--errRatio", type=fraction, default=0.05, help="max fraction of output elements outside the "
                      "dtype's tolerance for a candidate to win (default 0.05)")
    srch.add_argument("--min_gain", type=gain, default=1.02, help="a winner other than torch must be this many "
                      "times faster than F.linear, else torch is kept (default 1.02: H100 timing noise, see "
                      "BENCHMARKS.md); 1.0 keeps the plain fastest")
    srch.add_argument("--screen_top", type=positive_int, default=20, help="BLASLt solutions kept after phase 1 (20)")
    srch.add_argument("--screen_libtypes", default="", help="comma list of non-BLASLt backends to screen in phase 1 "
                      "as well (their --screen_top fastest go to phase 2): faster on large config spaces, off by "
                      "default")
    srch.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    cli.add_confirm_arguments(srch)
    cli.add_candidates_from_argument(srch)
    cli.add_recheck_argument(srch)
    run = ap.add_argument_group("execution")
    cli.add_execution_arguments(run, "module to import in every process before tuning (registers extra backends)")
    run.add_argument("--peak_tflops", type=positive_float,
                     help="peak TFLOP/s for %% of roofline (default: measured table)")
    run.add_argument("--peak_bw", type=positive_float, help="peak GB/s for %% of roofline (default: measured table)")
    add_aiter_flags(ap)
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
        run_config = getattr(args, "run_config", False)
        if in_place(args) and not run_config:
            if args.indtype or args.outdtype or args.all_bias:
                raise UsageError("-i X -o X --all retunes X's rows as they are keyed: --indtype, --outdtype and "
                                 "--all_bias do not apply")
            return []  # the shapes are the file's rows for the workers' device (TuneJob.rows_of)
        if os.path.abspath(path) == os.path.abspath(args.tuned_file) and not run_config:
            raise UsageError(f"--input_file and --tuned_file are the same file {path}; the input is never written "
                             "(add --all to retune that file's rows in place)")
        header = read_csv_rows(path)[0]
        has_out = "outdtype" in header
        problems = []
        for key in load_untuned(path):
            p = GemmProblem(*key)
            new_dtype = dtype or p.dtype
            new_otype = otype or (p.otype if has_out else new_dtype)
            problems.append(_fp8_scaled(replace(p, dtype=new_dtype, otype=new_otype), "scaleAB" in header,
                                        otype is not None or has_out))
    for p in problems:  # the runtime's rule: a shape it would refuse cannot be tuned (nothing is written)
        why = dtype_error(p.dtype, p.otype)
        if why is not None:
            source = ("--indtype " + args.indtype if dtype is not None and not dtype.is_floating_point
                      else "--outdtype " + args.outdtype if otype is not None
                      else args.model_dir or args.input_file or "bf16_untuned_gemm.csv")
            raise UsageError(f"{source}: {why}; no backend can tune it")
    if args.all_bias:
        problems = [replace(p, bias=b) for p in problems for b in (False, True)]
    return list(dict.fromkeys(problems))


def in_place(args: argparse.Namespace) -> bool:
    """``-i X -o X --all``: AITER's retune of a tuned file in place."""
    return bool(getattr(args, "all", False) and args.input_file and not args.model_dir
                and os.path.abspath(args.input_file) == os.path.abspath(args.tuned_file))


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
        if n in AITER_AMD_LIBTYPES and n not in known:
            raise UsageError(f"--libtype {n!r}: AITER's AMD kernels are not part of this package; known here: "
                             f"{', '.join(known)} ({DIFFERENCES})")
        if n not in known:
            raise UsageError(f"--libtype {n!r}: no such backend; known: {', '.join(known)}")
        b = backends.get_backend(n)
        if not b.is_available():
            raise UsageError(f"--libtype {n!r} is not available here: {b.unavailable_reason()}")
    return tuple(dict.fromkeys(names))


# ---- main -----------------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cli.configure_logging(args.verbose)
    plugins = cli.plugins_of(args.plugin)
    try:
        cli.apply_recheck(args, "input_file")
        check_aiter_flags(args)
        run_config = args.run_config if isinstance(args.run_config, str) else None
        if run_config is not None and not os.path.isfile(run_config):
            raise UsageError(f"--run_config {run_config}: file not found")
        problems = [] if run_config is not None else load_problems(args)
        if args.print_shapes:
            sys.stdout.write(render_csv(BF16_UNTUNED_COLUMNS, [GEMM_A16W16.untuned_row(p) for p in problems]))
            return EXIT_OK
        devices = cli.executor_devices(args.mp, args.ray)
        env = cli.worker_env(on_gpu=devices[0] is not None)
        with scoped_env(env):
            import_plugins(plugins)
            libtypes = resolve_libtypes(args.libtype, devices[0] is not None)
    except (UsageError, ConfigError, ModelConfigError, ImportError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    search = SearchOptions(libtypes, err_ratio=args.errRatio, screen_top=args.screen_top, seed=args.seed,
                           screen_libtypes=tuple(cli.name_list(args.screen_libtypes)), min_gain=args.min_gain,
                           confirm_rounds=args.confirm_rounds, pad_check=args.pad_check == "on",
                           finalist_margin=args.finalist_margin,
                           **with_iterations(cli.timing_configs(args.timing, on_gpu=devices[0] is not None), args))
    spec = tune_op("gemm_a16w16")
    job = TuneJob(PROG, spec, problems, search, args.tuned_file, args.batch, args.all,
                  keep_class_rows=args.keep_class_rows,
                  candidates=cli.candidates_from(args.candidates_from, "gemm_a16w16") if args.candidates_from
                  else None, profile_file=args.profile_file, summary_file=args.summary_file,
                  peak_tflops=args.peak_tflops, peak_bw=args.peak_bw, verbose=args.verbose,
                  rows_of=run_config or (args.tuned_file if in_place(args) and not args.run_config else None),
                  compare=None if args.run_config else compare_options(args, args.tuned_file), err_limit=args.errRatio)
    executor = cli.build_executor(devices, plugins, args.timeout, args.ray, env)
    return run(job, executor, run_config=bool(args.run_config), sort=args.sort)


if __name__ == "__main__":
    sys.exit(main())
