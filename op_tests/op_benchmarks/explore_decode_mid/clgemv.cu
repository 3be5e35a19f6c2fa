// Cluster split-K tensor-core GEMV for batched decode: Y[M, N] = X[M, K] @ W[N, K]^T (+ bias), M <= 128 per tile.
//
// Why: at M 17-256 a decode GEMM must give every SM a share of the weight, and N / rows-per-tile tiles are too few,
// so K is split. Split-K as cuBLAS and the Triton decode family do it costs one of two things: float32 partials
// written to and read back from global memory (a second kernel, or one program summing every split alone), or
// smaller tiles, each of which re-reads the whole activation slice from L2 (M / rows-per-tile times the weight's
// bytes). Here the K splits of one tile are the CTAs of one thread-block cluster (CL_S of them): each CTA keeps its
// activation slice (MT tokens x K / CL_S) resident in shared memory, loaded once with cp.async while the first
// weight loads are in flight, streams its weight rows from global memory straight into mma.sync A fragments (the
// k permutation of ``tcgemv.cu``: one 16-byte load of 8 consecutive k of a row holds the A elements of two
// m16n8k16 steps), and at the end the cluster sums its partial tiles through distributed shared memory: CTA r adds
// rows [r BN / S, (r + 1) BN / S) of every peer's tile in rank order (deterministic), adds the bias and stores Y.
// No partial touches global memory; tiles of 16 CL_WN rows keep the activation re-reads at M / (16 CL_WN) of the
// weight.
//
// Compile-time parameters (prepended #defines): CL_MT tokens per tile (multiple of 8, <= 128), CL_WN warps (16 rows
// each), CL_U 32-k chunks per weight stage, CL_S CTAs per cluster = K splits (1, 2, 4 or 8), CL_KS = K / CL_S (the
// split's length, a multiple of 32 CL_U), IN_F16 (0: bf16, 1: fp16 operands), OUT_KIND (0 bf16, 1 fp16, 2 fp32),
// HAS_BIAS. Grid: x = N tiles x M tiles (M tiles fastest), y = CL_S. Dynamic shared memory: cl_smem_bytes().
// Requires 16-byte aligned rows (ldx, ldw multiples of 8) and base pointers.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

struct V4 {
  u32 x, y, z, w;
};

#define CL_BN (16 * CL_WN)
#define CL_NJ (CL_MT / 8)
#define CL_KC (32 * CL_U)
#define CL_NST (CL_KS / CL_KC)
// B fragments read ahead of their products: up to 8 token groups (32 registers) at a time, a divisor of CL_NJ.
#define CL_JB (CL_NJ <= 8 ? CL_NJ : CL_NJ % 8 == 0 ? 8 : CL_NJ % 4 == 0 ? 4 : CL_NJ % 2 == 0 ? 2 : 1)
#ifndef CL_DIAG
#define CL_DIAG 0  // diagnostics (timing only, wrong results): 1 no products, 2 no cluster reduction
#endif
// Activation row pitch in shared memory: an odd multiple of 64 bytes, so that the 16-byte reads of a warp's 8 tokens
// x 4 k-groups (one phase: 2 tokens x 64 bytes) fall in different banks.
#define CL_XP ((CL_KS * 2) % 128 == 0 ? CL_KS * 2 + 64 : CL_KS * 2)
#define CL_X_BYTES (CL_MT * CL_XP)
#define CL_P_BYTES (CL_S > 1 ? CL_MT * CL_BN * 4 : 0)
#define CL_BAR_OFF (CL_X_BYTES > CL_P_BYTES ? CL_X_BYTES : CL_P_BYTES)

