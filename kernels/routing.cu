// hash_topk (docs/routing.md §1): one logical warp per row, lane j < K + S owns
// slot j. Lanes below K look up the row's table entry and weigh it,
// w = sqrt(softplus(logit)), in double like src/routing.rs; a butterfly sum
// over the warp gives the normalizer, and each weight is rounded to f32 once.
// Lanes K..K+S-1 write the shared slots. A padded row, a token id outside the
// table or any entry outside 0..E makes the whole row (-1, 0): device values
// are never trusted to index memory.
#include "shim.cuh"
#include "warp.cuh"

namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kWarpsPerBlock * UKV_WARP;

__global__ void __launch_bounds__(kThreads) hash_topk_kernel(ukv_hash_topk_params p) {
  const int lane = threadIdx.x % UKV_WARP;
  const int64_t n = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / UKV_WARP;
  // The next kernel may launch now; inputs are read only once the previous
  // kernel (the router GEMM) has finished.
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  if (n >= p.num_tokens) return;
  const int slots = p.routed + p.shared;
  const int64_t real = p.num_real != nullptr ? ukv_index_at(p.num_real, p.num_real_i64 != 0, 0) : p.num_real_host;
  bool ok = n < real;
  int64_t expert = -1;
  double w = 0.0;
  if (ok) {
    const int64_t token = ukv_index_at(p.input_ids, p.input_ids_i64 != 0, n);
    ok = token >= 0 && token < p.vocab;
    if (ok && lane < p.routed) {
      expert = p.tid2eid[token * p.table_stride + lane];
      ok = expert >= 0 && expert < p.num_experts;
      if (ok) {
        const double x = p.logits[n * p.logits_stride + expert];
        w = sqrt(fmax(x, 0.0) + log1p(exp(-fabs(x))));
      }
    }
  }
  // Whole-warp steps: every lane of the warp reaches them.
  ok = ukv_warp_all(ok);
  const double sum = ukv_xor_sum<16, 1>(w);
  if (lane >= slots) return;
  float weight = 0.f;
  int32_t id = -1;
  if (ok && lane < p.routed) {
    weight = (float)(w / sum);
    id = (int32_t)expert;
  } else if (ok) {
    weight = (float)(1.0 / (double)p.routed_scaling_factor);
    id = p.num_experts + (lane - p.routed);
  }
  p.weights[n * p.weights_stride + lane] = weight;
  p.ids[n * p.ids_stride + lane] = id;
}

}  // namespace

extern "C" int unikv_gpu_hash_topk(int device, const ukv_hash_topk_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_tokens == 0) return UKV_SHIM_OK;
    const unsigned blocks = (unsigned)ukv::cdiv(p->num_tokens, kWarpsPerBlock);
    return ukv::launch_early(device, hash_topk_kernel, dim3(blocks), dim3(kThreads), stream, "hash_topk_kernel", *p);
  })
}
