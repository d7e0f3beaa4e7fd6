"""FP8 query probe (host only, NumPy): the per-row error of decode attention when
the query is quantized to e4m3 per (token, head), the route that would run QK on
FP8 wgmma (bench/notes/v31.md, 31e). Keys come from an FP8 pool row as the
library stores it (448 e4m3 codes in 7 tiles of 64 with power-of-two scales, 64
bf16-exact rope dims; docs/fp8.md); softmax scale 512^-0.5, sink on. Prints the
relative L2 error of each (token, head) output row against the unquantized
query, which the tests bound by 1e-2. Run: python3 bench/probes/fp8_query_error.py
"""
import numpy as np

rng = np.random.default_rng(1)


def e4m3_values():
    vals = set()
    for e in range(16):
        for m in range(8):
            if e == 15 and m == 7:
                continue  # NaN
            vals.add((m / 8) * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(sorted(vals))


E4M3 = e4m3_values()


def e4m3_round(x):
    """Round to the nearest e4m3fn value (ties down to the smaller magnitude), saturating."""
    a = np.minimum(np.abs(x), 448.0)
    i = np.clip(np.searchsorted(E4M3, a), 1, len(E4M3) - 1)
    lo, hi = E4M3[i - 1], E4M3[i]
    return np.sign(x) * np.where(a - lo <= hi - a, lo, hi)


def quantize_rows(x):
    """Each row's own scale (amax / 448), then e4m3, then back."""
    scale = np.abs(x).max(axis=-1, keepdims=True) / 448.0 + 1e-30
    return e4m3_round(x / scale) * scale


def pool_rows(n):
    x = rng.standard_normal((n, 512))
    nope = x[:, :448].reshape(n, 7, 64)
    scale = 2.0 ** np.ceil(np.log2(np.abs(nope).max(-1, keepdims=True) / 448.0))
    nope = (e4m3_round(nope / scale) * scale).reshape(n, 448)
    return np.concatenate([nope, x[:, 448:]], 1)


def attention(q, k, sink):
    s = (q @ k.T) * 512**-0.5
    m = np.maximum(s.max(-1, keepdims=True), sink[:, None])
    p = np.exp(s - m)
    return (p @ k) / (p.sum(-1, keepdims=True) + np.exp(sink[:, None] - m))


print("keys 2176, 64 heads, 3 draws per query scale; per-row relative L2 error of the output")
for q_scale in (0.1, 0.3, 1.0, 3.0, 10.0):
    errs = []
    for _ in range(3):
        k = pool_rows(2176)
        q = rng.standard_normal((64, 512)) * q_scale
        sink = rng.standard_normal(64)
        ref = attention(q, k, sink)
        out = attention(quantize_rows(q), k, sink)
        errs.append(np.linalg.norm(out - ref, axis=-1) / np.linalg.norm(ref, axis=-1))
    e = np.concatenate(errs)
    print(f"  q ~ N(0, {q_scale}^2): max {e.max():.2e}, mean {e.mean():.2e}, rows above 1e-2: {(e > 1e-2).sum()} of {e.size}")
