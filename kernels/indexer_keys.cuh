// What the indexer's score kernels (indexer_score.cu) and selection kernels
// (indexer_topk.cu) share: a token's keys, and the score launch the top-k
// entry point calls.
#pragma once

#include "shim.cuh"

namespace ukv_indexer_topk {

constexpr int kPage = 64;  // keys per page

// Token t's request (-1: padding) and number of keys.
struct TokenKeys {
  int request;
  int keys;
};

__device__ __forceinline__ TokenKeys token_keys(const ukv_indexer_topk_params& p, int t) {
  // Both loads issued before either is used.
  const int b = p.batch_id[t];
  const int64_t pos = ukv_index_at(p.positions, p.positions_i64 != 0, t);
  if (b < 0 || b >= p.requests) return TokenKeys{-1, 0};
  // (pos + 1) / 4 without overflowing at a hostile INT64_MAX.
  const int64_t visible = pos < 0 ? 0 : pos / 4 + ((pos & 3) == 3);
  const int64_t cap = min((int64_t)p.logits_width, (int64_t)p.max_pages * kPage);
  return TokenKeys{b, (int)min(visible, cap)};
}

// Launches the scores of every visible key into `logits` (indexer_score.cu).
int launch_scores(int device, const ukv_indexer_topk_params& p, void* stream);

}  // namespace ukv_indexer_topk
