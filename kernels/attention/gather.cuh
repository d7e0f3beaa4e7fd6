// Tile layouts in shared memory and the gather pipelines of the NVIDIA
// kernels: TileLoads (bulk copies or cp.async into bf16 tiles, FP8 rows
// dequantized in place), ProducerPipeline (producer warps gather and
// dequantize for the 16/32-head kernels) and RawPipeline (stored FP8 rows for
// the raw variant); load_q loads a block's query rows.
#pragma once

#include "common.cuh"

namespace {

#if defined(UKV_NVIDIA_KERNELS)
// Tile layouts in shared memory: where 16-byte chunk `c` of row `r` lives.
// RowTile: 1024-byte rows, chunks XOR-swizzled by r & 7 so the 8 rows an
// ldmatrix reads hit distinct banks (queries of the mma.sync kernels).
struct RowTile {
  __device__ __forceinline__ static uint32_t at(int r, int c) { return row_chunk(r, c); }
};
// PadTile: key tiles of the mma.sync kernels. Rows stay contiguous (one bulk
// copy each) and 16 bytes of padding per row shift consecutive rows by four
// banks, so ldmatrix reads are conflict-free without a swizzle.
struct PadTile {
  static constexpr bool kContiguousRows = true;
  static constexpr uint32_t kRowBytes = kD * 2 + 16;
  static constexpr size_t kTileBytes = (size_t)kBK * kRowBytes;
  __device__ __forceinline__ static uint32_t at(int r, int c) { return (uint32_t)r * kRowBytes + (uint32_t)c * 16u; }
};
#if defined(UKV_HAS_WGMMA)
// AtomTile: the 128-byte-swizzle layout of 64-row tiles that wgmma reads
// through a descriptor: 8 column atoms of 64 rows x 128 bytes (64 elements),
// each row's chunks XOR-swizzled by r & 7. The same bytes serve as a K-major
// operand (rows = keys or heads, k = dims) and as an MN-major one (k = keys,
// n = dims).
struct AtomTile {
  static constexpr bool kContiguousRows = false;
  static constexpr uint32_t kAtomBytes = 64 * 128;
  static constexpr size_t kTileBytes = (size_t)kBK * kD * 2;
  __device__ __forceinline__ static uint32_t at(int r, int c) {
    return (uint32_t)(c >> 3) * kAtomBytes + (uint32_t)r * 128u + (uint32_t)(((c & 7) ^ (r & 7)) << 4);
  }
};
#endif

#if defined(UKV_HAS_BULK_COPY)
constexpr bool kHasBulkCopy = true;
#else
constexpr bool kHasBulkCopy = false;
#endif
#endif  // UKV_NVIDIA_KERNELS

#if defined(UKV_NVIDIA_KERNELS)
// Dequantizes in place the FP8 rows among rows row0 + step * k (k < kRows) of
// a landed tile, by one warp. A nope row is 56 pieces of 8 codes; lane l takes
// pieces l and 32 + l (l < 24), their scale bytes (the first copy of s_j at
// byte 448 + 2j), and writes bf16 chunks l and 32 + l: 8-byte reads and
// 16-byte writes at consecutive addresses, free of bank conflicts. Every lane
// reads its pieces of all kRows rows before any lane writes (the bf16 chunks
// overwrite the raw bytes; a warp vote orders no memory, so a __syncwarp
// separates the two: without it racecheck reports hazards). When every piece
// of the round takes the integer
// path (one warp vote) the round is branch-free, so the pieces' loads and
// arithmetic overlap; otherwise each piece picks its path. The rope chunks
// landed in place. The values are exact (an e4m3 value times a power of two
// fits bf16 unless it is subnormal, i.e. for scale bytes below 10, which no
// store writes), so the tile holds what src/cache_layouts/unified.rs
// dequantize_row gives.
// Dequantizes in place scaled row r of a landed tile (docs/fp8.md §8), by one
// warp: its 512 codes in chunks 0..31 and 8 fp32 scales in chunks 32..33
// become 64 bf16 chunks. Lane l reads pieces l and 32 + l (8 codes each)
// and their scales before any lane writes, then writes chunks l and 32 + l.
template <class Layout>
__device__ __forceinline__ void dequantize_scaled_row(char* tile, int r, ukv_fp8_format fmt) {
  const int lane = threadIdx.x % UKV_WARP;
  const uint2 lo = *reinterpret_cast<const uint2*>(tile + Layout::at(r, lane / 2) + 8 * (lane % 2));
  const uint2 hi = *reinterpret_cast<const uint2*>(tile + Layout::at(r, 16 + lane / 2) + 8 * (lane % 2));
  // Scale j (dims 64j..64j+63) is float j % 4 of chunk 32 + j / 4.
  const int j_lo = lane / 8, j_hi = 4 + lane / 8;
  const float s_lo = *reinterpret_cast<const float*>(tile + Layout::at(r, 32 + j_lo / 4) + 4 * (j_lo % 4));
  const float s_hi = *reinterpret_cast<const float*>(tile + Layout::at(r, 32 + j_hi / 4) + 4 * (j_hi % 4));
  ukv_syncwarp();
  dequantize_scaled_piece(lo, s_lo, fmt, tile + Layout::at(r, lane));
  dequantize_scaled_piece(hi, s_hi, fmt, tile + Layout::at(r, UKV_WARP + lane));
  ukv_syncwarp();  // before the next row's reads
}

template <class Layout, int kRows>
__device__ __forceinline__ void dequantize_rows(char* tile, const int* valid, ukv_fp8_format fmt, int row0, int step) {
  constexpr int kPieces = 56, kScaleChunk = 28;
  const int lane = threadIdx.x % UKV_WARP;
  // Scaled rows first, each on its own (valid[r] is the same for the warp).
#pragma unroll 1
  for (int k = 0; k < kRows; ++k)
    if (valid[row0 + step * k] == kRowScaled) dequantize_scaled_row<Layout>(tile, row0 + step * k, fmt);
  const bool second = lane < kPieces - UKV_WARP;  // lanes past it repeat piece 32 + 23 (read, never written)
  const int hi_lane = second ? lane : kPieces - UKV_WARP - 1;
  uint2 lo[kRows], hi[kRows];
  uint32_t s_lo[kRows], s_hi[kRows];
  bool fp8[kRows];
  bool fast = fmt == UKV_FP8_E4M3FN;
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    // Every row's bytes are read (in bounds whatever the row holds); only FP8
    // rows are written.
    const int r = row0 + step * k;
    const int kind = valid[r];
    fp8[k] = fp8_in_place(kind);
    lo[k] = *reinterpret_cast<const uint2*>(tile + Layout::at(r, lane / 2) + 8 * (lane % 2));
    hi[k] = *reinterpret_cast<const uint2*>(tile + Layout::at(r, 16 + hi_lane / 2) + 8 * (hi_lane % 2));
    const uint4 scales = *reinterpret_cast<const uint4*>(tile + Layout::at(r, kScaleChunk));
    s_lo[k] = row_scale(scales, kind, lane / 8);
    s_hi[k] = row_scale(scales, kind, 4 + hi_lane / 8);
  }
  // Every raw piece is read before any lane writes (the warp vote below is no
  // memory barrier); then one flag, without a branch per piece.
  ukv_syncwarp();
#pragma unroll
  for (int k = 0; k < kRows; ++k) fast &= !fp8[k] | (fp8_fast_path(lo[k], s_lo[k]) & fp8_fast_path(hi[k], s_hi[k]));
  const bool all_fast = ukv_warp_all(fast);
  if (all_fast) {
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int r = row0 + step * k;
      const uint4 a = dequantize_fast(lo[k], s_lo[k]), b = dequantize_fast(hi[k], s_hi[k]);
      if (fp8[k]) *reinterpret_cast<uint4*>(tile + Layout::at(r, lane)) = a;
      if (fp8[k] && second) *reinterpret_cast<uint4*>(tile + Layout::at(r, UKV_WARP + lane)) = b;
    }
    return;
  }
