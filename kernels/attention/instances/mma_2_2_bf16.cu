// attention_kernel<2, 2> for bf16 pools.
#include "attention/mma.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kMma2x2Bf16, (Smem<2, 2>::kBytes), kThreads, attention_kernel<2, 2, false>);
#endif

