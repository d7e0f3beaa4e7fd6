// Index-stream builders. Each builder is three launches (programmatic
// dependent launch: each waits for the previous before reading), all sized by
// the capture-time token count: (1) one warp per token computes slice lengths into
// indptr[t + 1]; (2) one block turns them into exclusive prefix sums in place;
// (3) one block per token writes its slice. Invalid device values give empty
// slices (or, inside a CSA tail, a repeat of the token's newest window row), so
// no -1 and no row outside the pool is ever written.
#include "shim.cuh"
#include "warp.cuh"

namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kScanThreads = 1024;
constexpr int kFillThreads = 128;

// Leading entries of row[0..limit) that are valid page indices (< rows), for a
// whole warp; every lane returns the same count.
__device__ int leading_valid(const int32_t* row, int limit, int rows) {
  const int lane = threadIdx.x % UKV_WARP;
  for (int base = 0; base < limit; base += UKV_WARP) {
    const int j = base + lane;
    bool ok = false;
    if (j < limit) {
      const int v = row[j];
      ok = v >= 0 && v < rows;
    }
    const int first_bad = ukv_first_lane(!ok);
    if (first_bad >= 0) return base + first_bad;
  }
  return limit;
}

// Request slot of token t, or -1 when the token is padding or its values are invalid.
__device__ int token_slot(const int32_t* batch_id, const int32_t* req_slots, int num_requests,
                          int num_slots, const int32_t* positions, int t) {
  const int b = batch_id[t];
  if (b < 0 || b >= num_requests) return -1;
  const int slot = req_slots[b];
  if (slot < 0 || slot >= num_slots || positions[t] < 0) return -1;
  return slot;
}

__global__ void decode_lengths_kernel(ukv_decode_streams_params p) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int t = blockIdx.x * kWarpsPerBlock + threadIdx.x / UKV_WARP;
  if (t >= p.num_tokens) return;
  int swa = 0, hca = 0, csa = 0;
  if (token_slot(p.batch_id, p.req_slots, p.num_requests, p.num_slots, p.positions, t) >= 0) {
    // Token counts through the position are 64-bit: pos + 1 overflows an
    // int at a hostile INT32_MAX (the CPU backend computes them in usize).
    const int64_t seen = (int64_t)p.positions[t] + 1;
    swa = (int)min(seen, (int64_t)p.window);
    if (p.c128 != nullptr) {
      const int limit = (int)min(seen / 128, (int64_t)p.c128_width);
      hca = leading_valid(p.c128 + t * p.c128_stride, limit, p.hca_rows);
    }
    csa = (int)min(seen / 4, (int64_t)p.csa_topk);
  }
  // The HCA and CSA streams are optional (NULL indptr: not built).
  if (threadIdx.x % UKV_WARP == 0) {
    p.swa.indptr[t + 1] = swa;
    if (p.hca.indptr != nullptr) p.hca.indptr[t + 1] = swa + hca;
    if (p.csa.indptr != nullptr) p.csa.indptr[t + 1] = swa + csa;
  }
}

// In-place exclusive scan of the lengths in indptr[1..=n] of up to three streams.
__global__ void scan_kernel(int32_t* a, int32_t* b, int32_t* c, int n) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  __shared__ int32_t partial[kScanThreads / UKV_WARP];
  int32_t* ptr = blockIdx.x == 0 ? a : blockIdx.x == 1 ? b : c;
  if (ptr == nullptr) return;
  int carry = 0;
  const int lane = threadIdx.x % UKV_WARP, warp = threadIdx.x / UKV_WARP;
  for (int base = 0; base < n; base += kScanThreads) {
    const int i = base + threadIdx.x;
    int v = i < n ? ptr[i + 1] : 0;
    // Inclusive scan within the warp, then across warps.
    v = ukv_warp_inclusive_sum(v);
    if (lane == UKV_WARP - 1) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
      partial[lane] = ukv_warp_inclusive_sum(lane < kScanThreads / UKV_WARP ? partial[lane] : 0);
    }
    __syncthreads();
    const int total = v + (warp > 0 ? partial[warp - 1] : 0) + carry;
    if (i < n) ptr[i + 1] = total;
    carry += partial[kScanThreads / UKV_WARP - 1];
    __syncthreads();
  }
  if (threadIdx.x == 0) ptr[0] = 0;
}

