"""memeff inside PyTorch's own ``torch.nn.functional.scaled_dot_product_attention``.

PyTorch routes a fused SDPA call to one of its kernels through aten ops ("slots"). This module
implements the CUDA kernels of the flash slot with memeff:

- ``aten::_scaled_dot_product_flash_attention`` and ``..._backward`` (what F.sdpa calls),
- ``aten::_flash_attention_forward`` / ``_flash_attention_backward`` (dense [B, L, H, D] and
  packed [total, H, D] with cum_seq_q/k, what ``torch.nn.attention.varlen`` calls), and
- ``aten::_flash_attention_forward_no_dropout_inplace`` where the torch build has it,

and, on request, the memory-efficient slot (``slots=("flash", "efficient")``:
``aten::_scaled_dot_product_efficient_attention`` and its backward, with attn_bias, its
gradient and dropout; ``aten::_fill_mem_eff_dropout_mask_`` then returns memeff's mask) and
cuDNN's (``"cudnn"``: ``aten::_scaled_dot_product_cudnn_attention`` and its backward).

Nothing changes on import. ``import memeff.torch`` registers the implementation "memeff" with
PyTorch's flash-attention registry (``torch.nn.attention.register_flash_attention_impl``) where
the torch build has one; ``torch.nn.attention.activate_flash_attention_impl("memeff")`` or
:func:`activate` turns it on, ``torch.nn.attention.restore_flash_attention_impl()`` or
:func:`deactivate` off. Without the registry, :func:`activate` registers the same kernels itself.

The outputs have exactly the shapes, dtypes and strides of PyTorch's kernels (those of PyTorch's
meta kernels, which torch.compile traces with). The flash slot's ``rng_state`` output (uint64[2]
on the device) holds memeff's (seed, offset); the backward regenerates the mask from it, and
``memeff.torch.dropout_mask(shape, p, rng_state.view(torch.int64))`` returns the mask a call
used. A call memeff cannot run (a sliding window, ALiBi slopes, a paged KV cache, ...) runs
PyTorch's own kernel, captured when the kernels were registered; :func:`explain_sdpa` records
which calls ran where and why.
"""

import contextlib
import inspect
import logging
import math
import warnings
from collections import namedtuple
from typing import Dict, List, Optional, Sequence, Tuple

import torch

import memeff.torch as _package  # partly initialized: this module is imported at its end

IMPL_NAME = "memeff"
SLOTS = ("flash", "efficient", "cudnn")  # the fused slots
MATH_SLOT = "math"  # the calls PyTorch sends to its math path (aten_sdpa_math.py): opt-in

_log = logging.getLogger("memeff.torch.sdpa")
_ops = torch.ops.memeff

SdpaCall = namedtuple("SdpaCall", ["op", "ran", "reason", "backend"])
SdpaCall.__doc__ = """One call of an aten SDPA op taken over by memeff: `op` the aten op's name,
`ran` "memeff" or "pytorch" (PyTorch's own kernel), `reason` why PyTorch's kernel ran ("" when
memeff ran), `backend` the memeff backend that ran it ("" when PyTorch's kernel ran)."""

# The records of the innermost explain_sdpa() block, or None outside one (no cost then).
_records: Optional[List[SdpaCall]] = None


# ---------------------------------------------------------------------------------------------
# Argument mapping: PyTorch's conventions to memeff's, and memeff's outputs to PyTorch's layouts.


def _is_non_overlapping_and_dense(t: torch.Tensor) -> bool:
    if t.is_contiguous():
        return True
    dims = sorted((d for d in range(t.dim()) if t.shape[d] != 1), key=lambda d: t.stride(d))
    step = 1
    for d in dims:
        if t.stride(d) != step:
            return False
        step *= t.shape[d]
    return True


