"""memeff for PyTorch: a drop-in ``scaled_dot_product_attention`` backed by torch.ops.memeff.

The ops (``torch.ops.memeff.fwd``, ``.bwd``, ``.draw_rng_state``, ``.dropout_mask``) are
registered in C++ (memeff._C) for CPU and CUDA tensors; this module registers their autograd
formula and fake (meta) kernels, so they work under autograd, CUDA-graph capture and
``torch.compile(fullgraph=True)``.

Dropout randomness comes from torch's own generators: ``torch.manual_seed`` (or a
``generator=``) decides the mask. Each call with dropout draws one (seed, offset) pair into an
int64[2] ``rng_state`` tensor (on CUDA, in the graph-safe way PyTorch's fused kernels use, so a
replayed CUDA graph draws a fresh mask each replay), and the backward regenerates the same mask
from it. ``dropout_mask(shape, p, rng_state)`` returns the 0/1 mask a call used.
"""

import contextlib
import threading
from collections import namedtuple
from typing import List, Optional, Sequence, Tuple, Union

import torch

from . import _C  # noqa: F401  (loading the library registers torch.ops.memeff)

__all__ = [
    "scaled_dot_product_attention",
    "dropout_mask",
    "dropout_threshold",
    "last_rng_state",
    "last_backends",
    "use_backends",
    "backend_names",
    "version",
    "DropoutThreshold",
]

_ops = torch.ops.memeff
_CAUSAL_MODES = ("none", "top_left", "bottom_right")

# Backend allow-list (in priority order) for calls made inside `use_backends`; () lets memeff's
# dispatcher choose. A plain module global so torch.compile can read (and guard on) it.
_backend_order: Tuple[str, ...] = ()


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.last_rng_state: Optional[torch.Tensor] = None


_thread_state = _ThreadState()

DropoutThreshold = namedtuple("DropoutThreshold", ["threshold", "p_effective", "keep_scale"])


# ---------------------------------------------------------------------------------------------
# Fake (meta) kernels: shapes and dtypes only, for torch.compile and FakeTensor tracing. They
# mirror the real kernels, which return fresh contiguous tensors.


@torch.library.register_fake("memeff::fwd")
def _fwd_fake(q, k, v, bias, rng_state, dropout_p, causal, scale, backends):
    batch, heads, queries = q.shape[0], q.shape[1], q.shape[2]
    out = q.new_empty((batch, heads, queries, v.shape[3]))
    lse = q.new_empty((batch, heads, queries), dtype=torch.float32)
    return out, lse


@torch.library.register_fake("memeff::bwd")
def _bwd_fake(dout, q, k, v, bias, out, lse, rng_state, dropout_p, causal, scale, bias_grad,
              backends):
    dbias = bias.new_empty(bias.shape) if bias_grad else q.new_empty((0,))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias


@torch.library.register_fake("memeff::draw_rng_state")
def _draw_rng_state_fake(like, generator=None):
    return like.new_empty((2,), dtype=torch.int64)


@torch.library.register_fake("memeff::dropout_mask")
def _dropout_mask_fake(rng_state, shape, dropout_p):
    return torch.empty(shape, dtype=torch.bool, device=rng_state.device)


# ---------------------------------------------------------------------------------------------
# Autograd: the forward saves what memeff's backward needs (inputs, out, lse and the RNG state,
# from which the backward regenerates the forward's dropout mask).


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, bias, rng_state, dropout_p, causal, scale, backends = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, bias, rng_state, out, lse)
    ctx.dropout_p = dropout_p
    ctx.causal = causal
    ctx.scale = scale
    ctx.backends = list(backends)
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, dout, _dlse):
    q, k, v, bias, rng_state, out, lse = ctx.saved_tensors
    bias_grad = bias is not None and ctx.needs_input_grad[3]
    dq, dk, dv, dbias = _ops.bwd(dout, q, k, v, bias, out, lse, rng_state, ctx.dropout_p,
                                 ctx.causal, ctx.scale, bias_grad, ctx.backends)
    return dq, dk, dv, (dbias if bias_grad else None), None, None, None, None, None


