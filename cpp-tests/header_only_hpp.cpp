// unikv.hpp on its own, built as C++17 and as C++20 (-pedantic -Werror, see
// CMakeLists.txt): the header compiles alone, wraps every C entry point
// (hpp_coverage checks the names), and its pieces behave: handle ownership,
// exceptions and the non-throwing forms, descriptor builders, make_struct,
// and the queries: capabilities, pool sizes from the parameters, plan info and
// description, the log callback, decode streams without HCA/CSA outputs.
// Includes nothing but the header, plus <cstdio> for the report.
#include <unikv.hpp>

#include <cstdio>

namespace {

// Handles are move-only with unique ownership.
static_assert(!std::is_copy_constructible<unikv::context>::value, "context is move-only");
static_assert(!std::is_copy_assignable<unikv::pool>::value, "pool is move-only");
static_assert(std::is_nothrow_move_constructible<unikv::decode_plan>::value, "plans move without throwing");
static_assert(std::is_nothrow_move_assignable<unikv::prefill_plan>::value, "plans move without throwing");
static_assert(std::is_nothrow_destructible<unikv::buffer>::value, "buffers free without throwing");
static_assert(!std::is_copy_constructible<unikv::buffer>::value, "buffer is move-only");
// The calls that cannot fail are noexcept.
static_assert(noexcept(unikv::status_string(0)), "status_string is noexcept");
static_assert(noexcept(unikv::last_error_message()), "last_error_message is noexcept");
static_assert(noexcept(unikv::version()), "version is noexcept");
static_assert(noexcept(unikv::version_string()), "version_string is noexcept");
static_assert(noexcept(std::declval<unikv::pool&>().reset()), "destroying a handle is noexcept");
static_assert(noexcept(std::declval<unikv::context&>().get()), "get is noexcept");
static_assert(noexcept(unikv::make_struct<unikv::decode_args>()), "make_struct is noexcept");
// make_struct fills struct_size.
static_assert(unikv::make_struct<unikv::decode_args>().struct_size == sizeof(unikv_decode_args),
              "make_struct sets struct_size");
static_assert(unikv::make_struct<unikv::rope_params>().base == 0.0, "make_struct zeroes the rest");
// Typed descriptors map element types to dtypes.
static_assert(unikv::dtype_of<unikv::bf16>::value == UNIKV_DTYPE_BF16, "bf16");
static_assert(unikv::dtype_of<const float>::value == UNIKV_DTYPE_F32, "f32");
static_assert(unikv::dtype_of<std::int64_t>::value == UNIKV_DTYPE_I64, "i64");
static_assert(unikv::dtype_size(UNIKV_DTYPE_FP8_E4M3FNUZ) == 1 && unikv::dtype_size(99) == 0, "dtype_size");
// The queries return their structs, struct_size set; the log guard stays put.
static_assert(std::is_same<decltype(unikv::get_capabilities()), unikv_capabilities>::value, "capabilities");
static_assert(std::is_same<decltype(std::declval<const unikv::decode_plan&>().get_info()), unikv::plan_info>::value,
              "plan info");
static_assert(std::is_same<decltype(std::declval<const unikv::prefill_plan&>().describe()), std::string>::value,
              "plan description");
static_assert(!std::is_copy_constructible<unikv::scoped_log_callback>::value &&
                  !std::is_move_constructible<unikv::scoped_log_callback>::value,
              "the library holds the log guard's address");

int failures = 0;

void expect(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "FAIL: %s\n", what);
        ++failures;
    }
}

void descriptors() {
    float host[2 * 3 * 4] = {};
    const unikv_tensor t = unikv::make_tensor(host, {2, 3, 4});
    expect(t.data == host && t.dtype == UNIKV_DTYPE_F32 && t.ndim == 3, "typed descriptor");
    expect(t.strides[0] == 12 && t.strides[1] == 4 && t.strides[2] == 1, "row-major strides");
    expect(unikv::tensor_extent(t) == 24, "extent of a contiguous tensor");

    const std::uint16_t bits[8] = {};
    const unikv_tensor s = unikv::make_tensor(bits, UNIKV_DTYPE_BF16, {2, 2}, {4, 1});
    expect(s.dtype == UNIKV_DTYPE_BF16 && s.strides[0] == 4 && s.shape[1] == 2, "strided descriptor");
    expect(unikv::tensor_extent(s) == 6, "extent of a padded tensor");
    expect(unikv::no_tensor().data == nullptr && unikv::tensor_extent(unikv::no_tensor()) == 0, "absent tensor");

    bool threw = false;
    try {
        static_cast<void>(unikv::make_tensor(host, {1, 1, 1, 1, 1}));
    } catch (const unikv::error& e) {
        threw = e.code() == UNIKV_BAD_SHAPE;
    }
    expect(threw, "rank 5 throws BAD_SHAPE");
    threw = false;
    try {
        static_cast<void>(unikv::make_tensor(host, {2, 3}, {3}));
    } catch (const unikv::error& e) {
        threw = e.code() == UNIKV_BAD_STRIDE;
    }
    expect(threw, "stride count mismatch throws BAD_STRIDE");

    expect(unikv::bf16::from_float(1.0f).bits == 0x3F80, "bf16 of 1");
    expect(unikv::bf16::from_float(1.00390625f).bits == 0x3F80, "bf16 ties to even");
    expect(unikv::bf16{0xC040}.to_float() == -3.0f, "bf16 to float");
}

