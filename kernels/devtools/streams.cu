// Development tools for tests and the benchmark (not part of the C ABI):
// streams, CUDA-graph capture and replay, events, and a device copy for the
// bandwidth ceiling.
#include "../shim.cuh"

namespace {

// Grid-stride 16-byte copy with four loads in flight per thread: the
// bandwidth ceiling a streaming kernel can reach.
__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

}  // namespace

extern "C" {

// Copies `bytes` (a multiple of 16) with a kernel; for the copy-bandwidth ceiling.
int unikv_gpu_dev_copy(int device, void* dst, const void* src, size_t bytes, void* stream) {
  UKV_ENTRY(device, {
    int sms = 0;
    ukv_error_t e = ukv_device_get_attribute(&sms, UKV_ATTR_SM_COUNT, device);
    if (e != UKV_SUCCESS) return ukv::report(e, "device attribute");
    copy_kernel<<<sms * 8, 256, 0, (ukv_stream_t)stream>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst),
                                                           bytes / 16);
    return ukv::check_launch("copy_kernel");
  })
}

int unikv_gpu_dev_stream_create(int device, void** out) {
  UKV_ENTRY(device, {
    ukv_stream_t s;
    ukv_error_t e = ukv_stream_create(&s);
    if (e != UKV_SUCCESS) return ukv::report(e, "stream create");
    *out = (void*)s;
    return UKV_SHIM_OK;
  })
}

int unikv_gpu_dev_stream_destroy(int device, void* stream) {
  UKV_ENTRY(device, {
    ukv_error_t e = ukv_stream_destroy((ukv_stream_t)stream);
    return e == UKV_SUCCESS ? UKV_SHIM_OK : ukv::report(e, "stream destroy");
  })
}

// Global capture mode, as the issue's graph test requires.
int unikv_gpu_dev_capture_begin(int device, void* stream) {
  UKV_ENTRY(device, {
    ukv_error_t e = ukv_stream_begin_capture((ukv_stream_t)stream, UKV_STREAM_CAPTURE_GLOBAL);
    return e == UKV_SUCCESS ? UKV_SHIM_OK : ukv::report(e, "begin capture");
  })
}

int unikv_gpu_dev_capture_end(int device, void* stream, void** exec_out) {
  UKV_ENTRY(device, {
    ukv_graph_t graph;
    ukv_error_t e = ukv_stream_end_capture((ukv_stream_t)stream, &graph);
    if (e != UKV_SUCCESS) return ukv::report(e, "end capture");
    ukv_graph_exec_t exec;
    e = ukv_graph_instantiate(&exec, graph);
    (void)ukv_graph_destroy(graph);
    if (e != UKV_SUCCESS) return ukv::report(e, "graph instantiate");
    *exec_out = (void*)exec;
    return UKV_SHIM_OK;
  })
}

int unikv_gpu_dev_graph_launch(int device, void* exec, void* stream) {
  UKV_ENTRY(device, {
    ukv_error_t e = ukv_graph_launch((ukv_graph_exec_t)exec, (ukv_stream_t)stream);
    return e == UKV_SUCCESS ? UKV_SHIM_OK : ukv::report(e, "graph launch");
  })
}

int unikv_gpu_dev_graph_destroy(int device, void* exec) {
  UKV_ENTRY(device, {
    ukv_error_t e = ukv_graph_exec_destroy((ukv_graph_exec_t)exec);
    return e == UKV_SUCCESS ? UKV_SHIM_OK : ukv::report(e, "graph destroy");
  })
}

int unikv_gpu_dev_event_create(int device, void** out) {
  UKV_ENTRY(device, {
    ukv_event_t ev;
    ukv_error_t e = ukv_event_create(&ev);
    if (e != UKV_SUCCESS) return ukv::report(e, "event create");
    *out = (void*)ev;
    return UKV_SHIM_OK;
  })
}

int unikv_gpu_dev_event_destroy(int device, void* event) {
  UKV_ENTRY(device, {
    ukv_error_t e = ukv_event_destroy((ukv_event_t)event);
    return e == UKV_SUCCESS ? UKV_SHIM_OK : ukv::report(e, "event destroy");
  })
}

int unikv_gpu_dev_event_record(int device, void* event, void* stream) {
  UKV_ENTRY(device, {
    ukv_error_t e = ukv_event_record((ukv_event_t)event, (ukv_stream_t)stream);
    return e == UKV_SUCCESS ? UKV_SHIM_OK : ukv::report(e, "event record");
  })
}

// Milliseconds between two recorded events (synchronizes on `end`).
int unikv_gpu_dev_event_elapsed(int device, void* start, void* end, float* ms) {
  UKV_ENTRY(device, {
    ukv_error_t e = ukv_event_synchronize((ukv_event_t)end);
    if (e == UKV_SUCCESS) e = ukv_event_elapsed_time(ms, (ukv_event_t)start, (ukv_event_t)end);
    return e == UKV_SUCCESS ? UKV_SHIM_OK : ukv::report(e, "event elapsed");
  })
}

}  // extern "C"
