// serving_step.cpp: a small serving session on a unified KV pool, end to end.
//
// What a serving engine does with unikv, in call order (docs/serving-step.md §2):
//
//   startup  unikv_context_create              AUTO: the GPU backend when present
//            unikv_pool_create                 per layer one [rows, 512] bf16 buffer, and
//                                              the compressor state (compressor_state)
//            unikv_*_plan_create               capture-time shapes; workspace sizes
//   admit    unikv_pool_acquire_slot           one SWA ring per request; compressed
//                                              rows are addressed by the engine's
//                                              own KV page table
//   prefill  per layer:
//              unikv_compress_prefill          groups the chunk closes, from the layer's
//                                              kv_score projection: BEFORE attention
//              unikv_build_prefill_streams     prefix (pool rows) + extend (chunk rows)
//              unikv_sparse_prefill
//              unikv_store_swa + final_pos     the chunk's last window: AFTER attention
//   decode   unikv_build_decode_streams        once per step, shared by all layers
//            per layer:
//              unikv_compress_decode           groups this step closes
//              unikv_store_swa                 this step's rows: BEFORE attention
//              unikv_fill_csa_tail             ratio-4 layers: this layer's top-k
//              unikv_sparse_decode
//   finish   unikv_pool_release_slot           also clears the slot's compressor rings
//
// The model is a stand-in: latent rows, the compressors' kv_score projections
// and queries are pseudo-random, and the CSA "indexer" picks the most recent
// groups. The library computes the compressed rows (gated pooling, RMSNorm,
// RoPE, the store: docs/compressor.md), so the engine keeps only its GEMM
// output. The program keeps a host copy of every row in the pool (compressed
// rows read back after each compress call) and checks each output against a
// dense float64 attention over the keys the token must see.
//
// Every tensor lives in the context's memory (unikv_memory_alloc) and results
// come back with unikv_memory_copy + unikv_stream_synchronize, so the program
// runs unchanged on a GPU backend.
//
// It uses the C++ bindings, unikv.hpp: each unikv::pool / plan / context
// method above is the C function of the same name (unikv_pool_acquire_slot
// is pool.acquire_slot, unikv_sparse_decode is decode_plan.sparse_decode),
// handles and buffers free themselves, and a failing call throws
// unikv::error with the library's message naming the argument at fault.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>

#include <unikv.hpp>

namespace {

// ---------------------------------------------------------------------------
// Configuration

constexpr uint32_t kNumLayers = 3;
constexpr uint32_t kRatios[kNumLayers] = {0, 4, 128};  // dense, CSA, HCA
constexpr uint32_t kWindow = 64;                       // 128 in DeepSeek-V4
constexpr uint32_t kMaxRequests = 4;
constexpr uint32_t kC128Blocks = 16;  // KV page space: 16 blocks of 128 tokens
constexpr int kPageTokens = 256;      // one page = 2 blocks = 2 c128 rows = 64 c4 rows
constexpr int kHeadDim = 512;
constexpr int kHeads = 8;      // local query heads (V4-Flash at TP8)
constexpr int kCsaTopk = 32;   // the indexer's top-k (512 or 1024 in production)
constexpr int kC128Width = 8;  // c128 table width: up to 8 closed 128-groups
constexpr int kNumRequests = 3;
constexpr int kPromptLens[kNumRequests] = {100, 300, 200};
constexpr int kDecodeSteps = 4;
constexpr int kDecodeGraphTokens = 4;  // decode batch size the CUDA graph is captured for
constexpr int kPrefillTokens = kPromptLens[0] + kPromptLens[1] + kPromptLens[2];  // one chunk each
constexpr int64_t kMaxPos = 512;  // RoPE table rows: every position of the session
const float kSoftmaxScale = 1.0f / std::sqrt(512.0f);
constexpr double kTolerance = 1e-2;  // relative L2 error per (token, head) output row

// ---------------------------------------------------------------------------
// Small helpers

uint16_t float_to_bf16(float value) { return unikv::bf16::from_float(value).bits; }  // nearest even
float bf16_to_float(uint16_t half) { return unikv::bf16{half}.to_float(); }

using Row = std::vector<uint16_t>;  // 512 bf16 values

// splitmix64: the same numbers on every platform, so the checksum is stable.
class Random {
public:
    explicit Random(uint64_t seed) : state_(seed) {}
    Row row(float amplitude) {
        Row r(kHeadDim);
        for (uint16_t& v : r) v = float_to_bf16(amplitude * static_cast<float>(2.0 * unit() - 1.0));
        return r;
    }
    float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(unit()); }

private:
    double unit() {
        uint64_t x = (state_ += 0x9E3779B97F4A7C15ull);
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        return static_cast<double>((x ^ (x >> 31)) >> 11) * 0x1.0p-53;
    }
    uint64_t state_;
};

