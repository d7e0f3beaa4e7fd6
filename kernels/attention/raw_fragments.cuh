// The heads-on-N kernels' raw FP8 variant: MMA fragments built in registers
// from stored e4m3fn rows (RawPipeline's stages), and its query prologue.
#pragma once

#include "heads_on_n.cuh"

#if defined(UKV_NVIDIA_KERNELS)
namespace {

#if defined(UKV_HAS_WGMMA)
// Raw variant: fragments built from stored e4m3fn rows (raw_variant in plan.cu).

// Slot of the key in M row m of the QK MMA. Within a warp's 16 rows, bit 0
// of m is slot bit 2, bit 1 bit 0, bit 2 bit 3 and bit 3 bit 1: rows 2i and
// 2i + 1, which a quarter warp reads together, sit 4 slots (64 bytes of
// banks) apart, and the 16-head kernel's PV reads the keys of rows
// {g, g + 8 : g in 4h .. 4h + 3} in one 8-row ldmatrix phase, whose slots
// then differ mod 8 (conflict-free: a slot is 80 bytes mod 128).
__device__ __forceinline__ int qk_slot(int m) {
  return (m & ~15) | ((m & 1) << 2) | ((m >> 1) & 1) | ((m & 4) << 1) | ((m >> 2) & 2);
}

// The order of k inside each 64-dim block of QK: thread tq's four fragment
// pairs of k-step kk are four consecutive dims, so one 16-byte read of a key
// gives a block's fragments. Codes (blocks 0..6): thread tq holds dims
// 16 tq .. 16 tq + 15, pair 2 kk + hi of them for k-step kk (hi: fragment
// registers 2, 3). Rope dims (block 7, bf16, two reads): 8 tq .. 8 tq + 7 and
// 32 + 8 tq .. +7, so a quarter warp's reads are conflict-free. Returns the
// MMA's pair index (k / 2 within the block) of physical dim pair pp.
__device__ __forceinline__ int qk_logical_pair(int block, int pp) {
  const bool rope = block == kD / 64 - 1;
  const int tq = rope ? (pp >> 2) & 3 : pp >> 3;
  const int kk = rope ? 2 * (pp >> 4) + ((pp & 3) >> 1) : (pp & 7) >> 1;
  return 8 * kk + 4 * (pp & 1) + tq;
}

// QK fragments of the rope block (bf16 as stored) for this thread's keys in
// slots slot[0] (M row 16q + g) and slot[1] (row + 8). a[kk] is k-step kk's
// fragment: registers 0, 1 the pair hi = 0 of key 0, 1; 2, 3 the pair hi = 1.
template <int kLayout>
__device__ __forceinline__ void raw_qk_rope(const char* tile, const int (&slot)[2], int tq, uint32_t (&a)[4][4]) {
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const char* row = tile + raw_row(slot[e]) + RawTile::rope<kLayout>();
    const uint4 x = *reinterpret_cast<const uint4*>(row + 16 * tq);
    const uint4 y = *reinterpret_cast<const uint4*>(row + 64 + 16 * tq);
    const uint32_t w[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      a[kk][e] = w[2 * kk];
      a[kk][2 + e] = w[2 * kk + 1];
    }
  }
}

// The raw variant's QK code blocks on f16 MMAs: a pair of e4m3fn codes
// converts to f16 exactly in one instruction (NaN stays NaN), the query is
// in f16 (scaled per head, see the kernel), and the key's scale factor
// multiplies the block's partial scores in f32 afterwards (raw_scale_f32):
// no bf16 multiplies, no range limits on the scale byte, no NaN test.
__device__ __forceinline__ float raw_scale_f32(uint32_t s) {
  // 2^(s - 127); byte 0 is the subnormal 2^-127 and byte 255 NaN (UE8M0).
  return __uint_as_float(s == 0u ? 0x00400000u : s == 255u ? 0x7FC00000u : s << 23);
}

// Fragments of code block `block` in f16 (layout as raw_qk_rope) and the two
// keys' factors for it; kLayout: the slots' source layout (RawTile::scale_at).
template <int kLayout>
__device__ __forceinline__ void raw_qk_block_f16(const char* tile, const int (&slot)[2], int block, int tq,
                                                 uint32_t (&a)[4][4], float (&factor)[2]) {
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const char* row = tile + raw_row(slot[e]);
    const uint4 x = *reinterpret_cast<const uint4*>(row + 64 * block + 16 * tq);
    factor[e] = raw_scale_f32(*reinterpret_cast<const uint8_t*>(row + RawTile::scale_at<kLayout>(block)));
    const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      a[kk][e] = ukv_cvt_e4m3x2_to_half2<0>(w[kk]);
      a[kk][2 + e] = ukv_cvt_e4m3x2_to_half2<1>(w[kk]);
    }
  }
}

