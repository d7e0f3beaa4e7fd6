// store_flashmla probe (H200): how close can the FlashMLA FP8 store get to
// the copy bandwidth at T = 8192, and which of tokens per warp, block size and
// streaming cache hints moves it? Each variant is the library kernel's math
// (kernels/cache_store.cu, e4m3fn) with one knob changed, timed as the
// benchmark times it: a CUDA graph of calls with programmatic dependent
// launch, each call on fresh rows (3x L2 of inputs) and random locations
// (half the slots of 64-token pages). A plain kernel that moves the same bytes
// (rows in, contiguous 584-byte records out) gives this size's practical
// ceiling. The block-size gain reached the library only once its kernels
// stopped branching per thread on the location type (bench/notes/v23.md
// and v24.md). Build and run on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90a -I kernels bench/probes/store_flashmla.cu -o /tmp/sf && /tmp/sf
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "fp8.cuh"

#include "probe.cuh"

constexpr int kT = 8192, kDims = 512, kPage = 64, kPageShift = 6;
constexpr int64_t kPageBytes = 37440;  // ceil(584 * 64 / 576) * 576
constexpr int kSlots = 2 * kT;
constexpr int kPages = kSlots / kPage;

struct Params {
  const uint16_t* rows;
  const int32_t* loc;
  uint8_t* cache;
};

template <bool kHints>
__device__ __forceinline__ uint4 load16(const uint4* p) {
  if constexpr (kHints) return __ldcs(p);
  return *p;
}
template <bool kHints>
__device__ __forceinline__ void store16(uint4* p, uint4 v) {
  if constexpr (kHints) {
    __stcs(p, v);
  } else {
    *p = v;
  }
}

template <int TPW, bool kHints>
__device__ __forceinline__ void token(const Params& p, int64_t loc, const uint4& a, const uint4& b, int lane) {
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  float x[16];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[2 * i] = __uint_as_float(w[i] << 16);
    x[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(x[i]));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
  const int64_t page = loc >> kPageShift, slot = loc & (kPage - 1);
  uint8_t* base = p.cache + page * kPageBytes;
  uint8_t* value = base + slot * 576;
  if (lane < 28) {
    const uint8_t byte = ukv_ue8m0_scale_byte(m, UKV_FP8_E4M3FN);
    const float inv = ukv_ue8m0_inverse(byte);
    uint32_t c[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      c[i] = (uint32_t)ukv_fp8x2_encode_e4m3fn(x[4 * i] * inv, x[4 * i + 1] * inv) |
             ((uint32_t)ukv_fp8x2_encode_e4m3fn(x[4 * i + 2] * inv, x[4 * i + 3] * inv) << 16);
    store16<kHints>(reinterpret_cast<uint4*>(value + lane * 16), make_uint4(c[0], c[1], c[2], c[3]));
    if (lane % 4 == 0) base[576 * kPage + slot * 8 + lane / 4] = byte;
  } else {
    uint4* dst = reinterpret_cast<uint4*>(value + 448 + (lane - 28) * 32);
    store16<kHints>(dst, a);
    store16<kHints>(dst + 1, b);
  }
}

template <int TPW, int kThreads, bool kHints>
__global__ void __launch_bounds__(kThreads) store_kernel(Params p) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int lane = threadIdx.x % 32;
  const int64_t first = ((int64_t)blockIdx.x * kThreads + threadIdx.x) / 32 * TPW;
  int64_t loc[TPW];
  uint4 a[TPW], b[TPW];
#pragma unroll
  for (int j = 0; j < TPW; ++j) {
    const int64_t t = first + j;
    loc[j] = -1;
    if (t >= kT) continue;
    loc[j] = p.loc[t];
    const uint4* src = reinterpret_cast<const uint4*>(p.rows + t * kDims + lane * 16);
    a[j] = load16<kHints>(src);
    b[j] = load16<kHints>(src + 1);
  }
#pragma unroll
  for (int j = 0; j < TPW; ++j)
    if (loc[j] >= 0) token<TPW, kHints>(p, loc[j], a[j], b[j], lane);
}

