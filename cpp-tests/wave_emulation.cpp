// Wave64 check without an AMD GPU: the logical-warp helpers the kernels use
// (kernels/warp.cuh over the HIP mapping in kernels/vendor/hip_warp.cuh, the
// same headers, not copies) compiled as host C++ and run on an emulated wave.
// Every lane is a host thread; the HIP builtins below follow HIP's documented
// semantics (amd_warp_functions.h): __shfl_xor/__shfl_up/__shfl exchange within
// width-aligned segments and return the caller's own value for a source outside
// its segment, __ballot returns one bit per lane of the physical wave. Each
// helper is checked lane by lane against a scalar reference, with the wave at
// 64 lanes (two logical warps per wave) and at 32, for two waves of a block.
//
// Limits: lanes run as threads meeting at a barrier at every exchange, so this
// checks data movement and lane arithmetic (which lane reads which, ballot bit
// positions, the logical warp inside a wave), not timing, memory ordering or
// the compiler's code for the real target.
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace emu {

// One emulated physical wave: `size` lanes, one host thread each.
struct Wave {
  int size = 64;
  std::mutex mutex;
  std::condition_variable cv;
  int arrived = 0;
  unsigned generation = 0;
  std::vector<uint64_t> slots;

  void barrier() {
    std::unique_lock<std::mutex> lock(mutex);
    const unsigned gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen; });
    }
  }
  // Every lane publishes `value`; this lane gets lane `src`'s.
  uint64_t exchange(int lane, uint64_t value, int src) {
    slots[lane] = value;
    barrier();
    const uint64_t got = slots[src];
    barrier();
    return got;
  }
};

Wave* wave = nullptr;
int wave_size = 64;
thread_local int lane = 0;
struct Dim3 {
  unsigned x, y, z;
};
thread_local Dim3 thread_idx{0, 0, 0};

template <class T>
uint64_t bits_of(T v) {
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

}  // namespace emu

// The HIP environment vendor/hip_warp.cuh expects, on emulated lanes.
#define __device__
#define __forceinline__ inline
#define threadIdx (emu::thread_idx)
#define __AMDGCN_WAVEFRONT_SIZE (emu::wave_size)

template <class T>
T __shfl_xor(T var, int lane_mask, int width) {
  const int self = emu::lane;
  int index = self ^ lane_mask;
  index = index >= ((self + width) & ~(width - 1)) ? self : index;
  return emu::from_bits<T>(emu::wave->exchange(self, emu::bits_of(var), index));
}
int __shfl_up(int var, unsigned lane_delta, int width) {
  const int self = emu::lane;
  int index = self - (int)lane_delta;
  index = index < (self & ~(width - 1)) ? self : index;
  return emu::from_bits<int>(emu::wave->exchange(self, emu::bits_of(var), index));
}
int __shfl(int var, int src_lane, int width) {
  const int self = emu::lane;
  const int index = (src_lane & (width - 1)) + (self & ~(width - 1));
  return emu::from_bits<int>(emu::wave->exchange(self, emu::bits_of(var), index));
}
uint64_t __ballot(int predicate) {
  emu::Wave& w = *emu::wave;
  w.slots[emu::lane] = predicate != 0;
  w.barrier();
  uint64_t out = 0;
  for (int l = 0; l < w.size; ++l) out |= w.slots[l] << l;
  w.barrier();
  return out;
}
void __builtin_amdgcn_wave_barrier() { emu::wave->barrier(); }
void __builtin_amdgcn_fence(int, const char*) {}
int __ffsll(unsigned long long x) { return __builtin_ffsll((long long)x); }
int __popcll(unsigned long long x) { return __builtin_popcountll(x); }

#define UKV_WAVE_EMULATION 1
#include "warp.cuh"