#pragma unroll  // registers, not a local-memory array, hold the pieces
  for (int k = 0; k < kRows; ++k) {
    if (!fp8[k]) continue;
    const int r = row0 + step * k;
    dequantize_piece(lo[k], s_lo[k], fmt, tile + Layout::at(r, lane));
    if (second) dequantize_piece(hi[k], s_hi[k], fmt, tile + Layout::at(r, UKV_WARP + lane));
  }
}

#if defined(UKV_HAS_WGMMA)
// dequantize_rows for the wgmma producers (AtomTile stages): a round of rows
// row0 .. row0 + kJobRows - 1, one warp, one job per lane: a job is two
// consecutive 16-byte code chunks of one row under one scale byte (half a
// 64-code block), converted into four bf16 chunks, so its row, swizzle and
// scale are worked out once per 32 codes. Lane l < 28 takes job l. Same
// ordering as dequantize_rows: every lane reads its chunks before any lane
// writes (the bf16 chunks overwrite raw ones), and one warp vote picks the
// branch-free path for the whole round.
constexpr int kJobRows = 2;
__device__ __forceinline__ void dequantize_jobs(char* tile, const int* valid, ukv_fp8_format fmt, int row0) {
  constexpr int kJobChunks = 2, kCodeChunks = 28, kScaleChunk = 28;
  constexpr int kJobsPerRow = kCodeChunks / kJobChunks;
  static_assert(kJobRows * kJobsPerRow <= UKV_WARP, "one job per lane");
  const int lane = threadIdx.x % UKV_WARP;
  const bool mine = lane < kJobRows * kJobsPerRow;  // lanes past the last job read that job (in bounds), never write
  const int job = mine ? lane : kJobRows * kJobsPerRow - 1;
  const int r = row0 + job / kJobsPerRow, first = kJobChunks * (job % kJobsPerRow);
  const int kind = valid[r];
  const bool fp8 = mine && fp8_in_place(kind);
  char* row = tile + (uint32_t)r * 128u;
  const uint32_t swizzle = (uint32_t)r & 7u;
  const auto chunk = [&](int c) { return row + (uint32_t)(c >> 3) * AtomTile::kAtomBytes + ((((uint32_t)c & 7u) ^ swizzle) << 4); };
  // Store order. A job's bf16 chunks lie in atom column first / 4, and atom
  // columns are 8 KB apart, so the same store of every job of a row hits the
  // same banks: in a warp's store the jobs of all 7 atom columns meet in one
  // quarter-pair of the banks, 7 wavefronts for 448 bytes (bench/notes/v41.md).
  // Jobs in odd atom columns convert their second code chunk first, which
  // puts them in the other banks: 4 wavefronts.
  const int flip = (first >> 2) & 1;
  // The code chunk raw[q] holds.
  const auto code_chunk = [&](int q) { return first + (q ^ flip); };
  uint4 raw[kJobChunks];
#pragma unroll
  for (int q = 0; q < kJobChunks; ++q) raw[q] = *reinterpret_cast<const uint4*>(chunk(code_chunk(q)));
  // The row's whole scale chunk, loaded beside the codes (row_scale).
  const uint32_t s = row_scale(*reinterpret_cast<const uint4*>(chunk(kScaleChunk)), kind, first / 4);
  ukv_syncwarp();  // every raw chunk read before any lane writes
  bool fast = fmt == UKV_FP8_E4M3FN;
#pragma unroll
  for (int q = 0; q < kJobChunks; ++q) fast &= fp8_fast_path16(raw[q], s);
  const bool all_fast = ukv_warp_all(!fp8 || fast);
  if (!fp8) return;
#pragma unroll
  for (int q = 0; q < kJobChunks; ++q) {
    char* dst0 = chunk(2 * code_chunk(q));
    char* dst1 = chunk(2 * code_chunk(q) + 1);
    if (all_fast) {
      uint4 a, b;
      dequantize_fast16(raw[q], s, a, b);
      *reinterpret_cast<uint4*>(dst0) = a;
      *reinterpret_cast<uint4*>(dst1) = b;
    } else {
      dequantize_piece(make_uint2(raw[q].x, raw[q].y), s, fmt, dst0);
      dequantize_piece(make_uint2(raw[q].z, raw[q].w), s, fmt, dst1);
    }
  }
}
#endif

