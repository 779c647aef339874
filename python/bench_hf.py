#!/usr/bin/env python3
"""One training step of Hugging Face transformers models with memeff's attention
(attn_implementation="memeff", memeff.torch.hf), with transformers' "sdpa" attention under
PyTorch's default dispatch ("default"), with memeff's kernels in that dispatcher's slots
("slots": memeff.torch.activate(("flash", "efficient", "cudnn")); "slots_math" adds the math
slot) and forced onto each of torch's SDPA backends, in one run, eager or under torch.compile
(--compile): a BERT-base-sized masked-LM encoder (random init, L = 512, attention dropout 0.1)
and a small Llama-style decoder with grouped-query attention (causal, no attention dropout, as
Llama trains). bf16 autocast, AdamW.

    python3 python/bench_hf.py [--models bert,llama] [--compile [MODE]] [--bert-pad F]
                               [--llama-pad F] [--json FILE]

Timing: CUDA events around each step (forward, backward, optimizer step) after warm-up steps;
median and minimum of --steps steps; peak memory of the timed steps. "vs best torch" is the
step time over the fastest torch backend's in the same run. On the CPU it runs shrunken models
(a smoke test of the script, not a measurement).
"""
import argparse
import copy
import sys

import bench_common as bc  # first: makes `import memeff` find the installed package

import torch
import transformers

import memeff.torch.hf as mhf


def add_model_arguments(ap, steps):
    """The models' arguments, shared with bench_profile.py: which models, their batch shapes and
    padding, --compile, the autocast dtype and the warm-up and timed (or profiled) steps."""
    ap.add_argument("--models", default="bert,llama", help="comma-separated: bert, llama")
    bc.add_compile_argument(ap)
    ap.add_argument("--bert-batch", type=int, default=32)
    ap.add_argument("--bert-seq", type=int, default=512)
    ap.add_argument("--bert-pad", type=float, default=0.0, metavar="F",
                    help="right-pad the BERT batch: sequence lengths drawn uniformly from "
                         "[F·seq, seq] (default 0: no padding, no attention_mask)")
    ap.add_argument("--llama-batch", type=int, default=8)
    ap.add_argument("--llama-seq", type=int, default=1024)
    ap.add_argument("--llama-pad", type=float, default=0.0, metavar="F",
                    help="right-pad the Llama batch the same way")
    ap.add_argument("--dtype", choices=list(bc.DTYPES), default="bf16")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--json", help="also write the results to this file")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="memeff,slots,default," + ",".join(bc.TORCH_BACKENDS),
                    help="memeff, slots, default and torch SDPA backends to time")
    add_model_arguments(ap, steps=10)
    return ap.parse_args()


def bert_base(small):
    """BERT-base: 12 layers, width 768, 12 heads of 64, attention dropout 0.1."""
    if small:
        return transformers.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, intermediate_size=128,
                                       max_position_embeddings=512,
                                       attention_probs_dropout_prob=0.1)
    return transformers.BertConfig(attention_probs_dropout_prob=0.1)  # the defaults are base


def small_llama(small):
    """A Llama-style decoder: 8 layers, width 1024, 16 query heads of 64 on 4 key/value heads."""
    if small:
        return transformers.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=2048)
    return transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                                    num_hidden_layers=8, num_attention_heads=16,
                                    num_key_value_heads=4, max_position_embeddings=2048)


def model_case(kind, args, device, small):
    """(title, config, model class, batch builder) of a model kind."""
    gen = torch.Generator().manual_seed(0)
    if kind == "bert":
        config, cls, batch, seq = (bert_base(small), transformers.BertForMaskedLM,
                                   args.bert_batch, args.bert_seq)
    elif kind == "llama":
        config, cls, batch, seq = (small_llama(small), transformers.LlamaForCausalLM,
                                   args.llama_batch, args.llama_seq)
    else:
        raise SystemExit(f"bench_hf.py: unknown model {kind!r} (expected bert or llama)")
    if small:
        batch, seq = min(batch, 2), min(seq, 64)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=gen).to(device)
    mask = None
    pad = getattr(args, f"{kind}_pad", 0.0)
    if pad > 0:
        lengths = torch.randint(max(1, int(pad * seq)), seq + 1, (batch,), generator=gen)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long().to(device)
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None)
    title = (f"{cls.__name__}: {config.num_hidden_layers} layers, width {config.hidden_size}, "
             f"{heads} heads" + (f" on {kv_heads} kv heads" if kv_heads not in (None, heads)
                                 else "") + f", batch {batch} x {seq} tokens, attention dropout "
             f"{getattr(config, 'attention_probs_dropout_prob', getattr(config, 'attention_dropout', 0.0))}"
             + (f", right-padded to {int(mask.sum())} of {mask.numel()} tokens"
                if mask is not None else ""))
    return title, config, cls, ids, mask


def model_runner(kind, args, device, small):
    """(title, build, loss_of) of a model kind: build(name) makes the model for an attention
    name (memeff's implementation for "memeff", transformers' "sdpa" otherwise; compiled with
    --compile), loss_of(model) its masked-LM or causal-LM loss on the batch."""
    title, config, cls, ids, mask = model_case(kind, args, device, small)

    def build(name):
        implementation = mhf.NAME if name == "memeff" else "sdpa"
        with device:  # parameters created (and initialized) on the device: quicker
            model = cls._from_config(copy.deepcopy(config), attn_implementation=implementation)
        return bc.maybe_compile(model.to(device).train(), args.compile)

    def loss_of(model):
        return model(input_ids=ids, attention_mask=mask, labels=ids).loss

    return title, build, loss_of


def environment(device):
    """memeff registered with transformers, and the run's environment (bench_common)."""
    mhf.register()
    return bc.environment(device, transformers=transformers.__version__)


def main():
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    small = device.type == "cpu"
    dtype = bc.DTYPES[args.dtype]
    names = bc.backend_names(args.backends, device)
    env = environment(device)
    print(f"# one training step of Hugging Face models ({args.dtype} autocast, AdamW"
          f"{bc.run_mode(args.compile)}), {bc.describe(env)}; median of {args.steps} steps "
          f"after {args.warmup} warm-up" + ("; CPU smoke test with shrunken models" if small
                                            else ""), flush=True)
    report = {**env, "args": vars(args), "models": []}
    for kind in [m.strip() for m in args.models.split(",") if m.strip()]:
        title, build, loss_of = model_runner(kind, args, device, small)
        results, notes = bc.bench_training_steps(names, build, loss_of, device, dtype,
                                                 args.warmup, args.steps)
        print(f"\n## {title}", flush=True)
        bc.print_step_table(results, notes)
        report["models"].append({"model": kind, "title": title, "results": results})
        sys.stdout.flush()
    bc.write_json(args.json, report)


if __name__ == "__main__":
    main()