// QK of the raw variant over scale blocks kFirst .. kFirst + kBlocks - 1: one
// commit group per block into its own accumulators, added to s with the
// keys' scale factors once complete, while the next block's fragments
// (double-buffered) are built. Code blocks run on f16 MMAs
// (raw_qk_block_f16), the rope block on bf16. q_desc is the descriptor of
// the query's first k-step; blocks sit atom_col bytes apart, k-steps 32.
// kOverlap: two sets of block accumulators, so block i + 1's MMAs are issued
// before block i's are awaited and the tensor cores never wait for the
// factor multiply (16 more registers; for a warpgroup that has them).
template <int kLayout, int NH, int kFirst, int kBlocks, bool kOverlap = false>
__device__ __forceinline__ void raw_qk(const char* ks, const int (&slots)[2], int tq, uint64_t q_desc,
                                       uint32_t atom_col, float (&s)[NH / 2]) {
  uint32_t a[2][4][4];
  float factor[2][2];
  const auto build = [&](int i) {
    if (kFirst + i == kD / 64 - 1) {
      raw_qk_rope<kLayout>(ks, slots, tq, a[i & 1]);
      factor[i & 1][0] = factor[i & 1][1] = 1.f;
    } else {
      raw_qk_block_f16<kLayout>(ks, slots, kFirst + i, tq, a[i & 1], factor[i & 1]);
    }
  };
  float part[kOverlap ? 2 : 1][NH / 2];
  const auto issue = [&](int i) {
    const int block = kFirst + i;
    float(&d)[NH / 2] = part[kOverlap ? i & 1 : 0];
    ukv_wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint64_t step = q_desc + (uint64_t)((block * atom_col + j * 32) >> 4);
      if (block == kD / 64 - 1) {
        swap_mma<NH>(d, a[i & 1][j], step, j);
      } else {
        swap_mma<NH, true>(d, a[i & 1][j], step, j);
      }
    }
    ukv_wgmma_commit();
  };
  // Adds block i's completed partial scores times the keys' factors.
  const auto add = [&](int i) {
    float(&d)[NH / 2] = part[kOverlap ? i & 1 : 0];
    ukv_wgmma_fence_regs(d);
#pragma unroll
    for (int r = 0; r < NH / 2; ++r) s[r] = fmaf(d[r], factor[i & 1][(r & 2) ? 1 : 0], s[r]);
  };
  build(0);
#pragma unroll
  for (int i = 0; i < kBlocks; ++i) {
    issue(i);
    if constexpr (kOverlap) {
      // Block i - 1's MMAs (and their fragment registers) are done once at
      // most block i's group is pending.
      if (i > 0) {
        ukv_wgmma_wait<1>();
        add(i - 1);
      }
      if (i + 1 < kBlocks) build(i + 1);
    } else {
      if (i + 1 < kBlocks) build(i + 1);
      ukv_wgmma_wait<0>();
      add(i);
    }
  }
  if constexpr (kOverlap) {
    ukv_wgmma_wait<0>();
    add(kBlocks - 1);
  }
}

// The raw kernels' PV. M tile mb is scale block first + mb (the rope dims for
// block 7: a warpgroup taking whole tiles runs all eight, one splitting a
// tile's dims four) and k position 16 kk + 2 j + e within the tile is the key
// of QK row 16 kk + j + 8 e (j = g of that row's warp kk), so a softmax
// thread's two keys are adjacent in P^T and its P^T words hold both.
// Code blocks run on f16 MMAs: ldmatrix.trans of the codes as 16-bit pairs
// gives a thread the dim pair 2g, 2g + 1 of two keys, one byte permute and
// two conversions (exact) make rows g (dim 2g) and g + 8 (dim 2g + 1), and an
// f16x2 multiply applies each key's factor 2^(s - ref): ref is the running
// maximum of the block's scale bytes over the valid keys the block's
// accumulators have seen (the warpgroup's tiles at 16 heads), so
// the factors stay at most 1 and the accumulators hold the values over
// 2^(ref - 127) (rescaled when ref grows, converted after the last tile).
// A value below 2^-24 of its block's largest scale loses precision (f16
// subnormals), far below the output's bf16 rounding unless one tile mixes
// keys whose scales differ by 2^20 and more.

