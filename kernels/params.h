/* Plain parameter structs of the kernel shim, mirrored (#[repr(C)]) by
 * src/backend/gpu/shim.rs. The backend compares the sizes when it starts
 * (unikv_gpu_params_size); tests/param_layout.rs compares every field's offset
 * and size, from the field list in kernels/devtools/param_layout.cu (a field
 * missing there fails to compile). No padding: reserved fields fill the gaps.
 * Pointers are device memory; strides are in elements; offsets are 64-bit. */
#pragma once

#include <stdint.h>

/* SWA ring scatter (docs/pool.md §9). */
/* A pool layer's rows: bf16 `[rows, 512]` in `data`, or (fp8 != 0) the FP8
 * pool's 512-byte nope rows in `data` and `[rows, 64]` bf16 rope rows in `rope`
 * (docs/fp8.md §4). `fp8_format` is a ukv_fp8_format (kernels/fp8.cuh). */
typedef struct ukv_pool_rows {
  void* data;
  void* rope;
  int32_t fp8;
  uint32_t fp8_format;
} ukv_pool_rows;

typedef struct ukv_store_swa_params {
  const void* kv;           /* [num_tokens, 512] bf16, row stride kv_stride */
  const int32_t* batch_id;  /* [num_tokens] */
  const int32_t* req_slots; /* [num_requests] */
  const int32_t* positions; /* [num_tokens] */
  const int32_t* final_pos; /* [num_requests] or NULL */
  ukv_pool_rows pool;
  int64_t kv_stride;
  int64_t pool_rows;
  int32_t num_tokens;
  int32_t num_requests;
  int32_t window;
  int32_t ring;
  int32_t num_slots;
  int32_t reserved;
} ukv_store_swa_params;

/* Compressed-row scatter (docs/pool.md §9). */
typedef struct ukv_store_compressed_params {
  const void* kv;      /* [num_rows, 512] bf16 */
  const int32_t* loc;  /* [num_rows], < 0 = skip */
  ukv_pool_rows pool;
  int64_t kv_stride;
  int64_t swa_rows;
  int64_t compressed_rows;
  int32_t num_rows;
  int32_t reserved;
} ukv_store_compressed_params;

/* Quantize-and-store into a FlashMLA FP8 KV cache or an indexer key cache
 * (docs/fp8.md §5, §6): one entry per layout, same params. */
typedef struct ukv_cache_store_params {
  const void* rows;       /* [num_tokens, 512] bf16 (FlashMLA) or [num_tokens, 128] bf16 / f32 (indexer) */
  const void* loc;        /* [num_tokens] int32 or int64; < 0 or >= token_slots: skipped */
  uint8_t* cache;         /* [num_pages, bytes_per_page], 16-byte aligned */
  int64_t row_stride;     /* elements */
  int64_t bytes_per_page;
  int64_t token_slots;    /* num_pages * page_size */
  int64_t num_tokens;
  int32_t page_shift;     /* page_size = 1 << page_shift (2, 64, 256) */
  uint32_t format;        /* ukv_fp8_format */
  int32_t loc_i64;        /* 1: loc is int64 */
  int32_t rows_f32;       /* 1: rows are f32 (indexer only) */
} ukv_cache_store_params;

/* Quantize-and-store into scaled FP8 rows (docs/fp8.md §8): per 64-dim tile
 * scale = max(amax, 1e-4) / divisor, codes encode(x * (1 / scale)). */
typedef struct ukv_scaled_store_params {
  const void* rows;      /* [num_tokens, 512] bf16, row stride row_stride elements */
  const void* loc;       /* [num_tokens] int32 or int64; < 0 or >= num_rows: skipped */
  uint8_t* codes;        /* [num_rows, 512], row stride codes_stride bytes, 16-byte aligned */
  float* scales;         /* [num_rows, 8], row stride scales_stride floats */
  int64_t row_stride;
  int64_t codes_stride;
  int64_t scales_stride;
  int64_t num_rows;
  int64_t num_tokens;
  float divisor;         /* 448, 240 or 224 */
  uint32_t format;       /* ukv_fp8_format */
  int32_t loc_i64;       /* 1: loc is int64 */
  int32_t reserved;
} ukv_scaled_store_params;

/* Fused Q/KV RMSNorm + RoPE + pool store (docs/prepare.md §4). Index vectors
 * are int32, or int64 where their *_i64 flag is set. */
