"""memeff for PyTorch: a drop-in ``scaled_dot_product_attention`` backed by torch.ops.memeff,
``varlen_attention`` for packed variable-length sequences (``torch.ops.memeff.varlen_fwd``) and
``context_parallel_attention``, ring attention over a torch.distributed group
(memeff.torch.context_parallel).

The ops (``torch.ops.memeff.fwd``, ``.bwd``, ``.varlen_fwd``, ``.varlen_bwd``, ``.dropout_mask``,
...) and the autograd kernels of ``fwd`` and ``varlen_fwd`` are registered in C++ (memeff._C), so
a forward and backward run without Python between the call and the kernels; this module
registers their fake (meta) kernels, so they also work under ``torch.compile(fullgraph=True)``,
and CUDA-graph capture works as for eager calls.

Outputs take their inputs' memory layout: ``out`` is laid out like ``query`` (a [B, L, H, D]
storage viewed as [B, H, L, D] gives an ``out`` of that layout, which ``transpose(1, 2)`` makes
contiguous again), and dq, dk, dv like q, k, v, so models that view [B, L, H·D] projections as
heads need no copies around the attention.

Dropout randomness comes from torch's own generators: ``torch.manual_seed`` (or a
``generator=``) decides the mask. With dropout, the forward op draws one (seed, offset) pair, in
the graph-safe way PyTorch's fused kernels use (so a replayed CUDA graph draws a fresh mask each
replay), and the backward regenerates the same mask from it. ``dropout_mask(shape, p,
rng_state)`` returns the 0/1 mask a call used. ``memeff.torch.hf`` plugs memeff into Hugging Face
transformers. ``activate()`` puts memeff inside torch's own
``torch.nn.functional.scaled_dot_product_attention`` (memeff.torch.aten_sdpa).
"""

import contextlib
import math
import threading
import warnings
from collections import namedtuple
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from .. import _C  # noqa: F401  (loading the library registers torch.ops.memeff)

__all__ = [
    "scaled_dot_product_attention",
    "varlen_attention",
    "dropout_mask",
    "dropout_threshold",
    "last_rng_state",
    "last_backends",
    "use_backends",
    "backend_names",
    "version",
    "DropoutThreshold",
    "context_parallel_attention",
    "context_parallel_shard",
    "context_parallel_unshard",
    "activate",
    "deactivate",
    "explain_sdpa",
    "ArgumentError",
]

_ops = torch.ops.memeff
_CAUSAL_MODES = tuple(_ops.causal_modes())  # ("none", "top_left", "bottom_right")

# Backend allow-list (in priority order) for calls made inside `use_backends`; () lets memeff's
# dispatcher choose. A plain module global so torch.compile can read (and guard on) it.
_backend_order: Tuple[str, ...] = ()


class _ThreadState(threading.local):
    def __init__(self) -> None:
        # The latest eager call's (state as the op returned it, the device of its query), or None
        # without dropout: the state is on the CPU for a CUDA call outside graph capture, and
        # last_rng_state() returns it on the query's device.
        self.last_rng_state: Optional[Tuple[torch.Tensor, torch.device]] = None


_thread_state = _ThreadState()

DropoutThreshold = namedtuple("DropoutThreshold", ["threshold", "p_effective", "keep_scale"])


# ---------------------------------------------------------------------------------------------
# Fake (meta) kernels: shapes, dtypes and strides only, for torch.compile and FakeTensor tracing.
# They mirror the real kernels (python/csrc/ops.cpp), strides included: out and dq/dk/dv in the
# layouts of q and q/k/v, lse contiguous, the drawn rng_state an int64[2] CPU tensor.


def _empty_in_layout_of(like: torch.Tensor, last) -> torch.Tensor:
    """A new tensor of like's sizes but `last` in the last dimension ([B, H, L, last], or packed
    [total, H, last]) whose other dimensions lie in memory in the order of like's (outermost
    first by stride; size-1 and broadcast dimensions outermost; ties keep the logical order):
    the rule of empty_in_layout_of in python/csrc/ops.cpp."""
    n = like.dim() - 1

    def outerness(d):
        return math.inf if like.shape[d] == 1 or like.stride(d) == 0 else like.stride(d)

    order = sorted(range(n), key=outerness, reverse=True)  # stable, also reversed
    storage = like.new_empty([like.shape[d] for d in order] + [last])
    if order == list(range(n)):
        return storage
    logical = [0] * n + [n]
    for position, d in enumerate(order):
        logical[d] = position
    return storage.permute(logical)


