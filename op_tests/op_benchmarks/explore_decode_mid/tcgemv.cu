// Tensor-core GEMV for batched decode: Y[M, N] = X[M, K] @ W[N, K]^T (+ bias), M <= 64 tokens per tile.
//
// Why: on the H100 the M = 1 CUDA-core gemv streams a weight at 0.8-1.0 of the copy bandwidth because every thread
// loads the weight with 16-byte loads straight into registers, many warps per SM keeping those loads in flight;
// every tensor-core kernel measured at M 17-256 (cuBLAS, Triton's wgmma/mma tiles) stages the weight through shared
// memory and reaches 0.55-0.8 on small weights. Here the weight goes from global memory straight into mma.sync's
// A fragments: a thread's 16-byte load of 8 consecutive k of one row holds, under a permutation of k that the
// activation's B fragments share, its A elements of two m16n8k16 steps. The weight never touches shared memory;
// each warp keeps the next stage's loads (2 TC_U TC_R 16-byte loads per thread) in flight while it multiplies the
// current one. The activation tile (small, read by every warp of the tile) streams through a ring of TC_XS
// shared-memory stages filled with cp.async; its rows are padded to an odd multiple of 64 bytes so that a warp's
// 16-byte reads of two tokens fall in different banks.
//
// k permutation, per 32-k chunk (thread lane = 4 g + q): the thread loads W[row][kc + 8q .. 8q + 7] and
// X[token][kc + 8q .. 8q + 7]; in k16 step s the 32-bit pairs 2s and 2s + 1 of those loads are its A registers
// {a0|a1, a2|a3} (rows g and g + 8) and its B registers {b0, b1}: logical k (2q, 2q + 1) of step s is physical
// kc + 8q + 4s + (0, 1), logical (2q + 8, 2q + 9) is kc + 8q + 4s + (2, 3). A and B agree, so the products are
// exactly those of X @ W^T.
//
// Compile-time parameters (prepended #defines): TC_MT tokens per tile (8, 16, ..., 64), TC_R m16 row tiles per warp,
// TC_WN warps along N, TC_U 32-k chunks per stage, TC_XS activation stages in shared memory (>= 2), IN_F16 (0: bf16,
// 1: fp16 operands), OUT_KIND (0 bf16, 1 fp16, 2 fp32), HAS_BIAS. Dynamic shared memory: TC_XS * TC_MT * XP bytes.
// Grid: x = N tiles (16 TC_R TC_WN rows) x M tiles (TC_MT tokens), M tiles fastest; y = K splits. K splits > 1 store float32
// partials to ws[split][M][N]; the last split of a tile to arrive (counter cnt[tile], reset by it) sums them in
// split order (deterministic) and stores Y.
// Requires K % (32 TC_U) == 0, 16-byte aligned rows (ldx, ldw multiples of 8) and base pointers.
// Device helpers: cuda_common.cuh (prepended with the #defines).

#define TC_NJ (TC_MT / 8)
#define TC_BN (16 * TC_R * TC_WN)
#define TC_KC (32 * TC_U)
// Activation row pitch in shared memory: an odd multiple of 64 bytes (see above).
#define TC_XP ((TC_KC * 2) % 128 == 0 ? TC_KC * 2 + 64 : TC_KC * 2)

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }

__device__ __forceinline__ void cp_async_wait_stage() {
  asm volatile("cp.async.wait_group %0;" ::"n"(TC_XS - 2));
}

// The activation's stage `st` (k in [k0, k0 + TC_KC)) into ring slot st % TC_XS, by every thread of the block.
__device__ __forceinline__ void issue_x(u32 xs, const u16* X, int ldx, int M, int m0, int k0, int st) {
  const u32 slot = xs + (u32)(st % TC_XS) * (TC_MT * TC_XP);
  constexpr int pieces = TC_MT * TC_KC / 8;
  for (int i = threadIdx.x; i < pieces; i += 32 * TC_WN) {
    const int tok = i / (TC_KC / 8);
    const int c8 = i % (TC_KC / 8);
    cp_async16(slot + tok * TC_XP + 16 * c8, X + (long)min(m0 + tok, M - 1) * ldx + k0 + 8 * c8);
  }
}

__device__ __forceinline__ void load_w(V4 (&wv)[TC_U][TC_R][2], const u16* const (&wp)[TC_R][2], int k0) {
#pragma unroll
  for (int u = 0; u < TC_U; ++u)
#pragma unroll
    for (int t = 0; t < TC_R; ++t) {
      wv[u][t][0] = ld_stream(wp[t][0] + k0 + 32 * u);
      wv[u][t][1] = ld_stream(wp[t][1] + k0 + 32 * u);
    }
}

__device__ __forceinline__ void compute(float (&acc)[TC_R][TC_NJ][4], const V4 (&wv)[TC_U][TC_R][2], u32 xslot,
                                        int g, int q) {
#pragma unroll
  for (int u = 0; u < TC_U; ++u)
#pragma unroll
    for (int j = 0; j < TC_NJ; ++j) {
      const V4 xv = lds128(xslot + (8 * j + g) * TC_XP + (32 * u + 8 * q) * 2);
#pragma unroll
      for (int s = 0; s < 2; ++s)
#pragma unroll
        for (int t = 0; t < TC_R; ++t)
          mma16816(acc[t][j], pair(wv[u][t][0], 2 * s), pair(wv[u][t][1], 2 * s), pair(wv[u][t][0], 2 * s + 1),
                   pair(wv[u][t][1], 2 * s + 1), pair(xv, 2 * s), pair(xv, 2 * s + 1));
    }
}

