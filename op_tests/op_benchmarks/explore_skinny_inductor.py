"""Skinny GEMM against ``torch.compile(mode="max-autotune-no-cudagraphs")`` at M <= 16 (issue 14, part 1).

At M = 1 Inductor turns ``F.linear`` into a reduction kernel (``triton_red_fused_mm_t_0``: an ``[XBLOCK, R0_BLOCK]``
float32 accumulator over K, B loaded ``evict_first``, A ``evict_last``; XBLOCK, R0_BLOCK and warps picked by its
coordinate descent; ``inspect_inductor_decode.py`` printed it). Our ``fma`` variant is the same loop with a
``[BM, BN, BK]`` accumulator, so the question is which tiles and load hints it is missing. Per shape this script

1. compiles ``F.linear`` with max-autotune and reads the config Inductor settled on (its ``.best_config`` files);
2. screens a grid of skinny configs (``--pdl``: then the best gemv ones again with programmatic dependent launch;
   the tuner's ``gemv`` space at M == 1; ``fma`` / ``fma_2pass``: BN 1-16, BK
   512-4096, 4-16 warps, with and without ``evict_first``; plus Inductor's own tile as a ``gemv`` config) with the
   tuner's CUDA-graph timing over rotating buffers > 2x L2, each checked against float32 first;
3. times F.linear, max-autotune, the current dispatch (``gemm_a16w16``) and the 3 best screened configs in paired
   rounds (``gradlib.timing.time_paired``: CUDA-graph replays, order alternating, a fresh capture per block).

At M > 16 (batched decode, issue 14 part 2) the candidates are the Triton GEMM's classic tiles
(:class:`~aiter_gemm.kernels.gemm_a16w16.GemmConfig`, BLOCK_M 32-128, split-K 1-4): screened unspecialised (one binary
per tile, shared by every shape), then the best ``--sp_top`` compiled for the shape (``_SP``) and screened again; the
paired round holds the best of both. max-autotune is compiled only where M <= ``--compile_max_m``.

    python -m op_tests.op_benchmarks.explore_skinny_inductor --out results/skinny_inductor_h100 [--shapes 1x4096x4096]
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="1x4096x4096,1x6144x4096,1x28672x4096,1x4096x14336,1x1280x8192,1x8192x1024,"
                    "1x7168x8192,1x8192x3584", help="MxNxK list (default: the shipped M=1 shapes)")
    ap.add_argument("--pairs", type=int, default=21, help="paired rounds of the final comparison (default 21)")
    ap.add_argument("--top", type=int, default=3, help="screened configs that go to the final comparison")
    ap.add_argument("--deadline_s", type=float, default=520.0, help="stop starting new shapes after this")
    ap.add_argument("--compile_max_m", type=int, default=16, help="time max-autotune only where M <= this")
    ap.add_argument("--sp_top", type=int, default=4, help="M > 16: screened tiles compiled again for the shape; "
                    "M == 1 with --pdl: gemv tiles launched again with PDL")
    ap.add_argument("--only_gemv", action="store_true", help="M <= 16: screen the gemv tiles only (up to M = 8)")
    ap.add_argument("--pdl", action="store_true", help="M == 1: also the best gemv tiles with _PDL and _PDLW")
    return ap.parse_args(argv)


# Before torch: a cache of this run's own, so the .best_config files it holds are this run's choices.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor_"))  # its own: best_config files

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

from aiter_gemm import current_device_identity, gemm_a16w16, get_GEMM_A16W16_config  # noqa: E402
from aiter_gemm.backends import get_backend  # noqa: E402
from aiter_gemm.backends import skinny as skinny_backend  # noqa: E402
from aiter_gemm.backends import triton as triton_backend  # noqa: E402
from aiter_gemm.device import DeviceIdentity  # noqa: E402
from aiter_gemm.kernels.gemm_a16w16 import GemmConfig  # noqa: E402
from aiter_gemm.kernels.skinny import MAX_M, SkinnyConfig, block_m  # noqa: E402
from gradlib.timing import SCREEN, TimingConfig, cache_bytes, rotating_sets, time_paired, time_runner  # noqa: E402

PAIRED = TimingConfig(warmup=5, reps=9, target_us=500.0, budget_s=0.4)
TOL = 2e-2  # bf16 output vs a float32 reference, relative to the largest |value|


Config = SkinnyConfig | GemmConfig


def runner(cfg: Config) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``(a, w) -> a @ w.T`` in bf16 through the backend's own runner for ``cfg`` (skinny, or the Triton GEMM)."""
    run = get_backend("skinny" if isinstance(cfg, SkinnyConfig) else "triton").runner(cfg, _identity())
    return lambda a, w: run(a, w, None, torch.bfloat16)


@functools.cache
def _identity() -> DeviceIdentity:
    return current_device_identity(on_gpu=True)


