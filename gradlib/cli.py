"""What every tuner CLI shares: usage errors and exit statuses, the execution flags (``--mp``, ``--ray``,
``--timeout``, ``--plugin``, ``--verbose``), and turning them into an executor (local process pool or Ray actors).

Exit statuses (docs): 0 every shape tuned or already tuned; 1 some shape had no valid candidate; 2 bad arguments
or input (an output that cannot be written included: checked before anything runs); 3 workers could not start; 4 an
output could not be written at the end (its tuned rows are printed); 130 interrupted by SIGINT (Ctrl-C), 143 by
SIGTERM (what finished is saved).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import torch

from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.cliargs import (  # noqa: F401 - the tuners' argparse types, shared with every program
    existing_file,
    fraction,
    gain,
    int_list,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    positive_int_list,
)
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.registry import op_spec
from aiter_gemm.timing import TimingConfig
from gradlib.pool import Executor, PoolError, ProcessPool
from gradlib.search import CONFIRM, FULL, SCREEN

EXIT_OK, EXIT_FAILED_SHAPES, EXIT_USAGE, EXIT_POOL, EXIT_UNSAVED = 0, 1, 2, 3, 4
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143
#: The exit statuses as the tuners' ``--help`` states them.
EXIT_HELP = ("exit status: 0 every shape tuned or already tuned; 1 some shape had no valid candidate; 2 bad arguments "
             "or input (an output that cannot be written included); 3 workers could not start; 4 an output could "
             "not be written (the tuned rows are printed); 130 interrupted by Ctrl-C, 143 by SIGTERM (what "
             "finished is saved).")


class UsageError(ValueError):
    """Bad arguments or input files: exit status 2 with the message."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a job scheduler, ``docker stop``), raised in the main thread as Ctrl-C is, so the driver
    saves what finished the same way."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the driver runs, SIGTERM raises :class:`Terminated` (once: a repeated SIGTERM does not interrupt the
    final checkpoint). Only the main thread can own signal handlers; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen = []

    def handler(signum: int, frame: object) -> None:
        if not seen:
            seen.append(signum)
            raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupt_status(exc: KeyboardInterrupt) -> int:
    """130 for Ctrl-C (SIGINT), 143 (128 + 15) for SIGTERM, as a shell reports a process those signals killed."""
    return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED


def name_list(text: str) -> list[str]:
    """argparse type: comma-separated names."""
    return [v.strip() for v in text.split(",") if v.strip()]


def add_execution_arguments(group: argparse._ArgumentGroup, plugin_help: str) -> None:
    """``--mp``, ``--ray``, ``--timeout``, ``--plugin``, ``--verbose``: the same flags with the same meaning in
    every tuner."""
    group.add_argument("--mp", type=positive_int, default=None, help="worker processes, one per GPU (default: "
                       "every visible GPU; 1 on CPU, where Triton kernels run in the interpreter)")
    group.add_argument("--ray", metavar="ADDRESS", default=None,
                       help="run on a Ray cluster instead of local processes: 'auto' (the cluster 'ray start' "
                       "started on this machine), HOST:6379, ray://HOST:10001 (Ray client), or 'local' (a private "
                       "one-machine Ray instance); one actor per cluster GPU (--mp caps it). Needs "
                       "pip install 'aiter_gemm[ray]' on the driver and every node")
    group.add_argument("--timeout", type=positive_float, default=60.0, help="seconds one candidate may take, JIT "
                       "compilation included, before its worker is killed and it is recorded failed (60)")
    group.add_argument("--plugin", action="append", default=[], help=plugin_help + "; also GRADLIB_PLUGINS=mod1,mod2")
    group.add_argument("--verbose", "-v", action="store_true", help="log progress")


def add_confirm_arguments(group: argparse._ArgumentGroup) -> None:
    """``--confirm_rounds``, ``--finalist_margin``, ``--pad_check`` and ``--timing``: how a winner is confirmed and
    timed (every tuner)."""
    group.add_argument("--confirm_rounds", type=non_negative_int, default=2,
                       help="re-time the winner against the runtime's "
                       "default and the library call in this many fresh rounds of alternating order before writing "
                       "it (written only if it still wins by --min_gain; 0: off, plain fastest of the search)")
    group.add_argument("--finalist_margin", type=non_negative_float, default=1.15, help="the fastest candidate of "
                       "each other libtype within this factor of the winner's search time is re-timed in the same "
                       "confirmation rounds, and the best median there is the winner (timings taken one after another "
                       "drift); 0 or 1: off (1.15)")
    group.add_argument("--pad_check", choices=("on", "off"), default="on", help="also confirm the winner at the "
                       "smallest M of each padding range it would serve and one in the middle, and write the "
                       "smallest M it held for as pad_m_min (docs/configs.md); off: exact use only")
    group.add_argument("--timing", choices=("graph", "eager"), default="graph", help="time candidates by "
                       "CUDA-graph replay (graph: GPU time, as served with CUDA graphs) or by a loop of eager calls "
                       "(eager: includes each backend's launch cost, for deployments without graphs)")


