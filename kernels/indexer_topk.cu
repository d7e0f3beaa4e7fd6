// Indexer scores and top-k selection (docs/indexer.md §3): the CSA
// page-index table of every token of a forward, in two launches whose grids
// depend on the tensor shapes only.
//
// Scores: three kernels, one chosen per launch (unikv_gpu_indexer_topk):
// FP8 wgmma on sm_90a for e4m3fn (score_wgmma_kernel), f16 mma.sync on other
// NVIDIA GPUs and for e4m3fnuz (score_mma_kernel), CUDA cores on HIP
// (score_kernel, below).
//
// score_kernel: one block per (token, page of 64 keys), 256 threads.
// The token's query heads and the page's 64 keys are decoded into shared
// memory as bf16 (exact: every e4m3 value is a bf16), rows padded by 8 bytes so
// the 8 keys or 4 heads a warp reads sit in different banks. Thread (key
// tid / 4, group tid % 4) holds its key's 128 values in registers and takes
// heads g, g + 4, ...: each dot product in fp32 in dim order (the products are
// exact), relu, times the head weight; the 4 groups' partial sums meet through
// shuffles and one multiply by the key's scale gives the score.
//
// Selection: one block per token, 512 threads (select_held_kernel; small
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
#include <math.h>

#include "fp8.cuh"
#include "shim.cuh"
#include "warp.cuh"

