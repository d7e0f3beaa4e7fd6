// Writing one 512-value latent row into a pool layer's row, shared by every
// kernel that stores rows (store.cu, prepare.cu): bf16 pools take the row as
// is; FP8 pools (docs/fp8.md §4) quantize it exactly as
// src/cache_layouts/unified.rs does, so every writer gives the same bytes.
#pragma once

#include <cstdint>
#include <cstring>

#include "fp8.cuh"
#include "params.h"

// A run of Bytes bytes moved as one aligned load or store.
template <int Bytes>
struct ukv_chunk;
template <>
struct ukv_chunk<4> {
  typedef uint32_t type;
};
template <>
struct ukv_chunk<8> {
  typedef uint2 type;
};
template <>
struct ukv_chunk<16> {
  typedef uint4 type;
};

// Stores Bytes bytes (a multiple of 4) from 32-bit words; `dst` is aligned to Bytes.
template <int Bytes>
__device__ __forceinline__ void ukv_store_chunk(void* dst, const uint32_t* words) {
  typename ukv_chunk<Bytes>::type v;
  memcpy(&v, words, Bytes);
  *reinterpret_cast<typename ukv_chunk<Bytes>::type*>(dst) = v;
}

// Stores this thread's N consecutive values (N = 4 or 8: one 8- or 16-byte
// vector) of the row at pool row `row`; they start at dim `dim` (a multiple
// of N) and arrive as packed bf16 pairs, the lower dim in the low half.
//
// FP8 rows: the lanes holding one 64-dim tile must be an aligned group of
// 64/N lanes of one warp, and every lane of the warp must call this (the tile
// amax is a shuffle reduction across the group). The group's first lane
// writes the tile's scale byte twice; the lanes of dims 448..511 copy the bf16
// rope dims into the rope row and zero the nope row's 50 pad bytes.
template <int N>
__device__ __forceinline__ void ukv_store_pool_row(const ukv_pool_rows& pool, int64_t row, int dim,
                                                   const uint32_t (&bits)[N / 2]) {
  static_assert(N == 4 || N == 8, "a thread stores one 8- or 16-byte vector");
  constexpr int kBytes = 2 * N;
  if (!pool.fp8) {
    ukv_store_chunk<kBytes>(static_cast<ukv_bf16*>(pool.data) + row * 512 + dim, bits);
    return;
  }
  float v[N];
  for (int i = 0; i < N / 2; ++i) {
    v[2 * i] = ukv_fp8_bits_float(bits[i] << 16);
    v[2 * i + 1] = ukv_fp8_bits_float(bits[i] & 0xFFFF0000u);
  }
  uint8_t scale;
  uint32_t codes[N / 4];
  ukv_fp8_quantize_tile<N>(v, (ukv_fp8_format)pool.fp8_format, &scale, codes);
  uint8_t* nope = static_cast<uint8_t*>(pool.data) + row * 512;
  if (dim < 448) {
    ukv_store_chunk<N>(nope + dim, codes);
    if (dim % 64 == 0) {
      const uint32_t twice = scale * 0x0101u;
      reinterpret_cast<uint16_t*>(nope + 448)[dim / 64] = (uint16_t)twice;
    }
    return;
  }
  ukv_store_chunk<kBytes>(static_cast<ukv_bf16*>(pool.rope) + row * 64 + (dim - 448), bits);
  // Pad bytes 462..511: the first 48/N rope lanes zero 464..511, the next 462..463.
  const int lane = (dim - 448) / N;
  const uint32_t zeros[N / 4] = {};
  if (lane < 48 / N) {
    ukv_store_chunk<N>(nope + 464 + N * lane, zeros);
  } else if (lane == 48 / N) {
    reinterpret_cast<uint16_t*>(nope + 462)[0] = 0;
  }
}