def add_output_arguments(group: argparse._ArgumentGroup, all_help: str) -> None:
    """``--all`` and ``--keep_class_rows``: which rows of the tuned file a new row replaces (every tuner)."""
    group.add_argument("--all", action="store_true", help=all_help)
    group.add_argument("--keep_class_rows", action="store_true", help="write this device's rows (device_name) "
                       "beside the rows naming no device, which serve every device of their gfx and cu_num (another "
                       "GPU of the class, the H100 for an H200), instead of replacing them (--all) or leaving the "
                       "shape alone")


def add_recheck_argument(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--recheck", action="store_true", help="check the tuned file (-o) on this GPU, no search: "
                       "every row serving this device re-timed against the library call and the runtime default, "
                       "and a row for this device (device_name) written beside the class row where one of them "
                       "beats it by --min_improvement_pct; short for -i <-o> --all --keep_class_rows "
                       "--candidates_from <-o> --compare --update_improved")


def rows_source(args: argparse.Namespace, input_attr: str = "shapes") -> tuple[str | None, str | None]:
    """(the ``--run_config`` file or None, the file whose rows are the shapes to time or None): a run of rows
    (``--run_config FILE``) or an in-place retune (``--all`` with the same input and output file) takes its shapes
    from rows; UsageError when the ``--run_config`` file is missing."""
    run_config = args.run_config if isinstance(args.run_config, str) else None
    shapes = getattr(args, input_attr)
    in_place = bool(args.all and shapes and os.path.abspath(shapes) == os.path.abspath(args.tuned_file))
    if run_config is not None and not os.path.isfile(run_config):
        raise UsageError(f"--run_config {run_config}: file not found")
    return run_config, run_config or (args.tuned_file if in_place and not args.run_config else None)


def print_notes(prog: str, notes: Sequence[str]) -> None:
    """The shape loaders' notes, on stderr (``--print_shapes``' stdout stays a CSV)."""
    for note in notes:
        print(f"{prog}: note: {note}", file=sys.stderr)


def apply_recheck(args: argparse.Namespace, input_attr: str) -> None:
    """``--recheck`` as the flags it stands for (``input_attr``: the tuner's ``-i`` destination); a UsageError where
    a flag given with it asks for something else."""
    if not args.recheck:
        return
    tuned = args.tuned_file
    if not os.path.isfile(tuned):
        raise UsageError(f"--recheck: the tuned file -o {tuned} does not exist")
    if args.run_config:
        raise UsageError("--recheck writes the rows that lose here; --run_config only times rows")
    for flag in ("model_dir", "nk", "candidates"):  # the tuners that have them
        if getattr(args, flag, None):
            raise UsageError(f"--recheck times the rows of -o {tuned} as they are: not with --{flag}")
    for flag, path in (("-i", getattr(args, input_attr)), ("--candidates_from", args.candidates_from)):
        if path and os.path.abspath(path) != os.path.abspath(tuned):
            raise UsageError(f"--recheck checks -o {tuned} in place: {flag} {path} is another file")
    setattr(args, input_attr, tuned)
    args.candidates_from = tuned
    args.all = args.keep_class_rows = args.compare = args.update_improved = True


def add_candidates_from_argument(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--candidates_from", metavar="TUNED_CSV", type=existing_file, help="no search: time each "
                       "shape's solution from this tuned file (and the library call), confirm it as a new winner "
                       "would be, and write it with its checked padding range (re-confirming a shipped or stale file "
                       "cheaply)")


def candidates_from(path: str, op: str) -> Callable[[GemmProblem, DeviceIdentity], tuple[Solution, ...]]:
    """Per (shape, device): the solution ``path``'s row for it names (``()`` when the file has none)."""
    from gradlib.results import row_solutions

    row_key = op_spec(op).row_key
    cache: dict[DeviceIdentity, dict] = {}

    def fixed(p: GemmProblem, ident: DeviceIdentity) -> tuple[Solution, ...]:
        if ident not in cache:
            cache[ident] = row_solutions(path, ident, op)
        sol = cache[ident].get(row_key(p))
        return (sol,) if sol is not None else ()

    return fixed


