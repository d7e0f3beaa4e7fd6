// attention_swap_kernel<16, 5>, the raw FP8 variant over FlashMLA caches.
#include "attention/swap.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kSwap16x5RawFlashMla, (SwapSmem<16, 5, true>::kBytes), swap_threads(true),
                       attention_swap_kernel<16, 5, true, true, kLayoutFlashMla>);
#endif
