"""Kernels compiled for sm_90 on a machine without a GPU, as Triton's JIT would specialize each recorded launch: what
the bound-launch tests (test_blockscale_bound, test_moe_bound) read as Triton's ``CompiledKernel``. Compiling runs
in a fresh interpreter (the tests' own runs Triton's interpreter, which cannot compile)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from op_tests.runtime_helpers import REPO

#: The child's exit status where this Triton cannot compile for sm_90 (the tests skip).
CANNOT_COMPILE = 3

_SCRIPT = """
import json, sys
{setup}
from op_tests.sm90_compile import compile_calls
json.dump({{case: compile_calls(calls_of(case)) for case in CASES}}, sys.stdout)
"""


def compile_calls(calls) -> list[dict]:  # noqa: ANN001 - recorded (kernel, grid, kwargs) launches
    """Each recorded launch compiled for sm_90 (in the child): its metadata, signature, argument names and PTX."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    kernels = []
    for fn, _grid, kwargs in calls:  # as the JIT specializes and compiles the launch
        bound, spec, options = create_function_from_signature(fn.signature, fn.params, backend)(**kwargs)
        options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, options)
        try:
            k = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
        except Exception as exc:  # noqa: BLE001 - this Triton cannot compile for sm_90 here
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            sys.exit(CANNOT_COMPILE)
        meta = {f: getattr(k.metadata, f) for f in k.metadata._fields if f != "target"}
        kernels.append({"meta": meta, "signature": k.src.signature, "arg_names": k.src.fn.arg_names,
                        "ptx": k.asm["ptx"]})
    return kernels


def compiled_cases(setup: str, what: str) -> dict[str, list[SimpleNamespace]]:
    """case -> its launches compiled for sm_90, as stand-ins of ``CompiledKernel`` (metadata, asm["ptx"],
    src.signature, src.fn.arg_names). ``setup`` is child code defining ``CASES`` and ``calls_of(case)`` (the
    recorded launches of one case); skips where Triton cannot compile for sm_90, fails naming ``what`` otherwise."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _SCRIPT.format(setup=setup)], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=900)
    if res.returncode == CANNOT_COMPILE:
        pytest.skip(f"Triton cannot compile for sm_90 here: {res.stderr[-800:]}")
    assert res.returncode == 0, f"{what} failed: {res.stderr[-2000:]}"
    return {case: [SimpleNamespace(metadata=SimpleNamespace(**k["meta"]), asm={"ptx": k["ptx"]},
                                   src=SimpleNamespace(signature=k["signature"],
                                                       fn=SimpleNamespace(arg_names=k["arg_names"])))
                   for k in kernels] for case, kernels in json.loads(res.stdout).items()}
