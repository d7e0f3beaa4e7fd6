"""The Python package on the CPU backend with NumPy arrays (standard-library
unittest; pytest runs it too). Run from the repository with the library
staged:

    UNIKV_LIBRARY=build/stage/lib/libunikv.so PYTHONPATH=python \\
        python3 -m unittest discover -s python/tests -v

(scripts/python-test.sh does exactly that.) Results are compared with float64
references written here, on random inputs, with outputs poisoned first:
decode and prefill attention (over a pool, and over scaled FP8 rows the
scaled store wrote), the merge, the SWA and compressed stores, the
decode streams with the CSA tail (and without the HCA/CSA outputs), inverse
RoPE, hash routing and the top-k rule; the queries (capabilities, pool sizes
before creation, plan info and description, the log callback); plus the
ctypes struct layouts against the C header and the coverage of every C
function.
"""

import ctypes
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import numpy as np

import unikv
from unikv import _capi

HEAD_DIM = 512
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def to_bf16(x):
    """float array -> bf16 bits (uint16), round to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return bits.astype(np.uint16)


def from_bf16(bits):
    """bf16 bits -> float64."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def include_dir():
    """The include dir next to the loaded library (an install prefix), else
    UNIKV_INCLUDE_DIR, else the repository's include/."""
    if os.environ.get("UNIKV_INCLUDE_DIR"):
        return os.environ["UNIKV_INCLUDE_DIR"]
    lib = os.path.realpath(_capi.load()._name)
    candidate = os.path.join(os.path.dirname(os.path.dirname(lib)), "include")
    if os.path.exists(os.path.join(candidate, "unikv.h")):
        return candidate
    return os.path.join(REPO, "include")


def header_functions(text):
    return re.findall(r"^(?:UNIKV_NODISCARD\s+)?(?:unikv_status|void|uint32_t|const char \*)\s*(unikv_\w+)\(",
                      text, re.M)