// Memory in the context's address space (device memory on GPU backends):
// unikv::buffer, plus whole-vector copies.
class Buffer : public unikv::buffer {
public:
    Buffer() = default;
    Buffer(const unikv::context& ctx, size_t bytes) : unikv::buffer(ctx, bytes), ctx_(&ctx) {}

    template <class T>
    void upload(const std::vector<T>& host) {
        unikv::buffer::upload(host.data(), host.size() * sizeof(T));
    }
    template <class T>
    std::vector<T> download(size_t count) const {
        std::vector<T> host(count);
        unikv::buffer::download(host.data(), count * sizeof(T));
        ctx_->stream_synchronize();  // the copy is ordered on the stream
        return host;
    }

private:
    const unikv::context* ctx_ = nullptr;
};

Buffer i32_buffer(const unikv::context& ctx, int n) { return Buffer(ctx, n * sizeof(int32_t)); }
Buffer bf16_buffer(const unikv::context& ctx, int rows) { return Buffer(ctx, rows * kHeadDim * sizeof(uint16_t)); }

const char* backend_name(uint32_t backend) {
    switch (backend) {
        case UNIKV_BACKEND_CPU: return "CPU";
        case UNIKV_BACKEND_CUDA: return "CUDA";
        case UNIKV_BACKEND_ROCM: return "ROCm";
        default: return "unknown";
    }
}

// ---------------------------------------------------------------------------
// Requests, the model stand-in and the dense reference

struct Request {
    int prompt_len = 0;
    uint32_t slot = 0;       // from unikv_pool_acquire_slot
    std::vector<int> pages;  // the engine's page table: page id per 256 tokens
    int len = 0;             // tokens whose rows are in the pool
};

// Compressed page index of a request's group-th group of `ratio` (docs/pool.md §5):
// c4 group i -> pages[i / 64] * 64 + i % 64, c128 group i -> pages[i / 2] * 2 + i % 2.
int page_index(const Request& r, uint32_t ratio, int group) {
    const int per_page = kPageTokens / static_cast<int>(ratio);
    return r.pages[group / per_page] * per_page + group % per_page;
}

// The CSA indexer stand-in: the most recent min(visible, topk) groups, newest first.
std::vector<int> csa_topk(int pos) {
    std::vector<int> groups;
    for (int g = (pos + 1) / 4 - 1; g >= 0 && static_cast<int>(groups.size()) < kCsaTopk; --g)
        groups.push_back(g);
    return groups;
}

// Every row the model has produced, kept on the host for the reference:
// latent[layer][request][position], compressed[layer][request][group].
struct History {
    std::vector<std::vector<Row>> latent[kNumLayers];
    std::vector<std::vector<Row>> compressed[kNumLayers];
};

std::vector<double> to_double(const uint16_t* row) {
    std::vector<double> out(kHeadDim);
    for (int d = 0; d < kHeadDim; ++d) out[d] = bf16_to_float(row[d]);
    return out;
}

// Dense attention in float64 for one (token, head) over `keys` (K = V), with
// the sink as a virtual key of value zero (docs/attention.md §1).
std::vector<double> dense_attention(const std::vector<double>& q,
                                    const std::vector<std::vector<double>>& keys, double sink) {
    std::vector<double> logits;
    double max_logit = sink;
    for (const std::vector<double>& k : keys) {
        double dot = 0;
        for (int d = 0; d < kHeadDim; ++d) dot += q[d] * k[d];
        logits.push_back(kSoftmaxScale * dot);
        max_logit = std::max(max_logit, logits.back());
    }
    std::vector<double> out(kHeadDim, 0.0);
    double denominator = std::exp(sink - max_logit);
    for (size_t j = 0; j < keys.size(); ++j) {
        const double w = std::exp(logits[j] - max_logit);
        denominator += w;
        for (int d = 0; d < kHeadDim; ++d) out[d] += w * keys[j][d];
    }
    for (double& v : out) v /= denominator;
    return out;
}

// What the model hands the attention of one layer besides the latent rows.
struct LayerQueries {
    std::vector<uint16_t> q;  // [T, H, 512]
    std::vector<float> sink;  // [H]
};

// ---------------------------------------------------------------------------
// One forward pass: the batch layout every call of the step shares

