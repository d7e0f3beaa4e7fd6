// Quantize-and-store into the FlashMLA FP8 KV cache, the indexer key cache
// (docs/fp8.md §2, §5, §6) and scaled FP8 rows (docs/fp8.md §8),
// bit-identical to src/cache_layouts/ (the CPU backend): the codec of fp8.cuh
// and the same fp32 operations.
//
// Each lane owns 16 consecutive dims of a row: it reads them with 16-byte loads,
// the amax of its 64-dim tile (FlashMLA, 4 lanes) or 128-dim key (indexer, 8
// lanes) is a shuffle reduction inside its lane group, and it writes its 16
// codes with one 16-byte store. Two FlashMLA tokens per warp (one at a time),
// four indexer keys per warp; no shared memory. Byte offsets are 64-bit
// (caches pass 4 GiB). A location that is negative or past the cache is
// skipped: nothing is written.
#include "cache_rows.cuh"
#include "shim.cuh"

namespace {

using namespace ukv_cache_rows;

// Threads per block: the FlashMLA store at 256, the indexer store at 128
// (bench/notes/v23.md and v24.md); the scaled store like the FlashMLA one.
constexpr int kFlashThreads = 256;
constexpr int kIndexerThreads = 128;
constexpr int kScaledThreads = 256;
// Tokens per warp of store_flashmla_kernel. At one token per warp the kernel
// needed 38 registers per thread, room for 48 warps per SM, so a batch of 8192
// tokens took 1.3 waves; at two it needs 59 (32 warps per SM) and 4096 warps
// fit in one (bench/notes/v18.md).
constexpr int kFlashTokensPerWarp = 2;

// One token: the shared row store (cache_rows.cuh) at the params' cache.
template <ukv_fp8_format F>
__device__ __forceinline__ void store_flashmla_token(const ukv_cache_store_params& p, int64_t loc, const uint4& a,
                                                     const uint4& b, int lane) {
  ukv_cache_rows::store_flashmla_row<F>(p.cache, p.bytes_per_page, p.page_shift, loc, a, b, lane);
}

// kFlashTokensPerWarp consecutive tokens per warp; Loc: the location type
// (ukv_index_at).
template <ukv_fp8_format F, typename Loc>
__global__ void __launch_bounds__(kFlashThreads) store_flashmla_kernel(ukv_cache_store_params p) {
  // The next kernel may be scheduled now; this one waits for its predecessor's
  // writes (rows, locations) and reads of the cache.
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int lane = threadIdx.x % UKV_WARP;
  const int64_t first = ((int64_t)blockIdx.x * kFlashThreads + threadIdx.x) / UKV_WARP * kFlashTokensPerWarp;
  // Every row and location of the warp is loaded before any is used, so all
  // the loads are in flight at once.
  int64_t loc[kFlashTokensPerWarp];
  uint4 a[kFlashTokensPerWarp], b[kFlashTokensPerWarp];
#pragma unroll
  for (int j = 0; j < kFlashTokensPerWarp; ++j) {
    const int64_t t = first + j;
    loc[j] = -1;
    if (t >= p.num_tokens) continue;
    loc[j] = ukv_index_at<Loc>(p.loc, t);
    const uint4* src =
        reinterpret_cast<const uint4*>(static_cast<const ukv_bf16*>(p.rows) + t * p.row_stride + lane * kDimsPerLane);
    a[j] = src[0];
    b[j] = src[1];
  }
  // Whole warps skip a token (one token per warp at a time): the shuffles see
  // all lanes.
#pragma unroll
  for (int j = 0; j < kFlashTokensPerWarp; ++j)
    if (loc[j] >= 0 && loc[j] < p.token_slots) store_flashmla_token<F>(p, loc[j], a[j], b[j], lane);
}

// Eight lanes per key. scale = max(amax, 1e-4) / max (IEEE division),
// inv = 1 / scale (correctly rounded), codes encode(x * inv), as on the CPU.
template <ukv_fp8_format F, typename In, typename Loc>
__global__ void __launch_bounds__(kIndexerThreads) store_indexer_kernel(ukv_cache_store_params p) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int part = threadIdx.x % kKeyLanes;
  const int64_t t = ((int64_t)blockIdx.x * kIndexerThreads + threadIdx.x) / kKeyLanes;
  // A warp may hold keys past num_tokens or at skipped locations: their lanes
  // still join the shuffles and only skip the loads and stores.
  const bool in_batch = t < p.num_tokens;
  const int64_t loc = in_batch ? ukv_index_at<Loc>(p.loc, t) : -1;
  float x[kDimsPerLane] = {};
  if (in_batch) load16(static_cast<const In*>(p.rows) + t * p.row_stride + part * kDimsPerLane, x);
  const float amax = group_amax<kKeyLanes>(x);
  if (loc < 0 || loc >= p.token_slots) return;

  const float scale = fmaxf(amax, 1e-4f) / ukv_fp8_max(F);
  const float inv = 1.0f / scale;
  const int64_t page = loc >> p.page_shift, slot = loc & ((1 << p.page_shift) - 1);
  uint8_t* page_base = p.cache + page * p.bytes_per_page;
  *reinterpret_cast<uint4*>(page_base + slot * kKeyDims + part * kDimsPerLane) = encode16<F>(x, inv);
  if (part == 0) *reinterpret_cast<float*>(page_base + ((int64_t)kKeyDims << p.page_shift) + slot * 4) = scale;
}

