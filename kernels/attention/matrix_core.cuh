// A 16x16x16 bf16 matrix product with fp32 accumulation over one 64-thread
// group, in the operand layout of CDNA's v_mfma_f32_16x16x16bf16_1k. On gfx90a
// and gfx94x/gfx950 it is that instruction (the group is the wave64); on every
// other target it is an exact software model of it through shared memory, so
// code written against this layout runs everywhere: on NVIDIA it is how the
// H200 tests check the matrix-core kernel's fragment indexing against the CPU
// backend (attention/portable.cuh).
//
// Layout (lane = thread % 64, g = lane / 16, r = lane % 16):
//   a: A[r][4g .. 4g + 3]  (A is 16 x 16, M x K), 4 bf16 in k order
//   b: B[4g .. 4g + 3][r]  (B is 16 x 16, K x N), 4 bf16 in k order
//   d: D[4g + i][r]        i = 0..3, fp32
// so a row-major A and a key-major B^T (rows of K, or of V read down a
// column) both give each lane 8 contiguous bytes.
#pragma once

#include "compat.cuh"

#if defined(__HIPCC__) && (defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || \
                           defined(__gfx942__) || defined(__gfx950__))
#define UKV_MFMA 1
#endif

struct UkvMmaAcc {
  float v[4];
};

// Bytes of shared memory per 64-thread group the software model exchanges
// operands through (unused where the instruction exists).
constexpr int kMmaScratchBytes = 64 * 16;

// d += A . B. Every thread of the block calls it at the same points (the
// software model synchronizes the block); `scratch` is this group's
// kMmaScratchBytes, 8-byte aligned.
__device__ __forceinline__ void ukv_mma16x16x16(UkvMmaAcc& d, uint2 a, uint2 b, char* scratch) {
#if defined(UKV_MFMA)
  typedef short short4_t __attribute__((ext_vector_type(4)));
  typedef float float4_t __attribute__((ext_vector_type(4)));
  short4_t av, bv;
  __builtin_memcpy(&av, &a, 8);
  __builtin_memcpy(&bv, &b, 8);
  float4_t c = {d.v[0], d.v[1], d.v[2], d.v[3]};
  c = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(av, bv, c, 0, 0, 0);
  (void)scratch;
#pragma unroll
  for (int i = 0; i < 4; ++i) d.v[i] = c[i];
#else
  const int lane = threadIdx.x % 64, g = lane / 16, r = lane % 16;
  uint2* a_s = reinterpret_cast<uint2*>(scratch);
  uint2* b_s = a_s + 64;
  a_s[lane] = a;
  b_s[lane] = b;
  __syncthreads();
  // Element k of A's row m sits in lane m + 16 (k / 4), slot k % 4; element k
  // of B's column n in lane n + 16 (k / 4).
  const uint16_t* a16 = reinterpret_cast<const uint16_t*>(a_s);
  const uint16_t* b16 = reinterpret_cast<const uint16_t*>(b_s);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = 4 * g + i;
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const float x = __uint_as_float((uint32_t)a16[(m + 16 * (k / 4)) * 4 + k % 4] << 16);
      const float y = __uint_as_float((uint32_t)b16[(r + 16 * (k / 4)) * 4 + k % 4] << 16);
      sum = fmaf(x, y, sum);
    }
    d.v[i] += sum;
  }
  __syncthreads();  // the scratch is rewritten by the next call
#endif
}
