// attention_roles_kernel<32, 4>, the raw FP8 variant.
#include "attention/roles.cuh"
#include "attention/launcher.cuh"

#if defined(UKV_NVIDIA_KERNELS)
UKV_ATTENTION_LAUNCHER(kRoles32x4Raw, (RoleSmem<32, 4>::kBytes), kRoleThreads, attention_roles_kernel<32, 4>);
#endif

