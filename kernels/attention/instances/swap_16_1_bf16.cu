// attention_swap_kernel<16, 1> for bf16 pools.
#include "attention/swap.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kSwap16x1Bf16, (SwapSmem<16, 1>::kBytes), swap_threads(false),
                       attention_swap_kernel<16, 1, false, false>);
#endif

