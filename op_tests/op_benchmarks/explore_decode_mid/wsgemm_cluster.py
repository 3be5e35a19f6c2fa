"""wsgemm with its K splits summed through distributed shared memory (exploration, issue 14; Triton >= 3.9).

Why
===

``wsgemm.py`` measured on the H100 that its weight stream alone runs 1.32-1.69x faster than F.linear at N = 1280,
but that the split-K fix-up (float32 partials to global memory, a counter, the last split re-reading them) costs
1.7-4.2 us, which leaves the full kernel at 1.04-1.11x. Here the ``CL`` K splits of one output tile are the CTAs of
one thread-block cluster: each runs wsgemm's producer / consumer ring over its K slice, then writes its float32
partial into its own shared memory, destination-major (slice ``q`` = the ``BN / CL`` rows CTA ``q`` owns), and one
thread bulk-copies slice q into slot ``rank`` of CTA q's receive buffer through distributed shared memory (DSMEM:
``cp.async.bulk.shared::cluster.shared::cta``, one copy per destination), the bytes counted on CTA q's receive
mbarrier, which each CTA armed with the bytes all CL slices bring. A CTA waits on it, sums the ``CL`` slots in split
order (deterministic), stores its rows, and before it exits waits until every CTA has received its slice (a relaxed
remote arrive on a ``done`` mbarrier: a bulk copy reads its source until it lands; without the wait, D 8, the H100
reported an unspecified launch failure). Nothing goes through global memory but the output.

What it showed (H100, BENCHMARKS.md "M 17-256: the K splits summed through distributed shared memory"): correct and
deterministic, but slower than wsgemm's global-memory fix-up on every shape measured. The exchange cost 1.6-14 us;
the handshake alone (D 7: 16-byte slices) 0.4-1.5 us, the rest grew with the bytes (16 KB per CTA: 1.2 us in
clusters of 2, 3.6-6.4 us in clusters of 4 or 8). Two earlier exchanges measured the same way, at the commits named
there: per-thread ``st.shared::cluster`` + ``mbarrier.arrive.release.cluster`` (ptxas: a ``MEMBAR.ALL.GPU`` per
arrive) and one ``st.async`` per 16 bytes (complete_tx on the owner's mbarrier), no faster.

How it is written
=================

Gluon's own cross-CTA layout conversion would express the exchange, but it needs the kernel compiled for clusters
(``num_ctas``), where every layout must describe the cluster and the TMA and wgmma of wsgemm's partitions would have
to be re-expressed as cluster-wide tensors (and Triton 3.6, the H100's, fails to lower the conversion). So the kernel
is compiled as for one CTA (``program_id`` is the CTA's own index: tile = pid // CL, split = pid % CL) and launched
in clusters of ``CL`` CTAs along x (:func:`launch` sets the compiled kernel's cluster size); the exchange is inline
PTX through ``gl.inline_asm``, which takes shared-memory descriptors as operands (Triton >= 3.9).

The receive mbarrier must be initialised (and armed) before another CTA's bytes land on it: each CTA initialises
it, fences the initialisation to the cluster and arrives on the cluster barrier at the start
(``barrier.cluster.arrive``: the default warps in the prologue, the producer warps at the start of their
partition), and waits on the cluster barrier only after its own K split (``barrier.cluster.wait``), just before its
first remote store. A cluster barrier waits for every thread of the cluster that has not exited, so the CTA must
have no idle warps: Triton pads the warp-specialised region's warps to whole warpgroups, which for one TMA producer
warp leaves three warps parked in its scheduler loop; the configs therefore use 4 cp.async producer warps (``_P4``:
4 + 4 or 8 + 4 warps).

Configs are wsgemm's with ``_CL<c>`` (``c`` = ``SK`` = 2, 4 or 8): :func:`wsgemm.launch_wsgemm` hands them here.
"""

from __future__ import annotations

import torch
import triton

from op_tests.op_benchmarks.explore_decode_mid import wsgemm as ws

try:
    from triton.experimental.gluon.language.nvidia.hopper import cluster as _cluster  # noqa: F401  (3.9+)
    HAS_CLUSTER = ws.gluon is not None
