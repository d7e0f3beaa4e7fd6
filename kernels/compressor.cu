// The KV compressor (docs/compressor.md): gated pooling of each closed group
// of raw `kv_score` rows, RMSNorm, RoPE (and for the indexer compressor the
// Hadamard transform), then the store, the operations of src/compressor.rs,
// src/rope.rs and src/indexer.rs in the same order.
//
// One block per token (ratio 128 on sm_90: a cluster of blocks per token,
// compress_c128_cluster_kernel). A token appends its raw row to its
// request's ring (decode: in this kernel; prefill: in compress_write_kernel,
// launched after it, so that no group reads a ring row the same call
// overwrites). A token
// whose position closes a group gathers the group's window rows (its own and
// its request's earlier rows in the call from `kv_score`, older ones from
// the ring), pools every channel with one thread per channel, in blocks of 8
// candidates with the fixed exp of src/compressor.rs (`exp_f32`), and with
// ukv_mul_rn / ukv_add_rn / ukv_sub_rn so nothing is contracted into an FMA:
// the pooled values are the CPU backend's bit for bit. Warp 0 then normalizes
// (the sum of squares in double, row_math.cuh: almost always the host's
// factor) and rotates; the stores are pool_rows.cuh (pool rows), cache_rows.cuh
// (FlashMLA) and indexer_rows.cuh (indexer keys), the writers every other
// operation uses.
//
// Launch configuration depends on num_tokens only; no allocation or host
// synchronization (graph-safe). Device values are never trusted: a token with
// an invalid batch id, slot or negative position is skipped; a group whose
// first position is past the RoPE table or whose location is negative or past
// the target is not stored; every read and write stays inside the state,
// `kv_score` and the target.
#include "compressor_group.cuh"