torch.library.register_autograd("memeff::fwd", _fwd_backward, setup_context=_fwd_setup_context)


# ---------------------------------------------------------------------------------------------
# The user-facing API.


def _causal_mode(is_causal: bool, causal, attn_mask) -> str:
    if causal is None or causal is False:
        mode = "none"
    elif causal is True:
        mode = "top_left"
    elif isinstance(causal, str) and causal in _CAUSAL_MODES:
        mode = causal
    else:
        raise ValueError(f"memeff: argument `causal`: expected None, True, False or one of "
                         f"{_CAUSAL_MODES}, got {causal!r}")
    if is_causal:
        if attn_mask is not None:
            # torch.nn.functional.scaled_dot_product_attention refuses this combination too.
            raise RuntimeError("memeff: explicit attn_mask should not be set when is_causal=True "
                               "(as in torch); pass causal='top_left' or 'bottom_right' to "
                               "combine a mask with a causal mask")
        if mode == "bottom_right":
            raise ValueError("memeff: is_causal=True means top-left causal and conflicts with "
                             "causal='bottom_right'")
        mode = "top_left"
    return mode


def _bias_of_mask(attn_mask: Optional[torch.Tensor], q: torch.Tensor, rank: int,
                  keys: int) -> Optional[torch.Tensor]:
    """The additive [B|1, H|1, Lq|1, Lk] bias memeff takes, from torch's attn_mask conventions
    (broadcast from the right; a boolean mask keeps True and drops False)."""
    if attn_mask is None:
        return None
    if attn_mask.dtype == torch.bool:
        bias = torch.zeros(attn_mask.shape, dtype=q.dtype, device=attn_mask.device)
        bias = bias.masked_fill(attn_mask.logical_not(), float("-inf"))
    elif attn_mask.dtype == q.dtype or attn_mask.dtype == torch.float32:
        bias = attn_mask
    elif attn_mask.is_floating_point():
        bias = attn_mask.to(q.dtype)
    else:
        raise TypeError(f"memeff: argument `attn_mask`: expected a bool or floating-point mask, "
                        f"got {attn_mask.dtype}")
    if bias.dim() > rank:
        raise ValueError(f"memeff: argument `attn_mask`: {bias.dim()} dimensions do not "
                         f"broadcast to the {rank}-dimensional attention scores")
    while bias.dim() < rank:
        bias = bias.unsqueeze(0)
    if rank == 3:
        bias = bias.unsqueeze(1)
    if bias.shape[-1] == 1 and keys != 1:
        # memeff broadcasts bias over B, H and Lq but stores keys densely.
        bias = bias.expand(*bias.shape[:-1], keys)
    return bias


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    *,
    causal: Union[None, bool, str] = None,
    generator: Optional[torch.Generator] = None,
    rng_state: Optional[torch.Tensor] = None,
    return_rng_state: bool = False,
):
    """Drop-in for torch.nn.functional.scaled_dot_product_attention, computed by memeff.

    query [B, Hq, Lq, D], key [B, Hkv, Lk, D], value [B, Hkv, Lk, Dv] (or the same without the
    head dimension); out [B, Hq, Lq, Dv]. Same semantics as torch: attn_mask is a float
    additive mask or a boolean keep-mask broadcastable to [B, Hq, Lq, Lk]; is_causal is top-left
    causal; scale defaults to 1/sqrt(D); enable_gqa allows Hq a multiple of Hkv; dropout_p is
    applied whenever it is > 0 (as in torch's functional form, regardless of training mode).

    Extras (keyword only):
      causal: "top_left" (= is_causal), "bottom_right" (the last query sees every key, as in
        decoding with a KV cache) or None; unlike is_causal it may be combined with attn_mask.
      generator: the torch.Generator dropout draws from (default: the device's default one).
      rng_state: replay a previous call's mask by passing its rng_state instead of drawing.
      return_rng_state: return (out, rng_state); rng_state is None when dropout_p is 0.

    memeff quantizes p to 8 bits (see dropout_threshold); kept values are scaled by
    1/(1 - p_effective), so the expectation is exact.
    """
    rank = query.dim()
    if rank not in (3, 4) or key.dim() != rank or value.dim() != rank:
        raise ValueError(f"memeff: expected query, key and value of 4 dimensions [B, H, L, D] "
                         f"(or 3 without H), got {query.dim()}, {key.dim()} and {value.dim()}")
    q, k, v = (query, key, value) if rank == 4 else (query.unsqueeze(1), key.unsqueeze(1),
                                                      value.unsqueeze(1))
    mode = _causal_mode(is_causal, causal, attn_mask)
    if q.shape[1] != k.shape[1] and not enable_gqa:
        raise RuntimeError(f"memeff: query has {q.shape[1]} heads and key/value {k.shape[1]}; "
                           f"pass enable_gqa=True for grouped-query attention (as in torch)")
    bias = _bias_of_mask(attn_mask, q, rank, k.shape[2])
    p = float(dropout_p)
    state = None
    if p > 0.0:
        state = rng_state if rng_state is not None else _ops.draw_rng_state(q.detach(), generator)
    out, _ = _ops.fwd(q, k, v, bias, state, p, mode, None if scale is None else float(scale),
                      list(_backend_order))
    if not torch.compiler.is_compiling():
        _thread_state.last_rng_state = state
    if rank == 3:
        out = out.squeeze(1)
    return (out, state) if return_rng_state else out


