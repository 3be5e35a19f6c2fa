"""CPU demo: run every shape of a model shape list through ``gemm_a16w16`` and show what each dispatched to.

    python -m aiter_gemm.demo [--shapes configs/model_configs/<model>_untuned_gemm.csv] [--max-m 64]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import aiter_gemm
from aiter_gemm.configs import load_untuned
from aiter_gemm.settings import default_config_dir

DEFAULT_SHAPES = "model_configs/llama3_8b_untuned_gemm.csv"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=str(default_config_dir() / DEFAULT_SHAPES), help="untuned shape CSV")
    ap.add_argument("--max-m", type=int, default=64, help="skip shapes with a larger M (CPU time)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    keys = [k for k in load_untuned(args.shapes) if k[0] <= args.max_m]
    ident = aiter_gemm.current_device_identity(on_gpu=args.device != "cpu")
    units = "SMs/CUs" if ident.is_gpu else "cores"
    print(f"{len(keys)} shapes from {args.shapes} on {ident.gfx} ({ident.cu_num} {units})")
    print(f"{'M':>6} {'N':>6} {'K':>6} {'bias':>5} {'dtype':>15} {'libtype':>9} {'matched':>11} {'ms':>8}  source")
    for M, N, K, bias, dtype, otype, scale_ab, bpre in keys:
        if scale_ab or bpre:
            continue
        run_dtype = dtype
        x = torch.randn(M, K, dtype=run_dtype, device=args.device)
        w = torch.randn(N, K, dtype=run_dtype, device=args.device)
        b = torch.randn(N, dtype=run_dtype, device=args.device) if bias else None
        t0 = time.perf_counter()
        out = aiter_gemm.gemm_a16w16(x, w, b, otype=otype if otype != dtype else None)
        ms = (time.perf_counter() - t0) * 1e3
        assert out.shape == (M, N)
        cfg = aiter_gemm.get_GEMM_A16W16_config(M, N, K, bias, run_dtype, out.dtype)
        print(f"{M:6d} {N:6d} {K:6d} {bias!s:>5} {str(run_dtype):>15} {cfg['libtype']:>9} {cfg['matched']:>11} "
              f"{ms:8.2f}  {cfg['source']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
