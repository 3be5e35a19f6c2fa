"""Bound Triton launches: a compiled Triton kernel launched from C++ (``csrc/triton_launch.cpp``) with
``cuLaunchKernel``, without Triton's Python launcher.

Why: Triton's launcher binds and specializes the arguments, builds the cache key, looks the kernel up and its C
launcher queries the driver per pointer; that cost an eager activation-quantizer call 30-54 us of host time on the
H200 host (issue 53), several times the kernel. A plan (:func:`bind`) is one launch of one ``CompiledKernel`` with
the arguments of the Triton launch that made it: grid, integers, block and shared memory are fixed, and a later call
gives tensors of the same dtype, device, sizes and strides (pointers 16-byte aligned where the bound ones were: Triton
specialized the kernel on it), which the C++ side checks before it allocates the outputs, writes the pointers into the
packed parameters and launches on torch's current stream. A caller caches plans under a key that fixes every
integer argument (shapes and strides) and runs Triton's launch where :func:`run` says None; an op that makes several
launches per call (the fused MoE) binds each and replays them in order through a :class:`LaunchSequence`. Runners
bind only where :data:`BINDS` says launches are usable, and keep their plans per layout in a :class:`PlanCache`.

The parameters follow Triton's kernel ABI: the non-constexpr arguments of the kernel's specialized signature in
order, then Triton's trailing scratch pointers (global, and profile from Triton 3.5). A host-side tensor descriptor
(``TensorDescriptor`` of an input, TMA metadata compiled in) is a 128-byte TMA tensor map by value, then its shape
(i32) and strides (i64), as Triton's launcher expands it: the plan keeps cuTensorMapEncodeTiled's arguments as
Triton's launcher derives them and encodes the map of each call's address in C++ (``csrc/tensor_map.cpp``); bind
checks that map against Triton's own for the bound call. Their number and sizes are read from the kernel's PTX
``.entry`` and must agree with the signature, so a Triton whose ABI differs, a kernel needing scratch memory,
decomposed or im2col descriptors, tuples, clusters, cooperative or PDL launches keep Triton's launch (logged once per
kernel and reason), as does every call where the extension is not built. Launch hooks (a profiler's, e.g.
proton's) are read per call: while one is installed every call runs Triton's launch, which calls it. Triton 3.5+
holds them in ``HookChain`` objects that are never None, so "installed" means a chain with entries (as torch's
static launcher reads them), and a plan bound before a profiler started honours its hooks too.
"""

from __future__ import annotations

import inspect
import logging
import re
import struct
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from aiter_gemm.kernels.common import INTERPRET, Launch
from aiter_gemm.op_entry import EXT

log = logging.getLogger("aiter_gemm")

__all__ = ["BINDS", "UNTRIED", "Launch", "LaunchSequence", "PlanCache", "Unsupported", "bind", "bind_all",
           "bind_each", "hooks_owner", "plan_args", "ptx_params", "run"]

#: The bound launch: ``run(plan, *inputs)`` -> tuple of outputs, or None (not taken: run Triton's launch).
run = None if EXT is None else EXT.triton_run

#: What ``PlanCache._plans.get(layout, UNTRIED)`` gives for a layout no call has bound yet.
UNTRIED = object()

#: Whether runners bind their launches: the C++ extension built and Triton compiling (not interpreting). Read once
#: at import, as both are, so that no call (nor a first call's decision) runs code here to ask.
BINDS: bool = run is not None and not INTERPRET

_PTX_SIZES = {"u8": 1, "s8": 1, "b8": 1, "u16": 2, "s16": 2, "b16": 2, "f16": 2, "u32": 4, "s32": 4, "b32": 4,
              "f32": 4, "u64": 8, "s64": 8, "b64": 8, "f64": 8}
