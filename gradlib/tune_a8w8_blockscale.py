"""``python -m gradlib.tune_a8w8_blockscale``: tune the A8W8 block-scale Triton kernels per (M, N, K) and write the
tuned CSV rows and seed 002's per-(N, K) JSON files that :func:`aiter_gemm.gemm_a8w8_blockscale` dispatches from.

Examples::

    python -m gradlib.tune_a8w8_blockscale --nk 8192,8192 10240,8192 --m 1,16,64,256,1024,4096 --quick
    python -m gradlib.tune_a8w8_blockscale --model_dir deepseek_v3_dir --tp 8 -o dsv3_blockscale_tuned.csv
    python -m gradlib.tune_a8w8_blockscale --shapes a8w8_blockscale_untuned_gemm.csv --mp 8

Shapes: ``--nk N,K ...`` or ``--model_dir`` (+ ``--tp``) crossed with ``--m``, and/or ``--shapes`` (an untuned CSV
with M,N,K columns, e.g. AITER's ``a8w8_blockscale_untuned_gemm.csv``, taken as is). Model projections (M = tokens,
N = out features per TP rank, K = in features): Llama-style configs give qkv, o, gate_up and down as
:mod:`gradlib.models` derives them (lm_head stays bf16 in FP8 checkpoints, so it is not tuned); configs with
``kv_lora_rank`` (DeepSeek-V2/V3 MLA) give the rules of :func:`deepseek_projections`.

Search: every config of :func:`~aiter_gemm.kernels.a8w8_blockscale.config_space` (variant x BLOCK_SIZE_M/N x
GROUP_SIZE_M x split-K x warps x stages x N subtiles; ``--quick``: a hand-picked list per M class), already pruned
of configs that cannot fit (shared memory, register budget, split-K beyond the K blocks) or cannot win;
``--variants`` restricts the variants, ``--candidates`` names the configs to time instead. ``--libtype`` (default
``triton,torch`` on a GPU, ``triton`` on CPU): ``torch`` adds torch's block-scaled ``F.scaled_mm`` (cuBLASLt) as one
more candidate where it supports the shape; when it wins, the row and JSON bucket say ``libtype=torch``. Each
candidate runs in a worker of gradlib's crash-isolated pool (:mod:`gradlib.pool`, one process per GPU, ``--mp``; a
candidate that raises, hangs past ``--timeout`` or kills its process is recorded failed and the run goes on), is
checked against the float32 dequantized reference (``err_ratio`` <= ``--errRatio``) and timed with CUDA-graph replay
over rotating inputs larger than twice the L2 (:mod:`gradlib.timing`). One shape's candidates are split into one
chunk per worker.

Output: the winner per shape is merged into ``-o`` (AITER's a8w8-blockscale columns, :func:`aiter_gemm.blockscale.
csv_row`) every ``--batch`` shapes; shapes the file already has for this device are skipped (resume), unless
``--all``. JSON: after its shapes finish, each (N, K) gets ``{arch}-GEMM-A8W8_BLOCKSCALE-N={N}-K={K}.json`` in
``--json_dir``, rebuilt from every row of the tuned file for that (N, K) on this device. Buckets (``--buckets``):

* ``fine`` (default): ``M_LEQ_<m>`` for each tuned M, holding the winner at m, plus ``any`` (the largest M's
  winner). The best variant changes within seed 002's categories (on H100: swapAB / split-K up to M = 16, base
  with 64-wide tiles up to 256, 128 x 128 tiles on 8 warps from 1024), so one config per category loses.
* ``seed``: seed 002's ``small_M`` (M <= 256), ``medium_M`` (256 < M <= 2048), ``large_M`` (M > 2048): per
  category, the config with the lowest geometric mean of time / best time over the category's tuned M (among
  configs valid at all of them, timed in this run; the winner at the category's largest M otherwise); ``large_M``
  repeats the highest tuned category when no M above 2048 was tuned, so every M has an entry.

Exit status: 0 every shape tuned or already tuned; 1 some shape had no valid config; 2 bad arguments or input;
3 workers could not start; 130 interrupted (what finished is saved).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.blockscale import (
    BLOCKSCALE_TUNED_COLUMNS,
    Choice,
    buckets_from_tuned,
    csv_row,
    json_config_path,
    parse_choice,
    write_json_configs,
)
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.dtypes import parse_dtype
from aiter_gemm.fileio import merge_csv_rows, read_csv_rows, render_csv
from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl
from aiter_gemm.kernels.a8w8_blockscale import VARIANTS, config_space, default_config
from gradlib import gemm_tuner
from gradlib.blockscale_shapes import (  # noqa: F401 - Projection, deepseek_projections, ... re-exported
    Projection,
    UsageError,
    deepseek_projections,
    int_list,
    load_shapes,
    model_projections,
    nk_pair,
    read_shapes_csv,
)
from gradlib.blockscale_tasks import BLOCKSCALE, FP8, X_SCALE_LAYOUTS, check_candidate, is_config_name
from gradlib.models import ModelConfigError
from gradlib.pool import Executor, scoped_env
from gradlib.tasks import ItemResult, Task, import_plugins
from gradlib.timing import FULL, TimingConfig

log = logging.getLogger("gradlib")

PROG = "python -m gradlib.tune_a8w8_blockscale"
DEFAULT_MS = (1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
KEY_COLUMNS = ("gfx", "cu_num", "M", "N", "K")
PROFILE_COLUMNS = (*KEY_COLUMNS, "kernelName", "status", "us", "errRatio", "tflops", "error")
# Interpreted Triton on CPU (tests): ~50 ms a launch at N = K = 256, so a few launches per candidate.
CPU_TIMING = TimingConfig(warmup=1, reps=3, target_us=0.0, use_graph=False, budget_s=0.2)
# Seed 002's categories as (JSON key, largest M); the last is unbounded.
SEED_BUCKETS = (("small_M", 256), ("medium_M", 2048), ("large_M", None))


def candidate_names(M: int, N: int, K: int, args: argparse.Namespace, otype: torch.dtype = torch.bfloat16,
                    num_sms: int = 132) -> list[str]:
    """The candidates of one shape: --candidates (those that can run it), else the pruned config space plus the
    runtime's built-in default (so a tuned row is never slower than having none; ``--libtype`` triton) and torch's
    block-scaled matmul where it supports the shape (``--libtype`` torch)."""
    if args.candidates:
        return [c for c in args.candidates if check_candidate(c, M, N, K, otype) is None]
    libtypes = getattr(args, "libtype", None) or ("triton",)
    out = []
    if "triton" in libtypes:
        variants = set(args.variants) if args.variants else set(VARIANTS)
        cfgs = [*config_space(M, N, K, quick=args.quick), default_config(M, N, K, num_sms)]
        out += list(dict.fromkeys(c.name for c in cfgs if c.variant in variants))
    if torch_impl.LIBTYPE in libtypes and torch_impl.shape_error(M, N, K, otype) is None:
        out.append(torch_impl.NAME)
    return out


# ---- the search of one shape ------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """One shape's results: every candidate's, and the winner (fastest valid Triton config or torch's) if any."""

    shape_id: int
    M: int
    N: int
    K: int
    names: list[str]
    results: list[ItemResult]
    winner: int | None
    wall_s: float

    @property
    def tuned(self) -> bool:
        return self.winner is not None


@dataclass
class BlockscaleSearch:
    """The candidates of one shape split into chunks (one per executor slot) that run concurrently; drives like
    :class:`gradlib.search.ShapeSearch` (``next_task`` / ``on_item`` / ``on_task_done`` / ``done`` / ``outcome``)."""

    shape_id: int
    problem: GemmProblem
    names: list[str]
    chunk: int
    timing: TimingConfig
    max_err: float
    seed: int = 0
    options: tuple[tuple[str, object], ...] = ()
    done: bool = False
    outcome: Outcome | None = None
    planned: int = 0
    started: float = 0.0
    _next: int = 0
    _outstanding: int = 0
    _offset: dict[int, int] = field(default_factory=dict)
    _results: dict[int, ItemResult] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.planned = len(self.names)

    def next_task(self, task_id: int) -> Task | None:
        if self.done:
            return None
        if not self.started:
            self.started = time.monotonic()
        if self._next >= len(self.names):
            return None
        items = tuple(self.names[self._next:self._next + self.chunk])
        self._offset[task_id] = self._next
        self._next += len(items)
        self._outstanding += 1
        return Task(task_id, self.shape_id, BLOCKSCALE, self.problem, items, self.timing, check=True,
                    max_err=self.max_err, seed=self.seed, options=self.options)

    def on_item(self, res: ItemResult) -> None:
        self._results[self._offset[res.task_id] + res.index] = res

    def on_task_done(self) -> None:
        self._outstanding -= 1
        if self._outstanding == 0 and self._next >= len(self.names):
            self._finish()

    def _finish(self) -> None:
        results = [self._results.get(i) or ItemResult(-1, i, False, error="no result from the executor")
                   for i in range(len(self.names))]
        valid = [i for i, r in enumerate(results) if r.ok and math.isfinite(r.us) and r.err_ratio <= self.max_err
                 and is_config_name(self.names[i])]
        winner = min(valid, key=lambda i: results[i].us) if valid else None
        p = self.problem
        self.done = True
        self.outcome = Outcome(self.shape_id, p.M, p.N, p.K, self.names, results, winner,
                               time.monotonic() - (self.started or time.monotonic()))


# ---- output -----------------------------------------------------------------------------------------------------
def _status(res: ItemResult) -> str:
    return "ok" if res.ok else ("inaccurate" if res.error.startswith("err_ratio") else "failed")


def _geomean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return math.exp(sum(map(math.log, xs)) / len(xs))


def seed_buckets(best: Mapping[int, Choice], times: Mapping[int, Mapping[str, float]]) -> dict[str, Choice]:
    """Seed 002's three categories from the winners per M (``best``) and this run's valid timings per M
    (``times[M][kernelName]``); see the module docstring for the rule."""
    out: dict[str, Choice] = {}
    lower = 0
    for key, upper in SEED_BUCKETS:
        ms = sorted(m for m in best if m > lower and (upper is None or m <= upper))
        lower = upper or lower
        if not ms:
            continue
        pick = best[ms[-1]]
        if all(m in times for m in ms):
            common = set.intersection(*(set(times[m]) for m in ms))
            if common:
                name = min(sorted(common), key=lambda n: _geomean(times[m][n] / min(times[m].values()) for m in ms))
                pick = parse_choice(name)
        out[key] = pick
    if "large_M" not in out:
        out["large_M"] = out[next(k for k, _ in reversed(SEED_BUCKETS) if k in out)]
    return out


class Writer:
    """Buffers finished shapes; every ``batch`` shapes merges their rows into the tuned CSV (and the profile),
    then rewrites the JSON of each (N, K) whose shapes in this run are all finished."""

    def __init__(self, args: argparse.Namespace, identity: DeviceIdentity, shapes: Sequence[tuple[int, int, int]]):
        self.tuned_file, self.identity, self.batch = args.tuned_file, identity, args.batch
        self.json_dir = Path(args.json_dir or Path(args.tuned_file).resolve().parent)
        self.bucket_mode, self.profile_file = args.buckets, args.profile_file
        self._replace = (lambda old, new: True) if args.all else None
        self._left: dict[tuple[int, int], int] = {}
        for _, n, k in shapes:
            self._left[(n, k)] = self._left.get((n, k), 0) + 1
        self._times: dict[tuple[int, int], dict[int, dict[str, float]]] = {}
        self._rows: list[dict] = []
        self._profile: list[dict] = []
        self._pending = 0
        self._ready_nk: list[tuple[int, int]] = []
        self.json_written: list[Path] = []

    def skipped(self, shape: tuple[int, int, int]) -> None:
        """An already-tuned shape: counts as finished for its (N, K)'s JSON."""
        self._done_one(shape[1], shape[2])

    def _done_one(self, n: int, k: int) -> None:
        self._left[(n, k)] -= 1
        if self._left[(n, k)] == 0:
            self._ready_nk.append((n, k))

    def add(self, o: Outcome) -> None:
        ident = self.identity
        if o.winner is not None:
            res = o.results[o.winner]
            cfg = parse_choice(o.names[o.winner])
            self._rows.append(csv_row(ident, o.M, o.N, o.K, cfg, res.us, res.err_ratio, kernel_id=o.winner))
        self._times.setdefault((o.N, o.K), {})[o.M] = {
            n: r.us for n, r in zip(o.names, o.results) if r.ok and is_config_name(n)}
        if self.profile_file:
            for n, r in zip(o.names, o.results):
                ok = r.ok and math.isfinite(r.us)
                self._profile.append({
                    "gfx": ident.gfx, "cu_num": ident.cu_num, "M": o.M, "N": o.N, "K": o.K, "kernelName": n,
                    "status": _status(r), "us": f"{r.us:.4f}" if ok else "inf",
                    "errRatio": "" if math.isnan(r.err_ratio) else f"{r.err_ratio:.6f}",
                    "tflops": f"{2 * o.M * o.N * o.K / r.us / 1e6:.2f}" if ok else "", "error": r.error})
        self._done_one(o.N, o.K)
        self._pending += 1
        if self._pending >= self.batch:
            self.flush()

    def flush(self) -> None:
        """Merge buffered rows (CSV under its lock, atomic rename), then the JSON of finished (N, K) pairs."""
        if self._rows:
            added, replaced = merge_csv_rows(self.tuned_file, BLOCKSCALE_TUNED_COLUMNS, self._rows, KEY_COLUMNS,
                                             replace=self._replace)
            if len(self._rows) - added - replaced:
                log.warning("%s: %d shape(s) were tuned meanwhile by another writer; their rows were kept",
                            self.tuned_file, len(self._rows) - added - replaced)
            log.info("checkpoint: %d row(s) added, %d replaced in %s", added, replaced, self.tuned_file)
        if self._profile:
            merge_csv_rows(self.profile_file, PROFILE_COLUMNS, self._profile, (*KEY_COLUMNS, "kernelName"),
                           replace=lambda old, new: True)
        self._rows, self._profile, self._pending = [], [], 0
        ready, self._ready_nk = self._ready_nk, []
        for n, k in ready:
            self.write_json(n, k)

    def tuned_configs(self, n: int, k: int) -> dict[int, Choice]:
        """Config per M of the tuned file's rows for (n, k) on this device (rows naming no config are skipped)."""
        if not os.path.isfile(self.tuned_file):
            return {}
        out = {}
        for r in read_csv_rows(self.tuned_file)[1]:
            if (r.get("gfx", "") or self.identity.gfx) != self.identity.gfx \
                    or str(r.get("cu_num", "")).strip() != str(self.identity.cu_num) \
                    or (int(r["N"]), int(r["K"])) != (n, k):
                continue
            try:
                out[int(r["M"])] = parse_choice(r["kernelName"])
            except ValueError as exc:
                log.warning("%s: row M=%s N=%d K=%d skipped for the JSON: %s", self.tuned_file, r["M"], n, k, exc)
        return out

    def write_json(self, n: int, k: int) -> None:
        best = self.tuned_configs(n, k)
        if not best:
            return
        if self.bucket_mode == "seed":
            buckets = seed_buckets(best, self._times.get((n, k), {}))
        else:
            buckets = buckets_from_tuned(best)
        self.json_dir.mkdir(parents=True, exist_ok=True)
        path = json_config_path(self.json_dir, self.identity.gfx, n, k)
        write_json_configs(path, buckets)
        self.json_written.append(path)
        log.info("wrote %s (%d bucket(s) from %d tuned M)", path, len(buckets), len(best))


def tuned_shapes(path: str, identity: DeviceIdentity) -> set[tuple[int, int, int]]:
    """(M, N, K) the tuned file already has a row for on this device (a missing file has none)."""
    if not os.path.isfile(path):
        return set()
    done = set()
    for r in read_csv_rows(path)[1]:
        try:
            if (r.get("gfx", "") or identity.gfx) == identity.gfx and int(r["cu_num"]) == identity.cu_num:
                done.add((int(r["M"]), int(r["N"]), int(r["K"])))
        except (KeyError, ValueError) as exc:
            raise UsageError(f"{path}: unreadable row {r} ({exc})") from None
    return done


def format_table(outcomes: list[Outcome]) -> str:
    head = (f"{'M':>6} {'N':>6} {'K':>6}  {'winner':<50} {'us':>10} {'TFLOPS':>8} {'ok/cands':>8} {'wall s':>7}")
    lines = [head, "-" * len(head)]
    for o in sorted(outcomes, key=lambda o: o.shape_id):
        ok = sum(r.ok for r in o.results)
        if o.winner is None:
            lines.append(f"{o.M:>6} {o.N:>6} {o.K:>6}  {'FAILED: no valid config':<50} {'-':>10} {'-':>8} "
                         f"{ok:>3}/{len(o.names):<4} {o.wall_s:>7.1f}")
            continue
        us = o.results[o.winner].us
        lines.append(f"{o.M:>6} {o.N:>6} {o.K:>6}  {o.names[o.winner]:<50} {us:>10.3f} "
                     f"{2 * o.M * o.N * o.K / us / 1e6:>8.2f} {ok:>3}/{len(o.names):<4} {o.wall_s:>7.1f}")
    return "\n".join(lines)


# ---- CLI ----------------------------------------------------------------------------------------------------------
def _executor_devices(args: argparse.Namespace) -> list[str | None]:
    """Worker slots as the bf16 tuner picks them: local GPUs for ``--mp``, the cluster's with ``--ray``."""
    pick = getattr(gemm_tuner, "executor_devices", None)  # absent before the bf16 tuner had --ray
    return pick(args) if pick is not None else gemm_tuner.worker_devices(args.mp)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_argument_group("shapes")
    src.add_argument("--nk", type=nk_pair, nargs="+", metavar="N,K", help="weight shapes to tune, e.g. 8192,8192")
    src.add_argument("--model_dir", help="folder with a Hugging Face config.json (or a shipped model config's "
                     "name): tune its fp8 linears (Llama-style or DeepSeek MLA; see the module docstring)")
    src.add_argument("--tp", type=int, default=1, help="tensor-parallel degree for --model_dir (default 1)")
    src.add_argument("--m", type=int_list, default=list(DEFAULT_MS),
                     help="batch sizes M for --nk / --model_dir (default 1,16,32,64,...,8192)")
    src.add_argument("--shapes", help="untuned CSV with M,N,K columns (e.g. AITER's "
                     "a8w8_blockscale_untuned_gemm.csv), tuned as listed")
    src.add_argument("--outdtype", default="bf16", help="output dtype (bf16, fp16, fp32; default bf16)")
    src.add_argument("--print_shapes", action="store_true", help="print the shapes as an untuned CSV and exit")
    out = ap.add_argument_group("output")
    out.add_argument("-o", "--tuned_file", default="a8w8_blockscale_tuned_gemm.csv",
                     help="tuned CSV to merge winners into (created if missing; other rows are kept)")
    out.add_argument("--json_dir", help="folder for the per-(N, K) JSON files (default: the tuned file's folder; "
                     "the runtime reads AITER_GEMM_TRITON_CONFIGS folders, then configs/triton/)")
    out.add_argument("--buckets", choices=("fine", "seed"), default="fine",
                     help="JSON M buckets: one per tuned M (fine) or seed 002's small/medium/large_M")
    out.add_argument("--profile_file", help="CSV receiving every candidate's result")
    out.add_argument("--all", action="store_true", help="retune shapes the tuned file already has (replace them)")
    out.add_argument("--batch", type=int, default=4, help="checkpoint every this many shapes (4)")
    srch = ap.add_argument_group("search")
    srch.add_argument("--quick", action="store_true", help="a short hand-picked config list per M class")
    srch.add_argument("--libtype", type=lambda s: [v.strip() for v in s.split(",") if v.strip()],
                      help="implementations to time: triton (our kernels), torch (F.scaled_mm block-wise, "
                      "cuBLASLt); default triton,torch on a GPU, triton on CPU")
    srch.add_argument("--variants", type=lambda s: [v.strip() for v in s.split(",") if v.strip()],
                      help=f"only these variants (comma list of {', '.join(VARIANTS)})")
    srch.add_argument("--candidates", type=lambda s: [v.strip() for v in s.split(",") if v.strip()],
                      help="time exactly these kernelNames (or names registered by a --plugin) instead")
    srch.add_argument("--errRatio", type=float, default=0.01, help="max fraction of outputs outside isclose(ref, "
                      "rtol=atol=1e-2) for a config to win (default 0.01: a correct config scores 0, fp8 products "
                      "being exact in the float32 reference and bf16 rounding 0.4%%)")
    srch.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    srch.add_argument("--x_scale_layout", choices=X_SCALE_LAYOUTS, default="row_major",
                      help="x_scale's memory layout as the model's quantizer writes it: row_major (default; "
                      "quantize_blockscale's, AITER's) or m_major (strides (1, M), vLLM's column_major_scales: "
                      "torch's block-scaled matmul needs it; our Triton kernel ran up to 29%% slower with it on "
                      "most H100 shapes with M >= 16)")
    run = ap.add_argument_group("execution")
    run.add_argument("--mp", type=int, default=None, help="worker processes, one per GPU (default: every visible "
                     "GPU; 1 on CPU, where kernels run in the Triton interpreter)")
    run.add_argument("--timeout", type=float, default=60.0, help="seconds one candidate may take, JIT compilation "
                     "included, before its worker is killed and it is recorded failed (60)")
    run.add_argument("--plugin", action="append", default=[], help="module imported in every process (registers "
                     "extra launchers); also GRADLIB_PLUGINS=mod1,mod2")
    add_ray = getattr(gemm_tuner, "add_ray_argument", None)  # --ray ADDRESS, as gemm-tuner takes it
    if add_ray is not None:
        add_ray(run)
    run.add_argument("--verbose", "-v", action="store_true", help="log progress")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="[gradlib] %(levelname)s %(message)s")
    plugins = ["gradlib.blockscale_tasks", *args.plugin,
               *[m.strip() for m in os.environ.get("GRADLIB_PLUGINS", "").split(",") if m.strip()]]
    try:
        shapes = load_shapes(args)
        if args.print_shapes:
            sys.stdout.write(render_csv(("M", "N", "K"), [dict(zip("MNK", s)) for s in shapes]))
            return gemm_tuner.EXIT_OK
        if args.batch < 1 or args.timeout <= 0 or not (0 <= args.errRatio <= 1):
            raise UsageError("--batch must be >= 1, --timeout > 0, 0 <= --errRatio <= 1")
        otype = parse_dtype(args.outdtype)
        if otype not in (torch.bfloat16, torch.float16, torch.float32):
            raise UsageError(f"--outdtype must be bf16, fp16 or fp32, got {args.outdtype}")
        bad = sorted(set(args.variants or ()) - set(VARIANTS))
        if bad:
            raise UsageError(f"--variants {bad}: not among {list(VARIANTS)}")
        bad = sorted(set(args.libtype or ()) - {"triton", torch_impl.LIBTYPE})
        if bad:
            raise UsageError(f"--libtype {bad}: not among ['triton', '{torch_impl.LIBTYPE}']")
        devices = _executor_devices(args)
        on_gpu = devices[0] is not None
        if torch_impl.LIBTYPE in (args.libtype or ()) and not on_gpu:
            raise UsageError(f"--libtype torch: {torch_impl.unavailable_reason(torch.device('cpu'))}")
        args.libtype = args.libtype or (["triton", torch_impl.LIBTYPE] if on_gpu else ["triton"])
        env = {} if on_gpu else {"TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1")}
        with scoped_env(env):
            import_plugins(plugins)
        if args.candidates:
            from gradlib.blockscale_tasks import EXTRA_LAUNCHERS

            unknown = [c for c in args.candidates if c not in EXTRA_LAUNCHERS and not is_config_name(c)]
            if unknown:
                raise UsageError(f"--candidates {unknown}: neither kernelNames nor registered launchers")
    except (UsageError, ModelConfigError, ImportError, KeyError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return gemm_tuner.EXIT_USAGE
    timing = FULL if on_gpu else CPU_TIMING
    return tune(args, shapes, otype, timing, gemm_tuner.build_executor(args, devices, plugins, env))


def tune(args: argparse.Namespace, shapes: list[tuple[int, int, int]], otype: torch.dtype, timing: TimingConfig,
         pool: Executor) -> int:
    """Start the executor, skip tuned shapes, run the searches with checkpoints, print the table and summary."""
    from tqdm import tqdm

    t0 = time.monotonic()
    failed = gemm_tuner.start_executor(pool, PROG)
    if failed is not None:
        return failed
    ident = pool.identity
    try:
        done = set() if args.all else tuned_shapes(args.tuned_file, ident)
    except UsageError as exc:
        pool.close()
        print(f"{PROG}: error: tuned file unusable: {exc}", file=sys.stderr)
        return gemm_tuner.EXIT_USAGE
    writer = Writer(args, ident, shapes)
    todo = []
    for s in shapes:
        if s in done:
            writer.skipped(s)
        else:
            todo.append(s)
    searches, outcomes = [], []
    for i, (m, n, k) in enumerate(todo):
        names = candidate_names(m, n, k, args, otype, ident.cu_num if ident.is_gpu else 132)
        if not names:  # nothing can run it: a failed shape without work
            log.warning("M=%d N=%d K=%d: no candidate can run this shape", m, n, k)
            outcomes.append(Outcome(i, m, n, k, [], [], None, 0.0))
            writer.add(outcomes[-1])
            continue
        chunk = max(1, math.ceil(len(names) / pool.slots))
        searches.append(BlockscaleSearch(i, GemmProblem(m, n, k, False, FP8, otype), names, chunk, timing,
                                         args.errRatio, args.seed, (("x_scale_layout", args.x_scale_layout),)))
    log.info("device %s (gfx=%s cu_num=%d), %d worker(s): %d shape(s), %d already tuned, %d candidates in all",
             ident.name, ident.gfx, ident.cu_num, pool.slots, len(shapes), len(shapes) - len(todo),
             sum(len(s.names) for s in searches))
    counts = {"items": 0, "failed": 0}
    with tqdm(total=len(todo), desc="shapes", unit="shape", disable=None) as bar:

        def on_item(search: BlockscaleSearch, res: ItemResult) -> None:
            counts["items"] += 1
            counts["failed"] += not res.ok

        def on_outcome(o: Outcome) -> None:
            outcomes.append(o)
            writer.add(o)
            bar.update(1)
            log.info("M=%d N=%d K=%d: %s in %.1f s", o.M, o.N, o.K,
                     o.names[o.winner] if o.tuned else "no valid config", o.wall_s)

        interrupted, pool_error = gemm_tuner.drive(pool, searches, on_outcome, on_item, writer)
    if outcomes:
        print(format_table(outcomes))
    tuned = sum(o.tuned for o in outcomes)
    failed = len(outcomes) - tuned
    unfinished = len(todo) - len(outcomes)
    print(f"{PROG}: {tuned} tuned, {len(shapes) - len(todo)} skipped (already in {args.tuned_file}), {failed} failed"
          + (f", {unfinished} not finished" if unfinished else "")
          + f"; {counts['items']} candidates run ({counts['failed']} failed), {pool.restarts} worker restart(s); "
          f"{pool.slots} worker(s) on {ident.gfx}/{ident.cu_num}; wall {time.monotonic() - t0:.1f} s; rows in "
          f"{args.tuned_file}; {len(writer.json_written)} JSON file(s) in {writer.json_dir}")
    return gemm_tuner.exit_status(PROG, pool_error, interrupted, failed)


if __name__ == "__main__":
    sys.exit(main())
