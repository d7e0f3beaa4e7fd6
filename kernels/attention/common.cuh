// Sparse decode / prefill attention over gathered latent rows (K = V, MQA).
//
// One CTA = (token, head block of 16*MT heads, key split). Eight warps share
// every gathered row: each 64-key tile is read from global memory once per CTA
// (TileLoads: bulk copies or cp.async, pipelined over stages) and serves all
// heads of the block. attention_kernel (mma.sync):
//   QK:  S[Hb, 64] = Q[Hb, 512] . K[64, 512]^T, warp w computes keys 8w..8w+7
//        (mma.sync m16n8k16, bf16 in, f32 accumulate).
//   softmax (online, log2 domain): warp w owns rows w, w+8, ...; P rounded to
//        bf16 and the denominator summed from the rounded values.
//   PV:  O[Hb, 512] += P[Hb, 64] . V[64, 512], warp w owns dims 64w..64w+63.
// attention_wgmma_kernel does the same for 64-head blocks with warpgroup MMA.
// A token's keys are cut into at most S splits (S fixed by the plan): tiles per
// split = cdiv(tiles_t, S). The cut depends only on the token's own length and
// the plan, never on num_tokens or the other tokens, so a token's output is
// bitwise independent of its batch. A token with one split is written directly
// with the sink folded in; otherwise the splits' (m, l, acc) partials merge in
// split order, inside the token's thread-block cluster (sm_90+) or through the
// plan's workspace and combine_kernel.
//
// Keys come from up to two sources (pool rows, a FlashMLA cache or scaled FP8
// rows, then the prefill chunk's own rows or a second cache); an index
// outside its source (-1 included) is skipped, never read.
// Rows of an FP8 pool (docs/fp8.md §4) are gathered as they are
// stored into their bf16 slot in the tile (the 512-byte nope row at its start,
// the 128-byte rope row at its end) and dequantized there in place
// (dequantize_rows; in the 16/32-head kernels by producer warps), so every
// kernel's MMA code reads bf16 tiles either way. portable.cuh holds
// the kernel for GPUs without NVIDIA's tensor-core or async-copy instructions
// (HIP builds: on MFMA where the device has it).
//
// Layout of kernels/attention/: this header (constants, key resolution, FP8
// pieces, split cut, epilogue, cluster merge), gather.cuh (tile layouts and
// the three gather pipelines), one header per kernel family (mma.cuh,
// wgmma.cuh, swap.cuh with heads_on_n.cuh and raw_fragments.cuh, roles.cuh,
// portable.cuh), combine.cu (split combine and merge), plan.cu (the plan and
// the C entry points) and instances/: one translation unit per kernel
// instantiation, exporting its launcher (launcher.cuh). One nvcc run per
// file keeps each a whole program (see build.rs).
#pragma once

#include <math.h>

#include <type_traits>

#include "fp8.cuh"
#include "shim.cuh"
#include "warp.cuh"

// The tensor-core, async-copy and cluster kernels use NVIDIA-only instructions;
// a HIP build carries the portable kernels only (portable.cuh).
#if !defined(__HIPCC__)
#define UKV_NVIDIA_KERNELS 1
#endif

// The split settings of a launch. Outside the anonymous namespace: the plan
// passes it to the launchers of other translation units (launcher.cuh).
struct SplitConfig {
  int splits;   // S: the plan's split cap, also gridDim.z
  int cluster;  // 1: the S blocks of a (token, head block) form a cluster and merge in it
};

