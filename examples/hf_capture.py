"""The capture half of :mod:`examples.hf_decode`: which GEMM shapes a Hugging Face model should run
(its projections, and ``gradlib.models``' vLLM-style derivation for comparison), ``generate()`` with capture on,
and the check of the captured file against what the patched modules saw; the tuner call."""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import aiter_gemm
from aiter_gemm.fileio import atomic_write_text
from aiter_gemm.settings import scoped_env

if TYPE_CHECKING:
    from examples.hf_model import PatchState

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
CAPTURE_FILE = "captured_gemm.csv"
TUNED_FILE = "tuned_gemm.csv"
#: The dtype field of an FP8Linear's shape (its GEMM is gemm_a8w8_blockscale's, captured to that op's untuned file
#: in the same folder, and tuned into FP8_TUNED_FILE).
FP8_KEY = "fp8_blockscale"
FP8_TUNED_FILE = "a8w8_blockscale_tuned_gemm.csv"


# ---------------------------------------------------------------------------------------------------------------
# expected shapes


def hf_projections(arch: Any) -> dict[str, tuple[int, int, bool]]:
    """(N, K, bias) per Hugging Face module name of a Llama-family decoder (q/k/v, gate/up unfused; the vocabulary
    unpadded), from gradlib's :class:`~gradlib.models.ModelArch` (tp = 1)."""
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    return {"q_proj": (q, arch.hidden, arch.qkv_bias), "k_proj": (kv, arch.hidden, arch.qkv_bias),
            "v_proj": (kv, arch.hidden, arch.qkv_bias), "o_proj": (arch.hidden, q, arch.o_bias),
            "gate_proj": (arch.intermediate, arch.hidden, arch.mlp_bias),
            "up_proj": (arch.intermediate, arch.hidden, arch.mlp_bias),
            "down_proj": (arch.hidden, arch.intermediate, arch.mlp_bias), "lm_head": (arch.vocab, arch.hidden, False)}


Key = tuple[int, int, int, bool, str]  # M, N, K, bias, dtype name


def hf_expected(arch: Any, suffixes: set[str], nsets: set[int], head_ms: set[int], dtype: torch.dtype,
                fp8_suffixes: frozenset[str] = frozenset()) -> set[Key]:
    """Every (M, N, K) the patched modules named ``*.<suffix>`` run for these token counts (lm_head: ``head_ms``);
    those of ``fp8_suffixes`` (FP8Linear on the block-scale op) keyed with dtype :data:`FP8_KEY`, without bias."""
    out: set[Key] = set()
    for name, (n, k, bias) in hf_projections(arch).items():
        if name in suffixes:
            kind = (False, FP8_KEY) if name in fp8_suffixes else (bias, str(dtype))
            out |= {(m, n, k, *kind) for m in (head_ms if name == "lm_head" else nsets)}
    return out


def gradlib_expected(arch: Any, nsets: set[int], head_ms: set[int], dtype: torch.dtype) -> set[Key]:
    """What ``gemm-tuner --model_dir`` derives (``gradlib.models.model_problems``, tp = 1) for the same counts."""
    from gradlib.models import model_problems

    return {(p.M, p.N, p.K, bool(p.bias), str(p.dtype))
            for p in model_problems(arch, 1, sorted(nsets), sorted(head_ms), dtype=dtype)}


def read_untuned(path: Path) -> set[Key]:
    """The shapes of an untuned CSV as written by capture (M,N,K,bias,dtype,...; the block-scale op's M,N,K only:
    dtype :data:`FP8_KEY`)."""
    from aiter_gemm.configs import parse_size
    from aiter_gemm.dtypes import parse_dtype

    with open(path, newline="") as f:
        return {(*(parse_size(r[c]) for c in "MNK"), r["bias"].strip().lower() in ("true", "1"),
                 str(parse_dtype(r["dtype"]))) if "dtype" in r else (*(parse_size(r[c]) for c in "MNK"), False, FP8_KEY)
                for r in csv.DictReader(f)}


def fp8_capture_file(captured: Path) -> Path:
    """Where the block-scale op's shapes go when ``captured`` is AITER_UNTUNED_GEMM_FILE (its folder)."""
    from aiter_gemm.ops.a8w8_blockscale import UNTUNED_FILE

    return captured.parent / UNTUNED_FILE


