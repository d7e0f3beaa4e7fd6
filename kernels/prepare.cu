// Fused Q/KV preparation (docs/prepare.md §4): RMSNorm + RoPE of every Q head
// and of each token's KV row; the KV row is optionally written out and stored
// into its pool row (quantized for FP8 pools, kernels/pool_rows.cuh).
//
// One launch for both paths: blocks [0, kv_blocks) run one token's KV row per
// warp, the next q_blocks two Q heads of one token per warp, and any after
// them one indexer query head per warp (the fused call with the indexer's
// query preparation). A warp holds a 512-value
// row as two 16-byte vectors per lane (lane l: dims 8l..8l+7, then
// 256+8l..256+8l+7), so every global access is a whole 16-byte vector, the
// norm is a warp-shuffle reduction, and lanes 24..31 hold the RoPE dims
// 448..511 in their second vector and rotate them in registers.
//
// The math is src/rope.rs's (prepare_q_row, prepare_kv_row) operation for
// operation: the sum of squares in double and the norm factor rounded to float
// once (so the factor is almost always the host's bit for bit), then the same
// sequence of correctly rounded float multiplies and adds, never contracted
// into FMAs (ukv_mul_rn / ukv_add_rn), with bf16 rounding at the same points.
//
// Device values are never trusted: a position outside the table skips the
// token (nothing written for it), a row outside the layer skips the store.
#include "indexer_query.cuh"
#include "pool_rows.cuh"
#include "row_math.cuh"
#include "shim.cuh"

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * UKV_WARP;
// 8 blocks per SM (at most 64 registers, no spills): 32 warps with 2 KB of
// Q rows each in flight keep HBM busy, and a warp holds both rows' norm
// reductions in flight at once (prepare_q; at 48 registers they spill).
// NVIDIA tuning: HIP builds ignore it.
[[maybe_unused]] constexpr int kMinBlocks = 8;
constexpr int kDims = 512;
constexpr int kQHeads = 2;    // Q heads per warp
constexpr int kRopeLane = 24;  // lanes 24..31: dims 448 + 8 (lane - 24) in the second vector

// A lane's 16 values stay packed as bf16 pairs (word i: dims 2i, 2i+1 of the
// lane's values; words 0..3 the first vector, 4..7 the second), unpacked one
// pair at a time: the registers that hold a warp's loads in flight are the
// kernel's memory parallelism. In a rope lane the second vector's word j is
// exactly pair j of the lane's 4 RoPE pairs.
typedef uint32_t LaneRow[8];

__device__ __forceinline__ float low_of(uint32_t w) { return ukv_fp8_bits_float(w << 16); }
__device__ __forceinline__ float high_of(uint32_t w) { return ukv_fp8_bits_float(w & 0xFFFF0000u); }

__device__ __forceinline__ void load_row(const ukv_bf16* row, int lane, LaneRow& x) {
  const uint4* p = reinterpret_cast<const uint4*>(row);
  const uint4 lo = p[lane], hi = p[UKV_WARP + lane];
  x[0] = lo.x, x[1] = lo.y, x[2] = lo.z, x[3] = lo.w;
  x[4] = hi.x, x[5] = hi.y, x[6] = hi.z, x[7] = hi.w;
}

__device__ __forceinline__ void store_row(ukv_bf16* row, int lane, const LaneRow& x) {
  uint4* p = reinterpret_cast<uint4*>(row);
  p[lane] = make_uint4(x[0], x[1], x[2], x[3]);
  p[UKV_WARP + lane] = make_uint4(x[4], x[5], x[6], x[7]);
}

// rsqrt(mean(x^2) + eps) over the warp's row, as src/rope.rs rms_norm: the
// squares of bf16 values are exact in double, so the sum usually is too,
// whatever the order.
__device__ __forceinline__ float norm_factor(const LaneRow& x, float eps) {
  double sum = 0.0;
  for (int i = 0; i < 8; ++i) {
    const double lo = low_of(x[i]), hi = high_of(x[i]);
    sum += lo * lo;
    sum += hi * hi;
  }
  sum = ukv_xor_sum<16, 1>(sum);
  return ukv_rms_factor(sum, kDims, eps);
}

