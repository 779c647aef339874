# NaN and Inf in the data through memeff.torch.scaled_dot_product_attention against PyTorch's
# math path (torch.ops.aten._scaled_dot_product_attention_math in fp64 on the same rounded
# inputs), forward and backward (docs/api.md, "Non-finite inputs"):
#   - without a mask, the non-finite entries of out, dq, dk and dv are exactly the math path's;
#   - with a causal or a key-padding mask, memeff's are a subset of the math path's (the math
#     path adds the mask to a NaN score and multiplies masked zeros by NaN; in memeff a masked key
#     never reaches a row's scores) and hold every row that sees the planted value;
#   - a NaN or Inf in k at a key a -inf mask removes for every row never reaches out, and at a key
#     the causal mask hides from every row reaches neither out nor the other keys' gradients;
#   - entries finite in both agree within the dtype's tolerance.
import math

import pytest

torch = pytest.importorskip("torch")
import memeff.torch as mt  # noqa: E402

NAN, INF = float("nan"), float("inf")
B, H, L, D = 2, 2, 48, 64
PAD = L - 3  # the key the key-padding mask removes for every row

# (tensor, index [b, h, i, e], value)
PLANTS = [
    ("q", (0, 1, 5, 3), NAN),
    ("q", (1, 0, 40, 0), -INF),
    ("k", (1, 0, 20, 0), NAN),
    ("k", (0, 1, 33, 7), INF),
    ("v", (1, 1, 9, 2), NAN),
    ("v", (0, 0, 0, 5), -INF),
    ("dout", (1, 0, 12, 1), NAN),
]
MASKS = ["none", "causal", "key_padding"]
TOL = {torch.float32: 2e-4, torch.float16: 1e-2, torch.bfloat16: 4e-2}


def inputs(device, dtype, plant):
    gen = torch.Generator().manual_seed(5)
    t = {name: torch.randn(B, H, L, D, generator=gen).to(device, dtype)
         for name in ("q", "k", "v", "dout")}
    name, (b, h, i, e), value = plant
    t[name][b, h, i, e] = value
    return t


def run(t, mask_kind, math_path):
    """out, dq, dk, dv of the math path (fp64) or of memeff (the inputs' dtype)."""
    leaves = {n: (t[n].double() if math_path else t[n]).detach().requires_grad_()
              for n in ("q", "k", "v")}
    mask = None
    if mask_kind == "key_padding":
        mask = torch.ones(B, 1, 1, L, dtype=torch.bool, device=t["q"].device)
        mask[..., PAD] = False
    causal = mask_kind == "causal"
    if math_path:
        if mask is not None:  # the raw math op takes an additive mask (F.sdpa converts a bool one)
            mask = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device).masked_fill(
                mask.logical_not(), -INF)
        out = torch.ops.aten._scaled_dot_product_attention_math(
            leaves["q"], leaves["k"], leaves["v"], attn_mask=mask, dropout_p=0.0,
            is_causal=causal)[0]
    else:
        out = mt.scaled_dot_product_attention(leaves["q"], leaves["k"], leaves["v"],
                                              attn_mask=mask, is_causal=causal)
    out.backward(t["dout"].to(out.dtype))
    return {"out": out.detach(), "dq": leaves["q"].grad, "dk": leaves["k"].grad,
            "dv": leaves["v"].grad}


def rows_that_see(plant, mask_kind):
    """Entries of out (as a boolean [B, H, L, D] tensor) the plant must make non-finite."""
    name, (b, h, i, e), value = plant
    need = torch.zeros(B, H, L, D, dtype=torch.bool)
    if name == "q" and value != value:  # a NaN query row
        need[b, h, i, :] = True
    elif name == "k" and value != value:  # a NaN key: every row that sees it
        rows = range(i, L) if mask_kind == "causal" else range(L)
        if not (mask_kind == "key_padding" and i == PAD):
            for r in rows:
                need[b, h, r, :] = True
    elif name == "v":  # every row that sees key i, in column e
        rows = range(i, L) if mask_kind == "causal" else range(L)
        for r in rows:
            need[b, h, r, e] = True
    return need