__device__ __forceinline__ void put(const ukv_stream_out& s, int64_t at, int32_t row) {
  if (at >= 0 && at < s.capacity) s.indices[at] = row;
}

__global__ void decode_fill_kernel(ukv_decode_streams_params p) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int t = blockIdx.x;
  const int slot = token_slot(p.batch_id, p.req_slots, p.num_requests, p.num_slots, p.positions, t);
  if (slot < 0) return;
  const int pos = p.positions[t];
  const int swa = (int)min((int64_t)pos + 1, (int64_t)p.window);
  // An absent stream (NULL indptr) has capacity 0, so `put` writes nothing.
  const bool has_hca = p.hca.indptr != nullptr, has_csa = p.csa.indptr != nullptr;
  const int64_t s0 = p.swa.indptr[t], h0 = has_hca ? p.hca.indptr[t] : 0, c0 = has_csa ? p.csa.indptr[t] : 0;
  for (int i = threadIdx.x; i < swa; i += blockDim.x) {
    const int32_t row = slot * p.ring + (pos - swa + 1 + i) % p.ring;
    put(p.swa, s0 + i, row);
    put(p.hca, h0 + i, row);
    put(p.csa, c0 + i, row);
  }
  const int hca = has_hca ? p.hca.indptr[t + 1] - (int)h0 - swa : 0;
  for (int j = threadIdx.x; j < hca; j += blockDim.x) {
    put(p.hca, h0 + swa + j, p.swa_rows + p.c128[t * p.c128_stride + j]);
  }
}

__global__ void csa_tail_kernel(ukv_csa_tail_params p) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int t = blockIdx.x;
  if (p.batch_id[t] < 0 || p.positions[t] < 0) return;
  const int swa = (int)min((int64_t)p.positions[t] + 1, (int64_t)p.window);
  const int64_t start = p.indptr[t];
  const int tail = min(p.indptr[t + 1] - (int)start - swa, p.width);
  if (start < 0 || swa < 1 || start + swa > p.capacity) return;
  const int32_t newest = p.indices[start + swa - 1];
  for (int j = threadIdx.x; j < tail; j += blockDim.x) {
    const int pi = p.table[t * p.table_stride + j];
    const bool ok = pi >= 0 && pi < p.csa_rows;
    const int64_t at = start + swa + j;
    if (at < p.capacity) p.indices[at] = ok ? p.swa_rows + pi : newest;
  }
}

__global__ void prefill_lengths_kernel(ukv_prefill_streams_params p) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int t = blockIdx.x * kWarpsPerBlock + threadIdx.x / UKV_WARP;
  if (t >= p.num_tokens) return;
  int prefix = 0, extend = 0;
  if (token_slot(p.batch_id, p.req_slots, p.num_requests, p.num_slots, p.positions, t) >= 0) {
    const int b = p.batch_id[t], pos = p.positions[t], start = p.chunk_start[b];
    if (start >= 0 && start <= pos && p.extend_start[b] >= 0) {
      const int swa_low = max(pos - p.window + 1, 0);
      extend = (int)min((int64_t)pos - start + 1, (int64_t)p.window);
      prefix = min(max(start - swa_low, 0), p.window);
      if (p.table != nullptr) {
        const int visible = p.ratio == 0 ? 0 : (int)(((int64_t)pos + 1) / p.ratio);
        prefix += leading_valid(p.table + t * p.table_stride, min(visible, p.width), p.compressed_rows);
      }
    }
  }
  if (threadIdx.x % UKV_WARP == 0) {
    p.prefix.indptr[t + 1] = prefix;
    p.extend.indptr[t + 1] = extend;
  }
}

