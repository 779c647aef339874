#!/usr/bin/env python3
"""Times one training step (forward, backward, AdamW step) of the small causal transformer of
memeff.tiny_transformer with its attention computed by memeff's op, by torch's SDPA under its
default dispatch ("default"), by that dispatch with memeff in its slots ("slots") and by each of
torch's SDPA backends (math, efficient, flash, cudnn), in one run, eager or under torch.compile
(--compile), and prints a table.

    python3 python/bench_train.py [--batch 8 --seq 1024 --width 1024 --heads 16 --layers 2]
                                  [--compile [MODE]]

Timing: CUDA events around each step after warm-up steps; the median of --steps steps. A
backend that cannot run the configuration (e.g. flash without a GPU that supports it) is listed
with the reason. Needs a CUDA device (on the CPU it times memeff against torch's math backend).
"""
import argparse

import bench_common as bc  # first: makes `import memeff` find the installed package

import torch
from torch.nn import functional as F

from memeff.tiny_transformer import TinyTransformer, memeff_attention, torch_attention


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--dropout", type=float, default=0.1, help="attention dropout")
    ap.add_argument("--dtype", choices=list(bc.DTYPES), default="bf16",
                    help="autocast dtype of the model")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--backends", default="memeff,slots,default," + ",".join(bc.TORCH_BACKENDS))
    bc.add_compile_argument(ap)
    ap.add_argument("--json", help="also write the results to this file")
    return ap.parse_args()


def build(name, args, device):
    attention = memeff_attention if name == "memeff" else torch_attention
    model = TinyTransformer(args.vocab, args.width, args.heads, args.layers, args.seq,
                            args.dropout, attention).to(device)
    return bc.maybe_compile(model, args.compile)


def main():
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = bc.DTYPES[args.dtype]
    names = bc.backend_names(args.backends, device)
    env = bc.environment(device)
    print(f"# training step of a {args.layers}-layer causal transformer: batch {args.batch}, "
          f"seq {args.seq}, width {args.width}, {args.heads} heads (head dim "
          f"{args.width // args.heads}), attention dropout {args.dropout}, {args.dtype} autocast"
          f"{bc.run_mode(args.compile)}; "
          f"{bc.describe(env)}; median of {args.steps} steps after {args.warmup} warm-up",
          flush=True)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def loss_of(model):
        logits = model(inputs)
        return F.cross_entropy(logits.float().reshape(-1, args.vocab), targets.reshape(-1))

    results, notes = bc.bench_training_steps(names, lambda n: build(n, args, device), loss_of,
                                             device, dtype, args.warmup, args.steps)
    bc.print_step_table(results, notes)
    bc.write_json(args.json, {**env, "args": vars(args), "results": results})

if __name__ == "__main__":
    main()
