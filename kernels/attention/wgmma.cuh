// The 64-head warpgroup-MMA kernel (attention_wgmma_kernel, sm_90a).
#pragma once

#include "gather.cuh"

#if defined(UKV_NVIDIA_KERNELS)
namespace {

// Warpgroup-MMA kernel for 64-head blocks (Hopper, sm_90a). Same CTA work as
// attention_kernel<4, 2>, but QK and PV run as wgmma with every operand read
// from shared memory, so no warp reloads Q fragments per tile (the shared-
// memory traffic that holds the mma.sync kernel near 20% of the MMA peak).
// Warpgroup w (threads 128w..128w+127):
//   QK:  partial S_w[64 heads, 64 keys] over dims 256w..256w+255
//        (16 x m64n64k16); the two partials meet through shared memory and
//        warpgroup w finishes key columns 32w..32w+31.
//   softmax: both warpgroups take the row max over all 64 keys (exchanged),
//        so they share m; each keeps a partial row sum l_w of its columns.
//   PV:  O[64, dims 256w..256w+255] += P[64, 64] . V[64, 256] with P written
//        to shared memory (2 x m64n128k16 per 16 keys, V read MN-major from the
//        same key tile).
// Accumulator fragments follow the m64nN layout: thread (warp q of the
// warpgroup, lane) holds rows 16q + lane/4 and +8, columns 8i + 2(lane%4) + {0,1}.
struct WgSmem {
  static constexpr int kHb = 64;
  static constexpr int kStages = 2;
  static constexpr size_t kTileBytes = (size_t)kBK * kD * 2;
  static constexpr size_t kQ = 0;                                  // AtomTile [64][512] bf16
  static constexpr size_t kK = kQ + (size_t)kHb * kD * 2;          // AtomTile [stages][64][512] bf16
  static constexpr size_t kP = kK + kStages * kTileBytes;          // [64 heads][64 keys] bf16, 128B-swizzled
  static constexpr size_t kX = kP + (size_t)kHb * kBK * 2;         // f32 [16][threads]: S partial exchange
  static constexpr size_t kXm = kX + (size_t)16 * kThreads * 4;    // f32 [2][threads]: row max / sum exchange
  static constexpr size_t kValid = kXm + (size_t)2 * kThreads * 4; // int [stages][64]
  static constexpr size_t kBar = kValid + (size_t)kStages * kBK * 4; // u64 [stages] mbarriers
  static constexpr size_t kBytes = kBar + kStages * 8;
  // Typed views of the carve-outs.
  __device__ __forceinline__ static int* valid(char* smem) { return smem_at<int>(smem, kValid); }
  __device__ __forceinline__ static float* exchange(char* smem) { return smem_at<float>(smem, kX); }
  __device__ __forceinline__ static float* exchange_ml(char* smem) { return smem_at<float>(smem, kXm); }
  __device__ __forceinline__ static uint64_t* bars(char* smem) { return smem_at<uint64_t>(smem, kBar); }
  // The key stages as f32 once every tile is done (partials, exchanges).
  __device__ __forceinline__ static float* drained(char* smem) { return smem_at<float>(smem, kK); }
};

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) attention_wgmma_kernel(ukv_attention_params p, SplitConfig cfg) {
#if defined(UKV_HAS_WGMMA)
  constexpr int kHb = WgSmem::kHb;
  extern __shared__ __align__(1024) char smem[];
  const int t = blockIdx.x, hb = blockIdx.y, split = blockIdx.z;
  const int h0 = hb * kHb;
  const int tid = threadIdx.x, lane = tid % UKV_WARP, wg = tid / 128, wq = (tid / UKV_WARP) % 4;
  const int g = lane >> 2, tq = lane & 3;
  const int row0 = wq * 16 + g;  // this thread's rows: row0 and row0 + 8
  const int partner = tid ^ 128;  // same fragment position in the other warpgroup
  int* valid_s = WgSmem::valid(smem);
  float* xs = WgSmem::exchange(smem);
  float* xm = WgSmem::exchange_ml(smem);
  char* ps = smem + WgSmem::kP;

  SplitWork work;
  if (!split_work(p, t, split, cfg, work)) return;
  const TokenKeys& keys = work.keys;
  const TokenSplit& cut = work.cut;
  const bool direct = work.direct;
  const int tile_begin = work.tile_begin, tile_end = work.tile_end;

  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};  // this thread's columns only; reduced at the end
  float o[2][64];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 64; ++i) o[h][i] = 0.f;

  TileLoads<WgSmem::kStages, AtomTile, kFp8> loads{smem + WgSmem::kK, valid_s, WgSmem::bars(smem), tile_begin,
                                                   tile_end};
  loads.init();
  __syncthreads();
  if (tile_begin < tile_end) load_q<AtomTile, kHb>(p, t, h0, smem + WgSmem::kQ);
  loads.start(p, keys);
  const float qk_scale = p.softmax_scale * kLog2e;

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int stage = loads.advance(p, keys, tile);
    ukv_fence_async_shared();  // the query rows (cp.async) before wgmma reads them
    __syncthreads();
    loads.dequantize(p, stage);
    const char* ks = loads.tile(stage);

    // QK over this warpgroup's half of the dims: k-steps 16w..16w+15, each
    // 16 dims = 32 bytes inside a 128-byte atom column.
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.f;
    ukv_wgmma_fence();
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int kstep = wg * 16 + i;
      const uint32_t off = (uint32_t)(kstep >> 2) * AtomTile::kAtomBytes + (uint32_t)(kstep & 3) * 32u;
      ukv_wgmma_m64n64k16(s, ukv_wgmma_desc(smem + WgSmem::kQ + off, 16, 1024), ukv_wgmma_desc(ks + off, 16, 1024), 1);
    }
    ukv_wgmma_commit();
    ukv_wgmma_wait<0>();
    ukv_wgmma_fence_regs(s);

    // Exchange: warpgroup w keeps key blocks 4w..4w+3 (fragment regs 16w..16w+15)
    // and hands the other half to its partner.
    float x[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      xs[j * kThreads + tid] = wg == 0 ? s[16 + j] : s[j];
      x[j] = wg == 0 ? s[j] : s[16 + j];
    }
    __syncthreads();
    const int* valid = valid_s + stage * kBK;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int col = 8 * (4 * wg + j / 4) + 2 * tq + (j & 1);
      const float v = (x[j] + xs[j * kThreads + partner]) * qk_scale;
      x[j] = valid[col] != 0 ? v : -INFINITY;
      mx[(j >> 1) & 1] = fmaxf(mx[(j >> 1) & 1], x[j]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = ukv_xor_max<1, 2>(mx[r]);
      xm[r * kThreads + tid] = mx[r];
    }
    __syncthreads();
    float alpha[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m_run[r], fmaxf(mx[r], xm[r * kThreads + partner]));
      base[r] = m_new == -INFINITY ? 0.f : m_new;
      alpha[r] = exp2f(m_run[r] - base[r]);
      m_run[r] = m_new;
    }

    // P = 2^(x - m), rounded to bf16; the row sum adds the rounded values.
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 16; j += 2) {
      const int r = (j >> 1) & 1;
      const ukv_bf16 p0 = ukv_float_to_bf16(exp2f(x[j] - base[r]));
      const ukv_bf16 p1 = ukv_float_to_bf16(exp2f(x[j + 1] - base[r]));
      sum[r] += ukv_bf16_to_float(p0) + ukv_bf16_to_float(p1);
      const int col = 8 * (4 * wg + j / 4) + 2 * tq;
      const int row = row0 + 8 * r;
      const uint32_t packed = ukv_pack_bf16x2(ukv_bf16_to_float(p0), ukv_bf16_to_float(p1));
      *reinterpret_cast<uint32_t*>(ps + row * 128 + ((((col >> 3) ^ (row & 7))) << 4) + (col & 7) * 2) = packed;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + sum[r];
    ukv_fence_async_shared();
    __syncthreads();

    // PV: rescale, then O[:, 256w + 128h ...] += P . V for h = 0, 1.
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 64; i += 4) {
        o[h][i] *= alpha[0];
        o[h][i + 1] *= alpha[0];
        o[h][i + 2] *= alpha[1];
        o[h][i + 3] *= alpha[1];
      }
    ukv_wgmma_fence();
