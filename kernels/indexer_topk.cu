// Indexer top-k selection (docs/indexer.md §3): the CSA page-index table of
// every token of a forward, after the scores (indexer_score.cu) in a launch
// of its own; both grids depend on the tensor shapes only.
//
// One block per token, 512 threads (select_held_kernel; small
// batches of rows past 4096 keys on a cluster of 8 blocks per token), the
// row's keys read once into registers, 4 to 64 consecutive keys per thread;
// rows past 32768 keys in batches too large for clusters re-read the logits
// in every pass (select_reread_kernel). At most topk keys: all of them.
// Otherwise a radix select over 32-bit order keys (the total order of
// src/indexer.rs order_key: -0 = +0, NaN lowest), 8 bits per pass from the
// top, finds the topk-th largest key T; the output keeps key > T, and key ==
// T while fewer than topk - count(key > T) ties were kept in index order, so
// ties go to lower indices and the set is the CPU backend's exactly. The
// passes stop early once every key sharing T's known top bits is taken (then
// "T" is those bits and its ties all keys under them): with distinct scores
// the third pass usually settles it. Prefix
// sums place the kept keys in ascending index order; -1 fills the rest of
// the row. With the fused CSA tail (unikv_indexer_topk_fill_csa) every
// write of an output entry also writes its pool row into the token's CSA
// stream (RowOut), so the tail costs no launch of its own.
//
// Device values are never trusted: a batch id outside the page table makes
// the token padding (a row of -1), its keys are clamped to the logits row and
// the page-table row, and a key on a page outside the cache scores -inf.
#include "indexer_keys.cuh"
#include "warp.cuh"

namespace {

using namespace ukv_indexer_topk;

constexpr int kSelectThreads = 512;
constexpr int kSelectWarps = kSelectThreads / UKV_WARP;

// Key i's page index: page_table[b][i / 64] * 64 + i % 64.
__device__ __forceinline__ int32_t page_index(const ukv_indexer_topk_params& p, int b, int i) {
  return (int32_t)((int64_t)p.page_table[b * p.page_table_stride + i / kPage] * kPage + i % kPage);
}

// Token t's output row: its topk_indices row and, for the fused CSA tail,
// where its selected keys go in its CSA slice (docs/index-streams.md §4).
// The tail's bounds are clamped as csa_tail_kernel (index.cu) clamps them.
struct RowOut {
  int32_t* out;
  int64_t csa_at;  // CSA entry of selected key 0
  int csa_len;     // 0: no tail
  // Entry j holds `page`: a -1, or a page index outside the pool's CSA rows,
  // puts the token's newest SWA row (the entry before the tail) in the stream.
  __device__ __forceinline__ void put(const ukv_indexer_topk_params& p, int j, int32_t page) const {
    out[j] = page;
    if (j < csa_len && csa_at + j < p.csa_capacity)
      p.csa_indices[csa_at + j] = page >= 0 && page < p.csa_rows ? p.csa_row_base + page : p.csa_indices[csa_at - 1];
  }
};

// Where token t's CSA tail starts and ends (swa: its window entries, 0 for
// no tail). The indptr loads are issued beside the row's first loads and
// used only at the output: a CSA stream built at the start of the step is
// out of L2 by a later layer, and waiting for it before the radix passes
// cost about 0.5 us a call (bench/notes/v47.md).
struct CsaSlice {
  int start, end, swa;
};

__device__ __forceinline__ CsaSlice csa_slice(const ukv_indexer_topk_params& p, int t) {
  if (p.csa_indices == nullptr) return CsaSlice{0, 0, 0};
  const int start = p.csa_indptr[t], end = p.csa_indptr[t + 1];
  const int64_t pos = ukv_index_at(p.positions, p.positions_i64 != 0, t);
  const int swa = p.batch_id[t] < 0 || pos < 0 ? 0 : (int)min(pos + 1, (int64_t)p.csa_window);
  return CsaSlice{start, end, swa};
}

// Made where the row is written.
__device__ __forceinline__ RowOut row_out(const ukv_indexer_topk_params& p, int t, const CsaSlice& c) {
  RowOut r{p.topk_indices + t * p.topk_stride, 0, 0};
  if (c.swa < 1 || c.start < 0 || (int64_t)c.start + c.swa > p.csa_capacity) return r;
  r.csa_at = (int64_t)c.start + c.swa;
  r.csa_len = (int)max((int64_t)0, min((int64_t)c.end - c.start - c.swa, (int64_t)p.topk_width));
  return r;
}

// src/indexer.rs order_key.
__device__ __forceinline__ uint32_t order_key(float x) {
  if (x != x) return 0u;
  const uint32_t bits = x == 0.f ? 0u : __float_as_uint(x);
  return (bits >> 31) != 0u ? ~bits : bits | 0x80000000u;
}

// Inclusive prefix sum of `v` over the block (all threads call it); `total`
// receives the block's sum. `scratch` holds kSelectWarps ints.
__device__ __forceinline__ int block_inclusive_sum(int v, int* scratch, int* total) {
  const int lane = threadIdx.x % UKV_WARP, warp = threadIdx.x / UKV_WARP;
  int x = ukv_warp_inclusive_sum(v);
  __syncthreads();  // the scratch's previous use is over
  if (lane == UKV_WARP - 1) scratch[warp] = x;
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < kSelectWarps; ++w) {
    const int s = scratch[w];
    before += w < warp ? s : 0;
    all += s;
  }
  *total = all;
  return x + before;
}