typedef struct ukv_prepare_qkv_params {
  const void* q_in;         /* [num_tokens, num_heads, 512] bf16 */
  void* q_out;              /* same shape */
  const void* kv_in;        /* [num_tokens, 512] bf16 */
  const void* kv_weight;    /* [512] bf16 */
  void* kv_out;             /* [num_tokens, 512] bf16, or NULL */
  const float* rope_table;  /* [max_pos, 64] */
  const void* positions;    /* [num_tokens] */
  const void* rows;         /* [num_tokens] pool rows (< 0: no store), or NULL */
  ukv_pool_rows pool;
  int64_t q_in_stride_token, q_in_stride_head;
  int64_t q_out_stride_token, q_out_stride_head;
  int64_t kv_in_stride, kv_out_stride;
  int64_t table_stride;
  int64_t max_pos;
  int64_t pool_rows;
  int32_t num_tokens;
  int32_t num_heads;
  float q_eps;
  float kv_eps;
  int32_t positions_i64;
  int32_t rows_i64;
} ukv_prepare_qkv_params;

/* One output stream of an index builder. */
typedef struct ukv_stream_out {
  int32_t* indptr;  /* [num_tokens + 1] */
  int32_t* indices; /* [capacity] */
  int64_t capacity;
} ukv_stream_out;

/* Decode streams (docs/index-streams.md §3). */
typedef struct ukv_decode_streams_params {
  const int32_t* batch_id;
  const int32_t* req_slots;
  const int32_t* positions;
  const int32_t* c128; /* [num_tokens, c128_width] row stride c128_stride, or NULL */
  ukv_stream_out swa;
  ukv_stream_out hca;
  ukv_stream_out csa;
  int64_t c128_stride;
  int32_t c128_width;
  int32_t num_tokens;
  int32_t num_requests;
  int32_t window;
  int32_t ring;
  int32_t num_slots;
  int32_t swa_rows;
  int32_t hca_rows; /* compressed rows of a ratio-128 layer */
  int32_t csa_topk;
  int32_t reserved;
} ukv_decode_streams_params;

/* Per-layer CSA tail fill (docs/index-streams.md §4). */
typedef struct ukv_csa_tail_params {
  const int32_t* batch_id;
  const int32_t* positions;
  const int32_t* table; /* [num_tokens, width] row stride table_stride */
  const int32_t* indptr;
  int32_t* indices;
  int64_t table_stride;
  int64_t capacity;
  int32_t width;
  int32_t num_tokens;
  int32_t window;
  int32_t swa_rows;
  int32_t csa_rows; /* compressed rows of a ratio-4 layer */
  int32_t reserved;
} ukv_csa_tail_params;

/* Prefill streams (docs/index-streams.md §5). */
typedef struct ukv_prefill_streams_params {
  const int32_t* batch_id;
  const int32_t* req_slots;
  const int32_t* positions;
  const int32_t* chunk_start;
  const int32_t* extend_start;
  const int32_t* table; /* page indices of the layer's ratio, or NULL */
  ukv_stream_out prefix;
  ukv_stream_out extend;
  int64_t table_stride;
  int32_t width;
  int32_t ratio;
  int32_t num_tokens;
  int32_t num_requests;
  int32_t window;
  int32_t ring;
  int32_t num_slots;
  int32_t swa_rows;
  int32_t compressed_rows;
  int32_t reserved;
} ukv_prefill_streams_params;

/* One key source of sparse attention, by `layout` (a ukv_kv_layout,
 * kernels/attention/common.cuh; docs/attention.md §6):
 *  0 pool rows: bf16 rows in kv.data (stride kv_stride elements), or (kv.fp8)
 *    the FP8 pool's nope rows in kv.data and rope rows in kv.rope;
 *  1 FlashMLA cache (kv.fp8 = 1): pages of kv_stride bytes from kv.data, key i
 *    the token slot i % 2^page_shift of page i >> page_shift (docs/fp8.md §5);
 *  2 scaled FP8 rows (kv.fp8 = 1): codes [rows, 512] in kv.data (stride
 *    kv_stride bytes), fp32 scales [rows, 8] in `scales` (stride
 *    scales_stride floats) (docs/fp8.md §8).
 * kv.fp8_format is the call's FP8 flavour for every source. */
