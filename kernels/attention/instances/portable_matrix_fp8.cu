// attention_portable_kernel, matrix variant, for FP8 pools.
#include "attention/portable.cuh"
#include "attention/launcher.cuh"

UKV_ATTENTION_LAUNCHER(kPortableMatrixFp8, (PortableSmem<true>::kBytes), kPortableThreads,
                       attention_portable_kernel<true, true>);