// Index of the factor word of (block, tq, k-step kk, half hh): the keys at
// k positions 16 kk + 8 hh + 2 tq, + 1.
__device__ __forceinline__ int raw_fac_at(int block, int tq, int kk, int hh) {
  return ((block * 4 + tq) * 4 + kk) * 2 + hh;
}

// 2^d for d <= 0 as an f32 (0 below 2^-126).
__device__ __forceinline__ float raw_pow2(int d) { return __uint_as_float((uint32_t)max(d + 127, 0) << 23); }

// The factor word of a softmax thread's two keys for one code block: the
// f16 pair 2^(s - ref) of their scale bytes s0, s1 (0 for a key without a
// row) under the block's running maximum ref.
__device__ __forceinline__ uint32_t raw_factor_word(uint32_t s0, uint32_t s1, int ref) {
  return ukv_pack_half2(raw_pow2((int)s0 - ref), raw_pow2((int)s1 - ref));
}

// A softmax thread's P^T word of head h for its two keys (PV k positions k,
// k + 1): f16 for the code blocks' MMAs, bf16 for the rope block's.
__device__ __forceinline__ void raw_store_pt(char* pt16, char* ptbf, int h, int k, float p0, float p1) {
  *reinterpret_cast<uint32_t*>(pt16 + pt_at(h, k)) = ukv_pack_half2(p0, p1);
  *reinterpret_cast<uint32_t*>(ptbf + pt_at(h, k)) = ukv_pack_bf16x2(p0, p1);
}

// Code block mb's running scale maximum in the kernel's ref_s words (word
// mb & 3, half mb >> 2); mb must be known at compile time, or ref_s goes to
// the stack.
__device__ __forceinline__ int alt_ref(const uint32_t (&ref)[4], int mb) {
  return (int)(ref[mb & 3] >> (16 * (mb >> 2)) & 0xFFFFu);
}

// Word i of the kernel's ref_s through selects: an index in a register would
// put ref_s on the stack.
__device__ __forceinline__ uint32_t ref_word(const uint32_t (&ref)[4], int i) {
  return i == 0 ? ref[0] : i == 1 ? ref[1] : i == 2 ? ref[2] : ref[3];
}

// The scale maxima and factor words of the split layout, where warpgroup wg's
// PV covers code blocks 4 wg .. 4 wg + 3 and lane tq of each warp reduces
// block blk = 4 wg + tq (none for the rope block, blk 7). First this lane's
// scale bytes of blk for its two keys (0 for a key without a row) and their
// maximum over the warp's 16 keys, stored at smax_w[4 q + tq] (the
// warpgroup's [4 warps][4 blocks]).
template <int kLayout>
__device__ __forceinline__ void raw_block_scales(const char* ks, const bool (&v_key)[2], const int (&slot)[2], int blk,
                                                 int q, int lane, uint32_t* smax_w, uint32_t (&sb)[2]) {
#pragma unroll
  for (int e = 0; e < 2; ++e)
    if (v_key[e] && blk < kD / 64 - 1)
      sb[e] = *reinterpret_cast<const uint8_t*>(ks + raw_row(slot[e]) + RawTile::scale_at<kLayout>(blk));
  uint32_t smax = max(sb[0], sb[1]);
#pragma unroll
  for (int off = 4; off < UKV_WARP; off *= 2) smax = max(smax, (uint32_t)ukv_shfl_xor((int)smax, off, UKV_WARP));
  if ((lane >> 2) == 0) smax_w[4 * q + (lane & 3)] = smax;
}

