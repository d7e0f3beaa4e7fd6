// What the probes share: timing as unikv-bench times the library (the median
// of graph replays, each graph holding a batch of calls launched with
// programmatic dependent launch, PDL), the copy ceiling of the same run, an
// empty kernel and random bf16 inputs.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "compat.cuh"
#include "cuda_check.cuh"

// Median milliseconds of `reps` runs of what `enqueue` puts on stream s.
template <typename Enqueue>
float median_ms(cudaStream_t s, int reps, Enqueue&& enqueue) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    CHECK(cudaEventRecord(e0, s));
    enqueue();
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaEventSynchronize(e1));
    float x;
    CHECK(cudaEventElapsedTime(&x, e0, e1));
    ms.push_back(x);
  }
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Microseconds per call of a graph of `calls` launches: launch(i, cfg)
// enqueues call i through cudaLaunchKernelEx with cfg, which carries the
// stream, the PDL attribute and 128 threads per block (the caller sets the grid).
template <typename Launch>
float per_call_us(cudaStream_t s, int calls, Launch&& launch) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.blockDim = dim3(128);
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < calls; ++i) launch(i, cfg);
  CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ge;
  CHECK(cudaGraphInstantiate(&ge, g, 0));
  CHECK(cudaGraphLaunch(ge, s));
  const float ms = median_ms(s, 15, [&] { CHECK(cudaGraphLaunch(ge, s)); });
  CHECK(cudaGraphExecDestroy(ge));
  CHECK(cudaGraphDestroy(g));
  return ms * 1000.f / (float)calls;
}

// Bytes per second of a 2 GiB device-to-device copy (read + write).
inline double copy_ceiling(cudaStream_t s) {
  const size_t big = 2ull << 30;
  void *x, *y;
  CHECK(cudaMalloc(&x, big));
  CHECK(cudaMalloc(&y, big));
  CHECK(cudaMemsetAsync(x, 1, big, s));
  const float ms = median_ms(s, 7, [&] { CHECK(cudaMemcpyAsync(y, x, big, cudaMemcpyDeviceToDevice, s)); });
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  return 2.0 * big / (ms * 1e-3);
}

// An empty kernel: what any call costs under graph replay.
__global__ void empty_kernel() {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
}

// Microseconds per call of the empty kernel under graph replay, `calls` a graph.
inline float empty_call_us(cudaStream_t s, int calls) {
  return per_call_us(s, calls, [&](int, cudaLaunchConfig_t cfg) {
    cfg.gridDim = dim3(1);
    CHECK(cudaLaunchKernelEx(&cfg, empty_kernel));
  });
}

// `elems` random bf16 values (normal, mean 0, deviation 1) in fresh device memory.
inline uint16_t* random_bf16_device(size_t elems, std::mt19937& rng) {
  std::vector<uint16_t> host(elems);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : host) {
    const float f = nd(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    v = (uint16_t)(u >> 16);
  }
  uint16_t* d;
  CHECK(cudaMalloc(&d, elems * 2));
  CHECK(cudaMemcpy(d, host.data(), elems * 2, cudaMemcpyHostToDevice));
  return d;
}
