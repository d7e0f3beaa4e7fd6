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
  // FP8 kernels: P double-buffered (kP, then the first half of kX, which
  // their loop does not exchange through), then [2][alpha | m] per head row.
  static constexpr size_t kPBytes = (size_t)kHb * kBK * 2;
  static constexpr size_t kHand = kP + 2 * kPBytes;
  static_assert(kX == kP + kPBytes && kHand + 2 * 2 * kHb * 4 <= kXm, "P's second buffer and the handover fit in kX");
  static constexpr size_t kValid = kXm + (size_t)2 * kThreads * 4; // int [stages][64]
  // u64 mbarriers [4][stages]: TileLoads' (bf16 pools: unused, the gather is
  // cp.async), then the FP8 producer pipeline's ready, empty and (pairs) landed.
  static constexpr size_t kBar = kValid + (size_t)kStages * kBK * 4;
  static constexpr size_t kBytes = kBar + 4 * kStages * 8;
  // Typed views of the carve-outs.
  __device__ __forceinline__ static int* valid(char* smem) { return smem_at<int>(smem, kValid); }
  __device__ __forceinline__ static float* exchange(char* smem) { return smem_at<float>(smem, kX); }
  __device__ __forceinline__ static float* exchange_ml(char* smem) { return smem_at<float>(smem, kXm); }
  __device__ __forceinline__ static float* handover(char* smem) { return smem_at<float>(smem, kHand); }
  __device__ __forceinline__ static uint64_t* bars(char* smem) { return smem_at<uint64_t>(smem, kBar); }
  // The key stages as f32 once every tile is done (partials, exchanges).
  __device__ __forceinline__ static float* drained(char* smem) { return smem_at<float>(smem, kK); }
};

// Producer warpgroups of the FP8 instantiation. One producer warp per
// scheduler left the conversion latency-bound (bench/notes/v32.md: 26% issue
// per producer warp, the consumers waiting on `ready` 30% of the time); two
// give each scheduler a second independent instruction stream.
constexpr int kWgProducerWarpgroups = 2;
constexpr int kWgProducerWarps = 4 * kWgProducerWarpgroups;
// Registers per thread of the FP8 kernel's roles (setmaxnreg): warpgroup 0
// holds S, P and half of O, warpgroup 1 half of O, and the producers the rest.
// At 64 the 64-head kernel's producers spilled 16 bytes whose reloads sat in
// the copy path (and missed L1 behind the FlashMLA scale copies, which go
// through it): at 72 that kernel runs 2.6% faster over a pool, 4.4% over a
// FlashMLA cache (bench/notes/v37.md 37c).
constexpr int kProducerRegs = 72, kQkRegs = 208, kPvRegs = 160;

// Threads of attention_wgmma_kernel: the two consumer warpgroups, and for FP8
// pools the producer warpgroups (threads 256 and up).
__host__ __device__ constexpr int wgmma_threads(bool fp8) {
  return fp8 ? kThreads + 128 * kWgProducerWarpgroups : kThreads;
}

// Named barriers of the FP8 instantiation (bar.sync 0 would wait for the
// producers too).
enum WgBarrier : int {
  kWgConsumers = 1,  // the two consumer warpgroups' 256 threads
  kWgRegsLent = 2,   // the producers gave their registers back (setmaxnreg)
};

