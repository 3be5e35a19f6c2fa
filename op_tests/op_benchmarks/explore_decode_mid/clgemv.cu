// Cluster split-K tensor-core GEMV for batched decode: Y[M, N] = X[M, K] @ W[N, K]^T (+ bias), M <= 128 per tile.
//
// Why: at M 17-256 a decode GEMM must give every SM a share of the weight, and N / rows-per-tile tiles are too few,
// so K is split. Split-K as cuBLAS and the Triton decode family do it costs one of two things: float32 partials
// written to and read back from global memory (a second kernel, or one program summing every split alone), or
// smaller tiles, each of which re-reads the whole activation slice from L2 (M / rows-per-tile times the weight's
// bytes). Here the K splits of one tile are the CTAs of one thread-block cluster (CL_S of them): each CTA keeps its
// activation slice (MT tokens x K / CL_S) resident in shared memory, loaded once with cp.async while the first
// weight loads are in flight, streams its weight rows from global memory straight into mma.sync fragments, and at
// the end the cluster sums its partial tiles through distributed shared memory: CTA r adds rows
// [r BN / S, (r + 1) BN / S) of every peer's tile in rank order (deterministic), adds the bias and stores Y. No
// partial touches global memory; tiles of 8 CL_R CL_WN rows keep the activation re-reads at M / BN of the weight.
//
// Operands of m16n8k16: A = the activation (16 tokens x 16 k), B = the weight (16 k x 8 rows). Per 32-k chunk,
// lane (g, q) = (lane / 4, lane % 4) loads W[row g][kc + 8q .. 8q + 7] (16 bytes): its 32-bit pairs 2s and 2s + 1
// are its B registers b0, b1 of k16 step s, i.e. logical k (2q, 2q + 1) of step s is physical kc + 8q + 4s + (0, 1)
// and logical (2q + 8, 2q + 9) is kc + 8q + 4s + (2, 3). The activation is stored in shared memory in that same
// permuted, fragment order ([chunk][token tile][step][lane][4 registers], written with 4-byte cp.async), so one
// 16-byte shared load is a lane's whole A fragment and one 16-byte global load a lane's B fragments of two steps:
// no register shuffling between loads and mma.sync (the first version's A-from-weight layout spent ~4 moves per
// mma and ran issue-bound, Nsight Compute: 4.4 cycles per issued instruction at one warp per scheduler).
//
// Memory-level parallelism: each warp keeps CL_NB - 1 weight stages in flight in a ring of CL_NB register stages
// (Nsight Compute on the two-stage version: 2 warps per scheduler, 11-12 cycles per issued instruction, mostly
// waiting on those loads; the M = 1 gemv keeps 12 warps per scheduler loading).
//
// Compile-time parameters (prepended #defines): CL_MT tokens per tile (multiple of 16, <= 128), CL_WN warps, CL_R
// 8-row weight tiles per warp, CL_U 32-k chunks per weight stage, CL_NB register stages of the weight ring (2..4),
// CL_S CTAs per cluster = K splits (1, 2, 4 or 8),
// CL_KS = K / CL_S (a multiple of 32 CL_U), CL_DIAG (diagnostics, wrong results, timing only: 2 no cluster
// reduction; 3 the weight stream alone, each load folded into one register by XOR, no activation, no products;
// 4 no weight loads: the activation, the products on a constant weight and the reduction),
// IN_F16 (0: bf16, 1: fp16 operands), OUT_KIND (0 bf16, 1 fp16, 2 fp32), HAS_BIAS. Grid: x = N tiles x M tiles (M
// tiles fastest), y = CL_S. Requires 16-byte aligned rows (ldx, ldw multiples of 8) and base pointers.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

struct V4 {
  u32 x, y, z, w;
};

#define CL_NT (CL_MT / 16)  // token tiles of the mma's M side
#define CL_BN (8 * CL_R * CL_WN)
#define CL_KC (32 * CL_U)
#define CL_NST (CL_KS / CL_KC)
#ifndef CL_DIAG
#define CL_DIAG 0
#endif
// The activation slice in fragment order: 512 bytes per (32-k chunk, token tile, step), KS x MT x 2 bytes in all.
#define CL_X_BYTES (CL_KS * CL_MT * 2)
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

