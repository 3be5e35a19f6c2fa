"""CPU demo: run every shape of a model shape list through ``gemm_a16w16`` and show what each dispatched to.

    python -m aiter_gemm.demo [--shapes configs/model_configs/<model>_untuned_gemm.csv] [--max-m 64]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import torch

import aiter_gemm
from aiter_gemm.cliargs import device_arg, positive_int
from aiter_gemm.configs import ConfigError, load_untuned
from aiter_gemm.dispatch import MISS_MESSAGE
from aiter_gemm.fileio import file_problem
from aiter_gemm.logs import PrefixFormatter
from aiter_gemm.settings import default_config_dir

DEFAULT_SHAPES = "model_configs/llama3_8b_untuned_gemm.csv"


class _MissLines(logging.Handler):
    """Keeps the runtime's per-shape "not found tuned config" INFO lines (the table's ``default`` rows say the same)
    so they do not interleave with the table; every other record is printed to stderr as it comes."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.setFormatter(PrefixFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == MISS_MESSAGE:
            self.lines.append(record.getMessage())
        else:
            print(self.format(record), file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m aiter_gemm.demo", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Run every shape of a model's shape list through gemm_a16w16 once and print what each "
                    "dispatched to: libtype, how it matched, the source.")
    ap.add_argument("--shapes", default=str(default_config_dir() / DEFAULT_SHAPES), help="untuned shape CSV")
    ap.add_argument("--max-m", type=positive_int, default=64, help="skip shapes with a larger M (CPU time)")
    ap.add_argument("--device", type=device_arg, default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where the GEMMs run")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    missing = file_problem(args.shapes)
    if missing is not None:
        ap.error(f"--shapes {args.shapes}: {missing}")
    try:  # a shape list that cannot be read is a usage error naming file, line and column
        keys = [k for k in load_untuned(args.shapes) if k[0] <= args.max_m]
    except ConfigError as exc:
        ap.error(f"--shapes {exc}")
    ident = aiter_gemm.current_device_identity(on_gpu=args.device.type != "cpu")
    units = "SMs/CUs" if ident.is_gpu else "cores"
    logger = logging.getLogger("aiter_gemm")
    misses, saved = _MissLines(), (logger.handlers[:], logger.level, logger.propagate)
    logger.handlers, logger.propagate = [misses], False  # the only way out while the table prints
    logger.setLevel(logging.INFO)
    try:
        print(f"{len(keys)} shapes from {args.shapes} on {ident.gfx} ({ident.cu_num} {units})")
        print(f"{'M':>6} {'N':>6} {'K':>6} {'bias':>5} {'dtype':>15} {'libtype':>9} {'matched':>11} "
              f"{'1st ms':>8}  source")
        weights: dict[tuple, torch.Tensor] = {}  # one random weight per (N, K, dtype): lm_head's is 1 GB in bf16
        for M, N, K, bias, dtype, otype, scale_ab, bpre in keys:
            if scale_ab or bpre:
                continue
            x = torch.randn(M, K, dtype=dtype, device=args.device)
            w = weights.get((N, K, dtype))
            if w is None:
                w = weights[(N, K, dtype)] = torch.randn(N, K, dtype=dtype, device=args.device)
            b = torch.randn(N, dtype=dtype, device=args.device) if bias else None
            t0 = time.perf_counter()
            out = aiter_gemm.gemm_a16w16(x, w, b, otype=otype if otype != dtype else None)
            ms = (time.perf_counter() - t0) * 1e3  # the first call: the decision included
            assert out.shape == (M, N)
            cfg = aiter_gemm.get_GEMM_A16W16_config(M, N, K, bias, dtype, out.dtype)
            print(f"{M:6d} {N:6d} {K:6d} {bias!s:>5} {str(dtype):>15} {cfg['libtype']:>9} {cfg['matched']:>11} "
                  f"{ms:8.2f}  {cfg['source']}")
    finally:
        logger.handlers, logger.propagate = saved[0], saved[2]
        logger.setLevel(saved[1])
    if misses.lines:
        print(f"{len(misses.lines)} shape(s) matched no tuned row and ran the default; for each, aiter_gemm logs "
              f"AITER's INFO line, e.g.\n  {misses.lines[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