namespace {

constexpr int kDims = 128;
constexpr int kPage = 64;  // keys per page
constexpr int kScoreThreads = 256;
constexpr int kGroups = kScoreThreads / kPage;  // threads per key
constexpr int kRowBytes = kDims * 2 + 8;        // a bf16 row in shared memory, padded
constexpr int kSelectThreads = 512;
constexpr int kSelectWarps = kSelectThreads / UKV_WARP;

// Token t's request (-1: padding) and number of keys.
struct TokenKeys {
  int request;
  int keys;
};

__device__ __forceinline__ TokenKeys token_keys(const ukv_indexer_topk_params& p, int t) {
  // Both loads issued before either is used.
  const int b = p.batch_id[t];
  const int64_t pos = ukv_index_at(p.positions, p.positions_i64 != 0, t);
  if (b < 0 || b >= p.requests) return TokenKeys{-1, 0};
  // (pos + 1) / 4 without overflowing at a hostile INT64_MAX.
  const int64_t visible = pos < 0 ? 0 : pos / 4 + ((pos & 3) == 3);
  const int64_t cap = min((int64_t)p.logits_width, (int64_t)p.max_pages * kPage);
  return TokenKeys{b, (int)min(visible, cap)};
}

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

// 16 codes to 16 bf16 values (8 words) of a shared-memory row.
__device__ __forceinline__ void decode16(uint4 codes, ukv_fp8_format fmt, uint32_t* dst) {
  const uint32_t w[4] = {codes.x, codes.y, codes.z, codes.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float v[4];
    ukv_fp8x2_decode(w[i] & 0xFFFFu, fmt, v[0], v[1]);
    ukv_fp8x2_decode(w[i] >> 16, fmt, v[2], v[3]);
    // Exact: an FP8 value has 4 significant bits.
    dst[2 * i] = ukv_pack_bf16x2(v[0], v[1]);
    dst[2 * i + 1] = ukv_pack_bf16x2(v[2], v[3]);
  }
}

__global__ void __launch_bounds__(kScoreThreads) score_kernel(ukv_indexer_topk_params p) {
  extern __shared__ __align__(16) char smem[];
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int page_col = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
  const TokenKeys tk = token_keys(p, t);
  const int first = page_col * kPage;
  if (tk.request < 0 || first >= tk.keys) return;
  float* logits = p.logits + t * p.logits_stride + first;
  const int key = tid / kGroups, group = tid % kGroups;
  const int64_t page = p.page_table[tk.request * p.page_table_stride + page_col];
  if (page < 0 || page >= p.cache_pages) {
    if (group == 0 && first + key < tk.keys) logits[key] = -INFINITY;
    return;
  }
  const ukv_fp8_format fmt = (ukv_fp8_format)p.format;
  char* k_s = smem;
  char* q_s = smem + kPage * kRowBytes;
  float* w_s = reinterpret_cast<float*>(q_s + p.num_heads * kRowBytes);
  const uint8_t* page_base = p.cache + page * p.bytes_per_page;
  // 8 pieces of 16 codes per row.
  for (int i = tid; i < kPage * 8; i += kScoreThreads) {
    const uint4 c = reinterpret_cast<const uint4*>(page_base + (i / 8) * kDims)[i % 8];
    decode16(c, fmt, reinterpret_cast<uint32_t*>(k_s + (i / 8) * kRowBytes + (i % 8) * 32));
  }
  const uint8_t* q = p.q_fp8 + t * p.q_stride_token;
  for (int i = tid; i < p.num_heads * 8; i += kScoreThreads) {
    const uint4 c = reinterpret_cast<const uint4*>(q + (i / 8) * p.q_stride_head)[i % 8];
    decode16(c, fmt, reinterpret_cast<uint32_t*>(q_s + (i / 8) * kRowBytes + (i % 8) * 32));
  }
  for (int h = tid; h < p.num_heads; h += kScoreThreads) w_s[h] = p.weights[t * p.weights_stride + h];
  __syncthreads();

  uint32_t k2[kDims / 2];
#pragma unroll
  for (int i = 0; i < kDims / 2; ++i) k2[i] = reinterpret_cast<const uint32_t*>(k_s + key * kRowBytes)[i];
  float sum = 0.f;
  for (int h = group; h < p.num_heads; h += kGroups) {
    const uint32_t* q2 = reinterpret_cast<const uint32_t*>(q_s + h * kRowBytes);
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kDims / 2; ++i) {
      const uint32_t a = q2[i];
      dot = fmaf(__uint_as_float(a << 16), __uint_as_float(k2[i] << 16), dot);
      dot = fmaf(__uint_as_float(a & 0xFFFF0000u), __uint_as_float(k2[i] & 0xFFFF0000u), dot);
    }
    sum = fmaf(w_s[h], fmaxf(dot, 0.f), sum);
  }
  sum = ukv_xor_sum<1, kGroups / 2>(sum);
  if (group == 0 && first + key < tk.keys) {
    const float scale = *reinterpret_cast<const float*>(page_base + (int64_t)kDims * kPage + key * 4);
    logits[key] = scale * sum;
  }
}

#if !defined(__HIPCC__)
// The scores on tensor cores (NVIDIA sm_80+): one block per (token, run of
// kRunPages pages), 8 warps; warp w multiplies keys 16 (w % 4) .. + 15 of
// each page against heads 32 (w / 4) .. + 31 (m16n8k16 f16 MMA, f32
// accumulation; every FP8 value is an f16 and the products are exact).
//  - Keys: each page's raw codes and scales land by cp.async in one of
//    kStages shared-memory stages (rows padded to 144 bytes), kStages - 1
//    pages ahead; the A fragments are converted from the raw codes in
//    registers (cvt e4m3x2 -> f16x2), so no f16 copy of the keys is stored.
//  - The MMA's k order is permuted the same way in A and B (lane quad t of a
//    k-step takes dims 4t..4t+3: A slots 2t, 2t+1 and 8+2t, 8+2t+1), so one
//    4-byte load gives a row's two A registers and one 8-byte load a head's
//    two B registers.
//  - Queries: each warp converts its B fragments (8 k-steps x 4 n-tiles)
//    straight from the token's codes once and keeps them in 64 registers for
//    the whole run; shared memory holds only key stages.
// Each lane weighs its accumulators' relu by the head weights; the quad and
// then the two head halves sum up, and the key's scale gives the score.
constexpr int kRunPages = 8;
constexpr int kStages = 4;
constexpr int kMmaHeads = 64;             // heads the fragments cover (zero past num_heads)
constexpr int kRawRow = kDims + 16;       // a page row of codes in shared memory, padded

