// The portable attention kernels: no asynchronous copies, no clusters, at
// most 61 KB of shared memory (CDNA's 64 KB LDS rules out the other kernels'
// tiles). Two variants of one kernel:
//   scalar (kMatrix = false): no tensor cores at all; the path of GPUs without
//     matrix instructions.
//   matrix (kMatrix = true): QK and PV on 16x16x16 matrix products
//     (matrix_core.cuh): MFMA on CDNA gfx90a/gfx94x/gfx950, the software model
//     of it elsewhere.
// A HIP build runs the matrix variant where the device has MFMA and the scalar
// one otherwise; on NVIDIA a test hook (unikv_gpu_test_plan_portable) runs
// either, so both are checked against the CPU backend on the H200. It shares
// common.cuh's key resolution, split cut, sink fold, inverse-RoPE epilogue and
// workspace layout (merged by combine_kernel).
//
// One block = (token, 16-head block, key split), 256 threads; the split's keys
// in chunks of 32:
//   gather: 8 threads per key copy (bf16) or dequantize (FP8, dequantize_piece)
//     its row into K[32][512] bf16; an invalid key gives a zero row.
//   QK, scalar: thread (warp w, lane k) computes heads w and w + 8 against key
//     k in fp32, walking the 256 dim pairs from pair k on (rotated, so the 32
//     lanes read 32 different banks of their 32 rows).
//   QK, matrix: 64-thread group w computes S[16 heads][keys 16 (w % 2) ..]
//     over dims 256 (w / 2) .. + 255 (16 products); the two dim halves add up
//     in the softmax.
//   softmax: warp w owns heads w and w + 8, lane = key (log2 domain, P rounded
//     to bf16 and the denominator summed from the rounded values, as the MMA
//     kernels do).
//   PV, scalar: thread t accumulates heads 4 (t / 64) .. + 3 over dims
//     8 (t % 64) .. + 7.
//   PV, matrix: group w accumulates O[16 heads][dims 128 w .. + 127] as eight
//     16x16 tiles (two products each), and hands its tiles to the scalar
//     layout through shared memory before the shared epilogue.
// Matrix-variant rows are padded by 16 bytes: its fragment loads read 16 rows
// at one column, which would otherwise all hit one bank.

#pragma once

#include "common.cuh"
#include "matrix_core.cuh"

