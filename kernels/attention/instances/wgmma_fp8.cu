// attention_wgmma_kernel for FP8 pools.
#include "attention/wgmma.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kWgmmaFp8, (WgSmem::kBytes), wgmma_threads(true), attention_wgmma_kernel<true>);
#endif

