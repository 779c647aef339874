#!/usr/bin/env python3
"""Packed variable-length attention on the GPU: memeff.torch.varlen_attention beside memeff on
the same sequences padded to the longest, torch's FlashAttention-2 varlen path and cuDNN (SDPA
on the padded batch), forward and forward+backward, with and without dropout.

    python3 python/bench_varlen.py [--tokens 32768] [--head-dims 64,128] [--json FILE]

The batch: sequence lengths drawn uniformly from --min-len..--max-len (64..4096) with a fixed
seed until about --tokens tokens; causal; bf16; --heads query heads (and --kv-heads). Peers:

  memeff_varlen       memeff.torch.varlen_attention on the packed [T, H, D] tensors
  memeff_padded       memeff's dense op on the padded [S, H, Lmax, D] batch (right padding with
                      causal needs no key mask: a real query row sees real keys only)
  torch_flash_varlen  torch's FlashAttention-2 varlen path, the first that runs of:
                      torch.nn.attention.varlen.varlen_attn (no dropout),
                      torch.ops.aten._flash_attention_forward with cum_seq (dropout too),
                      nested jagged tensors with SDPA on the flash backend
  torch_flash_padded  SDPA's flash backend on the padded batch
  cudnn_padded        SDPA's cuDNN backend on the padded batch, where it accepts the case

"predicted" is the time memeff would take on the real (unpadded) FLOPs at its dense throughput:
memeff's dense op is timed on one equal-length batch of about the same tokens (length: the
FLOP-weighted mean sequence length, a multiple of 64) and its TFLOP/s divide the packed batch's
FLOPs (the project's convention, bench_common.forward_flops and flop_factor: 4·H·Lq·Lk·D per
sequence, halved when causal; forward+backward 3.5 times that). The table gives memeff_varlen / predicted (1.0: packing costs nothing beyond
the real work) and the fastest peer / memeff_varlen (below 1: a peer is faster).

Timing: CUDA events around each call, --warmup calls first, the median of --iters. Progress on
stderr; a peer that fails prints its reason and the rest goes on. --json writes every number.
"""
import argparse
import inspect
import random
import statistics
import sys

import bench_common as bc  # first: makes `import memeff` find the installed package

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import memeff.torch as mt

PEERS = ["memeff_varlen", "memeff_padded", "torch_flash_varlen", "torch_flash_padded",
         "cudnn_padded"]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=32768, help="about this many tokens in all")
    ap.add_argument("--min-len", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0, help="seed of the sequence lengths")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--dropouts", default="0,0.1")
    ap.add_argument("--no-causal", action="store_true",
                    help="full attention (the padded peers then take a key padding mask)")
    ap.add_argument("--memeff-backends", default="",
                    help="restrict memeff's backends, e.g. cuda_sm90 or cuda (default: dispatch)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", help="also write the results to this file")
    return ap.parse_args()


def draw_lengths(tokens, low, high, seed):
    """Lengths uniform in [low, high] until the next would pass `tokens` (at least one)."""
    rng = random.Random(seed)
    lengths = []
    while True:
        n = rng.randint(low, high)
        if lengths and sum(lengths) + n > tokens:
            break
        lengths.append(n)
        if sum(lengths) + low > tokens:
            break
    return lengths


def pass_name(backward):
    return "fwd+bwd" if backward else "fwd"


def reason(error: BaseException) -> str:
    """The first line of an error, longer than bench_common.reason's (notes join several)."""
    text = str(error).strip()
    return text.splitlines()[0][:1000] if text else type(error).__name__


def log(*parts):
    print(*parts, file=sys.stderr, flush=True)


