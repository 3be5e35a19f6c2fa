"""The hand-scheduled warp-specialised kernel types of the TileLang FP8 block-scale GEMM (configs, names and their
support rule: :mod:`aiter_gemm.kernels.a8w8_blockscale_tilelang_config`): ``ws``, DeepGEMM's design for M >= 64, and
``ws_swapAB``, the decode form that splits K over its math warpgroups (:func:`build_ws_swapped`).

One producer warpgroup (24 registers a thread after ``setmaxnreg``) issues the TMA loads of each 128-wide K block
of XQ and WQ into a ``num_stages`` ring and stages that block's token and weight scales in shared memory (read
``PREFETCH`` blocks ahead into registers, so their global-load latency is off the ring's critical path), then
arrives on the stage's ``full`` barrier. ``block_M / 64`` math warpgroups (240 or 160 registers) each own 64 token
rows: wait ``full``, read the scales, issue the block's wgmmas into a float32 partial tile, wait for them, release the
stage (``empty``) and promote the partial tile into the accumulator times the scales. The math warpgroups drift out
of phase, so one's promotion overlaps the other's wgmmas (the overlap TileLang's automatic warp specialisation of
``base`` lacks; docs/exploration.md, "The hand-scheduled warp-specialised FP8 kernel"). ``block_N`` may span two 128-row
weight-scale blocks (192): each column picks its block's scale.

TileLang's automatic passes are switched off for this kernel (:data:`PASS_CONFIGS`): they would add a second
producer and insert ``__syncthreads`` between the roles, which deadlocks a hand-scheduled pipeline.
No ``from __future__ import annotations``: TileLang reads the ``T.Tensor`` annotations from the builder's closure.
"""

from aiter_gemm.kernels.a8w8_blockscale_tilelang_config import PRODUCER_REGS, ws_math_registers
from aiter_gemm.kernels.blockscale_format import SCALE_BLOCK

#: Scale blocks the producer loads ahead of the stage it fills: 4 blocks (~2 us of wgmma at 128x128 tiles) cover an
#: L2 miss; a load in the producer's loop without it capped the kernel at the producer's latency.
PREFETCH = 4
PASS_CONFIGS = {"tl.disable_warp_specialized": True, "tl.disable_thread_storage_sync": True}


def _token_scales(T, M, rows: int, mmajor: bool):
    """The producers' read of one stage's token scales (both kernels, prologue and refill): producer thread ``i``
    reads x_scale of tokens row0 + i + 128 r of a ``rows``-token tile at K block ``k`` into ``pf[base + r]``; past M
    it reads nothing (``clear``: the slot is zeroed first; ``ok``: one more guard, the prologue's K bound)."""
    per_thread = (rows + 127) // 128

    @T.macro
    def load(SA, pf, base, row0, i, k, clear, ok):
        for r in T.unroll(per_thread):
            row = row0 + i + 128 * r
            if clear:
                pf[base + r] = 0.0
            if row < M and ok and i + 128 * r < rows:
                pf[base + r] = SA[k, row] if mmajor else SA[row, k]

    return load, per_thread