def torch_layout_strides(query: torch.Tensor, shape: Sequence[int]) -> Tuple[int, ...]:
    """The strides PyTorch gives a result of `shape` allocated after `query` (its attention
    output, and the gradients of its backward with shape = the input's): query's own when the
    shapes are equal and query is dense, else dense in query's dimension order (innermost first
    by stride, stride-0 dimensions outermost), as torch.empty_like does."""
    shape = tuple(int(s) for s in shape)
    if tuple(query.shape) == shape and _is_non_overlapping_and_dense(query):
        return tuple(query.stride())
    order = sorted(range(query.dim()),
                   key=lambda d: query.stride(d) if query.stride(d) else math.inf)
    strides, step = [0] * len(order), 1
    for d in order:
        strides[d] = step
        step *= shape[d]
    return tuple(strides)


def _same_layout(t: torch.Tensor, strides: Sequence[int]) -> bool:
    """Equal strides wherever a dimension has more than one element (the rest do not matter)."""
    return all(size <= 1 or stride == want
               for size, stride, want in zip(t.shape, t.stride(), strides))


def in_torch_layout(t: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """t (a result of memeff) in the layout PyTorch gives it (torch_layout_strides(query,
    t.shape)): t itself when it already is, else a copy."""
    if t.shape == query.shape and t.stride() == query.stride():
        return t  # the common case, decided without the rule
    strides = torch_layout_strides(query, t.shape)
    if _same_layout(t, strides):
        return t
    result = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)
    result.copy_(t)
    return result


