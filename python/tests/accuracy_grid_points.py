# The accuracy grid of issue 11: random attention problems in fp16/bf16 (lengths 1 to 2048, head
# dims 8 to 256, GQA, bias, both causal modes, dropout 0/0.22/0.48) and, for each, the error of
# memeff's output and gradients against an fp64 math reference divided by the error of torch's
# eager math in the same low precision: the measure PyTorch's *_vs_math_ref_grads tests bound.
# One definition for test_accuracy_grid.py (asserts the bars) and python/accuracy_grid.py (table).
import contextlib
import math
import random
import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

import memeff.torch as mt
from attention_helpers import additive, causal_keep

OUTPUTS = ("out", "dq", "dk", "dv", "dbias")

# PyTorch's fudge factors for its fused kernels (test/test_transformers.py,
# test_mem_efficient_attention_attn_mask_vs_math_ref_grads): a kernel's error may be this many
# times the error of torch's math in the same dtype.
PYTORCH_BARS = {"out": 4.0, "dq": 160.0, "dk": 25.0, "dv": 8.0, "dbias": 45.0}

# FlashAttention-2's tests (tests/test_flash_attn.py) hold every output to 2x the error of a
# same-precision PyTorch implementation: the better target the issue names.
FA2_BAR = 2.0

# The floor of the baseline error, per dtype: test_transformers.py's own `default_atol` table
# (not torch.testing's, whose atol is 1e-5 for all three).
DEFAULT_ATOL = {torch.float16: 1e-3, torch.bfloat16: 1e-3, torch.float32: 1e-5}

DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
DTYPES_BY_NAME = {name: dtype for dtype, name in DTYPE_NAMES.items()}

CAUSAL_MODES = ("none", "top_left", "bottom_right")
# None, an additive [Lq, Lk] bias broadcast over B and H (PyTorch's test uses this one), or a
# full [B, Hq, Lq, Lk] one; both require grad, so dbias is measured.
BIAS_KINDS = (None, "lq_lk", "full")
DROPOUT_PS = (0.0, 0.22, 0.48)


@dataclass(frozen=True)
class GridSpec:
    """How one grid is drawn: every axis value appears equally often (±1) among `points` points
    per dtype, in a random order per axis, so the combinations are random shapes."""
    points: int
    lengths: Tuple[int, ...]  # drawn for Lq and Lk independently
    head_dims: Tuple[int, ...]  # D = Dv
    head_layouts: Tuple[Tuple[int, int], ...]  # (Hq, Hkv); Hq > Hkv is GQA
    batches: Tuple[int, ...]
    max_scores: int  # bound on B·Hq·Lq·Lk: long lengths get B = 1 and few heads


# The grid, for a GPU: 200 points per dtype; B·Hq·Lq·Lk <= 2^23 keeps Lq = Lk = 2048 to
# two heads (the fp64 reference of such a point is milliseconds on an H100/H200).
FULL_GRID = GridSpec(
    points=200,
    lengths=(1, 17, 65, 513, 2048),
    head_dims=(8, 16, 32, 40, 64, 80, 96, 128, 160, 192, 256),
    head_layouts=((1, 1), (2, 2), (4, 4), (2, 1), (4, 1), (8, 2)),
    batches=(1, 2, 3),
    max_scores=1 << 23,
)

# A small subset for the CPU (torch's fp16/bf16 matmul there takes ~0.1 s at 513x513x256).
QUICK_GRID = GridSpec(
    points=12,
    lengths=(1, 17, 65, 513),
    head_dims=(8, 32, 64, 128, 256),
    head_layouts=((1, 1), (2, 2), (2, 1), (4, 1)),
    batches=(1, 2),
    max_scores=1 << 18,
)


@dataclass(frozen=True)
class GridPoint:
    device: str
    dtype: torch.dtype
    batch: int
    heads_q: int
    heads_kv: int
    len_q: int
    len_k: int
    head_dim: int
    causal: str
    bias: Optional[str]
    dropout_p: float
    seed: int

    @property
    def name(self) -> str:
        return (f"{self.device}-{DTYPE_NAMES[self.dtype]}-B{self.batch}-H{self.heads_q}x"
                f"{self.heads_kv}-L{self.len_q}x{self.len_k}-D{self.head_dim}-{self.causal}-"
                f"bias_{self.bias or 'none'}-p{self.dropout_p}")


