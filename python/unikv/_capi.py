"""The C API of unikv.h through ctypes: the structs, the enums and the 55
function prototypes, and how the shared library is found.

Layer of record: every struct here mirrors its C twin field by field (the
tests compile a C program that checks sizeof and every offsetof against the
installed header). The friendly API is in ``unikv/__init__.py``.
"""

import ctypes
import ctypes.util
import os
import threading
from ctypes import (
    CFUNCTYPE,
    POINTER,
    c_char_p,
    c_double,
    c_float,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)

# The header version these bindings mirror (UNIKV_VERSION_*). The library
# must have the same major and minor version: the structs are only promised
# to be stable within one.
VERSION_MAJOR = 0
VERSION_MINOR = 1

# ---------------------------------------------------------------------------
# Enums (uint32_t values of unikv.h)

STATUS_NAMES = {
    0: "UNIKV_OK",
    1: "UNIKV_NULL_ARGUMENT",
    2: "UNIKV_BAD_STRUCT_SIZE",
    3: "UNIKV_BAD_ENUM",
    4: "UNIKV_BAD_DTYPE",
    5: "UNIKV_BAD_SHAPE",
    6: "UNIKV_BAD_STRIDE",
    7: "UNIKV_BAD_ALIGNMENT",
    8: "UNIKV_CAPACITY_EXCEEDED",
    9: "UNIKV_OUT_OF_RANGE",
    10: "UNIKV_INVALID_STATE",
    11: "UNIKV_BACKEND_UNAVAILABLE",
    12: "UNIKV_OUT_OF_MEMORY",
    13: "UNIKV_GPU_ERROR",
    14: "UNIKV_INTERNAL",
    15: "UNIKV_INVALID_ARGUMENT",
    16: "UNIKV_INVALID_HANDLE",
    17: "UNIKV_OVERLAPPING_BUFFERS",
}

DTYPE_BF16 = 1
DTYPE_F16 = 2
DTYPE_F32 = 3
DTYPE_I32 = 4
DTYPE_I64 = 5
DTYPE_U8 = 6
DTYPE_FP8_E4M3FN = 7
DTYPE_FP8_E4M3FNUZ = 8

BACKEND_AUTO = 0
BACKEND_CPU = 1
BACKEND_CUDA = 2
BACKEND_ROCM = 3
BACKEND_GPU = 4  # a request only: CUDA or ROCm, whichever is compiled in; never reported

# unikv_log_level
LOG_ERROR = 1
LOG_WARNING = 2
LOG_INFO = 3

# unikv_kernel_family
KERNEL_CPU_REFERENCE = 1
KERNEL_MMA = 2
KERNEL_WGMMA_HEADS_ON_M = 3
KERNEL_WGMMA_HEADS_ON_N = 4
KERNEL_PORTABLE_SCALAR = 5
KERNEL_PORTABLE_MATRIX = 6

# unikv_plan_kind
PLAN_DECODE = 1
PLAN_PREFILL = 2

# unikv_kv_layout: where a key source's rows live (docs/attention.md §6).
KV_LAYOUT_POOL = 0
KV_LAYOUT_FLASHMLA = 1
KV_LAYOUT_SCALED_FP8 = 2

# unikv_compressor
COMPRESSOR_KV = 0
COMPRESSOR_INDEXER = 1

COPY_HOST_TO_DEVICE = 0
COPY_DEVICE_TO_HOST = 1
COPY_DEVICE_TO_DEVICE = 2

# ---------------------------------------------------------------------------
# Structs


class Tensor(ctypes.Structure):
    """unikv_tensor: data pointer, dtype, rank, shape and strides (elements)."""

    _c_name_ = "unikv_tensor"
    _fields_ = [
        ("data", c_void_p),
        ("dtype", c_uint32),
        ("ndim", c_uint32),
        ("shape", c_int64 * 4),
        ("strides", c_int64 * 4),
    ]

    def __repr__(self):
        n = self.ndim
        return "Tensor(data=0x%x, dtype=%d, shape=%s, strides=%s)" % (
            self.data or 0,
            self.dtype,
            list(self.shape[:n]),
            list(self.strides[:n]),
        )


class _Sized(ctypes.Structure):
    """A struct whose first field is ``size_t struct_size``, set on creation."""

    def __init__(self, **fields):
        super().__init__()
        self.struct_size = ctypes.sizeof(type(self))
        for name, value in fields.items():
            setattr(self, name, value)