_INT_SIZES = {"i1": 1, "u1": 1, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4, "i64": 8, "u64": 8}
_FLOAT_CODES = {("fp32", "f32"): "<f", ("f32", "f32"): "<f", ("fp64", "f64"): "<d"}
_INT_CODES = {1: "b", 2: "h", 4: "i", 8: "q"}
_MAX_TRAILING = 2  # Triton's scratch pointers: global (3.2+), profile (3.5+)
_MAP = "b8[128]"  # a by-value CUtensorMap parameter (.param .align 64 .b8 name[128])
_MAP_WORD, _MAP_BIT = 1, 21  # the bit Triton 3.9 clears in small tensors' maps on drivers up to 13.1 (CUTLASS's fix)
_L2_128B = 2  # CU_TENSOR_MAP_L2_PROMOTION_L2_128B, what Triton's launcher asks for
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
    tensor_maps: tuple = ()  # (param, input, dtype, dims, strides, box, element strides, interleave, swizzle, l2,
    # oob fill, keep): cuTensorMapEncodeTiled's arguments but the address, innermost dimension first


def ptx_params(ptx: str, name: str) -> list[str]:
    """The PTX types (``u64``, ``u32``, ``f32``..., ``b8[128]`` for a by-value TMA tensor map) of kernel ``name``'s
    parameters, in order; Unsupported when the entry is missing or a parameter is neither a scalar nor a map."""
    m = re.search(rf"\.entry\s+{re.escape(name)}\s*\((.*?)\)", ptx, re.S)
    if m is None:
        raise Unsupported(f"no .entry {name} in the kernel's PTX")
    types = []
    for decl in filter(None, (d.strip() for d in m.group(1).split(","))):
        if re.fullmatch(r"\.param\s+\.align\s+64\s+\.b8\s+\w+\[128\]", decl):
            types.append(_MAP)
            continue
        p = re.fullmatch(r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+(?:\.ptr(?:\s+\.\w+)*(?:\s+\.align\s+\d+)?\s+)?\w+",
                         decl)
        if p is None or p.group(1) not in _PTX_SIZES:
            raise Unsupported(f"PTX parameter {decl!r} of {name} is neither a scalar nor a tensor map this launcher "
                              "packs")
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


def _descriptor_rank(ty: str) -> int:
    """The rank of a ``tensordesc<dtype[block]>`` type (``input_rank=`` where given), as Triton's launcher reads it."""
    m = re.match(r"tensordesc<([^[>]*)\[([^\]]*)\]", ty)
    if m is None:
        raise Unsupported(f"tensor descriptor type {ty!r} is not one this launcher knows")
    rank = re.search(r",input_rank=(\d+)", ty)
    return int(rank.group(1)) if rank else m.group(2).count(",") + 1


def _tma_dtype(device_type: int) -> int:
    """The host enum (CUtensorMapDataType) of a tensor map's element type as Triton's metadata numbers it."""
    try:
        from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST
    except ImportError:
        raise Unsupported("this Triton has no TMA dtype table (triton.backends.nvidia.driver)") from None
    return TMA_DTYPE_DEVICE_TO_HOST[device_type]


def _tensor_map(name: str, desc: Any, meta: Mapping[str, Any], rank: int, tensors: Sequence[torch.Tensor],
                n_inputs: int) -> tuple:
    """A tensor map spec (without its parameter index) of descriptor argument ``name``: cuTensorMapEncodeTiled's
    arguments as Triton's launcher derives them (``make_tensordesc_arg``), the address left to each call."""
    base = getattr(desc, "base", None)
    index = next((j for j, t in enumerate(tensors[:n_inputs]) if t is base), None)
    if index is None:
        raise Unsupported(f"descriptor argument {name} is not a TensorDescriptor of one of the plan's inputs")
    shape, strides = [int(v) for v in desc.shape], [int(v) for v in desc.strides]
    if len(shape) != rank or shape != list(base.shape) or strides != list(base.stride()) or strides[-1] != 1:
        raise Unsupported(f"descriptor argument {name} (shape {shape}, strides {strides}) is not its whole input "
                          f"{tuple(base.shape)} with strides {tuple(base.stride())}")
    if meta.get("is_im2col") or meta.get("fp4_padded") or getattr(desc, "round_f32_to_tf32", False):
        raise Unsupported(f"descriptor argument {name} is im2col, fp4-padded or rounds to tf32")
    padding = getattr(desc, "padding", "zero")
    if padding not in ("zero", "nan"):
        raise Unsupported(f"descriptor argument {name} has padding {padding!r}")
    size, block = int(meta["elem_size"]), [int(v) for v in meta["block_size"]]
    if len(block) != rank:
        raise Unsupported(f"descriptor argument {name}: block {block} for rank {rank}")
    byte_strides = tuple(size * v for v in reversed(strides[:-1]))
    return (index, _tma_dtype(int(meta["elem_type"])), tuple(reversed(shape)), byte_strides, tuple(reversed(block)),
            (1,) * rank, 0, int(meta["swizzle"]), _L2_128B, 1 if padding == "nan" else 0, None)