namespace {

constexpr int kPortableHeads = 16;
constexpr int kPortableKeys = 32;
constexpr int kPortableThreads = 256;
constexpr int kPortableGroups = kPortableThreads / 64;  // 64-thread groups of the matrix variant

template <bool kMatrix>
struct PortableSmem {
  static constexpr size_t kRow = (size_t)kD * 2 + (kMatrix ? 16 : 0);                 // bytes per Q/K row
  static constexpr size_t kQ = 0;                                                      // bf16 [16][kRow]
  static constexpr size_t kK = kQ + kPortableHeads * kRow;                             // bf16 [32][kRow]
  static constexpr size_t kP = kK + kPortableKeys * kRow;                              // f32 [16][32]
  static constexpr size_t kM = kP + (size_t)kPortableHeads * kPortableKeys * 4;        // f32 [16] running max
  static constexpr size_t kL = kM + kPortableHeads * 4;                                // f32 [16] running sum
  static constexpr size_t kAlpha = kL + kPortableHeads * 4;                            // f32 [16] this chunk's rescale
  static constexpr size_t kValid = kAlpha + kPortableHeads * 4;                        // int [32]: key valid
  static constexpr size_t kS = kValid + kPortableKeys * 4;                             // f32 [2][16][32] (matrix)
  static constexpr size_t kScratch = kS + (kMatrix ? 2 * kPortableHeads * kPortableKeys * 4 : 0);
  static constexpr size_t kBytes = kScratch + (kMatrix ? kPortableGroups * kMmaScratchBytes : 0);
  // The matrix variant's output tiles, f32 [16][512], reuse K after the loop.
  static_assert(!kMatrix || kPortableKeys * kRow >= (size_t)kPortableHeads * kD * 4, "output tiles fit in K");
  // Typed views of the carve-outs.
  __device__ __forceinline__ static float* probs(char* smem) { return smem_at<float>(smem, kP); }
  __device__ __forceinline__ static float* running_max(char* smem) { return smem_at<float>(smem, kM); }
  __device__ __forceinline__ static float* running_sum(char* smem) { return smem_at<float>(smem, kL); }
  __device__ __forceinline__ static float* alpha(char* smem) { return smem_at<float>(smem, kAlpha); }
  __device__ __forceinline__ static int* valid(char* smem) { return smem_at<int>(smem, kValid); }
  __device__ __forceinline__ static float* scores(char* smem) { return smem_at<float>(smem, kS); }
};

// Row `key` of the chunk: 8 threads (part = 0..7) write 8 of its 64 bf16
// chunks each (chunk part + 8i): copied from a bf16 row, dequantized from an
// FP8 pool row or FlashMLA token (codes piece c for chunk c < 56, the bf16
// rope dims for the rest) or a scaled row (codes piece c for every chunk), or
// zeros for an invalid key.
template <bool kFp8>
__device__ __forceinline__ void portable_gather_row(const ukv_attention_params& p, PendingKey pk, char* row, int part) {
  const bool ok = key_valid(p, pk);
  const ukv_kv_source& src = p.src[ok ? pk.source : 0];
  for (int i = 0; i < kChunks / 8; ++i) {
    const int c = part + 8 * i;
    uint4* dst = reinterpret_cast<uint4*>(row + c * 16);
    if (!ok) {
      *dst = make_uint4(0, 0, 0, 0);
    } else if (kFp8 && src.layout == kLayoutFlashMla) {
      const char* value = flashmla_value(src, pk.raw);
      if (c >= kFp8RopeChunk) {
        *dst = reinterpret_cast<const uint4*>(value + kFlashCodeBytes)[c - kFp8RopeChunk];
      } else {
        const uint2 codes = reinterpret_cast<const uint2*>(value)[c];
        const uint32_t scale = reinterpret_cast<const uint8_t*>(value + flashmla_scale_delta(src, pk.raw))[c / 8];
        dequantize_piece(codes, scale, (ukv_fp8_format)src.kv.fp8_format, reinterpret_cast<char*>(dst));
      }
    } else if (kFp8 && src.layout == kLayoutScaled) {
      const uint2 codes = reinterpret_cast<const uint2*>(scaled_codes(src, pk.raw))[c];
      dequantize_scaled_piece(codes, scaled_scales(src, pk.raw)[c / 8], (ukv_fp8_format)src.kv.fp8_format,
                              reinterpret_cast<char*>(dst));
    } else if (kFp8 && src.kv.fp8) {
      if (c >= kFp8RopeChunk) {
        *dst = reinterpret_cast<const uint4*>(static_cast<const char*>(src.kv.rope) +
                                              (int64_t)pk.raw * kFp8RopeBytes)[c - kFp8RopeChunk];
      } else {
        const char* nope = static_cast<const char*>(src.kv.data) + (int64_t)pk.raw * kFp8NopeBytes;
        const uint2 codes = reinterpret_cast<const uint2*>(nope)[c];
        const uint32_t scale = reinterpret_cast<const uint8_t*>(nope)[448 + 2 * (c / 8)];
        dequantize_piece(codes, scale, (ukv_fp8_format)src.kv.fp8_format, reinterpret_cast<char*>(dst));
      }
    } else {
      *dst = reinterpret_cast<const uint4*>(static_cast<const ukv_bf16*>(src.kv.data) +
                                            (int64_t)pk.raw * src.kv_stride)[c];
    }
  }
}

// The matrix variant's QK: group w's S tile (keys 16 (w % 2) .., dims
// 256 (w / 2) ..) into s_s[w / 2].
__device__ __forceinline__ void portable_matrix_qk(const char* q_s, const char* k_s, float* s_s, char* scratch,
                                                   int tid) {
  using L = PortableSmem<true>;
  const int group = tid / 64, lane = tid % 64, g = lane / 16, r = lane % 16;
  const int key_tile = group % 2, half = group / 2;
  const size_t col = ((size_t)half * (kD / 2) + 4 * g) * 2;
  const char* qa = q_s + r * L::kRow + col;
  const char* kb = k_s + (16 * key_tile + r) * L::kRow + col;
  UkvMmaAcc s{{0.f, 0.f, 0.f, 0.f}};
  for (int step = 0; step < kD / 2 / 16; ++step)
    ukv_mma16x16x16(s, *reinterpret_cast<const uint2*>(qa + step * 32), *reinterpret_cast<const uint2*>(kb + step * 32),
                    scratch);
#pragma unroll
  for (int i = 0; i < 4; ++i) s_s[(half * kPortableHeads + 4 * g + i) * kPortableKeys + 16 * key_tile + r] = s.v[i];
}

// The matrix variant's PV: group w's eight O tiles (dims 128 w + 16 n ..)
// += P . V over the chunk's 32 keys.
__device__ __forceinline__ void portable_matrix_pv(UkvMmaAcc (&o)[8], const float* p_s, const char* k_s,
                                                   char* scratch, int tid) {
  using L = PortableSmem<true>;
  const int group = tid / 64, lane = tid % 64, g = lane / 16, r = lane % 16;
#pragma unroll
  for (int half = 0; half < kPortableKeys / 16; ++half) {
    // P was rounded to bf16 when it was written: its high 16 bits are exact.
    const float* prow = p_s + r * kPortableKeys + 16 * half + 4 * g;
    const uint2 a = make_uint2((__float_as_uint(prow[0]) >> 16) | (__float_as_uint(prow[1]) & 0xFFFF0000u),
                               (__float_as_uint(prow[2]) >> 16) | (__float_as_uint(prow[3]) & 0xFFFF0000u));
    const char* vcol = k_s + (16 * half + 4 * g) * L::kRow + (size_t)(128 * group + r) * 2;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const char* v = vcol + n * 32;
      const uint32_t v0 = *reinterpret_cast<const uint16_t*>(v), v1 = *reinterpret_cast<const uint16_t*>(v + L::kRow);
      const uint32_t v2 = *reinterpret_cast<const uint16_t*>(v + 2 * L::kRow);
      const uint32_t v3 = *reinterpret_cast<const uint16_t*>(v + 3 * L::kRow);
      ukv_mma16x16x16(o[n], a, make_uint2(v0 | v1 << 16, v2 | v3 << 16), scratch);
    }
  }
}

