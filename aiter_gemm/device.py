"""Device identity ``(gfx, cu_num)`` and the device facts kernels and configs depend on.

Identity: ROCm gives the gfx arch (``gfx942``) and CU count, CUDA gives ``sm_<major><minor>`` and the SM count, CPU
gives ``cpu`` and the core count. ``AITER_GEMM_ARCH`` / ``AITER_GEMM_CU_NUM`` override either field so configs tuned
on one device can be used or tested on another; they are read once by :mod:`aiter_gemm.settings`.

Facts (one table each, used by every backend and tuner): shared memory per block, TMA support, and the SM count
heuristics assume when they must reason about a GPU they are not running on (the CPU interpreter in tests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

# Shared memory one block may use, by arch (bytes). Hopper / Blackwell: 227 KiB; Ampere A100: 163 KiB; Ada and
# consumer parts: 99 KiB; CDNA3 (MI300): 64 KiB LDS; CDNA4 (MI350): 160 KiB. Unknown GPUs get the conservative
# 99 KiB; the CPU interpreter has no limit worth modelling.
SMEM_PER_BLOCK: dict[str, int] = {
    "sm_90": 227 * 1024, "sm_100": 227 * 1024, "sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024,
    "gfx942": 64 * 1024, "gfx950": 160 * 1024, "cpu": 1 << 30,
}
DEFAULT_SMEM_PER_BLOCK = 99 * 1024
# SM / CU counts of the parts each arch name usually means, for search spaces and heuristics given an arch but no
# count. 132: the H100 SXM (and H200) every sm_90 heuristic here was measured on.
TYPICAL_CU: dict[str, int] = {"sm_90": 132, "gfx942": 304, "gfx950": 256}
DEFAULT_CU = 108  # an A100: the smallest datacenter part a heuristic should still fill
#: The device the heuristics were measured on (H100 SXM): what "a GPU" means where none is present (CPU tests).
REFERENCE_ARCH = "sm_90"
REFERENCE_CU = TYPICAL_CU[REFERENCE_ARCH]


def smem_limit(arch: str) -> int:
    """Bytes of shared memory one block may use on ``arch``."""
    return SMEM_PER_BLOCK.get(arch, DEFAULT_SMEM_PER_BLOCK)


def has_tma(arch: str) -> bool:
    """NVIDIA sm_90 and newer have TMA (the bulk tensor copy engine)."""
    if not arch.startswith("sm_"):
        return False
    digits = "".join(ch for ch in arch[3:] if "0" <= ch <= "9")  # ASCII: isdigit() takes other scripts' digits
    return bool(digits) and int(digits) >= 90


def typical_cu(arch: str, cu_num: int | None = None) -> int:
    """``cu_num`` when given, else the usual SM/CU count of ``arch``."""
    return cu_num or TYPICAL_CU.get(arch, DEFAULT_CU)


@dataclass(frozen=True)
class DeviceIdentity:
    """What a tuned row is keyed on: ``gfx`` (arch name) and ``cu_num`` (CUs / SMs / cores)."""

    gfx: str
    cu_num: int
    kind: str  # "cuda", "hip" or "cpu": which vendor code paths apply
    name: str = ""  # the name torch reports ("NVIDIA H100 80GB HBM3"), or AITER_GEMM_DEVICE_NAME's

    @property
    def device_name(self) -> str:
        """The name as file names and key columns hold it: spaces as ``_`` (SGLang's ``device_name=``), so the H100
        and the H200, both ``(sm_90, 132)``, are told apart."""
        return "_".join(self.name.split())

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("cuda", "hip")

    @property
    def heuristic_cu(self) -> int:
        """The SM/CU count heuristics should assume: this GPU's, or the reference GPU's on CPU (interpreter tests
        then pick the configs an H100 would)."""
        return self.cu_num if self.is_gpu else REFERENCE_CU

    def torch_device(self) -> torch.device:
        """The torch device this identity stands for in this process: the current CUDA device for a CUDA GPU, else
        the device of its kind (``cpu``)."""
        if self.kind == "cuda" and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device(self.kind)


def probe_gpu(index: int | None = None) -> DeviceIdentity | None:
    """Identity of CUDA/ROCm device ``index`` (default: current), or None when there is no GPU."""
    if not torch.cuda.is_available():
        return None
    idx = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(idx)
    if torch.version.hip is not None:
        gfx = getattr(props, "gcnArchName", "gfx").split(":")[0]
        return DeviceIdentity(gfx, int(props.multi_processor_count), "hip", props.name)
    return DeviceIdentity(f"sm_{props.major}{props.minor}", int(props.multi_processor_count), "cuda", props.name)


def probe_cpu() -> DeviceIdentity:
    return DeviceIdentity("cpu", os.cpu_count() or 1, "cpu", "cpu")


def apply_overrides(ident: DeviceIdentity, arch: str | None, cu_num: int | None,
                    name: str | None = None) -> DeviceIdentity:
    """Replace gfx, cu_num and/or the device name by the environment overrides, keeping the real vendor kind."""
    return DeviceIdentity(arch or ident.gfx, ident.cu_num if cu_num is None else cu_num, ident.kind,
                          name or ident.name)

