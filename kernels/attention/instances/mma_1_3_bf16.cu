// attention_kernel<1, 3> for bf16 pools.
#include "attention/mma.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kMma1x3Bf16, (Smem<1, 3>::kBytes), kThreads, attention_kernel<1, 3, false>);
#endif

