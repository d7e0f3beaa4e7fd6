// End-to-end serving scenario, on the CPU backend by default or on the backend
// UNIKV_TEST_BACKEND names (cpu, cuda, auto), so the same test runs on a GPU.
//
// Three requests of different prompt lengths go through chunked prefill (chunks
// longer than the SWA ring, several chunks per long prompt), then batched decode
// steps (enough for the ring to wrap) padded with CUDA-graph padding tokens, over
// a pool with one dense, one CSA (ratio 4) and one HCA (ratio 128) layer. A
// request starts decoding as soon as its prefill is done, so decode steps run
// between the prefill chunks of the others.
//
// The "model" is deterministic: every latent row, compressed row, query, sink
// and top-k choice is a pure function of its key. Every attention output is
// compared with a float64 dense attention over the key set the token must see,
// derived from that model (never from the library's index streams).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "serving_common.hpp"

namespace {

using namespace serving;

// ---------------------------------------------------------------------------
// Scenario

constexpr int kLayers = 3;
constexpr uint32_t kRatios[kLayers] = {0, 4, 128};  // dense, CSA, HCA
constexpr uint32_t kWindow = 16;
constexpr uint32_t kSpecExtra = 2;  // ring of 18 rows per slot
constexpr uint32_t kMaxRequests = 4;
constexpr uint32_t kC128Blocks = 32;  // 16 pages of 256 tokens
constexpr int kPageTokens = 256;
constexpr int kHeads = 8;
constexpr int kCsaTopk = 8;
constexpr int kC128Width = 8;     // HCA table width: 8 groups cover 1024 tokens
constexpr int kChunk = 128;       // prefill chunk, longer than the ring
constexpr int kDecodeSteps = 20;  // more than the ring: each ring wraps
constexpr int kRequests = 3;
// 250: the second request closes its 128-group 1 (position 255) while decoding.
constexpr int kPromptLens[kRequests] = {37, 250, 700};
// Page ids handed out in this order; all below kC128Blocks / 2.
constexpr int kPageIds[] = {11, 4, 9, 14, 2, 7, 0, 13};
constexpr int kPrefillMaxTokens = kRequests * kChunk;
// The captured decode graph's size: always at least one padding token.
constexpr int kDecodeMaxTokens = kRequests + 1;
// Device buffers serve both kinds of forward.
constexpr int kMaxTokens = std::max(kPrefillMaxTokens, kDecodeMaxTokens);
constexpr int kMaxTableWidth = std::max(kC128Width, kCsaTopk);
constexpr double kTolerance = 1e-2;
const float kScale = 1.0f / std::sqrt(512.0f);

// ---------------------------------------------------------------------------
// The stand-in model

enum Kind : uint64_t { kLatent = 1, kCompressed, kQuery, kSink, kTopk, kJunk };

Bf16Row latent_row(int req, int layer, int pos) {
    return random_row({kLatent, uint64_t(req), uint64_t(layer), uint64_t(pos)}, 1.0);
}

Bf16Row compressed_row(int req, int layer, int group) {
    return random_row({kCompressed, uint64_t(req), uint64_t(layer), uint64_t(group)}, 1.0);
}

// Amplitude 3 spreads the logits over about +-1, so the softmax is far from
// uniform and a wrong key set shows. Padding tokens pass req = -1.
Bf16Row query_row(int req, int pos, int layer, int head) {
    return random_row({kQuery, uint64_t(req), uint64_t(pos), uint64_t(layer), uint64_t(head)}, 3.0);
}

// Rows that must never reach the pool: padding rows and compressor outputs of
// tokens that close no group.
Bf16Row junk_row(int layer, int token) {
    return random_row({kJunk, uint64_t(layer), uint64_t(token)}, 100.0);
}

float sink_logit(int layer, int head) {
    Rng rng({kSink, uint64_t(layer), uint64_t(head)});
    return static_cast<float>(rng.uniform(-2.0, 2.0));
}

// The stand-in indexer of a CSA layer: min(visible, topk) distinct groups among
// the (pos + 1) / 4 visible ones, in pseudo-random order.
std::vector<int> csa_topk_groups(int req, int layer, int pos) {
    const int visible = (pos + 1) / 4;
    std::vector<int> groups(visible);
    std::iota(groups.begin(), groups.end(), 0);
    Rng rng({kTopk, uint64_t(req), uint64_t(layer), uint64_t(pos)});
    const int k = std::min(visible, kCsaTopk);
    for (int i = 0; i < k; ++i) std::swap(groups[i], groups[i + rng.below(visible - i)]);
    groups.resize(k);
    return groups;
}

// ---------------------------------------------------------------------------
// Requests and batches

struct Request {
    int prompt_len = 0;
    std::vector<int> pages;  // page table: page id of each 256-token page
    uint32_t slot = 0;
    int processed = 0;  // tokens whose rows are in the pool
    int decoded = 0;
};

// Compressed page index of a request's group (docs/pool.md §5):
// c4 entry i -> pt[i / 64] * 64 + i % 64, c128 entry i -> pt[i / 2] * 2 + i % 2.
int page_index(const Request& r, uint32_t ratio, int group) {
    const int per_page = kPageTokens / static_cast<int>(ratio);
    return r.pages[group / per_page] * per_page + group % per_page;
}

// One token of a forward; request < 0 marks a CUDA-graph padding token.
struct Token {
    int request;
    int pos;
};

// One forward: the requests in it (batch index -> request) and its tokens,
// each request's tokens contiguous, padding last.
struct Batch {
    std::vector<int> requests;
    std::vector<Token> tokens;
    std::vector<int32_t> batch_id;
    std::vector<int32_t> positions;
    std::vector<int32_t> first_row;  // per batch entry: its first token
    std::vector<int32_t> count;      // per batch entry: its tokens

