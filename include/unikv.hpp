// unikv.hpp: header-only C++17 bindings over the C API of unikv.h.
//
// What it adds to the C header, and nothing else (no state, no threads, no
// allocation except in error messages, the vector and string helpers and the
// std::function log callback):
//
// - Errors as exceptions: every fallible wrapper throws `unikv::error`, which
//   carries the status code, the C function's name and the library's
//   last-error message (read on the failing thread right after the call).
// - A non-throwing form: `unikv::call(unikv_fn, args...)` runs any C entry
//   point and returns a `unikv::status` (code + message), and the handle
//   creators and `pool::try_acquire_slot` have `try_` twins returning a
//   `unikv::result<T>`. Only std::bad_alloc (copying a message) can escape
//   them.
// - RAII handles with unique ownership (move-only): `context`, `pool`,
//   `decode_plan`, `prefill_plan`, plus `buffer` for memory from
//   `unikv_memory_alloc`. Destructors call the C *_destroy / free functions
//   and never throw. A pool or plan keeps its context alive inside the
//   library; a `buffer` does not: destroy buffers before their context
//   (declare the context first).
// - Tensor descriptors: `make_tensor(ptr, dtype, shape[, strides])`,
//   typed `make_tensor(T* ptr, shape[, strides])` (float, int32_t, int64_t,
//   uint8_t, and the storage types `bf16`, `f16`, `fp8_e4m3fn`,
//   `fp8_e4m3fnuz`), `buffer::tensor(...)` and `no_tensor()` for an absent
//   optional argument. Contiguous row-major strides are filled in when none
//   are given.
// - `make_struct<S>()`: a zeroed parameter / argument / info struct with
//   `struct_size = sizeof(S)`, and short aliases for every struct
//   (`unikv::decode_args` is `unikv_decode_args`, ...).
//
// Every C function has one wrapper, named after it without the `unikv_`
// prefix and, for the functions of one handle kind, as a member of that
// handle without the kind's prefix:
//
//   unikv_status_string / last_error_message / version / version_string /
//   rope_table / get_capabilities / set_log_callback
//                                       -> unikv::status_string(), ... (free;
//                                          also scoped_log_callback)
//   unikv_pool_params_get_info / _get_layer / _get_compressor
//                                       -> unikv::pool_params_get_info(params),
//                                          pool_params_get_layer(params, layer),
//                                          pool_params_get_compressor(params,
//                                          layer, compressor)
//   unikv_context_create / _destroy     -> context::create, ~context
//   unikv_context_get_info              -> context::get_info
//   unikv_memory_alloc/free/copy/set    -> context::memory_alloc, ... (and `buffer`)
//   unikv_stream_synchronize            -> context::stream_synchronize
//   unikv_attention_merge, unikv_store_flashmla, unikv_store_scaled_fp8,
//   unikv_store_indexer,
//   unikv_indexer_prepare_q/_k, unikv_indexer_topk(_from_logits),
//   unikv_inverse_rope, unikv_hash_topk -> context::attention_merge, ...
//   unikv_pool_create / _destroy        -> pool::create, ~pool
//   unikv_pool_get_info / get_layer / get_compressor / acquire_slot /
//   release_slot / release_slot_async   -> pool::get_info, ...
//   unikv_build_decode_streams, unikv_fill_csa_tail,
//   unikv_indexer_topk_fill_csa, unikv_build_prefill_streams, unikv_prepare_qkv,
//   unikv_prepare_qkv_indexer_q, unikv_store_swa,
//   unikv_store_compressed, unikv_compress_decode,
//   unikv_compress_prefill              -> pool::build_decode_streams, ...
//   unikv_decode_plan_create / _destroy / _workspace_size / _get_info /
//   _describe, unikv_sparse_decode      -> decode_plan::create, ~decode_plan,
//                                          workspace_size, get_info, describe
//                                          (a std::string), sparse_decode
//   unikv_prefill_plan_*, unikv_sparse_prefill -> prefill_plan::...
//
// Streams are `void*` (a cudaStream_t / hipStream_t; nullptr = the default
// stream), as in the C API. Requires C++17; compiles warning-free under
// -Wall -Wextra -pedantic from C++17 on.
#ifndef UNIKV_HPP
#define UNIKV_HPP

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "unikv.h"

#if !defined(__cplusplus) || __cplusplus < 201703L
#error "unikv.hpp requires C++17 or later (use unikv.h from C or older C++)"
#endif

namespace unikv {

// ---------------------------------------------------------------------------
// Library-wide functions (none can fail)

// A static description of a status code; never null.
inline const char* status_string(std::uint32_t code) noexcept { return unikv_status_string(code); }

// The last failing call's message on this thread ("" before any failure).
inline const char* last_error_message() noexcept { return unikv_last_error_message(); }

// The library's packed version; compare with UNIKV_VERSION.
inline std::uint32_t version() noexcept { return unikv_version(); }

// The library's version as "MAJOR.MINOR.PATCH".
inline const char* version_string() noexcept { return unikv_version_string(); }

// True when the loaded library is the version this header was written for.
inline bool version_matches() noexcept { return unikv_version() == UNIKV_VERSION; }

// ---------------------------------------------------------------------------
// Errors

// Thrown by every fallible wrapper. what() reads
// "<call>: <status description>: <library message>".
class error : public std::runtime_error {
public:
    error(unikv_status code, const std::string& call, const std::string& message)
        : std::runtime_error(call + ": " + unikv_status_string(code) + (message.empty() ? "" : ": ") + message),
          code_(code),
          call_(call),
          message_(message) {}