def _sized(c_name, fields):
    return type(
        "".join(part.capitalize() for part in c_name[len("unikv_") :].split("_")),
        (_Sized,),
        {"_c_name_": c_name, "_fields_": [("struct_size", c_size_t)] + fields},
    )


T = Tensor
ContextOptions = _sized(
    "unikv_context_options",
    [("backend", c_uint32), ("device", c_int32), ("cpu_threads", c_uint32), ("validate", c_uint32)],
)
ContextInfo = _sized(
    "unikv_context_info",
    [("backend", c_uint32), ("device", c_int32), ("cpu_threads", c_uint32), ("validate", c_uint32)],
)
PoolParams = _sized(
    "unikv_pool_params",
    [
        ("compress_ratios", POINTER(c_uint32)),
        ("layer_buffers", POINTER(c_void_p)),
        ("num_layers", c_uint32),
        ("max_requests", c_uint32),
        ("window", c_uint32),
        ("spec_extra", c_uint32),
        ("c128_blocks", c_uint32),
        ("kv_dtype", c_uint32),
        ("rope_buffers", POINTER(c_void_p)),
        ("compressor_state", c_uint32),
        ("c4_state_ring", c_uint32),
        ("c128_state_ring", c_uint32),
        ("reserved", c_uint32),
        ("state_buffers", POINTER(c_void_p)),
    ],
)
PoolInfo = _sized(
    "unikv_pool_info",
    [
        ("swa_rows", c_uint64),
        ("row_bytes", c_uint64),
        ("num_layers", c_uint32),
        ("max_requests", c_uint32),
        ("window", c_uint32),
        ("ring", c_uint32),
        ("c128_blocks", c_uint32),
        ("slots_in_use", c_uint32),
        ("kv_dtype", c_uint32),
        ("owns_memory", c_uint32),
        ("c4_state_ring", c_uint32),
        ("c128_state_ring", c_uint32),
    ],
)
PoolLayerInfo = _sized(
    "unikv_pool_layer_info",
    [
        ("data", c_void_p),
        ("rows", c_uint64),
        ("swa_rows", c_uint64),
        ("compressed_rows", c_uint64),
        ("bytes", c_uint64),
        ("compress_ratio", c_uint32),
        ("reserved", c_uint32),
        ("rope_data", c_void_p),
        ("rope_bytes", c_uint64),
        ("state_data", c_void_p),
        ("state_bytes", c_uint64),
    ],
)
AttentionPlanParams = _sized(
    "unikv_attention_plan_params",
    [
        ("max_tokens", c_uint32),
        ("num_heads", c_uint32),
        ("head_dim", c_uint32),
        ("q_dtype", c_uint32),
        ("kv_dtype", c_uint32),
        ("out_dtype", c_uint32),
        ("kv_layout", c_uint32),
        ("reserved", c_uint32),
    ],
)


class KvCache(ctypes.Structure):
    """unikv_kv_cache: a key source's rows in a caller-owned cache (all zero:
    the call's default rows, a pool layer or extend_kv)."""

    _c_name_ = "unikv_kv_cache"
    _fields_ = [
        ("layout", c_uint32),
        ("fp8_dtype", c_uint32),
        ("page_size", c_uint32),
        ("reserved", c_uint32),
        ("data", T),
        ("scales", T),
    ]