__global__ void prefill_fill_kernel(ukv_prefill_streams_params p) {
  ukv_pdl_launch_dependents();
  ukv_pdl_wait();
  const int t = blockIdx.x;
  const int slot = token_slot(p.batch_id, p.req_slots, p.num_requests, p.num_slots, p.positions, t);
  if (slot < 0) return;
  const int b = p.batch_id[t], pos = p.positions[t], start = p.chunk_start[b];
  if (start < 0 || start > pos || p.extend_start[b] < 0) return;
  const int swa_low = max(pos - p.window + 1, 0);
  const int extend = (int)min((int64_t)pos - start + 1, (int64_t)p.window);
  const int prefix_swa = min(max(start - swa_low, 0), p.window);
  const int64_t x0 = p.prefix.indptr[t], e0 = p.extend.indptr[t];
  const int compressed = p.prefix.indptr[t + 1] - (int)x0 - prefix_swa;
  for (int k = threadIdx.x; k < prefix_swa; k += blockDim.x) {
    put(p.prefix, x0 + k, slot * p.ring + (swa_low + k) % p.ring);
  }
  for (int j = threadIdx.x; j < compressed; j += blockDim.x) {
    put(p.prefix, x0 + prefix_swa + j, p.swa_rows + p.table[t * p.table_stride + j]);
  }
  const int first = p.extend_start[b] + (pos - start) + 1 - extend;
  for (int k = threadIdx.x; k < extend; k += blockDim.x) put(p.extend, e0 + k, first + k);
}

}  // namespace

extern "C" {

int unikv_gpu_build_decode_streams(int device, const ukv_decode_streams_params* p, void* stream) {
  UKV_ENTRY(device, {
    const int t = p->num_tokens;
    if (t > 0) {
      if (int r = ukv::launch_early(device, decode_lengths_kernel, dim3((unsigned)ukv::cdiv(t, kWarpsPerBlock)),
                                    dim3(kWarpsPerBlock * UKV_WARP), stream, "decode_lengths_kernel", *p))
        return r;
    }
    if (int r = ukv::launch_early(device, scan_kernel, dim3(3), dim3(kScanThreads), stream, "scan_kernel",
                                  p->swa.indptr, p->hca.indptr, p->csa.indptr, t))
      return r;
    if (t == 0) return UKV_SHIM_OK;
    return ukv::launch_early(device, decode_fill_kernel, dim3((unsigned)t), dim3(kFillThreads), stream,
                             "decode_fill_kernel", *p);
  })
}

int unikv_gpu_fill_csa_tail(int device, const ukv_csa_tail_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_tokens == 0) return UKV_SHIM_OK;
    return ukv::launch_early(device, csa_tail_kernel, dim3((unsigned)p->num_tokens), dim3(kFillThreads), stream,
                             "csa_tail_kernel", *p);
  })
}

int unikv_gpu_build_prefill_streams(int device, const ukv_prefill_streams_params* p, void* stream) {
  UKV_ENTRY(device, {
    const int t = p->num_tokens;
    if (t > 0) {
      if (int r = ukv::launch_early(device, prefill_lengths_kernel, dim3((unsigned)ukv::cdiv(t, kWarpsPerBlock)),
                                    dim3(kWarpsPerBlock * UKV_WARP), stream, "prefill_lengths_kernel", *p))
        return r;
    }
    if (int r = ukv::launch_early(device, scan_kernel, dim3(2), dim3(kScanThreads), stream, "scan_kernel",
                                  p->prefix.indptr, p->extend.indptr, (int32_t*)nullptr, t))
      return r;
    if (t == 0) return UKV_SHIM_OK;
    return ukv::launch_early(device, prefill_fill_kernel, dim3((unsigned)t), dim3(kFillThreads), stream,
                             "prefill_fill_kernel", *p);
  })
}

}  // extern "C"
