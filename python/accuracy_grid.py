#!/usr/bin/env python3
"""Runs issue 11's accuracy grid and prints a markdown table: per dtype and output, memeff's error
ratio (max|memeff - fp64 math| / max(max|torch's fp16/bf16 math - fp64 math|, 1e-3)) as max,
median and 95th percentile over the points, their count, and how many exceed PyTorch's bar for its
fused kernels (out 4, dq 160, dk 25, dv 8, dbias 45) and FlashAttention-2's ~2.

    PYTHONPATH=<site holding memeff> python3 python/accuracy_grid.py [--device cuda]
        [--dtypes fp16,bf16] [--quick] [--json PATH]

The grid and the per-point measurement are python/tests/accuracy_grid_points.py, the ones
python/tests/test_accuracy_grid.py asserts: the issue's grid by default (for a GPU), --quick the
small one the CPU tests run. Progress goes to stderr. Exit status 1 when a point exceeds PyTorch's
bar (where the test fails).
"""
import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time

# Use the installed memeff (with its compiled _C), not the source folder beside this script; the
# grid lives with the tests that assert it.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.join(_HERE, "tests"))

import torch  # noqa: E402

import memeff.torch as mt  # noqa: E402
from accuracy_grid_points import (DEFAULT_ATOL, DTYPE_NAMES, DTYPES_BY_NAME, FA2_BAR,  # noqa: E402
                                  FULL_GRID, OUTPUTS, PYTORCH_BARS, QUICK_GRID, exceeds, grid,
                                  measure)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="cuda or cpu (default: cuda when torch sees a GPU)")
    ap.add_argument("--dtypes", default="fp16,bf16",
                    help="comma-separated, of fp16, bf16 (default: both)")
    ap.add_argument("--quick", action="store_true",
                    help=f"the small grid of the CPU tests ({QUICK_GRID.points} points per dtype) "
                         f"instead of the issue's ({FULL_GRID.points} per dtype)")
    ap.add_argument("--json", metavar="PATH", help="also write every point's numbers here")
    args = ap.parse_args()
    try:
        args.dtypes = [DTYPES_BY_NAME[name.strip()] for name in args.dtypes.split(",")]
    except KeyError as e:
        ap.error(f"--dtypes: unknown dtype {e.args[0]!r}; expected fp16, bf16")
    if args.device not in ("cuda", "cpu") or (args.device == "cuda"
                                              and not torch.cuda.is_available()):
        ap.error(f"--device {args.device}: expected cpu, or cuda with a GPU torch can see")
    return args


def nearest_rank(sorted_values, fraction):
    return sorted_values[max(0, math.ceil(fraction * len(sorted_values)) - 1)]


def sortable(ratio):
    """NaN (a non-finite output) as inf: the worst, exceeding every bar."""
    return math.inf if math.isnan(ratio) else ratio


def fmt(x):
    return "non-finite" if not math.isfinite(x) else f"{x:.3g}"


def summary_rows(results, dtypes):
    rows = []
    for dtype in dtypes:
        for output in OUTPUTS:
            measured = [(r.outputs[output], r.point) for r in results
                        if r.point.dtype == dtype and output in r.outputs]
            if not measured:
                continue
            ratios = sorted(sortable(e.ratio) for e, _ in measured)
            over = [(e, p) for e, p in measured if exceeds(e.ratio, PYTORCH_BARS[output])]
            _, worst_p = max(measured, key=lambda ep: sortable(ep[0].ratio))
            rows.append({
                "dtype": DTYPE_NAMES[dtype], "output": output, "points": len(measured),
                "max": ratios[-1], "median": statistics.median(ratios),
                "p95": nearest_rank(ratios, 0.95), "bar": PYTORCH_BARS[output],
                "over_pytorch_bar": len(over),
                "over_fa2_bar": sum(1 for e, _ in measured if exceeds(e.ratio, FA2_BAR)),
                "worst_point": worst_p.name,
            })
    return rows


def print_table(rows, device, elapsed):
    print(f"memeff {mt.version()} on {device}, torch {torch.__version__}: ratio = max|memeff - "
          f"fp64 math| / max(max|torch lp math - fp64 math|, floor), floor "
          f"{DEFAULT_ATOL[torch.float16]:g} (fp16, bf16); {elapsed:.0f} s\n")
    print("| dtype | output | points | max | median | p95 | PyTorch bar | > bar | > FA2 ~2 "
          "| worst point |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['dtype']} | {r['output']} | {r['points']} | {fmt(r['max'])} | "
              f"{fmt(r['median'])} | {fmt(r['p95'])} | {r['bar']:g} | {r['over_pytorch_bar']} | "
              f"{r['over_fa2_bar']} | {r['worst_point']} |")


def point_json(result):
    fields = dataclasses.asdict(result.point)
    fields["dtype"] = DTYPE_NAMES[result.point.dtype]
    return {"name": result.point.name, **fields, "backends": list(result.backends),
            "outputs": {name: dataclasses.asdict(e) for name, e in result.outputs.items()}}


def main():
    args = parse_args()
    spec = QUICK_GRID if args.quick else FULL_GRID
    if args.device == "cpu" and not args.quick:
        print("note: the issue's grid on the CPU takes long (fp64 and fp16/bf16 math at "
              "2048x2048); --quick runs the CPU tests' subset", file=sys.stderr)
    points = [p for dtype in args.dtypes for p in grid(args.device, dtype, spec)]
    results = []
    start = time.perf_counter()
    for i, point in enumerate(points, 1):
        result = measure(point)
        results.append(result)
        worst = max(result.outputs, key=lambda n: result.outputs[n].ratio / PYTORCH_BARS[n])
        print(f"[{i}/{len(points)}] {point.name} ({'/'.join(result.backends)}): "
              + " ".join(f"{n} {fmt(e.ratio)}" for n, e in result.outputs.items())
              + f"  (closest to its bar: {worst})", file=sys.stderr)
    elapsed = time.perf_counter() - start

    rows = summary_rows(results, args.dtypes)
    print_table(rows, args.device, elapsed)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": args.device, "torch": torch.__version__,
                       "memeff": mt.version(), "grid": "quick" if args.quick else "full",
                       "pytorch_bars": PYTORCH_BARS, "fa2_bar": FA2_BAR,
                       "floor": {DTYPE_NAMES[d]: a for d, a in DEFAULT_ATOL.items()},
                       "summary": rows, "points": [point_json(r) for r in results]},
                      f, indent=1, allow_nan=True)
        print(f"wrote {args.json}", file=sys.stderr)
    failing = [r.point.name for r in results for n, e in r.outputs.items()
               if exceeds(e.ratio, PYTORCH_BARS[n])]
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
