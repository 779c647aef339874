"""memeff as a Hugging Face transformers attention implementation.

    import memeff.torch.hf
    memeff.torch.hf.register()   # once per process
    model = AutoModel.from_config(config, attn_implementation="memeff")

Models that call attention through transformers' attention-function registry (BERT-style
encoders, Llama/Mistral-style decoders, ...) then run memeff's fused kernels: causal masks as
memeff's causal mode (no mask tensor), grouped-query attention without repeating k and v,
padding masks as a bias broadcast over the heads ([B, 1, Lq, Lk] where the mask also holds a
causal or windowed pattern) and over the queries too (an encoder's [B, 1, 1, Lk]), and
attention dropout as the module passes it (its rate in training, 0 in eval). The output comes in
the [B, L, H, D] layout transformers wants with no copy, since memeff's output takes the query's
[B, L, H, D] storage order.

A plain causal or bidirectional pattern without padding gets no mask, under torch.compile too
(mask_function), and a right-padded batch (an encoder's, or a decoder's with as many queries as
keys) runs as per-batch key lengths through varlen_attention instead of reading a mask (eager
calls; _right_padding, _causal_right_padding).

Sliding windows and logit softcapping (Mistral, Gemma-2) run in memeff's kernels: a causal
module's `sliding_window` W as window_size (W - 1, 0), `softcap` as softcap; a plain causal
sliding window without padding then needs no mask (_window_without_mask; docs/torch.md).

Padding-free (packed) batches run memeff.torch.varlen_attention, as transformers runs
flash-attention's varlen function for them: sequences concatenated into one row (batch 1) whose
position_ids restart at each sequence (what DataCollatorWithFlattening returns), or the
cu_seq_lens_q / cu_seq_lens_k / max_length_q / max_length_k keyword arguments
(DataCollatorWithFlattening(return_flash_attn_kwargs=True)). The mask function then builds no
[T, T] block-diagonal mask for a plainly causal (or bidirectional) packed batch; a model whose
mask holds more (a sliding window, ...) gets transformers' mask and the dense path, which is
as correct. Under torch.compile the mask is kept and the padding-free path is taken only from
the cu_seq_lens keyword arguments (finding sequences in position_ids reads their values).

Written against transformers 5.x (AttentionInterface and AttentionMaskInterface.register; the
GPU machine has 5.17, this was also run with 5.25); transformers is imported only by register()
and the mask function.
"""

import collections
import functools
import weakref
from typing import Optional, Tuple

import torch

from . import scaled_dot_product_attention, varlen_attention
from .. import torch as _memeff_torch

__all__ = ["NAME", "attention_forward", "mask_function", "register"]

