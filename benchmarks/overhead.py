"""Host time the dispatch adds per call (``--bench overhead``): tiny GEMMs, where host time is all there is.

For an exact hit, a padded hit and a default decision (2-D A), an exact hit with a 3-D A, ``TunedLinear`` against the
``nn.Linear`` it replaces, the ``torch.ops`` custom op that compiled graphs call, and on a GPU a graph-timed row whose
eager calls run F.linear, ``gemm_a8w8_blockscale`` against the plain ``F.scaled_mm`` call (torch-decided shapes and
a Triton-decided one: its bound launch, or torch's matmul where launches do not bind), and FP8 linears (the bound
activation quantizer against Triton's launcher; torch's block-scaled GEMM with its cuBLASLt plan cached against
torch's op bound to the shape; the op, torch's block-scaled arm and the ``FP8Linear`` twin against bf16 F.linear /
nn.Linear of the same shape; ``note`` says which launch, GEMM (its bound Triton launch or cached cuBLASLt plan, or
why not) and call entry they took): N calls of the torch call and N of ours back to back, R times, the median of the
per-repeat differences (``added_us``). The decisions come from a tuned CSV this bench writes to a temporary folder (the
environment is restored afterwards).
"""

from __future__ import annotations

import csv
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

import aiter_gemm
from aiter_gemm.configs import BF16_TUNED_COLUMNS
from aiter_gemm.op_entry import EXT
from aiter_gemm.settings import scoped_env

N, K = 64, 64


