// Store path: SWA ring scatter and compressed-row scatter. One 64-thread block
// per source row, 16 bytes per thread. Invalid device values (batch id, slot,
// position, location) skip the row: nothing is written out of bounds.
#include "shim.cuh"

namespace {

constexpr int kRowVectors = 512 * 2 / 16;  // 16-byte vectors per bf16 row

__global__ void store_swa_kernel(ukv_store_swa_params p) {
  const int t = blockIdx.x;
  const int b = p.batch_id[t];
  if (b < 0 || b >= p.num_requests) return;
  const int slot = p.req_slots[b];
  const int pos = p.positions[t];
  if (slot < 0 || slot >= p.num_slots || pos < 0) return;
  // Outside the request's final window: a later token owns this ring row.
  if (p.final_pos != nullptr && (int64_t)pos <= (int64_t)p.final_pos[b] - p.window) return;
  const int64_t row = (int64_t)slot * p.ring + pos % p.ring;
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const ukv_bf16*>(p.kv) + t * p.kv_stride);
  uint4* dst = reinterpret_cast<uint4*>(static_cast<ukv_bf16*>(p.pool) + row * 512);
  dst[threadIdx.x] = src[threadIdx.x];
}

__global__ void store_compressed_kernel(ukv_store_compressed_params p) {
  const int i = blockIdx.x;
  const int loc = p.loc[i];
  if (loc < 0 || loc >= p.compressed_rows) return;
  const int64_t row = p.swa_rows + loc;
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const ukv_bf16*>(p.kv) + i * p.kv_stride);
  uint4* dst = reinterpret_cast<uint4*>(static_cast<ukv_bf16*>(p.pool) + row * 512);
  dst[threadIdx.x] = src[threadIdx.x];
}

}  // namespace

extern "C" {

int unikv_gpu_store_swa(int device, const ukv_store_swa_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_tokens == 0) return UKV_SHIM_OK;
    store_swa_kernel<<<p->num_tokens, kRowVectors, 0, (ukv_stream_t)stream>>>(*p);
    return ukv::check_launch("store_swa_kernel");
  })
}

int unikv_gpu_store_compressed(int device, const ukv_store_compressed_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_rows == 0) return UKV_SHIM_OK;
    store_compressed_kernel<<<p->num_rows, kRowVectors, 0, (ukv_stream_t)stream>>>(*p);
    return ukv::check_launch("store_compressed_kernel");
  })
}

}  // extern "C"