NAME = "memeff"


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    position_bias: Optional[torch.Tensor] = None,
    **kwargs,
) -> Tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [B, Hq, Lq, D], key/value
    [B, Hkv, Lk, D(v)], attention_mask boolean (True = attend) or additive float, broadcastable
    to [B, Hq, Lq, Lk], or None. Returns ([B, Lq, Hq, Dv], None): memeff never forms the
    attention weights. `softcap` (Gemma-2's attention logit cap) and `sliding_window` (a causal
    module's last W keys, the query's own included: window (W - 1, 0)) run in memeff's kernels
    (docs/window.md); `s_aux` (attention sinks) and `block_table` (paged caches) are refused."""
    for unsupported in ("s_aux", "block_table"):
        if kwargs.get(unsupported) is not None:
            raise NotImplementedError(f"memeff attention: argument `{unsupported}` is not "
                                      f"supported; use another attn_implementation for this model")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    modifiers = {"softcap": float(kwargs.get("softcap") or 0.0)}
    window = _causal_window(module, attention_mask, position_bias, is_causal, kwargs)
    if window is not None:
        modifiers["window_size"] = window
    # A decoder's right padding as mask_function returns it: key-padding rows that carry the
    # causal pattern with them (top-left: as many queries as keys, from position 0).
    causal_padding = _is_causal_padding(attention_mask)
    if attention_mask is None and position_bias is None:
        packing = _packing(query, key, kwargs)
        if packing is not None:
            return _varlen_forward(query, key, value, packing, dropout, scaling, is_causal,
                                   modifiers), None
    elif position_bias is None and (causal_padding or not is_causal):
        # fp32 packed calls have no CUDA backend (the fused kernels take 16-bit inputs): those,
        # and any other packed call no backend takes, run the dense path below, the same mask.
        keys = None if query.is_cuda and query.dtype == torch.float32 else _right_padding(
            attention_mask, key)
        if keys is not None:
            try:
                return _key_lengths_forward(query, key, value, keys, dropout, scaling,
                                            "top_left" if causal_padding else None,
                                            modifiers), None
            except NotImplementedError:
                pass
    # As transformers' sdpa_attention_forward decides it: causal only when the mask was left out
    # because it was purely causal (an explicit mask already holds the causal pattern), never for
    # a single query (decoding), and for decoder modules (module.is_causal) unless told otherwise.
    # A causal padding mask holds only the padding: the causal pattern comes from the mode.
    causal = ("top_left" if query.shape[2] > 1 and (attention_mask is None and is_causal or
                                                    causal_padding) else None)
    bias = attention_mask
    if position_bias is not None:  # T5-style learned relative bias: add the mask to it
        if attention_mask is None:
            bias = position_bias
        elif attention_mask.dtype == torch.bool:
            bias = position_bias.masked_fill(attention_mask.logical_not(), float("-inf"))
        else:
            bias = position_bias + attention_mask
    # Top-left causal over the whole key range is what transformers gets by slicing the keys of a
    # static cache to Lq: no query sees a key past its own position either way.
    out = scaled_dot_product_attention(query, key, value, attn_mask=bias, dropout_p=dropout,
                                       scale=scaling, enable_gqa=query.shape[1] != key.shape[1],
                                       causal=causal, **modifiers)
    # memeff's out is laid out like the query, which transformers builds as a [B, L, H, D]
    # projection viewed as heads: this transpose is contiguous and .contiguous() copies nothing.
    return out.transpose(1, 2).contiguous(), None


# Sliding windows -------------------------------------------------------------------------------

# The configs of models whose attention modules pass `sliding_window` to the attention function,
# by id (Mistral's and Gemma-2's do; some models build sliding-window masks without passing it).
# Only their sliding-window masks may be left out (_window_without_mask): the first forward of
# such a model builds transformers' mask, and its attention calls record the config here.
_configs_passing_windows: "weakref.WeakValueDictionary[int, object]" = (
    weakref.WeakValueDictionary())


def _causal_window(module, attention_mask, position_bias, is_causal, kwargs):
    """The window (W - 1, 0) of a causal module's `sliding_window` W (transformers' pattern:
    key j visible to query i iff i - W < j <= i, the last W keys) when there is no mask to hold
    it; None otherwise (an explicit mask already holds the window and the positions, which a
    window aligned on Lq and Lk could not know with a static cache)."""
    width = kwargs.get("sliding_window")
    if width is None:
        return None
    config = getattr(module, "config", None)
    if config is not None:
        _configs_passing_windows[id(config)] = config
    if not is_causal or attention_mask is not None or position_bias is not None:
        return None
    return (int(width) - 1, 0)


@functools.lru_cache(maxsize=None)
def _window_codes():
    """The code objects of transformers' causal sliding-window mask function: the combinator
    (and_masks) and the window overlay."""
    from transformers import masking_utils as mu
    overlay = mu.sliding_window_overlay(1).__code__
    return mu.and_masks(mu.causal_mask_function).__code__, overlay


def _is_causal_window(mask_fn, width) -> bool:
    """Whether a transformers mask function is exactly causal with a sliding window of `width`
    (sliding_window_causal_mask_function(width)) and nothing else."""
    from transformers.masking_utils import causal_mask_function
    combinator, overlay = _window_codes()
    if getattr(mask_fn, "__code__", None) is not combinator:
        return False
    parts = [cell.cell_contents for cell in mask_fn.__closure__ or ()]
    parts = [p for part in parts for p in (part if isinstance(part, tuple) else (part,))
             if callable(p)]
    if len(parts) != 2 or causal_mask_function not in parts:
        return False
    (window,) = [p for p in parts if p is not causal_mask_function]
    if getattr(window, "__code__", None) is not overlay:
        return False
    widths = [cell.cell_contents for cell in window.__closure__ or ()]
    return widths == [width]


# The head dims whose Hopper kernels run a window in both passes (docs/window.md).
def _kernels_take_windows(device, dtype=None, config=None) -> bool:
    """Whether memeff's fused backends on `device` run a window for a model of `config` computing
    in `dtype` (docs/window.md): the host backends always; on a GPU the fused kernels (`cuda` on
    compute capability 8.0 and newer, `cuda_sm90` on 9.0: fp16 or bf16, head dims that are
    multiples of 8 up to 256, forward and backward). Other GPU calls get transformers'
    sliding-window mask, read as a bias, as before windows existed (cuda_math would run the
    window too, but materializes the scores)."""
    device = torch.device(device)
    if device.type == "cpu":
        return True
    if (device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16) or config is None
            or "cuda" not in _memeff_torch.backend_names()
            or torch.cuda.get_device_capability(device) < (8, 0)):
        return False
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None:
        heads = getattr(config, "num_attention_heads", None)
        head_dim = config.hidden_size // heads if heads else None
    return isinstance(head_dim, int) and 0 < head_dim <= 256 and head_dim % 8 == 0


def _window_without_mask(kwargs) -> bool:
    """Whether a mask request is a plain causal sliding window with no padding (mask), from
    position 0 (training, a prefill), for a model whose attention receives `sliding_window`:
    the attention then runs top-left causal with window (W - 1, 0) and needs no mask. Eager
    only (the registry of models is not read while torch.compile traces)."""
    width, padding = kwargs.get("local_size"), kwargs.get("attention_mask")
    config = kwargs.get("config")
    if not _kernels_take_windows(kwargs.get("device", "cpu"), kwargs.get("dtype"), config):
        return False
    q_offset, kv_offset = kwargs.get("q_offset", 0), kwargs.get("kv_offset", 0)
    if not (isinstance(width, int) and width > 0 and config is not None
            and _configs_passing_windows.get(id(config)) is config
            and kwargs.get("allow_is_causal_skip", True)
            and not isinstance(q_offset, torch.Tensor) and q_offset == 0
            and not isinstance(kv_offset, torch.Tensor) and kv_offset == 0
            and not torch.compiler.is_compiling()
            and _is_causal_window(kwargs.get("mask_function"), width)):
        return False
    if padding is None:
        return True
    # A padding mask that masks nothing (read once per mask tensor, as the other masks are).
    if padding.dim() != 2:
        return False
    found = _key_padding_of(_key_padding_rows(padding, kwargs, kwargs.get("kv_length"), 0))
    return found is not None and found.kind == "none"


# Padding-free batches ---------------------------------------------------------------------------

_PACKING_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def _read_once_per_tensor(read):
    """read(tensor), a function of a tensor's values, remembered for the latest tensor (the same
    object at the same version): every layer of a forward gets the same position_ids or mask,
    so its values are read (a device synchronization) once per forward. None while a CUDA graph
    captures, where reading would synchronize."""
    last = [None, -1, None]

    @functools.wraps(read)
    def remembered(tensor: torch.Tensor):
        if tensor.is_cuda and torch.cuda.is_current_stream_capturing():
            return None
        ref, version, found = last
        if ref is not None and ref() is tensor and version == tensor._version:
            return found
        found = read(tensor)
        last[:] = [weakref.ref(tensor), tensor._version, found]
        return found

    return remembered


def _packing(query: torch.Tensor, key: torch.Tensor, kwargs):
    """(cu_seqlens_q, cu_seqlens_k, max_q, max_k) of a padding-free call, or None: from the
    flash-attention keyword arguments when all four are given (as transformers' flash path takes
    them), else from position_ids restarting inside one row of queries and keys (batch 1,
    equal lengths, not while torch.compile traces or a CUDA graph captures)."""
    given = [kwargs.get(name) for name in _PACKING_KWARGS]
    if all(x is not None for x in given):
        return tuple(given)
    position_ids = kwargs.get("position_ids")
    if (position_ids is None or query.shape[0] != 1 or query.shape[2] < 2
            or key.shape[2] != query.shape[2] or position_ids.dim() > 2
            or position_ids.numel() != query.shape[2] or torch.compiler.is_compiling()):
        return None
    return _packing_of_positions(position_ids)


@_read_once_per_tensor
def _packing_of_positions(position_ids: torch.Tensor):
    """Sequences in one row of position ids: a new one starts wherever the position does not
    grow by 1 (the rule of transformers' find_packed_sequence_indices, which its masks follow).
    None for a single sequence."""
    positions = position_ids.reshape(-1)
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[1:] = positions[1:] - positions[:-1] != 1
    first = starts.nonzero().flatten()
    if first.numel() < 2:
        return None
    cu_seqlens = torch.cat([first, first.new_tensor([positions.numel()])]).to(torch.int32)
    longest = int(cu_seqlens.diff().max())
    return cu_seqlens, cu_seqlens, longest, longest


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[B, H, L, D] as packed rows [B·L, H, D]: a view for transformers' projections, which are
    [B, L, H, D] tensors seen as heads (a copy for any other layout)."""
    return t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3])