def gemm_grid(m: int, n: int, k: int, arch: str, sms: int) -> list[GemmConfig]:
    """M > 16: the tuner's space of the Triton GEMM (:func:`aiter_gemm.backends.triton.config_space`: tiles around M,
    split-K where the tiles underfill the GPU), its classic-kernel configs, unspecialised: the top ones are compiled
    for the shape afterwards. (Runs up to commit 3441b4d screened a hand-made subset of it instead: BLOCK_M one or
    two powers of two up to 128, BN 32-128, BK 64/128, 3-5 stages, split-K 2/4 on a few tiles.)"""
    return [c for c in triton_backend.config_space(m, n, k, arch, sms) if not c.TMA_PERSISTENT]


def grid(m: int, n: int, k: int, arch: str, sms: int, only_gemv: bool = False) -> list[Config]:
    """M >= 2: the tuner's gemv tiles up to M = 8 (``gemv_space``), whole-K ``dot`` tiles, shape-specialised
    (``dot_sp_space``) and not (the one-pass dot configs of the skinny ``config_space``), pruned by the backend's
    ``config_error``; ``only_gemv``: the gemv tiles alone. (Runs up to commit 3441b4d
    screened a subset: ``_SP`` BN 32-128 x BK 64/128 x 3-5 stages x 2-8 warps, and 8 unspecialised tiles.) M == 1:
    the gemv variants' tuner space (``gemv_space``), and fma (whole K) / fma_2pass (split-K while N / BN gives fewer
    than 2 programs per SM) tiles, with and without evict_first, float32 accumulators per thread 4..64
    (BM * BN * BK / (32 * warps))."""
    space = skinny_backend.config_space(m, n, k, arch, sms)  # gemv tiles first, then the _SP and plain dot ones
    out = [c for c in space if c.variant.gemv or (m > 1 and c.solidx == 3 and not only_gemv)]
    if m > 1 or only_gemv:
        return out
    bm = block_m(m, False)
    for ef in (False, True):
        for bn in (1, 2, 4, 8, 16):
            for bk in (512, 1024, 2048, 4096):
                if bk > triton.next_power_of_2(k):
                    continue
                for warps in (4, 8, 16):
                    regs = bm * bn * bk // (32 * warps)
                    if not 4 <= regs <= 64:
                        continue
                    out.append(SkinnyConfig(0, bn, bk, 1, warps, 1, ef))
                    programs = triton.cdiv(n, bn)
                    for split in (2, 4, 8):
                        if programs < 2 * sms and programs * split <= 4 * sms and triton.cdiv(k, bk) >= split:
                            out.append(SkinnyConfig(1, bn, bk, split, warps, 1, ef))
    return out


def inductor_configs(before: set[Path]) -> list[dict]:
    """The ``.best_config`` files Inductor wrote since ``before`` (its coordinate-descent choice per kernel)."""
    cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    found = []
    for path in sorted(set(cache.rglob("*.best_config")) - before):
        try:
            found.append({"file": path.name, **json.loads(path.read_text())})
        except (OSError, ValueError):
            continue
    return found


def as_skinny(cfg: dict, m: int, k: int) -> SkinnyConfig | None:
    """Inductor's reduction tile as a skinny ``gemv`` config (XBLOCK rows of B, R0_BLOCK of K, evict_first); a
    persistent reduction (no R0_BLOCK) holds all of K in one block."""
    x, r, w = cfg.get("XBLOCK"), cfg.get("R0_BLOCK") or cfg.get("RBLOCK"), cfg.get("num_warps")
    if not (x and w) or m != 1:
        return None
    try:
        return SkinnyConfig(6, int(x), int(r) if r else triton.next_power_of_2(k), 1, int(w), 1, True)
    except ValueError:  # a tile our kernel cannot take: recorded in results.json, not timed
        return None