// A rope lane's 4 (cos, sin) pairs: table floats 8 (lane - 24) + 0..7.
struct RopePairs {
  float4 a, b;
  __device__ __forceinline__ float cos_of(int j) const { return j == 0 ? a.x : j == 1 ? a.z : j == 2 ? b.x : b.z; }
  __device__ __forceinline__ float sin_of(int j) const { return j == 0 ? a.y : j == 1 ? a.w : j == 2 ? b.y : b.w; }
};

__device__ __forceinline__ RopePairs load_pairs(const float* table_row, int lane) {
  const float4* cs = reinterpret_cast<const float4*>(table_row) + 2 * (lane - kRopeLane);
  return RopePairs{cs[0], cs[1]};
}

// Q heads h0, h0 + 1 (the second if < H) of token t, `item` = t * ceil(H/2)
// + h0/2: both rows are loaded before either is used, doubling the warp's
// bytes in flight, and they share the token's position and table row. Per
// head: n = bf16(x * f) on all dims, then bf16(RoPE(n)) on 448..511.
template <typename Pos>
__device__ __forceinline__ void prepare_q(const ukv_prepare_qkv_params& p, int item, int lane) {
  const int groups = (p.num_heads + kQHeads - 1) / kQHeads;
  const int t = item / groups, h0 = (item % groups) * kQHeads;
  const int heads = min(kQHeads, p.num_heads - h0);
  const int64_t pos = ukv_index_at<Pos>(p.positions, t);
  LaneRow x[kQHeads] = {};
  const ukv_bf16* in = static_cast<const ukv_bf16*>(p.q_in) + t * p.q_in_stride_token + h0 * p.q_in_stride_head;
  for (int j = 0; j < kQHeads; ++j) {
    if (j < heads) load_row(in + j * p.q_in_stride_head, lane, x[j]);
  }
  if (pos < 0 || pos >= p.max_pos) return;  // uniform: one token per warp
  const bool rope = lane >= kRopeLane;
  RopePairs cs{};
  if (rope) cs = load_pairs(p.rope_table + pos * p.table_stride, lane);
  ukv_bf16* out = static_cast<ukv_bf16*>(p.q_out) + t * p.q_out_stride_token + h0 * p.q_out_stride_head;
  // Both factors before either row is used: each is a long dependent chain
  // (conversions to double, adds, shuffles, the refined rsqrt), and computed
  // one after the other they doubled a warp's latency (an absent second head
  // normalizes zeros, never stored). bench/notes/v26.md.
  float f[kQHeads];
  for (int j = 0; j < kQHeads; ++j) f[j] = norm_factor(x[j], p.q_eps);
  for (int j = 0; j < kQHeads; ++j) {
    if (j == heads) break;  // uniform
    for (int i = 0; i < 8; ++i) {
      float re = ukv_bf16_round(ukv_mul_rn(low_of(x[j][i]), f[j]));
      float im = ukv_bf16_round(ukv_mul_rn(high_of(x[j][i]), f[j]));
      if (rope && i >= 4) ukv_rope_rotate(re, im, cs.cos_of(i - 4), cs.sin_of(i - 4));
      x[j][i] = ukv_pack_bf16x2(re, im);
    }
    store_row(out + j * p.q_out_stride_head, lane, x[j]);
  }
}

