"""Device identity ``(gfx, cu_num)``: the arch name and compute-unit count that key tuned rows.

ROCm gives the gfx arch (``gfx942``) and CU count, CUDA gives ``sm_<major><minor>`` and the SM count, CPU gives
``cpu`` and the core count. ``AITER_GEMM_ARCH`` / ``AITER_GEMM_CU_NUM`` override either field so configs tuned on one
device can be used or tested on another; they are read once by :mod:`aiter_gemm.settings`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeviceIdentity:
    """What a tuned row is keyed on: ``gfx`` (arch name) and ``cu_num`` (CUs / SMs / cores)."""

    gfx: str
    cu_num: int
    kind: str  # "cuda", "hip" or "cpu": which vendor code paths apply
    name: str = ""  # marketing name, for logs and benchmark CSVs only

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("cuda", "hip")


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


def apply_overrides(ident: DeviceIdentity, arch: str | None, cu_num: int | None) -> DeviceIdentity:
    """Replace gfx and/or cu_num by the environment overrides, keeping the real vendor kind."""
    return DeviceIdentity(arch or ident.gfx, ident.cu_num if cu_num is None else cu_num, ident.kind, ident.name)
