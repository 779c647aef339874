# memeff.torch.scaled_dot_product_attention without dropout against torch's SDPA math backend
# computed in fp64: outputs and gradients (q, k, v and a float mask that requires grad) for
# fp32/fp16/bf16, causal both ways, float and bool masks, GQA and odd lengths; plus the API's
# edge semantics and its error messages.
import math

import pytest

torch = pytest.importorskip("torch")
import memeff.torch as mt  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from attention_helpers import (additive, assert_close_to_reference,  # noqa: E402
                               assert_output_and_grads_close, causal_keep, randn_leaves,
                               reference_attention, seeded_generator)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# (B, Hq, Hkv, Lq, Lk, D, Dv, causal, mask kind)
CASES = [
    (2, 4, 4, 17, 17, 64, 64, "none", None),
    (1, 4, 4, 65, 129, 64, 64, "top_left", None),
    (2, 2, 2, 64, 127, 128, 128, "bottom_right", None),
    (2, 8, 2, 33, 47, 64, 64, "none", "float"),
    (1, 4, 1, 31, 31, 128, 128, "top_left", "bool"),
    (2, 4, 2, 1, 100, 64, 64, "bottom_right", "float_grad_rows"),
    (1, 2, 2, 40, 72, 64, 32, "none", "float_grad_2d"),
    (2, 3, 3, 129, 65, 64, 64, "none", "bool_keys"),
    (2, 4, 2, 40, 72, 64, 64, "none", "bool_rows"),
    (1, 2, 2, 33, 33, 64, 64, "top_left", "bool_rows"),
]


def make_mask(kind, B, Hq, Lq, Lk, dtype, device, gen):
    """The user's attn_mask of each kind (requires_grad for the *_grad kinds)."""
    if kind is None:
        return None
    if kind == "float":  # full shape
        return torch.randn(B, Hq, Lq, Lk, generator=gen).to(device, dtype)
    if kind == "float_grad_rows":  # broadcast over B and Lq: [1, Hq, 1, Lk]
        return torch.randn(1, Hq, 1, Lk, generator=gen).to(device, dtype).requires_grad_()
    if kind == "float_grad_2d":  # [Lq, Lk], broadcast over B and H
        return torch.randn(Lq, Lk, generator=gen).to(device, dtype).requires_grad_()
    if kind == "bool":  # [B, 1, Lq, Lk], each row keeps its diagonal so no row is empty
        keep = torch.rand(B, 1, Lq, Lk, generator=gen) > 0.4
        keep |= torch.eye(Lq, Lk, dtype=torch.bool)
        return keep.to(device)
    if kind == "bool_keys":  # [B, 1, 1, Lk] key padding mask, at least one key kept
        keep = torch.rand(B, 1, 1, Lk, generator=gen) > 0.3
        keep[..., 0] = True
        return keep.to(device)
    if kind == "bool_rows":  # [B, 1, Lq, 1] broadcast over the keys (stride 0), rows dropped
        rows = torch.rand(B, 1, Lq, 1, generator=gen) > 0.3
        rows[..., 0, :] = True
        rows[..., -1, :] = False
        return rows.to(device).expand(B, 1, Lq, Lk)
    raise AssertionError(kind)


def torch_math(q, k, v, mask, causal, enable_gqa):
    """torch's math SDPA with causal folded into an additive mask (bottom-right built by hand)."""
    Lq, Lk = q.shape[2], k.shape[2]
    bias = None
    if mask is not None:
        bias = additive(mask, q.dtype) if mask.dtype == torch.bool else mask.to(q.dtype)
    allowed = causal_keep(Lq, Lk, causal, q.device)
    if allowed is not None:
        causal_bias = additive(allowed, q.dtype)
        bias = causal_bias if bias is None else bias + causal_bias
    with sdpa_kernel(SDPBackend.MATH):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                                                enable_gqa=enable_gqa)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}_H{}x{}_L{}x{}_D{}x{}_{}_{}".format(*c))
def test_matches_torch_math(device, dtype, case):
    B, Hq, Hkv, Lq, Lk, D, Dv, causal, mask_kind = case
    gen = seeded_generator(case)
    q, k, v = randn_leaves(gen, device, dtype, (B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, Dv))
    mask = make_mask(mask_kind, B, Hq, Lq, Lk, dtype, device, gen)
    dout = torch.randn(B, Hq, Lq, Dv, generator=gen).to(device, dtype)
    gqa = Hq != Hkv

    causal_kw = None if causal == "none" else causal
    out = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask, causal=causal_kw,
                                          enable_gqa=gqa)
    wanted = [t for t in (q, k, v, mask) if t is not None and t.requires_grad]
    got = torch.autograd.grad(out, wanted, dout)

    # The reference: torch's math backend on the inputs in fp64 (a boolean mask as it is); the
    # tolerance from the same backend in the test dtype.
    assert out.dtype == dtype and out.shape == (B, Hq, Lq, Dv)
    assert_output_and_grads_close(
        out, got, (q, k, v, mask), dout,
        lambda q, k, v, mask: torch_math(q, k, v, mask, causal, gqa), dtype,
        ["dq", "dk", "dv", "dmask"])


