// attention_swap_kernel<16, 5>, the raw FP8 variant.
#include "attention/swap.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kSwap16x5Raw, (SwapSmem<16, 5, true>::kBytes), swap_threads(true),
                       attention_swap_kernel<16, 5, true, true>);
#endif

