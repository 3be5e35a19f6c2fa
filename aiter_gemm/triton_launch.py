"""Bound Triton launches: a compiled Triton kernel launched from C++ (``csrc/triton_launch.cpp``) with
``cuLaunchKernel``, without Triton's Python launcher.

Why: Triton's launcher binds and specializes the arguments, builds the cache key, looks the kernel up and its C
launcher queries the driver per pointer; that cost an eager activation-quantizer call 30-54 us of host time on the
H200 host (issue 53), several times the kernel. A plan (:func:`bind`) is one launch of one ``CompiledKernel`` with
the arguments of the Triton launch that made it: grid, integers, block and shared memory are fixed, and a later call
gives tensors of the same dtype, device, sizes and strides (pointers 16-byte aligned where the bound ones were: Triton
specialized the kernel on it), which the C++ side checks before it allocates the outputs, writes the pointers into the
packed parameters and launches on torch's current stream. A caller caches plans under a key that fixes every
integer argument (shapes and strides) and runs Triton's launch where :func:`run` says None.

The parameters follow Triton's kernel ABI: the non-constexpr arguments of the kernel's specialized signature in
order, then Triton's trailing scratch pointers (global, and profile from Triton 3.5). Their number and sizes are read
from the kernel's PTX ``.entry`` and must agree with the signature, so a Triton whose ABI differs, a kernel needing
scratch memory, tensor descriptors, tuples, clusters, cooperative or PDL launches keep Triton's launch (logged once
per kernel and reason), as does every call where the extension is not built. Launch hooks (a profiler's, e.g.
proton's) are read per call: while one is installed every call runs Triton's launch, which calls it. Triton 3.5+
holds them in ``HookChain`` objects that are never None, so "installed" means a chain with entries (as torch's
static launcher reads them), and a plan bound before a profiler started honours its hooks too.
"""

from __future__ import annotations

import logging
import re
import struct
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch

from aiter_gemm.op_entry import EXT

log = logging.getLogger("aiter_gemm")

__all__ = ["Unsupported", "bind", "hooks_owner", "plan_args", "ptx_params", "run"]

#: The bound launch: ``run(plan, *inputs)`` -> tuple of outputs, or None (not taken: run Triton's launch).
run = None if EXT is None else EXT.triton_run

_PTX_SIZES = {"u8": 1, "s8": 1, "b8": 1, "u16": 2, "s16": 2, "b16": 2, "f16": 2, "u32": 4, "s32": 4, "b32": 4,
              "f32": 4, "u64": 8, "s64": 8, "b64": 8, "f64": 8}
_INT_SIZES = {"i1": 1, "u1": 1, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4, "i64": 8, "u64": 8}
_FLOAT_CODES = {("fp32", "f32"): "<f", ("f32", "f32"): "<f", ("fp64", "f64"): "<d"}
_INT_CODES = {1: "b", 2: "h", 4: "i", 8: "q"}
_MAX_TRAILING = 2  # Triton's scratch pointers: global (3.2+), profile (3.5+)
_warned: set[tuple[str, str]] = set()


class Unsupported(ValueError):
    """Why a kernel launch cannot be bound (the caller keeps Triton's launch)."""


class PlanArgs(NamedTuple):
    """What :func:`EXT.triton_plan` takes besides the kernel's function handle and what keeps it loaded."""

    grid: tuple[int, int, int]
    block: int
    shared: int
    device: torch.device
    blob: bytes
    offsets: tuple[int, ...]
    pointers: tuple[int, ...]  # flat (parameter index, tensor index) pairs; tensors: inputs, then outputs
    inputs: tuple
    outputs: tuple