// Gathers 64-key tiles into kStages stages of `Layout`.
//  - Bulk (sm_90+, contiguous rows): lanes 0..7 of warp w copy keys 8w..8w+7,
//    one 1 KB bulk copy (cp.async.bulk) each, completing on the stage's
//    mbarrier. Measured (bench/probes/gather.cu): 87 GB/s per SM from 8 warps
//    against 34 for 16-byte cp.async; 3.9 TB/s over 132 SMs against 2.2.
//  - cp.async (elsewhere, or the swizzled wgmma layout): lanes 0..15 of warp w
//    resolve key 4l + w/2 and the two warps of a key copy its two halves in
//    16-byte pieces; one commit group per tile.
// kFp8: the kernel serves an FP8 pool (its instantiations for bf16 pools carry
// no FP8 code, so their registers and schedules are as before).
template <int kStages, class Layout, bool kFp8>
struct TileLoads {
  static constexpr bool kBulk = kHasBulkCopy && Layout::kContiguousRows;
  char* stages;    // kStages tiles
  int* valid;      // int [kStages][64]: key valid
  uint64_t* bars;  // mbarrier per stage (bulk copies)
  int tile_begin, tile_end;
  PendingKey pending{-1, -1};  // this lane's key of the next tile to issue

  __device__ __forceinline__ char* tile(int stage) const { return stages + (size_t)stage * Layout::kTileBytes; }