void handles_and_errors() {
    unikv::context ctx = unikv::context::create(UNIKV_BACKEND_CPU, 1);
    expect(static_cast<bool>(ctx), "context created");
    const unikv_context_info info = ctx.get_info();
    expect(info.backend == UNIKV_BACKEND_CPU && info.cpu_threads == 1, "context info");

    // Moves transfer ownership; the moved-from handle is empty.
    unikv::context moved = std::move(ctx);
    expect(!ctx && moved, "move transfers the context");  // NOLINT(bugprone-use-after-move)

    // An error carries the status and the library's message.
    auto bad = unikv::make_struct<unikv::pool_params>();  // num_layers 0
    bool threw = false;
    try {
        static_cast<void>(unikv::pool::create(moved, bad));
    } catch (const unikv::error& e) {
        threw = e.code() != UNIKV_OK && !e.message().empty() && e.call() == "unikv_pool_create";
        expect(std::string(e.what()).find("unikv_pool_create: ") == 0, "what() names the call");
    }
    expect(threw, "pool_create with bad params throws unikv::error");

    // The non-throwing forms.
    const unikv::result<unikv::pool> r = unikv::pool::try_create(moved, bad);
    expect(!r && r.code() != UNIKV_OK && !r.message().empty(), "try_create returns the failure");
    const unikv::status s = unikv::call(unikv_memory_free, moved.get(), reinterpret_cast<void*>(16));
    expect(s == UNIKV_INVALID_ARGUMENT && !s.message().empty(), "call() returns status and message");
    expect(unikv::call(unikv_stream_synchronize, moved.get(), nullptr).ok(), "call() success");

    // A pool with one slot: acquire, then the try_ form reports a full pool.
    const std::uint32_t ratios[] = {0};
    auto params = unikv::make_struct<unikv::pool_params>();
    params.compress_ratios = ratios;
    params.num_layers = 1;
    params.max_requests = 1;
    params.window = 4;
    params.kv_dtype = UNIKV_DTYPE_BF16;
    unikv::pool pool = unikv::pool::create(moved, params);
    const std::uint32_t slot = pool.acquire_slot();
    expect(slot == 1, "first slot is 1");
    const unikv::result<std::uint32_t> full = pool.try_acquire_slot();
    expect(full.code() == UNIKV_CAPACITY_EXCEEDED, "try_acquire_slot on a full pool");
    pool.release_slot(slot);
    expect(pool.get_info().slots_in_use == 0, "slot released");
    expect(pool.get_layer(0).rows == 2 * 4, "layer rows");

    // Buffers round-trip data and reject out-of-range copies.
    unikv::buffer buf(moved, 16);
    const std::int32_t in[4] = {1, 2, 3, 4};
    std::int32_t out[4] = {};
    buf.upload(in, sizeof in);
    buf.download(out, sizeof out);
    moved.stream_synchronize();
    expect(out[3] == 4, "buffer round trip");
    threw = false;
    try {
        buf.upload(in, sizeof in, nullptr, 4);
    } catch (const unikv::error& e) {
        threw = e.code() == UNIKV_CAPACITY_EXCEEDED;
    }
    expect(threw, "upload past the end throws");
    unikv::buffer other = std::move(buf);
    expect(buf.data() == nullptr && other.size() == 16, "buffer moves");  // NOLINT(bugprone-use-after-move)

    const unikv::decode_plan plan = unikv::decode_plan::create(moved, unikv::plan_params(4, 8));
    expect(plan.workspace_size() == 0, "CPU plans need no workspace");
    const unikv::result<unikv::prefill_plan> pp = unikv::prefill_plan::try_create(moved, unikv::plan_params(4, 8));
    expect(pp.ok() && pp.value().workspace_size() == 0, "try_create success");

    auto rope = unikv::make_struct<unikv::rope_params>();
    rope.base = 10000.0;
    const std::vector<float> table = unikv::rope_table(rope, 3);
    expect(table.size() == 3 * 64 && table[0] == 1.0f && table[1] == 0.0f, "rope table row 0");
}

