// Device side of the FP8 codec test (tests/gpu/fp8_codec.rs, through the test hook
// unikv::ffi::test_hooks::gpu_fp8_check): every value through the software
// encoder, the hardware-or-software pair encoder (byte order included) and the
// UE8M0 scale, and every code decoded, for comparison with src/fp8.rs.
#include "../fp8.cuh"
#include "../shim.cuh"

namespace {

__global__ void fp8_check_kernel(ukv_fp8_check_params p) {
  const ukv_fp8_format fmt = (ukv_fp8_format)p.format;
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 256) p.decoded[i] = ukv_fp8_decode((uint8_t)i, fmt);
  if (2 * i >= p.n) return;
  const float lo = p.x[2 * i];
  const float hi = 2 * i + 1 < p.n ? p.x[2 * i + 1] : 0.f;
  uint16_t pair;
  if (fmt == UKV_FP8_E4M3FN) {
    pair = ukv_fp8x2_encode_e4m3fn(lo, hi);
  } else {
    pair = (uint16_t)(ukv_fp8_encode(lo, fmt) | ((uint32_t)ukv_fp8_encode(hi, fmt) << 8));
  }
  p.sw[2 * i] = ukv_fp8_encode_sw(lo, fmt);
  p.hw[2 * i] = (uint8_t)(pair & 0xFFu);
  p.scale[2 * i] = ukv_ue8m0_scale_byte(fabsf(lo), fmt);
  if (2 * i + 1 < p.n) {
    p.sw[2 * i + 1] = ukv_fp8_encode_sw(hi, fmt);
    p.hw[2 * i + 1] = (uint8_t)(pair >> 8);
    p.scale[2 * i + 1] = ukv_ue8m0_scale_byte(fabsf(hi), fmt);
  }
}

}  // namespace

extern "C" int unikv_gpu_fp8_check(int device, const ukv_fp8_check_params* p, void* stream) {
  UKV_ENTRY(device, {
    const int64_t pairs = (p->n + 1) / 2;
    const int64_t threads = pairs > 256 ? pairs : 256;
    const unsigned blocks = (unsigned)ukv::cdiv(threads, 256);
    fp8_check_kernel<<<blocks, 256, 0, (ukv_stream_t)stream>>>(*p);
    return ukv::check_launch("fp8_check_kernel");
  })
}