def _dense_last_dim(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """memeff reads tensors whose last dimension is contiguous; others are copied."""
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


def flash_causal_mode(is_causal: bool, window_size_left: Optional[int] = None,
                      window_size_right: Optional[int] = None,
                      max_k: Optional[int] = None) -> Tuple[Optional[str], str]:
    """memeff's causal mode for a flash-slot call, and "" — or (None, why) when the window
    cannot be expressed. FlashAttention aligns its causal mask bottom-right (the last query sees
    every key) and encodes it as window_size_right = 0; a window of -1 (or None) is unbounded,
    and a left window at least the number of keys bounds nothing."""
    left = -1 if window_size_left is None else int(window_size_left)
    right = -1 if window_size_right is None else int(window_size_right)
    if left >= 0 and max_k is not None and left >= max_k:
        left = -1
    if left >= 0:
        return None, f"a sliding window (window_size_left={left})"
    if is_causal:
        right = 0 if right < 0 else right
    if right < 0:
        return "none", ""
    if right == 0:
        return "bottom_right", ""
    return None, f"a sliding window (window_size_right={right})"


def _state_for_torch(drawn: torch.Tensor, dropout_p: float, device: torch.device) -> torch.Tensor:
    """The flash slot's rng_state output (uint64[2] on the device) holding memeff's (seed,
    offset): the forward's drawn state (int64[2] on the CPU, or on the device under CUDA-graph
    capture), or an unwritten one without dropout (as PyTorch's kernel returns it)."""
    if dropout_p <= 0.0:
        _remember_state(None, device)
        return torch.empty((2,), dtype=torch.uint64, device=device)
    _remember_state(drawn, device)
    state = drawn if drawn.device == device else drawn.to(device)
    return state.view(torch.uint64)


def _remember_state(drawn: Optional[torch.Tensor], device: torch.device) -> None:
    """memeff.torch.last_rng_state() returns the latest call's state, through a slot too."""
    _package._thread_state.last_rng_state = None if drawn is None else (drawn, device)


def _state_for_memeff(rng_state: Optional[torch.Tensor], dropout_p: float
                      ) -> Optional[torch.Tensor]:
    """The forward's rng_state (as _state_for_torch returned it) as memeff's backward reads it."""
    if dropout_p <= 0.0 or rng_state is None:
        return None
    if rng_state.dtype != torch.int64:
        rng_state = rng_state.view(torch.int64)
    return rng_state.reshape(2)


def _flash_debug_mask(query: torch.Tensor, key: torch.Tensor, lse: torch.Tensor,
                      rng_state: torch.Tensor, dropout_p: float, causal: str,
                      scale: Optional[float]) -> torch.Tensor:
    """The flash slot's debug mask for a dense [B, H, L, D] call: the attention probabilities
    [B, Hq, Lq, Lk] negated where dropout dropped them, zero-padded to multiples of 128 as
    PyTorch's kernel pads them. The sign follows FlashAttention's convention; its magnitudes
    are not normalized, these are the probabilities."""
    B, Hq, Lq, D = query.shape
    Lk = key.shape[2]
    group = Hq // key.shape[1]
    k = key.repeat_interleave(group, dim=1) if group > 1 else key
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    s = (query.float() @ k.float().transpose(-1, -2)) * scale
    probs = torch.exp(s - lse.unsqueeze(-1))
    if causal == "bottom_right":
        i = torch.arange(Lq, device=query.device).unsqueeze(1)
        j = torch.arange(Lk, device=query.device).unsqueeze(0)
        probs = probs.masked_fill(j > i + (Lk - Lq), 0.0)
    probs = torch.nan_to_num(probs, nan=0.0)
    if dropout_p > 0.0:
        keep = _package.dropout_mask((B, Hq, Lq, Lk), dropout_p, rng_state.view(torch.int64))
        probs = torch.where(keep, probs, -probs)
    rows, cols = -(-Lq // 128) * 128, -(-Lk // 128) * 128
    mask = query.new_zeros((B, Hq, rows, cols))
    mask[:, :, :Lq, :Lk] = probs.to(query.dtype)
    return mask


# ---------------------------------------------------------------------------------------------
# Recording where calls ran.


@contextlib.contextmanager
def explain_sdpa():
    """Record the aten SDPA calls memeff's kernels receive inside the block: yields a list that
    fills with one SdpaCall (op, ran, reason, backend) per call, e.g.::

        with memeff.torch.explain_sdpa() as calls:
            F.scaled_dot_product_attention(q, k, v)
        print(calls)  # [SdpaCall(op='_scaled_dot_product_flash_attention', ran='memeff', ...)]

    Under torch.compile a fused slot's calls are recorded when the graph runs (not while it
    traces); the math slot's are recorded while the graph traces (by each pass that traces it),
    since the trace takes memeff's own op into the graph and its runs pass no slot. A CUDA graph's
    replays run no Python and record nothing. The logger "memeff.torch.sdpa" says
    the same at DEBUG level, in or outside the block."""
    global _records
    saved = _records
    _records = []
    try:
        yield _records
    finally:
        _records = saved


def _note(op: str, reason: str) -> None:
    """Record that `op` ran on memeff ("" reason) or on PyTorch's kernel (because of reason)."""
    if _records is None and not _log.isEnabledFor(logging.DEBUG):
        return
    backend = _ops.last_backends()["backward" in op] if not reason else ""
    call = SdpaCall(op, "pytorch" if reason else "memeff", reason, backend)
    if _records is not None:
        _records.append(call)
    _log.debug("%s ran on %s%s", op, backend or "PyTorch's kernel",
               f" ({reason})" if reason else "")


def _backends() -> Tuple[str, ...]:
    """The allow-list of memeff.torch.use_backends now."""
    return _package._backend_order


# ---------------------------------------------------------------------------------------------
# The kernels. The dispatcher calls each with the dispatch keyset first (what PyTorch's kernel,
# `_original[op]`, takes when a call falls back to it).

_original: Dict[str, object] = {}


class Unsupported(Exception):
    """Raised by a kernel for a call memeff cannot run; PyTorch's kernel runs it instead, and
    the message is the reason explain_sdpa() records."""


def slot_kernel(op: str):
    """Decorate fn(*args, **kwargs), memeff's version of aten::op, into the kernel the
    dispatcher calls: PyTorch's kernel runs the call when fn raises Unsupported or memeff's op
    finds no backend for it (NotImplementedError); every call is noted for explain_sdpa()."""
    def wrap(fn):
        def kernel(keyset, *args, **kwargs):
            try:
                result = fn(*args, **kwargs)
            except Unsupported as why:
                return _fallback(op, str(why), keyset, args, kwargs)
            except NotImplementedError as why:
                return _fallback(op, f"memeff: {why}", keyset, args, kwargs)
            _note(op, "")
            return result
        kernel.__name__ = kernel.__qualname__ = fn.__name__
        kernel.__doc__ = fn.__doc__
        return kernel
    return wrap


def _fallback(op: str, reason: str, keyset, args, kwargs):
    kernel = _original.get(op)
    if kernel is None:
        raise NotImplementedError(
            f"memeff: aten::{op}: memeff cannot run this call ({reason}) and PyTorch's own "
            f"kernel is not at hand (none for this device, or no torch.library.get_kernel)")
    _note(op, reason)
    return kernel.call_boxed(keyset, *args, **kwargs)


def _require_supported(*tensors: Optional[torch.Tensor]) -> None:
    """Raise Unsupported unless memeff reads these tensors (its dtypes, one device)."""
    tensors = [t for t in tensors if t is not None]
    for t in tensors:
        if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise Unsupported(f"dtype {t.dtype}")
    if len({t.device for t in tensors}) != 1:
        raise Unsupported("tensors on different devices")


def _supported_causal(is_causal, window_size_left=None, window_size_right=None,
                      max_k=None) -> str:
    causal, reason = flash_causal_mode(is_causal, window_size_left, window_size_right, max_k)
    if causal is None:
        raise Unsupported(reason)
    return causal


@slot_kernel("_scaled_dot_product_flash_attention")
def _sdpa_flash_forward(query, key, value, dropout_p=0.0, is_causal=False,
                        return_debug_mask=False, *, scale=None):
    _require_supported(query, key, value)
    out, lse, rng_state, unused, debug = _dense_forward(
        query, key, value, dropout_p, _supported_causal(is_causal), return_debug_mask, scale)
    return (out, lse, None, None, query.shape[2], key.shape[2], rng_state, unused, debug)


@slot_kernel("_scaled_dot_product_flash_attention_backward")
def _sdpa_flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                         max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *,
                         scale=None):
    _require_supported(grad_out, query, key, value, out)
    return _dense_backward(grad_out, query, key, value, out, logsumexp, dropout_p,
                           _supported_causal(is_causal), philox_seed, scale)


def _dense_forward(query, key, value, dropout_p, causal, return_debug_mask, scale):
    """out, lse, rng_state, unused, debug_mask of a flash forward on [B, H, L, D] tensors."""
    p = float(dropout_p)
    q, k, v = _dense_last_dim(query), _dense_last_dim(key), _dense_last_dim(value)
    out, lse, drawn = _ops.fwd(q, k, v, None, None, p, causal, scale, _backends())
    rng_state = _state_for_torch(drawn, p, query.device)
    if return_debug_mask:
        debug = _flash_debug_mask(q, k, lse, rng_state, p, causal, scale)
    else:
        debug = torch.empty((0,), dtype=query.dtype, device=query.device)
    unused = torch.empty((), dtype=torch.uint64, device=query.device)
    return in_torch_layout(out, query), lse, rng_state, unused, debug


def _dense_backward(grad_out, query, key, value, out, logsumexp, dropout_p, causal, rng_state,
                    scale):
    """dq, dk, dv of a flash backward on [B, H, L, D] tensors."""
    p = float(dropout_p)
    dq, dk, dv, _ = _ops.bwd(_dense_last_dim(grad_out), _dense_last_dim(query),
                             _dense_last_dim(key), _dense_last_dim(value), None,
                             _dense_last_dim(out), logsumexp, _state_for_memeff(rng_state, p), p,
                             causal, scale, False, _backends())
    return in_torch_layout(dq, query), in_torch_layout(dk, key), in_torch_layout(dv, value)


def _flash_forward_checks(query, key, value, cum_seq_q, cum_seq_k, max_k, is_causal,
                          window_size_left, window_size_right, seqused_k, alibi_slopes,
                          block_table) -> str:
    """memeff's causal mode for a flash forward it can run; else raises Unsupported."""
    _require_supported(query, key, value)
    if alibi_slopes is not None:
        raise Unsupported("ALiBi slopes")
    if seqused_k is not None:
        raise Unsupported("seqused_k")
    if block_table is not None:
        raise Unsupported("a paged KV cache (block_table)")
    if (cum_seq_q is None) != (cum_seq_k is None):
        raise Unsupported("only one of cum_seq_q and cum_seq_k")
    if query.dim() != (4 if cum_seq_q is None else 3):
        raise Unsupported(f"a {'dense' if cum_seq_q is None else 'packed'} query of "
                          f"{query.dim()} dimensions")
    return _supported_causal(is_causal, window_size_left, window_size_right,
                             key.shape[1] if cum_seq_k is None else max_k)


def _flash_forward_memeff(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                          causal, return_debug_mask, scale):
    """out, lse, rng_state, unused, debug_mask of a flash forward on [B, L, H, D] (or packed
    [total, H, D]) tensors."""
    if cum_seq_q is None:
        out, lse, rng_state, unused, debug = _dense_forward(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), dropout_p, causal,
            return_debug_mask, scale)
        return out.transpose(1, 2), lse, rng_state, unused, debug
    if return_debug_mask:
        raise RuntimeError("memeff: aten::_flash_attention_forward: a debug mask of packed "
                           "sequences (cum_seq_q) is not implemented")
    p = float(dropout_p)
    out, lse, drawn = _ops.varlen_fwd(_dense_last_dim(query), _dense_last_dim(key),
                                      _dense_last_dim(value), cum_seq_q, cum_seq_k, max_q, max_k,
                                      None, p, causal, scale, _backends(), False)
    rng_state = _state_for_torch(drawn, p, query.device)
    debug = torch.empty((0,), dtype=query.dtype, device=query.device)
    unused = torch.empty((), dtype=torch.uint64, device=query.device)
    return in_torch_layout(out, query), lse, rng_state, unused, debug