#pragma unroll
    for (int k = 0; k < kBK / 16; ++k) {
      const uint64_t da = ukv_wgmma_desc(ps + k * 32, 16, 1024);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const char* v = ks + (size_t)(4 * wg + 2 * h) * AtomTile::kAtomBytes + (size_t)k * 16 * 128;
        ukv_wgmma_m64n128k16_bt(o[h], da, ukv_wgmma_desc(v, AtomTile::kAtomBytes, 1024), 1);
      }
    }
    ukv_wgmma_commit();
    ukv_wgmma_wait<0>();
    ukv_wgmma_fence_regs(o[0]);
    ukv_wgmma_fence_regs(o[1]);
    __syncthreads();  // the stage, P and the exchange buffers are rewritten next tile
  }

  // Row sums: the quad's columns, then the partner warpgroup's (same order in
  // both warpgroups, so they agree bit for bit).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] = ukv_xor_sum<1, 2>(l_run[r]);
    xm[r * kThreads + tid] = l_run[r];
  }
  __syncthreads();
  float l_tot[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float other = xm[r * kThreads + partner];
    l_tot[r] = wg == 0 ? l_run[r] + other : other + l_run[r];
  }

  if (!direct && cfg.cluster != 0) {
    // The key stages are free now; they hold this split's acc for the merge,
    // the exchange buffer its (m, l).
    static_assert(kHb * kD * 4 <= WgSmem::kStages * WgSmem::kTileBytes, "the partial fits in the key stages");
    ukv_cp_async_wait<0>();
    float* acc_s = WgSmem::drained(smem);
    float* m_s = xs;
    float* l_s = xs + kHb;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + 8 * r;
      if (wg == 0 && tq == 0) {
        m_s[row] = m_run[r];
        l_s[row] = l_tot[r];
      }
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const int col = 256 * wg + 128 * hh + 8 * i + 2 * tq;
          *reinterpret_cast<float2*>(acc_s + partial_at(row, col)) = make_float2(o[hh][4 * i + 2 * r], o[hh][4 * i + 2 * r + 1]);
        }
    }
    ukv_cluster_sync();
    cluster_merge<kHb>(p, t, h0, cut.count, split, cfg.splits, m_s, l_s, acc_s);
    ukv_cluster_sync();  // no block leaves while another still reads its shared memory
  } else if (direct) {
    const float* cs = inverse_rope_row(p, t);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = h0 + row0 + 8 * r;
      if (h >= p.num_heads) continue;
      float lse;
      const float scale = fold_sink(p, h, m_run[r], l_tot[r], &lse);
      ukv_bf16* out = static_cast<ukv_bf16*>(p.out) + (int64_t)t * p.out_stride_token + (int64_t)h * p.out_stride_head;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const int col = 256 * wg + 128 * hh + 8 * i + 2 * tq;
          float lo = o[hh][4 * i + 2 * r] * scale, hi = o[hh][4 * i + 2 * r + 1] * scale;
          inverse_rope_pair(cs, col, lo, hi);
          *reinterpret_cast<uint32_t*>(out + col) = ukv_pack_bf16x2(lo, hi);
        }
      if (p.lse != nullptr && wg == 0 && tq == 0) p.lse[(int64_t)t * p.lse_stride_token + h] = lse;
    }
  } else {
    float* rec = static_cast<float*>(p.workspace) +
                 (((size_t)t * gridDim.y + hb) * cfg.splits + split) * partial_floats(kHb);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + 8 * r;
      if (wg == 0 && tq == 0) {
        rec[row] = m_run[r];
        rec[kHb + row] = l_tot[r];
      }
      float* acc_out = rec + 2 * kHb + (size_t)row * kD;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const int col = 256 * wg + 128 * hh + 8 * i + 2 * tq;
          *reinterpret_cast<float2*>(acc_out + col) = make_float2(o[hh][4 * i + 2 * r], o[hh][4 * i + 2 * r + 1]);
        }
    }
  }
#endif
}

}  // namespace
#endif  // UKV_NVIDIA_KERNELS
