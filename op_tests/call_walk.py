"""Which runtime files a first GEMM call runs: ``sys.setprofile`` over the first call of an op after import, in a
fresh process, recording every function of ``aiter_gemm/`` that runs (module bodies of what the call imports
included) and whether it ran inside the dispatcher's decision (docs/design.md, "One call through the files").

``python -m op_tests.call_walk`` prints each scenario's file count and files in first-run order;
:func:`walk` is what op_tests/test_call_walk.py checks.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: A Triton bf16 row naming no kernel (AITER's convention: the JSON level fills it in), and a block-scale shape a
#: JSON bucket serves: the two paths through the JSON level.
SCENARIOS = ("gemm_a16w16", "gemm_a8w8_blockscale")

_CHILD = textwrap.dedent("""
    import json, os, sys
    import torch
    tmp, op = sys.argv[1], sys.argv[2]
    cu = os.cpu_count()
    os.environ["AITER_GEMM_TRITON_CONFIGS"] = tmp
    entry = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, NUM_KSPLIT=1, num_warps=4,
                 num_stages=2)
    with open(os.path.join(tmp, "cpu-GEMM-A16W16-N=64-K=64.json"), "w") as f:
        json.dump({"any": entry}, f)
    with open(os.path.join(tmp, "bf16.csv"), "w") as f:
        f.write("gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,kernelName,"
                "err_ratio,tflops,bw\\n")
        f.write(f"cpu,{cu},8,64,64,False,torch.bfloat16,torch.bfloat16,False,False,triton,0,0,1.0,,0,0,0\\n")
    with open(os.path.join(tmp, "cpu-GEMM-A8W8_BLOCKSCALE-N=128-K=256.json"), "w") as f:
        json.dump({"any": {"variant": "base", "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 128,
                           "GROUP_SIZE_M": 2, "NUM_KSPLIT": 1, "num_warps": 4, "num_stages": 2}}, f)
    os.environ["AITER_CONFIG_GEMM_BF16"] = os.path.join(tmp, "bf16.csv")
    import aiter_gemm
    if op == "gemm_a16w16":
        fn = aiter_gemm.gemm_a16w16
        args = (torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(64, 64, dtype=torch.bfloat16))
    else:
        from aiter_gemm.kernels.a8w8_blockscale import quantize_blockscale
        fn = aiter_gemm.gemm_a8w8_blockscale
        args = quantize_blockscale(torch.randn(8, 256), torch.randn(128, 256))
    root = os.path.join(os.path.dirname(os.path.abspath(aiter_gemm.__file__)), "")
    seen, stack = {}, []

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call":
            inside = bool(stack) or (code.co_name == "_decide" and code.co_filename.endswith("dispatch.py"))
            stack.append(inside) if stack or inside else None
            if code.co_filename.startswith(root):
                key = (code.co_filename[len(root):], code.co_name)
                seen.setdefault(key, inside)
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    out = fn(*args)
    sys.setprofile(None)
    fp8 = (False, torch.float8_e4m3fn, torch.bfloat16) if op != "gemm_a16w16" else ()
    label = aiter_gemm.get_dispatcher(op).decide(aiter_gemm.GemmProblem(8, *out.shape[1:], args[0].shape[1], *fp8),
                                                 False)
    print(json.dumps({"calls": [[f, n, i] for (f, n), i in seen.items()], "matched": label.matched,
                      "libtype": label.solution.libtype, "kernelName": label.solution.kernelName}))
""")


def walk(op: str, root: Path = REPO) -> dict:
    """The first call of ``op`` (one of :data:`SCENARIOS`) in a fresh process run from ``root``: ``calls``, the
    runtime functions it ran as ``[file relative to aiter_gemm/, function, ran inside Dispatcher._decide]`` in
    first-run order, and the decision's ``matched``, ``libtype`` and ``kernelName``."""
    env = {"PYTHONPATH": str(root), "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "",
           "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run([sys.executable, "-c", _CHILD, tmp, op], cwd=root, env=env, capture_output=True,
                             text=True, timeout=600)
    if res.returncode:
        raise RuntimeError(f"first call of {op} failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def files_of(result: dict) -> list[str]:
    """The runtime files a walk ran functions of, in first-run order."""
    return list(dict.fromkeys(f for f, _name, _inside in result["calls"]))


def main() -> None:
    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else REPO
    for op in SCENARIOS:
        result = walk(op, root)
        files = files_of(result)
        print(f"{op}: {len(files)} files ({result['matched']} {result['libtype']} {result['kernelName']})")
        for f in files:
            print(f"  {f}")


if __name__ == "__main__":
    main()
