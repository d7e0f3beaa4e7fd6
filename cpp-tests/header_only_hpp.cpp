// unikv.hpp on its own, built as C++17 and as C++20 (-pedantic -Werror, see
// CMakeLists.txt): the header compiles alone, wraps every C entry point
// (hpp_coverage checks the names), and its pieces behave: handle ownership,
// exceptions and the non-throwing forms, descriptor builders, make_struct.
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

}  // namespace

// Exit code: 0 = pass.
int main() {
    expect(unikv::version_matches(), "header and library versions agree");
    try {
        descriptors();
        handles_and_errors();
    } catch (const unikv::error& e) {
        std::fprintf(stderr, "FAIL: unexpected %s\n", e.what());
        return 1;
    }
    if (failures == 0) std::printf("unikv.hpp (C++%ld): PASS\n", __cplusplus / 100 % 100);
    return failures == 0 ? 0 : 1;
}
