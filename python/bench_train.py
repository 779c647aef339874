#!/usr/bin/env python3
"""Times one training step (forward, backward, AdamW step) of the small causal transformer of
memeff.tiny_transformer with its attention computed by memeff and by each of torch's SDPA
backends (math, efficient, flash, cudnn), in one run, and prints a table.

    python3 python/bench_train.py [--batch 8 --seq 1024 --width 1024 --heads 16 --layers 2]

Timing: CUDA events around each step after warm-up steps; the median of --steps steps. A
backend that cannot run the configuration (e.g. flash without a GPU that supports it) is listed
with the reason. Needs a CUDA device (on the CPU it times memeff against torch's math backend).
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

# Use the installed memeff (with its compiled _C), not the source folder beside this script.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import memeff.torch as mt
from memeff.tiny_transformer import TinyTransformer, memeff_attention, torch_attention

TORCH_BACKENDS = {
    "math": SDPBackend.MATH,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--dropout", type=float, default=0.1, help="attention dropout")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16",
                    help="autocast dtype of the model")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--backends", default="memeff,math,efficient,flash,cudnn")
    ap.add_argument("--json", help="also write the results to this file")
    return ap.parse_args()


class Timer:
    """CUDA events on a GPU, wall clock (after synchronizing nothing) on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def time(self, fn):
        if self.cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


def bench_one(name, args, device, dtype):
    torch.manual_seed(0)
    attention = memeff_attention if name == "memeff" else torch_attention
    model = TinyTransformer(args.vocab, args.width, args.heads, args.layers, args.seq,
                            args.dropout, attention).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step():
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = model(inputs)
        loss = F.cross_entropy(logits.float().reshape(-1, args.vocab), targets.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    timer = Timer(device)
    guard = sdpa_kernel(TORCH_BACKENDS[name]) if name in TORCH_BACKENDS else contextlib.nullcontext()
    with guard:
        for _ in range(args.warmup):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times = [timer.time(step) for _ in range(args.steps)]
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else float("nan")
    kernel = "/".join(mt.last_backends()) if name == "memeff" else ""
    return {"backend": name, "ms": statistics.median(times), "min_ms": min(times),
            "peak_mib": peak, "kernel": kernel}


def main():
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    names = [n.strip() for n in args.backends.split(",") if n.strip()]
    if device.type == "cpu":
        names = [n for n in names if n in ("memeff", "math")]
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"# training step of a {args.layers}-layer causal transformer: batch {args.batch}, "
          f"seq {args.seq}, width {args.width}, {args.heads} heads (head dim "
          f"{args.width // args.heads}), attention dropout {args.dropout}, {args.dtype} autocast; "
          f"{gpu}, torch {torch.__version__}, memeff {mt.version()}; median of {args.steps} "
          f"steps after {args.warmup} warm-up", flush=True)
    results = []
    for name in names:
        try:
            r = bench_one(name, args, device, dtype)
        except Exception as e:  # a torch backend that cannot run this configuration
            reason = str(e).strip().splitlines()[0][:100] if str(e).strip() else type(e).__name__
            r = {"backend": name, "ms": float("nan"), "min_ms": float("nan"),
                 "peak_mib": float("nan"), "kernel": "", "error": reason}
            print(f"  {name}: failed: {reason}", file=sys.stderr, flush=True)
        results.append(r)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    best_torch = min((r["ms"] for r in results if r["backend"] != "memeff" and r["ms"] == r["ms"]),
                     default=float("nan"))
    print("| attention | step ms (median) | step ms (min) | peak MiB | vs best torch | note |")
    print("|---|---|---|---|---|---|")
    for r in results:
        ratio = r["ms"] / best_torch if best_torch == best_torch else float("nan")
        note = r.get("error", r["kernel"] and f"memeff backends fwd/bwd: {r['kernel']}")
        print(f"| {r['backend']} | {r['ms']:.2f} | {r['min_ms']:.2f} | {r['peak_mib']:.0f} | "
              f"{ratio:.2f} | {note} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "device": gpu, "torch": torch.__version__,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
