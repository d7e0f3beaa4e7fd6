// attention_swap_kernel<16, 3> for FP8 pools (dequantized in place).
#include "attention/swap.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kSwap16x3Fp8, (SwapSmem<16, 3>::kBytes), swap_threads(true),
                       attention_swap_kernel<16, 3, true, false>);
#endif

