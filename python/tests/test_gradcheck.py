# torch.autograd.gradcheck of memeff's op in fp64 on small CPU shapes: the analytic gradients
# of q, k, v and the bias against finite differences, with dropout too (the mask is a fixed
# function of the rng_state passed in, so finite differences see the same mask every time).
import pytest

torch = pytest.importorskip("torch")
import memeff.torch as mt  # noqa: E402

# (B, Hq, Hkv, Lq, Lk, D, causal, bias shape or None, dropout p)
CASES = [
    (1, 2, 2, 5, 7, 4, "none", (1, 2, 1, 7), 0.0),
    (2, 2, 1, 6, 6, 3, "top_left", (2, 1, 6, 6), 0.0),
    (1, 4, 2, 5, 9, 4, "bottom_right", (1, 1, 5, 9), 0.3),
    (1, 2, 2, 9, 4, 5, "none", None, 0.5),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}_H{}x{}_L{}x{}_D{}_{}_{}_p{}".format(*c))
def test_gradcheck_fp64(case):
    B, Hq, Hkv, Lq, Lk, D, causal, bias_shape, p = case
    gen = torch.Generator().manual_seed(21)
    q = torch.randn(B, Hq, Lq, D, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, Hkv, Lk, D, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, Hkv, Lk, D + 1, generator=gen, dtype=torch.float64, requires_grad=True)
    inputs = [q, k, v]
    if bias_shape is not None:
        inputs.append(torch.randn(*bias_shape, generator=gen, dtype=torch.float64,
                                  requires_grad=True))
    rng_state = torch.tensor([12345, 678], dtype=torch.int64) if p > 0 else None

    def attention(q, k, v, bias=None):
        return mt.scaled_dot_product_attention(
            q, k, v, attn_mask=bias, dropout_p=p, causal=None if causal == "none" else causal,
            enable_gqa=True, rng_state=rng_state)

    assert torch.autograd.gradcheck(attention, tuple(inputs), eps=1e-6, atol=1e-6, rtol=1e-4)
    if p > 0:  # the mask really drops something, so this checked the dropout path
        keep = mt.dropout_mask((B, Hq, Lq, Lk), p, rng_state)
        assert 0 < keep.sum().item() < keep.numel()