// Then, past a barrier of the warpgroup: its four running maxima ref (word
// mb: block 4 wg + mb; the old values to ref_old) take in the tile's, and
// this lane writes its factor words of blk (raw_fac_at) for its key pair.
__device__ __forceinline__ void raw_block_factors(const uint32_t* smax_w, int blk, int q, int lane,
                                                  const uint32_t (&sb)[2], uint32_t (&ref)[4],
                                                  uint32_t (&ref_old)[4], uint32_t* fac) {
#pragma unroll
  for (int mb = 0; mb < 4; ++mb) ref_old[mb] = ref[mb];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint4 v = *reinterpret_cast<const uint4*>(smax_w + 4 * w);
    ref[0] = max(ref[0], v.x);
    ref[1] = max(ref[1], v.y);
    ref[2] = max(ref[2], v.z);
    ref[3] = max(ref[3], v.w);
  }
  const int g = lane >> 2, tq = lane & 3;
  if (blk < kD / 64 - 1) fac[raw_fac_at(blk, g & 3, q, g >> 2)] = raw_factor_word(sb[0], sb[1], (int)ref_word(ref, tq));
}

// The QK row (its slot, qk_slot) of the key at k position 8 hh + i of k-step kk.
__device__ __forceinline__ int raw_pv_slot(int kk, int hh, int i) {
  return qk_slot(16 * kk + 4 * hh + (i >> 1) + 8 * (i & 1));
}

// V^T fragments of code block `block` for k-steps 0..3 (warp q: dims 16 q ..
// 16 q + 15 of the block); fac: this thread's 8 factor words of the block.
__device__ __forceinline__ void raw_pv_codes(const char* tile, int block, int q, int lane, const uint32_t* fac,
                                             uint32_t (&a)[4][4]) {
  const uint4 f0 = *reinterpret_cast<const uint4*>(fac), f1 = *reinterpret_cast<const uint4*>(fac + 4);
  const uint32_t f[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
  // Lanes 8 m .. 8 m + 7 address matrix m: k-step 2 pp + m / 2, keys 8 (m & 1) + i.
  const int m = lane >> 3;
#pragma unroll
  for (int pp = 0; pp < 2; ++pp) {
    uint32_t r[4];
    ukv_ldmatrix_x4_trans(r, tile + raw_row(raw_pv_slot(2 * pp + (m >> 1), m & 1, lane & 7)) + 64 * block + 16 * q);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int kk = 2 * pp + (j >> 1), hh = j & 1;
      // r[j]: key 2 tq's codes of dims 2g, 2g + 1, then key 2 tq + 1's.
      const uint32_t x = ukv_byte_perm(r[j], 0u, 0x3120u);
      a[kk][2 * hh] = ukv_f16x2_mul(ukv_cvt_e4m3x2_to_half2<0>(x), f[2 * kk + hh]);
      a[kk][2 * hh + 1] = ukv_f16x2_mul(ukv_cvt_e4m3x2_to_half2<1>(x), f[2 * kk + hh]);
    }
  }
}

// V^T fragments of the rope block (bf16 as stored): row g (+8) of warp q is
// rope dim 16 q + g (+8), matrices (keys 0..7, 8..15) x (dims +0, +8).
template <int kLayout>
__device__ __forceinline__ void raw_pv_rope(const char* tile, int q, int lane, uint32_t (&a)[4][4]) {
  const int m = lane >> 3;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    ukv_ldmatrix_x4_trans(a[kk], tile + raw_row(raw_pv_slot(kk, m >> 1, lane & 7)) + RawTile::rope<kLayout>() + 32 * q +
                                     16 * (m & 1));
}

