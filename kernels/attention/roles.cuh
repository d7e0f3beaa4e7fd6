// The 32-head raw kernel with warp-specialized roles (attention_roles_kernel,
// sm_90a).
#pragma once

#include "raw_fragments.cuh"

#if defined(UKV_NVIDIA_KERNELS)
namespace {

// The 32-head raw kernel with its warpgroups specialized (bench/notes/v27.md).
// In attention_swap_kernel's split mode both warpgroups run each
// tile's QK, score exchange, softmax and PV in turn, three block-wide barriers
// apart, so a tile costs the sum of those phases. Here each phase has its own
// warps and consecutive tiles overlap:
//   value warpgroups 0, 1 (threads 0..255): PV of tile i over dims
//     256 w .. 256 w + 255, in the split mode's accumulator layout, with the
//     scale maxima and factor words of their code blocks;
//   producer warps (256..383): the gather (RawPipeline);
//   score warpgroup (384..511): QK over all 512 dims of tile i + 1 (or
//     i + 2) and its softmax, writing P^T and each head's rescale alpha into
//     one of two slots.
// A slot passes to the value warpgroups through mbarrier `pfull` and back
// through `pempty`; a stage is released by all 384 consumer threads. The
// score warpgroup, one warp per scheduler, bounds the tile rate, so it does
// nothing the value warpgroups can (bench/notes/v27.md, 27c).
constexpr int kRoleThreads = kThreads + kProducerWarps * UKV_WARP + 128;

template <int NH, int ST>
struct RoleSmem {
  static constexpr int kStages = ST;
  static constexpr size_t kTileBytes = RawTile::kTileBytes;
  static constexpr size_t kAtomCol = (size_t)NH * 128;
  static constexpr size_t kQ = 0;                   // [8][NH][128 B] swizzled (raw_load_q)
  static constexpr size_t kK = kQ + 8 * kAtomCol;   // [stages] RawTile
  static constexpr size_t kPTBytes = (size_t)NH * 128;
  // Per slot: P^T in f16 and in bf16 [NH][64] (pt_at); then the slots' head
  // rescales alpha [2][NH] (written only when a head's reference moved) and
  // whether one did, and the factor words (raw_fac_at, each value warpgroup
  // writing its blocks').
  static constexpr size_t kPT = (kK + kStages * kTileBytes + 1023) / 1024 * 1024;
  static constexpr size_t kAlpha = kPT + 2 * 2 * kPTBytes;     // f32 [2][NH]
  static constexpr size_t kRescale = kAlpha + 2 * NH * 4;        // u32 [2]: a reference moved
  static constexpr size_t kFac = kRescale + 16;                  // u32 [kRawFacWords]
  // The score warps' head maxima, one buffer per tile parity: f32 [2][NH][4 warps].
  static constexpr size_t kWarp = kFac + kRawFacWords * 4;
  static constexpr size_t kSmax = kWarp + 2 * 4 * NH * 4;        // u32 [2 value warpgroups][4 warps][4 blocks]
  static constexpr size_t kHead = kSmax + 2 * 16 * 4;           // f32 [4][NH]: m, l, scale, score factor
  static constexpr size_t kValid = kHead + 4 * NH * 4;          // int [stages][64]
  // u64: full, empty [stages]; pfull, pempty [2]; done; the cluster merge's (merge_pushed)
  static constexpr size_t kBar = kValid + kStages * kBK * 4;
  static constexpr size_t kBytes = kBar + (2 * kStages + 6) * 8;
  // Typed views of the carve-outs.
  __device__ __forceinline__ static int* valid(char* smem) { return smem_at<int>(smem, kValid); }
  __device__ __forceinline__ static float* head(char* smem) { return smem_at<float>(smem, kHead); }
  __device__ __forceinline__ static uint32_t* fac(char* smem) { return smem_at<uint32_t>(smem, kFac); }
  __device__ __forceinline__ static float* alpha(char* smem) { return smem_at<float>(smem, kAlpha); }
  __device__ __forceinline__ static uint32_t* rescale(char* smem) { return smem_at<uint32_t>(smem, kRescale); }
  __device__ __forceinline__ static uint64_t* bars(char* smem) { return smem_at<uint64_t>(smem, kBar); }
  __device__ __forceinline__ static uint64_t* merge_bar(char* smem) { return bars(smem) + 2 * kStages + 5; }
  __device__ __forceinline__ static float* warp(char* smem) { return smem_at<float>(smem, kWarp); }
  __device__ __forceinline__ static uint32_t* smax(char* smem) { return smem_at<uint32_t>(smem, kSmax); }
};

// Named barriers of attention_roles_kernel besides RegsBarrier's (4, 5).
enum RoleBarrier : int {
  kRoleScore = 1,   // the score warpgroup's 128 threads
  kRoleMoved = 2,   // the score warpgroup's per-tile vote (bar.red) on whether a reference moves
  kRoleQuery = 3,   // the query hand-over: the value warps stored it, the score warpgroup may read it
  kRoleValue0 = 6,  // value warpgroup 0's 128 threads
  kRoleValue1 = 7,  // value warpgroup 1's
};

// kLayout: the key sources' layout, an e4m3fn pool or FlashMLA cache (RawPipeline).
template <int NH, int ST, int kLayout = kLayoutPool>
__global__ void __launch_bounds__(kRoleThreads, 1) attention_roles_kernel(ukv_attention_params p, SplitConfig cfg) {
#if defined(UKV_HAS_WGMMA)
  using L = RoleSmem<NH, ST>;
  // Registers per thread at entry and per role while the tiles run: with
  // fewer the value warpgroups spill (and below 160 ptxas serializes the
  // kernel's wgmmas).
  constexpr int kRegsAtEntry = 65536 / kRoleThreads;
  constexpr int kProducerRegs = 32, kScoreRegs = 144, kValueRegs = 168;
  static_assert(kProducerWarps * UKV_WARP * kProducerRegs + 128 * kScoreRegs + kThreads * kValueRegs <= 65536,
                "the roles' registers fit the SM");
  constexpr int kStages = ST;
  // How far (log2) a tile's maximum may pass a head's reference before the
  // reference moves: P^T then holds values below 2^8, which f16 and bf16 keep
  // to the same relative precision as values below 1, and the row sums stay
  // far from f32's range.
  constexpr float kLazyLog2 = 8.f;
  constexpr int kRegs = NH / 2;  // S^T and each O^T block: fragment registers per thread
  constexpr int kCols = NH / 4;  // head columns per thread
  constexpr int kScoreTid = kThreads + kProducerWarps * UKV_WARP;
  static_assert(PushedMerge<NH>::kBytes <= L::kK - L::kQ + kStages * L::kTileBytes,
                "the cluster merge fits in the query and key stages");
  extern __shared__ __align__(1024) char smem[];
  // Warpgroup and warp indices through a shuffle from lane 0 (warp-uniform,
  // so descriptors stay in uniform registers).
  const int tid = threadIdx.x, lane = tid % UKV_WARP;
  const int wg = ukv_shfl(tid / 128, 0, UKV_WARP), q = ukv_shfl((tid / UKV_WARP) % 4, 0, UKV_WARP);
  const int g = lane >> 2, tq = lane & 3;
  int* valid_s = L::valid(smem);
  float* m_h = L::head(smem);
  float* l_h = m_h + NH;
  float* scale_h = l_h + NH;
  float* qk_h = scale_h + NH;
  uint32_t* fac_s = L::fac(smem);
  float* alpha_s = L::alpha(smem);
  uint32_t* rescale_s = L::rescale(smem);
  uint64_t* bars = L::bars(smem);
  uint64_t* pfull = bars + 2 * kStages;
  uint64_t* pempty = pfull + 2;
  uint64_t* done = pempty + 2;  // the score warpgroup wrote m_h and l_h
  const auto head_of_c = [&](int c) { return 8 * (c / 2) + 2 * tq + (c & 1); };
  const auto pt_slot = [&](int par) { return smem + L::kPT + (size_t)par * 2 * L::kPTBytes; };
  // A barrier of value warpgroup wg's 128 threads (a branch, not an id in a
  // register: see RegsBarrier).
  const auto wg_sync = [wg] {
    if (wg == 0) {
      ukv_named_sync(kRoleValue0, 128);
    } else {
      ukv_named_sync(kRoleValue1, 128);
    }
  };

  // This thread's keys: M rows 16 q + g and + 8 of the QK MMAs (score
  // warpgroup), whose P^T k positions 16 q + 2 g, + 1 a value thread's factor
  // words cover.
  const int qk_slots[2] = {qk_slot(16 * q + g), qk_slot(16 * q + g + 8)};

  SplitWork work;
  const BlockTask task = token_major_block();
  if (!split_work(p, task.t, blockIdx.z, cfg, work)) return;
  const int t = task.t, h0 = task.hb * NH;
  const int tile_begin = work.tile_begin, tile_end = work.tile_end;
  const RawPipeline<kStages, kLayout> pipe{smem + L::kK, valid_s, bars, tile_begin, tile_end};
  pipe.init(kThreads + 128);
  if (tid == 0) {
    for (int s = 0; s < 2; ++s) {
      ukv_mbar_init(&pfull[s], 128);
      ukv_mbar_init(&pempty[s], kThreads);
    }
    ukv_mbar_init(done, 128);
    ukv_mbar_init_fence();
  }
  __syncthreads();

  float o[4][kRegs];
#pragma unroll
  for (int mb = 0; mb < 4; ++mb)
#pragma unroll
    for (int i = 0; i < kRegs; ++i) o[mb][i] = 0.f;
  const bool value = tid < kThreads, score = tid >= kScoreTid;
  // Registers: the producers lend theirs while the tiles run, as in
  // attention_swap_kernel (each side waits at a named barrier first).
  if (!value && !score) {
    ukv_setmaxnreg_dec<kProducerRegs>();
    ukv_named_arrive(kRegsLentBarrier, kRoleThreads);
    pipe.produce(p, work.keys);
    ukv_named_sync(kRegsBackBarrier, kRoleThreads);
    ukv_setmaxnreg_inc<kRegsAtEntry>();
  } else {
    // One site for the consumers' side of each hand-over (synccheck reports
    // threads reaching one barrier at two places as divergent).
    ukv_named_sync(kRegsLentBarrier, kRoleThreads);
    if (score) {
      ukv_setmaxnreg_inc<kScoreRegs>();
      ukv_named_sync(kRoleQuery, kThreads + 128);
      const uint64_t q_desc = ukv_wgmma_desc(smem + L::kQ, 16, 1024);
      // Per column: the head's score factor (qk_h), running max and sum.
      float qk_c[kCols], m_run[kCols], l_run[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        qk_c[c] = qk_h[head_of_c(c)];
        m_run[c] = -INFINITY;
        l_run[c] = 0.f;
      }
      for (int tile = tile_begin; tile < tile_end; ++tile) {
        const int i = tile - tile_begin, par = i & 1;
        float* warp_w = L::warp(smem) + par * 4 * NH;
        const int stage = pipe.acquire(tile);
        const char* ks = pipe.tile(stage);
        float s[kRegs];
#pragma unroll
        for (int r = 0; r < kRegs; ++r) s[r] = 0.f;
        raw_qk<kLayout, NH, 0, kD / 64, true>(ks, qk_slots, tq, q_desc, (uint32_t)L::kAtomCol, s);
        const int* valid = valid_s + stage * kBK;
        const bool v_key[2] = {valid[qk_slots[0]] != 0, valid[qk_slots[1]] != 0};
        pipe.release(stage);  // the value warpgroups hold it until their PV
        // A head's reference m_run moves only when the tile's maximum passes it
        // by more than kLazyLog2, so most tiles rescale nothing (alpha 1) and
        // the value warpgroups skip the multiply (P stays below 2^kLazyLog2).
        // Whether any head's does is one barrier with an OR over the
        // warpgroup; only then are the heads' exact maxima exchanged.
        float mx[kCols];
        bool over = false;
#pragma unroll
        for (int r = 0; r < kRegs; ++r) {
          const int e = (r & 2) ? 1 : 0;
          s[r] = v_key[e] ? s[r] * qk_c[(r / 4) * 2 + (r & 1)] : -INFINITY;
        }
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const int r = (c / 2) * 4 + (c & 1);
          mx[c] = fmaxf(s[r], s[r + 2]);
          over = over || mx[c] > m_run[c] + kLazyLog2;
        }
        const bool moved = ukv_named_sync_or(kRoleMoved, 128, over);
        float base[kCols], alpha[kCols], sum[kCols];
        if (moved) {
#pragma unroll
          for (int c = 0; c < kCols; ++c) {
            mx[c] = ukv_xor_max<4, 16>(mx[c]);
            if (g == 0) warp_w[4 * head_of_c(c) + q] = mx[c];
          }
          ukv_named_sync(kRoleScore, 128);
#pragma unroll
          for (int c = 0; c < kCols; ++c) {
            const float4 m4 = *reinterpret_cast<const float4*>(warp_w + 4 * head_of_c(c));
            const float m_tile = fmaxf(fmaxf(m4.x, m4.y), fmaxf(m4.z, m4.w));
            const bool move = m_tile > m_run[c] + kLazyLog2;
            alpha[c] = move ? ukv_exp2_ftz(m_run[c] - m_tile) : 1.f;
            m_run[c] = move ? m_tile : m_run[c];
          }
        } else {
#pragma unroll
          for (int c = 0; c < kCols; ++c) alpha[c] = 1.f;
        }
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          base[c] = m_run[c] == -INFINITY ? 0.f : m_run[c];
          sum[c] = 0.f;
        }
        // The slot of tile i - 2 must be free: the value warpgroups' PV of it done.
        if (i >= 2) ukv_mbar_wait(&pempty[par], (uint32_t)((i - 2) >> 1) & 1u);
        if (moved && q == 0 && g == 0) {
#pragma unroll
          for (int c = 0; c < kCols; ++c) alpha_s[par * NH + head_of_c(c)] = alpha[c];
        }
        if (q == 0 && lane == 0) rescale_s[par] = moved ? 1u : 0u;
        // P^T[head][k] with k = 16 q + 2 g + e for the key of row 16 q + g + 8 e.
        char* pt16 = pt_slot(par);
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const int r = (c / 2) * 4 + (c & 1);
          const float p0 = ukv_exp2_ftz(s[r] - base[c]), p1 = ukv_exp2_ftz(s[r + 2] - base[c]);
          sum[c] += p0 + p1;
          raw_store_pt(pt16, pt16 + L::kPTBytes, head_of_c(c), 16 * q + 2 * g, p0, p1);
        }
#pragma unroll
        for (int c = 0; c < kCols; ++c) l_run[c] = l_run[c] * alpha[c] + sum[c];
        ukv_fence_async_shared();  // P^T before the value warpgroups' wgmma read it
        ukv_mbar_arrive(&pfull[par]);
      }
      // Per-head (m, l): the row sums over lanes, then warps in a fixed order,
      // through the parity buffer the last tile did not use.
      float* lw = L::warp(smem) + ((tile_end - tile_begin) & 1) * 4 * NH;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const float l = ukv_xor_sum<4, 16>(l_run[c]);
        if (g == 0) lw[4 * head_of_c(c) + q] = l;
        if (q == 0 && g == 0) m_h[head_of_c(c)] = m_run[c];
      }
      ukv_named_sync(kRoleScore, 128);
      const int h = tid - kScoreTid;
      if (h < NH) {
        const float4 l4 = *reinterpret_cast<const float4*>(lw + 4 * h);
        l_h[h] = ((l4.x + l4.y) + l4.z) + l4.w;
      }
      ukv_mbar_arrive(done);
    } else {
      ukv_setmaxnreg_inc<kValueRegs>();
      if (tile_begin < tile_end) {
        raw_load_q<NH, kWarps>(p, t, h0, tid / UKV_WARP, lane, p.softmax_scale * kLog2e, smem + L::kQ, qk_h);
      }
      ukv_fence_async_shared();  // before the score warpgroup's wgmma read the query
      ukv_named_arrive(kRoleQuery, kThreads + 128);
      // This lane's code block 4 wg + tq (none for warpgroup 1's lanes tq = 3:
      // the rope block), and the running scale maxima of this warpgroup's blocks
      // 4 wg + mb its accumulators have seen (raw_pv_codes: they hold values
      // over 2^(ref - 127)).
      const int blk = 4 * wg + tq;
      uint32_t* smax_w = L::smax(smem) + 16 * wg;
      uint32_t ref_s[4] = {0u, 0u, 0u, 0u};
      for (int tile = tile_begin; tile < tile_end; ++tile) {
        const int i = tile - tile_begin, par = i & 1;
        const int stage = pipe.acquire(tile);
        const char* ks = pipe.tile(stage);
        // The scale bytes of this lane's block for its two keys (0 for a key
        // without a row), their maximum over the warp, then over the warpgroup;
        // this lane's factor words 2^(s - max) for its key pair (PV k positions
        // 16 q + 2 g, + 1). The first barrier also orders the last tile's reads
        // of the factor words before these writes, the second these writes
        // before the PV, and the maxima's reads before the next tile's writes.
        const int* valid = valid_s + stage * kBK;
        const bool v_key[2] = {valid[qk_slots[0]] != 0, valid[qk_slots[1]] != 0};
        uint32_t sb[2] = {0u, 0u};
        raw_block_scales<kLayout>(ks, v_key, qk_slots, blk, q, lane, smax_w, sb);
        wg_sync();
        uint32_t ref_old[4];
        raw_block_factors(smax_w, blk, q, lane, sb, ref_s, ref_old, fac_s);
        // Tile i's P^T and alpha; each block's accumulators rescale by alpha
        // and by their scale maximum's growth, if either moved (the same
        // answer in every thread of the warpgroup).
        ukv_mbar_wait(&pfull[par], (uint32_t)(i >> 1) & 1u);
        const bool moved = rescale_s[par] != 0u;
        bool rescale = moved;
#pragma unroll
        for (int mb = 0; mb < 4; ++mb) rescale = rescale || ref_old[mb] != ref_s[mb];
        if (rescale) {
          float a_h[kCols];  // the slot's alpha words are written only when a reference moved
#pragma unroll
          for (int c = 0; c < kCols; ++c) a_h[c] = moved ? alpha_s[par * NH + head_of_c(c)] : 1.f;
#pragma unroll
          for (int mb = 0; mb < 4; ++mb) {
            const float beta = 4 * wg + mb < kD / 64 - 1 ? raw_pow2((int)ref_old[mb] - (int)ref_s[mb]) : 1.f;
#pragma unroll
            for (int r = 0; r < kRegs; ++r) o[mb][r] *= a_h[(r / 4) * 2 + (r & 1)] * beta;
          }
        }
        wg_sync();
        const uint64_t pt16_desc = ukv_wgmma_desc(pt_slot(par), 16, 1024);
        const uint64_t ptbf_desc = ukv_wgmma_desc(pt_slot(par) + L::kPTBytes, 16, 1024);
        if (wg == 0) {
          raw_pv<kLayout, NH, 0, 4>(ks, q, lane, fac_s, pt16_desc, ptbf_desc, o);
        } else {
          raw_pv<kLayout, NH, 4, 4>(ks, q, lane, fac_s, pt16_desc, ptbf_desc, o);
        }
        pipe.release(stage);
        ukv_wgmma_wait<0>();
#pragma unroll
        for (int mb = 0; mb < 4; ++mb) ukv_wgmma_fence_regs(o[mb]);
        ukv_mbar_arrive(&pempty[par]);  // the slot's P^T and alpha are read
      }
#pragma unroll
      for (int mb = 0; mb < 4; ++mb) {
        const float unit = 4 * wg + mb < kD / 64 - 1 ? raw_scale_f32(ref_s[mb]) : 1.f;
#pragma unroll
        for (int r = 0; r < kRegs; ++r) o[mb][r] *= unit;
      }
      // m_h and l_h, which swap_finish reads (racecheck orders the score
      // warpgroup's writes before these threads' reads only through this wait).
      ukv_mbar_wait(done, 0);
    }
    ukv_setmaxnreg_dec<kRegsAtEntry>();
    ukv_named_arrive(kRegsBackBarrier, kRoleThreads);
  }
  __syncthreads();
  swap_finish<NH, true>(p, cfg, task, work, smem + L::kQ, L::merge_bar(smem), m_h, l_h, scale_h, value, wg, q, lane,
                        o);
#endif
}

}  // namespace
#endif  // UKV_NVIDIA_KERNELS
