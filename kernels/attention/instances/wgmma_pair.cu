// attention_wgmma_pair_kernel: 128-head blocks sharing each tile's rows.
// Defined here, not in wgmma.cuh, because a kernel that is not a template
// would be compiled again in every translation unit including the header.
#include "attention/wgmma.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
namespace {

// The cluster shape is a property of sm_90 code only (other device passes
// reject the attribute; their plans never name this kernel).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define UKV_PAIR_CLUSTER __cluster_dims__(1, 2, 1)
#else
#define UKV_PAIR_CLUSTER
#endif

// 128-head blocks whose tokens run one split: the token's two head blocks
// form a cluster and share each tile (WgProducer<true>): its conversion in
// FP8 plans, its copies in bf16 ones.
__global__ void UKV_PAIR_CLUSTER __launch_bounds__(wgmma_threads(true), 1)
    attention_wgmma_pair_kernel(ukv_attention_params p, SplitConfig cfg) {
  wgmma_attention<true, true>(p, cfg);
}

}  // namespace

UKV_ATTENTION_LAUNCHER(kWgmmaPair, (WgSmem::kBytes), wgmma_threads(true), attention_wgmma_pair_kernel);
#endif