  // Before the first issue; a __syncthreads must follow.
  __device__ __forceinline__ void init() const {
    if (kBulk && threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) ukv_mbar_init(&bars[s], kBK);  // one arrival per key
      ukv_mbar_init_fence();
    }
  }

  __device__ __forceinline__ int key_of_lane() const {
    const int lane = threadIdx.x % UKV_WARP, warp = threadIdx.x / UKV_WARP;
    if (kBulk) return lane < kBK / kWarps ? warp * (kBK / kWarps) + lane : -1;
    return lane < kBK / 4 ? lane * 4 + (warp >> 1) : -1;
  }

  // This lane's key of `tile` (see PendingKey: fetched a tile ahead).
  __device__ __forceinline__ PendingKey fetch(const TokenKeys& k, int tile) const {
    const int key = key_of_lane();
    return key >= 0 ? fetch_key(k, tile * kBK + key) : PendingKey{-1, -1};
  }

  // Bulk gathers: one key's row (one arrival on the stage's mbarrier).
  __device__ __forceinline__ void issue_row(const ukv_attention_params& p, PendingKey pk, int stage, int key) const {
    char* dst = tile(stage);
    char* row = dst + Layout::at(key, 0);
    const bool ok = key_valid(p, pk);
    const ukv_kv_source& src = p.src[ok ? pk.source : 0];
    const bool fp8 = kFp8 && src.kv.fp8;
    const int layout = kFp8 && ok ? src.layout : kLayoutPool;
    valid[stage * kBK + key] = !ok    ? kRowInvalid
                               : !fp8 ? kRowBf16
                               : layout == kLayoutFlashMla ? kRowFlashMla
                               : layout == kLayoutScaled   ? kRowScaled
                                                           : kRowFp8;
    if (layout == kLayoutFlashMla) {
      // The scale slot (8 bytes, not a bulk copy's 16) read here and stored
      // where dequantize_rows looks for a FlashMLA token's scales.
      const char* value = flashmla_value(src, pk.raw);
      *reinterpret_cast<uint2*>(dst + Layout::at(key, kFlashCodeBytes / 16)) =
          *reinterpret_cast<const uint2*>(value + flashmla_scale_delta(src, pk.raw));
      ukv_fence_async_shared();  // before a later bulk copy into this row
      ukv_mbar_arrive_expect(&bars[stage], kFlashValueBytes);
      ukv_bulk_copy(row, value, kFlashCodeBytes, &bars[stage]);
      ukv_bulk_copy(dst + Layout::at(key, kFp8RopeChunk), value + kFlashCodeBytes, kFp8RopeBytes, &bars[stage]);
    } else if (layout == kLayoutScaled) {
      ukv_mbar_arrive_expect(&bars[stage], kScaledCodeBytes + kScaledScaleBytes);
      ukv_bulk_copy(row, scaled_codes(src, pk.raw), kScaledCodeBytes, &bars[stage]);
      ukv_bulk_copy(dst + Layout::at(key, kScaledCodeBytes / 16), scaled_scales(src, pk.raw), kScaledScaleBytes,
                    &bars[stage]);
    } else if (ok && fp8) {
      ukv_mbar_arrive_expect(&bars[stage], kFp8NopeBytes + kFp8RopeBytes);
      ukv_bulk_copy(row, static_cast<const char*>(src.kv.data) + (int64_t)pk.raw * kFp8NopeBytes, kFp8NopeBytes,
                    &bars[stage]);
      ukv_bulk_copy(dst + Layout::at(key, kFp8RopeChunk),
                    static_cast<const char*>(src.kv.rope) + (int64_t)pk.raw * kFp8RopeBytes, kFp8RopeBytes,
                    &bars[stage]);
    } else if (ok) {
      ukv_mbar_arrive_expect(&bars[stage], kD * 2);
      ukv_bulk_copy(row, static_cast<const ukv_bf16*>(src.kv.data) + (int64_t)pk.raw * src.kv_stride, kD * 2,
                    &bars[stage]);
    } else {
      for (int c = 0; c < kChunks; ++c) *reinterpret_cast<uint4*>(row + c * 16) = make_uint4(0, 0, 0, 0);
      ukv_fence_async_shared();  // before a later bulk copy into this row
      ukv_mbar_arrive(&bars[stage]);
    }
  }

  __device__ __forceinline__ void issue(const ukv_attention_params& p, PendingKey pk, int stage) const {
    const int lane = threadIdx.x % UKV_WARP, warp = threadIdx.x / UKV_WARP;
    char* dst = tile(stage);
    const int key = key_of_lane();
    if (kBulk) {
      if (key >= 0) issue_row(p, pk, stage, key);
      return;
    }
    const bool ok = key_valid(p, pk);
    // Which 32 chunks of the row this warp copies: half 0 the first 512 bytes
    // (of a bf16 row, or an FP8 nope row), half 1 the rest (of an FP8 row only
    // the rope chunks 56..63).
    const int half = warp & 1;
    const char* lane_base = static_cast<const char*>(p.src[0].kv.data);
    int kind = kRowInvalid;
    int scale_delta = 0;  // FlashMLA: the scale slot's offset from the value slot
    if (ok) {
      const ukv_kv_source& src = p.src[pk.source];
      if (kFp8 && src.layout == kLayoutFlashMla) {
        // Half 0: the 448 codes (chunks 0..27) and the scale slot (chunk 28);
        // half 1: the rope dims (chunks 56..63).
        kind = kRowFlashMla;
        const char* value = flashmla_value(src, pk.raw);
        lane_base = half == 0 ? value : value + kFlashCodeBytes - kFp8RopeChunk * 16;
        scale_delta = flashmla_scale_delta(src, pk.raw);
      } else if (kFp8 && src.layout == kLayoutScaled) {
        // Half 0: the 512 codes; half 1: the 32 scale bytes (chunks 32..33).
        kind = kRowScaled;
        lane_base = half == 0 ? scaled_codes(src, pk.raw)
                              : reinterpret_cast<const char*>(scaled_scales(src, pk.raw)) - kScaledCodeBytes;
      } else if (kFp8 && src.kv.fp8) {
        kind = kRowFp8;
        lane_base = half == 0 ? static_cast<const char*>(src.kv.data) + (int64_t)pk.raw * kFp8NopeBytes
                              : static_cast<const char*>(src.kv.rope) + (int64_t)pk.raw * kFp8RopeBytes -
                                    kFp8RopeChunk * 16;
      } else {
        kind = kRowBf16;
        lane_base = reinterpret_cast<const char*>(static_cast<const ukv_bf16*>(src.kv.data) +
                                                  (int64_t)pk.raw * src.kv_stride);
      }
    }
    if (key >= 0 && half == 0) valid[stage * kBK + key] = kind;
    const uint64_t row_bits = reinterpret_cast<uint64_t>(lane_base);
#pragma unroll 4
    for (int i = 0; i < kBK / 4; ++i) {
      const int k = i * 4 + (warp >> 1);
      const uint64_t addr = ((uint64_t)(uint32_t)ukv_shfl((int)(uint32_t)row_bits, i, UKV_WARP)) |
                            ((uint64_t)(uint32_t)ukv_shfl((int)(uint32_t)(row_bits >> 32), i, UKV_WARP) << 32);
      const int k_kind = ukv_shfl(kind, i, UKV_WARP);
      const int chunk = half * 32 + lane;
      bool copy = k_kind == kRowBf16 || (k_kind == kRowFp8 && (half == 0 || chunk >= kFp8RopeChunk));
      if (kFp8) {
        const int k_delta = ukv_shfl(scale_delta, i, UKV_WARP);
        constexpr int kScaleChunk = kFlashCodeBytes / 16;
        copy |= k_kind == kRowFlashMla && (chunk < kScaleChunk || chunk >= kFp8RopeChunk);
        copy |= k_kind == kRowScaled && (half == 0 || chunk < (kScaledCodeBytes + kScaledScaleBytes) / 16);
        if (k_kind == kRowFlashMla && chunk == kScaleChunk) {
          // The 8-byte scale slot instead of a (zero-filling) 16-byte copy.
          ukv_cp_async8(dst + Layout::at(k, chunk), reinterpret_cast<const char*>(addr) + k_delta);
          continue;
        }
      }
      ukv_cp_async16(dst + Layout::at(k, chunk), reinterpret_cast<const char*>(addr) + chunk * 16, copy);
    }
  }

  // Prologue, after the caller issued its query loads: fetches the keys of the
  // first kStages tiles (their loads overlap instead of queueing), then issues
  // the first kStages - 1 tiles, one commit group each (empty groups keep the
  // count uniform).
  __device__ __forceinline__ void start(const ukv_attention_params& p, const TokenKeys& keys) {
    PendingKey first[kStages];
#pragma unroll
    for (int i = 0; i < kStages; ++i) first[i] = fetch(keys, tile_begin + i);
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) {
      if (tile_begin + i < tile_end) issue(p, first[i], i);
      ukv_cp_async_commit();
    }
    pending = first[kStages - 1];
  }

  // Top of the iteration for `tile`: issues tile + kStages - 1, fetches the
  // keys of the one after (consumed next iteration), waits for `tile` and
  // returns its stage. A __syncthreads must follow before anyone reads it.
  __device__ __forceinline__ int advance(const ukv_attention_params& p, const TokenKeys& keys, int tile) {
    const int ahead = tile + kStages - 1;
    if (ahead < tile_end) issue(p, pending, (ahead - tile_begin) % kStages);
    ukv_cp_async_commit();
    pending = fetch(keys, ahead + 1);
    wait(tile);
    return (tile - tile_begin) % kStages;
  }

  // After advance() and the __syncthreads that follows it: dequantizes the
  // stage's FP8 rows in place and syncs again, so the tile holds bf16 rows
  // only. Nothing to do unless the pool is FP8 (uniform over the grid).
  // Warp w takes rows w + 8k, kRoundRows at a time (kernels at their register
  // limit batch fewer).
  template <int kRoundRows = 4>
  __device__ __forceinline__ void dequantize(const ukv_attention_params& p, int stage) const {
    if (!kFp8) return;
    const int warp = threadIdx.x / UKV_WARP;
#pragma unroll 1
    for (int round = 0; round < kBK / kWarps / kRoundRows; ++round)
      dequantize_rows<Layout, kRoundRows>(tile(stage), valid + stage * kBK, (ukv_fp8_format)p.src[0].kv.fp8_format,
                                          warp + kWarps * kRoundRows * round, kWarps);
    ukv_fence_async_shared();  // generic writes before later async-proxy access (bulk copies, wgmma)
    __syncthreads();
  }

  // Waits until tile `tile` (and the query rows) have landed; a __syncthreads
  // must follow before anyone reads them.
  __device__ __forceinline__ void wait(int tile) const {
    if (kBulk) {
      ukv_cp_async_wait<0>();  // the query rows
      const int i = tile - tile_begin;
      ukv_mbar_wait(&bars[i % kStages], (uint32_t)(i / kStages) & 1u);
    } else {
      ukv_cp_async_wait<kStages - 1>();
    }
  }
};