// Sizes from the parameters alone equal a created pool's, and buffers of those
// sizes are what an adopting pool takes.
void pool_sizes(const unikv::context& ctx) {
    const std::uint32_t ratios[] = {0, 4, 128};
    for (const unikv_dtype dtype : {UNIKV_DTYPE_BF16, UNIKV_DTYPE_FP8_E4M3FN}) {
        const bool fp8 = dtype != UNIKV_DTYPE_BF16;
        auto params = unikv::make_struct<unikv::pool_params>();
        params.compress_ratios = ratios;
        params.num_layers = 3;
        params.max_requests = 2;
        params.window = 8;
        params.spec_extra = 1;
        params.c128_blocks = 3;
        params.kv_dtype = dtype;
        const unikv_pool_info want = unikv::pool_params_get_info(params);
        const unikv::pool created = unikv::pool::create(ctx, params);
        const unikv_pool_info got = created.get_info();
        expect(want.swa_rows == got.swa_rows && want.row_bytes == got.row_bytes && want.ring == got.ring,
               "pool_params_get_info: geometry of the created pool");
        expect(want.num_layers == 3 && want.kv_dtype == got.kv_dtype && want.owns_memory == 1 &&
                   want.slots_in_use == 0,
               "pool_params_get_info: layers, dtype, ownership");
        std::vector<unikv::buffer> data, rope;
        for (std::uint32_t layer = 0; layer < params.num_layers; ++layer) {
            const unikv_pool_layer_info w = unikv::pool_params_get_layer(params, layer);
            const unikv_pool_layer_info g = created.get_layer(layer);
            expect(w.rows == g.rows && w.swa_rows == g.swa_rows && w.compressed_rows == g.compressed_rows &&
                       w.compress_ratio == g.compress_ratio,
                   "pool_params_get_layer: rows of the created pool");
            expect(w.bytes == g.bytes && w.rope_bytes == g.rope_bytes, "pool_params_get_layer: buffer sizes");
            expect(w.bytes == w.rows * (fp8 ? 512u : 1024u) && w.rope_bytes == (fp8 ? w.rows * 128u : 0u),
                   "pool_params_get_layer: row formula");
            expect(w.data == nullptr && w.rope_data == nullptr, "no buffers before adoption");
            data.emplace_back(ctx, static_cast<std::size_t>(w.bytes));
            if (fp8) rope.emplace_back(ctx, static_cast<std::size_t>(w.rope_bytes));
        }
        // An adopting pool takes buffers of exactly the reported sizes.
        void* layer_buffers[3] = {};
        void* rope_buffers[3] = {};
        for (std::size_t i = 0; i < data.size(); ++i) layer_buffers[i] = data[i].data();
        for (std::size_t i = 0; i < rope.size(); ++i) rope_buffers[i] = rope[i].data();
        params.layer_buffers = layer_buffers;
        params.rope_buffers = fp8 ? rope_buffers : nullptr;
        expect(unikv::pool_params_get_layer(params, 1).data == data[1].data(), "adopted buffer reported");
        expect(unikv::pool_params_get_info(params).owns_memory == 0, "an adopting pool owns nothing");
        const unikv::pool adopting = unikv::pool::create(ctx, params);
        expect(adopting.get_layer(2).data == data[2].data(), "the adopting pool uses the buffers");
    }
    // Checked as pool::create checks them; the layer past the last is out of range.
    auto params = unikv::make_struct<unikv::pool_params>();
    params.compress_ratios = ratios;
    params.num_layers = 3;
    params.max_requests = 1;
    params.window = 4;
    params.kv_dtype = UNIKV_DTYPE_BF16;
    bool threw = false;
    try {
        static_cast<void>(unikv::pool_params_get_layer(params, 3));
    } catch (const unikv::error& e) {
        threw = e.code() == UNIKV_OUT_OF_RANGE && e.call() == "unikv_pool_params_get_layer";
    }
    expect(threw, "pool_params_get_layer past the last layer throws OUT_OF_RANGE");
    params.window = 0;
    threw = false;
    try {
        static_cast<void>(unikv::pool_params_get_info(params));
    } catch (const unikv::error& e) {
        threw = e.code() == UNIKV_INVALID_ARGUMENT && e.message().find("params.window") != std::string::npos;
    }
    expect(threw, "pool_params_get_info checks the parameters");
}