struct Forward {
    std::vector<int32_t> batch_id;      // per token: request index, -1 = padding
    std::vector<int32_t> positions;     // per token
    std::vector<int32_t> req_slots;     // per request
    std::vector<int32_t> chunk_start;   // per request: first position in this forward
    std::vector<int32_t> extend_start;  // per request: row of its first token
    std::vector<int32_t> final_pos;     // per request: last position in this forward
    int tokens() const { return static_cast<int>(batch_id.size()); }
};

// Each request's tokens from its current length on (`count[r]` of them), then
// CUDA-graph padding up to `graph_tokens`.
Forward make_forward(const std::vector<Request>& requests, const std::vector<int>& count, int graph_tokens) {
    Forward f;
    for (int r = 0; r < static_cast<int>(requests.size()); ++r) {
        f.req_slots.push_back(static_cast<int32_t>(requests[r].slot));
        f.chunk_start.push_back(requests[r].len);
        f.extend_start.push_back(f.tokens());
        f.final_pos.push_back(requests[r].len + count[r] - 1);
        for (int i = 0; i < count[r]; ++i) {
            f.batch_id.push_back(r);
            f.positions.push_back(requests[r].len + i);
        }
    }
    while (f.tokens() < graph_tokens) {
        f.batch_id.push_back(-1);
        f.positions.push_back(0);
    }
    return f;
}

// ---------------------------------------------------------------------------
// The engine

class Engine {
public:
    Engine() {
        create_context();
        create_pool();
        create_plans();
        allocate_buffers();
    }
    void admit(int prompt_len) {
        Request r;
        r.prompt_len = prompt_len;
        r.slot = pool_.acquire_slot();
        const int max_tokens = prompt_len + kDecodeSteps;
        for (int t = 0; t < max_tokens; t += kPageTokens) r.pages.push_back(next_page_++);
        std::printf("request %zu: prompt %d tokens, slot %u, pages", requests_.size(), prompt_len, r.slot);
        for (int p : r.pages) std::printf(" %d", p);
        std::printf("\n");
        requests_.push_back(r);
        for (uint32_t l = 0; l < kNumLayers; ++l) {
            history_.latent[l].emplace_back();
            history_.compressed[l].emplace_back();
        }
    }

    // One chunk per request: its whole prompt, all requests in one forward.
    void prefill() {
        std::vector<int> count;
        for (const Request& r : requests_) count.push_back(r.prompt_len);
        const Forward f = make_forward(requests_, count, 0);
        upload_forward(f);
        for (uint32_t layer = 0; layer < kNumLayers; ++layer) prefill_layer(f, layer);
        finish_forward(count);
        prefill_tokens_ += f.tokens();
        std::printf("prefill: 1 forward, %d tokens x %u layers\n", f.tokens(), kNumLayers);
    }

    // One token per request plus padding up to the captured graph size.
    void decode_step() {
        const std::vector<int> count(requests_.size(), 1);
        const Forward f = make_forward(requests_, count, kDecodeGraphTokens);
        upload_forward(f);
        build_decode_streams(f);
        last_step_checksum_ = 0.0;
        for (uint32_t layer = 0; layer < kNumLayers; ++layer) last_step_checksum_ += decode_layer(f, layer);
        finish_forward(count);
        ++decode_steps_;
    }

    void report() const {
        const int padding = kDecodeGraphTokens - static_cast<int>(requests_.size());
        std::printf("decode: %d steps x (%zu requests + %d padding) tokens x %u layers\n", decode_steps_,
                    requests_.size(), padding, kNumLayers);
        std::printf("tokens processed: %d prefill + %d decode\n", prefill_tokens_,
                    decode_steps_ * static_cast<int>(requests_.size()));
        const unikv_pool_info info = pool_info();
        std::printf("pool occupancy: %u / %u slots in use; rows per layer:", info.slots_in_use,
                    info.max_requests);
        for (uint32_t l = 0; l < kNumLayers; ++l) {
            const unikv::pool_layer_info layer = pool_.get_layer(l);
            std::printf(" %llu (ratio %u)", static_cast<unsigned long long>(layer.rows),
                        layer.compress_ratio);
        }
        std::printf("\n");
        std::printf("checksum of the last decode step's outputs: %.6f\n", last_step_checksum_);
        std::printf(
            "max relative L2 error vs dense reference: %.3e over %ld (token, head) rows, %ld above %.0e\n",
            max_error_, rows_checked_, rows_failed_, kTolerance);
    }

    void finish() {
        for (const Request& r : requests_) pool_.release_slot(r.slot);
        const unikv_pool_info info = pool_info();
        std::printf("requests finished: %u / %u slots in use\n", info.slots_in_use, info.max_requests);
    }

    bool outputs_match_reference() const { return rows_failed_ == 0; }

private:
    // --- startup ---------------------------------------------------------

