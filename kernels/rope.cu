// Inverse RoPE of an attention output (docs/attention.md §4): dims 448..511 of
// every (token, head) are rotated in place by the conjugate of the token's
// table row; dims 0..447 are never read or written. Memory-bound: a head moves
// its 128 rope bytes in and out, one 8-byte vector (two pairs) per thread, 16
// threads per head, 16 heads per block; a token's 256-byte table row is read by
// each of its heads and served from cache after the first. A position outside
// the table skips the token: nothing is read from the table or written.
#include "shim.cuh"

namespace {

constexpr int kNope = 448;
constexpr int kLanesPerHead = 64 / 4;  // 4 bf16 per thread
constexpr int kThreads = 256;

// src/rope.rs `rotate` with sin negated (exact), each product and sum rounded
// on its own, so the result is the CPU backend's bit for bit:
// re' = re c + im s, im' = im c - re s.
__device__ __forceinline__ float2 conj_rotate(float re, float im, float c, float s) {
  return make_float2(ukv_add_rn(ukv_mul_rn(re, c), ukv_mul_rn(im, s)),
                     ukv_sub_rn(ukv_mul_rn(im, c), ukv_mul_rn(re, s)));
}

__global__ void __launch_bounds__(kThreads) inverse_rope_kernel(ukv_inverse_rope_params p) {
  const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  const int64_t head = i / kLanesPerHead;  // (token, head) flattened
  const int lane = (int)(i % kLanesPerHead);
  // The next kernel may launch now; this one reads x only once its
  // predecessor (typically the attention that wrote it) has finished.
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  if (head >= p.num_tokens * p.num_heads) return;
  const int64_t t = head / p.num_heads, h = head % p.num_heads;
  const int64_t pos = p.positions_i64 != 0 ? static_cast<const int64_t*>(p.positions)[t]
                                           : (int64_t) static_cast<const int32_t*>(p.positions)[t];
  if (pos < 0 || pos >= p.max_pos) return;
  const float4 cs = *reinterpret_cast<const float4*>(p.table + pos * p.table_stride + lane * 4);
  uint2* x = reinterpret_cast<uint2*>(static_cast<ukv_bf16*>(p.x) + t * p.x_stride_token + h * p.x_stride_head +
                                      kNope + lane * 4);
  const uint2 v = *x;
  const ukv_bf16* e = reinterpret_cast<const ukv_bf16*>(&v);
  const float2 a = conj_rotate(ukv_bf16_to_float(e[0]), ukv_bf16_to_float(e[1]), cs.x, cs.y);
  const float2 b = conj_rotate(ukv_bf16_to_float(e[2]), ukv_bf16_to_float(e[3]), cs.z, cs.w);
  *x = make_uint2(ukv_pack_bf16x2(a.x, a.y), ukv_pack_bf16x2(b.x, b.y));
}

}  // namespace

extern "C" int unikv_gpu_inverse_rope(int device, const ukv_inverse_rope_params* p, void* stream) {
  UKV_ENTRY(device, {
    const int64_t heads = p->num_tokens * p->num_heads;
    if (heads == 0) return UKV_SHIM_OK;
    const int64_t blocks = ukv::cdiv(heads * kLanesPerHead, kThreads);
    if (blocks > INT32_MAX) {
      ukv::set_error("x: num_tokens * num_heads is too large for one launch");
      return UKV_SHIM_INVALID;
    }
    return ukv::launch_early(device, inverse_rope_kernel, dim3((unsigned)blocks), dim3(kThreads), stream,
                             "inverse_rope_kernel", *p);
  })
}