typedef struct ukv_kv_source {
  ukv_pool_rows kv;
  const int32_t* indices;
  const int32_t* indptr;   /* [num_tokens + 1] */
  int64_t kv_stride;
  int64_t rows;            /* keys: valid indices are below it */
  int64_t capacity;        /* entries of `indices` */
  const float* scales;     /* layout 2 */
  int64_t scales_stride;   /* layout 2 */
  int32_t layout;
  int32_t page_shift;      /* layout 1 */
} ukv_kv_source;

/* Sparse decode / prefill attention (docs/attention.md §1, §2). */
typedef struct ukv_attention_params {
  const void* q;           /* [num_tokens, H, 512] bf16 */
  void* out;               /* [num_tokens, H, 512] bf16 */
  float* lse;              /* [num_tokens, H] f32 or NULL */
  const float* sink;       /* [H] f32 or NULL */
  void* workspace;
  ukv_kv_source src[2];
  int64_t q_stride_token, q_stride_head;
  int64_t out_stride_token, out_stride_head;
  int64_t lse_stride_token;
  int64_t workspace_bytes;
  int32_t num_sources;
  int32_t num_tokens;
  int32_t num_heads;
  int32_t skip_negative;
  float softmax_scale;
  int32_t reserved;
  /* Decode's inverse-RoPE epilogue: fp32 [rope_rows, 64] table and
   * [num_tokens] positions (int64 when positions_i64), or rope_table NULL. */
  const float* rope_table;
  const void* positions;
  int64_t rope_rows;
  int32_t positions_i64;
  int32_t reserved2;
} ukv_attention_params;

/* Merge of partial attention results over disjoint key sets. */
typedef struct ukv_merge_params {
  const void* parts_out;   /* [num_parts][num_tokens, H, 512] bf16 */
  const float* parts_lse;  /* [num_parts][num_tokens, H] */
  const float* sink;       /* [H] or NULL */
  void* out;
  float* lse;              /* or NULL */
  int64_t part_stride_out; /* elements between parts */
  int64_t part_stride_lse;
  int64_t out_stride_token, out_stride_head;
  int64_t in_stride_token, in_stride_head;
  int64_t lse_stride_token, in_lse_stride_token;
  int32_t num_parts;
  int32_t num_tokens;
  int32_t num_heads;
  int32_t reserved;
} ukv_merge_params;

/* Inverse RoPE of an attention output's rope dims (docs/attention.md §4). */
typedef struct ukv_inverse_rope_params {
  void* x;               /* [num_tokens, num_heads, 512] bf16, rotated in place */
  const void* positions; /* [num_tokens] int32 or int64 (positions_i64) */
  const float* table;    /* [max_pos, 64] f32, row stride table_stride */
  int64_t x_stride_token, x_stride_head;
  int64_t table_stride;
  int64_t max_pos;
  int64_t num_tokens;
  int64_t num_heads;
  int32_t positions_i64; /* 1: positions are int64 */
  int32_t reserved;
} ukv_inverse_rope_params;

/* Launch configuration chosen at plan creation (capture-time shapes only). */
typedef struct ukv_attention_plan {
  int32_t max_tokens;
  int32_t num_heads;
  int32_t head_blocks;   /* CTAs per token along heads */
  int32_t block_m_tiles; /* 16-row MMA tiles per head block */
  int32_t sm_count;
  int32_t max_splits;
  int64_t workspace_bytes;
  int32_t dependent_launch; /* sm_90+: the combine kernel is launched early (PDL) */
  int32_t stages;           /* key-tile stages of the kernel instantiation */
  int32_t wgmma;            /* sm_90a warpgroup-MMA kernel: 64 (heads on M), 16 or 32 (heads on N); 0 none */
  int32_t cluster;          /* 1: a token's splits merge inside a thread-block cluster (sm_90+) */
  int32_t kv_fp8;           /* 1: the kernels for FP8 pools (in-tile dequantization) */
  int32_t portable;         /* portable kernel: 1 scalar, 2 matrix (HIP builds; NVIDIA: test hook) */
  int32_t pair;             /* 1: a token's two 64-head FP8 blocks share the conversion in a cluster */
  int32_t long_splits;      /* > 0: calls with long key lists split this far, merged through the workspace */
  int32_t long_keys;        /* index capacity per token from which calls take long_splits (0: every call) */
  int32_t reserved;         /* keeps the struct free of tail padding */
} ukv_attention_plan;

