"""The weight-read floor: how long streaming a weight's bytes once takes on this GPU, with no math and no output.

A memory-bound GEMM (decode) cannot run faster than reading its weight, and at tens of MB that read stays well
below the copy bandwidth of a large buffer (launch, ramp and tail are a fixed ~2-3.5 us): on the H100 this kernel
read 17-262 MB weights at 0.73-0.985 of the 256 MiB copy bandwidth, within 0.5% of the best of 30 read kernels
(programs x block x warps) and of torch's copy on every one (``benchmarks/results/fp8/decode_limits_h100/``). The
benchmark's ``weight_read`` provider times it, so a decode kernel's time reads as a fraction of what is attainable.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

#: 4 programs per SM reading 4 KB a step with 4 warps: the best or within 0.5% of it on all 8 weights measured.
PROGRAMS_PER_SM = 4
BLOCK = 1024  # int32 words a step
NUM_WARPS = 4


@triton.jit
def _read_kernel(src, out, n, n_per, BLOCK: tl.constexpr):
    """Program p XOR-folds words [p * n_per, (p + 1) * n_per) of ``src`` into its BLOCK-wide slot of ``out`` (the
    store keeps the loads from being dropped)."""
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * n_per
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for i in tl.range(0, n_per, BLOCK, num_stages=4):
        offs = start + i + tl.arange(0, BLOCK)
        acc ^= tl.load(src + offs, mask=offs < n, other=0)
    tl.store(out + pid * BLOCK + tl.arange(0, BLOCK), acc)


def words(weight: torch.Tensor) -> torch.Tensor:
    """``weight``'s bytes as int32 words; ValueError naming the tensor's shape, dtype and strides if it is not
    contiguous or its size is not a multiple of 4 bytes."""
    nbytes = weight.numel() * weight.element_size()
    if not weight.is_contiguous() or nbytes % 4:
        raise ValueError(f"the weight read needs a contiguous tensor of a multiple of 4 bytes, got shape "
                         f"{tuple(weight.shape)} dtype {weight.dtype} stride {weight.stride()}")
    return weight.view(torch.uint8).view(-1).view(torch.int32)


def programs(device: torch.device) -> int:
    """Programs of one read: :data:`PROGRAMS_PER_SM` per SM (4 on a CPU, where only the interpreter runs it)."""
    if device.type != "cuda":
        return 4
    return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def _words_per_program(n: int, progs: int) -> int:
    """Each program's share of ``n`` words, rounded up to whole steps (the last programs may read past the end:
    masked)."""
    return triton.cdiv(triton.cdiv(n, progs), BLOCK) * BLOCK


def folds(device: torch.device) -> torch.Tensor:
    """An output of one read on ``device``: the (programs, BLOCK) int32 XOR folds."""
    return torch.empty((programs(device), BLOCK), dtype=torch.int32, device=device)


def bind(weight: torch.Tensor, out: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
    """The read of ``weight`` with its launch fixed (words, grid, share per program, output): calling it launches the
    kernel and nothing else, so a timed call pays no host work of its own. ``out`` (:func:`folds`), shared between
    reads if given."""
    src = words(weight)
    progs = programs(weight.device)
    if out is None or out.numel() != progs * BLOCK:
        out = folds(weight.device)
    n = src.numel()
    n_per = _words_per_program(n, progs)

    def read() -> torch.Tensor:
        _read_kernel[(progs,)](src, out, n, n_per, BLOCK=BLOCK, num_warps=NUM_WARPS)
        return out

    return read


def read_weight(weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Stream ``weight``'s bytes once; returns the (programs, BLOCK) int32 XOR folds (``out`` reused if given)."""
    return bind(weight, out)()


def read_weight_ref(weight: torch.Tensor) -> torch.Tensor:
    """What :func:`read_weight` returns, in torch: program p's words folded by XOR per position within a step."""
    src = words(weight)
    progs = programs(weight.device)
    n = src.numel()
    n_per = _words_per_program(n, progs)
    padded = torch.zeros(progs * n_per, dtype=torch.int32, device=weight.device)
    padded[:n] = src
    folded = padded.view(progs, n_per // BLOCK, BLOCK)
    out = torch.zeros((progs, BLOCK), dtype=torch.int32, device=weight.device)
    for step in range(folded.shape[1]):
        out ^= folded[:, step]
    return out
