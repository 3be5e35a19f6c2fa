"""One solution of an op on one problem, outside a model: the op's inputs and float32 reference
(:attr:`~aiter_gemm.opspec.OpSpec.make_inputs`, built as :class:`Inputs`), whether they fit the device
(:func:`inputs_memory`), and a solution's runner prepared through the runtime's dispatcher (:func:`prepare_runner`).
What ``python -m aiter_gemm.kernel_check``, the tuner's workers and the benchmarks share.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from aiter_gemm.backends.base import Problem, Solution
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.dispatch import dispatcher_for
from aiter_gemm.registry import op_spec

#: A solution standing for whatever the runtime's heuristic default runs for a shape (resolved by
#: :func:`prepare_runner`): what the tuner confirms a winner against.
DEFAULT = Solution("<default>", -1, 0, "")


@dataclass
class Inputs:
    """One shape's rotating input sets (each a tuple the op's :attr:`~aiter_gemm.opspec.OpSpec.call_runner`
    takes) and set 0's float32 reference output; ``key`` names what they were made for (the tuner's worker caches
    them by it)."""

    key: tuple
    sets: list[tuple]
    ref: torch.Tensor


def cloned_sets(first: tuple, n: int) -> list[tuple]:
    """``first`` and ``n - 1`` copies (tensors cloned with their strides, other values shared): rotating sets."""

    def clone(v: Any) -> Any:
        return v.clone(memory_format=torch.preserve_format) if isinstance(v, torch.Tensor) else v

    return [first] + [tuple(clone(v) for v in first) for _ in range(n - 1)]


def prepare_runner(op: str, p: Problem, sol: Solution, identity: DeviceIdentity, eager: bool = False
                   ) -> tuple[Any, Solution, str | None]:
    """A runner of ``sol`` for ``p`` through the runtime dispatcher's public API (the one way a candidate becomes a
    runner, for the tuner's workers and ``kernel_check``): (runner, the solution it runs, None) or (None, sol, why
    not). :data:`DEFAULT` resolves to the dispatcher's default decision (as eager calls see it with ``eager``), any
    other solution to :meth:`~aiter_gemm.dispatch.Dispatcher.runner_for` (the runtime's rule)."""
    disp = dispatcher_for(op_spec(op))
    if sol == DEFAULT:
        dec = disp.default_decision(p, identity, eager=eager)
        return dec.runner, dec.solution, None
    runner, why = disp.runner_for(p, sol, identity)
    if runner is None:
        return None, sol, (why if why.startswith("backend ") else
                           f"{sol.kernelName or sol.libtype} cannot run {p.label()} here: {why}")
    return runner, sol, None


def inputs_memory(p: Problem, device: torch.device) -> tuple[bool, str | None]:
    """(whether ``p``'s inputs can fit on ``device``, what they need against what it has; None where its memory is
    unknown). Every op's inputs start as float32 operands and end with a float32 reference (``p.inputs_bytes()``): a
    lower bound of what they take. The tuner's workers and ``kernel_check --shape`` check it before allocating."""
    need, what = p.inputs_bytes()
    have, how = device_memory(device)
    if have is None:
        return True, None
    return need <= have, (f"inputs need at least {need / 1e9:.1f} GB ({what}), {device.type} has "
                          f"{have / 1e9:.1f} GB {how}")


def device_memory(device: torch.device) -> tuple[int | None, str]:
    """Bytes ``device`` can give a shape's inputs and what they are: a GPU's free memory, the CPU's physical memory
    (its free pages undercount what the page cache would give back); None where unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0], "free"
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "in total"
    except (AttributeError, ValueError, OSError):  # not POSIX
        return None, ""


def free_memory(device: torch.device) -> int | None:
    """Free bytes of a GPU (what rotating input sets may take a fraction of); None on CPU."""
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