__device__ __forceinline__ V4 ld_stream(const u16* p) {  // the weight: read once, keep it out of L1
  V4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ u32 pair(const V4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if IN_F16
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ float in_to_f32(u16 h) {
  float f;
#if IN_F16
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
#else
  asm("mov.b32 %0, %1;" : "=f"(f) : "r"(((u32)h) << 16));
#endif
  return f;
}

__device__ __forceinline__ void store_out(void* y, long idx, float v) {
#if OUT_KIND == 2
  reinterpret_cast<float*>(y)[idx] = v;
#else
  u16 h;
#if OUT_KIND == 1
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
#else
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
#endif
  reinterpret_cast<u16*>(y)[idx] = h;
#endif
}

__device__ __forceinline__ u32 smem_u32(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

__device__ __forceinline__ void cp_async16(u32 dst, const u16* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

// This thread's arrival on `bar` fires when its earlier cp.asyncs have landed (the barrier counts every thread).
__device__ __forceinline__ void cp_async_arrive(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void bar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void bar_wait_phase0(u32 bar) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n"
      " @!p bra WAIT_%=;\n}" ::"r"(bar)
      : "memory");
}

__device__ __forceinline__ V4 lds128(u32 addr) {
  V4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ u32 cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ float4 ld_peer_v4(u32 local_addr, u32 peer) {
  u32 remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local_addr), "r"(peer));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}

__device__ __forceinline__ void load_w(V4 (&wv)[CL_U][2], const u16* w0, const u16* w1, int k0) {
#pragma unroll
  for (int u = 0; u < CL_U; ++u) {
    wv[u][0] = ld_stream(w0 + k0 + 32 * u);
    wv[u][1] = ld_stream(w1 + k0 + 32 * u);
  }
}

// Stage st: the weight chunk in registers times the resident activation columns [st CL_KC, (st + 1) CL_KC).
// The B fragments of a 32-k chunk are read from shared memory first, then multiplied: every asm here is volatile
// (kept in program order), so reading one fragment right before its mma.sync would expose each read's latency.
__device__ __forceinline__ void compute(float (&acc)[CL_NJ][4], const V4 (&wv)[CL_U][2], u32 xs, int st, int g,
                                        int q) {
#pragma unroll
  for (int u = 0; u < CL_U; ++u)
#pragma unroll
    for (int j0 = 0; j0 < CL_NJ; j0 += CL_JB) {
      V4 xv[CL_JB];
#pragma unroll
      for (int j = 0; j < CL_JB; ++j)
        xv[j] = lds128(xs + (8 * (j0 + j) + g) * CL_XP + (st * CL_KC + 32 * u + 8 * q) * 2);
#pragma unroll
      for (int s = 0; s < 2; ++s)
#pragma unroll
        for (int j = 0; j < CL_JB; ++j) {
#if CL_DIAG == 1  // diagnostic: no products, the loaded words folded in so that no load is dead
          acc[j0 + j][0] += __int_as_float((pair(wv[u][0], 2 * s) ^ pair(wv[u][1], 2 * s + 1) ^ pair(xv[j], 2 * s)) & 0x3f800000u);
#else
          mma16816(acc[j0 + j], pair(wv[u][0], 2 * s), pair(wv[u][1], 2 * s), pair(wv[u][0], 2 * s + 1),
                   pair(wv[u][1], 2 * s + 1), pair(xv[j], 2 * s), pair(xv[j], 2 * s + 1));
#endif
        }
    }
}

extern "C" __global__ void
#if CL_S > 1
__cluster_dims__(1, CL_S, 1)
#endif
__launch_bounds__(32 * CL_WN) clgemv(const u16* __restrict__ X, const u16* __restrict__ W,
                                      const u16* __restrict__ bias, void* __restrict__ Y, int M, int N, int ldx,
                                      int ldw, int ldy) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31;
  const int wn = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int q = lane & 3;
  const int num_m = (M + CL_MT - 1) / CL_MT;
  const int m0 = (blockIdx.x % num_m) * CL_MT;
  const int n_tile0 = (blockIdx.x / num_m) * CL_BN;
  const int n0 = n_tile0 + wn * 16;
  const int kb = blockIdx.y * CL_KS;
  const u32 xs = smem_u32(smem);
  const u32 bars = xs + CL_BAR_OFF;  // CL_NST mbarriers, one per activation chunk

  if (threadIdx.x == 0) {
    for (int c = 0; c < CL_NST; ++c) bar_init(bars + 8 * c, 32 * CL_WN);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  // The first weight stage goes out first (HBM latency), then the whole activation slice, chunk by chunk: each
  // thread's cp.asyncs of chunk c, then its arrival on barrier c, which fires when they have landed.
  // Rows past N re-read the last valid row and tokens past M the last valid token: no load masks.
  const u16* w0 = W + (long)min(n0 + g, N - 1) * ldw + kb + 8 * q;
  const u16* w1 = W + (long)min(n0 + g + 8, N - 1) * ldw + kb + 8 * q;
  V4 wa[CL_U][2];
  V4 wb[CL_U][2];
  load_w(wa, w0, w1, 0);
  {
    constexpr int pieces = CL_MT * CL_KC / 8;  // 16-byte pieces per chunk
    for (int c = 0; c < CL_NST; ++c) {
      for (int i = threadIdx.x; i < pieces; i += 32 * CL_WN) {
        const int tok = i / (CL_KC / 8);
        const int c8 = i % (CL_KC / 8);
        cp_async16(xs + tok * CL_XP + (c * CL_KC + 8 * c8) * 2,
                   X + (long)min(m0 + tok, M - 1) * ldx + kb + c * CL_KC + 8 * c8);
      }
      cp_async_arrive(bars + 8 * c);
    }
  }

  float acc[CL_NJ][4];
#pragma unroll
  for (int j = 0; j < CL_NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;

  // Two stages per trip (wa, then wb): register arrays are indexed by constants only. The next stage's weight
  // loads are issued before this stage's products.
  for (int st = 0; st < CL_NST; st += 2) {
    if (st + 1 < CL_NST) load_w(wb, w0, w1, (st + 1) * CL_KC);
    bar_wait_phase0(bars + 8 * st);
    compute(acc, wa, xs, st, g, q);
    if (st + 1 >= CL_NST) break;
    if (st + 2 < CL_NST) load_w(wa, w0, w1, (st + 2) * CL_KC);
    bar_wait_phase0(bars + 8 * (st + 1));
    compute(acc, wb, xs, st + 1, g, q);
  }

#if CL_S == 1 || CL_DIAG == 2
#pragma unroll
  for (int e = 0; e < 4; ++e) {  // fragment element e of j: row + 8 (e >> 1), token + (e & 1)
    const int row = n0 + g + 8 * (e >> 1);
    if (row >= N) continue;
    const float b = HAS_BIAS ? in_to_f32(bias[row]) : 0.f;
#pragma unroll
    for (int j = 0; j < CL_NJ; ++j) {
      const int tok = m0 + 8 * j + 2 * q + (e & 1);
      if (tok < M) store_out(Y, (long)tok * ldy + row, acc[j][e] + b);
    }
  }
#else
  // The cluster's reduction. This CTA's partial tile P[token][row] (float32) replaces its activation slice.
  __syncthreads();
  float* P = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int e = 0; e < 4; ++e)
#pragma unroll
    for (int j = 0; j < CL_NJ; ++j)
      P[(8 * j + 2 * q + (e & 1)) * CL_BN + wn * 16 + g + 8 * (e >> 1)] = acc[j][e];
  cluster_sync();  // every CTA's partial is written and visible to the cluster
  constexpr int RB = CL_BN / CL_S;  // rows this rank sums (a multiple of 4)
  const int r0 = (int)cluster_rank() * RB;
  for (int i = threadIdx.x; i < CL_MT * (RB / 4); i += 32 * CL_WN) {
    const int tok = i / (RB / 4);
    const int row = r0 + 4 * (i % (RB / 4));
    const u32 addr = xs + (u32)(tok * CL_BN + row) * 4;
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int p = 0; p < CL_S; ++p) {  // rank order: the same sum whichever CTA finishes first
      const float4 v = ld_peer_v4(addr, p);
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    const int gtok = m0 + tok;
    const int grow = n_tile0 + row;
    if (gtok >= M) continue;
    const float s4[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (grow + e < N) store_out(Y, (long)gtok * ldy + grow + e, s4[e] + (HAS_BIAS ? in_to_f32(bias[grow + e]) : 0.f));
  }
  cluster_sync();  // no CTA leaves while a peer may still read its shared memory
#endif
}