    void create_context() {
        ctx_ = unikv::context::create(UNIKV_BACKEND_AUTO);
        const unikv::context_info info = ctx_.get_info();
        if (info.backend == UNIKV_BACKEND_CPU)
            std::printf("unikv %s: backend CPU (%u threads)\n", unikv_version_string(), info.cpu_threads);
        else
            std::printf("unikv %s: backend %s (device %d)\n", unikv_version_string(),
                        backend_name(info.backend), info.device);
    }

    void create_pool() {
        auto params = unikv::make_struct<unikv::pool_params>();
        params.compress_ratios = kRatios;
        params.layer_buffers = nullptr;  // the pool allocates (zeroed) buffers itself
        params.num_layers = kNumLayers;
        params.max_requests = kMaxRequests;
        params.window = kWindow;
        params.spec_extra = 0;  // no speculative decoding
        params.c128_blocks = kC128Blocks;
        params.kv_dtype = UNIKV_DTYPE_BF16;
        params.compressor_state = 1;  // the pool keeps each request's raw compressor rows
        params.c4_state_ring = 8;     // 16 / 256 with speculative decoding
        params.c128_state_ring = 128;
        pool_ = unikv::pool::create(ctx_, params);
        const unikv_pool_info info = pool_info();
        std::printf("pool: %u layers (ratios 0/4/128), window %u, ring %u, %u request slots\n",
                    info.num_layers, info.window, info.ring, info.max_requests);
    }

    unikv::pool_info pool_info() const { return pool_.get_info(); }

    void create_plans() {
        // bf16 queries and outputs, head_dim 512, the pool's kv dtype.
        prefill_plan_ = unikv::prefill_plan::create(ctx_, unikv::plan_params(kPrefillTokens, kHeads));
        prefill_workspace_ = Buffer(ctx_, prefill_plan_.workspace_size());  // 0 bytes on the CPU backend
        decode_plan_ = unikv::decode_plan::create(ctx_, unikv::plan_params(kDecodeGraphTokens, kHeads));
        decode_workspace_ = Buffer(ctx_, decode_plan_.workspace_size());
    }

    // Sized once for the largest forward, as a CUDA-graph engine must.
    void allocate_buffers() {
        const int T = std::max(kPrefillTokens, kDecodeGraphTokens);
        const int table_width = std::max(kC128Width, kCsaTopk);
        const unikv::context& ctx = ctx_;
        q_ = bf16_buffer(ctx, T * kHeads);
        out_ = bf16_buffer(ctx, T * kHeads);
        kv_ = bf16_buffer(ctx, T);
        kv_score_ = Buffer(ctx, size_t(T) * 4 * kHeadDim * sizeof(float));  // widest: ratio 4
        compress_loc_ = i32_buffer(ctx, T);
        // The compressors' parameters (the checkpoint's ape and norm weight)
        // and the compressed layers' RoPE table (base 40000, as DeepSeek-V4).
        auto rope = unikv::make_struct<unikv::rope_params>();
        rope.base = 40000.0;
        rope_table_ = Buffer(ctx, kMaxPos * 64 * sizeof(float));
        rope_table_.upload(unikv::rope_table(rope, static_cast<uint32_t>(kMaxPos)));
        for (uint32_t l = 0; l < kNumLayers; ++l) {
            if (kRatios[l] == 0) continue;
            std::vector<float> ape(kRatios[l] * values(kRatios[l]));
            for (float& v : ape) v = rng_.uniform(-1.0f, 1.0f);
            std::vector<uint16_t> norm(kHeadDim);
            for (uint16_t& w : norm) w = float_to_bf16(rng_.uniform(0.5f, 1.5f));
            ape_[l] = Buffer(ctx, ape.size() * sizeof(float));
            ape_[l].upload(ape);
            norm_[l] = Buffer(ctx, norm.size() * sizeof(uint16_t));
            norm_[l].upload(norm);
        }
        sink_ = Buffer(ctx, kHeads * sizeof(float));
        batch_id_ = i32_buffer(ctx, T);
        positions_ = i32_buffer(ctx, T);
        req_slots_ = i32_buffer(ctx, kNumRequests);
        chunk_start_ = i32_buffer(ctx, kNumRequests);
        extend_start_ = i32_buffer(ctx, kNumRequests);
        final_pos_ = i32_buffer(ctx, kNumRequests);
        c128_table_ = i32_buffer(ctx, T * kC128Width);
        csa_table_ = i32_buffer(ctx, T * kCsaTopk);
        // Index streams, at the worst-case capacities the builders require.
        prefix_indptr_ = i32_buffer(ctx, T + 1);
        prefix_indices_ = i32_buffer(ctx, T * (kWindow + table_width));
        extend_indptr_ = i32_buffer(ctx, T + 1);
        extend_indices_ = i32_buffer(ctx, T * kWindow);
        swa_indptr_ = i32_buffer(ctx, T + 1);
        swa_indices_ = i32_buffer(ctx, T * kWindow);
        hca_indptr_ = i32_buffer(ctx, T + 1);
        hca_indices_ = i32_buffer(ctx, T * (kWindow + kC128Width));
        csa_indptr_ = i32_buffer(ctx, T + 1);
        csa_indices_ = i32_buffer(ctx, T * (kWindow + kCsaTopk));
    }

