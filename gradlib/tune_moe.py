"""``python -m gradlib.tune_moe``: tune the fused-MoE op per problem (AITER's fmoe key: token, model_dim, inter_dim,
expert, topk, ...) and write AITER's tuned fmoe rows that :func:`aiter_gemm.fused_moe` dispatches from
(``AITER_CONFIG_FMOE``), and, with ``--vllm_dir``, vLLM's / SGLang's fused-MoE JSON files.

Examples: :data:`EXAMPLES` (``--help`` prints them).

Shapes: ``-i`` (an untuned fmoe CSV in AITER's columns, e.g. the ``untuned_fmoe.csv`` that ``AITER_TUNE_GEMM=1``
captures; ``--last``: its last shape only), and/or ``--model_dir`` (a folder with a Hugging Face config.json or a
shipped name: ``qwen3_30b_a3b``, ``qwen3_235b_a22b``, ``deepseek_v3``, ``mixtral_8x7b``; ``--tp`` splits each expert,
``--ep`` keeps E/ep experts per rank: :func:`gradlib.models.moe_experts`) crossed with ``--token`` and ``--dtype``.

Search: the shared driver (:mod:`gradlib.driver`) over the op's backends (:mod:`aiter_gemm.backends.fused_moe`):
``triton`` (every :class:`~aiter_gemm.kernels.fused_moe.MoeConfig` of the config space for both GEMMs, plus the
default pair; ``--quick``: the short list), then stage by stage (``--stage_search separate``, :mod:`gradlib.moe`):
GEMM2's configs beside the best GEMM1 config, then GEMM1's beside the best GEMM2 config; ``torch`` (grouped_mm where
it runs, the per-expert loop) is timed too and is the baseline; ``deepgemm`` (FP8 experts on DeepGEMM's grouped
GEMMs, one candidate; its JIT called once per shape first) when ``--libtype`` names it (opt-in: it is checked
against its own reference, GEMM1's output rounded to bf16). Before anything is timed, the Triton candidates' kernels
are built in parallel processes into Triton's disk cache (:func:`gradlib.driver.precompile`, the backend's
``precompile``; ``AITER_GEMM_PRECOMPILE_WORKERS``), so workers load them instead of compiling. Each candidate runs
in a worker of the crash-isolated pool (``--mp``, ``--timeout``), is checked against the float32 reference
(``--errRatio``) and timed by CUDA-graph replay over rotating copies of the experts larger than twice the L2, tokens
routed as ``--routing`` says; the winner is re-timed against the op's untuned default and torch's experts before it
is written (``--confirm_rounds``), and at the smallest token count its padded lookup serves (``--pad_check``).

Output: AITER's tuned fmoe columns (``block_m, ksplit, us1, kernelName1, err1, us2, kernelName2, err2, us,
run_1stage, tflops, bw``) plus ``libtype`` and the project's columns, merged into ``-o`` every ``--batch`` shapes;
shapes the file has for this device are skipped (resume), unless ``--all``. AITER's tuner flags work as in the other
tuners (:mod:`gradlib.aiter_flags`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from aiter_gemm.backends.base import QUANT_ALIASES, MoeProblem, Solution
from aiter_gemm.backends.fused_moe import stage_names
from aiter_gemm.backends.fused_moe import triton as triton_backend
from aiter_gemm.configs import load_untuned
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.errors import ConfigError
from aiter_gemm.fileio import render_csv
from aiter_gemm.kernels import fused_moe_deepgemm as deepgemm_impl
from aiter_gemm.kernels import fused_moe_torch as torch_impl
from aiter_gemm.kernels.fused_moe import MoeConfig
from aiter_gemm.ops.fused_moe import FMOE_UNTUNED_COLUMNS, FUSED_MOE, KIND, ROUTINGS
from aiter_gemm.registry import get_backend, known_backends
from aiter_gemm.settings import scoped_env
from aiter_gemm.timing import TimingConfig
from gradlib import cli
from gradlib.aiter_flags import add_aiter_flags, check_aiter_flags, compare_options, with_iterations
from gradlib.cli import EXIT_OK, EXIT_USAGE, UsageError, fraction, gain, name_list, positive_int, positive_int_list
from gradlib.driver import TuneJob, run
from gradlib.models import MOE_DTYPES, ModelConfigError, moe_experts, moe_problems
from gradlib.moe import stage_refine, vllm_sidecar
from gradlib.search import SearchOptions
from gradlib.tasks import import_plugins
from gradlib.tune_ops import tune_op

__all__ = ["CPU_TIMING", "DEFAULT_TOKENS", "OPTIONAL_LIBTYPES", "PROG", "build_parser", "candidate_solution",
           "default_libtypes", "load_problems", "main"]

PROG = "python -m gradlib.tune_moe"
#: Token counts tuned by default: powers of two, as AITER's padded lookup serves every count from them.
DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
# Interpreted Triton on CPU (tests): about a second a call on tiny shapes, so a few calls per candidate.
CPU_TIMING = TimingConfig(warmup=1, reps=3, target_us=0.0, use_graph=False, budget_s=0.2)
OP_LIBTYPES = (triton_backend.NAME, torch_impl.LIBTYPE)
#: Timed only when ``--libtype`` names them (asked for where their backend cannot run: a usage error). DeepGEMM's
#: experts write GEMM1's output in bf16 before requantizing it, so they are checked against their own reference
#: (``Backend.reference``), not the op's: a user opts into that arithmetic, the tuner never picks it unasked.
OPTIONAL_LIBTYPES = (deepgemm_impl.LIBTYPE,)
log = logging.getLogger("gradlib")

DESCRIPTION = ("Tune the fused-MoE op per problem: write AITER's tuned fmoe rows (and vLLM/SGLang fused-MoE JSON "
               "files) that aiter_gemm.fused_moe dispatches from.")
EXAMPLES = (
    f"{PROG} --model_dir qwen3_30b_a3b --token 1,2,4,8,16,32,64 -o tuned_fmoe.csv",
    f"{PROG} --model_dir deepseek_v3 --ep 8 --dtype fp8 -o dsv3_ep8_tuned_fmoe.csv --vllm_dir vllm_configs",
    f"{PROG} --model_dir mixtral_8x7b --tp 2 --print_shapes",
    f"{PROG} -i untuned_fmoe.csv -o tuned_fmoe.csv --mp 8 --routing skewed",
)


# ---- shapes -------------------------------------------------------------------------------------------------------
def read_untuned(path: str) -> list[MoeProblem]:
    """The problems of an untuned fmoe CSV (AITER's columns, every one required), in file order, duplicates once."""
    if not os.path.isfile(path):
        raise UsageError(f"-i {path}: file not found")
    problems = [MoeProblem(*key) for key in load_untuned(path, KIND)]
    return list(dict.fromkeys(replace(p, q_type=QUANT_ALIASES.get(p.q_type, p.q_type)) for p in problems))


def load_problems(untuned: str | None, model_dir: str | None, tp: int, ep: int, tokens: Sequence[int],
                  dtypes: Sequence[str] | None, last: bool = False, notes: list[str] | None = None
                  ) -> list[MoeProblem]:
    """Every problem to tune, in order, without duplicates: ``untuned``'s rows (``last``: its last one), then the
    model's experts at each of ``tokens`` in each of ``dtypes`` (default: the checkpoint's, fp8 for an FP8
    checkpoint with (128, 128) blocks, else bf16). ``notes`` receives what the model runs that these leave out."""
    problems: list[MoeProblem] = []
    if untuned:
        rows = read_untuned(untuned)
        problems += rows[-1:] if last else rows
    elif last:
        raise UsageError("--last takes the last shape of -i; no -i given")
    if (tp > 1 or ep > 1) and not model_dir:
        raise UsageError("--tp and --ep shard the experts of --model_dir; no --model_dir given")
    if model_dir:
        if any(t < 1 for t in tokens):
            raise UsageError(f"--token must be positive token counts, got {list(tokens)}")
        m = moe_experts(model_dir, tp, ep)
        if notes is not None:
            notes += list(m.notes)
        for name in dtypes or (None,):
            problems += moe_problems(m, tokens, name)
    if not problems:
        raise UsageError("no shapes: give -i or --model_dir")
    return list(dict.fromkeys(problems))


# ---- candidates ---------------------------------------------------------------------------------------------------
def default_libtypes(on_gpu: bool) -> tuple[str, ...]:
    """The backends timed without ``--libtype``: triton and torch (:data:`OPTIONAL_LIBTYPES` only when named)."""
    return OP_LIBTYPES


def candidate_solution(name: str) -> Solution:
    """The solution a ``--candidates`` name stands for: torch's ``grouped_mm`` or ``loop``, DeepGEMM's
    ``deepgemm_m_grouped_contiguous``, else a Triton config pair ``kernelName1[;kernelName2]``; ValueError saying
    what is wrong."""
    if name in torch_impl.NAMES:
        return Solution(torch_impl.LIBTYPE, -1, 0, name)
    if name == deepgemm_impl.NAME:
        return Solution(deepgemm_impl.LIBTYPE, -1, 0, name)
    first, second = stage_names(name)
    return triton_backend.solution_of(MoeConfig.parse(first), MoeConfig.parse(second))


# ---- CLI ----------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=cli.help_epilog(EXAMPLES),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_argument_group("shapes")
    src.add_argument("-i", "--untune_file", "--shapes", dest="shapes", help="untuned CSV in AITER's fmoe columns ("
                     + ", ".join(FMOE_UNTUNED_COLUMNS) + "), tuned as listed; -i X -o X --all: X's rows retuned")
    src.add_argument("--last", action="store_true", help="tune only the last shape of -i (AITER's flag)")
    src.add_argument("--model_dir", help="folder with a Hugging Face config.json, or a shipped model's name "
                     "(qwen3_30b_a3b, qwen3_235b_a22b, deepseek_v3, mixtral_8x7b): tune its routed experts")
    src.add_argument("--tp", type=positive_int, default=1, help="tensor parallelism for --model_dir: each expert's "
                     "intermediate size / tp (default 1)")
    src.add_argument("--ep", type=positive_int, default=1, help="expert parallelism for --model_dir: E/ep local "
                     "experts, each token routed to topk of them (default 1)")
    src.add_argument("--token", "--m", dest="token", type=positive_int_list, default=list(DEFAULT_TOKENS),
                     help="token counts for --model_dir (default 1,2,4,...,4096)")
    src.add_argument("--dtype", type=name_list, help=f"experts' types for --model_dir, comma list of "
                     f"{', '.join(MOE_DTYPES)} (fp8: e4m3 with (128, 128) block scales; default: the checkpoint's)")
    src.add_argument("--print_shapes", action="store_true", help="print the shapes as an untuned fmoe CSV (AITER's "
                     "columns) and exit")
    out = ap.add_argument_group("output")
    out.add_argument("-o", "--tune_file", "--tuned_file", dest="tuned_file", default="tuned_fmoe.csv",
                     help="tuned CSV to merge winners into (created if missing; other rows are kept)")
    out.add_argument("--vllm_dir", help="also merge, per tuned token count, the fastest config vLLM's kernel runs "
                     "into vLLM's fused-MoE file of the problem in this folder (E=..,N=..,device_name=..[,dtype="
                     "fp8_w8a8][,block_shape=[128,128]].json; other M kept), for VLLM_TUNED_CONFIG_FOLDER or "
                     "AITER_GEMM_FUSED_MOE_CONFIGS")
    out.add_argument("-o2", "--profile_file", help="CSV receiving every candidate's result")
    cli.add_output_arguments(out, "retune shapes the tuned file already has (replace them)")
    out.add_argument("--batch", type=positive_int, default=4, help="checkpoint every this many shapes (4)")
    srch = ap.add_argument_group("search")
    srch.add_argument("--libtype", type=name_list, help="implementations to time: triton (our fused-MoE kernels; "
                      "interpreted on CPU), torch (grouped_mm where it runs, the per-expert loop; the baseline), "
                      "deepgemm (FP8 experts on DeepGEMM's grouped GEMMs; deep_gemm installed, sm_90), or a backend "
                      "a --plugin registers; default triton,torch (deepgemm only when named: its GEMM1 output is bf16)")
    srch.add_argument("--quick", action="store_true", help="the Triton kernels' short config list")
    srch.add_argument("--stage_search", choices=("separate", "shared"), default="separate",
                      help="separate (default): after every config for both GEMMs, GEMM2's configs beside the best "
                      "GEMM1 config, then GEMM1's beside the best GEMM2 config (about 3x the configs); shared: one "
                      "config for both GEMMs only (what vLLM's files hold)")
    srch.add_argument("--candidates", type=name_list, help="time exactly these (kernelName1[;kernelName2] Triton "
                      "config pairs, grouped_mm, loop, deepgemm_m_grouped_contiguous) instead")
    srch.add_argument("--routing", choices=ROUTINGS, default="uniform", help="how the test tokens pick their "
                      "experts: uniform (every expert equally likely) or skewed (Zipf: a few experts get most "
                      "tokens, some none)")
    srch.add_argument("--errRatio", type=fraction, default=0.05, help="max fraction of outputs outside "
                      "isclose(ref, rtol=atol=1e-2) for a candidate to win (default 0.05; AITER's MoE tuner: 0.5)")
    srch.add_argument("--seed", type=int, default=0, help="seed of the random inputs and routing")
    srch.add_argument("--min_gain", type=gain, default=1.02, help="a confirmed winner must be this many times "
                      "faster than the op's untuned default (and torch's experts) at its token count (1.02)")
    cli.add_confirm_arguments(srch)
    cli.add_candidates_from_argument(srch)
    run_ = ap.add_argument_group("execution")
    cli.add_execution_arguments(run_, "module imported in every process (registers extra backends)")
    add_aiter_flags(ap, split_shapes=True)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cli.configure_logging(args.verbose)
    plugins = cli.plugins_of(args.plugin, first=["gradlib.moe"])
    try:
        check_aiter_flags(args)
        _, rows_of = cli.rows_source(args)
        notes: list[str] = []
        problems = [] if rows_of else load_problems(args.shapes, args.model_dir, args.tp, args.ep, args.token,
                                                    args.dtype, args.last, notes)
        cli.print_notes(PROG, notes)
        if args.print_shapes:
            sys.stdout.write(render_csv(FMOE_UNTUNED_COLUMNS, [FUSED_MOE.untuned_row(p) for p in problems]))
            return EXIT_OK
        devices = cli.executor_devices(args.mp, args.ray)
        on_gpu = devices[0] is not None
        env = cli.worker_env(on_gpu)
        with scoped_env(env):
            import_plugins(plugins)
        known = known_backends(FUSED_MOE.backends)  # the op's backends and the plugins' registrations
        bad = sorted(set(args.libtype or ()) - set(known))
        if bad:
            raise UsageError(f"--libtype {bad}: not among the op's backends {sorted(known)}")
        for lib in (lib for lib in args.libtype or () if lib in OPTIONAL_LIBTYPES):
            why = get_backend(lib, FUSED_MOE.backends).unavailable_reason()
            if why is not None:
                raise UsageError(f"--libtype {lib}: {why}")
        libtypes = tuple(args.libtype or default_libtypes(on_gpu))
        if args.vllm_dir and args.run_config:
            raise UsageError("--vllm_dir: --run_config times rows without tuning; nothing to write for vLLM")
        if args.vllm_dir and triton_backend.NAME not in libtypes:
            raise UsageError(f"--vllm_dir: vLLM's files hold Triton configs, and triton is not timed (--libtype "
                             f"{','.join(libtypes)})")
        fixed_names = [(c, candidate_solution(c)) for c in args.candidates or ()]
    except ValueError as exc:  # UsageError, a --candidates name that does not parse, ModelConfigError
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ConfigError, ModelConfigError, ImportError, KeyError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    package = FUSED_MOE.backends
    timing = with_iterations(cli.timing_configs(args.timing, None if on_gpu else CPU_TIMING, on_gpu), args)
    search = SearchOptions(libtypes, err_ratio=args.errRatio, seed=args.seed, min_gain=args.min_gain,
                           confirm_rounds=0 if args.candidates else args.confirm_rounds,
                           pad_check=args.pad_check == "on", finalist_margin=args.finalist_margin, op=FUSED_MOE.name,
                           baseline=torch_impl.LIBTYPE if torch_impl.LIBTYPE in libtypes else None,
                           quick=args.quick, **timing, options=(("routing", args.routing),),
                           untunable=tuple(n for n in known_backends(package) if not get_backend(n, package).tunable),
                           refine=stage_refine() if args.stage_search == "separate" and not args.candidates else None)

    def fixed(p: MoeProblem, ident: DeviceIdentity) -> tuple[Solution, ...]:
        return tuple(sol for _, sol in fixed_names)

    job = TuneJob(PROG, tune_op(FUSED_MOE.name), problems, search, args.tuned_file, args.batch, args.all,
                  keep_class_rows=args.keep_class_rows, split_shapes=not args.shape_grouped,
                  candidates=fixed if args.candidates else
                  cli.candidates_from(args.candidates_from, FUSED_MOE.name) if args.candidates_from else None,
                  profile_file=args.profile_file, verbose=args.verbose,
                  sidecar=partial(vllm_sidecar, tuned_file=args.tuned_file, vllm_dir=args.vllm_dir)
                  if args.vllm_dir else None,
                  rows_of=rows_of, compare=None if args.run_config else compare_options(args, args.tuned_file),
                  output_dirs=(("--vllm_dir", args.vllm_dir),) if args.vllm_dir else (), err_limit=args.errRatio)
    executor = cli.build_executor(devices, plugins, args.timeout, args.ray, env)
    return run(job, executor, run_config=bool(args.run_config), sort=args.sort)


if __name__ == "__main__":
    sys.exit(main())
