"""TileLang FP8 block-scale configs: the typed config (SGLang's keys plus this project's), its name grammar, the one
rule of what a config can build and which shapes it can run (tuner and runtime share it), and the tuner's space.
The kernels they build are in :mod:`aiter_gemm.kernels.a8w8_blockscale_tilelang`."""

from dataclasses import asdict, dataclass, fields
from typing import Any

from aiter_gemm.configs import json_int
from aiter_gemm.kernels.blockscale_format import SCALE_BLOCK
from aiter_gemm.kernels.common import KernelName

#: Scale groups one pipeline stage of the swapped types may hold (``block_K`` up to 512): each weight row then streams
#: 512 contiguous bytes a stage instead of 128, which brought M <= 16 decode closer to the weight read
#: (docs/exploration.md, "Stages of several scale groups").
MAX_GROUPS = 4
#: SGLang's kernel types, then the hand-scheduled warp-specialised ones (:mod:`aiter_gemm.kernels.
#: a8w8_blockscale_tilelang_ws`): ``ws`` (DeepGEMM's design) and ``ws_swapAB`` (K split over the math warpgroups);
#: the first word of a config name.
SGLANG_KERNEL_TYPES = ("base", "swapAB", "splitK", "splitK_swapAB")
KERNEL_TYPES = (*SGLANG_KERNEL_TYPES, "ws", "ws_swapAB")
SWAPPED = frozenset({"swapAB", "splitK_swapAB", "ws_swapAB"})
#: Types built with TileLang's automatic warp specialisation and barrier insertion off (their own schedule).
HAND_SCHEDULED = frozenset({"ws", "ws_swapAB"})
SPLIT = frozenset({"splitK", "splitK_swapAB"})
#: wgmma needs 64 rows per math warpgroup on its M side; N side multiples of 8 up to 256.
_WGMMA_M = 64
#: Shared memory per CTA on sm_90 (227 KB usable), minus what TileLang keeps for barriers and scale staging.
_SMEM_BYTES = 227 * 1024 - 2 * 1024
#: Shared memory of one SM (228 KB, 1 KB of it kept by the driver per resident CTA): a CTA of ``min_blocks`` 2 gets
#: half, less the driver's 1 KB and the same 2 KB of margin (113664 bytes).
_SM_SMEM_BYTES = 228 * 1024
#: The largest L2 rasterization panel (``swizzle``, in CTAs): TileLang's code generator takes it as a C ``int``.
MAX_SWIZZLE = 1024
#: 32-bit registers of one SM (sm_90): what the threads of its resident CTAs share.
REGISTER_FILE = 65536
#: Registers a producer thread keeps after setmaxnreg (it only issues loads); the math threads take the rest.
PRODUCER_REGS = 24

#: The ``kernelName`` grammar (:attr:`TileLangConfig.name`; ``c_scale_local`` is always true, so the name does not
#: carry it).
NAME = KernelName("{kernel_type:" + "|".join(KERNEL_TYPES) + "}-BM{block_M}_BN{block_N}_BK{block_K}_S{num_stages}"
                  "_T{threads}_SK{split_k}[_BS][_AS][_SW{swizzle}][_MB{min_blocks}]", "TileLang config name",
                  f"; types: {', '.join(KERNEL_TYPES)}")