#if defined(UKV_HAS_WGMMA)
// The producer warpgroups of attention_wgmma_kernel<true> (bench/notes/v31.md,
// v32.md), which FP8 plans and bf16 plans of large batches run (plan.cu,
// v42.md): they gather each tile's stored rows into an AtomTile stage with
// 16-byte cp.async and dequantize its FP8 rows in place while the consumer
// warpgroups run the MMAs and softmax of the tile before, so neither the
// copies' issue nor the conversion sits on the consumers' path. Each producer
// warp owns a fixed set of keys of every tile: it copies them, waits for its
// own copies, and converts them, so no barrier spans the producer warps. Per
// stage two mbarriers: `ready` (the producers arrive once the stage holds bf16
// rows) and `empty` (the consumers arrive once their PV has read it).
//
// kPair: the two head blocks of a token (128 heads) run as a cluster of two
// blocks, and each converts only half of every tile (keys 32 r .. 32 r + 31 in
// the block of rank r, 4 per producer warp) and also copies its bf16 rows into
// the peer's stage, so every row is gathered and converted once per token
// instead of once per head block. Those copies (bulk copies of a warp's rows,
// send(); the `valid` entries by st.async) complete their bytes on the peer's
// `landed` barrier (one arrival a tile: the peer's own producer announcing
// the bytes), so neither block makes a cluster-scope fence or acquire per
// tile (the per-thread release.cluster arrivals and
// acquire.cluster waits before cost a quarter of the pair's samples,
// bench/notes/v32.md 32b). `empty` also takes one arrival per consumer
// warpgroup of the peer: a producer refills a stage only when the peer's
// consumers are done with it too, because its rows also go into the peer's
// stage.
template <bool kPair>
struct WgProducer {
  static constexpr int kStages = WgSmem::kStages;
  static constexpr int kKeysPerWarp = kPair ? kBK / (2 * kWgProducerWarps) : kBK / kWgProducerWarps;
  static constexpr int kProducerThreads = kWgProducerWarps * UKV_WARP;
  static constexpr int kEmptyArrivals = kPair ? kThreads + kThreads / 128 : kThreads;
  // kPair: what the peer stores into a stage per tile (its half of the rows
  // and of `valid`).
  static constexpr uint32_t kLandedBytes = kBK / 2 * (kD * 2 + 4);
  char* stages;
  int* valid;  // int [kStages][64]: what each key row holds
  // mbarriers [3][kStages]: ready, empty and (kPair) landed, the peer's half
  // of a stage; one pointer, so the producers (at 72 registers) hold one.
  uint64_t* bars;
  int tile_begin, tile_end;
  int rank;  // kPair: this block's rank in the pair

  __device__ __forceinline__ char* tile(int stage) const { return stages + (size_t)stage * AtomTile::kTileBytes; }
  __device__ __forceinline__ uint64_t* ready(int stage) const { return bars + stage; }
  __device__ __forceinline__ uint64_t* empty(int stage) const { return bars + kStages + stage; }
  __device__ __forceinline__ uint64_t* landed(int stage) const { return bars + 2 * kStages + stage; }
  static __device__ __forceinline__ uint32_t parity(int i) { return (uint32_t)(i / kStages) & 1u; }
  // The tile key a producer warp's k-th key is.
  __device__ __forceinline__ int key_of(int warp, int k) const {
    return (kPair ? rank * (kBK / 2) : 0) + warp * kKeysPerWarp + k;
  }

