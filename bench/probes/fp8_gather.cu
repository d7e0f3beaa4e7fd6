// FP8 row-gather probe (H200): how fast can 132 SMs pull random FP8 pool rows
// (a 512-byte nope row and a 128-byte rope row from two buffers,
// docs/fp8.md §4) into shared memory, against 1 KB bf16 rows, and what does
// the in-place dequantization add? Decides how attention gathers FP8 tiles
// (bench/notes/v13.md). Build and run on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90a bench/probes/fp8_gather.cu -o /tmp/fp8g && /tmp/fp8g
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda_check.cuh"

constexpr int kSlot = 1040;  // bytes per row slot in the tile (bf16 row + 16 B pad)
constexpr int kTileRows = 64;
constexpr int kStages = 3;
constexpr int kTileBytes = kTileRows * kSlot;

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t* b, int n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(n));
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
__device__ __forceinline__ void bulk(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
__device__ __forceinline__ void cp16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
}

// The integer dequantization of kernels/attention/gather.cuh, on one row slot.
// kKind 0: full; 1: no stores (results folded into `sink`); 2: stores raw
// chunks without converting.
template <int kKind = 0>
__device__ __forceinline__ void dequant_row(char* row, int lane, uint32_t& sink) {
  const uint4 c = *reinterpret_cast<const uint4*>(row + 16 * lane);
  uint4 rope = make_uint4(0, 0, 0, 0);
  if (lane < 8) rope = *reinterpret_cast<const uint4*>(row + 512 + 16 * lane);
  const uint32_t w = __shfl_sync(0xffffffffu, c.x, 28);
  const uint32_t s = w & 0xFF;
  __syncwarp();
  if (lane < 28) {
    const uint32_t in[4] = {c.x, c.y, c.z, c.w};
    const uint32_t f = ((s + 120u) << 7) * 0x00010001u;
    uint32_t out[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (kKind == 2) {
        out[i] = in[i / 2];
        continue;
      }
      const uint32_t x = __byte_perm(in[i / 2], 0u, (i % 2) == 0 ? 0x1404u : 0x3424u);
      const uint32_t b = (x & 0x80008000u) | ((x >> 4) & 0x07F007F0u);
      __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&b), *reinterpret_cast<const __nv_bfloat162*>(&f));
      out[i] = *reinterpret_cast<uint32_t*>(&r);
    }
    if (kKind == 1) {
      for (int i = 0; i < 8; ++i) sink ^= out[i];
      return;
    }
    *reinterpret_cast<uint4*>(row + 32 * lane) = make_uint4(out[0], out[1], out[2], out[3]);
    *reinterpret_cast<uint4*>(row + 32 * lane + 16) = make_uint4(out[4], out[5], out[6], out[7]);
  }
  if (lane < 8 && kKind != 1) *reinterpret_cast<uint4*>(row + 896 + 16 * lane) = rope;
}