    // --- per forward -----------------------------------------------------

    void upload_forward(const Forward& f) {
        batch_id_.upload(f.batch_id);
        positions_.upload(f.positions);
        req_slots_.upload(f.req_slots);
        chunk_start_.upload(f.chunk_start);
        extend_start_.upload(f.extend_start);
        final_pos_.upload(f.final_pos);
        c128_table_.upload(c128_table(f));
    }

    void finish_forward(const std::vector<int>& count) {
        for (size_t r = 0; r < requests_.size(); ++r) requests_[r].len += count[r];
    }

    // [T, kC128Width]: page index of every 128-group closed at or before each
    // token, -1 after (padding tokens: all -1).
    std::vector<int32_t> c128_table(const Forward& f) const {
        std::vector<int32_t> table(f.tokens() * kC128Width, -1);
        for (int t = 0; t < f.tokens(); ++t) {
            if (f.batch_id[t] < 0) continue;
            for (int g = 0; g < (f.positions[t] + 1) / 128; ++g)
                table[t * kC128Width + g] = page_index(requests_[f.batch_id[t]], 128, g);
        }
        return table;
    }

    // [T, kCsaTopk]: the indexer's top-k as page indices, front-packed, -1 after.
    std::vector<int32_t> csa_table(const Forward& f) const {
        std::vector<int32_t> table(f.tokens() * kCsaTopk, -1);
        for (int t = 0; t < f.tokens(); ++t) {
            if (f.batch_id[t] < 0) continue;
            const std::vector<int> groups = csa_topk(f.positions[t]);
            for (size_t j = 0; j < groups.size(); ++j)
                table[t * kCsaTopk + j] = page_index(requests_[f.batch_id[t]], 4, groups[j]);
        }
        return table;
    }

    // The model's outputs for one layer: the tokens' latent rows into `kv_`,
    // queries into `q_`, the layer's sink into `sink_`; on compressed layers the
    // compressor's kv_score projection, from which the library stores the rows
    // of the groups this forward closes into the pool.
    LayerQueries run_model_layer(const Forward& f, uint32_t layer, bool decode) {
        const uint32_t ratio = kRatios[layer];
        std::vector<uint16_t> kv, q;
        std::vector<float> kv_score;
        std::vector<int32_t> loc;
        for (int t = 0; t < f.tokens(); ++t) {
            const Row row = rng_.row(1.0f);
            kv.insert(kv.end(), row.begin(), row.end());
            for (int h = 0; h < kHeads; ++h) {
                const Row qh = rng_.row(3.0f);
                q.insert(q.end(), qh.begin(), qh.end());
            }
            if (ratio != 0) {
                // kv_score = x . wkv_gate^T: values in [-2, 2], scores in [-4, 4].
                const int n = 2 * values(ratio);
                for (int i = 0; i < n; ++i)
                    kv_score.push_back(i < n / 2 ? rng_.uniform(-2.0f, 2.0f) : rng_.uniform(-4.0f, 4.0f));
            }
            const int r = f.batch_id[t];
            int32_t where = -1;
            if (r >= 0) {  // padding: its rows are never stored
                const int pos = f.positions[t];
                history_.latent[layer][r].push_back(row);
                if (ratio != 0 && (pos + 1) % ratio == 0)  // this token closes a group
                    where = page_index(requests_[r], ratio, (pos + 1) / static_cast<int>(ratio) - 1);
            }
            loc.push_back(where);
        }
        std::vector<float> sink;
        for (int h = 0; h < kHeads; ++h) sink.push_back(rng_.uniform(-1.0f, 1.0f));
        kv_.upload(kv);
        q_.upload(q);
        sink_.upload(sink);
        if (ratio != 0) compress(f, layer, kv_score, loc, decode);
        return {std::move(q), std::move(sink)};
    }

    // Floats of a compressor's kv_score half (values, then as many scores).
    static int values(uint32_t ratio) { return ratio == 4 ? 2 * kHeadDim : kHeadDim; }