def _flash_backward_memeff(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                           max_q, max_k, dropout_p, causal, rng_state, scale):
    """dq, dk, dv of a flash backward on [B, L, H, D] (or packed) tensors."""
    if cum_seq_q is None:
        dq, dk, dv = _dense_backward(
            *(t.transpose(1, 2) for t in (grad_out, query, key, value, out)), logsumexp,
            dropout_p, causal, rng_state, scale)
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
    p = float(dropout_p)
    dq, dk, dv = _ops.varlen_bwd(*(_dense_last_dim(t) for t in (grad_out, query, key, value)),
                                 cum_seq_q, cum_seq_k, max_q, max_k, _dense_last_dim(out),
                                 logsumexp, _state_for_memeff(rng_state, p), p, causal, scale,
                                 _backends())
    return in_torch_layout(dq, query), in_torch_layout(dk, key), in_torch_layout(dv, value)


@slot_kernel("_flash_attention_forward")
def _flash_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                   return_debug_mask, *, scale=None, window_size_left=None,
                   window_size_right=None, seqused_k=None, alibi_slopes=None, **rest):
    causal = _flash_forward_checks(query, key, value, cum_seq_q, cum_seq_k, max_k, is_causal,
                                   window_size_left, window_size_right, seqused_k, alibi_slopes,
                                   rest.get("block_table"))
    return _flash_forward_memeff(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k,
                                 dropout_p, causal, return_debug_mask, scale)


