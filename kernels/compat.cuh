// The vendor layer: the only files that name the GPU vendor's runtime, types,
// intrinsics and PTX. Kernel files use the ukv_* names and UKV_HAS_* feature
// macros these headers define: the vendor map (CUDA, HIP, or the host
// emulation of a HIP wave) and the PTX wrappers, each a no-op or absent where
// the target lacks the instruction.
#pragma once

#include "vendor/map.cuh"

#if !defined(UKV_WAVE_EMULATION)
#include "ptx/async_copy.cuh"
#include "ptx/grid.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/mma.cuh"
#include "ptx/numeric.cuh"
#include "ptx/wgmma.cuh"
#endif
