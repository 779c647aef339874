"""The memory-efficient slot of PyTorch's SDPA run by memeff (memeff.torch.activate(slots=
("flash", "efficient"))): ``aten::_scaled_dot_product_efficient_attention`` and its backward
(attn_bias and its gradient, dropout, fp32) and ``aten::_fill_mem_eff_dropout_mask_``, which then
returns memeff's mask for a forward's (philox_seed, philox_offset).

The forward returns PyTorch's shapes and layouts: out [B, H, Lq, Dv] over [B, Lq, H, Dv]
storage, logsumexp [B, H, Lq rounded up to 32] (fp32; [B, H, 0] without compute_log_sumexp),
and the seed and offset as int64 scalars (on the CPU, or on the device under CUDA-graph
capture), which are memeff's (seed, offset)."""

from typing import Optional

import torch

from .aten_sdpa import (Unsupported, _package, _backends, _dense_last_dim, _ops, _remember_state,
                        _require_supported, _same_layout, slot_kernel)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _over_blhd(t: torch.Tensor) -> torch.Tensor:
    """t [B, H, L, D] over [B, L, H, D] storage, the layout of the efficient slot's out and
    gradients (a copy only where t is laid out otherwise)."""
    B, H, L, D = t.shape
    strides = (L * H * D, D, H * D, 1)
    if _same_layout(t, strides):
        return t
    result = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)
    result.copy_(t)
    return result


def _bias_for_memeff(attn_bias: Optional[torch.Tensor], q: torch.Tensor,
                     with_grad: bool) -> Optional[torch.Tensor]:
    """attn_bias ([B, H, Lq, Lk], often expanded from fewer elements) as memeff reads it: a
    broadcast (stride-0) dimension is read once, unless its gradient is wanted per element (the
    gradient of the expanded tensor PyTorch asks for)."""
    if attn_bias is None:
        return None
    bias = attn_bias
    while bias.dim() < 4:
        bias = bias.unsqueeze(0)
    if with_grad:
        if any(s == 0 and n > 1 for s, n in zip(bias.stride(), bias.shape)):
            bias = bias.contiguous()
    else:
        for d in range(3):
            if bias.stride(d) == 0 and bias.shape[d] > 1:
                bias = bias.narrow(d, 0, 1)
    if bias.dtype != q.dtype and bias.dtype != torch.float32:
        bias = bias.to(q.dtype)
    return _dense_last_dim(bias)


def _split_state(drawn: torch.Tensor, dropout_p: float, device: torch.device):
    """(philox_seed, philox_offset) as PyTorch's kernel returns them, holding memeff's state."""
    if dropout_p <= 0.0:
        _remember_state(None, device)
        return (torch.empty((), dtype=torch.int64), torch.empty((), dtype=torch.int64))
    _remember_state(drawn, device)
    return drawn[0], drawn[1]


def _joined_state(philox_seed: torch.Tensor, philox_offset: torch.Tensor,
                  dropout_p: float) -> Optional[torch.Tensor]:
    """memeff's int64[2] rng_state from the forward's seed and offset tensors."""
    if dropout_p <= 0.0:
        return None
    seed, offset = philox_seed.reshape(()), philox_offset.reshape(())
    if (seed.device == offset.device and seed.storage_offset() + 1 == offset.storage_offset()
            and seed.untyped_storage().data_ptr() == offset.untyped_storage().data_ptr()):
        return torch.as_strided(seed, (2,), (1,))  # still the forward's int64[2] (no copy)
    return torch.stack([seed.to(offset.device), offset]).to(torch.int64)


@slot_kernel("_scaled_dot_product_efficient_attention")
def efficient_forward(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0,
                      is_causal=False, *, scale=None):
    _require_supported(query, key, value, attn_bias)
    if query.dim() != 4:
        raise Unsupported(f"a query of {query.dim()} dimensions")
    p = float(dropout_p)
    q, k, v = (_dense_last_dim(t) for t in (query, key, value))
    out, lse, drawn = _ops.fwd(q, k, v, _bias_for_memeff(attn_bias, q, False), None, p,
                               "top_left" if is_causal else "none", scale, _backends())
    B, H, Lq, _ = out.shape
    rows = _round_up(Lq, 32) if compute_log_sumexp else 0
    logsumexp = torch.empty((B, H, rows), dtype=torch.float32, device=query.device)
    if rows:
        logsumexp[:, :, :Lq] = lse  # the padding is never read
    seed, offset = _split_state(drawn, p, query.device)
    return _over_blhd(out), logsumexp, seed, offset


@slot_kernel("_scaled_dot_product_efficient_attention_backward")
def efficient_backward(grad_out, query, key, value, attn_bias, out, logsumexp, philox_seed,
                       philox_offset, dropout_p, grad_input_mask, is_causal=False, *, scale=None):
    _require_supported(grad_out, query, key, value, attn_bias, out)
    p = float(dropout_p)
    bias_grad = attn_bias is not None and bool(grad_input_mask[3])
    dout, q, k, v, o = (_dense_last_dim(t) for t in (grad_out, query, key, value, out))
    bias = _bias_for_memeff(attn_bias, q, bias_grad)
    lse = logsumexp[:, :, :q.shape[2]].contiguous()
    dq, dk, dv, dbias = _ops.bwd(dout, q, k, v, bias, o, lse,
                                 _joined_state(philox_seed, philox_offset, p), p,
                                 "top_left" if is_causal else "none", scale, bias_grad,
                                 _backends())

    grad_bias = None
    if bias_grad:
        shape = list(attn_bias.shape)
        padded = torch.empty(shape[:-1] + [_round_up(shape[-1], 16)], dtype=attn_bias.dtype,
                             device=attn_bias.device)
        grad_bias = padded[..., :shape[-1]]
        grad_bias.copy_(dbias.reshape(shape))
    return _over_blhd(dq), _over_blhd(dk), _over_blhd(dv), grad_bias


@slot_kernel("_fill_mem_eff_dropout_mask_")
def fill_dropout_mask(mask, dropout_p, seed, offset):
    """aten::_fill_mem_eff_dropout_mask_(mask [B, H, Lq, Lk], p, seed, offset): memeff's keep
    mask of a call with that (seed, offset) as 1.0 (kept) and 0.0 (dropped), so that
    ``mask > p`` — how PyTorch's tests read the uniform numbers its own kernel writes — is the
    keep mask."""
    if mask.dim() != 4:
        raise Unsupported(f"a mask of {mask.dim()} dimensions")
    state = torch.tensor([int(seed), int(offset)], dtype=torch.int64)
    keep = _package.dropout_mask(tuple(mask.shape), float(dropout_p), state)
    mask.copy_(keep.to(mask.device))
    return mask


KERNELS = {
    "_scaled_dot_product_efficient_attention": efficient_forward,
    "_scaled_dot_product_efficient_attention_backward": efficient_backward,
    "_fill_mem_eff_dropout_mask_": fill_dropout_mask,
}
