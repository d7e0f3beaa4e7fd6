"""unikv from Python: ctypes bindings over the installed libunikv.so.

Pure Python, no compile step. The library is found through the environment
variable ``UNIKV_LIBRARY`` (a file, or a folder holding libunikv.so), then
next to this package, then by the system loader.

Arrays go in as they are: NumPy arrays (the array interface), PyTorch tensors
(``data_ptr`` and strides, CPU or CUDA), anything with
``__cuda_array_interface__`` (CuPy, Numba) or ``__dlpack__``. They are turned
into ``unikv_tensor`` descriptors pointing at the caller's memory: nothing is
copied, and the memory must be where the context computes (host memory for
the CPU backend, device memory for CUDA). bf16 has no NumPy dtype: pass the
bits as a uint16 array with ``unikv.as_tensor(a, "bf16")`` (or any 2-byte
array; the same for the FP8 types with uint8).

Every launch takes ``stream=``: by default the current PyTorch CUDA stream
of the first CUDA tensor among the arguments (``torch.cuda.current_stream()``),
else the null stream; pass an integer handle, a ``torch.cuda.Stream`` or any
object with ``cuda_stream`` or ``ptr`` to choose one.

A failing call raises ``unikv.Error`` with the status code, its name, the C
function and the library's message naming the argument at fault.

Every C function has one wrapper (``tests/test_unikv.py`` checks it):

==============================================  ===============================
C function                                      Python
==============================================  ===============================
unikv_status_string, unikv_last_error_message,  status_string(), last_error_message(),
unikv_version, unikv_version_string,            version(), version_string(),
unikv_rope_table                                rope_table()
unikv_get_capabilities                          capabilities() -> dict
unikv_pool_params_get_info / _get_layer         pool_sizes(...) -> (PoolInfo, [PoolLayerInfo])
unikv_pool_params_get_compressor                compressor_sizes(...) -> CompressorInfo
unikv_set_log_callback                          set_log_callback(fn), unset_log_callback()
unikv_context_create / _destroy / _get_info     Context(...), Context.close(), .info()
unikv_memory_alloc / free / copy / set          Context.alloc() -> Buffer, Buffer.free(),
                                                Context.memory_copy(), .memory_set()
unikv_stream_synchronize                        Context.synchronize()
unikv_attention_merge, unikv_store_flashmla,    Context.attention_merge(**fields), ...
unikv_store_scaled_fp8,
unikv_store_indexer, unikv_indexer_prepare_q,
unikv_indexer_prepare_k, unikv_indexer_topk,
unikv_indexer_topk_from_logits,
unikv_inverse_rope, unikv_hash_topk
unikv_pool_create / _destroy / _get_info /      Context.create_pool(), Pool.close(),
_get_layer / _acquire_slot / _release_slot /    .info(), .layer(), .acquire_slot(), ...,
_release_slot_async / _get_compressor           .release_slot_async(), .compressor()
unikv_build_decode_streams, unikv_fill_csa_tail,  Pool.build_decode_streams(**fields), ...
unikv_indexer_topk_fill_csa,                    Pool.indexer_topk_fill_csa(csa_indptr, csa_indices,
                                                **fields)
unikv_build_prefill_streams, unikv_prepare_qkv,
unikv_prepare_qkv_indexer_q,                    Pool.prepare_qkv_indexer_q(indexer, **fields)
unikv_store_swa, unikv_store_compressed,
unikv_compress_decode, unikv_compress_prefill
unikv_decode_plan_create / _destroy /           Context.create_decode_plan(), .close(),
_workspace_size / _get_info / _describe,        .workspace_size, .info(), .describe(),
unikv_sparse_decode                             .sparse_decode(pool, ...)
unikv_prefill_plan_*, unikv_sparse_prefill      the same on PrefillPlan
==============================================  ===============================

Launch wrappers take the argument struct's fields as keyword arguments
(tensor fields accept arrays, scalar fields numbers; ``struct_size`` is set for
you). ``num_tokens`` (``num_rows``) and ``num_heads`` default to the leading
extents of the main tensor; everything else left out is zero / absent.
"""

import ctypes
import threading

from . import _capi
from ._capi import (  # noqa: F401  (re-exported)
    BACKEND_AUTO,
    BACKEND_CPU,
    BACKEND_CUDA,
    BACKEND_GPU,
    BACKEND_ROCM,
    COMPRESSOR_INDEXER,
    COMPRESSOR_KV,
    COPY_DEVICE_TO_DEVICE,
    COPY_DEVICE_TO_HOST,
    COPY_HOST_TO_DEVICE,
    DTYPE_BF16,
    DTYPE_F16,
    DTYPE_F32,
    DTYPE_FP8_E4M3FN,
    DTYPE_FP8_E4M3FNUZ,
    DTYPE_I32,
    DTYPE_I64,
    DTYPE_U8,
    KERNEL_CPU_REFERENCE,
    KERNEL_MMA,
    KERNEL_PORTABLE_MATRIX,
    KERNEL_PORTABLE_SCALAR,
    KERNEL_WGMMA_HEADS_ON_M,
    KERNEL_WGMMA_HEADS_ON_N,
    KV_LAYOUT_FLASHMLA,
    KV_LAYOUT_POOL,
    KV_LAYOUT_SCALED_FP8,
    LOG_ERROR,
    LOG_INFO,
    LOG_WARNING,
    PLAN_DECODE,
    PLAN_PREFILL,
    STATUS_NAMES,
    Tensor,
)

__version__ = "0.1.0"

__all__ = [
    "Error",
    "Context",
    "Pool",
    "DecodePlan",
    "PrefillPlan",
    "Buffer",
    "Tensor",
    "as_tensor",
    "tensor",
    "status_string",
    "last_error_message",
    "version",
    "version_string",
    "rope_table",
    "capabilities",
    "pool_sizes",
    "set_log_callback",
    "unset_log_callback",
]

# ---------------------------------------------------------------------------
# Errors


