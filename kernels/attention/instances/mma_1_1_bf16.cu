// attention_kernel<1, 1> for bf16 pools.
#include "attention/mma.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kMma1x1Bf16, (Smem<1, 1>::kBytes), kThreads, attention_kernel<1, 1, false>);
#endif