    // The layer's compressor: every token's raw row into its request's ring,
    // the groups the forward closes into pool rows swa_rows + loc, before the
    // attention of the tokens that see them. The stored rows are read back for
    // the reference.
    void compress(const Forward& f, uint32_t layer, const std::vector<float>& kv_score,
                  const std::vector<int32_t>& loc, bool decode) {
        const uint32_t ratio = kRatios[layer];
        const int64_t T = f.tokens(), R = int64_t(f.req_slots.size());
        kv_score_.upload(kv_score);
        compress_loc_.upload(loc);
        auto a = unikv::make_struct<unikv::compress_args>();
        a.kv_score = kv_score_.tensor(UNIKV_DTYPE_F32, {T, 2 * values(ratio)});
        a.ape = ape_[layer].tensor(UNIKV_DTYPE_F32, {int64_t(ratio), values(ratio)});
        a.norm_weight = norm_[layer].tensor(UNIKV_DTYPE_BF16, {kHeadDim});
        a.rope_table = rope_table_.tensor(UNIKV_DTYPE_F32, {kMaxPos, 64});
        a.batch_id = batch_id_.tensor(UNIKV_DTYPE_I32, {T});
        a.req_slots = req_slots_.tensor(UNIKV_DTYPE_I32, {R});
        a.positions = positions_.tensor(UNIKV_DTYPE_I32, {T});
        a.loc = compress_loc_.tensor(UNIKV_DTYPE_I32, {T});
        a.layer = layer;
        a.compressor = UNIKV_COMPRESSOR_KV;
        a.num_tokens = static_cast<uint32_t>(T);
        a.eps = 1e-6f;
        if (decode)
            pool_.compress_decode(a);
        else
            pool_.compress_prefill(a);
        const unikv::pool_layer_info info = pool_.get_layer(layer);
        for (int t = 0; t < T; ++t) {
            if (loc[t] < 0) continue;
            Row row(kHeadDim);
            ctx_.memory_copy(row.data(), static_cast<const uint16_t*>(info.data) + (info.swa_rows + loc[t]) * kHeadDim,
                             kHeadDim * sizeof(uint16_t), UNIKV_COPY_DEVICE_TO_HOST);
            ctx_.stream_synchronize();
            history_.compressed[layer][f.batch_id[t]].push_back(row);
        }
    }

    // Writes the forward's latent rows into the requests' SWA rings. With
    // final_pos (prefill), only each request's last `window` positions are
    // written, so a chunk longer than the ring does not overwrite itself.
    void store_swa(const Forward& f, uint32_t layer, bool final_window_only) {
        const int64_t T = f.tokens(), R = int64_t(f.req_slots.size());
        auto a = unikv::make_struct<unikv::store_swa_args>();
        a.kv = kv_.tensor(UNIKV_DTYPE_BF16, {T, kHeadDim});
        a.batch_id = batch_id_.tensor(UNIKV_DTYPE_I32, {T});
        a.req_slots = req_slots_.tensor(UNIKV_DTYPE_I32, {R});
        a.positions = positions_.tensor(UNIKV_DTYPE_I32, {T});
        if (final_window_only) a.final_pos = final_pos_.tensor(UNIKV_DTYPE_I32, {R});
        a.layer = layer;
        a.num_tokens = static_cast<uint32_t>(T);
        pool_.store_swa(a);
    }

