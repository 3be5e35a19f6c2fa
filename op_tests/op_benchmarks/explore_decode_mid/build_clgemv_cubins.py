"""Build the clgemv cubins an exploration run needs, ahead, on a machine without a GPU (nvcc -arch=sm_90): every
config of ``clgemv.grid_configs`` for the given shapes, and its diagnostic twins (``--diag``: D2-D5).

  python op_tests/op_benchmarks/explore_decode_mid/build_clgemv_cubins.py 64x4096x4096,32x1280x8192 .tccubins/cl
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from op_tests.op_benchmarks.explore_decode_mid import clgemv as cl  # noqa: E402


def main() -> int:
    shapes = [tuple(int(x) for x in s.split("x")) for s in sys.argv[1].split(",")]
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / ".tccubins" / "cl"
    jobs = set()
    for M, N, K in shapes:
        cfgs = cl.grid_configs(M, N, K, 132)
        print(f"{M}x{N}x{K}: {len(cfgs)} configs", flush=True)
        for c in cfgs:
            jobs.add((c, K))
            for d in (2, 3, 4, 5) if c.S > 1 else (3, 4, 5):
                jobs.add((dataclasses.replace(c, D=d), K))
    cl.build_cubins(sorted(jobs, key=lambda t: (t[1], t[0].name)), out, jobs=2)
    print(f"{len(jobs)} cubins in {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