def ptx_params(ptx: str, name: str) -> list[str]:
    """The PTX types (``u64``, ``u32``, ``f32``...) of kernel ``name``'s parameters, in order; Unsupported when the
    entry is missing or a parameter is not a scalar (a by-value array: a tensor descriptor)."""
    m = re.search(rf"\.entry\s+{re.escape(name)}\s*\((.*?)\)", ptx, re.S)
    if m is None:
        raise Unsupported(f"no .entry {name} in the kernel's PTX")
    types = []
    for decl in filter(None, (d.strip() for d in m.group(1).split(","))):
        p = re.fullmatch(r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+(?:\.ptr(?:\s+\.\w+)*(?:\s+\.align\s+\d+)?\s+)?\w+",
                         decl)
        if p is None or p.group(1) not in _PTX_SIZES:
            raise Unsupported(f"PTX parameter {decl!r} of {name} is not a scalar this launcher packs")
        types.append(p.group(1))
    return types


def _pack_one(name: str, ty: str, ptx: str, value: Any) -> bytes:
    size = _PTX_SIZES[ptx]
    if ty.startswith("*"):
        if size != 8:
            raise Unsupported(f"pointer argument {name} is PTX .{ptx}")
        if value is not None:
            raise Unsupported(f"pointer argument {name} is a {type(value).__name__}, not one of the plan's tensors")
        return bytes(8)
    if ty in _INT_SIZES:
        if _INT_SIZES[ty] != size or ptx.startswith("f"):
            raise Unsupported(f"integer argument {name} ({ty}) is PTX .{ptx}: not the Triton ABI this launcher knows")
        if not isinstance(value, (bool, int)):
            raise Unsupported(f"integer argument {name} ({ty}) has value {value!r}")
        code = _INT_CODES[size]
        code = code.upper() if ty.startswith("u") or ty == "i1" else code
        try:
            return struct.pack("<" + code, int(value))
        except struct.error:
            raise Unsupported(f"integer argument {name} = {value} does not fit PTX .{ptx}") from None
    code = _FLOAT_CODES.get((ty, ptx))
    if code is None or not isinstance(value, (int, float)):
        raise Unsupported(f"argument {name} of type {ty} (PTX .{ptx}) is not packed by this launcher")
    return struct.pack(code, float(value))


def _spec(t: torch.Tensor, align: bool) -> tuple:
    return (t.dtype, tuple(t.shape), tuple(t.stride()), align and t.data_ptr() % 16 == 0)


