"""Bisect a failing wsgemm_cluster launch on the GPU (each case in its own process: a fault poisons the context).

Cases: ``probe`` (a kernel that stores each CTA's %ctaid.x, %cluster_ctarank and %cluster_nctarank, launched through
:func:`wsgemm_cluster.launch_in_clusters`: does the launch form clusters?), then one cluster config as built (D0),
without the cluster barrier (D5), without the DSMEM exchange (D6), without the epilogue (D4); ``--sanitize`` reruns
the first failing config under compute-sanitizer when it is installed.

  python op_tests/op_benchmarks/explore_decode_mid/debug_wscl.py [--cfg NAME] [--shape MxNxK] [--sanitize]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)

PROBE = """
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from op_tests.op_benchmarks.explore_decode_mid import wsgemm_cluster as wscl

@gluon.jit
def probe(out_ptr):
    L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    pid = gl.program_id(0)
    i = gl.arange(0, 128, layout=L)
    rank = gl.inline_asm("mov.u32 $0, %cluster_ctarank;", "=r", [], gl.int32, is_pure=True)
    n = gl.inline_asm("mov.u32 $0, %cluster_nctarank;", "=r", [], gl.int32, is_pure=True)
    gl.store(out_ptr + pid * 3 + i, gl.where(i == 0, pid, gl.where(i == 1, rank, n)), mask=i < 3)

out = torch.full((8, 3), -1, dtype=torch.int32, device="cuda")
wscl.launch_in_clusters(probe, 4, 2, (out, ), dict(num_warps=4))
torch.cuda.synchronize()
print("probe (ctaid.x, cluster_ctarank, cluster_nctarank):", out.tolist())
"""

CASE = """
import torch
from op_tests.op_benchmarks.explore_decode_mid import wsgemm as ws
from op_tests.op_benchmarks.explore_decode_mid.test_explore_kernels import reference
cfg = ws.WsGemmConfig.from_name({name!r})
M, N, K = {shape}
torch.manual_seed(0)
a = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
b = torch.randn(N, K, dtype=torch.bfloat16, device="cuda")
out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
ws.launch_wsgemm(a, b, None, out, cfg)
torch.cuda.synchronize()
err = ((out.float() - reference(a, b).float()).abs().max() / reference(a, b).float().abs().max()).item()
print(cfg.name, "ran; max rel err", err)
"""


def run(code: str, timeout: int, prefix=()) -> tuple[int, str]:
    """Run ``code`` from a file in ROOT (Triton's JIT reads kernels' source from their file)."""
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".py", dir=ROOT, prefix="_dbg_", delete=False) as f:
        f.write(f"import sys; sys.path.insert(0, {ROOT!r})\n" + code)
    try:
        p = subprocess.run([*prefix, sys.executable, f.name], cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout)
        return p.returncode, (p.stdout + p.stderr)[-2500:]
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout}s (a hang)"
    finally:
        os.unlink(f.name)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cfg", default="WS_BN64_BM16_BK64_SK2_W4_S4_P4_CL2")
    ap.add_argument("--shape", default="16x128x256")
    ap.add_argument("--sanitize", action="store_true")
    args = ap.parse_args()
    shape = tuple(int(x) for x in args.shape.split("x"))
    rc, log = run(PROBE, 120)
    print(f"== probe rc={rc}\n{log}", flush=True)
    failing = None
    for d in (0, 5, 6, 4):
        from op_tests.op_benchmarks.explore_decode_mid import wsgemm as ws
        base = ws.WsGemmConfig.from_name(args.cfg)
        name = ws.WsGemmConfig(**{**base.__dict__, "D": d}).name
        rc, log = run(CASE.format(name=name, shape=shape), 120)
        print(f"== {name} rc={rc}\n{log}", flush=True)
        if rc != 0 and failing is None:
            failing = name
    san = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if args.sanitize and failing and os.path.exists(san):
        rc, log = run(CASE.format(name=failing, shape=shape), 300, prefix=(san, "--print-limit", "5"))
        print(f"== compute-sanitizer {failing} rc={rc}\n{log}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
