// Shared by the shim's translation units: status codes, the thread-local error
// message, the device guard and the entry/launch checks. Nothing here is
// visible to Rust except through the extern "C" functions of shim.cu.
#pragma once

#include <exception>
#include <string>

#include "compat.cuh"
#include "params.h"

// Status codes returned by every extern "C" shim function (src/backend/gpu/shim.rs).
enum : int {
  UKV_SHIM_OK = 0,
  UKV_SHIM_ERROR = 1,        // a recoverable runtime or launch error
  UKV_SHIM_FATAL = 2,        // a sticky error: the device context is unusable
  UKV_SHIM_OUT_OF_MEMORY = 3,
  UKV_SHIM_UNAVAILABLE = 4,  // no driver or no device
  UKV_SHIM_INVALID = 5,      // an argument the shim cannot launch with
};

// Element i of a device index vector the caller passes as int32 or int64
// (positions, rows, locations, token ids); `i` keeps the caller's integer
// type, so a 32-bit index stays 32-bit address arithmetic. With the element
// type T as a template parameter (a kernel instantiated per type, picked at
// launch) no thread branches on it: in a memory-bound kernel that branch
// cost 0.3 us of 4.6 (the FlashMLA store, bench/notes/v24.md).
template <class T, class Index>
__device__ __forceinline__ int64_t ukv_index_at(const void* v, Index i) {
  return static_cast<const T*>(v)[i];
}
template <class Index>
__device__ __forceinline__ int64_t ukv_index_at(const void* v, bool is_i64, Index i) {
  return is_i64 ? ukv_index_at<int64_t>(v, i) : ukv_index_at<int32_t>(v, i);
}

namespace ukv {

void set_error(const std::string& message);

// Maps a runtime error to a shim status and records its message.
int report(ukv_error_t e, const char* what);

// Sets the context's device for the current scope and restores the caller's.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  int status() const { return status_; }

 private:
  int previous_ = -1;
  bool changed_ = false;
  int status_ = UKV_SHIM_OK;
};

// Checks the launch that was just issued.
inline int check_launch(const char* kernel) {
  ukv_error_t e = ukv_get_last_error();
  return e == UKV_SUCCESS ? UKV_SHIM_OK : report(e, kernel);
}

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// What launch paths ask about a device, read once per device. The first read
// copies a flag from the device, which a stream capture refuses, so the
// backend makes it when it opens the device (unikv_gpu_open_device).
struct DeviceFacts {
  int major = 0;       // compute capability major (on HIP, what the runtime reports)
  int sms = 0;         // multiprocessors
  bool wgmma = false;  // sm_90 running the sm_90a image, whose kernels carry wgmma
  // NVIDIA: the architecture the loaded kernel image was compiled for
  // (__CUDA_ARCH__, e.g. 900 or 800). A GPU newer than every compiled target
  // runs the portable PTX (build.rs), whose code has none of sm_90's
  // features (the PDL wait, clusters), however new the GPU: the host uses
  // them only where sm90_code() says so.
  int image_arch = 0;
  bool sm90_code() const { return major >= 9 && image_arch >= 900; }
};
int device_facts(int device, DeviceFacts* facts);

// Whether `device` has programmatic dependent launch (sm_90+).
int pdl_supported(int device, bool* supported);

// Launches `kernel` with `smem` bytes of dynamic shared memory (within the
// default 48 KB), early (programmatic dependent launch) where the device has
// it, so the launch overlaps the previous kernel's tail; the kernel must call
// ukv_pdl_wait() before reading what that kernel wrote. A failed launch is
// reported as `name`.
template <typename... Params, typename... Args>
int launch_early_smem(int device, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, void* stream,
                      const char* name, Args... args) {
  bool pdl = false;
  if (int r = pdl_supported(device, &pdl)) return r;
  const ukv_error_t e = ukv_launch_dependent(kernel, grid, block, smem, (ukv_stream_t)stream, pdl, 1, args...);
  if (e == UKV_SUCCESS) return UKV_SHIM_OK;
  (void)ukv_get_last_error();  // clear it: the failure is reported here
  return report(e, name);
}

// launch_early_smem without dynamic shared memory.
template <typename... Params, typename... Args>
int launch_early(int device, void (*kernel)(Params...), dim3 grid, dim3 block, void* stream, const char* name,
                 Args... args) {
  return launch_early_smem(device, kernel, grid, block, 0, stream, name, args...);
}

}  // namespace ukv

// Every extern "C" entry: sets the device, runs the body, turns C++ exceptions
// into a status so none crosses into Rust.
#define UKV_ENTRY(device, ...)                                  \
  try {                                                         \
    ukv::DeviceGuard guard_(device);                            \
    if (guard_.status() != UKV_SHIM_OK) return guard_.status(); \
    __VA_ARGS__                                                 \
  } catch (const std::exception& e) {                           \
    ukv::set_error(e.what());                                   \
    return UKV_SHIM_ERROR;                                      \
  } catch (...) {                                               \
    ukv::set_error("unknown C++ exception in the kernel shim"); \
    return UKV_SHIM_ERROR;                                      \
  }