def _expanded(compiled: Any, args: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """The kernel's parameters as Triton's launcher passes them: (name, type, value) of each non-constexpr argument
    of the specialized signature, a tensor descriptor as (map, shape, strides) with type ``nvTmaDesc`` and value
    (descriptor, its metadata, rank)."""
    signature, maps = compiled.src.signature, getattr(compiled.metadata, "tensordesc_meta", None) or []
    out, n_desc = [], 0
    for name in compiled.src.fn.arg_names:
        if name not in signature:
            raise Unsupported(f"argument {name} is not in the kernel's signature {dict(signature)}")
        ty = signature[name]
        if not isinstance(ty, str) or ty.startswith(("tensordesc_im2col", "nvTmaDesc")):
            raise Unsupported(f"argument {name} has type {ty!r} (tuples and im2col descriptors are not bound)")
        if ty == "constexpr":
            continue
        if name not in args:
            raise Unsupported(f"argument {name} was not given")
        if ty.startswith("tensordesc"):
            if n_desc >= len(maps):
                raise Unsupported(f"descriptor argument {name} has no TMA metadata (decomposed descriptors are "
                                  "not bound)")
            desc, rank = args[name], _descriptor_rank(ty)
            out.append((name, "nvTmaDesc", (desc, maps[n_desc], rank)))
            out += [(f"{name}.shape[{i}]", "i32", v) for i, v in enumerate(getattr(desc, "shape", [None] * rank))]
            out += [(f"{name}.strides[{i}]", "i64", v) for i, v in enumerate(getattr(desc, "strides", [None] * rank))]
            n_desc += 1
        else:
            out.append((name, ty, args[name]))
    if n_desc != len(maps):
        raise Unsupported(f"{len(maps)} TMA metadata entries for {n_desc} descriptor arguments")
    return out


def plan_args(compiled: Any, grid: Sequence[int], args: Mapping[str, Any], inputs: Sequence[torch.Tensor],
              outputs: Sequence[torch.Tensor]) -> PlanArgs:
    """The launch of ``compiled`` (Triton's ``CompiledKernel``) with ``args`` (every kernel argument by name, as it
    was launched) as a plan's arguments: each pointer argument must be one of ``inputs`` (given per call) or
    ``outputs`` (allocated per call like these), or None, each tensor descriptor one of an input. Unsupported says
    why it cannot be bound."""
    meta = compiled.metadata
    for attr in ("global_scratch_size", "profile_scratch_size"):
        if getattr(meta, attr, 0):
            raise Unsupported(f"the kernel needs {attr.replace('_', ' ')} {getattr(meta, attr)}")
    if getattr(meta, "num_ctas", 1) != 1 or getattr(meta, "launch_cooperative_grid", False) \
            or getattr(meta, "launch_pdl", False):
        raise Unsupported("cluster, cooperative or PDL launches are not bound")
    tensors = [*inputs, *outputs]
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise Unsupported(f"the tensors are on {sorted(map(str, devices))}, not one device")
    kernel_args = _expanded(compiled, args)
    ptx = ptx_params(compiled.asm["ptx"], meta.name)
    trailing = ptx[len(kernel_args):]
    if len(ptx) < len(kernel_args) or len(trailing) > _MAX_TRAILING or any(t not in ("u64", "b64") for t in trailing):
        raise Unsupported(f"the PTX entry takes {len(ptx)} parameters ({ptx}) for {len(kernel_args)} signature "
                          "arguments: not the Triton ABI this launcher knows")
    blob, offsets, pointers, maps = bytearray(), [], [], []
    for i, (ptx_ty, entry) in enumerate(zip(ptx, [*kernel_args, *[None] * len(trailing)])):
        is_map = ptx_ty == _MAP
        blob += bytes(-len(blob) % (64 if is_map else _PTX_SIZES[ptx_ty]))  # natural alignment
        offsets.append(len(blob))
        if entry is None:  # a scratch pointer: null (the kernel needs none, checked above)
            blob += bytes(8)
            continue
        name, ty, value = entry
        if is_map != (ty == "nvTmaDesc"):
            raise Unsupported(f"argument {name} ({ty}) is PTX .{ptx_ty}: not the Triton ABI this launcher knows")
        if is_map:
            maps.append((i, *_tensor_map(name, *value, tensors, len(inputs))))
            blob += bytes(128)
            continue
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
                    tuple(_spec(t, True) for t in inputs), tuple(_spec(t, False) for t in outputs), tuple(maps))