def fmoe_capture_file(captured: Path) -> Path:
    """Where ``fused_moe``'s shapes go when ``captured`` is AITER_UNTUNED_GEMM_FILE (its folder: AITER's
    ``untuned_fmoe.csv``)."""
    from aiter_gemm.ops.fused_moe import UNTUNED_FILE

    return captured.parent / UNTUNED_FILE


MoeKey = tuple[int, int, int, int, int, str, str, str]  # token, model_dim, inter_dim, expert, topk, dtype, q_dtype_w,
#                                                       q_type (names)


def moe_key(token: int, w2: torch.Tensor, topk: int, dtype: torch.dtype) -> MoeKey:
    """The :data:`MoeKey` of an experts call: ``w2`` is down_proj (E, H, I), FP8 ones with (128, 128) block scales
    (AITER's ``per_1x128``)."""
    from aiter_gemm.backends.base import QUANT_BLOCK, QUANT_NONE
    from aiter_gemm.kernels.blockscale_format import FP8

    fp8 = w2.dtype == FP8
    return (token, w2.shape[1], w2.shape[2], w2.shape[0], topk, str(dtype), str(FP8 if fp8 else dtype),
            QUANT_BLOCK if fp8 else QUANT_NONE)


def read_untuned_fmoe(path: Path) -> set[MoeKey]:
    """The shapes of an untuned fmoe CSV (AITER's columns) as :data:`MoeKey`."""
    from aiter_gemm.configs import load_untuned
    from aiter_gemm.ops.fused_moe import KIND

    return {(*key[:5], str(key[6]), str(key[8]), str(key[9])) for key in load_untuned(path, KIND)}


def moe_expected(config_dir: Path, tokens: set[int], dtype: torch.dtype) -> set[MoeKey]:
    """Every experts call an MoE model makes for these token counts, from ``gradlib.models.moe_experts`` (what
    ``python -m gradlib.tune_moe --model_dir`` derives; tp = ep = 1): FP8 experts where the config is an FP8
    checkpoint's with (128, 128) blocks."""
    from aiter_gemm.kernels.blockscale_format import FP8
    from gradlib.models import moe_experts

    m = moe_experts(config_dir)
    w2 = torch.empty((m.experts, m.hidden, m.inter), dtype=FP8 if m.fp8 else dtype, device="meta")
    return {moe_key(t, w2, m.topk, dtype) for t in tokens}


def compare(got: set[Key], want: set[Key]) -> dict[str, Any]:
    return {"match": got == want, "missing": sorted(want - got), "unexpected": sorted(got - want)}


# ---------------------------------------------------------------------------------------------------------------
# runtime environment


@contextlib.contextmanager
def runtime_env(values: dict[str, str | None]) -> Iterator[None]:
    """Set (``None``: unset) AITER_* variables and reload the runtime; restore both on exit."""
    try:
        with scoped_env(values):
            aiter_gemm.reload_configs()
            yield
    finally:
        aiter_gemm.reload_configs()


# ---------------------------------------------------------------------------------------------------------------
# capture


