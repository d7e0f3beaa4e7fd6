// The attention plan (kernel choice, split cap, cluster merge, workspace)
// and the C entry points that plan and launch attention. The kernels are
// reached through their launchers (launcher.cuh, instances/).
#include "attention/launcher.cuh"
#include "attention/portable.cuh"  // kPortableHeads: the portable plans' head blocks

namespace {

// Keys a token from which heads-on-N and FP8 plans take their long splits: at
// 2176 keys they won at some shapes and lost at others, at 8320 they won at
// every one where plans have them (bench/notes/v46.md).
constexpr int kLongKeys = 4096;

// Split cap S for a plan: one wave of resident CTAs when max_tokens tokens run,
// so small batches spread each token over many SMs without a second wave, and
// large ones write no partials at all.
int split_cap(int max_tokens, int head_blocks, int resident_ctas, int max_splits) {
  const int want = resident_ctas / (max_tokens * head_blocks);
  return want < 1 ? 1 : (want > max_splits ? max_splits : want);
}

// The head block of a small batch, 0 for the default (64 heads, or all of
// them up to 32). A few tokens fill few SMs however far their keys are split
// (16 splits at most, in one cluster), so their heads spread over 16- or
// 32-head blocks of the heads-on-N kernels instead: more blocks gather the
// same keys at once, each with less math per tile. Smaller blocks also gather
// (and for FP8, decode) each row more often, which loses once the blocks
// outnumber the SMs, and first at long keys (bench/notes/v38.md). bf16 rows,
// whose 64-head kernel decodes nothing, gain at T = 1 only. FP8 rows take
// 32-head blocks while one wave of them (one 512-thread block per SM) holds
// the batch: faster at every measured shape but 64 heads at 8320 keys and
// T = 16 / 64 (2-5% slower; 7-40% faster at 640-2176 keys).
int small_batch_head_block(int max_tokens, int num_heads, int kv_fp8, int sms) {
  if (num_heads <= 16) return 0;
  switch (kv_fp8) {
    case 0: return max_tokens > 1 ? 0 : num_heads > 64 ? 32 : 16;  // bf16 rows
    case 1:                                                         // FP8 pool rows
    case 2:                                                         // FlashMLA tokens (the same kernels)
      if (max_tokens == 1) return 16;
      return num_heads > 32 && (int64_t)max_tokens * ukv::cdiv(num_heads, 32) <= sms ? 32 : 0;
    default: return 0;  // scaled FP8 rows: not measured
  }
}

// Lets `kernel` use its dynamic shared memory (AttentionLauncher::configure).
int configure(const AttentionLauncher& kernel) {
  const ukv_error_t e = kernel.configure();
  return e == UKV_SUCCESS ? UKV_SHIM_OK : ukv::report(e, "set attention shared memory");
}

// Test hook (unikv_gpu_test_plan_fallbacks): plans created on this thread skip
// the cluster merge and/or the wgmma kernel, so the tests also cover the paths
// that sm_80 and ROCm take.
thread_local bool g_no_cluster = false;
thread_local bool g_no_wgmma = false;
// Test hook (unikv_gpu_test_plan_portable): plans use the portable kernel's
// scalar (1) or matrix (2) variant.
thread_local int g_portable = 0;

// The portable variant a plan for `device` takes (0: none). A HIP build has
// no other kernel: the matrix variant where the device has MFMA, else scalar.
int portable_variant(int device, int* variant) {
#if defined(__HIPCC__)
  bool mfma = false;
  if (ukv_error_t e = ukv_device_has_mfma(device, &mfma)) return ukv::report(e, "device properties");
  *variant = g_portable != 0 ? g_portable : mfma ? 2 : 1;
#else
  (void)device;
  *variant = g_portable;
#endif
  return UKV_SHIM_OK;
}

// The raw FP8 variant a call may take (raw_variant): none, or the one over
// e4m3fn pools or over e4m3fn FlashMLA caches.
enum RawVariant : int { kRawNone = 0, kRawPool = 1, kRawFlashMla = 2 };

// The kernel instantiation a plan names, by its launcher. `raw`: the variant
// the heads-on-N kernels may take (raw_variant).
int plan_kernel(const ukv_attention_plan& plan, [[maybe_unused]] RawVariant raw, const AttentionLauncher** kernel) {
  const bool fp8 = plan.kv_fp8 != 0;
  if (plan.portable != 0) {
    *kernel = plan.portable == 2 ? (fp8 ? &kPortableMatrixFp8 : &kPortableMatrixBf16)
                                 : (fp8 ? &kPortableScalarFp8 : &kPortableScalarBf16);
    return UKV_SHIM_OK;
  }
#if defined(UKV_NVIDIA_KERNELS)
  switch (plan.wgmma) {
    case 64: {
      // bf16 plans of enough tokens take the kernel with producer warpgroups
      // too (they copy bf16 rows, no conversion): from 128 tokens at 64 heads
      // (there up to 9% faster than the gather kernel, and 2-7% more since
      // its producers skip the conversion rounds), from 16 at 128 heads, two
      // head blocks a token (T = 64 3-14% faster; T = 16 1.2% slower at 640
      // keys, 13% faster at 8320). Smaller plans, whose CTAs have few tiles,
      // keep the gather kernel (bench/notes/v42.md 42a, v43.md 43b, 43c).
      const int producer_tokens = plan.head_blocks > 1 ? 16 : 128;
      if (plan.pair != 0) {
        *kernel = &kWgmmaPair;
      } else if (fp8) {
        *kernel = &kWgmmaProducers;
      } else {
        *kernel = plan.max_tokens >= producer_tokens ? &kWgmmaProducers : &kWgmmaBf16;
      }
      return UKV_SHIM_OK;
    }
    case 16:
      // FP8 plans take the raw variant with five stages, or three (the
      // in-place producer pipeline) when a source holds bf16 rows.
      if (fp8 && raw != kRawNone) {
        *kernel = raw == kRawFlashMla ? &kSwap16x5RawFlashMla : &kSwap16x5Raw;
      } else if (!fp8 && plan.stages == 1) {
        *kernel = &kSwap16x1Bf16;
      } else {
        *kernel = fp8 ? &kSwap16x3Fp8 : &kSwap16x3Bf16;
      }
      return UKV_SHIM_OK;
    case 32:
      if (fp8 && raw != kRawNone) {
        *kernel = raw == kRawFlashMla ? &kRoles32x4RawFlashMla : &kRoles32x4Raw;
      } else {
        *kernel = fp8 ? &kSwap32x2Fp8 : &kSwap32x2Bf16;
      }
      return UKV_SHIM_OK;
    default: break;
  }
  switch (plan.block_m_tiles * 8 + plan.stages) {
    case 1 * 8 + 1: *kernel = fp8 ? &kMma1x1Fp8 : &kMma1x1Bf16; return UKV_SHIM_OK;
    case 1 * 8 + 3: *kernel = fp8 ? &kMma1x3Fp8 : &kMma1x3Bf16; return UKV_SHIM_OK;
    case 2 * 8 + 2: *kernel = fp8 ? &kMma2x2Fp8 : &kMma2x2Bf16; return UKV_SHIM_OK;
    case 3 * 8 + 2: *kernel = fp8 ? &kMma3x2Fp8 : &kMma3x2Bf16; return UKV_SHIM_OK;
    case 4 * 8 + 2: *kernel = fp8 ? &kMma4x2Fp8 : &kMma4x2Bf16; return UKV_SHIM_OK;
    default: break;
  }
#endif
  ukv::set_error("attention plan names no kernel instantiation");
  return UKV_SHIM_INVALID;
}

// The raw variant a call takes: every key source an e4m3fn pool, or every
// one an e4m3fn FlashMLA cache (host-side arguments, so the kernel choice
// still depends only on what a graph captures). e4m3fnuz rows (the AMD
// format), scaled rows, and calls with bf16 rows or mixed layouts take the
// in-place kernels, which decode all of them.
RawVariant raw_variant(const ukv_attention_params& p) {
  if (p.num_sources == 0) return kRawNone;
  const int layout = p.src[0].layout;
  if (layout != kLayoutPool && layout != kLayoutFlashMla) return kRawNone;
  for (int s = 0; s < p.num_sources; ++s)
    if (p.src[s].kv.fp8 == 0 || p.src[s].kv.fp8_format != UKV_FP8_E4M3FN || p.src[s].layout != layout)
      return kRawNone;
  return layout == kLayoutFlashMla ? kRawFlashMla : kRawPool;
}

// Whether a call takes the plan's long splits: a choice by capture-time
// shapes only (the index capacity per token bounds its keys).
bool long_path(const ukv_attention_plan& plan, const ukv_attention_params& p) {
  if (plan.long_splits == 0) return false;
  int64_t capacity = 0;
  for (int s = 0; s < p.num_sources; ++s) capacity += p.src[s].capacity;
  return capacity >= (int64_t)plan.long_keys * p.num_tokens;
}

}  // namespace