@dataclass(frozen=True)
class TileLangConfig:
    """One kernel: SGLang's config keys (``kernel_type``, ``block_M``, ``block_N``, ``block_K``, ``num_stages``,
    ``threads``, ``split_k``, ``c_scale_local``, ``b_scale_shm``, ``a_scale_shm``) plus ``swizzle``, the L2
    rasterization panel (``T.use_swizzle``; 0 = launch order). In the swapped types ``block_M`` counts weight rows
    and ``block_N`` tokens, as in SGLang, and ``block_K`` may hold up to :data:`MAX_GROUPS` scale groups a pipeline
    stage (each multiplied and promoted with its own scales; SGLang's kernels take 128 only). ``*_scale_shm``: the
    token scales are staged in shared memory by the producer (cp.async) before the math warpgroup multiplies them in.

    ``c_scale_local`` is read from SGLang's files and not used: the combined per-row scales always live in the math
    threads' registers: TileLang 0.1.15 releases a pipeline stage before the promotion reads scales staged there in
    shared memory (SGLang's ``c_scale_local: false``), a race large tiles lose (docs/exploration.md, "A race in
    TileLang's shared-memory scale staging")."""

    kernel_type: str
    block_M: int
    block_N: int
    block_K: int = 128
    num_stages: int = 3
    threads: int = 128
    split_k: int = 1
    c_scale_local: bool = True
    b_scale_shm: bool = False
    a_scale_shm: bool = False
    swizzle: int = 0
    min_blocks: int = 1

    libtype = "tilelang"

    @property
    def variant(self) -> str:  # the Triton configs' name for the kernel type
        return self.kernel_type

    @property
    def swapped(self) -> bool:
        return self.kernel_type in SWAPPED

    @property
    def runs_in_sglang(self) -> bool:
        """Whether SGLang's own kernels run this config: its four types with one scale group a stage (``ws`` and
        wider stages are this project's; ``swizzle`` is an extra key SGLang ignores)."""
        return self.kernel_type in SGLANG_KERNEL_TYPES and self.block_K == SCALE_BLOCK

    @property
    def groups(self) -> int:
        """Scale groups (128-wide K blocks, each with its own scales and promotion) a pipeline stage holds."""
        return self.block_K // SCALE_BLOCK

    @property
    def NUM_KSPLIT(self) -> int:  # the op's split-count surface, shared with the Triton configs
        return self.split_k

    @property
    def name(self) -> str:
        """The CSV ``kernelName`` (:data:`NAME`)."""
        return config_name(asdict(self))

    @classmethod
    def from_name(cls, name: str) -> "TileLangConfig":
        v = NAME.parse(name)
        return cls(v["kernel_type"], v["block_M"], v["block_N"], v["block_K"], v["num_stages"], v["threads"],
                   v["split_k"], True, v["BS"], v["AS"], v["swizzle"] or 0,  # the optional _SW and _MB: 0 and 1
                   1 if v["min_blocks"] is None else v["min_blocks"])

    def to_json(self) -> dict[str, Any]:
        """The config as SGLang's JSON value holds it (plus ``libtype`` and, when set, ``swizzle`` and
        ``min_blocks``)."""
        out: dict[str, Any] = {"libtype": self.libtype, **asdict(self)}
        for key in ("swizzle", "a_scale_shm", "b_scale_shm"):
            if not out[key]:
                del out[key]
        if self.min_blocks == 1:
            del out["min_blocks"]
        return out

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> "TileLangConfig":
        """A config from SGLang's JSON value (``latency_ms`` / ``tflops`` ignored) or :meth:`to_json`; ValueError
        naming the unknown or missing key."""
        known = {f.name for f in fields(cls)}
        extra = set(entry) - known - {"libtype", "latency_ms", "tflops"}
        if extra:
            raise ValueError(f"unknown TileLang config keys {sorted(extra)} (known: {sorted(known)})")
        if entry.get("libtype", cls.libtype) != cls.libtype:
            raise ValueError(f"libtype {entry['libtype']!r} is not {cls.libtype!r}")
        try:
            kwargs = {f.name: json_int(f.name, entry[f.name]) if f.type in (int, "int") else entry[f.name]
                      for f in fields(cls) if f.name in entry}
            return cls(**kwargs)
        except TypeError as exc:
            raise ValueError(f"TileLang config {entry!r}: {exc}") from None

    def __post_init__(self) -> None:
        why = self.problem()
        if why is not None:
            raise ValueError(f"TileLang config {self.name}: {why}")

    def problem(self) -> str | None:
        """Why this config cannot be built for any shape (None if it can)."""
        if self.kernel_type not in KERNEL_TYPES:
            return f"kernel_type {self.kernel_type!r} is not one of {KERNEL_TYPES}"
        if self.block_K % SCALE_BLOCK or not SCALE_BLOCK <= self.block_K <= MAX_GROUPS * SCALE_BLOCK:
            return (f"block_K must be {SCALE_BLOCK} times 1..{MAX_GROUPS} (scale groups a pipeline stage), "
                    f"got {self.block_K}")
        if self.min_blocks not in (1, 2) or (self.min_blocks != 1 and self.kernel_type != "ws_swapAB"):
            return f"min_blocks={self.min_blocks}: 1, or 2 for ws_swapAB (two CTAs an SM)"
        if self.block_K != SCALE_BLOCK and self.kernel_type not in SWAPPED:
            return (f"{self.kernel_type} stages one scale group (block_K {SCALE_BLOCK}); wider stages are built "
                    f"for the swapped types")
        if self.kernel_type == "ws":
            return self._ws_problem()
        if self.kernel_type == "ws_swapAB":
            return self._ws_swapped_problem()
        if self.threads not in (128, 256, 384):
            return f"threads must be 128, 256 or 384 (math warpgroups), got {self.threads}"
        mma_m, mma_n = self.block_M, self.block_N
        if mma_m % _WGMMA_M:
            return f"block_M={mma_m} must be a multiple of {_WGMMA_M} (wgmma M)"
        if mma_n % 8 or not 8 <= mma_n <= 256:
            return f"block_N={mma_n} must be a multiple of 8 in 8..256 (wgmma N)"
        groups, m_tiles = self.threads // 128, mma_m // _WGMMA_M
        if groups > m_tiles and mma_n % (8 * groups // m_tiles):
            return (f"{groups} math warpgroups cannot share a {mma_m}x{mma_n} tile (each needs 64 rows or a "
                    f"multiple-of-8 slice of block_N)")
        weight_tile = self.block_M if self.swapped else self.block_N
        if SCALE_BLOCK % weight_tile and weight_tile % SCALE_BLOCK:
            return f"the weight tile ({weight_tile} rows) must divide or be a multiple of {SCALE_BLOCK}"
        if weight_tile > SCALE_BLOCK:
            return f"the weight tile ({weight_tile} rows) must lie in one {SCALE_BLOCK}-row scale block"
        if self.kernel_type in SPLIT and self.split_k < 2:
            return f"{self.kernel_type} needs split_k >= 2, got {self.split_k}"
        if self.kernel_type not in SPLIT and self.split_k != 1:
            return f"{self.kernel_type} has split_k 1, got {self.split_k}"
        why = self._pipeline_problem(1)
        if why is not None:
            return why
        if self.b_scale_shm and not self.swapped:
            return "b_scale_shm applies to the swapped types (token scales of the B operand)"
        if self.a_scale_shm and self.swapped:
            return "a_scale_shm applies to base and splitK (token scales of the A operand)"
        return None

    def _ws_problem(self) -> str | None:
        """The ``ws`` kernel's rule: 2 or 3 math warpgroups of 64 token rows plus the producer warpgroup, a weight
        tile of 8..256 rows in at most two scale blocks, no split, scales always staged by the producer."""
        if self.block_M not in (128, 192):
            return f"ws needs block_M 128 or 192 (2 or 3 math warpgroups of 64 rows), got {self.block_M}"
        if self.threads != 2 * self.block_M + 128:
            return (f"ws runs block_M/64 math warpgroups and a producer warpgroup: threads={2 * self.block_M + 128}, "
                    f"got {self.threads}")
        if self.block_N % 8 or not 8 <= self.block_N <= 256 or (self.block_N > 128 and self.block_N % 64):
            return f"ws block_N={self.block_N} must be a multiple of 8 up to 128, or 192 or 256"
        why = self._register_problem(self.block_M // 64)
        if why is not None:
            return why
        if self.split_k != 1:
            return f"ws has split_k 1, got {self.split_k}"
        if self.a_scale_shm or self.b_scale_shm:
            return "ws always stages the scales in shared memory: a_scale_shm / b_scale_shm do not apply"
        return self._pipeline_problem(2)

    def _ws_swapped_problem(self) -> str | None:
        """The ``ws_swapAB`` kernel's rule: 64 weight rows, 16..208 tokens (within the registers), 2-4 math warpgroups
        splitting K plus the producer warpgroup, a stage count that is a multiple of the math warpgroups (a ring slot
        serves one)."""
        groups = self.threads // 128 - 1
        if self.block_M != _WGMMA_M:
            return f"ws_swapAB has {_WGMMA_M} weight rows a CTA (block_M), got {self.block_M}"
        if self.threads % 128 or not 2 <= groups <= 4:
            return f"ws_swapAB runs 2-4 math warpgroups and a producer: threads 384, 512 or 640, got {self.threads}"
        if self.block_N % 16 or not 16 <= self.block_N <= 208:
            return f"ws_swapAB block_N={self.block_N} (tokens) must be a multiple of 16 in 16..208"
        why = self._register_problem(groups)
        if why is not None:
            return why
        if self.num_stages % groups:
            return f"ws_swapAB num_stages={self.num_stages} must be a multiple of its {groups} math warpgroups"
        if self.split_k != 1:
            return f"ws_swapAB has split_k 1 (K is split over its math warpgroups), got {self.split_k}"
        if self.a_scale_shm or self.b_scale_shm or self.swizzle:
            return "ws_swapAB always stages the scales in shared memory and runs in launch order: no _AS/_BS/_SW"
        return self._pipeline_problem(groups)

    def _register_problem(self, groups: int) -> str | None:
        """The hand-scheduled types' register rule: a math thread holds a float32 partial and an accumulator tile of
        64 x block_N (block_N / 2 registers each) and ~32 more, within what setmaxnreg gives it beside the producer
        (240 / 160 / 112 for 2 / 3 / 4 math warpgroups; 104 for 2 at two CTAs an SM)."""
        have = ws_math_registers(groups, self.min_blocks)
        if self.block_N + 32 > have:
            return (f"{self.kernel_type} block_N={self.block_N} needs {self.block_N + 32} registers a math thread, "
                    f"more than {have} with {groups} math warpgroups and {self.min_blocks} CTA(s) an SM")
        return None

    def _pipeline_problem(self, min_stages: int) -> str | None:
        """The rule every type shares: ``min_stages``..16 stages, shared memory within the SM's, swizzle in
        0..:data:`MAX_SWIZZLE`."""
        if not min_stages <= self.num_stages <= 16:
            return f"num_stages={self.num_stages} must be {min_stages}..16"
        have = min(_SMEM_BYTES, _SM_SMEM_BYTES // self.min_blocks - 3 * 1024)
        if self.smem_bytes() > have:
            return (f"needs {self.smem_bytes()} bytes of shared memory, more than {have} "
                    f"({self.min_blocks} CTA(s) an SM)")
        if not 0 <= self.swizzle <= MAX_SWIZZLE:
            return f"swizzle={self.swizzle} must be in 0..{MAX_SWIZZLE}"
        return None

    def smem_bytes(self) -> int:
        """Shared memory: the staged fp8 tiles or the output tile, whichever is larger (TileLang places the output
        tile over the stages, whose lifetime has ended: float32 for split-K partials, else at most 2 bytes counted
        as 4 to leave room for an fp32 output), plus the staged scales. ``ws`` keeps no output tile; ``ws_swapAB``
        keeps the accumulators its math warpgroups 1..G-1 hand to warpgroup 0."""
        stages = self.num_stages * (self.block_M + self.block_N) * self.block_K
        if self.kernel_type == "ws":
            return stages + self.num_stages * (self.block_M + 4) * 4
        if self.kernel_type == "ws_swapAB":  # + the parked accumulators of math warpgroups 1..G-1, the scales
            parked = (self.threads // 128 - 2) * self.block_N * self.block_M * 4
            return stages + parked + self.num_stages * self.groups * (self.block_N + 1) * 4
        return max(stages, self.block_M * self.block_N * 4) + 8 * (self.block_M + self.block_N) * self.num_stages


def config_name(values: dict[str, Any]) -> str:
    """:attr:`TileLangConfig.name` of config values, checked or not (values the rule rejects give a name that
    :meth:`TileLangConfig.from_name` rejects saying why: how an SGLang entry that cannot run here is named)."""
    v = {f.name: f.default for f in fields(TileLangConfig) if f.name != "kernel_type"} | values
    return NAME.format({**v, "BS": v["b_scale_shm"], "AS": v["a_scale_shm"], "swizzle": v["swizzle"] or None,
                        "min_blocks": None if v["min_blocks"] == 1 else v["min_blocks"]})


def launch_registers(threads: int, min_blocks: int = 1) -> int:
    """Registers a CTA of ``threads`` launches with when ``min_blocks`` CTAs share an SM: per thread 65536 /
    min_blocks / threads in steps of 8, at most 255."""
    return threads * min(255, REGISTER_FILE // min_blocks // threads // 8 * 8)


def math_registers(math_threads: int, producer_threads: int, pool: int) -> int:
    """Registers a math thread may ask setmaxnreg for: what ``pool`` leaves beside ``producer_threads`` at
    :data:`PRODUCER_REGS` each, in steps of 8, at most 240. setmaxnreg only moves registers inside the pool the CTA
    launched with, and an increase the pool cannot cover never returns (the CTA hangs)."""
    return min(240, (pool - producer_threads * PRODUCER_REGS) // math_threads // 8 * 8)


def auto_ws_math_registers(threads: int) -> int:
    """:func:`math_registers` under TileLang's automatic warp specialisation (SGLang's types), which gives the
    producer as many warpgroups as the ``threads`` of math ones and the launch the whole register file (232 each at
    threads=256, where the 512-thread launch would otherwise cap every thread at 128 registers and spill the two
    128x128 float32 accumulators). 0: no reallocation (one math warpgroup has room)."""
    return 0 if threads <= 128 else math_registers(threads, threads, REGISTER_FILE)


def ws_math_registers(groups: int, min_blocks: int = 1) -> int:
    """:func:`math_registers` of the hand-scheduled types: ``groups`` math warpgroups beside one producer warpgroup in
    the CTA's launch pool: 240 for 2 math warpgroups, 160 for 3, 112 for 4; 104 for 2 at two CTAs an SM."""
    return math_registers(128 * groups, 128, launch_registers(128 * (groups + 1), min_blocks))


def is_config_name(name: str) -> bool:
    """Whether ``name`` has the grammar of :attr:`TileLangConfig.name` (values unchecked)."""
    return NAME.matches(name)


def shape_error(cfg: TileLangConfig, M: int, N: int, K: int) -> str | None:
    """Why ``cfg`` cannot run (M, N, K) (None if it can): the one rule of the tuner and the runtime."""
    if M < 1 or N < 1 or K < 1:
        return f"empty problem M={M} N={N} K={K}"
    if K % SCALE_BLOCK:
        return f"K={K} is not a multiple of {SCALE_BLOCK}"
    if N % 16:
        return f"N={N} is not a multiple of 16 (TMA rows of the output)"
    kb = K // SCALE_BLOCK
    if kb % (cfg.split_k * cfg.groups):
        return (f"K/{SCALE_BLOCK}={kb} K blocks do not split into {cfg.split_k} equal parts of whole "
                f"{cfg.block_K}-wide stages")
    return None


def _token_tiles(M: int) -> tuple[int, ...]:
    """Token tiles (the swapped types' ``block_N``) worth timing at M: the smallest of 16..256 holding M, and half
    of it (two CTAs share the tokens: at M = 64 on the H100 the 32-token tile won on 5 of 8 weights)."""
    tile = next((t for t in (16, 32, 64, 128, 256) if t >= M), 256)
    return tuple(t for t in (tile, tile // 2) if t >= 16)


def _fit_tile(M: int, most: int) -> int:
    """The smallest multiple of 16 that splits M into as few token tiles as a tile of at most ``most`` tokens can."""
    per_tile = -(-M // -(-M // most))  # ceil(M / the fewest tiles)
    return -(-per_tile // 16) * 16


def _ws_token_tiles(M: int) -> tuple[int, ...]:
    """``ws_swapAB`` token tiles (one CTA an SM) at M: up to M = 128 those of :func:`_token_tiles`, and the tiles
    fitted to M in one CTA (up to 208 tokens, the registers' limit) or two (up to 128): M = 100 one tile of 112
    tokens, M = 136 one of 144 or two of 80, where 128-token tiles are 22% (M 100) and 47% (M 136: the second CTA
    94%) padding."""
    fits = [t for t in (_fit_tile(M, 208), _fit_tile(-(-M // 2), 128)) if -(-M // t) <= 2]
    return tuple(dict.fromkeys([*(_token_tiles(M) if M <= 128 else ()), *fits]))


def config_space(M: int, N: int, K: int, quick: bool = False) -> list[TileLangConfig]:
    """Configs the tuner times for (M, N, K), each valid there (:func:`shape_error`). Measured on the H100
    (8 weights of 16-131 MB, M 1-4096): swapped types win up to M = 64-128 (split-K where N / 64 tiles leave SMs
    idle), the warp-specialised ``ws`` from 128 up."""
    kb = K // SCALE_BLOCK if K % SCALE_BLOCK == 0 else 0
    out: list[TileLangConfig] = []

    def add(*args, **kw) -> bool:
        """Add the config if it builds and runs (M, N, K); whether it does."""
        try:
            cfg = TileLangConfig(*args, **kw)
        except ValueError:  # e.g. 128x128 tiles in 8 stages overflow shared memory: not a candidate
            return False
        if shape_error(cfg, M, N, K) is not None:
            return False
        if cfg not in out:
            out.append(cfg)
        return True

    if M <= 256:
        for bn in _token_tiles(M)[:1] if quick else _token_tiles(M):
            for st in (8,) if quick else (4, 8):
                for bm in (64,) if quick else (64, 128):
                    add("swapAB", bm, bn, num_stages=st)
            if M <= 64:
                # four scale groups a stage: 512 contiguous bytes of each weight row a stage, 1.03-1.19x the 8-stage
                # swapAB at M 1 and 16 on 6 held-out weights (H100, decode_limits_h100/wide.csv)
                for bk, st in ((512, 3),) if quick else ((512, 3), (512, 4), (256, 4), (256, 6)):
                    add("swapAB", 64, bn, block_K=bk, num_stages=st)
            for sk in (2, 4) if quick else (2, 4, 8):
                if kb and kb % sk == 0:
                    for st in (4,) if quick else (4, 8):
                        add("splitK_swapAB", 64, bn, num_stages=st, split_k=sk)
        # ws_swapAB, K split over 2 math warpgroups: at M 40 and 64 it ran 1.08-1.28x the quick-tuned row on 5 of 8
        # held-out weights (up to 0.90 of the weight read); at M 100-136 token tiles fitted to M (one tile of
        # 112 or 144 tokens, two of 80) ran 1.08-1.29x the tuned row on 5 of 8 (H100,
        # benchmarks/results/fp8/ws_swapab_h100/ and ws_swapab2_h100/wsk2.csv); at M 256 it won one weight.
        for bn in _ws_token_tiles(M):
            add("ws_swapAB", 64, bn, block_K=256, num_stages=6, threads=384)
            any(add("ws_swapAB", 64, bn, num_stages=st, threads=384) for st in (8, 6, 4))  # the most that fit
            if not quick and M <= 128:
                for bk, st, th in ((128, 6, 512), (256, 6, 512), (128, 12, 384), (128, 4, 384)):
                    add("ws_swapAB", 64, bn, block_K=bk, num_stages=st, threads=th)
        if 16 < M <= 160:
            # two CTAs an SM (104 registers a math thread: at most 64 tokens), the tile fitted to M: where the grid
            # passes the SMs one CTA's ramp and epilogue overlap the other's stream ((40|64, 10240, 5120): 1.13x
            # the best one-CTA config; (136, 5120, 8192) 1.2x the tuned row)
            bn = _fit_tile(M, 64)
            any(add("ws_swapAB", 64, bn, num_stages=st, threads=384, min_blocks=2) for st in (6, 4))
            if not quick:
                add("ws_swapAB", 64, bn, block_K=256, num_stages=2, threads=384, min_blocks=2)
    if M >= 64:
        # ws: 1.0-1.8x base-BM128_BN128_T256 at M 128-4096 on 8 weights (H100, docs/exploration.md), so base is
        # no longer timed there; 64-wide weight tiles win where 128-wide ones leave SMs idle (M <= 256).
        add("ws", 128, 64, num_stages=4, threads=384)
        add("ws", 128, 128, num_stages=4, threads=384)
        if 128 < M <= 192:
            # one 192-token tile where 128-token ones take two, each mostly padding: at M = 136 ws-BM192_BN96 ran
            # 54.8 us against the quick-tuned row's 67.9 on (24576, 4096), 30.4 against 32.0 on (10240, 5120)
            # (H100, benchmarks/results/fp8/decode_limits_h100/ws.csv; no gain on the 6 other held-out weights)
            add("ws", 192, 96, num_stages=4, threads=512)
        if not quick:
            add("ws", 128, 128, num_stages=4, threads=384, swizzle=8)
            add("ws", 128, 192, num_stages=4, threads=384)
            add("ws", 192, 128, num_stages=4, threads=512)
    return out