class Error(Exception):
    """A failing unikv call: ``status`` (int), ``status_name``, ``call`` and
    ``message`` (the library's last-error message)."""

    def __init__(self, status, call, message):
        self.status = int(status)
        self.status_name = STATUS_NAMES.get(self.status, "unknown status %d" % self.status)
        self.call = call
        self.message = message
        super().__init__(
            "%s: %s (%s)%s" % (call, status_string(self.status), self.status_name, ": " + message if message else "")
        )


def _check(status, call):
    if status != 0:
        raise Error(status, call, last_error_message())


# ---------------------------------------------------------------------------
# Library-wide functions


def status_string(status):
    """A static description of a status code."""
    return _capi.load().unikv_status_string(int(status)).decode()


def last_error_message():
    """The message of this thread's last failing call ("" before any)."""
    return _capi.load().unikv_last_error_message().decode()


def version():
    """The library's packed version (major * 1000000 + minor * 1000 + patch)."""
    return _capi.load().unikv_version()


def version_string():
    """The library's version as "MAJOR.MINOR.PATCH"."""
    return _capi.load().unikv_version_string().decode()


def rope_table(max_pos, base, yarn_factor=0.0, original_max_position=0, beta_fast=0.0, beta_slow=0.0, out=None):
    """unikv_rope_table: the ``[max_pos, 64]`` float32 RoPE table (host
    memory). Returns a NumPy array, or fills ``out`` (a writable C-contiguous
    float32 host array of at least max_pos * 64 elements) and returns it."""
    params = _capi.RopeParams(base=float(base))
    params.yarn.factor = float(yarn_factor)
    params.yarn.original_max_position = int(original_max_position)
    params.yarn.beta_fast = float(beta_fast)
    params.yarn.beta_slow = float(beta_slow)
    if out is None:
        import numpy

        out = numpy.empty((max_pos, 64), dtype=numpy.float32)
    t, _keep = _convert(out, None)
    if t.dtype != DTYPE_F32 or not _contiguous(t):
        raise TypeError("rope_table: out must be a C-contiguous float32 array")
    n = 1
    for i in range(t.ndim):
        n *= t.shape[i]
    lib = _capi.load()
    _check(
        lib.unikv_rope_table(ctypes.byref(params), int(max_pos), ctypes.cast(t.data, ctypes.POINTER(ctypes.c_float)), n),
        "unikv_rope_table",
    )
    return out


_BACKEND_NAMES = {BACKEND_AUTO: "auto", BACKEND_CPU: "cpu", BACKEND_CUDA: "cuda", BACKEND_ROCM: "rocm",
                  BACKEND_GPU: "gpu"}


def _mask_names(mask, names):
    return [name for code, name in sorted(names.items()) if mask >> code & 1]


def capabilities():
    """unikv_get_capabilities: what this build supports, as a dict.

    ``backends``: the backend names compiled in ("auto", "cpu", then "cuda" or
    "rocm" with "gpu"); ``gpu_devices``: GPUs present now; ``gpu_archs``: the
    compiled GPU targets (a list, empty without a GPU backend); ``kv_dtypes``
    and ``fp8_formats``: dtype names ("bf16", "fp8_e4m3fn", ...);
    ``ptx_embedded``: a bool; then the shape limits as ints (``max_heads``,
    ``head_dim``, ``nope_dim``, ``rope_dim``, ``max_tensor_dims``,
    ``page_tokens``, ``max_indexer_topk``, ``max_indexer_heads``,
    ``indexer_head_dim``, ``max_routing_slots``, ``max_cpu_threads``,
    ``max_tokens``)."""
    caps = _capi.Capabilities()
    _check(_capi.load().unikv_get_capabilities(ctypes.byref(caps)), "unikv_get_capabilities")
    dtypes = {code: name for name, code in _DTYPE_NAMES.items() if name in _CANONICAL_DTYPES}
    out = {}
    for name, _ in _capi.Capabilities._fields_:
        if name not in ("struct_size", "reserved"):
            out[name] = getattr(caps, name)
    out["backends"] = _mask_names(caps.backends, _BACKEND_NAMES)
    out["kv_dtypes"] = _mask_names(caps.kv_dtypes, dtypes)
    out["fp8_formats"] = _mask_names(caps.fp8_formats, dtypes)
    out["ptx_embedded"] = bool(caps.ptx_embedded)
    archs = (caps.gpu_archs or b"").decode()
    out["gpu_archs"] = archs.split(";") if archs else []
    return out


def _pool_params(compress_ratios, max_requests, window, spec_extra, c128_blocks, kv_dtype, layer_buffers,
                 rope_buffers, state_rings=None, state_buffers=None):
    """A PoolParams struct and the ctypes arrays it points into (keep both).
    ``state_rings``: None (no compressor state) or (c4_state_ring,
    c128_state_ring)."""
    ratios = (ctypes.c_uint32 * len(compress_ratios))(*compress_ratios)
    params = _capi.PoolParams(
        compress_ratios=ratios,
        num_layers=len(compress_ratios),
        max_requests=max_requests,
        window=window,
        spec_extra=spec_extra,
        c128_blocks=c128_blocks,
        kv_dtype=_dtype_code(kv_dtype),
    )
    keep = [ratios]
    if layer_buffers is not None:
        keep.append((ctypes.c_void_p * len(layer_buffers))(*[_address(b) for b in layer_buffers]))
        params.layer_buffers = keep[-1]
    if rope_buffers is not None:
        keep.append((ctypes.c_void_p * len(rope_buffers))(*[_address(b) for b in rope_buffers]))
        params.rope_buffers = keep[-1]
    if state_rings is not None:
        params.compressor_state = 1
        params.c4_state_ring, params.c128_state_ring = state_rings
    if state_buffers is not None:
        keep.append((ctypes.c_void_p * len(state_buffers))(*[_address(b) for b in state_buffers]))
        params.state_buffers = keep[-1]
    return params, keep


