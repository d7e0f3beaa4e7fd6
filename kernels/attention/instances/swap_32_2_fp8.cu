// attention_swap_kernel<32, 2> for FP8 pools (dequantized in place).
#include "attention/swap.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kSwap32x2Fp8, (SwapSmem<32, 2>::kBytes), swap_threads(true),
                       attention_swap_kernel<32, 2, true, false>);
#endif