// The pages a tensor-core score block covers: block (x, t) scores pages
// [first, last) of token t's row, the x-th run of `run` pages; an empty range
// for padding tokens and runs past the row.
struct PageRun {
  TokenKeys tk;
  int first, last;
  const int32_t* pages;  // the request's page-table row

  __device__ __forceinline__ bool page_ok(const ukv_indexer_topk_params& p, int col) const {
    const int64_t id = pages[col];
    return id >= 0 && id < p.cache_pages;
  }
  // Page `col`'s bytes (codes, then scales) and whether it is a page of the
  // run in the cache; any other gives the cache's start, for zero-filled
  // copies.
  __device__ __forceinline__ const uint8_t* bytes(const ukv_indexer_topk_params& p, int col, bool& ok) const {
    ok = col < last && page_ok(p, col);
    return p.cache + (ok ? (int64_t)pages[col] * p.bytes_per_page : 0);
  }
};

__device__ __forceinline__ PageRun page_run(const ukv_indexer_topk_params& p, int t, int run) {
  const TokenKeys tk = token_keys(p, t);
  const int first = (int)blockIdx.x * run;
  if (tk.request < 0 || first * kPage >= tk.keys) return PageRun{tk, first, first, p.page_table};
  return PageRun{tk, first, min(first + run, (tk.keys + kPage - 1) / kPage),
                 p.page_table + tk.request * p.page_table_stride};
}

// Two codes (the first in the low byte) to an f16 pair: one conversion
// instruction for e4m3fn on sm_89+, the software decoder otherwise.
template <ukv_fp8_format F>
__device__ __forceinline__ uint32_t codes_to_half2(uint32_t codes) {
#if defined(UKV_HAS_E4M3_CVT)
  if (F == UKV_FP8_E4M3FN) return ukv_cvt_e4m3x2_to_half2(codes);
#endif
  return ukv_pack_half2(ukv_fp8_decode((uint8_t)codes, F), ukv_fp8_decode((uint8_t)(codes >> 8), F));
}