DecodeArgs = _sized(
    "unikv_decode_args",
    [("q", T), ("indices", T), ("indptr", T), ("sink", T), ("out", T), ("lse", T)]
    + [("layer", c_uint32), ("num_tokens", c_uint32), ("softmax_scale", c_float), ("reserved", c_uint32)]
    + [("rope_table", T), ("positions", T)]
    + [("kv", KvCache), ("extra_kv", KvCache), ("extra_indices", T), ("extra_indptr", T)],
)
PrefillArgs = _sized(
    "unikv_prefill_args",
    [("q", T), ("indices", T), ("indptr", T), ("sink", T), ("out", T), ("lse", T)]
    + [("extend_kv", T), ("extend_indices", T), ("extend_indptr", T)]
    + [("layer", c_uint32), ("num_tokens", c_uint32), ("softmax_scale", c_float), ("reserved", c_uint32)]
    + [("kv", KvCache), ("extend_cache", KvCache)],
)
MergeArgs = _sized(
    "unikv_merge_args",
    [("parts_out", T), ("parts_lse", T), ("sink", T), ("out", T), ("lse", T)]
    + [("num_tokens", c_uint32), ("reserved", c_uint32)],
)
StoreFlashmlaArgs = _sized(
    "unikv_store_flashmla_args",
    [("cache", T), ("kv", T), ("loc", T)]
    + [("page_size", c_uint32), ("cache_dtype", c_uint32), ("num_tokens", c_uint32), ("reserved", c_uint32)],
)
StoreScaledFp8Args = _sized(
    "unikv_store_scaled_fp8_args",
    [("codes", T), ("scales", T), ("kv", T), ("loc", T)]
    + [("cache_dtype", c_uint32), ("scale_divisor", c_uint32), ("num_tokens", c_uint32), ("reserved", c_uint32)],
)
StoreIndexerArgs = _sized(
    "unikv_store_indexer_args",
    [("cache", T), ("key", T), ("loc", T)]
    + [("page_size", c_uint32), ("cache_dtype", c_uint32), ("num_tokens", c_uint32), ("reserved", c_uint32)],
)
DecodeStreamsArgs = _sized(
    "unikv_decode_streams_args",
    [("batch_id", T), ("req_slots", T), ("positions", T), ("c128_page_indices", T)]
    + [("swa_indptr", T), ("swa_indices", T), ("hca_indptr", T), ("hca_indices", T)]
    + [("csa_indptr", T), ("csa_indices", T), ("num_tokens", c_uint32), ("csa_topk", c_uint32)],
)
CsaTailArgs = _sized(
    "unikv_csa_tail_args",
    [("batch_id", T), ("positions", T), ("csa_page_indices", T), ("csa_indptr", T), ("csa_indices", T)]
    + [("num_tokens", c_uint32), ("reserved", c_uint32)],
)
PrefillStreamsArgs = _sized(
    "unikv_prefill_streams_args",
    [("batch_id", T), ("req_slots", T), ("positions", T), ("chunk_start", T), ("extend_start", T)]
    + [("page_indices", T), ("prefix_indptr", T), ("prefix_indices", T), ("extend_indptr", T)]
    + [("extend_indices", T), ("num_tokens", c_uint32), ("compress_ratio", c_uint32)],
)
IndexerPrepareQArgs = _sized(
    "unikv_indexer_prepare_q_args",
    [("q", T), ("weights", T), ("rope_table", T), ("positions", T), ("q_fp8", T), ("weights_out", T)]
    + [("q_dtype", c_uint32), ("num_tokens", c_uint32), ("num_heads", c_uint32), ("weight_scale", c_float)],
)
IndexerPrepareKArgs = _sized(
    "unikv_indexer_prepare_k_args",
    [("cache", T), ("key", T), ("norm_weight", T), ("rope_table", T), ("positions", T), ("loc", T)]
    + [("page_size", c_uint32), ("cache_dtype", c_uint32), ("num_tokens", c_uint32), ("eps", c_float)]
    + [("reserved", c_uint32)],
)
IndexerTopkArgs = _sized(
    "unikv_indexer_topk_args",
    [("q_fp8", T), ("weights", T), ("cache", T), ("page_table", T), ("batch_id", T), ("positions", T)]
    + [("logits", T), ("topk_indices", T)]
    + [("cache_dtype", c_uint32), ("num_tokens", c_uint32), ("num_heads", c_uint32), ("topk", c_uint32)],
)
CsaStream = _sized("unikv_csa_stream", [("csa_indptr", T), ("csa_indices", T)])
PrepareQkvArgs = _sized(
    "unikv_prepare_qkv_args",
    [("q_in", T), ("q_out", T), ("kv_in", T), ("kv_weight", T), ("kv_out", T), ("rope_table", T)]
    + [("positions", T), ("rows", T)]
    + [("layer", c_uint32), ("num_tokens", c_uint32), ("num_heads", c_uint32)]
    + [("q_eps", c_float), ("kv_eps", c_float), ("reserved", c_uint32)],
)


class RopeYarn(ctypes.Structure):
    """unikv_rope_yarn (no struct_size: it is embedded in unikv_rope_params)."""

    _c_name_ = "unikv_rope_yarn"
    _fields_ = [
        ("factor", c_double),
        ("original_max_position", c_uint64),
        ("beta_fast", c_double),
        ("beta_slow", c_double),
    ]


