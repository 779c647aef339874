#!/usr/bin/env python3
"""Per-call cost of memeff.torch.scaled_dot_product_attention beside torch's own SDPA backends on
tiny shapes, where the host-side path (Python, dispatch, validation, allocation, launches) is the
whole cost: forward and forward+backward, with and without dropout, in one run.

    python3 python/bench_overhead.py [--device cuda|cpu] [--json FILE]

Timing: N calls back to back, then one synchronization; the per-call time is the wall time over
N (what a training loop sees when the GPU is not the bottleneck), the median of --repeats such
loops after a warm-up. "vs flash" is memeff's time over torch's flash backend's in the same row
set (torch's CPU flash kernel on the CPU), and over the fastest torch backend that ran (flash
has no dropout on the CPU). Also one BERT-large-sized layer (32×16×384×64) on CUDA, where the
overhead should no longer show. Ends with a table; --json writes the rows.
"""
import argparse
import statistics
import sys
import time

import bench_common as bc  # first: makes `import memeff` find the installed package

import torch
from torch.nn import functional as F
from torch.nn.attention import sdpa_kernel

import memeff.torch as mt


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"],
                    default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--calls", type=int, default=100, help="calls per timed loop")
    ap.add_argument("--repeats", type=int, default=7, help="timed loops (the median is kept)")
    ap.add_argument("--layout", choices=["bhld", "blhd"], default="bhld",
                    help="q/k/v storage: contiguous [B, H, L, D], or [B, L, H, D] viewed "
                         "as [B, H, L, D] (what Hugging Face models pass)")
    ap.add_argument("--no-large", action="store_true", help="skip the BERT-large-sized layer")
    ap.add_argument("--json", help="also write the rows to this file")
    return ap.parse_args()


def make_inputs(shape, dtype, device, layout, requires_grad):
    B, H, L, D = shape
    gen = torch.Generator().manual_seed(0)

    def one():
        if layout == "blhd":
            t = torch.randn(B, L, H, D, generator=gen).to(device, dtype).transpose(1, 2)
        else:
            t = torch.randn(B, H, L, D, generator=gen).to(device, dtype)
        return t.requires_grad_(requires_grad)

    q, k, v = one(), one(), one()
    dout = torch.randn(B, H, L, D, generator=gen).to(device, dtype)
    return q, k, v, dout


def attention_fn(impl):
    if impl == "memeff":
        return mt.scaled_dot_product_attention
    return F.scaled_dot_product_attention


def per_call_us(impl, shape, dtype, device, layout, dropout_p, backward, calls, repeats):
    """Median over `repeats` loops of the wall time per call (µs), or a reason string."""
    q, k, v, dout = make_inputs(shape, dtype, device, layout, backward)
    fn = attention_fn(impl)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def one_call():
        out = fn(q, k, v, dropout_p=dropout_p)
        if backward:
            torch.autograd.grad(out, (q, k, v), dout)

    guard = sdpa_kernel(bc.TORCH_BACKENDS[impl]) if impl in bc.TORCH_BACKENDS else None
    try:
        if guard is not None:
            guard.__enter__()
        for _ in range(max(10, calls // 10)):  # warm-up: kernels loaded, caches filled
            one_call()
        sync()
        times = []
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            for _ in range(calls):
                one_call()
            sync()
            times.append((time.perf_counter() - start) / calls * 1e6)
        return statistics.median(times)
    except RuntimeError as e:  # a torch backend that cannot run this configuration
        return bc.reason(e)
    finally:
        if guard is not None:
            guard.__exit__(None, None, None)


def main():
    args = parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    impls = ["memeff", "flash", "efficient", "cudnn", "math"] if device.type == "cuda" else \
        ["memeff", "flash", "math"]
    shapes = [("tiny", (1, 1, 16, 64), args.calls)]
    if device.type == "cuda" and not args.no_large:
        shapes.append(("bert-large", (32, 16, 384, 64), max(20, args.calls // 10)))
    env = bc.environment(device)
    print(f"# per-call time, {bc.describe(env)}, {str(dtype).split('.')[-1]}, {args.layout} "
          f"inputs; median of {args.repeats} loops", flush=True)
    rows = []
    for shape_name, shape, calls in shapes:
        for backward in (False, True):
            for dropout_p in (0.0, 0.1):
                row = {"shape": shape_name, "B,H,L,D": list(shape),
                       "pass": "fwd+bwd" if backward else "fwd", "dropout": dropout_p}
                for impl in impls:
                    row[impl] = per_call_us(impl, shape, dtype, device, args.layout, dropout_p,
                                            backward, calls, args.repeats)
                rows.append(row)
                print(f"  {row}", file=sys.stderr, flush=True)

    def cell(x):
        return f"{x:.1f}" if isinstance(x, float) else "n/a"

    def ratio(a, b):
        return a / b if isinstance(a, float) and isinstance(b, float) else float("nan")

    table = []
    for r in rows:
        timed = [r[i] for i in impls[1:] if isinstance(r[i], float)]
        r["vs_flash"] = ratio(r["memeff"], r["flash"])
        r["vs_best_torch"] = ratio(r["memeff"], min(timed)) if timed else float("nan")
        table.append([f"{r['shape']} {tuple(r['B,H,L,D'])}", r["pass"], str(r["dropout"])] +
                     [cell(r[i]) for i in impls] +
                     [f"{r['vs_flash']:.2f}", f"{r['vs_best_torch']:.2f}"])
    bc.print_table(["shape", "pass", "dropout"] + [f"{i} µs" for i in impls] +
                   ["memeff / flash", "memeff / best torch"], table)
    bc.write_json(args.json, {**env, "dtype": str(dtype), "layout": args.layout, "rows": rows})


if __name__ == "__main__":
    main()