class Case:
    """The packed batch of one configuration, its padded twin, and the memeff settings."""

    def __init__(self, lengths, heads, kv_heads, dim, dropout_p, causal, backends, device):
        self.lengths, self.H, self.Hkv, self.D = lengths, heads, kv_heads, dim
        self.p, self.causal, self.backends, self.device = dropout_p, causal, backends, device
        self.S, self.T, self.Lmax = len(lengths), sum(lengths), max(lengths)
        gen = torch.Generator(device=device).manual_seed(1)

        def randn(*shape):
            return torch.randn(*shape, generator=gen, device=device, dtype=torch.bfloat16)

        self.q, self.k, self.v = randn(self.T, heads, dim), randn(self.T, kv_heads, dim), \
            randn(self.T, kv_heads, dim)
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        self.cu = torch.tensor(cu, dtype=torch.int32, device=device)
        # The padded batch: [S, Lmax, H, D] storage (a model's projection) viewed as
        # [S, H, Lmax, D], rows past each length zero.
        self.q_pad, self.k_pad, self.v_pad = (self.pad(t) for t in (self.q, self.k, self.v))
        keep = torch.arange(self.Lmax, device=device)[None, :] < torch.tensor(lengths,
                                                                             device=device)[:, None]
        self.key_mask = None if causal else keep[:, None, None, :]

    def pad(self, packed):
        out = packed.new_zeros(self.S, self.Lmax, packed.shape[1], packed.shape[2])
        for s, (a, n) in enumerate(zip(self.cu[:-1].tolist(), self.lengths)):
            out[s, :n] = packed[a:a + n]
        return out.transpose(1, 2)

    def memeff_guard(self):
        return mt.use_backends(*self.backends) if self.backends else _null()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def leaves(*tensors):
    return tuple(t.detach().requires_grad_() for t in tensors)


# Each peer: setup(case) -> (forward callable, the tensors it differentiates, a note).


def memeff_varlen(c):
    q, k, v = leaves(c.q, c.k, c.v)

    def fwd():
        with c.memeff_guard():
            return mt.varlen_attention(q, k, v, c.cu, c.cu, c.Lmax, c.Lmax, dropout_p=c.p,
                                       causal=c.causal)

    return fwd, (q, k, v), ""


def memeff_padded(c):
    q, k, v = (t.transpose(1, 2).detach().requires_grad_().transpose(1, 2)
               for t in (c.q_pad, c.k_pad, c.v_pad))

    def fwd():
        with c.memeff_guard():
            return mt.scaled_dot_product_attention(q, k, v, attn_mask=c.key_mask, dropout_p=c.p,
                                                   is_causal=c.causal, enable_gqa=c.Hkv != c.H)

    return fwd, (q, k, v), "no key mask" if c.causal else "key padding mask"


def _varlen_attn(c, q, k, v):
    from torch.nn.attention.varlen import varlen_attn
    if c.p > 0:
        raise RuntimeError("varlen_attn has no dropout")
    params = inspect.signature(varlen_attn).parameters
    kw = {}
    if c.causal:
        if "is_causal" in params:  # torch 2.9
            kw["is_causal"] = True
        elif "window_size" in params:  # 2.10 and later: causal is window (-1, 0)
            kw["window_size"] = (-1, 0)
        else:
            raise RuntimeError("varlen_attn takes neither is_causal nor window_size")
    if c.Hkv != c.H:
        if "enable_gqa" not in params:
            raise RuntimeError("varlen_attn has no enable_gqa")
        kw["enable_gqa"] = True
    return varlen_attn(q, k, v, c.cu, c.cu, c.Lmax, c.Lmax, **kw)


def _aten_flash(c, q, k, v):
    out = torch.ops.aten._flash_attention_forward(q, k, v, c.cu, c.cu, c.Lmax, c.Lmax, c.p,
                                                  c.causal, False)
    return out[0]


def _nested_flash(c, q, k, v):
    offsets = c.cu.to(torch.int64)

    def nested(t):
        return torch.nested.nested_tensor_from_jagged(t, offsets, min_seqlen=min(c.lengths),
                                                      max_seqlen=c.Lmax).transpose(1, 2)

    out = F.scaled_dot_product_attention(nested(q), nested(k), nested(v), dropout_p=c.p,
                                         is_causal=c.causal, enable_gqa=c.Hkv != c.H)
    return out.transpose(1, 2).values()


TORCH_VARLEN_METHODS = [
    ("torch.nn.attention.varlen.varlen_attn", _varlen_attn),
    ("aten._flash_attention_forward(cum_seq)", _aten_flash),
    ("nested jagged + SDPA flash", _nested_flash),
]


