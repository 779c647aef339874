"""The calls PyTorch's SDPA dispatcher sends to its math path, run by memeff
(memeff.torch.activate(slots=(..., "math"))).

PyTorch chooses a backend for ``aten::scaled_dot_product_attention`` in C++ before any slot's
kernel runs, and some calls it sends to its math path (the attention as separate matrix
products, softmax and dropout) only because every fused kernel refused them: a mask broadcast
with a zero stride in the key dimension (what transformers' "sdpa" masks are under torch.compile
before torch 2.14), or a fused kernel disabled for that dtype or shape. The "math" slot puts a
kernel for ``aten::scaled_dot_product_attention`` itself at the autograd dispatch key of the
device: a call PyTorch would run on its math path while some fused backend is enabled runs
memeff's ``scaled_dot_product_attention`` (its autograd included) instead; every other call goes
on to PyTorch's own implementation (and from there to the fused slots, which memeff may hold
too). A call where the math path is all that is enabled (``sdpa_kernel(SDPBackend.MATH)``) runs
PyTorch's math path: the user asked for it. Under torch.inference_mode() no call reaches an
autograd key, so PyTorch's path runs there."""

import torch

from .aten_sdpa import Unsupported, _fallback, _original, _package, _require_supported, slot_kernel

_OP = "scaled_dot_product_attention"
_MATH = 0  # SDPBackend::math in PyTorch's C++ enum (what aten::_fused_sdp_choice returns)


def _some_fused_backend_enabled() -> bool:
    backends = torch.backends.cuda
    return (backends.flash_sdp_enabled() or backends.mem_efficient_sdp_enabled()
            or backends.cudnn_sdp_enabled())


@slot_kernel(_OP)
def _memeff_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                 scale=None, enable_gqa=False):
    """A call PyTorch's dispatcher gave its math path, run by memeff's op."""
    # attn_mask may be boolean (a keep-mask, what transformers' masks are); a float mask is an
    # additive bias of memeff's dtypes.
    _require_supported(query, key, value,
                       None if attn_mask is None or attn_mask.dtype == torch.bool else attn_mask)
    if attn_mask is not None and attn_mask.device != query.device:
        raise Unsupported("attn_mask on another device")
    if attn_mask is not None and is_causal:
        raise Unsupported("attn_mask and is_causal together (PyTorch's error)")
    if any(t.dim() not in (3, 4) for t in (query, key, value)):
        raise Unsupported("inputs of other than 3 or 4 dimensions")
    try:
        return _package.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                                     dropout_p=dropout_p, is_causal=is_causal,
                                                     scale=scale, enable_gqa=enable_gqa)
    except ValueError as why:
        # A form memeff's op refuses (a mask shape, heads without enable_gqa, ...): PyTorch's
        # math path takes it, or gives its own error.
        raise Unsupported(f"memeff: {str(why).splitlines()[0]}") from why


def sdpa_math_slot(keyset, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                   scale=None, enable_gqa=False):
    """aten::scaled_dot_product_attention at the device's autograd key (with_keyset)."""
    args = (query, key, value, attn_mask, dropout_p, is_causal)
    kwargs = {"scale": scale, "enable_gqa": enable_gqa}
    if not _some_fused_backend_enabled():
        return _fallback(_OP, "the math path is all that is enabled (sdpa_kernel)", keyset,
                         args, kwargs)
    choice = torch._fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal,
                                     scale=scale, enable_gqa=enable_gqa)
    if int(choice) == _MATH:
        return _memeff_math(keyset, *args, **kwargs)
    # A fused kernel takes it: PyTorch's implementation calls its slot (no record here; the
    # slot's kernel records the call if memeff holds that slot).
    return _original[_OP].call_boxed(keyset, *args, **kwargs)


KERNELS = {_OP: sdpa_math_slot}