# q_start, k_start and kv_block (a call placed in a larger attention, for context parallelism)
# and the score modifiers (window_left, window_right, alibi_slopes, softcap) change no shape.
@torch.library.register_fake("memeff::fwd")
def _fwd_fake(q, k, v, bias, rng_state, dropout_p, causal, scale, backends, generator=None, *,
              q_start=0, k_start=0, kv_block=False, window_left=-1, window_right=-1,
              alibi_slopes=None, softcap=0.0):
    out = _empty_in_layout_of(q, v.shape[3])
    lse = q.new_empty((q.shape[0], q.shape[1], q.shape[2]), dtype=torch.float32)
    drawn = 2 if dropout_p > 0 and rng_state is None else 0
    return out, lse, torch.empty((drawn,), dtype=torch.int64, device="cpu")


@torch.library.register_fake("memeff::bwd")
def _bwd_fake(dout, q, k, v, bias, out, lse, rng_state, dropout_p, causal, scale, bias_grad,
              backends, *, q_start=0, k_start=0, kv_block=False, window_left=-1, window_right=-1,
              alibi_slopes=None, softcap=0.0):
    dbias = bias.new_empty(bias.shape) if bias_grad else q.new_empty((0,))
    return (_empty_in_layout_of(q, q.shape[3]), _empty_in_layout_of(k, k.shape[3]),
            _empty_in_layout_of(v, v.shape[3]), dbias)


@torch.library.register_fake("memeff::varlen_fwd")
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, rng_state,
                     dropout_p, causal, scale, backends, check_offsets, generator=None, *,
                     window_left=-1, window_right=-1, alibi_slopes=None, softcap=0.0):
    out = _empty_in_layout_of(q, v.shape[2])
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    drawn = 2 if dropout_p > 0 and rng_state is None else 0
    return out, lse, torch.empty((drawn,), dtype=torch.int64, device="cpu")


@torch.library.register_fake("memeff::varlen_bwd")
def _varlen_bwd_fake(dout, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out,
                     lse, rng_state, dropout_p, causal, scale, backends, *, window_left=-1,
                     window_right=-1, alibi_slopes=None, softcap=0.0):
    return (_empty_in_layout_of(q, q.shape[2]), _empty_in_layout_of(k, k.shape[2]),
            _empty_in_layout_of(v, v.shape[2]))


@torch.library.register_fake("memeff::dropout_mask")
def _dropout_mask_fake(rng_state, shape, dropout_p):
    return torch.empty(shape, dtype=torch.bool, device=rng_state.device)


@torch.library.register_fake("memeff::draw_rng_state")
def _draw_rng_state_fake(like, generator=None):
    return torch.empty((2,), dtype=torch.int64, device="cpu")


# ---------------------------------------------------------------------------------------------
# The user-facing API.


class ArgumentError(ValueError, RuntimeError):
    """A bad argument that torch.nn.functional.scaled_dot_product_attention reports as a
    RuntimeError: memeff's errors for bad arguments are ValueErrors (README), and this one is
    both, so code written for either catches it."""


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
            raise ArgumentError("memeff: explicit attn_mask should not be set when is_causal=True "
                               "(as in torch); pass causal='top_left' or 'bottom_right' to "
                               "combine a mask with a causal mask")
        if mode == "bottom_right":
            raise ValueError("memeff: is_causal=True means top-left causal and conflicts with "
                             "causal='bottom_right'")
        mode = "top_left"
    return mode


def _check_mask_shape(attn_mask: torch.Tensor, q: torch.Tensor, rank: int, keys: int) -> None:
    """ValueError unless attn_mask broadcasts (from the right) to the attention scores, said in
    terms of attn_mask."""
    if attn_mask.dim() > rank:
        raise ValueError(f"memeff: argument `attn_mask`: {attn_mask.dim()} dimensions do not "
                         f"broadcast to the {rank}-dimensional attention scores")
    scores = ((q.shape[0], q.shape[1], q.shape[2], keys) if rank == 4
              else (q.shape[0], q.shape[2], keys))
    if any(m != 1 and m != n for m, n in zip(reversed(attn_mask.shape), reversed(scores))):
        names = "[B, Hq, Lq, Lk]" if rank == 4 else "[B, Lq, Lk]"
        raise ValueError(f"memeff: argument `attn_mask`: shape {tuple(attn_mask.shape)} does not "
                         f"broadcast to the attention scores {names} = {list(scores)}")


