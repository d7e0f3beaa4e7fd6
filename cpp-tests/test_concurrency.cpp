// Eight threads share one context, one pool and one decode plan (issue 21):
// they acquire and release request slots as fast as they can and run decode
// in between, each with its own output and workspace. Checks: no slot is ever
// held by two threads, none is lost (afterwards every slot can be acquired
// once more, in order), and every decode result is bit-identical to the one
// computed before the threads started. UNIKV_TEST_BACKEND picks the backend
// as in test_serving.cpp (CPU by default).
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "serving_common.hpp"

using namespace serving;

namespace {

constexpr int kThreads = 8;
constexpr uint32_t kSlots = 24;
constexpr int kTokens = 4;
constexpr int kHeads = 16;
constexpr int kRounds = 2000;
constexpr int kDecodeEvery = 10;

unikv_backend backend_from_env() {
    const char* name = std::getenv("UNIKV_TEST_BACKEND");
    if (name == nullptr || std::strcmp(name, "cpu") == 0) return UNIKV_BACKEND_CPU;
    if (std::strcmp(name, "cuda") == 0) return UNIKV_BACKEND_CUDA;
    if (std::strcmp(name, "auto") == 0) return UNIKV_BACKEND_AUTO;
    fail("UNIKV_TEST_BACKEND must be cpu, cuda or auto");
}

// The fixed inputs of one decode call and a way to run it into fresh buffers.
struct DecodeCase {
    const unikv::context& ctx;
    const unikv::pool& pool;
    const unikv::decode_plan& plan;
    DeviceBuffer q, indices, indptr;
    size_t workspace_bytes = 0;

    DecodeCase(const unikv::context& c, const unikv::pool& p, const unikv::decode_plan& pl, uint64_t rows)
        : ctx(c),
          pool(p),
          plan(pl),
          q(c, size_t{kTokens} * kHeads * kHeadDim * 2),
          indices(c, size_t{kTokens} * 24 * 4),
          indptr(c, (kTokens + 1) * 4) {
        std::vector<uint16_t> qv;
        for (int r = 0; r < kTokens * kHeads; ++r) {
            const Bf16Row row = random_row({7, static_cast<uint64_t>(r)}, 1.0);
            qv.insert(qv.end(), row.begin(), row.end());
        }
        q.upload(qv);
        // Token t attends to 6 * (t + 1) rows spread over the pool.
        std::vector<int32_t> idx, ptr{0};
        Rng rng({11});
        for (int t = 0; t < kTokens; ++t) {
            for (int j = 0; j < 6 * (t + 1); ++j) idx.push_back(rng.below(static_cast<int>(rows)));
            ptr.push_back(static_cast<int32_t>(idx.size()));
        }
        indices.upload(idx);
        indptr.upload(ptr);
        workspace_bytes = plan.workspace_size();
    }

