"""Compiling the exploration's CUDA C++ kernels (``tcgemv.cu``, ``clgemv.cu``): NVRTC at run time through torch, or
cubins built ahead with nvcc on a machine without a GPU, loaded by name (faster: no compile on the GPU's clock)."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

_COMMON = Path(__file__).with_name("cuda_common.cuh")


def with_common(defines: dict[str, int], kernel_src: Path) -> str:
    """A kernel's source: its ``#define``s, then ``cuda_common.cuh`` (shared device helpers), then the kernel file."""
    return "".join(f"#define {k} {v}\n" for k, v in defines.items()) + _COMMON.read_text() + kernel_src.read_text()


def load_kernel(src: str, entry: str, cubin: Path | None, smem_bytes: int):
    """The kernel ``entry`` of ``src``: from ``cubin`` if that file exists, else compiled by NVRTC; its dynamic
    shared memory limit raised to ``smem_bytes``."""
    if cubin is not None and cubin.exists():
        from torch.cuda._utils import _cuda_load_module
        kern = _cuda_load_module(cubin.read_bytes(), [entry])[entry]
    else:
        # NVRTC optimises by default (it rejects -O3); -default-device: lambdas in device code are device code
        kern = torch.cuda._compile_kernel(src, entry, nvcc_options=["-default-device"])
    kern.set_shared_memory_config(smem_bytes)
    return kern


def build_cubins(jobs: Iterable[tuple[Path, Callable[[], str]]], workers: int = 2) -> None:
    """nvcc ``-arch=sm_90`` each (destination, source maker) whose cubin does not exist yet (a CPU machine can do this
    ahead of a GPU run)."""
    def one(job):
        dst, make_src = job
        if dst.exists():
            return
        dst.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", suffix=".cu") as f:
            f.write(make_src())
            f.flush()
            subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-O3", "-x", "cu", "-o", str(dst), f.name], check=True)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, list(jobs)))
