"""Helpers shared by the runtime tests: a recording fake backend and tuned-CSV writers."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import torch.nn.functional as F

from aiter_gemm.backends import Backend

BF16_HEADER = "gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,kernelName\n"


class FakeBackend(Backend):
    """Runs F.linear and records every (problem, solution) it prepared; knobs for default/blaslt/rejection."""

    def __init__(self, name: str, *, default_max_m: int = 0, priority: int = 0, blaslt: bool = False,
                 reject_solidx: int | None = None) -> None:
        self.name = name
        self.default_priority = priority
        self.is_blaslt = blaslt
        self.default_max_m = default_max_m
        self.reject_solidx = reject_solidx
        self.prepared: list = []
        self.calls = 0

    def prepare(self, problem, solution, device):
        if self.reject_solidx is not None and solution.solidx == self.reject_solidx:
            return None
        self.prepared.append((problem, solution))

        def run(a, b, bias, otype, scale_a, scale_b, scale_c):
            self.calls += 1
            return F.linear(a, b, bias).to(otype)

        return run

    def default_for(self, problem, device):
        from aiter_gemm.backends.base import Solution

        if problem.M <= self.default_max_m or (self.is_blaslt and problem.bpreshuffle):
            return Solution(self.name, -1, 0, "fake-default")
        return None


def bf16_row(M, N, K, libtype="torch", us=1.0, *, gfx=None, cu_num=None, bias=False, dtype="torch.float32",
             outdtype=None, solidx=0, kernel="k") -> str:
    """A tuned row, by default for the device this process dispatches on (the GPU if any, else the CPU)."""
    import aiter_gemm

    ident = aiter_gemm.current_device_identity()
    gfx = ident.gfx if gfx is None else gfx
    cu = ident.cu_num if cu_num is None else cu_num
    return (f"{gfx},{cu},{M},{N},{K},{bias},{dtype},{outdtype or dtype},False,False,{libtype},{solidx},0,{us},"
            f"{kernel}\n")


def sigkill_after_rows(cmd: list[str], env: dict, cwd, path, rows: int, timeout: float = 120.0) -> None:
    """Start ``cmd`` and SIGKILL it once the CSV at ``path`` holds ``rows`` data rows (it must not finish first)."""
    from aiter_gemm.fileio import read_csv_rows

    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists() and len(read_csv_rows(path)[1]) >= rows:
                break
            assert proc.poll() is None, "the tuner finished before it could be killed"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
