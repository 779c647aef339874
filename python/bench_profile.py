#!/usr/bin/env python3
"""Where a training step's time goes, attention backend by attention backend: torch.profiler over
steps of bench_hf.py's models (BERT-base masked LM with attention dropout 0.1, the small Llama
GQA decoder), GPU kernels grouped by kind and the host's work (launches, allocations,
synchronizations, copies, autograd), per step, side by side for memeff and torch's backends.

    python3 python/bench_profile.py [--models bert,llama] [--backends memeff,cudnn,slots]
                                    [--compile [MODE]] [--steps 5] [--json FILE]

The table's "attention" rows are the kernels of the attention itself; "memset", "copy" and
"elementwise" rows are where an attention implementation adds work around its kernels (dtype
conversions, layout copies, zero-fills). --top prints the busiest kernels of each backend.
On the CPU it runs shrunken models and reports the host side only (a smoke test).
"""
import argparse
import collections
import importlib.util
import os
import re
import sys

import bench_common as bc  # first: makes `import memeff` find the installed package

import torch
from torch.profiler import ProfilerActivity, profile


def _load_bench_hf():
    """bench_hf.py beside this file (its models), by path: bench_common took this folder off
    sys.path so that `import memeff` finds the installed package."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_hf.py")
    spec = importlib.util.spec_from_file_location("bench_hf", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench_hf = _load_bench_hf()

# GPU kernels by kind, first match wins (names as the CUDA profiler reports them).
_KERNEL_KINDS = [
    ("attention", re.compile(r"memeff|attention|fmha|flash|cudnn|sdpa|softmax_d|bwd_convert|"
                             r"bwd_preprocess|dq_|splitkv|bias_row", re.I)),
    ("gemm", re.compile(r"gemm|sm90_xmma|nvjet|cutlass|cublas|matmul|wgmma", re.I)),
    ("memset", re.compile(r"^memset|fill", re.I)),
    ("copy", re.compile(r"^memcpy|copy|cat|transpose|contiguous|clone", re.I)),
    ("optimizer", re.compile(r"adam|foreach|multi_tensor", re.I)),
    ("reduce, norm, loss", re.compile(r"reduce|norm|softmax|cross_entropy|nll|sum|mean", re.I)),
    ("elementwise, other", re.compile(r".")),
]

# Host-side work by kind: the runtime calls and aten ops whose count and time show what an
# implementation adds (substring of the profiler's event name -> row).
_HOST_KINDS = [
    ("kernel launches", ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                         "cuLaunchKernelEx")),
    ("memset calls", ("cudaMemsetAsync", "cuMemsetD")),
    ("memcpy calls", ("cudaMemcpyAsync", "cudaMemcpy")),
    ("synchronizations", ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                          "cudaEventSynchronize")),
    ("allocations (aten::empty*)", ("aten::empty", "aten::empty_strided", "aten::empty_like")),
    ("zero-fills (aten::zeros*, zero_, fill_)", ("aten::zeros", "aten::zero_", "aten::fill_",
                                                 "aten::zeros_like")),
    ("copies, conversions (aten::copy_, _to_copy)", ("aten::copy_", "aten::_to_copy")),
    ("memeff ops", ("memeff::",)),
]


# record_function names of the step itself (not kernels).
_ANNOTATIONS = {"train_step", "ProfilerStep"}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="memeff,cudnn,slots")
    ap.add_argument("--top", type=int, default=12, help="busiest kernels listed per backend")
    bench_hf.add_model_arguments(ap, steps=5)  # --steps: profiled steps (the table is per step)
    return ap.parse_args()


def _is_kernel(evt) -> bool:
    device_type = getattr(evt, "device_type", None)
    return device_type is not None and device_type != torch.autograd.DeviceType.CPU


def profile_steps(name, build, loss_of, device, dtype, warmup, steps):
    """Per-step totals of one backend: {"gpu": {kind: [ms, count]}, "host": {kind: [ms,
    count]}, "kernels": [(name, ms per step, count per step)], "step_host_ms": ...}."""
    guard = bc.backend_guard(name)
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = build(name)
    step, optimizer = bc.make_step(model, loss_of, device, dtype)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    try:
        with guard:
            for _ in range(warmup):
                step()
            calls = (bc.memeff_calls(step, compiled=hasattr(model, "_orig_mod"))
                     if name in bc.SLOT_BACKENDS else "")
            if device.type == "cuda":
                torch.cuda.synchronize()
            with profile(activities=activities) as prof:
                for _ in range(steps):
                    with torch.profiler.record_function("train_step"):
                        step()
                if device.type == "cuda":
                    torch.cuda.synchronize()
    finally:
        del model, optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    gpu = collections.OrderedDict((kind, [0.0, 0]) for kind, _ in _KERNEL_KINDS)
    host = collections.OrderedDict((kind, [0.0, 0]) for kind, _ in _HOST_KINDS)
    per_kernel = collections.defaultdict(lambda: [0.0, 0])
    step_host_ms = 0.0
    for evt in prof.events():
        if _is_kernel(evt):
            # record_function ranges appear on the device timeline too: not kernels.
            if getattr(evt, "is_user_annotation", False) or evt.name in _ANNOTATIONS or \
                    evt.name.startswith("Optimizer."):
                continue
            ms = getattr(evt, "device_time", getattr(evt, "cuda_time", 0.0)) / 1e3 / steps
            kind = next(k for k, pattern in _KERNEL_KINDS if pattern.search(evt.name))
            gpu[kind][0] += ms
            gpu[kind][1] += 1 / steps
            per_kernel[evt.name][0] += ms
            per_kernel[evt.name][1] += 1 / steps
            continue
        if evt.name == "train_step":
            step_host_ms += evt.cpu_time_total / 1e3 / steps
            continue
        for kind, names in _HOST_KINDS:
            if any(evt.name == n or (n.endswith("::") and evt.name.startswith(n)) for n in names):
                host[kind][0] += evt.self_cpu_time_total / 1e3 / steps
                host[kind][1] += 1 / steps
                break
    kernels = [(kernel, v[0], v[1]) for kernel, v in per_kernel.items()]
    kernels.sort(key=lambda k: -k[1])
    return {"backend": name, "gpu": gpu, "host": host, "kernels": kernels, "calls": calls,
            "graph_breaks": bc.graph_breaks(),
            "gpu_total_ms": sum(v[0] for v in gpu.values()), "step_host_ms": step_host_ms}


def _short(kernel: str) -> str:
    """A kernel's name without namespaces and return type, cut to 120 characters."""
    name = re.sub(r"(\w+::)+", "", kernel.removeprefix("void "))
    name = name.replace("(anonymous namespace)::", "").replace("|", "/")
    return name if len(name) <= 120 else name[:117] + "..."