def pool_sizes(compress_ratios, max_requests, window, spec_extra=0, c128_blocks=0, kv_dtype="bf16",
               layer_buffers=None, rope_buffers=None, state_rings=None, state_buffers=None):
    """The geometry a pool created with these arguments (those of
    ``Context.create_pool``) would have, without creating it or needing a
    context: ``(PoolInfo, [PoolLayerInfo per layer])`` from
    unikv_pool_params_get_info and unikv_pool_params_get_layer. Each layer's
    ``bytes`` and ``rope_bytes`` are the sizes of the ``layer_buffers`` /
    ``rope_buffers`` entries an adopting pool needs. The arguments are checked
    as ``create_pool`` checks them (the same errors)."""
    params, _keep = _pool_params(compress_ratios, max_requests, window, spec_extra, c128_blocks, kv_dtype,
                                 layer_buffers, rope_buffers, state_rings, state_buffers)
    lib = _capi.load()
    info = _capi.PoolInfo()
    _check(lib.unikv_pool_params_get_info(ctypes.byref(params), ctypes.byref(info)), "unikv_pool_params_get_info")
    layers = []
    for i in range(len(compress_ratios)):
        layer = _capi.PoolLayerInfo()
        _check(lib.unikv_pool_params_get_layer(ctypes.byref(params), i, ctypes.byref(layer)),
               "unikv_pool_params_get_layer")
        layers.append(layer)
    return info, layers


def compressor_sizes(layer, compressor, compress_ratios, max_requests, window, state_rings, spec_extra=0,
                     c128_blocks=0, kv_dtype="bf16", state_buffers=None):
    """unikv_pool_params_get_compressor: the state geometry (a CompressorInfo)
    of compressor ``compressor`` (COMPRESSOR_KV or COMPRESSOR_INDEXER) of
    ``layer`` in the pool these arguments (those of ``Context.create_pool``)
    would create."""
    params, _keep = _pool_params(compress_ratios, max_requests, window, spec_extra, c128_blocks, kv_dtype,
                                 None, None, state_rings, state_buffers)
    info = _capi.CompressorInfo()
    _check(_capi.load().unikv_pool_params_get_compressor(ctypes.byref(params), layer, compressor,
                                                         ctypes.byref(info)),
           "unikv_pool_params_get_compressor")
    return info


# The installed log callback (its ctypes thunk must stay alive while the
# library may call it) and every one replaced before: a call already running
# on another thread may still reach a replaced callback, so none is freed.
_log_lock = threading.Lock()
_log_thunks = []


def set_log_callback(fn):
    """unikv_set_log_callback: ``fn(level, message)`` receives the library's
    diagnostics (process-wide; replaces any earlier callback): LOG_INFO with
    the description of every plan created, LOG_ERROR with the message of
    every failing call. ``message`` is a str. It runs on the thread of the
    call that produced the message; an exception it raises is printed and
    ignored (it cannot cross the C library). ``fn=None`` removes it (as
    ``unset_log_callback()``). The bindings keep the callback alive."""
    if fn is None:
        thunk = _capi.LogFn()  # NULL
    else:
        if not callable(fn):
            raise TypeError("set_log_callback: %s is not callable" % type(fn).__name__)

        def forward(_user, level, message):
            try:
                fn(int(level), (message or b"").decode("utf-8", "replace"))
            except Exception:  # must not unwind into C
                import traceback

                traceback.print_exc()

        thunk = _capi.LogFn(forward)
    with _log_lock:
        _check(_capi.load().unikv_set_log_callback(thunk, None), "unikv_set_log_callback")
        if fn is not None:
            _log_thunks.append(thunk)


def unset_log_callback():
    """Removes the log callback (unikv_set_log_callback with NULL)."""
    set_log_callback(None)


# ---------------------------------------------------------------------------
# Tensors

_DTYPE_NAMES = {
    "bf16": DTYPE_BF16,
    "bfloat16": DTYPE_BF16,
    "f16": DTYPE_F16,
    "float16": DTYPE_F16,
    "f32": DTYPE_F32,
    "float32": DTYPE_F32,
    "i32": DTYPE_I32,
    "int32": DTYPE_I32,
    "i64": DTYPE_I64,
    "int64": DTYPE_I64,
    "u8": DTYPE_U8,
    "uint8": DTYPE_U8,
    "fp8_e4m3fn": DTYPE_FP8_E4M3FN,
    "float8_e4m3fn": DTYPE_FP8_E4M3FN,
    "fp8_e4m3fnuz": DTYPE_FP8_E4M3FNUZ,
    "float8_e4m3fnuz": DTYPE_FP8_E4M3FNUZ,
}
# The names capabilities() reports.
_CANONICAL_DTYPES = ("bf16", "f16", "f32", "i32", "i64", "u8", "fp8_e4m3fn", "fp8_e4m3fnuz")
_DTYPE_SIZES = {DTYPE_BF16: 2, DTYPE_F16: 2, DTYPE_F32: 4, DTYPE_I32: 4, DTYPE_I64: 8, DTYPE_U8: 1}
_DTYPE_SIZES[DTYPE_FP8_E4M3FN] = 1
_DTYPE_SIZES[DTYPE_FP8_E4M3FNUZ] = 1

# Array-interface type strings (byte order stripped) -> dtype.
_TYPESTR = {"f2": DTYPE_F16, "f4": DTYPE_F32, "i4": DTYPE_I32, "i8": DTYPE_I64, "u1": DTYPE_U8}


def _dtype_code(dtype):
    if dtype is None:
        return None
    if isinstance(dtype, int):
        if dtype not in _DTYPE_SIZES:
            raise ValueError("unknown unikv dtype %d" % dtype)
        return dtype
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPE_NAMES:
        raise ValueError("unknown dtype %r (one of %s)" % (dtype, ", ".join(sorted(_DTYPE_NAMES))))
    return _DTYPE_NAMES[name]


def tensor(data, dtype, shape, strides=None):
    """A descriptor from a raw address (int), a dtype (code or name), a shape
    and optional strides in elements (default: contiguous row-major)."""
    code = _dtype_code(dtype)
    shape = [int(s) for s in shape]
    if not 1 <= len(shape) <= 4:
        raise ValueError("unikv tensors have 1 to 4 axes, not %d" % len(shape))
    if strides is None:
        strides, step = [0] * len(shape), 1
        for i in reversed(range(len(shape))):
            strides[i], step = step, step * shape[i]
    elif len(strides) != len(shape):
        raise ValueError("%d strides for %d axes" % (len(strides), len(shape)))
    t = Tensor()
    t.data = int(data) or None
    t.dtype = code
    t.ndim = len(shape)
    for i, (n, s) in enumerate(zip(shape, strides)):
        t.shape[i] = n
        t.strides[i] = int(s)
    return t