  // Thread 0, before the roles split; a __syncthreads (kPair: a cluster
  // barrier, before any remote arrival) must follow.
  __device__ __forceinline__ void init() const {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) {
        ukv_mbar_init(ready(s), kProducerThreads);
        ukv_mbar_init(empty(s), kEmptyArrivals);
        if constexpr (kPair) ukv_mbar_init(landed(s), 1);
      }
      ukv_mbar_init_fence();
    }
  }

  // Consumers: waits until tile i's stage holds bf16 rows; returns the stage.
  __device__ __forceinline__ int acquire(int i) const {
    const int stage = i % kStages;
    ukv_mbar_wait(ready(stage), parity(i));
    if constexpr (kPair) {
      ukv_mbar_wait(landed(stage), parity(i));
      ukv_fence_async_shared();  // the peer's rows, stored through the generic proxy, before wgmma reads them
    }
    return stage;
  }

  // Consumers, after their PV of `stage`: every thread arrives on this
  // block's barrier (so compute-sanitizer sees each thread's reads of `valid`
  // ordered before the producers rewrite it), and kPair one thread per
  // warpgroup on the peer's (its PV wait covers the warpgroup's MMA, and every
  // consumer read `valid` before the P barrier).
  __device__ __forceinline__ void release(int stage) const {
    ukv_mbar_arrive(empty(stage));
    if constexpr (kPair) ukv_mbar_arrive_cluster_if(empty(stage), rank ^ 1, threadIdx.x % 128 == 64);
  }

  // Warp `warp` copies its keys of a tile into `stage` (`pk`: lane l <
  // kKeysPerWarp holds key key_of(warp, l)). Lanes kLanesPerKey k .. of the
  // warp copy key k, each every kLanesPerKey-th 16-byte chunk: of a bf16 row
  // all 64, of an FP8 row the 32 chunks of its nope bytes (into chunks 0..31,
  // where the conversion reads them) and the 8 rope chunks (56..63), of a
  // FlashMLA token its 28 code chunks, its 8-byte scale slot (into chunk 28,
  // where a pool row has its scale bytes) and the 8 rope chunks. Scaled rows
  // never come here: plan.cu gives their plans the mma.sync kernel. A key
  // without a row is zero-filled, so its P = 0 meets no NaN in PV. Every lane
  // resolves its own addresses: no shuffle per key.
  // kPair: `peer_delta` as in produce().
  __device__ __forceinline__ void issue(const ukv_attention_params& p, PendingKey pk, int stage, int warp, int lane,
                                        uint32_t peer_delta) const {
    constexpr int kLanesPerKey = UKV_WARP / kKeysPerWarp;
    const int k = lane / kLanesPerKey, sub = lane % kLanesPerKey;
    const PendingKey mine{ukv_shfl(pk.raw, k, UKV_WARP), ukv_shfl(pk.source, k, UKV_WARP)};
    // The source chosen by selects, not by a computed parameter index (which
    // copies the parameters to local memory).
    const ukv_kv_source& src = mine.source == 1 ? p.src[1] : p.src[0];
    const bool ok = mine.source >= 0 && mine.raw >= 0 && mine.raw < src.rows;
    int kind = kRowInvalid;
    const char* lo = static_cast<const char*>(p.src[0].kv.data);
    const char* hi = lo;
    int scale_delta = 0;  // FlashMLA: the scale slot's offset from the value slot
    if (ok && src.layout == kLayoutFlashMla) {
      // Chunks 0..27 the 448 codes, 28 the 8-byte scale slot, 56..63 the rope dims.
      kind = kRowFlashMla;
      lo = flashmla_value(src, mine.raw);
      hi = lo + kFlashCodeBytes - kFp8RopeChunk * 16;
      scale_delta = flashmla_scale_delta(src, mine.raw);
    } else if (ok && src.kv.fp8) {
      kind = kRowFp8;
      lo = static_cast<const char*>(src.kv.data) + (int64_t)mine.raw * kFp8NopeBytes;
      hi = static_cast<const char*>(src.kv.rope) + (int64_t)mine.raw * kFp8RopeBytes - kFp8RopeChunk * 16;
    } else if (ok) {
      kind = kRowBf16;
      lo = reinterpret_cast<const char*>(static_cast<const ukv_bf16*>(src.kv.data) + (int64_t)mine.raw * src.kv_stride);
      hi = lo;
    }
    const int key = key_of(warp, k);
    if (sub == 0) {
      int* v = valid + stage * kBK + key;
      *v = kind;
      if constexpr (kPair)
        ukv_st_async4(ukv_smem_addr(v) + peer_delta, (uint32_t)kind, ukv_smem_addr(landed(stage)) + peer_delta);
    }
    // Chunk c = sub + kLanesPerKey i lies in atom column (kLanesPerKey i) / 8
    // at column sub + (kLanesPerKey i) % 8, that XOR the row's swizzle: two
    // column offsets per lane, the rest immediates (kLanesPerKey is 4 or 8).
    static_assert(kLanesPerKey == 4 || kLanesPerKey == 8, "a key's lanes cover whole 8-chunk columns");
    char* row = tile(stage) + (uint32_t)key * 128u;
    const uint32_t swizzle = (uint32_t)key & 7u;
    const uint32_t col0 = ((uint32_t)sub ^ swizzle) << 4, col4 = (((uint32_t)sub + 4u) ^ swizzle) << 4;
    const bool fill = kind != kRowInvalid;
    // An FP8 row's chunks from copy_end (32 for a pool row, 28 for a FlashMLA
    // token) up to the rope chunks are written by the conversion, not copied.
    // The test is per key for whole lane groups inside that gap and per lane
    // only for the group that straddles 28: the producers are issue-bound, so
    // the loop keeps the instruction count of pool-only code (bench/notes/v33.md).
    const bool fp8 = fp8_in_place(kind);
    const int copy_end = kind == kRowFlashMla ? kFlashCodeBytes / 16 : kFp8NopeBytes / 16;
    if (kind == kRowFlashMla && sub == kFlashCodeBytes / 16 % kLanesPerKey) {
      // The 8-byte scale slot into chunk 28, where a pool row has its scale bytes.
      constexpr uint32_t c = kFlashCodeBytes / 16;
      ukv_cp_async8(row + (c >> 3) * AtomTile::kAtomBytes + (((c & 7u) ^ swizzle) << 4), lo + scale_delta);
    }
#pragma unroll
    for (int i = 0; i < kChunks / kLanesPerKey; ++i) {
      const int first = kLanesPerKey * i;  // the chunk of lane sub = 0
      const bool whole = first + kLanesPerKey <= kFlashCodeBytes / 16 || first >= kFp8RopeChunk;
      const bool gap = first >= kFp8NopeBytes / 16;
      if (whole || (gap ? !fp8 : !fp8 || first + sub < copy_end))
        ukv_cp_async16(row + (first >> 3) * AtomTile::kAtomBytes + ((first & 7) != 0 ? col4 : col0),
                       (first < kFp8NopeBytes / 16 ? lo + sub * 16 : hi + sub * 16) + first * 16, fill);
    }
    ukv_cp_async_commit();
  }

  // kPair: the warp's converted rows into the same place of the peer's
  // stage. Its kKeysPerWarp rows are consecutive, so in each of the 8 atom
  // columns they are one run of kKeysPerWarp 128-byte lines: 8 bulk copies
  // carry them (converted codes, rope, bf16 or zero-filled rows alike), where
  // per-chunk st.async took 2 instructions per converted chunk and lane
  // (bench/notes/v48.md). Every lane's generic stores and landed copies are
  // fenced for the async proxy before the warp barrier; lane 0 issues.
  __device__ __forceinline__ void send(int stage, int warp, int lane, uint32_t peer_delta, uint32_t bar) const {
    ukv_fence_async_shared();
    ukv_syncwarp();
    if (lane == 0) {
      const char* rows = tile(stage) + (uint32_t)key_of(warp, 0) * 128u;
#pragma unroll
      for (int column = 0; column < 8; ++column) {
        const char* src = rows + column * AtomTile::kAtomBytes;
        ukv_bulk_copy_to_peer(ukv_smem_addr(src) + peer_delta, src, kKeysPerWarp * 128u, bar);
      }
    }
  }

  // kPair: one producer thread announces the peer's bytes of tile i (issued
  // once the stage's tile before was released, so the phase is tile i's).
  __device__ __forceinline__ void expect_peer(int stage, int warp, int lane) const {
    if (kPair && warp == 0 && lane == 0) ukv_mbar_arrive_expect(landed(stage), kLandedBytes);
  }

  // The producer warpgroup's whole share of the block. Both stages are filled
  // at once; then tile i is converted as soon as its copies land, and tile
  // i + 1 goes into the stage of tile i - 1 once the consumers release it, so
  // a tile's copies overlap the consumers' work on the tile before.
  __device__ __forceinline__ void produce(const ukv_attention_params& p, const TokenKeys& keys) const {
    const int lane = threadIdx.x % UKV_WARP, warp = threadIdx.x / UKV_WARP - kWarps;
    const auto fetch = [&](int tile) {
      return lane < kKeysPerWarp ? fetch_key(keys, tile * kBK + key_of(warp, lane)) : PendingKey{-1, -1};
    };
    const ukv_fp8_format fmt = (ukv_fp8_format)p.src[0].kv.fp8_format;
    // Whether a source holds FP8 rows (every FP8 layout sets kv.fp8, as the
    // gathers assume): calls over bf16 rows only (bf16 plans of large
    // batches, plan.cu) skip the conversion rounds, which would only load,
    // vote and return for every row, on issue-bound warps. A test of the
    // arguments, not of each tile's rows: a ballot of the rows a tile holds
    // made FP8 calls 1.4-3.5% slower (bench/notes/v43.md 43b).
    const bool convert = p.src[0].kv.fp8 != 0 || (p.num_sources > 1 && p.src[1].kv.fp8 != 0);
    const int n = tile_end - tile_begin;
    const PendingKey first = fetch(tile_begin), second = fetch(tile_begin + 1);
    // kPair: how far the peer's copy of a shared-memory byte lies from it in
    // the shared::cluster window (the same offset in the peer block).
    const uint32_t peer_delta = kPair ? ukv_cluster_smem_addr(stages, rank ^ 1) - ukv_smem_addr(stages) : 0u;
    if (n > 0) {
      issue(p, first, 0, warp, lane, peer_delta);
      expect_peer(0, warp, lane);
    }
    if (n > 1) {
      issue(p, second, 1, warp, lane, peer_delta);
      expect_peer(1, warp, lane);
    }
    PendingKey next = fetch(tile_begin + 2);
    for (int i = 0; i < n; ++i) {
      const int stage = i % kStages;
      if (i == 0 && n > 1) {
        ukv_cp_async_wait<1>();
      } else {
        ukv_cp_async_wait<0>();
      }
      ukv_syncwarp();  // the warp's copies, landed per thread, before any lane reads them
      const uint32_t peer_bar = kPair ? ukv_smem_addr(landed(stage)) + peer_delta : 0u;
#pragma unroll 1
      for (int round = 0; convert && round < kKeysPerWarp / kJobRows; ++round)
        dequantize_jobs(tile(stage), valid + stage * kBK, fmt, key_of(warp, round * kJobRows));
      if constexpr (kPair)
        send(stage, warp, lane, peer_delta, peer_bar);  // which fences the stores for wgmma too
      else
        ukv_fence_async_shared();  // generic writes before the consumers' wgmma read them
      ukv_mbar_arrive(ready(stage));
      if (i >= 1 && i + 1 < n) {
        ukv_mbar_wait(empty((i - 1) % kStages), parity(i - 1));
        issue(p, next, (i + 1) % kStages, warp, lane, peer_delta);
        expect_peer((i + 1) % kStages, warp, lane);
        next = fetch(tile_begin + i + 2);
      }
    }
  }
};