namespace {

constexpr int kThreads = 256;
#if defined(UKV_NVIDIA_KERNELS)
constexpr int kWarps = kThreads / UKV_WARP;
#endif
constexpr int kD = 512;
constexpr int kBK = 64;                 // keys per tile
constexpr int kChunks = kD * 2 / 16;    // 16-byte chunks per row
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kMaxSplits = 64;
// Most blocks in a cluster: 16 is beyond the portable 8; Hopper schedules it
// where a GPC has 16 free SMs.
constexpr int kMaxClusterSplits = 16;
static_assert(kD / 4 >= kMaxSplits, "the combine kernel gives each split one thread");

// Element type T at byte offset `offset` of a kernel's dynamic shared memory:
// what the shared-memory layouts' typed accessors (Smem::scores, ...) return.
template <class T>
__device__ __forceinline__ T* smem_at(char* smem, size_t offset) {
  return reinterpret_cast<T*>(smem + offset);
}

#if defined(UKV_NVIDIA_KERNELS)
// Byte offset of 16-byte chunk `c` of row `r` in a 1024-byte-row tile: XOR
// swizzle so the 8 rows an ldmatrix reads hit distinct banks.
__device__ __forceinline__ uint32_t row_chunk(int r, int c) {
  return (uint32_t)r * 1024u + (uint32_t)((c ^ (r & 7)) << 4);
}
// Same for the 128-byte rows of P.
__device__ __forceinline__ uint32_t p_chunk(int r, int c) {
  return (uint32_t)r * 128u + (uint32_t)((c ^ (r & 7)) << 4);
}
#endif

// The (token, head block) a block runs. Blocks start in linear id order (x
// fastest), so the linear id is read token-major: a token's head blocks start
// together and the later ones read its rows from L2. In the grid's own order
// (token fastest) the 128-head wgmma kernel hit L2 7% of the time and read
// every row twice from DRAM (bench/notes/v42.md 42e). blockIdx.z (the split)
// is not remapped, so a cluster of a token's splits, (1, 1, S), keeps its
// (token, head block); the pair kernel, whose cluster spans the head blocks,
// keeps the grid's order.
struct BlockTask {
  int t, hb;
};
__device__ __forceinline__ BlockTask token_major_block() {
  // One token or one head block: the grid's order is token-major already,
  // and a batch-1 block's chain (token -> its key range -> rows) keeps out
  // the division (bf16 decode at T = 1 was 1-1.7% slower with it, v43.md).
  if (gridDim.x == 1 || gridDim.y == 1) return {(int)blockIdx.x, (int)blockIdx.y};
  const int linear = (int)(blockIdx.x + gridDim.x * blockIdx.y), blocks = (int)gridDim.y;
  return {linear / blocks, linear % blocks};
}

// Resolved key list of one token: source 0 then source 1.
struct TokenKeys {
  const int32_t* idx[2];
  int len[2];
  int total;
};

__device__ __forceinline__ TokenKeys token_keys(const ukv_attention_params& p, int t) {
  TokenKeys k{};
  for (int s = 0; s < 2; ++s) {
    k.idx[s] = nullptr;
    k.len[s] = 0;
    if (s >= p.num_sources) continue;
    const ukv_kv_source& src = p.src[s];
    const int64_t begin = src.indptr[t];
    int64_t end = src.indptr[t + 1];
    if (begin < 0 || end <= begin || begin >= src.capacity) continue;
    if (end > src.capacity) end = src.capacity;
    k.idx[s] = src.indices + begin;
    k.len[s] = (int)(end - begin);
  }
  k.total = k.len[0] + k.len[1];
  return k;
}

// A key index fetched one tile ahead of its use: the global load is issued in
// one iteration and consumed (checked, turned into an address) in the next, so
// its latency overlaps a whole tile of compute instead of stalling the gather.
struct PendingKey {
  int raw;     // the index value as loaded
  int source;  // 0 or 1; -1 when the key position is past the token's keys
};

// Fetches the index of key `j` (counted over source 0 then source 1) of a
// token; past its keys the source is -1.
__device__ __forceinline__ PendingKey fetch_key(const TokenKeys& k, int j) {
  PendingKey key{-1, -1};
  // Selects, not k.len[s]: a runtime index would put TokenKeys in local memory.
  const bool second = j >= k.len[0];
  if (second) j -= k.len[0];
  if (j < (second ? k.len[1] : k.len[0])) {
    key.raw = (second ? k.idx[1] : k.idx[0])[j];
    key.source = second ? 1 : 0;
  }
  return key;
}

// Whether a fetched key names a row of its source (an index outside it, -1
// included, is never read: its row is zero-filled and masked).
__device__ __forceinline__ bool key_valid(const ukv_attention_params& p, PendingKey k) {
  return k.source >= 0 && k.raw >= 0 && k.raw < p.src[k.source].rows;
}

// What a tile row holds (the per-stage `valid` array): nothing (masked), a
// bf16 row, or an FP8 row still to be dequantized: a pool row or a FlashMLA
// token (codes and rope dims where a pool row has them, its scale slot's
// bytes undoubled at byte 448), or a scaled row (512 codes, then its 8 fp32
// scales at byte 512).
enum : int { kRowInvalid = 0, kRowBf16 = 1, kRowFp8 = 2, kRowFlashMla = 3, kRowScaled = 4 };
// An FP8 row in the 640-byte pool's shape (a pool row or a FlashMLA token):
// what the wgmma producers dequantize in place.
__device__ __forceinline__ constexpr bool fp8_in_place(int kind) { return kind == kRowFp8 || kind == kRowFlashMla; }
// The scale byte of code block `block` (0..6) of such a row, from its 16-byte
// scale chunk: a pool row doubles its scale bytes, a FlashMLA token's are
// consecutive. Picked by a byte permute, so the chunk's load need not wait for
// the `valid` load that gives `kind` (a byte load at a kind-dependent address
// costs two shared-memory latencies; bench/notes/v37.md, 37f).
__device__ __forceinline__ uint32_t row_scale(uint4 chunk, int kind, int block) {
  const uint32_t at = (uint32_t)(kind == kRowFlashMla ? block : 2 * block);
  return ukv_byte_perm(at < 8 ? chunk.x : chunk.z, at < 8 ? chunk.y : chunk.w, at & 7u) & 0xFFu;
}

// ukv_kv_source.layout (kernels/params.h).
enum : int { kLayoutPool = 0, kLayoutFlashMla = 1, kLayoutScaled = 2 };

// Key resolution of the foreign layouts (docs/attention.md §6). FlashMLA
// (docs/fp8.md §5): token `id`'s 576-byte value slot (448 codes, then the 64
// bf16 rope dims) and its 8-byte scale slot, 64-bit offsets.
constexpr int kFlashValueBytes = 576;
constexpr int kFlashCodeBytes = 448;
__device__ __forceinline__ const char* flashmla_value(const ukv_kv_source& s, int id) {
  const int64_t page = id >> s.page_shift, slot = id & ((1 << s.page_shift) - 1);
  return static_cast<const char*>(s.kv.data) + page * s.kv_stride + slot * kFlashValueBytes;
}
// The scale slot's offset from the value slot: past the page's remaining
// value slots, then 8 bytes per earlier slot.
__device__ __forceinline__ int flashmla_scale_delta(const ukv_kv_source& s, int id) {
  const int slot = id & ((1 << s.page_shift) - 1);
  return (kFlashValueBytes << s.page_shift) - slot * (kFlashValueBytes - 8);
}
// Scaled FP8 rows (docs/fp8.md §8): row `id`'s 512 codes and 8 fp32 scales.
constexpr int kScaledCodeBytes = 512;
constexpr int kScaledScaleBytes = 32;
__device__ __forceinline__ const char* scaled_codes(const ukv_kv_source& s, int id) {
  return static_cast<const char*>(s.kv.data) + (int64_t)id * s.kv_stride;
}
__device__ __forceinline__ const float* scaled_scales(const ukv_kv_source& s, int id) {
  return s.scales + (int64_t)id * s.scales_stride;
}
// Eight codes of a scaled row with their tile's fp32 scale to their 16-byte
// chunk of bf16 values: bf16(decode(code) * scale), one f32 product rounded
// to nearest even (src/cache_layouts/scaled.rs dequantize_row).
__device__ __forceinline__ void dequantize_scaled_piece(uint2 codes, float scale, ukv_fp8_format fmt, char* dst) {
  const uint64_t all = (uint64_t)codes.y << 32 | codes.x;
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float lo = ukv_mul_rn(ukv_fp8_decode((uint8_t)(all >> (16 * i)), fmt), scale);
    const float hi = ukv_mul_rn(ukv_fp8_decode((uint8_t)(all >> (16 * i + 8)), fmt), scale);
    out[i] = ukv_pack_bf16x2(lo, hi);
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(out[0], out[1], out[2], out[3]);
}

// FP8 rows gathered raw: the 512 nope bytes (448 codes, the scale bytes and
// padding) in chunks 0..31 of the row's slot, the 128 rope bytes (already
// bf16) in chunks 56..63, where the row's bf16 rope dims belong; dequantizing
// the codes writes chunks 0..55.
constexpr int kFp8NopeBytes = 512;
constexpr int kFp8RopeBytes = 128;
constexpr int kFp8RopeChunk = kChunks - kFp8RopeBytes / 16;

// Whether 8 codes with scale byte s may take the integer path of
// dequantize_fast: an e4m3fn code c as the bf16 with bits
// (c & 0x80) << 8 | (c & 0x7F) << 4 has the value fp8(c) * 2^-120 (subnormal
// codes become bf16 subnormals), and one bf16 multiply by 2^(s - 7) gives
// fp8(c) * 2^(s - 127) exactly while that factor is a bf16 (s <= 134) and no
// product is subnormal (s >= 10). NaN codes (0x7F, 0xFF) would come out
// finite, so rows holding one, fnuz rows and other scales take the software
// decoder (same values, several times slower).
__device__ __forceinline__ bool fp8_fast_path(uint2 codes, uint32_t s) {
  // Bit 7 of a byte of `nan`: that code's low 7 bits are all 1.
  const uint32_t nan = ((codes.x & 0x7F7F7F7Fu) + 0x01010101u) | ((codes.y & 0x7F7F7F7Fu) + 0x01010101u);
  return s - 10u <= 124u && (nan & 0x80808080u) == 0u;
}

// Eight e4m3fn codes (one 8-byte piece of a nope row) with a scale byte that
// passed fp8_fast_path to their 16-byte chunk of bf16 values: per code pair
// one byte permute, a shift, a logic op and one bf16x2 multiply, no branch.
__device__ __forceinline__ uint4 dequantize_fast(uint2 codes, uint32_t s) {
  const uint32_t factor = ((s + 120u) << 7) * 0x00010001u;  // bf16 2^(s - 7), both halves
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // Codes 2i, 2i+1 as the high bytes of two 16-bit halves.
    const uint32_t x = ukv_byte_perm(i < 2 ? codes.x : codes.y, 0u, (i % 2) == 0 ? 0x1404u : 0x3424u);
    out[i] = ukv_bf16x2_mul((x & 0x80008000u) | ((x >> 4) & 0x07F007F0u), factor);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// fp8_fast_path for one 16-byte chunk of codes (the NaN test on four words).
__device__ __forceinline__ bool fp8_fast_path16(uint4 c, uint32_t s) {
  const uint32_t nan = ((c.x & 0x7F7F7F7Fu) + 0x01010101u) | ((c.y & 0x7F7F7F7Fu) + 0x01010101u) |
                       ((c.z & 0x7F7F7F7Fu) + 0x01010101u) | ((c.w & 0x7F7F7F7Fu) + 0x01010101u);
  return s - 10u <= 124u && (nan & 0x80808080u) == 0u;
}

// dequantize_fast for sixteen codes (one 16-byte chunk) into two bf16
// chunks, with one operation fewer per code pair: per word of four codes the
// magnitudes (c & 0x7F, shared with fp8_fast_path16's NaN test) and the signs
// moved to bit 3 ((c >> 4) & 0x08), then per pair one byte permute
// interleaves them into halves sign << 11 | magnitude, a shift by 4 makes
// those the bits (c & 0x80) << 8 | (c & 0x7F) << 4, and one bf16x2 multiply
// scales them: 9 operations per 4 codes instead of 10.
__device__ __forceinline__ void dequantize_fast16(uint4 c, uint32_t s, uint4& lo, uint4& hi) {
  const uint32_t factor = ((s + 120u) << 7) * 0x00010001u;  // bf16 2^(s - 7), both halves
  const uint32_t w[4] = {c.x, c.y, c.z, c.w};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t mag = w[i] & 0x7F7F7F7Fu, sign = (w[i] >> 4) & 0x08080808u;
    out[2 * i] = ukv_bf16x2_mul(ukv_byte_perm(mag, sign, 0x5140u) << 4, factor);
    out[2 * i + 1] = ukv_bf16x2_mul(ukv_byte_perm(mag, sign, 0x7362u) << 4, factor);
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

// Any piece: the integer path where it applies, else the software decoder, a
// compact loop (few live registers) rather than an out-of-line call, whose
// register saves would spill in the kernels at 128 registers.
__device__ __forceinline__ void dequantize_piece(uint2 codes, uint32_t s, ukv_fp8_format fmt, char* dst) {
  if (fmt == UKV_FP8_E4M3FN && fp8_fast_path(codes, s)) {
    *reinterpret_cast<uint4*>(dst) = dequantize_fast(codes, s);
    return;
  }
  const float scale = ukv_ue8m0_to_float((uint8_t)s);
  const uint64_t all = (uint64_t)codes.y << 32 | codes.x;
#pragma unroll 1
  for (int i = 0; i < 8; ++i) {
    const float v = ukv_fp8_decode((uint8_t)(all >> (8 * i)), fmt) * scale;
    *reinterpret_cast<ukv_bf16*>(dst + 2 * i) = ukv_float_to_bf16(v);
  }
}

// Decode's inverse-RoPE epilogue (docs/attention.md §4): the table row of
// token t, or nullptr when there is no epilogue or the position lies outside
// the table (that token's rope dims stay unrotated; the CPU backend rejects it).
__device__ __forceinline__ const float* inverse_rope_row(const ukv_attention_params& p, int t) {
  if (p.rope_table == nullptr) return nullptr;
  const int64_t pos = ukv_index_at(p.positions, p.positions_i64 != 0, t);
  return pos >= 0 && pos < p.rope_rows ? p.rope_table + pos * 64 : nullptr;
}

// Rotates output dims (d, d + 1), d even, by the conjugate of their (cos, sin)
// pair when they are rope dims (src/rope.rs inverse_rope_row).
__device__ __forceinline__ void inverse_rope_pair(const float* cs, int d, float& re, float& im) {
  if (cs == nullptr || d < kD - 64) return;
  const float2 c = *reinterpret_cast<const float2*>(cs + (d - (kD - 64)));
  const float r = re, i = im;
  re = r * c.x + i * c.y;
  im = i * c.x - r * c.y;
}

// Four consecutive output values from dim d0 (a multiple of 4), rotated where
// they are rope dims, packed as bf16.
__device__ __forceinline__ uint2 pack_out4(const float* cs, int d0, float a, float b, float c, float d) {
  inverse_rope_pair(cs, d0, a, b);
  inverse_rope_pair(cs, d0 + 2, c, d);
  return make_uint2(ukv_pack_bf16x2(a, b), ukv_pack_bf16x2(c, d));
}

// Head h's sink logit in the log2 domain (-inf without a sink).
__device__ __forceinline__ float sink_log2(const ukv_attention_params& p, int h) {
  return p.sink != nullptr ? p.sink[h] * kLog2e : -INFINITY;
}

// Folds the sink logit z (sink_log2) into (m, l) and returns the scale of acc
// (0 when the output is zero) and the natural-log LSE.
__device__ __forceinline__ float fold_sink(float z, float m, float l, float* lse) {
  const float mf = fmaxf(m, z);
  if (mf == -INFINITY) {
    *lse = -INFINITY;
    return 0.f;
  }
  const float a_kv = exp2f(m - mf);
  const float lf = l * a_kv + exp2f(z - mf);
  *lse = (mf + log2f(lf)) * kLn2;
  return lf > 0.f ? a_kv / lf : 0.f;
}
__device__ __forceinline__ float fold_sink(const ukv_attention_params& p, int h, float m, float l, float* lse) {
  return fold_sink(sink_log2(p, h), m, l, lse);
}

// The end of a split merge (cluster or workspace): four output values of
// (token t, head h) from dim d0, unnormalized with the merged (m, l), get the
// sink (logit z) and 1/l, the inverse-RoPE epilogue where asked (cs:
// inverse_rope_row), and are written as bf16; `with_lse`: this thread also
// writes the head's LSE.
__device__ __forceinline__ void write_merged4(const ukv_attention_params& p, int t, int h, int d0,
                                              const float (&acc)[4], float m, float l, bool with_lse, float z,
                                              const float* cs) {
  float lse;
  const float scale = fold_sink(z, m, l, &lse);
  ukv_bf16* out = static_cast<ukv_bf16*>(p.out) + (int64_t)t * p.out_stride_token + (int64_t)h * p.out_stride_head;
  *reinterpret_cast<uint2*>(out + d0) =
      pack_out4(cs, d0, acc[0] * scale, acc[1] * scale, acc[2] * scale, acc[3] * scale);
  if (p.lse != nullptr && with_lse) p.lse[(int64_t)t * p.lse_stride_token + h] = lse;
}
__device__ __forceinline__ void write_merged4(const ukv_attention_params& p, int t, int h, int d0,
                                              const float (&acc)[4], float m, float l, bool with_lse) {
  write_merged4(p, t, h, d0, acc, m, l, with_lse, sink_log2(p, h), inverse_rope_row(p, t));
}

#if defined(UKV_NVIDIA_KERNELS)
// One output group of a cluster merge over `count` splits, in split order:
// split j's (m, l) from m_of(j), l_of(j), its four values from acc_of(j);
// returns the merged (m, l) and the unnormalized values.
template <class MOf, class LOf, class AccOf>
__device__ __forceinline__ void merge_splits(int count, MOf m_of, LOf l_of, AccOf acc_of, float& m, float& l,
                                             float (&acc)[4]) {
  m = -INFINITY;
  for (int j = 0; j < count; ++j) m = fmaxf(m, m_of(j));
  l = 0.f;
  acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
  for (int j = 0; j < count; ++j) {
    const float mj = m_of(j);
    const float w = mj == -INFINITY ? 0.f : exp2f(mj - m);  // a split of only invalid keys adds nothing
    l += w * l_of(j);
    const float4 a = acc_of(j);
    acc[0] += w * a.x;
    acc[1] += w * a.y;
    acc[2] += w * a.z;
    acc[3] += w * a.w;
  }
}

// A split's partial accumulator, f32 [Hb][512], in its block's shared memory
// for the in-cluster merge; 8-float groups XOR-swizzled by row so the fragment
// stores of 8 rows at once hit distinct banks.
__device__ __forceinline__ int partial_at(int r, int col) { return r * kD + (col ^ ((r & 7) << 3)); }

// Merges the splits of one (token, head block) whose (m, l, acc) sit in the
// shared memory of the cluster's blocks (rank j = split j), in split order,
// exactly as combine_kernel does from the workspace. Block `rank` of `ranks`
// writes a 1/ranks share of the outputs, 4 dims per thread.
template <int kHb>
__device__ __forceinline__ void cluster_merge(const ukv_attention_params& p, int t, int h0, int count, int rank,
                                              int ranks, const float* m_s, const float* l_s, const float* acc_s) {
  constexpr int kItems = kHb * (kD / 4);
  const int per = (kItems + ranks - 1) / ranks;
  const int end = min(kItems, (rank + 1) * per);
  for (int item = rank * per + (int)threadIdx.x; item < end; item += kThreads) {
    const int r = item / (kD / 4), d0 = (item % (kD / 4)) * 4;
    const int h = h0 + r;
    if (h >= p.num_heads) continue;
    float m, l, acc[4];
    merge_splits(
        count, [&](int j) { return ukv_cluster_map(m_s, j)[r]; }, [&](int j) { return ukv_cluster_map(l_s, j)[r]; },
        [&](int j) { return *reinterpret_cast<const float4*>(ukv_cluster_map(acc_s, j) + partial_at(r, d0)); }, m, l,
        acc);
    write_merged4(p, t, h, d0, acc, m, l, d0 == 0);
  }
}

// A split block's end in cluster mode, once its partial (m, l, acc) is in
// shared memory: the cluster's blocks meet, merge (`merges`: this thread takes
// part), and none leaves while another still reads its shared memory.
template <int kHb>
__device__ __forceinline__ void merge_in_cluster(const ukv_attention_params& p, int t, int h0, int count, int rank,
                                                 int ranks, const float* m_s, const float* l_s, const float* acc_s,
                                                 bool merges = true) {
  ukv_cluster_sync();
  if (merges) cluster_merge<kHb>(p, t, h0, count, rank, ranks, m_s, l_s, acc_s);
  ukv_cluster_sync_exit();
}

// The split merge of the heads-on-N kernels (16 or 32 heads a block), pushed
// rather than pulled: pulling each split's partial through remote loads took
// 2.5 us of a 9.3 us batch-1 call at 640 keys (bench/notes/v45.md), while
// remote stores issue without waiting. Each block owns a 1/ranks share of the
// outputs; each split block sends every other block its share of the split's
// partial and its (m, l) by st.async, which complete on the receiving block's
// mbarrier, and each block merges its share in split order (its own split's
// from its own staged partial), as cluster_merge and combine_kernel do (the
// same bits). A block's region (its query and key stages, free once its tiles
// are done) holds, at PushedMerge's offsets: the staged partial, f32
// [kHb][512] (partial_at); per split its share for this block, [per] float4;
// per split its (m[kHb], l[kHb]).
template <int kHb>
struct PushedMerge {
  static constexpr int kItems = kHb * (kD / 4);  // 4-dim output groups
  static constexpr size_t kRecv = (size_t)kHb * kD * 4;
  static constexpr size_t kMl = kRecv + (size_t)(kItems + kMaxClusterSplits - 1) * 16;  // ranks x per <= this
  static constexpr size_t kBytes = kMl + (size_t)kMaxClusterSplits * 2 * kHb * 4;
};

// A split block's end in cluster mode, once its partial is staged at the start
// of `region` and its (m, l) in m_s, l_s: every thread of the block calls it
// (all of them push; `merges`: this thread, of the first kThreads, also
// merges). No block reads another's shared memory, so none waits for the
// others before it exits: its own barrier `bar` (used by nothing else) holds
// it until every push to it has landed.
template <int kHb>
__device__ __forceinline__ void merge_pushed(const ukv_attention_params& p, int t, int h0, int count, int rank,
                                             int ranks, const float* m_s, const float* l_s, char* region,
                                             uint64_t* bar, bool merges) {
  using M = PushedMerge<kHb>;
  static_assert(kHb % 4 == 0, "(m, l) travel in 16-byte pieces");
  constexpr int kMlPieces = 2 * kHb / 4;
  const float* acc_s = reinterpret_cast<const float*>(region);
  float4* recv = reinterpret_cast<float4*>(region + M::kRecv);
  float* recv_ml = reinterpret_cast<float*>(region + M::kMl);
  const int tid = threadIdx.x, threads = blockDim.x;
  const int per = (M::kItems + ranks - 1) / ranks;
  const int begin = rank * per, end = min(M::kItems, begin + per);
  if (tid == 0) {
    const int senders = count - (rank < count ? 1 : 0);
    ukv_mbar_init(bar, 1);
    ukv_mbar_init_fence();
    ukv_mbar_arrive_expect(bar, (uint32_t)(senders * (max(0, end - begin) * 16 + 2 * kHb * 4)));
  }
  __syncthreads();  // the staged partial
  // The blocks meet once: past it every block's tiles are done (the stages
  // they overwrite are no longer read: the last MMA and copy have completed
  // before the arrival) and its barrier initialized (thread 0 arrives after
  // initializing it). Relaxed: the pushes carry their own release
  // (ukv_st_async16).
  ukv_cluster_arrive_relaxed();
  ukv_cluster_wait();
  if (rank < count) {
    // Output group k goes to block k / per (r, advanced as k grows).
    for (int k = tid, r = tid / per; k < M::kItems; k += threads) {
      while (k >= (r + 1) * per) ++r;
      if (r == rank) continue;
      const uint4 v = *reinterpret_cast<const uint4*>(acc_s + partial_at(k / (kD / 4), (k % (kD / 4)) * 4));
      ukv_st_async16(ukv_cluster_smem_addr(recv + rank * per + (k - r * per), r), v, ukv_cluster_smem_addr(bar, r));
    }
    for (int k = tid; k < ranks * kMlPieces; k += threads) {
      const int r = k / kMlPieces, c = k % kMlPieces;
      if (r == rank) continue;
      const float* src = c < kHb / 4 ? m_s + 4 * c : l_s + 4 * (c - kHb / 4);
      const uint4 v = make_uint4(__float_as_uint(src[0]), __float_as_uint(src[1]), __float_as_uint(src[2]),
                                 __float_as_uint(src[3]));
      ukv_st_async16(ukv_cluster_smem_addr(recv_ml + rank * 2 * kHb + 4 * c, r), v, ukv_cluster_smem_addr(bar, r));
    }
  }
  // This thread's first output group: its head's sink logit and the token's
  // inverse-RoPE row, loaded while the pushes travel.
  const int first_h = h0 + (begin + tid) / (kD / 4);
  const bool first_ok = merges && begin + tid < end && first_h < p.num_heads;
  const float first_z = first_ok ? sink_log2(p, first_h) : 0.f;
  const float* cs = merges ? inverse_rope_row(p, t) : nullptr;
  ukv_mbar_wait(bar, 0u);
  if (!merges) return;
  for (int item = begin + tid; item < end; item += kThreads) {
    const int r = item / (kD / 4), d0 = (item % (kD / 4)) * 4;
    const int h = h0 + r;
    if (h >= p.num_heads) continue;
    // Split j's (m, l) and values: received, or this block's own.
    float m, l, acc[4];
    merge_splits(
        count, [&](int j) { return j == rank ? m_s[r] : recv_ml[2 * j * kHb + r]; },
        [&](int j) { return j == rank ? l_s[r] : recv_ml[(2 * j + 1) * kHb + r]; },
        [&](int j) {
          return j == rank ? *reinterpret_cast<const float4*>(acc_s + partial_at(r, d0)) : recv[j * per + (item - begin)];
        },
        m, l, acc);
    write_merged4(p, t, h, d0, acc, m, l, d0 == 0, item == begin + tid ? first_z : sink_log2(p, h), cs);
  }
}
#endif  // UKV_NVIDIA_KERNELS

// The split cut of one token: tiles per split and the number of splits.
struct TokenSplit {
  int tiles, per_split, count;
};
__device__ __forceinline__ TokenSplit token_split(int total_keys, int cap) {
  TokenSplit s;
  s.tiles = (total_keys + kBK - 1) / kBK;
  s.per_split = max(1, (s.tiles + cap - 1) / cap);
  s.count = (s.tiles + s.per_split - 1) / s.per_split;
  return s;
}

// A block's share of its token: the token's keys, their cut into splits,
// whether one split finishes the token alone (written directly, no merge),
// and this split's tiles.
struct SplitWork {
  TokenKeys keys;
  TokenSplit cut;
  bool direct;
  int tile_begin, tile_end;
};

// The start of every attention kernel: lets the next kernel be scheduled and
// waits for the previous one's writes (PDL), then resolves the block's work.
// False: the block has nothing to do. One split (or none: an empty slice) is
// finished by split 0 alone; in cluster mode every block of a split token joins
// the merge, even one past the token's splits (it adds nothing and shares the
// output writes).
__device__ __forceinline__ bool split_work(const ukv_attention_params& p, int t, int split, const SplitConfig& cfg,
                                           SplitWork& w) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  w.keys = token_keys(p, t);
  w.cut = token_split(w.keys.total, cfg.splits);
  w.direct = w.cut.count <= 1;
  if (w.direct ? split != 0 : (split >= w.cut.count && cfg.cluster == 0)) return false;
  w.tile_begin = split * w.cut.per_split;
  w.tile_end = min(w.cut.tiles, w.tile_begin + w.cut.per_split);
  return true;
}

// Workspace record of one (token, head block, split): m[Hb], l[Hb], acc[Hb][512].
__host__ __device__ __forceinline__ size_t partial_floats(int hb) { return (size_t)hb * (2 + kD); }

}  // namespace