def _varlen_forward(query, key, value, packing, dropout, scaling, is_causal,
                    modifiers) -> torch.Tensor:
    """query [B, Hq, L, D] (and key, value) as B·L packed rows -> [B, L, Hq, Dv]. Causal is
    bottom-right per sequence, as flash-attention's varlen function aligns it (the same as
    top-left where a sequence has as many queries as keys); modifiers: the window and softcap
    keywords of varlen_attention."""
    cu_q, cu_k, max_q, max_k = packing
    B, Hq, L, _ = query.shape
    out = varlen_attention(_rows(query), _rows(key), _rows(value),
                           cu_q.to(device=query.device, dtype=torch.int32),
                           cu_k.to(device=query.device, dtype=torch.int32), max_q, max_k,
                           dropout_p=dropout, causal="bottom_right" if is_causal else None,
                           scale=scaling, **modifiers)
    return out.reshape(B, L, Hq, out.shape[-1])


# Right-padded key masks ----------------------------------------------------------------------

# The [B, 1, 1, Lk] masks mask_function returned for a decoder's right padding, by id: they hold
# the padding only, and the attention adds the causal pattern (_is_causal_padding).
_causal_padding_masks: "weakref.WeakValueDictionary[int, torch.Tensor]" = (
    weakref.WeakValueDictionary())