def print_profile_table(results):
    names = [r["backend"] for r in results]
    header = ["per step"] + [f"{n} ms" for n in names] + [f"{n} count" for n in names]
    rows = []
    for section in ("gpu", "host"):
        for kind in results[0][section]:
            label = ("GPU: " if section == "gpu" else "host: ") + kind
            rows.append([label] + [f"{r[section][kind][0]:.3f}" for r in results] +
                        [f"{r[section][kind][1]:.0f}" for r in results])
    rows.append(["GPU: all kernels"] + [f"{r['gpu_total_ms']:.3f}" for r in results] +
                ["" for _ in results])
    rows.append(["host: the step (CPU time)"] + [f"{r['step_host_ms']:.3f}" for r in results] +
                ["" for _ in results])
    bc.print_table(header, rows)


def main():
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    small = device.type == "cpu"
    names = bc.backend_names(args.backends, device)
    env = bench_hf.environment(device)
    print(f"# torch.profiler over {args.steps} training steps ({args.dtype} autocast, AdamW"
          f"{bc.run_mode(args.compile)}), {bc.describe(env)}"
          + ("; CPU smoke test with shrunken models" if small else ""), flush=True)
    dtype = bc.DTYPES[args.dtype]
    report = {**env, "args": vars(args), "models": []}
    for kind in [m.strip() for m in args.models.split(",") if m.strip()]:
        title, build, loss_of = bench_hf.model_runner(kind, args, device, small)
        results = []
        for name in names:
            print(f"  {kind}: profiling {name} ...", file=sys.stderr, flush=True)
            try:
                results.append(profile_steps(name, build, loss_of, device, dtype, args.warmup,
                                             args.steps))
            except Exception as e:  # a torch backend that cannot run this configuration
                print(f"  {name}: failed: {bc.reason(e)}", file=sys.stderr, flush=True)
        if not results:
            continue
        print(f"\n## {title}\n", flush=True)
        print_profile_table(results)
        for r in results:
            print(f"\n{r['backend']}: graph breaks {r['graph_breaks']}"
                  + (f"; {r['calls']}" if r["calls"] else ""))
        for r in results:
            if not r["kernels"]:
                continue
            print(f"\n{r['backend']}: the {args.top} busiest kernels (ms and launches per step)\n")
            bc.print_table(["kernel", "ms", "count"],
                           [[_short(k), f"{ms:.3f}", f"{n:.0f}"]
                            for k, ms, n in r["kernels"][:args.top]])
        report["models"].append({"model": kind, "title": title, "results": results})
        sys.stdout.flush()
    bc.write_json(args.json, report)


if __name__ == "__main__":
    main()