// The kernel's dequantization (kernels/attention/gather.cuh dequantize_rows, 4 rows
// per warp round, integer fast path and out-of-line software fallback), with
// `force_slow` to time the fallback.
__device__ __forceinline__ float bits_float(uint32_t b) { return __uint_as_float(b); }
__device__ __noinline__ void chunk_slow(const uint4& c, uint32_t s, uint32_t (&out)[8]) {
  const uint32_t in[4] = {c.x, c.y, c.z, c.w};
  const float scale = bits_float(s << 23);
  for (int i = 0; i < 8; ++i) {
    float v[2];
    for (int h = 0; h < 2; ++h) {
      const uint32_t code = (in[i / 2] >> (16 * (i % 2) + 8 * h)) & 0xFF;
      const int e = (code >> 3) & 0xF;
      const uint32_t m = code & 7;
      const float mag = (float)(e == 0 ? m : 8 + m) * bits_float((uint32_t)((e == 0 ? 1 : e) - 7 - 3 + 127) << 23);
      v[h] = ((code & 0x7F) == 0x7F) ? __uint_as_float(0x7FC00000u) : (code & 0x80 ? -mag : mag);
    }
    __nv_bfloat162 r = __floats2bfloat162_rn(v[0] * scale, v[1] * scale);
    out[i] = *reinterpret_cast<uint32_t*>(&r);
  }
}
__device__ __forceinline__ void chunk_fast_or_slow(const uint4& c, uint32_t s, bool force_slow, uint32_t (&out)[8]) {
  const uint32_t in[4] = {c.x, c.y, c.z, c.w};
  uint32_t nan = 0;
  for (int i = 0; i < 4; ++i) nan |= (in[i] & 0x7F7F7F7Fu) + 0x01010101u;
  if (!force_slow && s >= 10u && s <= 134u && (nan & 0x80808080u) == 0u) {
    const uint32_t f = ((s + 120u) << 7) * 0x00010001u;
    for (int i = 0; i < 8; ++i) {
      const uint32_t x = __byte_perm(in[i / 2], 0u, (i % 2) == 0 ? 0x1404u : 0x3424u);
      const uint32_t b = (x & 0x80008000u) | ((x >> 4) & 0x07F007F0u);
      __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&b), *reinterpret_cast<const __nv_bfloat162*>(&f));
      out[i] = *reinterpret_cast<uint32_t*>(&r);
    }
    return;
  }
  chunk_slow(c, s, out);
}
__device__ __forceinline__ void kernel_dequant_tile(char* tile, bool force_slow) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll 1
  for (int round = 0; round < 2; ++round) {
    const int row0 = warp + 32 * round;
    uint4 codes[4];
    uint32_t scale[4];
    for (int k = 0; k < 4; ++k) {
      char* row = tile + (row0 + 8 * k) * kSlot;
      if (lane < 28) {
        codes[k] = *reinterpret_cast<const uint4*>(row + 16 * lane);
        scale[k] = *reinterpret_cast<const uint8_t*>(row + 448 + 2 * (lane / 4));
      }
    }
    char* rrow = tile + (row0 + 8 * (lane / 8)) * kSlot;
    const uint4 rope = *reinterpret_cast<const uint4*>(rrow + 512 + 16 * (lane % 8));
    __syncwarp();
    for (int k = 0; k < 4; ++k) {
      if (lane >= 28) continue;
      char* row = tile + (row0 + 8 * k) * kSlot;
      uint32_t out[8];
      chunk_fast_or_slow(codes[k], scale[k], force_slow, out);
      *reinterpret_cast<uint4*>(row + 32 * lane) = make_uint4(out[0], out[1], out[2], out[3]);
      *reinterpret_cast<uint4*>(row + 32 * lane + 16) = make_uint4(out[4], out[5], out[6], out[7]);
    }
    *reinterpret_cast<uint4*>(rrow + 896 + 16 * (lane % 8)) = rope;
  }
}

