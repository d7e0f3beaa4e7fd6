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
// Keys come from up to two sources (pool rows, then the prefill chunk's own
// rows); an index outside its source (-1 included) is skipped, never read.
// Rows of an FP8 pool (spec unified_kv 1.5(c)) are gathered as they are
// stored into their bf16 slot in the tile (the 512-byte nope row at its start,
// the 128-byte rope row at its end) and dequantized there in place
// (dequantize_rows; in the 16/32-head kernels by producer warps), so every
// kernel's MMA code reads bf16 tiles either way. attention_portable.cuh holds
// the kernel for GPUs without NVIDIA's tensor-core or async-copy instructions
// (HIP builds: on MFMA where the device has it).
#include <math.h>

#include <type_traits>

#include "fp8.cuh"
#include "matrix_core.cuh"
#include "shim.cuh"
#include "warp.cuh"

// The tensor-core, async-copy and cluster kernels use NVIDIA-only instructions;
// a HIP build carries the portable kernels only (attention_portable.cuh).
#if !defined(__HIPCC__)
#define UKV_NVIDIA_KERNELS 1
#endif

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
// bf16 row, or an FP8 row still to be dequantized.
enum : int { kRowInvalid = 0, kRowBf16 = 1, kRowFp8 = 2 };

// FP8 rows gathered raw: the 512 nope bytes (448 codes, the scale bytes and
// padding) in chunks 0..31 of the row's slot, the 128 rope bytes (already
// bf16) in chunks 56..63, where the row's bf16 rope dims belong; dequantizing
// the codes writes chunks 0..55.
constexpr int kFp8NopeBytes = 512;
constexpr int kFp8RopeBytes = 128;
constexpr int kFp8RopeChunk = kChunks - kFp8RopeBytes / 16;

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
template <class Layout, int kRows>
__device__ __forceinline__ void dequantize_rows(char* tile, const int* valid, ukv_fp8_format fmt, int row0, int step) {
  constexpr int kPieces = 56, kScaleChunk = 28;
  const int lane = threadIdx.x % UKV_WARP;
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
    const char* scales = tile + Layout::at(r, kScaleChunk);
    fp8[k] = valid[r] == kRowFp8;
    lo[k] = *reinterpret_cast<const uint2*>(tile + Layout::at(r, lane / 2) + 8 * (lane % 2));
    hi[k] = *reinterpret_cast<const uint2*>(tile + Layout::at(r, 16 + hi_lane / 2) + 8 * (hi_lane % 2));
    s_lo[k] = *reinterpret_cast<const uint8_t*>(scales + 2 * (lane / 8));
    s_hi[k] = *reinterpret_cast<const uint8_t*>(scales + 2 * (4 + hi_lane / 8));
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
    valid[stage * kBK + key] = !ok ? kRowInvalid : fp8 ? kRowFp8 : kRowBf16;
    if (ok && fp8) {
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
    if (ok) {
      const ukv_kv_source& src = p.src[pk.source];
      if (kFp8 && src.kv.fp8) {
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
      const bool copy = k_kind == kRowBf16 || (k_kind == kRowFp8 && (half == 0 || chunk >= kFp8RopeChunk));
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
// the dequantization leaves the consumers' critical path (bench/NOTES.md,
// version 15). Per stage three mbarriers, each completing one phase per tile:
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

// The heads-on-N kernels' raw FP8 variant (bench/NOTES.md, version 20):
// stages hold the rows as stored and the consumers build their MMA fragments
// from them in registers, so no bf16 tile exists. Slot k of a stage (key k of
// the tile) is 592 bytes: the stored nope row's 448 codes and scale bytes (s_j
// at byte 448 + 2j; the rest of the 512 bytes is padding and not copied), then
// the 64 bf16 rope dims. 592 = 80 mod 128, so slots 2 apart are 32 bytes of
// banks apart and slots 4 apart 64: the fragment reads below pick their slots
// to be conflict-free with that.
struct RawTile {
  static constexpr uint32_t kScales = 448;
  static constexpr uint32_t kNope = kScales + 16;
  static constexpr uint32_t kRowBytes = kNope + kFp8RopeBytes;
  static constexpr size_t kTileBytes = (size_t)kBK * kRowBytes;
};

#if defined(UKV_HAS_WGMMA)
__device__ __forceinline__ uint32_t raw_row(int slot) { return (uint32_t)slot * RawTile::kRowBytes; }

// The raw variant's pipeline: the producer warps only gather (a key's nope
// row in one bulk copy, its rope row in 16-byte cp.async spread over the
// warp's lanes, or a zero row with in-range scale bytes for a key that names
// no row); consumers wait for `full`, build fragments and release the stage
// with `empty` as soon as their last read of it is done, before their MMAs
// finish. A bulk copy takes its addresses in uniform registers, so a warp
// issues them one lane at a time (about 80 cycles each); with two per key
// that loop bounded the tile rate (bench/NOTES.md, 28a).
template <int kStages>
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

  // The rope rows of a producer warp's 16 keys (slots slot0 .. slot0 + 15; key
  // k's index in lane k): lane l copies chunk l % 8 of keys l / 8, + 4, + 8,
  // + 12. A key without a row (ok: key_valid) is skipped (issue_row zero-fills
  // its slot), and this thread's arrival on `full` waits for its copies. The
  // lane id is read, not derived from threadIdx.x, which the 16-head kernel
  // otherwise spills.
  __device__ __forceinline__ void issue_rope(const ukv_attention_params& p, PendingKey pk, bool ok, int stage,
                                             int slot0) const {
    const int lane = ukv_lane_id();
    const char* mine =
        ok ? static_cast<const char*>(p.src[pk.source].kv.rope) + (int64_t)pk.raw * kFp8RopeBytes : nullptr;
    char* dst = tile(stage) + raw_row(slot0 + lane / 8) + RawTile::kNope + 16 * (lane % 8);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const char* src = ukv_shfl_ptr(mine, 4 * j + lane / 8);
      if (src != nullptr) ukv_cp_async16(dst + 4 * j * RawTile::kRowBytes, src + 16 * (lane % 8), true);
    }
    ukv_cp_async_mbar_arrive(&full[stage]);
  }

  // A key's nope row (codes and scale bytes) in one bulk copy.
  __device__ __forceinline__ void issue_row(const ukv_attention_params& p, PendingKey pk, bool ok, int stage,
                                            int slot) const {
    char* row = tile(stage) + raw_row(slot);
    valid[stage * kBK + slot] = ok ? kRowFp8 : kRowInvalid;
    if (ok) {
      ukv_mbar_arrive_expect(&full[stage], RawTile::kNope);
      ukv_bulk_copy(row, static_cast<const char*>(p.src[pk.source].kv.data) + (int64_t)pk.raw * kFp8NopeBytes,
                    RawTile::kNope, &full[stage]);
    } else {
      // Zeros, and scale bytes 127 (factor 1) so the row takes the fast path.
      for (uint32_t c = 0; c < RawTile::kRowBytes / 16; ++c) {
        const uint32_t v = c == RawTile::kScales / 16 ? 0x7F7F7F7Fu : 0u;
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
        issue_rope(p, first[i], ok, i, warp * kKeysPerWarp);
        if (issuer) issue_row(p, first[i], ok, i, key);
      }
    }
    PendingKey next = fetch(tile_begin + kStages);
    for (int tile = tile_begin + kStages; tile < tile_end; ++tile) {
      const int i = tile - tile_begin, stage = i % kStages;
      ukv_mbar_wait(&empty[stage], parity(i - kStages));
      const bool ok = key_valid(p, next);
      issue_rope(p, next, ok, stage, warp * kKeysPerWarp);
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

// Decode's inverse-RoPE epilogue (spec unified_kv 5.4): the table row of
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

// Folds the sink into (m, l) and returns the scale of acc (0 when the output is
// zero) and the natural-log LSE.
__device__ __forceinline__ float fold_sink(const ukv_attention_params& p, int h, float m, float l, float* lse) {
  const float z = p.sink != nullptr ? p.sink[h] * kLog2e : -INFINITY;
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

// The end of a split merge (cluster or workspace): four output values of
// (token t, head h) from dim d0, unnormalized with the merged (m, l), get the
// sink and 1/l, the inverse-RoPE epilogue where asked, and are written as
// bf16; `with_lse`: this thread also writes the head's LSE.
__device__ __forceinline__ void write_merged4(const ukv_attention_params& p, int t, int h, int d0,
                                              const float (&acc)[4], float m, float l, bool with_lse) {
  float lse;
  const float scale = fold_sink(p, h, m, l, &lse);
  ukv_bf16* out = static_cast<ukv_bf16*>(p.out) + (int64_t)t * p.out_stride_token + (int64_t)h * p.out_stride_head;
  *reinterpret_cast<uint2*>(out + d0) =
      pack_out4(inverse_rope_row(p, t), d0, acc[0] * scale, acc[1] * scale, acc[2] * scale, acc[3] * scale);
  if (p.lse != nullptr && with_lse) p.lse[(int64_t)t * p.lse_stride_token + h] = lse;
}

struct SplitConfig {
  int splits;   // S: the plan's split cap, also gridDim.z
  int cluster;  // 1: the S blocks of a (token, head block) form a cluster and merge in it
};

#if defined(UKV_NVIDIA_KERNELS)
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
    float m = -INFINITY;
    for (int j = 0; j < count; ++j) m = fmaxf(m, ukv_cluster_map(m_s, j)[r]);
    float l = 0.f;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int j = 0; j < count; ++j) {
      const float mj = ukv_cluster_map(m_s, j)[r];
      const float w = mj == -INFINITY ? 0.f : exp2f(mj - m);  // a split of only invalid keys adds nothing
      l += w * ukv_cluster_map(l_s, j)[r];
      const float4 a = *reinterpret_cast<const float4*>(ukv_cluster_map(acc_s, j) + partial_at(r, d0));
      acc[0] += w * a.x;
      acc[1] += w * a.y;
      acc[2] += w * a.z;
      acc[3] += w * a.w;
    }
    write_merged4(p, t, h, d0, acc, m, l, d0 == 0);
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

#if defined(UKV_NVIDIA_KERNELS)
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
};


template <int MT, int ST, bool kFp8>
__global__ void __launch_bounds__(kThreads, Smem<MT, ST>::kCtasPerSm)
    attention_kernel(ukv_attention_params p, SplitConfig cfg) {
  constexpr int kHb = 16 * MT;
  extern __shared__ __align__(1024) char smem[];
  const int t = blockIdx.x, hb = blockIdx.y, split = blockIdx.z;
  const int h0 = hb * kHb;
  const int lane = threadIdx.x % UKV_WARP, warp = threadIdx.x / UKV_WARP;
  const int g = lane >> 2, tq = lane & 3;  // mma fragment row / column-pair
  float* m_s = reinterpret_cast<float*>(smem + Smem<MT, ST>::kM);
  float* l_s = reinterpret_cast<float*>(smem + Smem<MT, ST>::kL);
  float* alpha_s = reinterpret_cast<float*>(smem + Smem<MT, ST>::kAlpha);
  float* s_s = reinterpret_cast<float*>(smem + Smem<MT, ST>::kS);
  int* valid_s = reinterpret_cast<int*>(smem + Smem<MT, ST>::kValid);

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
  TileLoads<kStages, PadTile, kFp8> loads{smem + Smem<MT, ST>::kK, valid_s,
                                    reinterpret_cast<uint64_t*>(smem + Smem<MT, ST>::kBar), tile_begin, tile_end};
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
    float* acc_s = reinterpret_cast<float*>(smem + Smem<MT, ST>::kK);
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
    ukv_cluster_sync();
    cluster_merge<kHb>(p, t, h0, cut.count, split, cfg.splits, m_s, l_s, acc_s);
    ukv_cluster_sync();  // no block leaves while another still reads its shared memory
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
  int* valid_s = reinterpret_cast<int*>(smem + WgSmem::kValid);
  float* xs = reinterpret_cast<float*>(smem + WgSmem::kX);
  float* xm = reinterpret_cast<float*>(smem + WgSmem::kXm);
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

  TileLoads<WgSmem::kStages, AtomTile, kFp8> loads{smem + WgSmem::kK, valid_s,
                                             reinterpret_cast<uint64_t*>(smem + WgSmem::kBar), tile_begin, tile_end};
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
    float* acc_s = reinterpret_cast<float*>(smem + WgSmem::kK);
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

// Warpgroup-MMA kernel for blocks of NH = 16 or 32 heads (sm_90a), "swap AB":
// keys on the MMA's M side (64 per tile) and heads on N, so a small head block
// wastes no MMA rows, and a tile costs 32 short wgmma per warpgroup instead of
// the mma.sync kernel's long dependent chains (that kernel spends ~3 us per
// tile at one block per SM, more than the tile's share of DRAM bandwidth).
//   QK:  S^T[64 keys, NH] = K . Q^T; warpgroup w sums dims 256w..256w+255
//        (K fragments from the padded tile through ldmatrix, Q through a
//        descriptor); the partials meet in shared memory and warpgroup w
//        finishes heads [w NH/2, (w+1) NH/2).
//   softmax: per head over the 64 keys (lanes, then warps through shared
//        memory); P^T is written to shared memory as bf16.
//   PV:  O^T[512 dims, NH] += V^T . P^T; warpgroup w owns dims 256w..+255
//        (V^T fragments through ldmatrix.trans, P^T through a descriptor).
// Accumulator fragments (m64nN): thread (warp q of its warpgroup, lane) holds
// rows 16q + lane/4 and +8, columns 8i + 2(lane%4) + {0, 1}.
// The raw kernels' PV factor words, one set per warpgroup taking whole tiles
// or one shared by two splitting them: f16 pairs [7 code blocks][4 tq][4
// k-steps][2 halves] (raw_fac_at).
constexpr int kRawFacWords = 7 * 32;

template <int NH, int ST, bool kRaw = false>
struct SwapSmem {
  static constexpr int kStages = ST;
  static constexpr int kCtasPerSm = ST == 1 ? 2 : 1;
  // The 16-head raw variant's warpgroups may take turns at whole tiles (the
  // kernel's kAlt; its layout holds both modes).
  static constexpr bool kAlt = kRaw && NH == 16;
  static constexpr size_t kTileBytes = kRaw ? RawTile::kTileBytes : PadTile::kTileBytes;
  static constexpr size_t kAtomCol = (size_t)NH * 128;             // one 64-dim column of Q
  static constexpr size_t kQ = 0;                                   // [8][NH][128 B] swizzled
  static constexpr size_t kK = kQ + 8 * kAtomCol;                   // [stages] PadTile or RawTile
  // P^T, [NH][64] 16-bit: one bf16 buffer, or in the raw variant an f16 one
  // for the code blocks and a bf16 one for the rope block (with kAlt, per
  // warpgroup).
  static constexpr size_t kPTBytes = (size_t)NH * 128;
  static constexpr size_t kPT = (kK + kStages * kTileBytes + 1023) / 1024 * 1024;
  static constexpr size_t kX = kPT + (kAlt ? 4 : kRaw ? 2 : 1) * kPTBytes;  // f32 [NH/4][threads]
  // f32 [4][NH] per-warp max / sum; [2][4][NH] with kAlt (per warpgroup)
  static constexpr size_t kWarp = kX + (size_t)NH / 4 * kThreads * 4;
  // f32 [4][NH]: m, l, alpha, scale; [5][NH] in the raw variant, adding the
  // score factor
  static constexpr size_t kHead = kWarp + (size_t)(kAlt ? 2 : 1) * 4 * NH * 4;
  static constexpr size_t kValid = kHead + (size_t)(kRaw ? 5 : 4) * NH * 4;  // int [stages][64]
  static constexpr size_t kBar = kValid + (size_t)kStages * kBK * 4;  // u64 [3][stages]: full, ready, empty
  // Raw variant: the PV factor words (raw_fac_at; kAlt: per warpgroup), then
  // per warpgroup the warps' scale maxima, [4 warps][4] (kAlt: u16x2 pairs).
  static constexpr size_t kFac = (kBar + 3 * kStages * 8 + 15) / 16 * 16;
  static constexpr size_t kSmax = kFac + (kRaw ? (kAlt ? 2 : 1) * kRawFacWords * 4 : 0);
  static constexpr size_t kBytes = kSmax + (kRaw ? 2 * 16 * 4 : 0);
};

// Threads of a swap kernel block: the FP8 instantiations add the producer warps.
__host__ __device__ constexpr int swap_threads(bool fp8) { return kThreads + (fp8 ? kProducerWarps * UKV_WARP : 0); }

#if defined(UKV_HAS_WGMMA)
// Registers per thread of the FP8 swap kernels (one block per SM): at entry,
// and in the raw variant's producer and consumer warps while the tiles run
// (setmaxnreg; the block's total stays within the SM's 64 K).
constexpr int kEntryRegs = 65536 / swap_threads(true) / 8 * 8;
constexpr int kRawProducerRegs = 40;
constexpr int kRawConsumerRegs = (65536 - kProducerWarps * UKV_WARP * kRawProducerRegs) / kThreads / 8 * 8;
static_assert(kEntryRegs == 168 && kRawConsumerRegs == 232, "384 threads: 168 at entry, 40 + 232 in the tile loop");
// Named barriers of the raw variant's register hand-over (1..3 are the
// consumers' own): the producers have lent theirs / the consumers have
// given them back.
constexpr int kRegsLentBarrier = 4, kRegsBackBarrier = 5;

// Byte offset of P^T[h][key] in a swap kernel's P^T buffer: 128-byte rows of
// 64 bf16, 16-byte chunks XOR-swizzled by h & 7.
__device__ __forceinline__ uint32_t pt_at(int h, int key) {
  return (uint32_t)(h * 128 + (((key >> 3) ^ (h & 7)) << 4) + (key & 7) * 2);
}

// D[64 x NH] (+)= A . B^T of the heads-on-N kernels, on bf16 or f16 operands.
template <int NH, bool kF16 = false>
__device__ __forceinline__ void swap_mma(float (&d)[NH / 2], const uint32_t (&a)[4], uint64_t b, int accumulate = 1) {
  static_assert(NH == 16 || NH == 32, "heads-on-N blocks hold 16 or 32 heads");
  if constexpr (NH == 16) {
    ukv_wgmma_m64n16k16_ra<kF16>(d, a, b, accumulate);
  } else {
    ukv_wgmma_m64n32k16_ra<kF16>(d, a, b, accumulate);
  }
}
#endif

#if defined(UKV_HAS_WGMMA)
// Raw variant: fragments built from stored e4m3fn rows (raw_variant_applies).

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
__device__ __forceinline__ void raw_qk_rope(const char* tile, const int (&slot)[2], int tq, uint32_t (&a)[4][4]) {
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const char* row = tile + raw_row(slot[e]);
    const uint4 x = *reinterpret_cast<const uint4*>(row + RawTile::kNope + 16 * tq);
    const uint4 y = *reinterpret_cast<const uint4*>(row + RawTile::kNope + 64 + 16 * tq);
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
// keys' factors for it.
__device__ __forceinline__ void raw_qk_block_f16(const char* tile, const int (&slot)[2], int block, int tq,
                                                 uint32_t (&a)[4][4], float (&factor)[2]) {
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const char* row = tile + raw_row(slot[e]);
    const uint4 x = *reinterpret_cast<const uint4*>(row + 64 * block + 16 * tq);
    factor[e] = raw_scale_f32(*reinterpret_cast<const uint8_t*>(row + RawTile::kScales + 2 * block));
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
template <int NH, int kFirst, int kBlocks, bool kOverlap = false>
__device__ __forceinline__ void raw_qk(const char* ks, const int (&slots)[2], int tq, uint64_t q_desc,
                                       uint32_t atom_col, float (&s)[NH / 2]) {
  uint32_t a[2][4][4];
  float factor[2][2];
  const auto build = [&](int i) {
    if (kFirst + i == kD / 64 - 1) {
      raw_qk_rope(ks, slots, tq, a[i & 1]);
      factor[i & 1][0] = factor[i & 1][1] = 1.f;
    } else {
      raw_qk_block_f16(ks, slots, kFirst + i, tq, a[i & 1], factor[i & 1]);
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
__device__ __forceinline__ void raw_block_scales(const char* ks, const bool (&v_key)[2], const int (&slot)[2], int blk,
                                                 int q, int lane, uint32_t* smax_w, uint32_t (&sb)[2]) {
#pragma unroll
  for (int e = 0; e < 2; ++e)
    if (v_key[e] && blk < kD / 64 - 1)
      sb[e] = *reinterpret_cast<const uint8_t*>(ks + raw_row(slot[e]) + RawTile::kScales + 2 * blk);
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
__device__ __forceinline__ void raw_pv_rope(const char* tile, int q, int lane, uint32_t (&a)[4][4]) {
  const int m = lane >> 3;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    ukv_ldmatrix_x4_trans(a[kk], tile + raw_row(raw_pv_slot(kk, m >> 1, lane & 7)) + RawTile::kNope + 32 * q +
                                     16 * (m & 1));
}

// One warpgroup's PV, O^T += V^T . P^T over M tiles mb = 0 .. kTiles - 1, tile
// mb being block kFirst + mb (known at compile time: with a run-time block
// ptxas serializes the wgmmas). Code blocks run on f16 MMAs against the f16
// P^T, the rope block on bf16 MMAs against the bf16 one (the descriptors of
// their first k-step); fac holds the factor words (raw_fac_at).
template <int NH, int kFirst, int kTiles, int kRows>
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
      raw_pv_rope(tile, q, lane, a[mb & 1]);
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

// The end of a heads-on-N kernel, once m_h and l_h hold the block's per-head
// (m, l) and each consumer thread its accumulators o[mb][i] (fragment layout
// below, warpgroup wg owning dims 256 wg .. 256 wg + 255): the sink and the
// LSE, then the output written directly, merged in the cluster (through the
// drained key stages) or stored to the workspace. Every thread of the block
// calls it; `consumer`: the thread holds accumulators.
template <int NH, bool kRaw, int kRows>
__device__ __forceinline__ void swap_finish(const ukv_attention_params& p, const SplitConfig& cfg,
                                            const SplitWork& work, char* stages, const float* m_h, const float* l_h,
                                            float* scale_h, bool consumer, int wg, int q, int lane,
                                            const float (&o)[kRows][NH / 2]) {
  constexpr int kRegs = NH / 2;
  const int tid = threadIdx.x, t = blockIdx.x, hb = blockIdx.y, split = blockIdx.z;
  const int h0 = hb * NH, g = lane >> 2, tq = lane & 3;
  const auto head_of = [&](int i) { return 8 * (i / 4) + 2 * tq + (i & 1); };
  if (tid < NH) {
    float lse = -INFINITY;
    scale_h[tid] = h0 + tid < p.num_heads ? fold_sink(p, h0 + tid, m_h[tid], l_h[tid], &lse) : 0.f;
    if (work.direct && p.lse != nullptr && h0 + tid < p.num_heads) {
      p.lse[(int64_t)t * p.lse_stride_token + h0 + tid] = lse;
    }
  }
  __syncthreads();

  // Fragment (mb, i) of this thread: dim 64 (4 wg + mb) + 16 q + g (+8), head 8 (i/4) + 2 tq + (i & 1);
  // the raw variant's code blocks: 64 (4 wg + mb) + 16 q + 2 g (+1) (raw_pv_codes).
  const auto dim_of = [&](int mb, int i) {
    const int hi = (i & 2) ? 1 : 0;
    if constexpr (kRaw) {
      if (4 * wg + mb < kD / 64 - 1) return 64 * (4 * wg + mb) + 16 * q + 2 * g + hi;
    }
    return 64 * (4 * wg + mb) + 16 * q + g + 8 * hi;
  };
  if (!work.direct && cfg.cluster != 0) {
    ukv_cp_async_wait<0>();
    float* acc_s = reinterpret_cast<float*>(stages);
    if (consumer) {
#pragma unroll
      for (int mb = 0; mb < 4; ++mb)
#pragma unroll
        for (int i = 0; i < kRegs; ++i) acc_s[partial_at(head_of(i), dim_of(mb, i))] = o[mb][i];
    }
    ukv_cluster_sync();
    if (consumer) cluster_merge<NH>(p, t, h0, work.cut.count, split, cfg.splits, m_h, l_h, acc_s);
    ukv_cluster_sync();
  } else if (!consumer) {
    return;
  } else if (work.direct) {
    const float* cs = inverse_rope_row(p, t);
#pragma unroll
    for (int mb = 0; mb < 4; ++mb)
#pragma unroll
      for (int i = 0; i < kRegs; ++i) {
        const int h = head_of(i);
        float v = o[mb][i] * scale_h[h];
        // Rope dims (warpgroup 1, mb 3): a pair's other dim is held by lane ^ 4
        // (g +- 1, same head), and every lane takes part in the shuffle.
        if (cs != nullptr && wg == 1 && mb == 3) {
          const float other = ukv_shfl_xor(v, 4, UKV_WARP);
          const int d = dim_of(mb, i);
          const float2 c = *reinterpret_cast<const float2*>(cs + ((d - (kD - 64)) & ~1));
          v = (d & 1) == 0 ? v * c.x + other * c.y : v * c.x - other * c.y;
        }
        if (h0 + h >= p.num_heads) continue;
        ukv_bf16* out = static_cast<ukv_bf16*>(p.out) + (int64_t)t * p.out_stride_token +
                        (int64_t)(h0 + h) * p.out_stride_head;
        out[dim_of(mb, i)] = ukv_float_to_bf16(v);
      }
  } else {
    float* rec = static_cast<float*>(p.workspace) +
                 (((size_t)t * gridDim.y + hb) * cfg.splits + split) * partial_floats(NH);
    if (tid < NH) {
      rec[tid] = m_h[tid];
      rec[NH + tid] = l_h[tid];
    }
#pragma unroll
    for (int mb = 0; mb < 4; ++mb)
#pragma unroll
      for (int i = 0; i < kRegs; ++i) rec[2 * NH + (size_t)head_of(i) * kD + dim_of(mb, i)] = o[mb][i];
  }
}

#endif  // UKV_HAS_WGMMA

template <int NH, int ST, bool kFp8, bool kRaw>
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
  // (bench/NOTES.md, version 25).
  constexpr bool kAlt = L::kAlt;
  constexpr int kSplitTiles = 3;
  constexpr int kStages = L::kStages;
  constexpr int kRegs = NH / 2;    // S^T and each O^T block: fragment registers per thread
  constexpr int kOwn = NH / 4;     // S^T registers of this warpgroup's heads
  constexpr int kGroup = 4;        // QK fragments per wgmma commit group
  extern __shared__ __align__(1024) char smem[];
  const int t = blockIdx.x, hb = blockIdx.y, split = blockIdx.z;
  const int h0 = hb * NH;
  // The warpgroup and warp indices through a shuffle from lane 0: the
  // compiler then knows them warp-uniform and keeps the wgmma descriptors
  // derived from them in uniform registers.
  const int tid = threadIdx.x, lane = tid % UKV_WARP;
  const int wg = ukv_shfl(tid / 128, 0, UKV_WARP), q = ukv_shfl((tid / UKV_WARP) % 4, 0, UKV_WARP);
  const int g = lane >> 2, tq = lane & 3;
  const int partner = tid ^ 128;
  int* valid_s = reinterpret_cast<int*>(smem + L::kValid);
  float* xs = reinterpret_cast<float*>(smem + L::kX);
  float* warp_s = reinterpret_cast<float*>(smem + L::kWarp);
  float* m_h = reinterpret_cast<float*>(smem + L::kHead);
  float* l_h = m_h + NH;
  float* alpha_h = l_h + NH;
  float* scale_h = alpha_h + NH;
  float* qk_h = scale_h + NH;
  char* pt = smem + L::kPT;
  // Raw variant: the PV factor words (raw_fac_at) and the warps' scale maxima
  // (16 words per warpgroup); kAlt: the factor words per warpgroup too.
  uint32_t* fac_s = reinterpret_cast<uint32_t*>(smem + L::kFac);
  uint32_t* smax_s = reinterpret_cast<uint32_t*>(smem + L::kSmax);
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
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + L::kBar);
  using Pipe = std::conditional_t<kRaw, RawPipeline<kStages>, ProducerPipeline<kStages>>;
  using Loads = std::conditional_t<kRaw, Pipe, TileLoads<kStages, PadTile, kFp8>>;
  Loads loads{smem + L::kK, valid_s, bars, tile_begin, tile_end};
  const Pipe pipe{smem + L::kK, valid_s, bars, tile_begin, tile_end};
  // Raw variant: the slot of M row m's key.
  const auto slot_of = [](int m) { return kRaw ? qk_slot(m) : m; };
  // `alt`: a barrier of this warpgroup's 128 threads, named barrier 1 or 2
  // (constant ids: with an id in a register ptxas reserves all 16 barriers).
  const auto wg_sync = [wg] {
    if (wg == 0) {
      ukv_named_sync(1, 128);
    } else {
      ukv_named_sync(2, 128);
    }
  };
  // (kAlt: barrier 3, since 1 and 2 are the warpgroups' own: every named
  // barrier keeps one thread count.)
  const auto consumer_sync = [] {
    if constexpr (kFp8) {
      ukv_named_sync(kAlt ? 3 : 1, kThreads);
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
          raw_qk<NH, 0, kD / 64>(ks, qk_slots, tq, q_desc, (uint32_t)L::kAtomCol, s);

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
                             ? *reinterpret_cast<const uint8_t*>(ks + raw_row(qk_slots[e]) + RawTile::kScales + 2 * blk[j])
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
          raw_pv<NH, 0, 8>(ks, q, lane, fac_w, pt16_desc, ptbf_desc, o);
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
        // as races (bench/NOTES.md, version 20).
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
            raw_qk<NH, 0, 4>(ks, qk_slots, tq, q_desc, (uint32_t)L::kAtomCol, s);
          } else {
            raw_qk<NH, 4, 4>(ks, qk_slots, tq, q_desc, (uint32_t)L::kAtomCol, s);
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
          raw_block_scales(ks, v_key, slots, blk, q, lane, smax_s + 16 * wg, sb);
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
            raw_pv<NH, 0, 4>(ks, q, lane, fac_s, pt16_desc, ptbf_desc, o);
          } else {
            raw_pv<NH, 4, 4>(ks, q, lane, fac_s, pt16_desc, ptbf_desc, o);
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
      float* wg_ml = reinterpret_cast<float*>(smem + L::kX + NH * 128);  // [2 warpgroups][m, l][NH]
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
      float* xbuf = reinterpret_cast<float*>(smem + L::kK);  // [2][4][kRegs][128]
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
  static_assert(NH * kD * 4 <= kStages * L::kTileBytes, "the partial fits in the key stages");
  swap_finish<NH, kRaw>(p, cfg, work, smem + L::kK, m_h, l_h, scale_h, consumer, wg, q, lane, o);
#endif
}

// The 32-head raw kernel with its warpgroups specialized (bench/NOTES.md,
// version 27). In attention_swap_kernel's split mode both warpgroups run each
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
// nothing the value warpgroups can (bench/NOTES.md, 27c).
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
  // u64: full, empty [stages]; pfull, pempty [2]; done
  static constexpr size_t kBar = kValid + kStages * kBK * 4;
  static constexpr size_t kBytes = kBar + (2 * kStages + 5) * 8;
};

template <int NH, int ST>
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
  // Named barrier of the query hand-over: the value warps stored it, the score
  // warpgroup may read it (1, 2: the score warpgroup's own; 4, 5: registers;
  // 6, 7: value warpgroup 0's and 1's).
  constexpr int kQueryBarrier = 3;
  // The score warpgroup's per-tile vote (bar.red) on whether a reference moves.
  constexpr int kMovedBarrier = 2;
  constexpr int kStages = ST;
  // How far (log2) a tile's maximum may pass a head's reference before the
  // reference moves: P^T then holds values below 2^8, which f16 and bf16 keep
  // to the same relative precision as values below 1, and the row sums stay
  // far from f32's range.
  constexpr float kLazyLog2 = 8.f;
  constexpr int kRegs = NH / 2;  // S^T and each O^T block: fragment registers per thread
  constexpr int kCols = NH / 4;  // head columns per thread
  constexpr int kScoreTid = kThreads + kProducerWarps * UKV_WARP;
  static_assert(NH * kD * 4 <= kStages * L::kTileBytes, "the partial fits in the key stages");
  extern __shared__ __align__(1024) char smem[];
  // Warpgroup and warp indices through a shuffle from lane 0 (warp-uniform,
  // so descriptors stay in uniform registers).
  const int tid = threadIdx.x, lane = tid % UKV_WARP;
  const int wg = ukv_shfl(tid / 128, 0, UKV_WARP), q = ukv_shfl((tid / UKV_WARP) % 4, 0, UKV_WARP);
  const int g = lane >> 2, tq = lane & 3;
  int* valid_s = reinterpret_cast<int*>(smem + L::kValid);
  float* m_h = reinterpret_cast<float*>(smem + L::kHead);
  float* l_h = m_h + NH;
  float* scale_h = l_h + NH;
  float* qk_h = scale_h + NH;
  uint32_t* fac_s = reinterpret_cast<uint32_t*>(smem + L::kFac);
  float* alpha_s = reinterpret_cast<float*>(smem + L::kAlpha);
  uint32_t* rescale_s = reinterpret_cast<uint32_t*>(smem + L::kRescale);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + L::kBar);
  uint64_t* pfull = bars + 2 * kStages;
  uint64_t* pempty = pfull + 2;
  uint64_t* done = pempty + 2;  // the score warpgroup wrote m_h and l_h
  const auto head_of_c = [&](int c) { return 8 * (c / 2) + 2 * tq + (c & 1); };
  const auto pt_slot = [&](int par) { return smem + L::kPT + (size_t)par * 2 * L::kPTBytes; };
  // A barrier of value warpgroup wg's 128 threads (named barrier 6 or 7;
  // constant ids: with an id in a register ptxas reserves all 16 barriers).
  const auto wg_sync = [wg] {
    if (wg == 0) {
      ukv_named_sync(6, 128);
    } else {
      ukv_named_sync(7, 128);
    }
  };

  // This thread's keys: M rows 16 q + g and + 8 of the QK MMAs (score
  // warpgroup), whose P^T k positions 16 q + 2 g, + 1 a value thread's factor
  // words cover.
  const int qk_slots[2] = {qk_slot(16 * q + g), qk_slot(16 * q + g + 8)};

  SplitWork work;
  if (!split_work(p, blockIdx.x, blockIdx.z, cfg, work)) return;
  const int t = blockIdx.x, h0 = blockIdx.y * NH;
  const int tile_begin = work.tile_begin, tile_end = work.tile_end;
  const RawPipeline<kStages> pipe{smem + L::kK, valid_s, bars, tile_begin, tile_end};
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
      ukv_named_sync(kQueryBarrier, kThreads + 128);
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
        float* warp_w = reinterpret_cast<float*>(smem + L::kWarp) + par * 4 * NH;
        const int stage = pipe.acquire(tile);
        const char* ks = pipe.tile(stage);
        float s[kRegs];
#pragma unroll
        for (int r = 0; r < kRegs; ++r) s[r] = 0.f;
        raw_qk<NH, 0, kD / 64, true>(ks, qk_slots, tq, q_desc, (uint32_t)L::kAtomCol, s);
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
        const bool moved = ukv_named_sync_or(kMovedBarrier, 128, over);
        float base[kCols], alpha[kCols], sum[kCols];
        if (moved) {
#pragma unroll
          for (int c = 0; c < kCols; ++c) {
            mx[c] = ukv_xor_max<4, 16>(mx[c]);
            if (g == 0) warp_w[4 * head_of_c(c) + q] = mx[c];
          }
          ukv_named_sync(1, 128);
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
      float* lw = reinterpret_cast<float*>(smem + L::kWarp) + ((tile_end - tile_begin) & 1) * 4 * NH;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const float l = ukv_xor_sum<4, 16>(l_run[c]);
        if (g == 0) lw[4 * head_of_c(c) + q] = l;
        if (q == 0 && g == 0) m_h[head_of_c(c)] = m_run[c];
      }
      ukv_named_sync(1, 128);
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
      ukv_named_arrive(kQueryBarrier, kThreads + 128);
      // This lane's code block 4 wg + tq (none for warpgroup 1's lanes tq = 3:
      // the rope block), and the running scale maxima of this warpgroup's blocks
      // 4 wg + mb its accumulators have seen (raw_pv_codes: they hold values
      // over 2^(ref - 127)).
      const int blk = 4 * wg + tq;
      uint32_t* smax_w = reinterpret_cast<uint32_t*>(smem + L::kSmax) + 16 * wg;
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
        raw_block_scales(ks, v_key, qk_slots, blk, q, lane, smax_w, sb);
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
          raw_pv<NH, 0, 4>(ks, q, lane, fac_s, pt16_desc, ptbf_desc, o);
        } else {
          raw_pv<NH, 4, 4>(ks, q, lane, fac_s, pt16_desc, ptbf_desc, o);
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
  swap_finish<NH, true>(p, cfg, work, smem + L::kK, m_h, l_h, scale_h, value, wg, q, lane, o);
#endif
}

#endif  // UKV_NVIDIA_KERNELS

#include "attention_portable.cuh"

// Merges the splits of one (token, head) in split order; 128 threads x 4 dims.
// Every load is issued up front (one (m, l) pair per thread, then the acc rows
// unrolled) so the kernel pays a few memory latencies, not one per split.
__global__ void combine_kernel(ukv_attention_params p, SplitConfig cfg, int block_heads) {
  __shared__ float weight_s[kMaxSplits];
  __shared__ float sum_s[kMaxSplits];
  const int t = blockIdx.x, h = blockIdx.y;
  const int hb = h / block_heads, r = h % block_heads;
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();  // the attention grid's partials are complete and visible
  const size_t rec_floats = partial_floats(block_heads);
  const TokenSplit cut = token_split(token_keys(p, t).total, cfg.splits);
  if (cut.count <= 1) return;  // written directly by the attention kernel
  const int head_blocks = (p.num_heads + block_heads - 1) / block_heads;
  const float* base =
      static_cast<const float*>(p.workspace) + ((size_t)t * head_blocks + hb) * cfg.splits * rec_floats;
  // Thread s < count holds split s's running max and sum; the block max M
  // comes through shared memory, then weight_s[s] = 2^(m_s - M) (0 when the
  // split saw only invalid keys; its acc is zeros).
  const int s_own = threadIdx.x;
  const float m_own = s_own < cut.count ? base[s_own * rec_floats + r] : -INFINITY;
  const float l_own = s_own < cut.count ? base[s_own * rec_floats + block_heads + r] : 0.f;
  if (s_own < kMaxSplits) weight_s[s_own] = m_own;
  __syncthreads();
  float m = -INFINITY;
  for (int s = 0; s < cut.count; ++s) m = fmaxf(m, weight_s[s]);
  __syncthreads();
  if (s_own < cut.count) {
    const float w = (m_own == -INFINITY) ? 0.f : exp2f(m_own - m);
    weight_s[s_own] = w;
    sum_s[s_own] = w * l_own;
  }
  __syncthreads();
  float l = 0.f;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const int d0 = threadIdx.x * 4;
  const float* acc_base = base + 2 * block_heads + (size_t)r * kD + d0;
#pragma unroll 8
  for (int s = 0; s < cut.count; ++s) {
    const float w = weight_s[s];
    l += sum_s[s];
    const float4 a = *reinterpret_cast<const float4*>(acc_base + s * rec_floats);
    acc[0] += w * a.x;
    acc[1] += w * a.y;
    acc[2] += w * a.z;
    acc[3] += w * a.w;
  }
  write_merged4(p, t, h, d0, acc, m, l, threadIdx.x == 0);
}

// Merges P partial results over disjoint key sets (see ops/merge.rs); one
// 128-thread block per (token, head), 4 dims per thread, parts in order.
__global__ void merge_kernel(ukv_merge_params p) {
  const int t = blockIdx.x, h = blockIdx.y;
  const int d0 = threadIdx.x * 4;
  const float* lse_in = p.parts_lse + (int64_t)t * p.in_lse_stride_token + h;
  const float sink = p.sink != nullptr ? p.sink[h] : -INFINITY;
  float m = sink;
  for (int i = 0; i < p.num_parts; ++i) m = fmaxf(m, lse_in[i * p.part_stride_lse]);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  float lse = -INFINITY;
  if (m != -INFINITY) {
    float den = expf(sink - m);
    for (int i = 0; i < p.num_parts; ++i) {
      const float l = lse_in[i * p.part_stride_lse];
      if (l == -INFINITY) continue;  // an empty part: its output is not read
      const float w = expf(l - m);
      den += w;
      const ukv_bf16* row = static_cast<const ukv_bf16*>(p.parts_out) + i * p.part_stride_out +
                            (int64_t)t * p.in_stride_token + (int64_t)h * p.in_stride_head + d0;
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] += w * ukv_bf16_to_float(row[e]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] /= den;
    lse = m + logf(den);
  }
  ukv_bf16* out =
      static_cast<ukv_bf16*>(p.out) + (int64_t)t * p.out_stride_token + (int64_t)h * p.out_stride_head + d0;
  *reinterpret_cast<uint2*>(out) = make_uint2(ukv_pack_bf16x2(acc[0], acc[1]), ukv_pack_bf16x2(acc[2], acc[3]));
  if (p.lse != nullptr && threadIdx.x == 0) p.lse[(int64_t)t * p.lse_stride_token + h] = lse;
}

// Split cap S for a plan: one wave of resident CTAs when max_tokens tokens run,
// so small batches spread each token over many SMs without a second wave, and
// large ones write no partials at all.
int split_cap(int max_tokens, int head_blocks, int resident_ctas, int max_splits) {
  const int want = resident_ctas / (max_tokens * head_blocks);
  return want < 1 ? 1 : (want > max_splits ? max_splits : want);
}

// Lets `kernel` use `bytes` of dynamic shared memory, with all of the unified
// L1/shared storage as shared memory so the CTAs per SM it is built for fit.
template <typename Kernel>
int configure(Kernel kernel, size_t bytes) {
  ukv_error_t e = ukv_func_set_max_dynamic_smem(kernel, (int)bytes);
  if (e == UKV_SUCCESS) e = ukv_func_set_max_smem_carveout(kernel);
  return e == UKV_SUCCESS ? UKV_SHIM_OK : ukv::report(e, "set attention shared memory");
}

// Test hook (unikv_gpu_test_plan_fallbacks): plans created on this thread skip
// the cluster merge and/or the wgmma kernel, so the tests also cover the paths
// that sm_80 and ROCm take.
thread_local bool g_no_cluster = false;
thread_local bool g_no_wgmma = false;
// Test hook (unikv_gpu_test_plan_portable): plans use the portable kernel's
// scalar (1) or matrix (2) variant.
thread_local int g_portable = 0;

// The portable variant a plan for `device` takes (0: none). A HIP build has
// no other kernel: the matrix variant where the device has MFMA, else scalar.
int portable_variant(int device, int* variant) {
#if defined(__HIPCC__)
  bool mfma = false;
  if (ukv_error_t e = ukv_device_has_mfma(device, &mfma)) return ukv::report(e, "device properties");
  *variant = g_portable != 0 ? g_portable : mfma ? 2 : 1;
#else
  (void)device;
  *variant = g_portable;
#endif
  return UKV_SHIM_OK;
}

using AttentionKernel = void (*)(ukv_attention_params, SplitConfig);

// The kernel instantiation a plan names for bf16 or FP8 pools, its dynamic
// shared memory and its threads per block. `raw`: the heads-on-N kernels may
// take their raw variant (raw_variant_applies).
template <bool kFp8>
int plan_kernel_for(const ukv_attention_plan& plan, [[maybe_unused]] bool raw, AttentionKernel* kernel, size_t* smem,
                    int* threads) {
  *threads = kThreads;
  if (plan.portable != 0) {
    *kernel = plan.portable == 2 ? attention_portable_kernel<kFp8, true> : attention_portable_kernel<kFp8, false>;
    *smem = plan.portable == 2 ? PortableSmem<true>::kBytes : PortableSmem<false>::kBytes;
    *threads = kPortableThreads;
    return UKV_SHIM_OK;
  }
#if defined(UKV_NVIDIA_KERNELS)
  switch (plan.wgmma) {
    case 64: *kernel = attention_wgmma_kernel<kFp8>; *smem = WgSmem::kBytes; return UKV_SHIM_OK;
    case 16:
      *threads = swap_threads(kFp8);
      // FP8 plans take the raw variant with five stages, or three (the
      // in-place producer pipeline) when a source holds bf16 rows.
      if (kFp8 && raw) {
        *kernel = attention_swap_kernel<16, 5, true, true>;
        *smem = SwapSmem<16, 5, true>::kBytes;
      } else if (!kFp8 && plan.stages == 1) {
        *kernel = attention_swap_kernel<16, 1, false, false>;
        *smem = SwapSmem<16, 1>::kBytes;
      } else {
        *kernel = attention_swap_kernel<16, 3, kFp8, false>;
        *smem = SwapSmem<16, 3>::kBytes;
      }
      return UKV_SHIM_OK;
    case 32:
      if (kFp8 && raw) {
        *kernel = attention_roles_kernel<32, 4>;
        *smem = RoleSmem<32, 4>::kBytes;
        *threads = kRoleThreads;
      } else {
        *threads = swap_threads(kFp8);
        *kernel = attention_swap_kernel<32, 2, kFp8, false>;
        *smem = SwapSmem<32, 2>::kBytes;
      }
      return UKV_SHIM_OK;
    default: break;
  }
  switch (plan.block_m_tiles * 8 + plan.stages) {
    case 1 * 8 + 1: *kernel = attention_kernel<1, 1, kFp8>; *smem = Smem<1, 1>::kBytes; return UKV_SHIM_OK;
    case 1 * 8 + 3: *kernel = attention_kernel<1, 3, kFp8>; *smem = Smem<1, 3>::kBytes; return UKV_SHIM_OK;
    case 2 * 8 + 2: *kernel = attention_kernel<2, 2, kFp8>; *smem = Smem<2, 2>::kBytes; return UKV_SHIM_OK;
    case 3 * 8 + 2: *kernel = attention_kernel<3, 2, kFp8>; *smem = Smem<3, 2>::kBytes; return UKV_SHIM_OK;
    case 4 * 8 + 2: *kernel = attention_kernel<4, 2, kFp8>; *smem = Smem<4, 2>::kBytes; return UKV_SHIM_OK;
    default: break;
  }
#endif
  ukv::set_error("attention plan names no kernel instantiation");
  return UKV_SHIM_INVALID;
}

int plan_kernel(const ukv_attention_plan& plan, bool raw, AttentionKernel* kernel, size_t* smem, int* threads) {
  return plan.kv_fp8 ? plan_kernel_for<true>(plan, raw, kernel, smem, threads)
                     : plan_kernel_for<false>(plan, raw, kernel, smem, threads);
}

// Whether every key source of a call is an e4m3fn pool, the rows the raw
// variant reads (host-side arguments, so the kernel choice still depends only
// on what a graph captures). e4m3fnuz pools, the AMD format, take the
// in-place kernels, which decode either format.
bool raw_variant_applies(const ukv_attention_params& p) {
  for (int s = 0; s < p.num_sources; ++s)
    if (p.src[s].kv.fp8 == 0 || p.src[s].kv.fp8_format != UKV_FP8_E4M3FN) return false;
  return true;
}

}  // namespace

extern "C" {

// Chooses the launch configuration for capture-time shapes, configures the
// kernels, and reports the workspace every launch through the plan needs.
int unikv_gpu_attention_plan(int device, int max_tokens, int num_heads, int kv_fp8, ukv_attention_plan* plan) {
  UKV_ENTRY(device, {
    int smem_optin = 0;
    const ukv_error_t e = ukv_device_get_attribute(&smem_optin, UKV_ATTR_MAX_SMEM_OPTIN, device);
    if (e != UKV_SUCCESS) return ukv::report(e, "device attribute");
    ukv::DeviceFacts facts;
    if (int r = ukv::device_facts(device, &facts)) return r;
    const int sms = facts.sms, cc_major = facts.major;
    ukv_attention_plan pl{};
    pl.max_tokens = max_tokens;
    pl.num_heads = num_heads;
    pl.head_blocks = (int)ukv::cdiv(num_heads, 64);
    pl.block_m_tiles = (int)ukv::cdiv(ukv::cdiv(num_heads, pl.head_blocks), 16);
    pl.sm_count = sms;
    pl.dependent_launch = cc_major >= 9 ? 1 : 0;
    pl.kv_fp8 = kv_fp8 ? 1 : 0;
    if (int r = portable_variant(device, &pl.portable)) return r;
    if (pl.portable != 0) {
      pl.head_blocks = (int)ukv::cdiv(num_heads, kPortableHeads);
      pl.block_m_tiles = kPortableHeads / 16;
    }
    // Small head blocks of a large batch (CTAs for at least half the SMs): two
    // CTAs per SM with one stage each; measured better from T = 128 on, worse
    // at T <= 64 where CTAs have few tiles (bench/NOTES.md, version 6).
    pl.stages = pl.block_m_tiles > 1 ? 2 : (2 * max_tokens * pl.head_blocks >= sms ? 1 : 3);
    // sm_90a: blocks of up to 32 heads run the heads-on-N wgmma kernel, 64-head
    // blocks the heads-on-M one; the rest (and other GPUs) the mma.sync kernel.
    // 16-head blocks of batches past one CTA per SM take the one-stage variant
    // at two CTAs per SM (bench/NOTES.md, version 12).
    const bool swap = num_heads <= 32;
    const bool wgmma = (swap || pl.block_m_tiles == 4) && facts.wgmma && !g_no_wgmma && pl.portable == 0;
    pl.wgmma = !wgmma ? 0 : (swap ? 16 * pl.block_m_tiles : 64);
    // FP8 pools: the heads-on-N kernels dequantize on producer warps and keep
    // three stages at any batch (bench/NOTES.md, version 15).
    if (pl.wgmma == 16) pl.stages = !kv_fp8 && max_tokens * pl.head_blocks > sms ? 1 : 3;
    if (pl.wgmma == 32) pl.stages = 2;
    // FP8 plans configure both kernels a call may take (raw_variant_applies;
    // one where the plan's kernel has no raw variant); the cluster choice
    // below holds for each.
    struct Variant {
      AttentionKernel kernel = nullptr;
      size_t smem = 0;
      int threads = 0;
    } variants[2];
    int num_variants = pl.kv_fp8 ? 2 : 1;
    for (int v = 0; v < num_variants; ++v) {
      Variant& x = variants[v];
      if (int r = plan_kernel(pl, v == 1, &x.kernel, &x.smem, &x.threads)) return r;
      if (v == 1 && x.kernel == variants[0].kernel) {
        num_variants = 1;
        break;
      }
      if ((int)x.smem > smem_optin) {
        ukv::set_error("attention needs " + std::to_string(x.smem) +
                       " bytes of shared memory per block, the device allows " + std::to_string(smem_optin));
        return UKV_SHIM_INVALID;
      }
      if (int r = configure(x.kernel, x.smem)) return r;
    }
    // Blocks of the portable kernel (52 or 59 KB of shared memory) fit two per SM.
    const int resident = sms * (pl.portable != 0 ? 2 : pl.stages == 1 ? 2 : 1);
    // sm_90+: a token's splits form one thread-block cluster and merge through
    // distributed shared memory (no workspace, no second kernel), at most 16 of
    // them; elsewhere, or when no such cluster can be scheduled, they go
    // through the workspace and the combine kernel.
    pl.cluster = 0;
    pl.max_splits = split_cap(max_tokens, pl.head_blocks, resident, kMaxSplits);
    if (cc_major >= 9 && !g_no_cluster && pl.portable == 0) {
      // The most splits per token such that every (token, head block) cluster
      // is resident at once: a cluster needs its blocks on one GPC, so fewer
      // fit than resident / S (16-block clusters fit about one per GPC).
      const int want = split_cap(max_tokens, pl.head_blocks, resident, kMaxClusterSplits);
      for (int v = 0; v < num_variants && want > 1; ++v) {
        const ukv_error_t le = ukv_func_allow_large_clusters(variants[v].kernel);
        if (le != UKV_SUCCESS) return ukv::report(le, "attention clusters");
      }
      for (int splits = want; splits >= 1; --splits) {
        int clusters = max_tokens * pl.head_blocks;
        for (int v = 0; v < num_variants && splits > 1; ++v) {
          int fit = 0;
          const Variant& x = variants[v];
          const ukv_error_t ce = ukv_max_active_clusters(x.kernel, dim3(x.threads), x.smem, splits, &fit);
          if (ce != UKV_SUCCESS) return ukv::report(ce, "attention cluster occupancy");
          clusters = fit < clusters ? fit : clusters;
        }
        if (clusters >= max_tokens * pl.head_blocks) {
          pl.cluster = 1;
          pl.max_splits = splits;
          break;
        }
      }
    }
    const size_t records =
        pl.cluster == 0 && pl.max_splits > 1 ? (size_t)max_tokens * pl.head_blocks * pl.max_splits : 0;
    pl.workspace_bytes = (int64_t)(records * partial_floats(16 * pl.block_m_tiles) * sizeof(float));
    *plan = pl;
    return UKV_SHIM_OK;
  })
}

int unikv_gpu_attention(int device, const ukv_attention_plan* plan, const ukv_attention_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_tokens == 0) return UKV_SHIM_OK;
    ukv_stream_t s = (ukv_stream_t)stream;
    if (p->num_tokens > plan->max_tokens) {
      ukv::set_error("num_tokens exceeds the plan's max_tokens");
      return UKV_SHIM_INVALID;
    }
    const SplitConfig cfg{plan->max_splits, plan->cluster};
    AttentionKernel kernel = nullptr;
    size_t smem = 0;
    int threads = 0;
    if (int r = plan_kernel(*plan, raw_variant_applies(*p), &kernel, &smem, &threads)) return r;
    // Launched early (PDL) so its launch overlaps the previous kernel's tail;
    // it waits for that kernel's memory before reading any input.
    const bool early = plan->dependent_launch != 0;
    const int cluster_z = cfg.cluster != 0 && cfg.splits > 1 ? cfg.splits : 1;
    const ukv_error_t launched = ukv_launch_dependent(kernel, dim3(p->num_tokens, plan->head_blocks, cfg.splits),
                                                      dim3(threads), smem, s, early, cluster_z, *p, cfg);
    if (launched != UKV_SUCCESS) return ukv::report(launched, "attention_kernel");
    if (cfg.splits == 1 || cfg.cluster != 0) return UKV_SHIM_OK;
    ukv_error_t e = ukv_launch_dependent(combine_kernel, dim3(p->num_tokens, p->num_heads), dim3(kD / 4), 0, s,
                                         early, 1, *p, cfg, 16 * plan->block_m_tiles);
    return e == UKV_SUCCESS ? UKV_SHIM_OK : ukv::report(e, "combine_kernel");
  })
}

void unikv_gpu_test_plan_fallbacks(int no_cluster, int no_wgmma) {
  g_no_cluster = no_cluster != 0;
  g_no_wgmma = no_wgmma != 0;
}

void unikv_gpu_test_plan_portable(int variant) { g_portable = variant; }

int unikv_gpu_merge(int device, const ukv_merge_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_tokens == 0) return UKV_SHIM_OK;
    merge_kernel<<<dim3(p->num_tokens, p->num_heads), kD / 4, 0, (ukv_stream_t)stream>>>(*p);
    return ukv::check_launch("merge_kernel");
  })
}

}  // extern "C"
