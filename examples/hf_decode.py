"""A Hugging Face causal LM end to end on the tuned dispatch: capture the GEMM shapes it runs, check them against the
shapes ``gradlib.models`` derives, (tune them,) and time prefill and per-token decode with and without the patch.

    python -m examples.hf_decode --config llama3_8b --mode capture --out hf_out  # 1. capture + check
    gemm-tuner -i hf_out/captured_gemm.csv -o hf_out/tuned_gemm.csv              # 2. tune
    python -m examples.hf_decode --config llama3_8b --mode measure --out hf_out \\
        --tuned hf_out/tuned_gemm.csv                                            # 3. measure

The model is built from a ``config.json`` (a shipped name such as ``llama3_8b``, or a folder holding one) with random
weights, directly on the device: nothing is downloaded. ``--mode all`` runs capture, then (with ``--tune``) the
tuner, then the measurement.

Method. The model is patched with :func:`aiter_gemm.nn.patch_linear` ("with") or not ("without"); both run the same
weights. A decode step is one forward of ``batch x 1`` new token against a static KV cache filled by a prefill of
``--prompt-len`` tokens; its inputs, position and cache are static and every step first resets the cache's write
position, so one step can be repeated or captured once in a ``torch.cuda.CUDAGraph`` and replayed any number of
times. Per configuration (batch, eager/graph, prefill/decode) each arm is timed ``--rounds`` times, the arms
alternating (without, with, then with, without, ...: ``aiter_gemm.timing.interleaved``) so clock drift biases neither;
one timing is ``--decode-steps`` steps (``--prefill-steps`` prefills) between two CUDA events. Eager steps are
host-bound and the hosts here run in slow phases (a CPU-only run of a tiny model: 18 ms steps, then a second of 26-40
ms ones; H100 host: one eager decode step 26-150 ms within a run), so an eager timing is one step (``--eager-steps``)
after the switch to its arm and ``--eager-warm`` untimed steps of it (default 1: a step right after another arm's
can run slower, the host's caches holding the other arm's code; in three H100 runs of the FP8 loop without it, the
tuned arm read lower in the rounds where it followed the bf16 arm than where it followed torch_blockwise on 20 of 21
eager rows, by 0.2% (median) to 3.1%), and the arms alternate
step by step, ``--eager-rounds`` times, Python's garbage collector paused: the steps of a round are tens of
milliseconds apart, inside the same phase. The speedup is the median of the per-round ratios (adjacent timings of the
two arms); the report also gives medians and min/max over rounds, and the ratio of the medians, which pairs timings
of different rounds and, within the rounds' spread, can even disagree with the speedup in direction. ``--control``
adds a second unpatched arm to the same rounds: its ratio to "without" is what the method reads for identical work
(A/A). ``generate()`` is used for capture only (its wall time varies ~10%).

MoE models (``--config qwen3_30b_a3b``): "with" also runs the experts on ``fused_moe``
(:func:`aiter_gemm.nn.patch_moe`, ``--tuned-fmoe`` in front of AITER_CONFIG_FMOE), "without" on transformers' own
experts implementation (``grouped_mm`` by default); capture writes their shapes to AITER's ``untuned_fmoe.csv`` in
``--out`` as well (tune: ``python -m gradlib.tune_moe -i untuned_fmoe.csv``). An FP8 MoE config
(``qwen3_30b_a3b_fp8``) runs :mod:`examples.hf_fp8`'s arms with its experts as transformers' FP8 experts.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is built from a local config.json: never reach the hub

import torch  # noqa: E402

import aiter_gemm  # noqa: E402
from aiter_gemm.cliargs import (  # noqa: E402
    device_arg,
    non_negative_int,
    positive_int,
    positive_int_list,
)
from aiter_gemm.fileio import atomic_write_text, file_problem, render_csv, write_error  # noqa: E402
from aiter_gemm.timing import interleaved, ms_per_call  # noqa: E402
from benchmarks.hf_summary import CONTROL, markdown, summarize  # noqa: E402
from examples.hf_capture import (  # noqa: E402
    CAPTURE_FILE,
    DTYPES,
    FP8_KEY,
    FP8_TUNED_FILE,
    TUNED_FILE,
    hf_expected,
    run_capture,
    run_tuner,
    runtime_env,
)
from examples.hf_fp8 import TORCH_EXPERTS, ArmState, fp8_settings, quantize_model  # noqa: E402
from examples.hf_model import (  # noqa: E402  (also the names scripts import from here)
    PatchState,
    StaticSteps,
    build_model,
    capture_graph,
    resolve_config,
)
from examples.hf_profile import profile_decode  # noqa: E402

# ---------------------------------------------------------------------------------------------------------------
# measurement


def run_measure(args: argparse.Namespace, model: torch.nn.Module, state: PatchState, arch: Any, out: Path,
                model_name: str) -> dict[str, Any]:
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    modes = [m for m in args.exec if cuda or m == "eager"]
    if not cuda and "graph" in args.exec:
        print("measure: no CUDA device: CUDA-graph measurements skipped (eager only)")
    env: dict[str, str | None] = {"AITER_TUNE_GEMM": None}
    var = state.table_var
    if args.tuned:  # in front of the configured table (rows merge: on a duplicate key the lowest us wins)
        from aiter_gemm.settings import SHIPPED

        env[var] = f"{args.tuned}:{os.environ.get(var) or SHIPPED}"
    if args.tuned_fmoe:  # an MoE model's experts table, the same way
        from aiter_gemm.settings import SHIPPED

        env["AITER_CONFIG_FMOE"] = f"{args.tuned_fmoe}:{os.environ.get('AITER_CONFIG_FMOE') or SHIPPED}"
    base, main = state.arms[:2]
    arms = state.arms + (CONTROL,) if args.control else state.arms
    rounds: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    profiles: list[dict[str, Any]] = []
    with runtime_env(env), torch.no_grad():
        print(f"measure: {var}={os.environ.get(var) or '(shipped default)'}")
        if args.tuned_fmoe:
            print(f"measure: AITER_CONFIG_FMOE={os.environ['AITER_CONFIG_FMOE']}")
        for b in args.batch:
            steps = StaticSteps(model, b, args.prompt_len, device)
            for phase in args.phases:
                step = steps.prefill if phase == "prefill" else steps.decode
                # Same inputs and cache for both arms: their outputs must agree (rounding of the kernels aside).
                outs = {}
                for arm in state.arms:
                    state.set_arm(arm)
                    outs[arm] = step().float()
                checks += [agreement(b, phase, outs, base, arm) for arm in state.arms[1:]]
                for mode in modes:
                    if mode == "graph":
                        n = args.prefill_steps if phase == "prefill" else args.decode_steps
                        n_rounds = args.rounds
                    else:
                        n = 1 if phase == "prefill" else args.eager_steps
                        n_rounds = args.eager_rounds
                    fns = {}
                    graphs = []
                    for arm in arms:
                        state.set_arm(arm)
                        if mode == "graph":
                            g, _ = capture_graph(step)
                            graphs.append(g)
                            fns[arm] = _graph_timer(g, n)
                        else:
                            for _ in range(2):  # warm-up: decisions, compilation
                                step()
                            fns[arm] = _eager_timer(state, arm, step, n, cuda, args.eager_warm)
                    state.set_arm(base)
                    t0 = time.perf_counter()
                    gc.collect()
                    gc.disable()  # a collection inside one arm's timing is noise (eager steps allocate a lot)
                    try:
                        res = interleaved(fns, n_rounds)
                    finally:
                        gc.enable()
                    for arm, values in res.items():
                        for r, ms in enumerate(values):
                            first = arms[0] if r % 2 == 0 else arms[-1]
                            rounds.append({"model": model_name, "batch": b, "mode": mode, "phase": phase, "arm": arm,
                                           "round": r, "measured_first": arm == first, "steps": n, "ms": ms})
                    ratio = statistics.median(a / c for a, c in zip(res[base], res[main]))
                    print(f"measure: batch {b:>3} {mode:<5} {phase:<7} median ms {base} "
                          f"{statistics.median(res[base]):9.3f}, {main} {statistics.median(res[main]):9.3f}; "
                          f"speedup (median per-round ratio) {ratio:.3f}  ({time.perf_counter() - t0:.1f} s)",
                          flush=True)
                    if args.profile and cuda and phase == "decode":
                        profiles += profile_decode(state, step, graphs[:2], b, mode, out)
                    del fns, graphs  # the graphs' memory pools go before the next capture
            del steps
            if cuda:
                torch.cuda.empty_cache()
        decisions = dispatch_decisions(arch, state, args, model.dtype)
    summary = summarize(rounds, args.prompt_len, base, main)
    fp8_experts = bool(getattr(state, "experts_implementations", None))
    return {"rounds": rounds, "summary": summary, "agreement": checks, "profile": profiles, "decisions": decisions,
            "notes": notes(summary, decisions, args, state.names, fp8_experts)}


def notes(summary: list[dict[str, Any]], decisions: list[dict[str, Any]], args: argparse.Namespace,
          patched: list[str], fp8_experts: bool = False) -> list[str]:
    """What the numbers are known to contain besides GEMM tuning (each seen on the H100, see the README)."""
    out = []
    if fp8_experts and any(r["mode"] == "graph" for r in summary):
        out.append(f"graph rows: the torch_blockwise arm's experts ({TORCH_EXPERTS}, a per-expert loop that reads the "
                   "routing on the host) run every expert over every token in a CUDA graph (num_experts / top_k times "
                   "the work, correct but never fast): read graph rows against the bf16 arm (grouped_mm)")
    decode_ms = set(args.batch)
    triton_decode = [d for d in decisions if d["M"] in decode_ms and d["libtype"] in ("skinny", "triton")]
    if triton_decode and any(r["mode"] == "eager" and r["phase"] == "decode" for r in summary):
        out.append(f"eager decode is host-bound; {len(triton_decode)} decode shape(s) dispatch to Triton kernels "
                   "(skinny/triton), whose Python launcher costs more host time per call than cuBLAS: for eager "
                   "serving tune with --libtype cublaslt,torch (--tune-args); compare graph rows for kernel time")
    if any(n.rsplit(".", 1)[-1] == "lm_head" for n in patched) and any(b > 1 for b in args.batch):
        out.append("prefill, batch > 1: unpatched, HF computes the last position's logits with F.linear on "
                   "hidden_states[:, -1:, :], a strided 3-D view torch.matmul cannot fold into one GEMM, so it runs a "
                   "batched GEMM that reads the lm_head weight once per sequence; gemm_a16w16 flattens it into one "
                   "GEMM. That, not tuning, is most of the prefill gain: --exclude lm_head measures without it")
    return out


def _eager_timer(state: PatchState, arm: str, step: Callable[[], object], n: int, cuda: bool,
                 warm: int = 1) -> Callable[[], float]:
    def measure() -> float:
        state.set_arm(arm)
        for _ in range(warm):  # untimed: the host's caches then hold this arm's code, not the previous arm's
            step()
        return ms_per_call(step, n, cuda)

    return measure


def _graph_timer(graph: torch.cuda.CUDAGraph, n: int) -> Callable[[], float]:
    return lambda: ms_per_call(graph.replay, n, True)


def agreement(batch: int, phase: str, outs: dict[str, torch.Tensor], base: str, arm: str) -> dict[str, Any]:
    ref, got = outs[base], outs[arm]
    err = (got - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
    return {"batch": batch, "phase": phase, "arm": arm, "vs": base, "max_abs_diff_over_max_abs": err,
            "argmax_agree": float((got.argmax(-1) == ref.argmax(-1)).float().mean().item())}


def dispatch_decisions(arch: Any, state: PatchState, args: argparse.Namespace,
                       dtype: torch.dtype) -> list[dict[str, Any]]:
    """What ``gemm_a16w16`` (``gemm_a8w8_blockscale`` for FP8 modules) chose for each shape the patched model ran
    (tuned row or default), on this device."""
    suffixes = {n.rsplit(".", 1)[-1] for n in state.names}
    nsets = {b * args.prompt_len for b in args.batch} | set(args.batch)
    out = []
    for m, n, k, bias, kind in sorted(hf_expected(arch, suffixes, nsets, set(args.batch), dtype, state.fp8_suffixes)):
        cfg = (aiter_gemm.get_GEMM_A8W8_BLOCKSCALE_config(m, n, k, dtype=dtype) if kind == FP8_KEY
               else aiter_gemm.get_GEMM_A16W16_config(m, n, k, bias, dtype))
        out.append({"M": m, "N": n, "K": k, "bias": bias, **{c: cfg.get(c) for c in
                    ("matched", "libtype", "solidx", "kernelName", "us", "source", "eager_libtype")}})
    return out


# ---------------------------------------------------------------------------------------------------------------
# main


def device_or_auto(text: str) -> str | torch.device:
    """``auto`` (cuda when available, else cpu) or a device this process has (:func:`aiter_gemm.cliargs.device_arg`)."""
    return text if text == "auto" else device_arg(text)  # "auto" stays a str


def choice_list(*choices: str) -> Callable[[str], list[str]]:
    """An argparse type: a comma list of ``choices`` (each once, in the order given)."""
    def parse(text: str) -> list[str]:
        vals = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in vals if v not in choices]
        if not vals or bad:
            raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(choices)}, got {text!r}")
        return list(dict.fromkeys(vals))
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The command line; its help is the module docstring's first paragraph and its three-step example."""
    summary, example = __doc__.split("\n\n")[:2]
    ap = argparse.ArgumentParser(prog="python -m examples.hf_decode",
                                 description=" ".join(summary.replace("``", "").split()),
                                 epilog="example (capture, tune, measure):\n" + example,
                                 formatter_class=_HelpFormatter)
    ap.add_argument("--config", default="llama3_8b", help="shipped model name (configs/model_configs/<name>), a "
                    "folder with a config.json, or the config.json itself (default llama3_8b)")
    ap.add_argument("--layers", type=positive_int, default=None,
                    help="cut num_hidden_layers to this (default: the config's)")
    ap.add_argument("--batch", type=positive_int_list, default=[1, 8, 32, 64], help="batch sizes (default 1,8,32,64)")
    ap.add_argument("--prompt-len", type=positive_int, default=128, help="prompt tokens per sequence (default 128)")
    ap.add_argument("--new-tokens", type=positive_int, default=4,
                    help="tokens generate() makes per sequence in capture (default 4)")
    ap.add_argument("--decode-steps", type=positive_int, default=32,
                    help="decode steps (graph replays) per timed round (default 32)")
    ap.add_argument("--prefill-steps", type=positive_int, default=2,
                    help="prefill forwards per timed round (default 2)")
    ap.add_argument("--eager-rounds", type=positive_int, default=100,
                    help="timed rounds per arm in eager mode, arms alternating (default 100)")
    ap.add_argument("--eager-steps", type=positive_int, default=1,
                    help="decode steps per eager round (default 1; an eager prefill round is one prefill)")
    ap.add_argument("--eager-warm", type=non_negative_int, default=1,
                    help="untimed steps of an arm before each of its eager timings (default 1)")
    ap.add_argument("--control", action="store_true", help="time a second unpatched arm ('control') in the same "
                    "rounds: without / control is the A/A ratio, the method's own noise")
    ap.add_argument("--rounds", type=positive_int, default=6,
                    help="timed rounds per arm, arms alternating in order (default 6)")
    ap.add_argument("--mode", choices=("capture", "measure", "all"), default="all",
                    help="capture the GEMM shapes, measure, or both (default all)")
    ap.add_argument("--exec", type=choice_list("eager", "graph"), default=["eager", "graph"],
                    help="execution modes to measure (default eager,graph; graph needs CUDA)")
    ap.add_argument("--phases", type=choice_list("prefill", "decode"), default=["prefill", "decode"],
                    help="phases to measure, comma list of prefill,decode (default both)")
    ap.add_argument("--out", default="hf_decode_out", help="output folder (default hf_decode_out)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="model dtype (default bf16)")
    ap.add_argument("--device", type=device_or_auto, default="auto",
                    help="cuda, cpu or auto (default: cuda when available)")
    ap.add_argument("--attn", default="sdpa", help="attn_implementation of the model (default sdpa)")
    ap.add_argument("--include", nargs="*", default=None, help="patch only modules matching these globs")
    ap.add_argument("--exclude", nargs="*", default=None, help="do not patch modules matching these globs "
                    "(e.g. lm_head)")
    ap.add_argument("--capture-file", default=None, help=f"captured shapes (default <out>/{CAPTURE_FILE})")
    ap.add_argument("--capture-misses-only", action="store_true", help="keep the configured tuned tables during "
                    "capture, so only shapes they miss are captured (default: capture every shape the model runs)")
    ap.add_argument("--tune", action="store_true", help=f"run gemm-tuner on the captured file into "
                    f"<out>/{TUNED_FILE} and measure with it (mode all). Slow with every backend: on a fresh H100 "
                    "it tuned 16 of llama3_8b's 36 shapes in 8 min (Triton compiles); --tune-args "
                    "'--libtype cublaslt,torch,skinny' tuned 20 in 30 s")
    ap.add_argument("--tune-args", default="",
                    help="extra tuner arguments, e.g. '--libtype cublaslt,torch,skinny' (an FP8 model's config runs "
                    "python -m gradlib.tune_a8w8_blockscale on the block-scale shapes: e.g. '--quick --libtype "
                    "triton,torch'; default: none)")
    ap.add_argument("--tuned", default=None, help="tuned CSV(s) (colon list) put in front of AITER_CONFIG_GEMM_BF16 "
                    "(an FP8 model's: AITER_CONFIG_GEMM_A8W8_BLOCKSCALE; default: the shipped table) for the "
                    "measurement")
    ap.add_argument("--tuned-fmoe", "--tuned_fmoe", dest="tuned_fmoe", default=None,
                    help="an MoE model's tuned fmoe CSV(s) (colon list) put in front of AITER_CONFIG_FMOE for the "
                    "measurement (default: the shipped table)")
    ap.add_argument("--profile", action="store_true", help="profile decode steps (torch.profiler): GEMM share of GPU "
                    "time and launch gaps, traces in <out>")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and inputs (default 0)")
    return ap


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The epilog's command lines kept as written; the description wrapped to the terminal."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("example"):
            return super()._fill_text(text, width, indent)
        return argparse.HelpFormatter._fill_text(self, text, width, indent)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The arguments, checked before anything runs (usage and one line, exit 2): ``--config`` names a model,
    ``--out`` is a folder that can be written, every ``--tuned`` file exists."""
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        args.config_dir = resolve_config(args.config)
    except ValueError as exc:
        ap.error(str(exc))
    why = write_error(args.out, folder=True)
    if why is not None:
        ap.error(f"--out {args.out}: {why}")
    for flag, value in (("--tuned", args.tuned), ("--tuned-fmoe", args.tuned_fmoe)):
        for path in (value or "").split(":"):
            why = file_problem(path) if path and path != "@shipped" else None
            if why is not None:
                ap.error(f"{flag} {path}: {why}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        import transformers
    except ImportError:
        print("hf_decode needs transformers: pip install 'aiter_gemm[hf]' (or pip install transformers)")
        return 2
    from gradlib.models import ModelArch

    device = (torch.device("cuda" if torch.cuda.is_available() else "cpu") if isinstance(args.device, str)
              else args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config_dir = args.config_dir
    arch = ModelArch.from_config(json.loads((config_dir / "config.json").read_text()), str(config_dir))
    model_name = config_dir.name + (f"[{args.layers}L]" if args.layers else "")
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    model = build_model(config_dir, args.layers, DTYPES[args.dtype], device, args.attn)
    qcfg = fp8_settings(model.config)
    swapped = quantize_model(model, qcfg) if qcfg is not None else []  # random weights to FP8Linear / FP8Experts
    n_params = sum(p.numel() for p in model.parameters())
    n_linear = sum(isinstance(fp8, torch.nn.Linear) for _, fp8, _ in swapped)
    experts = f" and {len(swapped) - n_linear} experts modules" if len(swapped) > n_linear else ""
    print(f"model {model_name}: {type(model).__name__}, {n_params / 1e9:.2f} B parameters, {args.dtype} on {device}"
          + (f", {n_linear} linears{experts} FP8 (128x128 blocks; arms {', '.join(ArmState.arms)})" if swapped
             else "")
          + f", built in {time.perf_counter() - t0:.1f} s (transformers {transformers.__version__}, torch "
          f"{torch.__version__})", flush=True)
    state = ArmState(model, swapped, args.include, args.exclude) if swapped else \
        PatchState(model, args.include, args.exclude)
    meta = {"model": model_name, "config": str(config_dir), "args": vars(args), "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "transformers": transformers.__version__, "aiter_gemm": aiter_gemm.__version__,
            "python": platform.python_version(), "parameters": n_params,
            "experts_implementation": getattr(state, "experts_implementations", None)  # per arm (FP8 MoE) or
            or getattr(model.config, "_experts_implementation", None)}  # the unpatched arm's
    report: dict[str, Any] = {"meta": meta}
    rc = 0
    if args.mode in ("capture", "all"):
        report["capture"] = cap = run_capture(args, model, state, arch, out)
        moe = cap.get("moe", {"captured_vs_ran": {"match": True}, "captured_vs_gradlib_moe": {"match": True}})
        if not (cap["captured_vs_ran"]["match"] and cap["captured_vs_hf_layout"]["match"]
                and moe["captured_vs_ran"]["match"] and moe["captured_vs_gradlib_moe"]["match"]):
            print("capture: the captured shapes differ from what the model ran (see above)")
            rc = 1
        if args.tune and args.mode == "all":
            tuned = out / (FP8_TUNED_FILE if swapped else TUNED_FILE)
            report["tune_exit_status"] = run_tuner(args, Path(cap["file"]), tuned, fp8=bool(swapped))
            if args.tuned is None and tuned.exists():
                args.tuned = str(tuned)
    if args.mode in ("measure", "all"):
        t1 = time.perf_counter()
        res = run_measure(args, model, state, arch, out, model_name)
        report.update(res)
        meta["measure_s"] = time.perf_counter() - t1
        if device.type == "cuda":
            meta["max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
        # every output file written whole (temp + rename): a run killed mid-write leaves the earlier file, not half
        atomic_write_text(out / "rounds.csv", render_csv(list(res["rounds"][0]), res["rounds"]))
        table = markdown(res["summary"])
        atomic_write_text(out / "results.md", table + "\n")
        counts: dict[str, int] = {}
        for d in res["decisions"]:
            key = f"{d['matched']}:{d['libtype']}"
            counts[key] = counts.get(key, 0) + 1
        print(f"\ngemm decisions for the {len(res['decisions'])} shapes run (matched:libtype): "
              + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))
        worst = max((c["max_abs_diff_over_max_abs"] for c in res["agreement"]), default=0.0)
        print(f"logits with vs without: max |diff| / max |logits| = {worst:.2e}")
        print("\n" + table)
        for note in res["notes"]:
            print(f"\nnote: {note}")
    meta["total_s"] = time.perf_counter() - t0
    written = [f"{CAPTURE_FILE}, capture_check.json"] if "capture" in report else []
    if "summary" in report:  # a capture-only run leaves an earlier measurement's results alone
        atomic_write_text(out / "results.json", json.dumps(report, indent=1, default=str))
        written.append("results.json, rounds.csv, results.md" + (", trace_*.json" if report["profile"] else ""))
    print(f"\nwrote {', '.join(written)} in {out}/ ({meta['total_s']:.0f} s)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