def _contiguous(t):
    step = 1
    for i in reversed(range(t.ndim)):
        if t.shape[i] != 1 and t.strides[i] != step:
            return False
        step *= t.shape[i]
    return True


def _is_torch(obj):
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr") and hasattr(obj, "stride")


def _from_interface(iface, override, what):
    typestr = iface["typestr"]
    itemsize = int(typestr[2:])
    code = _TYPESTR.get(typestr[1:])
    if override is not None:
        if _DTYPE_SIZES[override] != itemsize:
            raise TypeError("%s: cannot view %s elements as unikv dtype %d" % (what, typestr, override))
        code = override
    if code is None:
        raise TypeError("%s: element type %s has no unikv dtype (pass dtype=)" % (what, typestr))
    if typestr[0] == ">":
        raise TypeError("%s: big-endian data" % what)
    shape = iface["shape"]
    strides = iface.get("strides")
    if strides is not None:
        if any(s % itemsize for s in strides):
            raise ValueError("%s: strides are not multiples of the element size" % what)
        strides = [s // itemsize for s in strides]
    if len(shape) == 0:
        shape, strides = (1,), None
    return tensor(iface["data"][0], code, shape, strides)


# DLPack (dlpack.h): DLTensor and DLManagedTensor, enough to read a capsule.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


# (type code, bits) -> dtype: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4.
_DLPACK_DTYPES = {
    (0, 32): DTYPE_I32,
    (0, 64): DTYPE_I64,
    (1, 8): DTYPE_U8,
    (2, 16): DTYPE_F16,
    (2, 32): DTYPE_F32,
    (4, 16): DTYPE_BF16,
}


def _from_dlpack(obj, override, what):
    capsule = obj.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    # DLManagedTensor starts with its DLTensor; the capsule keeps it alive.
    dl = _DLTensor.from_address(get(capsule, b"dltensor"))
    if dl.dtype.lanes != 1:
        raise TypeError("%s: vector dtypes are not supported" % what)
    code = _DLPACK_DTYPES.get((dl.dtype.code, dl.dtype.bits))
    itemsize = dl.dtype.bits // 8
    if override is not None:
        if _DTYPE_SIZES[override] != itemsize:
            raise TypeError("%s: cannot view %d-bit elements as unikv dtype %d" % (what, dl.dtype.bits, override))
        code = override
    if code is None:
        raise TypeError("%s: DLPack type (%d, %d bits) has no unikv dtype" % (what, dl.dtype.code, dl.dtype.bits))
    shape = [dl.shape[i] for i in range(dl.ndim)] or [1]
    strides = [dl.strides[i] for i in range(dl.ndim)] if dl.strides and dl.ndim else None
    return tensor((dl.data or 0) + dl.byte_offset, code, shape, strides), capsule


def _convert(obj, dtype, what="tensor", via=None):
    """(descriptor, object to keep alive during the call) for one argument."""
    override = _dtype_code(dtype)
    if obj is None:
        return Tensor(), None
    if isinstance(obj, Tensor):
        if override is not None and override != obj.dtype:
            raise TypeError("%s: a unikv.Tensor already has a dtype" % what)
        return obj, None
    if isinstance(obj, Buffer):
        raise TypeError("%s: a Buffer has no shape: use buffer.tensor(dtype, shape)" % what)
    if via == "dlpack":
        return _from_dlpack(obj, override, what)
    if _is_torch(obj):
        name = str(obj.dtype).replace("torch.", "")
        code = _DTYPE_NAMES.get(name)
        if override is not None:
            if _DTYPE_SIZES[override] != obj.element_size():
                raise TypeError("%s: cannot view %s as unikv dtype %d" % (what, obj.dtype, override))
            code = override
        if code is None:
            raise TypeError("%s: torch dtype %s has no unikv dtype" % (what, obj.dtype))
        shape = list(obj.shape) or [1]
        strides = list(obj.stride()) if obj.dim() else None
        return tensor(obj.data_ptr(), code, shape, strides), obj
    iface = getattr(obj, "__cuda_array_interface__", None)
    if iface is None:
        iface = getattr(obj, "__array_interface__", None)
    if iface is not None:
        return _from_interface(iface, override, what), obj
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj, override, what)
    raise TypeError(
        "%s: %s is not an array (NumPy, PyTorch, __cuda_array_interface__ or DLPack)" % (what, type(obj).__name__)
    )


_KV_LAYOUTS = {"pool": KV_LAYOUT_POOL, "flashmla": KV_LAYOUT_FLASHMLA, "scaled_fp8": KV_LAYOUT_SCALED_FP8}


def kv_cache(layout, data, fp8_dtype, page_size=0, scales=None):
    """A unikv_kv_cache descriptor (the ``kv``, ``extra_kv`` and
    ``extend_cache`` fields of attention calls, docs/attention.md §6):
    ``layout`` "flashmla" (``data``: the [num_pages, bytes_per_page] uint8
    cache, ``page_size`` 2, 64 or 256) or "scaled_fp8" (``data``: the
    [rows, 512] uint8 codes, ``scales``: [rows, 8] float32); ``fp8_dtype``
    "fp8_e4m3fn" or "fp8_e4m3fnuz". The arrays must outlive every call that
    uses the descriptor."""
    c = _capi.KvCache()
    c.layout = _KV_LAYOUTS.get(layout, layout)
    c.fp8_dtype = _dtype_code(fp8_dtype)
    c.page_size = page_size
    c.data = as_tensor(data, "u8")
    if scales is not None:
        c.scales = as_tensor(scales, "f32")
    return c


def as_tensor(obj, dtype=None, via=None):
    """The unikv_tensor descriptor of an array (see the module docstring).
    ``dtype`` reinterprets elements of the same size (e.g. uint16 bits as
    "bf16"); ``via="dlpack"`` forces the DLPack path. The array must outlive
    every use of the descriptor."""
    return _convert(obj, dtype, via=via)[0]