    void prefill_layer(const Forward& f, uint32_t layer) {
        const uint32_t ratio = kRatios[layer];
        const int64_t T = f.tokens(), R = int64_t(f.req_slots.size());
        const LayerQueries model = run_model_layer(f, layer, /*decode=*/false);

        // Index streams for this layer's kind: prefix = earlier ring rows +
        // compressed rows, extend = rows of this chunk's own K tensor.
        const int64_t width = ratio == 128 ? kC128Width : ratio == 4 ? kCsaTopk : 0;
        auto s = unikv::make_struct<unikv::prefill_streams_args>();
        s.batch_id = batch_id_.tensor(UNIKV_DTYPE_I32, {T});
        s.req_slots = req_slots_.tensor(UNIKV_DTYPE_I32, {R});
        s.positions = positions_.tensor(UNIKV_DTYPE_I32, {T});
        s.chunk_start = chunk_start_.tensor(UNIKV_DTYPE_I32, {R});
        s.extend_start = extend_start_.tensor(UNIKV_DTYPE_I32, {R});
        if (ratio == 128) s.page_indices = c128_table_.tensor(UNIKV_DTYPE_I32, {T, width});
        if (ratio == 4) {
            csa_table_.upload(csa_table(f));  // this layer's indexer output
            s.page_indices = csa_table_.tensor(UNIKV_DTYPE_I32, {T, width});
        }
        s.prefix_indptr = prefix_indptr_.tensor(UNIKV_DTYPE_I32, {T + 1});
        s.prefix_indices = prefix_indices_.tensor(UNIKV_DTYPE_I32, {T * (kWindow + width)});
        s.extend_indptr = extend_indptr_.tensor(UNIKV_DTYPE_I32, {T + 1});
        s.extend_indices = extend_indices_.tensor(UNIKV_DTYPE_I32, {T * kWindow});
        s.num_tokens = static_cast<uint32_t>(T);
        s.compress_ratio = ratio;
        pool_.build_prefill_streams(s);

        auto a = unikv::make_struct<unikv::prefill_args>();
        a.q = q_.tensor(UNIKV_DTYPE_BF16, {T, kHeads, kHeadDim});
        a.indices = s.prefix_indices;
        a.indptr = s.prefix_indptr;
        a.sink = sink_.tensor(UNIKV_DTYPE_F32, {kHeads});
        a.out = out_.tensor(UNIKV_DTYPE_BF16, {T, kHeads, kHeadDim});
        a.extend_kv = kv_.tensor(UNIKV_DTYPE_BF16, {T, kHeadDim});
        a.extend_indices = s.extend_indices;
        a.extend_indptr = s.extend_indptr;
        a.layer = layer;
        a.num_tokens = static_cast<uint32_t>(T);
        a.softmax_scale = kSoftmaxScale;
        prefill_plan_.sparse_prefill(pool_, a, prefill_workspace_);

        store_swa(f, layer, /*final_window_only=*/true);
        check_outputs(f, layer, model);
    }

    // Decode streams are layer-invariant except the CSA tail: build them once.
    void build_decode_streams(const Forward& f) {
        const int64_t T = f.tokens();
        auto s = unikv::make_struct<unikv::decode_streams_args>();
        s.batch_id = batch_id_.tensor(UNIKV_DTYPE_I32, {T});
        s.req_slots = req_slots_.tensor(UNIKV_DTYPE_I32, {int64_t(f.req_slots.size())});
        s.positions = positions_.tensor(UNIKV_DTYPE_I32, {T});
        s.c128_page_indices = c128_table_.tensor(UNIKV_DTYPE_I32, {T, kC128Width});
        s.swa_indptr = swa_indptr_.tensor(UNIKV_DTYPE_I32, {T + 1});
        s.swa_indices = swa_indices_.tensor(UNIKV_DTYPE_I32, {T * kWindow});
        s.hca_indptr = hca_indptr_.tensor(UNIKV_DTYPE_I32, {T + 1});
        s.hca_indices = hca_indices_.tensor(UNIKV_DTYPE_I32, {T * (kWindow + kC128Width)});
        s.csa_indptr = csa_indptr_.tensor(UNIKV_DTYPE_I32, {T + 1});
        s.csa_indices = csa_indices_.tensor(UNIKV_DTYPE_I32, {T * (kWindow + kCsaTopk)});
        s.num_tokens = static_cast<uint32_t>(T);
        s.csa_topk = kCsaTopk;
        pool_.build_decode_streams(s);
        decode_streams_ = s;
    }

    // Returns the sum of the layer's outputs (for the checksum).
    double decode_layer(const Forward& f, uint32_t layer) {
        const uint32_t ratio = kRatios[layer];
        const int64_t T = f.tokens();
        const unikv_decode_streams_args& s = decode_streams_;
        const LayerQueries model = run_model_layer(f, layer, /*decode=*/true);
        store_swa(f, layer, /*final_window_only=*/false);  // before attention: the token sees itself

        if (ratio == 4) {  // this layer's indexer ran: write its top-k into the CSA slices
            csa_table_.upload(csa_table(f));
            auto c = unikv::make_struct<unikv::csa_tail_args>();
            c.batch_id = s.batch_id;
            c.positions = s.positions;
            c.csa_page_indices = csa_table_.tensor(UNIKV_DTYPE_I32, {T, kCsaTopk});
            c.csa_indptr = s.csa_indptr;
            c.csa_indices = s.csa_indices;
            c.num_tokens = static_cast<uint32_t>(T);
            pool_.fill_csa_tail(c);
        }

        auto a = unikv::make_struct<unikv::decode_args>();
        a.q = q_.tensor(UNIKV_DTYPE_BF16, {T, kHeads, kHeadDim});
        a.indices = ratio == 0 ? s.swa_indices : ratio == 4 ? s.csa_indices : s.hca_indices;
        a.indptr = ratio == 0 ? s.swa_indptr : ratio == 4 ? s.csa_indptr : s.hca_indptr;
        a.sink = sink_.tensor(UNIKV_DTYPE_F32, {kHeads});
        a.out = out_.tensor(UNIKV_DTYPE_BF16, {T, kHeads, kHeadDim});
        a.layer = layer;
        a.num_tokens = static_cast<uint32_t>(T);
        a.softmax_scale = kSoftmaxScale;
        decode_plan_.sparse_decode(pool_, a, decode_workspace_);
        return check_outputs(f, layer, model);
    }