def run_capture(args: argparse.Namespace, model: torch.nn.Module, state: PatchState, arch: Any,
                out: Path) -> dict[str, Any]:
    """Run ``generate()`` per batch size with the model patched and capture on; check the captured file against the
    calls the patched modules saw and against both shape derivations."""
    captured = Path(args.capture_file) if args.capture_file else out / CAPTURE_FILE
    captured.unlink(missing_ok=True)
    fp8 = bool(state.fp8_suffixes)
    if fp8:
        fp8_capture_file(captured).unlink(missing_ok=True)
    fmoe_capture_file(captured).unlink(missing_ok=True)
    env: dict[str, str | None] = {"AITER_TUNE_GEMM": "1", "AITER_UNTUNED_GEMM_FILE": str(captured),
                                  "AITER_TUNE_GEMM_FLUSH_S": "3600"}
    if not args.capture_misses_only:  # capture every shape, not only those the tuned tables miss
        empty = out / "empty_tuned_gemm.csv"
        atomic_write_text(empty, "")
        env["AITER_CONFIG_GEMM_BF16"] = str(empty)
        env["AITER_CONFIG_FMOE"] = str(empty)
        if fp8:
            env["AITER_CONFIG_GEMM_A8W8_BLOCKSCALE"] = str(empty)
    dtype, device = DTYPES[args.dtype], next(model.parameters()).device
    seen: set[tuple[str, Key]] = set()
    moe_seen: set[MoeKey] = set()
    moe_hits: set[MoeKey] = set()  # --capture-misses-only: experts calls a tuned fmoe row covers
    with runtime_env(env):
        state.set(True)
        hooks = []
        for name in state.names:
            suffix = name.rsplit(".", 1)[-1]

            def hook(mod: torch.nn.Module, inputs: tuple, suffix: str = suffix) -> None:
                x = inputs[0]
                kind = (False, FP8_KEY) if suffix in state.fp8_suffixes else (mod.bias is not None, str(x.dtype))
                seen.add((suffix, (math.prod(x.shape[:-1]), mod.out_features, mod.in_features, *kind)))

            hooks.append(model.get_submodule(name).register_forward_pre_hook(hook))
        for name in state.experts:  # transformers' experts forward(hidden_states (T, H), top_k_index (T, k), ...)

            def moe_hook(mod: torch.nn.Module, inputs: tuple) -> None:
                moe_seen.add(moe_key(inputs[0].shape[0], mod.down_proj, inputs[1].shape[1], inputs[0].dtype))

            hooks.append(model.get_submodule(name).register_forward_pre_hook(moe_hook))
        try:
            with torch.no_grad():
                for b in args.batch:
                    ids = torch.randint(0, model.config.vocab_size, (b, args.prompt_len), device=device)
                    t0 = time.perf_counter()
                    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                                   min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
                    print(f"capture: generate batch {b} x {args.prompt_len} + {args.new_tokens} tokens "
                          f"{time.perf_counter() - t0:.2f} s")
        finally:
            for h in hooks:
                h.remove()
            state.set(False)
        aiter_gemm.get_dispatcher().flush_capture()
        if fp8:
            aiter_gemm.get_dispatcher("gemm_a8w8_blockscale").flush_capture()
        if state.experts:
            aiter_gemm.get_dispatcher("fused_moe").flush_capture()
        hits: dict[Key, str] = {}
        if args.capture_misses_only:  # shapes a tuned row covers are, by design, not captured
            for _, key in seen:
                cfg = (aiter_gemm.get_GEMM_A8W8_BLOCKSCALE_config(key[0], key[1], key[2], dtype=dtype)
                       if key[4] == FP8_KEY else aiter_gemm.get_GEMM_A16W16_config(key[0], key[1], key[2], key[3],
                                                                                   dtype))
                if cfg["matched"] != "default":
                    hits[key] = cfg["matched"]
            moe_hits = {k for k in moe_seen if aiter_gemm.get_fused_moe_config(
                *k[:5], dtype=k[5], q_dtype_w=k[6], q_type=k[7])["matched"] != "default"}
    got = read_untuned(captured) if captured.exists() else set()
    if fp8 and fp8_capture_file(captured).exists():
        got |= read_untuned(fp8_capture_file(captured))
    ran = {key for _, key in seen}
    nsets = {key[0] for suffix, key in seen if suffix != "lm_head"}
    head_ms = {key[0] for suffix, key in seen if suffix == "lm_head"}
    suffixes = {suffix for suffix, _ in seen}
    want_nsets = {b * args.prompt_len for b in args.batch} | ({b for b in args.batch} if args.new_tokens > 1 else set())
    hf = hf_expected(arch, suffixes, want_nsets, set(args.batch), dtype, state.fp8_suffixes) - set(hits)
    fused = gradlib_expected(arch, want_nsets, set(args.batch), dtype) - set(hits)
    result = {
        "file": str(captured), "rows": len(got), "fp8_file": str(fp8_capture_file(captured)) if fp8 else None,
        "modules_patched": len(state.names),
        "token_counts_seen": sorted(nsets), "lm_head_m_seen": sorted(head_ms),
        "lm_head_m_expected": sorted(args.batch) if "lm_head" in suffixes else [],
        "covered_by_tuned_rows": [list(k) + [v] for k, v in sorted(hits.items())],
        "captured_vs_ran": compare(got, ran - set(hits)),
        "captured_vs_hf_layout": compare(got, hf),
        "captured_vs_gradlib_models": compare(got, fused),
    }
    if state.experts:  # an MoE model: its experts calls on fused_moe, captured to AITER's untuned_fmoe.csv
        moe_file = fmoe_capture_file(captured)
        moe_got = read_untuned_fmoe(moe_file) if moe_file.exists() else set()
        result["moe"] = {"file": str(moe_file), "rows": len(moe_got), "modules_patched": len(state.experts),
                         "covered_by_tuned_rows": sorted(moe_hits),
                         "captured_vs_ran": compare(moe_got, moe_seen - moe_hits),
                         "captured_vs_gradlib_moe": compare(moe_got, moe_expected(args.config_dir, want_nsets, dtype)
                                                            - moe_hits)}
    print_capture(result, arch)
    atomic_write_text(out / "capture_check.json", json.dumps(result, indent=1, default=str))
    return result