def _traced(t: torch.Tensor) -> bool:
    """Whether a call on t is being traced rather than run: by Dynamo, or under one of the dispatch
    modes tracing runs in (the fake tensors Dynamo and AOTAutograd trace with, functionalization,
    make_fx's proxies). The math slot's kernel runs memeff's Python under them as torch.compile
    traces F.sdpa, and there torch.compiler.is_compiling() is False. A tensor such a call makes
    belongs to its trace: kept in module state, it fails the next trace (another fake mode:
    "Mixing fake modes NYI") and a real one kept from an eager call fails inside a trace ("Please
    convert all Tensors to FakeTensors first"). A user's own dispatch mode (FlopCounterMode, a
    logging mode) runs the call for real: its state is kept."""
    if torch.compiler.is_compiling() or isinstance(t, _TRACED_TENSORS):
        return True
    if torch._C._len_torch_dispatch_stack() == 0:
        return False
    return any(isinstance(mode, _TRACING_MODES) for mode in _get_current_dispatch_mode_stack())


_TRACED_TENSORS = (FakeTensor, FunctionalTensor)
_TRACING_MODES = (FakeTensorMode, FunctionalTensorMode, ProxyTorchDispatchMode)

_MASK_VALUES: dict = {}  # eager calls' values per dtype (see _mask_values)


def _new_mask_values(dtype: torch.dtype):
    # On the CPU by name: a default device (`with torch.device("cuda"):`) must not move them.
    return (torch.zeros((), dtype=dtype, device="cpu"),
            torch.full((), float("-inf"), dtype=dtype, device="cpu"))


def _mask_values(dtype: torch.dtype, q: torch.Tensor):
    """0 and -inf as 0-dim CPU tensors of `dtype`: made once per dtype for eager calls, and
    anew by a traced call (_traced(q)), in its trace (two small fills in the graph)."""
    if _traced(q):
        return _new_mask_values(dtype)
    values = _MASK_VALUES.get(dtype)
    if values is None:
        values = _MASK_VALUES[dtype] = _new_mask_values(dtype)
    return values


def _bias_of_mask(attn_mask: Optional[torch.Tensor], q: torch.Tensor, rank: int,
                  keys: int) -> Optional[torch.Tensor]:
    """The additive [B|1, H|1, Lq|1, Lk] bias memeff takes, from torch's attn_mask conventions
    (broadcast from the right; a boolean mask keeps True and drops False)."""
    if attn_mask is None:
        return None
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(f"memeff: argument `attn_mask`: expected a bool or floating-point mask, "
                        f"got {attn_mask.dtype}")
    _check_mask_shape(attn_mask, q, rank, keys)
    bias = attn_mask
    # A dimension broadcast by expand (stride 0, e.g. transformers' [B, 1, Lq, Lk] padding mask
    # expanded from [B, 1, 1, Lk]) is read once: memeff broadcasts size-1 dimensions itself, so
    # nothing of size Lq (or H, B) is materialized. The gradient of such a mask still comes out
    # right: the expand's backward sums what flows into its one row.
    for d in range(bias.dim() - 1):
        if bias.stride(d) == 0 and bias.shape[d] > 1:
            bias = bias.narrow(d, 0, 1)
    if bias.dtype == torch.bool:
        # One kernel, in q's dtype (0 and -inf are exact there): half the bytes of an fp32 bias,
        # and the Hopper forward loads a 16-bit bias that varies over queries in tiles by TMA.
        # The two values as 0-dim CPU tensors, which torch.where takes beside tensors of any
        # device as it takes Python scalars but in their own dtype: no allocation or fill on the
        # GPU per call (q.new_zeros(()) and q.new_full(()) launched two).
        zero, minus_inf = _mask_values(q.dtype, q)
        bias = torch.where(bias, zero, minus_inf)
    elif bias.dtype != q.dtype and bias.dtype != torch.float32:
        bias = bias.to(q.dtype)
    while bias.dim() < rank:
        bias = bias.unsqueeze(0)
    if rank == 3:
        bias = bias.unsqueeze(1)
    if bias.shape[-1] == 1 and keys != 1:
        # memeff broadcasts bias over B, H and Lq but stores keys densely.
        bias = bias.expand(*bias.shape[:-1], keys)
    return bias