namespace {

using namespace ukv_compressor;

// Threads of compress_kernel: ratio 4 a thread per channel (its decode
// chain is the per-thread pooling and epilogue, not throughput), ratio 128
// two channels per thread.
template <int Ratio, int Dim>
__host__ __device__ constexpr int block_threads() {
  return Ratio == 4 ? Dim : kThreads;
}

// Latent rows with a thread per dim (compress_kernel<4, 512>): the norm's
// sum of squares over the block (each warp's butterfly sum, then the warps'
// in warp order), the scale and RoPE on the thread's own dim (its pair's
// other half from the neighbouring lane), then the stores of store_latent.
// `w` is the dim's norm weight; `c`, `s` its RoPE pair's cos and sin.
__device__ __forceinline__ void finish_latent_per_dim(const ukv_compress_params& p, float x, float w, float c, float s,
                                                      float* pooled, double* warp_sums, int64_t loc) {
  constexpr int kRopeDim = 448;
  const int d = threadIdx.x, lane = d % UKV_WARP, warp = d / UKV_WARP;
  const double sq = ukv_xor_sum<16, 1>((double)x * (double)x);
  if (lane == 0) warp_sums[warp] = sq;
  __syncthreads();
  double sum = 0.0;
#pragma unroll
  for (int i = 0; i < 512 / UKV_WARP; ++i) sum += warp_sums[i];
  float y = ukv_mul_rn(ukv_mul_rn(x, ukv_rms_factor(sum, 512, p.eps)), w);
  if (d >= kRopeDim) {  // whole warps
    const float other = ukv_shfl_xor(y, 1, UKV_WARP);
    float re = d % 2 == 0 ? y : other, im = d % 2 == 0 ? other : y;
    ukv_rope_rotate(re, im, c, s);
    y = d % 2 == 0 ? re : im;
  }
  pooled[d] = y;
  __syncthreads();
  if (threadIdx.x < 2 * UKV_WARP) store_latent(p, pooled, loc, (int)threadIdx.x / UKV_WARP);
}

// One token per block: decode appends its row; a closing token stores its group.
template <int Ratio, int Dim, typename In>
__global__ void __launch_bounds__((block_threads<Ratio, Dim>())) compress_kernel(ukv_compress_params p) {
  constexpr int kWindow = Ratio == 4 ? 8 : Ratio;
  constexpr int kRow = 2 * (Ratio == 4 ? 2 : 1) * Dim;
  constexpr int kT = block_threads<Ratio, Dim>(), kPer = Dim / kT;
  static_assert(kPer * kT == Dim && kPer <= 2, "one or two channels per thread");
  // A thread per dim of a latent row: the epilogue runs on every thread.
  constexpr bool kPerDim = Dim == 512 && kT == 512;
  __shared__ const void* rows[kWindow];
  __shared__ int input[kWindow];
  __shared__ float pooled[Dim];
  __shared__ double warp_sums[kT / UKV_WARP];
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int64_t t = blockIdx.x;
  const In* own = static_cast<const In*>(p.kv_score) + t * p.kv_stride;
  // Decode: this thread's quads of the token's raw row, loaded now (their
  // latency hides behind the pooling) and stored into the ring after it.
  constexpr int kRowQuads = kRow / 4, kQuadsPer = (kRowQuads + kT - 1) / kT;
  float4 mine[kQuadsPer];
#pragma unroll
  for (int q = 0; q < kQuadsPer; ++q) {
    const int i = threadIdx.x + q * kT;
    if (!p.prefill && i < kRowQuads) mine[q] = load_quad(own, i);
  }
  int b, slot;
  int64_t pos, loc;
  token_fields(p, t, b, pos, loc);
  const int64_t first = (pos + 1) / Ratio * Ratio - Ratio;
  const bool closes = stores_group(p, Ratio, pos, loc);
  // A closing token's epilogue inputs (per thread where kPerDim, else into L1
  // by warp 0) and, ratio 4, the thread's `ape` values: loaded beside the
  // slot (batch id -> slot -> window rows), not behind it.
  float w = 0.f, c = 0.f, s = 0.f;
  float bias[Ratio == 4 ? kWindow : 1];
  if (closes) {
    if constexpr (kPerDim) {
      const int d = threadIdx.x;
      w = weight_at(p, d);
      if (d >= 448) {
        const float* cs = p.rope_table + first * p.table_stride + ((d - 448) & ~1);
        c = cs[0], s = cs[1];
      }
    } else if (threadIdx.x < UKV_WARP) {
      prefetch_epilogue(p, first);
    }
    if constexpr (Ratio == 4) {
#pragma unroll
      for (int i = 0; i < kWindow; ++i) bias[i] = ape_at<Ratio, Dim>(p, i, (int)threadIdx.x);
    }
  }
  if (!token_slot(p, b, pos, slot)) return;  // uniform: one token per block
  if (closes) {
    const int64_t start = first - (kWindow - Ratio);
    window_rows<kWindow, kRow, In>(p, t, b, slot, pos, start, rows, input, (int)threadIdx.x, kT);
    __syncthreads();
    const int first_valid = start < 0 ? (int)-start : 0;
    // A thread's two channels (ratio 128) one after the other: side by side,
    // their 256 loads would not stay in registers.
    // Measured (bench/notes/v35.md): the branch-free exps made the ratio-4
    // latent decode 0.2-0.4 us slower and the indexer decode 0.1 us faster.
    constexpr bool kBranchFree = Dim == 128;
    const auto pool = [&](int d) {
      if constexpr (Ratio == 4) {  // one channel per thread: d is threadIdx.x
        const auto held = [&](int i) { return bias[i]; };
        if (first_valid != 0) return pool_channel<Ratio, Dim, In, 4, kBranchFree>(rows, input, held, d);
        return pool_channel<Ratio, Dim, In, 0, kBranchFree>(rows, input, held, d);
      }
      const auto load = [&](int i) { return ape_at<Ratio, Dim>(p, i, d); };
      return pool_channel<Ratio, Dim, In, 0, kBranchFree>(rows, input, load, d);
    };
    const int d0 = threadIdx.x, d1 = threadIdx.x + kT;
    float out0 = 0.f, out1 = 0.f;
    if (d0 < Dim) out0 = pool(d0);
    if (d1 < Dim) out1 = pool(d1);
    if constexpr (kPerDim) {
      finish_latent_per_dim(p, out0, w, c, s, pooled, warp_sums, loc);
    } else {
      if (d0 < Dim) pooled[d0] = out0;
      if (d1 < Dim) pooled[d1] = out1;
      __syncthreads();
      finish_group(p, pooled, first, loc);
    }
  }
  // Decode: the ring row of `pos` held position pos - ring, which no group
  // of this token reads (its window starts at pos + 1 - kWindow >= pos - ring).
  // Written after the pooling, whose loads would otherwise wait for these
  // stores (the compiler cannot tell the ring rows apart).
  if (p.prefill) return;
  float4* dst = reinterpret_cast<float4*>(ring_row(p, slot, pos, kRow));
#pragma unroll
  for (int q = 0; q < kQuadsPer; ++q) {
    const int i = threadIdx.x + q * kT;
    if (i < kRowQuads) dst[i] = mine[q];
  }
}

// Two consecutive values of a raw row (8-byte aligned f32, 4-byte bf16).
__device__ __forceinline__ float2 load_pair(const float* row, int64_t i) {
  return reinterpret_cast<const float2*>(global_row(row))[i];
}
__device__ __forceinline__ float2 load_pair(const ukv_bf16* row, int64_t i) {
  const uint32_t v = reinterpret_cast<const unsigned int*>(global_row(row))[i];
  return make_float2(ukv_fp8_bits_float(v << 16), ukv_fp8_bits_float(v & 0xFFFF0000u));
}

// Channels d, d + 1 of a ratio-4 group's 8 candidates (one lane): values
// and scores, masked candidates zero.
struct PairRows {
  float2 v[8], l[8];
};
template <int Dim, typename In, int kFirstValid>
__device__ __forceinline__ void load_pairs(const void* const* rows, const int* input, int d, PairRows& r) {
  constexpr int kValues = 2 * Dim;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    // Candidates 0..3: the previous group's overlap channels; 4..7: the own
    // channels (offset Dim in the row).
    const int ch = (i >= 4 ? Dim : 0) + d;
    r.v[i] = r.l[i] = make_float2(0.f, 0.f);
    if (i < kFirstValid) continue;
    if (input[i]) {
      r.v[i] = load_pair(static_cast<const In*>(rows[i]), ch >> 1);
      r.l[i] = load_pair(static_cast<const In*>(rows[i]), (kValues + ch) >> 1);
    } else {
      r.v[i] = load_pair(static_cast<const float*>(rows[i]), ch >> 1);
      r.l[i] = load_pair(static_cast<const float*>(rows[i]), (kValues + ch) >> 1);
    }
  }
}