def _stream_handle(stream, arrays):
    if stream is not None:
        if isinstance(stream, int):
            return stream or None
        for attr in ("cuda_stream", "ptr", "handle"):
            if hasattr(stream, attr):
                return int(getattr(stream, attr)) or None
        raise TypeError("stream: an int handle or a stream object, not %s" % type(stream).__name__)
    for a in arrays:
        if _is_torch(a) and a.is_cuda:
            import torch

            return torch.cuda.current_stream(a.device).cuda_stream or None
    return None


def _address(x):
    """A raw address from None, an int, a Buffer or an array (its data pointer)."""
    if x is None:
        return None
    if isinstance(x, int):
        return x or None
    if isinstance(x, Buffer):
        return x.ptr
    if isinstance(x, Tensor):
        return x.data
    if _is_torch(x):
        return x.data_ptr() or None
    iface = getattr(x, "__cuda_array_interface__", None) or getattr(x, "__array_interface__", None)
    if iface is not None:
        return iface["data"][0] or None
    if hasattr(x, "__dlpack__"):
        raise TypeError("pass DLPack arrays' addresses through unikv.as_tensor(x, dtype).data")
    raise TypeError("not an address, Buffer or array: %s" % type(x).__name__)


# (struct, tensor giving num_tokens, tensor giving num_heads)
_LAUNCHES = {
    "unikv_sparse_decode": (_capi.DecodeArgs, "q", None),
    "unikv_sparse_prefill": (_capi.PrefillArgs, "q", None),
    "unikv_attention_merge": (_capi.MergeArgs, "out", None),
    "unikv_store_flashmla": (_capi.StoreFlashmlaArgs, "kv", None),
    "unikv_store_scaled_fp8": (_capi.StoreScaledFp8Args, "kv", None),
    "unikv_store_indexer": (_capi.StoreIndexerArgs, "key", None),
    "unikv_build_decode_streams": (_capi.DecodeStreamsArgs, "batch_id", None),
    "unikv_fill_csa_tail": (_capi.CsaTailArgs, "batch_id", None),
    "unikv_build_prefill_streams": (_capi.PrefillStreamsArgs, "batch_id", None),
    "unikv_indexer_prepare_q": (_capi.IndexerPrepareQArgs, "q", "q"),
    "unikv_indexer_prepare_k": (_capi.IndexerPrepareKArgs, "key", None),
    "unikv_indexer_topk": (_capi.IndexerTopkArgs, "batch_id", "q_fp8"),
    "unikv_indexer_topk_from_logits": (_capi.IndexerTopkArgs, "batch_id", None),
    "unikv_prepare_qkv": (_capi.PrepareQkvArgs, "q_in", "q_in"),
    "unikv_inverse_rope": (_capi.InverseRopeArgs, "x", "x"),
    "unikv_hash_topk": (_capi.HashTopkArgs, "router_logits", None),
    "unikv_store_swa": (_capi.StoreSwaArgs, "kv", None),
    "unikv_store_compressed": (_capi.StoreCompressedArgs, "kv", None),
    "unikv_compress_decode": (_capi.CompressArgs, "kv_score", None),
    "unikv_compress_prefill": (_capi.CompressArgs, "kv_score", None),
}


def _build_args(call, fields):
    """The argument struct of `call` from keyword fields; returns (struct,
    objects to keep alive, the arrays among them)."""
    cls, token_field, heads_field = _LAUNCHES[call]
    args = cls()
    keep, arrays = [], []
    known = {name: ftype for name, ftype in cls._fields_ if name != "struct_size"}
    for name, value in fields.items():
        if name not in known:
            raise TypeError("%s: unknown field %r (fields: %s)" % (call, name, ", ".join(known)))
        if known[name] is Tensor:
            dtype = None
            if isinstance(value, tuple):  # (array, dtype)
                value, dtype = value
            t, k = _convert(value, dtype, "%s.%s" % (call, name))
            setattr(args, name, t)
            keep.append(k)
            arrays.append(value)
        else:
            setattr(args, name, value)
    count = "num_rows" if "num_rows" in known else "num_tokens"
    if count not in fields:
        setattr(args, count, getattr(args, token_field).shape[0])
    if heads_field is not None and "num_heads" not in fields:
        args.num_heads = getattr(args, heads_field).shape[1]
    if call == "unikv_hash_topk" and "num_real_tokens_host" not in fields and "num_real_tokens" not in fields:
        args.num_real_tokens_host = args.num_tokens  # every row is real
    return args, keep, arrays