@dataclass
class OutputError:
    """max|memeff - ref64| (error) and max|torch lp math - ref64| (baseline) of one output;
    ratio = error / max(baseline, DEFAULT_ATOL[dtype])."""
    error: float
    baseline: float
    ratio: float


@dataclass
class PointResult:
    point: GridPoint
    outputs: Dict[str, OutputError]  # out, dq, dk, dv, and dbias where the point has a bias
    backends: Tuple[str, str]  # memeff's forward and backward backends


def _balanced(values, count, rng):
    """`count` values, each of `values` equally often (±1), in a random order."""
    drawn = [values[i % len(values)] for i in range(count)]
    rng.shuffle(drawn)
    return drawn


def _fit_heads(spec, batch, layout, len_q, len_k):
    """(batch, layout) with B·Hq·Lq·Lk <= spec.max_scores: B = 1 first, then the largest layout of
    the same kind (GQA or not) that fits, else the smallest of that kind."""
    if batch * layout[0] * len_q * len_k <= spec.max_scores:
        return batch, layout
    gqa = layout[0] != layout[1]
    same_kind = sorted((hq, hkv) for hq, hkv in spec.head_layouts if (hq != hkv) == gqa)
    fitting = [(hq, hkv) for hq, hkv in same_kind
               if hq * len_q * len_k <= spec.max_scores and hq <= layout[0]]
    return 1, (fitting[-1] if fitting else same_kind[0])


def grid(device: str, dtype: torch.dtype, spec: GridSpec) -> List[GridPoint]:
    """The points of `spec` for one dtype; the same list on every call."""
    rng = random.Random(f"memeff accuracy grid {DTYPE_NAMES[dtype]} {spec.points}")
    n = spec.points
    axes = [_balanced(values, n, rng) for values in (
        spec.lengths, spec.lengths, spec.head_dims, spec.head_layouts, spec.batches,
        CAUSAL_MODES, BIAS_KINDS, DROPOUT_PS)]
    points = []
    for len_q, len_k, head_dim, layout, batch, causal, bias, p in zip(*axes):
        batch, (heads_q, heads_kv) = _fit_heads(spec, batch, layout, len_q, len_k)
        points.append(GridPoint(device, dtype, batch, heads_q, heads_kv, len_q, len_k, head_dim,
                                causal, bias, p, rng.randrange(1 << 31)))
    return points


@contextlib.contextmanager
def low_precision_math():
    """torch's math SDPA computing in fp16/bf16 throughout, as PyTorch's `out_lp_ref` was before
    torch 2.5; since then the math backend upcasts fp16/bf16 to fp32 unless this is allowed, and its
    error would be the final rounding alone."""
    backends = torch.backends.cuda
    if not hasattr(backends, "allow_fp16_bf16_reduction_math_sdp"):  # torch < 2.5: always lp
        yield
        return
    saved = backends.fp16_bf16_reduction_math_sdp_allowed()
    backends.allow_fp16_bf16_reduction_math_sdp(True)
    try:
        yield
    finally:
        backends.allow_fp16_bf16_reduction_math_sdp(saved)


