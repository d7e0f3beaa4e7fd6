// Indexer scores (docs/indexer.md §3): every visible key's score of every
// token into `logits`, for the top-k selection (indexer_topk.cu).
//
// Three kernels, one chosen per launch (launch_scores):
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
// Device values are never trusted: a batch id outside the page table makes
// the token padding, its keys are clamped to the logits row and the
// page-table row, and a key on a page outside the cache scores -inf.
#include <math.h>

#include "fp8.cuh"
#include "indexer_keys.cuh"
#include "warp.cuh"

namespace {

using namespace ukv_indexer_topk;

constexpr int kDims = 128;
constexpr int kScoreThreads = 256;
constexpr int kGroups = kScoreThreads / kPage;  // threads per key
constexpr int kRowBytes = kDims * 2 + 8;        // a bf16 row in shared memory, padded

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

// Test hook (unikv_gpu_test_indexer_score_kernel): 0 the launch's choice,
// 1 the CUDA-core kernel (the HIP build's), 2 the f16 mma.sync kernel, so an
// H200 run checks every score kernel.
thread_local int g_score_kernel = 0;

}  // namespace

namespace ukv_indexer_topk {

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

}  // namespace ukv_indexer_topk

#if defined(UKV_TEST_HOOKS)
extern "C" void unikv_gpu_test_indexer_score_kernel(int kernel) { g_score_kernel = kernel; }
#endif
