"""Warp-specialised decode GEMM in Gluon (exploration, issue 14): ``out = a @ b.T (+ bias)`` for M = 17..256, Hopper.

Why this design
===============

The sections of BENCHMARKS.md on M 17-256 found that a weight stream fed by bulk copies reaches 0.74-0.95 of the
copy floor, 1.05-1.49x faster than F.linear, but every kernel that also multiplied lost that lead: the Triton
decode family (one warpgroup per CTA both issuing the TMA copies and waiting on wgmma) and the hand-written
mma.sync kernels (per-warp rings, warps waiting on each other). What was left to try is the shape of cuBLAS's own
``nvjet`` kernels: one *producer* warp that only issues TMA copies into a ring of shared-memory stages, and one or
two *consumer* warpgroups that only wait for a stage, issue wgmma on it and hand it back. Gluon (Triton's
low-level dialect: explicit layouts, mbarriers, ``warp_specialize``) expresses exactly that.

The tile is swapped: the weight's rows are the wgmma M side (64 per warpgroup), the tokens its N side (16..256).
A CTA covers ``BLOCK_SIZE_M`` tokens of its ``BLOCK_SIZE_N`` weight rows; several M tiles of the same rows run side
by side (M tiles fastest in the grid), the second reading the rows from L2, which is how cuBLAS's 64x32 ``nvjet``
tiles fill the SMs at M = 64. Where that still leaves too few CTAs, K is split (``NUM_KSPLIT``, a run-time
argument: one binary per tile and depth serves every shape and split) and the last split of a tile to arrive sums
the float32 partials in split order (deterministic, the CUTLASS split-K semaphore pattern of ``gemm_decode.py``'s
``FX``). The weight comes in by TMA (one producer warp, ``PW = 0``) or by ``PW`` producer warps issuing 16-byte
cp.async, the gemv's access pattern, each thread arriving on the stage's mbarrier when its copies land.

What it showed on the H100 (BENCHMARKS.md, "a warp-specialised Gluon kernel"): its weight stream alone (``D = 4``:
no wgmma, no activation, no epilogue) runs at 0.75-0.97 of the copy floor, 1.02-1.69x faster than F.linear, and
TMA or cp.async makes no difference; what the full kernel loses to that is mostly the end of the kernel: 0.6-2.3 us
of epilogue without a split, 1.7-4.2 us with the split-K fix-up (a chain of global-memory round trips nothing
overlaps). The persistent variant (``PS``), whose producer runs into the next tile while the consumers store the
last, needs tiles small enough to come 1.5 per CTA and lost to the best one-wave config of larger tiles. Best
configs: 0.92-1.16x F.linear.

Kernel: :func:`_wsgemm_kernel` (grid ``(M tiles x N tiles, splits)``), partitions :func:`_load_partition` (1 warp,
TMA) or :func:`_cpa_load_partition` (``PW`` warps, cp.async) and :func:`_mma_partition` (``num_warps`` warps), the
steps they share :func:`_tma_stage` and :func:`_mma_tile`; :func:`_wsgemm_persistent_kernel` for ``PS`` configs;
launcher :func:`launch_wsgemm`; reference :func:`wsgemm_ref` (the decode family's float32 one). Gluon has no
interpreter: the kernel runs on sm_90+ only; the CPU tests cover names, rejections and the grid, and compile it for
sm_90 (:func:`compile_offline`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import triton

from op_tests.op_benchmarks.explore_decode_mid.gemm_decode import _counters
from op_tests.op_benchmarks.explore_decode_mid.gemm_decode import gemm_decode_ref as wsgemm_ref  # noqa: F401

try:  # Gluon: Triton >= 3.5 (the H100 has 3.6)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp_async
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import constexpr_function
    # Triton 3.6 (the H100) names the TMA load async_copy_global_to_shared; 3.9 (CPU CI) renamed it async_load.
    _tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
    _cp_async_load = cp_async.async_load if hasattr(cp_async, "async_load") else cp_async.async_copy_global_to_shared
    _cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier  # likewise (3.9: barrier)
except ImportError:  # pragma: no cover - older Triton: names and grid only
    gluon = None

# Dynamic shared memory one CTA may use on sm_90 (227 KiB), less room for the mbarriers and the layout conversion
# of the epilogue (a float32 tile of up to 128 x 256 goes through shared memory: Triton reuses the ring for it).
_SMEM_LIMIT = 227 * 1024 - 2048


@dataclass(frozen=True)
class WsGemmConfig:
    BN: int = 64  # weight rows per CTA: the wgmma M side (64 per warpgroup)
    BM: int = 64  # tokens per CTA: the wgmma N side (multiple of 8, <= 256)
    BK: int = 64  # k per stage
    SK: int = 1  # K splits
    W: int = 4  # consumer warps (4: one warpgroup; 8: two, BN >= 128)
    S: int = 6  # ring stages
    D: int = 0  # diagnostics, timing only (wrong results): 1 no wgmma, 2 no activation copies, 3 neither, 4 = 3
    # without the epilogue (no stores, no split-K fix-up); cluster configs: 5 no cluster barrier, 6 no DSMEM exchange,
    # 7 the exchange's handshake with 16-byte slices, 8 no done handshake
    PW: int = 0  # 0: one producer warp issues TMA copies; > 0: PW producer warps issue cp.async (16 B per thread)
    E: int = 0  # epilogue layout: 0 threads along n, 4 bytes each; 1 the wgmma accumulator's own (no shared-memory
    # round trip); 2 threads along n, 16 bytes each
    PS: int = 0  # 0: a CTA per (tile, split); p > 0: persistent, p CTAs per SM loop over the tiles, the producer
    # running into the next tile while the consumers store the last (no split; TMA producer)
    CL: int = 1  # > 1: the SK = CL splits of a tile are one cluster's CTAs, summed through distributed shared
    # memory (wsgemm_cluster.py, Triton >= 3.9)

    @property
    def name(self) -> str:
        return (f"WS_BN{self.BN}_BM{self.BM}_BK{self.BK}_SK{self.SK}_W{self.W}_S{self.S}"
                + (f"_D{self.D}" if self.D else "") + (f"_P{self.PW}" if self.PW else "")
                + (f"_E{self.E}" if self.E else "") + (f"_PS{self.PS}" if self.PS else "")
                + (f"_CL{self.CL}" if self.CL > 1 else ""))

    @classmethod
    def from_name(cls, name: str) -> WsGemmConfig:
        m = re.fullmatch(r"WS_BN(\d+)_BM(\d+)_BK(\d+)_SK(\d+)_W(\d+)_S(\d+)"
                         r"(?:_D(\d))?(?:_P(\d+))?(?:_E(\d))?(?:_PS(\d))?(?:_CL(\d))?", name.strip())
        if m is None:
            raise ValueError(f"wsgemm kernelName {name!r} does not match WS_BN<n>_BM<m>_BK<k>_SK<s>_W<w>_S<st>"
                             "[_D<d>][_P<pw>][_E<e>][_PS<p>][_CL<c>] (e.g. 'WS_BN64_BM64_BK64_SK2_W4_S6')")
        *head, d, pw, e, ps, cl = m.groups()
        return cls(*(int(x) for x in head), int(d or 0), int(pw or 0), int(e or 0), int(ps or 0), int(cl or 1))

    @property
    def chunk_rows(self) -> int:
        """cp.async producers: rows one copy instruction of all PW warps covers (16 bytes per thread along K)."""
        return self.PW * 32 // (self.BK // 8) if self.PW else 0

    def smem_bytes(self) -> int:
        """The ring, and for the persistent kernel's epilogue (in the warp-specialised region, beside the live ring)
        the layout conversion's float32 tile unless E = 1 converts nothing; for a cluster the partial and the
        receive buffer."""
        scratch = self.BN * self.BM * 4 * (2 if self.CL > 1 else 1 if self.PS and self.E != 1 else 0)
        return self.S * (self.BN + self.BM) * self.BK * 2 + scratch


def config_error(cfg: WsGemmConfig, M: int, N: int, K: int) -> str | None:
    """Why ``cfg`` cannot run (M, N, K) with 16-bit inputs, or None (the one rule the grid and the launcher share)."""
    if cfg.BN not in (64, 128, 256) or cfg.W not in (4, 8) or cfg.BN < 16 * cfg.W:
        return f"{cfg.name}: BN in 64/128/256 with W = 4 or 8 consumer warps (16 rows per warp at least)"
    if cfg.BM & (cfg.BM - 1) or not 8 <= cfg.BM <= 256:
        return f"{cfg.name}: BM must be a power of 2 in 8..256 (the wgmma N side; Gluon tiles are powers of 2)"
    if cfg.BK not in (64, 128, 256):
        return f"{cfg.name}: BK must be 64, 128 or 256"
    if cfg.D not in (0, 1, 2, 3, 4) and not (cfg.CL > 1 and cfg.D in (5, 6, 7, 8)):
        return f"{cfg.name}: D must be 0..4 (5-8: cluster configs)"
    if cfg.PW and (cfg.PW not in (1, 2, 4, 8) or cfg.BK // 8 > 32 or cfg.BM % cfg.chunk_rows
                   or cfg.BN % cfg.chunk_rows or cfg.chunk_rows < 8):
        return (f"{cfg.name}: PW in 1/2/4/8, and BN and BM multiples of the {cfg.chunk_rows} rows one cp.async "
                "of the producers covers, at least 8 (the shared-memory swizzle's period)")
    if cfg.E not in (0, 1, 2):
        return f"{cfg.name}: E must be 0, 1 or 2"
    if cfg.PS and (cfg.SK != 1 or cfg.PW or cfg.D or cfg.PS > 2):
        return f"{cfg.name}: the persistent kernel (PS 1 or 2) takes no split, no cp.async producers, no diagnostics"
    if cfg.CL > 1 and (cfg.CL not in (2, 4, 8) or cfg.SK != cfg.CL or cfg.PS or cfg.E or cfg.D not in (0, 4, 5, 6, 7, 8)
                       or cfg.BN // cfg.CL < 4 or not cfg.PW):
        return (f"{cfg.name}: a cluster of CL = 2, 4 or 8 CTAs takes SK = CL splits, cp.async producers (a TMA "
                "producer warp leaves idle warps that a cluster barrier would wait for), no persistence, its own "
                "epilogue (E 0) and at least 4 rows per CTA; diagnostics D 4-8 only")
    if cfg.PW and K % 16:
        return f"{cfg.name}: cp.async producers need K % 16 == 0 (16-byte copies the JIT can prove aligned); K={K}"
    if not 2 <= cfg.S <= 16:
        return f"{cfg.name}: S must be in 2..16"
    if cfg.smem_bytes() > _SMEM_LIMIT:
        return f"{cfg.name}: {cfg.smem_bytes()} B of shared memory exceeds {_SMEM_LIMIT}"
    if K % 8:
        return f"{cfg.name}: K={K} rows are not 16-byte aligned (TMA)"
    k_tiles = triton.cdiv(K, cfg.BK)
    if cfg.SK < 1 or triton.cdiv(k_tiles, triton.cdiv(k_tiles, cfg.SK)) != cfg.SK:
        return f"{cfg.name}: {k_tiles} K tiles do not split into {cfg.SK} non-empty splits"
    return None


if gluon is not None:

    @gluon.jit
    def _tma_stage(w_desc, x_desc, w_bufs, x_bufs, ready_bars, empty_bars, c, off_n, off_m, k,
                   NUM_STAGES: gl.constexpr, DIAG: gl.constexpr):
        """Producer step ``c`` of the ring: wait for its stage to be free, then bring the weight and activation
        tiles at (off_n, k), (off_m, k) in with TMA, counted on the stage's ready barrier."""
        s = c % NUM_STAGES
        # A fresh mbarrier counts as having completed the phase before 0: the first round does not wait.
        mbarrier.wait(empty_bars.index(s), ((c // NUM_STAGES) & 1) ^ 1)
        bar = ready_bars.index(s)
        if DIAG >= 2:
            mbarrier.expect(bar, w_desc.block_type.nbytes)
            _tma_load(w_desc, [off_n, k], bar, w_bufs.index(s))
        else:
            mbarrier.expect(bar, w_desc.block_type.nbytes + x_desc.block_type.nbytes)
            _tma_load(w_desc, [off_n, k], bar, w_bufs.index(s))
            _tma_load(x_desc, [off_m, k], bar, x_bufs.index(s))

    @gluon.jit
    def _load_partition(w_desc, x_desc, w_bufs, x_bufs, ready_bars, empty_bars, off_n, off_m, kt_begin, n_iters,
                        BLOCK_SIZE_K: gl.constexpr, NUM_STAGES: gl.constexpr, DIAG: gl.constexpr):
        """Producer (1 warp): this CTA's K split of one tile, a TMA stage per K step."""
        for i in range(n_iters):
            _tma_stage(w_desc, x_desc, w_bufs, x_bufs, ready_bars, empty_bars, i, off_n, off_m,
                       (kt_begin + i) * BLOCK_SIZE_K, NUM_STAGES, DIAG)

    @gluon.jit
    def _cpa_copy_tile(buf, src_ptr, off_r, k0, R, K, stride_r, ROWS: gl.constexpr, BLOCK_SIZE_K: gl.constexpr,
                       PW: gl.constexpr, EVICT: gl.constexpr):
        """cp.async a ``[ROWS, BLOCK_SIZE_K]`` tile (rows past R and k past K zero-filled) in chunks of the rows one
        instruction of the PW warps covers: 16 bytes per thread, a warp's 32 threads along K first."""
        TPC: gl.constexpr = BLOCK_SIZE_K // 8
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPC, TPC], [PW, 1], [1, 0])
        CHUNK: gl.constexpr = PW * 32 // TPC
        offs_k = k0 + gl.arange(0, BLOCK_SIZE_K, layout=gl.SliceLayout(0, layout))
        offs_c = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, layout))
        # config_error asks K (and the launcher the row strides) to be multiples of 16 elements, which Triton's JIT
        # specialises on: every thread's 8 elements are then one 16-byte copy, in bounds or zero-filled as a whole.
        for c in gl.static_range(ROWS // CHUNK):
            rows = off_r + c * CHUNK + offs_c
            ptrs = src_ptr + rows[:, None] * stride_r + offs_k[None, :]
            mask = (rows[:, None] < R) & (offs_k[None, :] < K)
            _cp_async_load(buf.slice(c * CHUNK, CHUNK), ptrs, mask=mask, eviction_policy=EVICT)

    @gluon.jit
    def _cpa_load_partition(w_ptr, x_ptr, w_bufs, x_bufs, ready_bars, empty_bars, off_n, off_m, kt_begin, n_iters,
                            N, M, K, stride_wn, stride_xm,
                            BLOCK_SIZE_N: gl.constexpr, BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_K: gl.constexpr,
                            NUM_STAGES: gl.constexpr, PW: gl.constexpr, DIAG: gl.constexpr):
        """Producers (PW warps): the gemv's access pattern (every warp instruction 16 B x 32 threads along a row)
        through cp.async into the ring; each thread arrives on the stage's barrier once its copies have landed."""
        for i in range(n_iters):
            s = i % NUM_STAGES
            mbarrier.wait(empty_bars.index(s), ((i // NUM_STAGES) & 1) ^ 1)
            k0 = (kt_begin + i) * BLOCK_SIZE_K
            _cpa_copy_tile(w_bufs.index(s), w_ptr, off_n, k0, N, K, stride_wn, BLOCK_SIZE_N, BLOCK_SIZE_K, PW,
                           "evict_first")
            if DIAG < 2:
                _cpa_copy_tile(x_bufs.index(s), x_ptr, off_m, k0, M, K, stride_xm, BLOCK_SIZE_M, BLOCK_SIZE_K, PW,
                               "evict_last")
            cp_async.mbarrier_arrive(ready_bars.index(s), increment_count=False)

    @gluon.jit
    def _mma_tile(w_bufs, x_bufs, ready_bars, empty_bars, c0, n_iters, acc_layout: gl.constexpr,
                  BLOCK_SIZE_N: gl.constexpr, BLOCK_SIZE_M: gl.constexpr, NUM_STAGES: gl.constexpr,
                  DIAG: gl.constexpr, CPA: gl.constexpr):
        """Consumer steps ``c0 .. c0 + n_iters - 1`` of the ring: acc[BN, BM] += W_tile @ X_tile.T per stage, one
        wgmma group in flight; a stage goes back to the producer once the wgmma that read it has retired, the last
        one once all have."""
        acc = gl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_M), gl.float32, acc_layout)
        for i in range(n_iters):
            c = c0 + i
            s = c % NUM_STAGES
            mbarrier.wait(ready_bars.index(s), (c // NUM_STAGES) & 1)
            if DIAG == 1 or DIAG >= 3:
                mbarrier.arrive(empty_bars.index(s))
            else:
                if CPA:  # cp.async wrote the stage through the generic proxy; wgmma reads through the async one
                    fence_async_shared()
                acc = warpgroup_mma(w_bufs.index(s), x_bufs.index(s).permute((1, 0)), acc, is_async=True)
                # Leaves this iteration's wgmma in flight; the previous one has retired, so its stage is free.
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
                mbarrier.arrive(empty_bars.index((c + NUM_STAGES - 1) % NUM_STAGES), pred=i > 0)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        if DIAG != 1 and DIAG < 3:
            mbarrier.arrive(empty_bars.index((c0 + n_iters - 1) % NUM_STAGES))  # the last stage
        return acc

    @constexpr_function
    def _acc_layout(BLOCK_SIZE_M, num_warps):
        """wgmma's accumulator: ``num_warps`` warps along the weight rows, the token tile as the instruction's N."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                         instr_shape=[16, BLOCK_SIZE_M, 16])

    @gluon.jit
    def _mma_partition(w_bufs, x_bufs, ready_bars, empty_bars, n_iters,
                       BLOCK_SIZE_N: gl.constexpr, BLOCK_SIZE_M: gl.constexpr, NUM_STAGES: gl.constexpr,
                       NUM_WARPS: gl.constexpr, DIAG: gl.constexpr, CPA: gl.constexpr):
        """Consumers (``NUM_WARPS`` warps): one tile's K split; the accumulator goes back to the kernel."""
        acc = _mma_tile(w_bufs, x_bufs, ready_bars, empty_bars, 0, n_iters, _acc_layout(BLOCK_SIZE_M, NUM_WARPS),
                        BLOCK_SIZE_N, BLOCK_SIZE_M, NUM_STAGES, DIAG, CPA)
        return (acc, )  # a tuple: the default partition's results

    @constexpr_function
    def _epilogue_layout(EPI, BLOCK_SIZE_N, BLOCK_SIZE_M, num_warps):
        """The epilogue's register layout (``WsGemmConfig.E``); 1 is the accumulator's, so no conversion happens."""
        if EPI == 1:
            return _acc_layout(BLOCK_SIZE_M, num_warps)
        if EPI == 2:
            return gl.BlockedLayout([8, 1], [8, 4], [1, num_warps], [0, 1])
        return gl.BlockedLayout([2, 1], [32, 1], [1, num_warps], [0, 1])

    @gluon.jit
    def _tile_offsets(off_n, off_m, N, M, BLOCK_SIZE_N: gl.constexpr, BLOCK_SIZE_M: gl.constexpr,
                      layout: gl.constexpr):
        """The output tile's row (n) and column (m) indices in ``layout`` and its in-bounds mask."""
        offs_n = off_n + gl.arange(0, BLOCK_SIZE_N, layout=gl.SliceLayout(1, layout))
        offs_m = off_m + gl.arange(0, BLOCK_SIZE_M, layout=gl.SliceLayout(0, layout))
        return offs_n, offs_m, (offs_n[:, None] < N) & (offs_m[None, :] < M)

    @gluon.jit
    def _alloc_ring(w_desc, x_desc, NUM_STAGES: gl.constexpr, READY_ARRIVALS: gl.constexpr):
        """The ring's weight and activation stages and its ready / empty mbarriers (initialised): ``READY_ARRIVALS``
        arrivals complete a ready phase (TMA: the producer's expect-tx; cp.async: every producer thread)."""
        w_bufs = gl.allocate_shared_memory(w_desc.dtype, [NUM_STAGES] + w_desc.block_type.shape, w_desc.layout)
        x_bufs = gl.allocate_shared_memory(x_desc.dtype, [NUM_STAGES] + x_desc.block_type.shape, x_desc.layout)
        ready_bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        empty_bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NUM_STAGES):
            mbarrier.init(ready_bars.index(i), count=READY_ARRIVALS)
            mbarrier.init(empty_bars.index(i), count=1)
        fence_async_shared()
        return w_bufs, x_bufs, ready_bars, empty_bars

    @gluon.jit
    def _store_tile(acc, bias_ptr, c_ptr, offs_n, offs_m, N, mask, stride_cm, stride_cn, HAS_BIAS: gl.constexpr):
        """Add the bias (float32) and store the ``[BN, BM]`` float32 tile transposed into C's dtype."""
        if HAS_BIAS:
            bias = gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
            acc = acc + bias.to(gl.float32)[:, None]
        gl.store(c_ptr + offs_m[None, :] * stride_cm + offs_n[:, None] * stride_cn,
                 acc.to(c_ptr.dtype.element_ty), mask=mask)

    @gluon.jit
    def _wsgemm_kernel(w_desc, x_desc, w_ptr, x_ptr, c_ptr, bias_ptr, ws_ptr, cnt_ptr, M, N, K,
                       stride_wn, stride_xm, stride_cm, stride_cn, k_tiles, k_tiles_per_split, num_ksplit,
                       HAS_BIAS: gl.constexpr, NUM_STAGES: gl.constexpr, num_warps: gl.constexpr,
                       DIAG: gl.constexpr = 0, PW: gl.constexpr = 0, EPI: gl.constexpr = 0):
        """One ``[BLOCK_SIZE_N weight rows x BLOCK_SIZE_M tokens]`` tile of C.T over one K split."""
        BLOCK_SIZE_N: gl.constexpr = w_desc.block_type.shape[0]
        BLOCK_SIZE_K: gl.constexpr = w_desc.block_type.shape[1]
        BLOCK_SIZE_M: gl.constexpr = x_desc.block_type.shape[0]
        # M tiles fastest: the CTAs that read the same weight rows for different tokens run side by side, so the
        # weight comes from HBM once and from L2 for the others (cuBLAS's nvjet 64x32 tiles split M so at M = 64).
        tile = gl.program_id(0)
        pid_k = gl.program_id(1)
        num_m_tiles = (M + BLOCK_SIZE_M - 1) // BLOCK_SIZE_M
        pid_m = tile % num_m_tiles
        pid_n = tile // num_m_tiles
        off_n = pid_n * BLOCK_SIZE_N
        off_m = pid_m * BLOCK_SIZE_M
        kt_begin = pid_k * k_tiles_per_split
        n_iters = gl.minimum(kt_begin + k_tiles_per_split, k_tiles) - kt_begin  # >= 1 (config_error)

        w_bufs, x_bufs, ready_bars, empty_bars = _alloc_ring(w_desc, x_desc, NUM_STAGES, 1 if PW == 0 else PW * 32)

        if PW == 0:
            res = gl.warp_specialize([
                (_mma_partition, (w_bufs, x_bufs, ready_bars, empty_bars, n_iters,
                                  BLOCK_SIZE_N, BLOCK_SIZE_M, NUM_STAGES, num_warps, DIAG, False)),
                (_load_partition, (w_desc, x_desc, w_bufs, x_bufs, ready_bars, empty_bars, off_n, off_m, kt_begin,
                                   n_iters, BLOCK_SIZE_K, NUM_STAGES, DIAG)),
            ], [1], [40])
        else:
            res = gl.warp_specialize([
                (_mma_partition, (w_bufs, x_bufs, ready_bars, empty_bars, n_iters,
                                  BLOCK_SIZE_N, BLOCK_SIZE_M, NUM_STAGES, num_warps, DIAG, True)),
                (_cpa_load_partition, (w_ptr, x_ptr, w_bufs, x_bufs, ready_bars, empty_bars, off_n, off_m,
                                       kt_begin, n_iters, N, M, K, stride_wn, stride_xm,
                                       BLOCK_SIZE_N, BLOCK_SIZE_M, BLOCK_SIZE_K, NUM_STAGES, PW, DIAG)),
            ], [PW], [88])
        acc = res[0]

        if DIAG == 4:
            return
        # Epilogue: threads run along n (C's contiguous dimension), warps along m; or the accumulator's layout.
        out_layout: gl.constexpr = _epilogue_layout(EPI, BLOCK_SIZE_N, BLOCK_SIZE_M, num_warps)
        acc = gl.convert_layout(acc, out_layout)
        offs_n, offs_m, mask = _tile_offsets(off_n, off_m, N, M, BLOCK_SIZE_N, BLOCK_SIZE_M, out_layout)
        if num_ksplit == 1:
            _store_tile(acc, bias_ptr, c_ptr, offs_n, offs_m, N, mask, stride_cm, stride_cn, HAS_BIAS)
        else:
            tile_off = offs_m[None, :] * N + offs_n[:, None]
            gl.store(ws_ptr + pid_k * M * N + tile_off, acc, mask=mask)
            # Release: every thread's partial is stored before one thread bumps the counter (acq_rel, GPU scope).
            _cta_barrier()
            arrived = gl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == num_ksplit - 1:
                # Last to arrive: sum in split order (independent of arrival order); own partial from registers.
                total = gl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_M), gl.float32, out_layout)
                for s in range(num_ksplit):
                    not_mine = (tile_off * 0 + s) != pid_k
                    part = gl.load(ws_ptr + s * M * N + tile_off, mask=mask & not_mine, other=0.0,
                                   cache_modifier=".cg")
                    total += gl.where(not_mine, part, acc)
                _store_tile(total, bias_ptr, c_ptr, offs_n, offs_m, N, mask, stride_cm, stride_cn, HAS_BIAS)
                gl.store(cnt_ptr + tile, 0)  # ready for the next launch (stream order makes it visible)


    @gluon.jit
    def _ps_load_partition(w_desc, x_desc, w_bufs, x_bufs, ready_bars, empty_bars, num_tiles, num_m_tiles, k_tiles,
                           BLOCK_SIZE_N: gl.constexpr, BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_K: gl.constexpr,
                           NUM_STAGES: gl.constexpr):
        """Persistent producer: the ring runs on across this CTA's tiles, so the next tile's weight is already
        coming in while the consumers store the last one."""
        c = 0
        for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
            for i in range(k_tiles):
                _tma_stage(w_desc, x_desc, w_bufs, x_bufs, ready_bars, empty_bars, c,
                           (tile // num_m_tiles) * BLOCK_SIZE_N, (tile % num_m_tiles) * BLOCK_SIZE_M,
                           i * BLOCK_SIZE_K, NUM_STAGES, 0)
                c += 1

    @gluon.jit
    def _ps_mma_partition(w_bufs, x_bufs, ready_bars, empty_bars, c_ptr, bias_ptr, M, N, stride_cm, stride_cn,
                          num_tiles, num_m_tiles, k_tiles, BLOCK_SIZE_N: gl.constexpr, BLOCK_SIZE_M: gl.constexpr,
                          NUM_STAGES: gl.constexpr, NUM_WARPS: gl.constexpr, HAS_BIAS: gl.constexpr,
                          EPI: gl.constexpr):
        """Persistent consumers: per tile, :func:`_mma_tile`, then that tile's epilogue here, overlapping the
        producer's stream of the next tile."""
        out_layout: gl.constexpr = _epilogue_layout(EPI, BLOCK_SIZE_N, BLOCK_SIZE_M, NUM_WARPS)
        c = 0
        for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
            acc = _mma_tile(w_bufs, x_bufs, ready_bars, empty_bars, c, k_tiles, _acc_layout(BLOCK_SIZE_M, NUM_WARPS),
                            BLOCK_SIZE_N, BLOCK_SIZE_M, NUM_STAGES, 0, False)
            c += k_tiles
            out = gl.convert_layout(acc, out_layout)
            offs_n, offs_m, mask = _tile_offsets((tile // num_m_tiles) * BLOCK_SIZE_N,
                                                 (tile % num_m_tiles) * BLOCK_SIZE_M, N, M,
                                                 BLOCK_SIZE_N, BLOCK_SIZE_M, out_layout)
            _store_tile(out, bias_ptr, c_ptr, offs_n, offs_m, N, mask, stride_cm, stride_cn, HAS_BIAS)

    @gluon.jit
    def _wsgemm_persistent_kernel(w_desc, x_desc, c_ptr, bias_ptr, M, N, stride_cm, stride_cn, k_tiles,
                                  HAS_BIAS: gl.constexpr, NUM_STAGES: gl.constexpr, num_warps: gl.constexpr,
                                  EPI: gl.constexpr = 0):
        """``PS`` configs: a grid of ``PS`` CTAs per SM, each looping over ``(M tile, N tile)`` pairs (M fastest)."""
        BLOCK_SIZE_N: gl.constexpr = w_desc.block_type.shape[0]
        BLOCK_SIZE_K: gl.constexpr = w_desc.block_type.shape[1]
        BLOCK_SIZE_M: gl.constexpr = x_desc.block_type.shape[0]
        num_m_tiles = (M + BLOCK_SIZE_M - 1) // BLOCK_SIZE_M
        num_tiles = num_m_tiles * ((N + BLOCK_SIZE_N - 1) // BLOCK_SIZE_N)
        w_bufs, x_bufs, ready_bars, empty_bars = _alloc_ring(w_desc, x_desc, NUM_STAGES, 1)
        gl.warp_specialize([
            (_ps_mma_partition, (w_bufs, x_bufs, ready_bars, empty_bars, c_ptr, bias_ptr, M, N, stride_cm,
                                 stride_cn, num_tiles, num_m_tiles, k_tiles, BLOCK_SIZE_N, BLOCK_SIZE_M, NUM_STAGES,
                                 num_warps, HAS_BIAS, EPI)),
            (_ps_load_partition, (w_desc, x_desc, w_bufs, x_bufs, ready_bars, empty_bars, num_tiles, num_m_tiles,
                                  k_tiles, BLOCK_SIZE_N, BLOCK_SIZE_M, BLOCK_SIZE_K, NUM_STAGES)),
        ], [1], [40])


_GL_DTYPE = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16} if gluon is not None else {}


def _descriptors(a: torch.Tensor, b: torch.Tensor, cfg: WsGemmConfig):
    """TMA descriptors of the weight (``[BN, BK]`` boxes) and the activation (``[BM, BK]``), in the default
    NVMMA shared layout (the largest swizzle the box allows); the launcher and :func:`compile_offline` share them."""
    gdt = _GL_DTYPE[a.dtype]
    return (TensorDescriptor.from_tensor(b, [cfg.BN, cfg.BK],
                                         gl.NVMMASharedLayout.get_default_for([cfg.BN, cfg.BK], gdt)),
            TensorDescriptor.from_tensor(a, [cfg.BM, cfg.BK],
                                         gl.NVMMASharedLayout.get_default_for([cfg.BM, cfg.BK], gdt)))


def launch_wsgemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                  cfg: WsGemmConfig) -> torch.Tensor:
    """``out = a @ b.T (+ bias)``: a (M, K), b (N, K) bf16/fp16, unit K stride, 16-byte aligned rows; out (M, N)."""
    if gluon is None:
        raise RuntimeError("wsgemm needs Triton's Gluon (Triton >= 3.5)")
    M, K = a.shape
    N = b.shape[0]
    why = config_error(cfg, M, N, K)
    if why:
        raise ValueError(why)
    if a.dtype not in _GL_DTYPE or b.dtype != a.dtype:
        raise ValueError(f"wsgemm takes bf16/fp16 a and b of one dtype: a {a.dtype}, b {b.dtype}")
    row_align = 16 if cfg.PW else 8  # elements; cp.async: see _cpa_copy_tile
    if a.stride(1) != 1 or b.stride(1) != 1 or a.stride(0) % row_align or b.stride(0) % row_align:
        raise ValueError(f"wsgemm {cfg.name} needs unit K stride and row strides that are multiples of {row_align}: "
                         f"a {tuple(a.stride())}, b {tuple(b.stride())}")
    w_desc, x_desc = _descriptors(a, b, cfg)
    if cfg.CL > 1:
        from op_tests.op_benchmarks.explore_decode_mid import wsgemm_cluster
        return wsgemm_cluster.launch(a, b, bias, out, cfg, (w_desc, x_desc))
    k_tiles = triton.cdiv(K, cfg.BK)
    tiles = triton.cdiv(N, cfg.BN) * triton.cdiv(M, cfg.BM)
    if cfg.PS:
        sms = torch.cuda.get_device_properties(a.device).multi_processor_count
        _wsgemm_persistent_kernel[(min(tiles, cfg.PS * sms), )](
            w_desc, x_desc, out, bias if bias is not None else out, M, N, out.stride(0), out.stride(1), k_tiles,
            HAS_BIAS=bias is not None, NUM_STAGES=cfg.S, num_warps=cfg.W, EPI=cfg.E)
        return out
    if cfg.SK > 1:  # float32 partials per launch; the decode family's per-stream arrival counters (gemm_decode)
        ws = torch.empty((cfg.SK, M, N), dtype=torch.float32, device=a.device)
        cnt = _counters(a.device, tiles)
    else:
        ws = cnt = out  # unused
    _wsgemm_kernel[(tiles, cfg.SK)](w_desc, x_desc, b, a, out, bias if bias is not None else out, ws, cnt, M, N, K,
                                    b.stride(0), a.stride(0), out.stride(0), out.stride(1), k_tiles,
                                    triton.cdiv(k_tiles, cfg.SK), cfg.SK,
                                    HAS_BIAS=bias is not None, NUM_STAGES=cfg.S, num_warps=cfg.W, DIAG=cfg.D,
                                    PW=cfg.PW, EPI=cfg.E)
    return out


def grid_configs(M: int, N: int, K: int, cu: int, wide: bool = False, cluster: bool = False) -> list[WsGemmConfig]:
    """Exploration grid: BM = M rounded up to a power of 2 (16..256), and its half and quarter (>= 16: several M
    tiles read the same weight rows, the second from L2, instead of splitting K); BN 64 (4 warps) / 128 (4 or 8) /
    256 (8); BK 64/128; the deepest ring that fits one or two CTAs per SM; the K splits that bring the CTAs to
    0.9-2.2 per SM, and none where the tiles fill half the SMs; each fed by TMA and by 4 cp.async producer warps,
    each with the three epilogue layouts; and the persistent kernel (1 or 2 CTAs per SM, epilogue layouts 1 and 2)
    where the tiles come to 1.5 or more per CTA. ``wide``: also BK 256, rings of 2-4 stages and splits up to 4.5
    CTAs per SM (many small CTAs, as the gemv runs). ``cluster``: the epilogue layout 0 only, plus the cluster
    configs (``CL`` 2/4/8 K splits summed through DSMEM, 4 cp.async producer warps) that bring the CTAs to 0.9-2.2 per
    SM, with the deepest ring that fits beside the receive buffer at one or two CTAs per SM."""
    bm_full = min(256, max(16, 1 << (M - 1).bit_length()))
    hi = 4.5 if wide else 2.2
    out = []
    for bm, bn, w in ((bm, bn, w) for bm in (bm_full, bm_full // 2, bm_full // 4) if bm >= 16
                      for bn, w in ((64, 4), (128, 4), (128, 8), (256, 8))):
        tiles = -(-N // bn) * -(-M // bm)
        # No split as well where the tiles fill half the SMs: a split's fix-up costs more than idle SMs there
        # (ws7: the fix-up took 2.6-4 us at N = 1280; 1.45 CTAs per SM of 192 tiles lost to 0.73 of 96).
        splits = [1] if tiles >= 0.5 * cu else []
        splits += [s for s in range(2, 65) if 0.9 * cu <= tiles * s <= hi * cu][:6 if wide else 3]
        for bk in ((64, 128, 256) if wide else (64, 128)):
            per_stage = (bn + bm) * bk * 2
            depths = {min(12, _SMEM_LIMIT // per_stage), min(12, (_SMEM_LIMIT // 2 - 1024) // per_stage)}
            if wide:
                depths |= {2, 3, 4}
            for s in sorted(d for d in depths if d >= (2 if wide else 3)):
                for sk in splits:
                    for pw in (0, 4):
                        for e in ((0, ) if cluster else (0, 1, 2)):
                            c = WsGemmConfig(bn, bm, bk, sk, w, s, 0, pw, e)
                            if config_error(c, M, N, K) is None:
                                out.append(c)
            for cl in ((2, 4, 8) if cluster else ()):
                bufs = 2 * bn * bm * 4  # the partial and the receive buffer
                for room in (_SMEM_LIMIT - bufs, _SMEM_LIMIT // 2 - 1024 - bufs):
                    c = WsGemmConfig(bn, bm, bk, cl, w, min(12, room // per_stage), 0, 4, 0, 0, cl)
                    if 0.9 * cu <= tiles * cl <= hi * cu and c.S >= 3 and config_error(c, M, N, K) is None:
                        out.append(c)
            # Persistent: where the tiles come to 1.5 or more per CTA, so the epilogues overlap a stream.
            for ps in (1, 2):
                for e in (1, 2):
                    c = WsGemmConfig(bn, bm, bk, 1, w, 0, 0, 0, e, ps)
                    per_stage, room = (bn + bm) * bk * 2, _SMEM_LIMIT // ps - (1024 if ps > 1 else 0)
                    depth = min(12, (room - (bn * bm * 4 if e != 1 else 0)) // per_stage)
                    c = WsGemmConfig(bn, bm, bk, 1, w, depth, 0, 0, e, ps)
                    if tiles >= 1.5 * ps * cu and config_error(c, M, N, K) is None:
                        out.append(c)
    return out


def compile_offline(cfg: WsGemmConfig, M: int, N: int, K: int, has_bias: bool = False, arch: int = 90):
    """Compile :func:`_wsgemm_kernel` (``PS`` configs: :func:`_wsgemm_persistent_kernel`) for ``sm_<arch>`` without a
    GPU (Triton's own ptxas): the CPU tests read its PTX; the arguments are specialised as a launch on (M, N, K) bf16
    tensors would be."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    descs = dict(zip(("w_desc", "x_desc"), _descriptors(torch.empty(M, K, dtype=torch.bfloat16),
                                                        torch.empty(N, K, dtype=torch.bfloat16), cfg)))
    ptr_types = dict(w_ptr="*bf16", x_ptr="*bf16", c_ptr="*bf16", bias_ptr="*bf16", ws_ptr="*fp32", cnt_ptr="*i32")
    constexprs = dict(HAS_BIAS=has_bias, NUM_STAGES=cfg.S, num_warps=cfg.W, DIAG=cfg.D, PW=cfg.PW,
                         EPI=cfg.E)
    k_tiles = triton.cdiv(K, cfg.BK)
    ints = dict(M=M, N=N, K=K, stride_wn=K, stride_xm=K, stride_cm=N, stride_cn=1, k_tiles=k_tiles,
                k_tiles_per_split=triton.cdiv(k_tiles, cfg.SK), num_ksplit=cfg.SK)
    kernel = _wsgemm_persistent_kernel if cfg.PS else _wsgemm_kernel
    if cfg.CL > 1:
        from op_tests.op_benchmarks.explore_decode_mid import wsgemm_cluster
        kernel, constexprs["CL"] = wsgemm_cluster._wscl_kernel, cfg.CL
    names = kernel.arg_names
    constexprs = {n: v for n, v in constexprs.items() if n in names}
    ints = {n: v for n, v in ints.items() if n in names}
    sig = {n: (mangle_type(descs[n]) if n in descs else ptr_types.get(n, "constexpr" if n in constexprs else "i32"))
           for n in names}
    # As the launcher's JIT specialises: pointers 16-byte aligned, integers that are multiples of 16 marked so
    # (the cp.async producers' 16-byte copies need both), integers equal to 1 folded.
    for n, v in ints.items():
        if v == 1:
            sig[n], constexprs[n] = "constexpr", 1
    attrs = {(names.index(n),): [["tt.divisibility", 16]]
             for n in names if n in ptr_types or (n in ints and ints[n] % 16 == 0 and ints[n] != 1)}
    src = GluonASTSource(kernel, sig, {(names.index(n),): v for n, v in constexprs.items()}, attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=cfg.W))
