// attention_swap_kernel<16, 3> for bf16 pools.
#include "attention/swap.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kSwap16x3Bf16, (SwapSmem<16, 3>::kBytes), swap_threads(false),
                       attention_swap_kernel<16, 3, false, false>);
#endif

