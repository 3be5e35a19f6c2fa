// Cluster split-K tensor-core GEMV for batched decode: Y[M, N] = X[M, K] @ W[N, K]^T (+ bias), M <= 128 per tile.
//
// Why: at M 17-256 a decode GEMM must give every SM a share of the weight, and N / rows-per-tile tiles are too few,
// so K is split. Split-K as cuBLAS and the Triton decode family do it costs one of two things: float32 partials
// written to and read back from global memory (a second kernel, or one program summing every split alone), or
// smaller tiles, each of which re-reads the whole activation slice from L2 (M / rows-per-tile times the weight's
// bytes). Here the K splits of one tile are the CTAs of one thread-block cluster (CL_S of them): each CTA keeps its
// activation slice (MT tokens x K / CL_S) resident in shared memory, and at the end the cluster sums its partial
// tiles through distributed shared memory: CTA r adds rows [r BN / S, (r + 1) BN / S) of every peer's tile in rank
// order (deterministic), adds the bias and stores Y. No partial touches global memory.
//
// The weight stream: each warp owns 8 CL_R rows and a ring of CL_NS stages of CL_KC k per row in shared memory;
// lanes 0..8 CL_R - 1 each bring one row's 2 CL_KC contiguous bytes with a 1-D bulk copy (the TMA engine), counted
// on the stage's mbarrier; no CTA-wide synchronisation in the main loop. (Measured with wstream.cu, this streams a
// weight at 0.73-0.95 of the copy floor, within 0-9% of the M = 1 gemv. The earlier versions of this kernel loaded
// the weight into registers as mma.sync fragments, 8 rows x 64 bytes per warp instruction: 0.42 of the floor.)
// The activation slice arrives the same way, stage by stage: with each of its weight stages a warp also copies its
// share of the activation's CL_KC columns of that stage (CL_MT / CL_WN token rows) into the resident slice, counted
// on that stage's activation barrier (one arrival per warp). Loading the whole slice before the first product (an
// earlier version) stalled every warp's stream behind 32-128 KB of activation per CTA.
//
// Products: mma.sync m16n8k16, A = activation (16 tokens x 16 k, ldmatrix.x4 from the resident slice), B = weight
// (16 k x 8 rows, ldmatrix.x4 of the stage: two k16 steps of one 8-row tile). Rows of both are padded by 16 bytes so
// that ldmatrix's 8 row addresses fall in different banks.
//
// Compile-time parameters (prepended #defines, then cuda_common.cuh): CL_MT tokens per tile (multiple of 16,
// <= 128), CL_WN warps, CL_R 8-row weight tiles per warp (<= 4), CL_KC k per weight stage (multiple of 32), CL_NS
// ring stages, CL_S CTAs per cluster = K splits (1, 2, 4 or 8), CL_KS = K / CL_S (a multiple of CL_KC), CL_DIAG
// (timing only, wrong results: 2 no cluster reduction, 3 no products, 4 = 3 without the activation copies, 5 = 4
// with one 16-byte shared load per 8-row tile and 32 k instead of the ldmatrix reads, 6 = 5 launched without
// clusters), IN_F16 (0: bf16, 1: fp16 operands),
// OUT_KIND (0 bf16, 1 fp16, 2 fp32), HAS_BIAS. Grid: x = N tiles x M tiles (M tiles fastest), y = CL_S. Requires
// 16-byte aligned rows (ldx, ldw multiples of 8) and base pointers.

#define CL_NT (CL_MT / 16)  // token tiles of the mma's M side
#define CL_RPW (8 * CL_R)   // weight rows per warp
#define CL_BN (CL_RPW * CL_WN)
#define CL_NST (CL_KS / CL_KC)
#ifndef CL_DIAG
#define CL_DIAG 0
#endif
#define CL_XP (CL_KS * 2 + 16)  // activation row pitch (bytes)
#define CL_WP (CL_KC * 2 + 16)  // weight row pitch in a stage (bytes)
#define CL_STAGE (CL_RPW * CL_WP)
#define CL_X_BYTES (CL_MT * CL_XP)
#define CL_W_OFF CL_X_BYTES
#define CL_W_BYTES (CL_WN * CL_NS * CL_STAGE)
#define CL_P_BYTES (CL_S > 1 ? CL_MT * CL_BN * 4 : 0)  // the partial tile, over the activation and the rings
#define CL_BAR_OFF (CL_X_BYTES + CL_W_BYTES > CL_P_BYTES ? CL_X_BYTES + CL_W_BYTES : CL_P_BYTES)
#define CL_XROWS ((CL_MT + CL_WN - 1) / CL_WN)  // activation rows each warp copies per stage
// barriers: CL_NST activation barriers (one per stage, CL_WN arrivals), then CL_NS per warp

// Warp w's stage `st`: its weight rows into ring slot st % CL_NS (lanes < CL_RPW, one row each) and its share of the
// activation's columns of the stage (lanes < CL_XROWS, one token row each). Lane 0 arrives on both barriers with the
// bytes to expect.
__device__ __forceinline__ void issue_stage(u32 ring, u32 wbars, const u16* wrow, u32 xs, u32 xbars,
                                           const u16* xrow, int xtok, int lane, int st) {
  const int slot = st % CL_NS;
#if CL_DIAG >= 4
  const int xn = 0;
#else
  const int xn = min(CL_XROWS, CL_MT - (xtok - lane));  // this warp's activation rows (the last warp may have fewer)
#endif
  if (lane == 0) {
    bar_expect(wbars + 8 * slot, CL_RPW * CL_KC * 2);
    bar_expect(xbars + 8 * st, xn > 0 ? xn * CL_KC * 2 : 0);
  }
  __syncwarp();
  if (lane < CL_RPW) bulk_copy(ring + slot * CL_STAGE + lane * CL_WP, wrow + st * CL_KC, CL_KC * 2, wbars + 8 * slot);
  if (lane < xn) bulk_copy(xs + xtok * CL_XP + st * CL_KC * 2, xrow + st * CL_KC, CL_KC * 2, xbars + 8 * st);
}