// The C-pointer form of the log callback.
void count_messages(void* user, std::uint32_t level, const char* message) {
    if (level == UNIKV_LOG_INFO && message != nullptr) ++*static_cast<int*>(user);
}

void plans_and_log(const unikv::context& ctx) {
    std::vector<std::string> infos, errors;
    {
        const unikv::scoped_log_callback log([&](std::uint32_t level, const char* message) {
            (level == UNIKV_LOG_INFO ? infos : errors).emplace_back(message);
        });
        const unikv::decode_plan plan =
            unikv::decode_plan::create(ctx, unikv::plan_params(16, 64, UNIKV_DTYPE_FP8_E4M3FN));
        const unikv::plan_info info = plan.get_info();
        expect(info.struct_size == sizeof info && info.kind == UNIKV_PLAN_DECODE &&
                   info.backend == UNIKV_BACKEND_CPU && info.kernel_family == UNIKV_KERNEL_CPU_REFERENCE,
               "decode plan info: kind, backend, kernel");
        expect(info.max_tokens == 16 && info.num_heads == 64 && info.kv_dtype == UNIKV_DTYPE_FP8_E4M3FN,
               "decode plan info: capture-time shape");
        expect(info.head_block * info.head_blocks >= info.num_heads && info.max_splits == 1 &&
                   info.cluster_merge == 0 && info.workspace_bytes == plan.workspace_size(),
               "decode plan info: launch configuration");
        // describe() is the struct in words, and the line the log received.
        const std::string line = plan.describe();
        expect(!line.empty() && line.find('\0') == std::string::npos, "describe: one C string");
        expect(line.rfind("decode plan: cpu, cpu-reference kernel", 0) == 0, "describe: kind, backend, kernel");
        const std::string blocks = std::to_string(info.head_blocks) + " block";
        const std::string heads = "of " + std::to_string(info.head_block) + " heads (" +
                                  std::to_string(info.num_heads) + " heads)";
        expect(line.find(blocks) != std::string::npos && line.find(heads) != std::string::npos,
               "describe: the head blocks of get_info");
        expect(line.find("no key splits") != std::string::npos, "describe: max_splits 1");
        expect(line.find(std::to_string(info.workspace_bytes) + " workspace bytes, max_tokens " +
                         std::to_string(info.max_tokens)) != std::string::npos,
               "describe: workspace and max_tokens of get_info");
        expect(infos.size() == 1 && infos.back() == line, "the log received the plan's description");

        const unikv::prefill_plan prefill = unikv::prefill_plan::create(ctx, unikv::plan_params(8, 16));
        const unikv::plan_info pinfo = prefill.get_info();
        expect(pinfo.kind == UNIKV_PLAN_PREFILL && pinfo.num_heads == 16 && pinfo.max_tokens == 8 &&
                   pinfo.kv_dtype == UNIKV_DTYPE_BF16,
               "prefill plan info");
        const std::string pline = prefill.describe();
        expect(pline.rfind("prefill plan: cpu", 0) == 0 && infos.size() == 2 && infos.back() == pline,
               "prefill describe() and the log agree");

        // A failing call reaches the log as an error.
        const unikv::status s = unikv::call(unikv_decode_plan_describe, plan.get(), nullptr, std::size_t{4}, nullptr);
        expect(s == UNIKV_NULL_ARGUMENT, "describe into a NULL buffer of size 4 fails");
        expect(errors.size() == 1 && errors.back().find("buf") != std::string::npos, "the log received the error");
        bool threw = false;
        try {
            static_cast<void>(unikv::decode_plan().get_info());
        } catch (const unikv::error& e) {
            threw = e.code() == UNIKV_NULL_ARGUMENT && e.call() == "unikv_decode_plan_get_info";
        }
        expect(threw && errors.size() == 2, "get_info on an empty handle throws and logs");
    }
    // The guard removed the callback.
    const std::size_t seen = infos.size();
    static_cast<void>(unikv::decode_plan::create(ctx, unikv::plan_params(4, 8)));
    expect(infos.size() == seen, "no messages after the guard is gone");

    int count = 0;
    unikv::set_log_callback(&count_messages, &count);
    static_cast<void>(unikv::prefill_plan::create(ctx, unikv::plan_params(4, 8)));
    unikv::set_log_callback(nullptr);
    static_cast<void>(unikv::prefill_plan::create(ctx, unikv::plan_params(4, 8)));
    expect(count == 1, "set_log_callback with a C function pointer");
}

