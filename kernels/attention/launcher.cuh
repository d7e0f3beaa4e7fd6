// How plan.cu reaches the attention kernels: each instantiation lives in its
// own translation unit (instances/), which exports an AttentionLauncher, so
// the plan never takes the address of a kernel defined elsewhere and a kernel
// edit recompiles only its instances. The plan names an instantiation by its
// launcher's address.
#pragma once

#include "common.cuh"

struct AttentionLauncher {
  size_t smem;  // dynamic shared memory per block
  int threads;  // threads per block
  // Lets the kernel use `smem` bytes, with all of the unified L1/shared
  // storage as shared memory so the CTAs per SM it is built for fit.
  ukv_error_t (*configure)();
  ukv_error_t (*allow_large_clusters)();
  // How many clusters of `cluster_z` blocks fit at once (ukv_max_active_clusters).
  ukv_error_t (*max_active_clusters)(int cluster_z, int* fit);
  ukv_error_t (*launch)(dim3 grid, ukv_stream_t stream, bool early, int cluster_z, const ukv_attention_params& p,
                        SplitConfig cfg);
};

namespace {

template <void (*Kernel)(ukv_attention_params, SplitConfig), size_t kSmem, int kBlock>
struct LauncherOps {
  static ukv_error_t configure() {
    const ukv_error_t e = ukv_func_set_max_dynamic_smem(Kernel, (int)kSmem);
    return e == UKV_SUCCESS ? ukv_func_set_max_smem_carveout(Kernel) : e;
  }
  static ukv_error_t allow_large_clusters() { return ukv_func_allow_large_clusters(Kernel); }
  static ukv_error_t max_active_clusters(int cluster_z, int* fit) {
    return ukv_max_active_clusters(Kernel, dim3(kBlock), kSmem, cluster_z, fit);
  }
  static ukv_error_t launch(dim3 grid, ukv_stream_t stream, bool early, int cluster_z, const ukv_attention_params& p,
                            SplitConfig cfg) {
    return ukv_launch_dependent(Kernel, grid, dim3(kBlock), kSmem, stream, early, cluster_z, p, cfg);
  }
};

}  // namespace

// Defines launcher `name` of the kernel instantiation in the variadic
// arguments (its template arguments may hold commas). Not const: hipcc's
// device pass would take a const one with a constant initializer for an
// implicit device variable and link against the host functions it names.
#define UKV_ATTENTION_LAUNCHER(name, smem, threads, ...)                            \
  AttentionLauncher name {                                                           \
    (smem), (threads), LauncherOps<__VA_ARGS__, (smem), (threads)>::configure,       \
        LauncherOps<__VA_ARGS__, (smem), (threads)>::allow_large_clusters,           \
        LauncherOps<__VA_ARGS__, (smem), (threads)>::max_active_clusters,            \
        LauncherOps<__VA_ARGS__, (smem), (threads)>::launch                          \
  }

// The instantiations the plan names (instances/*.cu). Bf16 / Fp8: the pool
// the kernel serves; Raw: the raw FP8 variant (RawFlashMla: over FlashMLA
// caches). The NVIDIA ones exist in CUDA builds only.
extern AttentionLauncher kPortableScalarBf16, kPortableScalarFp8, kPortableMatrixBf16, kPortableMatrixFp8;
#if defined(UKV_NVIDIA_KERNELS)
extern AttentionLauncher kMma1x1Bf16, kMma1x1Fp8, kMma1x3Bf16, kMma1x3Fp8, kMma2x2Bf16, kMma2x2Fp8,
    kMma3x2Bf16, kMma3x2Fp8, kMma4x2Bf16, kMma4x2Fp8;
extern AttentionLauncher kWgmmaBf16, kWgmmaProducers, kWgmmaPair;
extern AttentionLauncher kSwap16x1Bf16, kSwap16x3Bf16, kSwap16x3Fp8, kSwap16x5Raw, kSwap16x5RawFlashMla,
    kSwap32x2Bf16, kSwap32x2Fp8;
extern AttentionLauncher kRoles32x4Raw, kRoles32x4RawFlashMla;
#endif

// Launches the workspace combine of a split launch (combine.cu).
ukv_error_t launch_attention_combine(dim3 grid, ukv_stream_t stream, bool early, const ukv_attention_params& p,
                                     SplitConfig cfg, int block_heads);