// The FP8 swap kernel's pipeline: a producer warpgroup (kProducerWarps warps
// after the eight consumer warps) gathers each tile and dequantizes it in
// place while the consumers run the MMAs and softmax of the tile before, so
// the dequantization leaves the consumers' critical path (bench/notes/v15.md).
// Per stage three mbarriers, each completing one phase per tile:
// `full` (TileLoads::bars: the bulk copies landed, one arrival per key),
// `ready` (dequantized) and `empty` (the consumers are done with it). Every
// producer (consumer) thread arrives on `ready` (`empty`): an arrival
// releases only the arriving thread's own shared-memory accesses.
constexpr int kProducerWarps = 4;
template <int kStages>
struct ProducerPipeline {
  TileLoads<kStages, PadTile, true> loads;
  uint64_t* ready;  // [kStages]
  uint64_t* empty;  // [kStages]

  // bars: [3][kStages] mbarriers (full, ready, empty).
  __device__ __forceinline__ ProducerPipeline(char* stages, int* valid, uint64_t* bars, int begin, int end)
      : loads{stages, valid, bars, begin, end}, ready(bars + kStages), empty(bars + 2 * kStages) {}

  // Before the roles split; a __syncthreads must follow.
  __device__ __forceinline__ void init() const {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) {
        ukv_mbar_init(&ready[s], kProducerWarps * UKV_WARP);
        ukv_mbar_init(&empty[s], kThreads);
      }
    }
    loads.init();  // thread 0 as well; fences the initializations
  }

  static __device__ __forceinline__ uint32_t parity(int i) { return (uint32_t)(i / kStages) & 1u; }

  // The producer warps' whole share of the block: the first kStages tiles are
  // issued at once (lanes 0..15 of warp w issue keys 16w..16w+15, their
  // indices loaded a tile ahead); tile i is dequantized as soon as it lands
  // (warp w takes rows w + 4k, 8 rows per round: the producers have registers
  // to spare), and then the stage of tile i - 1 is refilled once the
  // consumers release it, so tile i's dequantization overlaps the consumers'
  // work on tile i - 1.
  __device__ __forceinline__ void produce(const ukv_attention_params& p, const TokenKeys& keys) const {
    constexpr int kRoundRows = 8, kKeysPerWarp = kBK / kProducerWarps;
    const int begin = loads.tile_begin, end = loads.tile_end;
    const int lane = threadIdx.x % UKV_WARP, warp = threadIdx.x / UKV_WARP - kWarps;
    const int key = warp * kKeysPerWarp + lane;
    const bool issuer = lane < kKeysPerWarp;
    const auto fetch = [&](int tile) { return issuer ? fetch_key(keys, tile * kBK + key) : PendingKey{-1, -1}; };
    const ukv_fp8_format fmt = (ukv_fp8_format)p.src[0].kv.fp8_format;
    PendingKey first[kStages];
#pragma unroll
    for (int i = 0; i < kStages; ++i) first[i] = fetch(begin + i);
#pragma unroll
    for (int i = 0; i < kStages; ++i)
      if (issuer && begin + i < end) loads.issue_row(p, first[i], i, key);
    PendingKey next = fetch(begin + kStages);
    for (int tile = begin; tile < end; ++tile) {
      const int i = tile - begin, stage = i % kStages;
      ukv_mbar_wait(&loads.bars[stage], parity(i));
#pragma unroll 1
      for (int round = 0; round < kBK / kProducerWarps / kRoundRows; ++round)
        dequantize_rows<PadTile, kRoundRows>(loads.tile(stage), loads.valid + stage * kBK, fmt,
                                             warp + kProducerWarps * kRoundRows * round, kProducerWarps);
      ukv_fence_async_shared();  // generic writes before the stage's next bulk copies
      ukv_mbar_arrive(&ready[stage]);
      if (i >= 1 && tile - 1 + kStages < end) {
        const int prev = (i - 1) % kStages;
        ukv_mbar_wait(&empty[prev], parity(i - 1));
        if (issuer) loads.issue_row(p, next, prev, key);
        next = fetch(tile + kStages);
      }
    }
  }

  // Consumers: waits until tile `tile` is dequantized; returns its stage.
  __device__ __forceinline__ int acquire(int tile) const {
    const int i = tile - loads.tile_begin;
    ukv_mbar_wait(&ready[i % kStages], parity(i));
    return i % kStages;
  }

  // Consumers: this thread is done reading `stage` (its MMAs have completed).
  __device__ __forceinline__ void release(int stage) const { ukv_mbar_arrive(&empty[stage]); }
};