    void add(int request, int first_pos, int n) {
        first_row.push_back(static_cast<int32_t>(tokens.size()));
        count.push_back(n);
        for (int i = 0; i < n; ++i) {
            tokens.push_back({request, first_pos + i});
            batch_id.push_back(static_cast<int32_t>(requests.size()));
            positions.push_back(first_pos + i);
        }
        requests.push_back(request);
    }
    void pad_to(int total) {
        while (static_cast<int>(tokens.size()) < total) {
            tokens.push_back({-1, 0});
            batch_id.push_back(-1);
            positions.push_back(0);
        }
    }
    int size() const { return static_cast<int>(tokens.size()); }
};

// ---------------------------------------------------------------------------
// Per-layer host inputs of a forward, all derived from the model

struct LayerInputs {
    std::vector<uint16_t> kv;          // [T, 512]: the tokens' latent rows
    std::vector<uint16_t> q;           // [T, H, 512]
    std::vector<uint16_t> compressed;  // [T, 512]: what each token's compressor emits
    std::vector<int32_t> loc;          // [T]: page index of the group it closes, else -1
    std::vector<float> sink;           // [H]
};

void append(std::vector<uint16_t>& dst, const Bf16Row& row) { dst.insert(dst.end(), row.begin(), row.end()); }

LayerInputs layer_inputs(const Batch& batch, const std::vector<Request>& reqs, int layer) {
    const uint32_t ratio = kRatios[layer];
    LayerInputs in;
    for (int t = 0; t < batch.size(); ++t) {
        const Token tok = batch.tokens[t];
        const bool padding = tok.request < 0;
        append(in.kv, padding ? junk_row(layer, t) : latent_row(tok.request, layer, tok.pos));
        for (int h = 0; h < kHeads; ++h)
            append(in.q, query_row(tok.request, padding ? t : tok.pos, layer, h));
        const bool closes_group = !padding && ratio != 0 && (tok.pos + 1) % ratio == 0;
        const int group = closes_group ? (tok.pos + 1) / static_cast<int>(ratio) - 1 : 0;
        append(in.compressed, closes_group ? compressed_row(tok.request, layer, group) : junk_row(layer, t));
        in.loc.push_back(closes_group ? page_index(reqs[tok.request], ratio, group) : -1);
    }
    for (int h = 0; h < kHeads; ++h) in.sink.push_back(sink_logit(layer, h));
    return in;
}

// [T, kC128Width] c128 table: the page index of every 128-group closed at or
// before each token, -1 after.
std::vector<int32_t> c128_table(const Batch& batch, const std::vector<Request>& reqs) {
    std::vector<int32_t> table(static_cast<size_t>(batch.size()) * kC128Width, -1);
    for (int t = 0; t < batch.size(); ++t) {
        const Token tok = batch.tokens[t];
        if (tok.request < 0) continue;
        for (int g = 0; g < (tok.pos + 1) / 128; ++g)
            table[t * kC128Width + g] = page_index(reqs[tok.request], 128, g);
    }
    return table;
}

// [T, kCsaTopk] top-k table of a CSA layer: page indices of each token's chosen
// groups, front-packed, -1 after.
std::vector<int32_t> csa_table(const Batch& batch, const std::vector<Request>& reqs, int layer) {
    std::vector<int32_t> table(static_cast<size_t>(batch.size()) * kCsaTopk, -1);
    for (int t = 0; t < batch.size(); ++t) {
        const Token tok = batch.tokens[t];
        if (tok.request < 0) continue;
        const std::vector<int> groups = csa_topk_groups(tok.request, layer, tok.pos);
        for (size_t j = 0; j < groups.size(); ++j)
            table[t * kCsaTopk + j] = page_index(reqs[tok.request], 4, groups[j]);
    }
    return table;
}

// The keys token (req, pos) must see at `layer`: its SWA window, then all closed
// 128-groups (HCA) or its top-k groups (CSA).
std::vector<std::vector<double>> visible_keys(int req, int layer, int pos) {
    std::vector<std::vector<double>> keys;
    auto add = [&keys](const Bf16Row& row) { keys.push_back(to_double(row.data(), row.size())); };
    for (int p = std::max(0, pos - static_cast<int>(kWindow) + 1); p <= pos; ++p)
        add(latent_row(req, layer, p));
    if (kRatios[layer] == 128) {
        for (int g = 0; g < (pos + 1) / 128; ++g) add(compressed_row(req, layer, g));
    } else if (kRatios[layer] == 4) {
        for (int g : csa_topk_groups(req, layer, pos)) add(compressed_row(req, layer, g));
    }
    return keys;
}

// ---------------------------------------------------------------------------
// The serving loop

unikv_backend backend_from_env() {
    const char* name = std::getenv("UNIKV_TEST_BACKEND");
    if (name == nullptr || std::strcmp(name, "cpu") == 0) return UNIKV_BACKEND_CPU;
    if (std::strcmp(name, "cuda") == 0) return UNIKV_BACKEND_CUDA;
    if (std::strcmp(name, "auto") == 0) return UNIKV_BACKEND_AUTO;
    fail("UNIKV_TEST_BACKEND must be cpu, cuda or auto");
}

unikv::attention_plan_params plan_params(int max_tokens) {
    return unikv::plan_params(static_cast<uint32_t>(max_tokens), kHeads);
}

size_t bf16_rows(int rows) { return static_cast<size_t>(rows) * kHeadDim * sizeof(uint16_t); }
size_t i32s(int n) { return static_cast<size_t>(n) * sizeof(int32_t); }

class Scenario {
public:
    Scenario()
        : ctx_(unikv::context::create(backend_from_env())),
          pool_(create_pool()),
          decode_plan_(unikv::decode_plan::create(ctx_, plan_params(kDecodeMaxTokens))),
          prefill_plan_(unikv::prefill_plan::create(ctx_, plan_params(kPrefillMaxTokens))) {
        check_pool_geometry();
        acquire_slots();
        assign_pages();
    }

