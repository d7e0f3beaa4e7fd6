// Batch-1 decode probe (H200): where does one T = 1 attention call's time go?
// Issue 24 asks for at most 5 us per call at <= 1152 keys; the library's
// 16-head bf16 kernel (kernels/attention/swap.cuh, attention_swap_kernel<16, 3>,
// included as compiled into libunikv) takes 6 us at one key. Times it as
// unikv-bench does (a CUDA graph of calls launched with programmatic dependent
// launch, PDL; index sets rotating so rows come from DRAM), next to an empty
// kernel, over a 1M-row bf16 pool, and checks each shape's output against a
// float64 host reference (sink included).
// Build and run on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90a -I kernels bench/probes/decode_chain.cu kernels/shim.cu -o /tmp/dc && /tmp/dc
// A copy of kernels/attention/ in DIR/attention/ whose code calls
// UKV_STAMP(i) (i < 24) is timed instead with -I DIR before -I kernels: the
// probe then prints, per block of the graph's last call, its %globaltimer
// stamps in ns from the earliest block's stamp 1 (thread 0 of each block
// writes them; the timer advances in 32 ns steps); -DPROBE_NO_STAMPS times
// the copy without them.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda_check.cuh"

constexpr int kStampBlocks = 64;
constexpr int kStampPoints = 24;
__device__ unsigned long long g_stamps[kStampBlocks][kStampPoints];
#if defined(PROBE_NO_STAMPS)
#define UKV_STAMP(i) \
  do {               \
  } while (0)
#else
#define UKV_STAMP(i)                                                                             \
  do {                                                                                           \
    if (threadIdx.x == 0) {                                                                      \
      unsigned long long gt_;                                                                    \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt_));                                    \
      const unsigned b_ = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);         \
      if (b_ < kStampBlocks) g_stamps[b_][i] = gt_;                                              \
    }                                                                                            \
  } while (0)
#endif

#include "attention/instances/swap_16_3_bf16.cu"

#include "probe.cuh"

