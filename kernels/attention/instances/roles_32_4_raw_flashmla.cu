// attention_roles_kernel<32, 4> over FlashMLA caches (raw FP8 rows).
#include "attention/roles.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kRoles32x4RawFlashMla, (RoleSmem<32, 4>::kBytes), kRoleThreads,
                       attention_roles_kernel<32, 4, kLayoutFlashMla>);
#endif
