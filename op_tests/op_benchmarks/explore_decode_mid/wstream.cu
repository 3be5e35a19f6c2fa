// Weight-streaming probe (issue 14): how fast can a tile kernel's warps bring weight rows into shared memory with
// the bulk-copy engine (cp.async.bulk, 1-D, one copy per row piece), against the M = 1 gemv's register loads?
//
// clgemv's diagnostic D3 showed its weight stream, 16-byte register loads covering 8 rows x 64 bytes per warp
// instruction (the mma.sync B-fragment layout), running at 0.42 of the copy floor where the gemv, 512 contiguous
// bytes per warp instruction, runs at 0.92. This kernel streams the same rows the way a tensor-core kernel with a
// shared-memory ring would: each warp owns WS_RPW rows of a K slice and a ring of WS_NS stages of WS_KC k per row;
// lanes 0..WS_RPW-1 each copy one row's 2 WS_KC contiguous bytes into the stage (an mbarrier counts the bytes), and
// the warp then reads the stage back (16-byte shared loads, folded by XOR so nothing is dead). No products, no
// activation: the best a TMA-fed tile kernel's weight stream can do at this shape of pieces.
//
// Compile-time parameters: WS_RPW rows per warp (<= 32), WS_KC k per stage (multiple of 8), WS_NS ring stages,
// WS_WN warps, WS_KS the K slice per CTA. Grid: x = N / (WS_RPW WS_WN) row blocks, y = K / WS_KS slices.
// Requires N a multiple of WS_RPW WS_WN, K of WS_KS, WS_KS of WS_KC, 16-byte aligned rows. Device helpers:
// cuda_common.cuh (prepended with the #defines).

#define WS_PITCH (WS_KC * 2 + 16)  // row pitch in a stage: 16 bytes of padding
#define WS_STAGE (WS_RPW * WS_PITCH)
#define WS_NST (WS_KS / WS_KC)

extern "C" __global__ void __launch_bounds__(32 * WS_WN) wstream(const u16* __restrict__ W, u32* __restrict__ out,
                                                                 int ldw) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const u32 ring = smem_u32(smem) + warp * (WS_NS * WS_STAGE);
  const u32 bars = smem_u32(smem) + WS_WN * WS_NS * WS_STAGE + warp * WS_NS * 8;
  const int row0 = (blockIdx.x * WS_WN + warp) * WS_RPW;
  const int kb = blockIdx.y * WS_KS;
  if (lane == 0)
    for (int s = 0; s < WS_NS; ++s) bar_init(bars + 8 * s, 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncwarp();
  const u16* src = W + (long)(row0 + lane) * ldw + kb;

  // Prologue: stages 0 .. NS - 2 in flight.
  for (int st = 0; st < WS_NS - 1 && st < WS_NST; ++st) {
    if (lane == 0) bar_expect(bars + 8 * st, WS_RPW * WS_KC * 2);
    __syncwarp();
    if (lane < WS_RPW) bulk_copy(ring + st * WS_STAGE + lane * WS_PITCH, src + st * WS_KC, WS_KC * 2, bars + 8 * st);
  }
  u32 acc = 0;
  for (int st = 0; st < WS_NST; ++st) {
    const int slot = st % WS_NS;
    // Refill the slot stage st - 1 used (all lanes read it in the previous trip): stage st + NS - 1.
    const int nxt = st + WS_NS - 1;
    if (nxt < WS_NST) {
      __syncwarp();
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // our generic reads before the async writes
      const int ns = nxt % WS_NS;
      if (lane == 0) bar_expect(bars + 8 * ns, WS_RPW * WS_KC * 2);
      __syncwarp();
      if (lane < WS_RPW) bulk_copy(ring + ns * WS_STAGE + lane * WS_PITCH, src + nxt * WS_KC, WS_KC * 2, bars + 8 * ns);
    }
    bar_wait(bars + 8 * slot, (st / WS_NS) & 1);
    // Read the stage back: WS_RPW rows x 2 WS_KC bytes, 16 bytes per lane per load.
    constexpr int pieces = WS_RPW * WS_KC / 8;
#pragma unroll 4
    for (int i = lane; i < pieces; i += 32) {
      const V4 v = lds128(ring + slot * WS_STAGE + (i / (WS_KC / 8)) * WS_PITCH + (i % (WS_KC / 8)) * 16);
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  if (acc == 0x12345678u) out[blockIdx.y * gridDim.x * blockDim.x + blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
