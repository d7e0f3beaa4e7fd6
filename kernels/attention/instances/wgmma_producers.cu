// attention_wgmma_kernel with producer warpgroups: FP8 pools, and bf16 plans
// of large batches (plan.cu).
#include "attention/wgmma.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kWgmmaProducers, (WgSmem::kBytes), wgmma_threads(true), attention_wgmma_kernel<true>);
#endif