def print_capture(r: dict[str, Any], arch: Any) -> None:
    from gradlib.models import projections

    names: dict[tuple[int, int], list[str]] = {}
    for name, (n, k, _) in hf_projections(arch).items():
        names.setdefault((n, k), []).append(name)
    for p in projections(arch, 1):  # gradlib's (fused) names
        names.setdefault((p.N, p.K), []).append(f"{p.name} (gradlib)")

    def label(key: list | tuple) -> str:
        m, n, k = key[:3]
        return f"M={m} N={n} K={k}{' bias' if key[3] else ''}: {' / '.join(names.get((n, k), ['?']))}"

    print(f"\ncapture: {r['rows']} shapes in {r['file']} from {r['modules_patched']} patched modules; token counts "
          f"{r['token_counts_seen']}; lm_head saw M = {r['lm_head_m_seen']} (expected the batch sizes "
          f"{r['lm_head_m_expected']}: generate() computes logits for the last position only)")
    for what, title in (("captured_vs_ran", "calls the patched modules saw"),
                        ("captured_vs_hf_layout", "gradlib.models arch, Hugging Face layout (q/k/v, gate/up unfused)"),
                        ("captured_vs_gradlib_models", "gradlib.models.model_problems (gemm-tuner --model_dir)")):
        c = r[what]
        print(f"  vs {title}: {'MATCH' if c['match'] else 'MISMATCH'}")
        for tag in ("missing", "unexpected"):
            for key in c[tag][:12]:
                print(f"      {tag}: {label(key)}")
            if len(c[tag]) > 12:
                print(f"      ... {len(c[tag]) - 12} more {tag}")
    moe = r.get("moe")
    if moe is not None:
        print(f"capture: {moe['rows']} fused_moe shapes in {moe['file']} from {moe['modules_patched']} experts modules")
        for what, title in (("captured_vs_ran", "calls the experts modules saw"),
                            ("captured_vs_gradlib_moe", "gradlib.models.moe_experts (tune_moe --model_dir)")):
            c = moe[what]
            print(f"  vs {title}: {'MATCH' if c['match'] else 'MISMATCH'}")
            for tag in ("missing", "unexpected"):
                for key in c[tag][:12]:
                    print(f"      {tag}: token={key[0]} model_dim={key[1]} inter_dim={key[2]} expert={key[3]} "
                          f"topk={key[4]} {key[5]} weights {key[6]} {key[7]}")
    if not r["captured_vs_gradlib_models"]["match"]:
        print("  note: gradlib.models derives vLLM's fused qkv_proj and gate_up_proj (and pads the vocabulary to 64);"
              " a Hugging Face model runs q/k/v and gate/up as separate GEMMs, so tune the captured file, not "
              "--model_dir, for it (tuned rows of fused shapes never match its calls)")


def run_tuner(args: argparse.Namespace, captured: Path, tuned: Path, fp8: bool = False) -> int:
    """gemm-tuner on the captured file; for an FP8 model the block-scale tuner on that op's captured file."""
    tuner = "gradlib.tune_a8w8_blockscale" if fp8 else "gradlib.gemm_tuner"
    source = fp8_capture_file(captured) if fp8 else captured
    cmd = [sys.executable, "-m", tuner, "-i", str(source), "-o", str(tuned), *shlex.split(args.tune_args)]
    print("tune:", shlex.join(cmd), flush=True)
    t0 = time.perf_counter()
    rc = subprocess.call(cmd)
    print(f"tune: exit status {rc} after {time.perf_counter() - t0:.0f} s")
    return rc