__device__ __forceinline__ void cp_async4(u32 dst, const u16* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
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

__device__ __forceinline__ void load_w(V4 (&wv)[CL_U][CL_R], const u16* const (&wp)[CL_R], int k0) {
#if CL_DIAG == 4
  if (k0 >= 0) return;  // diagnostic: the constant weight of the prologue is reused
#endif
#pragma unroll
  for (int u = 0; u < CL_U; ++u)
#pragma unroll
    for (int r = 0; r < CL_R; ++r) wv[u][r] = ld_stream(wp[r] + k0 + 32 * u);
}

// Stage st: the weight chunks in registers times the resident activation chunks [st CL_U, (st + 1) CL_U). A lane's
// A fragments of a step are read first (every asm is volatile, kept in program order), then reused by its CL_R tiles.
__device__ __forceinline__ void compute(float (&acc)[CL_NT][CL_R][4], const V4 (&wv)[CL_U][CL_R], u32 xlane, int st) {
#pragma unroll
  for (int u = 0; u < CL_U; ++u)
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      V4 av[CL_NT];
#pragma unroll
      for (int t = 0; t < CL_NT; ++t) av[t] = lds128(xlane + (((st * CL_U + u) * CL_NT + t) * 2 + s) * 512);
#pragma unroll
      for (int r = 0; r < CL_R; ++r)
#pragma unroll
        for (int t = 0; t < CL_NT; ++t)
          mma16816(acc[t][r], av[t].x, av[t].y, av[t].z, av[t].w, pair(wv[u][r], 2 * s), pair(wv[u][r], 2 * s + 1));
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
  const int n0 = n_tile0 + wn * 8 * CL_R;
  const int kb = blockIdx.y * CL_KS;
  const u32 xs = smem_u32(smem);
  const u32 bars = xs + CL_BAR_OFF;  // CL_NST mbarriers, one per weight stage's activation chunks

  if (threadIdx.x == 0) {
    for (int c = 0; c < CL_NST; ++c) bar_init(bars + 8 * c, 32 * CL_WN);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  // The first weight stage goes out first (HBM latency). Rows past N re-read the last valid row and tokens past M
  // the last valid token: no load masks.
  const u16* wp[CL_R];
#pragma unroll
  for (int r = 0; r < CL_R; ++r) wp[r] = W + (long)min(n0 + 8 * r + g, N - 1) * ldw + kb + 8 * q;
  V4 wv[CL_NB][CL_U][CL_R];
#if CL_DIAG == 4
#pragma unroll
  for (int b = 0; b < CL_NB; ++b)
#pragma unroll
    for (int u = 0; u < CL_U; ++u)
#pragma unroll
      for (int r = 0; r < CL_R; ++r) wv[b][u][r] = V4{0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};
#endif
#pragma unroll
  for (int b = 0; b < CL_NB - 1; ++b)
    if (b < CL_NST) load_w(wv[b], wp, b * CL_KC);
  // Then the activation slice, stage by stage, in fragment order: token tok's 8 k at kc + 8 qq (16 bytes of X) are
  // 4 registers of lane (tok % 8, qq): pair p of them is register 2 (p % 2) + (tok % 16 >= 8) of step p / 2. Each
  // thread's 4-byte cp.asyncs of stage c, then its arrival on barrier c, which fires when they have landed.
  if (CL_DIAG != 3) {
    constexpr int pieces = CL_MT * CL_KC / 8;  // 16-byte pieces of X per stage
    for (int c = 0; c < CL_NST; ++c) {
      for (int i = threadIdx.x; i < pieces; i += 32 * CL_WN) {
        const int tok = i / (CL_KC / 8);
        const int c8 = i % (CL_KC / 8);  // 8-k group: chunk c8 / 4 of the stage, qq = c8 % 4
        const u16* src = X + (long)min(m0 + tok, M - 1) * ldx + kb + c * CL_KC + 8 * c8;
        const u32 frag = xs + ((c * CL_U + c8 / 4) * CL_NT + tok / 16) * 1024 + ((tok % 8) * 4 + c8 % 4) * 16 +
                         4 * (tok % 16 >= 8);
#pragma unroll
        for (int p = 0; p < 4; ++p) cp_async4(frag + (p / 2) * 512 + 8 * (p % 2), src + 2 * p);
      }
      cp_async_arrive(bars + 8 * c);
    }
  }

  float acc[CL_NT][CL_R][4];
#pragma unroll
  for (int t = 0; t < CL_NT; ++t)
#pragma unroll
    for (int r = 0; r < CL_R; ++r)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][r][e] = 0.f;

  // CL_NB stages per trip, so that the ring is indexed by constants only (registers): stage st lives in slot
  // st % CL_NB; before its products, the loads of stage st + CL_NB - 1 go into the slot stage st - 1 left.
  const u32 xlane = xs + lane * 16;
  for (int st0 = 0; st0 < CL_NST; st0 += CL_NB) {
#pragma unroll
    for (int b = 0; b < CL_NB; ++b) {
      const int st = st0 + b;
      if (st >= CL_NST) break;
      if (st + CL_NB - 1 < CL_NST) load_w(wv[(b + CL_NB - 1) % CL_NB], wp, (st + CL_NB - 1) * CL_KC);
#if CL_DIAG == 3
#pragma unroll
      for (int u = 0; u < CL_U; ++u)
#pragma unroll
        for (int r = 0; r < CL_R; ++r)
          acc[0][0][0] = __int_as_float(__float_as_int(acc[0][0][0]) ^ wv[b][u][r].x ^ wv[b][u][r].y ^
                                        wv[b][u][r].z ^ wv[b][u][r].w);
#else
      bar_wait_phase0(bars + 8 * st);
      compute(acc, wv[b], xlane, st);
#endif
    }
  }

  // Accumulator (t, r) element e: token 16 t + g + 8 (e >> 1), row 8 r + 2 q + (e & 1).
#if CL_S == 1 || CL_DIAG == 2 || CL_DIAG == 3
#pragma unroll
  for (int r = 0; r < CL_R; ++r)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = n0 + 8 * r + 2 * q + (e & 1);
      if (row >= N) continue;
      const float b = HAS_BIAS ? in_to_f32(bias[row]) : 0.f;
#pragma unroll
      for (int t = 0; t < CL_NT; ++t) {
        const int tok = m0 + 16 * t + g + 8 * (e >> 1);
        if (tok < M) store_out(Y, (long)tok * ldy + row, acc[t][r][e] + b);
      }
    }
#else
  // The cluster's reduction. This CTA's partial tile P[token][row] (float32) replaces its activation slice.
  __syncthreads();
  float* P = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int t = 0; t < CL_NT; ++t)