// Rows past what the register kernels hold (more than 32768 keys in batches
// too large for clusters): one block per token runs the radix select of the
// file's head, re-reading the row from the logits (L2) in every pass. For
// the output, warp w walks keys [w seg, (w + 1) seg) 32 at a time
// (coalesced); a lane's rank among its warp's ties or kept keys is a
// ballot's popcount plus the warp's running count, so the block scans twice
// per row, not twice per 512 keys (bench/notes/v34.md).
__global__ void __launch_bounds__(kSelectThreads) select_reread_kernel(ukv_indexer_topk_params p) {
  // One histogram per warp: the scores of a row share their top bits, so a
  // single histogram serializes the whole block's atomics on a few bins.
  __shared__ int hist[kSelectWarps][256];
  __shared__ int scratch[kSelectWarps];
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining;
  __shared__ bool s_complete;
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int t = blockIdx.x, tid = threadIdx.x;
  const TokenKeys tk = token_keys(p, t);
  const float* logits = p.logits + t * p.logits_stride;
  const int n = tk.keys;
  int written = n;
  // Made (its slice loaded too) where the output starts: made before the
  // radix passes, its fields were held across them and spilled.
  RowOut out;
  if (n <= p.topk) {
    out = row_out(p, t, csa_slice(p, t));
    for (int i = tid; i < n; i += kSelectThreads) out.put(p, i, page_index(p, tk.request, i));
  } else {
    // Radix select: after pass r the top 8(r + 1) bits of T are known, and
    // once every key under them is taken the lower bits do not matter.
    uint32_t prefix = 0, known = 0;
    int remaining = p.topk;  // keys still to take among those matching the prefix
    for (int pass = 0; pass < 4; ++pass) {
      const int shift = 24 - 8 * pass;
      for (int b = tid; b < kSelectWarps * 256; b += kSelectThreads) hist[b / 256][b % 256] = 0;
      __syncthreads();
      for (int i = tid; i < n; i += kSelectThreads) {
        const uint32_t k = order_key(logits[i]);
        if ((k & known) == prefix) atomicAdd(&hist[tid / UKV_WARP][(k >> shift) & 0xFFu], 1);
      }
      __syncthreads();
      // Thread d takes digit 255 - d: the inclusive sum counts the keys at or
      // above that digit; the digit where it first reaches `remaining` is T's.
      const int digit = 255 - tid;
      int count = 0;
      if (tid < 256)
        for (int w = 0; w < kSelectWarps; ++w) count += hist[w][digit];
      int total;
      const int at_or_above = block_inclusive_sum(count, scratch, &total);
      if (tid < 256 && at_or_above >= remaining && at_or_above - count < remaining) {
        s_prefix = prefix | ((uint32_t)digit << shift);
        s_remaining = remaining - (at_or_above - count);
        s_complete = at_or_above == remaining;  // T's bin is taken whole
      }
      __syncthreads();
      prefix = s_prefix;
      remaining = s_remaining;
      known = 0xFFFFFFFFu << shift;
      if (s_complete) break;
    }
    // prefix = T's known bits; `remaining` ties (keys equal to T on those
    // bits) are taken, lowest indices first.
    const int warp = tid / UKV_WARP, lane = tid % UKV_WARP;
    const int seg = (n + kSelectWarps - 1) / kSelectWarps;
    const int begin = min(n, warp * seg), end = min(n, begin + seg);
    const uint64_t lower = (1ull << lane) - 1ull;
    const auto walk = [&](auto body) {
      for (int i0 = begin; i0 < end; i0 += UKV_WARP) {
        const int i = i0 + lane;
        body(i, i < end ? order_key(logits[i]) & known : 0u, i < end);
      }
    };
    int ties = 0;
    walk([&](int, uint32_t k, bool in) { ties += ukv_popc64(ukv_ballot(in && k == prefix)); });
    int all;
    // One value per warp (lane 0's), scanned over the warps.
    int tie_base = block_inclusive_sum(lane == 0 ? ties : 0, scratch, &all) - (lane == 0 ? ties : 0);
    tie_base = ukv_shfl(tie_base, 0, UKV_WARP);
    int keeps = 0, tie_seen = 0;
    walk([&](int, uint32_t k, bool in) {
      const bool tie = in && k == prefix;
      const uint64_t tie_lanes = ukv_ballot(tie);
      const bool keep = in && (k > prefix || (tie && tie_base + tie_seen + ukv_popc64(tie_lanes & lower) < remaining));
      keeps += ukv_popc64(ukv_ballot(keep));
      tie_seen += ukv_popc64(tie_lanes);
    });
    int slot = block_inclusive_sum(lane == 0 ? keeps : 0, scratch, &all) - (lane == 0 ? keeps : 0);
    slot = ukv_shfl(slot, 0, UKV_WARP);
    tie_seen = 0;
    out = row_out(p, t, csa_slice(p, t));
    walk([&](int i, uint32_t k, bool in) {
      const bool tie = in && k == prefix;
      const uint64_t tie_lanes = ukv_ballot(tie);
      const bool keep = in && (k > prefix || (tie && tie_base + tie_seen + ukv_popc64(tie_lanes & lower) < remaining));
      const uint64_t keep_lanes = ukv_ballot(keep);
      if (keep) out.put(p, slot + ukv_popc64(keep_lanes & lower), page_index(p, tk.request, i));
      slot += ukv_popc64(keep_lanes);
      tie_seen += ukv_popc64(tie_lanes);
    });
    written = p.topk;
  }
  for (int j = written + tid; j < p.topk_width; j += kSelectThreads) out.put(p, j, -1);
}