extern "C" {

// Chooses the launch configuration for capture-time shapes, configures the
// kernels, and reports the workspace every launch through the plan needs.
// kv_fp8: 0 bf16 rows, 1 FP8 pool rows, 2 FlashMLA tokens, 3 scaled FP8 rows.
int unikv_gpu_attention_plan(int device, int max_tokens, int num_heads, int kv_fp8, ukv_attention_plan* plan) {
  UKV_ENTRY(device, {
    int smem_optin = 0;
    const ukv_error_t e = ukv_device_get_attribute(&smem_optin, UKV_ATTR_MAX_SMEM_OPTIN, device);
    if (e != UKV_SUCCESS) return ukv::report(e, "device attribute");
    ukv::DeviceFacts facts;
    if (int r = ukv::device_facts(device, &facts)) return r;
    // sm90: the loaded kernels have sm_90's PDL wait and clusters (not the
    // portable PTX a newer GPU may run; DeviceFacts::image_arch).
    const int sms = facts.sms;
    const bool sm90 = facts.sm90_code();
    ukv_attention_plan pl{};
    pl.max_tokens = max_tokens;
    pl.num_heads = num_heads;
    pl.head_blocks = (int)ukv::cdiv(num_heads, 64);
    pl.block_m_tiles = (int)ukv::cdiv(ukv::cdiv(num_heads, pl.head_blocks), 16);
    pl.sm_count = sms;
    pl.dependent_launch = sm90 ? 1 : 0;
    pl.kv_fp8 = kv_fp8 ? 1 : 0;
    if (int r = portable_variant(device, &pl.portable)) return r;
    if (pl.portable != 0) {
      pl.head_blocks = (int)ukv::cdiv(num_heads, kPortableHeads);
      pl.block_m_tiles = kPortableHeads / 16;
    }
    const int small_hb = small_batch_head_block(max_tokens, num_heads, kv_fp8, sms);
    if (small_hb != 0 && facts.wgmma && !g_no_wgmma && pl.portable == 0) {
      pl.head_blocks = (int)ukv::cdiv(num_heads, small_hb);
      pl.block_m_tiles = small_hb / 16;
    }
    // Small head blocks of a large batch (CTAs for at least half the SMs): two
    // CTAs per SM with one stage each; measured better from T = 128 on, worse
    // at T <= 64 where CTAs have few tiles (bench/notes/v06.md).
    pl.stages = pl.block_m_tiles > 1 ? 2 : (2 * max_tokens * pl.head_blocks >= sms ? 1 : 3);
    // sm_90a: blocks of up to 32 heads run the heads-on-N wgmma kernel, 64-head
    // blocks the heads-on-M one; the rest (and other GPUs) the mma.sync kernel.
    // 16-head blocks of batches past one CTA per SM take the one-stage variant
    // at two CTAs per SM (bench/notes/v12.md).
    const bool swap = pl.block_m_tiles <= 2;
    // kv_fp8 == 3 (scaled FP8 rows): the 64-head FP8 wgmma kernels' producers
    // read pool rows and FlashMLA tokens only, so those blocks take the
    // in-place mma.sync kernel, which dequantizes every layout.
    const bool scaled = kv_fp8 == 3;
    const bool wgmma =
        (swap || (pl.block_m_tiles == 4 && !scaled)) && facts.wgmma && !g_no_wgmma && pl.portable == 0;
    pl.wgmma = !wgmma ? 0 : (swap ? 16 * pl.block_m_tiles : 64);
    // FP8 pools: the heads-on-N kernels dequantize on producer warps and keep
    // three stages at any batch (bench/notes/v15.md).
    if (pl.wgmma == 16) pl.stages = !kv_fp8 && max_tokens * pl.head_blocks > sms ? 1 : 3;
    if (pl.wgmma == 32) pl.stages = 2;
    // FP8 plans configure both kernels a call may take (raw_variant, of the
    // plan's layout; one where the plan's kernel has no raw variant); the
    // cluster choice below holds for each.
    const AttentionLauncher* variants[2] = {nullptr, nullptr};
    int num_variants = pl.kv_fp8 ? 2 : 1;
    for (int v = 0; v < num_variants; ++v) {
      const RawVariant raw = v == 0 ? kRawNone : kv_fp8 == 2 ? kRawFlashMla : kRawPool;
      if (int r = plan_kernel(pl, raw, &variants[v])) return r;
      if (v == 1 && variants[1] == variants[0]) {
        num_variants = 1;
        break;
      }
      const AttentionLauncher& x = *variants[v];
      if ((int)x.smem > smem_optin) {
        ukv::set_error("attention needs " + std::to_string(x.smem) +
                       " bytes of shared memory per block, the device allows " + std::to_string(smem_optin));
        return UKV_SHIM_INVALID;
      }
      if (int r = configure(x)) return r;
    }
    // Blocks of the portable kernel (52 or 59 KB of shared memory) fit two per SM.
    const int resident = sms * (pl.portable != 0 ? 2 : pl.stages == 1 ? 2 : 1);
    // sm_90+: a token's splits form one thread-block cluster and merge through
    // distributed shared memory (no workspace, no second kernel), at most 16 of
    // them; elsewhere, or when no such cluster can be scheduled, they go
    // through the workspace and the combine kernel.
    pl.cluster = 0;
    pl.max_splits = split_cap(max_tokens, pl.head_blocks, resident, kMaxSplits);
    if (sm90 && !g_no_cluster && pl.portable == 0) {
      // The most splits per token such that every (token, head block) cluster
      // is resident at once: a cluster needs its blocks on one GPC, so fewer
      // fit than resident / S (16-block clusters fit about one per GPC).
      const int want = split_cap(max_tokens, pl.head_blocks, resident, kMaxClusterSplits);
      for (int v = 0; v < num_variants && want > 1; ++v) {
        const ukv_error_t le = variants[v]->allow_large_clusters();
        if (le != UKV_SUCCESS) return ukv::report(le, "attention clusters");
      }
      for (int splits = want; splits >= 1; --splits) {
        int clusters = max_tokens * pl.head_blocks;
        for (int v = 0; v < num_variants && splits > 1; ++v) {
          int fit = 0;
          const ukv_error_t ce = variants[v]->max_active_clusters(splits, &fit);
          if (ce != UKV_SUCCESS) return ukv::report(ce, "attention cluster occupancy");
          clusters = fit < clusters ? fit : clusters;
        }
        if (clusters >= max_tokens * pl.head_blocks) {
          pl.cluster = 1;
          pl.max_splits = splits;
          break;
        }
      }
    }
    // 128-head blocks whose tokens run one split: the token's two head blocks
    // gather (FP8: and convert) half of every tile each and copy it to the
    // other (a cluster of two, attention_wgmma_pair_kernel; bench/notes/v31.md).
    // bf16 plans take it where they would take the producer kernel (from 16
    // tokens at 128 heads): each block then copies half the rows from L2,
    // 3-8% faster at T >= 64 than two blocks copying all of them
    // (bench/notes/v48.md 48d).
    // NVIDIA only: HIP plans never name a wgmma kernel.
#if defined(UKV_NVIDIA_KERNELS)
    if (pl.wgmma == 64 && pl.head_blocks == 2 && pl.max_splits == 1 && sm90 && !g_no_cluster &&
        variants[0] == &kWgmmaProducers) {
      pl.pair = 1;
      if (int r = configure(kWgmmaPair)) return r;
    }
#endif
    // Splits past what one resident cluster per (token, head block) allows,
    // merged through the workspace and the combine kernel instead (calls
    // choose, long_path): a cluster holds at most 16 blocks, and fewer once
    // all clusters must be resident, so a few tokens with long key lists kept
    // 8 or more tiles on each of few SMs (bench/notes/v46.md). Calls take
    // them from kLongKeys keys a token on, and bf16 blocks of the heads-on-M
    // kernels at any length where occupancy, not the 16-block cap, limited
    // their clusters (their pulled merge lost to the combine kernel at every
    // measured length there). FP8 plans have them only where they stay
    // within 16 splits (more, thinner FP8 splits measured slower); the pair
    // kernel has no workspace path.
    pl.long_splits = 0;
    pl.long_keys = 0;
    if (pl.cluster != 0 && pl.pair == 0) {
      const int wide = split_cap(max_tokens, pl.head_blocks, resident, kMaxSplits);
      const bool within_cluster = wide <= kMaxClusterSplits;
      if (wide > pl.max_splits && (pl.kv_fp8 == 0 || within_cluster)) {
        const bool heads_on_m = pl.wgmma != 16 && pl.wgmma != 32;
        pl.long_splits = wide;
        pl.long_keys = pl.kv_fp8 == 0 && heads_on_m && within_cluster ? 0 : kLongKeys;
      }
    }
    const int record_splits = pl.cluster == 0 ? pl.max_splits : pl.long_splits;
    const size_t records =
        record_splits > 1 ? (size_t)max_tokens * pl.head_blocks * record_splits : 0;
    pl.workspace_bytes = (int64_t)(records * partial_floats(16 * pl.block_m_tiles) * sizeof(float));
    *plan = pl;
    return UKV_SHIM_OK;
  })
}

int unikv_gpu_attention(int device, const ukv_attention_plan* plan, const ukv_attention_params* p, void* stream) {
  UKV_ENTRY(device, {
    if (p->num_tokens == 0) return UKV_SHIM_OK;
    ukv_stream_t s = (ukv_stream_t)stream;
    if (p->num_tokens > plan->max_tokens) {
      ukv::set_error("num_tokens exceeds the plan's max_tokens");
      return UKV_SHIM_INVALID;
    }
    const SplitConfig cfg =
        long_path(*plan, *p) ? SplitConfig{plan->long_splits, 0} : SplitConfig{plan->max_splits, plan->cluster};
    const AttentionLauncher* kernel = nullptr;
    if (int r = plan_kernel(*plan, raw_variant(*p), &kernel)) return r;
    // Launched early (PDL) so its launch overlaps the previous kernel's tail;
    // it waits for that kernel's memory before reading any input.
    const bool early = plan->dependent_launch != 0;
    const int cluster_z = cfg.cluster != 0 && cfg.splits > 1 ? cfg.splits : 1;
    const ukv_error_t launched =
        kernel->launch(dim3(p->num_tokens, plan->head_blocks, cfg.splits), s, early, cluster_z, *p, cfg);
    if (launched != UKV_SUCCESS) return ukv::report(launched, "attention_kernel");
    if (cfg.splits == 1 || cfg.cluster != 0) return UKV_SHIM_OK;
    const ukv_error_t e =
        launch_attention_combine(dim3(p->num_tokens, p->num_heads), s, early, *p, cfg, 16 * plan->block_m_tiles);
    return e == UKV_SUCCESS ? UKV_SHIM_OK : ukv::report(e, "combine_kernel");
  })
}

#if defined(UKV_TEST_HOOKS)
void unikv_gpu_test_plan_fallbacks(int no_cluster, int no_wgmma) {
  g_no_cluster = no_cluster != 0;
  g_no_wgmma = no_wgmma != 0;
}

void unikv_gpu_test_plan_portable(int variant) { g_portable = variant; }
#endif

}  // extern "C"
