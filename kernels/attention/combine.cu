// The workspace combine of split launches (combine_kernel, launched by
// plan.cu through launch_attention_combine) and the merge of partial results
// over disjoint key sets (unikv_gpu_merge, ops/merge.rs). Both run on every
// GPU.
#include "attention/common.cuh"
#include "attention/launcher.cuh"

namespace {

// Merges the splits of one (token, head) in split order; 128 threads x 4 dims.
// Every load is issued up front (one (m, l) pair per thread, then the acc rows
// unrolled) so the kernel pays a few memory latencies, not one per split.
__global__ void combine_kernel(ukv_attention_params p, SplitConfig cfg, int block_heads) {
  __shared__ float weight_s[kMaxSplits];
  __shared__ float sum_s[kMaxSplits];
  const int t = blockIdx.x, h = blockIdx.y;
  const int hb = h / block_heads, r = h % block_heads;
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();  // the attention grid's partials are complete and visible
  const size_t rec_floats = partial_floats(block_heads);
  const TokenSplit cut = token_split(token_keys(p, t).total, cfg.splits);
  if (cut.count <= 1) return;  // written directly by the attention kernel
  const int head_blocks = (p.num_heads + block_heads - 1) / block_heads;
  const float* base =
      static_cast<const float*>(p.workspace) + ((size_t)t * head_blocks + hb) * cfg.splits * rec_floats;
  // Thread s < count holds split s's running max and sum; the block max M
  // comes through shared memory, then weight_s[s] = 2^(m_s - M) (0 when the
  // split saw only invalid keys; its acc is zeros).
  const int s_own = threadIdx.x;
  const float m_own = s_own < cut.count ? base[s_own * rec_floats + r] : -INFINITY;
  const float l_own = s_own < cut.count ? base[s_own * rec_floats + block_heads + r] : 0.f;
  if (s_own < kMaxSplits) weight_s[s_own] = m_own;
  __syncthreads();
  float m = -INFINITY;
  for (int s = 0; s < cut.count; ++s) m = fmaxf(m, weight_s[s]);
  __syncthreads();
  if (s_own < cut.count) {
    const float w = (m_own == -INFINITY) ? 0.f : exp2f(m_own - m);
    weight_s[s_own] = w;
    sum_s[s_own] = w * l_own;
  }
  __syncthreads();
  float l = 0.f;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const int d0 = threadIdx.x * 4;
  const float* acc_base = base + 2 * block_heads + (size_t)r * kD + d0;
#pragma unroll 8
  for (int s = 0; s < cut.count; ++s) {
    const float w = weight_s[s];
    l += sum_s[s];
    const float4 a = *reinterpret_cast<const float4*>(acc_base + s * rec_floats);
    acc[0] += w * a.x;
    acc[1] += w * a.y;
    acc[2] += w * a.z;
    acc[3] += w * a.w;
  }
  write_merged4(p, t, h, d0, acc, m, l, threadIdx.x == 0);
}

// Merges P partial results over disjoint key sets (see ops/merge.rs); one
// 128-thread block per (token, head), 4 dims per thread, parts in order.
__global__ void merge_kernel(ukv_merge_params p) {
  const int t = blockIdx.x, h = blockIdx.y;
  const int d0 = threadIdx.x * 4;
  const float* lse_in = p.parts_lse + (int64_t)t * p.in_lse_stride_token + h;
  const float sink = p.sink != nullptr ? p.sink[h] : -INFINITY;
  float m = sink;
  for (int i = 0; i < p.num_parts; ++i) m = fmaxf(m, lse_in[i * p.part_stride_lse]);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  float lse = -INFINITY;
  if (m != -INFINITY) {
    float den = expf(sink - m);
    for (int i = 0; i < p.num_parts; ++i) {
      const float l = lse_in[i * p.part_stride_lse];
      if (l == -INFINITY) continue;  // an empty part: its output is not read
      const float w = expf(l - m);
      den += w;
      const ukv_bf16* row = static_cast<const ukv_bf16*>(p.parts_out) + i * p.part_stride_out +
                            (int64_t)t * p.in_stride_token + (int64_t)h * p.in_stride_head + d0;
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] += w * ukv_bf16_to_float(row[e]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] /= den;
    lse = m + logf(den);
  }
  ukv_bf16* out =
      static_cast<ukv_bf16*>(p.out) + (int64_t)t * p.out_stride_token + (int64_t)h * p.out_stride_head + d0;
  *reinterpret_cast<uint2*>(out) = make_uint2(ukv_pack_bf16x2(acc[0], acc[1]), ukv_pack_bf16x2(acc[2], acc[3]));
  if (p.lse != nullptr && threadIdx.x == 0) p.lse[(int64_t)t * p.lse_stride_token + h] = lse;
}

}  // namespace

ukv_error_t launch_attention_combine(dim3 grid, ukv_stream_t stream, bool early, const ukv_attention_params& p,
                                     SplitConfig cfg, int block_heads) {
  return ukv_launch_dependent(combine_kernel, grid, dim3(kD / 4), 0, stream, early, 1, p, cfg, block_heads);
}

extern "C" {

int unikv_gpu_merge(int device, const ukv_merge_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_tokens == 0) return UKV_SHIM_OK;
    merge_kernel<<<dim3(p->num_tokens, p->num_heads), kD / 4, 0, (ukv_stream_t)stream>>>(*p);
    return ukv::check_launch("merge_kernel");
  })
}

}  // extern "C"