// One warpgroup's PV, O^T += V^T . P^T over M tiles mb = 0 .. kTiles - 1, tile
// mb being block kFirst + mb (known at compile time: with a run-time block
// ptxas serializes the wgmmas). Code blocks run on f16 MMAs against the f16
// P^T, the rope block on bf16 MMAs against the bf16 one (the descriptors of
// their first k-step); fac holds the factor words (raw_fac_at); kLayout: the
// slots' source layout (RawTile::rope).
template <int kLayout, int NH, int kFirst, int kTiles, int kRows>
__device__ __forceinline__ void raw_pv(const char* tile, int q, int lane, const uint32_t* fac, uint64_t pt16_desc,
                                       uint64_t ptbf_desc, float (&o)[kRows][NH / 2]) {
  static_assert(kTiles <= kRows, "an accumulator block per M tile");
  uint32_t a[2][4][4];
#pragma unroll
  for (int mb = 0; mb < kTiles; ++mb) {
    const int block = kFirst + mb;
    const bool codes = block < kD / 64 - 1;
    if (mb >= 2) ukv_wgmma_wait<1>();
    if (codes) {
      raw_pv_codes(tile, block, q, lane, fac + raw_fac_at(block, lane & 3, 0, 0), a[mb & 1]);
    } else {
      raw_pv_rope<kLayout>(tile, q, lane, a[mb & 1]);
    }
    ukv_wgmma_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (codes) {
        swap_mma<NH, true>(o[mb], a[mb & 1][k], pt16_desc + (uint64_t)(k * 2));
      } else {
        swap_mma<NH>(o[mb], a[mb & 1][k], ptbf_desc + (uint64_t)(k * 2));
      }
    }
    ukv_wgmma_commit();
  }
}
// The raw kernels' query prologue. Their QK code blocks run on f16 MMAs
// (raw_qk_block_f16): head h's query is scaled by 2^e so that its largest
// |q| lies in [2^14, 2^15), where f16 holds each of its bf16 values exactly
// down to 2^-32 of that largest one; qk_h[h] folds 2^-e into the softmax
// scale. Warp w of kLoadWarps owns rows w, w + kLoadWarps, ...: every row is
// loaded once (lane l: chunks l and l + 32), its largest |q| reduced over the
// warp, and the row stored scaled in the raw variant's k order
// (qk_logical_pair): the code blocks in f16, the rope block in bf16.
template <int NH, int kLoadWarps>
__device__ __forceinline__ void raw_load_q(const ukv_attention_params& p, int t, int h0, int warp, int lane,
                                           float qk_scale, char* q_smem, float* qk_h) {
  constexpr uint32_t kAtomCol = NH * 128;
  // Chunk `chunk` (16 bytes) of query row r of the block (zeros past the heads).
  const auto q_chunk = [&](int r, int chunk) {
    const ukv_bf16* qrow = static_cast<const ukv_bf16*>(p.q) + (int64_t)t * p.q_stride_token +
                           (int64_t)(h0 + r < p.num_heads ? h0 + r : 0) * p.q_stride_head;
    return h0 + r < p.num_heads ? *reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(qrow) + chunk * 16)
                                : make_uint4(0, 0, 0, 0);
  };
  const auto bf16_lo = [](uint32_t w) { return __uint_as_float(w << 16); };
  const auto bf16_hi = [](uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); };
  constexpr int kRows = NH / kLoadWarps, kLaneChunks = kChunks / UKV_WARP;
  static_assert(kChunks % UKV_WARP == 0, "whole chunks per lane");
  uint4 v[kRows][kLaneChunks];
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int j = 0; j < kLaneChunks; ++j) v[i][j] = q_chunk(warp + kLoadWarps * i, lane + UKV_WARP * j);
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = warp + kLoadWarps * i;
    float m = 0.f;
#pragma unroll
    for (int j = 0; j < kLaneChunks; ++j) {
      const uint32_t w[4] = {v[i][j].x, v[i][j].y, v[i][j].z, v[i][j].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) m = fmaxf(m, fmaxf(fabsf(bf16_lo(w[e])), fabsf(bf16_hi(w[e]))));
    }
    m = ukv_xor_max<1, 16>(m);
    const int top = (int)((__float_as_uint(m) >> 23) & 0xFFu) - 127;  // m in [2^top, 2^(top + 1))
    const int e2 = m > 0.f && isfinite(m) ? min(127, 14 - top) : 0;
    const float mul = __uint_as_float((uint32_t)(e2 + 127) << 23);
    if (lane == 0) qk_h[r] = ldexpf(qk_scale, -e2);
#pragma unroll
    for (int j = 0; j < kLaneChunks; ++j) {
      const int chunk = lane + UKV_WARP * j, block = chunk / 8;
      uint32_t w[4] = {v[i][j].x, v[i][j].y, v[i][j].z, v[i][j].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float lo = bf16_lo(w[e]) * mul, hi = bf16_hi(w[e]) * mul;
        w[e] = block == kD / 64 - 1 ? ukv_pack_bf16x2(lo, hi) : ukv_pack_half2(lo, hi);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int lp = qk_logical_pair(block, 4 * (chunk % 8) + e);
        const uint32_t at = (uint32_t)block * (uint32_t)kAtomCol + (uint32_t)r * 128u +
                            (uint32_t)(((lp >> 2) ^ (r & 7)) << 4) + (uint32_t)(lp & 3) * 4u;
        *reinterpret_cast<uint32_t*>(q_smem + at) = w[e];
      }
    }
  }
}

#endif  // UKV_HAS_WGMMA

}  // namespace
#endif  // UKV_NVIDIA_KERNELS
