// Store path: SWA ring scatter and compressed-row scatter into bf16 or FP8
// pools. One 128-thread block per source row, 4 values (8 bytes) per thread.
// Invalid device values (batch id, slot, position, location) skip the row:
// nothing is written out of bounds.
#include "pool_rows.cuh"
#include "shim.cuh"

namespace {

constexpr int kThreads = 128;  // 512 values / 4 per thread

// Writes one 512-value bf16 row to pool row `row` (kernels/pool_rows.cuh):
// thread i moves dims 4i..4i+3 as one 8-byte vector.
__device__ __forceinline__ void store_row(const ukv_pool_rows& pool, int64_t row, const ukv_bf16* src) {
  const int i = threadIdx.x;
  const uint2 v = reinterpret_cast<const uint2*>(src)[i];
  const uint32_t bits[2] = {v.x, v.y};
  ukv_store_pool_row<4>(pool, row, 4 * i, bits);
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