// The pooled channels d, d + 1 of loaded candidates, each as pool_channel
// pools it (scores plus `ape`, here the block's copy, rows of 2 Dim; one
// block of 8).
template <int Dim, int kFirstValid>
__device__ __forceinline__ float2 pool_pairs(const float* ape, const PairRows& r, int d) {
  float2 bias[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) bias[i] = *reinterpret_cast<const float2*>(ape + (i & 3) * 2 * Dim + (i >= 4 ? Dim : 0) + d);
  float out[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    float l[8], v[8], bm[1], bs[1], ba[1];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[i] = e == 0 ? r.v[i].x : r.v[i].y;
      l[i] = i < kFirstValid ? 0.f : ukv_add_rn(e == 0 ? r.l[i].x : r.l[i].y, e == 0 ? bias[i].x : bias[i].y);
    }
    pool_block<kFirstValid>(l, v, bm[0], bs[0], ba[0]);
    out[e] = combine_blocks(bm, bs, ba);
  }
  return make_float2(out[0], out[1]);
}

// A warp's pooling of one ratio-4 group into `pooled`, lane l channels
// 2l, 2l + 1 of each 64-channel step, the next step's loads issued before
// this step's math so that a warp keeps its loads in flight while it pools.
template <int Dim, typename In, int kFirstValid>
__device__ __forceinline__ void pool_group_warp(const float* ape, const void* const* rows, const int* input,
                                                float* pooled) {
  constexpr int kStep = 2 * UKV_WARP, kSteps = Dim / kStep;
  static_assert(Dim % kStep == 0, "whole steps");
  const int d0 = 2 * ((int)threadIdx.x % UKV_WARP);
  PairRows cur;
  load_pairs<Dim, In, kFirstValid>(rows, input, d0, cur);
#pragma unroll 1
  for (int step = 0; step < kSteps; ++step) {
    const int d = d0 + step * kStep;
    // The last step reloads its own channels (in bounds; no branch).
    PairRows next;
    load_pairs<Dim, In, kFirstValid>(rows, input, step + 1 < kSteps ? d + kStep : d, next);
    *reinterpret_cast<float2*>(&pooled[d]) = pool_pairs<Dim, kFirstValid>(ape, cur, d);
    cur = next;
  }
}