    // The status the C call returned (never UNIKV_OK).
    unikv_status code() const noexcept { return code_; }
    // The C function (or C++ helper) that failed.
    const std::string& call() const noexcept { return call_; }
    // The library's last-error message for the failure, naming the argument at fault.
    const std::string& message() const noexcept { return message_; }

private:
    unikv_status code_;
    std::string call_;
    std::string message_;
};

// A status code and, when it is a failure, the library's message captured
// right after the call. Success allocates nothing.
class [[nodiscard]] status {
public:
    status() noexcept : code_(UNIKV_OK), message_() {}
    explicit status(unikv_status code) : code_(code), message_() {
        if (code_ != UNIKV_OK) message_ = unikv_last_error_message();
    }
    status(unikv_status code, std::string message) : code_(code), message_(std::move(message)) {}

    unikv_status code() const noexcept { return code_; }
    bool ok() const noexcept { return code_ == UNIKV_OK; }
    explicit operator bool() const noexcept { return ok(); }
    // The library's message ("" on success).
    const std::string& message() const noexcept { return message_; }
    // The status code's static description.
    const char* description() const noexcept { return unikv_status_string(code_); }

    // Throws unikv::error naming `call` unless the status is OK.
    void throw_if_error(const char* call = "unikv") const {
        if (code_ != UNIKV_OK) throw error(code_, call, message_);
    }

private:
    unikv_status code_ = UNIKV_OK;
    std::string message_;
};

inline bool operator==(const status& s, unikv_status code) noexcept { return s.code() == code; }
inline bool operator!=(const status& s, unikv_status code) noexcept { return s.code() != code; }

// A value or a failure status, for the non-throwing creators.
template <class T>
class [[nodiscard]] result {
public:
    result(T value) : status_(), value_(std::move(value)) {}  // NOLINT: implicit on purpose
    result(status failure) : status_(std::move(failure)), value_() {}

    bool ok() const noexcept { return status_.ok(); }
    explicit operator bool() const noexcept { return ok(); }
    unikv_status code() const noexcept { return status_.code(); }
    const std::string& message() const noexcept { return status_.message(); }
    const status& get_status() const noexcept { return status_; }

    // The value; throws unikv::error when the call failed.
    T& value() & {
        status_.throw_if_error("unikv::result::value");
        return value_;
    }
    const T& value() const& {
        status_.throw_if_error("unikv::result::value");
        return value_;
    }
    T&& value() && {
        status_.throw_if_error("unikv::result::value");
        return std::move(value_);
    }

private:
    status status_;
    T value_{};
};

// Runs any C entry point without throwing:
//   unikv::status s = unikv::call(unikv_sparse_decode, plan.get(), pool.get(), &args, ws, n, stream);
template <class... Params, class... Args>
status call(unikv_status (*function)(Params...), Args&&... args) {
    return status(function(std::forward<Args>(args)...));
}

namespace detail {

inline void check(unikv_status code, const char* call) {
    if (code != UNIKV_OK) throw error(code, call, unikv_last_error_message());
}

// A snprintf-like C call `write(buf, size, &length)` read into a std::string:
// once with size 0 for the length, then into a buffer of that size.
template <class Write>
std::string read_text(Write write, const char* call) {
    std::size_t length = 0;
    check(write(nullptr, 0, &length), call);
    std::string text;
    for (;;) {
        text.assign(length + 1, '\0');
        std::size_t needed = 0;
        check(write(&text[0], text.size(), &needed), call);
        if (needed <= length) {
            text.resize(needed);
            return text;
        }
        length = needed;  // grew between the calls
    }
}

// Unique ownership of a C handle; Destroy accepts null and cannot fail.
template <class T, void (*Destroy)(T*)>
class handle {
public:
    handle() noexcept = default;
    explicit handle(T* adopt) noexcept : ptr_(adopt) {}
    handle(const handle&) = delete;
    handle& operator=(const handle&) = delete;
    handle(handle&& other) noexcept : ptr_(std::exchange(other.ptr_, nullptr)) {}
    handle& operator=(handle&& other) noexcept {
        if (this != &other) reset(std::exchange(other.ptr_, nullptr));
        return *this;
    }
    ~handle() { Destroy(ptr_); }