namespace {

constexpr int kRows = 1 << 20;
constexpr int kSets = 64;
constexpr float kScale = 0.044194173f;
constexpr float kSink = 0.5f;

float bf16_to_float(uint16_t v) {
  const uint32_t u = (uint32_t)v << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Output of head h over `keys` pool rows: softmax(q . k * scale) with the
// sink's term in the denominator, times the rows (K = V), in float64.
std::vector<double> reference(const std::vector<uint16_t>& q, const uint16_t* pool_host_rows, int keys, int h) {
  std::vector<double> s(keys), out(512, 0.0);
  double m = kSink;
  for (int j = 0; j < keys; ++j) {
    double dot = 0.0;
    for (int d = 0; d < 512; ++d)
      dot += (double)bf16_to_float(q[(size_t)h * 512 + d]) * bf16_to_float(pool_host_rows[(size_t)j * 512 + d]);
    s[j] = dot * kScale;
    m = std::max(m, s[j]);
  }
  double l = std::exp(kSink - m);
  for (int j = 0; j < keys; ++j) {
    const double w = std::exp(s[j] - m);
    l += w;
    for (int d = 0; d < 512; ++d) out[d] += w * bf16_to_float(pool_host_rows[(size_t)j * 512 + d]);
  }
  for (auto& x : out) x /= l;
  return out;
}

}  // namespace

int main() {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::mt19937 rng(5);
  const AttentionLauncher& kernel = kSwap16x3Bf16;
  if (kernel.configure() != UKV_SUCCESS || kernel.allow_large_clusters() != UKV_SUCCESS) {
    std::printf("configure failed\n");
    return 1;
  }
  uint16_t* pool = random_bf16_device((size_t)kRows * 512, rng);
  const float empty_us = empty_call_us(s, 64);
  std::printf("empty kernel %.2f us per call\n", empty_us);
  std::printf("| H | keys | splits | us per call | over empty | max error / max output |\n|---|---|---|---|---|---|\n");
  struct Shape {
    int heads, keys;
  };
  for (const Shape sh : {Shape{16, 1}, Shape{16, 64}, Shape{16, 640}, Shape{16, 1152}, Shape{16, 2176},
                         Shape{64, 640}}) {
    const int hb = sh.heads / 16;
    // The plan's rule (kernels/attention/plan.cu): the most splits, up to 16,
    // whose clusters are all resident at once.
    int splits = std::min(16, 132 / hb);
    for (; splits > 1; --splits) {
      int fit = 0;
      if (kernel.max_active_clusters(splits, &fit) != UKV_SUCCESS) return 1;
      if (fit >= hb) break;
    }
    std::vector<std::vector<int32_t>> sets(kSets, std::vector<int32_t>(sh.keys));
    std::uniform_int_distribution<int32_t> pick(0, kRows - 1);
    for (auto& set : sets)
      for (auto& x : set) x = pick(rng);  // repeats allowed: the kernel does not care
    int32_t* d_idx;
    int32_t* d_indptr;
    CHECK(cudaMalloc(&d_idx, (size_t)kSets * sh.keys * 4));
    for (int i = 0; i < kSets; ++i)
      CHECK(cudaMemcpy(d_idx + (size_t)i * sh.keys, sets[i].data(), sh.keys * 4, cudaMemcpyHostToDevice));
    const int32_t indptr[2] = {0, sh.keys};
    CHECK(cudaMalloc(&d_indptr, 8));
    CHECK(cudaMemcpy(d_indptr, indptr, 8, cudaMemcpyHostToDevice));
    std::vector<uint16_t> q_host((size_t)sh.heads * 512);
    uint16_t* d_q = random_bf16_device(q_host.size(), rng);
    CHECK(cudaMemcpy(q_host.data(), d_q, q_host.size() * 2, cudaMemcpyDeviceToHost));
    uint16_t* d_out;
    float* d_sink;
    CHECK(cudaMalloc(&d_out, q_host.size() * 2));
    CHECK(cudaMalloc(&d_sink, sh.heads * 4));
    const std::vector<float> sink(sh.heads, kSink);
    CHECK(cudaMemcpy(d_sink, sink.data(), sh.heads * 4, cudaMemcpyHostToDevice));

    ukv_attention_params p{};
    p.q = d_q;
    p.out = d_out;
    p.sink = d_sink;
    p.q_stride_token = p.out_stride_token = (int64_t)sh.heads * 512;
    p.q_stride_head = p.out_stride_head = 512;
    p.num_sources = 1;
    p.num_tokens = 1;
    p.num_heads = sh.heads;
    p.softmax_scale = kScale;
    ukv_kv_source& src = p.src[0];
    src.kv.data = pool;
    src.indptr = d_indptr;
    src.kv_stride = 512;
    src.rows = kRows;
    src.capacity = sh.keys;
    src.layout = kLayoutPool;
    const SplitConfig cfg{splits, splits > 1 ? 1 : 0};
    const dim3 grid(1, hb, splits);
    const auto launch = [&](int set) {
      p.src[0].indices = d_idx + (size_t)set * sh.keys;
      if (kernel.launch(grid, s, true, cfg.cluster ? splits : 1, p, cfg) != UKV_SUCCESS) std::exit(1);
    };

    // Set 0's output against the host.
    CHECK(cudaMemset(d_out, 0xFF, q_host.size() * 2));  // poison: NaN
    static const unsigned long long zeros[kStampBlocks][kStampPoints] = {};
    CHECK(cudaMemcpyToSymbol(g_stamps, zeros, sizeof(zeros)));
    launch(0);
    CHECK(cudaStreamSynchronize(s));
    std::vector<uint16_t> got(q_host.size());
    CHECK(cudaMemcpy(got.data(), d_out, got.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<uint16_t> rows_host((size_t)sh.keys * 512);
    for (int j = 0; j < sh.keys; ++j)
      CHECK(cudaMemcpy(rows_host.data() + (size_t)j * 512, pool + (size_t)sets[0][j] * 512, 1024,
                       cudaMemcpyDeviceToHost));
    double err = 0.0, top = 0.0;
    for (int h = 0; h < sh.heads; ++h) {
      const auto want = reference(q_host, rows_host.data(), sh.keys, h);
      for (int d = 0; d < 512; ++d) {
        const double x = bf16_to_float(got[(size_t)h * 512 + d]);
        err = std::isnan(x) ? INFINITY : std::max(err, std::fabs(x - want[d]));
        top = std::max(top, std::fabs(want[d]));
      }
    }
    const float us = per_call_us(s, kSets, [&](int i, cudaLaunchConfig_t) { launch(i); });
    // The stamps of the last call of the last replay (warm instruction
    // caches, launched early behind the call before it).
    unsigned long long stamps[kStampBlocks][kStampPoints];
    CHECK(cudaMemcpyFromSymbol(stamps, g_stamps, sizeof(stamps)));
    std::printf("| %d | %d | %d | %.2f | %.2f | %.4f |\n", sh.heads, sh.keys, splits, us, us - empty_us,
                err / top);
    unsigned long long base = ~0ull;
    for (int b = 0; b < kStampBlocks; ++b)
      if (stamps[b][1] != 0) base = std::min(base, stamps[b][1]);
    for (int b = 0; b < kStampBlocks && base != ~0ull; ++b) {
      if (stamps[b][0] == 0) continue;
      std::printf("  block %2d:", b);
      for (int i = 0; i < kStampPoints; ++i)
        std::printf(stamps[b][i] == 0 ? "     -" : " %5lld", (long long)(stamps[b][i] - base));
      std::printf("\n");
    }
    CHECK(cudaFree(d_idx));
    CHECK(cudaFree(d_indptr));
    CHECK(cudaFree(d_q));
    CHECK(cudaFree(d_out));
    CHECK(cudaFree(d_sink));
  }
  CHECK(cudaFree(pool));
  return 0;
}