// Ratio 4 prefill: a block per kSpan tokens, a warp per closing token (the
// block's closing tokens dealt to its warps in turn). A group is 8 candidate
// rows of at most 4 KB of values and scores: a warp pools it in 64-channel
// steps (pool_group_warp) and finishes it itself (finish_group_warp), so 8
// groups are in flight per block instead of one per 256-thread block. The
// pooling of a channel is pool_channel's, operation for operation.
constexpr int kSpan = UKV_WARP;
template <int Dim, typename In>
__global__ void __launch_bounds__(kThreads) compress_c4_prefill_kernel(ukv_compress_params p) {
  constexpr int kRatio = 4, kWindow = 8, kValues = 2 * Dim, kRow = 2 * kValues;
  constexpr int kWarps = kThreads / UKV_WARP;
  __shared__ __align__(16) float pooled[kWarps][Dim];
  // The block's copy of `ape` (rows of 2 Dim): read through L1 it missed to
  // L2 in 40% of reads once the streamed rows had evicted it.
  __shared__ __align__(16) float ape[4 * kValues];
  __shared__ const void* rows[kWarps][kWindow];
  __shared__ int input[kWarps][kWindow];
  __shared__ int closing[kSpan];
  __shared__ int count;
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int warp = (int)threadIdx.x / UKV_WARP, lane = (int)threadIdx.x % UKV_WARP;
  const int64_t t0 = (int64_t)blockIdx.x * kSpan;
  if (warp == 0) {
    int b, slot;
    int64_t pos, loc;
    const bool mine = t0 + lane < p.num_tokens && closes_group(p, kRatio, t0 + lane, b, slot, pos, loc);
    const uint64_t lanes = ukv_ballot(mine);
    if (mine) closing[ukv_popc64(lanes & ((1ull << lane) - 1ull))] = lane;
    if (lane == 0) count = ukv_popc64(lanes);
  }
  for (int i = (int)threadIdx.x; i < 4 * kValues; i += kThreads) ape[i] = p.ape[i / kValues * p.ape_stride + i % kValues];
  __syncthreads();
  for (int c = warp; c < count; c += kWarps) {
    const int64_t t = t0 + closing[c];
    int b, slot;
    int64_t pos, loc;
    token(p, t, b, slot, pos, loc);
    const int64_t first = pos + 1 - kRatio, start = first - (kWindow - kRatio);
    prefetch_epilogue(p, first);
    window_rows<kWindow, kRow, In>(p, t, b, slot, pos, start, rows[warp], input[warp], lane, UKV_WARP);
    ukv_syncwarp();
    if (start < 0) {
      pool_group_warp<Dim, In, 4>(ape, rows[warp], input[warp], pooled[warp]);
    } else {
      pool_group_warp<Dim, In, 0>(ape, rows[warp], input[warp], pooled[warp]);
    }
    ukv_syncwarp();
    finish_group_warp(p, pooled[warp], first, loc);
    ukv_syncwarp();  // the warp's rows and pooled values read before its next group
  }
}