def timing_configs(mode: str, cpu_fallback: TimingConfig | None = None, on_gpu: bool = True
                   ) -> dict[str, TimingConfig]:
    """The screen / full / confirm timing configs for ``--timing`` (``cpu_fallback`` for all three when given). Not
    ``on_gpu`` there are no CUDA graphs: calls are timed one by one, as eager calls, and rows say ``timing=eager``."""
    if cpu_fallback is not None:
        return {"screen": cpu_fallback, "full": cpu_fallback, "confirm": cpu_fallback}
    graph = mode == "graph" and on_gpu
    return {k: replace(v, use_graph=graph) for k, v in (("screen", SCREEN), ("full", FULL), ("confirm", CONFIRM))}


def plugins_of(cli_plugins: Sequence[str], first: Sequence[str] = ()) -> list[str]:
    """Modules every process imports: ``first`` (the tuner's own), ``--plugin`` ones, then ``GRADLIB_PLUGINS``."""
    env = [m.strip() for m in os.environ.get("GRADLIB_PLUGINS", "").split(",") if m.strip()]
    return [*first, *cli_plugins, *env]


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="[gradlib] %(levelname)s %(message)s")


def worker_devices(mp: int | None) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES value per worker: the visible GPUs in order (``mp`` of them); [None]*mp on CPU."""
    if mp is not None and mp < 1:
        raise UsageError(f"--mp must be >= 1, got {mp}")
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n_gpu == 0:
        return [None] * (mp or 1)
    mp = mp or n_gpu
    if mp > n_gpu:
        raise UsageError(f"--mp {mp} but only {n_gpu} GPU(s) are visible (one worker per GPU)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else [str(i) for i in range(n_gpu)]
    return ids[:mp]


def executor_devices(mp: int | None, ray: str | None) -> list[str | None]:
    """One entry per worker slot (None: a CPU worker): the local GPUs for ``--mp``, the cluster's with ``--ray``."""
    if not ray:
        return worker_devices(mp)
    from gradlib.ray_executor import ray_worker_devices  # ImportError (no Ray) -> exit 2 with the install hint

    try:
        devices = ray_worker_devices(ray, mp)
    except (ConnectionError, ValueError) as exc:
        raise UsageError(f"--ray {ray}: {exc}") from None
    if devices[0] is not None and not torch.cuda.is_available():
        # --libtype is resolved against the backends this process can load: here that would silently be torch only.
        raise UsageError(f"--ray {ray}: the cluster's actors run on GPUs but this driver sees none; run the "
                         "tuner on a GPU node of the cluster (backend availability is checked on the driver)")
    return devices


def worker_env(on_gpu: bool) -> dict[str, str | None]:
    """Environment the workers need: on CPU, Triton kernels run only interpreted, and the variable must be set before
    a kernel module is imported (in the workers, and in the driver for availability checks)."""
    return {} if on_gpu else {"TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1")}


def build_executor(devices: list[str | None], plugins: Sequence[str], timeout: float, ray: str | None,
                   env: dict[str, str | None]) -> Executor:
    """The executor of a run: Ray actors with ``ray``, else the process pool (one worker per device)."""
    if ray:
        from gradlib.ray_executor import RayExecutor

        return RayExecutor(ray, devices, plugins, timeout, extra_env=env)
    return ProcessPool(devices, plugins, timeout, extra_env=env)


def start_executor(pool: Executor, prog: str) -> int | None:
    """Start ``pool``; if that fails, close it, say why and return the exit status (None: it started)."""
    try:
        pool.start()
    except PoolError as exc:
        pool.close()
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_POOL
    except KeyboardInterrupt as exc:
        pool.close()
        print(f"{prog}: interrupted ({'SIGTERM' if isinstance(exc, Terminated) else 'SIGINT'}) while starting "
              "workers; nothing was tuned", file=sys.stderr)
        return interrupt_status(exc)
    return None


def exit_status(prog: str, pool_error: PoolError | None, interrupted: KeyboardInterrupt | None, failed: int,
                unsaved: bool = False) -> int:
    """The tuners' exit status: pool failure 3, results not written 4, interrupted 130 (SIGINT) or 143 (SIGTERM),
    some shape without a winner 1, else 0."""
    if pool_error is not None:
        print(f"{prog}: error: {pool_error}", file=sys.stderr)
        return EXIT_POOL
    if unsaved:
        return EXIT_UNSAVED
    if interrupted is not None:
        return interrupt_status(interrupted)
    return EXIT_FAILED_SHAPES if failed else EXIT_OK


def help_epilog(examples: Sequence[str]) -> str:
    """A tuner's ``--help`` epilog: example commands, then the exit statuses (plain text, wrapped by hand)."""
    import textwrap

    return "examples:\n" + "\n".join(f"  {e}" for e in examples) + "\n\n" + textwrap.fill(EXIT_HELP, 100)
