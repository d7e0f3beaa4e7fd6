// attention_kernel<2, 2> for FP8 pools.
#include "attention/mma.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kMma2x2Fp8, (Smem<2, 2>::kBytes), kThreads, attention_kernel<2, 2, true>);
#endif

