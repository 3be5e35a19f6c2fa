"""Where a patched eager decode step spends its extra host time (issue 15): on the GPU machine, for a
Llama-3.1-8B-shaped HF model (random weights) and a tuned file, per batch size:

1. which path each patched linear call takes (the C++ entry, or the Python path of ``TunedLinear.forward``);
2. the host time (launch loop, no sync inside) of 200 calls of each projection, patched module vs original, with
   the decode step's own 3-D input, in alternating rounds;
3. one whole decode step, unpatched vs patched vs unpatched on copies of the linear modules (vs patched through the
   Python path), alternating step by step: host time to the return of the step (no sync) and wall time to the end
   of its GPU work;
4. a cProfile of a few steps in each arm: the functions whose own time differs most.

    python -m op_tests.op_benchmarks.diag_hf_eager_host --tuned <csv> --batch 1,32 --out <dir>
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import json
import os
import pstats
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

import aiter_gemm
import aiter_gemm.nn as agnn
from aiter_gemm.examples.hf_capture import runtime_env
from aiter_gemm.examples.hf_decode import PatchState, StaticSteps, build_model, int_list, resolve_config

_sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a smoke run of the script only
PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj")


def host_us(fn, n: int) -> float:
    """Microseconds per call to issue ``n`` calls (no sync inside: the GPU work queues behind)."""
    _sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    _sync()
    return (t1 - t0) / n * 1e6


def paths(state: PatchState, steps: StaticSteps) -> dict[str, int]:
    """Calls of the C++ entry that returned a tensor vs went on to the Python path, over 3 patched decode steps."""
    counts = {"cpp_hit": 0, "cpp_miss": 0, "python_entry_run": 0}
    c_linear, run_entry = agnn._c_linear, agnn._run_linear_entry

    def counting_c(mod, x):
        out = c_linear(mod, x)
        counts["cpp_hit" if out is not None else "cpp_miss"] += 1
        return out

    def counting_run(*a):
        counts["python_entry_run"] += 1
        return run_entry(*a)

    state.set(True)
    agnn._c_linear, agnn._run_linear_entry = (counting_c if c_linear is not None else None), counting_run
    try:
        for _ in range(3):
            steps.decode()
    finally:
        agnn._c_linear, agnn._run_linear_entry = c_linear, run_entry
    _sync()
    return counts


def per_module(model, state: PatchState, batch: int, rounds: int) -> list[dict]:
    state.set(True)
    names = [f"model.layers.0.{p}" for p in PROJ] + ["lm_head"]
    patched = {n: model.get_submodule(n) for n in names}
    state.set(False)
    rows = []
    for n in names:
        orig = model.get_submodule(n)
        x = torch.randn(batch, 1, orig.in_features, device=DEVICE, dtype=orig.weight.dtype)
        new = patched[n]
        with torch.no_grad():
            for _ in range(20):
                new(x), orig(x)
            o, p = [], []
            for r in range(rounds):
                for which in ((orig, new) if r % 2 == 0 else (new, orig)):
                    (o if which is orig else p).append(host_us(lambda m=which, x=x: m(x), 200))
        rows.append({"module": n, "N": orig.out_features, "K": orig.in_features, "orig_us": statistics.median(o),
                     "patched_us": statistics.median(p),
                     "added_us": statistics.median([b - a for a, b in zip(o, p)])})
    return rows


class PlainSubclass(torch.nn.Linear):
    """A subclass of nn.Linear that changes nothing: what a module type other than nn.Linear costs by itself."""


def linear_copies(state: PatchState) -> dict[str, list]:
    """Per patched slot, three more unpatched modules sharing the original's parameters: one made as
    ``TunedLinear.from_linear`` makes its module (``__new__`` and a copy of the instance dict), the same of a
    subclass that changes nothing, one by ``nn.Linear.__init__`` (on the meta device, parameters then assigned).
    They separate what a module object made like ours costs from what our forward costs."""
    state.set(True)
    state.set(False)
    made_new, made_init, made_sub = [], [], []
    for _, _, _, orig in state._slots:
        state_dict = {k: type(v)(v) if isinstance(v, (dict, set)) else v for k, v in orig.__dict__.items()}
        c = torch.nn.Linear.__new__(torch.nn.Linear)
        c.__dict__.update(state_dict)
        made_new.append(c)
        c = PlainSubclass.__new__(PlainSubclass)
        c.__dict__.update(state_dict)
        made_sub.append(c)
        d = torch.nn.Linear(orig.in_features, orig.out_features, bias=orig.bias is not None, device="meta")
        d.weight, d.bias = orig.weight, orig.bias
        made_init.append(d)
    return {"copy_new": made_new, "copy_init": made_init, "copy_subclass": made_sub}


def whole_step(state: PatchState, steps: StaticSteps, rounds: int, python_path: bool) -> dict:
    """Decode steps of several arms, one step each per round, the arms in every order in turn
    (itertools.permutations: each arm equally often in each position): unpatched, patched (C++ entry), unpatched
    with the modules replaced by copies (see :func:`linear_copies`), and with ``python_path`` patched with the C++
    entry off (``TunedLinear``'s Python path)."""
    c_linear = agnn._c_linear
    copies = linear_copies(state)

    def use(arm: str) -> None:
        state.set(arm.startswith("with"))
        agnn._c_linear = None if arm == "with_python_path" else c_linear
        if arm.startswith("copy"):
            for (modules, attr, _, _), c in zip(state._slots, copies[arm]):
                modules[attr] = c
        elif arm == "without":
            for modules, attr, _, orig in state._slots:
                modules[attr] = orig

    arms = ["without", "with", "copy_new", "copy_init", "copy_subclass"] + (["with_python_path"] if python_path else [])
    orders = list(itertools.permutations(arms))
    res: dict[str, dict[str, list[float]]] = {a: {"host": [], "wall": []} for a in arms}
    try:
        for r in range(rounds):
            for arm in orders[r % len(orders)]:
                use(arm)
                _sync()
                t0 = time.perf_counter()
                steps.decode()
                t1 = time.perf_counter()
                _sync()
                t2 = time.perf_counter()
                res[arm]["host"].append((t1 - t0) * 1e3)
                res[arm]["wall"].append((t2 - t0) * 1e3)
    finally:
        use("without")
        agnn._c_linear = c_linear
    out = {}
    for kind in ("host", "wall"):
        wo = res["without"][kind]
        out[kind] = {"ms_without": statistics.median(wo), "min_without": min(wo)}
        for arm in arms[1:]:
            wi = res[arm][kind]
            out[kind].update({f"ms_{arm}": statistics.median(wi), f"min_{arm}": min(wi),
                              f"speedup_{arm}": statistics.median([a / b for a, b in zip(wo, wi)])})
    return out


def profile(state: PatchState, steps: StaticSteps, n: int, top: int) -> dict[str, str]:
    out = {}
    for arm in ("without", "with"):
        state.set(arm == "with")
        steps.decode()
        _sync()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            steps.decode()
        _sync()
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
        out[arm] = buf.getvalue()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="llama3_8b")
    ap.add_argument("--tuned", default=None)
    ap.add_argument("--batch", type=int_list, default=[1, 32])
    ap.add_argument("--rounds", type=int, default=200, help="whole-step rounds per arm")
    ap.add_argument("--module-rounds", type=int, default=15, help="rounds of the per-module timing (0: skip it)")
    ap.add_argument("--python-path", action="store_true", help="also an arm patched with the C++ entry off")
    ap.add_argument("--profile-steps", type=int, default=5, help="cProfiled steps per arm (0: none)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = build_model(resolve_config(args.config), None, torch.bfloat16, DEVICE, "sdpa")
    state = PatchState(model, None, None)
    env: dict[str, str | None] = {"AITER_TUNE_GEMM": None}
    if args.tuned:
        from aiter_gemm.settings import default_config_dir

        env["AITER_CONFIG_GEMM_BF16"] = f"{args.tuned}:{default_config_dir() / 'bf16_tuned_gemm.csv'}"
    threads = [f"{t.name} (daemon={t.daemon})" for t in threading.enumerate()]
    report: dict = {"eager_ext": aiter_gemm.ops.EAGER_EXT is not None, "threads": threads,
                    "switch_interval_s": sys.getswitchinterval(), "batches": {}}
    print(f"Python threads: {threads}; switch interval {sys.getswitchinterval()} s", flush=True)
    with runtime_env(env), torch.no_grad():
        for b in args.batch:
            steps = StaticSteps(model, b, 128, DEVICE)
            for arm in (True, False, True):
                state.set(arm)
                for _ in range(3):
                    steps.decode()
            rep = report["batches"][b] = {"paths": paths(state, steps)}
            print(f"batch {b}: paths of patched linear calls over 3 steps: {rep['paths']}", flush=True)
            rep["modules"] = per_module(model, state, b, args.module_rounds) if args.module_rounds else []
            for r in rep["modules"]:
                print(f"batch {b}: {r['module']:<26} N {r['N']:>6} K {r['K']:>5}  nn.Linear {r['orig_us']:6.2f} us"
                      f"  TunedLinear {r['patched_us']:6.2f} us  added {r['added_us']:+6.2f} us", flush=True)
            rep["step"] = whole_step(state, steps, args.rounds, args.python_path)
            for kind, v in rep["step"].items():
                arms = [k[len("speedup_"):] for k in v if k.startswith("speedup_")]
                print(f"batch {b}: whole decode step {kind:<4} without {v['ms_without']:7.3f} ms (min "
                      f"{v['min_without']:.3f}); " + "; ".join(
                          f"{a} {v['ms_' + a]:7.3f} ms (min {v['min_' + a]:.3f}) without/{a} {v['speedup_' + a]:.4f}"
                          for a in arms), flush=True)
            prof = profile(state, steps, args.profile_steps, 25) if args.profile_steps else {}
            for arm, text in prof.items():
                (out / f"cprofile_b{b}_{arm}.txt").write_text(text)
            state.set(False)
            del steps
    (out / "diag.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {out}/diag.json, cprofile_*.txt")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
