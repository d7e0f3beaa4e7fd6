// attention_portable_kernel, scalar variant, for FP8 pools.
#include "attention/portable.cuh"
#include "attention/launcher.cuh"

UKV_ATTENTION_LAUNCHER(kPortableScalarFp8, (PortableSmem<false>::kBytes), kPortableThreads,
                       attention_portable_kernel<true, false>);

