// Lightning indexer query and key preparation (docs/indexer.md §1, §2),
// the operations of src/indexer.rs in the same order: RoPE of dims 64..127
// (keys first get RMSNorm with the compressor's weight), the 128-point
// Walsh-Hadamard transform, FP8 with one fp32 scale.
//
// One warp per 128-dim vector (a query head, or a key), with the per-lane
// steps of indexer_rows.cuh (shared with the compressor's indexer keys):
// query codes, scales and weights are the CPU backend's bit for bit; a key's
// RMSNorm factor is a reduction (row_math.cuh) and may differ by an ulp.
//
// Device values are never trusted: a position outside the table skips the
// vector; a key location that is negative or past the cache skips its store.
#include "indexer_query.cuh"
#include "shim.cuh"

namespace {

using namespace ukv_indexer_rows;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * UKV_WARP;

__global__ void __launch_bounds__(kThreads) indexer_q_kernel(ukv_indexer_q_params p) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int64_t item = ((int64_t)blockIdx.x * kThreads + threadIdx.x) / UKV_WARP;
  if (item >= (int64_t)p.num_tokens * p.num_heads) return;  // whole warps
  ukv_indexer_query(p, item, threadIdx.x % UKV_WARP);
}

template <typename In>
__global__ void __launch_bounds__(kThreads) indexer_k_kernel(ukv_indexer_k_params p) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int lane = threadIdx.x % UKV_WARP;
  const int64_t t = ((int64_t)blockIdx.x * kThreads + threadIdx.x) / UKV_WARP;
  if (t >= p.num_tokens) return;  // whole warps
  const int64_t pos = ukv_index_at(p.positions, p.positions_i64 != 0, t);
  const int64_t loc = ukv_index_at(p.loc, p.loc_i64 != 0, t);
  if (pos < 0 || pos >= p.max_pos || loc < 0 || loc >= p.token_slots) return;
  float x[4], w[4];
  load4(static_cast<const In*>(p.key) + t * p.key_stride, lane, x);
  load4(static_cast<const ukv_bf16*>(p.norm_weight), lane, w);
  store_key4(x, w, p.table + pos * p.table_stride, lane, p.eps, (ukv_fp8_format)p.format, p.cache, p.bytes_per_page,
             p.page_shift, loc);
}

}  // namespace

extern "C" {

int unikv_gpu_indexer_prepare_q(int device, const ukv_indexer_q_params* p, void* stream) {
  UKV_ENTRY(device, {
    const int64_t items = (int64_t)p->num_tokens * p->num_heads;
    if (items == 0) return UKV_SHIM_OK;
    const unsigned blocks = (unsigned)ukv::cdiv(items, kWarps);
    return ukv::launch_early(device, indexer_q_kernel, dim3(blocks), dim3(kThreads), stream, "indexer_q_kernel", *p);
  })
}

int unikv_gpu_indexer_prepare_k(int device, const ukv_indexer_k_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_tokens == 0) return UKV_SHIM_OK;
    const unsigned blocks = (unsigned)ukv::cdiv(p->num_tokens, kWarps);
    return ukv::launch_early(device, p->key_f32 ? indexer_k_kernel<float> : indexer_k_kernel<ukv_bf16>, dim3(blocks),
                             dim3(kThreads), stream, "indexer_k_kernel", *p);
  })
}

}  // extern "C"
