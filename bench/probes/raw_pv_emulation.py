# Emulates the index plumbing of the raw variant's PV (kernels/attention.cu,
# raw_pv and the softmax writers): P^T words, factor words, the ldmatrix.trans
# fragment builders, wgmma m64nN k16 register/descriptor semantics and dim_of,
# for the 16-head kernel (one warpgroup, eight M tiles) and the 32-head one
# (two warpgroups, four each). Checks O^T against a direct sum and that every
# ldmatrix phase is free of bank conflicts. Run: python3 raw_pv_emulation.py
import numpy as np

rng = np.random.default_rng(1)
ROPE = 7


def qk_slot(m):
    return (m & ~15) | ((m & 1) << 2) | ((m >> 1) & 1) | ((m & 4) << 1) | ((m >> 2) & 2)


def raw_pv_slot(hh, i):
    return qk_slot(4 * hh + (i >> 1) + 8 * (i & 1))


def raw_fac_at(b, tq, kk, hh):
    return ((b * 4 + tq) * 4 + kk) * 2 + hh


def code_row(lane):  # slot of raw_pv_code_row
    m = lane >> 3
    return 16 * (m >> 1) + raw_pv_slot(m & 1, lane & 7)


def rope_row(lane):  # (slot, dim offset) of raw_pv_rope_row
    m = lane >> 3
    return raw_pv_slot(m >> 1, lane & 7), 8 * (m & 1)


def run(nh, first_of_wg, tiles):
    codes = rng.integers(-8, 8, size=(64, 448)).astype(float)
    scale = rng.integers(110, 130, size=(64, 7))
    rope = rng.standard_normal((64, 64))
    P = rng.random((nh, 64))  # P[h][slot]
    wgs = len(first_of_wg)
    own = nh // wgs if wgs > 1 else nh  # heads a softmax thread group writes
    ref = [scale[:, b].max() for b in range(7)]
    PT = np.zeros((nh, 64))
    fac = np.zeros((7 * 32, 2))
    for w, first in enumerate(first_of_wg):
        for q in range(4):
            for g in range(8):
                for tq in range(4):
                    slots = [qk_slot(16 * q + g), qk_slot(16 * q + g + 8)]
                    for c in range(own // 4):  # P^T words: heads of this thread
                        h = (w * own if wgs > 1 else 0) + 8 * (c // 2) + 2 * tq + (c & 1)
                        PT[h, 16 * q + 2 * g] = P[h, slots[0]]
                        PT[h, 16 * q + 2 * g + 1] = P[h, slots[1]]
                    for j in range(tiles // 4):  # raw_write_factors
                        b = first + tq + 4 * j
                        if b < ROPE:
                            fac[raw_fac_at(b, g & 3, q, g >> 2)] = [2.0 ** (scale[slots[e], b] - ref[b]) for e in range(2)]
    got = np.full((512, nh), np.nan)
    for w, first in enumerate(first_of_wg):
        for mb in range(tiles):
            block = first + mb
            for qw in range(4):
                A = np.zeros((16, 64))
                for pp in range(2):
                    for lane in range(32):
                        g, tq = lane >> 2, lane & 3
                        for m in range(4):  # matrix m, rows from lanes 8m..8m+7
                            rows = [8 * m + r for r in (2 * tq, 2 * tq + 1)]
                            if block < ROPE:
                                kk, hh = 2 * pp + (m >> 1), m & 1
                                f = fac[raw_fac_at(block, tq, kk, hh)]
                                for e, L in enumerate(rows):
                                    s = code_row(L) + 32 * pp
                                    base = 64 * block + 16 * qw + 2 * g
                                    # prmt 0x3120 + cvt lo/hi: row g <- dim 2g, row g+8 <- dim 2g+1
                                    A[g, 16 * kk + 8 * hh + 2 * tq + e] = codes[s, base] * f[e]
                                    A[g + 8, 16 * kk + 8 * hh + 2 * tq + e] = codes[s, base + 1] * f[e]
                            else:
                                for kq in range(2):
                                    kk = 2 * pp + kq
                                    hh, dh = m >> 1, m & 1
                                    for e, L in enumerate(rows):
                                        s, d0 = rope_row(L)
                                        s += 16 * kk
                                        A[g + 8 * dh, 16 * kk + 8 * hh + 2 * tq + e] = rope[s, 16 * qw + d0 + g]
                D = A @ PT.T  # B[k][n] = P^T[n][k]
                for lane in range(32):
                    g, tq = lane >> 2, lane & 3
                    for i in range(nh // 2):
                        hi = 1 if i & 2 else 0
                        h = 8 * (i // 4) + 2 * tq + (i & 1)
                        d = 64 * block + 16 * qw + (2 * g + hi if block < ROPE else g + 8 * hi)
                        assert np.isnan(got[d, h])
                        got[d, h] = D[g + 8 * hi, h]
    want = np.zeros((512, nh))
    for s in range(64):
        for b in range(7):
            want[64 * b:64 * b + 64] += np.outer(codes[s, 64 * b:64 * b + 64] * 2.0 ** (scale[s, b] - ref[b]), P[:, s])
        want[448:] += np.outer(rope[s], P[:, s])
    return np.abs(got - want).max(), int(np.isnan(got).sum())


print("16 heads: max abs err %.3g, unwritten %d" % run(16, [0], 8))
print("32 heads: max abs err %.3g, unwritten %d" % run(32, [0, 4], 4))
for name, row in (("codes", lambda L: code_row(L) * 592 + 0), ("rope", lambda L: rope_row(L)[0] * 592 + 2 * rope_row(L)[1])):
    for m in range(4):
        groups = {(row(8 * m + i) // 16) % 8 for i in range(8)}
        assert len(groups) == 8, (name, m, groups)
print("ldmatrix phases conflict-free")