def _rows_of_mask(attn_mask: Optional[torch.Tensor], q: torch.Tensor, rank: int,
                  keys: int) -> Optional[torch.Tensor]:
    """A boolean mask constant over the keys (broadcast there with stride 0, as transformers'
    masks of a model without padding are under torch.compile) keeps or drops whole query rows:
    then the attention runs without it and its output is multiplied by the rows' keep values,
    returned here as the mask's [..., Lq, 1] (None for any other mask). A row that keeps every
    key needs no bias, and one that drops every key gives 0, as a -inf bias would: no [Lq, Lk]
    bias is built or read."""
    if (attn_mask is None or attn_mask.dtype != torch.bool or attn_mask.dim() < 2
            or attn_mask.shape[-1] <= 1 or attn_mask.stride(-1) != 0):
        return None
    _check_mask_shape(attn_mask, q, rank, keys)
    return attn_mask.narrow(-1, 0, 1)


def _score_modifiers(window_size, alibi_slopes, softcap, q: torch.Tensor) -> dict:
    """The ops' keyword arguments for window_size, alibi_slopes and softcap (docs/window.md),
    checked where the ops cannot name them as the user wrote them: window_size a pair of ints,
    each -1 (unbounded) or >= 0; alibi_slopes an fp32 tensor on q's device (its shape, [Hq] or
    [B, Hq], memeff checks and names); softcap a finite number >= 0."""
    kwargs = {}
    if window_size is not None:
        if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
                or not all(isinstance(w, int) and not isinstance(w, bool) for w in window_size)):
            raise ValueError(f"memeff: argument `window_size`: expected a pair of ints (left, "
                             f"right), each -1 (unbounded) or >= 0, got {window_size!r}")
        left, right = window_size
        if left < -1 or right < -1:
            raise ValueError(f"memeff: argument `window_size`: expected each side -1 (unbounded) "
                             f"or >= 0, got {tuple(window_size)}")
        if (left, right) != (-1, -1):
            kwargs.update(window_left=left, window_right=right)
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor):
            raise TypeError(f"memeff: argument `alibi_slopes`: expected an fp32 tensor [Hq] or "
                            f"[B, Hq], got {type(alibi_slopes).__name__}")
        if alibi_slopes.dtype != torch.float32:
            raise TypeError(f"memeff: argument `alibi_slopes`: expected float32 slopes, got "
                            f"{alibi_slopes.dtype}")
        if alibi_slopes.device != q.device:
            raise ValueError(f"memeff: argument `alibi_slopes`: expected it on {q.device} (the "
                             f"device of the query), got {alibi_slopes.device}")
        if alibi_slopes.requires_grad and torch.is_grad_enabled():
            warnings.warn("memeff: argument `alibi_slopes` requires grad, but memeff computes no "
                          "gradient for the slopes (nor does FlashAttention): they receive none "
                          "and stay as they are; pass alibi_slopes.detach() to say so",
                          stacklevel=3)
        kwargs["alibi_slopes"] = alibi_slopes
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"memeff: argument `softcap`: expected a number (0: off), got "
                        f"{type(softcap).__name__}")
    # Comparisons (NaN fails them), not math.isfinite, which torch.compile cannot trace for a
    # symbolic float.
    if not 0 <= softcap < math.inf:
        raise ValueError(f"memeff: argument `softcap`: expected a finite number >= 0 (0: off), "
                         f"got {softcap!r}")
    if softcap > 0:
        kwargs["softcap"] = float(softcap)
    return kwargs


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
    window_size: Optional[Tuple[int, int]] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    softcap: float = 0.0,
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
      rng_state: replay a previous call's mask by passing its rng_state instead of drawing (an
        int64[2] tensor of seed and offset, on the CPU or on the device of query).
      return_rng_state: return (out, rng_state), rng_state on the device of query (None when
        dropout_p is 0).
      window_size: (left, right), a sliding window around each query's diagonal: query i sees
        key j iff i + shift - left <= j <= i + shift + right, shift aligning the diagonal as the
        causal mode does (0 for top_left, Lk - Lq for bottom_right and for no causal mask); -1
        leaves a side unbounded, a causal mode caps right at 0. Default: no window.
      alibi_slopes: fp32 [Hq] or [B, Hq] on query's device: the score gains
        -slope·|i + shift - j| (ALiBi). No gradient (a warning says so when they require one).
      softcap: > 0 maps each scaled score s = scale·q·k to softcap·tanh(s / softcap) before the
        mask, ALiBi and masking (Gemma-2); 0 (default) is off.
      These three are docs/window.md: the CPU, the fused CUDA kernels (cuda on compute
      capability 8.0 and newer, head dims up to 256; cuda_sm90 on Hopper) and cuda_math (any
      GPU, fp32 too, materializing the scores) run them, forward and backward; the decode
      kernel (cuda_splitkv) runs them in its forward.

    out has query's memory layout (see the module's docstring).

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
        raise ArgumentError(f"memeff: query has {q.shape[1]} heads and key/value {k.shape[1]}; "
                           f"pass enable_gqa=True for grouped-query attention (as in torch)")
    modifiers = _score_modifiers(window_size, alibi_slopes, softcap, q)
    rows = _rows_of_mask(attn_mask, q, rank, k.shape[2])
    bias = None if rows is not None else _bias_of_mask(attn_mask, q, rank, k.shape[2])
    p = float(dropout_p)
    # One op: it draws the dropout state itself when p > 0 and none is given.
    out, _, drawn = _ops.fwd(q, k, v, bias, rng_state, p, mode,
                             None if scale is None else float(scale), _backend_order, generator,
                             **modifiers)
    state = (rng_state if rng_state is not None else drawn) if p > 0.0 else None
    if not _traced(q):  # a traced call's state is a fake tensor of its trace
        _thread_state.last_rng_state = None if state is None else (state, q.device)
    if rank == 3:
        out = out.squeeze(1)
    if rows is not None:
        out = out * rows  # a dropped row is 0, as PyTorch's math path gives it (NaN stays NaN)
    if not return_rng_state:
        return out
    if state is not None and state.device != q.device:
        state = state.to(q.device)
    return out, state