def explore(m: int, n: int, k: int, dev: torch.device, arch: str, sms: int, cache: int, rows: list[dict],
            args: argparse.Namespace) -> dict:
    seen = set(Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).rglob("*.best_config"))
    torch._dynamo.reset()
    t0 = time.perf_counter()
    compiled = None
    if m <= args.compile_max_m:
        compiled = torch.compile(lambda x, w: F.linear(x, w), mode="max-autotune-no-cudagraphs", dynamic=False)
    set_bytes = (n * k + m * k + m * n) * 2
    n_sets = rotating_sets(set_bytes, cache, torch.cuda.mem_get_info(dev)[0])
    A = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _ in range(n_sets)]
    W = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / math.sqrt(k) for _ in range(n_sets)]
    ref = A[0].float() @ W[0].float().t()
    scale = ref.abs().max().item()
    if compiled is not None:
        compiled(A[0], W[0])
    compile_s = time.perf_counter() - t0
    ind = inductor_configs(seen) if compiled is not None else []
    cands = grid(m, n, k, arch, sms, args.only_gemv) if m <= MAX_M else gemm_grid(m, n, k, arch, sms)
    for c in ind:
        sk = as_skinny(c, m, k)
        if sk is not None and sk not in cands:
            cands.append(sk)

    def screen(configs: list[Config]) -> list[tuple[float, Config]]:
        timed = []
        for cfg in configs:
            try:
                run = runner(cfg)
                err = (run(A[0], W[0]).float() - ref).abs().max().item() / scale
                if not err < TOL:
                    rows.append({"M": m, "N": n, "K": k, "config": cfg.name, "us": "", "rel_err": err,
                                 "note": "wrong"})
                    continue
                t = time_runner(lambda i, run=run: run(A[i], W[i]), n_sets, dev, SCREEN)
            except Exception as exc:  # a config the compiler rejects (registers, shared memory): record and go on
                rows.append({"M": m, "N": n, "K": k, "config": cfg.name, "us": "", "rel_err": "",
                             "note": f"{type(exc).__name__}: {str(exc)[:120]}"})
                continue
            rows.append({"M": m, "N": n, "K": k, "config": cfg.name, "us": t.us, "rel_err": err, "note": ""})
            timed.append((t.us, cfg))
        return timed

    screened = screen(cands)
    if m > MAX_M:  # the best unspecialised tiles, compiled for this (N, K)
        screened.sort(key=lambda x: x[0])
        screened += screen([replace(cfg, SPECIALIZE=True) for _, cfg in screened[:args.sp_top]])
    if m == 1 and args.pdl:  # the best one-pass gemv tiles launched with programmatic dependent launch
        screened.sort(key=lambda x: x[0])
        gemvs = [cfg for _, cfg in screened if cfg.solidx == 6][:args.sp_top]
        screened += screen([replace(cfg, pdl=p) for cfg in gemvs for p in (1, 2)])
    screened.sort(key=lambda x: x[0])
    top = [cfg for _, cfg in screened[:args.top]]
    ind_sk = [as_skinny(c, m, k) for c in ind]
    for sk in ind_sk:  # Inductor's tile always goes to the final round
        if sk is not None and sk not in top and any(sk == c for _, c in screened):
            top.append(sk)
    if m > MAX_M:  # the best unspecialised tile too: what _SP itself is worth, paired
        plain = next((cfg for _, cfg in screened if not cfg.SPECIALIZE), None)
        if plain is not None and plain not in top:
            top.append(plain)
    err_c = (compiled(A[0], W[0]).float() - ref).abs().max().item() / scale if compiled is not None else None
    err_t = (gemm_a16w16(A[0], W[0]).float() - ref).abs().max().item() / scale
    methods = {"F.linear": lambda i: F.linear(A[i], W[i]), "dispatch": lambda i: gemm_a16w16(A[i], W[i])}
    if compiled is not None:
        methods["max-autotune"] = lambda i: compiled(A[i], W[i])
    for cfg in top:
        methods[cfg.name] = lambda i, run=runner(cfg): run(A[i], W[i])
    samples = time_paired(methods, n_sets, PAIRED, args.pairs, captures=3)
    med = {name: statistics.median(v) for name, v in samples.items()}

    def over(base: str) -> dict[str, float]:
        return {name: statistics.median([a / b for a, b in zip(samples[base], v)]) for name, v in samples.items()}
    dispatch = get_GEMM_A16W16_config(m, n, k, False, torch.bfloat16)
    floor_us = set_bytes / 3.0e12 * 1e6  # bytes at the measured copy bandwidth (3.0 TB/s, H100)
    return {"M": m, "N": n, "K": k, "n_sets": n_sets, "compile_s": compile_s, "inductor_best_configs": ind,
            "inductor_as_skinny": [c.name for c in ind_sk if c is not None], "screened": len(screened),
            "rel_err_compiled": err_c, "rel_err_dispatch": err_t, "dispatch": {
                c: dispatch.get(c) for c in ("libtype", "kernelName", "us", "matched")},
            "floor_us": floor_us, "median_us": med, "linear_over": over("F.linear"),
            "max_autotune_over": over("max-autotune") if compiled is not None else {},
            "fraction_of_floor": {name: floor_us / us for name, us in med.items()}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    arch = _identity().gfx
    cache = cache_bytes(dev)
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",") if s]
    t0 = time.monotonic()
    rows: list[dict] = []
    results = []
    for m, n, k in shapes:
        if time.monotonic() - t0 > args.deadline_s:
            print(f"deadline: skipped M={m} N={n} K={k}", flush=True)
            continue
        res = explore(m, n, k, dev, arch, sms, cache, rows, args)
        results.append(res)
        order = sorted(res["median_us"], key=res["median_us"].get)
        base = "max-autotune" if res["max_autotune_over"] else "F.linear"
        ratios = res["max_autotune_over"] or res["linear_over"]
        print(f"M={m} N={n} K={k}: floor {res['floor_us']:.2f} us; inductor {res['inductor_as_skinny']}; "
              + "; ".join(f"{name} {res['median_us'][name]:.2f} us ({ratios[name]:.3f}x of {base})"
                          for name in order), flush=True)
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        with open(out / "screen.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["M", "N", "K", "config", "us", "rel_err", "note"])
            w.writeheader()
            w.writerows(rows)
    env = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    (out / "env.json").write_text(json.dumps(env, indent=1))
    print(f"wrote {out}/results.json, screen.csv, env.json ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
