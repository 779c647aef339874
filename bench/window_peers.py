#!/usr/bin/env python3
"""Sliding-window attention in PyTorch's kernels, timed as `memeff run --check none` times memeff's:
FlashAttention-2's local attention (aten._flash_attention_forward/backward with window_size_left/right)
and FlexAttention (a compiled sliding-window block mask; no dropout). One JSON object per row on
stdout, progress on stderr. Causal windows, top-left aligned (Lq = Lk): query i sees keys i-W .. i.

  python3 bench/window_peers.py --shapes 2,16,16384,128 --windows 512 4096 --dropout 0 0.1
"""
import argparse, json, statistics, sys, time

import torch


def timed(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    ms = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        ms.append(a.elapsed_time(b))
    return statistics.median(ms)


def flash_row(B, H, L, D, W, p, dtype, warmup, iters):
    q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=dtype) for _ in range(3))
    do = torch.randn_like(q)
    f = torch.ops.aten._flash_attention_forward
    kw = dict(scale=None, window_size_left=W, window_size_right=0)
    fwd = lambda: f(q, k, v, None, None, L, L, p, True, False, **kw)
    out, lse, rng, unused, _ = fwd()
    bwd = lambda: torch.ops.aten._flash_attention_backward(do, q, k, v, out, lse, None, None, L, L, p, True,
                                                           rng, unused, **kw)
    return timed(fwd, warmup, iters), timed(bwd, warmup, iters)


_flex = {}


def flex_row(B, H, L, D, W, dtype, warmup, iters):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    if "fn" not in _flex:
        # the backward is timed again and again on one graph, which donated buffers forbid
        from torch._functorch import config as functorch_config
        functorch_config.donated_buffer = False
        _flex["fn"] = torch.compile(flex_attention)
    mask = create_block_mask(lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= W), None, None, L, L, device="cuda")
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    do = torch.randn(B, H, L, D, device="cuda", dtype=dtype)
    fn = _flex["fn"]
    fwd = lambda: fn(q, k, v, block_mask=mask)
    out = fwd()
    def bwd():
        torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    return timed(fwd, warmup, iters), timed(bwd, warmup, iters)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", required=True, help="B,H,L,D")
    ap.add_argument("--windows", nargs="+", type=int, required=True)
    ap.add_argument("--dropout", nargs="+", type=float, default=[0.0])
    ap.add_argument("--backends", default="flash,flex")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    backends = a.backends.split(",")
    for s in a.shapes:
        B, H, L, D = (int(x) for x in s.split(","))
        for W in a.windows:
            pairs = L * (W + 1) - W * (W + 1) // 2 if W < L else L * (L + 1) // 2
            flops = 4 * B * H * D * pairs
            for be in backends:
                for p in (a.dropout if be == "flash" else [0.0]):
                    t0 = time.time()
                    try:
                        if be == "flash":
                            f, b = flash_row(B, H, L, D, W, p, dtype, a.warmup, a.iters)
                        else:
                            f, b = flex_row(B, H, L, D, W, dtype, a.warmup, a.iters)
                        row = dict(backend=be, B=B, H=H, L=L, D=D, window=W, dropout=p, fwd_ms=f, bwd_ms=b,
                                   fwd_tflops=flops / f / 1e9, bwd_tflops=2.5 * flops / b / 1e9)
                    except Exception as e:  # a peer that cannot run a row says why
                        row = dict(backend=be, B=B, H=H, L=L, D=D, window=W, dropout=p, error=f"{type(e).__name__}: {e}"[:300])
                    print(json.dumps(row), flush=True)
                    print(f"[{be}] B={B} H={H} L={L} D={D} W={W} p={p}: {time.time() - t0:.1f} s", file=sys.stderr)
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