def plan_args(compiled: Any, grid: Sequence[int], args: Mapping[str, Any], inputs: Sequence[torch.Tensor],
              outputs: Sequence[torch.Tensor]) -> PlanArgs:
    """The launch of ``compiled`` (Triton's ``CompiledKernel``) with ``args`` (every kernel argument by name, as it
    was launched) as a plan's arguments: each pointer argument must be one of ``inputs`` (given per call) or
    ``outputs`` (allocated per call like these), or None. Unsupported says why it cannot be bound."""
    meta, src = compiled.metadata, compiled.src
    for attr in ("global_scratch_size", "profile_scratch_size"):
        if getattr(meta, attr, 0):
            raise Unsupported(f"the kernel needs {attr.replace('_', ' ')} {getattr(meta, attr)}")
    if getattr(meta, "tensordesc_meta", None):
        raise Unsupported("the kernel takes tensor descriptors")
    if getattr(meta, "num_ctas", 1) != 1 or getattr(meta, "launch_cooperative_grid", False) \
            or getattr(meta, "launch_pdl", False):
        raise Unsupported("cluster, cooperative or PDL launches are not bound")
    tensors = [*inputs, *outputs]
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise Unsupported(f"the tensors are on {sorted(map(str, devices))}, not one device")
    signature = src.signature
    kernel_args = []
    for name in src.fn.arg_names:
        if name not in signature:
            raise Unsupported(f"argument {name} is not in the kernel's signature {dict(signature)}")
        ty = signature[name]
        if not isinstance(ty, str) or ty.startswith(("tensordesc", "nvTmaDesc")):
            raise Unsupported(f"argument {name} has type {ty!r} (tuples and tensor descriptors are not bound)")
        if ty != "constexpr":
            if name not in args:
                raise Unsupported(f"argument {name} was not given")
            kernel_args.append((name, ty, args[name]))
    ptx = ptx_params(compiled.asm["ptx"], meta.name)
    trailing = ptx[len(kernel_args):]
    if len(ptx) < len(kernel_args) or len(trailing) > _MAX_TRAILING or any(t not in ("u64", "b64") for t in trailing):
        raise Unsupported(f"the PTX entry takes {len(ptx)} parameters ({ptx}) for {len(kernel_args)} signature "
                          "arguments: not the Triton ABI this launcher knows")
    blob, offsets, pointers = bytearray(), [], []
    for i, (ptx_ty, entry) in enumerate(zip(ptx, [*kernel_args, *[None] * len(trailing)])):
        size = _PTX_SIZES[ptx_ty]
        blob += bytes(-len(blob) % size)  # natural alignment
        offsets.append(len(blob))
        if entry is None:  # a scratch pointer: null (the kernel needs none, checked above)
            blob += bytes(8)
            continue
        name, ty, value = entry
        if ty.startswith("*") and isinstance(value, torch.Tensor):
            index = next((j for j, t in enumerate(tensors) if t is value), None)
            if index is None:
                raise Unsupported(f"pointer argument {name} is a tensor that is neither an input nor an output")
            pointers += [i, index]
            value = None
        blob += _pack_one(name, ty, ptx_ty, value)
    g = tuple(int(v) for v in grid)
    if not 1 <= len(g) <= 3 or min(g) < 1:
        raise Unsupported(f"grid {tuple(grid)} is not 1 to 3 positive sizes")
    block = meta.num_warps * getattr(meta, "warp_size", 32)
    return PlanArgs((*g, 1, 1)[:3], block, meta.shared, devices.pop(), bytes(blob), tuple(offsets), tuple(pointers),
                    tuple(_spec(t, True) for t in inputs), tuple(_spec(t, False) for t in outputs))


def hooks_owner() -> Any:
    """What holds the launch hooks Triton's launcher calls (``launch_enter_hook``, ``launch_exit_hook``):
    ``triton.knobs.runtime`` (Triton 3.4+), else ``CompiledKernel`` (class attributes before knobs)."""
    import triton

    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is not None:
        return runtime
    from triton.compiler.compiler import CompiledKernel

    return CompiledKernel


def bind(compiled: Any, grid: Sequence[int], args: Mapping[str, Any], inputs: Sequence[torch.Tensor],
         outputs: Sequence[torch.Tensor]) -> Any | None:
    """A plan of the launch Triton just made (``compiled`` is what ``kernel[grid](...)`` returned), for
    :func:`run`; None where it cannot be bound (no extension, not a CUDA launch on the current device, or
    :func:`plan_args`' reasons), logged once per kernel and reason."""
    name = getattr(getattr(compiled, "metadata", None), "name", type(compiled).__name__)
    try:
        if EXT is None:
            raise Unsupported("the C++ eager extension is not built")
        function = getattr(compiled, "function", None)
        if not isinstance(function, int) or not function:
            raise Unsupported("the kernel is not loaded (no CUfunction)")
        pa = plan_args(compiled, grid, args, inputs, outputs)
        if pa.device.type != "cuda":
            raise Unsupported(f"tensors on {pa.device}, not a CUDA device")
        if pa.device.index != torch.cuda.current_device():
            raise Unsupported(f"tensors on {pa.device}, current device cuda:{torch.cuda.current_device()}")
        if pa.shared > 227 * 1024:
            raise Unsupported(f"shared memory {pa.shared} needs the oversized-shared launch attribute")
        return EXT.triton_plan(function, *pa, compiled, hooks_owner())
    except Unsupported as exc:
        if (name, str(exc)) not in _warned:
            _warned.add((name, str(exc)))
            log.info("aiter_gemm: %s keeps Triton's launcher: %s", name, exc)
        return None
