// Helpers shared by the C++ serving tests: bf16 conversion, error reporting,
// whole-vector transfers to the context's memory, deterministic pseudo-random
// values and the float64 attention reference. Handles, buffers and tensor
// descriptors come from unikv.hpp.
//
// Buffers go through unikv_memory_alloc / unikv_memory_copy, so a test written
// with them runs unchanged on a GPU backend.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "unikv.hpp"

namespace serving {

constexpr int kHeadDim = 512;

// One latent row (or one query head) as raw bf16 bits.
using Bf16Row = std::vector<uint16_t>;

// ---------------------------------------------------------------------------
// bf16 <-> float (round to nearest even; NaN stays a quiet NaN)

inline uint16_t float_to_bf16(float value) { return unikv::bf16::from_float(value).bits; }

inline float bf16_to_float(uint16_t half) { return unikv::bf16{half}.to_float(); }

// ---------------------------------------------------------------------------
// Failure reporting

[[noreturn]] inline void fail(const std::string& message) {
    std::fprintf(stderr, "FAIL: %s\n", message.c_str());
    std::exit(1);
}

// Runs a test body: a failing library call (unikv::error) ends the test with
// the call, the status and the library's description of the argument at fault.
template <class Body>
int run_test(Body&& body) {
    try {
        body();
    } catch (const unikv::error& e) {
        fail(e.what());
    }
    return 0;
}

// ---------------------------------------------------------------------------
// Deterministic pseudo-random values: every value is a pure function of a key,
// so the test can regenerate any row it ever stored instead of keeping copies.

inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

class Rng {
public:
    explicit Rng(std::initializer_list<uint64_t> key) {
        for (uint64_t part : key) state_ = splitmix64(state_ ^ part);
    }
    uint64_t next() { return state_ = splitmix64(state_); }
    // Uniform in [lo, hi).
    double uniform(double lo, double hi) {
        return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53;
    }
    // Uniform in [0, n).
    int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }

private:
    uint64_t state_ = 0x5EED;
};

// A bf16 row of kHeadDim values uniform in [-amplitude, amplitude).
inline Bf16Row random_row(std::initializer_list<uint64_t> key, double amplitude) {
    Rng rng(key);
    Bf16Row row(kHeadDim);
    for (uint16_t& v : row) v = float_to_bf16(static_cast<float>(rng.uniform(-amplitude, amplitude)));
    return row;
}

// ---------------------------------------------------------------------------
// Memory in the context's address space (host memory on the CPU backend):
// unikv::buffer plus whole-vector transfers that wait for the copy.

class DeviceBuffer : public unikv::buffer {
public:
    DeviceBuffer(const unikv::context& ctx, size_t bytes) : unikv::buffer(ctx, bytes), ctx_(&ctx) {}

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
    const unikv::context* ctx_;
};

// ---------------------------------------------------------------------------
// Float64 reference attention (docs/attention.md §1)

inline std::vector<double> to_double(const uint16_t* bf16, size_t n) {
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(bf16[i]);
    return out;
}

// One (token, head): s_j = scale * <q, k_j>, M = max(sink, max s_j),
// out = sum_j e^(s_j - M) k_j / (e^(sink - M) + sum_j e^(s_j - M)); K = V.
// An empty key set gives zeros. Raw pointers in the loops keep unoptimized
// builds fast enough.
inline std::vector<double> reference_attention(const std::vector<double>& q,
                                               const std::vector<std::vector<double>>& keys, double sink,
                                               double scale) {
    std::vector<double> out(kHeadDim, 0.0);
    if (keys.empty()) return out;
    std::vector<double> logits(keys.size());
    double max_logit = sink;
    const double* qv = q.data();
    for (size_t j = 0; j < keys.size(); ++j) {
        const double* k = keys[j].data();
        double dot = 0.0;
        for (int d = 0; d < kHeadDim; ++d) dot += qv[d] * k[d];
        logits[j] = scale * dot;
        max_logit = std::max(max_logit, logits[j]);
    }
    double denominator = std::exp(sink - max_logit);
    double* acc = out.data();
    for (size_t j = 0; j < keys.size(); ++j) {
        const double* k = keys[j].data();
        const double w = std::exp(logits[j] - max_logit);
        denominator += w;
        for (int d = 0; d < kHeadDim; ++d) acc[d] += w * k[d];
    }
    for (double& v : out) v /= denominator;
    return out;
}

// ||got - want|| / ||want|| over one output row; NaN when `got` holds NaN.
inline double relative_l2_error(const uint16_t* got, const std::vector<double>& want) {
    double diff = 0.0, norm = 0.0;
    for (int d = 0; d < kHeadDim; ++d) {
        const double e = bf16_to_float(got[d]) - want[d];
        diff += e * e;
        norm += want[d] * want[d];
    }
    return std::sqrt(diff / norm);
}

}  // namespace serving
