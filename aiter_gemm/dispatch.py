"""The dispatcher: per-shape decision (tuned row or heuristic default) made once, then one dict lookup per GEMM.

Lookup order (AITER's): exact key, M padded at granularity level 0, then level 1, then the default heuristic. A row
whose backend is unavailable here, or whose solution the backend rejects, is a miss at that level (warned once).
The dispatcher owns immutable tables and an immutable settings object; :meth:`Dispatcher.reload` swaps them.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from typing import Any

import torch

from aiter_gemm import backends
from aiter_gemm.backends.base import Backend, GemmProblem, Runner, Solution
from aiter_gemm.capture import ShapeRecorder
from aiter_gemm.configs import ConfigTable, TunedRow, load_table
from aiter_gemm.device import DeviceIdentity, apply_overrides, probe_cpu, probe_gpu
from aiter_gemm.dtypes import dtype_name
from aiter_gemm.settings import Settings, load_settings

log = logging.getLogger("aiter_gemm")

MATCH_LEVELS = ("exact", "padded_gl0", "padded_gl1")


def get_padded_m(M: int, N: int, K: int, gl: int) -> int:
    """AITER's getPaddedM. gl=0: round M up to 16 (M<=256), 32 (<=1024), 64 (<=4096), else 128. gl=1: 8192 if
    M > 8192 and N > 4096, else the next power of two (1 for M <= 1)."""
    if gl == 0:
        step = 16 if M <= 256 else 32 if M <= 1024 else 64 if M <= 4096 else 128
        return (M + step - 1) // step * step
    if gl == 1:
        if M > 8192 and N > 4096:
            return 8192
        return 1 if M <= 1 else 1 << (M - 1).bit_length()
    raise ValueError(f"get_padded_m: gl must be 0 or 1, got {gl!r}")


@dataclass(frozen=True)
class Decision:
    """What one GEMM key runs: the backend's prepared runner, and why (matched level, row, source file)."""

    problem: GemmProblem
    device: DeviceIdentity
    solution: Solution
    matched: str  # exact | padded_gl0 | padded_gl1 | default
    row: TunedRow | None
    runner: Runner

    @property
    def source(self) -> str:
        return self.row.source if self.row is not None else "default heuristic"

    def as_config(self) -> dict[str, Any]:
        """AITER-style config dict: the row's columns (typed where known) plus ``matched`` and ``source``."""
        cfg: dict[str, Any] = dict(self.row.fields) if self.row is not None else {}
        sol = self.solution
        cfg.update(libtype=sol.libtype, solidx=sol.solidx, splitK=sol.splitK, kernelName=sol.kernelName,
                   us=self.row.us if self.row is not None else None, matched=self.matched, source=self.source,
                   line=self.row.line if self.row is not None else None, gfx=self.device.gfx,
                   cu_num=self.device.cu_num, M=self.problem.M, N=self.problem.N, K=self.problem.K)
        return cfg