def torch_flash_varlen(c, backward):
    """The first method of TORCH_VARLEN_METHODS that runs this case (forward, and backward when
    timed with it); the others' reasons go into the note."""
    q, k, v = leaves(c.q, c.k, c.v)
    reasons = []
    for name, method in TORCH_VARLEN_METHODS:
        def fwd(method=method):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return method(c, q, k, v)

        try:
            out = fwd()
            if backward:
                torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
            torch.cuda.synchronize()
            return fwd, (q, k, v), name + (f" (skipped: {'; '.join(reasons)})" if reasons else "")
        except Exception as e:  # noqa: BLE001 - a method this torch lacks or refuses
            reasons.append(f"{name}: {bc.reason(e)}")
            torch.cuda.empty_cache()
    raise RuntimeError("; ".join(reasons))


def sdpa_padded(backend):
    def setup(c):
        q, k, v = (t.transpose(1, 2).detach().requires_grad_().transpose(1, 2)
                   for t in (c.q_pad, c.k_pad, c.v_pad))

        def fwd():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=c.key_mask,
                                                      dropout_p=c.p, is_causal=c.causal,
                                                      enable_gqa=c.Hkv != c.H)

        return fwd, (q, k, v), ""

    return setup


def time_peer(setup, c, backward, warmup, iters):
    """{"ms": median, "note": ...} or {"error": reason}."""
    try:
        fwd, inputs, note = setup(c)
        out = fwd()
        dout = torch.randn_like(out)
        del out

        def call():
            out = fwd()
            if backward:
                torch.autograd.grad(out, inputs, dout)

        for _ in range(warmup):
            call()
        torch.cuda.synchronize()
        times = sorted(bc.time_ms(call, c.device) for _ in range(iters))
        result = {"ms": statistics.median(times), "min_ms": times[0], "note": note}
        if setup is memeff_varlen or setup is memeff_padded:
            result["memeff_backends"] = list(mt.last_backends())
        return result
    except Exception as e:  # noqa: BLE001 - a peer that cannot run this case
        return {"error": reason(e)}
    finally:
        torch.cuda.empty_cache()


def dense_throughput(c, backward, warmup, iters):
    """memeff's dense op on one equal-length batch of about the case's tokens: (TFLOP/s, the
    batch shape), at the case's dropout, causal mode and heads."""
    weighted = sum(n * n for n in c.lengths) / sum(c.lengths)  # FLOP-weighted mean length
    L = max(64, int(round(weighted / 64)) * 64)
    B = max(1, round(c.T / L))
    gen = torch.Generator(device=c.device).manual_seed(2)

    def blhd(heads):
        return torch.randn(B, L, heads, c.D, generator=gen, device=c.device,
                           dtype=torch.bfloat16).transpose(1, 2).requires_grad_()

    q, k, v = blhd(c.H), blhd(c.Hkv), blhd(c.Hkv)

    def fwd():
        with c.memeff_guard():
            return mt.scaled_dot_product_attention(q, k, v, dropout_p=c.p, is_causal=c.causal,
                                                   enable_gqa=c.Hkv != c.H)

    result = time_peer(lambda _: (fwd, (q, k, v), ""), c, backward, warmup, iters)
    flops = bc.forward_flops([L] * B, c.H, c.D, c.causal) * bc.flop_factor(pass_name(backward))
    if "ms" in result:
        result["tflops"] = flops / (result["ms"] * 1e-3) / 1e12
    result["shape"] = [B, c.H, L, c.D]
    return result