// KV row t: k = (x * f) * w in float, RoPE of 448..511 from those values, one
// bf16 rounding; then kv_out and the pool row.
template <typename Pos>
__device__ __forceinline__ void prepare_kv(const ukv_prepare_qkv_params& p, int t, int lane) {
  const int64_t pos = ukv_index_at<Pos>(p.positions, t);
  const int64_t row = p.rows != nullptr ? ukv_index_at(p.rows, p.rows_i64 != 0, t) : -1;
  LaneRow x, w;
  load_row(static_cast<const ukv_bf16*>(p.kv_in) + t * p.kv_in_stride, lane, x);
  load_row(static_cast<const ukv_bf16*>(p.kv_weight), lane, w);
  if (pos < 0 || pos >= p.max_pos) return;  // uniform: one token per warp
  const bool rope = lane >= kRopeLane;
  RopePairs cs{};
  if (rope) cs = load_pairs(p.rope_table + pos * p.table_stride, lane);
  const float f = norm_factor(x, p.kv_eps);
  for (int i = 0; i < 8; ++i) {
    float re = ukv_mul_rn(ukv_mul_rn(low_of(x[i]), f), low_of(w[i]));
    float im = ukv_mul_rn(ukv_mul_rn(high_of(x[i]), f), high_of(w[i]));
    if (rope && i >= 4) ukv_rope_rotate(re, im, cs.cos_of(i - 4), cs.sin_of(i - 4));
    x[i] = ukv_pack_bf16x2(re, im);
  }
  if (p.kv_out != nullptr) store_row(static_cast<ukv_bf16*>(p.kv_out) + t * p.kv_out_stride, lane, x);
  if (row < 0 || row >= p.pool_rows) return;  // uniform, as the FP8 tile reductions need
  const uint32_t lo[4] = {x[0], x[1], x[2], x[3]};
  const uint32_t hi[4] = {x[4], x[5], x[6], x[7]};
  ukv_store_pool_row<8>(p.pool, row, 8 * lane, lo);
  ukv_store_pool_row<8>(p.pool, row, kDims / 2 + 8 * lane, hi);
}

// Pos: the positions' type (ukv_index_at). Blocks past kv_blocks + q_blocks
// prepare the indexer's query heads, one per warp (iq; none when its
// num_tokens is 0): unikv_prepare_qkv_indexer_q, one launch for both calls.
template <typename Pos>
__global__ void UKV_LAUNCH_BOUNDS(kThreads, kMinBlocks)
    prepare_qkv_kernel(ukv_prepare_qkv_params p, int kv_blocks, int q_blocks, ukv_indexer_q_params iq) {
  // The next kernel may launch now; it waits for this grid before reading.
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();  // inputs written by the previous kernel are visible
  const int warp = threadIdx.x / UKV_WARP, lane = threadIdx.x % UKV_WARP;
  if ((int)blockIdx.x < kv_blocks) {
    const int t = blockIdx.x * kWarps + warp;
    if (t < p.num_tokens) prepare_kv<Pos>(p, t, lane);
    return;
  }
  if ((int)blockIdx.x < kv_blocks + q_blocks) {
    const int item = (blockIdx.x - kv_blocks) * kWarps + warp;
    if (item < p.num_tokens * ((p.num_heads + kQHeads - 1) / kQHeads)) prepare_q<Pos>(p, item, lane);
    return;
  }
  const int64_t item = (int64_t)(blockIdx.x - kv_blocks - q_blocks) * kWarps + warp;
  if (item < (int64_t)iq.num_tokens * iq.num_heads) ukv_indexer_query(iq, item, lane);  // whole warps
}

}  // namespace

extern "C" {

int unikv_gpu_prepare_qkv(int device, const ukv_prepare_qkv_params* p, const ukv_indexer_q_params* iq,
                          void* stream) {
  UKV_ENTRY(device, {
    ukv_indexer_q_params none{};
    const ukv_indexer_q_params& indexer = iq != nullptr ? *iq : none;
    // KV blocks first: they carry the most work per warp.
    const int kv_blocks = (int)ukv::cdiv(p->num_tokens, kWarps);
    const int q_blocks = (int)ukv::cdiv(p->num_tokens * ukv::cdiv(p->num_heads, kQHeads), kWarps);
    const int64_t iq_blocks = ukv::cdiv((int64_t)indexer.num_tokens * indexer.num_heads, kWarps);
    if (kv_blocks + q_blocks + iq_blocks == 0) return UKV_SHIM_OK;
    const auto kernel = p->positions_i64 ? prepare_qkv_kernel<int64_t> : prepare_qkv_kernel<int32_t>;
    return ukv::launch_early(device, kernel, dim3((unsigned)(kv_blocks + q_blocks + iq_blocks)), dim3(kThreads),
                             stream, "prepare_qkv_kernel", *p, kv_blocks, q_blocks, indexer);
  })
}

}  // extern "C"