@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: f"{p[0]}{list(p[1])}={p[2]}")
def test_nonfinite_values_match_the_math_path(device, mask_kind, plant):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    t = inputs(device, dtype, plant)
    ref = run(t, mask_kind, math_path=True)
    got = run(t, mask_kind, math_path=False)
    for what in ("out", "dq", "dk", "dv"):
        g_bad = ~torch.isfinite(got[what].double()).cpu()
        r_bad = ~torch.isfinite(ref[what]).cpu()
        invented = g_bad & ~r_bad
        assert not invented.any(), (
            f"{what}: {int(invented.sum())} entries non-finite where the math path is finite, "
            f"first at {invented.nonzero()[0].tolist()}")
        if mask_kind == "none":
            hidden = r_bad & ~g_bad
            assert not hidden.any(), (
                f"{what}: {int(hidden.sum())} entries finite where the math path is not, "
                f"first at {hidden.nonzero()[0].tolist()}")
        both = ~g_bad & ~r_bad
        if both.any():
            a = got[what].double().cpu()[both]
            r = ref[what].cpu()[both]
            err = (a - r).abs().max().item()
            assert err <= TOL[dtype] * max(1.0, r.abs().max().item()), f"{what}: error {err:.3g}"
    need = rows_that_see(plant, mask_kind)
    hidden = need & torch.isfinite(got["out"].double()).cpu()
    assert not hidden.any(), (f"out: {int(hidden.sum())} entries of rows that see the planted "
                              f"value are finite, first at {hidden.nonzero()[0].tolist()}")
    if plant[0] == "dout" and plant[2] != plant[2]:
        b, h, i, _ = plant[1]
        assert not torch.isfinite(got["dq"][b, h, i]).any(), "dq of the NaN dout row is finite"


def test_a_nan_key_every_row_masks_never_reaches_out(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    for value in (NAN, INF, -INF):
        t = inputs(device, dtype, ("k", (0, 1, PAD, 4), value))
        got = run(t, "key_padding", math_path=False)
        assert torch.isfinite(got["out"]).all(), f"k = {value} at a masked key reached out"
        mask = torch.ones(B, 1, 1, L, dtype=torch.bool, device=device)
        mask[..., PAD] = False
        clean = inputs(device, dtype, ("k", (0, 1, PAD, 4), 0.0))
        expected = mt.scaled_dot_product_attention(clean["q"], clean["k"], clean["v"],
                                                   attn_mask=mask)
        # Equal up to rounding: on the GPU the fused kernels recompute a row a NaN behind the
        # mask reached in fp32, key by key (docs/api.md).
        torch.testing.assert_close(got["out"], expected, rtol=2e-2, atol=2e-2,
                                   msg="a masked key's value changed out")


def test_keys_the_causal_mask_hides_from_every_row_reach_nothing(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, 30, D, generator=gen).to(device, dtype).requires_grad_()
    k = torch.randn(1, 2, 50, D, generator=gen).to(device, dtype)
    v = torch.randn(1, 2, 50, D, generator=gen).to(device, dtype)
    # Top-left causal, 30 queries: keys 30..49 are seen by no row. (A NaN in such a key's v may
    # reach out through a tile's 0·NaN product: docs/api.md lets backends differ there.)
    k[0, 1, 40, 2] = NAN
    k[0, 0, 45, 1] = INF
    k.requires_grad_()
    v.requires_grad_()
    out = mt.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.isfinite(out).all(), "a key no row sees reached out"
    out.sum().backward()
    assert torch.isfinite(k.grad[:, :, :30]).all() and torch.isfinite(v.grad[:, :, :30]).all(), \
        "a key no row sees reached another key's gradient"


def test_rows_without_keys_stay_zero_with_nan_queries(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 40, D, generator=gen).to(device, dtype)
    k = torch.randn(1, 2, 24, D, generator=gen).to(device, dtype)
    v = torch.randn(1, 2, 24, D, generator=gen).to(device, dtype)
    q[0, 0, 3, 0] = NAN  # bottom-right: rows 0..15 see no key
    q[0, 1, 30, 0] = NAN  # row 30 sees keys 0..14
    out = mt.scaled_dot_product_attention(q, k, v, causal="bottom_right")
    assert torch.equal(out[0, :, :16], torch.zeros_like(out[0, :, :16])), "rows without keys"
    assert torch.isnan(out[0, 1, 30]).all(), "row 30 sees its NaN query"
    assert torch.isfinite(out[0, 0, 16:]).all() and torch.isfinite(out[0, 1, 16:30]).all()
    assert math.isfinite(out[0, 1, 31:].double().abs().max().item())
