// FP8 E4M3 codec (e4m3fn, e4m3fnuz) and UE8M0 scales: the device twin of
// src/fp8.rs, bit-identical to it for every input (docs/fp8.md §2).
//
// Integer and bit operations plus one IEEE fp32 division, no vendor names, so it
// compiles unchanged for CUDA and HIP and on the host. It is the encoder for
// fnuz and for targets without a hardware e4m3 conversion (sm_80, gfx942);
// ukv_fp8_encode below picks the hardware conversion where compat.cuh has one
// (same results).
//
// - Encoding rounds to nearest even; finite overflow and +-Inf saturate to
//   +-max; every NaN encodes as 0x7F for fn (whatever its sign: that is what
//   the hardware conversion gives on an H200) and 0x80 for fnuz; fnuz has no
//   negative zero (-0 and negative underflow give 0x00). Callers must not clip
//   with fminf/fmaxf first: that turns NaN into max.
// - The clip bound and the UE8M0 scale divisor are the format's max: 448 for fn
//   and 240 for fnuz. sglang's HIP C++ kernels divide fnuz tiles by 224, so fnuz
//   pools written here are NOT byte-compatible with pools written by them (the
//   Triton kernels use 240, as here).
// - Tiles are quantized from bf16-rounded values: byte = ukv_ue8m0_scale_byte(amax)
//   with amax the NaN-ignoring max of |v|, then code = encode(v / ukv_ue8m0_to_float(byte)).
//   Multiplying by an exact inverse 2^(127-byte) gives the same bits; building the
//   inverse as the fp32 with exponent field (254 - byte) does not at byte 254
//   (Inf in the tile), where that field is 0.
// - Needs IEEE division and no flush-to-zero of the scale: do not compile with
//   --use_fast_math (-prec-div=false, -ftz=true).
#pragma once

#include <cstdint>
#include <cstring>

#include "compat.cuh"
#include "warp.cuh"

// The format is always an explicit argument, never implied by the platform.
enum ukv_fp8_format : uint32_t {
  UKV_FP8_E4M3FN = 0,    // bias 7, max 448 (0x7E), NaN 0x7F (0xFF decodes as NaN), signed zero
  UKV_FP8_E4M3FNUZ = 1,  // bias 8, max 240 (0x7F), NaN 0x80 only, no -0
};

__host__ __device__ inline uint32_t ukv_fp8_float_bits(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}

__host__ __device__ inline float ukv_fp8_bits_float(uint32_t b) {
  float x;
  memcpy(&x, &b, sizeof x);
  return x;
}

__host__ __device__ inline float ukv_fp8_max(ukv_fp8_format fmt) {
  return fmt == UKV_FP8_E4M3FNUZ ? 240.0f : 448.0f;
}

__host__ __device__ inline int ukv_fp8_bias(ukv_fp8_format fmt) { return fmt == UKV_FP8_E4M3FNUZ ? 8 : 7; }

// Magnitude bits (code without sign) of the format's max.
__host__ __device__ inline uint32_t ukv_fp8_max_code(ukv_fp8_format fmt) {
  return fmt == UKV_FP8_E4M3FNUZ ? 0x7Fu : 0x7Eu;
}

// FP8 magnitude bits nearest (ties to even) to a non-NaN fp32 magnitude, before
// saturation. The 24-bit significand is shifted so one kept unit is one FP8
// mantissa step: 20 bits dropped for normal results, one more per binade below
// the smallest normal; a normal result adds its exponent on top of the kept
// 1.mmm so a rounding carry moves into the exponent by itself.
__host__ __device__ inline uint32_t ukv_fp8_round_magnitude(uint32_t abs_bits, ukv_fp8_format fmt) {
  const int exp = (int)(abs_bits >> 23);
  const uint32_t significand = (abs_bits & 0x7FFFFFu) | (exp > 0 ? 0x800000u : 0u);
  const int e8 = exp - 127 + ukv_fp8_bias(fmt);  // FP8 biased exponent if normal
  const int shift = 20 + (e8 < 1 ? 1 - e8 : 0);
  if (shift > 24) return 0;  // below half the smallest subnormal
  const uint32_t kept = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  const uint32_t round_up = (rest > half || (rest == half && (kept & 1u))) ? 1u : 0u;
  const uint32_t exponent_base = (uint32_t)(e8 > 1 ? e8 - 1 : 0) << 3;
  return exponent_base + kept + round_up;
}