def _torch_math(point, q, k, v, bias, dout, keep, p_effective):
    """torch's math SDPA (the op PyTorch's tests call with dropout_mask) on these tensors, in their
    dtype: the output and the gradients of q, k, v (and bias). Causal masks of both modes are
    folded into the additive mask; kept probabilities are scaled by 1/(1 - p_effective)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v, bias) if t is not None]
    q, k, v = leaves[:3]
    mask = leaves[3] if bias is not None else None
    allowed = causal_keep(point.len_q, point.len_k, point.causal, q.device)
    if allowed is not None:
        causal_bias = additive(allowed, q.dtype)
        mask = causal_bias if mask is None else mask + causal_bias
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Dd]ropout mask should only be used.*")
        out = torch.ops.aten._scaled_dot_product_attention_math(
            q, k, v, mask, p_effective if keep is not None else 0.0, False, keep,
            enable_gqa=point.heads_q != point.heads_kv)[0]
    return out, torch.autograd.grad(out, leaves, dout.to(out.dtype))


def _max_abs_diff(a, b):
    return (a.detach().double() - b.detach().double()).abs().max().item()


def error_ratio(actual, reference, baseline, dtype) -> OutputError:
    """PyTorch's rule in ratio form: ratio <= bar is test_transformers.py's get_tolerances,
    atol = fudge · max(baseline error, default_atol[dtype]), with |kernel - ref| <= atol. The floor
    keeps an exact baseline (torch's lp math gets dq, dk, dbias exactly 0 where every row sees one
    key) from making the denominator 0. Left out: assertEqual's rtol·|ref| term (so this is the
    stricter rule). A non-finite error or baseline gives ratio NaN, which no bar passes."""
    error = _max_abs_diff(actual, reference)
    base = _max_abs_diff(baseline, reference)
    if not (math.isfinite(error) and math.isfinite(base)):
        return OutputError(error, base, math.nan)
    return OutputError(error, base, error / max(base, DEFAULT_ATOL[dtype]))


def measure(point: GridPoint) -> PointResult:
    """Runs memeff, the fp64 reference and torch's lp math on one point's random inputs."""
    gen = torch.Generator().manual_seed(point.seed)

    def draw(*shape):
        return torch.randn(*shape, generator=gen).to(point.device, point.dtype)

    B, Hq, Hkv, Lq, Lk, D = (point.batch, point.heads_q, point.heads_kv, point.len_q,
                             point.len_k, point.head_dim)
    q, k, v = draw(B, Hq, Lq, D), draw(B, Hkv, Lk, D), draw(B, Hkv, Lk, D)
    bias = {None: lambda: None, "lq_lk": lambda: draw(Lq, Lk),
            "full": lambda: draw(B, Hq, Lq, Lk)}[point.bias]()
    dout = draw(B, Hq, Lq, D)

    leaves = [t.detach().requires_grad_() for t in (q, k, v, bias) if t is not None]
    dropout_gen = torch.Generator(device=point.device).manual_seed(point.seed)
    out, rng_state = mt.scaled_dot_product_attention(
        leaves[0], leaves[1], leaves[2], attn_mask=leaves[3] if bias is not None else None,
        dropout_p=point.dropout_p, causal=None if point.causal == "none" else point.causal,
        enable_gqa=Hq != Hkv, generator=dropout_gen, return_rng_state=True)
    grads = torch.autograd.grad(out, leaves, dout)
    backends = mt.last_backends()

    keep, p_effective = None, 0.0
    if point.dropout_p > 0.0:
        # The exact keep-mask memeff drew, and its 8-bit-quantized p (keep scale 1/(1 - p_eff)).
        keep = mt.dropout_mask((B, Hq, Lq, Lk), point.dropout_p, rng_state)
        p_effective = mt.dropout_threshold(point.dropout_p).p_effective

    inputs = (q, k, v, bias, dout)
    ref_out, ref_grads = _torch_math(
        point, *[t.double() if t is not None else None for t in inputs], keep, p_effective)
    with low_precision_math():
        lp_out, lp_grads = _torch_math(point, *inputs, keep, p_effective)

    names = ["out", "dq", "dk", "dv"] + (["dbias"] if bias is not None else [])
    got = dict(zip(names, (out, *grads)))
    ref = dict(zip(names, (ref_out, *ref_grads)))
    lp = dict(zip(names, (lp_out, *lp_grads)))
    outputs = {}
    for name in names:
        if got[name].shape != ref[name].shape:
            raise AssertionError(f"{point.name}: {name} has shape {tuple(got[name].shape)}, "
                                 f"the reference {tuple(ref[name].shape)}")
        outputs[name] = error_ratio(got[name], ref[name], lp[name], point.dtype)
    return PointResult(point, outputs, backends)


def exceeds(ratio: float, bar: float) -> bool:
    """True unless ratio <= bar (so NaN exceeds every bar)."""
    return not ratio <= bar