def test_is_causal_is_top_left_and_three_dim_inputs(device):
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(3, 20, 32, generator=gen).to(device)  # [N, L, D]: no head dimension
    k = torch.randn(3, 28, 32, generator=gen).to(device)
    v = torch.randn(3, 28, 16, generator=gen).to(device)
    out = mt.scaled_dot_product_attention(q, k, v, is_causal=True)
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                               is_causal=True)
    assert out.shape == (3, 20, 16)
    assert (out.double() - ref).abs().max().item() < 1e-5
    # is_causal is the same as causal="top_left"
    same = mt.scaled_dot_product_attention(q, k, v, causal="top_left")
    assert torch.equal(out, same)


def test_custom_scale_and_strided_inputs(device):
    gen = torch.Generator().manual_seed(8)
    # [B, L, H, D] storage viewed as [B, H, L, D] (the layout a fused qkv projection produces)
    qkv = torch.randn(2, 37, 3, 4, 64, generator=gen).to(device)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    assert not q.is_contiguous()
    out = mt.scaled_dot_product_attention(q, k, v, scale=0.3)
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                               scale=0.3)
    assert (out.double() - ref).abs().max().item() < 1e-5


def test_rows_that_see_no_key_give_zero(device):
    # bottom-right causal with Lq > Lk: the first Lq - Lk queries see no key.
    gen = torch.Generator().manual_seed(9)
    q = torch.randn(1, 2, 12, 16, generator=gen).to(device).requires_grad_()
    k = torch.randn(1, 2, 5, 16, generator=gen).to(device).requires_grad_()
    v = torch.randn(1, 2, 5, 16, generator=gen).to(device).requires_grad_()
    out = mt.scaled_dot_product_attention(q, k, v, causal="bottom_right")
    assert torch.isfinite(out).all()
    assert (out[:, :, :7] == 0).all()
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[:, :, :7] == 0).all()


def test_a_mask_constant_over_the_keys_drops_whole_rows(device, monkeypatch):
    # A boolean mask broadcast over the keys with stride 0 (transformers' masks of a model without
    # padding, under torch.compile) runs as no mask, its dropped rows 0; with dropout the kept
    # rows are those of the dense mask with the same seed, and the dropped rows get no gradient.
    gen = seeded_generator("rows-mask")
    B, H, L, D, p = 2, 3, 48, 32, 0.2
    q, k, v = randn_leaves(gen, device, torch.float32, (B, H, L, D), (B, H, L, D), (B, H, L, D))
    rows = torch.rand(B, 1, L, 1, generator=gen).to(device) > 0.25
    mask = rows.expand(B, 1, L, L)
    assert mask.stride(-1) == 0
    biases = []
    bias_of_mask = mt._bias_of_mask
    monkeypatch.setattr(mt, "_bias_of_mask", lambda *a: biases.append(a) or bias_of_mask(*a))
    out, state = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                                 return_rng_state=True)
    assert biases == []  # no [Lq, Lk] bias built
    dense = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask.contiguous(), dropout_p=p,
                                            rng_state=state)
    assert len(biases) == 1
    torch.testing.assert_close(out, dense, rtol=1e-5, atol=1e-6)
    dropped = ~rows.expand(B, H, L, 1).squeeze(-1)
    assert torch.all(out[dropped] == 0) and torch.all(out[~dropped] != 0)
    (gq,) = torch.autograd.grad(out, (q,), torch.ones_like(out))
    assert torch.all(gq[dropped] == 0)
    # A misshaped one is named as attn_mask, as any mask is.
    with pytest.raises(ValueError, match="attn_mask"):
        mt.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 1, L, 1, dtype=torch.bool,
                                                                      device=device).expand(5, 1, L, L))


def test_gqa_needs_enable_gqa(device):
    q = torch.randn(1, 4, 8, 16, device=device)
    k = torch.randn(1, 2, 8, 16, device=device)
    # A ValueError, as the README promises for bad arguments, and a RuntimeError, as torch raises.
    for kind in (ValueError, RuntimeError):
        with pytest.raises(kind, match="enable_gqa"):
            mt.scaled_dot_product_attention(q, k, k)


@pytest.mark.parametrize("p", [-0.1, float("nan"), 1.0, float("inf")])
def test_a_bad_dropout_p_is_named(device, p):
    q = torch.randn(1, 2, 8, 16, device=device)
    with pytest.raises(ValueError, match=r"argument `dropout_p`: expected a probability in \[0, 1\)"):
        mt.scaled_dot_product_attention(q, q, q, dropout_p=p)
    cu = torch.tensor([0, 8], dtype=torch.int32, device=device)
    packed = q[0].transpose(0, 1).contiguous()
    with pytest.raises(ValueError, match=r"argument `dropout_p`"):
        mt.varlen_attention(packed, packed, packed, cu, cu, 8, 8, dropout_p=p)


