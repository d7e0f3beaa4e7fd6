// The mma.sync kernel (attention_kernel): blocks of 16 * MT heads, any GPU
// NVIDIA builds target (see common.cuh).
#pragma once

#include "gather.cuh"

#if defined(UKV_NVIDIA_KERNELS)
namespace {

// Shared-memory layout of one CTA for MT m-tiles (Hb = 16 * MT heads).
template <int MT, int ST>
struct Smem {
  static constexpr int kHb = 16 * MT;
  // Key-tile stages. With one stage a 16-head block needs ~88 KB,
  // so two CTAs share an SM and one gathers while the other computes (large
  // batches); with three, one CTA per SM keeps two tiles in flight (small
  // batches, where each CTA has few tiles). Larger blocks use two stages.
  static constexpr int kStages = ST;
  static constexpr int kCtasPerSm = ST == 1 ? 2 : 1;
  static constexpr size_t kTileBytes = PadTile::kTileBytes;
  static constexpr size_t kQ = 0;                                   // bf16 [Hb][512], swizzled
  static constexpr size_t kK = kQ + (size_t)kHb * kD * 2;           // bf16 [stages] PadTile
  static constexpr size_t kS = kK + kStages * kTileBytes;           // f32 [Hb][64]
  static constexpr size_t kP = kS + (size_t)kHb * kBK * 4;          // bf16 [Hb][64], swizzled
  static constexpr size_t kValid = kP + (size_t)kHb * kBK * 2;      // int [stages][64]
  static constexpr size_t kM = kValid + kStages * kBK * 4;          // f32 [Hb] running max
  static constexpr size_t kL = kM + kHb * 4;                        // f32 [Hb] running sum
  static constexpr size_t kAlpha = kL + kHb * 4;                    // f32 [Hb] rescale of this tile
  static constexpr size_t kBar = kAlpha + kHb * 4;                  // u64 [stages] mbarriers
  static constexpr size_t kBytes = kBar + kStages * 8;
  // Typed views of the carve-outs.
  __device__ __forceinline__ static float* scores(char* smem) { return smem_at<float>(smem, kS); }
  __device__ __forceinline__ static int* valid(char* smem) { return smem_at<int>(smem, kValid); }
  __device__ __forceinline__ static float* running_max(char* smem) { return smem_at<float>(smem, kM); }
  __device__ __forceinline__ static float* running_sum(char* smem) { return smem_at<float>(smem, kL); }
  __device__ __forceinline__ static float* alpha(char* smem) { return smem_at<float>(smem, kAlpha); }
  __device__ __forceinline__ static uint64_t* bars(char* smem) { return smem_at<uint64_t>(smem, kBar); }
  // The key stages as f32 once every tile is done (partials, exchanges).
  __device__ __forceinline__ static float* drained(char* smem) { return smem_at<float>(smem, kK); }
};

template <int MT, int ST, bool kFp8>
__global__ void __launch_bounds__(kThreads, Smem<MT, ST>::kCtasPerSm)
    attention_kernel(ukv_attention_params p, SplitConfig cfg) {
  constexpr int kHb = 16 * MT;
  extern __shared__ __align__(1024) char smem[];
  const BlockTask task = token_major_block();
  const int t = task.t, hb = task.hb, split = blockIdx.z;
  const int h0 = hb * kHb;
  const int lane = threadIdx.x % UKV_WARP, warp = threadIdx.x / UKV_WARP;
  const int g = lane >> 2, tq = lane & 3;  // mma fragment row / column-pair
  float* m_s = Smem<MT, ST>::running_max(smem);
  float* l_s = Smem<MT, ST>::running_sum(smem);
  float* alpha_s = Smem<MT, ST>::alpha(smem);
  float* s_s = Smem<MT, ST>::scores(smem);
  int* valid_s = Smem<MT, ST>::valid(smem);

  SplitWork work;
  if (!split_work(p, t, split, cfg, work)) return;
  const TokenKeys& keys = work.keys;
  const TokenSplit& cut = work.cut;
  const bool direct = work.direct;
  const int tile_begin = work.tile_begin, tile_end = work.tile_end;

  for (int r = threadIdx.x; r < kHb; r += kThreads) {
    m_s[r] = -INFINITY;
    l_s[r] = 0.f;
  }
  float acc[MT][8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][n][e] = 0.f;

  constexpr int kStages = Smem<MT, ST>::kStages;
  TileLoads<kStages, PadTile, kFp8> loads{smem + Smem<MT, ST>::kK, valid_s, Smem<MT, ST>::bars(smem), tile_begin,
                                          tile_end};
  loads.init();
  __syncthreads();
  if (tile_begin < tile_end) load_q<RowTile, kHb>(p, t, h0, smem + Smem<MT, ST>::kQ);
  loads.start(p, keys);
  const float qk_scale = p.softmax_scale * kLog2e;

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int stage = loads.advance(p, keys, tile);
    __syncthreads();
    loads.dequantize(p, stage);
    const char* ks = loads.tile(stage);

    // QK. With an even number of m-tiles, warps form 2 head halves x 4 key
    // quarters (16 keys each), halving the Q fragments each warp loads;
    // otherwise every warp takes 8 keys against all heads.
    if constexpr (MT % 2 == 0) {
      constexpr int kMw = MT / 2;
      const int hg = warp / 4, kq = warp % 4;
      // Two accumulator sets (even / odd k-steps) halve the dependent mma chain.
      float s[2][kMw][2][4];
#pragma unroll
      for (int par = 0; par < 2; ++par)
#pragma unroll
        for (int mt = 0; mt < kMw; ++mt)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[par][mt][nt][e] = 0.f;
      const int key_l = kq * 16 + (lane & 7) + ((lane >> 4) << 3);
#pragma unroll 4
      for (int k0 = 0; k0 < kD; k0 += 32) {
#pragma unroll
        for (int par = 0; par < 2; ++par) {
          const int kc = ((k0 + par * 16) >> 3);
          uint32_t b[4];  // b0,b1 of keys 0-7 and of keys 8-15 of this warp
          ukv_ldmatrix_x4(b, ks + PadTile::at(key_l, kc + ((lane >> 3) & 1)));
#pragma unroll
          for (int mt = 0; mt < kMw; ++mt) {
            uint32_t a[4];
            const int qr = (hg * kMw + mt) * 16 + (lane & 15);
            ukv_ldmatrix_x4(a, smem + Smem<MT, ST>::kQ + row_chunk(qr, kc + (lane >> 4)));
            ukv_mma_bf16_16816(s[par][mt][0], a, b[0], b[1]);
            ukv_mma_bf16_16816(s[par][mt][1], a, b[2], b[3]);
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < kMw; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int row = (hg * kMw + mt) * 16 + g;
          const int col = kq * 16 + nt * 8 + tq * 2;
          float* v0 = s[0][mt][nt];
          const float* v1 = s[1][mt][nt];
          *reinterpret_cast<float2*>(s_s + row * kBK + col) = make_float2(v0[0] + v1[0], v0[1] + v1[1]);
          *reinterpret_cast<float2*>(s_s + (row + 8) * kBK + col) = make_float2(v0[2] + v1[2], v0[3] + v1[3]);
        }
    } else {
      // One accumulator set per k-step of the pair: half the dependent chain.
      float s[2][MT][4];
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[half][mt][e] = 0.f;
      const int key_row_l = warp * 8 + (lane & 7);
#pragma unroll 4
      for (int k0 = 0; k0 < kD; k0 += 32) {
        uint32_t b[4];  // b0,b1 of k-step k0 and of k-step k0+16
        ukv_ldmatrix_x4(b, ks + PadTile::at(key_row_l, (k0 >> 3) + (lane >> 3)));
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            uint32_t a[4];
            const int qr = mt * 16 + (lane & 15);
            const int qc = ((k0 + half * 16) >> 3) + (lane >> 4);
            ukv_ldmatrix_x4(a, smem + Smem<MT, ST>::kQ + row_chunk(qr, qc));
            ukv_mma_bf16_16816(s[half][mt], a, b[half * 2], b[half * 2 + 1]);
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int col = warp * 8 + tq * 2;
        const float* v0 = s[0][mt];
        const float* v1 = s[1][mt];
        *reinterpret_cast<float2*>(s_s + (mt * 16 + g) * kBK + col) = make_float2(v0[0] + v1[0], v0[1] + v1[1]);
        *reinterpret_cast<float2*>(s_s + (mt * 16 + g + 8) * kBK + col) = make_float2(v0[2] + v1[2], v0[3] + v1[3]);
      }
    }
    __syncthreads();

    // Online softmax, one row per warp at a time; lanes own keys lane, lane+32.
    {
      const int* valid = valid_s + stage * kBK;
      const bool v0 = valid[lane] != 0, v1 = valid[lane + 32] != 0;
      for (int r = warp; r < kHb; r += kWarps) {
        const float x0 = s_s[r * kBK + lane] * qk_scale;
        const float x1 = s_s[r * kBK + lane + 32] * qk_scale;
        float mx = fmaxf(v0 ? x0 : -INFINITY, v1 ? x1 : -INFINITY);
        mx = ukv_xor_max<16, 1>(mx);
        const float m_old = m_s[r];
        const float m_new = fmaxf(m_old, mx);
        const float base = m_new == -INFINITY ? 0.f : m_new;
        const ukv_bf16 p0 = ukv_float_to_bf16(v0 ? exp2f(x0 - base) : 0.f);
        const ukv_bf16 p1 = ukv_float_to_bf16(v1 ? exp2f(x1 - base) : 0.f);
        float sum = ukv_bf16_to_float(p0) + ukv_bf16_to_float(p1);
        sum = ukv_xor_sum<16, 1>(sum);
        char* prow = smem + Smem<MT, ST>::kP;
        reinterpret_cast<ukv_bf16*>(prow + p_chunk(r, lane >> 3))[lane & 7] = p0;
        reinterpret_cast<ukv_bf16*>(prow + p_chunk(r, (lane + 32) >> 3))[lane & 7] = p1;
        ukv_syncwarp();  // every lane has read m_s[r] / l_s[r] before lane 0 updates them
        if (lane == 0) {
          const float alpha = exp2f(m_old - base);
          alpha_s[r] = alpha;
          l_s[r] = l_s[r] * alpha + sum;
          m_s[r] = m_new;
        }
      }
    }
    __syncthreads();

    // PV: rescale, then this warp's 64 output dims.
    {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const float a_lo = alpha_s[mt * 16 + g], a_hi = alpha_s[mt * 16 + g + 8];
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          acc[mt][n][0] *= a_lo;
          acc[mt][n][1] *= a_lo;
          acc[mt][n][2] *= a_hi;
          acc[mt][n][3] *= a_hi;
        }
      }
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 16) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          ukv_ldmatrix_x4(a[mt], smem + Smem<MT, ST>::kP + p_chunk(mt * 16 + (lane & 15), (kk >> 3) + (lane >> 4)));
        }
#pragma unroll
        for (int n = 0; n < 8; n += 2) {
          uint32_t b[4];  // b0,b1 of dims n*8.. and of dims (n+1)*8..
          const int vkey = kk + (lane & 7) + ((lane >> 3) & 1) * 8;
          const int vchunk = (warp * 64 + n * 8) / 8 + (lane >> 4);
          ukv_ldmatrix_x4_trans(b, ks + PadTile::at(vkey, vchunk));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            ukv_mma_bf16_16816(acc[mt][n], a[mt], b[0], b[1]);
            ukv_mma_bf16_16816(acc[mt][n + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();
  }
  __syncthreads();  // m_s / l_s written before the loop, read below

  // Epilogue. Rows g and g+8 of every m-tile; columns warp*64 + n*8 + 2tq.
  if (!direct && cfg.cluster != 0) {
    // The key stages are free now; they hold this split's acc for the merge.
    static_assert(kHb * kD * 4 <= kStages * Smem<MT, ST>::kTileBytes, "the partial fits in the key stages");
    ukv_cp_async_wait<0>();
    float* acc_s = Smem<MT, ST>::drained(smem);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 16 + g + half * 8;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          const int col = warp * 64 + n * 8 + tq * 2;
          *reinterpret_cast<float2*>(acc_s + partial_at(r, col)) = make_float2(acc[mt][n][half * 2], acc[mt][n][half * 2 + 1]);
        }
      }
    merge_in_cluster<kHb>(p, t, h0, cut.count, split, cfg.splits, m_s, l_s, acc_s);
  } else if (direct) {
    const float* cs = inverse_rope_row(p, t);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 16 + g + half * 8;
        const int h = h0 + r;
        if (h >= p.num_heads) continue;
        float lse;
        const float scale = fold_sink(p, h, m_s[r], l_s[r], &lse);
        ukv_bf16* out = static_cast<ukv_bf16*>(p.out) + (int64_t)t * p.out_stride_token + (int64_t)h * p.out_stride_head;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          const int col = warp * 64 + n * 8 + tq * 2;
          float lo = acc[mt][n][half * 2] * scale, hi = acc[mt][n][half * 2 + 1] * scale;
          inverse_rope_pair(cs, col, lo, hi);
          *reinterpret_cast<uint32_t*>(out + col) = ukv_pack_bf16x2(lo, hi);
        }
        if (p.lse != nullptr && warp == 0 && tq == 0) p.lse[(int64_t)t * p.lse_stride_token + h] = lse;
      }
    }
  } else {
    float* rec = static_cast<float*>(p.workspace) +
                 (((size_t)t * gridDim.y + hb) * cfg.splits + split) * partial_floats(kHb);
    for (int r = threadIdx.x; r < kHb; r += kThreads) {
      rec[r] = m_s[r];
      rec[kHb + r] = l_s[r];
    }
    {
      float* acc_out = rec + 2 * kHb;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = mt * 16 + g + half * 8;
#pragma unroll
          for (int n = 0; n < 8; ++n) {
            const int col = warp * 64 + n * 8 + tq * 2;
            *reinterpret_cast<float2*>(acc_out + (size_t)r * kD + col) =
                make_float2(acc[mt][n][half * 2], acc[mt][n][half * 2 + 1]);
          }
        }
    }
  }
}

}  // namespace
#endif  // UKV_NVIDIA_KERNELS
