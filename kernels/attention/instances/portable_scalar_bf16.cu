// attention_portable_kernel, scalar variant, for bf16 pools.
#include "attention/portable.cuh"
#include "attention/launcher.cuh"

UKV_ATTENTION_LAUNCHER(kPortableScalarBf16, (PortableSmem<false>::kBytes), kPortableThreads,
                       attention_portable_kernel<false, false>);