    // The C handle, still owned by this object (null when empty).
    T* get() const noexcept { return ptr_; }
    explicit operator bool() const noexcept { return ptr_ != nullptr; }
    // Gives up ownership: the caller must destroy the returned handle.
    T* release() noexcept { return std::exchange(ptr_, nullptr); }
    // Destroys the current handle (if any) and adopts `adopt`.
    void reset(T* adopt = nullptr) noexcept { Destroy(std::exchange(ptr_, adopt)); }

private:
    T* ptr_ = nullptr;
};

}  // namespace detail

// ---------------------------------------------------------------------------
// Structs: aliases and struct_size

using context_options = unikv_context_options;
using context_info = unikv_context_info;
using pool_params = unikv_pool_params;
using pool_info = unikv_pool_info;
using pool_layer_info = unikv_pool_layer_info;
using attention_plan_params = unikv_attention_plan_params;
using tensor = unikv_tensor;
using decode_args = unikv_decode_args;
using prefill_args = unikv_prefill_args;
using merge_args = unikv_merge_args;
using store_flashmla_args = unikv_store_flashmla_args;
using store_scaled_fp8_args = unikv_store_scaled_fp8_args;
using kv_cache = unikv_kv_cache;
using store_indexer_args = unikv_store_indexer_args;
using decode_streams_args = unikv_decode_streams_args;
using csa_tail_args = unikv_csa_tail_args;
using csa_stream = unikv_csa_stream;
using prefill_streams_args = unikv_prefill_streams_args;
using indexer_prepare_q_args = unikv_indexer_prepare_q_args;
using indexer_prepare_k_args = unikv_indexer_prepare_k_args;
using indexer_topk_args = unikv_indexer_topk_args;
using prepare_qkv_args = unikv_prepare_qkv_args;
using rope_yarn = unikv_rope_yarn;
using rope_params = unikv_rope_params;
using inverse_rope_args = unikv_inverse_rope_args;
using hash_topk_args = unikv_hash_topk_args;
using store_swa_args = unikv_store_swa_args;
using store_compressed_args = unikv_store_compressed_args;
using compress_args = unikv_compress_args;
using compressor_info = unikv_compressor_info;
using plan_info = unikv_plan_info;
// unikv_capabilities has no short alias: `unikv::capabilities()` would then
// compile to an empty struct instead of the query, get_capabilities().

// A zero-initialised S with `struct_size = sizeof(S)`: every parameter,
// argument and info struct of the C API (all start with `size_t struct_size`).
template <class S>
constexpr S make_struct() noexcept {
    static_assert(std::is_trivially_copyable<S>::value && std::is_standard_layout<S>::value,
                  "make_struct is for the C API's structs");
    static_assert(std::is_same<decltype(S::struct_size), std::size_t>::value,
                  "the struct has no leading size_t struct_size");
    S s{};
    s.struct_size = sizeof(S);
    return s;
}

// ---------------------------------------------------------------------------
// Element types and tensor descriptors

// 16-bit and 8-bit storage types for the typed helpers: bit patterns only.
struct bf16 {
    std::uint16_t bits;
    // Rounds to nearest even; NaN becomes the quiet NaN 0x7FC0.
    static bf16 from_float(float value) noexcept {
        std::uint32_t u;
        std::memcpy(&u, &value, sizeof u);
        if ((u & 0x7FFFFFFFu) > 0x7F800000u) return bf16{0x7FC0};
        u += 0x7FFFu + ((u >> 16) & 1u);
        return bf16{static_cast<std::uint16_t>(u >> 16)};
    }
    float to_float() const noexcept {
        const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
        float value;
        std::memcpy(&value, &u, sizeof value);
        return value;
    }
};
struct f16 {
    std::uint16_t bits;
};
struct fp8_e4m3fn {
    std::uint8_t bits;
};
struct fp8_e4m3fnuz {
    std::uint8_t bits;
};
static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2 && sizeof(fp8_e4m3fn) == 1 && sizeof(fp8_e4m3fnuz) == 1,
              "storage types have the element size");

// dtype_of<T>::value: the unikv_dtype of an element type.
template <class T>
struct dtype_of;
template <class T>
struct dtype_of<const T> : dtype_of<T> {};
template <>
struct dtype_of<bf16> : std::integral_constant<unikv_dtype, UNIKV_DTYPE_BF16> {};
template <>
struct dtype_of<f16> : std::integral_constant<unikv_dtype, UNIKV_DTYPE_F16> {};
template <>
struct dtype_of<float> : std::integral_constant<unikv_dtype, UNIKV_DTYPE_F32> {};
template <>
struct dtype_of<std::int32_t> : std::integral_constant<unikv_dtype, UNIKV_DTYPE_I32> {};
template <>
struct dtype_of<std::int64_t> : std::integral_constant<unikv_dtype, UNIKV_DTYPE_I64> {};
template <>
struct dtype_of<std::uint8_t> : std::integral_constant<unikv_dtype, UNIKV_DTYPE_U8> {};
template <>
struct dtype_of<fp8_e4m3fn> : std::integral_constant<unikv_dtype, UNIKV_DTYPE_FP8_E4M3FN> {};
template <>
struct dtype_of<fp8_e4m3fnuz> : std::integral_constant<unikv_dtype, UNIKV_DTYPE_FP8_E4M3FNUZ> {};

// Bytes per element of a dtype (0 for an unknown value).
constexpr std::size_t dtype_size(std::uint32_t dtype) noexcept {
    switch (dtype) {
        case UNIKV_DTYPE_BF16:
        case UNIKV_DTYPE_F16: return 2;
        case UNIKV_DTYPE_F32:
        case UNIKV_DTYPE_I32: return 4;
        case UNIKV_DTYPE_I64: return 8;
        case UNIKV_DTYPE_U8:
        case UNIKV_DTYPE_FP8_E4M3FN:
        case UNIKV_DTYPE_FP8_E4M3FNUZ: return 1;
        default: return 0;
    }
}

// Most axes a descriptor holds.
constexpr std::size_t max_rank = 4;

// An absent optional tensor argument (null data).
constexpr unikv_tensor no_tensor() noexcept { return unikv_tensor{}; }

// A descriptor of `ndim` axes; `strides` (in elements) may be null for the
// contiguous row-major layout. Throws unikv::error (UNIKV_BAD_SHAPE) for a
// rank outside 1..4. The library checks the rest when the tensor is used.
inline unikv_tensor make_tensor(const void* data, unikv_dtype dtype, const std::int64_t* shape, std::size_t ndim,
                                const std::int64_t* strides = nullptr) {
    if (ndim < 1 || ndim > max_rank)
        throw error(UNIKV_BAD_SHAPE, "unikv::make_tensor",
                    "rank " + std::to_string(ndim) + " is outside 1..4");
    unikv_tensor t{};
    t.data = const_cast<void*>(data);  // inputs are read only; the C struct has one pointer type
    t.dtype = dtype;
    t.ndim = static_cast<std::uint32_t>(ndim);
    std::int64_t stride = 1;
    for (std::size_t i = ndim; i-- > 0;) {
        t.shape[i] = shape[i];
        t.strides[i] = strides != nullptr ? strides[i] : stride;
        stride *= shape[i];
    }
    return t;
}