// Scaled FP8 rows: one row per warp, tile k (64 dims, docs/fp8.md §8) on
// lanes 4k..4k+3. scale = max(amax, 1e-4) / divisor (IEEE division),
// inv = 1 / scale (correctly rounded), codes encode(x * inv), as on the CPU
// (fp8::quantize_fp32_scale); the scale itself is stored. A row past the
// batch, or a location that is negative or past the rows, is skipped by
// the whole warp, so the shuffles see all lanes.
template <ukv_fp8_format F, typename Loc>
__global__ void __launch_bounds__(kScaledThreads) store_scaled_kernel(ukv_scaled_store_params p) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int lane = threadIdx.x % UKV_WARP;
  const int64_t t = ((int64_t)blockIdx.x * kScaledThreads + threadIdx.x) / UKV_WARP;
  if (t >= p.num_tokens) return;
  const int64_t loc = ukv_index_at<Loc>(p.loc, t);
  if (loc < 0 || loc >= p.num_rows) return;
  float x[kDimsPerLane];
  load16(static_cast<const ukv_bf16*>(p.rows) + t * p.row_stride + lane * kDimsPerLane, x);
  const float amax = group_amax<kTileLanes>(x);
  const float scale = fmaxf(amax, 1e-4f) / p.divisor;
  const float inv = 1.0f / scale;
  *reinterpret_cast<uint4*>(p.codes + loc * p.codes_stride + lane * kDimsPerLane) = encode16<F>(x, inv);
  if (lane % kTileLanes == 0) p.scales[loc * p.scales_stride + lane / kTileLanes] = scale;
}

using Kernel = void (*)(ukv_cache_store_params);

int launch(int device, Kernel kernel, int threads, int64_t items_per_block, const ukv_cache_store_params& p,
           void* stream, const char* name) {
  const unsigned blocks = (unsigned)ukv::cdiv(p.num_tokens, items_per_block);
  return ukv::launch_early(device, kernel, dim3(blocks), dim3(threads), stream, name, p);
}

template <ukv_fp8_format F>
Kernel flashmla_kernel(const ukv_cache_store_params& p) {
  return p.loc_i64 ? store_flashmla_kernel<F, int64_t> : store_flashmla_kernel<F, int32_t>;
}

template <ukv_fp8_format F, typename In>
Kernel indexer_kernel(const ukv_cache_store_params& p) {
  return p.loc_i64 ? store_indexer_kernel<F, In, int64_t> : store_indexer_kernel<F, In, int32_t>;
}

}  // namespace

extern "C" {

int unikv_gpu_store_flashmla(int device, const ukv_cache_store_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_tokens == 0) return UKV_SHIM_OK;
    const Kernel kernel = p->format == UKV_FP8_E4M3FNUZ ? flashmla_kernel<UKV_FP8_E4M3FNUZ>(*p)
                                                         : flashmla_kernel<UKV_FP8_E4M3FN>(*p);
    return launch(device, kernel, kFlashThreads, kFlashThreads / UKV_WARP * kFlashTokensPerWarp, *p, stream,
                  "store_flashmla_kernel");
  })
}

int unikv_gpu_store_indexer(int device, const ukv_cache_store_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_tokens == 0) return UKV_SHIM_OK;
    const bool fnuz = p->format == UKV_FP8_E4M3FNUZ;
    Kernel kernel;
    if (p->rows_f32) {
      kernel = fnuz ? indexer_kernel<UKV_FP8_E4M3FNUZ, float>(*p) : indexer_kernel<UKV_FP8_E4M3FN, float>(*p);
    } else {
      kernel = fnuz ? indexer_kernel<UKV_FP8_E4M3FNUZ, ukv_bf16>(*p) : indexer_kernel<UKV_FP8_E4M3FN, ukv_bf16>(*p);
    }
    return launch(device, kernel, kIndexerThreads, kIndexerThreads / kKeyLanes, *p, stream, "store_indexer_kernel");
  })
}

int unikv_gpu_store_scaled_fp8(int device, const ukv_scaled_store_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_tokens == 0) return UKV_SHIM_OK;
    using ScaledKernel = void (*)(ukv_scaled_store_params);
    const bool fnuz = p->format == UKV_FP8_E4M3FNUZ;
    ScaledKernel kernel;
    if (p->loc_i64) {
      kernel = fnuz ? store_scaled_kernel<UKV_FP8_E4M3FNUZ, int64_t> : store_scaled_kernel<UKV_FP8_E4M3FN, int64_t>;
    } else {
      kernel = fnuz ? store_scaled_kernel<UKV_FP8_E4M3FNUZ, int32_t> : store_scaled_kernel<UKV_FP8_E4M3FN, int32_t>;
    }
    const unsigned blocks = (unsigned)ukv::cdiv(p->num_tokens, kScaledThreads / UKV_WARP);
    return ukv::launch_early(device, kernel, dim3(blocks), dim3(kScaledThreads), stream, "store_scaled_kernel", *p);
  })
}

}  // extern "C"