def _max_length(value, name: str):
    """A maximum sequence length as the op takes it: an int (or a SymInt under torch.compile);
    a one-element tensor is read (a device synchronization for a CUDA tensor, an unbacked SymInt
    under torch.compile with capture_scalar_outputs)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_floating_point() or value.is_complex():
            raise ValueError(f"memeff: argument `{name}`: expected an int or a one-element integer "
                             f"tensor, got a {value.dtype} tensor of shape {tuple(value.shape)}")
        return value.item()
    return value


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p: float = 0.0,
    causal: Union[None, bool, str] = None,
    scale: Optional[float] = None,
    *,
    generator: Optional[torch.Generator] = None,
    rng_state: Optional[torch.Tensor] = None,
    return_lse: bool = False,
    return_rng_state: bool = False,
    check_offsets: bool = False,
    window_size: Optional[Tuple[int, int]] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    softcap: float = 0.0,
):
    """Attention over packed variable-length sequences (no padding), computed by memeff.

    q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv] hold S sequences one after
    the other; sequence s owns query rows cu_seqlens_q[s]:cu_seqlens_q[s+1] and key rows
    cu_seqlens_k[s]:cu_seqlens_k[s+1] and attends only within itself. cu_seqlens_q/k: int32
    [S + 1] on the device of q (0 first, non-decreasing, the totals last); max_seqlen_q/k: ints
    at least every sequence's length (a one-element tensor is read, which synchronizes on a GPU).
    Hq a multiple of Hkv is grouped-query attention. Returns out [total_q, Hq, Dv], laid out like
    q. Autograd reaches q, k and v.

    causal: None/False, True or "top_left" (query i of a sequence sees its keys j <= i), or
      "bottom_right" (j <= i + Lk_s - Lq_s: each sequence's last query sees all its keys; the
      same as top_left where a sequence has as many queries as keys).
    dropout_p: applied whenever > 0, as in scaled_dot_product_attention. Dropout element
      (s, h, i, j) is element (b = s, h, i, j) of the dense op's mask for the padded batch, so
      packing never changes the mask: dropout_mask((S, Hq, max_q, max_k), p, rng_state)[s, :,
      :Lq_s, :Lk_s] is the mask of sequence s.
    scale: default 1/sqrt(D).
    generator, rng_state: as for scaled_dot_product_attention.
    return_lse: also return lse [Hq, total_q] (fp32, natural log of each row's softmax
      denominator; -inf for a row that sees no key; not differentiable).
    return_rng_state: also return the rng_state (on the device of q; None without dropout).
      With both, the result is (out, lse, rng_state).
    check_offsets: read the offsets and check their values (0 first, non-decreasing, the
      packed totals last, no sequence longer than its max_seqlen), raising ValueError naming
      the argument. On the CPU they are always checked. On a GPU this is a copy to the host and
      a stream synchronization per call (skipped while a CUDA graph is captured), so it is off
      by default: unchecked offsets never make a kernel read or write outside the tensors (the
      kernels clamp them) but give meaningless results. Turn it on while debugging a data
      pipeline. The backward never reads them on the host.
    window_size, alibi_slopes, softcap: as for scaled_dot_product_attention, per sequence (the
      diagonal of a sequence without causal masking or with bottom_right is its last query on
      its last key); alibi_slopes [Hq] or [S, Hq] (a row per sequence).

    A bias is not supported with packed sequences; pad the batch for that.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"memeff: argument `{name}`: expected a packed [total, H, D] tensor "
                             f"(varlen_attention), got {t.dim()} dimensions")
    mode = _causal_mode(False, causal, None)
    modifiers = _score_modifiers(window_size, alibi_slopes, softcap, q)
    p = float(dropout_p)
    out, lse, drawn = _ops.varlen_fwd(
        q, k, v, cu_seqlens_q, cu_seqlens_k, _max_length(max_seqlen_q, "max_seqlen_q"),
        _max_length(max_seqlen_k, "max_seqlen_k"), rng_state, p, mode,
        None if scale is None else float(scale), _backend_order, bool(check_offsets), generator,
        **modifiers)
    state = (rng_state if rng_state is not None else drawn) if p > 0.0 else None
    if not _traced(q):  # a traced call's state is a fake tensor of its trace
        _thread_state.last_rng_state = None if state is None else (state, q.device)
    return _with_extras(out, lse, state, q, return_lse, return_rng_state)


