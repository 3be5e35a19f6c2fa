"""The ``ws`` kernel type of the TileLang FP8 block-scale GEMM: hand-scheduled warp specialisation, DeepGEMM's
design for M >= 64 (config, name and support rule: :mod:`aiter_gemm.kernels.a8w8_blockscale_tilelang`).

One producer warpgroup (24 registers a thread after ``setmaxnreg``) issues the TMA loads of each 128-wide K block
of XQ and WQ into a ``num_stages`` ring and stages that block's token and weight scales in shared memory (read
``PREFETCH`` blocks ahead into registers, so their global-load latency is off the ring's critical path), then
arrives on the stage's ``full`` barrier. ``block_M / 64`` math warpgroups (240 or 160 registers) each own 64 token
rows: wait ``full``, read the scales, issue the block's wgmmas into a float32 partial tile, wait for them, release the
stage (``empty``) and promote the partial tile into the accumulator times the scales. The math warpgroups drift out
of phase, so one's promotion overlaps the other's wgmmas (the overlap TileLang's automatic warp specialisation of
``base`` lacks: 1.0-1.8x ``base``'s speed on the H100, docs/exploration.md). ``block_N`` may span two 128-row
weight-scale blocks (192): each column picks its block's scale.

TileLang's automatic passes are switched off for this kernel (:data:`PASS_CONFIGS`): they would add a second
producer and insert ``__syncthreads`` between the roles, which deadlocks a hand-scheduled pipeline.
No ``from __future__ import annotations``: TileLang reads the ``T.Tensor`` annotations from the builder's closure.
"""

SCALE_BLOCK = 128
#: Scale blocks the producer loads ahead of the stage it fills: 4 blocks (~2 us of wgmma at 128x128 tiles) cover an
#: L2 miss; a load in the producer's loop without it capped the kernel at the producer's latency.
PREFETCH = 4
#: Registers per thread after setmaxnreg: the producer drops to 24, the math warpgroups share the rest of 64K.
PRODUCER_REGS = 24
PASS_CONFIGS = {"tl.disable_warp_specialized": True, "tl.disable_thread_storage_sync": True}


def math_registers(groups: int) -> int:
    """Registers a math thread may take beside the 24-register producer (240 for 2 groups, 160 for 3)."""
    return min(240, (65536 - 128 * PRODUCER_REGS) // (128 * groups) // 8 * 8)


def build_ws(N: int, K: int, cfg, out_dtype: str = "bfloat16", mmajor: bool = False):
    """``ws``: CTA (bx, by) computes tokens [by*BM, +BM) x weight rows [bx*BN, +BN); M symbolic."""
    import tilelang.language as T  # here: aiter_gemm imports without tilelang

    M = T.dynamic("m")
    H, BK, BN, stages = 64, SCALE_BLOCK, cfg.block_N, cfg.num_stages
    groups = cfg.block_M // H
    BM = cfg.block_M
    KB = K // BK
    rows_per_thread = (BM + 127) // 128
    crosses = BN > SCALE_BLOCK or SCALE_BLOCK % BN != 0
    NB = (N + SCALE_BLOCK - 1) // SCALE_BLOCK
    fp8, f32 = "float8_e4m3fn", "float32"
    sa_shape = (KB, M) if mmajor else (M, KB)
    regs = math_registers(groups)

    def sa_at(SA, m, k):
        return SA[k, m] if mmajor else SA[m, k]

    @T.macro
    def math(A_s, B_s, SA_s, SB_s, full, empty, C, g, bx, by):
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
                    for r in T.unroll(rows_per_thread):
                        row = by * BM + i + 128 * r
                        pf[d * rows_per_thread + r] = 0.0
                        if row < M and d < KB and i + 128 * r < BM:
                            pf[d * rows_per_thread + r] = sa_at(SA, row, d)
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
                                for r in T.unroll(rows_per_thread):
                                    row = by * BM + i + 128 * r
                                    if row < M and i + 128 * r < BM:
                                        pf[d * rows_per_thread + r] = sa_at(SA, row, k + PREFETCH)
            with T.ws(0):
                T.set_max_nreg(regs, 1)
                math(A_s, B_s, SA_s, SB_s, full, empty, C, 0, bx, by)
            with T.ws(1):
                T.set_max_nreg(regs, 1)
                math(A_s, B_s, SA_s, SB_s, full, empty, C, 1, bx, by)
            if groups == 3:
                with T.ws(2):
                    T.set_max_nreg(regs, 1)
                    math(A_s, B_s, SA_s, SB_s, full, empty, C, 2, bx, by)

    return ws