// mode 0: bf16, one 1 KB bulk copy per row (lanes 0..7 of each warp)
// mode 1: fp8, bulk 512 B nope + bulk 128 B rope per row
// mode 2: fp8, one bulk copy of 640 B per row (as if nope and rope were adjacent)
// mode 3: fp8, bulk 512 B nope + rope by 8 cp.async per row (cp.async.mbarrier.arrive)
// mode 4: fp8, all 40 chunks by cp.async, completing on the mbarrier
// mode 5..7: modes 1, 3, 4 plus the in-place dequantization of each tile
// mode 8, 9: mode 1 plus the dequantization without stores / stores without conversion
// mode 10: mode 1 plus the dequantization of rows 4 at a time (loads of 4 rows first)
// mode 11: no gather: dequantization of a resident tile only
// mode 12, 13: mode 1 plus the kernel's dequantize_tile (fast path; forced fallback)
template <int kMode>
__global__ void __launch_bounds__(256) gather(const char* pool, const char* nope, const char* rope, const int* idx,
                                              int tiles, float* sink) {
  extern __shared__ __align__(1024) char smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kStages * kTileBytes);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  constexpr int base = kMode >= 5 ? (kMode == 6 ? 3 : kMode == 7 ? 4 : 1) : kMode;
  constexpr bool dequant = kMode >= 5;
  constexpr int kind = kMode == 8 ? 1 : kMode == 9 ? 2 : 0;
  uint32_t bits = 0;
  if (threadIdx.x == 0) {
    // Arrivals: one per row (its expect_tx), plus one per lane whose cp.asyncs
    // complete on the barrier (.noinc: they count toward the expected total).
    const int n = base == 3 ? 2 * kTileRows : base == 4 ? 256 + kTileRows : kTileRows;
    for (int s = 0; s < kStages; ++s) mbar_init(&bars[s], n);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int* my = idx + (size_t)blockIdx.x * tiles * kTileRows;
  float acc = 0.f;
  auto issue = [&](int tile) {
    const int stage = tile % kStages;
    char* dst = smem + stage * kTileBytes;
    const int* rows = my + tile * kTileRows;
    uint64_t* bar = &bars[stage];
    if (base == 4) {
      // 64 rows x 40 chunks over 256 threads: 10 chunks each.
      if (threadIdx.x < kTileRows) mbar_expect(bar, 0);
      for (int c = threadIdx.x; c < kTileRows * 40; c += 256) {
        const int r = c / 40, ch = c % 40;
        const char* src = ch < 32 ? nope + (size_t)rows[r] * 512 + ch * 16 : rope + (size_t)rows[r] * 128 + (ch - 32) * 16;
        cp16(dst + r * kSlot + ch * 16, src);
      }
      asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
      return;
    }
    if (lane < 8) {
      const int r = warp * 8 + lane;
      char* d = dst + r * kSlot;
      const size_t row = (size_t)rows[r];
      if (base == 0) {
        mbar_expect(bar, 1024);
        bulk(d, pool + row * 1024, 1024, bar);
      } else if (base == 1) {
        mbar_expect(bar, 640);
        bulk(d, nope + row * 512, 512, bar);
        bulk(d + 512, rope + row * 128, 128, bar);
      } else if (base == 2) {
        mbar_expect(bar, 640);
        bulk(d, pool + row * 640, 640, bar);
      } else {
        mbar_expect(bar, 512);
        bulk(d, nope + row * 512, 512, bar);
      }
    }
    if (base == 3) {
      // 8 lanes per row copy its rope chunks; every lane of the warp arrives.
      for (int i = 0; i < 8; ++i) {
        const int r = warp * 8 + i;
        if (lane < 8) cp16(dst + r * kSlot + 512 + lane * 16, rope + (size_t)rows[r] * 128 + lane * 16);
      }
      if (lane < 8) asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
    }
  };
  if (kMode == 11) {
    for (int tile = 0; tile < tiles; ++tile) {
      for (int r = warp; r < kTileRows; r += 8) dequant_row<0>(smem + r * kSlot, lane, bits);
      __syncthreads();
    }
    if (bits == 12345u) *sink = 1.f;
    return;
  }
  for (int i = 0; i < kStages - 1 && i < tiles; ++i) issue(i);
  for (int tile = 0; tile < tiles; ++tile) {
    if (tile + kStages - 1 < tiles) {
      __syncthreads();  // the stage being refilled was read last iteration
      issue(tile + kStages - 1);
    }
    mbar_wait(&bars[tile % kStages], (tile / kStages) & 1);
    __syncthreads();
    char* t = smem + (tile % kStages) * kTileBytes;
    if (kMode == 12 || kMode == 13) {
      kernel_dequant_tile(t, kMode == 13);
      __syncthreads();
    } else if (dequant && kMode == 10) {
      for (int r0 = warp; r0 < kTileRows; r0 += 32) {
        uint4 c[4];
        for (int k = 0; k < 4; ++k) c[k] = *reinterpret_cast<const uint4*>(t + (r0 + 8 * k) * kSlot + 16 * lane);
        __syncwarp();
        for (int k = 0; k < 4; ++k) {
          const uint32_t in[4] = {c[k].x, c[k].y, c[k].z, c[k].w};
          const uint32_t f = (127u + 120u - 7u) << 7 | ((127u + 120u - 7u) << 23);
          uint32_t out[8];
          for (int i = 0; i < 8; ++i) {
            const uint32_t x = __byte_perm(in[i / 2], 0u, (i % 2) == 0 ? 0x1404u : 0x3424u);
            const uint32_t b = (x & 0x80008000u) | ((x >> 4) & 0x07F007F0u);
            __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&b), *reinterpret_cast<const __nv_bfloat162*>(&f));
            out[i] = *reinterpret_cast<uint32_t*>(&r);
          }
          if (lane < 28) {
            char* row = t + (r0 + 8 * k) * kSlot;
            *reinterpret_cast<uint4*>(row + 32 * lane) = make_uint4(out[0], out[1], out[2], out[3]);
            *reinterpret_cast<uint4*>(row + 32 * lane + 16) = make_uint4(out[4], out[5], out[6], out[7]);
          }
        }
      }
      __syncthreads();
    } else if (dequant) {
      for (int r = warp; r < kTileRows; r += 8) dequant_row<kind>(t + r * kSlot, lane, bits);
      __syncthreads();
    }
    acc += reinterpret_cast<const float*>(t)[threadIdx.x * 61];
  }
  if (acc == 12345.f || bits == 12345u) *sink = acc;
}