// Contiguous row-major: make_tensor(ptr, UNIKV_DTYPE_BF16, {tokens, heads, 512}).
inline unikv_tensor make_tensor(const void* data, unikv_dtype dtype, std::initializer_list<std::int64_t> shape) {
    return make_tensor(data, dtype, shape.begin(), shape.size());
}

// Explicit strides (in elements), one per axis; throws unikv::error
// (UNIKV_BAD_STRIDE) when the counts differ.
inline unikv_tensor make_tensor(const void* data, unikv_dtype dtype, std::initializer_list<std::int64_t> shape,
                                std::initializer_list<std::int64_t> strides) {
    if (strides.size() != shape.size())
        throw error(UNIKV_BAD_STRIDE, "unikv::make_tensor",
                    std::to_string(strides.size()) + " strides for " + std::to_string(shape.size()) + " axes");
    return make_tensor(data, dtype, shape.begin(), shape.size(), strides.begin());
}

// Typed: the dtype comes from the element type (dtype_of<T>).
template <class T, class = decltype(dtype_of<T>::value)>
unikv_tensor make_tensor(T* data, std::initializer_list<std::int64_t> shape) {
    return make_tensor(static_cast<const void*>(data), dtype_of<T>::value, shape);
}
template <class T, class = decltype(dtype_of<T>::value)>
unikv_tensor make_tensor(T* data, std::initializer_list<std::int64_t> shape,
                         std::initializer_list<std::int64_t> strides) {
    return make_tensor(static_cast<const void*>(data), dtype_of<T>::value, shape, strides);
}

// Elements a descriptor spans from its data pointer (0 for an absent one):
// 1 + sum (shape - 1) * stride, the extent a buffer must have.
inline std::int64_t tensor_extent(const unikv_tensor& t) noexcept {
    if (t.data == nullptr || t.ndim == 0) return 0;
    std::int64_t last = 0;
    for (std::uint32_t i = 0; i < t.ndim && i < max_rank; ++i) {
        if (t.shape[i] == 0) return 0;
        last += (t.shape[i] - 1) * t.strides[i];
    }
    return last + 1;
}

// ---------------------------------------------------------------------------
// Library-wide fallible function

// Fills `table` (host memory, at least max_pos * 64 floats) with a RoPE table.
inline void rope_table(const unikv_rope_params& params, std::uint32_t max_pos, float* table, std::size_t table_len) {
    detail::check(unikv_rope_table(&params, max_pos, table, table_len), "unikv_rope_table");
}

// The RoPE table as a new `[max_pos, 64]` vector.
inline std::vector<float> rope_table(const unikv_rope_params& params, std::uint32_t max_pos) {
    std::vector<float> table(static_cast<std::size_t>(max_pos) * 64);
    rope_table(params, max_pos, table.data(), table.size());
    return table;
}

// What this build supports: backends compiled in (bit `1u << backend`), GPU
// devices present now, compiled GPU targets, KV dtypes, FP8 formats and the
// shape limits. Needs no context.
inline unikv_capabilities get_capabilities() {
    unikv_capabilities caps = make_struct<unikv_capabilities>();
    detail::check(unikv_get_capabilities(&caps), "unikv_get_capabilities");
    return caps;
}

// True when `caps.backends` has the bit of `backend` (e.g. UNIKV_BACKEND_CUDA).
constexpr bool has_backend(const unikv_capabilities& caps, unikv_backend backend) noexcept {
    return backend < 32 && (caps.backends & (1u << backend)) != 0;
}

// Sizes before creating a pool: the pool-wide geometry a pool created from
// `params` would report (`pool::get_info`, with slots_in_use 0). `params` is
// checked exactly as pool::create checks it (same statuses and messages).
inline unikv_pool_info pool_params_get_info(const unikv_pool_params& params) {
    unikv_pool_info info = make_struct<unikv_pool_info>();
    detail::check(unikv_pool_params_get_info(&params, &info), "unikv_pool_params_get_info");
    return info;
}

// One layer of a pool created from `params` (`pool::get_layer`): rows, and
// `bytes` / `rope_bytes`, the sizes of the buffers an adopting pool needs for
// `params.layer_buffers[layer]` / `params.rope_buffers[layer]`.
inline unikv_pool_layer_info pool_params_get_layer(const unikv_pool_params& params, std::uint32_t layer) {
    unikv_pool_layer_info info = make_struct<unikv_pool_layer_info>();
    detail::check(unikv_pool_params_get_layer(&params, layer, &info), "unikv_pool_params_get_layer");
    return info;
}

// One compressor's state geometry in a pool created from `params`
// (`pool::get_compressor`; `compressor` a unikv_compressor).
inline unikv_compressor_info pool_params_get_compressor(const unikv_pool_params& params, std::uint32_t layer,
                                                        std::uint32_t compressor) {
    unikv_compressor_info info = make_struct<unikv_compressor_info>();
    detail::check(unikv_pool_params_get_compressor(&params, layer, compressor, &info),
                  "unikv_pool_params_get_compressor");
    return info;
}

// ---------------------------------------------------------------------------
// Diagnostics callback (process-wide)

using log_fn = unikv_log_fn;

// Sets (or with a null `callback`, removes) the process-wide diagnostics
// callback; `user` is passed back to it. `callback` gets a `unikv_log_level`
// and a message valid during the call only; it may run on several threads at
// once and must not throw. Whatever `user` points to must stay valid until the
// callback is replaced or removed, and a call already running on another
// thread may still reach the previous callback: remove or replace it while no
// other thread is inside the library before freeing that state.
inline void set_log_callback(unikv_log_fn callback, void* user = nullptr) {
    detail::check(unikv_set_log_callback(callback, user), "unikv_set_log_callback");
}