// Instantiated per format, so the e4m3fn kernel carries no software decoder.
template <ukv_fp8_format F>
__global__ void __launch_bounds__(kScoreThreads) score_mma_kernel(ukv_indexer_topk_params p) {
#if defined(UKV_HAS_MMA_BF16)
  __shared__ __align__(16) char raw_s[kStages][kPage * kRawRow];
  __shared__ __align__(16) float scale_s[kStages][kPage];
  __shared__ float w_s[kMmaHeads];
  __shared__ float part_s[2][kPage];
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int t = blockIdx.y, tid = threadIdx.x, lane = tid % UKV_WARP, warp = tid / UKV_WARP;
  const PageRun run = page_run(p, t, kRunPages);
  if (run.first >= run.last) return;
  // Page `col` into stage `stage`: 512 16-byte pieces of codes and 16 of
  // scales; an invalid page (or one past the run) lands as zeros.
  const auto issue = [&](int col, int stage) {
    bool ok;
    const uint8_t* base = run.bytes(p, col, ok);
    for (int i = tid; i < kPage * 8; i += kScoreThreads)
      ukv_cp_async16(raw_s[stage] + (i / 8) * kRawRow + (i % 8) * 16, base + (i / 8) * kDims + (i % 8) * 16, ok);
    if (tid < kPage / 4)
      ukv_cp_async16(&scale_s[stage][4 * tid], base + kDims * kPage + 16 * tid, ok);
    ukv_cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(run.first + s, s);

  // B fragments (permuted k order), straight from the token's query codes:
  // head head0 + 8 n + g, dims 16 ks + 4 tq .. + 3 (zeros past num_heads).
  const int head0 = 32 * (warp / 4), key0 = 16 * (warp % 4);
  const int g = lane / 4, tq = lane % 4;
  uint32_t bq[8][4][2];
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    const int h = head0 + 8 * n + g;
    const uint32_t* q = reinterpret_cast<const uint32_t*>(p.q_fp8 + t * p.q_stride_token + h * p.q_stride_head);
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      const uint32_t c = h < p.num_heads ? q[4 * ks + tq] : 0u;
      bq[ks][n][0] = codes_to_half2<F>(c & 0xFFFFu);
      bq[ks][n][1] = codes_to_half2<F>(c >> 16);
    }
  }
  if (tid < kMmaHeads) w_s[tid] = tid < p.num_heads ? p.weights[t * p.weights_stride + tid] : 0.f;
  __syncthreads();
  float wl[4][2];
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    wl[n][0] = w_s[head0 + 8 * n + 2 * tq];
    wl[n][1] = w_s[head0 + 8 * n + 2 * tq + 1];
  }

  for (int col = run.first; col < run.last; ++col) {
    const int i = col - run.first, stage = i % kStages;
    issue(col + kStages - 1, (i + kStages - 1) % kStages);
    ukv_cp_async_wait<kStages - 1>();
    __syncthreads();
    const char* rows = raw_s[stage];
    float acc[4][4] = {};
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      const uint32_t lo = *reinterpret_cast<const uint32_t*>(rows + (key0 + g) * kRawRow + 16 * ks + 4 * tq);
      const uint32_t hi = *reinterpret_cast<const uint32_t*>(rows + (key0 + g + 8) * kRawRow + 16 * ks + 4 * tq);
      const uint32_t a[4] = {codes_to_half2<F>(lo & 0xFFFFu), codes_to_half2<F>(hi & 0xFFFFu),
                             codes_to_half2<F>(lo >> 16), codes_to_half2<F>(hi >> 16)};
#pragma unroll
      for (int n = 0; n < 4; ++n) ukv_mma_f16_16816(acc[n], a, bq[ks][n][0], bq[ks][n][1]);
    }
    // Keys key0 + g (acc[n][0..1]) and key0 + g + 8 (acc[n][2..3]).
    float klo = 0.f, khi = 0.f;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      klo += wl[n][0] * fmaxf(acc[n][0], 0.f) + wl[n][1] * fmaxf(acc[n][1], 0.f);
      khi += wl[n][0] * fmaxf(acc[n][2], 0.f) + wl[n][1] * fmaxf(acc[n][3], 0.f);
    }
    klo = ukv_xor_sum<1, 2>(klo);
    khi = ukv_xor_sum<1, 2>(khi);
    if (tq == 0) {
      part_s[warp / 4][key0 + g] = klo;
      part_s[warp / 4][key0 + g + 8] = khi;
    }
    __syncthreads();
    if (tid < kPage && col * kPage + tid < run.tk.keys) {
      const float score = run.page_ok(p, col) ? scale_s[stage][tid] * (part_s[0][tid] + part_s[1][tid]) : -INFINITY;
      p.logits[t * p.logits_stride + col * kPage + tid] = score;
    }
    // The stage and part_s are rewritten by the next iteration.
    __syncthreads();
  }
#else
  (void)p;
#endif
}

// The scores on Hopper's FP8 tensor cores (sm_90a, e4m3fn): one warpgroup per
// (token, run of up to kRunPages pages; fewer for small batches, see
// launch_tensor_scores). Per page one m64n64k32 wgmma chain of 4
// k-steps multiplies the page's 64 keys (A, M = keys) by the token's 64 query
// heads (B, N = heads) straight from the codes, so a thread's accumulators
// hold 2 keys x 16 heads: the head sum is 16 weighted relus and two quad
// shuffles, with no exchange between warps. Key and query rows are 128 codes,
// one 128-byte swizzle row each: cp.async places 16-byte chunk c of row r at
// chunk c ^ (r % 8), the layout the descriptors name. kWgStages - 1 pages are
// in flight per block and 5 blocks share an SM; the MMAs take about a quarter
// of the time a page's bytes take at the copy rate.
constexpr int kWgThreads = 128;
constexpr int kWgBlocksPerSm = 5;  // 41 KB of shared memory per block