int main() {
  const size_t rows = 1 << 20;
  char *pool, *nope, *rope;
  CHECK(cudaMalloc(&pool, rows * 1024));
  CHECK(cudaMalloc(&nope, rows * 512));
  CHECK(cudaMalloc(&rope, rows * 128));
  CHECK(cudaMemset(pool, 1, rows * 1024));
  CHECK(cudaMemset(nope, 0x38, rows * 512));
  CHECK(cudaMemset(rope, 1, rows * 128));
  float* sink;
  CHECK(cudaMalloc(&sink, 4));
  const int blocks = 132, tiles = 32;
  std::vector<int> h(blocks * tiles * kTileRows);
  std::mt19937 rng(1);
  for (auto& v : h) v = (int)(rng() % rows);
  int* idx;
  CHECK(cudaMalloc(&idx, h.size() * 4));
  CHECK(cudaMemcpy(idx, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  const int smem = kStages * kTileBytes + 64;
  const char* names[] = {"bf16 1 KB bulk",       "fp8 bulk 512 + bulk 128",    "fp8 one 640 B bulk",
                         "fp8 bulk 512 + cp.async rope", "fp8 all cp.async (40 x 16 B)", "1 + dequant",
                         "3 + dequant",          "4 + dequant",
                         "1 + dequant, no stores", "1 + stores, no conversion", "1 + dequant 4 rows at a time",
                         "dequant only (no gather)", "1 + kernel dequant (fast)", "1 + kernel dequant (fallback)"};
  auto run = [&](auto kernel, int mode) {
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    kernel<<<blocks, 256, smem>>>(pool, nope, rope, idx, tiles, sink);
    CHECK(cudaDeviceSynchronize());
    cudaEventRecord(a);
    for (int i = 0; i < 10; ++i) kernel<<<blocks, 256, smem>>>(pool, nope, rope, idx, tiles, sink);
    cudaEventRecord(b);
    CHECK(cudaEventSynchronize(b));
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    const double row_bytes = mode == 0 ? 1024 : 640;
    const double n = 10.0 * blocks * tiles * kTileRows;
    std::printf("| %-30s | %7.1f GB/s | %6.1f ns per tile per SM |\n", names[mode], n * row_bytes / (ms * 1e-3) / 1e9,
                ms * 1e6 / (10.0 * tiles));
  };
  run(gather<0>, 0);
  run(gather<1>, 1);
  run(gather<2>, 2);
  run(gather<3>, 3);
  run(gather<4>, 4);
  run(gather<5>, 5);
  run(gather<6>, 6);
  run(gather<7>, 7);
  run(gather<8>, 8);
  run(gather<9>, 9);
  run(gather<10>, 10);
  run(gather<11>, 11);
  run(gather<12>, 12);
  run(gather<13>, 13);
  return 0;
}
