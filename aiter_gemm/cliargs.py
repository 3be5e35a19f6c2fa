"""argparse types the package's programs share (the tuners, ``kernel_check``, the demo, the examples, the benchmark
harness): each refuses a value no run can use when the command line is parsed, so a bad flag is argparse's usage and
one line naming it (exit 2), never a traceback or a run that fails later."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import torch

from aiter_gemm.configs import parse_int
from aiter_gemm.fileio import file_problem


def _number(convert: Callable[[str], float], ok: Callable[[float], bool], what: str) -> Callable[[str], float]:
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    parse.__name__ = what  # argparse names the type in some messages
    return parse


positive_int = _number(parse_int, lambda v: v >= 1, "an integer >= 1")
non_negative_int = _number(parse_int, lambda v: v >= 0, "an integer >= 0")
non_negative_float = _number(float, lambda v: v >= 0 and math.isfinite(v), "a number >= 0")
positive_float = _number(float, lambda v: v > 0 and math.isfinite(v), "a number > 0")
fraction = _number(float, lambda v: 0 <= v <= 1, "a number from 0 to 1")
gain = _number(float, lambda v: 1 <= v and math.isfinite(v), "a number >= 1.0")


def existing_file(text: str) -> str:
    """A path to a readable file (a missing one is refused when parsed, not after a run of failures)."""
    why = file_problem(text)
    if why is not None:
        raise argparse.ArgumentTypeError(f"{text}: {why}")
    return text


def int_list(text: str) -> list[int]:
    """Comma- or space-separated integers (ASCII digits: :func:`aiter_gemm.configs.parse_int`)."""
    try:
        return [parse_int(x.strip()) for x in text.replace(" ", ",").split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def positive_int_list(text: str) -> list[int]:
    """Comma- or space-separated integers >= 1 (token counts, batch sizes)."""
    values = int_list(text)
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return values


def device_arg(text: str) -> torch.device:
    """``cpu``, or ``cuda[:N]`` naming a GPU this process sees (a missing GPU is a usage error, not a traceback at
    the first tensor)."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    if device.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise argparse.ArgumentTypeError(f"{text}: this machine has no CUDA GPU (use --device cpu)")
        if device.index is not None and device.index >= n:
            raise argparse.ArgumentTypeError(f"{text}: this process sees {n} CUDA GPU(s), cuda:0 to cuda:{n - 1}")
    return device