// A std::function as the diagnostics callback for the lifetime of this object:
//   unikv::scoped_log_callback log([](std::uint32_t level, const char* msg) { ... });
// The constructor installs it (replacing any callback), the destructor removes
// the process-wide callback, whichever is set then. Neither copyable nor
// movable: the library holds this object's address. An exception thrown by
// the function is swallowed (it must not cross the C library). Destroy it
// while no other thread is inside the library (see set_log_callback).
class scoped_log_callback {
public:
    using function = std::function<void(std::uint32_t level, const char* message)>;

    explicit scoped_log_callback(function fn) : fn_(std::move(fn)) { set_log_callback(&trampoline, this); }
    scoped_log_callback(const scoped_log_callback&) = delete;
    scoped_log_callback& operator=(const scoped_log_callback&) = delete;
    ~scoped_log_callback() { static_cast<void>(unikv_set_log_callback(nullptr, nullptr)); }

private:
    static void trampoline(void* user, std::uint32_t level, const char* message) noexcept {
        try {
            const auto* self = static_cast<const scoped_log_callback*>(user);
            if (self->fn_) self->fn_(level, message);
        } catch (...) {  // NOLINT(bugprone-empty-catch): nothing may unwind into the library
        }
    }

    function fn_;
};

// ---------------------------------------------------------------------------
// Handles

class pool;
class decode_plan;
class prefill_plan;

// A context: one backend on one device (unikv_context_*).
class context : public detail::handle<unikv_context, unikv_context_destroy> {
public:
    context() noexcept = default;
    // Adopts a handle from unikv_context_create.
    explicit context(unikv_context* adopt) noexcept : handle(adopt) {}

    static context create(const unikv_context_options& options) {
        unikv_context* out = nullptr;
        detail::check(unikv_context_create(&options, &out), "unikv_context_create");
        return context(out);
    }
    // Options with `backend` (AUTO: a GPU when present, else the CPU) and
    // `cpu_threads` (0: one per core); the rest zero.
    static context create(unikv_backend backend = UNIKV_BACKEND_AUTO, std::uint32_t cpu_threads = 0) {
        return create(options(backend, cpu_threads));
    }
    static result<context> try_create(const unikv_context_options& opts) {
        unikv_context* out = nullptr;
        status s(unikv_context_create(&opts, &out));
        if (!s) return s;
        return context(out);
    }
    static unikv_context_options options(unikv_backend backend = UNIKV_BACKEND_AUTO, std::uint32_t cpu_threads = 0) {
        unikv_context_options o = make_struct<unikv_context_options>();
        o.backend = backend;
        o.cpu_threads = cpu_threads;
        return o;
    }

    unikv_context_info get_info() const {
        unikv_context_info info = make_struct<unikv_context_info>();
        detail::check(unikv_context_get_info(get(), &info), "unikv_context_get_info");
        return info;
    }

    // Raw memory; prefer `unikv::buffer`, which frees itself.
    void* memory_alloc(std::size_t bytes) const {
        void* out = nullptr;
        detail::check(unikv_memory_alloc(get(), bytes, &out), "unikv_memory_alloc");
        return out;
    }
    void memory_free(void* ptr) const { detail::check(unikv_memory_free(get(), ptr), "unikv_memory_free"); }
    void memory_copy(void* dst, const void* src, std::size_t bytes, unikv_copy_kind kind,
                     void* stream = nullptr) const {
        detail::check(unikv_memory_copy(get(), dst, src, bytes, kind, stream), "unikv_memory_copy");
    }
    void memory_set(void* ptr, std::uint8_t value, std::size_t bytes, void* stream = nullptr) const {
        detail::check(unikv_memory_set(get(), ptr, value, bytes, stream), "unikv_memory_set");
    }
    void stream_synchronize(void* stream = nullptr) const {
        detail::check(unikv_stream_synchronize(get(), stream), "unikv_stream_synchronize");
    }

    // Context-level operations (no pool).
    void attention_merge(const unikv_merge_args& args, void* stream = nullptr) const {
        detail::check(unikv_attention_merge(get(), &args, stream), "unikv_attention_merge");
    }
    void store_flashmla(const unikv_store_flashmla_args& args, void* stream = nullptr) const {
        detail::check(unikv_store_flashmla(get(), &args, stream), "unikv_store_flashmla");
    }
    void store_scaled_fp8(const unikv_store_scaled_fp8_args& args, void* stream = nullptr) const {
        detail::check(unikv_store_scaled_fp8(get(), &args, stream), "unikv_store_scaled_fp8");
    }
    void store_indexer(const unikv_store_indexer_args& args, void* stream = nullptr) const {
        detail::check(unikv_store_indexer(get(), &args, stream), "unikv_store_indexer");
    }
    void indexer_prepare_q(const unikv_indexer_prepare_q_args& args, void* stream = nullptr) const {
        detail::check(unikv_indexer_prepare_q(get(), &args, stream), "unikv_indexer_prepare_q");
    }
    void indexer_prepare_k(const unikv_indexer_prepare_k_args& args, void* stream = nullptr) const {
        detail::check(unikv_indexer_prepare_k(get(), &args, stream), "unikv_indexer_prepare_k");
    }
    void indexer_topk(const unikv_indexer_topk_args& args, void* stream = nullptr) const {
        detail::check(unikv_indexer_topk(get(), &args, stream), "unikv_indexer_topk");
    }
    void indexer_topk_from_logits(const unikv_indexer_topk_args& args, void* stream = nullptr) const {
        detail::check(unikv_indexer_topk_from_logits(get(), &args, stream), "unikv_indexer_topk_from_logits");
    }
    void inverse_rope(const unikv_inverse_rope_args& args, void* stream = nullptr) const {
        detail::check(unikv_inverse_rope(get(), &args, stream), "unikv_inverse_rope");
    }
    void hash_topk(const unikv_hash_topk_args& args, void* stream = nullptr) const {
        detail::check(unikv_hash_topk(get(), &args, stream), "unikv_hash_topk");
    }
};