// The same bytes as a store: 1024 in and 584 out per token, no math.
__global__ void __launch_bounds__(128) move_kernel(Params p) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int lane = threadIdx.x % 32;
  const int64_t t0 = ((int64_t)blockIdx.x * 128 + threadIdx.x) / 32 * 2;
  uint4 a[2], b[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const uint4* src = reinterpret_cast<const uint4*>(p.rows + (t0 + j) * kDims + lane * 16);
    a[j] = src[0];
    b[j] = src[1];
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    uint4* dst = reinterpret_cast<uint4*>(p.cache + (t0 + j) * 584 / 16 * 16);
    const uint4 v = make_uint4(a[j].x ^ b[j].x, a[j].y ^ b[j].y, a[j].z ^ b[j].z, a[j].w ^ b[j].w);
    if (lane < 36) dst[lane] = v;  // 576 bytes
  }
}

using Kernel = void (*)(Params);

float per_call_us(Kernel k, int threads, int tokens_per_block, const std::vector<Params>& sets, cudaStream_t s) {
  return per_call_us(s, (int)sets.size(), [&](int i, cudaLaunchConfig_t cfg) {
    cfg.gridDim = dim3((kT + tokens_per_block - 1) / tokens_per_block);
    cfg.blockDim = dim3(threads);
    CHECK(cudaLaunchKernelEx(&cfg, k, sets[i]));
  });
}

int main() {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double copy_bw = copy_ceiling(s);

  const int sets = 18;  // 3 x 50 MB of rows
  std::mt19937 rng(7);
  uint16_t* rows = random_bf16_device((size_t)sets * kT * kDims, rng);
  uint8_t* cache;
  CHECK(cudaMalloc(&cache, (size_t)kPages * kPageBytes));
  CHECK(cudaMemset(cache, 0, (size_t)kPages * kPageBytes));
  std::vector<Params> params;
  std::vector<int32_t> slots(kSlots);
  for (int i = 0; i < kSlots; ++i) slots[i] = i;
  for (int i = 0; i < sets; ++i) {
    std::shuffle(slots.begin(), slots.end(), rng);
    int32_t* loc;
    CHECK(cudaMalloc(&loc, kT * 4));
    CHECK(cudaMemcpy(loc, slots.data(), kT * 4, cudaMemcpyHostToDevice));
    params.push_back(Params{rows + (size_t)i * kT * kDims, loc, cache});
  }
  const double bytes = (double)kT * (1024 + 4 + 584);
  std::printf("copy ceiling %.2f TB/s; T = %d, %.1f MB per call, floor %.2f us\n", copy_bw / 1e12, kT, bytes / 1e6,
              bytes / copy_bw * 1e6);
  struct V {
    const char* name;
    Kernel k;
    int threads, tpb;
  } vs[] = {
      {"2 tok/warp, 128 thr (version 18)", store_kernel<2, 128, false>, 128, 8},
      {"1 tok/warp, 128 thr", store_kernel<1, 128, false>, 128, 4},
      {"4 tok/warp, 128 thr", store_kernel<4, 128, false>, 128, 16},
      {"2 tok/warp, 256 thr (library)", store_kernel<2, 256, false>, 256, 16},
      {"1 tok/warp, 256 thr", store_kernel<1, 256, false>, 256, 8},
      {"2 tok/warp, 512 thr", store_kernel<2, 512, false>, 512, 32},
      {"2 tok/warp, 128 thr, .cs hints", store_kernel<2, 128, true>, 128, 8},
      {"4 tok/warp, 128 thr, .cs hints", store_kernel<4, 128, true>, 128, 16},
      {"same bytes, no math (move)", move_kernel, 128, 8},
  };
  for (const V& v : vs) {
    const float us = per_call_us(v.k, v.threads, v.tpb, params, s);
    std::printf("| %-32s | %7.2f us | %6.0f GB/s | %5.1f%% |\n", v.name, us, bytes / (us * 1e-6) / 1e9,
                100.0 * bytes / copy_bw / (us * 1e-6));
  }
  return 0;
}