def _is_causal_padding(mask: Optional[torch.Tensor]) -> bool:
    return mask is not None and _causal_padding_masks.get(id(mask)) is mask


def _causal_right_padding(kwargs) -> Optional[torch.Tensor]:
    """For a plain causal pattern over a right-padded batch with as many queries as keys, from
    position 0 (a decoder's training or prefill step), eager: the padding as [B, 1, 1, Lk]
    boolean rows, remembered as causal (the attention runs it as key lengths with top-left
    causal, or as a key-padding bias under causal mode), instead of transformers' [B, 1, Lq, Lk]
    mask. None otherwise (transformers' mask then)."""
    from transformers.masking_utils import causal_mask_function

    padding = kwargs.get("attention_mask")
    q_length, kv_length = kwargs.get("q_length"), kwargs.get("kv_length")
    if (padding is None or padding.dim() != 2 or kwargs.get("local_size") is not None
            or kwargs.get("mask_function", causal_mask_function) is not causal_mask_function
            or not isinstance(q_length, int) or q_length != kv_length
            or kwargs.get("q_offset", 0) != 0 or isinstance(kwargs.get("q_offset"), torch.Tensor)
            or kwargs.get("kv_offset", 0) != 0 or torch.compiler.is_compiling()):
        return None
    rows = _key_padding_rows(padding, kwargs, kv_length, 0)
    found = _key_padding_of(rows)
    if found is None or found.kind != "right":  # left padding, holes, none at all, or unread
        return None
    _causal_padding_masks[id(rows)] = rows
    return rows


def _right_padding(mask: Optional[torch.Tensor], key: torch.Tensor):
    """(rows, cu_seqlens_k, max_k) of a key-padding mask ([B, 1, 1, Lk] boolean, as
    mask_function returns it) whose every row is a prefix of True (right padding) and that
    masks some key: the packed rows of the keys each batch entry sees, their offsets and the
    longest; None for any other mask, and while torch.compile traces (reading the values would
    break the graph) or a CUDA graph captures."""
    if (mask is None or mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1:3] != (1, 1)
            or mask.shape[0] != key.shape[0] or mask.shape[3] != key.shape[2]
            or torch.compiler.is_compiling()):
        return None
    found = _key_padding_of(mask)
    return found.packed if found is not None and found.kind == "right" else None


def _key_padding_rows(padding: torch.Tensor, kwargs, kv_length, kv_offset) -> torch.Tensor:
    """A mask request's 2D padding mask as [B, 1, 1, Lk] boolean key-padding rows."""
    from transformers.masking_utils import prepare_padding_mask

    padding = prepare_padding_mask(padding, kv_length, kv_offset)
    padding = padding.to(device=kwargs.get("device", padding.device), dtype=torch.bool)
    return padding[:, None, None, :]


