// attention_portable_kernel, matrix variant, for bf16 pools.
#include "attention/portable.cuh"
#include "attention/launcher.cuh"

UKV_ATTENTION_LAUNCHER(kPortableMatrixBf16, (PortableSmem<true>::kBytes), kPortableThreads,
                       attention_portable_kernel<false, true>);