template <bool kFp8, bool kMatrix>
__global__ void UKV_LAUNCH_BOUNDS(kPortableThreads, 1)
    attention_portable_kernel(ukv_attention_params p, SplitConfig cfg) {
  using L = PortableSmem<kMatrix>;
  extern __shared__ __align__(1024) char smem[];
  const BlockTask task = token_major_block();
  const int t = task.t, hb = task.hb, split = blockIdx.z;
  const int h0 = hb * kPortableHeads;
  const int tid = threadIdx.x, lane = tid % UKV_WARP, warp = tid / UKV_WARP;
  const char* q_s = smem + L::kQ;
  char* k_s = smem + L::kK;
  float* p_s = L::probs(smem);
  float* m_s = L::running_max(smem);
  float* l_s = L::running_sum(smem);
  float* alpha_s = L::alpha(smem);
  int* valid_s = L::valid(smem);
  float* s_s = L::scores(smem);
  char* scratch = smem + L::kScratch + (size_t)(tid / 64) * kMmaScratchBytes;

  SplitWork work;
  if (!split_work(p, t, split, cfg, work)) return;
  const int key_begin = work.tile_begin * kBK;
  const int key_end = min(work.keys.total, work.tile_end * kBK);

  for (int c = tid; c < kPortableHeads * kChunks; c += kPortableThreads) {
    const int r = c / kChunks, chunk = c % kChunks;
    const bool valid = h0 + r < p.num_heads;
    const ukv_bf16* q = static_cast<const ukv_bf16*>(p.q) + (int64_t)t * p.q_stride_token +
                        (int64_t)(valid ? h0 + r : 0) * p.q_stride_head;
    *reinterpret_cast<uint4*>(smem + L::kQ + r * L::kRow + chunk * 16) =
        valid ? reinterpret_cast<const uint4*>(q)[chunk] : make_uint4(0, 0, 0, 0);
  }
  if (tid < kPortableHeads) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.f;
  }
  const int pv_h0 = 4 * (tid / 64), pv_d0 = 8 * (tid % 64);
  float acc[4][8];
