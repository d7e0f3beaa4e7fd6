// Row-gather probe (H200): how fast can one SM pull random 1 KB rows into
// shared memory with each copy mechanism, at 1 and 2 blocks per SM and with
// few SMs (the small-batch decode case)? Decides how attention gathers its key
// tiles (bench/notes/v09.md). Build and run on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90a bench/probes/gather.cu -o /tmp/gather && /tmp/gather
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda_check.cuh"

constexpr int kRowBytes = 1024;
constexpr int kTileRows = 64;
constexpr int kStages = 3;
constexpr int kTileBytes = kTileRows * kRowBytes;

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t* b) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(b)));
}
__device__ __forceinline__ void mbar_expect(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
  asm volatile("{\n.reg .pred d;\nW:\nmbarrier.try_wait.parity.shared::cta.b64 d, [%0], %1;\n@!d bra W;\n}\n" ::"r"(
                   smem_u32(b)),
               "r"(parity)
               : "memory");
}

// mode 0: cp.async 16 B by all 256 threads; 1: one 1 KB bulk copy per row from
// warp 0; 2: bulk copies from all 8 warps; 3: 8 tensor boxes of 128 B per row
// (warp 0); 4: two 512 B bulk copies per row (warp 0).
template <int kMode>
__global__ void __launch_bounds__(256) gather(const char* pool, const int* idx, int tiles_per_block,
                                              const __grid_constant__ CUtensorMap map, float* sink) {
  extern __shared__ __align__(1024) char smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kStages * kTileBytes);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(&bars[s]);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int* my = idx + (size_t)blockIdx.x * tiles_per_block * kTileRows;
  float acc = 0.f;
  auto issue = [&](int tile) {
    const int stage = tile % kStages;
    char* dst = smem + stage * kTileBytes;
    const int* rows = my + tile * kTileRows;
    if (kMode == 0) {
      for (int c = threadIdx.x; c < kTileRows * 64; c += 256) {
        const int r = c / 64, ch = c % 64;
        const char* src = pool + (size_t)rows[r] * kRowBytes + ch * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst + r * kRowBytes + ch * 16)), "l"(src));
      }
      asm volatile("cp.async.commit_group;\n" ::);
    } else if (kMode == 2) {
      if (threadIdx.x == 0) mbar_expect(&bars[stage], kTileBytes);
      __syncthreads();
      if (lane < 8) {
        const int r = warp * 8 + lane;
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                smem_u32(dst + r * kRowBytes)),
            "l"(pool + (size_t)rows[r] * kRowBytes), "r"(kRowBytes), "r"(smem_u32(&bars[stage]))
            : "memory");
      }
    } else if (warp == 0) {
      if (lane == 0) mbar_expect(&bars[stage], kTileBytes);
      __syncwarp();
      for (int r = lane; r < kTileRows; r += 32) {
        const char* src = pool + (size_t)rows[r] * kRowBytes;
        if (kMode == 1) {
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                  smem_u32(dst + r * kRowBytes)),
              "l"(src), "r"(kRowBytes), "r"(smem_u32(&bars[stage]))
              : "memory");
        } else if (kMode == 4) {
          for (int h = 0; h < 2; ++h) {
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                    smem_u32(dst + r * kRowBytes + h * 512)),
                "l"(src + h * 512), "r"(512), "r"(smem_u32(&bars[stage]))
                : "memory");
          }
        } else {
          for (int a = 0; a < 8; ++a) {
            asm volatile(
                "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                "%3}], [%4];\n" ::"r"(smem_u32(dst + a * kTileRows * 128 + r * 128)),
                "l"(&map), "r"(a * 64), "r"(rows[r]), "r"(smem_u32(&bars[stage]))
                : "memory");
          }
        }
      }
    }
  };
  for (int i = 0; i < kStages - 1 && i < tiles_per_block; ++i) issue(i);
  for (int tile = 0; tile < tiles_per_block; ++tile) {
    if (tile + kStages - 1 < tiles_per_block) {
      __syncthreads();  // the stage being refilled was read last iteration
      issue(tile + kStages - 1);
    }
    if (kMode == 0) {
      const int ahead = min(kStages - 1, tiles_per_block - 1 - tile);
      if (ahead >= 2) asm volatile("cp.async.wait_group 2;\n" ::);
      else if (ahead == 1) asm volatile("cp.async.wait_group 1;\n" ::);
      else asm volatile("cp.async.wait_group 0;\n" ::);
    } else {
      mbar_wait(&bars[tile % kStages], (tile / kStages) & 1);
    }
    __syncthreads();
    acc += reinterpret_cast<const float*>(smem + (tile % kStages) * kTileBytes)[threadIdx.x * 61];
  }
  if (acc == 12345.f) *sink = acc;
}

int main() {
  const size_t rows = 1 << 20;  // 1 GiB pool
  char* pool;
  CHECK(cudaMalloc(&pool, rows * kRowBytes));
  CHECK(cudaMemset(pool, 1, rows * kRowBytes));
  float* sink;
  CHECK(cudaMalloc(&sink, 4));
  const int max_blocks = 264, tiles = 16;
  std::vector<int> h(max_blocks * tiles * kTileRows);
  std::mt19937 rng(1);
  for (auto& v : h) v = (int)(rng() % rows);
  int* idx;
  CHECK(cudaMalloc(&idx, h.size() * 4));
  CHECK(cudaMemcpy(idx, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  CUtensorMap map;
  const cuuint64_t dims[2] = {512, rows}, strides[1] = {kRowBytes};
  const cuuint32_t box[2] = {64, 1}, es[2] = {1, 1};
  reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, pool, dims, strides,
                                                         box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                                         CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  const int smem = kStages * kTileBytes + 64;
  const char* names[] = {"cp.async 16B x256 thr", "bulk 1KB, warp 0", "bulk 1KB, 8 warps", "tensor 128B boxes", "bulk 512B, warp 0"};
  auto run = [&](auto kernel, int mode, int blocks, int per_sm) {
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    kernel<<<blocks, 256, smem>>>(pool, idx, tiles, map, sink);
    CHECK(cudaDeviceSynchronize());
    cudaEventRecord(a);
    for (int i = 0; i < 5; ++i) kernel<<<blocks, 256, smem>>>(pool, idx, tiles, map, sink);
    cudaEventRecord(b);
    CHECK(cudaEventSynchronize(b));
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    const double bytes = 5.0 * blocks * tiles * kTileBytes;
    std::printf("| %-22s | %4d blocks (%d/SM) | %7.1f GB/s total | %6.1f GB/s per block |\n", names[mode], blocks, per_sm,
                bytes / (ms * 1e-3) / 1e9, bytes / (ms * 1e-3) / 1e9 / blocks);
  };
  // 3 stages x 64 KB: one block per SM. Grid sizes: 16 SMs, 132 SMs.
  for (int blocks : {16, 132}) {
    run(gather<0>, 0, blocks, 1);
    run(gather<1>, 1, blocks, 1);
    run(gather<2>, 2, blocks, 1);
    run(gather<3>, 3, blocks, 1);
    run(gather<4>, 4, blocks, 1);
  }
  return 0;
}
