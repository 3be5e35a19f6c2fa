"""``python -m gradlib.tune_a8w8_blockscale``: tune the A8W8 block-scale op per (M, N, K) and write the tuned CSV
rows and the per-(N, K) JSON files that :func:`aiter_gemm.gemm_a8w8_blockscale` dispatches from.

Examples: :data:`EXAMPLES` (``--help`` prints them).

Shapes: ``--nk N,K ...`` or ``--model_dir`` (+ ``--tp``) crossed with ``--m``, and/or ``--shapes`` (an untuned CSV
with M,N,K columns, e.g. AITER's ``a8w8_blockscale_untuned_gemm.csv``, taken as is): :mod:`gradlib.blockscale_shapes`.

Search: the same driver as ``gemm-tuner`` (:mod:`gradlib.driver`) over the op's backends
(:mod:`aiter_gemm.backends.a8w8_blockscale`): every config of
:func:`~aiter_gemm.kernels.a8w8_blockscale.config_space` plus the runtime's default config (``--quick``: a
hand-picked list per M class); ``--variants`` restricts the variants, ``--candidates`` names the configs (or
registered launchers) to time instead. ``--libtype`` (default ``triton,torch`` on a GPU, ``triton`` on CPU):
``torch`` adds torch's block-scaled ``F.scaled_mm`` (cuBLASLt) where it supports the shape; when it wins, the row
and JSON bucket say ``libtype=torch``. ``tilelang`` (default where TileLang is installed and the GPU is sm_90) adds
:func:`~aiter_gemm.kernels.a8w8_blockscale_tilelang.config_space`; its kernels are compiled in parallel, before any
is timed, into TileLang's disk cache (:func:`gradlib.driver.precompile`). ``deepgemm`` (default where ``deep_gemm``
imports and the GPU is sm_90) adds DeepGEMM's ``fp8_gemm_nt`` (one candidate; its JIT called once per shape first).
Each candidate runs in a worker of the crash-isolated pool (``--mp``,
``--timeout``, ``--ray``), is checked against the float32 dequantized reference (``err_ratio`` <= ``--errRatio``)
and timed with CUDA-graph replay over rotating inputs larger than twice the L2. One shape's candidates are split into
one chunk per worker.

Output: the winner per shape is merged into ``-o`` every ``--batch`` shapes; shapes the file already has for this
device are skipped (resume), unless ``--all``. JSON: after its shapes finish, each (N, K) gets
``{arch}-GEMM-A8W8_BLOCKSCALE-N={N}-K={K}.json`` in ``--json_dir``, rebuilt from every row of the tuned file for
that (N, K) on this device (``--buckets``: :mod:`gradlib.blockscale`). ``--sglang_dir DIR``: the fastest TileLang
config per tuned M is also merged into SGLang's file of the (N, K) for this GPU's name
(:mod:`aiter_gemm.sglang_tilelang`).

AITER's tuner flags work as in ``gemm-tuner`` (:mod:`gradlib.aiter_flags`): ``-i/--untune_file`` (= ``--shapes``),
``--tune_file``, ``-o2``, ``--sort``, ``--compare`` / ``--update_improved`` / ``--min_improvement_pct``,
``--run_config [FILE]``, ``--warmup`` / ``--iters``, ``--shape_grouped`` (a shape's candidates on one worker, not
split over all), and ``-i X -o X --all`` retunes X's rows for this device in place.

Exit status: as ``gemm-tuner``'s (:mod:`gradlib.cli`); the JSON files, like the CSV, are checked writable before
anything runs and kept pending (rebuilt at the next checkpoint or rerun) when a write fails.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from functools import partial

import torch

from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.device import REFERENCE_ARCH, REFERENCE_CU, DeviceIdentity
from aiter_gemm.dtypes import OUT_DTYPES, parse_dtype
from aiter_gemm.errors import ConfigError
from aiter_gemm.fileio import render_csv
from aiter_gemm.kernels import a8w8_blockscale_deepgemm as deepgemm_impl
from aiter_gemm.kernels import a8w8_blockscale_tilelang as tilelang_impl
from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl
from aiter_gemm.kernels.a8w8_blockscale import VARIANTS
from aiter_gemm.ops.a8w8_blockscale import GEMM_A8W8_BLOCKSCALE, X_SCALE_LAYOUTS, parse_choice
from aiter_gemm.registry import get_backend, known_backends
from aiter_gemm.settings import scoped_env
from aiter_gemm.timing import TimingConfig
from gradlib import cli
from gradlib.aiter_flags import add_aiter_flags, check_aiter_flags, compare_options, with_iterations
from gradlib.blockscale import (
    BLOCKSCALE,
    EXTRA_LAUNCHERS,
    FP8,
    SEED_BUCKETS,
    JsonSidecar,
    candidate_solution,
    check_candidate,
    is_config_name,
    seed_buckets,
)
from gradlib.blockscale_shapes import (  # noqa: F401 - re-exported for callers of this CLI module
    Projection,
    deepseek_projections,
    load_shapes,
    model_projections,
    nk_pair,
    read_shapes_csv,
)
from gradlib.cli import EXIT_OK, EXIT_USAGE, UsageError, fraction, gain, name_list, positive_int, positive_int_list
from gradlib.driver import TuneJob, run
from gradlib.models import ModelConfigError
from gradlib.search import SearchOptions
from gradlib.tasks import enumerate_solutions, import_plugins
from gradlib.tune_ops import tune_op

__all__ = ["CPU_TIMING", "DEFAULT_MS", "PROG", "SEED_BUCKETS", "build_parser", "candidate_names",
           "deepseek_projections", "main", "model_projections", "seed_buckets"]

PROG = "python -m gradlib.tune_a8w8_blockscale"
DEFAULT_MS = (1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# Interpreted Triton on CPU (tests): ~50 ms a launch at N = K = 256, so a few launches per candidate.
CPU_TIMING = TimingConfig(warmup=1, reps=3, target_us=0.0, use_graph=False, budget_s=0.2)
log = logging.getLogger("gradlib")
OP_LIBTYPES = ("triton", torch_impl.LIBTYPE, tilelang_impl.TileLangConfig.libtype, deepgemm_impl.LIBTYPE)
#: The optional implementations: libtype -> its kernel module, whose ``unavailable_reason()`` says why it cannot run
#: here (None: it can).
OPTIONAL = {tilelang_impl.TileLangConfig.libtype: tilelang_impl, deepgemm_impl.LIBTYPE: deepgemm_impl}


def default_libtypes(on_gpu: bool) -> tuple[str, ...]:
    """Every implementation that can run here: on a GPU triton and torch, plus tilelang and deepgemm where they are
    installed and the GPU is sm_90 (an absence is said once, not an error); on CPU triton (interpreter)."""
    if not on_gpu:
        return ("triton",)
    out = []
    for lib in OP_LIBTYPES:
        why = OPTIONAL[lib].unavailable_reason() if lib in OPTIONAL else None
        if why is not None:
            log.info("%s candidates not timed: %s", lib, why)
        else:
            out.append(lib)
    return tuple(out)


DESCRIPTION = ("Tune the A8W8 block-scale GEMM per (M, N, K): write the tuned CSV rows and the per-(N, K) JSON files "
               "that aiter_gemm.gemm_a8w8_blockscale dispatches from.")
EXAMPLES = (
    f"{PROG} --nk 8192,8192 10240,8192 --m 1,16,64,256,1024,4096 --quick",
    f"{PROG} --model_dir deepseek_v3 --tp 8 -o dsv3_blockscale_tuned.csv",
    f"{PROG} --model_dir qwen3_8b_fp8 --m 1,16,64 --print_shapes",
    f"{PROG} -i a8w8_blockscale_untuned_gemm.csv --mp 8 --json_dir my_configs",
)


def _variant_filter(variants: Sequence[str] | None):
    """Keep Triton configs of ``variants`` (all when None) and every other backend's solutions."""
    if not variants:
        return None
    wanted = set(variants)

    def accept(sol: Solution) -> bool:
        return sol.libtype != "triton" or parse_choice(sol.kernelName).variant in wanted

    return accept