#pragma unroll
    for (int r = 0; r < CL_R; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<float2*>(P + (16 * t + g + 8 * h) * CL_BN + wn * 8 * CL_R + 8 * r + 2 * q) =
            make_float2(acc[t][r][2 * h], acc[t][r][2 * h + 1]);
  cluster_sync();  // every CTA's partial is written and visible to the cluster
  constexpr int RB = CL_BN / CL_S;  // rows this rank sums (a multiple of 4)
  const int r0 = (int)cluster_rank() * RB;
  for (int i = threadIdx.x; i < CL_MT * (RB / 4); i += 32 * CL_WN) {
    const int tok = i / (RB / 4);
    const int row = r0 + 4 * (i % (RB / 4));
    const u32 addr = xs + (u32)(tok * CL_BN + row) * 4;
    float4 v[CL_S];
#pragma unroll
    for (int p = 0; p < CL_S; ++p) v[p] = ld_peer_v4(addr, p);  // all loads in flight, then the sums
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int p = 0; p < CL_S; ++p) {  // rank order: the same sum whichever CTA finishes first
      sum.x += v[p].x;
      sum.y += v[p].y;
      sum.z += v[p].z;
      sum.w += v[p].w;
    }
    const int gtok = m0 + tok;
    const int grow = n_tile0 + row;
    if (gtok >= M) continue;
    const float s4[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (grow + e < N)
        store_out(Y, (long)gtok * ldy + grow + e, s4[e] + (HAS_BIAS ? in_to_f32(bias[grow + e]) : 0.f));
  }
  cluster_sync();  // no CTA leaves while a peer may still read its shared memory
#endif
}
