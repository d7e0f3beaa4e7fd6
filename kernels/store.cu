// Store path: SWA ring scatter and compressed-row scatter into bf16 or FP8
// pools. One 128-thread block per source row, 4 values (8 bytes) per thread.
// Invalid device values (batch id, slot, position, location) skip the row:
// nothing is written out of bounds.
#include "fp8.cuh"
#include "shim.cuh"

namespace {

constexpr int kThreads = 128;      // 512 values / 4 per thread
constexpr int kNopeThreads = 112;  // 448 nope dims; threads 112..127 hold the rope dims

// Writes one 512-value bf16 row to pool row `row`. FP8 rows (spec unified_kv
// 1.5(c)): each 16-thread group quantizes one 64-dim tile exactly as
// src/cache_layouts/unified.rs does; its first lane writes the scale byte
// twice; the rope threads copy the bf16 rope dims and zero the 50 pad bytes.
__device__ __forceinline__ void store_row(const ukv_pool_rows& pool, int64_t row, const ukv_bf16* src) {
  const int i = threadIdx.x;
  const uint2 bits = reinterpret_cast<const uint2*>(src)[i];
  if (!pool.fp8) {
    reinterpret_cast<uint2*>(static_cast<ukv_bf16*>(pool.data) + row * 512)[i] = bits;
    return;
  }
  const float v[4] = {ukv_fp8_bits_float(bits.x << 16), ukv_fp8_bits_float(bits.x & 0xFFFF0000u),
                      ukv_fp8_bits_float(bits.y << 16), ukv_fp8_bits_float(bits.y & 0xFFFF0000u)};
  uint8_t scale;
  // Every lane takes part (the tile reduction shuffles across 16 lanes).
  const uint32_t codes = ukv_fp8_quantize_tile16(v, (ukv_fp8_format)pool.fp8_format, &scale);
  uint8_t* nope = static_cast<uint8_t*>(pool.data) + row * 512;
  if (i < kNopeThreads) {
    reinterpret_cast<uint32_t*>(nope)[i] = codes;
    if (i % 16 == 0) reinterpret_cast<uint16_t*>(nope + 448)[i / 16] = (uint16_t)(scale * 0x0101u);
    return;
  }
  const int j = i - kNopeThreads;
  reinterpret_cast<uint2*>(static_cast<ukv_bf16*>(pool.rope) + row * 64)[j] = bits;
  if (j < 12) reinterpret_cast<uint32_t*>(nope + 464)[j] = 0u;  // bytes 464..511
  if (j == 12) reinterpret_cast<uint16_t*>(nope + 462)[0] = 0u;  // bytes 462..463
}

__global__ void __launch_bounds__(kThreads) store_swa_kernel(ukv_store_swa_params p) {
  const int t = blockIdx.x;
  const int b = p.batch_id[t];
  if (b < 0 || b >= p.num_requests) return;
  const int slot = p.req_slots[b];
  const int pos = p.positions[t];
  if (slot < 0 || slot >= p.num_slots || pos < 0) return;
  // Outside the request's final window: a later token owns this ring row.
  if (p.final_pos != nullptr && (int64_t)pos <= (int64_t)p.final_pos[b] - p.window) return;
  const int64_t row = (int64_t)slot * p.ring + pos % p.ring;
  store_row(p.pool, row, static_cast<const ukv_bf16*>(p.kv) + t * p.kv_stride);
}

__global__ void __launch_bounds__(kThreads) store_compressed_kernel(ukv_store_compressed_params p) {
  const int i = blockIdx.x;
  const int loc = p.loc[i];
  if (loc < 0 || loc >= p.compressed_rows) return;
  store_row(p.pool, p.swa_rows + loc, static_cast<const ukv_bf16*>(p.kv) + i * p.kv_stride);
}

}  // namespace

extern "C" {

int unikv_gpu_store_swa(int device, const ukv_store_swa_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_tokens == 0) return UKV_SHIM_OK;
    store_swa_kernel<<<p->num_tokens, kThreads, 0, (ukv_stream_t)stream>>>(*p);
    return ukv::check_launch("store_swa_kernel");
  })
}

int unikv_gpu_store_compressed(int device, const ukv_store_compressed_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_rows == 0) return UKV_SHIM_OK;
    store_compressed_kernel<<<p->num_rows, kThreads, 0, (ukv_stream_t)stream>>>(*p);
    return ukv::check_launch("store_compressed_kernel");
  })
}

}  // extern "C"
