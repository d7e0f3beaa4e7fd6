// attention_kernel<1, 3> for FP8 pools.
#include "attention/mma.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kMma1x3Fp8, (Smem<1, 3>::kBytes), kThreads, attention_kernel<1, 3, true>);
#endif

