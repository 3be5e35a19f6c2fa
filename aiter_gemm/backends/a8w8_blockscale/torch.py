"""Backend ``torch`` of ``gemm_a8w8_blockscale``: torch's block-scaled ``F.scaled_mm`` (cuBLASLt on Hopper), see
:mod:`aiter_gemm.kernels.a8w8_blockscale_torch`. One solution, ``kernelName`` ``scaled_mm_blockwise``; it runs where
that module's :func:`~aiter_gemm.kernels.a8w8_blockscale_torch.unavailable_reason` (this torch, this device) and
:func:`~aiter_gemm.kernels.a8w8_blockscale_torch.shape_error` (the layouts verified on the H100) allow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from aiter_gemm.backends.a8w8_blockscale import solution_of
from aiter_gemm.backends.base import GemmProblem, LibraryCallBackend, Solution
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl
from aiter_gemm.kernels.a8w8_blockscale import decode_config

SOLUTION = solution_of(torch_impl.TorchBlockwise())


#: Where our Triton default config stays the default below torch's (H100 sweep, BENCHMARKS.md): the
#: largest M per weight size (N * K elements) at which it was faster than torch's block-scaled matmul by >= 5% on
#: every measured (N, K): 10 DeepSeek-V3 and Llama-3-70B weights, M in 1..4096. Above it torch's is the default.
TRITON_BELOW: tuple[tuple[int, int], ...] = ((4 << 20, 500), (16 << 20, 256), (1 << 62, 16))
#: Device classes that sweep ran on; on others torch's matmul is the default wherever it runs (no data for Triton).
MEASURED_ON = frozenset({("sm_90", 132)})


def triton_stays_default(M: int, N: int, K: int, device: DeviceIdentity) -> bool:
    """Whether the Triton default config keeps shape (M, N, K) on ``device``: :data:`TRITON_BELOW`, or a measured
    decode tile (:func:`~aiter_gemm.kernels.a8w8_blockscale.decode_config`)."""
    if (device.gfx, device.cu_num) not in MEASURED_ON:
        return False
    if decode_config(M, N, K, device.name) is not None:
        return True
    return M <= next(m for w, m in TRITON_BELOW if N * K <= w)


class BlockscaleTorchBackend(LibraryCallBackend):
    name = torch_impl.LIBTYPE
    solution = SOLUTION
    default_priority = 10  # above the Triton default config where it claims a shape (default_for)
    x_scale_m_major = True  # cuBLASLt takes x_scale M-major; row-major costs a transposing copy per call

    def library_why(self, device: torch.device | None) -> str | None:
        """:func:`~aiter_gemm.kernels.a8w8_blockscale_torch.unavailable_reason` on a decision's device (this
        machine as a whole: None, torch's op being importable everywhere)."""
        return None if device is None else torch_impl.unavailable_reason(device)

    def problem_why(self, problem: GemmProblem, arch: str) -> str | None:
        """:func:`~aiter_gemm.kernels.a8w8_blockscale_torch.shape_error` (the layouts verified on the H100), whatever
        this torch and this device can run."""
        return torch_impl.shape_error(problem.M, problem.N, problem.K, problem.otype)

    def prepare(self, problem: GemmProblem, solution: Solution, device: DeviceIdentity):
        """A runner bound to the shape (:func:`~aiter_gemm.kernels.a8w8_blockscale_torch.launcher`: on a GPU, torch's
        cuBLASLt call with its plan cached where nvmath-python allows)."""
        if self.why_not(problem, solution, device) is not None:
            return None
        return torch_impl.launcher(problem.M, problem.N, problem.K, problem.otype, device.torch_device())

    def describe(self, solution: Solution) -> dict[str, Any]:
        return torch_impl.TorchBlockwise().to_json()

    def parse_json_entry(self, entry: Mapping[str, Any]) -> Solution:
        """``{"libtype": "torch", "kernelName": "scaled_mm_blockwise"}``, exactly."""
        return solution_of(torch_impl.TorchBlockwise.from_json(dict(entry)))

    def default_for(self, problem: GemmProblem, device: DeviceIdentity) -> Solution | None:
        """torch's matmul where the sweep found it faster than our Triton default (the dispatcher checks it can
        run here); ``no untuned FP8 shape slower than torch's path by more than 2%`` (issue 13) holds there."""
        if not device.is_gpu or triton_stays_default(problem.M, problem.N, problem.K, device):
            return None
        return SOLUTION

    def eager_default_for(self, problem: GemmProblem, device: DeviceIdentity) -> Solution | None:
        """Every shape on a GPU: eager calls pay the Triton launcher, which loses wherever this path runs (H100
        host, 23 Triton-decided shapes: median 114 us per eager call, 0.83x this path's 85 us; held-out run 0)."""
        return SOLUTION if device.is_gpu else None


BACKEND = BlockscaleTorchBackend()