// The heads-on-N kernels' raw FP8 variant (bench/notes/v20.md):
// stages hold the rows as stored and the consumers build their MMA fragments
// from them in registers, so no bf16 tile exists. Slot k of a stage (key k of
// the tile) is 592 bytes: the 448 codes first, then for a pool row 16 bytes of
// scales (as stored in its nope row: s_j at byte 448 + 2j; the rest of the 512
// bytes is padding and not copied) and the 64 bf16 rope dims, for a FlashMLA
// token its value slot's 64 rope dims as stored (one 576-byte copy with the
// codes) and the 8 bytes of its page's scale slot (s_j at 576 + j).
// 592 = 80 mod 128, so slots 2 apart are 32 bytes of banks apart and slots 4
// apart 64: the fragment reads below pick their slots to be conflict-free
// with that (either layout: it moves every slot's rope by the same bytes).
struct RawTile {
  static constexpr uint32_t kPoolScales = 448;
  static constexpr uint32_t kPoolNope = kPoolScales + 16;  // a pool row's copied bytes: codes, scales
  static constexpr uint32_t kRowBytes = kPoolNope + kFp8RopeBytes;
  static constexpr size_t kTileBytes = (size_t)kBK * kRowBytes;
  static_assert(kFlashValueBytes + 16 == kRowBytes, "a FlashMLA value slot and its scale bytes fill a slot");
  // Where a slot of key source layout kLayout has its scale bytes and rope dims.
  template <int kLayout>
  static __device__ __forceinline__ constexpr uint32_t scales() {
    return kLayout == kLayoutFlashMla ? kFlashValueBytes : kPoolScales;
  }
  template <int kLayout>
  static __device__ __forceinline__ constexpr uint32_t rope() {
    return kLayout == kLayoutFlashMla ? kFlashCodeBytes : kPoolNope;
  }
  // Scale byte of code block `block`.
  template <int kLayout>
  static __device__ __forceinline__ uint32_t scale_at(int block) {
    return scales<kLayout>() + (kLayout == kLayoutFlashMla ? 1 : 2) * block;
  }
};

