// The heads-on-N warpgroup-MMA kernel (attention_swap_kernel, sm_90a) for
// blocks of 16 or 32 heads, in-place or raw FP8 variants.
#pragma once

#include "raw_fragments.cuh"

#if defined(UKV_NVIDIA_KERNELS)
namespace {

// Named barriers of attention_swap_kernel besides RegsBarrier's. A barrier
// keeps one thread count, so with kAlt, whose warpgroups own 1 and 2, the
// consumers' moves to 3.
enum SwapBarrier : int {
  kSwapConsumers = 1,     // the eight consumer warps (FP8 pools, kAlt off)
  kSwapWarpgroup0 = 1,    // kAlt: warpgroup 0's 128 threads
  kSwapWarpgroup1 = 2,    // kAlt: warpgroup 1's 128 threads
  kSwapAltConsumers = 3,  // kAlt: the eight consumer warps
};

// kLayout (raw variant): the key sources' layout, an e4m3fn pool or FlashMLA
// cache (RawPipeline).
template <int NH, int ST, bool kFp8, bool kRaw, int kLayout = kLayoutPool>
__global__ void __launch_bounds__(swap_threads(kFp8), SwapSmem<NH, ST, kRaw>::kCtasPerSm)
    attention_swap_kernel(ukv_attention_params p, SplitConfig cfg) {
#if defined(UKV_HAS_WGMMA)
  static_assert(kFp8 || !kRaw, "the raw variant reads FP8 rows");
  static_assert(!kRaw || NH == 16, "32-head raw blocks run attention_roles_kernel");
  using L = SwapSmem<NH, ST, kRaw>;
  // Raw variant (16 heads, kAlt), a block of more than kSplitTiles tiles:
  // each warpgroup takes every other tile whole (all 512 dims), so the two
  // never wait for each other within a tile and one's softmax and barriers
  // overlap the other's fragment building and MMAs; they merge once at the
  // end (`alt`). Otherwise the warpgroups split the dims of each tile, which
  // halves a tile's latency: the better choice for a block of a few tiles
  // (bench/notes/v25.md).
  constexpr bool kAlt = L::kAlt;
  constexpr int kSplitTiles = 3;
  constexpr int kStages = L::kStages;
  constexpr int kRegs = NH / 2;    // S^T and each O^T block: fragment registers per thread
  constexpr int kOwn = NH / 4;     // S^T registers of this warpgroup's heads
  constexpr int kGroup = 4;        // QK fragments per wgmma commit group
  extern __shared__ __align__(1024) char smem[];
  const BlockTask task = token_major_block();
  const int t = task.t, hb = task.hb, split = blockIdx.z;
  const int h0 = hb * NH;
  // The warpgroup and warp indices through a shuffle from lane 0: the
  // compiler then knows them warp-uniform and keeps the wgmma descriptors
  // derived from them in uniform registers.
  const int tid = threadIdx.x, lane = tid % UKV_WARP;
  const int wg = ukv_shfl(tid / 128, 0, UKV_WARP), q = ukv_shfl((tid / UKV_WARP) % 4, 0, UKV_WARP);
  const int g = lane >> 2, tq = lane & 3;
  const int partner = tid ^ 128;
  int* valid_s = L::valid(smem);
  float* xs = L::exchange(smem);
  float* warp_s = L::warp(smem);
  float* m_h = L::head(smem);
  float* l_h = m_h + NH;
  float* alpha_h = l_h + NH;
  float* scale_h = alpha_h + NH;
  float* qk_h = scale_h + NH;
  char* pt = smem + L::kPT;
  // Raw variant: the PV factor words (raw_fac_at) and the warps' scale maxima
  // (16 words per warpgroup); kAlt: the factor words per warpgroup too.
  uint32_t* fac_s = L::fac(smem);
  uint32_t* smax_s = L::smax(smem);
  // Column (head) of fragment register j of this warpgroup's own S^T part.
  const auto own_head = [&](int j) { return 8 * (wg * (NH / 16) + j / 4) + 2 * tq + (j & 1); };
  // Head of this thread's accumulator column c (S^T or O^T fragment register
  // i: c = (i / 4) * 2 + (i & 1), head_of).
  const auto head_of_c = [&](int c) { return 8 * (c / 2) + 2 * tq + (c & 1); };

  SplitWork work;
  if (!split_work(p, t, split, cfg, work)) return;
  const TokenKeys& keys = work.keys;
  const int tile_begin = work.tile_begin, tile_end = work.tile_end;
  const bool alt = kAlt && tile_end - tile_begin > kSplitTiles;  // uniform over the block

  // Running (m, l) per head column of this thread (both rows of the pair
  // share it): its own heads after the exchange, or with `alt` all its S^T
  // columns (head_of_c).
  constexpr int kCols = kAlt ? kRegs / 2 : kOwn / 2;
  float m_run[kCols], l_run[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    m_run[c] = -INFINITY;
    l_run[c] = 0.f;
  }
  float o[kAlt ? 8 : 4][kRegs];
#pragma unroll
  for (int mb = 0; mb < (kAlt ? 8 : 4); ++mb)
#pragma unroll
    for (int i = 0; i < kRegs; ++i) o[mb][i] = 0.f;

  // bf16: all warps gather (TileLoads); FP8: the producer warps gather and
  // dequantize (ProducerPipeline) or only gather (RawPipeline), and the
  // consumers' barriers leave them out.
  static_assert(!kFp8 || ST > 1, "the FP8 pipeline keeps a tile in flight while it dequantizes another");
  // (The raw variant names its RawPipeline twice, so that no TileLoads of
  // PadTile stages exists in it.)
  uint64_t* bars = L::bars(smem);
  using Pipe = std::conditional_t<kRaw, RawPipeline<kStages, kLayout>, ProducerPipeline<kStages>>;
  using Loads = std::conditional_t<kRaw, Pipe, TileLoads<kStages, PadTile, kFp8>>;
  Loads loads{smem + L::kK, valid_s, bars, tile_begin, tile_end};
  const Pipe pipe{smem + L::kK, valid_s, bars, tile_begin, tile_end};
  // Raw variant: the slot of M row m's key.
  const auto slot_of = [](int m) { return kRaw ? qk_slot(m) : m; };
  // `alt`: a barrier of this warpgroup's 128 threads (a branch, not an id in
  // a register: see RegsBarrier).
  const auto wg_sync = [wg] {
    if (wg == 0) {
      ukv_named_sync(kSwapWarpgroup0, 128);
    } else {
      ukv_named_sync(kSwapWarpgroup1, 128);
    }
  };
  const auto consumer_sync = [] {
    if constexpr (kFp8) {
      ukv_named_sync(kAlt ? kSwapAltConsumers : kSwapConsumers, kThreads);
    } else {
      __syncthreads();
    }
  };
  if constexpr (kRaw) {
    pipe.init(alt ? 128 : kThreads);  // the threads that release a stage
  } else if constexpr (kFp8) {
    pipe.init();
  } else {
    loads.init();
  }
  __syncthreads();
  // Raw variant: per code block, the largest scale byte of the valid keys its
  // accumulators have seen (raw_pv_codes). `alt` (this warpgroup's tiles):
  // word j holds blocks j (low half) and j + 4; otherwise word mb block 4 wg + mb.
  uint32_t ref_s[4] = {0u, 0u, 0u, 0u};
  // The producers run no consumer iteration, then join the epilogue's barriers
  // (rather than exiting: sanitizers wait for exited threads at them). The
  // raw variant's producers only issue copies, so their registers go to the
  // consumers while the tiles run (all warps run the epilogue at the entry count).
  const bool consumer = !kFp8 || tid < kThreads;
  // setmaxnreg.inc spins until the registers are free; each side waits at a
  // named barrier for the other's release first, so it never spins (a warp
  // spinning there hung compute-sanitizer's racecheck).
  if (!consumer) {
    if constexpr (kRaw) {
      ukv_setmaxnreg_dec<kRawProducerRegs>();
      ukv_named_arrive(kRegsLentBarrier, swap_threads(true));
    }
    pipe.produce(p, keys);
    if constexpr (kRaw) {
      ukv_named_sync(kRegsBackBarrier, swap_threads(true));
      ukv_setmaxnreg_inc<kEntryRegs>();
    }
  } else {
    if constexpr (kRaw) {
      ukv_named_sync(kRegsLentBarrier, swap_threads(true));
      ukv_setmaxnreg_inc<kRawConsumerRegs>();
    }
    const float qk_scale = p.softmax_scale * kLog2e;
    if (kRaw && tile_begin < tile_end) {
      raw_load_q<NH, kWarps>(p, t, h0, tid / UKV_WARP, lane, qk_scale, smem + L::kQ, qk_h);
    } else if (!kRaw && tile_begin < tile_end) {
      for (int c = tid; c < NH * kChunks; c += kThreads) {
        const int r = c / kChunks, chunk = c % kChunks;
        const bool valid = h0 + r < p.num_heads;
        const ukv_bf16* qrow = static_cast<const ukv_bf16*>(p.q) + (int64_t)t * p.q_stride_token +
                               (int64_t)(valid ? h0 + r : 0) * p.q_stride_head;
        const uint32_t at = (uint32_t)(chunk >> 3) * (uint32_t)L::kAtomCol + (uint32_t)r * 128u +
                            (uint32_t)(((chunk & 7) ^ (r & 7)) << 4);
        ukv_cp_async16(smem + L::kQ + at, reinterpret_cast<const char*>(qrow) + chunk * 16, valid);
      }
    }
    if constexpr (kFp8) {
      ukv_cp_async_wait_all();   // the query rows (issued above, in no commit group)
      ukv_fence_async_shared();  // before wgmma reads them
      consumer_sync();
    } else {
      loads.start(p, keys);
    }

    // (`alt` is false unless kAlt; the constexpr test keeps the whole-tile code,
    // which indexes eight accumulator blocks, out of the other instantiations.)
    if (alt) {
      if constexpr (kAlt) {
        // Warpgroup wg: tiles tile_begin + wg, + 2, ...; its own P^T pair, factor
        // words and barrier.
        char* pt16_w = pt + 2 * wg * L::kPTBytes;
        char* ptbf_w = pt16_w + L::kPTBytes;
        uint32_t* fac_w = fac_s + wg * kRawFacWords;
        uint32_t* smax_w = smax_s + wg * 16;
        float* warp_w = warp_s + wg * 4 * NH;
        const int qk_slots[2] = {slot_of(16 * q + g), slot_of(16 * q + g + 8)};
        // Descriptors of Q's first k-step and of the P^T buffers; a step adds its
        // byte offset / 16.
        const uint64_t q_desc = ukv_wgmma_desc(smem + L::kQ, 16, 1024);
        const uint64_t pt16_desc = ukv_wgmma_desc(pt16_w, 16, 1024), ptbf_desc = ukv_wgmma_desc(ptbf_w, 16, 1024);
        // This lane's code blocks for the scale maxima and factor words: tq and
        // tq + 4 (none for lane 3's second: block 7 holds the rope dims).
        const int blk[2] = {tq, tq + 4};
        for (int tile = tile_begin + wg; tile < tile_end; tile += 2) {
          const int stage = pipe.acquire(tile);
          const char* ks = loads.tile(stage);

          // QK over all eight blocks (raw_qk).
          float s[kRegs];
#pragma unroll
          for (int i = 0; i < kRegs; ++i) s[i] = 0.f;
          raw_qk<kLayout, NH, 0, kD / 64>(ks, qk_slots, tq, q_desc, (uint32_t)L::kAtomCol, s);

          // Softmax of the tile within the warpgroup: the head max over the
          // warp's 16 keys (lanes g), then its 4 warps through shared memory;
          // the scale maxima of this lane's blocks go the same way.
          const int* valid = valid_s + stage * kBK;
          const bool v_key[2] = {valid[qk_slots[0]] != 0, valid[qk_slots[1]] != 0};
          uint32_t sb[2][2];  // [block of blk][key]: scale byte, 0 for a key without a row
#pragma unroll
          for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              sb[j][e] = v_key[e] && blk[j] < kD / 64 - 1
                             ? *reinterpret_cast<const uint8_t*>(ks + raw_row(qk_slots[e]) + RawTile::scale_at<kLayout>(blk[j]))
                             : 0u;
          uint32_t smax = max(sb[0][0], sb[0][1]) | max(sb[1][0], sb[1][1]) << 16;
#pragma unroll
          for (int off = 4; off < UKV_WARP; off *= 2) smax = ukv_max_u16x2(smax, (uint32_t)ukv_shfl_xor((int)smax, off, UKV_WARP));
          if (g == 0) smax_w[4 * q + tq] = smax;
          float mx[kRegs / 2];
#pragma unroll
          for (int c = 0; c < kRegs / 2; ++c) mx[c] = -INFINITY;
#pragma unroll
          for (int i = 0; i < kRegs; ++i) {
            const int e = (i & 2) ? 1 : 0, c = (i / 4) * 2 + (i & 1);
            s[i] = v_key[e] ? s[i] * qk_h[head_of_c(c)] : -INFINITY;
            mx[c] = fmaxf(mx[c], s[i]);
          }
#pragma unroll
          for (int c = 0; c < kRegs / 2; ++c) {
            mx[c] = ukv_xor_max<4, 16>(mx[c]);
            if (g == 0) warp_w[q * NH + head_of_c(c)] = mx[c];
          }
          wg_sync();
          float base[kRegs / 2], alpha[kRegs / 2], sum[kRegs / 2];
#pragma unroll
          for (int c = 0; c < kRegs / 2; ++c) {
            const int h = head_of_c(c);
            const float m_tile = fmaxf(fmaxf(warp_w[h], warp_w[NH + h]), fmaxf(warp_w[2 * NH + h], warp_w[3 * NH + h]));
            const float m_new = fmaxf(m_run[c], m_tile);
            base[c] = m_new == -INFINITY ? 0.f : m_new;
            alpha[c] = exp2f(m_run[c] - base[c]);
            m_run[c] = m_new;
            sum[c] = 0.f;
          }
          // The running scale maxima; the code blocks' accumulators rescale by
          // 2^(old - new), and this lane writes the factor words 2^(s - max) of
          // its blocks for its key pair (PV k positions 16 q + 2 g, + 1).
          uint32_t ref_old[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) ref_old[j] = ref_s[j];
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const uint4 v = *reinterpret_cast<const uint4*>(smax_w + 4 * w);
            ref_s[0] = ukv_max_u16x2(ref_s[0], v.x);
            ref_s[1] = ukv_max_u16x2(ref_s[1], v.y);
            ref_s[2] = ukv_max_u16x2(ref_s[2], v.z);
            ref_s[3] = ukv_max_u16x2(ref_s[3], v.w);
          }
          const uint32_t ref_tq = ref_word(ref_s, tq);
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            if (blk[j] >= kD / 64 - 1) continue;
            const int ref = (int)(ref_tq >> (16 * j)) & 0xFFFF;
            fac_w[raw_fac_at(blk[j], g & 3, q, g >> 2)] = raw_factor_word(sb[j][0], sb[j][1], ref);
          }
          // P^T[head][k] with k = 16 q + 2 g + e for the key of row 16 q + g + 8 e:
          // f16 for the code blocks, bf16 for the rope block.
#pragma unroll
          for (int c = 0; c < kRegs / 2; ++c) {
            const int i = (c / 2) * 4 + (c & 1), h = head_of_c(c);
            const float p0 = exp2f(s[i] - base[c]), p1 = exp2f(s[i + 2] - base[c]);
            sum[c] += p0 + p1;
            raw_store_pt(pt16_w, ptbf_w, h, 16 * q + 2 * g, p0, p1);
          }
#pragma unroll
          for (int c = 0; c < kRegs / 2; ++c) l_run[c] = l_run[c] * alpha[c] + sum[c];
#pragma unroll
          for (int mb = 0; mb < 8; ++mb) {
            float f[kRegs / 2];
            const float beta = mb < kD / 64 - 1 ? raw_pow2(alt_ref(ref_old, mb) - alt_ref(ref_s, mb)) : 1.f;
#pragma unroll
            for (int c = 0; c < kRegs / 2; ++c) f[c] = alpha[c] * beta;
#pragma unroll
            for (int i = 0; i < kRegs; ++i) o[mb][i] *= f[(i / 4) * 2 + (i & 1)];
          }
          ukv_fence_async_shared();  // P^T before wgmma reads it
          wg_sync();

          // PV: M tile mb is block mb (raw_pv).
          raw_pv<kLayout, NH, 0, 8>(ks, q, lane, fac_w, pt16_desc, ptbf_desc, o);
          // Every read of the stage is done (the MMAs read registers and P^T).
          pipe.release(stage);
          ukv_wgmma_wait<0>();
#pragma unroll
          for (int mb = 0; mb < 8; ++mb) ukv_wgmma_fence_regs(o[mb]);
        }
        // With an odd tile count warpgroup 1 has one tile fewer: it passes that
        // tile's two named barriers here. Not needed for correctness, but
        // racecheck orders two warps' accesses only when the warps have passed
        // as many barriers: without this it reports the merge's exchanges below
        // as races (bench/notes/v20.md).
        if (wg == 1 && (tile_end - tile_begin) % 2 == 1) {
          wg_sync();
          wg_sync();
        }
      }
    } else {
      for (int tile = tile_begin; tile < tile_end; ++tile) {
        int stage;
        if constexpr (kFp8) {
          stage = pipe.acquire(tile);
        } else {
          stage = loads.advance(p, keys, tile);
          ukv_fence_async_shared();  // the query rows (cp.async) before wgmma reads them
          __syncthreads();
        }
        const char* ks = loads.tile(stage);

        // QK over this warpgroup's 16 k-steps of 16 dims (blocks 4 wg .. 4 wg + 3).
        // bf16: in commit groups of kGroup fragments double-buffered in
        // registers (a group's registers are reloaded only after the group two
        // back has completed), which keeps the kernel within 128 registers for
        // two CTAs per SM. Raw variant: raw_qk.
        float s[kRegs];
#pragma unroll
        for (int i = 0; i < kRegs; ++i) s[i] = 0.f;
        if constexpr (kRaw) {
          const int qk_slots[2] = {slot_of(16 * q + g), slot_of(16 * q + g + 8)};
          const uint64_t q_desc = ukv_wgmma_desc(smem + L::kQ, 16, 1024);
          if (wg == 0) {
            raw_qk<kLayout, NH, 0, 4>(ks, qk_slots, tq, q_desc, (uint32_t)L::kAtomCol, s);
          } else {
            raw_qk<kLayout, NH, 4, 4>(ks, qk_slots, tq, q_desc, (uint32_t)L::kAtomCol, s);
          }
        } else {
          uint32_t a[2][kGroup][4];
#pragma unroll
          for (int grp = 0; grp < 16 / kGroup; ++grp) {
            if (grp >= 2) ukv_wgmma_wait<1>();
#pragma unroll
            for (int j = 0; j < kGroup; ++j) {
              const int kstep = 16 * wg + grp * kGroup + j;
              ukv_ldmatrix_x4(a[grp & 1][j], ks + PadTile::at(16 * q + (lane & 15), 2 * kstep + (lane >> 4)));
            }
            ukv_wgmma_fence();
#pragma unroll
            for (int j = 0; j < kGroup; ++j) {
              const int kstep = 16 * wg + grp * kGroup + j;
              const char* qb = smem + L::kQ + (size_t)(kstep >> 2) * L::kAtomCol + (kstep & 3) * 32;
              swap_mma<NH>(s, a[grp & 1][j], ukv_wgmma_desc(qb, 16, 1024));
            }
            ukv_wgmma_commit();
          }
          ukv_wgmma_wait<0>();
          ukv_wgmma_fence_regs(s);
        }

        // The other warpgroup's heads go to it; this one's come back.
        float x[kOwn];
#pragma unroll
        for (int j = 0; j < kOwn; ++j) {
          xs[j * kThreads + tid] = wg == 0 ? s[kOwn + j] : s[j];
          x[j] = wg == 0 ? s[j] : s[kOwn + j];
        }
        consumer_sync();
        const int* valid = valid_s + stage * kBK;
        const bool v_key[2] = {valid[slot_of(16 * q + g)] != 0, valid[slot_of(16 * q + g + 8)] != 0};
        float mx[kOwn / 2];
#pragma unroll
        for (int c = 0; c < kOwn / 2; ++c) mx[c] = -INFINITY;
#pragma unroll
        for (int j = 0; j < kOwn; ++j) {
          const float v = (x[j] + xs[j * kThreads + partner]) * (kRaw ? qk_h[own_head(j)] : qk_scale);
          x[j] = v_key[(j & 2) ? 1 : 0] ? v : -INFINITY;
          const int c = (j / 4) * 2 + (j & 1);
          mx[c] = fmaxf(mx[c], x[j]);
        }
        // Max over the warp's 16 keys (lanes with the same lane % 4), then warps.
#pragma unroll
        for (int c = 0; c < kOwn / 2; ++c) {
          mx[c] = ukv_xor_max<4, 16>(mx[c]);
          if (g == 0) warp_s[q * NH + own_head(c / 2 * 4 + (c & 1))] = mx[c];
        }
        // Raw variant: this lane's code block 4 wg + tq (none for warpgroup 1's
        // lanes tq = 3: the rope block), its scale bytes for the lane's two keys
        // (0 for a key without a row) and their maximum over the warp.
        [[maybe_unused]] const int blk = 4 * wg + tq;
        [[maybe_unused]] uint32_t sb[2] = {0u, 0u};
        if constexpr (kRaw) {
          const int slots[2] = {slot_of(16 * q + g), slot_of(16 * q + g + 8)};
          raw_block_scales<kLayout>(ks, v_key, slots, blk, q, lane, smax_s + 16 * wg, sb);
        }
        consumer_sync();
        float base[kOwn / 2], alpha[kOwn / 2];
#pragma unroll
        for (int c = 0; c < kOwn / 2; ++c) {
          const int h = own_head(c / 2 * 4 + (c & 1));
          const float m_tile = fmaxf(fmaxf(warp_s[h], warp_s[NH + h]), fmaxf(warp_s[2 * NH + h], warp_s[3 * NH + h]));
          const float m_new = fmaxf(m_run[c], m_tile);
          base[c] = m_new == -INFINITY ? 0.f : m_new;
          alpha[c] = exp2f(m_run[c] - base[c]);
          m_run[c] = m_new;
          if (q == 0 && g == 0) alpha_h[h] = alpha[c];
        }
        float sum[kOwn / 2];
#pragma unroll
        for (int c = 0; c < kOwn / 2; ++c) sum[c] = 0.f;
        // Raw variant: the running scale maxima of this warpgroup's blocks (tile
        // mb's accumulators rescale by 2^(old - new) below); this lane writes
        // the factor words 2^(s - max) of its block for its key pair (PV k
        // positions 16 q + 2 g, + 1), and P^T[head][k] with k = 16 q + 2 g + e
        // for the key of row 16 q + g + 8 e: f16 for the code blocks, bf16 for
        // the rope block. Otherwise P^T[head][key] in bf16; the sums add the
        // rounded values.
        uint32_t ref_old[4] = {};
        if constexpr (kRaw) {
          raw_block_factors(smax_s + 16 * wg, blk, q, lane, sb, ref_s, ref_old, fac_s);
#pragma unroll
          for (int c = 0; c < kOwn / 2; ++c) {
            const int j = (c / 2) * 4 + (c & 1), h = own_head(j);
            const float p0 = exp2f(x[j] - base[c]), p1 = exp2f(x[j + 2] - base[c]);
            sum[c] += p0 + p1;
            raw_store_pt(pt, pt + L::kPTBytes, h, 16 * q + 2 * g, p0, p1);
          }
        } else {
#pragma unroll
          for (int j = 0; j < kOwn; ++j) {
            const int c = (j / 4) * 2 + (j & 1);
            const ukv_bf16 pb = ukv_float_to_bf16(exp2f(x[j] - base[c]));
            sum[c] += ukv_bf16_to_float(pb);
            const int h = own_head(j), key = slot_of(16 * q + g + ((j & 2) ? 8 : 0));
            *reinterpret_cast<ukv_bf16*>(pt + pt_at(h, key)) = pb;
          }
        }
#pragma unroll
        for (int c = 0; c < kOwn / 2; ++c) l_run[c] = l_run[c] * alpha[c] + sum[c];
        ukv_fence_async_shared();
        consumer_sync();

        // PV: rescale every head's column (raw variant: and each code block's
        // accumulators by its scale maximum's growth), then O^T[dims of this
        // warpgroup] += V^T . P^T.
#pragma unroll
        for (int mb = 0; mb < 4; ++mb) {
          const float beta = kRaw && 4 * wg + mb < kD / 64 - 1 ? raw_pow2((int)ref_old[mb] - (int)ref_s[mb]) : 1.f;
#pragma unroll
          for (int i = 0; i < kRegs; ++i) o[mb][i] *= alpha_h[8 * (i / 4) + 2 * tq + (i & 1)] * beta;
        }
        if constexpr (kRaw) {
          const uint64_t pt16_desc = ukv_wgmma_desc(pt, 16, 1024), ptbf_desc = ukv_wgmma_desc(pt + L::kPTBytes, 16, 1024);
          if (wg == 0) {
            raw_pv<kLayout, NH, 0, 4>(ks, q, lane, fac_s, pt16_desc, ptbf_desc, o);
          } else {
            raw_pv<kLayout, NH, 4, 4>(ks, q, lane, fac_s, pt16_desc, ptbf_desc, o);
          }
          // Every read of the stage is done (the MMAs read registers and P^T),
          // so the producers may refill it while the MMAs run.
          pipe.release(stage);
        } else {
          // One commit group per 64-dim block: its four key steps' V^T fragments.
          uint32_t a[2][4][4];
#pragma unroll
          for (int mb = 0; mb < 4; ++mb) {
            if (mb >= 2) ukv_wgmma_wait<1>();
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const int key = 16 * k + (lane & 7) + ((lane >> 4) << 3);
              const int chunk = 8 * (4 * wg + mb) + 2 * q + ((lane >> 3) & 1);
              ukv_ldmatrix_x4_trans(a[mb & 1][k], ks + PadTile::at(key, chunk));
            }
            ukv_wgmma_fence();
#pragma unroll
            for (int k = 0; k < 4; ++k) swap_mma<NH>(o[mb], a[mb & 1][k], ukv_wgmma_desc(pt + k * 32, 16, 1024));
            ukv_wgmma_commit();
          }
        }
        ukv_wgmma_wait<0>();
#pragma unroll
        for (int mb = 0; mb < 4; ++mb) ukv_wgmma_fence_regs(o[mb]);
        // FP8: the producers may refill the stage (raw variant: released above).
        // P^T and the exchange buffers are rewritten next tile only past barriers
        // every warp reaches after its last read of them.
        if constexpr (kFp8 && !kRaw) {
          pipe.release(stage);
        } else if constexpr (!kFp8) {
          __syncthreads();  // the stage, P^T and the exchange buffers are rewritten next tile
        }
      }
    }
    if (kRaw && !alt) {
      // A code block's accumulators hold its values over 2^(ref - 127).
#pragma unroll
      for (int mb = 0; mb < 4; ++mb) {
        const float unit = 4 * wg + mb < kD / 64 - 1 ? raw_scale_f32(ref_s[mb]) : 1.f;
#pragma unroll
        for (int i = 0; i < kRegs; ++i) o[mb][i] *= unit;
      }
    }
    if constexpr (kRaw) {
      ukv_setmaxnreg_dec<kEntryRegs>();
      ukv_named_arrive(kRegsBackBarrier, swap_threads(true));
    }
  }

  // Per-head (m, l): the row sums over lanes and warps, in a fixed order.
  if (alt) {
    if constexpr (kAlt) {
      // Both warpgroups' (m, l) meet in shared memory; each rescales its
      // accumulators to the merged max, then warpgroup w keeps blocks mb
      // 4w..4w+3 (the split layout the writes below expect: scale block
      // 4 wg + q) and adds the other's values for them.
      float* wg_ml = L::exchange(smem) + NH * 32;  // [2 warpgroups][m, l][NH]
      float* warp_w = warp_s + wg * 4 * NH;
      if (consumer) {
#pragma unroll
        for (int c = 0; c < kRegs / 2; ++c) {
          l_run[c] = ukv_xor_sum<4, 16>(l_run[c]);
          if (g == 0) warp_w[q * NH + head_of_c(c)] = l_run[c];
        }
        wg_sync();
        if (q == 0 && g == 0) {
#pragma unroll
          for (int c = 0; c < kRegs / 2; ++c) {
            const int h = head_of_c(c);
            wg_ml[2 * wg * NH + h] = m_run[c];
            wg_ml[(2 * wg + 1) * NH + h] = ((warp_w[h] + warp_w[NH + h]) + warp_w[2 * NH + h]) + warp_w[3 * NH + h];
          }
        }
      }
      __syncthreads();
      // The other warpgroup's blocks go through the (drained) key stages.
      float* xbuf = L::drained(smem);  // [2][4][kRegs][128]
      const auto merged = [&](int h, float* m, float* f0, float* f1) {
        const float m0 = wg_ml[h], m1 = wg_ml[2 * NH + h];
        *m = fmaxf(m0, m1);
        *f0 = *m == -INFINITY ? 0.f : exp2f(m0 - *m);
        *f1 = *m == -INFINITY ? 0.f : exp2f(m1 - *m);
      };
      if (consumer) {
        float f_own[kRegs / 2];
#pragma unroll
        for (int c = 0; c < kRegs / 2; ++c) {
          float m, f0, f1;
          merged(head_of_c(c), &m, &f0, &f1);
          f_own[c] = wg == 0 ? f0 : f1;
        }
#pragma unroll
        for (int mb = 0; mb < 8; ++mb) {
          // A code block's accumulators hold its values over 2^(ref - 127),
          // ref its running scale maximum (raw_pv_codes).
          const float unit = mb < kD / 64 - 1 ? raw_scale_f32((uint32_t)alt_ref(ref_s, mb)) : 1.f;
#pragma unroll
          for (int i = 0; i < kRegs; ++i) o[mb][i] *= f_own[(i / 4) * 2 + (i & 1)] * unit;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int i = 0; i < kRegs; ++i)
            xbuf[(((1 - wg) * 4 + j) * kRegs + i) * 128 + tid % 128] = wg == 0 ? o[4 + j][i] : o[j][i];
      }
      __syncthreads();
      if (consumer) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int i = 0; i < kRegs; ++i)
            o[j][i] = (wg == 0 ? o[j][i] : o[4 + j][i]) + xbuf[((wg * 4 + j) * kRegs + i) * 128 + tid % 128];
      }
      if (tid < NH) {
        float m, f0, f1;
        merged(tid, &m, &f0, &f1);
        m_h[tid] = m;
        l_h[tid] = wg_ml[NH + tid] * f0 + wg_ml[3 * NH + tid] * f1;
      }
    }
  } else {
    if (consumer) {
#pragma unroll
      for (int c = 0; c < kOwn / 2; ++c) {
        l_run[c] = ukv_xor_sum<4, 16>(l_run[c]);
        const int h = own_head(c / 2 * 4 + (c & 1));
        if (g == 0) warp_s[q * NH + h] = l_run[c];
        if (q == 0 && g == 0) m_h[h] = m_run[c];
      }
    }
    __syncthreads();
    if (tid < NH) l_h[tid] = ((warp_s[tid] + warp_s[NH + tid]) + warp_s[2 * NH + tid]) + warp_s[3 * NH + tid];
  }
  static_assert(PushedMerge<NH>::kBytes <= L::kK - L::kQ + kStages * L::kTileBytes,
                "the cluster merge fits in the query and key stages");
  swap_finish<NH, kRaw>(p, cfg, task, work, smem + L::kQ, L::merge_bar(smem), m_h, l_h, scale_h, consumer, wg, q,
                        lane, o);
#endif
}

}  // namespace
#endif  // UKV_NVIDIA_KERNELS