def main():
    args = parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_varlen.py times CUDA kernels: no CUDA device")
    device = torch.device("cuda")
    kv_heads = args.kv_heads or args.heads
    causal = not args.no_causal
    backends = [b for b in args.memeff_backends.split(",") if b]
    lengths = draw_lengths(args.tokens, args.min_len, args.max_len, args.seed)
    env = bc.environment(device)
    print(f"# packed varlen attention, {bc.describe(env)}, bf16, {len(lengths)} sequences, {sum(lengths)} tokens (lengths {args.min_len}.."
          f"{args.max_len}, seed {args.seed}, longest {max(lengths)}), heads {args.heads}/"
          f"{kv_heads}, {'causal' if causal else 'full'}; median of {args.iters} after "
          f"{args.warmup} warm-up calls", flush=True)
    log(f"lengths: {lengths}")
    setups = {
        "memeff_varlen": memeff_varlen,
        "memeff_padded": memeff_padded,
        "torch_flash_padded": sdpa_padded(SDPBackend.FLASH_ATTENTION),
        "cudnn_padded": sdpa_padded(SDPBackend.CUDNN_ATTENTION),
    }
    rows = []
    for dim in [int(d) for d in args.head_dims.split(",")]:
        for p in [float(x) for x in args.dropouts.split(",")]:
            try:
                case = Case(lengths, args.heads, kv_heads, dim, p, causal, backends, device)
            except Exception as e:  # noqa: BLE001 - e.g. out of memory for the padded batch
                log(f"D={dim} p={p}: cannot build the inputs: {reason(e)}")
                continue
            for backward in (False, True):
                row = {"D": dim, "dropout": p, "pass": pass_name(backward)}
                for name in PEERS:
                    log(f"D={dim} p={p} {row['pass']}: {name} ...")
                    if name == "torch_flash_varlen":
                        setup = (lambda c, b=backward: torch_flash_varlen(c, b))
                    else:
                        setup = setups[name]
                    row[name] = time_peer(setup, case, backward, args.warmup, args.iters)
                    log(f"  {row[name]}")
                log(f"D={dim} p={p} {row['pass']}: memeff dense throughput ...")
                dense = dense_throughput(case, backward, args.warmup, args.iters)
                log(f"  {dense}")
                row["memeff_dense"] = dense
                flops = (bc.forward_flops(lengths, args.heads, dim, causal) *
                         bc.flop_factor(row["pass"]))
                row["flops"] = flops
                row["predicted_ms"] = (flops / (dense["tflops"] * 1e12) * 1e3
                                       if "tflops" in dense else float("nan"))
                mine = row["memeff_varlen"].get("ms", float("nan"))
                row["varlen_vs_predicted"] = mine / row["predicted_ms"]
                peers = [(row[n]["ms"], n) for n in PEERS[2:] if "ms" in row[n]]
                best = min(peers, default=(float("nan"), ""))
                row["fastest_peer"] = best[1]
                row["fastest_peer_vs_memeff"] = best[0] / mine
                row["memeff_varlen_tflops"] = flops / (mine * 1e-3) / 1e12
                rows.append(row)
            del case
            torch.cuda.empty_cache()

    def ms(r, name):
        return f"{r[name]['ms']:.3f}" if "ms" in r[name] else "failed"

    table = []
    for r in rows:
        table.append([str(r["D"]), str(r["dropout"]), r["pass"]] + [ms(r, n) for n in PEERS] +
                     [f"{r['predicted_ms']:.3f}", f"{r['varlen_vs_predicted']:.3f}",
                      f"{r['fastest_peer_vs_memeff']:.3f} ({r['fastest_peer'] or '-'})",
                      f"{r['memeff_varlen_tflops']:.0f}"])
    bc.print_table(["D", "p", "pass"] + [f"{n} ms" for n in PEERS] +
                   ["predicted ms", "varlen / predicted", "fastest peer / memeff",
                    "memeff TFLOP/s"], table)
    notes = {}
    for r in rows:
        for n in PEERS:
            text = r[n].get("error") or r[n].get("note")
            if text:
                notes.setdefault((n, text), []).append(f"D={r['D']} p={r['dropout']} {r['pass']}")
    for (n, text), where_seen in notes.items():
        print(f"- {n}: {text} [{', '.join(where_seen)}]")
    for r in rows:
        if "memeff_backends" in r["memeff_varlen"]:
            print(f"- memeff_varlen D={r['D']} p={r['dropout']} {r['pass']}: backends "
                  f"{r['memeff_varlen']['memeff_backends']}; dense reference "
                  f"{r['memeff_dense'].get('shape')} at "
                  f"{r['memeff_dense'].get('tflops', float('nan')):.0f} TFLOP/s")
    bc.write_json(args.json, {**env, "lengths": lengths, "heads": args.heads,
                              "kv_heads": kv_heads, "causal": causal, "rows": rows})


if __name__ == "__main__":
    main()