namespace {

int failures = 0;

void expect(bool ok, const char* what, int wave_size, unsigned tid, double got, double want) {
  if (ok) return;
  if (++failures <= 20)
    std::printf("FAIL %s: wave %d, thread %u: got %.9g, want %.9g\n", what, wave_size, tid, got, want);
}

// Runs `body(lane)` on every lane of one wave whose first thread is `first`.
void run_wave(int size, unsigned first, const std::function<void(int)>& body) {
  emu::Wave w;
  w.size = size;
  w.slots.assign((size_t)size, 0);
  emu::wave = &w;
  emu::wave_size = size;
  std::vector<std::thread> lanes;
  for (int l = 0; l < size; ++l) {
    lanes.emplace_back([&, l] {
      emu::lane = l;
      emu::thread_idx = emu::Dim3{first + (unsigned)l, 0, 0};
      body(l);
    });
  }
  for (auto& t : lanes) t.join();
  emu::wave = nullptr;
}

// Scalar references over the logical warp (32 lanes) of thread `tid`: the
// lanes whose index differs from tid's only in the bits of `group_mask`.
template <class T, class Op>
T reduce_group(const std::vector<T>& v, unsigned tid, unsigned group_mask, T init, Op op) {
  T acc = init;
  const unsigned warp = tid / 32 * 32, lane = tid % 32;
  for (unsigned other = 0; other < 32; ++other)
    if ((other & ~group_mask) == (lane & ~group_mask)) acc = op(acc, v[warp + other]);
  return acc;
}

void check_wave(int wave_size, unsigned first, std::mt19937& rng) {
  const int n = wave_size;
  std::vector<float> f(first + n), ints(first + n);
  std::vector<double> d(first + n);
  std::vector<int> pred(first + n), counts(first + n);
  std::uniform_real_distribution<float> real(-100.f, 100.f);
  std::uniform_int_distribution<int> small(-1000, 1000);
  // Lanes set with probability density/16; with 0 (or by chance) a logical
  // warp has none, and "first set lane" moves around.
  const int density = std::uniform_int_distribution<int>(0, 3)(rng);
  for (int l = 0; l < n; ++l) {
    const unsigned t = first + l;
    f[t] = real(rng);
    ints[t] = (float)small(rng);  // integer values: sums are exact in any order
    d[t] = (double)small(rng) * 0.5;
    pred[t] = density == 0 ? 0 : (int)(std::uniform_int_distribution<int>(0, 15)(rng) < density);
    counts[t] = small(rng);
  }
  std::vector<float> r_max16(first + n), r_max8(first + n), r_max4(first + n), r_quad(first + n),
      r_cols(first + n), r_sum(first + n), r_sum_cols(first + n), r_sum_quad(first + n);
  std::vector<double> r_dsum(first + n);
  std::vector<int> r_all(first + n), r_first(first + n), r_scan(first + n), r_bcast(first + n);
  run_wave(wave_size, first, [&](int l) {
    const unsigned t = first + l;
    r_max16[t] = ukv_xor_max<16, 1>(f[t]);
    r_max8[t] = ukv_xor_max<8, 1>(f[t]);
    r_max4[t] = ukv_xor_max<4, 1>(f[t]);
    r_quad[t] = ukv_xor_max<1, 2>(f[t]);
    r_cols[t] = ukv_xor_max<4, 16>(f[t]);
    r_sum[t] = ukv_xor_sum<16, 1>(ints[t]);
    r_sum_cols[t] = ukv_xor_sum<4, 16>(ints[t]);
    r_sum_quad[t] = ukv_xor_sum<1, 2>(ints[t]);
    r_dsum[t] = ukv_xor_sum<16, 1>(d[t]);
    r_all[t] = ukv_warp_all(pred[t] != 0);
    r_first[t] = ukv_first_lane(pred[t] != 0);
    r_scan[t] = ukv_warp_inclusive_sum(counts[t]);
    r_bcast[t] = ukv_shfl(counts[t], 7, UKV_WARP);
  });
  const auto fmax_op = [](float a, float b) { return std::fmax(a, b); };
  const auto fsum_op = [](float a, float b) { return a + b; };
  for (int l = 0; l < n; ++l) {
    const unsigned t = first + l, lane = t % 32, warp = t / 32 * 32;
    const float m16 = reduce_group(f, t, 31u, -INFINITY, fmax_op);
    expect(r_max16[t] == m16, "xor_max<16,1>", wave_size, t, r_max16[t], m16);
    const float m8 = reduce_group(f, t, 15u, -INFINITY, fmax_op);
    expect(r_max8[t] == m8, "xor_max<8,1>", wave_size, t, r_max8[t], m8);
    const float m4 = reduce_group(f, t, 7u, -INFINITY, fmax_op);
    expect(r_max4[t] == m4, "xor_max<4,1>", wave_size, t, r_max4[t], m4);
    const float mq = reduce_group(f, t, 3u, -INFINITY, fmax_op);
    expect(r_quad[t] == mq, "xor_max<1,2>", wave_size, t, r_quad[t], mq);
    const float mc = reduce_group(f, t, 28u, -INFINITY, fmax_op);
    expect(r_cols[t] == mc, "xor_max<4,16>", wave_size, t, r_cols[t], mc);
    const float s = reduce_group(ints, t, 31u, 0.f, fsum_op);
    expect(r_sum[t] == s, "xor_sum<16,1>", wave_size, t, r_sum[t], s);
    const float sc = reduce_group(ints, t, 28u, 0.f, fsum_op);
    expect(r_sum_cols[t] == sc, "xor_sum<4,16>", wave_size, t, r_sum_cols[t], sc);
    const float sq = reduce_group(ints, t, 3u, 0.f, fsum_op);
    expect(r_sum_quad[t] == sq, "xor_sum<1,2>", wave_size, t, r_sum_quad[t], sq);
    const double ds = reduce_group(d, t, 31u, 0.0, [](double a, double b) { return a + b; });
    expect(r_dsum[t] == ds, "xor_sum<16,1> (double)", wave_size, t, r_dsum[t], ds);
    int all = 1, first_set = -1, scan = 0;
    for (unsigned o = 0; o < 32; ++o) {
      all &= pred[warp + o];
      if (first_set < 0 && pred[warp + o]) first_set = (int)o;
      if (o <= lane) scan += counts[warp + o];
    }
    expect(r_all[t] == all, "warp_all", wave_size, t, r_all[t], all);
    expect(r_first[t] == first_set, "first_lane", wave_size, t, r_first[t], first_set);
    expect(r_scan[t] == scan, "warp_inclusive_sum", wave_size, t, r_scan[t], scan);
    expect(r_bcast[t] == counts[warp + 7], "shfl(lane 7)", wave_size, t, r_bcast[t], counts[warp + 7]);
  }
}

}  // namespace

int main() {
  std::mt19937 rng(0x5eed);
  int cases = 0;
  for (int wave_size : {64, 32}) {
    for (int trial = 0; trial < 12; ++trial) {
      for (unsigned w = 0; w < 2; ++w) {
        check_wave(wave_size, w * (unsigned)wave_size, rng);
        ++cases;
      }
    }
  }
  if (failures != 0) {
    std::printf("wave emulation: %d mismatches over %d waves\n", failures, cases);
    return 1;
  }
  std::printf("wave emulation: %d waves (wave64 and wave32, two waves per block) match the scalar references\n",
              cases);
  return 0;
}
