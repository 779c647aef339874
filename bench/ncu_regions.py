#!/usr/bin/env python3
"""Where a step of the Hopper backward spends its time, from an Nsight Compute source export.

    ncu --clock-control none -k regex:attention_backward_kernel --launch-count 1 \\
        --section SourceCounters --section WarpStateStats -o rep \\
        memeff run --device cuda --backend cuda_sm90 ... --iters 1 --warmup 0 --check none
    ncu -i rep.ncu-rep --page source --csv --print-source sass > rep.csv
    bench/ncu_regions.py rep.csv [rep2.csv ...] [--json out.json]

The consumer loop of attention_backward_kernel (src/cuda/kernels/sm90/bwd_kernel.cuh) is the
run of instructions executed as often as its first Sᵀ wgmma. It is split at landmarks of the
step, in program order:

    loop top      .. the first Sᵀ wgmma (A and B from shared memory)
    S, dP issue   .. the wait for Sᵀ (WARPGROUP.DEPBAR.LE gsb0, 0x1)
    wait S, P     .. the wait for dPᵀ (WARPGROUP.DEPBAR.LE gsb0, 0x0)
    wait dP, dS   .. the first dV wgmma (A from registers)
    dV, dS store  .. the dS barrier (BAR.SYNC, named barrier 1) included
    dQ, dK issue  .. the wait for dQ (WARPGROUP.DEPBAR.LE gsb0, 0x1) included
    dQ out, end   .. the loop's last instruction

and each region's warp-stall samples (a sample is one warp at one instant, so a region's count
is the warp-time spent there) are printed with its three largest stall reasons. Samples outside
the loop (prologue, epilogue, the producer warps) are counted apart. The wide tile (head dims
129-256) has another step and is refused by name of the missing landmark.
"""
import argparse
import csv
import json
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
REGIONS = ["loop top", "S, dP issue", "wait S, P", "wait dP, dS", "dV, dS store", "dQ, dK issue",
           "dQ out, end"]

# wgmma with both operands in shared memory, not transposed A (Sᵀ, dPᵀ): "HGMMA... gdesc[URx], "
SMEM_WGMMA = re.compile(r"HGMMA\.\S+ R\d+, gdesc\[")
# wgmma with A from registers (dV, dK): "HGMMA... R24, R196, gdesc[...]"
REG_WGMMA = re.compile(r"HGMMA\.\S+ R\d+, R\d+, gdesc\[")


def read_export(path):
    """Rows of an ncu source-page CSV: the first line names the kernel, the second is the header."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows[:3]) if "Source" in r and "Address" in r), None)
    if header_at is None:
        raise SystemExit(f"{path}: no header with Address and Source (an ncu --page source --csv "
                         "export?)")
    header = rows[header_at]
    for column in (SAMPLES, EXECUTED):
        if column not in header:
            raise SystemExit(f"{path}: column '{column}' missing (profile with --section "
                             "SourceCounters and --section WarpStateStats)")
    kernel = rows[0][1] if header_at > 0 and len(rows[0]) > 1 else ""
    index = {name: i for i, name in enumerate(header)}
    return kernel, index, [r for r in rows[header_at + 1:] if len(r) == len(header)]


def number(text):
    text = text.replace(",", "").strip()
    return float(text) if text else 0.0


def split(path):
    kernel, ix, rows = read_export(path)
    source = [r[ix["Source"]] for r in rows]
    executed = [r[ix[EXECUTED]] for r in rows]
    samples = [number(r[ix[SAMPLES]]) for r in rows]
    reasons = [name for name in ix if name.startswith("stall_") and "Not Issued" not in name]

    first_s = next((k for k, s in enumerate(source) if SMEM_WGMMA.search(s) and "tnspA" not in s),
                   None)
    if first_s is None:
        raise SystemExit(f"{path}: landmark 'first Sᵀ wgmma' not found")
    per_step = executed[first_s]
    loop = [k for k, c in enumerate(executed) if c == per_step]
    begin, end = loop[0], loop[-1]

    def after(start, what, test):
        for k in range(start, end + 1):
            if executed[k] == per_step and test(source[k]):
                return k
        raise SystemExit(f"{path}: landmark '{what}' not found after the first Sᵀ wgmma")

    wait_s = after(first_s, "wait for Sᵀ", lambda s: "WARPGROUP.DEPBAR.LE gsb0, 0x1" in s)
    wait_dp = after(wait_s, "wait for dPᵀ", lambda s: "WARPGROUP.DEPBAR.LE gsb0, 0x0" in s)
    first_dv = after(wait_dp, "first dV wgmma", lambda s: REG_WGMMA.search(s) is not None)
    ds_barrier = after(first_dv, "dS barrier", lambda s: re.search(r"BAR\.SYNC\S* 0x1,", s))
    wait_dq = after(ds_barrier, "wait for dQ", lambda s: "WARPGROUP.DEPBAR.LE gsb0, 0x1" in s)
    bounds = [begin, first_s, wait_s, wait_dp, first_dv, ds_barrier + 1, wait_dq + 1, end + 1]

    total = sum(samples)
    regions = []
    for name, lo, hi in zip(REGIONS, bounds, bounds[1:]):
        by_reason = {r[6:]: sum(number(rows[k][ix[r]]) for k in range(lo, hi)) for r in reasons}
        top = sorted(by_reason.items(), key=lambda kv: -kv[1])[:3]
        regions.append({"region": name, "samples": sum(samples[lo:hi]), "instructions": hi - lo,
                        "top_reasons": [[r, v] for r, v in top if v > 0]})
    in_loop = sum(samples[begin:end + 1])
    return {"file": path, "kernel": kernel, "executions_per_instruction": per_step,
            "total_samples": total, "loop_samples": in_loop, "outside_loop": total - in_loop,
            "regions": regions}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("exports", nargs="+", help="ncu --page source --csv --print-source sass")
    parser.add_argument("--json", help="also write the regions of every export here")
    args = parser.parse_args(argv)
    results = [split(path) for path in args.exports]
    for res in results:
        print(f"{res['file']}: {res['total_samples']:.0f} samples, {res['loop_samples']:.0f} in "
              f"the consumer loop ({res['outside_loop']:.0f} outside)")
        print(f"  {'region':14s} {'samples':>9s} {'share':>6s} {'instr':>6s}  top stall reasons")
        for reg in res["regions"]:
            share = reg["samples"] / res["loop_samples"] * 100 if res["loop_samples"] else 0.0
            reasons = ", ".join(f"{r} {v:.0f}" for r, v in reg["top_reasons"])
            print(f"  {reg['region']:14s} {reg['samples']:9.0f} {share:5.1f}% "
                  f"{reg['instructions']:6d}  {reasons}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