    // Serves every request to completion, then prints the summary.
    void run() {
        while (!finished()) {
            if (Batch b = prefill_batch(); b.size() > 0) run_prefill(b);
            if (Batch b = decode_batch(); b.size() > 0) run_decode(b);
        }
        release_slots();
        std::printf(
            "test_serving: PASS: %d prefill forwards, %d decode forwards, %ld (token, head) rows "
            "checked, %ld padding rows zero, max relative L2 error %.3e (tolerance %.0e)\n",
            prefill_forwards_, decode_forwards_, rows_checked_, padding_checked_, max_error_, kTolerance);
    }

private:
    // Declared first, destroyed last: the buffers below are freed through the context.
    unikv::context ctx_;
    unikv::pool pool_;
    unikv::decode_plan decode_plan_;
    unikv::prefill_plan prefill_plan_;
    std::vector<Request> reqs_;

    // Plan workspaces (0 bytes on the CPU backend), then forward inputs and
    // outputs, all in the context's memory.
    DeviceBuffer decode_ws_{ctx_, decode_plan_.workspace_size()};
    DeviceBuffer prefill_ws_{ctx_, prefill_plan_.workspace_size()};
    DeviceBuffer kv_{ctx_, bf16_rows(kMaxTokens)};
    DeviceBuffer q_{ctx_, bf16_rows(kMaxTokens * kHeads)};
    DeviceBuffer out_{ctx_, bf16_rows(kMaxTokens * kHeads)};
    DeviceBuffer compressed_{ctx_, bf16_rows(kMaxTokens)};
    DeviceBuffer loc_{ctx_, i32s(kMaxTokens)};
    DeviceBuffer sink_{ctx_, kHeads * sizeof(float)};
    DeviceBuffer batch_id_{ctx_, i32s(kMaxTokens)};
    DeviceBuffer positions_{ctx_, i32s(kMaxTokens)};
    DeviceBuffer req_slots_{ctx_, i32s(kRequests)};
    DeviceBuffer chunk_start_{ctx_, i32s(kRequests)};
    DeviceBuffer extend_start_{ctx_, i32s(kRequests)};
    DeviceBuffer final_pos_{ctx_, i32s(kRequests)};
    DeviceBuffer c128_table_{ctx_, i32s(kMaxTokens * kC128Width)};
    DeviceBuffer layer_table_{ctx_, i32s(kMaxTokens * kMaxTableWidth)};
    // Decode streams (built once per forward).
    DeviceBuffer swa_indptr_{ctx_, i32s(kDecodeMaxTokens + 1)};
    DeviceBuffer swa_indices_{ctx_, i32s(kDecodeMaxTokens * kWindow)};
    DeviceBuffer hca_indptr_{ctx_, i32s(kDecodeMaxTokens + 1)};
    DeviceBuffer hca_indices_{ctx_, i32s(kDecodeMaxTokens * (kWindow + kC128Width))};
    DeviceBuffer csa_indptr_{ctx_, i32s(kDecodeMaxTokens + 1)};
    DeviceBuffer csa_indices_{ctx_, i32s(kDecodeMaxTokens * (kWindow + kCsaTopk))};
    // Prefill streams (built per layer).
    DeviceBuffer prefix_indptr_{ctx_, i32s(kMaxTokens + 1)};
    DeviceBuffer prefix_indices_{ctx_, i32s(kMaxTokens * (kWindow + kMaxTableWidth))};
    DeviceBuffer extend_indptr_{ctx_, i32s(kMaxTokens + 1)};
    DeviceBuffer extend_indices_{ctx_, i32s(kMaxTokens * kWindow)};

