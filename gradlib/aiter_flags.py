"""AITER's tuner flags on our tuners (AITER: ``aiter/utility/base_tuner.py``'s common parser, ``GemmTuner``'s and
``gradlib/gemm_tuner.py``'s), so AITER users' scripts run unchanged. Each flag is one of:

- mapped onto what it means here: ``--sort``, ``--compare``, ``--update_improved``, ``--min_improvement_pct``,
  ``--run_config``, ``--warmup``, ``--iters`` (and, in the CLIs, ``-i/--untune_file``, ``-o/--tune_file``, ``-o2``,
  the ``GTUNE_*`` defaults);
- accepted because our tuner always does what it asks (logged): ``-k/--splitK`` (split-K candidates are always in
  the search), ``--shape_grouped`` / ``--auto_group_small_m`` (a shape's candidates already run on one GPU),
  ``--post_verify`` and its knobs (every candidate is checked before it is timed);
- refused with the reason (docs/aiter.md): ``--fast_tune``, ``--tune_tie_break_rel_tol`` other
  than 0, ``--rocblas-decode``.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import replace

from aiter_gemm.configs import parse_bool
from aiter_gemm.timing import TimingConfig
from gradlib.cli import UsageError, non_negative_float, non_negative_int, positive_int
from gradlib.compare import CompareOptions, candidate_path

log = logging.getLogger("gradlib")

DIFFERENCES = "README, Differences from AITER"
def str2bool(text: str) -> bool:
    """argparse type of AITER's ``--sort``: :func:`~aiter_gemm.configs.parse_bool`'s words (AITER's yes/true/t/y/1
    and no/false/f/n/0 among them), any case."""
    try:
        return parse_bool(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a boolean: {exc}") from None


def env_default(var: str, fallback: str | None = None) -> str | None:
    """A flag's default from AITER's ``GTUNE_*`` variable when it is set (argparse applies the flag's type)."""
    return os.environ.get(var, "").strip() or fallback


def add_aiter_flags(parser: argparse.ArgumentParser, split_shapes: bool = False) -> None:
    """Add AITER's common tuner flags this parser does not already have (``split_shapes``: this tuner spreads one
    shape over the workers, so ``--shape_grouped`` has AITER's meaning: keep it on one)."""
    g = parser.add_argument_group(f"AITER's flags ({DIFFERENCES})")
    g.add_argument("--sort", type=str2bool, default=False, metavar="BOOL", help="order the tuned file's rows by "
                   "key (N before M, as AITER) at the end; default False here (AITER: True), so rows you wrote keep "
                   "their place")
    g.add_argument("--compare", action="store_true", help="also time what runs each shape today (the tuned file's "
                   "row, else the runtime default) in the same rounds, report pre/post times and keep every winner "
                   "in a candidate copy; the tuned file is only written with --update_improved")
    g.add_argument("--update_improved", action="store_true", help="with --compare: write only the rows whose new "
                   "winner is --min_improvement_pct faster than what runs today (or whose row no longer runs)")
    g.add_argument("--min_improvement_pct", type=non_negative_float, default=3.0,
                   help="with --compare: the improvement "
                   "(pre - post) / pre in %% a new winner needs (3.0)")
    g.add_argument("--run_config", nargs="?", const=True, default=False, metavar="TUNED_CSV", help="time the rows "
                   "of TUNED_CSV on this device (without a file: the runtime default for the input shapes) against "
                   "F.linear, print the table and exit; nothing is written")
    g.add_argument("--warmup", type=non_negative_int, default=None,
                   help="warm-up calls before each timing (default: ours, 10 "
                   "in the full phase, 5 in confirmation rounds)")
    g.add_argument("--iters", type=positive_int, default=None,
                   help="timed repetitions per candidate, the median is kept "
                   "(default: ours, 21 in the full phase, 11 in confirmation rounds)")
    g.add_argument("-k", "--splitK", action="store_true", help="accepted: split-K candidates are always searched")
    g.add_argument("--shape_grouped", action="store_true", help="keep each shape's candidates on one worker"
                   + ("" if split_shapes else " (always the case in this tuner)"))
    g.add_argument("--auto_group_small_m", type=int, default=0, help="accepted: small-M shapes are grouped"
                   + ("" if split_shapes else " (every shape is, in this tuner)"))
    g.add_argument("--post_verify", action="store_true", help="accepted: every candidate is checked against the "
                   "float32 reference before it is timed, and the winner again in the confirmation rounds")
    g.add_argument("--post_verify_slack_tol", type=float, default=10.0, help="accepted with --post_verify (unused)")
    g.add_argument("--post_verify_max_fallback", type=int, default=3, help="accepted with --post_verify (unused)")
    g.add_argument("--post_verify_iters", type=int, default=1, help="accepted with --post_verify (unused)")
    g.add_argument("--fast_tune", action="store_true", help="refused: candidates are never timed unchecked")
    g.add_argument("--tune_tie_break_rel_tol", type=float, default=0.0, help="refused unless 0: near-ties go to "
                   "the library call through --min_gain")
    g.add_argument("--rocblas-decode", dest="rocblas_decode", action="store_true", help="refused: no rocBLAS here")


def check_aiter_flags(args: argparse.Namespace) -> None:
    """UsageError for AITER flags used in a way this tuner refuses, naming the reason; logs the accepted ones."""
    if args.update_improved and not args.compare:
        raise UsageError("--update_improved requires --compare")
    if args.fast_tune:
        raise UsageError(f"--fast_tune is not provided: every candidate is checked against the float32 reference "
                         f"before it is timed, so there is no unchecked mode to verify afterwards ({DIFFERENCES})")
    if args.tune_tie_break_rel_tol:
        raise UsageError(f"--tune_tie_break_rel_tol is not provided: near-ties are settled by --min_gain against "
                         f"F.linear and by the --confirm_rounds re-timing, not by kernel id ({DIFFERENCES})")
    if args.rocblas_decode:
        raise UsageError(f"--rocblas-decode: rocBLAS is not a backend here ({DIFFERENCES})")
    for flag, on in (("-k/--splitK", args.splitK), ("--post_verify", args.post_verify),
                     ("--auto_group_small_m", args.auto_group_small_m)):
        if on:
            log.info("%s: already what this tuner does (%s)", flag, DIFFERENCES)


def with_iterations(timing: dict[str, TimingConfig], args: argparse.Namespace) -> dict[str, TimingConfig]:
    """The full-phase and confirmation timings with ``--warmup`` / ``--iters`` applied (screening keeps its own)."""
    changes = {k: v for k, v in (("warmup", args.warmup), ("reps", args.iters)) if v is not None}
    if not changes:
        return timing
    return {name: replace(cfg, **changes) if name in ("full", "confirm") else cfg for name, cfg in timing.items()}


def compare_options(args: argparse.Namespace, tuned_file: str) -> CompareOptions | None:
    """``--compare``'s settings (None without it); the candidate copy goes where AITER keeps it."""
    if not args.compare:
        return None
    return CompareOptions(args.min_improvement_pct, args.update_improved, candidate_path(tuned_file))