// Keys per thread of a row of n keys in select_held_kernel: the smallest of
// 4, 8, 16, ... up to kHeld with which kCluster blocks cover the row.
template <int kHeld, int kCluster>
__device__ __forceinline__ int row_span(int n) {
  int span = 4;
  while (span < kHeld && span * kSelectThreads * kCluster < n) span *= 2;
  return span;
}

// f(j) for j = 0 .. span - 1 (span a power of two from 4 to kHeld), each
// span's loop unrolled so that held[j] stays a register.
template <int kHeld, class F>
__device__ __forceinline__ void for_span(int span, F&& f) {
  if (span <= 4 || kHeld == 4) {
#pragma unroll
    for (int j = 0; j < 4; ++j) f(j);
  } else if (span <= 8 || kHeld == 8) {
#pragma unroll
    for (int j = 0; j < 8; ++j) f(j);
  } else if (span <= 16 || kHeld == 16) {
#pragma unroll
    for (int j = 0; j < 16; ++j) f(j);
  } else if (span <= 32 || kHeld == 32) {
#pragma unroll
    for (int j = 0; j < 32; ++j) f(j);
  } else {
#pragma unroll
    for (int j = 0; j < kHeld; ++j) f(j);
  }
}

// This thread's `span` consecutive keys from `first` as order keys (0 at
// `limit` and past), in 16-byte loads where the row allows.
template <int kHeld>
__device__ __forceinline__ void load_span(const float* logits, int first, int limit, int span,
                                          uint32_t (&held)[kHeld]) {
  const bool vector = reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  for_span<kHeld>(span, [&](int j) {
    if (j % 4 != 0) return;
    const int i = first + j;
    if (vector && i + 4 <= limit) {
      const float4 v = *reinterpret_cast<const float4*>(logits + i);
      held[j] = order_key(v.x);
      held[j + 1] = order_key(v.y);
      held[j + 2] = order_key(v.z);
      held[j + 3] = order_key(v.w);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) held[j + e] = i + e < limit ? order_key(logits[i + e]) : 0u;
    }
  });
}