#if !defined(__HIPCC__)
// Ratio 128 on sm_90: a group pooled by a cluster of kSlices blocks, block
// `rank` (blockIdx.z) channels kSliceDims rank ..: a lane per channel, a warp
// per 16 (kSlices 16) or 32 (kSlices 8) candidates, so the group's 512 KB of
// raw rows and 256 KB of `ape` load on 16 (8) SMs at once. The channel's
// block results are combined in block order as in
// pool_channel (the same bits), the exps of the combine spread over the
// warps. Blocks 1.. then send their slices into block 0's shared memory by
// st.async, completing on block 0's mbarrier: no cluster-scope fence (a
// release barrier's MEMBAR.ALL.GPU) and no second barrier before they exit;
// block 0 finishes the group.
//   Decode (16 blocks): cluster x is token x, which then appends its row
// (after the pooling, see compress_kernel). Prefill (8 blocks: its clusters
// are latency chains, and twice as many fit at once): cluster x takes the
// closing tokens among tokens 128 x .. 128 x + 127, in token order (one per
// request crossing a group boundary there: one or two for long chunks), so
// 8192 tokens are 64 clusters, not 8192; compress_write_kernel appends the
// rows after it.
//   Two blocks per SM (at most 128 registers; the forms take 96-111). Decode
// blocks of 512 threads (a warp per 8 candidates) were 5-18% slower
// (bench/notes/v40.md).
constexpr int kSlotTokens = 128;
template <typename In, bool kPrefill, int kSlices>
__global__ void __launch_bounds__(kThreads, 2) compress_c128_cluster_kernel(ukv_compress_params p) {
  constexpr int kRatio = 128, kDim = 512, kRow = 2 * kDim, kBlocks = kRatio / kBlock;
  constexpr int kSliceDims = kDim / kSlices, kWarps = kThreads / UKV_WARP;
  // Warp w: channels 32 (w % kLanes) .. of the slice, pooling blocks
  // kBlocksPer (w / kLanes) ..
  constexpr int kLanes = kSliceDims / UKV_WARP, kBlocksPer = kBlocks * kLanes / kWarps;
  static_assert(kLanes * UKV_WARP == kSliceDims && kBlocksPer * kWarps == kBlocks * kLanes, "whole blocks per warp");
  // Per pooling block and channel: max, sum, weighted sum; then the sum and
  // weighted sum scaled to the group's max.
  __shared__ float part[3][kBlocks][kSliceDims];
  __shared__ float scaled[2][kBlocks][kSliceDims];
  __shared__ __align__(16) float pooled[kDim];  // block 0: every block's slice
  __shared__ uint64_t landed;                   // block 0: the slices' bytes
  __shared__ const void* rows[kRatio];
  __shared__ int input[kRatio];
  __shared__ int closing[kSlotTokens];
  const int rank = (int)blockIdx.z, lane = (int)threadIdx.x % UKV_WARP, warp = (int)threadIdx.x / UKV_WARP;
  const int ch = warp % kLanes * UKV_WARP + lane, chunk = warp / kLanes;
  if (rank == 0 && threadIdx.x == 0) {
    ukv_mbar_init(&landed, 1);
    ukv_mbar_init_fence();
  }
  ukv_cluster_arrive_relaxed();  // waited for before the first st.async
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int64_t t0 = kPrefill ? (int64_t)blockIdx.x * kSlotTokens : (int64_t)blockIdx.x;
  // Decode: block `rank`'s share of the token's raw row (one quad for each of
  // its first kShareQuads threads), loaded now and appended after the pooling.
  constexpr int kShareQuads = kRow / 4 / kSlices;
  float4 share = make_float4(0.f, 0.f, 0.f, 0.f);
  if (!kPrefill && threadIdx.x < kShareQuads)
    share = load_quad(static_cast<const In*>(p.kv_score) + t0 * p.kv_stride, rank * kShareQuads + threadIdx.x);
  // The groups: prefill, the slot's closing tokens in token order, the same
  // list in every block of the cluster (warp w's ballot places its lanes
  // after the lower warps'); decode, the one token if it closes a group.
  int count, b, slot;
  int64_t pos, loc;
  bool live = false;
  const int d = rank * kSliceDims + ch, i0 = chunk * kBlocksPer * kBlock;
  float bias[kPrefill ? 1 : kBlocksPer * kBlock];  // decode: the thread's `ape` values
  if constexpr (kPrefill) {
    __shared__ int warp_counts[kSlotTokens / UKV_WARP];
    const int i = threadIdx.x;
    const bool mine = i < kSlotTokens && t0 + i < p.num_tokens && closes_group(p, kRatio, t0 + i, b, slot, pos, loc);
    const uint64_t lanes = ukv_ballot(mine);
    if (i < kSlotTokens && lane == 0) warp_counts[warp] = ukv_popc64(lanes);
    __syncthreads();
    int before = 0;
    count = 0;
    for (int w = 0; w < kSlotTokens / UKV_WARP; ++w) {
      before += w < warp ? warp_counts[w] : 0;
      count += warp_counts[w];
    }
    if (mine) closing[before + ukv_popc64(lanes & ((1ull << lane) - 1ull))] = i;
    __syncthreads();
  } else {
    // A closing token's `ape` values load beside its slot (batch id -> slot
    // -> ring rows), not behind it.
    token_fields(p, t0, b, pos, loc);
    const bool closes = stores_group(p, kRatio, pos, loc);
    if (closes) {
#pragma unroll
      for (int n = 0; n < kBlocksPer * kBlock; ++n) bias[n] = p.ape[(i0 + n) * p.ape_stride + d];
    }
    live = token_slot(p, b, pos, slot);
    count = live && closes ? 1 : 0;
  }
  ukv_cluster_wait();  // block 0's mbarrier initialized
  const uint32_t remote_pooled = ukv_cluster_smem_addr(&pooled[d], 0);
  const uint32_t remote_landed = ukv_cluster_smem_addr(&landed, 0);
  for (int c = 0; c < count; ++c) {
    const int64_t t = kPrefill ? t0 + closing[c] : t0;
    if constexpr (kPrefill) token(p, t, b, slot, pos, loc);
    const int64_t first = pos + 1 - kRatio;
    if (rank == 0 && warp == 0) prefetch_epilogue(p, first);
    if constexpr (kPrefill) {
      window_rows<kRatio, kRow, In>(p, t, b, slot, pos, first, rows, input, (int)threadIdx.x, kThreads);
      __syncthreads();
    }
    // Decode: candidate i is position first + i, the token's own row last
    // (the last warp's last candidate) and the earlier ones in the ring. A
    // warp's 16 (32) rows are consecutive ring rows: first is a multiple of
    // 128, so they start at a multiple of 16 (32) and do not wrap (rings of
    // 128, 256).
    const float* ring = kPrefill ? nullptr : ring_row(p, slot, first + i0, kRow) + d;
    const float* ape = kPrefill ? p.ape + d + i0 * p.ape_stride : nullptr;
    // Two pooling blocks' loads in flight at a time (32 values and 16 of
    // `ape` per thread): all of a warp's four (kSlices 8) took 243 registers.
    constexpr int kStep = 2;
    static_assert(kBlocksPer % kStep == 0, "whole steps");
#pragma unroll 1
    for (int k0 = 0; k0 < kBlocksPer; k0 += kStep) {
      float l[kStep][kBlock], v[kStep][kBlock];
#pragma unroll
      for (int k = 0; k < kStep; ++k) {
#pragma unroll
        for (int j = 0; j < kBlock; ++j) {
          const int n = (k0 + k) * kBlock + j, i = i0 + n;  // n: the warp's candidate n
          if constexpr (kPrefill) {
            v[k][j] = raw_at<In>(rows[i], input[i], d);
            l[k][j] = ukv_add_rn(raw_at<In>(rows[i], input[i], kDim + d), ape[n * p.ape_stride]);
          } else {
            if (n == kBlocksPer * kBlock - 1 && i0 + kBlocksPer * kBlock == kRatio) {  // i == kRatio - 1
              const In* own = static_cast<const In*>(p.kv_score) + t * p.kv_stride;
              v[k][j] = raw_value(own, d);
              l[k][j] = raw_value(own, kDim + d);
            } else {
              v[k][j] = raw_value(ring, n * kRow);
              l[k][j] = raw_value(ring, n * kRow + kDim);
            }
            l[k][j] = ukv_add_rn(l[k][j], bias[n]);
          }
        }
      }
#pragma unroll
      for (int k = 0; k < kStep; ++k) {
        const int blk = chunk * kBlocksPer + k0 + k;
        pool_block<0, false>(l[k], v[k], part[0][blk][ch], part[1][blk][ch], part[2][blk][ch]);
      }
    }
    __syncthreads();
    // combine_blocks, its exps by the warps that pooled the blocks, its sums
    // in block order by the first kLanes warps.
    float big = part[0][0][ch];
#pragma unroll
    for (int k = 1; k < kBlocks; ++k) big = part[0][k][ch] > big ? part[0][k][ch] : big;
#pragma unroll
    for (int k = chunk * kBlocksPer; k < (chunk + 1) * kBlocksPer; ++k) {
      const float e = pool_exp<false>(ukv_sub_rn(part[0][k][ch], big));
      scaled[0][k][ch] = ukv_mul_rn(part[1][k][ch], e);
      scaled[1][k][ch] = ukv_mul_rn(part[2][k][ch], e);
    }
    __syncthreads();
    if (chunk == 0) {
      float s = 0.f, a = 0.f;
#pragma unroll
      for (int k = 0; k < kBlocks; ++k) s = ukv_add_rn(s, scaled[0][k][ch]), a = ukv_add_rn(a, scaled[1][k][ch]);
      if (rank == 0) {
        pooled[d] = a / s;
      } else {
        ukv_st_async4(remote_pooled, __float_as_uint(a / s), remote_landed);
      }
    }
    if (rank == 0) {
      if (threadIdx.x == 0) ukv_mbar_arrive_expect(&landed, (kSlices - 1) * kSliceDims * (uint32_t)sizeof(float));
      ukv_mbar_wait(&landed, (uint32_t)c & 1u);
      __syncthreads();  // and the block's own slice
      finish_group(p, pooled, first, loc);
    }
    if (c + 1 < count) {
      // Block 0 has read `pooled` (its values stored) before the next group's
      // slices overwrite it, and every block its tables and partial results.
      __syncthreads();
      ukv_cluster_sync_exit();
    }
  }
  if (kPrefill || !live) return;
  // Block `rank` appends its share of the row after the pooling (see compress_kernel).
  float4* dst = reinterpret_cast<float4*>(ring_row(p, slot, pos, kRow));
  if (threadIdx.x < kShareQuads) dst[rank * kShareQuads + threadIdx.x] = share;
}
#endif

