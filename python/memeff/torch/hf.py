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

Written against transformers 5.x (AttentionInterface and AttentionMaskInterface.register; the
GPU machine has 5.17, this was also run with 5.25); transformers is imported only by register().
"""

from typing import Optional, Tuple

import torch

from . import scaled_dot_product_attention

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
    attention weights."""
    for unsupported in ("softcap", "s_aux"):
        if kwargs.get(unsupported) is not None:
            raise NotImplementedError(f"memeff attention: argument `{unsupported}` is not "
                                      f"supported; use another attn_implementation for this model")
    # As transformers' sdpa_attention_forward decides it: causal only when the mask was left out
    # because it was purely causal (an explicit mask already holds the causal pattern), never for
    # a single query (decoding), and for decoder modules (module.is_causal) unless told otherwise.
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    causal = "top_left" if query.shape[2] > 1 and attention_mask is None and is_causal else None
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
                                       causal=causal)
    # memeff's out is laid out like the query, which transformers builds as a [B, L, H, D]
    # projection viewed as heads: this transpose is contiguous and .contiguous() copies nothing.
    return out.transpose(1, 2).contiguous(), None


def mask_function(*args, **kwargs) -> Optional[torch.Tensor]:
    """transformers' mask-interface signature (keyword arguments from its create_*_mask
    helpers). The masks of transformers' "sdpa" implementation (boolean, True = attend, or None
    where causal mode or nothing at all does), except one: a plain bidirectional mask with
    padding (an encoder's) is returned as its [B, 1, 1, Lk] key-padding rows, which broadcast to
    the same mask, instead of being expanded to [B, 1, Lq, Lk] (which memeff would then read
    for every query row)."""
    from transformers.masking_utils import (ALL_MASK_ATTENTION_FUNCTIONS,
                                            bidirectional_mask_function, prepare_padding_mask)
    padding = kwargs.get("attention_mask")
    if (args or kwargs.get("mask_function") is not bidirectional_mask_function
            or padding is None or padding.dim() != 2 or kwargs.get("local_size") is not None):
        return ALL_MASK_ATTENTION_FUNCTIONS["sdpa"](*args, **kwargs)
    padding = prepare_padding_mask(padding, kwargs["kv_length"], kwargs.get("kv_offset", 0))
    padding = padding.to(device=kwargs.get("device", padding.device), dtype=torch.bool)
    # As transformers does for sdpa: no mask when nothing is padded (a check of the values, so
    # not while torch.compile traces, where keeping the mask is as correct).
    if (kwargs.get("allow_is_bidirectional_skip", False) and not torch.compiler.is_compiling()
            and bool(padding.all())):
        return None
    return padding[:, None, None, :]


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