// Memory from unikv_memory_alloc (device memory on GPU backends), freed by the
// destructor. Must not outlive its context.
class buffer {
public:
    buffer() noexcept = default;
    buffer(const context& ctx, std::size_t bytes) : ctx_(ctx.get()), bytes_(bytes) {
        detail::check(unikv_memory_alloc(ctx_, bytes_, &data_), "unikv_memory_alloc");
    }
    buffer(const buffer&) = delete;
    buffer& operator=(const buffer&) = delete;
    buffer(buffer&& other) noexcept
        : ctx_(std::exchange(other.ctx_, nullptr)),
          bytes_(std::exchange(other.bytes_, 0)),
          data_(std::exchange(other.data_, nullptr)) {}
    buffer& operator=(buffer&& other) noexcept {
        if (this != &other) {
            reset();
            ctx_ = std::exchange(other.ctx_, nullptr);
            bytes_ = std::exchange(other.bytes_, 0);
            data_ = std::exchange(other.data_, nullptr);
        }
        return *this;
    }
    ~buffer() { reset(); }

    // Frees the memory now (a failure, which only a misuse can cause, is
    // left in the thread's last error).
    void reset() noexcept {
        if (data_ != nullptr) static_cast<void>(unikv_memory_free(ctx_, data_));
        data_ = nullptr;
        bytes_ = 0;
    }

    void* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return bytes_; }
    template <class T>
    T* as() const noexcept {
        return static_cast<T*>(data_);
    }

    // Host -> buffer and buffer -> host copies of `bytes` at byte `offset`,
    // ordered on `stream` (host memory must stay valid until it gets there;
    // call context::stream_synchronize before reading downloaded data).
    void upload(const void* src, std::size_t bytes, void* stream = nullptr, std::size_t offset = 0) {
        range_check(offset, bytes, "unikv::buffer::upload");
        detail::check(unikv_memory_copy(ctx_, static_cast<char*>(data_) + offset, src, bytes,
                                        UNIKV_COPY_HOST_TO_DEVICE, stream),
                      "unikv_memory_copy");
    }
    void download(void* dst, std::size_t bytes, void* stream = nullptr, std::size_t offset = 0) const {
        range_check(offset, bytes, "unikv::buffer::download");
        detail::check(unikv_memory_copy(ctx_, dst, static_cast<const char*>(data_) + offset, bytes,
                                        UNIKV_COPY_DEVICE_TO_HOST, stream),
                      "unikv_memory_copy");
    }
    // Sets every byte (e.g. to poison outputs before a test).
    void fill(std::uint8_t value, void* stream = nullptr) {
        detail::check(unikv_memory_set(ctx_, data_, value, bytes_, stream), "unikv_memory_set");
    }

    // A descriptor over the buffer (contiguous unless strides are given).
    unikv_tensor tensor(unikv_dtype dtype, std::initializer_list<std::int64_t> shape) const {
        return make_tensor(data_, dtype, shape);
    }
    unikv_tensor tensor(unikv_dtype dtype, std::initializer_list<std::int64_t> shape,
                        std::initializer_list<std::int64_t> strides) const {
        return make_tensor(data_, dtype, shape, strides);
    }

private:
    void range_check(std::size_t offset, std::size_t bytes, const char* call) const {
        if (offset > bytes_ || bytes > bytes_ - offset)
            throw error(UNIKV_CAPACITY_EXCEEDED, call,
                        std::to_string(bytes) + " bytes at offset " + std::to_string(offset) + " of a " +
                            std::to_string(bytes_) + "-byte buffer");
    }

    const unikv_context* ctx_ = nullptr;
    std::size_t bytes_ = 0;
    void* data_ = nullptr;
};

// A unified KV pool (unikv_pool_*) and the operations on its rows.
class pool : public detail::handle<unikv_pool, unikv_pool_destroy> {
public:
    pool() noexcept = default;
    explicit pool(unikv_pool* adopt) noexcept : handle(adopt) {}

    static pool create(const context& ctx, const unikv_pool_params& params) {
        unikv_pool* out = nullptr;
        detail::check(unikv_pool_create(ctx.get(), &params, &out), "unikv_pool_create");
        return pool(out);
    }
    static result<pool> try_create(const context& ctx, const unikv_pool_params& params) {
        unikv_pool* out = nullptr;
        status s(unikv_pool_create(ctx.get(), &params, &out));
        if (!s) return s;
        return pool(out);
    }

    unikv_pool_info get_info() const {
        unikv_pool_info info = make_struct<unikv_pool_info>();
        detail::check(unikv_pool_get_info(get(), &info), "unikv_pool_get_info");
        return info;
    }
    unikv_pool_layer_info get_layer(std::uint32_t layer) const {
        unikv_pool_layer_info info = make_struct<unikv_pool_layer_info>();
        detail::check(unikv_pool_get_layer(get(), layer, &info), "unikv_pool_get_layer");
        return info;
    }

