"""``python -m aiter_gemm.kernel_check``: run one kernel config of one op on one shape, on its own: verify it against
a float32 reference, benchmark it with CUDA events, or profile it under Nsight Compute (docs/configs.md, "Checking
one kernel"). How kernel bugs get reported and a config is tuned by hand.

    python -m aiter_gemm.kernel_check --op a8w8_blockscale --libtype triton --shape 16,4096,7168 \\
        --config swapAB-BM16_BN128_BK128_GM1_SK1_W4_S3 --verify --bench --ncu ncu_out

``--config``: a kernelName as the tuned CSVs write it, a JSON object (a JSON-file entry of the op, or the row fields
``solidx``/``splitK``/``kernelName``), an integer ``solidx`` (a16w16: a skinny variant, a cuBLASLt algorithm id among
the shape's candidates, -1 for its heuristic #0), or ``default`` (the libtype's default for the shape, else its first
candidate). The runner is built the way the tuner builds a candidate's (:func:`aiter_gemm.testbed.prepare_runner`:
the backend's ``why_not`` and ``prepare``), on the op's inputs and float32 reference as the tuner times on them
(:attr:`aiter_gemm.opspec.OpSpec.make_inputs`).

Output, exactly: ``VERIFY: PASS`` or ``VERIFY: FAIL max_abs_err=<v>`` (``--verify``: every element within the
tuner's tolerance for the dtypes, :data:`aiter_gemm.accuracy.TOLERANCES`), ``TFLOPS: <v> time_ms: <v>`` (``--bench``:
10 warm-up calls, then 50 timed between two CUDA events). ``--ncu DIR`` runs this command again under ``ncu``
(``--set full``, only the kernel calls inside a profiler window) into ``DIR/<name>.ncu-rep`` and exports it with
``ncu --import ... --csv --page raw`` into ``DIR/<name>.csv``. Every argument is checked before anything runs (the
dtypes against the op's rule, the shape against the device's memory, ``--ncu`` DIR writable, ``--config`` through the
op's parsers). Without a CUDA GPU, ``--bench`` beside ``--verify`` or ``--ncu`` is skipped with one line on stderr
saying why. Exit status: 0 done (verified), 1 verification failed, 2 bad arguments or a config that cannot run here
(one line naming the argument).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from aiter_gemm.accuracy import err_ratio, tolerance_for
from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.configs import parse_int, parse_size
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.dtypes import parse_dtype
from aiter_gemm.fileio import atomic_write_text, write_error
from aiter_gemm.registry import get_backend, known_backends, op_spec
from aiter_gemm.testbed import inputs_memory, prepare_runner
from aiter_gemm.timing import ms_per_call

PROG = "python -m aiter_gemm.kernel_check"
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
WARMUP, ITERS = 10, 50
#: --op -> (the op's name, the libtypes checked here; None: every backend of the op's package).
OPS: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "a16w16": ("gemm_a16w16", None),
    "a8w8_blockscale": ("gemm_a8w8_blockscale", ("triton", "tilelang", "torch", "deepgemm")),
}
_SOLUTION_KEYS = {f.name for f in fields(Solution)}
NO_CUDA = "--bench: times with CUDA events and needs a CUDA GPU; this machine has none"
NO_NCU = "--ncu: Nsight Compute's ncu is not on PATH (install Nsight Compute, or put its folder on PATH)"


class UsageError(ValueError):
    """Bad arguments, or a config that cannot run here: the message names the argument."""


@dataclass(frozen=True)
class Check:
    """One kernel on one shape: what the arguments resolved to."""

    op: str
    problem: GemmProblem
    solution: Solution
    identity: DeviceIdentity
    device: torch.device


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description="Verify, benchmark or profile one kernel config of one op "
                                 "on one shape.", formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", required=True, choices=sorted(OPS), help="the op")
    ap.add_argument("--libtype", required=True, help="the backend (a16w16: every backend the dispatcher knows; "
                    "a8w8_blockscale: triton, tilelang, torch, deepgemm)")
    ap.add_argument("--shape", required=True, help="M,N,K")
    ap.add_argument("--config", default="default", help="a kernelName as the CSVs write it, a JSON object, an "
                    "integer solidx, or default (the libtype's default for the shape)")
    ap.add_argument("--dtype", default="bf16", help="a16w16 input dtype (bf16, fp16, fp32; default bf16)")
    ap.add_argument("--outdtype", help="output dtype (default: bf16 for a8w8_blockscale, the input dtype for a16w16)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    ap.add_argument("--verify", action="store_true", help="compare with the float32 reference")
    ap.add_argument("--bench", action="store_true", help=f"{WARMUP} warm-up and {ITERS} timed calls, CUDA events")
    ap.add_argument("--ncu", metavar="DIR", help="profile under Nsight Compute; report and CSV export in DIR")
    ap.add_argument("--profile_calls", type=int, help=argparse.SUPPRESS)  # the run under ncu: a profiler window
    return ap


def _shape(text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    try:
        M, N, K = (parse_size(p.strip()) for p in parts)
    except ValueError:
        raise UsageError(f"--shape {text!r}: must be M,N,K, three positive integers") from None
    return M, N, K


def _problem(args: argparse.Namespace, op: str) -> GemmProblem:
    M, N, K = _shape(args.shape)
    try:
        if op == "gemm_a8w8_blockscale":
            dtype, otype = torch.float8_e4m3fn, parse_dtype(args.outdtype or "bf16")
        else:
            dtype = parse_dtype(args.dtype)
            otype = parse_dtype(args.outdtype) if args.outdtype else dtype
    except (ValueError, KeyError) as exc:
        raise UsageError(f"--dtype/--outdtype: {exc}") from None
    why = _dtype_error(op, dtype, otype)
    if why is not None:
        raise UsageError(f"--dtype/--outdtype: {why}")
    return GemmProblem(M, N, K, False, dtype, otype)


def _dtype_error(op: str, dtype: torch.dtype, otype: torch.dtype) -> str | None:
    """The op's own dtype rule (what its public function refuses), then the tuner's tolerance table (what
    ``--verify`` compares with)."""
    if op == "gemm_a8w8_blockscale":
        from aiter_gemm.backends.a8w8_blockscale.triton import OUT_DTYPES

        if otype not in OUT_DTYPES:
            return f"{otype} output is not supported (one of {', '.join(map(str, OUT_DTYPES))})"
    else:
        from aiter_gemm.ops.a16w16 import dtype_error

        why = dtype_error(dtype, otype)
        if why is not None:
            return why
    try:
        tolerance_for(dtype, otype)
    except KeyError as exc:
        return str(exc.args[0])
    return None


def _libtype(args: argparse.Namespace) -> tuple[str, Any]:
    op, allowed = OPS[args.op]
    package = op_spec(op).backends
    known = allowed or tuple(known_backends(package))
    if args.libtype not in known:
        raise UsageError(f"--libtype {args.libtype!r}: not a backend of {op} here (one of {', '.join(known)})")
    backend = get_backend(args.libtype, package)
    why = backend.unavailable_reason()
    if why is not None:
        raise UsageError(f"--libtype {args.libtype}: cannot run here: {why}")
    return op, backend


def resolve_solution(op: str, libtype: str, backend: Any, problem: GemmProblem, identity: DeviceIdentity,
                     text: str) -> Solution:
    """The solution ``--config`` names for ``libtype`` (see the module docstring); UsageError naming ``--config``."""
    text = text.strip()
    if text == "default":
        sol = backend.default_for(problem, identity) or next(iter(backend.candidates(problem, identity)), None)
        if sol is None:
            raise UsageError(f"--config default: {libtype} has no default or candidate for M={problem.M} "
                             f"N={problem.N} K={problem.K}")
        return sol
    if text.startswith("{"):
        return _json_solution(op, libtype, problem, text)
    if op == "gemm_a8w8_blockscale":
        from aiter_gemm.ops.a8w8_blockscale import parse_choice, solution_of

        try:
            sol = solution_of(parse_choice(text))
        except ValueError as exc:
            raise UsageError(f"--config {text!r}: {exc}") from None
        return _same_libtype(sol, libtype, text)
    listed = list(backend.candidates(problem, identity))
    try:
        solidx = parse_int(text)
    except ValueError:
        solidx = None
    if solidx is not None:
        sol = Solution(libtype, solidx)
        if backend.why_not(problem, sol, identity) is None:
            return sol
        return next((s for s in listed if s.solidx == solidx), sol)  # e.g. a cuBLASLt algorithm id
    return next((s for s in listed if s.kernelName == text), Solution(libtype, -1, 0, text))


def _json_solution(op: str, libtype: str, problem: GemmProblem, text: str) -> Solution:
    try:
        entry = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--config: not valid JSON: {exc}") from None
    if not isinstance(entry, dict):
        raise UsageError(f"--config: a JSON object expected, got {type(entry).__name__}")
    if set(entry) <= _SOLUTION_KEYS:
        for key, kind in (("libtype", str), ("solidx", int), ("splitK", int), ("kernelName", str)):
            if key in entry and (not isinstance(entry[key], kind) or isinstance(entry[key], bool)):
                raise UsageError(f"--config {text}: {key} must be a JSON {'string' if kind is str else 'integer'}, "
                                 f"got {entry[key]!r}")
        return _same_libtype(Solution(**{"libtype": libtype, **entry}), libtype, text)
    spec = op_spec(op)
    try:
        if spec.json is None:
            raise ValueError(f"{libtype} configs are given by solidx / kernelName (keys {sorted(_SOLUTION_KEYS)})")
        # An entry as the op's JSON files hold one, parsed by --libtype's backend (as written: the runtime would fit
        # a bucket's config to each shape).
        named = {"libtype": libtype} if libtype != spec.json.libtype else {}
        sol = spec.json.parse({**named, **entry}, lambda name: get_backend(name, spec.backends))
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--config {text}: {exc}") from None
    return _same_libtype(sol, libtype, text)


def _same_libtype(sol: Solution, libtype: str, text: str) -> Solution:
    if sol.libtype != libtype:
        raise UsageError(f"--config {text!r} is a {sol.libtype} config, not --libtype {libtype}")
    return sol


def resolve(args: argparse.Namespace) -> Check:
    """Every argument checked and resolved (UsageError naming the one that is wrong)."""
    from aiter_gemm import current_device_identity

    op, backend = _libtype(args)
    problem = _problem(args, op)
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    fits, need = inputs_memory(problem, device)
    if not fits:
        raise UsageError(f"--shape {args.shape}: {need}")
    identity = current_device_identity(on_gpu)
    try:
        sol = resolve_solution(op, args.libtype, backend, problem, identity, args.config)
    except UsageError:
        raise
    except ValueError as exc:  # a parser's ConfigError or ValueError (a kernelName out of range, malformed)
        raise UsageError(f"--config {args.config}: {exc}") from None
    return Check(op, problem, sol, identity, device)


def prepare(check: Check, seed: int = 0):
    """(runner, inputs) of the check: the tuner's way (``prepare_runner``, the op's inputs and reference)."""
    try:
        runner, _, why = prepare_runner(check.op, check.problem, check.solution, check.identity)
    except ValueError as exc:  # a parser's ConfigError or ValueError, raised while building the runner
        raise UsageError(f"--config {check.solution.kernelName or check.solution.solidx}: {exc}") from None
    if runner is None:
        raise UsageError(f"--config: {why}")
    return runner, op_spec(check.op).make_inputs(check.problem, seed, check.device, 0, {})


def verify(check: Check, runner: Any, inputs: Any) -> tuple[bool, float]:
    """(passed, max |out - ref|): passed when every element is within the tuner's tolerance of the float32
    reference (``err_ratio`` 0)."""
    p = check.problem
    out = op_spec(check.op).call_runner(runner, inputs.sets[0], p)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (p.M, p.N):
        return False, float("inf")
    diff = (out.float() - inputs.ref.float()).abs()
    max_err = float(diff.max()) if diff.numel() else 0.0
    if diff.isnan().any():
        max_err = float("nan")
    return err_ratio(out, inputs.ref, tolerance_for(p.dtype, p.otype)) == 0.0, max_err


def bench(check: Check, runner: Any, inputs: Any) -> tuple[float, float]:
    """(TFLOPS, ms per call): :data:`WARMUP` calls, then :data:`ITERS` between two CUDA events."""
    if check.device.type != "cuda":
        raise UsageError(NO_CUDA)
    call, args, p = op_spec(check.op).call_runner, inputs.sets[0], check.problem
    ms = ms_per_call(lambda: call(runner, args, p), ITERS, cuda=True, warmup=WARMUP)
    return p.flops / ms / 1e9, ms


def ncu_commands(argv: Sequence[str], directory: str | Path, name: str, ncu: str = "ncu"
                 ) -> tuple[list[str], list[str], Path, Path]:
    """(profile command, export command, report, CSV): this command again without ``--verify``/``--bench``/
    ``--ncu``, one call in a profiler window, under ``ncu --set full``; then the report exported as CSV."""
    rest: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--verify", "--bench"):
            continue
        elif a == "--ncu":
            skip = True
        elif not a.startswith("--ncu="):
            rest.append(a)
    report = Path(directory) / f"{name}.ncu-rep"
    profile = [ncu, "--target-processes", "all", "--set", "full", "--profile-from-start", "off", "--export",
               str(report), "--force-overwrite", sys.executable, "-m", "aiter_gemm.kernel_check", *rest,
               "--profile_calls", "1"]
    return profile, [ncu, "--import", str(report), "--csv", "--page", "raw"], report, report.with_suffix(".csv")


def profile_window(check: Check, runner: Any, inputs: Any, calls: int) -> None:
    """One warm-up call (JIT compilation outside the window), then ``calls`` calls inside cudaProfilerStart/Stop,
    the only kernels ``ncu --profile-from-start off`` profiles."""
    call, args, p = op_spec(check.op).call_runner, inputs.sets[0], check.problem
    call(runner, args, p)
    cuda = check.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
    for _ in range(calls):
        call(runner, args, p)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def run_ncu(argv: Sequence[str], args: argparse.Namespace, check: Check) -> int:
    ncu = shutil.which("ncu")
    if ncu is None:
        raise UsageError(NO_NCU)
    name = re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{args.op}_{args.libtype}_{args.shape}_{check.solution.kernelName}")
    Path(args.ncu).mkdir(parents=True, exist_ok=True)
    profile, export, report, csv_path = ncu_commands(argv, args.ncu, name[:160], ncu)
    rc = subprocess.run(profile, check=False).returncode
    if rc != 0:
        print(f"{PROG}: ncu exited with status {rc}: {' '.join(profile)}", file=sys.stderr)
        return rc
    exported = subprocess.run(export, stdout=subprocess.PIPE, text=True, check=False)
    rc = exported.returncode
    if rc == 0:  # the CSV written whole (temp + rename), never a half export
        atomic_write_text(csv_path, exported.stdout)
    if rc != 0:
        print(f"{PROG}: ncu --import exited with status {rc}: {' '.join(export)}", file=sys.stderr)
        return rc
    print(f"NCU: {report} {csv_path}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    out = sys.stdout
    try:
        # Standard output holds only the result lines (parsed by scripts, as AITER's are): whatever the kernels'
        # libraries print while building or compiling (TileLang logs each compile through tqdm.write to stdout)
        # goes to standard error.
        with contextlib.redirect_stdout(sys.stderr):
            if not (args.verify or args.bench or args.ncu or args.profile_calls):
                raise UsageError("nothing to do: give --verify, --bench and/or --ncu DIR")
            unwritable = write_error(args.ncu, folder=True) if args.ncu else None
            if unwritable is not None:
                raise UsageError(f"--ncu {args.ncu}: {unwritable}")
            check = resolve(args)
            if args.ncu and shutil.which("ncu") is None:
                raise UsageError(NO_NCU)
            if args.bench and check.device.type != "cuda":
                if not (args.verify or args.ncu):
                    raise UsageError(NO_CUDA)
                print(f"{PROG}: skipping {NO_CUDA}", file=sys.stderr)
                args.bench = False
            runner, inputs = prepare(check, args.seed)
            if args.profile_calls:
                profile_window(check, runner, inputs, args.profile_calls)
                return EXIT_OK
            if args.verify:
                passed, max_err = verify(check, runner, inputs)
                print("VERIFY: PASS" if passed else f"VERIFY: FAIL max_abs_err={max_err:.6g}", file=out, flush=True)
                if not passed:
                    return EXIT_FAIL
            if args.bench:
                tflops, ms = bench(check, runner, inputs)
                print(f"TFLOPS: {tflops:.2f} time_ms: {ms:.5f}", file=out, flush=True)
        if args.ncu:
            return run_ncu(argv, args, check)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