    int prefill_forwards_ = 0;
    int decode_forwards_ = 0;
    long rows_checked_ = 0;
    long padding_checked_ = 0;
    double max_error_ = 0.0;

    // --- setup --------------------------------------------------------------

    unikv::pool create_pool() const {
        unikv::pool_params p = unikv::make_struct<unikv::pool_params>();
        p.compress_ratios = kRatios;
        p.num_layers = kLayers;
        p.max_requests = kMaxRequests;
        p.window = kWindow;
        p.spec_extra = kSpecExtra;
        p.c128_blocks = kC128Blocks;
        p.kv_dtype = UNIKV_DTYPE_BF16;
        return unikv::pool::create(ctx_, p);
    }

    unikv_pool_info pool_info() const { return pool_.get_info(); }

    void expect_slots_in_use(uint32_t want) const {
        const uint32_t got = pool_info().slots_in_use;
        if (got != want)
            fail("slots_in_use is " + std::to_string(got) + ", expected " + std::to_string(want));
    }

    // Rows per layer follow the header's formula; the test's row arithmetic
    // (slot * ring + pos % ring, swa_rows + page index) relies on it.
    void check_pool_geometry() const {
        const unikv_pool_info info = pool_info();
        const uint64_t ring = kWindow + kSpecExtra;
        if (info.ring != ring || info.swa_rows != (kMaxRequests + 1) * ring) fail("unexpected SWA geometry");
        for (int layer = 0; layer < kLayers; ++layer) {
            const unikv_pool_layer_info li = pool_.get_layer(layer);
            const uint32_t ratio = kRatios[layer];
            const uint64_t compressed = ratio == 0 ? 0 : kC128Blocks * (ratio == 4 ? 32 : 1) + 256 / ratio;
            if (li.compress_ratio != ratio || li.compressed_rows != compressed ||
                li.rows != info.swa_rows + compressed)
                fail("unexpected geometry of layer " + std::to_string(layer));
        }
    }

