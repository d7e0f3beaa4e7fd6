// attention_swap_kernel<32, 2> for bf16 pools.
#include "attention/swap.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kSwap32x2Bf16, (SwapSmem<32, 2>::kBytes), swap_threads(false),
                       attention_swap_kernel<32, 2, false, false>);
#endif