RopeParams = _sized("unikv_rope_params", [("base", c_double), ("yarn", RopeYarn)])
InverseRopeArgs = _sized(
    "unikv_inverse_rope_args",
    [("x", T), ("positions", T), ("rope_table", T), ("num_tokens", c_uint32), ("num_heads", c_uint32)],
)
HashTopkArgs = _sized(
    "unikv_hash_topk_args",
    [("router_logits", T), ("input_ids", T), ("tid2eid", T), ("topk_weights", T), ("topk_ids", T)]
    + [("num_real_tokens", T), ("num_real_tokens_host", c_uint32), ("num_tokens", c_uint32)]
    + [("num_shared", c_uint32), ("routed_scaling_factor", c_float)],
)
StoreSwaArgs = _sized(
    "unikv_store_swa_args",
    [("kv", T), ("batch_id", T), ("req_slots", T), ("positions", T), ("final_pos", T)]
    + [("layer", c_uint32), ("num_tokens", c_uint32)],
)
CompressArgs = _sized(
    "unikv_compress_args",
    [("kv_score", T), ("ape", T), ("norm_weight", T), ("rope_table", T), ("batch_id", T), ("req_slots", T)]
    + [("positions", T), ("loc", T), ("cache", T)]
    + [("layer", c_uint32), ("compressor", c_uint32), ("num_tokens", c_uint32), ("cache_dtype", c_uint32)]
    + [("page_size", c_uint32), ("eps", c_float)],
)
CompressorInfo = _sized(
    "unikv_compressor_info",
    [
        ("state", c_void_p),
        ("offset_bytes", c_uint64),
        ("bytes", c_uint64),
        ("slot_bytes", c_uint64),
        ("row_floats", c_uint32),
        ("score_offset", c_uint32),
        ("ring", c_uint32),
        ("head_dim", c_uint32),
        ("compress_ratio", c_uint32),
        ("num_slots", c_uint32),
        ("max_rollback", c_uint32),
        ("reserved", c_uint32),
    ],
)
StoreCompressedArgs = _sized(
    "unikv_store_compressed_args",
    [("kv", T), ("loc", T), ("layer", c_uint32), ("num_rows", c_uint32)],
)
Capabilities = _sized(
    "unikv_capabilities",
    [
        ("backends", c_uint32),
        ("gpu_devices", c_uint32),
        ("kv_dtypes", c_uint32),
        ("fp8_formats", c_uint32),
        ("ptx_embedded", c_uint32),
        ("max_heads", c_uint32),
        ("head_dim", c_uint32),
        ("nope_dim", c_uint32),
        ("rope_dim", c_uint32),
        ("max_tensor_dims", c_uint32),
        ("page_tokens", c_uint32),
        ("max_indexer_topk", c_uint32),
        ("max_indexer_heads", c_uint32),
        ("indexer_head_dim", c_uint32),
        ("max_routing_slots", c_uint32),
        ("max_cpu_threads", c_uint32),
        ("max_tokens", c_uint32),
        ("reserved", c_uint32),
        ("gpu_archs", c_char_p),
    ],
)
PlanInfo = _sized(
    "unikv_plan_info",
    [
        ("kind", c_uint32),
        ("backend", c_uint32),
        ("kernel_family", c_uint32),
        ("max_tokens", c_uint32),
        ("num_heads", c_uint32),
        ("kv_dtype", c_uint32),
        ("head_block", c_uint32),
        ("head_blocks", c_uint32),
        ("max_splits", c_uint32),
        ("cluster_merge", c_uint32),
        ("stages", c_uint32),
        ("dependent_launch", c_uint32),
        ("raw_fp8_variant", c_uint32),
        ("sm_count", c_uint32),
        ("workspace_bytes", c_uint64),
        ("long_key_splits", c_uint32),
        ("long_keys", c_uint32),
    ],
)

# unikv_log_fn: void (*)(void* user, uint32_t level, const char* message).
LogFn = CFUNCTYPE(None, c_void_p, c_uint32, c_char_p)