class _Handle:
    """Unique ownership of a C handle; ``close()`` (or leaving a ``with``
    block, or garbage collection) destroys it."""

    _destroy = None
    _ptr = None  # also when a constructor failed before the handle existed

    def __init__(self, ptr):
        self._ptr = ptr

    @property
    def handle(self):
        """The raw C handle (an int); ValueError once closed."""
        if not self._ptr:
            raise ValueError("%s is closed" % type(self).__name__)
        return self._ptr

    def close(self):
        ptr, self._ptr = self._ptr, None
        if ptr and _capi._lib is not None:
            getattr(_capi._lib, self._destroy)(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _launch(self, call, fields, stream, *extra_handles):
        args, keep, arrays = _build_args(call, fields)
        lib = _capi.load()
        ptrs = [self.handle] + [h.handle for h in extra_handles]
        s = _stream_handle(stream, arrays)
        status = getattr(lib, call)(*ptrs, ctypes.byref(args), s)
        del keep
        _check(status, call)


def _new_handle(create, *args):
    out = ctypes.c_void_p()
    _check(getattr(_capi.load(), create)(*args, ctypes.byref(out)), create)
    return out.value


class Context(_Handle):
    """unikv_context: one backend on one device.

    ``backend``: "auto" (a GPU when compiled in and present, else the CPU),
    "gpu" (a GPU required: Error UNIKV_BACKEND_UNAVAILABLE without one),
    "cpu", "cuda", "rocm" or a BACKEND_* code."""

    _destroy = "unikv_context_destroy"
    _BACKENDS = {"auto": BACKEND_AUTO, "cpu": BACKEND_CPU, "cuda": BACKEND_CUDA, "rocm": BACKEND_ROCM,
                 "gpu": BACKEND_GPU}

    def __init__(self, backend="auto", device=0, cpu_threads=0, validate=False):
        code = self._BACKENDS[backend] if isinstance(backend, str) else int(backend)
        options = _capi.ContextOptions(backend=code, device=device, cpu_threads=cpu_threads, validate=int(validate))
        super().__init__(_new_handle("unikv_context_create", ctypes.byref(options)))

    def info(self):
        """unikv_context_get_info as a ContextInfo struct."""
        info = _capi.ContextInfo()
        _check(_capi.load().unikv_context_get_info(self.handle, ctypes.byref(info)), "unikv_context_get_info")
        return info

    @property
    def backend(self):
        """The backend in use: "cpu", "cuda" or "rocm" (never "auto" or "gpu")."""
        return _BACKEND_NAMES[self.info().backend]

    # --- memory ---------------------------------------------------------

    def alloc(self, nbytes):
        """unikv_memory_alloc: zeroed memory in the context's memory space."""
        ptr = ctypes.c_void_p()
        _check(_capi.load().unikv_memory_alloc(self.handle, nbytes, ctypes.byref(ptr)), "unikv_memory_alloc")
        return Buffer(self, ptr.value, nbytes)

    def memory_copy(self, dst, src, nbytes, kind, stream=None):
        """unikv_memory_copy between addresses (ints, Buffers or arrays)."""
        s = _stream_handle(stream, [dst, src])
        _check(
            _capi.load().unikv_memory_copy(self.handle, _address(dst), _address(src), nbytes, kind, s),
            "unikv_memory_copy",
        )

    def memory_set(self, ptr, value, nbytes, stream=None):
        """unikv_memory_set: `nbytes` bytes at `ptr` to `value`."""
        s = _stream_handle(stream, [ptr])
        _check(_capi.load().unikv_memory_set(self.handle, _address(ptr), value, nbytes, s), "unikv_memory_set")

    def synchronize(self, stream=None):
        """unikv_stream_synchronize (a no-op on the CPU backend)."""
        s = _stream_handle(stream, [])
        _check(_capi.load().unikv_stream_synchronize(self.handle, s), "unikv_stream_synchronize")

    # --- handles --------------------------------------------------------

    def create_pool(self, compress_ratios, max_requests, window, spec_extra=0, c128_blocks=0, kv_dtype="bf16",
                    layer_buffers=None, rope_buffers=None, state_rings=None, state_buffers=None):
        """unikv_pool_create. ``layer_buffers`` / ``rope_buffers``: None (the
        pool allocates) or one caller-owned buffer per layer (arrays, Buffers
        or addresses), which must outlive the pool (the Pool keeps a
        reference); ``unikv.pool_sizes(...)`` with the same arguments gives
        their sizes. ``state_rings``: None (no compressor state) or
        (c4_state_ring, c128_state_ring), e.g. (8, 128); ``state_buffers``
        adopts the state as ``layer_buffers`` adopts the rows (None entries
        for dense layers)."""
        return Pool(self, compress_ratios, max_requests, window, spec_extra, c128_blocks, kv_dtype, layer_buffers,
                    rope_buffers, state_rings, state_buffers)

    def create_decode_plan(self, max_tokens, num_heads, kv_dtype="bf16", head_dim=512, q_dtype="bf16",
                           out_dtype="bf16", kv_layout="pool"):
        """unikv_decode_plan_create. ``kv_layout``: "pool", "flashmla",
        "scaled_fp8" or a KV_LAYOUT_* code (the key sources' layout)."""
        return DecodePlan(self, max_tokens, num_heads, kv_dtype, head_dim, q_dtype, out_dtype, kv_layout)

    def create_prefill_plan(self, max_tokens, num_heads, kv_dtype="bf16", head_dim=512, q_dtype="bf16",
                            out_dtype="bf16", kv_layout="pool"):
        """unikv_prefill_plan_create; ``kv_layout`` as for decode plans."""
        return PrefillPlan(self, max_tokens, num_heads, kv_dtype, head_dim, q_dtype, out_dtype, kv_layout)

    # --- context-level operations ---------------------------------------

    def attention_merge(self, stream=None, **fields):
        """unikv_attention_merge; fields of unikv_merge_args."""
        self._launch("unikv_attention_merge", fields, stream)

    def store_flashmla(self, stream=None, **fields):
        """unikv_store_flashmla; fields of unikv_store_flashmla_args."""
        self._launch("unikv_store_flashmla", fields, stream)

    def store_scaled_fp8(self, stream=None, **fields):
        """unikv_store_scaled_fp8; fields of unikv_store_scaled_fp8_args."""
        self._launch("unikv_store_scaled_fp8", fields, stream)

    def store_indexer(self, stream=None, **fields):
        """unikv_store_indexer; fields of unikv_store_indexer_args."""
        self._launch("unikv_store_indexer", fields, stream)

    def indexer_prepare_q(self, stream=None, **fields):
        """unikv_indexer_prepare_q; fields of unikv_indexer_prepare_q_args."""
        self._launch("unikv_indexer_prepare_q", fields, stream)

    def indexer_prepare_k(self, stream=None, **fields):
        """unikv_indexer_prepare_k; fields of unikv_indexer_prepare_k_args."""
        self._launch("unikv_indexer_prepare_k", fields, stream)

    def indexer_topk(self, stream=None, **fields):
        """unikv_indexer_topk; fields of unikv_indexer_topk_args."""
        self._launch("unikv_indexer_topk", fields, stream)

    def indexer_topk_from_logits(self, stream=None, **fields):
        """unikv_indexer_topk_from_logits; fields of unikv_indexer_topk_args."""
        self._launch("unikv_indexer_topk_from_logits", fields, stream)

    def inverse_rope(self, stream=None, **fields):
        """unikv_inverse_rope; fields of unikv_inverse_rope_args."""
        self._launch("unikv_inverse_rope", fields, stream)

    def hash_topk(self, stream=None, **fields):
        """unikv_hash_topk; fields of unikv_hash_topk_args."""
        self._launch("unikv_hash_topk", fields, stream)


class Buffer:
    """Memory from unikv_memory_alloc; freed by ``free()`` or when collected.
    ``ptr`` is its address, ``nbytes`` its size."""

    def __init__(self, ctx, ptr, nbytes):
        self.ctx, self.ptr, self.nbytes = ctx, ptr, nbytes

    def free(self):
        """unikv_memory_free."""
        ptr, self.ptr = self.ptr, None
        if ptr is not None and self.ctx._ptr:
            _check(_capi.load().unikv_memory_free(self.ctx.handle, ptr), "unikv_memory_free")

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass

    def tensor(self, dtype, shape, strides=None):
        """A descriptor over this buffer."""
        return tensor(self.ptr, dtype, shape, strides)

    def upload(self, host, stream=None):
        """Copies a host array (C-contiguous) into the start of the buffer."""
        t, _keep = _convert(host, None)
        nbytes = _nbytes(host)
        if nbytes > self.nbytes:
            raise ValueError("upload of %d bytes into a %d-byte buffer" % (nbytes, self.nbytes))
        self.ctx.memory_copy(self.ptr, t.data, nbytes, COPY_HOST_TO_DEVICE, stream)

    def download(self, host, stream=None):
        """Fills a host array (C-contiguous) from the start of the buffer and
        waits for the copy; returns the array."""
        t, _keep = _convert(host, None)
        self.ctx.memory_copy(t.data, self.ptr, _nbytes(host), COPY_DEVICE_TO_HOST, stream)
        self.ctx.synchronize(stream)
        return host

    def fill(self, value, stream=None):
        """Sets every byte to `value` (e.g. to poison outputs)."""
        self.ctx.memory_set(self.ptr, value, self.nbytes, stream)


def _nbytes(arr):
    n = getattr(arr, "nbytes", None)
    if n is None:
        n = arr.numel() * arr.element_size()
    return int(n)


class Pool(_Handle):
    """unikv_pool: the unified KV pool and the operations on its rows."""

    _destroy = "unikv_pool_destroy"

    def __init__(self, ctx, compress_ratios, max_requests, window, spec_extra=0, c128_blocks=0, kv_dtype="bf16",
                 layer_buffers=None, rope_buffers=None, state_rings=None, state_buffers=None):
        params, _keep = _pool_params(compress_ratios, max_requests, window, spec_extra, c128_blocks, kv_dtype,
                                     layer_buffers, rope_buffers, state_rings, state_buffers)
        # Caller memory must outlive the pool.
        self._buffers = (layer_buffers, rope_buffers, state_buffers)
        self.ctx = ctx
        super().__init__(_new_handle("unikv_pool_create", ctx.handle, ctypes.byref(params)))

    def info(self):
        """unikv_pool_get_info as a PoolInfo struct."""
        info = _capi.PoolInfo()
        _check(_capi.load().unikv_pool_get_info(self.handle, ctypes.byref(info)), "unikv_pool_get_info")
        return info

    def layer(self, index):
        """unikv_pool_get_layer as a PoolLayerInfo struct."""
        info = _capi.PoolLayerInfo()
        _check(_capi.load().unikv_pool_get_layer(self.handle, index, ctypes.byref(info)), "unikv_pool_get_layer")
        return info

    def acquire_slot(self):
        """unikv_pool_acquire_slot: a free slot (Error CAPACITY_EXCEEDED when full)."""
        slot = ctypes.c_uint32()
        _check(_capi.load().unikv_pool_acquire_slot(self.handle, ctypes.byref(slot)), "unikv_pool_acquire_slot")
        return slot.value

    def release_slot(self, slot):
        """unikv_pool_release_slot (clears the slot's compressor rings)."""
        _check(_capi.load().unikv_pool_release_slot(self.handle, slot), "unikv_pool_release_slot")

    def release_slot_async(self, slot, stream=None):
        """unikv_pool_release_slot_async: the rings are cleared on ``stream``."""
        s = _stream_handle(stream, [])
        _check(_capi.load().unikv_pool_release_slot_async(self.handle, slot, s), "unikv_pool_release_slot_async")

    def compressor(self, layer, compressor=0):
        """unikv_pool_get_compressor as a CompressorInfo struct
        (``compressor``: COMPRESSOR_KV or COMPRESSOR_INDEXER)."""
        info = _capi.CompressorInfo()
        _check(_capi.load().unikv_pool_get_compressor(self.handle, layer, compressor, ctypes.byref(info)),
               "unikv_pool_get_compressor")
        return info

    def compress_decode(self, stream=None, **fields):
        """unikv_compress_decode; fields of unikv_compress_args."""
        self._launch("unikv_compress_decode", fields, stream)

    def compress_prefill(self, stream=None, **fields):
        """unikv_compress_prefill; fields of unikv_compress_args."""
        self._launch("unikv_compress_prefill", fields, stream)

    def build_decode_streams(self, stream=None, **fields):
        """unikv_build_decode_streams; fields of unikv_decode_streams_args.
        The HCA (``hca_indptr``, ``hca_indices``) and CSA (``csa_indptr``,
        ``csa_indices``) outputs may be left out (both of a pair) when the
        pool has no ratio-128 / ratio-4 layers."""
        self._launch("unikv_build_decode_streams", fields, stream)

    def fill_csa_tail(self, stream=None, **fields):
        """unikv_fill_csa_tail; fields of unikv_csa_tail_args."""
        self._launch("unikv_fill_csa_tail", fields, stream)

    def indexer_topk_fill_csa(self, csa_indptr, csa_indices, stream=None, **fields):
        """unikv_indexer_topk_fill_csa: ``csa_indptr`` and ``csa_indices``
        (the CSA stream, updated in place) and the fields of
        unikv_indexer_topk_args."""
        call = "unikv_indexer_topk_fill_csa"
        args, keep, arrays = _build_args("unikv_indexer_topk", fields)
        csa = _capi.CsaStream()
        for name, value in (("csa_indptr", csa_indptr), ("csa_indices", csa_indices)):
            t, k = _convert(value, None, "%s.%s" % (call, name))
            setattr(csa, name, t)
            keep.append(k)
            arrays.append(value)
        s = _stream_handle(stream, arrays)
        status = _capi.load().unikv_indexer_topk_fill_csa(self.handle, ctypes.byref(args), ctypes.byref(csa), s)
        del keep
        _check(status, call)

    def build_prefill_streams(self, stream=None, **fields):
        """unikv_build_prefill_streams; fields of unikv_prefill_streams_args."""
        self._launch("unikv_build_prefill_streams", fields, stream)

    def prepare_qkv(self, stream=None, **fields):
        """unikv_prepare_qkv; fields of unikv_prepare_qkv_args."""
        self._launch("unikv_prepare_qkv", fields, stream)

    def prepare_qkv_indexer_q(self, indexer, stream=None, **fields):
        """unikv_prepare_qkv_indexer_q: ``indexer`` a dict of the fields of
        unikv_indexer_prepare_q_args, ``fields`` those of
        unikv_prepare_qkv_args."""
        call = "unikv_prepare_qkv_indexer_q"
        args, keep, arrays = _build_args("unikv_prepare_qkv", fields)
        query, keep_q, arrays_q = _build_args("unikv_indexer_prepare_q", indexer)
        s = _stream_handle(stream, arrays + arrays_q)
        status = _capi.load().unikv_prepare_qkv_indexer_q(self.handle, ctypes.byref(args), ctypes.byref(query), s)
        del keep, keep_q
        _check(status, call)

    def store_swa(self, stream=None, **fields):
        """unikv_store_swa; fields of unikv_store_swa_args."""
        self._launch("unikv_store_swa", fields, stream)

    def store_compressed(self, stream=None, **fields):
        """unikv_store_compressed; fields of unikv_store_compressed_args."""
        self._launch("unikv_store_compressed", fields, stream)


class _Plan(_Handle):
    _create = _size = _run = _info = _describe = None

    def __init__(self, ctx, max_tokens, num_heads, kv_dtype, head_dim, q_dtype, out_dtype, kv_layout="pool"):
        params = _capi.AttentionPlanParams(
            max_tokens=max_tokens,
            num_heads=num_heads,
            head_dim=head_dim,
            q_dtype=_dtype_code(q_dtype),
            kv_dtype=_dtype_code(kv_dtype),
            out_dtype=_dtype_code(out_dtype),
            kv_layout=_KV_LAYOUTS.get(kv_layout, kv_layout),
        )
        self.ctx = ctx
        super().__init__(_new_handle(self._create, ctx.handle, ctypes.byref(params)))

    @property
    def workspace_size(self):
        """The plan's workspace bytes (0 on the CPU backend)."""
        n = ctypes.c_size_t()
        _check(getattr(_capi.load(), self._size)(self.handle, ctypes.byref(n)), self._size)
        return n.value

    def info(self):
        """The launch configuration the plan chose, as a PlanInfo struct
        (``kind``, ``backend``, ``kernel_family``, ``head_block``,
        ``max_splits``, ``cluster_merge``, ``stages``, ``workspace_bytes``, ...)."""
        info = _capi.PlanInfo()
        _check(getattr(_capi.load(), self._info)(self.handle, ctypes.byref(info)), self._info)
        return info

    def describe(self):
        """The launch configuration as one human-readable line (its wording
        may change between versions: decide from ``info()``)."""
        call = getattr(_capi.load(), self._describe)
        length = ctypes.c_size_t()
        _check(call(self.handle, None, 0, ctypes.byref(length)), self._describe)
        while True:
            buf = ctypes.create_string_buffer(length.value + 1)
            needed = ctypes.c_size_t()
            _check(call(self.handle, buf, len(buf), ctypes.byref(needed)), self._describe)
            if needed.value <= length.value:
                return buf.raw[: needed.value].decode("utf-8", "replace")
            length = needed

    def _attend(self, pool, workspace, stream, fields):
        args, keep, arrays = _build_args(self._run, fields)
        if workspace is None:
            ws, ws_bytes = None, 0
        elif isinstance(workspace, Buffer):
            ws, ws_bytes = workspace.ptr, workspace.nbytes
        elif isinstance(workspace, int):
            ws, ws_bytes = workspace, self.workspace_size
        else:
            ws, ws_bytes = _address(workspace), _nbytes(workspace)
            arrays.append(workspace)
        s = _stream_handle(stream, arrays)
        pool_handle = None if pool is None else pool.handle
        status = getattr(_capi.load(), self._run)(self.handle, pool_handle, ctypes.byref(args), ws, ws_bytes, s)
        del keep
        _check(status, self._run)


class DecodePlan(_Plan):
    """unikv_decode_plan and its launch."""

    _destroy = "unikv_decode_plan_destroy"
    _create = "unikv_decode_plan_create"
    _size = "unikv_decode_plan_workspace_size"
    _run = "unikv_sparse_decode"
    _info = "unikv_decode_plan_get_info"
    _describe = "unikv_decode_plan_describe"

    def sparse_decode(self, pool, workspace=None, stream=None, **fields):
        """unikv_sparse_decode; fields of unikv_decode_args. ``workspace``: a
        Buffer, an array (its bytes) or None when workspace_size is 0.
        ``pool`` may be None when the key sources are caches (``kv`` and
        ``extra_kv`` fields: see ``kv_cache``)."""
        self._attend(pool, workspace, stream, fields)


class PrefillPlan(_Plan):
    """unikv_prefill_plan and its launch."""

    _destroy = "unikv_prefill_plan_destroy"
    _create = "unikv_prefill_plan_create"
    _size = "unikv_prefill_plan_workspace_size"
    _run = "unikv_sparse_prefill"
    _info = "unikv_prefill_plan_get_info"
    _describe = "unikv_prefill_plan_describe"

    def sparse_prefill(self, pool, workspace=None, stream=None, **fields):
        """unikv_sparse_prefill; fields of unikv_prefill_args."""
        self._attend(pool, workspace, stream, fields)
