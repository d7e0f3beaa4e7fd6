// Top-k selection probe (H200): what does the indexer's selection cost per
// call at small batches, and where does a one-block row's time go? Issue 24
// asks for a whole `indexer_topk` call (scores and selection) of at most 6 us
// at N <= 8192 keys, T <= 4. Times the library's selection launch
// (kernels/indexer_topk.cu, included as compiled into libunikv) as the
// benchmark's "select only" rows do: a CUDA graph of calls with programmatic
// dependent launch over the same logits (hot in L2), next to an empty kernel.
// Rows run at their own width and in a logits table 131072 wide (a
// capture-time maximum, as serving stacks size it). Every row's output is
// checked against a host selection (the top k keys of
// src/indexer.rs's order, ties to the lower index, ascending, -1 after).
// Logits are sums of 64 relu'd heads with signed weights, as the indexer's.
// Build and run on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90a -I kernels bench/probes/select.cu kernels/shim.cu kernels/indexer_score.cu -o /tmp/sel && /tmp/sel
// (-I DIR before -I kernels times a modified DIR/indexer_topk.cu instead; if it
// defines SELECT_STAMPS, the probe prints its per-phase clock stamps of block 0
// at T = 1, read from its `g_stamps`.)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "indexer_topk.cu"

#include "probe.cuh"

namespace {

uint32_t host_order_key(float x) {
  if (x != x) return 0u;
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if (x == 0.f) bits = 0u;
  return (bits >> 31) != 0u ? ~bits : bits | 0x80000000u;
}

// The selection src/indexer.rs makes of one row (page table = identity).
std::vector<int32_t> host_select(const float* row, int n, int k, int width) {
  std::vector<int32_t> out(width, -1);
  if (n <= k) {
    for (int i = 0; i < n; ++i) out[i] = i;
    return out;
  }
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return host_order_key(row[a]) > host_order_key(row[b]); });
  std::vector<int> kept(order.begin(), order.begin() + k);
  std::sort(kept.begin(), kept.end());
  for (int i = 0; i < k; ++i) out[i] = kept[i];
  return out;
}

}  // namespace

int main() {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  const float empty_us = empty_call_us(s, 64);
  std::printf(
      "empty kernel %.2f us per call\n| T | keys | width | k | us per call | over empty | output |\n"
      "|---|---|---|---|---|---|---|\n",
      empty_us);
  for (const int t : {1, 4}) {
    for (const int n : {1024, 2048, 4096, 8192, 32768, 131072}) {
      for (const int k : {512, 1024}) {
        for (const int width : {n, n < 131072 ? 131072 : 0}) {
          if (width == 0 || k >= n || (width != n && (t != 1 || k != 512))) continue;
          std::vector<float> logits((size_t)t * width);
          std::vector<float> w(64);
          for (auto& x : w) x = nd(rng) / 8.f;
          for (auto& x : logits) {
            float sum = 0.f;
            for (int h = 0; h < 64; ++h) sum += w[h] * std::max(nd(rng), 0.f);
            x = sum;
          }
          const int pages = width / kPage;
          std::vector<int32_t> table(pages), batch(t), pos(t);
          for (int i = 0; i < pages; ++i) table[i] = i;
          for (int i = 0; i < t; ++i) batch[i] = 0, pos[i] = 4 * n - 1;  // every key visible
          float* d_logits;
          int32_t *d_table, *d_batch, *d_pos, *d_out;
          CHECK(cudaMalloc(&d_logits, logits.size() * 4));
          CHECK(cudaMalloc(&d_table, pages * 4));
          CHECK(cudaMalloc(&d_batch, t * 4));
          CHECK(cudaMalloc(&d_pos, t * 4));
          CHECK(cudaMalloc(&d_out, (size_t)t * k * 4));
          CHECK(cudaMemcpy(d_logits, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
          CHECK(cudaMemcpy(d_table, table.data(), pages * 4, cudaMemcpyHostToDevice));
          CHECK(cudaMemcpy(d_batch, batch.data(), t * 4, cudaMemcpyHostToDevice));
          CHECK(cudaMemcpy(d_pos, pos.data(), t * 4, cudaMemcpyHostToDevice));
          CHECK(cudaMemset(d_out, 0x7F, (size_t)t * k * 4));  // poison
          ukv_indexer_topk_params p{};
          p.page_table = d_table;
          p.batch_id = d_batch;
          p.positions = d_pos;
          p.logits = d_logits;
          p.topk_indices = d_out;
          p.page_table_stride = pages;
          p.logits_stride = width;
          p.topk_stride = k;
          p.requests = 1;
          p.max_pages = pages;
          p.logits_width = width;
          p.topk_width = k;
          p.num_tokens = t;
          p.topk = k;
          if (launch_select(0, p, s) != UKV_SHIM_OK) {
            std::printf("launch failed\n");
            return 1;
          }
          CHECK(cudaStreamSynchronize(s));
          std::vector<int32_t> got((size_t)t * k);
          CHECK(cudaMemcpy(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost));
          bool ok = true;
          for (int i = 0; i < t; ++i) {
            const auto want = host_select(&logits[(size_t)i * width], n, k, k);
            ok = ok && std::equal(want.begin(), want.end(), got.begin() + (size_t)i * k);
          }
#if defined(SELECT_STAMPS)
          if (t == 1) {
            long long stamps[32];
            CHECK(cudaMemcpyFromSymbol(stamps, g_stamps, sizeof(stamps)));
            std::printf("stamps (cycles from entry), keys %d, k %d:", n, k);
            for (int i = 1; i < 32 && stamps[i] != 0; ++i) std::printf(" %lld", stamps[i] - stamps[0]);
            std::printf("\n");
          }
#endif
          const float us = per_call_us(s, 64, [&](int, cudaLaunchConfig_t) {
            if (launch_select(0, p, s) != UKV_SHIM_OK) std::exit(1);
          });
          std::printf("| %d | %d | %d | %d | %.2f | %.2f | %s |\n", t, n, width, k, us, us - empty_us,
                      ok ? "exact" : "WRONG");
          CHECK(cudaFree(d_logits));
          CHECK(cudaFree(d_table));
          CHECK(cudaFree(d_batch));
          CHECK(cudaFree(d_pos));
          CHECK(cudaFree(d_out));
        }
      }
    }
  }
  return 0;
}
