#!/usr/bin/env python3
"""PyTorch SDPA's forward on decode shapes, the peer of bench/splitkv_decode.sh.

Each shape is B,H,Lq,Lk,D,causal,Hkv:dropout with causal 0 (none) or 1, aligned as --causal-align
says: top_left (is_causal) or bottom_right (torch.nn.attention.bias.causal_lower_right; no mask at
all when Lq = 1), as memeff bench's shapes. GQA runs
through enable_gqa; where a backend refuses it, K and V are expanded to H heads before timing
(row key "gqa": "expanded"). Forward only (dropout in training mode), CUDA events around each
call after a 256 MiB write that empties L2, median of --iters calls.
"""
import argparse, json, sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


def timed_ms(fn, iters, flush):
    for _ in range(5):
        fn()
    times = []
    for _ in range(iters):
        flush.zero_()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def call(q, k, v, causal, p, gqa):
    Lq, Lk = q.shape[2], k.shape[2]
    if causal == 2 and Lq > 1:
        from torch.nn.attention.bias import causal_lower_right
        mask = causal_lower_right(Lq, Lk)
        if gqa:
            return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                                          enable_gqa=True)
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
    return lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal == 1,
                                                  enable_gqa=gqa)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", required=True)
    ap.add_argument("--backends", nargs="*", default=["flash", "efficient", "cudnn", "math"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--causal-align", default="bottom_right", choices=["top_left", "bottom_right"])
    ap.add_argument("--json")
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    dev = torch.device("cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    rows = []
    for s in a.shapes:
        fields, p = s.split(":") if ":" in s else (s, "0")
        B, H, Lq, Lk, D, causal, Hkv = (int(x) for x in fields.split(","))
        if causal:
            causal = 2 if a.causal_align == "bottom_right" else 1
        p = float(p)
        q = torch.randn(B, H, Lq, D, device=dev, dtype=dtype)
        k = torch.randn(B, Hkv, Lk, D, device=dev, dtype=dtype)
        v = torch.randn(B, Hkv, Lk, D, device=dev, dtype=dtype)
        for be in a.backends:
            row = {"B": B, "H": H, "Hkv": Hkv, "Lq": Lq, "Lk": Lk, "D": D,
                   "causal_mode": ["none", "top_left", "bottom_right"][causal], "dropout": p,
                   "dtype": a.dtype, "backend": "torch_" + be, "gqa": "native"}
            try:
                with sdpa_kernel(BACKENDS[be]):
                    try:
                        fn = call(q, k, v, causal, p, Hkv != H)
                        fn()
                    except (RuntimeError, TypeError):
                        if Hkv == H:
                            raise
                        ke = k.repeat_interleave(H // Hkv, dim=1)
                        ve = v.repeat_interleave(H // Hkv, dim=1)
                        fn = call(q, ke, ve, causal, p, False)
                        fn()
                        row["gqa"] = "expanded"
                    row["fwd_ms"] = timed_ms(fn, a.iters, flush)
                print(f"{s:32s} {be:9s} fwd {row['fwd_ms']:8.4f} ms ({row['gqa']} GQA)", flush=True)
            except Exception as e:  # a backend that refuses the shape
                row["error"] = str(e).splitlines()[0][:200]
                print(f"{s:32s} {be:9s} unsupported: {row['error'][:80]}", flush=True)
            rows.append(row)
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                      fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