    // A request cancelled before its first forward takes slot 1 and gives it
    // back, so the served requests run in slots 2..4, the last one included.
    void acquire_slots() {
        expect_slots_in_use(0);
        const uint32_t cancelled = pool_.acquire_slot();
        for (int len : kPromptLens) {
            Request r;
            r.prompt_len = len;
            r.slot = pool_.acquire_slot();
            if (r.slot < 1 || r.slot > kMaxRequests) fail("slot " + std::to_string(r.slot) + " out of 1..R");
            reqs_.push_back(r);
        }
        expect_slots_in_use(kRequests + 1);
        pool_.release_slot(cancelled);
        expect_slots_in_use(kRequests);
    }

    void release_slots() {
        for (const Request& r : reqs_)
            pool_.release_slot(r.slot);
        expect_slots_in_use(0);
    }

    void assign_pages() {
        size_t next = 0;
        for (Request& r : reqs_) {
            const int tokens = r.prompt_len + kDecodeSteps;
            for (int p = 0; p < (tokens + kPageTokens - 1) / kPageTokens; ++p)
                r.pages.push_back(kPageIds[next++]);
        }
    }

    // --- scheduling ---------------------------------------------------------

    bool finished() const {
        return std::all_of(reqs_.begin(), reqs_.end(),
                           [](const Request& r) { return r.decoded == kDecodeSteps; });
    }

    // The next chunk of every request still in prefill.
    Batch prefill_batch() const {
        Batch b;
        for (int i = 0; i < kRequests; ++i) {
            const Request& r = reqs_[i];
            if (r.processed < r.prompt_len)
                b.add(i, r.processed, std::min(kChunk, r.prompt_len - r.processed));
        }
        return b;
    }

    // One token of every request done with prefill, padded to the graph size.
    Batch decode_batch() const {
        Batch b;
        for (int i = 0; i < kRequests; ++i) {
            const Request& r = reqs_[i];
            if (r.processed >= r.prompt_len && r.decoded < kDecodeSteps) b.add(i, r.processed, 1);
        }
        if (b.size() > 0) b.pad_to(kDecodeMaxTokens);
        return b;
    }

    void upload_batch(const Batch& b) {
        std::vector<int32_t> slots;
        for (int req : b.requests) slots.push_back(static_cast<int32_t>(reqs_[req].slot));
        batch_id_.upload(b.batch_id);
        positions_.upload(b.positions);
        req_slots_.upload(slots);
    }

    // --- prefill: per layer, store closed groups -> build streams -> attention
    //     over pool prefix + chunk rows -> store the chunk's final window ------