@slot_kernel("_flash_attention_forward_no_dropout_inplace")
def _flash_forward_no_dropout_inplace(out, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k,
                                      dropout_p, is_causal, return_debug_mask, *, scale=None,
                                      window_size_left=None, window_size_right=None,
                                      seqused_k=None, alibi_slopes=None, **rest):
    causal = _flash_forward_checks(query, key, value, cum_seq_q, cum_seq_k, max_k, is_causal,
                                   window_size_left, window_size_right, seqused_k, alibi_slopes,
                                   rest.get("block_table"))
    if float(dropout_p) != 0.0 or return_debug_mask:
        raise Unsupported("dropout or a debug mask in the in-place form")
    result, lse, _, _, _ = _flash_forward_memeff(query, key, value, cum_seq_q, cum_seq_k, max_q,
                                                 max_k, 0.0, causal, False, scale)
    out.copy_(result)
    return lse


@slot_kernel("_flash_attention_backward")
def _flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
                    max_k, dropout_p, is_causal, rng_state, unused, *, scale=None,
                    window_size_left=None, window_size_right=None):
    _require_supported(grad_out, query, key, value, out)
    causal = _supported_causal(is_causal, window_size_left, window_size_right,
                               key.shape[1] if cum_seq_k is None else max_k)
    return _flash_backward_memeff(grad_out, query, key, value, out, logsumexp, cum_seq_q,
                                  cum_seq_k, max_q, max_k, dropout_p, causal, rng_state, scale)