    // Runs decode on the default stream into a fresh output; returns its bits.
    std::vector<uint16_t> run() const {
        DeviceBuffer out(ctx, size_t{kTokens} * kHeads * kHeadDim * 2);
        DeviceBuffer workspace(ctx, workspace_bytes);
        out.fill(0xA5);
        auto a = unikv::make_struct<unikv::decode_args>();
        a.q = q.tensor(UNIKV_DTYPE_BF16, {kTokens, kHeads, kHeadDim});
        a.indices = indices.tensor(UNIKV_DTYPE_I32, {static_cast<int64_t>(indices.size() / 4)});
        a.indptr = indptr.tensor(UNIKV_DTYPE_I32, {kTokens + 1});
        a.out = out.tensor(UNIKV_DTYPE_BF16, {kTokens, kHeads, kHeadDim});
        a.layer = 0;
        a.num_tokens = kTokens;
        a.softmax_scale = 0.044194173f;
        plan.sparse_decode(pool, a, workspace);
        return out.download<uint16_t>(size_t{kTokens} * kHeads * kHeadDim);
    }
};

void run() {
    const unikv::context ctx = unikv::context::create(backend_from_env(), /*cpu_threads=*/2);

    const uint32_t ratios[] = {0};
    auto p = unikv::make_struct<unikv::pool_params>();
    p.compress_ratios = ratios;
    p.num_layers = 1;
    p.max_requests = kSlots;
    p.window = 8;
    p.kv_dtype = UNIKV_DTYPE_BF16;
    const unikv::pool pool = unikv::pool::create(ctx, p);

    const unikv_pool_layer_info layer = pool.get_layer(0);
    std::vector<uint16_t> rows;
    for (uint64_t r = 0; r < layer.rows; ++r) {
        const Bf16Row row = random_row({3, r}, 1.0);
        rows.insert(rows.end(), row.begin(), row.end());
    }
    ctx.memory_copy(layer.data, rows.data(), rows.size() * 2, UNIKV_COPY_HOST_TO_DEVICE);

    const unikv::decode_plan plan = unikv::decode_plan::create(ctx, unikv::plan_params(kTokens, kHeads));

    const DecodeCase decode(ctx, pool, plan, layer.rows);
    const std::vector<uint16_t> expected = decode.run();

    // owner[s] is the thread (1-based) holding slot s, 0 when free.
    std::vector<std::atomic<int>> owner(kSlots + 1);
    std::atomic<int> failures{0};
    std::vector<std::string> messages(kThreads);
    std::vector<std::thread> threads;
    for (int id = 1; id <= kThreads; ++id) {
        threads.emplace_back([&, id] {
            std::vector<uint32_t> held;
            Rng rng({static_cast<uint64_t>(id)});
            for (int round = 0; round < kRounds && failures.load() == 0; ++round) {
                // Non-throwing: a full pool (CAPACITY_EXCEEDED) is expected here.
                const unikv::result<uint32_t> acquired = pool.try_acquire_slot();
                if (acquired.ok()) {
                    const uint32_t slot = acquired.value();
                    int free_mark = 0;
                    if (slot == 0 || slot > kSlots || !owner[slot].compare_exchange_strong(free_mark, id)) {
                        messages[id - 1] = "slot " + std::to_string(slot) + " handed out while held by thread " +
                                           std::to_string(free_mark);
                        failures.fetch_add(1);
                        return;
                    }
                    held.push_back(slot);
                } else if (acquired.code() != UNIKV_CAPACITY_EXCEEDED) {
                    messages[id - 1] = "acquire: " + acquired.message();
                    failures.fetch_add(1);
                    return;
                }
                // Release one held slot at random about half the time.
                if (!held.empty() && rng.below(2) == 0) {
                    const size_t k = static_cast<size_t>(rng.below(static_cast<int>(held.size())));
                    const uint32_t victim = held[k];
                    held.erase(held.begin() + static_cast<std::ptrdiff_t>(k));
                    owner[victim].store(0);
                    if (const unikv::status s = unikv::call(unikv_pool_release_slot, pool.get(), victim); !s) {
                        messages[id - 1] = "release: " + s.message();
                        failures.fetch_add(1);
                        return;
                    }
                }
                if (round % kDecodeEvery == id % kDecodeEvery && decode.run() != expected) {
                    messages[id - 1] = "decode result differs from the single-threaded one";
                    failures.fetch_add(1);
                    return;
                }
            }
            for (uint32_t slot : held) {
                owner[slot].store(0);
                if (const unikv::status s = unikv::call(unikv_pool_release_slot, pool.get(), slot); !s) {
                    messages[id - 1] = "final release: " + s.message();
                    failures.fetch_add(1);
                }
            }
        });
    }
    for (std::thread& t : threads) t.join();
    for (const std::string& m : messages) {
        if (!m.empty()) fail(m);
    }

    // Nothing lost: all slots are free again and come out lowest first.
    const unikv_pool_info info = pool.get_info();
    if (info.slots_in_use != 0) fail(std::to_string(info.slots_in_use) + " slots still in use");
    for (uint32_t want = 1; want <= kSlots; ++want) {
        const uint32_t slot = pool.acquire_slot();
        if (slot != want) fail("slot " + std::to_string(slot) + " where " + std::to_string(want) + " was due");
    }
    if (pool.try_acquire_slot().code() != UNIKV_CAPACITY_EXCEEDED) fail("a slot past max_requests");
    std::printf("concurrency: %d threads x %d rounds, slots and decode results consistent\n", kThreads, kRounds);
}

}  // namespace

int main() { return run_test(run); }
