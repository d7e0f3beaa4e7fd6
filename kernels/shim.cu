// Runtime side of the shim: errors, device selection, memory helpers, streams.
#include <atomic>
#include <cstring>

#include "shim.cuh"

namespace ukv {

namespace {
thread_local std::string g_message;
}  // namespace

void set_error(const std::string& message) { g_message = message; }

// 1 in the image built with wgmma (sm_90a), 0 in every other image.
__device__ int g_wgmma_built =
#if defined(UKV_HAS_WGMMA)
    1;
#else
    0;
#endif

// The architecture each image was compiled for (DeviceFacts::image_arch).
__device__ int g_image_arch =
#if defined(__CUDA_ARCH__)
    __CUDA_ARCH__;
#else
    0;
#endif

int device_facts(int device, DeviceFacts* facts) {
  // Per device: bit 31 (read), SM count << 9, major << 1, wgmma; 0 when not
  // read yet. Devices past the table are read every time.
  // The image's architecture in its own table (stored before `known`, so a
  // reader that sees `known` set sees it too).
  static std::atomic<uint32_t> known[64];
  static std::atomic<int> image[64];
  const bool cached = device >= 0 && device < 64;
  if (cached) {
    if (const uint32_t v = known[device].load(std::memory_order_acquire)) {
      facts->sms = (int)((v >> 9) & 0xFFFFu);
      facts->major = (int)((v >> 1) & 0xFFu);
      facts->wgmma = (v & 1u) != 0;
      facts->image_arch = image[device].load(std::memory_order_relaxed);
      return UKV_SHIM_OK;
    }
  }
  int major = 0, sms = 0, wgmma = 0, image_arch = 0;
  ukv_error_t e = ukv_device_get_attribute(&major, UKV_ATTR_CC_MAJOR, device);
  if (e == UKV_SUCCESS) e = ukv_device_get_attribute(&sms, UKV_ATTR_SM_COUNT, device);
  if (e != UKV_SUCCESS) return report(e, "device attribute");
  e = ukv_memcpy_from_symbol(&wgmma, g_wgmma_built, sizeof(wgmma));
  if (e == UKV_SUCCESS) e = ukv_memcpy_from_symbol(&image_arch, g_image_arch, sizeof(image_arch));
  if (e != UKV_SUCCESS) return report(e, "read the kernel image's features");
  facts->major = major;
  facts->sms = sms;
  facts->wgmma = wgmma != 0 && major == 9;
  facts->image_arch = image_arch;
  if (cached) {
    image[device].store(image_arch, std::memory_order_relaxed);
    known[device].store(1u << 31 | (uint32_t)(sms & 0xFFFF) << 9 | (uint32_t)(major & 0xFF) << 1 | (facts->wgmma ? 1u : 0u),
                        std::memory_order_release);
  }
  return UKV_SHIM_OK;
}

int pdl_supported(int device, bool* supported) {
  DeviceFacts facts;
  if (int r = device_facts(device, &facts)) return r;
  // The kernels wait for their predecessor (ukv_pdl_wait) only in sm_90 code.
  *supported = facts.sm90_code();
  return UKV_SHIM_OK;
}

int report(ukv_error_t e, const char* what) {
  set_error(std::string(what) + ": " + ukv_get_error_string(e));
  if (e == UKV_ERROR_MEMORY_ALLOCATION) return UKV_SHIM_OUT_OF_MEMORY;
  if (e == UKV_ERROR_NO_DEVICE || e == UKV_ERROR_INSUFFICIENT_DRIVER) return UKV_SHIM_UNAVAILABLE;
  return ukv_error_is_sticky(e) ? UKV_SHIM_FATAL : UKV_SHIM_ERROR;
}

DeviceGuard::DeviceGuard(int device) {
  ukv_error_t e = ukv_get_device(&previous_);
  if (e != UKV_SUCCESS) {
    status_ = report(e, "get device");
    return;
  }
  if (previous_ != device) {
    e = ukv_set_device(device);
    if (e != UKV_SUCCESS) {
      status_ = report(e, "set device");
      return;
    }
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) (void)ukv_set_device(previous_);
}

}  // namespace ukv

