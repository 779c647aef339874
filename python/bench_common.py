"""What the benchmark scripts beside this file share: the installed memeff (not the source folder
next to them, which lacks the compiled memeff._C), torch's SDPA backends and the dtypes by name,
the project's FLOP convention, a timer (CUDA events on a GPU, the wall clock on the CPU), the
one-line reason of a failed configuration, the training-step loop, and the environment line,
markdown table and JSON they end with. Import it before memeff."""
import collections
import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import torch  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402

TORCH_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}

# --dtype names, as memeff spells them.
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# FLOPs of a pass as a multiple of the forward's, the project's convention (memeff's
# pass_flop_factor and training_flop_factor): the backward's five matrix products of the
# forward's size against its two.
_PASS_FLOP_FACTORS = {"fwd": 1.0, "bwd": 2.5}


def flop_factor(pass_name: str) -> float:
    """FLOPs of "fwd", "bwd" or "fwd+bwd" over a forward's: 1, 2.5 and 3.5."""
    return sum(_PASS_FLOP_FACTORS[p] for p in pass_name.split("+"))


def forward_flops(lengths, heads, dim, causal) -> float:
    """A forward's FLOPs by the project's convention (memeff::attention_flops_packed) over
    sequences of these lengths (queries = keys): 4·H·L²·D each, halved when causal."""
    return sum(4.0 * heads * n * n * dim * (0.5 if causal else 1.0) for n in lengths)


def time_ms(fn, device) -> float:
    """Milliseconds of one fn() call: CUDA events around it on a GPU, else the wall clock."""
    if device.type == "cuda":
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def reason(error: BaseException) -> str:
    """The first informative line of an error (what a backend that cannot run a configuration
    says): torch.compile's errors open with "backend='inductor' raised:" and name the cause on
    the next line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if lines and lines[0].endswith("raised:") and len(lines) > 1:
        return f"{lines[0]} {lines[1]}"[:160]
    return lines[0][:100] if lines else type(error).__name__


def device_name(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"


def environment(device, **versions):
    """What a run measured on, for its JSON: the device and the versions of torch, of any other
    package named in `versions` (e.g. transformers=...) and of memeff."""
    import memeff.torch as mt

    return {"device": device_name(device), "torch": torch.__version__, **versions,
            "memeff": mt.version()}


def describe(env) -> str:
    """environment() as the reports' first line puts it: "device, torch X, ..., memeff Y"."""
    return ", ".join([env["device"]] + [f"{k} {v}" for k, v in env.items() if k != "device"])


# Names a --backends list may hold besides TORCH_BACKENDS: memeff's own op ("memeff"; in
# bench_hf.py attn_implementation="memeff"), PyTorch's default SDPA dispatch ("default"), that
# dispatch with memeff's kernels in its fused slots ("slots": memeff.torch.activate of
# aten_sdpa.SLOTS) and in its math path too ("slots_math").
SLOT_BACKENDS = ("slots", "slots_math")
OTHER_BACKENDS = ("memeff",) + SLOT_BACKENDS + ("default",)


def backend_names(spec, device):
    """The names of a --backends list ("memeff,default,flash,..."), checked; on the CPU only
    memeff, the default dispatch and torch's math backend (the slots are CUDA kernels, torch's CPU
    flash kernel has no dropout)."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    for n in names:
        if n not in TORCH_BACKENDS and n not in OTHER_BACKENDS:
            raise SystemExit(f"--backends: unknown name {n!r} (expected some of "
                             f"{', '.join(OTHER_BACKENDS + tuple(TORCH_BACKENDS))})")
    return ([n for n in names if n in ("memeff", "default", "math")] if device.type == "cpu"
            else names)


def backend_guard(name):
    """The context a backend name runs in: sdpa_kernel(backend) for a forced torch backend,
    memeff's slots activated for "slots" and "slots_math", nothing for "memeff" and
    "default"."""
    from contextlib import contextmanager, nullcontext

    from torch.nn.attention import sdpa_kernel

    if name in TORCH_BACKENDS:
        return sdpa_kernel(TORCH_BACKENDS[name])
    if name not in SLOT_BACKENDS:
        return nullcontext()

    @contextmanager
    def slots():
        import memeff.torch as mt
        from memeff.torch import aten_sdpa

        mt.activate(aten_sdpa.SLOTS + ((aten_sdpa.MATH_SLOT,) if name == "slots_math" else ()))
        try:
            yield
        finally:
            mt.deactivate()

    return slots()


def add_compile_argument(ap):
    """--compile [MODE]: run the model under torch.compile (maybe_compile)."""
    ap.add_argument("--compile", nargs="?", const="default", default=None, metavar="MODE",
                    help="run the model under torch.compile (mode: default, max-autotune, ...)")


def maybe_compile(model, compile_mode):
    """torch.compile(model) with --compile's mode ("default", "max-autotune", ...), or the model
    itself when compile_mode is None."""
    if compile_mode is None:
        return model
    # PyTorch's compile caches (Inductor's, AOTAutograd's) are not told which kernels the
    # dispatcher held while a graph was traced: with them on, the "default" step compiled after a
    # slots run ran memeff's kernels (H100, docs/benchmarks.md). Every backend compiles afresh.
    torch._inductor.config.force_disable_caches = True
    return torch.compile(model, mode=None if compile_mode == "default" else compile_mode)


def print_table(header, rows):
    """A markdown table: header is a list of column names, rows lists of cell strings."""
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def write_json(path, document):
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=1)


def make_step(model, loss_of, device, dtype):
    """(step, optimizer): step() is one training step of model (forward under autocast in
    `dtype`, loss_of(model) backward, an AdamW step)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = loss_of(model)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step, optimizer