#if defined(UKV_HAS_WGMMA)
__device__ __forceinline__ uint32_t raw_row(int slot) { return (uint32_t)slot * RawTile::kRowBytes; }

// The raw variant's pipeline: the producer warps only gather (a pool key's
// nope row in one bulk copy, its rope row in 16-byte cp.async spread over the
// warp's lanes; a FlashMLA token's value slot in one bulk copy, its scale
// bytes by one cp.async of the issuing lane; or a zero row with in-range
// scale bytes for a key that names no row); consumers wait for `full`, build
// fragments and release the stage with `empty` as soon as their last read of
// it is done, before their MMAs finish. A bulk copy takes its addresses in uniform registers, so a warp
// issues them one lane at a time (about 80 cycles each); with two per key
// that loop bounded the tile rate (bench/notes/v28.md, 28a). kLayout: every
// key source of the call is an e4m3fn pool (kLayoutPool) or FlashMLA cache
// (kLayoutFlashMla).
template <int kStages, int kLayout = kLayoutPool>
struct RawPipeline {
  char* stages;
  int* valid;      // int [kStages][64]: slot holds a row
  uint64_t* full;  // [kStages]: one arrival per key and per producer thread, plus the bulk copies' bytes
  uint64_t* empty; // [kStages]: one arrival per consumer thread of the tile
  int tile_begin, tile_end;

  // bars: [2][kStages] mbarriers (full, empty).
  __device__ __forceinline__ RawPipeline(char* stages_, int* valid_, uint64_t* bars, int begin, int end)
      : stages(stages_), valid(valid_), full(bars), empty(bars + kStages), tile_begin(begin), tile_end(end) {}

  __device__ __forceinline__ char* tile(int stage) const { return stages + (size_t)stage * RawTile::kTileBytes; }
  static __device__ __forceinline__ uint32_t parity(int i) { return (uint32_t)(i / kStages) & 1u; }

