#!/usr/bin/env python3
"""Warp samples of a warp-specialized kernel per role, from Nsight Compute.

The roles of the wgmma kernels (producers, consumer warpgroups) start with a
`setmaxnreg` (SASS `USETMAXREG`), so splitting the kernel's SASS at those
instructions splits its warp samples by role. Reads the source page of a
report with per-instruction stall columns:

    ncu --set full -k regex:KERNEL --launch-skip 3 --launch-count 1 -o rep BINARY
    ncu --import rep.ncu-rep --page source --csv --print-source sass > sass.csv
    scripts/ncu-roles.py sass.csv

and prints, per region holding at least 0.5% of the samples, its share of the
samples, its top stall reasons and the opcodes its samples sit on
(bench/notes/v37.md has an example).
"""
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"


def main(path):
    rows = list(csv.reader(open(path, newline="")))
    head = next(i for i, r in enumerate(rows) if SAMPLES in r)
    header, data = rows[head], rows[head + 1:]
    source = next(i for i, c in enumerate(header) if c.startswith("Source"))
    samples = header.index(SAMPLES)
    # Issued and not-issued stall columns alike ("stall_wait", "stall_wait (Not Issued)").
    stalls = [i for i, c in enumerate(header) if c.startswith("stall_") and "Not Issued" not in c]
    regions = []
    name, counts, opcodes = "kernel entry", collections.Counter(), collections.Counter()
    for row in data:
        if len(row) <= max(source, samples):
            continue
        text = row[source].strip()
        if "USETMAXREG" in text:
            regions.append((name, counts, opcodes))
            name, counts, opcodes = text, collections.Counter(), collections.Counter()
        n = float(row[samples] or 0)
        counts[SAMPLES] += n
        for i in stalls:
            counts[header[i]] += float(row[i] or 0)
        words = text.split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if words:
            opcodes[words[0].split(".")[0]] += n
    regions.append((name, counts, opcodes))
    total = sum(c[SAMPLES] for _, c, _ in regions) or 1.0
    for name, counts, opcodes in regions:
        n = counts[SAMPLES]
        if n < 0.005 * total:
            continue
        print(f"{name}: {n:.0f} samples ({100 * n / total:.1f}%)")
        top = sorted(((v, k) for k, v in counts.items() if k != SAMPLES), reverse=True)[:8]
        print("  stalls: " + "; ".join(f"{k[6:]} {100 * v / n:.1f}%" for v, k in top))
        print("  opcodes: " + "; ".join(f"{k} {100 * v / n:.1f}%" for k, v in opcodes.most_common(10)))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