    // --- checking --------------------------------------------------------

    // The keys token (r, pos) must see: its window, then all closed 128-groups
    // (HCA) or the indexer's top-k groups (CSA).
    std::vector<std::vector<double>> visible_keys(uint32_t layer, int r, int pos) const {
        std::vector<std::vector<double>> keys;
        for (int p = std::max(0, pos - static_cast<int>(kWindow) + 1); p <= pos; ++p)
            keys.push_back(to_double(history_.latent[layer][r][p].data()));
        const std::vector<Row>& groups = history_.compressed[layer][r];
        if (kRatios[layer] == 128)
            for (int g = 0; g < (pos + 1) / 128; ++g) keys.push_back(to_double(groups[g].data()));
        if (kRatios[layer] == 4)
            for (int g : csa_topk(pos)) keys.push_back(to_double(groups[g].data()));
        return keys;
    }

    // Compares every real token's output with the dense reference; returns the
    // sum of those outputs.
    double check_outputs(const Forward& f, uint32_t layer, const LayerQueries& model) {
        const std::vector<uint16_t> out = out_.download<uint16_t>(size_t(f.tokens()) * kHeads * kHeadDim);
        double sum = 0.0;
        for (int t = 0; t < f.tokens(); ++t) {
            if (f.batch_id[t] < 0) continue;  // padding: output is zeros, ignored
            const std::vector<std::vector<double>> keys = visible_keys(layer, f.batch_id[t], f.positions[t]);
            for (int h = 0; h < kHeads; ++h) {
                const size_t at = (size_t(t) * kHeads + h) * kHeadDim;
                const std::vector<double> ref = dense_attention(to_double(&model.q[at]), keys, model.sink[h]);
                double diff = 0, norm = 0;
                for (int d = 0; d < kHeadDim; ++d) {
                    const double got = bf16_to_float(out[at + d]);
                    sum += got;
                    diff += (got - ref[d]) * (got - ref[d]);
                    norm += ref[d] * ref[d];
                }
                const double error = std::sqrt(diff / norm);
                if (!(error < kTolerance)) ++rows_failed_;  // NaN counts as a failure
                max_error_ = std::max(max_error_, error);
                ++rows_checked_;
            }
        }
        return sum;
    }

    // Declared first, destroyed last: the buffers below are freed through the context.
    unikv::context ctx_;
    unikv::pool pool_;
    unikv::prefill_plan prefill_plan_;
    unikv::decode_plan decode_plan_;
    Buffer prefill_workspace_, decode_workspace_;
    Buffer q_, out_, kv_, kv_score_, compress_loc_, sink_;
    Buffer rope_table_, ape_[kNumLayers], norm_[kNumLayers];
    Buffer batch_id_, positions_, req_slots_, chunk_start_, extend_start_, final_pos_;
    Buffer c128_table_, csa_table_;
    Buffer prefix_indptr_, prefix_indices_, extend_indptr_, extend_indices_;
    Buffer swa_indptr_, swa_indices_, hca_indptr_, hca_indices_, csa_indptr_, csa_indices_;
    unikv_decode_streams_args decode_streams_{};

    std::vector<Request> requests_;
    int next_page_ = 0;  // a trivial page allocator
    History history_;
    Random rng_{2024};
    int prefill_tokens_ = 0;
    int decode_steps_ = 0;
    long rows_checked_ = 0;
    long rows_failed_ = 0;
    double max_error_ = 0.0;
    double last_step_checksum_ = 0.0;
};

}  // namespace

int main() {
    try {
        Engine engine;
        for (int len : kPromptLens) engine.admit(len);
        engine.prefill();
        for (int step = 0; step < kDecodeSteps; ++step) engine.decode_step();
        engine.report();
        engine.finish();
        if (!engine.outputs_match_reference()) {
            std::fprintf(stderr, "FAILED: outputs differ from the dense reference\n");
            return 1;
        }
    } catch (const unikv::error& e) {  // "<call>: <status>: <the argument at fault>"
        std::fprintf(stderr, "FAILED: %s\n", e.what());
        return 1;
    }
    return 0;
}