/* FP8 codec test (kernels/devtools/fp8_check.cu): n values through the encoders, 256 codes decoded. */
typedef struct ukv_fp8_check_params {
  const float* x;    /* [n] */
  uint8_t* sw;       /* [n] software encoder */
  uint8_t* hw;       /* [n] hardware pair encoder where present (fn), else software */
  uint8_t* scale;    /* [n] UE8M0 byte of |x| as a tile's amax */
  float* decoded;    /* [256] */
  int64_t n;
  uint32_t format;   /* 0 e4m3fn, 1 e4m3fnuz */
  int32_t reserved;
} ukv_fp8_check_params;

/* hash_topk (routing.cu): per row, K table experts weighted from the router
 * logits, then S shared slots; rows past the real-token count are padding. */
typedef struct ukv_hash_topk_params {
  const float* logits;      /* [num_tokens, num_experts] f32, row stride logits_stride */
  const void* input_ids;    /* [num_tokens] int32 or int64 (input_ids_i64) */
  const int32_t* tid2eid;   /* [vocab, routed] int32, row stride table_stride */
  float* weights;           /* [num_tokens, routed + shared] f32 */
  int32_t* ids;             /* [num_tokens, routed + shared] int32 */
  const void* num_real;     /* device count of real rows (int32 or int64), or NULL: num_real_host */
  int64_t logits_stride, table_stride, weights_stride, ids_stride;
  int64_t vocab;
  int32_t num_tokens, num_experts, routed, shared;
  int32_t num_real_host;
  int32_t input_ids_i64, num_real_i64;
  float routed_scaling_factor;
} ukv_hash_topk_params;

/* Indexer query preparation (indexer.cu, docs/indexer.md §1): per (token,
 * head), RoPE + Hadamard + FP8 with an fp32 scale, and the folded weight. */
typedef struct ukv_indexer_q_params {
  const void* q;            /* [num_tokens, num_heads, 128] bf16 */
  const void* weights;      /* [num_tokens, num_heads] bf16, token stride weights_stride */
  const float* table;       /* [max_pos, 64] f32, row stride table_stride */
  const void* positions;    /* [num_tokens] int32 or int64 (positions_i64) */
  uint8_t* q_fp8;           /* [num_tokens, num_heads, 128] codes */
  float* weights_out;       /* [num_tokens, num_heads] f32 */
  int64_t q_stride_token, q_stride_head;
  int64_t out_stride_token, out_stride_head;
  int64_t weights_stride, weights_out_stride;
  int64_t table_stride, max_pos;
  int32_t num_tokens, num_heads;
  int32_t positions_i64;
  uint32_t format;          /* 0 e4m3fn, 1 e4m3fnuz */
  float weight_scale;
  int32_t reserved;
} ukv_indexer_q_params;

/* Indexer key preparation (indexer.cu, docs/indexer.md §2): RMSNorm + RoPE
 * + Hadamard + FP8 into the indexer key cache (layout of cache_store.cu). */
typedef struct ukv_indexer_k_params {
  const void* key;          /* [num_tokens, 128] bf16 or f32 (key_f32), row stride key_stride */
  const void* norm_weight;  /* [128] bf16 */
  const float* table;       /* [max_pos, 64] f32, row stride table_stride */
  const void* positions;    /* [num_tokens] int32 or int64 (positions_i64) */
  const void* loc;          /* [num_tokens] int32 or int64 (loc_i64); negative or past the cache = skip */
  uint8_t* cache;           /* [num_pages, 132 * page_size] */
  int64_t key_stride;
  int64_t table_stride, max_pos;
  int64_t bytes_per_page;
  int64_t token_slots;      /* num_pages * page_size */
  int32_t page_shift;       /* log2(page_size) */
  int32_t num_tokens;
  int32_t key_f32, positions_i64, loc_i64;
  uint32_t format;          /* 0 e4m3fn, 1 e4m3fnuz */
  float eps;
  int32_t reserved;
} ukv_indexer_k_params;

/* Indexer scores and top-k (indexer_topk.cu, docs/indexer.md §3). Token t
 * of request batch_id[t] (negative or >= requests: padding) sees
 * min((pos + 1) / 4, logits_width, max_pages * 64) keys. */