def test_a_misshaped_attn_mask_is_named_as_such(device):
    q = torch.randn(2, 4, 16, 32, device=device)
    with pytest.raises(ValueError, match=r"argument `attn_mask`: shape \(2, 4, 16, 15\) does not "
                                         r"broadcast to the attention scores \[B, Hq, Lq, Lk\] = "
                                         r"\[2, 4, 16, 16\]"):
        mt.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(2, 4, 16, 15, device=device))
    with pytest.raises(ValueError, match=r"argument `attn_mask`"):  # 3 heads against 4
        mt.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(3, 16, 16, device=device))
    # what broadcasts still runs: [Lk], [B, 1, 1, Lk], [Lq, 1]
    for shape in [(16,), (2, 1, 1, 16), (16, 1)]:
        mt.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(shape, device=device))


def test_is_causal_with_mask_is_refused_like_torch(device):
    q = torch.randn(1, 2, 8, 16, device=device)
    mask = torch.zeros(8, 8, device=device)
    with pytest.raises(RuntimeError, match="is_causal"):
        mt.scaled_dot_product_attention(q, q, q, attn_mask=mask, is_causal=True)
    # the causal= keyword combines with a mask
    out = mt.scaled_dot_product_attention(q, q, q, attn_mask=mask, causal="top_left")
    ref = mt.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert (out - ref).abs().max().item() < 1e-6


def test_core_errors_arrive_with_their_message(device):
    q = torch.randn(1, 2, 8, 16, device=device)
    with pytest.raises(ValueError, match=r"argument `k`: expected dtype"):
        mt.scaled_dot_product_attention(q, q.half(), q)
    with pytest.raises(ValueError, match=r"argument `v`"):
        mt.scaled_dot_product_attention(q, q, torch.randn(1, 2, 9, 16, device=device))
    with pytest.raises(ValueError, match="dropout_p"):
        mt.scaled_dot_product_attention(q, q, q, dropout_p=1.0)
    with pytest.raises(ValueError, match="causal"):
        mt.scaled_dot_product_attention(q, q, q, causal="diagonal")
    with pytest.raises(NotImplementedError, match="no_such_backend"):
        with mt.use_backends("no_such_backend"):
            mt.scaled_dot_product_attention(q, q, q)


def test_causal_modes_have_one_spelling(device):
    # The op takes memeff's names of the modes (the C++ API's), and the Python check lists the
    # same ones; Lq != Lk, so top_left and bottom_right differ.
    assert torch.ops.memeff.causal_modes() == ["none", "top_left", "bottom_right"]
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, n, 16, generator=gen).to(device) for n in (8, 12, 12))
    for mode in ("none", "top_left", "bottom_right"):
        out, _, _ = torch.ops.memeff.fwd(q, k, v, None, None, 0.0, mode, None, [])
        ref = reference_attention(q.double(), k.double(), v.double(), causal=mode)
        assert_close_to_reference(out, ref, reference_attention(q, k, v, causal=mode),
                                  torch.float32, f"causal={mode}")
    with pytest.raises(ValueError, match=r'argument `causal`: expected "none", "top_left" or '
                                         r'"bottom_right", got "bottom-right"'):
        torch.ops.memeff.fwd(q, k, v, None, None, 0.0, "bottom-right", None, [])
    with pytest.raises(ValueError, match=r"argument `causal`: expected None, True, False or one "
                                         r"of \('none', 'top_left', 'bottom_right'\)"):
        mt.scaled_dot_product_attention(q, k, v, causal="diagonal")


def test_introspection():
    assert mt.version() and "reference" in mt.backend_names()
    t = mt.dropout_threshold(0.1)
    assert t.threshold == round(256 * 0.9) and math.isclose(t.p_effective, 1 - t.threshold / 256)
    assert math.isclose(t.keep_scale, 256 / t.threshold)
    q = torch.randn(1, 1, 4, 8)
    with mt.use_backends("reference"):
        mt.scaled_dot_product_attention(q, q, q)
    assert mt.last_backends()[0] == "reference"


def test_autocast_runs_in_the_region_dtype_like_torch(device):
    # q and k in fp32 (as after a model's rotary embedding), v in bf16: under autocast both
    # memeff and torch compute in bf16; the gradients come back in each input's own dtype.
    gen = torch.Generator().manual_seed(10)
    q = torch.randn(2, 4, 24, 32, generator=gen).to(device).requires_grad_()
    k = torch.randn(2, 2, 24, 32, generator=gen).to(device).requires_grad_()
    v = torch.randn(2, 2, 24, 32, generator=gen).to(device, torch.bfloat16).requires_grad_()
    bias = torch.randn(1, 4, 1, 24, generator=gen).to(device)  # fp32 stays fp32
    with pytest.raises(ValueError, match="argument `v`"):
        mt.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # no autocast: refused
    results = []
    for fn in (mt.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention):
        with torch.autocast(device, dtype=torch.bfloat16):
            out = fn(q, k, v, attn_mask=bias, enable_gqa=True, is_causal=False)
        grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
        results.append((out, grads))
    (out, grads), (ref, ref_grads) = results
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    for g, r, t in zip(grads, ref_grads, (q, k, v)):
        assert g.dtype == r.dtype == t.dtype
        torch.testing.assert_close(g, r, rtol=5e-2, atol=5e-2)