// Rows of at most kCluster * kHeld * kSelectThreads keys, held in registers:
// the same radix select and output order as select_reread_kernel, built for
// the small batches, whose selection is a chain of short steps of a few
// hundred cycles each (bench/notes/v39.md):
//  - a thread holds `span` consecutive keys, the fewest (4, 8, ... kHeld)
//    with which the blocks cover the token's row, so a short row spreads over
//    all 16 warps (a warp issues a dependent instruction every ~5 cycles: 16
//    keys per thread made a pass ~300 instructions on one warp); warps
//    without keys skip the counting;
//  - one block loads the logits by the row's width (a capture-time maximum)
//    as soon as the previous kernel is done, beside the token's key count,
//    and reloads them only when the row is short enough for a smaller span;
//    the thread's page-table entry is read before the passes;
//  - the histograms of pass r are set r % 2, the first two cleared before the
//    PDL wait and each reused one while the next pass counts; a thread counts
//    its keys of its first key's digit in one atomic (the early passes' keys
//    share their top bits);
//  - after the histogram barrier the first 256 threads sum their digit's
//    counts (kCluster > 1: over the cluster's blocks, each block's counts
//    pushed into every block by st.async) and scan them per warp; after one
//    more barrier every warp finds T's digit itself from the warps' totals and
//    one row of the scan;
//  - one block scan of (keys above T, ties) per thread, plus the lower
//    blocks' totals, places the output.
// kCluster > 1 (sm_90, small batches of long rows): a token's blocks form a
// cluster, block r holding keys from r span kSelectThreads.
template <int kHeld, int kCluster>
__global__ void __launch_bounds__(kSelectThreads) select_held_kernel(ukv_indexer_topk_params p) {
  static_assert(kPage % kHeld == 0 && kHeld <= kPage, "a thread's keys on one page");
  constexpr int kDigits = 256, kDigitWarps = kDigits / UKV_WARP;
  __shared__ int hist[2][kSelectWarps][kDigits];
  __shared__ int above[kDigits];  // per digit warp: keys at or above the lane's digit
  __shared__ int digit_totals[kDigitWarps];
  __shared__ int scan_totals[2][kSelectWarps];
  // kCluster > 1: every block pushes its digit counts (16 bits: at most
  // kHeld * kSelectThreads keys a block) into each block's recv[pass & 1]
  // [sender] by st.async, completing on that block's landed[pass & 1]; then
  // its (keys above T, ties) into totals[sender]. Pushes instead of a cluster
  // barrier and remote loads: the barrier's release fences at GPU scope, and
  // made a cluster's pass twice a block's (bench/notes/v44.md). One buffer
  // per pass parity: a block may push pass r + 1 while another still sums
  // its pass r counts, never pass r + 2 (that needs this block's r + 1).
#if !defined(__HIPCC__)  // clusters: NVIDIA only
  constexpr int kRecv = kCluster > 1 ? kCluster : 1;
  constexpr uint32_t kCountBytes = kRecv * kDigits * sizeof(uint16_t);
  __shared__ __align__(4) uint16_t recv[2][kRecv][kDigits];
  __shared__ int totals[kRecv][2];
  __shared__ uint64_t landed[3];  // the two count buffers, then totals
#endif
  const int t = blockIdx.x, tid = threadIdx.x, warp = tid / UKV_WARP, lane = tid % UKV_WARP;
  const int rank = kCluster > 1 ? (int)blockIdx.z : 0;
#if !defined(__HIPCC__)
  if constexpr (kCluster > 1) {
    if (tid == 0) {
      for (int b = 0; b < 3; ++b) ukv_mbar_init(&landed[b], 1);
      ukv_mbar_init_fence();
      ukv_mbar_arrive_expect(&landed[0], kCountBytes);
      ukv_mbar_arrive_expect(&landed[1], kCountBytes);
      ukv_mbar_arrive_expect(&landed[2], kRecv * 2 * sizeof(int));
    }
    ukv_cluster_arrive_relaxed();  // waited for before the first push
  }
#endif
  ukv_pdl_launch_dependents();
  for (int i = tid; i < 2 * kSelectWarps * kDigits; i += kSelectThreads) (&hist[0][0][0])[i] = 0;
  ukv_pdl_wait();
  // One block: the keys as the row's width spreads them, loaded beside the
  // token's key count. A cluster waits for the count: its width's load would
  // be up to 512 KB a token, mostly wasted on the short rows of a wide table.
  const float* logits = p.logits + t * p.logits_stride;
  uint32_t held[kHeld];
  int span = 0;
  if constexpr (kCluster == 1) {
    span = row_span<kHeld, kCluster>(p.logits_width);
    load_span(logits, tid * span, p.logits_width, span, held);
  }
  const TokenKeys tk = token_keys(p, t);
  const CsaSlice slice = csa_slice(p, t);
  const int n = tk.keys;
  if (row_span<kHeld, kCluster>(n) != span) {  // uniform over the cluster
    span = row_span<kHeld, kCluster>(n);
    load_span(logits, (rank * kSelectThreads + tid) * span, n, span, held);
  }
  if constexpr (kCluster > 1) ukv_cluster_wait();
  const int first_key = (rank * kSelectThreads + tid) * span;
  // This thread's keys below n, whether its warp holds any, and their page.
  const int mine = max(0, min(span, n - first_key));
  const bool warp_keys = (rank * kSelectThreads + warp * UKV_WARP) * span < n;
  const int64_t page_base =
      mine > 0 ? (int64_t)p.page_table[tk.request * p.page_table_stride + first_key / kPage] * kPage : 0;
  RowOut out;  // made at the output (CsaSlice)
  int written = n;
  if (n <= p.topk) {
    out = row_out(p, t, slice);
    if (rank == 0)
      for (int i = tid; i < n; i += kSelectThreads) out.put(p, i, page_index(p, tk.request, i));
  } else {
    __syncthreads();  // the histograms are clear
    uint32_t prefix = 0, known = 0;  // T's bits found so far, and which
    int remaining = p.topk;            // keys still to take among those matching the prefix
    for (int pass = 0; pass < 4; ++pass) {
      const int shift = 24 - 8 * pass;
      int* h = hist[pass & 1][warp];
      if (warp_keys) {
        const uint32_t lead = (held[0] >> shift) & 0xFFu;
        int lead_count = 0;
        for_span<kHeld>(span, [&](int j) {
          const uint32_t d = (held[j] >> shift) & 0xFFu;
          const bool match = j < mine && (held[j] & known) == prefix;
          lead_count += match && d == lead;
          if (match && d != lead) atomicAdd(&h[d], 1);
        });
        if (lead_count != 0) atomicAdd(&h[lead], lead_count);
      }
      __syncthreads();
      // Thread d < 256 takes digit 255 - d: its count over the warps'
      // histograms (and the cluster's blocks), scanned within its warp.
      int c = 0;
      if (tid < kDigits) {
#pragma unroll
        for (int w = 0; w < kSelectWarps; ++w) c += hist[pass & 1][w][kDigits - 1 - tid];
      }
#if !defined(__HIPCC__)
      if constexpr (kCluster > 1) {
        // Even lanes push their digit's and the next one's counts as a word.
        const uint32_t pair = (uint32_t)c | (uint32_t)ukv_shfl(c, lane + 1, UKV_WARP) << 16;
        if (tid < kDigits) {
          if (lane % 2 == 0) {
            for (int r = 0; r < kCluster; ++r)
              ukv_st_async4(ukv_cluster_smem_addr(&recv[pass & 1][rank][tid], r), pair,
                            ukv_cluster_smem_addr(&landed[pass & 1], r));
          }
          ukv_mbar_wait(&landed[pass & 1], (uint32_t)(pass >> 1) & 1u);
          c = 0;
#pragma unroll
          for (int r = 0; r < kCluster; ++r) c += recv[pass & 1][r][tid];
        }
        // Re-armed for pass + 2, whose counts only come after every thread
        // here has read these (the next pass's histogram barrier).
        if (tid == 0) ukv_mbar_arrive_expect(&landed[pass & 1], kCountBytes);
      }
#endif
      if (tid < kDigits) {
        const int x = ukv_warp_inclusive_sum(c);
        above[tid] = x;
        if (lane == UKV_WARP - 1) digit_totals[warp] = x;
      }
      __syncthreads();
      // Every warp: the digit warp where the keys at or above first reach
      // `remaining` (a scan of the warps' totals over the first lanes), then
      // its lane.
      const int total = lane < kDigitWarps ? digit_totals[lane] : 0;
      const int running = ukv_warp_inclusive_sum(total);
      const int seg = max(0, ukv_first_lane(lane < kDigitWarps && running >= remaining));
      const int before = ukv_shfl(running - total, seg, UKV_WARP);
      const int at_or_above = before + above[seg * UKV_WARP + lane];
      const int strictly_above = before + (lane == 0 ? 0 : above[seg * UKV_WARP + lane - 1]);
      const int hit = max(0, ukv_first_lane(at_or_above >= remaining && strictly_above < remaining));
      prefix |= (uint32_t)(kDigits - 1 - (seg * UKV_WARP + hit)) << shift;
      known = 0xFFFFFFFFu << shift;
      remaining -= ukv_shfl(strictly_above, hit, UKV_WARP);
      // T's bin holds exactly the keys still to take: all are taken, and T's
      // lower bits do not matter.
      if (ukv_shfl(at_or_above - strictly_above, hit, UKV_WARP) == remaining) break;
      // Pass + 2 counts into this set: every thread has read it (the barrier above).
      if (pass < 2)
        for (int i = tid; i < kSelectWarps * kDigits; i += kSelectThreads) (&hist[pass & 1][0][0])[i] = 0;
    }
    // prefix = T's known bits; `remaining` ties (keys equal to T on those
    // bits) are taken, lowest indices first.
    int gt = 0, eq = 0;
    if (warp_keys) {
      for_span<kHeld>(span, [&](int j) {
        gt += j < mine && (held[j] & known) > prefix;
        eq += j < mine && (held[j] & known) == prefix;
      });
    }
    const int gt_incl = ukv_warp_inclusive_sum(gt), eq_incl = ukv_warp_inclusive_sum(eq);
    if (lane == UKV_WARP - 1) {
      scan_totals[0][warp] = gt_incl;
      scan_totals[1][warp] = eq_incl;
    }
    __syncthreads();
    int gt_before = gt_incl - gt, tie_rank = eq_incl - eq;
    int gt_all = 0, eq_all = 0;
    for (int w = 0; w < kSelectWarps; ++w) {
      gt_before += w < warp ? scan_totals[0][w] : 0;
      tie_rank += w < warp ? scan_totals[1][w] : 0;
      gt_all += scan_totals[0][w];
      eq_all += scan_totals[1][w];
    }
#if defined(__HIPCC__)
    (void)gt_all, (void)eq_all;  // the block's totals serve clusters only
#else
    if constexpr (kCluster > 1) {
      if (tid < kCluster) {
        ukv_st_async4(ukv_cluster_smem_addr(&totals[rank][0], tid), (uint32_t)gt_all,
                      ukv_cluster_smem_addr(&landed[2], tid));
        ukv_st_async4(ukv_cluster_smem_addr(&totals[rank][1], tid), (uint32_t)eq_all,
                      ukv_cluster_smem_addr(&landed[2], tid));
      }
      ukv_mbar_wait(&landed[2], 0u);
      for (int r = 0; r < rank; ++r) {
        gt_before += totals[r][0];
        tie_rank += totals[r][1];
      }
    }
#endif
    int slot = gt_before + min(tie_rank, remaining);
    out = row_out(p, t, slice);
    if (gt + eq > 0) {
      for_span<kHeld>(span, [&](int j) {
        const bool tie = j < mine && (held[j] & known) == prefix;
        if (j < mine && ((held[j] & known) > prefix || (tie && tie_rank < remaining)))
          out.put(p, slot++, (int32_t)(page_base + (first_key + j) % kPage));
        tie_rank += tie;
      });
    }
    written = p.topk;
  }
  if (rank == 0)
    for (int j = written + tid; j < p.topk_width; j += kSelectThreads) out.put(p, j, -1);
  // No exit barrier: no block reads another's shared memory, and each has
  // waited for every push into its own.
}

