// Shared by the heads-on-N kernels (swap.cuh, roles.cuh): their
// shared-memory layout, register budgets, P^T layout, MMA and epilogue.
#pragma once

#include "gather.cuh"

#if defined(UKV_NVIDIA_KERNELS)
namespace {

// Warpgroup-MMA kernel for blocks of NH = 16 or 32 heads (sm_90a), "swap AB":
// keys on the MMA's M side (64 per tile) and heads on N, so a small head block
// wastes no MMA rows, and a tile costs 32 short wgmma per warpgroup instead of
// the mma.sync kernel's long dependent chains (that kernel spends ~3 us per
// tile at one block per SM, more than the tile's share of DRAM bandwidth).
//   QK:  S^T[64 keys, NH] = K . Q^T; warpgroup w sums dims 256w..256w+255
//        (K fragments from the padded tile through ldmatrix, Q through a
//        descriptor); the partials meet in shared memory and warpgroup w
//        finishes heads [w NH/2, (w+1) NH/2).
//   softmax: per head over the 64 keys (lanes, then warps through shared
//        memory); P^T is written to shared memory as bf16.
//   PV:  O^T[512 dims, NH] += V^T . P^T; warpgroup w owns dims 256w..+255
//        (V^T fragments through ldmatrix.trans, P^T through a descriptor).
// Accumulator fragments (m64nN): thread (warp q of its warpgroup, lane) holds
// rows 16q + lane/4 and +8, columns 8i + 2(lane%4) + {0, 1}.
// The raw kernels' PV factor words, one set per warpgroup taking whole tiles
// or one shared by two splitting them: f16 pairs [7 code blocks][4 tq][4
// k-steps][2 halves] (raw_fac_at).
constexpr int kRawFacWords = 7 * 32;

template <int NH, int ST, bool kRaw = false>
struct SwapSmem {
  static constexpr int kStages = ST;
  static constexpr int kCtasPerSm = ST == 1 ? 2 : 1;
  // The 16-head raw variant's warpgroups may take turns at whole tiles (the
  // kernel's kAlt; its layout holds both modes).
  static constexpr bool kAlt = kRaw && NH == 16;
  static constexpr size_t kTileBytes = kRaw ? RawTile::kTileBytes : PadTile::kTileBytes;
  static constexpr size_t kAtomCol = (size_t)NH * 128;             // one 64-dim column of Q
  static constexpr size_t kQ = 0;                                   // [8][NH][128 B] swizzled
  static constexpr size_t kK = kQ + 8 * kAtomCol;                   // [stages] PadTile or RawTile
  // P^T, [NH][64] 16-bit: one bf16 buffer, or in the raw variant an f16 one
  // for the code blocks and a bf16 one for the rope block (with kAlt, per
  // warpgroup).
  static constexpr size_t kPTBytes = (size_t)NH * 128;
  static constexpr size_t kPT = (kK + kStages * kTileBytes + 1023) / 1024 * 1024;
  static constexpr size_t kX = kPT + (kAlt ? 4 : kRaw ? 2 : 1) * kPTBytes;  // f32 [NH/4][threads]
  // f32 [4][NH] per-warp max / sum; [2][4][NH] with kAlt (per warpgroup)
  static constexpr size_t kWarp = kX + (size_t)NH / 4 * kThreads * 4;
  // f32 [4][NH]: m, l, alpha, scale; [5][NH] in the raw variant, adding the
  // score factor
  static constexpr size_t kHead = kWarp + (size_t)(kAlt ? 2 : 1) * 4 * NH * 4;
  static constexpr size_t kValid = kHead + (size_t)(kRaw ? 5 : 4) * NH * 4;  // int [stages][64]
  // u64 [3][stages]: full, ready, empty; then the cluster merge's (merge_pushed)
  static constexpr size_t kBar = kValid + (size_t)kStages * kBK * 4;
  // Raw variant: the PV factor words (raw_fac_at; kAlt: per warpgroup), then
  // per warpgroup the warps' scale maxima, [4 warps][4] (kAlt: u16x2 pairs).
  static constexpr size_t kFac = (kBar + (3 * kStages + 1) * 8 + 15) / 16 * 16;
  static constexpr size_t kSmax = kFac + (kRaw ? (kAlt ? 2 : 1) * kRawFacWords * 4 : 0);
  static constexpr size_t kBytes = kSmax + (kRaw ? 2 * 16 * 4 : 0);
  // Typed views of the carve-outs.
  __device__ __forceinline__ static int* valid(char* smem) { return smem_at<int>(smem, kValid); }
  __device__ __forceinline__ static float* exchange(char* smem) { return smem_at<float>(smem, kX); }
  __device__ __forceinline__ static float* warp(char* smem) { return smem_at<float>(smem, kWarp); }
  __device__ __forceinline__ static float* head(char* smem) { return smem_at<float>(smem, kHead); }
  __device__ __forceinline__ static uint32_t* fac(char* smem) { return smem_at<uint32_t>(smem, kFac); }
  __device__ __forceinline__ static uint32_t* smax(char* smem) { return smem_at<uint32_t>(smem, kSmax); }
  __device__ __forceinline__ static uint64_t* bars(char* smem) { return smem_at<uint64_t>(smem, kBar); }
  __device__ __forceinline__ static uint64_t* merge_bar(char* smem) { return bars(smem) + 3 * kStages; }
  // The key stages as f32 once every tile is done (partials, exchanges).
  __device__ __forceinline__ static float* drained(char* smem) { return smem_at<float>(smem, kK); }
};

// Threads of a swap kernel block: the FP8 instantiations add the producer warps.
__host__ __device__ constexpr int swap_threads(bool fp8) { return kThreads + (fp8 ? kProducerWarps * UKV_WARP : 0); }

#if defined(UKV_HAS_WGMMA)
// Registers per thread of the FP8 swap kernels (one block per SM): at entry,
// and in the raw variant's producer and consumer warps while the tiles run
// (setmaxnreg; the block's total stays within the SM's 64 K).
constexpr int kEntryRegs = 65536 / swap_threads(true) / 8 * 8;
constexpr int kRawProducerRegs = 40;
constexpr int kRawConsumerRegs = (65536 - kProducerWarps * UKV_WARP * kRawProducerRegs) / kThreads / 8 * 8;
static_assert(kEntryRegs == 168 && kRawConsumerRegs == 232, "384 threads: 168 at entry, 40 + 232 in the tile loop");
// Named barriers (bar.sync / bar.arrive ids; 0 is __syncthreads') of the raw
// variants' register hand-over, the same ids in both heads-on-N kernels
// (SwapBarrier and RoleBarrier name their others): the producers have lent
// theirs / the consumers have given them back. Ids are compile-time constants
// everywhere: with an id in a register ptxas reserves all 16 barriers.
enum RegsBarrier : int { kRegsLentBarrier = 4, kRegsBackBarrier = 5 };

// Byte offset of P^T[h][key] in a swap kernel's P^T buffer: 128-byte rows of
// 64 bf16, 16-byte chunks XOR-swizzled by h & 7.
__device__ __forceinline__ uint32_t pt_at(int h, int key) {
  return (uint32_t)(h * 128 + (((key >> 3) ^ (h & 7)) << 4) + (key & 7) * 2);
}

// D[64 x NH] (+)= A . B^T of the heads-on-N kernels, on bf16 or f16 operands.
template <int NH, bool kF16 = false>
__device__ __forceinline__ void swap_mma(float (&d)[NH / 2], const uint32_t (&a)[4], uint64_t b, int accumulate = 1) {
  static_assert(NH == 16 || NH == 32, "heads-on-N blocks hold 16 or 32 heads");
  if constexpr (NH == 16) {
    ukv_wgmma_m64n16k16_ra<kF16>(d, a, b, accumulate);
  } else {
    ukv_wgmma_m64n32k16_ra<kF16>(d, a, b, accumulate);
  }
}
#endif

#if defined(UKV_HAS_WGMMA)
// The end of a heads-on-N kernel, once m_h and l_h hold the block's per-head
// (m, l) and each consumer thread its accumulators o[mb][i] (fragment layout
// below, warpgroup wg owning dims 256 wg .. 256 wg + 255): merged in the
// cluster (merge_pushed, in `region`: the block's query and key stages, on its
// own mbarrier), or the sink and the LSE, then the output written directly or
// stored to the workspace. Every thread of the block calls it; `consumer`: the
// thread holds accumulators.
template <int NH, bool kRaw, int kRows>
__device__ __forceinline__ void swap_finish(const ukv_attention_params& p, const SplitConfig& cfg, BlockTask task,
                                            const SplitWork& work, char* region, uint64_t* merge_bar,
                                            const float* m_h, const float* l_h, float* scale_h, bool consumer, int wg,
                                            int q, int lane, const float (&o)[kRows][NH / 2]) {
  constexpr int kRegs = NH / 2;
  const int tid = threadIdx.x, t = task.t, hb = task.hb, split = blockIdx.z;
  const int h0 = hb * NH, g = lane >> 2, tq = lane & 3;
  const auto head_of = [&](int i) { return 8 * (i / 4) + 2 * tq + (i & 1); };
  // Fragment (mb, i) of this thread: dim 64 (4 wg + mb) + 16 q + g (+8), head 8 (i/4) + 2 tq + (i & 1);
  // the raw variant's code blocks: 64 (4 wg + mb) + 16 q + 2 g (+1) (raw_pv_codes).
  const auto dim_of = [&](int mb, int i) {
    const int hi = (i & 2) ? 1 : 0;
    if constexpr (kRaw) {
      if (4 * wg + mb < kD / 64 - 1) return 64 * (4 * wg + mb) + 16 * q + 2 * g + hi;
    }
    return 64 * (4 * wg + mb) + 16 * q + g + 8 * hi;
  };
  if (!work.direct && cfg.cluster != 0) {
    ukv_cp_async_wait<0>();  // no copy still lands in the stages
    float* acc_s = reinterpret_cast<float*>(region);
    if (consumer) {
#pragma unroll
      for (int mb = 0; mb < 4; ++mb)
#pragma unroll
        for (int i = 0; i < kRegs; ++i) acc_s[partial_at(head_of(i), dim_of(mb, i))] = o[mb][i];
    }
    merge_pushed<NH>(p, t, h0, work.cut.count, split, cfg.splits, m_h, l_h, region, merge_bar, consumer);
    return;
  }
  if (tid < NH) {
    float lse = -INFINITY;
    scale_h[tid] = h0 + tid < p.num_heads ? fold_sink(p, h0 + tid, m_h[tid], l_h[tid], &lse) : 0.f;
    if (work.direct && p.lse != nullptr && h0 + tid < p.num_heads) {
      p.lse[(int64_t)t * p.lse_stride_token + h0 + tid] = lse;
    }
  }
  __syncthreads();
  if (!consumer) {
    return;
  } else if (work.direct) {
    const float* cs = inverse_rope_row(p, t);
#pragma unroll
    for (int mb = 0; mb < 4; ++mb)
#pragma unroll
      for (int i = 0; i < kRegs; ++i) {
        const int h = head_of(i);
        float v = o[mb][i] * scale_h[h];
        // Rope dims (warpgroup 1, mb 3): a pair's other dim is held by lane ^ 4
        // (g +- 1, same head), and every lane takes part in the shuffle.
        if (cs != nullptr && wg == 1 && mb == 3) {
          const float other = ukv_shfl_xor(v, 4, UKV_WARP);
          const int d = dim_of(mb, i);
          const float2 c = *reinterpret_cast<const float2*>(cs + ((d - (kD - 64)) & ~1));
          v = (d & 1) == 0 ? v * c.x + other * c.y : v * c.x - other * c.y;
        }
        if (h0 + h >= p.num_heads) continue;
        ukv_bf16* out = static_cast<ukv_bf16*>(p.out) + (int64_t)t * p.out_stride_token +
                        (int64_t)(h0 + h) * p.out_stride_head;
        out[dim_of(mb, i)] = ukv_float_to_bf16(v);
      }
  } else {
    float* rec = static_cast<float*>(p.workspace) +
                 (((size_t)t * gridDim.y + hb) * cfg.splits + split) * partial_floats(NH);
    if (tid < NH) {
      rec[tid] = m_h[tid];
      rec[NH + tid] = l_h[tid];
    }
#pragma unroll
    for (int mb = 0; mb < 4; ++mb)
#pragma unroll
      for (int i = 0; i < kRegs; ++i) rec[2 * NH + (size_t)head_of(i) * kD + dim_of(mb, i)] = o[mb][i];
  }
}

#endif  // UKV_HAS_WGMMA

}  // namespace
#endif  // UKV_NVIDIA_KERNELS