extern "C" {

const char* unikv_gpu_last_error(void) { return ukv::g_message.c_str(); }

// Sizes of the params structs, checked against the Rust mirrors.
size_t unikv_gpu_params_size(int which) {
  switch (which) {
    case 0: return sizeof(ukv_store_swa_params);
    case 1: return sizeof(ukv_store_compressed_params);
    case 2: return sizeof(ukv_decode_streams_params);
    case 3: return sizeof(ukv_csa_tail_params);
    case 4: return sizeof(ukv_prefill_streams_params);
    case 5: return sizeof(ukv_attention_params);
    case 6: return sizeof(ukv_merge_params);
    case 7: return sizeof(ukv_attention_plan);
    case 8: return sizeof(ukv_fp8_check_params);
    case 9: return sizeof(ukv_inverse_rope_params);
    case 10: return sizeof(ukv_cache_store_params);
    case 11: return sizeof(ukv_prepare_qkv_params);
    case 12: return sizeof(ukv_hash_topk_params);
    case 13: return sizeof(ukv_indexer_q_params);
    case 14: return sizeof(ukv_indexer_k_params);
    case 15: return sizeof(ukv_indexer_topk_params);
    case 16: return sizeof(ukv_scaled_store_params);
    case 17: return sizeof(ukv_compress_params);
    case 18: return sizeof(ukv_compress_clear_params);
    default: return 0;
  }
}

// Number of devices; UKV_SHIM_UNAVAILABLE (with the reason) when there is no
// driver or no device, which a CPU-only machine reports here.
int unikv_gpu_device_count(int* count) {
  *count = 0;
  ukv_error_t e = ukv_get_device_count(count);
  if (e != UKV_SUCCESS) {
    *count = 0;
    (void)ukv_get_last_error();
    return ukv::report(e, "device count");
  }
  return UKV_SHIM_OK;
}

// Reads what launch paths ask about `device` (ukv::device_facts) while no
// stream is being captured: the backend calls it when it opens the device.
int unikv_gpu_open_device(int device) {
  UKV_ENTRY(device, {
    ukv::DeviceFacts facts;
    return ukv::device_facts(device, &facts);
  })
}

int unikv_gpu_malloc(int device, size_t bytes, void** out) {
  UKV_ENTRY(device, {
    void* p = nullptr;
    ukv_error_t e = ukv_malloc(&p, bytes == 0 ? 1 : bytes);
    if (e != UKV_SUCCESS) {
      (void)ukv_get_last_error();
      return ukv::report(e, "device malloc");
    }
    // Pools and workspaces start zeroed, as on the CPU backend.
    e = ukv_memset(p, 0, bytes);
    if (e != UKV_SUCCESS) {
      (void)ukv_free(p);
      return ukv::report(e, "memset");
    }
    *out = p;
    return UKV_SHIM_OK;
  })
}

int unikv_gpu_free(int device, void* ptr) {
  UKV_ENTRY(device, {
    ukv_error_t e = ukv_free(ptr);
    return e == UKV_SUCCESS ? UKV_SHIM_OK : ukv::report(e, "device free");
  })
}

// kind: 0 host->device, 1 device->host, 2 device->device.
int unikv_gpu_memcpy_async(int device, void* dst, const void* src, size_t bytes, int kind, void* stream) {
  UKV_ENTRY(device, {
    ukv_memcpy_kind k = kind == 0 ? UKV_MEMCPY_HOST_TO_DEVICE
                       : kind == 1 ? UKV_MEMCPY_DEVICE_TO_HOST
                                   : UKV_MEMCPY_DEVICE_TO_DEVICE;
    ukv_error_t e = ukv_memcpy_async(dst, src, bytes, k, (ukv_stream_t)stream);
    return e == UKV_SUCCESS ? UKV_SHIM_OK : ukv::report(e, "memcpy async");
  })
}

int unikv_gpu_memset_async(int device, void* ptr, int value, size_t bytes, void* stream) {
  UKV_ENTRY(device, {
    ukv_error_t e = ukv_memset_async(ptr, value, bytes, (ukv_stream_t)stream);
    return e == UKV_SUCCESS ? UKV_SHIM_OK : ukv::report(e, "memset async");
  })
}

int unikv_gpu_stream_synchronize(int device, void* stream) {
  UKV_ENTRY(device, {
    ukv_error_t e = ukv_stream_synchronize((ukv_stream_t)stream);
    return e == UKV_SUCCESS ? UKV_SHIM_OK : ukv::report(e, "stream synchronize");
  })
}

}  // extern "C"