#pragma unroll
  for (int h = 0; h < 4; ++h)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[h][i] = 0.f;
  UkvMmaAcc o[8];
#pragma unroll
  for (int n = 0; n < 8; ++n) o[n] = UkvMmaAcc{{0.f, 0.f, 0.f, 0.f}};
  const float qk_scale = p.softmax_scale * kLog2e;

  for (int key0 = key_begin; key0 < key_end; key0 += kPortableKeys) {
    __syncthreads();  // the previous chunk's K and P are no longer read
    {
      const int key = tid / 8;
      const PendingKey pk = key0 + key < key_end ? fetch_key(work.keys, key0 + key) : PendingKey{-1, -1};
      portable_gather_row<kFp8>(p, pk, k_s + key * L::kRow, tid % 8);
      if (tid % 8 == 0) valid_s[key] = key_valid(p, pk);
    }
    __syncthreads();

    // QK for heads warp and warp + 8 against key `lane`.
    const bool key_ok = valid_s[lane] != 0;
    float sa = 0.f, sb = 0.f;
    if constexpr (kMatrix) {
      portable_matrix_qk(q_s, k_s, s_s, scratch, tid);
      __syncthreads();
      const int tile = kPortableHeads * kPortableKeys;
      sa = s_s[warp * kPortableKeys + lane] + s_s[tile + warp * kPortableKeys + lane];
      sb = s_s[(warp + 8) * kPortableKeys + lane] + s_s[tile + (warp + 8) * kPortableKeys + lane];
    } else {
      const uint32_t* krow = reinterpret_cast<const uint32_t*>(k_s + lane * L::kRow);
      const uint32_t* qa = reinterpret_cast<const uint32_t*>(q_s + warp * L::kRow);
      const uint32_t* qb = reinterpret_cast<const uint32_t*>(q_s + (warp + 8) * L::kRow);
      for (int i = 0; i < kD / 2; ++i) {
        const int pair = (i + lane) % (kD / 2);
        const uint32_t k2 = krow[pair], a2 = qa[pair], b2 = qb[pair];
        const float k_lo = __uint_as_float(k2 << 16), k_hi = __uint_as_float(k2 & 0xFFFF0000u);
        sa += __uint_as_float(a2 << 16) * k_lo + __uint_as_float(a2 & 0xFFFF0000u) * k_hi;
        sb += __uint_as_float(b2 << 16) * k_lo + __uint_as_float(b2 & 0xFFFF0000u) * k_hi;
      }
    }

    // Online softmax of heads warp and warp + 8 over this chunk.
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int h = warp + 8 * j;
      const float x = key_ok ? (j == 0 ? sa : sb) * qk_scale : -INFINITY;
      const float m_old = m_s[h];
      const float m_new = fmaxf(m_old, ukv_xor_max<16, 1>(x));
      const float base = m_new == -INFINITY ? 0.f : m_new;
      const float pr = ukv_bf16_round(key_ok ? exp2f(x - base) : 0.f);
      const float sum = ukv_xor_sum<16, 1>(pr);
      p_s[h * kPortableKeys + lane] = pr;
      ukv_syncwarp();  // every lane read m_s[h] before lane 0 updates it
      if (lane == 0) {
        const float alpha = exp2f(m_old - base);
        alpha_s[h] = alpha;
        l_s[h] = l_s[h] * alpha + sum;
        m_s[h] = m_new;
      }
    }
    __syncthreads();

    // PV: rescale, then add this chunk's P . V.
    if constexpr (kMatrix) {
      const int g = tid % 64 / 16;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float alpha = alpha_s[4 * g + i];
#pragma unroll
        for (int n = 0; n < 8; ++n) o[n].v[i] *= alpha;
      }
      portable_matrix_pv(o, p_s, k_s, scratch, tid);
    } else {
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        const float alpha = alpha_s[pv_h0 + h];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[h][i] *= alpha;
      }
      for (int k = 0; k < kPortableKeys; ++k) {
        const uint4 v4 = *reinterpret_cast<const uint4*>(k_s + k * L::kRow + pv_d0 * 2);
        const uint32_t v2[4] = {v4.x, v4.y, v4.z, v4.w};
        float v[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          v[2 * i] = __uint_as_float(v2[i] << 16);
          v[2 * i + 1] = __uint_as_float(v2[i] & 0xFFFF0000u);
        }
#pragma unroll
        for (int h = 0; h < 4; ++h) {
          const float pk = p_s[(pv_h0 + h) * kPortableKeys + k];
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[h][i] += pk * v[i];
        }
      }
    }
  }
  __syncthreads();
  if constexpr (kMatrix) {
    // The O tiles into the scalar variant's per-thread layout, through K.
    float* o_s = reinterpret_cast<float*>(k_s);
    const int group = tid / 64, g = tid % 64 / 16, r = tid % 16;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) o_s[(4 * g + i) * kD + 128 * group + 16 * n + r] = o[n].v[i];
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 4; ++h)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[h][i] = o_s[(pv_h0 + h) * kD + pv_d0 + i];
  }

  // Direct: the sink, 1/l, the inverse-RoPE epilogue, bf16; one thread per
  // head writes its LSE. Split: the raw (m, l, acc) record for combine_kernel.
  if (work.direct) {
    const float* cs = inverse_rope_row(p, t);
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const int head = h0 + pv_h0 + h;
      if (head >= p.num_heads) continue;
      float lse;
      const float scale = fold_sink(p, head, m_s[pv_h0 + h], l_s[pv_h0 + h], &lse);
      ukv_bf16* out = static_cast<ukv_bf16*>(p.out) + (int64_t)t * p.out_stride_token + (int64_t)head * p.out_stride_head;
#pragma unroll
      for (int i = 0; i < 8; i += 4) {
        *reinterpret_cast<uint2*>(out + pv_d0 + i) = pack_out4(cs, pv_d0 + i, acc[h][i] * scale, acc[h][i + 1] * scale,
                                                               acc[h][i + 2] * scale, acc[h][i + 3] * scale);
      }
      if (p.lse != nullptr && pv_d0 == 0) p.lse[(int64_t)t * p.lse_stride_token + head] = lse;
    }
  } else {
    float* rec = static_cast<float*>(p.workspace) +
                 (((size_t)t * gridDim.y + hb) * cfg.splits + split) * partial_floats(kPortableHeads);
    if (tid < kPortableHeads) {
      rec[tid] = m_s[tid];
      rec[kPortableHeads + tid] = l_s[tid];
    }
#pragma unroll
    for (int h = 0; h < 4; ++h)
#pragma unroll
      for (int i = 0; i < 8; ++i) rec[2 * kPortableHeads + (size_t)(pv_h0 + h) * kD + pv_d0 + i] = acc[h][i];
  }
}

}  // namespace