extern "C" __global__ void
#if CL_S > 1 && CL_DIAG != 6
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
  const int n0 = n_tile0 + wn * CL_RPW;
  const int kb = blockIdx.y * CL_KS;
  const u32 xs = smem_u32(smem);
  const u32 ring = xs + CL_W_OFF + wn * (CL_NS * CL_STAGE);
  const u32 xbars = xs + CL_BAR_OFF;
  const u32 wbars = xbars + 8 * CL_NST + wn * (8 * CL_NS);

  if (threadIdx.x == 0) {
    for (int i = 0; i < CL_NST; ++i) bar_init(xbars + 8 * i, CL_WN);
    for (int i = 0; i < CL_WN * CL_NS; ++i) bar_init(xbars + 8 * CL_NST + 8 * i, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  // Stages 0 .. NS - 2 in flight. Rows past N re-read row N - 1; tokens past M copy row M - 1 (their outputs are not
  // stored).
  const u16* wrow = W + (long)min(n0 + lane, N - 1) * ldw + kb;
  const int xtok = wn * CL_XROWS + lane;
  const u16* xrow = X + (long)min(m0 + xtok, M - 1) * ldx + kb;
  for (int st = 0; st < CL_NS - 1 && st < CL_NST; ++st) issue_stage(ring, wbars, wrow, xs, xbars, xrow, xtok, lane, st);

  float acc[CL_NT][CL_R][4];
#pragma unroll
  for (int t = 0; t < CL_NT; ++t)
#pragma unroll
    for (int r = 0; r < CL_R; ++r)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][r][e] = 0.f;

  // ldmatrix row addresses. A (tile t, k16 at k): lane l -> token 16 t + l % 16, k + 8 (l / 16). B (tile r, two
  // k16 steps at k): lane l -> row 8 r + l % 8, k + 8 (l / 8).
  const u32 a_lane = xs + (lane % 16) * CL_XP + (lane / 16) * 16;
  const u32 b_lane = (lane % 8) * CL_WP + (lane / 8) * 16;
  for (int st = 0; st < CL_NST; ++st) {
    const int nxt = st + CL_NS - 1;
    if (nxt < CL_NST) {  // refill the slot stage st - 1 used: every lane has read it (the previous trip)
      __syncwarp();
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      issue_stage(ring, wbars, wrow, xs, xbars, xrow, xtok, lane, nxt);
    }
    const int slot = st % CL_NS;
    bar_wait(xbars + 8 * st, 0);
    bar_wait(wbars + 8 * slot, (st / CL_NS) & 1);
    const u32 stage = ring + slot * CL_STAGE;
#pragma unroll
    for (int kc = 0; kc < CL_KC; kc += 32) {
#if CL_DIAG >= 5
#pragma unroll
      for (int r = 0; r < CL_R; ++r) {
        const V4 v = lds128(stage + r * 8 * CL_WP + b_lane + kc * 2);
        acc[0][r][0] = __int_as_float(__float_as_int(acc[0][r][0]) ^ v.x ^ v.y ^ v.z ^ v.w);
      }
      continue;
#endif
      V4 b[CL_R];
#pragma unroll
      for (int r = 0; r < CL_R; ++r) b[r] = ldmatrix_x4(stage + r * 8 * CL_WP + b_lane + kc * 2);
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        V4 a[CL_NT];
#pragma unroll
        for (int t = 0; t < CL_NT; ++t) a[t] = ldmatrix_x4(a_lane + t * 16 * CL_XP + (st * CL_KC + kc + 16 * s) * 2);
#pragma unroll
        for (int r = 0; r < CL_R; ++r)
#pragma unroll
          for (int t = 0; t < CL_NT; ++t) {
#if CL_DIAG >= 3
            acc[t][r][0] = __int_as_float(__float_as_int(acc[t][r][0]) ^ a[t].x ^ pair(b[r], 2 * s));
#else
            mma16816(acc[t][r], a[t].x, a[t].y, a[t].z, a[t].w, pair(b[r], 2 * s), pair(b[r], 2 * s + 1));
#endif
          }
      }
    }
  }

  // Accumulator (t, r) element e: token 16 t + g + 8 (e >> 1), row 8 r + 2 q + (e & 1).
#if CL_S == 1 || CL_DIAG >= 2
#pragma unroll
  for (int r = 0; r < CL_R; ++r)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = n0 + 8 * r + 2 * q + (e & 1);
      if (row >= N) continue;
      const float bv = HAS_BIAS ? in_to_f32(bias[row]) : 0.f;
#pragma unroll
      for (int t = 0; t < CL_NT; ++t) {
        const int tok = m0 + 16 * t + g + 8 * (e >> 1);
        if (tok < M) store_out(Y, (long)tok * ldy + row, acc[t][r][e] + bv);
      }
    }
#else
  // The cluster's reduction. This CTA's partial tile P[token][row] (float32) replaces its activation and rings.
  __syncthreads();
  float* P = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int t = 0; t < CL_NT; ++t)
#pragma unroll
    for (int r = 0; r < CL_R; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<float2*>(P + (16 * t + g + 8 * h) * CL_BN + wn * CL_RPW + 8 * r + 2 * q) =
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