def candidate_names(M: int, N: int, K: int, args: argparse.Namespace, otype: torch.dtype = torch.bfloat16,
                    num_sms: int = REFERENCE_CU) -> list[str]:
    """The candidates of one shape as the workers enumerate them on a GPU of ``num_sms`` SMs: ``--candidates`` (those
    that can run it), else each ``--libtype`` backend's space (the Triton one holds the runtime's default config, so
    a tuned row is never slower than having none), ``--variants`` applied."""
    if args.candidates:
        return [c for c in args.candidates if check_candidate(c, M, N, K, otype) is None]
    problem = GemmProblem(M, N, K, False, FP8, otype)
    ident = DeviceIdentity(REFERENCE_ARCH, num_sms, "cuda")
    accept = _variant_filter(args.variants)
    out = []
    for lib in getattr(args, "libtype", None) or ("triton",):
        sols = enumerate_solutions(get_backend(lib, GEMM_A8W8_BLOCKSCALE.backends), problem, ident, args.quick)
        out += [s.kernelName for s in sols if accept is None or accept(s)]
    return out


# ---- CLI ----------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=cli.help_epilog(EXAMPLES),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_argument_group("shapes")
    src.add_argument("--nk", type=nk_pair, nargs="+", metavar="N,K", help="weight shapes to tune, e.g. 8192,8192")
    src.add_argument("--model_dir", help="folder with a Hugging Face config.json (or a shipped model config's "
                     "name, e.g. qwen3_8b_fp8, deepseek_v3): tune its dense fp8 linears (Llama/Qwen-style with fused "
                     "qkv and gate_up, or DeepSeek MLA with its dense layers and shared experts; routed experts are "
                     "grouped GEMMs, not covered); quantization_config.weight_block_size must be [128, 128]")
    src.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree for --model_dir (default 1)")
    src.add_argument("--m", type=positive_int_list, default=list(DEFAULT_MS),
                     help="batch sizes M for --nk / --model_dir (default 1,16,32,64,...,8192)")
    src.add_argument("-i", "--shapes", "--untune_file", help="untuned CSV with M,N,K columns (e.g. AITER's "
                     "a8w8_blockscale_untuned_gemm.csv), tuned as listed; -i X -o X --all: X's rows retuned in place")
    src.add_argument("--outdtype", default="bf16", help="output dtype (bf16, fp16, fp32; default bf16)")
    src.add_argument("--print_shapes", action="store_true", help="print the shapes as an untuned CSV and exit")
    out = ap.add_argument_group("output")
    out.add_argument("-o", "--tuned_file", "--tune_file", default="a8w8_blockscale_tuned_gemm.csv",
                     help="tuned CSV to merge winners into (created if missing; other rows are kept)")
    out.add_argument("--json_dir", help="folder for the per-(N, K) JSON files (default: the tuned file's folder; "
                     "the runtime reads AITER_GEMM_TRITON_CONFIGS folders, then configs/triton/)")
    out.add_argument("--sglang_dir", help="also merge the fastest TileLang config per tuned M into SGLang's file of "
                     "each (N, K) in this folder (N={N},K={K},device_name={this GPU},dtype=fp8_w8a8,block_shape=[128, "
                     "128].json; other M kept), for SGLANG_TILELANG_GEMM_CONFIG_DIR or AITER_GEMM_SGLANG_TILELANG_DIR")
    out.add_argument("--buckets", choices=("fine", "seed"), default="fine",
                     help="JSON M buckets: one per tuned M (fine) or the named small/medium/large_M (seed)")
    out.add_argument("-o2", "--profile_file", help="CSV receiving every candidate's result")
    cli.add_output_arguments(out, "retune shapes the tuned file already has (replace them)")
    out.add_argument("--batch", type=positive_int, default=4, help="checkpoint every this many shapes (4)")
    srch = ap.add_argument_group("search")
    srch.add_argument("--quick", action="store_true", help="a short hand-picked config list per M class")
    srch.add_argument("--libtype", type=name_list,
                      help="implementations to time: triton (our kernels), torch (F.scaled_mm block-wise, "
                      "cuBLASLt), tilelang (our TileLang kernels, sm_90), deepgemm (DeepGEMM's fp8_gemm_nt, sm_90); "
                      "default all that run here (a GPU: triton,torch, tilelang and deepgemm where installed), "
                      "triton on CPU")
    srch.add_argument("--variants", type=name_list, help=f"only these variants (comma list of {', '.join(VARIANTS)})")
    srch.add_argument("--candidates", type=name_list,
                      help="time exactly these kernelNames (or names registered by a --plugin) instead")
    srch.add_argument("--errRatio", type=fraction, default=0.01, help="max fraction of outputs outside isclose(ref, "
                      "rtol=atol=1e-2) for a config to win (default 0.01: a correct config scores 0, fp8 products "
                      "being exact in the float32 reference and bf16 rounding 0.4%%)")
    srch.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    srch.add_argument("--min_gain", type=gain, default=1.02, help="a confirmed winner must be this many times "
                      "faster than the runtime's default (and torch's block-scaled matmul) at its M (1.02)")
    cli.add_confirm_arguments(srch)
    cli.add_candidates_from_argument(srch)
    cli.add_recheck_argument(srch)
    srch.add_argument("--x_scale_layout", choices=X_SCALE_LAYOUTS, default="row_major",
                      help="x_scale's memory layout as the model's quantizer writes it: row_major (default; "
                      "quantize_blockscale's, AITER's) or m_major (strides (1, M), vLLM's column_major_scales: "
                      "torch's block-scaled matmul needs it; our Triton kernel ran up to 29%% slower with it on "
                      "most H100 shapes with M >= 16)")
    run = ap.add_argument_group("execution")
    cli.add_execution_arguments(run, "module imported in every process (registers extra launchers)")
    add_aiter_flags(ap, split_shapes=True)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cli.configure_logging(args.verbose)
    plugins = cli.plugins_of(args.plugin, first=["gradlib.blockscale"])
    try:
        cli.apply_recheck(args, "shapes")
        check_aiter_flags(args)
        _, rows_of = cli.rows_source(args)
        notes: list[str] = []
        shapes = [] if rows_of else load_shapes(args.shapes, args.nk, args.model_dir, args.tp, args.m, notes)
        cli.print_notes(PROG, notes)
        if args.print_shapes:
            sys.stdout.write(render_csv(("M", "N", "K"), [dict(zip("MNK", s)) for s in shapes]))
            return EXIT_OK
        otype = parse_dtype(args.outdtype)
        if otype not in OUT_DTYPES:
            raise UsageError(f"--outdtype must be bf16, fp16 or fp32, got {args.outdtype}")
        bad = sorted(set(args.variants or ()) - set(VARIANTS))
        if bad:
            raise UsageError(f"--variants {bad}: not among {list(VARIANTS)}")
        bad = sorted(set(args.libtype or ()) - set(OP_LIBTYPES))
        if bad:
            raise UsageError(f"--libtype {bad}: not among {list(OP_LIBTYPES)}")
        devices = cli.executor_devices(args.mp, args.ray)
        on_gpu = devices[0] is not None
        if torch_impl.LIBTYPE in (args.libtype or ()) and not on_gpu:
            raise UsageError(f"--libtype torch: {torch_impl.unavailable_reason(torch.device('cpu'))}")
        for lib in (lib for lib in args.libtype or () if lib in OPTIONAL):
            why = OPTIONAL[lib].unavailable_reason() if on_gpu else f"{lib} runs on an sm_90 GPU, not on CPU"
            if why is not None:
                raise UsageError(f"--libtype {lib}: {why}")
        libtypes = tuple(args.libtype or default_libtypes(on_gpu))
        if args.sglang_dir and tilelang_impl.TileLangConfig.libtype not in libtypes:
            why = tilelang_impl.unavailable_reason() or "add it to --libtype"
            raise UsageError(f"--sglang_dir: SGLang's files hold TileLang configs, and tilelang is not timed here "
                             f"(libtypes {','.join(libtypes)}; {why})")
        if args.sglang_dir and args.run_config:
            raise UsageError("--sglang_dir: --run_config times rows without tuning; nothing to write for SGLang")
        env = cli.worker_env(on_gpu)
        with scoped_env(env):
            import_plugins(plugins)
        if args.candidates:
            unknown = [c for c in args.candidates if c not in EXTRA_LAUNCHERS and not is_config_name(c)]
            if unknown:
                raise UsageError(f"--candidates {unknown}: neither kernelNames nor registered launchers")
    except (UsageError, ConfigError, ModelConfigError, ImportError, KeyError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    package = GEMM_A8W8_BLOCKSCALE.backends
    timing = with_iterations(cli.timing_configs(args.timing, None if on_gpu else CPU_TIMING, on_gpu), args)
    search = SearchOptions(libtypes, err_ratio=args.errRatio, seed=args.seed, min_gain=args.min_gain,
                           confirm_rounds=0 if args.candidates else args.confirm_rounds,
                           pad_check=args.pad_check == "on", finalist_margin=args.finalist_margin, op=BLOCKSCALE,
                           baseline=torch_impl.LIBTYPE if on_gpu and torch_impl.LIBTYPE in libtypes else None,
                           quick=args.quick, **timing,
                           options=(("x_scale_layout", args.x_scale_layout),),
                           untunable=tuple(n for n in known_backends(package) if not get_backend(n, package).tunable),
                           accept=_variant_filter(args.variants))
    problems = [GemmProblem(m, n, k, False, FP8, otype) for m, n, k in shapes]

    def fixed(p: GemmProblem, ident: DeviceIdentity) -> tuple[Solution, ...]:
        return tuple(candidate_solution(c) for c in candidate_names(p.M, p.N, p.K, args, otype))

    spec = tune_op(BLOCKSCALE)
    job = TuneJob(PROG, spec, problems, search, args.tuned_file, args.batch, args.all,
                  keep_class_rows=args.keep_class_rows,
                  split_shapes=not args.shape_grouped, candidates=fixed if args.candidates else
                  cli.candidates_from(args.candidates_from, BLOCKSCALE) if args.candidates_from else None,
                  profile_file=args.profile_file, verbose=args.verbose,
                  sidecar=None if args.run_config else partial(_sidecar, tuned_file=args.tuned_file,
                                                               json_dir=args.json_dir, bucket_mode=args.buckets,
                                                               sglang_dir=args.sglang_dir,
                                                               class_only=args.keep_class_rows),
                  rows_of=rows_of, compare=None if args.run_config else compare_options(args, args.tuned_file),
                  output_dirs=tuple((flag, d) for flag, d in (("--json_dir", args.json_dir),
                                                              ("--sglang_dir", args.sglang_dir)) if d),
                  err_limit=args.errRatio)
    executor = cli.build_executor(devices, plugins, args.timeout, args.ray, env)
    return run(job, executor, run_config=bool(args.run_config), sort=args.sort)


def _sidecar(identity: DeviceIdentity, problems: list[GemmProblem], tuned_file: str, json_dir: str | None,
             bucket_mode: str, sglang_dir: str | None = None, class_only: bool = False) -> JsonSidecar:
    return JsonSidecar(identity, tuned_file, problems, json_dir, bucket_mode, sglang_dir, class_only)


if __name__ == "__main__":
    sys.exit(main())