def _map_keep(ours: bytes, theirs: bytes) -> bytes | None:
    """The AND-mask that makes this launcher's encoding of a tensor map Triton's (None: they are equal);
    Unsupported where they differ in more than the bit Triton 3.9 clears for small tensors on older drivers."""
    if ours == theirs:
        return None
    bit = 1 << _MAP_BIT
    keep = [(1 << 64) - 1] * 16
    keep[_MAP_WORD] &= ~bit
    mine = struct.unpack("<16Q", ours)
    if struct.pack("<16Q", *(a & k for a, k in zip(mine, keep))) != theirs:
        raise Unsupported("the TMA tensor map this launcher encodes differs from Triton's")
    return struct.pack("<16Q", *keep)


def _checked_maps(compiled: Any, args: Mapping[str, Any], pa: PlanArgs) -> tuple:
    """``pa``'s tensor maps with the mask that makes their encoding Triton's: each map encoded here for the bound
    call's address against the map (and shape and strides) Triton's launcher made of the same descriptor."""
    if not pa.tensor_maps:
        return ()
    try:
        from triton.backends.nvidia.driver import make_tensordesc_arg as make
    except ImportError:
        raise Unsupported("this Triton has no make_tensordesc_arg (triton.backends.nvidia.driver)") from None
    extra = [None] * (len(inspect.signature(make).parameters) - 2)  # Triton 3.9 takes a third, unused, argument
    descs = [value[:2] for _, ty, value in _expanded(compiled, args) if ty == "nvTmaDesc"]
    checked = []
    for spec, (desc, meta) in zip(pa.tensor_maps, descs):
        try:
            theirs = make(desc, meta, *extra)
            their_map = _map_bytes(theirs[0])
            values = [int(v) for v in theirs[1:]]
        except Exception as exc:  # a Triton that makes its maps otherwise: keep its launcher
            raise Unsupported(f"Triton's own tensor map could not be read ({type(exc).__name__}: {exc})") from None
        if values != [*map(int, desc.shape), *map(int, desc.strides)]:
            raise Unsupported(f"Triton passes a descriptor as {len(theirs)} values, not the map, shape and strides")
        ours = EXT.tensormap_encode(spec, desc.base.data_ptr())
        if ours is None:
            raise Unsupported("the driver has no cuTensorMapEncodeTiled or refused the tensor map")
        checked.append((*spec[:-1], _map_keep(ours, their_map)))
    return tuple(checked)


