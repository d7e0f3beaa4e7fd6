// store_indexer probe (H200): how far is the indexer key-cache store from
// what any call moving its bytes can do? The issue asks for 70% of the copy
// bandwidth at T = 8192 (3.2 MB, a 0.76 us floor at 4.2 TB/s). Timed as the
// benchmark times it: a CUDA graph of calls with programmatic dependent launch,
// 64 input sets (3x L2 of rows at most), random distinct locations over twice
// T slots of 64-key pages (so the 2.1 MB cache stays in L2, as in the bench).
// Rows: the library kernel (kernels/cache_store.cu, e4m3fn, bf16 keys, int32
// locations, included as compiled into libunikv); kernels that move the same
// bytes with no math (codes and scale, or codes only); an empty kernel.
// Build and run on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90a -I kernels bench/probes/store_indexer.cu kernels/shim.cu -o /tmp/si && /tmp/si
// (-I DIR before -I kernels times a modified DIR/cache_store.cu instead.)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "cache_store.cu"

#include "probe.cuh"

namespace {

// cache_store.cu's kKeyDims: a key's dims, its codes' bytes.
constexpr int kKeyBytes = kKeyDims * 2, kPage = 64, kPageShift = 6;
constexpr int64_t kPageBytes = (kKeyDims + 4) * kPage;

// Eight lanes per key as in the library: each loads its 32 bytes and stores
// 16 (the key's codes' share), lane 0 of the key also its 4-byte scale.
template <bool kScale>
__global__ void __launch_bounds__(128) move_kernel(ukv_cache_store_params p) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int part = threadIdx.x % 8;
  const int64_t t = ((int64_t)blockIdx.x * 128 + threadIdx.x) / 8;
  if (t >= p.num_tokens) return;
  const int64_t loc = static_cast<const int32_t*>(p.loc)[t];
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const char*>(p.rows) + t * kKeyBytes) + 2 * part;
  const uint4 a = src[0], b = src[1];
  uint8_t* page_base = p.cache + (loc >> kPageShift) * kPageBytes;
  const int64_t slot = loc & (kPage - 1);
  *reinterpret_cast<uint4*>(page_base + slot * kKeyDims + part * 16) =
      make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
  if (kScale && part == 0) *reinterpret_cast<uint32_t*>(page_base + kKeyDims * kPage + slot * 4) = a.x;
}

}  // namespace

int main() {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double copy_bw = copy_ceiling(s);
  std::printf("copy ceiling %.2f TB/s\n| kernel | T | us per call | GB/s | of the floor |\n|---|---|---|---|---|\n",
              copy_bw / 1e12);
  std::mt19937 rng(7);
  for (const int t : {64, 8192}) {
    const int pages = (2 * t + kPage - 1) / kPage, sets = 64;
    char* rows = reinterpret_cast<char*>(random_bf16_device((size_t)sets * t * kKeyBytes / 2, rng));
    uint8_t* cache;
    CHECK(cudaMalloc(&cache, (size_t)pages * kPageBytes));
    CHECK(cudaMemset(cache, 0, (size_t)pages * kPageBytes));
    std::vector<int32_t> slots(pages * kPage);
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = (int32_t)i;
    std::vector<ukv_cache_store_params> params;
    for (int i = 0; i < sets; ++i) {
      std::shuffle(slots.begin(), slots.end(), rng);
      int32_t* loc;
      CHECK(cudaMalloc(&loc, t * 4));
      CHECK(cudaMemcpy(loc, slots.data(), t * 4, cudaMemcpyHostToDevice));
      ukv_cache_store_params p{};
      p.rows = rows + (size_t)i * t * kKeyBytes;
      p.loc = loc;
      p.cache = cache;
      p.row_stride = kKeyBytes / 2;
      p.bytes_per_page = kPageBytes;
      p.token_slots = (int64_t)pages * kPage;
      p.num_tokens = t;
      p.page_shift = kPageShift;
      p.format = UKV_FP8_E4M3FN;
      params.push_back(p);
    }
    const double bytes = (double)t * (kKeyBytes + 4 + kKeyDims + 4);
    const auto row = [&](const char* name, Kernel k, int grid) {
      const float us = per_call_us(s, sets, [&](int i, cudaLaunchConfig_t cfg) {
        cfg.gridDim = dim3(grid);
        CHECK(cudaLaunchKernelEx(&cfg, k, params[i]));
      });
      std::printf("| %s | %d | %.2f | %.0f | %.1f%% |\n", name, t, us, bytes / (us * 1e-6) / 1e9,
                  100.0 * bytes / copy_bw / (us * 1e-6));
    };
    const int grid = (t + 15) / 16;
    row("library", store_indexer_kernel<UKV_FP8_E4M3FN, ukv_bf16, int32_t>, grid);
    row("move: codes and scale", move_kernel<true>, grid);
    row("move: codes only", move_kernel<false>, grid);
    const float us = empty_call_us(s, sets);
    std::printf("| empty kernel | %d | %.2f | | |\n", t, us);
    for (auto& p : params) CHECK(cudaFree(const_cast<void*>(p.loc)));
    CHECK(cudaFree(rows));
    CHECK(cudaFree(cache));
  }
  return 0;
}