def build_ws(N: int, K: int, cfg, out_dtype: str = "bfloat16", mmajor: bool = False):
    """``ws``: CTA (bx, by) computes tokens [by*BM, +BM) x weight rows [bx*BN, +BN); M symbolic."""
    import tilelang.language as T  # here: aiter_gemm imports without tilelang

    M = T.dynamic("m")
    H, BK, BN, stages = 64, SCALE_BLOCK, cfg.block_N, cfg.num_stages
    groups = cfg.block_M // H
    BM = cfg.block_M
    KB = K // BK
    crosses = BN > SCALE_BLOCK or SCALE_BLOCK % BN != 0
    NB = (N + SCALE_BLOCK - 1) // SCALE_BLOCK
    fp8, f32 = "float8_e4m3fn", "float32"
    sa_shape = (KB, M) if mmajor else (M, KB)
    regs = ws_math_registers(groups)

    load_sa, rows_per_thread = _token_scales(T, M, BM, mmajor)

    @T.macro
    def math(A_s, B_s, SA_s, SB_s, full, empty, C, g, bx, by):
        with T.ws(g):  # math warpgroup g: its threads, its registers
            T.set_max_nreg(regs, 1)
            C_l = T.alloc_fragment((H, BN), f32)
            C_acc = T.alloc_fragment((H, BN), f32)
            Sc = T.alloc_fragment((H,), f32)
            Sc1 = T.alloc_fragment((H,), f32)
            first = (bx * BN // SCALE_BLOCK + 1) * SCALE_BLOCK - bx * BN  # columns below use the first scale block
            T.clear(C_acc)
            for k in T.serial(KB):
                s = k % stages
                T.mbarrier_wait_parity(full[s], (k // stages) & 1)
                for i in T.Parallel(H):
                    Sc[i] = SA_s[s, g * H + i] * SB_s[s, 0]
                if crosses:
                    for i in T.Parallel(H):
                        Sc1[i] = SA_s[s, g * H + i] * SB_s[s, 1]
                T.wgmma_gemm(A_s[s, g * H:(g + 1) * H, :], B_s[s, :, :], C_l, transpose_B=True, clear_accum=True)
                T.wait_wgmma(0)
                T.mbarrier_arrive(empty[s])
                if crosses:
                    for i, j in T.Parallel(H, BN):
                        C_acc[i, j] += C_l[i, j] * T.if_then_else(j < first, Sc[i], Sc1[i])
                else:
                    for i, j in T.Parallel(H, BN):
                        C_acc[i, j] += C_l[i, j] * Sc[i]
            T.copy(C_acc, C[by * BM + g * H, bx * BN])

    @T.prim_func
    def ws(A: T.Tensor((M, K), fp8), B: T.Tensor((N, K), fp8), C: T.Tensor((M, N), out_dtype),
           SA: T.Tensor(sa_shape, f32), SB: T.Tensor((NB, KB), f32)):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=128 * (groups + 1)) as (bx, by):
            A_s = T.alloc_shared((stages, BM, BK), fp8)
            B_s = T.alloc_shared((stages, BN, BK), fp8)
            SA_s = T.alloc_shared((stages, BM), f32)
            SB_s = T.alloc_shared((stages, 4), f32)
            full = T.alloc_barrier([128] * stages)  # the producer's 128 threads (+ the TMA bytes)
            empty = T.alloc_barrier([128 * groups] * stages)
            if cfg.swizzle:
                T.use_swizzle(panel_size=cfg.swizzle)
            tx = T.get_thread_binding()
            with T.ws(groups):
                T.set_max_nreg(PRODUCER_REGS, 0)
                i = tx - 128 * groups
                b0 = bx * BN // SCALE_BLOCK
                b1 = T.min(b0 + 1, NB - 1)
                pf = T.alloc_local((PREFETCH * rows_per_thread,), f32)
                pfb = T.alloc_local((PREFETCH * 2,), f32)
                for d in T.unroll(PREFETCH):
                    pfb[2 * d] = SB[b0, T.min(d, KB - 1)]
                    pfb[2 * d + 1] = SB[b1, T.min(d, KB - 1)]
                    load_sa(SA, pf, d * rows_per_thread, by * BM, i, d, True, d < KB)
                for k0 in T.serial(T.ceildiv(KB, PREFETCH)):
                    for d in T.unroll(PREFETCH):
                        k = k0 * PREFETCH + d
                        if k < KB:
                            s = k % stages
                            T.mbarrier_wait_parity(empty[s], ((k // stages) & 1) ^ 1)
                            T.tma_copy(A[by * BM:(by + 1) * BM, k * BK:(k + 1) * BK], A_s[s, :, :], barrier=full[s])
                            T.tma_copy(B[bx * BN:(bx + 1) * BN, k * BK:(k + 1) * BK], B_s[s, :, :], barrier=full[s])
                            for r in T.unroll(rows_per_thread):
                                if i + 128 * r < BM:
                                    SA_s[s, i + 128 * r] = pf[d * rows_per_thread + r]
                            if i == 0:
                                SB_s[s, 0] = pfb[2 * d]
                                SB_s[s, 1] = pfb[2 * d + 1]
                            T.mbarrier_arrive(full[s])
                            if k + PREFETCH < KB:
                                pfb[2 * d] = SB[b0, k + PREFETCH]
                                pfb[2 * d + 1] = SB[b1, k + PREFETCH]
                                load_sa(SA, pf, d * rows_per_thread, by * BM, i, k + PREFETCH, False, True)
            math(A_s, B_s, SA_s, SB_s, full, empty, C, 0, bx, by)
            math(A_s, B_s, SA_s, SB_s, full, empty, C, 1, bx, by)
            if groups == 3:
                math(A_s, B_s, SA_s, SB_s, full, empty, C, 2, bx, by)

    return ws


def build_ws_swapped(N: int, K: int, cfg, out_dtype: str = "bfloat16", mmajor: bool = False):
    """``ws_swapAB``: CTA (bx, by) computes tokens [bx*BN, +BN) x weight rows [by*64, +64) (the weight on wgmma's M
    side, as ``swapAB``) with K split over its ``threads / 128 - 1`` math warpgroups.

    The producer warpgroup fills a ``num_stages`` ring in K order, ``block_K / 128`` scale groups a stage (TMA loads,
    the stage's token and weight scales staged as in ``ws``); math warpgroup g takes stages g, g + G, ... (the stage
    count is a multiple of G, so a ring slot always serves one warpgroup) into its own float32 accumulator. At the end
    warpgroups 1..G-1 park their accumulators in shared memory and warpgroup 0 adds them and stores the tile. Why:
    at decode M 17-256 one warpgroup's K loop (wait for the stage, wgmma, wait, promote) is latency-bound (tensor pipe
    23-41% busy, DRAM 0.9-1.3 TB/s on the H100); G loops of K / G blocks run side by side and one's promotion overlaps
    the others' wgmmas, with no second kernel and no float32 partials in HBM (what ``splitK_swapAB`` pays).
    ``min_blocks`` 2 launches two CTAs an SM (half the registers and shared memory each), so one CTA's ramp and
    epilogue overlap the other's stream where the grid passes the SMs (at M 40 and 64 on the (10240, 5120) weight
    1.13x the best config of one CTA an SM, H100)."""
    import tilelang.language as T  # here: aiter_gemm imports without tilelang

    M = T.dynamic("m")
    BW, BT, GK, stages = cfg.block_M, cfg.block_N, cfg.groups, cfg.num_stages
    G = cfg.threads // 128 - 1
    BK = SCALE_BLOCK * GK
    KB = K // SCALE_BLOCK
    KS = KB // GK  # ring stages in all
    NB = (N + SCALE_BLOCK - 1) // SCALE_BLOCK
    fp8, f32 = "float8_e4m3fn", "float32"
    sa_shape = (KB, M) if mmajor else (M, KB)
    regs = ws_math_registers(G, cfg.min_blocks)
    PF = PREFETCH

    load_sa, tok_per_thread = _token_scales(T, M, BT, mmajor)

    @T.macro
    def math(W_s, X_s, SA_s, SB_s, full, empty, R_s, done, C, g, bx, by):
        with T.ws(g):  # math warpgroup g: its threads, its registers
            T.set_max_nreg(regs, 1)
            C_l = T.alloc_fragment((BW, BT), f32)
            C_acc = T.alloc_fragment((BT, BW), f32)  # (tokens, weight rows): stored as out's tile
            Sc = T.alloc_fragment((BT,), f32)
            T.clear(C_acc)
            for kk in T.serial((KS - g + G - 1) // G):
                ks = kk * G + g
                s = ks % stages
                T.mbarrier_wait_parity(full[s], (ks // stages) & 1)
                for q in T.unroll(GK):
                    for j in T.Parallel(BT):
                        Sc[j] = SA_s[s, q * BT + j] * SB_s[s, q]
                    T.wgmma_gemm(W_s[s, :, q * SCALE_BLOCK:(q + 1) * SCALE_BLOCK],
                                 X_s[s, :, q * SCALE_BLOCK:(q + 1) * SCALE_BLOCK], C_l, transpose_B=True,
                                 clear_accum=True)
                    T.wait_wgmma(0)
                    if q == GK - 1:  # the stage's operands and scales are read: the producer may refill it
                        T.mbarrier_arrive(empty[s])
                    for i, j in T.Parallel(BW, BT):
                        C_acc[j, i] += C_l[i, j] * Sc[j]
            if g > 0:
                T.copy(C_acc, R_s[g - 1, :, :])
                T.mbarrier_arrive(done[0])
            else:  # G >= 2 (the config rule)
                T.mbarrier_wait_parity(done[0], 0)
                for r in T.unroll(G - 1):
                    for j, i in T.Parallel(BT, BW):
                        C_acc[j, i] += R_s[r, j, i]
                T.copy(C_acc, C[bx * BT, by * BW])

    @T.macro
    def produce(A, B, SA, SB, W_s, X_s, SA_s, SB_s, full, empty, i, bx, by):
        wb = by * BW // SCALE_BLOCK
        pf = T.alloc_local((PF * GK * tok_per_thread,), f32)  # token scales, PF stages ahead
        pfb = T.alloc_local((PF * GK,), f32)  # the weight block's scales
        for d in T.unroll(PF):
            for q in T.unroll(GK):
                kq = T.min(d * GK + q, KB - 1)
                pfb[d * GK + q] = SB[wb, kq]
                load_sa(SA, pf, (d * GK + q) * tok_per_thread, bx * BT, i, kq, True, True)
        for k0 in T.serial((KS + PF - 1) // PF):
            for d in T.unroll(PF):
                ks = k0 * PF + d
                if ks < KS:
                    s = ks % stages
                    T.mbarrier_wait_parity(empty[s], ((ks // stages) & 1) ^ 1)
                    T.tma_copy(B[by * BW:(by + 1) * BW, ks * BK:(ks + 1) * BK], W_s[s, :, :], barrier=full[s])
                    T.tma_copy(A[bx * BT:(bx + 1) * BT, ks * BK:(ks + 1) * BK], X_s[s, :, :], barrier=full[s])
                    for q in T.unroll(GK):
                        for r in T.unroll(tok_per_thread):
                            if i + 128 * r < BT:
                                SA_s[s, q * BT + i + 128 * r] = pf[(d * GK + q) * tok_per_thread + r]
                        if i == 0:
                            SB_s[s, q] = pfb[d * GK + q]
                    T.mbarrier_arrive(full[s])
                    if ks + PF < KS:
                        for q in T.unroll(GK):
                            kq = (ks + PF) * GK + q
                            pfb[d * GK + q] = SB[wb, kq]
                            load_sa(SA, pf, (d * GK + q) * tok_per_thread, bx * BT, i, kq, False, True)

    @T.prim_func
    def ws_swap_ab(A: T.Tensor((M, K), fp8), B: T.Tensor((N, K), fp8), C: T.Tensor((M, N), out_dtype),
                   SA: T.Tensor(sa_shape, f32), SB: T.Tensor((NB, KB), f32)):
        # tokens on the grid's x: the CTAs sharing a weight tile run side by side and meet its bytes in L2
        with T.Kernel(T.ceildiv(M, BT), T.ceildiv(N, BW), threads=128 * (G + 1)) as (bx, by):
            if cfg.min_blocks > 1:  # __launch_bounds__(threads, 2): two CTAs an SM, the launch pool halved
                T.annotate_min_blocks_per_sm(cfg.min_blocks)
            W_s = T.alloc_shared((stages, BW, BK), fp8)
            X_s = T.alloc_shared((stages, BT, BK), fp8)
            SA_s = T.alloc_shared((stages, GK * BT), f32)
            SB_s = T.alloc_shared((stages, GK), f32)
            R_s = T.alloc_shared((G - 1, BT, BW), f32)
            full = T.alloc_barrier([128] * stages)  # the producer's 128 threads (+ the TMA bytes)
            empty = T.alloc_barrier([128] * stages)  # the one math warpgroup the slot serves
            done = T.alloc_barrier([128 * (G - 1)])  # warpgroups 1..G-1 have parked their accumulators
            tx = T.get_thread_binding()
            with T.ws(G):
                T.set_max_nreg(PRODUCER_REGS, 0)
                produce(A, B, SA, SB, W_s, X_s, SA_s, SB_s, full, empty, tx - 128 * G, bx, by)
            math(W_s, X_s, SA_s, SB_s, full, empty, R_s, done, C, 0, bx, by)
            math(W_s, X_s, SA_s, SB_s, full, empty, R_s, done, C, 1, bx, by)
            if G >= 3:
                math(W_s, X_s, SA_s, SB_s, full, empty, R_s, done, C, 2, bx, by)
            if G >= 4:
                math(W_s, X_s, SA_s, SB_s, full, empty, R_s, done, C, 3, bx, by)

    return ws_swap_ab