// Prefill's ring writes, after the pooling kernel: each request's rows that
// no later token of the same request in the call overwrites (its last
// `ring`). A warp per token: a request's last 128 rows (ratio 128) are 128
// warps' copies, not one block's.
template <typename In>
__global__ void __launch_bounds__(kThreads) compress_write_kernel(ukv_compress_params p) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();  // the groups have read the ring
  const int64_t t = (int64_t)blockIdx.x * (kThreads / UKV_WARP) + threadIdx.x / UKV_WARP;
  int b, slot;
  int64_t pos, loc;
  if (t >= p.num_tokens || !token(p, t, b, slot, pos, loc)) return;
  const int64_t u = t + p.ring;
  if (u < p.num_tokens && p.batch_id[u] == b && ukv_index_at(p.positions, p.positions_i64 != 0, u) == pos + p.ring)
    return;
  write_row(p, static_cast<const In*>(p.kv_score) + t * p.kv_stride, slot, pos);
}

__global__ void __launch_bounds__(kThreads) compress_clear_kernel(ukv_compress_clear_params p) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int64_t total = p.num_rows * p.row_floats;
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < total; i += (int64_t)gridDim.x * kThreads) {
    p.rows[i] = i % p.row_floats < p.row_floats / 2 ? 0.0f : -INFINITY;
  }
}