KeyPadding = collections.namedtuple("KeyPadding", ["kind", "packed"])
KeyPadding.__doc__ = """What a key-padding mask holds: kind "none" (every key kept), "right"
(each row a prefix of kept keys, some key masked; packed = (rows, cu_seqlens_k, max_k) of the
kept keys) or "other"."""


@_read_once_per_tensor
def _key_padding_of(mask: torch.Tensor) -> KeyPadding:
    """The one reading of a [B, 1, 1, Lk] key-padding mask's values, shared by the mask function
    (no mask where every key is kept) and the attention (key lengths where right-padded): one
    synchronization for a mask that masks nothing, three for a right-padded one (its check, its
    shape, the kept keys' rows); once per mask tensor, so per forward, not per layer (None while
    a CUDA graph captures)."""
    keep = mask.reshape(mask.shape[0], mask.shape[3])
    if bool(keep.all()):  # a synchronization, and the only one of a mask that masks nothing
        return KeyPadding("none", None)
    B, Lk = keep.shape
    lengths = keep.sum(dim=1)  # int64
    prefix = torch.arange(Lk, device=keep.device)[None, :] < lengths[:, None]
    misplaced, longest = torch.stack([(keep != prefix).sum(), lengths.max()]).tolist()
    if misplaced:
        return KeyPadding("other", None)
    rows = prefix.reshape(-1).nonzero().reshape(-1)
    cu_seqlens = torch.zeros(B + 1, dtype=torch.int32, device=keep.device)
    cu_seqlens[1:] = lengths.cumsum(0)
    return KeyPadding("right", (rows, cu_seqlens, max(longest, 1)))


def _key_lengths_forward(query, key, value, keys, dropout, scaling, causal: Optional[str] = None,
                         modifiers=None) -> torch.Tensor:
    """A right-padded batch as per-batch key lengths: query [B, Hq, L, D] as B sequences of L
    queries (every row, padded ones included, as the dense path computes them) over only the
    keys each one sees, gathered into packed rows (a copy of the visible keys and values, about
    2·B·Lk·Hkv·D elements), run by varlen_attention, so no bias is read and no padded key block
    is visited; causal "top_left" for a decoder's (query i sees its keys j <= i). Dropout element
    (b, h, i, j) is the dense call's: each sequence's keys keep their positions (a prefix).
    -> [B, L, Hq, Dv]."""
    rows_k, cu_k, max_k = keys
    B, Hq, L, _ = query.shape
    cu_q = torch.arange(0, (B + 1) * L, L, dtype=torch.int32, device=query.device)
    out = varlen_attention(_rows(query), _rows(key).index_select(0, rows_k),
                           _rows(value).index_select(0, rows_k), cu_q, cu_k, L, max_k,
                           dropout_p=dropout, causal=causal, scale=scaling, **(modifiers or {}))
    return out.reshape(B, L, Hq, out.shape[-1])


@functools.lru_cache(maxsize=None)
def _mask_codes():
    """The code objects of transformers' mask functions a plain packed mask is made of: the
    causal and bidirectional patterns, the packed-sequence mask, and the combinators that join
    them (and_masks, the position remap of packed sequences)."""
    from transformers import masking_utils as mu
    probe = torch.zeros(1, 1, dtype=torch.long)
    patterns = {mu.causal_mask_function.__code__, mu.bidirectional_mask_function.__code__}
    packed = mu.packed_sequence_mask_function(probe).__code__
    combinators = {mu.and_masks(mu.causal_mask_function).__code__}
    remap = getattr(mu, "remap_positions_for_packed_sequence", None)
    if remap is not None:
        combinators.add(remap(mu.causal_mask_function, probe).__code__)
    return patterns, packed, combinators


def _is_plain_packed(mask_fn) -> bool:
    """Whether a transformers mask function is a causal or bidirectional pattern restricted to
    packed sequences and nothing else: what varlen_attention computes without a mask."""
    patterns, packed, combinators = _mask_codes()
    found = {"pattern": 0, "packed": 0}

    def walk(fn, depth):
        code = getattr(fn, "__code__", None)
        if code is None or depth > 8:
            return False
        if code is packed or code in patterns:
            found["packed" if code is packed else "pattern"] += 1
            return True
        if code not in combinators:
            return False
        for cell in fn.__closure__ or ():
            value = cell.cell_contents
            for item in value if isinstance(value, tuple) else (value,):
                if callable(item) and not walk(item, depth + 1):
                    return False
        return True

    return walk(mask_fn, 0) and found == {"pattern": 1, "packed": 1}