// A pool without compressed layers needs only the SWA stream.
void decode_streams_without_compressed_outputs(const unikv::context& ctx) {
    const std::uint32_t dense[] = {0, 0};
    auto params = unikv::make_struct<unikv::pool_params>();
    params.compress_ratios = dense;
    params.num_layers = 2;
    params.max_requests = 2;
    params.window = 4;
    params.kv_dtype = UNIKV_DTYPE_BF16;
    const unikv::pool pool = unikv::pool::create(ctx, params);
    std::int32_t batch_id[2] = {0, 1}, slots[2] = {1, 2}, positions[2] = {2, 9};
    std::int32_t indptr[3] = {-7, -7, -7}, indices[8] = {};
    auto args = unikv::make_struct<unikv::decode_streams_args>();
    args.batch_id = unikv::make_tensor(batch_id, {2});
    args.req_slots = unikv::make_tensor(slots, {2});
    args.positions = unikv::make_tensor(positions, {2});
    args.swa_indptr = unikv::make_tensor(indptr, {3});
    args.swa_indices = unikv::make_tensor(indices, {8});
    args.hca_indptr = args.hca_indices = args.csa_indptr = args.csa_indices = unikv::no_tensor();
    args.num_tokens = 2;
    pool.build_decode_streams(args);
    // ring 4: slot 1, positions 0..2 -> rows 4..6; slot 2, positions 6..9 -> 10, 11, 8, 9
    expect(indptr[0] == 0 && indptr[1] == 3 && indptr[2] == 7, "SWA stream offsets");
    expect(indices[0] == 4 && indices[2] == 6 && indices[3] == 10 && indices[6] == 9, "SWA stream rows");

    const std::uint32_t with_csa[] = {0, 4};
    params.compress_ratios = with_csa;
    const unikv::pool csa_pool = unikv::pool::create(ctx, params);
    bool threw = false;
    try {
        csa_pool.build_decode_streams(args);
    } catch (const unikv::error& e) {
        threw = e.code() == UNIKV_NULL_ARGUMENT && e.message().find("csa_indptr") != std::string::npos;
    }
    expect(threw, "a pool with ratio-4 layers needs the CSA stream");
}

void queries() {
    const unikv_capabilities caps = unikv::get_capabilities();
    expect(caps.struct_size == sizeof caps, "capabilities struct_size");
    expect(unikv::has_backend(caps, UNIKV_BACKEND_CPU) && unikv::has_backend(caps, UNIKV_BACKEND_AUTO),
           "capabilities report the CPU backend");
    expect(unikv::has_backend(caps, UNIKV_BACKEND_GPU) ==
               (unikv::has_backend(caps, UNIKV_BACKEND_CUDA) || unikv::has_backend(caps, UNIKV_BACKEND_ROCM)),
           "GPU is listed with a GPU backend");
    expect(!unikv::has_backend(caps, static_cast<unikv_backend>(40)), "has_backend past the mask");
    expect((caps.kv_dtypes & (1u << UNIKV_DTYPE_BF16)) != 0 && caps.head_dim == 512 && caps.rope_dim == 64 &&
               caps.nope_dim == 448 && caps.max_heads >= 64,
           "capabilities: dtypes and limits");
    expect(caps.gpu_archs != nullptr, "gpu_archs is never null");
    if (caps.gpu_devices == 0) {
        // Required GPU: an error, not AUTO's CPU fallback.
        const unikv::result<unikv::context> gpu =
            unikv::context::try_create(unikv::context::options(UNIKV_BACKEND_GPU));
        expect(gpu.code() == UNIKV_BACKEND_UNAVAILABLE, "UNIKV_BACKEND_GPU without a GPU");
    }

    const unikv::context ctx = unikv::context::create(UNIKV_BACKEND_CPU, 1);
    expect(ctx.get_info().backend == UNIKV_BACKEND_CPU, "a CPU context reports the CPU backend");
    pool_sizes(ctx);
    plans_and_log(ctx);
    decode_streams_without_compressed_outputs(ctx);
}

}  // namespace

// Exit code: 0 = pass.
int main() {
    expect(unikv::version_matches(), "header and library versions agree");
    try {
        descriptors();
        handles_and_errors();
        queries();
    } catch (const unikv::error& e) {
        std::fprintf(stderr, "FAIL: unexpected %s\n", e.what());
        return 1;
    }
    if (failures == 0) std::printf("unikv.hpp (C++%ld): PASS\n", __cplusplus / 100 % 100);
    return failures == 0 ? 0 : 1;
}