    // Throws unikv::error (UNIKV_CAPACITY_EXCEEDED) when every slot is taken.
    std::uint32_t acquire_slot() const {
        std::uint32_t slot = 0;
        detail::check(unikv_pool_acquire_slot(get(), &slot), "unikv_pool_acquire_slot");
        return slot;
    }
    // Non-throwing: a full pool is an ordinary condition for a scheduler.
    result<std::uint32_t> try_acquire_slot() const {
        std::uint32_t slot = 0;
        status s(unikv_pool_acquire_slot(get(), &slot));
        if (!s) return s;
        return slot;
    }
    // Clears the slot's compressor rings first (host-synchronous on GPUs).
    void release_slot(std::uint32_t slot) const {
        detail::check(unikv_pool_release_slot(get(), slot), "unikv_pool_release_slot");
    }
    // Queues the clearing of the slot's compressor rings on `stream`.
    void release_slot_async(std::uint32_t slot, void* stream = nullptr) const {
        detail::check(unikv_pool_release_slot_async(get(), slot, stream), "unikv_pool_release_slot_async");
    }
    // A compressor's state geometry (`compressor` a unikv_compressor).
    unikv_compressor_info get_compressor(std::uint32_t layer, std::uint32_t compressor) const {
        unikv_compressor_info info = make_struct<unikv_compressor_info>();
        detail::check(unikv_pool_get_compressor(get(), layer, compressor, &info), "unikv_pool_get_compressor");
        return info;
    }

    void build_decode_streams(const unikv_decode_streams_args& args, void* stream = nullptr) const {
        detail::check(unikv_build_decode_streams(get(), &args, stream), "unikv_build_decode_streams");
    }
    void fill_csa_tail(const unikv_csa_tail_args& args, void* stream = nullptr) const {
        detail::check(unikv_fill_csa_tail(get(), &args, stream), "unikv_fill_csa_tail");
    }
    void indexer_topk_fill_csa(const unikv_indexer_topk_args& args, const unikv_csa_stream& csa,
                               void* stream = nullptr) const {
        detail::check(unikv_indexer_topk_fill_csa(get(), &args, &csa, stream), "unikv_indexer_topk_fill_csa");
    }
    void build_prefill_streams(const unikv_prefill_streams_args& args, void* stream = nullptr) const {
        detail::check(unikv_build_prefill_streams(get(), &args, stream), "unikv_build_prefill_streams");
    }
    void prepare_qkv(const unikv_prepare_qkv_args& args, void* stream = nullptr) const {
        detail::check(unikv_prepare_qkv(get(), &args, stream), "unikv_prepare_qkv");
    }
    void prepare_qkv_indexer_q(const unikv_prepare_qkv_args& args, const unikv_indexer_prepare_q_args& indexer,
                               void* stream = nullptr) const {
        detail::check(unikv_prepare_qkv_indexer_q(get(), &args, &indexer, stream), "unikv_prepare_qkv_indexer_q");
    }
    void store_swa(const unikv_store_swa_args& args, void* stream = nullptr) const {
        detail::check(unikv_store_swa(get(), &args, stream), "unikv_store_swa");
    }
    void store_compressed(const unikv_store_compressed_args& args, void* stream = nullptr) const {
        detail::check(unikv_store_compressed(get(), &args, stream), "unikv_store_compressed");
    }
    void compress_decode(const unikv_compress_args& args, void* stream = nullptr) const {
        detail::check(unikv_compress_decode(get(), &args, stream), "unikv_compress_decode");
    }
    void compress_prefill(const unikv_compress_args& args, void* stream = nullptr) const {
        detail::check(unikv_compress_prefill(get(), &args, stream), "unikv_compress_prefill");
    }
};

// A decode plan (unikv_decode_plan_*) and its launch, unikv_sparse_decode.
class decode_plan : public detail::handle<unikv_decode_plan, unikv_decode_plan_destroy> {
public:
    decode_plan() noexcept = default;
    explicit decode_plan(unikv_decode_plan* adopt) noexcept : handle(adopt) {}

    static decode_plan create(const context& ctx, const unikv_attention_plan_params& params) {
        unikv_decode_plan* out = nullptr;
        detail::check(unikv_decode_plan_create(ctx.get(), &params, &out), "unikv_decode_plan_create");
        return decode_plan(out);
    }
    static result<decode_plan> try_create(const context& ctx, const unikv_attention_plan_params& params) {
        unikv_decode_plan* out = nullptr;
        status s(unikv_decode_plan_create(ctx.get(), &params, &out));
        if (!s) return s;
        return decode_plan(out);
    }

    std::size_t workspace_size() const {
        std::size_t bytes = 0;
        detail::check(unikv_decode_plan_workspace_size(get(), &bytes), "unikv_decode_plan_workspace_size");
        return bytes;
    }

    // The launch configuration the plan chose (kernel family, head block,
    // split cap, cluster merge, stages, workspace).
    unikv_plan_info get_info() const {
        unikv_plan_info info = make_struct<unikv_plan_info>();
        detail::check(unikv_decode_plan_get_info(get(), &info), "unikv_decode_plan_get_info");
        return info;
    }
    // The same as one human-readable line (wording may change between
    // versions; read get_info() to decide anything).
    std::string describe() const {
        return detail::read_text([this](char* buf, std::size_t size, std::size_t* length) {
            return unikv_decode_plan_describe(get(), buf, size, length);
        }, "unikv_decode_plan_describe");
    }

    void sparse_decode(const pool& p, const unikv_decode_args& args, void* workspace, std::size_t workspace_bytes,
                       void* stream = nullptr) const {
        detail::check(unikv_sparse_decode(get(), p.get(), &args, workspace, workspace_bytes, stream),
                      "unikv_sparse_decode");
    }
    void sparse_decode(const pool& p, const unikv_decode_args& args, const buffer& workspace,
                       void* stream = nullptr) const {
        sparse_decode(p, args, workspace.data(), workspace.size(), stream);
    }
    // Without a pool: every key source is a cache (args.kv, args.extra_kv).
    void sparse_decode(const unikv_decode_args& args, void* workspace, std::size_t workspace_bytes,
                       void* stream = nullptr) const {
        detail::check(unikv_sparse_decode(get(), nullptr, &args, workspace, workspace_bytes, stream),
                      "unikv_sparse_decode");
    }
    void sparse_decode(const unikv_decode_args& args, const buffer& workspace, void* stream = nullptr) const {
        sparse_decode(args, workspace.data(), workspace.size(), stream);
    }
};

