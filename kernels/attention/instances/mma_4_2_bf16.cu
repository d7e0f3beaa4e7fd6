// attention_kernel<4, 2> for bf16 pools.
#include "attention/mma.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kMma4x2Bf16, (Smem<4, 2>::kBytes), kThreads, attention_kernel<4, 2, false>);
#endif

