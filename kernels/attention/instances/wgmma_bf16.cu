// attention_wgmma_kernel for bf16 pools.
#include "attention/wgmma.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kWgmmaBf16, (WgSmem::kBytes), kThreads, attention_wgmma_kernel<false>);
#endif