    void run_prefill(const Batch& b) {
        upload_batch(b);
        std::vector<int32_t> chunk_start, final_pos;
        for (size_t i = 0; i < b.requests.size(); ++i) {
            chunk_start.push_back(b.positions[b.first_row[i]]);
            final_pos.push_back(chunk_start.back() + b.count[i] - 1);
        }
        chunk_start_.upload(chunk_start);
        extend_start_.upload(b.first_row);
        final_pos_.upload(final_pos);
        for (int layer = 0; layer < kLayers; ++layer) run_prefill_layer(b, layer);
        for (size_t i = 0; i < b.requests.size(); ++i) reqs_[b.requests[i]].processed += b.count[i];
        ++prefill_forwards_;
    }

    void run_prefill_layer(const Batch& b, int layer) {
        const LayerInputs in = upload_layer(b, layer);
        const uint32_t ratio = kRatios[layer];
        const int64_t T = b.size();
        // Ratio 0 reads no table; the prefix stream then holds at most the window.
        const int64_t width = ratio == 128 ? kC128Width : ratio == 4 ? kCsaTopk : 0;

        auto s = unikv::make_struct<unikv::prefill_streams_args>();
        s.batch_id = batch_id_.tensor(UNIKV_DTYPE_I32, {T});
        s.req_slots = req_slots_.tensor(UNIKV_DTYPE_I32, {int64_t(b.requests.size())});
        s.positions = positions_.tensor(UNIKV_DTYPE_I32, {T});
        s.chunk_start = chunk_start_.tensor(UNIKV_DTYPE_I32, {int64_t(b.requests.size())});
        s.extend_start = extend_start_.tensor(UNIKV_DTYPE_I32, {int64_t(b.requests.size())});
        if (ratio != 0) {
            layer_table_.upload(ratio == 128 ? c128_table(b, reqs_) : csa_table(b, reqs_, layer));
            s.page_indices = layer_table_.tensor(UNIKV_DTYPE_I32, {T, width});
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
        a.layer = static_cast<uint32_t>(layer);
        a.num_tokens = static_cast<uint32_t>(T);
        a.softmax_scale = kScale;
        out_.fill(0xFF);  // bf16 NaN: rows the library does not write fail the check
        prefill_plan_.sparse_prefill(pool_, a, prefill_ws_);

        store_swa(b, layer, /*final_window_only=*/true);
        verify(b, layer, in);
    }

    // --- decode: streams once per forward; per layer store closed groups and
    //     the step's rows -> CSA tail -> attention ------------------------------

    void run_decode(const Batch& b) {
        upload_batch(b);
        c128_table_.upload(c128_table(b, reqs_));
        const int64_t T = b.size();
        auto s = unikv::make_struct<unikv::decode_streams_args>();
        s.batch_id = batch_id_.tensor(UNIKV_DTYPE_I32, {T});
        s.req_slots = req_slots_.tensor(UNIKV_DTYPE_I32, {int64_t(b.requests.size())});
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

        for (int layer = 0; layer < kLayers; ++layer) run_decode_layer(b, layer, s);
        for (int req : b.requests) {
            ++reqs_[req].processed;
            ++reqs_[req].decoded;
        }
        ++decode_forwards_;
    }

    void run_decode_layer(const Batch& b, int layer, const unikv_decode_streams_args& s) {
        const LayerInputs in = upload_layer(b, layer);
        const uint32_t ratio = kRatios[layer];
        const int64_t T = b.size();
        store_swa(b, layer, /*final_window_only=*/false);
        if (ratio == 4) {
            layer_table_.upload(csa_table(b, reqs_, layer));
            auto c = unikv::make_struct<unikv::csa_tail_args>();
            c.batch_id = s.batch_id;
            c.positions = s.positions;
            c.csa_page_indices = layer_table_.tensor(UNIKV_DTYPE_I32, {T, kCsaTopk});
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
        a.layer = static_cast<uint32_t>(layer);
        a.num_tokens = static_cast<uint32_t>(T);
        a.softmax_scale = kScale;
        out_.fill(0xFF);
        decode_plan_.sparse_decode(pool_, a, decode_ws_);
        verify(b, layer, in);
    }

    // --- shared steps -------------------------------------------------------

    // Uploads the layer's rows, queries and sinks, and stores the compressed rows
    // of groups closed by this forward's tokens: they must be in the pool before
    // the attention that reads them.
    LayerInputs upload_layer(const Batch& b, int layer) {
        LayerInputs in = layer_inputs(b, reqs_, layer);
        kv_.upload(in.kv);
        q_.upload(in.q);
        sink_.upload(in.sink);
        if (kRatios[layer] != 0) {
            compressed_.upload(in.compressed);
            loc_.upload(in.loc);
            auto c = unikv::make_struct<unikv::store_compressed_args>();
            c.kv = compressed_.tensor(UNIKV_DTYPE_BF16, {b.size(), kHeadDim});
            c.loc = loc_.tensor(UNIKV_DTYPE_I32, {b.size()});
            c.layer = static_cast<uint32_t>(layer);
            c.num_rows = static_cast<uint32_t>(b.size());
            pool_.store_compressed(c);
        }
        return in;
    }

    // Writes the forward's latent rows into the rings. Prefill passes each
    // request's last chunk position as final_pos, so a chunk longer than the ring
    // writes only its final window.
    void store_swa(const Batch& b, int layer, bool final_window_only) {
        auto a = unikv::make_struct<unikv::store_swa_args>();
        a.kv = kv_.tensor(UNIKV_DTYPE_BF16, {b.size(), kHeadDim});
        a.batch_id = batch_id_.tensor(UNIKV_DTYPE_I32, {b.size()});
        a.req_slots = req_slots_.tensor(UNIKV_DTYPE_I32, {int64_t(b.requests.size())});
        a.positions = positions_.tensor(UNIKV_DTYPE_I32, {b.size()});
        if (final_window_only) a.final_pos = final_pos_.tensor(UNIKV_DTYPE_I32, {int64_t(b.requests.size())});
        a.layer = static_cast<uint32_t>(layer);
        a.num_tokens = static_cast<uint32_t>(b.size());
        pool_.store_swa(a);
    }

    // Compares every (token, head) output row with the float64 reference over the
    // token's key set; padding tokens must give exact zeros.
    void verify(const Batch& b, int layer, const LayerInputs& in) {
        const std::vector<uint16_t> out =
            out_.download<uint16_t>(static_cast<size_t>(b.size()) * kHeads * kHeadDim);
        for (int t = 0; t < b.size(); ++t) {
            const Token tok = b.tokens[t];
            const std::vector<std::vector<double>> keys = tok.request < 0
                                                              ? std::vector<std::vector<double>>{}
                                                              : visible_keys(tok.request, layer, tok.pos);
            for (int h = 0; h < kHeads; ++h) {
                const size_t row = (static_cast<size_t>(t) * kHeads + h) * kHeadDim;
                if (tok.request < 0) {
                    expect_zero_row(&out[row], layer, t);
                    continue;
                }
                const std::vector<double> q = to_double(&in.q[row], kHeadDim);
                const double err =
                    relative_l2_error(&out[row], reference_attention(q, keys, in.sink[h], kScale));
                if (!(err < kTolerance)) {
                    fail("layer " + std::to_string(layer) + " request " + std::to_string(tok.request) +
                         " position " + std::to_string(tok.pos) + " head " + std::to_string(h) + " (" +
                         std::to_string(keys.size()) + " keys): relative L2 error " + std::to_string(err));
                }
                max_error_ = std::max(max_error_, err);
                ++rows_checked_;
            }
        }
    }

    void expect_zero_row(const uint16_t* row, int layer, int token) {
        for (int d = 0; d < kHeadDim; ++d) {
            if (bf16_to_float(row[d]) != 0.0f)
                fail("layer " + std::to_string(layer) + " padding token " + std::to_string(token) +
                     " is not zero");
        }
        ++padding_checked_;
    }
};

}  // namespace

int main() {
    std::printf("unikv %s (header %s)\n", unikv_version_string(), UNIKV_VERSION_STRING);
    if (unikv_version() != UNIKV_VERSION) fail("header and library versions differ");
    return run_test([] { Scenario().run(); });
}