def dropout_mask(shape: Sequence[int], dropout_p: float, rng_state: torch.Tensor) -> torch.Tensor:
    """The boolean keep-mask [B, Hq, Lq, Lk] (or [B, Lq, Lk]) of a call with this rng_state and
    dropout_p, on rng_state's device: True where the attention probability was kept (and scaled
    by dropout_threshold(p).keep_scale), False where it was dropped. Computed on the CPU."""
    dims = [int(s) for s in shape]
    if len(dims) not in (3, 4):
        raise ValueError(f"memeff: argument `shape`: expected [B, Hq, Lq, Lk] or [B, Lq, Lk], "
                         f"got {list(shape)}")
    full = dims if len(dims) == 4 else [dims[0], 1, dims[1], dims[2]]
    mask = _ops.dropout_mask(rng_state.detach().to("cpu"), full, float(dropout_p))
    if len(dims) == 3:
        mask = mask.squeeze(1)
    return mask.to(rng_state.device)


def dropout_threshold(dropout_p: float) -> DropoutThreshold:
    """memeff's 8-bit quantization of p: keep when a random byte < threshold (1..256);
    p_effective = 1 - threshold/256, kept values scaled by keep_scale = 256/threshold."""
    threshold, p_effective, keep_scale = _ops.dropout_threshold(float(dropout_p))
    return DropoutThreshold(int(threshold), float(p_effective), float(keep_scale))


def last_rng_state() -> Optional[torch.Tensor]:
    """The rng_state of this thread's latest eager scaled_dot_product_attention call (None if it
    had no dropout). Under CUDA-graph capture it is the graph's tensor, rewritten each replay."""
    return _thread_state.last_rng_state


def last_backends() -> Tuple[str, str]:
    """Names of the memeff backends that ran the latest forward and backward ("" before any)."""
    forward_name, backward_name = _ops.last_backends()
    return forward_name, backward_name


@contextlib.contextmanager
def use_backends(*names: str):
    """Restrict (and order) memeff's backends for calls made inside the block, e.g.
    ``with use_backends("reference"):``. The backward of a call uses its forward's choice.
    Process-wide while active (not per thread)."""
    global _backend_order
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"memeff: backend names are strings, got {name!r}")
    saved = _backend_order
    _backend_order = tuple(names)
    try:
        yield
    finally:
        _backend_order = saved


def backend_names() -> List[str]:
    """The backends compiled into this build ("reference", "cpu", "cuda_sm90", "cuda", ...)."""
    return list(_ops.backend_names())


def version() -> str:
    """The memeff library version this extension was built from."""
    return str(_ops.version())