// fp32 -> FP8 in software; equals the hardware cvt.rn.satfinite for fn.
__host__ __device__ inline uint8_t ukv_fp8_encode_sw(float x, ukv_fp8_format fmt) {
  const uint32_t bits = ukv_fp8_float_bits(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return fmt == UKV_FP8_E4M3FNUZ ? 0x80 : 0x7F;
  uint32_t magnitude = ukv_fp8_round_magnitude(abs_bits, fmt);
  const uint32_t max_code = ukv_fp8_max_code(fmt);
  if (magnitude > max_code) magnitude = max_code;
  if (fmt == UKV_FP8_E4M3FNUZ && magnitude == 0) return 0;
  return (uint8_t)(sign | magnitude);
}

// FP8 -> fp32, exact for every finite code; NaN codes give the NaN 0x7FC00000.
__host__ __device__ inline float ukv_fp8_decode(uint8_t code, ukv_fp8_format fmt) {
  const bool nan = fmt == UKV_FP8_E4M3FNUZ ? code == 0x80 : (code & 0x7F) == 0x7F;
  if (nan) return ukv_fp8_bits_float(0x7FC00000u);
  const int exp_field = (code >> 3) & 0xF;
  const uint32_t mantissa = code & 0x7u;
  // Subnormals share the smallest normal's exponent, without the implicit 1.
  const uint32_t significand = exp_field == 0 ? mantissa : 8u + mantissa;
  const int exp = (exp_field == 0 ? 1 : exp_field) - ukv_fp8_bias(fmt) - 3;
  const float magnitude = (float)significand * ukv_fp8_bits_float((uint32_t)(exp + 127) << 23);
  return (code & 0x80) ? -magnitude : magnitude;
}

// UE8M0 byte of a tile: max(amax, 1e-4) / max as one fp32 division, rounded up
// to a power of two by the exponent bits (+1 when any mantissa bit is set;
// exact powers stay), clamped to 254. The comparison keeps 1e-4 for a NaN amax,
// like Rust's f32::max.
__host__ __device__ inline uint8_t ukv_ue8m0_scale_byte(float amax, ukv_fp8_format fmt) {
  const float floored = amax > 1e-4f ? amax : 1e-4f;
  const uint32_t bits = ukv_fp8_float_bits(floored / ukv_fp8_max(fmt));
  const uint32_t e = (bits >> 23) + ((bits & 0x7FFFFFu) != 0 ? 1u : 0u);
  return (uint8_t)(e < 254u ? e : 254u);
}

// The scale 2^(byte-127): byte 0 is the subnormal 2^-127, 255 the E8M0 NaN.
__host__ __device__ inline float ukv_ue8m0_to_float(uint8_t byte) {
  if (byte == 0) return ukv_fp8_bits_float(0x00400000u);
  if (byte == 255) return ukv_fp8_bits_float(0x7FC00000u);
  return ukv_fp8_bits_float((uint32_t)byte << 23);
}

// The exact inverse 2^(127-byte) of a UE8M0 scale byte below 255: a normal
// float up to byte 253, the subnormal 2^-127 at 254 (an Inf in the tile).
// Multiplying by it gives the bits of dividing by ukv_ue8m0_to_float(byte) as
// long as subnormals are not flushed (see the note on --use_fast_math above).
__host__ __device__ inline float ukv_ue8m0_inverse(uint8_t byte) {
  return byte < 254 ? ukv_fp8_bits_float((uint32_t)(254 - byte) << 23) : ukv_fp8_bits_float(0x00400000u);
}

// Two values to e4m3fn, `lo` in the low byte: one hardware conversion where
// the target has it, the software codec otherwise.
__device__ __forceinline__ uint16_t ukv_fp8x2_encode_e4m3fn(float lo, float hi) {
#if defined(UKV_HAS_E4M3_CVT)
  return ukv_cvt_e4m3x2(lo, hi);
#else
  return (uint16_t)(ukv_fp8_encode_sw(lo, UKV_FP8_E4M3FN) | ((uint32_t)ukv_fp8_encode_sw(hi, UKV_FP8_E4M3FN) << 8));
#endif
}

// One value in either format (fnuz always in software: NVIDIA hardware does
// not convert to it).
__device__ __forceinline__ uint8_t ukv_fp8_encode(float x, ukv_fp8_format fmt) {
  if (fmt == UKV_FP8_E4M3FN) return (uint8_t)(ukv_fp8x2_encode_e4m3fn(x, 0.f) & 0xFFu);
  return ukv_fp8_encode_sw(x, fmt);
}

// Four values to codes packed little-endian (v[0] in the low byte).
__device__ __forceinline__ uint32_t ukv_fp8x4_encode(const float (&v)[4], ukv_fp8_format fmt) {
  if (fmt == UKV_FP8_E4M3FN)
    return (uint32_t)ukv_fp8x2_encode_e4m3fn(v[0], v[1]) | ((uint32_t)ukv_fp8x2_encode_e4m3fn(v[2], v[3]) << 16);
  uint32_t codes = 0;
  for (int i = 0; i < 4; ++i) codes |= (uint32_t)ukv_fp8_encode_sw(v[i], fmt) << (8 * i);
  return codes;
}

// One 64-value tile held N consecutive values per lane (N = 4 or 8) by the
// 64/N lanes of an aligned group of the warp (all 32 lanes call it): the tile's
// UE8M0 byte (NaN-ignoring amax over the group, as src/fp8.rs quantize_block)
// and this lane's N codes, 4 per word (v[0] in the low byte of codes[0]). `v`
// holds bf16-representable values.
template <int N>
__device__ __forceinline__ void ukv_fp8_quantize_tile(const float (&v)[N], ukv_fp8_format fmt, uint8_t* scale_byte,
                                                      uint32_t (&codes)[N / 4]) {
  static_assert(N == 4 || N == 8, "a lane holds 4 or 8 values of a tile");
  float amax = 0.f;
  // fmaxf drops NaN operands, so a NaN never becomes the amax (Rust's f32::max).
  for (int i = 0; i < N; ++i) amax = fmaxf(amax, fabsf(v[i]));
  amax = ukv_xor_max<32 / N, 1>(amax);
  const uint8_t byte = ukv_ue8m0_scale_byte(amax, fmt);
  const float scale = ukv_ue8m0_to_float(byte);
  for (int w = 0; w < N / 4; ++w) {
    float q[4];
    for (int i = 0; i < 4; ++i) q[i] = v[4 * w + i] / scale;
    codes[w] = ukv_fp8x4_encode(q, fmt);
  }
  *scale_byte = byte;
}

// Two codes (the low byte first) to their exact fp32 values: the hardware
// conversion for e4m3fn where present, the software decoder otherwise.
__device__ __forceinline__ void ukv_fp8x2_decode(uint32_t codes, ukv_fp8_format fmt, float& lo, float& hi) {
#if defined(UKV_HAS_E4M3_CVT)
  if (fmt == UKV_FP8_E4M3FN) {
    ukv_cvt_e4m3x2_to_float2((uint16_t)codes, lo, hi);
    return;
  }
#endif
  lo = ukv_fp8_decode((uint8_t)codes, fmt);
  hi = ukv_fp8_decode((uint8_t)(codes >> 8), fmt);
}