# The flash slot: aten op name -> kernel.
_FLASH_KERNELS = {
    "_scaled_dot_product_flash_attention": _sdpa_flash_forward,
    "_scaled_dot_product_flash_attention_backward": _sdpa_flash_backward,
    "_flash_attention_forward": _flash_forward,
    "_flash_attention_backward": _flash_backward,
    "_flash_attention_forward_no_dropout_inplace": _flash_forward_no_dropout_inplace,
}


# ---------------------------------------------------------------------------------------------
# Registration.


def _has_aten_op(name: str) -> bool:
    try:
        getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _kernels_of(slots: Sequence[str]) -> Dict[str, object]:
    kernels = {}
    for slot in slots:
        if slot == "flash":
            kernels.update(_FLASH_KERNELS)
        elif slot == "efficient":
            from . import aten_sdpa_efficient
            kernels.update(aten_sdpa_efficient.KERNELS)
        elif slot == "cudnn":
            from . import aten_sdpa_cudnn
            kernels.update(aten_sdpa_cudnn.KERNELS)
        elif slot == MATH_SLOT:
            from . import aten_sdpa_math
            kernels.update(aten_sdpa_math.KERNELS)
        else:
            raise ValueError(f"memeff: argument `slots`: expected names among "
                             f"{SLOTS + (MATH_SLOT,)}, got {slot!r}")
    return {name: fn for name, fn in kernels.items() if _has_aten_op(name)}


def _keep_original(name: str, dispatch_key: str, computed: bool = False):
    """PyTorch's kernel of aten::name for dispatch_key, callable after memeff's replaces it (None
    where this torch cannot keep kernels, or has none for that key). computed: the kernel the
    dispatcher runs for that key though none is registered there (a composite one)."""
    get_kernel = getattr(torch.library, "get_kernel", None)
    if get_kernel is None:
        return None
    try:
        if not computed and not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}",
                                                                               dispatch_key):
            return None
        return get_kernel(f"aten::{name}", dispatch_key)
    except (RuntimeError, AttributeError):
        return None


class Handle:
    """memeff's kernels in the dispatcher: remove() takes them out again (PyTorch's own come
    back). The registry's FlashAttentionHandle."""

    def __init__(self, library, slots: Tuple[str, ...], ops: Tuple[str, ...]):
        self._library = library
        self.slots = slots
        self.ops = ops

    @property
    def active(self) -> bool:
        return self._library is not None

    def remove(self) -> None:
        global _handle
        library, self._library = self._library, None
        if library is not None:
            destroy = getattr(library, "_destroy", None)
            if destroy is not None:
                destroy()
            _forget_python_dispatch(self.ops)
        if _handle is self:
            _handle = None


def _forget_python_dispatch(names: Sequence[str]) -> None:
    """Drop what PyTorch's Python dispatcher remembered of aten::name's kernels (each overload's
    dispatch cache, filled as torch.compile traces). It is not told when a Library's kernels
    come or go: after memeff's kernel for a composite op's autograd key was removed, graphs
    traced later still looked for a kernel there, found PyTorch's "not implemented" fallback and
    lost their backward (seen with the math slot, torch 2.11 and 2.15)."""
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        overloads = getattr(packet, "overloads", None)
        if overloads is None:
            continue
        for overload in overloads():
            cache = getattr(getattr(packet, overload, None), "_dispatch_cache", None)
            if isinstance(cache, dict):
                cache.clear()


# Ops PyTorch implements as a composite of others (no kernel of their own per device): memeff's
# kernel goes to the device's autograd key (its gradients are memeff's op's), and PyTorch's
# composite implementation, which the dispatcher runs there otherwise, is kept for the calls
# memeff passes on.
_COMPOSITE_OPS = frozenset({"scaled_dot_product_attention"})

_handle: Optional[Handle] = None
_requested_slots: Tuple[str, ...] = ("flash",)