__global__ void __launch_bounds__(kWgThreads) score_wgmma_kernel(ukv_indexer_topk_params p, int run_pages) {
#if defined(UKV_HAS_WGMMA)
  constexpr int kWgStages = 4;
  const auto swizzled_chunk = [](int row, int chunk) { return row * kDims + ((chunk ^ (row & 7)) << 4); };
  __shared__ __align__(1024) uint8_t keys_s[kWgStages][kPage * kDims];
  __shared__ __align__(1024) uint8_t q_s[kMmaHeads * kDims];
  __shared__ __align__(16) float scale_s[kWgStages][kPage];
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int t = blockIdx.y, tid = threadIdx.x, lane = tid % UKV_WARP, warp = tid / UKV_WARP;
  const PageRun run = page_run(p, t, run_pages);
  if (run.first >= run.last) return;
  // Page `col` into `stage` (an invalid page lands as zeros; nothing past the
  // run), then one commit group either way.
  const auto issue = [&](int col, int stage) {
    if (col < run.last) {
      bool ok;
      const uint8_t* base = run.bytes(p, col, ok);
      for (int i = tid; i < kPage * 8; i += kWgThreads)
        ukv_cp_async16(keys_s[stage] + swizzled_chunk(i / 8, i % 8), base + i * 16, ok);
      if (tid < kPage / 4) ukv_cp_async16(&scale_s[stage][4 * tid], base + kDims * kPage + 16 * tid, ok);
    }
    ukv_cp_async_commit();
  };
  // The query rows join the first page's group; heads past num_heads are zeros.
  const uint8_t* q = p.q_fp8 + t * p.q_stride_token;
  for (int i = tid; i < kMmaHeads * 8; i += kWgThreads) {
    const int h = i / 8;
    const bool ok = h < p.num_heads;
    ukv_cp_async16(q_s + swizzled_chunk(h, i % 8), q + (ok ? h * p.q_stride_head : 0) + (i % 8) * 16, ok);
  }
#pragma unroll
  for (int s = 0; s < kWgStages - 1; ++s) issue(run.first + s, s);

  // This thread's accumulators: keys 16 warp + lane / 4 (+ 8), heads
  // 8 j + 2 (lane % 4) + {0, 1} for j < 8.
  float w[8][2];
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int h = 8 * j + 2 * (lane % 4) + e;
      w[j][e] = h < p.num_heads ? p.weights[t * p.weights_stride + h] : 0.f;
    }
  const int key0 = 16 * warp + lane / 4;

  for (int col = run.first; col < run.last; ++col) {
    const int i = col - run.first, stage = i % kWgStages;
    ukv_cp_async_wait<kWgStages - 2>();
    ukv_fence_async_shared();
    // Also: every thread is past the previous page, whose stage is refilled now.
    __syncthreads();
    issue(col + kWgStages - 1, (i + kWgStages - 1) % kWgStages);
    float acc[32];
    ukv_wgmma_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k)
      ukv_wgmma_m64n64k32_e4m3(acc, ukv_wgmma_desc(keys_s[stage] + 32 * k, 16, 1024),
                               ukv_wgmma_desc(q_s + 32 * k, 16, 1024), k);
    ukv_wgmma_commit();
    ukv_wgmma_wait<0>();
    ukv_wgmma_fence_regs(acc);
    float lo = 0.f, hi = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      lo += w[j][0] * fmaxf(acc[4 * j], 0.f) + w[j][1] * fmaxf(acc[4 * j + 1], 0.f);
      hi += w[j][0] * fmaxf(acc[4 * j + 2], 0.f) + w[j][1] * fmaxf(acc[4 * j + 3], 0.f);
    }
    lo = ukv_xor_sum<1, 2>(lo);
    hi = ukv_xor_sum<1, 2>(hi);
    if (lane % 4 == 0) {
      const bool ok = run.page_ok(p, col);
      float* out = p.logits + t * p.logits_stride + col * kPage;
      if (col * kPage + key0 < run.tk.keys) out[key0] = ok ? scale_s[stage][key0] * lo : -INFINITY;
      if (col * kPage + key0 + 8 < run.tk.keys) out[key0 + 8] = ok ? scale_s[stage][key0 + 8] * hi : -INFINITY;
    }
  }
  ukv_cp_async_wait<0>();
