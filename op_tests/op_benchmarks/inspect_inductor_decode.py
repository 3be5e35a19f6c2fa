"""What ``torch.compile(mode="max-autotune-no-cudagraphs")`` runs for a decode GEMM (issue 14): per (M, N, K),
compile ``F.linear`` with Inductor's autotune log and generated code on (``TORCH_LOGS=output_code``, set by this
script), then time the compiled call, F.linear and the skinny kernel's default and tuned choices with
``triton.testing.do_bench`` (L2 flushed between calls). The log holds the winning template, its launch config and
the source of the kernel Inductor emitted: what our skinny search space must contain.

    python -m op_tests.op_benchmarks.inspect_inductor_decode --shapes 1x4096x4096,1x1280x8192 --out <dir>
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCH_LOGS", "output_code")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def shape_list(text: str) -> list[tuple[int, int, int]]:
    out = []
    for item in text.split(","):
        m, n, k = (int(v) for v in item.lower().split("x"))
        out.append((m, n, k))
    return out


def inspect_shape(m: int, n: int, k: int, dev: torch.device, sms: int) -> dict:
    """Compile F.linear at (m, n, k) with max-autotune (its log goes to stderr) and time it beside F.linear and the
    skinny default (microseconds, ``do_bench`` medians)."""
    import triton

    from aiter_gemm.kernels.skinny import default_skinny_config, launch_skinny

    torch._dynamo.reset()
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5
    t0 = time.perf_counter()
    fn = torch.compile(lambda x, wt: F.linear(x, wt), mode="max-autotune-no-cudagraphs", dynamic=False)
    got = fn(a, w)
    compile_s = time.perf_counter() - t0
    ref = a.float() @ w.float().t()
    err = ((got.float() - ref).abs().max() / ref.abs().max()).item()
    calls = {"compile": lambda: fn(a, w), "F.linear": lambda: F.linear(a, w)}
    cfg = default_skinny_config(m, n, k, sms) if m <= 16 else None
    if cfg is not None:
        calls["skinny_default"] = lambda: launch_skinny(a, w, None, torch.bfloat16, cfg)
    floor_us = (n * k + m * k + m * n) * 2 / 3.0e12 * 1e6  # bytes / 3.0 TB/s (measured copy)
    row = {"M": m, "N": n, "K": k, "compile_s": compile_s, "compile_rel_err": err, "floor_us": floor_us,
           "skinny_default": cfg.name if cfg else None}
    for name, call in calls.items():
        row[f"{name}_us"] = triton.testing.do_bench(call, warmup=50, rep=300) * 1e3
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=shape_list, required=True, help="MxNxK,... (A is M x K, the weight N x K)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rows = []
    for m, n, k in args.shapes:
        print(f"===== shape M={m} N={n} K={k} =====", flush=True)
        row = inspect_shape(m, n, k, dev, sms)
        rows.append(row)
        print("RESULT " + json.dumps(row), flush=True)
    (out / "inspect.json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {out}/inspect.json (the generated code and autotune tables are in this log)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
