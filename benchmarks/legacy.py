"""Rows of the harness's CSV format (:data:`benchmarks.measure.COLUMNS`) from the raw files of the scripts it replaced,
so the tables of record measured before the harness existed render from their committed files unchanged.

Recognised by their header: ``heldout.csv`` (bench_heldout: paired ratios), ``tuned_gemm.csv`` (bench_tuned_gemm:
round medians of F.linear, the dispatch and max-autotune), ``summary.csv`` (bench_a8w8_blockscale ``--op``: the
block-scale op, torch's block-scaled matmul with its layouts prepared outside the timing (``torch_prepared``), the best
Triton config and bf16 F.linear), the dispatch-overhead CSVs,
``layer.csv``, the M = 1 gemv default sweep and the defaults sweep. Ratios those scripts did not pair are ratios of
medians (their rows' ``rounds`` is empty).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from aiter_gemm.fileio import read_csv_rows

FP8_NAMES = {"torch_blockwise": "torch_blockscale", "bf16_F.linear": "flinear"}
OVERHEAD_PATHS = {"eager gemm_a16w16": ("dispatch", "flinear"), "TunedLinear module": ("TunedLinear", "nn.Linear"),
                  "torch.ops custom op": ("custom_op", "flinear"),
                  "eager gemm_a8w8_blockscale": ("dispatch_blockscale", "torch_blockscale")}
#: The block-scale benchmark's (N, K) -> model, for labels.
FP8_LABELS = {**dict.fromkeys(((256, 7168), (2112, 7168), (3072, 1536), (4096, 512), (512, 7168), (7168, 2048)),
                              "dsv3"),
              **dict.fromkeys(((10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)), "llama3_70b")}
#: H100: FP8 dense peak (datasheet) and the measured copy bandwidth, for the block-scale rows' roofline.
H100_FP8_FLOPS, H100_BW = 1979e12, 3.0e12


def _f(x: str | None) -> float:
    try:
        v = float(x) if x not in (None, "") else math.nan
    except ValueError:
        return math.nan
    return v


def _fmt(v: float, digits: int = 4) -> str:
    return "" if math.isnan(v) else f"{v:.{digits}f}"


def _pair(base: dict, provider: str, us: float, vs: str = "", vs_us: float = math.nan, **extra) -> dict:
    row = {**base, "provider": provider, "us": _fmt(us), **extra}
    if vs and not math.isnan(vs_us) and us > 0:
        row.update(vs=vs, vs_us=_fmt(vs_us), ratio=_fmt(vs_us / us))
    return row


def heldout(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        fp8 = r["set"] == "fp8"
        out.append({"bench": "fp8" if fp8 else "bf16", "set": "shipped" if r["set"] == "tuned" else r["set"],
                    "label": "fp8" if fp8 else r["model"], "M": r["M"], "N": r["N"], "K": r["K"], "bias": "False",
                    "provider": "dispatch", "mode": r["mode"], "us": r["us"],
                    "vs": FP8_NAMES.get(r["model"], r["model"]) if fp8 else "flinear", "vs_us": r["ref_us"],
                    "ratio": r["ratio"], "ratio_q1": r["ratio_q1"], "ratio_q3": r["ratio_q3"], "rounds": r["rounds"],
                    "libtype": r["libtype"], "eager_libtype": r["eager_libtype"], "matched": r["matched"],
                    "rel_err": r["rel_err"]})
    return out


def tuned_gemm(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        base = {"bench": "bf16", "set": "shipped", "label": r["model"], "M": r["M"], "N": r["N"], "K": r["K"],
                "bias": r["bias"], "mode": "graph", "roofline_us": r["roofline_us"]}
        f, t, c = _f(r["flinear_us"]), _f(r["tuned_us"]), _f(r["compile_us"])
        roof = _f(r["roofline_us"])
        out.append(_pair(base, "flinear", f, roof=r["flinear_roof"]))
        out.append(_pair(base, "dispatch", t, "flinear", f, roof=r["tuned_roof"], libtype=r["tuned_libtype"],
                         matched=r["tuned_matched"]))
        if not math.isnan(c):
            out.append(_pair(base, "maxautotune", c, "flinear", f, roof=_fmt(roof / c)))
            out.append(_pair(base, "dispatch", t, "maxautotune", c, roof=r["tuned_roof"],
                             libtype=r["tuned_libtype"], matched=r["tuned_matched"]))
        eager = {**base, "mode": "eager", "roofline_us": ""}
        out.append(_pair(eager, "flinear", _f(r["flinear_eager_us"])))
        out.append(_pair(eager, "dispatch", _f(r["tuned_eager_us"]), "flinear", _f(r["flinear_eager_us"]),
                         libtype=r["tuned_libtype"]))
    return out


def blockscale_summary(rows: list[dict], path: Path) -> list[dict]:
    meta = {}
    best = path.parent / "best.json"
    if best.is_file():
        meta = json.loads(best.read_text()).get("meta", {})
    h100 = "H100" in str(meta.get("device", ""))
    out = []
    for r in rows:
        M, N, K = int(r["M"]), int(r["N"]), int(r["K"])
        roof = math.nan
        if h100:
            kb, nb = -(-K // 128), -(-N // 128)
            nbytes = M * K + N * K + 2 * M * N + 4 * (M * kb + nb * kb)
            roof = max(2.0 * M * N * K / H100_FP8_FLOPS, nbytes / H100_BW) * 1e6
        base = {"bench": "fp8", "set": "shipped", "label": FP8_LABELS.get((N, K), "fp8"), "M": M, "N": N, "K": K,
                "bias": "False", "mode": "graph", "roofline_us": _fmt(roof)}
        op, bf, tb, tr = _f(r.get("op_us")), _f(r["bf16_linear_us"]), _f(r["torch_blockscale_us"]), _f(r["us"])
        libtype, _, name = (r.get("op_choice") or "").partition(":")
        info = {"libtype": libtype, "matched": r.get("op_matched", ""), "note": name}
        # torch's matmul was timed with its layouts prepared outside the timing (not the per-call F.scaled_mm)
        for prov, us in (("flinear", bf), ("torch_prepared", tb), (f"triton:{r['best_config']}", tr)):
            if not math.isnan(us):
                out.append(_pair(base, prov, us, roof=_fmt(roof / us)))
        if not math.isnan(op):
            for vs, vs_us in (("flinear", bf), ("torch_prepared", tb)):
                if not math.isnan(vs_us):
                    out.append(_pair(base, "dispatch", op, vs, vs_us, roof=_fmt(roof / op),
                                     tflops=_fmt(2.0 * M * N * K / op / 1e6, 1), **info))
    return out


def overhead(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        provider, vs = OVERHEAD_PATHS.get(r["path"], (r["path"], "torch"))
        ref, ours = _f(r["torch_us"]), _f(r["call_us"])
        out.append({"bench": "overhead", "set": "tiny", "label": r["case"], "M": r["M"], "N": r["N"], "K": r["K"],
                    "bias": "False", "provider": provider, "mode": "eager", "us": r["call_us"], "vs": vs,
                    "vs_us": r["torch_us"], "ratio": _fmt(ref / ours), "rounds": r.get("repeats", ""),
                    "added_us": r["added_us"]})
    return out


def layer(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        base = {"bench": "layer", "set": "llama3_8b:tp1", "label": "layer", "M": r["M"], "N": "4096", "K": "4096",
                "bias": "False", "rel_err": r["rel_err"]}
        for mode in ("graph", "eager"):
            f, d = _f(r[f"F.linear_{mode}_us"]), _f(r[f"gemm_a16w16_{mode}_us"])
            out.append(_pair({**base, "mode": mode}, "flinear", f))
            out.append(_pair({**base, "mode": mode}, "dispatch", d, "flinear", f))
    return out


def gemv_default(rows: list[dict]) -> list[dict]:
    """The M = 1 default sweep: ``default`` is the default of its time (the fma / dot tiles), each gemv candidate a
    ``skinny:<kernelName>`` provider; ratios are its paired medians."""
    out = []
    for r in rows:
        method = r["method"]
        provider = "flinear" if method == "F.linear" else ("default" if method == "default" else f"skinny:{method}")
        row = {"bench": "bf16", "set": r["set"], "label": r["set"], "M": "1", "N": r["N"], "K": r["K"],
               "bias": "False", "provider": provider, "mode": "graph", "us": _fmt(_f(r["us"])),
               "libtype": r["config"], "rel_err": r["rel_err"]}
        if provider != "flinear":
            row.update(vs="flinear", ratio=_fmt(_f(r["speedup"])), ratio_q1=_fmt(_f(r["q1"])),
                       ratio_q3=_fmt(_f(r["q3"])))
        out.append(row)
    return out


def defaults_sweep(rows: list[dict]) -> list[dict]:
    """The defaults sweep: part A (the skinny default against F.linear, M <= 16) and C (the block-scale Triton
    default against torch's block-scaled matmul); ratios of the two rounds' medians."""
    groups: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r["part"][:1] not in ("A", "C") or r["error"]:
            continue
        name, _, cfg = r["method"].partition(":")
        # part C timed the op's own torch runner (bound per shape), not the per-call F.scaled_mm
        provider = {"F.linear": "flinear", "torch_blockwise": "torch", "skinny_default": "skinny",
                    "triton_default": "triton"}.get(name, name)
        groups.setdefault((r["part"], r["M"], r["N"], r["K"], r["mode"]), {})[provider] = {**r, "config": cfg}
    out = []
    for (part, M, N, K, mode), by in groups.items():
        fp8 = part == "C"
        ref = by.get("torch" if fp8 else "flinear")
        base = {"bench": "fp8" if fp8 else "bf16", "set": "defaults" if fp8 else part[2:], "M": M, "N": N, "K": K,
                "bias": "False", "mode": mode, "label": FP8_LABELS.get((int(N), int(K)), "fp8") if fp8 else part[2:]}
        vs = "torch" if fp8 else "flinear"
        for provider, r in by.items():
            if ref is not None and r is not ref:
                out.append(_pair(base, provider, _f(r["us"]), vs, _f(ref["us"]), libtype=r["config"]))
            else:
                out.append(_pair(base, provider, _f(r["us"])))
    return out


def eager_host(rows: list[dict]) -> list[dict]:
    """bench_eager_host: host us to submit a call and GPU us per call, F.linear and the dispatch (``host`` mode)."""
    out = []
    for r in rows:
        base = {"bench": "bf16", "set": "host", "label": "host", "M": r["M"], "N": r["N"], "K": r["K"],
                "bias": "False", "mode": "host"}
        f, d = _f(r["host_us_linear"]), _f(r["host_us_ours"])
        out.append(_pair(base, "flinear", f, gpu_us=r["gpu_us_linear"]))
        out.append(_pair(base, "dispatch", d, "flinear", f, gpu_us=r["gpu_us_ours"], libtype=r["libtype"],
                         eager_libtype=r["eager_libtype"]))
    return out


#: (columns that identify the format, converter taking (rows, path)).
FORMATS: tuple[tuple[frozenset[str], Callable[[list[dict], Path], list[dict]]], ...] = (
    (frozenset({"set", "model", "method", "ref_us"}), lambda rows, path: heldout(rows)),
    (frozenset({"flinear_us", "tuned_us", "speedup_tuned"}), lambda rows, path: tuned_gemm(rows)),
    (frozenset({"best_config", "bf16_linear_us", "torch_blockscale_us"}), blockscale_summary),
    (frozenset({"path", "case", "torch_us", "call_us", "added_us"}), lambda rows, path: overhead(rows)),
    (frozenset({"F.linear_graph_us", "gemm_a16w16_graph_us"}), lambda rows, path: layer(rows)),
    (frozenset({"set", "method", "config", "speedup", "q1", "q3"}), lambda rows, path: gemv_default(rows)),
    (frozenset({"part", "method", "mode", "rounds", "error"}), lambda rows, path: defaults_sweep(rows)),
    (frozenset({"host_us_linear", "host_us_ours", "gpu_us_linear"}), lambda rows, path: eager_host(rows)),
)


def convert(path: Path) -> list[dict] | None:
    """The file's rows in the harness format, or None if it is no format this module knows."""
    header, rows = read_csv_rows(path)
    cols = set(header)
    for need, conv in FORMATS:
        if need <= cols:
            return conv(rows, path)
    return None