using Kernel = void (*)(ukv_compress_params);

template <int Ratio, int Dim>
Kernel pick(bool f32) {
  return f32 ? compress_kernel<Ratio, Dim, float> : compress_kernel<Ratio, Dim, ukv_bf16>;
}

template <int Dim>
Kernel pick_c4_prefill(bool f32) {
  return f32 ? compress_c4_prefill_kernel<Dim, float> : compress_c4_prefill_kernel<Dim, ukv_bf16>;
}

}  // namespace

extern "C" {

int unikv_gpu_compress(int device, const ukv_compress_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_tokens == 0) return UKV_SHIM_OK;
    Kernel kernel = nullptr;
    if (p->ratio == 4 && p->dim == 512) kernel = pick<4, 512>(p->kv_f32 != 0);
    if (p->ratio == 4 && p->dim == 128) kernel = pick<4, 128>(p->kv_f32 != 0);
    if (p->ratio == 128 && p->dim == 512) kernel = pick<128, 512>(p->kv_f32 != 0);
    if (kernel == nullptr || (p->target == 2) != (p->dim == 128)) {
      ukv::set_error("compress: no kernel for this ratio, dim and target");
      return UKV_SHIM_INVALID;
    }
    if (p->ring <= 0 || (p->ring & (p->ring - 1)) != 0) {  // ring_row masks
      ukv::set_error("compress: the state ring is not a power of two");
      return UKV_SHIM_INVALID;
    }
    dim3 grid((unsigned)p->num_tokens);
    const dim3 block(kThreads);
    dim3 kernel_block(p->ratio == 4 ? (p->dim == 512 ? block_threads<4, 512>() : block_threads<4, 128>())
                                    : block_threads<128, 512>());
    if (p->prefill && p->ratio == 4) {
      kernel_block = block;
      kernel = p->dim == 512 ? pick_c4_prefill<512>(p->kv_f32 != 0) : pick_c4_prefill<128>(p->kv_f32 != 0);
      grid = dim3((unsigned)ukv::cdiv(p->num_tokens, kSpan));
    }
#if !defined(__HIPCC__)
    // Ratio 128: one cluster per token (decode, 16 blocks: past the portable
    // cluster size) or per 128-token slot (prefill, 8 blocks) where the
    // loaded image has clusters (DeviceFacts::sm90_code).
    ukv::DeviceFacts facts;
    if (int r = ukv::device_facts(device, &facts)) return r;
    if (p->ratio == 128 && facts.sm90_code()) {
      bool pdl = false;
      if (int r = ukv::pdl_supported(device, &pdl)) return r;
      const bool f32 = p->kv_f32 != 0, prefill = p->prefill != 0;
      constexpr int kDecodeSlices = 16, kPrefillSlices = 8;
      const auto cluster_kernel =
          prefill ? (f32 ? compress_c128_cluster_kernel<float, true, kPrefillSlices>
                         : compress_c128_cluster_kernel<ukv_bf16, true, kPrefillSlices>)
                  : (f32 ? compress_c128_cluster_kernel<float, false, kDecodeSlices>
                         : compress_c128_cluster_kernel<ukv_bf16, false, kDecodeSlices>);
      const unsigned clusters = (unsigned)(prefill ? ukv::cdiv(p->num_tokens, kSlotTokens) : p->num_tokens);
      const int slices = prefill ? kPrefillSlices : kDecodeSlices;
      ukv_error_t e = slices > 8 ? ukv_func_allow_large_clusters(cluster_kernel) : UKV_SUCCESS;
      if (e == UKV_SUCCESS)
        e = ukv_launch_dependent(cluster_kernel, dim3(clusters, 1, (unsigned)slices), block, 0, (ukv_stream_t)stream,
                                 pdl, slices, *p);
      if (e != UKV_SUCCESS) {
        (void)ukv_get_last_error();
        return ukv::report(e, "compress_c128_cluster_kernel");
      }
    } else
#endif
    if (int r = ukv::launch_early(device, kernel, grid, kernel_block, stream, "compress_kernel", *p)) return r;
    if (!p->prefill) return UKV_SHIM_OK;
    return ukv::launch_early(device, p->kv_f32 ? compress_write_kernel<float> : compress_write_kernel<ukv_bf16>,
                             dim3((unsigned)ukv::cdiv(p->num_tokens, kThreads / UKV_WARP)), block, stream,
                             "compress_write_kernel", *p);
  })
}

int unikv_gpu_compress_clear(int device, const ukv_compress_clear_params* p, void* stream) {
  UKV_ENTRY(device, {
    const int64_t total = p->num_rows * p->row_floats;
    if (total <= 0) return UKV_SHIM_OK;
    const int64_t needed = ukv::cdiv(total, kThreads);
    const unsigned blocks = (unsigned)(needed < (1 << 16) ? needed : (1 << 16));
    return ukv::launch_early(device, compress_clear_kernel, dim3(blocks), dim3(kThreads), stream,
                             "compress_clear_kernel", *p);
  })
}

}  // extern "C"