def per_call_us(fn: Callable[[], object], n: int, sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n * 1e6


def measure(ref: Callable[[], object], ours: Callable[[], object], n: int, repeats: int,
            sync: Callable[[], None]) -> tuple[float, float, float]:
    """(median ref us, median ours us, median of per-repeat ours - ref), repeats alternating the two loops."""
    for _ in range(3):  # warm-up: decisions made, caches filled
        per_call_us(ref, n // 10 + 1, sync)
        per_call_us(ours, n // 10 + 1, sync)
    refs, outs, diffs = [], [], []
    for _ in range(repeats):
        r, o = per_call_us(ref, n, sync), per_call_us(ours, n, sync)
        refs.append(r)
        outs.append(o)
        diffs.append(o - r)
    return statistics.median(refs), statistics.median(outs), statistics.median(diffs)


def _row(case: str, provider: str, vs: str, m: int, n: int, k: int, got: tuple[float, float, float],
         repeats: int, note: str = "") -> dict:
    ref, ours, added = got
    return {"bench": "overhead", "set": "tiny", "label": case, "M": m, "N": n, "K": k, "bias": False,
            "provider": provider, "mode": "eager", "us": f"{ours:.3f}", "vs": vs, "vs_us": f"{ref:.3f}",
            "ratio": f"{ref / ours:.4f}", "rounds": repeats, "added_us": f"{added:.3f}", "note": note}


def _tuned_csv(path: Path, dev: torch.device, dtype: torch.dtype) -> None:
    """Rows for the cases: M = 8 exact, M = 13 padded to 16 (gl0), and on a GPU a graph-timed skinny row at M = 4."""
    ident = aiter_gemm.current_device_identity(on_gpu=dev.type == "cuda")
    name = str(dtype)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, BF16_TUNED_COLUMNS, restval="")
        w.writeheader()
        base = {"gfx": ident.gfx, "cu_num": ident.cu_num, "N": N, "K": K, "bias": False, "dtype": name,
                "outdtype": name, "scaleAB": False, "bpreshuffle": False, "solidx": 0, "us": 1.0}
        for m in (8, 16):
            w.writerow({**base, "M": m, "libtype": "torch", "splitK": 0, "kernelName": "F.linear"})
        if dev.type == "cuda":
            w.writerow({**base, "M": 4, "libtype": "skinny", "splitK": 1, "kernelName": "fma_BN8_BK64_SK1_W4_S1",
                        "timing": "graph"})


def _blockscale_rows(calls: int, repeats: int, sync: Callable[[], None]) -> list[dict]:
    """The block-scale op against the plain call of torch's block-scaled matmul: torch-decided (M a multiple of 4,
    and padded) and a Triton-decided shape, whose eager calls run its bound launch (``triton_bound``), or torch's
    where launches do not bind (``eager_switch``)."""
    from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl
    from aiter_gemm.kernels.a8w8_blockscale import quantize_blockscale
    from aiter_gemm.ops.a8w8_blockscale import gemm_a8w8_blockscale, get_GEMM_A8W8_BLOCKSCALE_config

    if torch_impl.unavailable_reason(torch.device("cuda")) is not None:
        return []
    n, k, rows = 256, 512, []
    for case, m in (("torch", 1024), ("torch_padded", 1027), ("triton", 128)):
        ops = tuple(t.cuda() for t in quantize_blockscale(torch.randn(m, k), torch.randn(n, k)))
        cfg = get_GEMM_A8W8_BLOCKSCALE_config(m, n, k)
        if cfg["libtype"] != case.split("_")[0] or cfg["eager_libtype"] not in ("torch", cfg["libtype"]):
            raise RuntimeError(f"blockscale case {case}: the dispatch decided {cfg}")
        if case == "triton":
            case = "triton_bound" if cfg["eager_libtype"] == "triton" else "eager_switch"
        got = measure(lambda ops=ops: torch_impl.gemm_a8w8_blockscale_torch(*ops),
                      lambda ops=ops: gemm_a8w8_blockscale(*ops), calls // 4, repeats, sync)
        rows.append(_row(case, "dispatch_blockscale", "torch_blockscale", m, n, k, got, repeats,
                         f"gemm: {_gemm_path(cfg, ops)}"))
    return rows


def _gemm_path(cfg: dict, ops: tuple) -> str:
    """What the block-scale op's eager calls of ``ops`` run (``cfg``: the shape's decision as
    ``get_GEMM_A8W8_BLOCKSCALE_config`` reports it): torch's matmul, or the Triton runner's launch now, bound or
    Triton's launcher (and why)."""
    from aiter_gemm.backends.base import GemmProblem

    eager = cfg["eager_libtype"]
    what = eager if eager == cfg["libtype"] else f"{eager} (eager switch from {cfg['libtype']})"
    if eager not in ("triton", "torch"):
        return what
    disp = aiter_gemm.get_dispatcher("gemm_a8w8_blockscale")
    XQ, WQ = ops[0], ops[1]
    M, N, K = XQ.shape[0], WQ.shape[0], XQ.shape[1]
    dec = disp.decide(GemmProblem(M, N, K, False, XQ.dtype, torch.bfloat16), True)
    runner = dec.eager_runner or dec.runner
    if eager == "torch":
        return f"{what}, {_lt_path(runner, M, N, K)}"
    path = getattr(runner, "launch_path", None)
    return f"{what}, {path(*ops, torch.bfloat16) if path else 'Triton launcher (launches do not bind here)'}"


def _lt_path(runner: Callable, M: int, N: int, K: int) -> str:
    """Whether torch's block-scale runner for (M, N, K) has its cuBLASLt plan cached, and why not."""
    from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl

    if isinstance(runner, torch_impl.LtBlockwiseRunner):
        return "cached cuBLASLt plan"
    return f"F.scaled_mm (no cached plan: {torch_impl.LT.reason(M, N, K) or 'not asked: no CUDA device'})"


def _fp8_rows(calls: int, repeats: int, sync: Callable[[], None]) -> list[dict]:
    """FP8 linears on one decode shape: the activation quantizer's bound launch against Triton's launcher, and the
    whole FP8 linear (quantize, GEMM) through the op, through torch's block-scaled matmul and as transformers'
    ``FP8Linear`` twin, each against bf16 F.linear / nn.Linear of the same shape (issue 53: within 5 us)."""
    from aiter_gemm.fp8_linear import fp8_block_linear, from_fp8_linear
    from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl
    from aiter_gemm.kernels import act_quant
    from aiter_gemm.kernels.a8w8_blockscale import quantize_blockscale
    from aiter_gemm.ops.a8w8_blockscale import get_GEMM_A8W8_BLOCKSCALE_config

    if torch_impl.unavailable_reason(torch.device("cuda")) is not None:
        return []
    m, n, k = 8, 512, 512
    x = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16)
    linear = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
    w = linear.weight.detach()
    _, wq, _, ws = quantize_blockscale(x[0].float(), w.float())
    x2 = x[0]
    got = measure(lambda: act_quant.quant_triton(x2, True), lambda: act_quant.per_token_group_quant_fp8(x2, True),
                  calls // 4, repeats, sync)
    quant = f"quantizer: {_quant_path(x2)}"
    rows = [_row("fp8_quant", "act_quant_bound", "triton_launcher", m, n, k, got, repeats, quant)]
    xq, xs = act_quant.per_token_group_quant_fp8(x2, True)
    ops = (xq, wq, xs, ws, torch.bfloat16)
    bound, cached = torch_impl.launcher(m, n, k), torch_impl.launcher(m, n, k, device=x2.device)
    lt = _lt_path(cached, m, n, k)
    got = measure(lambda: bound(*ops), lambda: cached(*ops), calls // 4, repeats, sync)
    rows.append(_row("fp8_gemm", "torch_blockscale_lt", "torch_blockscale_bound", m, n, k, got, repeats, lt))
    cfg = get_GEMM_A8W8_BLOCKSCALE_config(m, n, k)
    for provider, gemm in (("fp8_block_linear", None), ("torch_blockscale", torch_impl.gemm_a8w8_blockscale_torch)):
        got = measure(lambda: F.linear(x, w), lambda gemm=gemm: fp8_block_linear(x, wq, ws, None, gemm, True),
                      calls // 4, repeats, sync)
        what = "torch" if gemm is not None else _gemm_path(cfg, (xq, wq, xs, ws))
        rows.append(_row("fp8_linear", provider, "flinear", m, n, k, got, repeats, f"{quant}; gemm: {what}"))
    try:
        from transformers.integrations.finegrained_fp8 import FP8Linear
    except ImportError:
        return rows
    fp8 = FP8Linear(k, n, block_size=(128, 128), activation_scheme="dynamic", has_bias=False).cuda()
    fp8.weight.data, fp8.weight_scale_inv.data = wq, ws
    twin = from_fp8_linear(fp8, "overhead")
    with torch.no_grad():
        got = measure(lambda: linear(x), lambda: twin(x), calls // 4, repeats, sync)
        entry = "C++ fp8_call" if EXT is not None and EXT.fp8_call(twin, x) is not None else "Python forward"
    rows.append(_row("fp8_linear", "TunedFP8Linear", "nn.Linear", m, n, k, got, repeats,
                     f"{quant}; gemm: {_gemm_path(cfg, (xq, wq, xs, ws))}; call: {entry}"))
    return rows


def _quant_path(x2: torch.Tensor) -> str:
    """Which launch the activation quantizer's calls of x2 (M-major scales) take now, and why not the bound one."""
    from aiter_gemm.kernels import act_quant

    if act_quant.TABLES is None:
        return "Triton's launcher (the C++ extension is not built)"
    plan = EXT.triton_table_find(act_quant.TABLES[1], x2)
    if plan is None:
        return "Triton's launcher (not bound: the log says why)"
    if EXT.triton_run(plan, x2) is None:
        return "Triton's launcher (the plan declines: a launch hook, another device current, a misaligned view)"
    return "bound launch"


def run_overhead(device: torch.device, calls: int, repeats: int) -> list[dict]:
    """Every case's row (see the module docstring)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "overhead_tuned.csv"
        _tuned_csv(path, device, dtype)
        try:
            with scoped_env({"AITER_CONFIG_GEMM_BF16": str(path)}):
                aiter_gemm.reload_configs()
                return _cases(device, dtype, calls, repeats, sync)
        finally:
            aiter_gemm.reload_configs()


def _cases(dev: torch.device, dtype: torch.dtype, calls: int, repeats: int, sync: Callable[[], None]) -> list[dict]:
    b = torch.randn(N, K, device=dev, dtype=dtype)
    rows = []
    for case, m in {"exact": 8, "padded_gl0": 13, "default": 100}.items():  # 100 pads to 112 / 128: no row
        a = torch.randn(m, K, device=dev, dtype=dtype)
        cfg = aiter_gemm.get_GEMM_A16W16_config(m, N, K, False, dtype, dtype)
        if cfg["matched"] != case or cfg["libtype"] != "torch":
            raise RuntimeError(f"overhead case {case}: the dispatch decided {cfg}")
        got = measure(lambda a=a: F.linear(a, b), lambda a=a: aiter_gemm.gemm_a16w16(a, b), calls, repeats, sync)
        rows.append(_row(case, "dispatch", "flinear", m, N, K, got, repeats))
    # A 3-D activation, as a model's linears get one; and patch_linear's TunedLinear against its nn.Linear.
    a3 = torch.randn(1, 8, K, device=dev, dtype=dtype)
    got = measure(lambda: F.linear(a3, b), lambda: aiter_gemm.gemm_a16w16(a3, b), calls, repeats, sync)
    rows.append(_row("exact_3d", "dispatch", "flinear", 8, N, K, got, repeats))
    from aiter_gemm.nn import TunedLinear

    linear = torch.nn.Linear(K, N, bias=False, device=dev, dtype=dtype)
    tuned = TunedLinear.from_linear(linear)
    with torch.no_grad():
        got = measure(lambda: linear(a3), lambda: tuned(a3), calls, repeats, sync)
    rows.append(_row("exact_3d", "TunedLinear", "nn.Linear", 8, N, K, got, repeats))
    if dev.type == "cuda":  # decode through a graph-timed skinny row outside capture: the eager switch's cost
        a4 = torch.randn(1, 4, K, device=dev, dtype=dtype)
        cfg = aiter_gemm.get_GEMM_A16W16_config(4, N, K, False, dtype, dtype)
        if (cfg["libtype"], cfg["eager_libtype"]) != ("skinny", "torch"):
            raise RuntimeError(f"overhead case eager_switch_3d: the dispatch decided {cfg}")
        got = measure(lambda: F.linear(a4, b), lambda: aiter_gemm.gemm_a16w16(a4, b), calls, repeats, sync)
        rows.append(_row("eager_switch_3d", "dispatch", "flinear", 4, N, K, got, repeats))
        with torch.no_grad():
            got = measure(lambda: linear(a4), lambda: tuned(a4), calls, repeats, sync)
        rows.append(_row("eager_switch_3d", "TunedLinear", "nn.Linear", 4, N, K, got, repeats))
        rows += _blockscale_rows(calls, repeats, sync)
        rows += _fp8_rows(calls, repeats, sync)
    a = torch.randn(8, K, device=dev, dtype=dtype)
    op = torch.ops.aiter_gemm.gemm_a16w16
    got = measure(lambda: F.linear(a, b), lambda: op(a, b), calls // 4, repeats, sync)
    rows.append(_row("exact", "custom_op", "flinear", 8, N, K, got, repeats))
    return rows