# Every struct, for the layout test.
STRUCTS = [
    Tensor,
    ContextOptions,
    ContextInfo,
    PoolParams,
    PoolInfo,
    PoolLayerInfo,
    AttentionPlanParams,
    KvCache,
    DecodeArgs,
    PrefillArgs,
    MergeArgs,
    StoreFlashmlaArgs,
    StoreScaledFp8Args,
    StoreIndexerArgs,
    DecodeStreamsArgs,
    CsaTailArgs,
    PrefillStreamsArgs,
    IndexerPrepareQArgs,
    IndexerPrepareKArgs,
    IndexerTopkArgs,
    CsaStream,
    PrepareQkvArgs,
    RopeYarn,
    RopeParams,
    InverseRopeArgs,
    HashTopkArgs,
    StoreSwaArgs,
    StoreCompressedArgs,
    CompressArgs,
    CompressorInfo,
    Capabilities,
    PlanInfo,
]

# ---------------------------------------------------------------------------
# Functions: name -> (restype, argtypes). Handles are opaque void pointers.

_ST = c_uint32  # unikv_status
_H = c_void_p  # any handle
_P = c_void_p  # memory / stream


def _p(t):
    return POINTER(t)


FUNCTIONS = {
    "unikv_status_string": (c_char_p, [c_uint32]),
    "unikv_last_error_message": (c_char_p, []),
    "unikv_version": (c_uint32, []),
    "unikv_version_string": (c_char_p, []),
    "unikv_context_create": (_ST, [_p(ContextOptions), _p(c_void_p)]),
    "unikv_context_destroy": (None, [_H]),
    "unikv_context_get_info": (_ST, [_H, _p(ContextInfo)]),
    "unikv_memory_alloc": (_ST, [_H, c_size_t, _p(c_void_p)]),
    "unikv_memory_free": (_ST, [_H, _P]),
    "unikv_memory_copy": (_ST, [_H, _P, _P, c_size_t, c_uint32, _P]),
    "unikv_memory_set": (_ST, [_H, _P, c_uint8, c_size_t, _P]),
    "unikv_stream_synchronize": (_ST, [_H, _P]),
    "unikv_pool_create": (_ST, [_H, _p(PoolParams), _p(c_void_p)]),
    "unikv_pool_destroy": (None, [_H]),
    "unikv_pool_get_info": (_ST, [_H, _p(PoolInfo)]),
    "unikv_pool_get_layer": (_ST, [_H, c_uint32, _p(PoolLayerInfo)]),
    "unikv_pool_acquire_slot": (_ST, [_H, _p(c_uint32)]),
    "unikv_pool_release_slot": (_ST, [_H, c_uint32]),
    "unikv_decode_plan_create": (_ST, [_H, _p(AttentionPlanParams), _p(c_void_p)]),
    "unikv_decode_plan_destroy": (None, [_H]),
    "unikv_decode_plan_workspace_size": (_ST, [_H, _p(c_size_t)]),
    "unikv_prefill_plan_create": (_ST, [_H, _p(AttentionPlanParams), _p(c_void_p)]),
    "unikv_prefill_plan_destroy": (None, [_H]),
    "unikv_prefill_plan_workspace_size": (_ST, [_H, _p(c_size_t)]),
    "unikv_sparse_decode": (_ST, [_H, _H, _p(DecodeArgs), _P, c_size_t, _P]),
    "unikv_sparse_prefill": (_ST, [_H, _H, _p(PrefillArgs), _P, c_size_t, _P]),
    "unikv_attention_merge": (_ST, [_H, _p(MergeArgs), _P]),
    "unikv_store_flashmla": (_ST, [_H, _p(StoreFlashmlaArgs), _P]),
    "unikv_store_scaled_fp8": (_ST, [_H, _p(StoreScaledFp8Args), _P]),
    "unikv_store_indexer": (_ST, [_H, _p(StoreIndexerArgs), _P]),
    "unikv_build_decode_streams": (_ST, [_H, _p(DecodeStreamsArgs), _P]),
    "unikv_fill_csa_tail": (_ST, [_H, _p(CsaTailArgs), _P]),
    "unikv_build_prefill_streams": (_ST, [_H, _p(PrefillStreamsArgs), _P]),
    "unikv_indexer_prepare_q": (_ST, [_H, _p(IndexerPrepareQArgs), _P]),
    "unikv_indexer_prepare_k": (_ST, [_H, _p(IndexerPrepareKArgs), _P]),
    "unikv_indexer_topk": (_ST, [_H, _p(IndexerTopkArgs), _P]),
    "unikv_indexer_topk_from_logits": (_ST, [_H, _p(IndexerTopkArgs), _P]),
    "unikv_indexer_topk_fill_csa": (_ST, [_H, _p(IndexerTopkArgs), _p(CsaStream), _P]),
    "unikv_prepare_qkv": (_ST, [_H, _p(PrepareQkvArgs), _P]),
    "unikv_prepare_qkv_indexer_q": (_ST, [_H, _p(PrepareQkvArgs), _p(IndexerPrepareQArgs), _P]),
    "unikv_rope_table": (_ST, [_p(RopeParams), c_uint32, _p(c_float), c_size_t]),
    "unikv_inverse_rope": (_ST, [_H, _p(InverseRopeArgs), _P]),
    "unikv_hash_topk": (_ST, [_H, _p(HashTopkArgs), _P]),
    "unikv_store_swa": (_ST, [_H, _p(StoreSwaArgs), _P]),
    "unikv_store_compressed": (_ST, [_H, _p(StoreCompressedArgs), _P]),
    "unikv_pool_params_get_info": (_ST, [_p(PoolParams), _p(PoolInfo)]),
    "unikv_pool_params_get_layer": (_ST, [_p(PoolParams), c_uint32, _p(PoolLayerInfo)]),
    "unikv_get_capabilities": (_ST, [_p(Capabilities)]),
    "unikv_decode_plan_get_info": (_ST, [_H, _p(PlanInfo)]),
    "unikv_prefill_plan_get_info": (_ST, [_H, _p(PlanInfo)]),
    "unikv_decode_plan_describe": (_ST, [_H, _P, c_size_t, _p(c_size_t)]),
    "unikv_prefill_plan_describe": (_ST, [_H, _P, c_size_t, _p(c_size_t)]),
    "unikv_set_log_callback": (_ST, [LogFn, c_void_p]),
    "unikv_pool_release_slot_async": (_ST, [_H, c_uint32, _P]),
    "unikv_pool_get_compressor": (_ST, [_H, c_uint32, c_uint32, _p(CompressorInfo)]),
    "unikv_pool_params_get_compressor": (_ST, [_p(PoolParams), c_uint32, c_uint32, _p(CompressorInfo)]),
    "unikv_compress_decode": (_ST, [_H, _p(CompressArgs), _P]),
    "unikv_compress_prefill": (_ST, [_H, _p(CompressArgs), _P]),
}