def _map_bytes(obj: Any) -> bytes:
    """The 128 bytes of a tensor map as Triton's launcher takes it: a ``PyCUtensorMap`` (Triton 3.5+), or an object
    holding it in host memory at ``tma_desc_cpu_ptr()`` (earlier)."""
    if hasattr(obj, "tma_desc_cpu_ptr"):
        import ctypes

        return ctypes.string_at(obj.tma_desc_cpu_ptr(), 128)
    return EXT.tensormap_bytes(obj)


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
        pa = pa._replace(tensor_maps=_checked_maps(compiled, args, pa))
        return EXT.triton_plan(function, *pa, compiled, hooks_owner())
    except Unsupported as exc:
        if (name, str(exc)) not in _warned:
            _warned.add((name, str(exc)))
            log.info("aiter_gemm: %s keeps Triton's launcher: %s", name, exc)
        return None


def bind_all(launches: Iterable[Launch]) -> tuple | None:
    """The plans of launches made one after another for one call (a GEMM and its split-K reduction), or None where
    any of them cannot be bound (:func:`bind` logs why)."""
    plans = bind_each(launches)
    return None if plans is None or any(p is None for p in plans) else plans


class LaunchSequence:
    """The launches of one call of an op that makes several in a fixed order (the fused MoE: token sorting, two
    GEMMs...), each bound or not on its own: the i-th launch runs ``plans[i]`` where that plan takes the call
    (:meth:`run`; ``missed`` is set where one declines), else Triton's launch, which :meth:`made` records when
    ``launches`` is a list (the call that binds). A caller keeps the plans per layout of the call's tensors (a
    :class:`PlanCache`), so that every integer a plan fixed is the call's."""

    __slots__ = ("index", "launches", "missed", "plans")

    def __init__(self, plans: Sequence[Any] = (), launches: list[Launch] | None = None) -> None:
        self.plans, self.launches, self.index, self.missed = plans, launches, 0, False

    def run(self, *inputs: torch.Tensor) -> tuple | None:
        """The next launch's plan on ``inputs``: its outputs, or None (no plan, or it declines: run Triton's)."""
        i = self.index
        self.index = i + 1
        plan = self.plans[i] if i < len(self.plans) else None
        if plan is None:
            return None
        got = run(plan, *inputs)
        if got is None:
            self.missed = True
        return got

    def made(self, compiled: Any, grid: tuple, args: Mapping[str, Any], inputs: tuple, outputs: tuple = ()) -> None:
        """Triton's launch of the current launch (after :meth:`run` said None), recorded when binding."""
        if self.launches is not None:
            self.launches.append(Launch(compiled, grid, args, inputs, outputs))


def bind_each(launches: Iterable[Launch]) -> tuple | None:
    """The plan of each launch (None where it cannot be bound: :func:`bind` logs why), for a
    :class:`LaunchSequence`; None where none binds."""
    plans = tuple(bind(*launch) for launch in launches)
    return None if all(p is None for p in plans) else plans


class PlanCache:
    """A bound runner's plans per layout of its call's tensors, the base of each such runner, which reads the two
    slots itself on its hot path: ``_plans`` maps a layout to its plans (None: nothing binds, Triton's launch runs;
    absent, :data:`UNTRIED`: the layout's next aligned call binds), ``_last`` is the plans last bound or run (None
    before any), which a call tries first. Past :attr:`MAX_LAYOUTS` layouts the plans start over."""

    __slots__ = ("_last", "_plans")
    MAX_LAYOUTS = 64

    def __init__(self) -> None:
        self._last: Any = None
        self._plans: dict[Hashable, Any] = {}

    def _store(self, layout: Hashable, plans: Any) -> None:
        """Keep what binding ``layout``'s call gave (None: nothing binds), as the last plans too unless None; a full
        cache starts over first (:meth:`_start_over`)."""
        if len(self._plans) >= self.MAX_LAYOUTS:
            self._start_over()
        self._plans[layout] = plans
        if plans is not None:
            self._last = plans

    def _start_over(self) -> None:
        """Forget every layout's plans (a runner extends it to what it keeps per layout beside them)."""
        self._plans.clear()