except ImportError:  # Triton 3.6: no cluster module, and the cross-CTA conversion does not lower
    HAS_CLUSTER = False

if HAS_CLUSTER:
    gluon, gl, mbarrier = ws.gluon, ws.gl, ws.mbarrier
    from triton.runtime.jit import constexpr_function

    @constexpr_function
    def _store_own_asm(outputs, inputs):
        """Per group of 4 consecutive rows of one token: store the 4 floats into this CTA's own shared memory at an
        offset (``mapa`` to its own rank gives the address the CTA-id bits)."""
        vals, addrs = inputs
        return "\n".join(
            f"{{ .reg .b32 me, a; mov.u32 me, %cluster_ctarank; mapa.shared::cluster.u32 a, {addrs[i]}, me; "
            f"st.shared.v4.f32 [a], {{{vals[i]}, {vals[i + 1]}, {vals[i + 2]}, {vals[i + 3]}}}; }}"
            for i in range(0, len(vals), 4))

    @constexpr_function
    def _send_asm(CL, SLOT, SENT):
        """Thread 0: bulk-copy slice q of this CTA's partial ($0: ``part``) into slot ``rank`` ($3) of CTA q's
        ``recv`` ($1), the bytes counted on CTA q's receive mbarrier ($2), for every q of the cluster."""
        lines = ["{ .reg .pred p; .reg .b32 t, me, src, dst, b; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
                 "mov.u32 me, %cluster_ctarank;"]
        for q in range(CL):
            lines.append(f"add.u32 src, $0, {q * SLOT}; mapa.shared::cluster.u32 src, src, me; "
                         f"mad.lo.u32 dst, $3, {SLOT}, $1; mapa.shared::cluster.u32 dst, dst, {q}; "
                         f"mapa.shared::cluster.u32 b, $2, {q}; "
                         f"@p cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes "
                         f"[dst], [src], {SENT}, [b];")
        return "\n".join(lines) + " }"

    @constexpr_function
    def _done_asm(CL):
        """Thread 0: tell every CTA of the cluster (its ``done`` mbarrier, $0) that its slice for this CTA has
        landed, so it may exit (a bulk copy reads its source until then)."""
        return ("{ .reg .pred p; .reg .b32 t, b; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
                + " ".join(f"mapa.shared::cluster.u32 b, $0, {q}; "
                           "@p mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [b];" for q in range(CL))
                + " }")

    @gluon.jit
    def _cluster_arrive():
        gl.inline_asm("barrier.cluster.arrive.relaxed.aligned;", "", [], (), is_pure=False)

    @gluon.jit
    def _cl_load_partition(w_ptr, x_ptr, w_bufs, x_bufs, ready_bars, empty_bars, off_n, off_m, kt_begin, n_iters,
                           N, M, K, stride_wn, stride_xm,
                           BLOCK_SIZE_N: gl.constexpr, BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_K: gl.constexpr,
                           NUM_STAGES: gl.constexpr, PW: gl.constexpr, DIAG: gl.constexpr):
        """wsgemm's cp.async producers, after arriving on the cluster barrier (every warp of the cluster must)."""
        _cluster_arrive()
        ws._cpa_load_partition(w_ptr, x_ptr, w_bufs, x_bufs, ready_bars, empty_bars, off_n, off_m, kt_begin,
                               n_iters, N, M, K, stride_wn, stride_xm, BLOCK_SIZE_N, BLOCK_SIZE_M, BLOCK_SIZE_K,
                               NUM_STAGES, PW, DIAG)

    @gluon.jit
    def _wscl_kernel(w_desc, x_desc, w_ptr, x_ptr, c_ptr, bias_ptr, M, N, K, stride_wn, stride_xm, stride_cm,
                     stride_cn, k_tiles, k_tiles_per_split,
                     HAS_BIAS: gl.constexpr, NUM_STAGES: gl.constexpr, num_warps: gl.constexpr, CL: gl.constexpr,
                     DIAG: gl.constexpr = 0, PW: gl.constexpr = 4):
        """One ``[BLOCK_SIZE_N x BLOCK_SIZE_M]`` tile of C.T per cluster of CL CTAs; CTA r runs K split r."""
        BLOCK_SIZE_N: gl.constexpr = w_desc.block_type.shape[0]
        BLOCK_SIZE_K: gl.constexpr = w_desc.block_type.shape[1]
        BLOCK_SIZE_M: gl.constexpr = x_desc.block_type.shape[0]
        ROWS: gl.constexpr = BLOCK_SIZE_N // CL  # rows of the tile each CTA sums and stores
        pid = gl.program_id(0)
        tile = pid // CL
        rank = pid % CL  # = %cluster_ctarank: clusters of CL consecutive CTAs along x
        num_m_tiles = (M + BLOCK_SIZE_M - 1) // BLOCK_SIZE_M
        off_n = (tile // num_m_tiles) * BLOCK_SIZE_N
        off_m = (tile % num_m_tiles) * BLOCK_SIZE_M
        kt_begin = rank * k_tiles_per_split
        n_iters = gl.minimum(kt_begin + k_tiles_per_split, k_tiles) - kt_begin  # >= 1 (config_error)

        w_bufs, x_bufs, ready_bars, empty_bars = ws._alloc_ring(w_desc, x_desc, NUM_STAGES, PW * 32)
        # part: this CTA's partial, slice q = the ROWS rows CTA q owns; recv: slot s = split s's partial of this CTA's
        # rows. Both [CL, BM, ROWS] float32, token-major, rows contiguous.
        SLOT: gl.constexpr = BLOCK_SIZE_M * ROWS * 4
        plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
        part = gl.allocate_shared_memory(gl.float32, [CL, BLOCK_SIZE_M, ROWS], plain)
        recv = gl.allocate_shared_memory(gl.float32, [CL, BLOCK_SIZE_M, ROWS], plain)
        recv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        done_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(recv_bar, count=1)
        mbarrier.init(done_bar, count=CL)  # one arrival per CTA that has received its slice of `part`
        # recv_bar's one arrival now, with the bytes the CL slices will bring: its phase completes once they landed.
        # Diagnostics: D 7 sends 16 bytes per slice (the handshake without the transfer), D 8 skips the done wait.
        SENT: gl.constexpr = 16 if DIAG == 7 else SLOT
        mbarrier.expect(recv_bar, CL * SENT)
        gl.inline_asm("fence.mbarrier_init.release.cluster;", "", [], (), is_pure=False)
        if DIAG != 5:
            _cluster_arrive()

        res = gl.warp_specialize([
            (ws._mma_partition, (w_bufs, x_bufs, ready_bars, empty_bars, n_iters,
                                 BLOCK_SIZE_N, BLOCK_SIZE_M, NUM_STAGES, num_warps, DIAG, True)),
            (_cl_load_partition, (w_ptr, x_ptr, w_bufs, x_bufs, ready_bars, empty_bars, off_n, off_m,
                                  kt_begin, n_iters, N, M, K, stride_wn, stride_xm,
                                  BLOCK_SIZE_N, BLOCK_SIZE_M, BLOCK_SIZE_K, NUM_STAGES, PW, DIAG)),
        ], [PW], [88])
        # Every CTA of the cluster has initialised its receive mbarrier (and no warp has exited yet).
        if DIAG != 5:
            gl.inline_asm("barrier.cluster.wait.acquire.aligned;", "", [], (), is_pure=False)
        if DIAG == 4:
            return
        # Exchange: the partial into `part` (4 consecutive rows per thread), visible to the async proxy; then thread
        # 0 bulk-copies slice q to CTA q for every q (CL copies).
        TN: gl.constexpr = min(32, BLOCK_SIZE_N // 4)
        push: gl.constexpr = gl.BlockedLayout([4, 1], [TN, 32 // TN], [1, num_warps], [0, 1])
        acc = gl.convert_layout(res[0], push)
        n = gl.arange(0, BLOCK_SIZE_N, layout=gl.SliceLayout(1, push))[:, None]
        m = gl.arange(0, BLOCK_SIZE_M, layout=gl.SliceLayout(0, push))[None, :]
        local = (((n // ROWS) * BLOCK_SIZE_M + m) * ROWS + n % ROWS) * 4
        if DIAG != 6:
            gl.inline_asm(_store_own_asm, ("f", "r"), [acc, local + _smem_base(part)], (), is_pure=False)
            gl.inline_asm("fence.proxy.async.shared::cta;", "", [], (), is_pure=False)
            ws._cta_barrier()
            gl.inline_asm(_send_asm(CL, SLOT, SENT), "r,r,r,r", [_smem_base(part), _smem_base(recv), recv_bar, rank],
                          (), is_pure=False)
            mbarrier.wait(recv_bar, 0)
            gl.inline_asm(_done_asm(CL), "r", [done_bar], (), is_pure=False)
        # Sum the CL partials of this CTA's rows in split order and store them (threads along the rows).
        TR: gl.constexpr = min(32, ROWS // 4)
        red: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 32 // TR, TR], [1, num_warps, 1], [2, 1, 0])
        total = gl.sum(recv.load(red), axis=0)
        out: gl.constexpr = gl.SliceLayout(0, red)
        offs_m = off_m + gl.arange(0, BLOCK_SIZE_M, layout=gl.SliceLayout(1, out))
        offs_n = off_n + rank * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(0, out))
        if HAS_BIAS:
            total += gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(gl.float32)[None, :]
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        gl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
                 total.to(c_ptr.dtype.element_ty), mask=mask)
        if DIAG != 6 and DIAG != 8:
            mbarrier.wait(done_bar, 0)  # every CTA has its slice of this CTA's `part`: no copy reads it any more

    @gluon.jit
    def _smem_base(buf):
        """The shared-memory offset of ``buf``'s origin in this CTA's window, as a scalar (Gluon hands inline_asm a
        descriptor without the CTA-id bits that sm_90 shared addresses carry in a cluster; ``mapa`` sets them)."""
        return gl.inline_asm("mov.u32 $0, $1;", "=r,r", [buf], gl.int32, is_pure=False)


def launch(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor, cfg: ws.WsGemmConfig,
           descs) -> torch.Tensor:
    """``out = a @ b.T (+ bias)`` with ``cfg.CL`` K splits per cluster (the checks are :func:`wsgemm.launch_wsgemm`'s).
    The kernel is compiled for one CTA; its cached compiled form is then told to launch in clusters of CL (Triton's
    launcher multiplies the grid by it and sets the cluster dimension)."""
    if not HAS_CLUSTER:
        raise RuntimeError(f"{cfg.name}: the DSMEM reduction needs Gluon's inline_asm on shared memory (Triton >= "
                           f"3.9); this is Triton {triton.__version__}")
    M, K = a.shape
    N = b.shape[0]
    w_desc, x_desc = descs
    k_tiles = triton.cdiv(K, cfg.BK)
    tiles = triton.cdiv(N, cfg.BN) * triton.cdiv(M, cfg.BM)
    args = (w_desc, x_desc, b, a, out, bias if bias is not None else out, M, N, K, b.stride(0), a.stride(0),
            out.stride(0), out.stride(1), k_tiles, triton.cdiv(k_tiles, cfg.CL))
    kw = dict(HAS_BIAS=bias is not None, NUM_STAGES=cfg.S, num_warps=cfg.W, CL=cfg.CL, DIAG=cfg.D, PW=cfg.PW)
    launch_in_clusters(_wscl_kernel, tiles, cfg.CL, args, kw)
    return out


def launch_in_clusters(kernel, clusters: int, cl: int, args: tuple, kw: dict):
    """Launch a kernel compiled for one CTA as ``clusters`` clusters of ``cl`` CTAs along x: Triton's launcher
    multiplies grid x by the compiled kernel's CTA count and sets it as the cluster dimension, so the cached compiled
    kernel is told ``cl``; returns it."""
    compiled = kernel.warmup(*args, grid=(clusters, ), **kw)
    warps, ctas, smem = compiled.packed_metadata
    if ctas != cl:
        compiled.packed_metadata = (warps, cl, smem)
    kernel[(clusters, )](*args, **kw)
    return compiled