def _with_extras(out: torch.Tensor, lse: torch.Tensor, state: Optional[torch.Tensor],
                 q: torch.Tensor, return_lse: bool, return_rng_state: bool):
    """out alone, or (out, lse), (out, rng_state), (out, lse, rng_state) by the return_* flags;
    the state on q's device (None without dropout)."""
    if not (return_lse or return_rng_state):
        return out
    result = [out]
    if return_lse:
        result.append(lse)
    if return_rng_state:
        if state is not None and state.device != q.device:
            state = state.to(q.device)
        result.append(state)
    return tuple(result)


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
    """The rng_state of this thread's latest eager scaled_dot_product_attention or
    varlen_attention call, on the device of its query (None if it had no dropout). Under
    CUDA-graph capture it is the graph's tensor, rewritten each replay."""
    last = _thread_state.last_rng_state
    if last is None:
        return None
    state, device = last
    return state if state.device == device else state.to(device)


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


def _current_backends() -> Tuple[str, ...]:
    """The allow-list of use_backends now (read at call time by memeff.torch.context_parallel)."""
    return _backend_order


def backend_names() -> List[str]:
    """The backends compiled into this build ("reference", "cpu", "cuda_sm90", "cuda", ...)."""
    return list(_ops.backend_names())


def version() -> str:
    """The memeff library version this extension was built from."""
    return str(_ops.version())


from . import hf  # noqa: E402  (memeff.torch.hf.register(): transformers is imported only there)
from .context_parallel import (  # noqa: E402  (it uses the helpers above)
    context_parallel_attention, context_parallel_shard, context_parallel_unshard)
from . import aten_sdpa  # noqa: E402  (memeff inside torch's own scaled_dot_product_attention)
from .aten_sdpa import activate, deactivate, explain_sdpa  # noqa: E402

aten_sdpa.register_with_torch()  # known to torch.nn.attention's registry; active only on request