// Rows of up to 32768 keys select from registers (select_held_kernel), on
// one block per token, or for small batches of rows past 4096 keys on a
// cluster; longer rows re-read the logits (select_reread_kernel).
int launch_select(int device, const ukv_indexer_topk_params& p, void* stream) {
  const int w = p.logits_width;
#if !defined(__HIPCC__)
  // Small batches of long rows on sm_90: a cluster of kSelectCluster blocks
  // per token, so the row's passes run on 8 SMs. From 4097 keys wide: at
  // 8192 one block (16 keys a thread) took about 1.1 us more a call
  // (bench/notes/v44.md).
  constexpr int kSelectCluster = 8;
  ukv::DeviceFacts facts;
  if (int r = ukv::device_facts(device, &facts)) return r;
  constexpr int kSpan = kSelectCluster * kSelectThreads;  // keys per held register over the cluster
  // Up to 32 held keys per thread: at 64 the cluster kernel spilled 392 bytes.
  if (facts.sm90_code() && w > 8 * kSelectThreads && w <= 32 * kSpan &&
      p.num_tokens * kSelectCluster <= facts.sms) {
    const auto kernel =
        w <= 16 * kSpan ? select_held_kernel<16, kSelectCluster> : select_held_kernel<32, kSelectCluster>;
    bool pdl = false;
    if (int r = ukv::pdl_supported(device, &pdl)) return r;
    const ukv_error_t e = ukv_launch_dependent(kernel, dim3((unsigned)p.num_tokens, 1, kSelectCluster),
                                               dim3(kSelectThreads), 0, (ukv_stream_t)stream, pdl, kSelectCluster, p);
    if (e == UKV_SUCCESS) return UKV_SHIM_OK;
    (void)ukv_get_last_error();
    return ukv::report(e, "indexer select_held_kernel (cluster)");
  }
#endif
  // Register arrays for the row's width (the span a row uses follows its own
  // length); a 1024-thread block with 4 or 8 keys per thread was no faster at
  // 4096 or 8192 keys (bench/notes/v39.md).
  const auto kernel = w <= 4 * kSelectThreads    ? select_held_kernel<4, 1>
                      : w <= 8 * kSelectThreads  ? select_held_kernel<8, 1>
                      : w <= 16 * kSelectThreads ? select_held_kernel<16, 1>
                      : w <= 64 * kSelectThreads ? select_held_kernel<64, 1>
                                                 : select_reread_kernel;
  return ukv::launch_early(device, kernel, dim3((unsigned)p.num_tokens), dim3(kSelectThreads), stream,
                           "indexer select kernel", p);
}

}  // namespace

extern "C" int unikv_gpu_indexer_topk(int device, const ukv_indexer_topk_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_tokens == 0) return UKV_SHIM_OK;
    if (p->score) {
      if (int r = launch_scores(device, *p, stream)) return r;
    }
    return launch_select(device, *p, stream);
  })
}