class Abi(unittest.TestCase):
    def test_struct_layout_matches_the_c_header(self):
        """sizeof and every offsetof of each ctypes struct equal the C ones,
        from a C program compiled against the installed header."""
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if cc is None:
            self.skipTest("no C compiler")
        lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <unikv.h>", "int main(void) {"]
        expected = []
        for cls in _capi.STRUCTS:
            c = cls._c_name_
            lines.append('printf("%%zu\\n", sizeof(%s));' % c)
            expected.append(("sizeof %s" % c, ctypes.sizeof(cls)))
            for name, _ in cls._fields_:
                lines.append('printf("%%zu\\n", offsetof(%s, %s));' % (c, name))
                expected.append(("offsetof %s.%s" % (c, name), getattr(cls, name).offset))
        lines += ["return 0;", "}"]
        with tempfile.TemporaryDirectory() as tmp:
            src, exe = os.path.join(tmp, "layout.c"), os.path.join(tmp, "layout")
            with open(src, "w") as f:
                f.write("\n".join(lines))
            subprocess.run([cc, "-std=c11", "-I", include_dir(), src, "-o", exe], check=True)
            got = subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split()
        self.assertEqual(len(got), len(expected))
        for (what, want), value in zip(expected, got):
            self.assertEqual(int(value), want, what)

    def test_every_c_function_is_bound_and_wrapped(self):
        with open(os.path.join(include_dir(), "unikv.h")) as f:
            names = header_functions(f.read())
        self.assertGreaterEqual(len(names), 50)
        self.assertEqual(sorted(names), sorted(_capi.FUNCTIONS), "ctypes prototypes vs unikv.h")
        with open(unikv.__file__) as f:
            source = f.read()
        missing = [n for n in names if '"%s"' % n not in source and ".%s(" % n not in source]
        self.assertEqual(missing, [], "C functions without a Python wrapper")

    def test_version(self):
        self.assertEqual(unikv.version() // 1000, _capi.VERSION_MAJOR * 1000 + _capi.VERSION_MINOR)
        self.assertEqual(unikv.version_string(), unikv.__version__)


class Basics(unittest.TestCase):
    def setUp(self):
        self.ctx = unikv.Context("cpu", cpu_threads=2)

    def tearDown(self):
        self.ctx.close()

    def test_context_info(self):
        info = self.ctx.info()
        self.assertEqual(info.backend, unikv.BACKEND_CPU)
        self.assertEqual(info.cpu_threads, 2)
        self.assertEqual(self.ctx.backend, "cpu")

    def test_errors_carry_status_and_message(self):
        with self.assertRaises(unikv.Error) as caught:
            self.ctx.create_pool([0], max_requests=0, window=8)
        e = caught.exception
        self.assertNotEqual(e.status, 0)
        self.assertEqual(e.call, "unikv_pool_create")
        self.assertTrue(e.message)
        self.assertIn(e.status_name, str(e))
        self.assertEqual(unikv.last_error_message(), e.message)

        pool = self.ctx.create_pool([0], max_requests=1, window=8)
        plan = self.ctx.create_decode_plan(max_tokens=2, num_heads=4)
        q = np.zeros((2, 3, HEAD_DIM), np.uint16)  # 3 heads for a 4-head plan
        out = np.zeros_like(q)
        with self.assertRaises(unikv.Error) as caught:
            plan.sparse_decode(pool, q=(q, "bf16"), out=(out, "bf16"), indices=np.zeros(1, np.int32),
                               indptr=np.zeros(3, np.int32), softmax_scale=0.1)
        self.assertEqual(caught.exception.status_name, "UNIKV_BAD_SHAPE")
        with self.assertRaises(TypeError):
            pool.store_swa(no_such_field=1)

    def test_slots(self):
        pool = self.ctx.create_pool([0, 4], max_requests=2, window=8, c128_blocks=2)
        self.assertEqual([pool.acquire_slot(), pool.acquire_slot()], [1, 2])
        with self.assertRaises(unikv.Error) as caught:
            pool.acquire_slot()
        self.assertEqual(caught.exception.status_name, "UNIKV_CAPACITY_EXCEEDED")
        self.assertEqual(pool.info().slots_in_use, 2)
        pool.release_slot(1)
        self.assertEqual(pool.info().slots_in_use, 1)
        self.assertEqual(pool.layer(1).compressed_rows, 2 * 32 + 64)

    def test_buffers(self):
        buf = self.ctx.alloc(64)
        data = np.arange(16, dtype=np.int32)
        buf.upload(data)
        self.assertTrue(np.array_equal(buf.download(np.empty(16, np.int32)), data))
        buf.fill(0xFF)
        self.assertTrue(np.all(buf.download(np.empty(16, np.int32)) == -1))
        t = buf.tensor("i32", [4, 4])
        self.assertEqual((t.data, t.dtype, list(t.strides[:2])), (buf.ptr, unikv.DTYPE_I32, [4, 1]))
        buf.free()

    def test_descriptors(self):
        a = np.zeros((6, 8, 4), np.float32)[::2, :, 1:3]
        t = unikv.as_tensor(a)
        self.assertEqual((t.dtype, t.ndim), (unikv.DTYPE_F32, 3))
        self.assertEqual(list(t.shape[:3]), [3, 8, 2])
        self.assertEqual(list(t.strides[:3]), [64, 4, 1])
        self.assertEqual(t.data, a.__array_interface__["data"][0])
        bits = np.zeros((2, HEAD_DIM), np.uint16)
        self.assertEqual(unikv.as_tensor(bits, "bf16").dtype, unikv.DTYPE_BF16)
        with self.assertRaises(TypeError):
            unikv.as_tensor(bits)  # uint16 has no unikv dtype
        with self.assertRaises(TypeError):
            unikv.as_tensor(bits, "f32")  # element sizes differ
        # DLPack gives the same descriptor as the array interface.
        if hasattr(a, "__dlpack__"):
            for arr, dtype in ((a, None), (np.arange(10, dtype=np.int64)[2:], None), (bits, "bf16")):
                d = unikv.as_tensor(arr, dtype, via="dlpack")
                i = unikv.as_tensor(arr, dtype)
                self.assertEqual(bytes(d), bytes(i))

    def test_torch_and_cuda_interface_paths(self):
        """The PyTorch (data_ptr + strides) and __cuda_array_interface__ paths,
        with stand-ins over NumPy memory (PyTorch itself runs in gpu_torch.py)."""
        a = np.zeros((4, 6), np.float32)[:, 1:5]

        class FakeTorchTensor:  # what the bindings read from a torch.Tensor
            dtype, is_cuda = "torch.bfloat16", False

            def data_ptr(self):
                return a.__array_interface__["data"][0]

            def stride(self):
                return (6, 1)

            def element_size(self):
                return 2

            def dim(self):
                return 2

            shape = (4, 4)

        FakeTorchTensor.__module__ = "torch"
        t = unikv.as_tensor(FakeTorchTensor())
        self.assertEqual((t.dtype, list(t.shape[:2]), list(t.strides[:2])), (unikv.DTYPE_BF16, [4, 4], [6, 1]))
        self.assertIsNone(unikv._stream_handle(None, [FakeTorchTensor()]), "CPU tensors: the null stream")
        self.assertEqual(unikv._stream_handle(0x1234, []), 0x1234)

        class CudaArray:
            __cuda_array_interface__ = {"data": (a.__array_interface__["data"][0], False), "shape": (4, 4),
                                        "typestr": "<f4", "strides": (24, 4), "version": 3}

        self.assertEqual(bytes(unikv.as_tensor(CudaArray())), bytes(unikv.as_tensor(a)))

    def test_rope_table(self):
        table = unikv.rope_table(7, base=10000.0)
        omega = 10000.0 ** (-2.0 * np.arange(32) / 64.0)
        angle = np.arange(7)[:, None] * omega[None, :]
        want = np.stack([np.cos(angle), np.sin(angle)], axis=-1).reshape(7, 64)
        self.assertTrue(np.allclose(table, want, rtol=0, atol=1e-6))


class Attention(unittest.TestCase):
    """unikv_sparse_decode against a float64 reference."""

    def test_decode_matches_reference(self):
        rng = np.random.default_rng(2027)
        heads, tokens, window, requests = 8, 6, 16, 4
        scale = HEAD_DIM ** -0.5
        with unikv.Context("cpu") as ctx:
            pool = ctx.create_pool([0], max_requests=requests, window=window)
            layer = pool.layer(0)
            rows = int(layer.rows)
            kv = to_bf16(rng.uniform(-1, 1, (rows, HEAD_DIM)))
            ctx.memory_copy(layer.data, kv, kv.nbytes, unikv.COPY_HOST_TO_DEVICE)

            q = to_bf16(rng.uniform(-3, 3, (tokens, heads, HEAD_DIM)))
            sink = rng.uniform(-2, 2, heads).astype(np.float32)
            counts = [rng.integers(1, 40) for _ in range(tokens)]
            counts[2] = 0  # an empty slice: zeros, lse = sink
            slices = [rng.choice(rows, n, replace=False).astype(np.int32) for n in counts]
            indices = np.concatenate(slices)
            indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
            out = np.full((tokens, heads, HEAD_DIM), 0xFFFF, np.uint16)  # NaN
            lse = np.full((tokens, heads), np.nan, np.float32)

            plan = ctx.create_decode_plan(max_tokens=tokens, num_heads=heads)
            self.assertEqual(plan.workspace_size, 0)
            plan.sparse_decode(pool, q=(q, "bf16"), indices=indices, indptr=indptr, sink=sink, out=(out, "bf16"),
                               lse=lse, layer=0, softmax_scale=scale)

        keys = from_bf16(kv)
        qf = from_bf16(q)
        got = from_bf16(out)
        for t in range(tokens):
            k = keys[slices[t]]
            for h in range(heads):
                if len(k) == 0:
                    self.assertTrue(np.all(got[t, h] == 0), "empty slice gives zeros")
                    self.assertAlmostEqual(float(lse[t, h]), float(sink[h]), places=5)
                    continue
                logits = scale * (k @ qf[t, h])
                m = max(float(sink[h]), logits.max())
                w = np.exp(logits - m)
                den = np.exp(sink[h] - m) + w.sum()
                want = (w @ k) / den
                err = np.linalg.norm(got[t, h] - want) / np.linalg.norm(want)
                self.assertLess(err, 1e-2, "token %d head %d" % (t, h))
                self.assertAlmostEqual(float(lse[t, h]), m + np.log(den), delta=1e-4 * max(1.0, abs(m)))

    def test_decode_over_scaled_fp8_rows_written_by_the_store(self):
        """unikv_store_scaled_fp8 writes rows whose codes read back within
        the format's error; decode over them with no pool (a scaled FP8 plan,
        kv=kv_cache(...)) matches the float64 reference over the values the
        reader sees, bf16(fp32(decode(code) * scale))."""
        rng = np.random.default_rng(2028)
        heads, tokens, rows = 4, 3, 50
        scale = HEAD_DIM ** -0.5
        # e4m3fn code -> value (NaN codes 0x7F, 0xFF excluded by the store's inputs).
        codes_all = np.arange(256)
        exp, man = (codes_all >> 3) & 0xF, codes_all & 7
        mag = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
        table = np.where(codes_all & 0x80, -mag, mag)
        with unikv.Context("cpu") as ctx:
            kv = to_bf16(rng.uniform(-2, 2, (rows, HEAD_DIM)))
            codes = np.full((rows, HEAD_DIM), 0xA5, np.uint8)
            scales = np.full((rows, 8), np.nan, np.float32)
            loc = np.arange(rows, dtype=np.int32)
            ctx.store_scaled_fp8(codes=codes, scales=scales, kv=(kv, "bf16"), loc=loc,
                                 cache_dtype=unikv.DTYPE_FP8_E4M3FN, scale_divisor=224)
            per_dim = np.repeat(scales.astype(np.float64), 64, axis=1)
            exact = table[codes] * per_dim
            self.assertLess(np.max(np.abs(exact - from_bf16(kv))), 2.0 ** -4 * 2 + 1e-6)
            values = from_bf16(to_bf16((table[codes] * per_dim).astype(np.float32)))

            q = to_bf16(rng.uniform(-3, 3, (tokens, heads, HEAD_DIM)))
            sink = rng.uniform(-2, 2, heads).astype(np.float32)
            counts = [7, 0, 30]
            slices = [rng.choice(rows, n, replace=False).astype(np.int32) for n in counts]
            indices = np.concatenate(slices)
            indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
            out = np.full((tokens, heads, HEAD_DIM), 0xFFFF, np.uint16)
            lse = np.full((tokens, heads), np.nan, np.float32)
            plan = ctx.create_decode_plan(max_tokens=tokens, num_heads=heads, kv_dtype="fp8_e4m3fn",
                                          kv_layout="scaled_fp8")
            source = unikv.kv_cache("scaled_fp8", codes, "fp8_e4m3fn", scales=scales)
            plan.sparse_decode(None, q=(q, "bf16"), indices=indices, indptr=indptr, sink=sink, out=(out, "bf16"),
                               lse=lse, softmax_scale=scale, kv=source)
        qf, got = from_bf16(q), from_bf16(out)
        for t in range(tokens):
            k = values[slices[t]]
            for h in range(heads):
                if len(k) == 0:
                    self.assertTrue(np.all(got[t, h] == 0), "empty slice gives zeros")
                    continue
                logits = scale * (k @ qf[t, h])
                m = max(float(sink[h]), logits.max())
                w = np.exp(logits - m)
                den = np.exp(sink[h] - m) + w.sum()
                err = np.linalg.norm(got[t, h] - (w @ k) / den) / np.linalg.norm((w @ k) / den)
                self.assertLess(err, 1e-2, "token %d head %d" % (t, h))
                self.assertAlmostEqual(float(lse[t, h]), m + np.log(den), delta=1e-4 * max(1.0, abs(m)))

    def test_prefill_matches_reference(self):
        """Two key sources (pool rows and the chunk's own rows), -1 skipped."""
        rng = np.random.default_rng(5)
        heads, tokens, chunk_rows = 4, 5, 12
        scale = HEAD_DIM ** -0.5
        with unikv.Context("cpu") as ctx:
            pool = ctx.create_pool([0], max_requests=2, window=16)
            layer = pool.layer(0)
            rows = int(layer.rows)
            kv = to_bf16(rng.uniform(-1, 1, (rows, HEAD_DIM)))
            ctx.memory_copy(layer.data, kv, kv.nbytes, unikv.COPY_HOST_TO_DEVICE)
            extend_kv = to_bf16(rng.uniform(-1, 1, (chunk_rows, HEAD_DIM)))
            q = to_bf16(rng.uniform(-3, 3, (tokens, heads, HEAD_DIM)))
            sink = rng.uniform(-2, 2, heads).astype(np.float32)
            prefix = [rng.choice(rows, rng.integers(0, 10), replace=False).astype(np.int32) for _ in range(tokens)]
            extend = [rng.choice(chunk_rows, rng.integers(1, 8), replace=False).astype(np.int32)
                      for _ in range(tokens)]
            prefix[1] = np.append(prefix[1], -1).astype(np.int32)  # skipped
            out = np.full((tokens, heads, HEAD_DIM), 0xFFFF, np.uint16)
            plan = ctx.create_prefill_plan(max_tokens=tokens, num_heads=heads)
            plan.sparse_prefill(
                pool, q=(q, "bf16"), sink=sink, out=(out, "bf16"), layer=0, softmax_scale=scale,
                indices=np.concatenate(prefix),
                indptr=np.cumsum([0] + [len(p) for p in prefix]).astype(np.int32),
                extend_kv=(extend_kv, "bf16"), extend_indices=np.concatenate(extend),
                extend_indptr=np.cumsum([0] + [len(e) for e in extend]).astype(np.int32))
        keys, ext, qf, got = from_bf16(kv), from_bf16(extend_kv), from_bf16(q), from_bf16(out)
        for t in range(tokens):
            k = np.concatenate([keys[prefix[t][prefix[t] >= 0]], ext[extend[t]]])
            for h in range(heads):
                logits = scale * (k @ qf[t, h])
                m = max(float(sink[h]), logits.max())
                w = np.exp(logits - m)
                want = (w @ k) / (np.exp(sink[h] - m) + w.sum())
                self.assertLess(np.linalg.norm(got[t, h] - want) / np.linalg.norm(want), 1e-2)


class Queries(unittest.TestCase):
    """Capabilities, pool sizes before creation, plan introspection and the
    log callback, on the CPU backend."""

    def setUp(self):
        self.ctx = unikv.Context("cpu", cpu_threads=1)

    def tearDown(self):
        unikv.unset_log_callback()
        self.ctx.close()

    def test_capabilities(self):
        caps = unikv.capabilities()
        self.assertIn("cpu", caps["backends"])
        self.assertIn("auto", caps["backends"])
        self.assertEqual("gpu" in caps["backends"], "cuda" in caps["backends"] or "rocm" in caps["backends"])
        self.assertIn("bf16", caps["kv_dtypes"])
        self.assertEqual(caps["fp8_formats"], ["fp8_e4m3fn", "fp8_e4m3fnuz"])
        self.assertEqual((caps["head_dim"], caps["nope_dim"], caps["rope_dim"]), (512, 448, 64))
        self.assertEqual(caps["max_heads"], 128)
        self.assertIsInstance(caps["ptx_embedded"], bool)
        self.assertIsInstance(caps["gpu_archs"], list)
        if "gpu" not in caps["backends"]:
            self.assertEqual(caps["gpu_archs"], [])
        if caps["gpu_devices"] == 0:
            # A required GPU is an error, not AUTO's CPU fallback.
            with self.assertRaises(unikv.Error) as caught:
                unikv.Context("gpu")
            self.assertEqual(caught.exception.status_name, "UNIKV_BACKEND_UNAVAILABLE")
            self.assertIn("UNIKV_BACKEND_GPU", caught.exception.message)
        self.assertEqual(self.ctx.backend, "cpu")

    def test_pool_sizes_equal_a_created_pool(self):
        ratios = [0, 4, 128, 4]
        for kv_dtype in ("bf16", "fp8_e4m3fn", "fp8_e4m3fnuz"):
            fp8 = kv_dtype != "bf16"
            geometry = dict(max_requests=3, window=8, spec_extra=2, c128_blocks=5, kv_dtype=kv_dtype)
            info, layers = unikv.pool_sizes(ratios, **geometry)
            pool = self.ctx.create_pool(ratios, **geometry)
            got = pool.info()
            for field in ("swa_rows", "row_bytes", "num_layers", "max_requests", "window", "ring", "c128_blocks",
                          "kv_dtype", "owns_memory", "slots_in_use"):
                self.assertEqual(getattr(info, field), getattr(got, field), "%s %s" % (kv_dtype, field))
            self.assertEqual(len(layers), len(ratios))
            for i, want in enumerate(layers):
                have = pool.layer(i)
                for field in ("rows", "swa_rows", "compressed_rows", "bytes", "compress_ratio", "rope_bytes"):
                    self.assertEqual(getattr(want, field), getattr(have, field),
                                     "%s layer %d %s" % (kv_dtype, i, field))
                self.assertIsNone(want.data)
                self.assertEqual(want.bytes, want.rows * (512 if fp8 else 1024))
                self.assertEqual(want.rope_bytes, want.rows * 128 if fp8 else 0)
            pool.close()
            # Buffers of exactly those sizes are what an adopting pool takes.
            data = [self.ctx.alloc(int(layer.bytes)) for layer in layers]
            rope = [self.ctx.alloc(int(layer.rope_bytes)) for layer in layers] if fp8 else None
            adopting = self.ctx.create_pool(ratios, layer_buffers=data, rope_buffers=rope, **geometry)
            self.assertEqual(adopting.info().owns_memory, 0)
            self.assertEqual([adopting.layer(i).data for i in range(len(ratios))], [b.ptr for b in data])
            info, layers = unikv.pool_sizes(ratios, layer_buffers=data, rope_buffers=rope, **geometry)
            self.assertEqual(info.owns_memory, 0)
            self.assertEqual(layers[1].data, data[1].ptr)
            adopting.close()

    def test_pool_sizes_check_like_create_pool(self):
        for bad in (dict(compress_ratios=[0, 5]), dict(window=0), dict(kv_dtype="f32")):
            args = dict(compress_ratios=[0, 4], max_requests=1, window=4)
            args.update(bad)
            with self.assertRaises(unikv.Error) as created:
                self.ctx.create_pool(**args)
            with self.assertRaises(unikv.Error) as sized:
                unikv.pool_sizes(**args)
            self.assertEqual(sized.exception.status, created.exception.status, bad)
            self.assertEqual(sized.exception.message, created.exception.message, bad)
            self.assertEqual(sized.exception.call, "unikv_pool_params_get_info")

    def test_plan_info_and_description(self):
        for create, kind, prefix in ((self.ctx.create_decode_plan, unikv.PLAN_DECODE, "decode plan: cpu"),
                                     (self.ctx.create_prefill_plan, unikv.PLAN_PREFILL, "prefill plan: cpu")):
            plan = create(max_tokens=16, num_heads=64, kv_dtype="fp8_e4m3fn")
            info = plan.info()
            self.assertEqual((info.kind, info.backend, info.kernel_family),
                             (kind, unikv.BACKEND_CPU, unikv.KERNEL_CPU_REFERENCE))
            self.assertEqual((info.max_tokens, info.num_heads, info.kv_dtype), (16, 64, unikv.DTYPE_FP8_E4M3FN))
            self.assertGreaterEqual(info.head_block * info.head_blocks, 64)
            self.assertEqual((info.max_splits, info.cluster_merge, info.stages, info.sm_count), (1, 0, 0, 0))
            self.assertEqual(info.workspace_bytes, plan.workspace_size)
            line = plan.describe()
            self.assertTrue(line.startswith(prefix + ", cpu-reference kernel"), line)
            self.assertIn("%d block%s of %d heads (64 heads)"
                          % (info.head_blocks, "" if info.head_blocks == 1 else "s", info.head_block), line)
            self.assertIn("no key splits", line)
            self.assertIn("%d workspace bytes, max_tokens 16" % info.workspace_bytes, line)
            self.assertNotIn("\0", line)
            plan.close()
        with self.assertRaises(ValueError):
            plan.describe()  # closed

    def test_log_callback(self):
        messages = []
        unikv.set_log_callback(lambda level, message: messages.append((level, message)))
        plan = self.ctx.create_decode_plan(max_tokens=4, num_heads=16)
        self.assertEqual(messages, [(unikv.LOG_INFO, plan.describe())])
        prefill = self.ctx.create_prefill_plan(max_tokens=4, num_heads=16)
        self.assertEqual(messages[-1], (unikv.LOG_INFO, prefill.describe()))
        with self.assertRaises(unikv.Error) as caught:
            self.ctx.create_pool([0], max_requests=1, window=0)
        level, message = messages[-1]
        self.assertEqual(level, unikv.LOG_ERROR)
        self.assertIn(caught.exception.message, message)
        self.assertIn("params.window", message)
        # A callback that raises is reported and ignored; the call succeeds.
        def broken(level, message):
            raise RuntimeError("from the callback")

        unikv.set_log_callback(broken)
        import contextlib
        import io

        with contextlib.redirect_stderr(io.StringIO()) as err:
            self.ctx.create_decode_plan(max_tokens=4, num_heads=16).close()
        self.assertIn("from the callback", err.getvalue())
        # Removed: nothing more arrives.
        unikv.set_log_callback(lambda level, message: messages.append((level, message)))
        count = len(messages)
        unikv.unset_log_callback()
        self.ctx.create_decode_plan(max_tokens=4, num_heads=16).close()
        self.assertEqual(len(messages), count)
        with self.assertRaises(TypeError):
            unikv.set_log_callback("not callable")

    def test_decode_streams_without_compressed_outputs(self):
        """A pool without ratio-4 / ratio-128 layers: the HCA and CSA outputs left out."""
        window = 4
        pool = self.ctx.create_pool([0, 0], max_requests=2, window=window)
        batch_id = np.array([0, 1], np.int32)
        slots = np.array([1, 2], np.int32)
        positions = np.array([2, 9], np.int32)
        indptr = np.full(3, -7, np.int32)
        indices = np.full(2 * window, -7, np.int32)
        pool.build_decode_streams(batch_id=batch_id, req_slots=slots, positions=positions, swa_indptr=indptr,
                                  swa_indices=indices)
        self.assertEqual(list(indptr), [0, 3, 7])
        # ring 4: slot 1, positions 0..2 -> rows 4..6; slot 2, positions 6..9 -> 10, 11, 8, 9
        self.assertEqual(list(indices[:7]), [4, 5, 6, 10, 11, 8, 9])
        csa_pool = self.ctx.create_pool([0, 4], max_requests=2, window=window)
        with self.assertRaises(unikv.Error) as caught:
            csa_pool.build_decode_streams(batch_id=batch_id, req_slots=slots, positions=positions,
                                          swa_indptr=indptr, swa_indices=indices)
        self.assertEqual(caught.exception.status_name, "UNIKV_NULL_ARGUMENT")
        self.assertIn("csa_indptr", caught.exception.message)


class Stores(unittest.TestCase):
    """unikv_store_swa and unikv_store_compressed against the row formulas."""

    def setUp(self):
        self.rng = np.random.default_rng(7)
        self.ctx = unikv.Context("cpu")

    def tearDown(self):
        self.ctx.close()

    def pool_rows(self, pool, layer):
        info = pool.layer(layer)
        rows = np.empty((int(info.rows), HEAD_DIM), np.uint16)
        self.ctx.memory_copy(rows, info.data, rows.nbytes, unikv.COPY_DEVICE_TO_HOST)
        self.ctx.synchronize()
        return rows

    def poison(self, pool, layer):
        info = pool.layer(layer)
        self.ctx.memory_set(info.data, 0xAB, int(info.bytes))
        return self.pool_rows(pool, layer)

    def test_store_swa(self):
        window, spec_extra = 8, 2
        pool = self.ctx.create_pool([0, 128], max_requests=3, window=window, spec_extra=spec_extra, c128_blocks=2)
        ring = window + spec_extra
        slots = np.array([pool.acquire_slot(), pool.acquire_slot(), pool.acquire_slot()][::-1], np.int32)
        # Request 0: positions 3..7, request 1: 17..26 (wraps the ring),
        # request 2: position 0; one padding row.
        batch_id = np.array([0] * 5 + [1] * 10 + [2, -1], np.int32)
        positions = np.array(list(range(3, 8)) + list(range(17, 27)) + [0, 0], np.int32)
        kv = to_bf16(self.rng.uniform(-1, 1, (len(batch_id), HEAD_DIM)))
        want = self.poison(pool, 1)
        pool.store_swa(kv=(kv, "bf16"), batch_id=batch_id, req_slots=slots, positions=positions, layer=1)
        for t, b in enumerate(batch_id):
            if b >= 0:
                want[slots[b] * ring + positions[t] % ring] = kv[t]
        self.assertTrue(np.array_equal(self.pool_rows(pool, 1), want))

    def test_store_compressed(self):
        pool = self.ctx.create_pool([0, 4], max_requests=2, window=8, c128_blocks=2)
        info = pool.layer(1)
        n = 12
        loc = self.rng.choice(int(info.compressed_rows), n, replace=False).astype(np.int32)
        loc[5] = -1  # skipped
        kv = to_bf16(self.rng.uniform(-1, 1, (n, HEAD_DIM)))
        want = self.poison(pool, 1)
        pool.store_compressed(kv=(kv, "bf16"), loc=loc, layer=1)
        for i, p in enumerate(loc):
            if p >= 0:
                want[int(info.swa_rows) + p] = kv[i]
        self.assertTrue(np.array_equal(self.pool_rows(pool, 1), want))


class Compressor(unittest.TestCase):
    """unikv_compress_prefill / _decode and the compressor state queries."""

    def setUp(self):
        self.rng = np.random.default_rng(11)
        self.ctx = unikv.Context("cpu")

    def tearDown(self):
        self.ctx.close()

    def run_chunks(self, cuts):
        """Ratio-4 attention compressor over 13 tokens of one request cut
        into prefill calls at `cuts`; returns the pool rows and the state."""
        pool = self.ctx.create_pool([0, 4], max_requests=1, window=8, c128_blocks=1, state_rings=(8, 128))
        slot = pool.acquire_slot()
        rng = np.random.default_rng(3)
        n = 13
        kv_score = rng.uniform(-2, 2, (n, 4 * HEAD_DIM)).astype(np.float32)
        ape = rng.uniform(-1, 1, (4, 2 * HEAD_DIM)).astype(np.float32)
        norm = np.ones(HEAD_DIM, np.float32)
        table = unikv.rope_table(16, 40000.0)
        loc = np.where((np.arange(n) + 1) % 4 == 0, (np.arange(n) + 1) // 4 - 1, -1).astype(np.int64)
        for a, b in zip(cuts, cuts[1:]):
            m = b - a
            pool.compress_prefill(kv_score=kv_score[a:b], ape=ape, norm_weight=norm, rope_table=table,
                                  batch_id=np.zeros(m, np.int32), req_slots=np.array([slot], np.int32),
                                  positions=np.arange(a, b, dtype=np.int64), loc=loc[a:b], layer=1, eps=1e-6)
        info = pool.layer(1)
        rows = np.empty((int(info.rows), HEAD_DIM), np.uint16)
        self.ctx.memory_copy(rows, info.data, rows.nbytes, unikv.COPY_DEVICE_TO_HOST)
        c = pool.compressor(1, unikv.COMPRESSOR_KV)
        state = np.empty(int(c.bytes) // 4, np.float32)
        self.ctx.memory_copy(state, c.state, state.nbytes, unikv.COPY_DEVICE_TO_HOST)
        self.ctx.synchronize()
        return rows, state, c

    def test_chunks_give_the_rows_of_one_call(self):
        rows, state, c = self.run_chunks([0, 13])
        self.assertEqual((c.ring, c.row_floats, c.head_dim, c.compress_ratio), (8, 4 * HEAD_DIM, HEAD_DIM, 4))
        for cuts in ([0, 5, 13], [0, 4, 8, 12, 13], [0, 1, 2, 3, 13]):
            r, s, _ = self.run_chunks(cuts)
            self.assertTrue(np.array_equal(r, rows), cuts)
            self.assertTrue(np.array_equal(s, state), cuts)

    def test_sizes_before_creation(self):
        c = unikv.compressor_sizes(1, unikv.COMPRESSOR_INDEXER, [0, 4], max_requests=2, window=8,
                                   state_rings=(16, 128))
        self.assertEqual((c.ring, c.row_floats, c.head_dim, c.max_rollback), (16, 512, 128, 9))
        self.assertEqual(c.offset_bytes, 3 * 16 * 4 * HEAD_DIM * 4)
        info, layers = unikv.pool_sizes([0, 4], max_requests=2, window=8, state_rings=(16, 128))
        self.assertEqual(layers[1].state_bytes, c.offset_bytes + c.bytes)
        self.assertEqual(info.c4_state_ring, 16)
        pool = self.ctx.create_pool([0, 4], max_requests=2, window=8, state_rings=(16, 128))
        slot = pool.acquire_slot()
        pool.release_slot_async(slot)
        with self.assertRaises(unikv.Error) as caught:
            self.ctx.create_pool([0, 4], max_requests=2, window=8, state_rings=(12, 128))
        self.assertIn("c4_state_ring", caught.exception.message)


class Streams(unittest.TestCase):
    """unikv_build_decode_streams and unikv_fill_csa_tail against the slice
    rule: [window rows oldest to newest | compressed rows in table order]."""

    def test_decode_streams(self):
        window, topk = 8, 4
        with unikv.Context("cpu") as ctx:
            pool = ctx.create_pool([0, 4, 128], max_requests=2, window=window, c128_blocks=4)
            slots = np.array([pool.acquire_slot(), pool.acquire_slot()], np.int32)
            swa_rows = int(pool.info().swa_rows)
            batch_id = np.array([0, 1, -1], np.int32)
            positions = np.array([260, 3, 0], np.int32)
            # The (pos + 1) / 128 closed 128-groups' page indices, -1 after.
            c128 = np.array([[5, 3], [-1, -1], [-1, -1]], np.int32)
            t = len(batch_id)
            out = {}
            for kind, width in (("swa", 0), ("hca", 2), ("csa", topk)):
                out[kind + "_indptr"] = np.full(t + 1, -7, np.int32)
                out[kind + "_indices"] = np.full(t * (window + width), -7, np.int32)
            pool.build_decode_streams(batch_id=batch_id, req_slots=slots, positions=positions,
                                      c128_page_indices=c128, csa_topk=topk, **out)
            # This layer's top-k: min((pos + 1) / 4, topk) valid entries per token.
            csa_pages = np.array([[9, 2, 30, 191], [17, -1, -1, -1], [-1, -1, -1, -1]], np.int32)
            pool.fill_csa_tail(batch_id=batch_id, positions=positions, csa_page_indices=csa_pages,
                               csa_indptr=out["csa_indptr"], csa_indices=out["csa_indices"])

        def slices(kind):
            ptr, idx = out[kind + "_indptr"], out[kind + "_indices"]
            return [list(idx[ptr[i] : ptr[i + 1]]) for i in range(t)]

        swa = []
        for i in range(t):
            b = batch_id[i]
            if b < 0:
                swa.append([])
                continue
            lo = max(0, positions[i] - window + 1)
            swa.append([slots[b] * window + p % window for p in range(lo, positions[i] + 1)])
        self.assertEqual(slices("swa"), swa)
        self.assertEqual(slices("hca"), [swa[0] + [swa_rows + 5, swa_rows + 3], swa[1], []])
        self.assertEqual(slices("csa"), [swa[0] + [swa_rows + p for p in (9, 2, 30, 191)], swa[1] + [swa_rows + 17],
                                         []])


class ContextOps(unittest.TestCase):
    """Context-level operations against float64 references."""

    def setUp(self):
        self.rng = np.random.default_rng(11)
        self.ctx = unikv.Context("cpu")

    def tearDown(self):
        self.ctx.close()

    def test_attention_merge(self):
        parts, tokens, heads = 3, 4, 4
        parts_out = to_bf16(self.rng.uniform(-1, 1, (parts, tokens, heads, HEAD_DIM)))
        parts_lse = self.rng.uniform(-3, 3, (parts, tokens, heads)).astype(np.float32)
        parts_lse[1, 2] = -np.inf  # a part without keys for token 2
        sink = self.rng.uniform(-2, 2, heads).astype(np.float32)
        out = np.full((tokens, heads, HEAD_DIM), 0xFFFF, np.uint16)
        lse = np.full((tokens, heads), np.nan, np.float32)
        self.ctx.attention_merge(parts_out=(parts_out, "bf16"), parts_lse=parts_lse, sink=sink,
                                 out=(out, "bf16"), lse=lse)
        po = from_bf16(parts_out)
        pl = parts_lse.astype(np.float64)
        m = np.maximum(pl.max(axis=0), sink[None, :])
        w = np.exp(pl - m[None])  # [P, T, H]
        den = w.sum(axis=0) + np.exp(sink[None, :] - m)
        want = (w[..., None] * po).sum(axis=0) / den[..., None]
        got = from_bf16(out)
        err = np.linalg.norm(got - want, axis=-1) / np.linalg.norm(want, axis=-1)
        self.assertLess(err.max(), 1e-2)
        self.assertTrue(np.allclose(lse, m + np.log(den), rtol=0, atol=1e-4))

    def test_inverse_rope(self):
        tokens, heads, max_pos = 5, 3, 50
        table = unikv.rope_table(max_pos, base=10000.0)
        x = to_bf16(self.rng.uniform(-2, 2, (tokens, heads, HEAD_DIM)))
        before = x.copy()
        positions = self.rng.integers(0, max_pos, tokens).astype(np.int32)
        self.ctx.inverse_rope(x=(x, "bf16"), positions=positions, rope_table=table)
        self.assertTrue(np.array_equal(x[..., :448], before[..., :448]), "dims 0..447 untouched")
        c = table[positions, 0::2].astype(np.float64)[:, None, :]
        s = table[positions, 1::2].astype(np.float64)[:, None, :]
        x0, x1 = from_bf16(before[..., 448::2]), from_bf16(before[..., 449::2])
        want = np.empty((tokens, heads, 64))
        want[..., 0::2] = x0 * c + x1 * s
        want[..., 1::2] = x1 * c - x0 * s
        got = from_bf16(x[..., 448:])
        # One rounding to bf16 (8 significant bits) of the exact value.
        self.assertTrue(np.all(np.abs(got - want) <= 2.0 ** -8 * np.abs(want) + 1e-30))

    def test_hash_topk(self):
        tokens, experts, k, vocab, scaling = 6, 16, 4, 40, 1.5
        logits = self.rng.normal(0, 2, (tokens, experts)).astype(np.float32)
        input_ids = self.rng.integers(0, vocab, tokens).astype(np.int32)
        tid2eid = np.stack([self.rng.choice(experts, k, replace=False) for _ in range(vocab)]).astype(np.int32)
        weights = np.full((tokens, k + 1), np.nan, np.float32)
        ids = np.full((tokens, k + 1), -7, np.int32)
        real = tokens - 2  # the last two rows are padding
        self.ctx.hash_topk(router_logits=logits, input_ids=input_ids, tid2eid=tid2eid, topk_weights=weights,
                           topk_ids=ids, num_real_tokens_host=real, num_shared=1, routed_scaling_factor=scaling)
        for n in range(tokens):
            if n >= real:
                self.assertTrue(np.all(ids[n] == -1) and np.all(weights[n] == 0), "padding row %d" % n)
                continue
            e = tid2eid[input_ids[n]]
            x = logits[n, e].astype(np.float64)
            w = np.sqrt(np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x))))
            self.assertEqual(list(ids[n]), list(e) + [experts])
            self.assertTrue(np.allclose(weights[n, :k], w / w.sum(), rtol=1e-6, atol=0))
            self.assertAlmostEqual(float(weights[n, k]), 1 / scaling, places=6)


    def test_indexer_topk_from_logits(self):
        """The selection rule of unikv_indexer_topk_args on the caller's scores."""
        tokens, topk, max_pages = 4, 6, 2
        page_table = np.array([[3, 1], [0, 2]], np.int32)
        batch_id = np.array([0, 1, 0, -1], np.int32)
        positions = np.array([30, 300, 11, 5], np.int32)
        width = max_pages * 64
        logits = self.rng.normal(size=(tokens, width)).astype(np.float32)
        logits[0, 2] = logits[0, 5]  # a tie: the lower key index wins
        out = np.full((tokens, topk), -7, np.int32)
        self.ctx.indexer_topk_from_logits(page_table=page_table, batch_id=batch_id, positions=positions,
                                          logits=logits, topk_indices=out, topk=topk)
        for t in range(tokens):
            if batch_id[t] < 0:
                self.assertEqual(list(out[t]), [-1] * topk)
                continue
            n = (positions[t] + 1) // 4
            order = sorted(range(n), key=lambda i: (-logits[t, i], i))
            chosen = sorted(order[:topk])
            pages = [page_table[batch_id[t]][i // 64] * 64 + i % 64 for i in chosen]
            self.assertEqual(list(out[t]), pages + [-1] * (topk - len(pages)), "token %d" % t)

    def test_indexer_topk_fill_csa(self):
        """unikv_indexer_topk_fill_csa writes what unikv_indexer_topk then
        unikv_fill_csa_tail write: logits, table and CSA stream."""
        window, topk, heads = 8, 6, 4
        pool = self.ctx.create_pool([4], max_requests=2, window=window, c128_blocks=8)  # CSA pages 0..3
        slots = np.array([pool.acquire_slot(), pool.acquire_slot()], np.int32)
        page_table = np.array([[3, 1], [0, 2]], np.int32)
        batch_id = np.array([0, 1, -1], np.int32)
        positions = np.array([300, 13, 0], np.int32)
        tokens = len(batch_id)
        # Random e4m3fn codes without NaN (0x7F, 0xFF), positive key scales.
        codes = lambda *shape: (self.rng.integers(0, 0x7F, size=shape) | (self.rng.integers(0, 2, size=shape) << 7))
        cache = np.zeros((4, 8448), np.uint8)
        cache[:, :8192] = codes(4, 8192)
        cache[:, 8192:] = self.rng.uniform(0.1, 2.0, size=(4, 64)).astype(np.float32).view(np.uint8)
        q_fp8 = codes(tokens, heads, 128).astype(np.uint8)
        weights = self.rng.normal(size=(tokens, heads)).astype(np.float32)
        streams = {"swa_indptr": np.zeros(tokens + 1, np.int32), "swa_indices": np.zeros(tokens * window, np.int32),
                   "csa_indptr": np.zeros(tokens + 1, np.int32),
                   "csa_indices": np.full(tokens * (window + topk), -7, np.int32)}
        pool.build_decode_streams(batch_id=batch_id, req_slots=slots, positions=positions, csa_topk=topk, **streams)
        results = []
        for fused in (False, True):
            logits = np.full((tokens, 128), -7, np.float32)
            table = np.full((tokens, topk), -7, np.int32)
            csa_indices = streams["csa_indices"].copy()
            fields = dict(q_fp8=q_fp8, weights=weights, cache=cache, page_table=page_table, batch_id=batch_id,
                          positions=positions, logits=logits, topk_indices=table,
                          cache_dtype=unikv.DTYPE_FP8_E4M3FN, topk=topk)
            if fused:
                pool.indexer_topk_fill_csa(streams["csa_indptr"], csa_indices, **fields)
            else:
                self.ctx.indexer_topk(**fields)
                pool.fill_csa_tail(batch_id=batch_id, positions=positions, csa_page_indices=table,
                                   csa_indptr=streams["csa_indptr"], csa_indices=csa_indices)
            results.append((logits, table, csa_indices))
        for want, got in zip(*results):
            np.testing.assert_array_equal(got, want)
        # Token 0's tail: the pool rows of its six selected keys.
        swa_rows = int(pool.info().swa_rows)
        start = streams["csa_indptr"][0] + window
        self.assertEqual(list(results[1][2][start : start + topk]), [swa_rows + p for p in results[1][1][0]])
        self.assertTrue((results[1][1][0] >= 0).all())

    def test_prepare_qkv_indexer_q(self):
        """unikv_prepare_qkv_indexer_q writes what unikv_prepare_qkv then
        unikv_indexer_prepare_q write."""
        tokens, heads, iheads, max_pos = 3, 4, 8, 64
        pool = self.ctx.create_pool([4], max_requests=2, window=8, c128_blocks=1)
        table = unikv.rope_table(max_pos, base=10000.0)
        positions = self.rng.integers(0, max_pos, tokens).astype(np.int32)
        q_in = to_bf16(self.rng.uniform(-2, 2, (tokens, heads, HEAD_DIM)))
        kv_in = to_bf16(self.rng.uniform(-2, 2, (tokens, HEAD_DIM)))
        kv_weight = to_bf16(self.rng.uniform(0.5, 1.5, HEAD_DIM))
        iq = to_bf16(self.rng.uniform(-2, 2, (tokens, iheads, 128)))
        iw = to_bf16(self.rng.uniform(-1, 1, (tokens, iheads)))
        rows = np.array([3, 9, 12], np.int32)
        info = pool.layer(0)
        results = []
        for fused in (False, True):
            self.ctx.memory_set(info.data, 0, int(info.bytes))
            q_out = np.zeros_like(q_in)
            q_fp8 = np.zeros((tokens, iheads, 128), np.uint8)
            w_out = np.zeros((tokens, iheads), np.float32)
            qkv = dict(q_in=(q_in, "bf16"), q_out=(q_out, "bf16"), kv_in=(kv_in, "bf16"),
                       kv_weight=(kv_weight, "bf16"), rope_table=table, positions=positions, rows=rows,
                       layer=0, q_eps=1e-6, kv_eps=1e-6)
            query = dict(q=(iq, "bf16"), weights=(iw, "bf16"), rope_table=table, positions=positions,
                         q_fp8=q_fp8, weights_out=w_out, q_dtype=unikv.DTYPE_FP8_E4M3FN, weight_scale=0.1)
            if fused:
                pool.prepare_qkv_indexer_q(query, **qkv)
            else:
                pool.prepare_qkv(**qkv)
                self.ctx.indexer_prepare_q(**query)
            stored = np.empty(int(info.bytes), np.uint8)
            self.ctx.memory_copy(stored, info.data, stored.nbytes, unikv.COPY_DEVICE_TO_HOST)
            results.append((q_out, q_fp8, w_out, stored))
        for want, got in zip(*results):
            np.testing.assert_array_equal(got, want)
        self.assertTrue(results[1][1].any() and results[1][3].any(), "outputs written")


if __name__ == "__main__":
    unittest.main()