typedef struct ukv_indexer_topk_params {
  const uint8_t* q_fp8;     /* [num_tokens, num_heads, 128] codes (score only) */
  const float* weights;     /* [num_tokens, num_heads] f32 (score only) */
  const uint8_t* cache;     /* [cache_pages, bytes_per_page] indexer key cache (score only) */
  const int32_t* page_table; /* [requests, max_pages] */
  const int32_t* batch_id;  /* [num_tokens] */
  const void* positions;    /* [num_tokens] int32 or int64 (positions_i64) */
  float* logits;            /* [num_tokens, logits_width] */
  int32_t* topk_indices;    /* [num_tokens, topk_width] */
  int64_t q_stride_token, q_stride_head, weights_stride;
  int64_t page_table_stride, logits_stride, topk_stride;
  int64_t bytes_per_page, cache_pages;
  int32_t requests, max_pages, logits_width, topk_width;
  int32_t num_tokens, num_heads, topk, positions_i64;
  uint32_t format;          /* 0 e4m3fn, 1 e4m3fnuz (score only) */
  int32_t score;            /* 1: compute the logits, then select */
  /* The fused CSA tail (NULL csa_indices: none): token t's entries after its
   * min(pos + 1, csa_window) SWA entries of csa_indices[csa_indptr[t]..]
   * receive csa_row_base + the page index of its j-th selected key (a page
   * index outside [0, csa_rows), or a j past the selected keys, the newest
   * SWA row, as csa_tail_kernel writes). */
  int32_t* csa_indices;      /* [csa_capacity] */
  const int32_t* csa_indptr; /* [num_tokens + 1] */
  int64_t csa_capacity;
  int32_t csa_window, csa_row_base, csa_rows, csa_reserved;
} ukv_indexer_topk_params;

/* The KV compressor (docs/compressor.md; kernels/compressor.cu). Decode: one
 * launch, every token appends its raw row to its ring and a token closing a
 * group pools and stores it. Prefill (prefill != 0): the groups first, then
 * the ring writes (the rows a later token of the same request in the call
 * does not overwrite). target: 0 the pool's compressed rows (row swa_rows +
 * loc), 1 a FlashMLA cache, 2 an indexer key cache. A token whose batch id,
 * slot or position is invalid is skipped; a group whose first position is
 * past the table or whose location is negative or >= capacity is not stored. */
typedef struct ukv_compress_params {
  const void* kv_score;     /* [num_tokens, row_floats] f32 or bf16 (kv_f32), row stride kv_stride */
  const float* ape;         /* [ratio, value_floats] f32, row stride ape_stride */
  const void* norm_weight;  /* [dim] bf16 or f32 (weight_f32) */
  const float* rope_table;  /* [max_pos, 64] f32, row stride table_stride */
  const int32_t* batch_id;  /* [num_tokens], < 0 = padding */
  const int32_t* req_slots; /* [num_requests] */
  const void* positions;    /* [num_tokens] int32 or int64 (positions_i64) */
  const void* loc;          /* [num_tokens] int32 or int64 (loc_i64) */
  float* state;             /* [num_slots * ring, row_floats] f32 rings */
  uint8_t* cache;           /* targets 1, 2: [pages, bytes_per_page] */
  ukv_pool_rows pool;       /* target 0 */
  int64_t kv_stride;        /* elements */
  int64_t ape_stride;
  int64_t table_stride;
  int64_t max_pos;
  int64_t capacity;         /* locations of the target */
  int64_t swa_rows;         /* target 0 */
  int64_t bytes_per_page;   /* targets 1, 2 */
  int32_t page_shift;       /* targets 1, 2: log2(page size) */
  int32_t num_tokens;
  int32_t num_requests;
  int32_t num_slots;
  int32_t ring;
  int32_t ratio;            /* 4 or 128 */
  int32_t dim;              /* 512 or 128 */
  int32_t target;
  int32_t prefill;
  int32_t kv_f32;
  int32_t weight_f32;
  int32_t positions_i64;
  int32_t loc_i64;
  uint32_t format;          /* targets 1, 2: ukv_fp8_format */
  float eps;
  int32_t reserved;
} ukv_compress_params;

/* Empties `num_rows` raw rows of `row_floats` f32 each: the first half of
 * every row (values) 0, the second (scores) -inf. */
typedef struct ukv_compress_clear_params {
  float* rows;
  int64_t num_rows;
  int32_t row_floats;
  int32_t reserved;
} ukv_compress_clear_params;