extern "C" __global__ void __launch_bounds__(32 * TC_WN) tcgemv(
    const u16* __restrict__ X, const u16* __restrict__ W, const u16* __restrict__ bias, void* __restrict__ Y,
    float* __restrict__ ws, int* __restrict__ cnt, int M, int N, int K, int ldx, int ldw, int ldy,
    int chunks_per_split) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31;
  const int wn = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int q = lane & 3;
  const int num_m = (M + TC_MT - 1) / TC_MT;
  const int tile = blockIdx.x;
  const int m0 = (tile % num_m) * TC_MT;
  const int n0 = (tile / num_m) * TC_BN + wn * 16 * TC_R;
  const int split = blockIdx.y;
  const int num_splits = gridDim.y;
  const int kb = split * chunks_per_split * TC_KC;
  const int nst = (min(K, kb + chunks_per_split * TC_KC) - kb) / TC_KC;
  const u32 xs = smem_u32(smem);

  // Rows past N re-read the last valid row: no load masks.
  const u16* wp[TC_R][2];
#pragma unroll
  for (int t = 0; t < TC_R; ++t) {
    wp[t][0] = W + (long)min(n0 + 16 * t + g, N - 1) * ldw + 8 * q;
    wp[t][1] = W + (long)min(n0 + 16 * t + g + 8, N - 1) * ldw + 8 * q;
  }
  float acc[TC_R][TC_NJ][4];
#pragma unroll
  for (int t = 0; t < TC_R; ++t)
#pragma unroll
    for (int j = 0; j < TC_NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][j][e] = 0.f;

  // Prologue: activation stages 0 .. TC_XS - 2 in flight (one commit group each, empty past the end), the first
  // weight stage in registers.
#pragma unroll
  for (int p = 0; p < TC_XS - 1; ++p) {
    if (p < nst) issue_x(xs, X, ldx, M, m0, kb + p * TC_KC, p);
    cp_async_commit();
  }
  V4 wa[TC_U][TC_R][2];
  V4 wb[TC_U][TC_R][2];
  load_w(wa, wp, kb);
  // Two stages per trip (wa, then wb): register arrays are indexed by constants only.
  for (int s = 0; s < nst; s += 2) {
    cp_async_wait_stage();  // this thread's copies of stage s landed
    __syncthreads();        // everyone's did, and every warp is done with the slot refilled next
    if (s + TC_XS - 1 < nst) issue_x(xs, X, ldx, M, m0, kb + (s + TC_XS - 1) * TC_KC, s + TC_XS - 1);
    cp_async_commit();
    if (s + 1 < nst) load_w(wb, wp, kb + (s + 1) * TC_KC);
    compute(acc, wa, xs + (u32)(s % TC_XS) * (TC_MT * TC_XP), g, q);
    if (s + 1 >= nst) break;
    cp_async_wait_stage();
    __syncthreads();
    if (s + TC_XS < nst) issue_x(xs, X, ldx, M, m0, kb + (s + TC_XS) * TC_KC, s + TC_XS);
    cp_async_commit();
    if (s + 2 < nst) load_w(wa, wp, kb + (s + 2) * TC_KC);
    compute(acc, wb, xs + (u32)((s + 1) % TC_XS) * (TC_MT * TC_XP), g, q);
  }

  // Every accumulator of this thread inside M x N: f(value, row, token, bias of the row as float32).
  auto each_output = [&](auto&& f) {
#pragma unroll
    for (int t = 0; t < TC_R; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // fragment element e of (t, j): row + 8 (e >> 1), token + (e & 1)
        const int row = n0 + 16 * t + g + 8 * (e >> 1);
        if (row >= N) continue;
        const float b = HAS_BIAS ? in_to_f32(bias[row]) : 0.f;
#pragma unroll
        for (int j = 0; j < TC_NJ; ++j) {
          const int tok = m0 + 8 * j + 2 * q + (e & 1);
          if (tok < M) f(acc[t][j][e], row, tok, b);
        }
      }
  };
  if (num_splits == 1) {
    each_output([&](float v, int row, int tok, float b) { store_out(Y, (long)tok * ldy + row, v + b); });
    return;
  }

  // Split K: float32 partials, then the last split of this tile to arrive sums them in split order.
  each_output([&](float v, int row, int tok, float) { ws[((long)split * M + tok) * N + row] = v; });
  __shared__ int last;
  __threadfence();  // release: this thread's partials are visible GPU-wide before the counter moves
  __syncthreads();
  if (threadIdx.x == 0) {
    const int prev = atomicAdd(cnt + tile, 1);
    last = prev == num_splits - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // acquire: every other split's partials are visible
  each_output([&](float mine, int row, int tok, float b) {
    float sum = 0.f;
    for (int s = 0; s < num_splits; ++s) {
      float v = mine;
      if (s != split) {
        asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(ws + ((long)s * M + tok) * N + row));
      }
      sum += v;
    }
    store_out(Y, (long)tok * ldy + row, sum + b);
  });
  if (threadIdx.x == 0) cnt[tile] = 0;  // ready for the next launch (stream order makes it visible)
}