#endif  // UKV_HAS_WGMMA

// The body of attention_wgmma_kernel and attention_wgmma_pair_kernel
// (instances/wgmma_pair.cu).
template <bool kFp8, bool kPair>
__device__ __forceinline__ void wgmma_attention(const ukv_attention_params& p, const SplitConfig& cfg) {
#if defined(UKV_HAS_WGMMA)
  static_assert(kFp8 || !kPair, "pairs share converted FP8 rows");
  constexpr int kHb = WgSmem::kHb;
  extern __shared__ __align__(1024) char smem[];
  // The pair keeps the grid's order: its cluster is blocks (t, 0) and (t, 1).
  const BlockTask task = kPair ? BlockTask{(int)blockIdx.x, (int)blockIdx.y} : token_major_block();
  const int t = task.t, hb = task.hb;
  const int split = blockIdx.z;
  const int h0 = hb * kHb;
  const int tid = threadIdx.x, lane = tid % UKV_WARP, warpgroup = tid / 128, wq = (tid / UKV_WARP) % 4;
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

  // Consumer barriers: the consumer warpgroups (bf16: the whole block), each
  // running its own copy of the consumer code, hence the non-aligned form
  // (__syncthreads is bar.sync.aligned, which every thread must reach at the
  // same instruction: synccheck reported the bf16 kernel's per-warpgroup copies).
  const auto consumers_sync = [] { ukv_named_sync_unaligned(kWgConsumers, kThreads); };
  TileLoads<WgSmem::kStages, AtomTile, false> loads{smem + WgSmem::kK, valid_s, WgSmem::bars(smem), tile_begin,
                                                    tile_end};
  uint64_t* bars = WgSmem::bars(smem);
  const WgProducer<kPair> producer{smem + WgSmem::kK,
                                   valid_s,
                                   bars + WgSmem::kStages,
                                   tile_begin,
                                   tile_end,
                                   kPair ? ukv_cluster_rank() : 0};
  if constexpr (kFp8) {
    producer.init();
  } else {
    loads.init();
  }
  if constexpr (kPair) {
    ukv_cluster_sync();  // both blocks' barriers initialized before any remote arrival
  } else {
    __syncthreads();
  }
  if constexpr (kFp8) {
    static_assert(WgProducer<kPair>::kProducerThreads * kProducerRegs + 128 * (kQkRegs + kPvRegs) <= 65536,
                  "the roles' registers fit the SM");
    if (tid >= kThreads) {
      ukv_setmaxnreg_dec<kProducerRegs>();
      ukv_named_arrive(kWgRegsLent, wgmma_threads(true));
      producer.produce(p, keys);
      if constexpr (kPair) {
        ukv_cluster_sync();  // see the consumers' last barrier
        return;
      }
      // The cluster merge's two barriers span every thread of the cluster.
      if (!direct && cfg.cluster != 0) {
        ukv_cluster_sync();
        ukv_cluster_sync_exit();
      }
      return;
    }
    ukv_named_sync(kWgRegsLent, wgmma_threads(true));
  }

  // The consumers, compiled once per warpgroup (`wg` a constant): FP8 kernels
  // give each its own register count, which ptxas honours only in code that
  // one warpgroup alone runs (shared code takes the smaller count and spills).
  const auto consumers = [&](auto wg_constant) {
    constexpr int wg = decltype(wg_constant)::value;

    float m_run[2] = {-INFINITY, -INFINITY};
    float l_run[2] = {0.f, 0.f};  // this thread's columns only; reduced at the end
    float o[2][64];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 64; ++i) o[h][i] = 0.f;

    if (tile_begin < tile_end) load_q<AtomTile, kHb>(p, t, h0, smem + WgSmem::kQ);
    if constexpr (kFp8) {
      ukv_cp_async_commit();
      ukv_cp_async_wait<0>();
      ukv_fence_async_shared();  // the query rows (cp.async) before wgmma reads them
      consumers_sync();
    } else {
      loads.start(p, keys);
    }
    const float qk_scale = p.softmax_scale * kLog2e;

    // P = 2^(x - base) of this thread's scores x (fragment columns col_of(j)),
    // rounded to bf16 and stored into the tile's P; the row sums add the
    // rounded values.
    const auto exp_store_p = [&](const auto& x, const float* base, char* pt, float* sum, auto col_of) {
      constexpr int kN = sizeof(x) / sizeof(x[0]);
#pragma unroll
      for (int j = 0; j < kN; j += 2) {
        const int r = (j >> 1) & 1;
        const ukv_bf16 p0 = ukv_float_to_bf16(exp2f(x[j] - base[r]));
        const ukv_bf16 p1 = ukv_float_to_bf16(exp2f(x[j + 1] - base[r]));
        sum[r] += ukv_bf16_to_float(p0) + ukv_bf16_to_float(p1);
        const int col = col_of(j), row = row0 + 8 * r;
        const uint32_t packed = ukv_pack_bf16x2(ukv_bf16_to_float(p0), ukv_bf16_to_float(p1));
        *reinterpret_cast<uint32_t*>(pt + row * 128 + ((((col >> 3) ^ (row & 7))) << 4) + (col & 7) * 2) = packed;
      }
    };
    // S = Q . K^T over k-steps first .. first + steps - 1 (16 dims = 32 bytes
  // inside a 128-byte atom column each), waited for.
  const auto qk = [&](float(&s)[32], const char* ks, int first, int steps) {
#pragma unroll
    for (int j = 0; j < 32; ++j) s[j] = 0.f;
    ukv_wgmma_fence();
#pragma unroll
    for (int j = 0; j < steps; ++j) {
      const int kstep = first + j;
      const uint32_t off = (uint32_t)(kstep >> 2) * AtomTile::kAtomBytes + (uint32_t)(kstep & 3) * 32u;
      ukv_wgmma_m64n64k16(s, ukv_wgmma_desc(smem + WgSmem::kQ + off, 16, 1024), ukv_wgmma_desc(ks + off, 16, 1024), 1);
    }
    ukv_wgmma_commit();
    ukv_wgmma_wait<0>();
    ukv_wgmma_fence_regs(s);
  };
  // The running max moves to m_new: the factor the old state scales by, and
    // the exponent base of the new scores.
    const auto advance_max = [&](int r, float m_new, float* alpha, float* base) {
      base[r] = m_new == -INFINITY ? 0.f : m_new;
      alpha[r] = exp2f(m_run[r] - base[r]);
      m_run[r] = m_new;
    };

    for (int tile = tile_begin; tile < tile_end; ++tile) {
      const int i = tile - tile_begin;
      int stage;
      const char* ks;
      // FP8: P and the rescale factors are double-buffered by tile parity.
      char* pt = kFp8 ? ps + (i & 1) * WgSmem::kPBytes : ps;
      float alpha[2];
      if constexpr (kFp8) {
        // Warpgroup 0 runs QK over all 512 dims and the softmax, warpgroup 1
        // only its half of PV, so warpgroup 1's PV of tile i overlaps warpgroup
        // 0's QK of tile i + 1 (bench/notes/v36.md 36d). One barrier of both per
        // tile hands P, alpha and m over; warpgroup 0 passes it only once
        // warpgroup 1 finished tile i - 1, so the other buffer is free.
        stage = producer.acquire(i);
        ks = producer.tile(stage);
        float* hand = WgSmem::handover(smem) + (i & 1) * 2 * kHb;  // [alpha | m] per head row
        if (wg == 0) {
          float s[32];
          qk(s, ks, 0, 32);
          const int* valid = valid_s + stage * kBK;
          float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
          for (int j = 0; j < 32; ++j) {
            const int col = 8 * (j / 4) + 2 * tq + (j & 1);
            s[j] = valid[col] != 0 ? s[j] * qk_scale : -INFINITY;
            mx[(j >> 1) & 1] = fmaxf(mx[(j >> 1) & 1], s[j]);
          }
          float base[2], sum[2] = {0.f, 0.f};
#pragma unroll
          for (int r = 0; r < 2; ++r) advance_max(r, fmaxf(m_run[r], ukv_xor_max<1, 2>(mx[r])), alpha, base);
          exp_store_p(s, base, pt, sum, [&](int j) { return 8 * (j / 4) + 2 * tq; });
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            l_run[r] = l_run[r] * alpha[r] + sum[r];
            if (tq == 0) {
              hand[row0 + 8 * r] = alpha[r];
              hand[kHb + row0 + 8 * r] = m_run[r];
            }
          }
          ukv_fence_async_shared();
        }
        consumers_sync();
        if (wg == 1) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            alpha[r] = hand[row0 + 8 * r];
            m_run[r] = hand[kHb + row0 + 8 * r];
          }
        }
      } else {
        stage = loads.advance(p, keys, tile);
        ukv_fence_async_shared();  // the query rows (cp.async) before wgmma reads them
        consumers_sync();
        ks = loads.tile(stage);

        // QK over this warpgroup's half of the dims.
        float s[32];
        qk(s, ks, wg * 16, 16);

        // Exchange: warpgroup w keeps key blocks 4w..4w+3 (fragment regs 16w..16w+15)
        // and hands the other half to its partner.
        float x[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          xs[j * kThreads + tid] = wg == 0 ? s[16 + j] : s[j];
          x[j] = wg == 0 ? s[j] : s[16 + j];
        }
        consumers_sync();
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
        consumers_sync();
        float base[2], sum[2] = {0.f, 0.f};
#pragma unroll
        for (int r = 0; r < 2; ++r) advance_max(r, fmaxf(m_run[r], fmaxf(mx[r], xm[r * kThreads + partner])), alpha, base);
        exp_store_p(x, base, pt, sum, [&](int j) { return 8 * (4 * wg + j / 4) + 2 * tq; });
#pragma unroll
        for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + sum[r];
        ukv_fence_async_shared();
        consumers_sync();
      }

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
        const uint64_t da = ukv_wgmma_desc(pt + k * 32, 16, 1024);
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
      if constexpr (kFp8) {
        // The stage goes back to the producers; P and the exchange buffers are
        // rewritten only past the next tile's first barrier.
        producer.release(stage);
      } else {
        consumers_sync();  // the stage, P and the exchange buffers are rewritten next tile
      }
    }

    // Row sums: the quad's columns, then the partner warpgroup's (same order in
    // both warpgroups, so they agree bit for bit).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_run[r] = ukv_xor_sum<1, 2>(l_run[r]);
      xm[r * kThreads + tid] = l_run[r];
    }
    consumers_sync();
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
      merge_in_cluster<kHb>(p, t, h0, cut.count, split, cfg.splits, m_s, l_s, acc_s);
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
  };
  if (warpgroup == 0) {
    // FP8: warpgroup 0 holds S, P and its half of O; warpgroup 1 only its
    // half of O, so the producers get the rest.
    if constexpr (kFp8) ukv_setmaxnreg_inc<kQkRegs>();
    consumers(std::integral_constant<int, 0>{});
  } else {
    if constexpr (kFp8) ukv_setmaxnreg_inc<kPvRegs>();
    consumers(std::integral_constant<int, 1>{});
  }
  if constexpr (kPair) {
    // No block of the pair exits while its peer may still store into its
    // shared memory or arrive on its barriers.
    ukv_cluster_sync();
  }
#else
  (void)p;
  (void)cfg;
#endif
}

template <bool kFp8>
__global__ void __launch_bounds__(wgmma_threads(kFp8), 1) attention_wgmma_kernel(ukv_attention_params p, SplitConfig cfg) {
  wgmma_attention<kFp8, false>(p, cfg);
}

}  // namespace
#endif  // UKV_NVIDIA_KERNELS