#else
  (void)p;
  (void)run_pages;
#endif
}
#endif  // !__HIPCC__

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

// Test hook (unikv_gpu_test_indexer_score_kernel): 0 the launch's choice,
// 1 the CUDA-core kernel (the HIP build's), 2 the f16 mma.sync kernel, so an
// H200 run checks every score kernel.
thread_local int g_score_kernel = 0;

// The score launch: FP8 wgmma for e4m3fn on sm_90a, f16 mma.sync on other
// NVIDIA GPUs (sm_80+) and for e4m3fnuz, whose codes the tensor cores do not
// read, CUDA cores on HIP and older GPUs.
int launch_scores(int device, const ukv_indexer_topk_params& p, void* stream) {
  const int64_t pages = ukv::cdiv(p.logits_width, kPage);
#if !defined(__HIPCC__)
  ukv::DeviceFacts facts;
  if (int r = ukv::device_facts(device, &facts)) return r;
  if (facts.major >= 8 && g_score_kernel != 1) {
    if (facts.wgmma && p.format == UKV_FP8_E4M3FN && g_score_kernel == 0) {
      // Runs of 8 pages, halved while the batch would not fill one wave of
      // blocks, so small batches spread their pages over more SMs
      // (bench/notes/v19.md).
      int run = kRunPages;
      while (run > 1 && p.num_tokens * ukv::cdiv(pages, run) < kWgBlocksPerSm * facts.sms) run /= 2;
      return ukv::launch_early(device, score_wgmma_kernel,
                               dim3((unsigned)ukv::cdiv(pages, run), (unsigned)p.num_tokens), dim3(kWgThreads),
                               stream, "indexer score_wgmma_kernel", p, run);
    }
    return ukv::launch_early(device,
                             p.format == UKV_FP8_E4M3FNUZ ? score_mma_kernel<UKV_FP8_E4M3FNUZ>
                                                          : score_mma_kernel<UKV_FP8_E4M3FN>,
                             dim3((unsigned)ukv::cdiv(pages, kRunPages), (unsigned)p.num_tokens),
                             dim3(kScoreThreads), stream, "indexer score_mma_kernel", p);
  }
#endif
  const size_t smem = (size_t)(kPage + p.num_heads) * kRowBytes + (size_t)p.num_heads * 4;
  return ukv::launch_early_smem(device, score_kernel, dim3((unsigned)pages, (unsigned)p.num_tokens),
                                dim3(kScoreThreads), smem, stream, "indexer score_kernel", p);
}

}  // namespace

#if defined(UKV_TEST_HOOKS)
extern "C" void unikv_gpu_test_indexer_score_kernel(int kernel) { g_score_kernel = kernel; }
#endif

extern "C" int unikv_gpu_indexer_topk(int device, const ukv_indexer_topk_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_tokens == 0) return UKV_SHIM_OK;
    if (p->score) {
      if (int r = launch_scores(device, *p, stream)) return r;
    }
    return launch_select(device, *p, stream);
  })
}