def mask_function(*args, **kwargs) -> Optional[torch.Tensor]:
    """transformers' mask-interface signature (keyword arguments from its create_*_mask
    helpers). The masks of transformers' "sdpa" implementation (boolean, True = attend, or None
    where causal mode or nothing at all does), except three: a plain causal or bidirectional
    pattern without a padding mask gives None under torch.compile too (_no_mask_needed; an
    eager call gets the same from transformers); a plain bidirectional mask with
    padding (an encoder's) is returned as its [B, 1, 1, Lk] key-padding rows, which broadcast to
    the same mask, instead of being expanded to [B, 1, Lq, Lk] (which memeff would then read
    for every query row); and a packed row of sequences under a plain causal or bidirectional
    pattern gets no mask at all (the attention runs varlen_attention instead of reading a
    [T, T] block-diagonal mask)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, bidirectional_mask_function
    padding = kwargs.get("attention_mask")
    if not args:
        if _no_mask_needed(kwargs) or _window_without_mask(kwargs):
            return None
        rows = _causal_right_padding(kwargs)
        if rows is not None:
            return rows
    # A packed row (transformers found sequences in position_ids): no mask, the attention runs
    # varlen_attention on the same position_ids (it takes them for batch 1 only). Kept under
    # torch.compile (see the module's docstring).
    if (not args and padding is None and kwargs.get("local_size") is None
            and kwargs.get("batch_size") == 1
            and kwargs.get("q_length") == kwargs.get("kv_length")
            and not torch.compiler.is_compiling()
            and _is_plain_packed(kwargs.get("mask_function"))):
        return None
    if (args or kwargs.get("mask_function") is not bidirectional_mask_function
            or padding is None or padding.dim() != 2 or kwargs.get("local_size") is not None):
        return ALL_MASK_ATTENTION_FUNCTIONS["sdpa"](*args, **kwargs)
    rows = _key_padding_rows(padding, kwargs, kwargs["kv_length"], kwargs.get("kv_offset", 0))
    # As transformers does for sdpa: no mask when nothing is padded (a check of the values, so
    # not while torch.compile traces, where keeping the mask is as correct). The same reading
    # tells the attention whether the rows are right padding.
    if kwargs.get("allow_is_bidirectional_skip", False) and not torch.compiler.is_compiling():
        found = _key_padding_of(rows)
        if found is not None and found.kind == "none":
            return None
    return rows


def _no_mask_needed(kwargs) -> bool:
    """Whether a mask request is a plain causal or bidirectional pattern with no padding mask,
    which memeff computes without a mask (causal mode, or nothing): decided from the request's
    arguments alone, never from tensor values, so also while torch.compile traces (where
    transformers' own "sdpa" masks materialize the pattern, as they cannot check the padding).
    Causal needs a single query, as many queries as keys, or queries from position 0 (a prefill
    into a longer cache), as transformers' skip rule has it; a tensor q_offset (static caches
    under compile) keeps the mask, as there."""
    from transformers.masking_utils import bidirectional_mask_function, causal_mask_function

    if kwargs.get("attention_mask") is not None or kwargs.get("local_size") is not None:
        return False
    pattern = kwargs.get("mask_function", causal_mask_function)
    q_length, kv_length = kwargs.get("q_length"), kwargs.get("kv_length")
    if pattern is bidirectional_mask_function:
        return bool(kwargs.get("allow_is_bidirectional_skip", False))
    if pattern is not causal_mask_function or not kwargs.get("allow_is_causal_skip", True):
        return False
    q_offset = kwargs.get("q_offset", 0)
    if isinstance(q_offset, torch.Tensor) or not isinstance(q_length, int):
        return False
    # Top-left causal (what attention_forward runs for several queries without a mask) is the
    # pattern when queries and keys start together: as many of each, or a prefill (q_offset 0)
    # whose later keys no query sees.
    return q_length == 1 or q_length == kv_length or q_offset == 0


def register(name: str = NAME) -> None:
    """Registers memeff with transformers' attention-function registry and its masks with the
    mask registry (mask_function), so `attn_implementation=name` selects it. Idempotent."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:  # pragma: no cover - the message is the point
        raise ImportError("memeff.torch.hf.register() needs transformers 5 (AttentionInterface "
                          "and AttentionMaskInterface)") from e
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, mask_function)