def register_kernels(slots: Sequence[str] = ("flash",), dispatch_key: str = "CUDA") -> Handle:
    """Put memeff's kernels for `slots` into PyTorch's dispatcher for dispatch_key, replacing
    any of an earlier call; returns their Handle. activate() is the user's way in; this is what
    the registry calls (and tests call with dispatch_key="CPU")."""
    global _handle
    slots = tuple(slots)
    kernels = _kernels_of(slots)
    if _handle is not None:
        _handle.remove()
    _original.clear()
    for name in kernels:
        if name in _COMPOSITE_OPS:
            _original[name] = _keep_original(name, "Autograd" + dispatch_key, computed=True)
        else:
            _original[name] = _keep_original(name, dispatch_key)
    library = torch.library.Library("aten", "IMPL")
    # Torch builds whose Library.impl refuses to replace a kernel registered from Python unless
    # told (allow_override, off by default there) get told, as newer builds do by default.
    override = ({"allow_override": True}
                if "allow_override" in inspect.signature(library.impl).parameters else {})
    with warnings.catch_warnings():
        # Replacing a kernel PyTorch registered is the point; its warning says nothing new.
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
        for name, fn in kernels.items():
            key = "Autograd" + dispatch_key if name in _COMPOSITE_OPS else dispatch_key
            library.impl(name, fn, key, with_keyset=True, **override)
    _forget_python_dispatch(tuple(kernels))  # what it cached before these kernels came
    _handle = Handle(library, slots, tuple(kernels))
    return _handle


def _registry():
    """torch.nn.attention's flash-attention registry functions, or None where this torch has
    none."""
    attention = getattr(torch.nn, "attention", None)
    names = ("register_flash_attention_impl", "activate_flash_attention_impl",
             "restore_flash_attention_impl")
    if attention is None or not all(hasattr(attention, n) for n in names):
        return None
    return attention


def _register_fn(*_args, **_kwargs) -> Handle:
    """What torch.nn.attention.activate_flash_attention_impl("memeff") calls."""
    return register_kernels(_requested_slots)


def register_with_torch() -> bool:
    """Make "memeff" known to torch.nn.attention's registry (import memeff.torch does this);
    False where this torch has no registry. Activates nothing."""
    registry = _registry()
    if registry is None:
        return False
    registry.register_flash_attention_impl(IMPL_NAME, register_fn=_register_fn)
    return True


def activate(slots: Sequence[str] = ("flash",)) -> Handle:
    """Run torch.nn.functional.scaled_dot_product_attention's fused CUDA kernels with memeff:
    the flash slot by default; slots=("flash", "efficient", "cudnn") takes the memory-efficient
    slot (attn_bias and its gradient, fp32) and cuDNN's too (any subset may be named), and
    "math" the calls PyTorch's dispatcher would send to its math path although a fused backend
    is enabled (aten_sdpa_math.py; not by default). Through
    torch's registry where it exists (the same as
    torch.nn.attention.activate_flash_attention_impl("memeff")), else directly. Returns the
    Handle; deactivate() (or the registry's restore_flash_attention_impl()) undoes it."""
    global _requested_slots
    slots = tuple(slots)
    _kernels_of(slots)  # names checked before anything changes
    _requested_slots = slots
    registry = _registry()
    try:
        if registry is not None and register_with_torch():
            registry.activate_flash_attention_impl(IMPL_NAME)
            if _handle is None:  # a registry that did not call register_fn
                register_kernels(slots)
        else:
            register_kernels(slots)
    finally:
        _requested_slots = ("flash",)
    return _handle


def deactivate() -> None:
    """Give the slots back to PyTorch's own kernels (nothing happens when memeff's are not
    active)."""
    registry = _registry()
    if (registry is not None and _handle is not None
            and getattr(registry, "current_flash_attention_impl", lambda: None)() == IMPL_NAME):
        registry.restore_flash_attention_impl()
    if _handle is not None:  # a registry that kept no handle, or activation without it
        _handle.remove()


def is_active() -> bool:
    """Whether memeff's kernels are in the dispatcher now."""
    return _handle is not None and _handle.active


def active_slots() -> Tuple[str, ...]:
    """The slots memeff holds now (() when inactive)."""
    return _handle.slots if is_active() else ()