  // Before the roles split; a __syncthreads must follow. `consumers`: the
  // threads that release each stage.
  __device__ __forceinline__ void init(int consumers) const {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) {
        ukv_mbar_init(&full[s], kBK + kProducerWarps * UKV_WARP);
        ukv_mbar_init(&empty[s], consumers);
      }
      ukv_mbar_init_fence();
    }
  }

  // What a producer warp's 16 keys (slots slot0 .. slot0 + 15; key k's index
  // in lane k) need beside issue_row's bulk copy: a pool row's rope row (lane
  // l copies chunk l % 8 of keys l / 8, + 4, + 8, + 12), a FlashMLA token's 8
  // scale bytes (lane k those of key k). A key without a row (ok: key_valid)
  // is skipped (issue_row zero-fills its slot), and this thread's arrival on
  // `full` waits for its copies. The lane id is read, not derived from
  // threadIdx.x, which the 16-head kernel otherwise spills.
  __device__ __forceinline__ void issue_pieces(const ukv_attention_params& p, PendingKey pk, bool ok, int stage,
                                             int slot0) const {
    const int lane = ukv_lane_id();
    if constexpr (kLayout == kLayoutFlashMla) {
      if (ok) {
        const ukv_kv_source& src = p.src[pk.source];
        ukv_cp_async8(tile(stage) + raw_row(slot0 + lane) + RawTile::scales<kLayout>(),
                      flashmla_value(src, pk.raw) + flashmla_scale_delta(src, pk.raw));
      }
    } else {
      const char* mine =
          ok ? static_cast<const char*>(p.src[pk.source].kv.rope) + (int64_t)pk.raw * kFp8RopeBytes : nullptr;
      char* dst = tile(stage) + raw_row(slot0 + lane / 8) + RawTile::rope<kLayout>() + 16 * (lane % 8);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const char* src = ukv_shfl_ptr(mine, 4 * j + lane / 8);
        if (src != nullptr) ukv_cp_async16(dst + 4 * j * RawTile::kRowBytes, src + 16 * (lane % 8), true);
      }
    }
    ukv_cp_async_mbar_arrive(&full[stage]);
  }

  // A pool key's nope row (codes and scale bytes) in one bulk copy; a
  // FlashMLA token's value slot (codes and rope dims; issue_pieces copies its
  // scale bytes).
  __device__ __forceinline__ void issue_row(const ukv_attention_params& p, PendingKey pk, bool ok, int stage,
                                            int slot) const {
    char* row = tile(stage) + raw_row(slot);
    valid[stage * kBK + slot] = ok ? kRowFp8 : kRowInvalid;
    if (ok) {
      const ukv_kv_source& src = p.src[pk.source];
      constexpr uint32_t kBytes = kLayout == kLayoutFlashMla ? kFlashValueBytes : RawTile::kPoolNope;
      const char* from = kLayout == kLayoutFlashMla ? flashmla_value(src, pk.raw)
                                                    : static_cast<const char*>(src.kv.data) + (int64_t)pk.raw * kFp8NopeBytes;
      ukv_mbar_arrive_expect(&full[stage], kBytes);
      ukv_bulk_copy(row, from, kBytes, &full[stage]);
    } else {
      // Zeros, and scale bytes 127 (factor 1) so the row takes the fast path.
      for (uint32_t c = 0; c < RawTile::kRowBytes / 16; ++c) {
        const uint32_t v = c == RawTile::scales<kLayout>() / 16 ? 0x7F7F7F7Fu : 0u;
        *reinterpret_cast<uint4*>(row + 16 * c) = make_uint4(v, v, v, v);
      }
      ukv_fence_async_shared();  // before a later bulk copy into this slot
      ukv_mbar_arrive(&full[stage]);
    }
  }

  // The producer warps' share: lanes 0..15 of producer warp w issue the nope
  // rows of keys 16w..16w+15 of each tile (indices loaded a tile ahead), all
  // 32 lanes their rope rows; a stage is refilled as soon as the consumers
  // release it.
  __device__ __forceinline__ void produce(const ukv_attention_params& p, const TokenKeys& keys) const {
    constexpr int kKeysPerWarp = kBK / kProducerWarps;
    const int lane = threadIdx.x % UKV_WARP, warp = threadIdx.x / UKV_WARP - kWarps;
    const int key = warp * kKeysPerWarp + lane;
    const bool issuer = lane < kKeysPerWarp;
    const auto fetch = [&](int t) { return issuer ? fetch_key(keys, t * kBK + key) : PendingKey{-1, -1}; };
    PendingKey first[kStages];
#pragma unroll
    for (int i = 0; i < kStages; ++i) first[i] = fetch(tile_begin + i);
#pragma unroll
    for (int i = 0; i < kStages; ++i) {
      if (tile_begin + i < tile_end) {
        const bool ok = key_valid(p, first[i]);
        issue_pieces(p, first[i], ok, i, warp * kKeysPerWarp);
        if (issuer) issue_row(p, first[i], ok, i, key);
      }
    }
    PendingKey next = fetch(tile_begin + kStages);
    for (int tile = tile_begin + kStages; tile < tile_end; ++tile) {
      const int i = tile - tile_begin, stage = i % kStages;
      ukv_mbar_wait(&empty[stage], parity(i - kStages));
      const bool ok = key_valid(p, next);
      issue_pieces(p, next, ok, stage, warp * kKeysPerWarp);
      if (issuer) issue_row(p, next, ok, stage, key);
      next = fetch(tile + 1);
    }
  }

  // Consumers: waits until tile `tile` has landed; returns its stage.
  __device__ __forceinline__ int acquire(int tile) const {
    const int i = tile - tile_begin;
    ukv_mbar_wait(&full[i % kStages], parity(i));
    return i % kStages;
  }

  // Consumers: this thread's reads of `stage` are done.
  __device__ __forceinline__ void release(int stage) const { ukv_mbar_arrive(&empty[stage]); }
};
#endif  // UKV_HAS_WGMMA

// Loads the block's kHb query rows (zeros past the last head).
template <class Layout, int kHb>
__device__ __forceinline__ void load_q(const ukv_attention_params& p, int t, int h0, char* q_smem) {
  for (int c = threadIdx.x; c < kHb * kChunks; c += kThreads) {
    const int r = c / kChunks, chunk = c % kChunks;
    const int h = h0 + r;
    const bool valid = h < p.num_heads;
    const ukv_bf16* q = static_cast<const ukv_bf16*>(p.q) + (int64_t)t * p.q_stride_token +
                        (int64_t)(valid ? h : 0) * p.q_stride_head;
    ukv_cp_async16(q_smem + Layout::at(r, chunk), reinterpret_cast<const char*>(q) + chunk * 16, valid);
  }
}

#endif  // UKV_NVIDIA_KERNELS

}  // namespace