# ---------------------------------------------------------------------------
# Loading


def _candidates():
    """Where the library is looked for, in order."""
    env = os.environ.get("UNIKV_LIBRARY")
    if env:
        # An explicit choice is final: a wrong path is an error, not a fallback.
        return [os.path.join(env, "libunikv.so") if os.path.isdir(env) else env], True
    here = os.path.dirname(os.path.abspath(__file__))
    found = []
    # Next to the package: inside it, or a lib/ folder beside it (an install
    # prefix holding both the library and the package).
    for folder in (here, os.path.dirname(here), os.path.join(os.path.dirname(here), "lib")):
        path = os.path.join(folder, "libunikv.so")
        if os.path.exists(path):
            found.append(path)
    # Then the system loader (LD_LIBRARY_PATH, the ld.so cache).
    found.append("libunikv.so")
    system = ctypes.util.find_library("unikv")
    if system:
        found.append(system)
    return found, False


_lock = threading.Lock()
_lib = None


def load():
    """The loaded library with every prototype set (loaded once)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        paths, explicit = _candidates()
        errors = []
        lib = None
        for path in paths:
            try:
                lib = ctypes.CDLL(path)
                break
            except OSError as e:
                errors.append("%s: %s" % (path, e))
                if explicit:
                    break
        if lib is None:
            raise OSError(
                "unikv: cannot load libunikv.so (set UNIKV_LIBRARY to its path): " + "; ".join(errors)
            )
        for name, (restype, argtypes) in FUNCTIONS.items():
            f = getattr(lib, name)
            f.restype = restype
            f.argtypes = argtypes
        v = lib.unikv_version()
        if v // 1000000 != VERSION_MAJOR or v // 1000 % 1000 != VERSION_MINOR:
            raise OSError(
                "unikv: %s is version %s; these bindings need %d.%d.x"
                % (getattr(lib, "_name", "?"), lib.unikv_version_string().decode(), VERSION_MAJOR, VERSION_MINOR)
            )
        _lib = lib
        return lib