def run_mode(compile_mode) -> str:
    """How a report's first line names --compile's mode: ", torch.compile mode M" or ", eager"."""
    return f", torch.compile mode {compile_mode}" if compile_mode else ", eager"


def bench_training_step(name, build, loss_of, device, dtype, warmup, steps):
    """Times one training step (forward under autocast in `dtype`, backward, AdamW step) of
    build(name)'s model inside backend_guard(name): the median and minimum of `steps` steps
    after `warmup` ones, and the peak memory of the timed steps. A configuration that fails
    gives its reason instead of times. Under torch.compile the warm-up steps compile."""
    guard = backend_guard(name)
    result = {"backend": name, "ms": float("nan"), "min_ms": float("nan"),
              "peak_mib": float("nan")}
    model = optimizer = None
    try:
        torch.manual_seed(0)
        model = build(name)
        step, optimizer = make_step(model, loss_of, device, dtype)
        torch._dynamo.reset()  # each backend compiles afresh (a no-op without torch.compile)
        with guard:
            for _ in range(warmup):
                step()
            if name in SLOT_BACKENDS:
                result["calls"] = memeff_calls(step, compiled=hasattr(model, "_orig_mod"))
            result["graph_breaks"] = graph_breaks()
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            times = sorted(time_ms(step, device) for _ in range(steps))
        result.update(ms=times[len(times) // 2], min_ms=times[0])
        if device.type == "cuda":
            result["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    except Exception as e:  # a torch backend that cannot run this configuration
        result["error"] = reason(e)
        print(f"  {name}: failed: {result['error']}", file=sys.stderr, flush=True)
    finally:
        del model, optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


def memeff_calls(step, compiled: bool = False) -> str:
    """What one more call of step() sent through memeff's slots: "memeff ran N of M slot calls
    (op: count ...), PyTorch ran K (reasons)"; without the math slot, nothing reaches the slots
    when torch's dispatcher chose its math path. Under torch.compile (compiled), calls that
    tracing already turned into memeff's ops (the math slot's) are in the graph and pass no slot
    at run time, so the count says only what reached a slot."""
    import memeff.torch as mt

    with mt.explain_sdpa() as calls:
        step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    ran = [c for c in calls if c.ran == "memeff"]
    ops = collections.Counter(c.op.lstrip("_") for c in ran)
    reasons = collections.Counter(c.reason for c in calls if c.ran != "memeff")
    text = f"memeff ran {len(ran)} of {len(calls)} slot calls"
    if ops:
        text += " (" + ", ".join(f"{op} x{n}" for op, n in ops.items()) + ")"
    if reasons:
        text += "; PyTorch's kernels: " + ", ".join(f"{r} x{n}" for r, n in reasons.items())
    if compiled:
        text += " at run time (compiled: ops traced into the graph are not counted)"
    return text


def graph_breaks() -> int:
    """Graph breaks torch.compile counted since the last torch._dynamo.reset()."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def bench_training_steps(names, build, loss_of, device, dtype, warmup, steps):
    """bench_training_step for each backend name: the results, and a note of the backends memeff
    ran (forward/backward) for the table."""
    import memeff.torch as mt

    results, notes = [], {}
    for name in names:
        print(f"  {name} ...", file=sys.stderr, flush=True)
        results.append(bench_training_step(name, build, loss_of, device, dtype, warmup, steps))
        r = results[-1]
        if "error" in r:
            continue
        note = ["memeff backends fwd/bwd: " + "/".join(mt.last_backends())] if name == "memeff" \
            else []
        if r.get("calls"):
            note.append(r["calls"])
        if r.get("graph_breaks"):
            note.append(f"{r['graph_breaks']} graph breaks")
        if note:
            notes[name] = "; ".join(note)
    return results, notes


def print_step_table(results, notes=None):
    """The training-step table: median and minimum step time, peak memory, and the ratios to the
    fastest forced torch backend and to torch's default dispatch of the same run. notes: extra
    text per backend name."""
    notes = notes or {}
    nan = float("nan")
    best = min((r["ms"] for r in results if r["backend"] in TORCH_BACKENDS and r["ms"] == r["ms"]),
               default=nan)
    default = next((r["ms"] for r in results if r["backend"] == "default"), nan)
    rows = []
    for r in results:
        r["vs_best_torch"] = r["ms"] / best if best == best else nan
        r["vs_default"] = r["ms"] / default if default == default else nan
        rows.append([r["backend"], f"{r['ms']:.2f}", f"{r['min_ms']:.2f}", f"{r['peak_mib']:.0f}",
                     f"{r['vs_best_torch']:.3f}", f"{r['vs_default']:.3f}",
                     r.get("error", notes.get(r["backend"], ""))])
    print_table(["attention", "step ms (median)", "step ms (min)", "peak MiB", "vs best torch",
                 "vs default", "note"], rows)