class Dispatcher:
    """Owns the settings, the config tables and the decision cache; :meth:`reload` rebuilds all three."""

    def __init__(self, settings: Settings | None = None) -> None:
        self._lock = threading.RLock()
        self._recorder: ShapeRecorder | None = None
        self.reload(settings)

    # ---- state -------------------------------------------------------------------------------------------
    def reload(self, settings: Settings | None = None) -> None:
        """Re-read the environment (unless ``settings`` is given) and every config file; drop cached decisions."""
        with self._lock:
            self.settings = settings if settings is not None else load_settings()
            self._tables: dict[str, ConfigTable] = {}
            self._fast: dict[tuple, tuple] = {}  # run()'s key -> (runner, otype, 2-D shape, out shape)
            self._by_problem: dict[tuple[GemmProblem, bool], Decision] = {}
            self._devices: dict[bool, DeviceIdentity] = {}
            self._defaults: list[Backend] | None = None
            self._warned: set = set()
            if self._recorder is not None:
                self._recorder.close()
            self._recorder = ShapeRecorder(self.settings.untuned_file, self.settings.capture_flush_s) \
                if self.settings.tune_gemm else None
            for backend in backends.loaded_backends():
                backend.on_reload()
            # The main table loads now, not at the first GEMM, so a first GEMM inside CUDA graph capture does no
            # file I/O (a bad file raises here, naming file, line and column).
            self.table("GEMM_BF16")
            if self.settings.log_tuned_config and not log.handlers and not logging.getLogger().handlers:
                handler = logging.StreamHandler()
                handler.setFormatter(logging.Formatter("[aiter_gemm] %(message)s"))
                log.addHandler(handler)
                log.setLevel(logging.INFO)

    def table(self, kind: str) -> ConfigTable:
        """The merged table of a config kind (``GEMM_BF16``, ``GEMM_A8W8_BLOCKSCALE``, ...), loaded on first use."""
        table = self._tables.get(kind)
        if table is None:
            with self._lock:
                table = self._tables.get(kind)
                if table is None:
                    table = self._tables[kind] = load_table(kind, self.settings.config_paths[kind])
        return table

    def device(self, on_gpu: bool) -> DeviceIdentity:
        """This process's identity for GPU or CPU tensors, with AITER_GEMM_ARCH / AITER_GEMM_CU_NUM applied."""
        ident = self._devices.get(on_gpu)
        if ident is None:
            probed = probe_gpu() if on_gpu else probe_cpu()
            if probed is None:
                raise RuntimeError("aiter_gemm: a GPU tensor was given but torch sees no GPU")
            ident = self._devices[on_gpu] = apply_overrides(probed, self.settings.arch, self.settings.cu_num)
        return ident

    def flush_capture(self) -> None:
        if self._recorder is not None:
            self._recorder.flush()

    # ---- deciding ----------------------------------------------------------------------------------------
    def decide(self, problem: GemmProblem, on_gpu: bool) -> Decision:
        """The (cached) decision for ``problem`` on this process's GPU (``on_gpu``) or CPU."""
        key = (problem, on_gpu)
        dec = self._by_problem.get(key)
        if dec is None:
            with self._lock:
                dec = self._by_problem.get(key)
                if dec is None:
                    dec = self._by_problem[key] = self._decide(problem, self.device(on_gpu))
        return dec

    def _decide(self, problem: GemmProblem, device: DeviceIdentity) -> Decision:
        dec = None
        if problem.M > 0 and problem.N > 0:
            table = self.table("GEMM_BF16")
            for level in MATCH_LEVELS:
                m = problem.M if level == "exact" else get_padded_m(problem.M, problem.N, problem.K, int(level[-1]))
                if level != "exact" and m == problem.M:
                    continue  # same key as the exact lookup: already a miss
                row = table.lookup(device.gfx, device.cu_num, _row_key(problem.with_m(m)))
                if row is not None:
                    dec = self._from_row(problem, device, row, level)
                    if dec is not None:
                        break
        if dec is None:
            dec = self._default(problem, device)
            if self._recorder is not None:
                self._recorder.record(problem)
        if self.settings.log_tuned_config:
            log.info("M=%d N=%d K=%d bias=%s dtype=%s otype=%s scaleAB=%s bpreshuffle=%s -> matched=%s libtype=%s "
                     "solidx=%d kernelName=%s source=%s", problem.M, problem.N, problem.K, problem.bias,
                     dtype_name(problem.dtype), dtype_name(problem.otype), problem.scaleAB, problem.bpreshuffle,
                     dec.matched, dec.solution.libtype, dec.solution.solidx, dec.solution.kernelName or "-",
                     dec.source + (f":{dec.row.line}" if dec.row is not None else ""))
        return dec

    def _from_row(self, problem: GemmProblem, device: DeviceIdentity, row: TunedRow, level: str) -> Decision | None:
        v = row.values
        sol = Solution(v["libtype"], v["solidx"], v["splitK"], v["kernelName"])
        backend = backends.get_backend(sol.libtype)
        if not backend.is_available():
            self._warn_once(("libtype", sol.libtype),
                            "aiter_gemm: rows with libtype %r cannot run here (%s); treating them as misses",
                            sol.libtype, backend.unavailable_reason())
            return None
        runner = backend.prepare(problem, sol, device)
        if runner is None:
            self._warn_once(("row", row.source, row.line),
                            "aiter_gemm: %s:%d (libtype %r, solidx %d, kernelName %r) cannot run M=%d N=%d K=%d here; "
                            "treated as a miss", row.source, row.line, sol.libtype, sol.solidx, sol.kernelName,
                            problem.M, problem.N, problem.K)
            return None
        return Decision(problem, device, sol, level, row, runner)

    def _default(self, problem: GemmProblem, device: DeviceIdentity) -> Decision:
        """AITER's order: pre-shuffled weights -> a BLASLt heuristic solution; else the highest-priority available
        backend whose ``default_for`` accepts the shape (skinny for small M on a GPU); torch last."""
        if self._defaults is None:
            self._defaults = sorted(backends.available_backends(), key=lambda b: -b.default_priority)
        for backend in self._defaults:
            if problem.bpreshuffle and not backend.is_blaslt:
                continue
            sol = backend.default_for(problem, device)
            runner = backend.prepare(problem, sol, device) if sol is not None else None
            if runner is not None:
                return Decision(problem, device, sol, "default", None, runner)
        raise RuntimeError(
            f"aiter_gemm: no available backend can run M={problem.M} N={problem.N} K={problem.K} "
            f"dtype={dtype_name(problem.dtype)} bpreshuffle={problem.bpreshuffle} on {device.gfx}"
            + (" (a pre-shuffled weight needs a BLASLt backend: cublaslt or hipblaslt)" if problem.bpreshuffle else "")
        )

    def _warn_once(self, key: tuple, msg: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    # ---- running -----------------------------------------------------------------------------------------
    def run(self, A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None = None, otype: torch.dtype | None = None,
            scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None,
            scale_c: torch.Tensor | None = None) -> torch.Tensor:
        """out (..., N) = A (..., K) @ B (N, K).T (+ bias): the eager path, one dict lookup after the first call.

        Measured on CPU: building and hashing this key is ~0.4 us, the rest of the added cost is two Python calls."""
        key = (A.shape, B.shape, A.dtype, B.dtype, otype, bias is None,
               scale_a is None and scale_b is None and scale_c is None, A.is_cuda,
               getattr(B, "is_shuffled", False) is True)
        fast = self._fast.get(key)
        if fast is None:
            fast = self._fast_miss(key, A, B, bias, otype, scale_a, scale_b, scale_c)
        runner, out_dtype, shape2d, out_shape = fast
        if shape2d is None:
            return runner(A, B, bias, out_dtype, scale_a, scale_b, scale_c)
        return runner(A.reshape(shape2d), B, bias, out_dtype, scale_a, scale_b, scale_c).reshape(out_shape)

    def _fast_miss(self, key: tuple, A, B, bias, otype, scale_a, scale_b, scale_c) -> tuple:
        problem = problem_of(A, B, bias, otype, scale_a, scale_b, scale_c, key[8])
        dec = self.decide(problem, key[7])
        flat = A.dim() == 2
        fast = (dec.runner, problem.otype, None if flat else (problem.M, problem.K),
                None if flat else (*A.shape[:-1], problem.N))
        self._fast[key] = fast
        return fast


def problem_of(A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None, otype: torch.dtype | None,
               scale_a: torch.Tensor | None, scale_b: torch.Tensor | None, scale_c: torch.Tensor | None = None,
               bpreshuffle: bool = False) -> GemmProblem:
    """Validate the operands of ``gemm_a16w16`` and return their :class:`GemmProblem` (errors name the tensor)."""
    if not isinstance(A, torch.Tensor) or not isinstance(B, torch.Tensor):
        raise TypeError(f"gemm_a16w16: A and B must be tensors, got {type(A).__name__} and {type(B).__name__}")
    if A.dim() < 1 or B.dim() != 2:
        raise ValueError(f"gemm_a16w16: A must be (..., K) and B (N, K); got A {tuple(A.shape)} {A.dtype}, "
                         f"B {tuple(B.shape)} {B.dtype}")
    K = A.shape[-1]
    N = B.shape[0]
    if B.shape[1] != K:
        raise ValueError(f"gemm_a16w16: K mismatch: A {tuple(A.shape)} {A.dtype} has K={K} but B {tuple(B.shape)} "
                         f"{B.dtype} has K={B.shape[1]} (B is (N, K), nn.Linear weight layout)")
    if A.dtype != B.dtype:
        raise ValueError(f"gemm_a16w16: A {tuple(A.shape)} is {A.dtype} but B {tuple(B.shape)} is {B.dtype}; "
                         "both operands must have one dtype")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != N):
        raise ValueError(f"gemm_a16w16: bias must be (N,) = ({N},), got {tuple(bias.shape)} {bias.dtype}")
    if A.device != B.device:
        raise ValueError(f"gemm_a16w16: A is on {A.device} but B {tuple(B.shape)} is on {B.device}")
    if otype is not None and not isinstance(otype, torch.dtype):
        raise TypeError(f"gemm_a16w16: otype must be a torch.dtype or None, got {otype!r}")
    if not A.dtype.is_floating_point:
        raise ValueError(f"gemm_a16w16: A {tuple(A.shape)} has dtype {A.dtype}; expected a floating dtype")
    return GemmProblem(M=math.prod(A.shape[:-1]), N=N, K=K, bias=bias is not None, dtype=A.dtype,
                       otype=otype or A.dtype,
                       scaleAB=scale_a is not None or scale_b is not None or scale_c is not None,
                       bpreshuffle=bpreshuffle)


def _row_key(p: GemmProblem) -> tuple:
    """The GEMM_BF16 table key of a problem (the untuned columns, typed as the table parses them)."""
    return (p.M, p.N, p.K, p.bias, p.dtype, p.otype, p.scaleAB, p.bpreshuffle)
