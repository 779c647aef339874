"""The cuDNN slot of PyTorch's SDPA run by memeff (memeff.torch.activate(slots=("flash",
"cudnn"))): ``aten::_scaled_dot_product_cudnn_attention`` and its backward, with attn_bias (the
slot takes no gradient for it), dropout and top-left causal masking.

The forward returns PyTorch's shapes and layouts: out in the layout PyTorch gives it after the
query, logsumexp [B, H, Lq, 1] (fp32), and the seed and offset as int64 scalars holding memeff's
(seed, offset) (on the CPU, or on the device under CUDA-graph capture), as the efficient slot
returns them."""

from .aten_sdpa import (Unsupported, _backends, _dense_last_dim, _ops, _require_supported,
                        in_torch_layout, slot_kernel)
from .aten_sdpa_efficient import _bias_for_memeff, _joined_state, _split_state


@slot_kernel("_scaled_dot_product_cudnn_attention")
def cudnn_forward(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0,
                  is_causal=False, return_debug_mask=False, *, scale=None):
    _require_supported(query, key, value, attn_bias)
    if query.dim() != 4:
        raise Unsupported(f"a query of {query.dim()} dimensions")
    if return_debug_mask:
        raise Unsupported("return_debug_mask")
    p = float(dropout_p)
    q, k, v = (_dense_last_dim(t) for t in (query, key, value))
    out, lse, drawn = _ops.fwd(q, k, v, _bias_for_memeff(attn_bias, q, False), None, p,
                               "top_left" if is_causal else "none", scale, _backends())
    seed, offset = _split_state(drawn, p, query.device)
    return (in_torch_layout(out, query), lse.unsqueeze(-1), None, None, query.shape[2],
            key.shape[2], seed, offset, None)


@slot_kernel("_scaled_dot_product_cudnn_attention_backward")
def cudnn_backward(grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset,
                   attn_bias, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, *,
                   scale=None):
    _require_supported(grad_out, query, key, value, out, attn_bias)
    p = float(dropout_p)
    dout, q, k, v, o = (_dense_last_dim(t) for t in (grad_out, query, key, value, out))
    dq, dk, dv, _ = _ops.bwd(dout, q, k, v, _bias_for_memeff(attn_bias, q, False), o,
                             logsumexp.reshape(logsumexp.shape[:3]).contiguous(),
                             _joined_state(philox_seed, philox_offset, p), p,
                             "top_left" if is_causal else "none", scale, False, _backends())
    return in_torch_layout(dq, query), in_torch_layout(dk, key), in_torch_layout(dv, value)


KERNELS = {
    "_scaled_dot_product_cudnn_attention": cudnn_forward,
    "_scaled_dot_product_cudnn_attention_backward": cudnn_backward,
}