// A prefill plan (unikv_prefill_plan_*) and its launch, unikv_sparse_prefill.
class prefill_plan : public detail::handle<unikv_prefill_plan, unikv_prefill_plan_destroy> {
public:
    prefill_plan() noexcept = default;
    explicit prefill_plan(unikv_prefill_plan* adopt) noexcept : handle(adopt) {}

    static prefill_plan create(const context& ctx, const unikv_attention_plan_params& params) {
        unikv_prefill_plan* out = nullptr;
        detail::check(unikv_prefill_plan_create(ctx.get(), &params, &out), "unikv_prefill_plan_create");
        return prefill_plan(out);
    }
    static result<prefill_plan> try_create(const context& ctx, const unikv_attention_plan_params& params) {
        unikv_prefill_plan* out = nullptr;
        status s(unikv_prefill_plan_create(ctx.get(), &params, &out));
        if (!s) return s;
        return prefill_plan(out);
    }

    std::size_t workspace_size() const {
        std::size_t bytes = 0;
        detail::check(unikv_prefill_plan_workspace_size(get(), &bytes), "unikv_prefill_plan_workspace_size");
        return bytes;
    }

    // The launch configuration the plan chose (kernel family, head block,
    // split cap, cluster merge, stages, workspace).
    unikv_plan_info get_info() const {
        unikv_plan_info info = make_struct<unikv_plan_info>();
        detail::check(unikv_prefill_plan_get_info(get(), &info), "unikv_prefill_plan_get_info");
        return info;
    }
    // The same as one human-readable line (wording may change between
    // versions; read get_info() to decide anything).
    std::string describe() const {
        return detail::read_text([this](char* buf, std::size_t size, std::size_t* length) {
            return unikv_prefill_plan_describe(get(), buf, size, length);
        }, "unikv_prefill_plan_describe");
    }

    void sparse_prefill(const pool& p, const unikv_prefill_args& args, void* workspace,
                        std::size_t workspace_bytes, void* stream = nullptr) const {
        detail::check(unikv_sparse_prefill(get(), p.get(), &args, workspace, workspace_bytes, stream),
                      "unikv_sparse_prefill");
    }
    void sparse_prefill(const pool& p, const unikv_prefill_args& args, const buffer& workspace,
                        void* stream = nullptr) const {
        sparse_prefill(p, args, workspace.data(), workspace.size(), stream);
    }
    // Without a pool: both key sources are caches or extend rows.
    void sparse_prefill(const unikv_prefill_args& args, void* workspace, std::size_t workspace_bytes,
                        void* stream = nullptr) const {
        detail::check(unikv_sparse_prefill(get(), nullptr, &args, workspace, workspace_bytes, stream),
                      "unikv_sparse_prefill");
    }
    void sparse_prefill(const unikv_prefill_args& args, const buffer& workspace, void* stream = nullptr) const {
        sparse_prefill(args, workspace.data(), workspace.size(), stream);
    }
};

// Attention plan parameters for bf16 queries and outputs: `max_tokens`,
// `num_heads`, head_dim 512, the key rows' `kv_dtype` and their layout
// (a pool layer by default; a FlashMLA cache or scaled FP8 rows of the FP8
// `kv_dtype` otherwise).
inline unikv_attention_plan_params plan_params(std::uint32_t max_tokens, std::uint32_t num_heads,
                                               unikv_dtype kv_dtype = UNIKV_DTYPE_BF16,
                                               unikv_kv_layout kv_layout = UNIKV_KV_LAYOUT_POOL) noexcept {
    unikv_attention_plan_params p = make_struct<unikv_attention_plan_params>();
    p.max_tokens = max_tokens;
    p.num_heads = num_heads;
    p.head_dim = 512;
    p.q_dtype = UNIKV_DTYPE_BF16;
    p.kv_dtype = kv_dtype;
    p.out_dtype = UNIKV_DTYPE_BF16;
    p.kv_layout = kv_layout;
    return p;
}

// A key source in FlashMLA's paged FP8 cache (docs/attention.md §6):
// `cache` is the [num_pages, bytes_per_page] UNIKV_DTYPE_U8 tensor,
// `page_size` 2, 64 or 256, `fp8` the codes' flavour.
inline unikv_kv_cache flashmla_cache(const unikv_tensor& cache, std::uint32_t page_size,
                                     unikv_dtype fp8 = UNIKV_DTYPE_FP8_E4M3FN) noexcept {
    unikv_kv_cache c{};
    c.layout = UNIKV_KV_LAYOUT_FLASHMLA;
    c.fp8_dtype = fp8;
    c.page_size = page_size;
    c.data = cache;
    return c;
}

// A key source of scaled FP8 rows: `codes` [rows, 512] UNIKV_DTYPE_U8 and
// `scales` [rows, 8] UNIKV_DTYPE_F32 (docs/fp8.md §8).
inline unikv_kv_cache scaled_fp8_rows(const unikv_tensor& codes, const unikv_tensor& scales,
                                      unikv_dtype fp8 = UNIKV_DTYPE_FP8_E4M3FN) noexcept {
    unikv_kv_cache c{};
    c.layout = UNIKV_KV_LAYOUT_SCALED_FP8;
    c.fp8_dtype = fp8;
    c.data = codes;
    c.scales = scales;
    return c;
}

}  // namespace unikv

#endif  // UNIKV_HPP
