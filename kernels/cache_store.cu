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
#include "fp8.cuh"
#include "shim.cuh"

namespace {

// Threads per block: the FlashMLA store at 256, the indexer store at 128
// (bench/notes/v23.md and v24.md); the scaled store like the FlashMLA one.
constexpr int kFlashThreads = 256;
constexpr int kIndexerThreads = 128;
constexpr int kScaledThreads = 256;
constexpr int kDimsPerLane = 16;

// FlashMLA value slot: 448 codes (lanes 0..27), then 64 bf16 RoPE dims copied
// by lanes 28..31 (32 bytes each); scale slot: 7 UE8M0 bytes and a pad byte.
constexpr int kNopeDims = 448;
constexpr int kNopeLanes = kNopeDims / kDimsPerLane;
constexpr int64_t kValueSlotBytes = 576;
constexpr int64_t kScaleSlotBytes = 8;
constexpr int kTileLanes = 64 / kDimsPerLane;
static_assert(kNopeLanes == 28 && kNopeLanes + 4 == UKV_WARP, "one warp per 512-dim token");

// Indexer: 128 codes per key (8 lanes), then one fp32 scale per key.
constexpr int kKeyDims = 128;
constexpr int kKeyLanes = kKeyDims / kDimsPerLane;
static_assert(UKV_WARP % kKeyLanes == 0, "whole keys per warp");

// A bf16 pair's two values (little-endian: the first in the low half); the
// widening is exact.
__device__ __forceinline__ void unpack_bf16x2(uint32_t w, float& lo, float& hi) {
  lo = ukv_fp8_bits_float(w << 16);
  hi = ukv_fp8_bits_float(w & 0xFFFF0000u);
}

// 16 consecutive bf16 dims held in two 16-byte vectors.
__device__ __forceinline__ void unpack16(const uint4& a, const uint4& b, float (&x)[kDimsPerLane]) {
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) unpack_bf16x2(w[i], x[2 * i], x[2 * i + 1]);
}

// 16 consecutive dims from two 16-byte loads (bf16) or four (f32).
__device__ __forceinline__ void load16(const ukv_bf16* src, float (&x)[kDimsPerLane]) {
  const uint4* v = reinterpret_cast<const uint4*>(src);
  unpack16(v[0], v[1], x);
}
__device__ __forceinline__ void load16(const float* src, float (&x)[kDimsPerLane]) {
  const float4* v = reinterpret_cast<const float4*>(src);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 q = v[i];
    x[4 * i] = q.x;
    x[4 * i + 1] = q.y;
    x[4 * i + 2] = q.z;
    x[4 * i + 3] = q.w;
  }
}

// NaN-ignoring max of |x| over this lane's dims and the `Lanes` lanes of its
// group (fmaxf drops a NaN operand, like Rust's f32::max).
template <int Lanes>
__device__ __forceinline__ float group_amax(const float (&x)[kDimsPerLane]) {
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) m = fmaxf(m, fabsf(x[i]));
  m = ukv_xor_max<1, Lanes / 2>(m);
  return m;
}

// The 16 codes of x * inv, dim order = byte order.
template <ukv_fp8_format F>
__device__ __forceinline__ uint4 encode16(const float (&x)[kDimsPerLane], float inv) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float* q = x + 4 * i;
    if (F == UKV_FP8_E4M3FN) {
      w[i] = (uint32_t)ukv_fp8x2_encode_e4m3fn(q[0] * inv, q[1] * inv) |
             ((uint32_t)ukv_fp8x2_encode_e4m3fn(q[2] * inv, q[3] * inv) << 16);
    } else {
      w[i] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) w[i] |= (uint32_t)ukv_fp8_encode_sw(q[j] * inv, F) << (8 * j);
    }
  }
  uint4 out;
  out.x = w[0];
  out.y = w[1];
  out.z = w[2];
  out.w = w[3];
  return out;
}

// Tokens per warp of store_flashmla_kernel. At one token per warp the kernel
// needed 38 registers per thread, room for 48 warps per SM, so a batch of 8192
// tokens took 1.3 waves; at two it needs 59 (32 warps per SM) and 4096 warps
// fit in one (bench/notes/v18.md).
constexpr int kFlashTokensPerWarp = 2;

// One token (its row as two 16-byte vectors per lane, `loc` already
// checked). Tile k is lanes 4k..4k+3; its scale is the UE8M0 byte of the tile
// amax and codes are encode(x * 2^(127-byte)), which rounds like the CPU's
// x / 2^(byte-127).
template <ukv_fp8_format F>
__device__ __forceinline__ void store_flashmla_token(const ukv_cache_store_params& p, int64_t loc, const uint4& a,
                                                     const uint4& b, int lane) {
  float x[kDimsPerLane];
  unpack16(a, b, x);
  // Lanes 28..31 reduce among themselves too (the RoPE dims); unused.
  const float amax = group_amax<kTileLanes>(x);

  const int64_t page = loc >> p.page_shift, slot = loc & ((1 << p.page_shift) - 1);
  uint8_t* page_base = p.cache + page * p.bytes_per_page;
  uint8_t* value = page_base + slot * kValueSlotBytes;
  if (lane < kNopeLanes) {
    const uint8_t byte = ukv_ue8m0_scale_byte(amax, F);
    *reinterpret_cast<uint4*>(value + lane * kDimsPerLane) = encode16<F>(x, ukv_ue8m0_inverse(byte));
    if (lane % kTileLanes == 0) {
      page_base[(kValueSlotBytes << p.page_shift) + slot * kScaleSlotBytes + lane / kTileLanes] = byte;
    }
  } else {
    // The RoPE dims' bf16 bits as loaded: 32 bytes per lane, 16-byte aligned.
    uint4* dst = reinterpret_cast<uint4*>(value + kNopeDims + (lane - kNopeLanes) * 2 * kDimsPerLane);
    dst[0] = a;
    dst[1] = b;
  }
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
