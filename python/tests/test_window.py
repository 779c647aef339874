# Sliding windows, ALiBi and softcapping through memeff.torch (docs/window.md): the op and
# varlen_attention against the fp64 math reference of attention_helpers (an explicit window mask,
# the ALiBi distance bias, the tanh cap), with and without dropout (the mask from dropout_mask),
# gradients of q, k, v and the bias, every causal alignment, GQA, packed sequences; the defaults
# changing nothing; the errors naming window_size, alibi_slopes and softcap; torch.compile
# (fullgraph). The CUDA kernels refuse the three for now: there these tests skip on that refusal
# (and run once the kernels take them), and a call must fail with the backends' reasons.
import warnings
from itertools import accumulate

import pytest

torch = pytest.importorskip("torch")
import memeff.torch as mt  # noqa: E402

from attention_helpers import (assert_output_and_grads_close, random_bias,  # noqa: E402
                               randn_leaves, reference_attention, seeded_generator,
                               skip_if_the_kernels_refuse)


def alibi(heads, batch=None):
    """ALiBi's usual slopes 2^(-8(h+1)/H) (docs/window.md), [H], or [batch, H] scaled per row so
    that the batch entries differ."""
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])
    return slopes if batch is None else slopes * torch.arange(1, batch + 1).unsqueeze(1)


def slopes_for(kind, B, Hq, device):
    return None if kind is None else alibi(Hq, B if kind == "batch" else None).to(device)


def test_a_refusal_on_cuda_names_the_feature_and_every_backend():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    q = torch.randn(1, 2, 16, 64, device="cuda", dtype=torch.bfloat16)
    try:
        mt.scaled_dot_product_attention(q, q, q, window_size=(4, 0), is_causal=True)
    except NotImplementedError as e:  # until the kernels take windows
        assert "window" in str(e) and "docs/window.md" in str(e), str(e)


# (B, Hq, Hkv, Lq, Lk, D, causal, window, alibi: None / "heads" / "batch", softcap,
#  bias: None / "grad_rows" / "full", dropout p)
CASES = [
    (2, 4, 4, 17, 17, 32, "none", (3, 2), None, 0.0, None, 0.0),
    (2, 4, 4, 17, 17, 32, "none", (3, 2), "heads", 2.0, None, 0.3),
    (1, 4, 2, 20, 45, 32, "bottom_right", (6, 0), "heads", 0.0, "grad_rows", 0.2),
    (2, 2, 2, 45, 20, 16, "top_left", (4, -1), "batch", 1.5, "grad_rows", 0.0),
    (1, 8, 2, 24, 70, 32, "none", (-1, -1), "heads", 1.5, "full", 0.3),
    (1, 2, 2, 16, 16, 16, "top_left", (0, 0), None, 0.0, None, 0.1),  # the diagonal alone
    (1, 2, 1, 40, 10, 16, "none", (1, 0), "heads", 0.0, None, 0.0),  # rows that see no key
    (1, 2, 2, 70, 70, 16, "bottom_right", (100, 0), None, 3.0, None, 0.2),  # wider than L
]


def case_id(c):
    return "B{}_H{}x{}_L{}x{}_D{}_{}_w{}_{}_alibi-{}_cap{}_bias-{}_p{}".format(
        *c[:7], *c[7], *c[8:])


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_the_reference(device, case):
    B, Hq, Hkv, Lq, Lk, D, causal, window, alibi_kind, softcap, bias_kind, p = case
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    gen = seeded_generator(case)
    q, k, v = randn_leaves(gen, device, dtype, (B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D))
    bias = random_bias(bias_kind, gen, device, dtype, B, Hq, Lq, Lk)
    slopes = slopes_for(alibi_kind, B, Hq, device)
    dout = torch.randn(B, Hq, Lq, D, generator=gen).to(device, dtype)

    out, state = skip_if_the_kernels_refuse(device, lambda: mt.scaled_dot_product_attention(
        q, k, v, attn_mask=bias, dropout_p=p, causal=None if causal == "none" else causal,
        enable_gqa=Hq != Hkv, return_rng_state=True, window_size=window, alibi_slopes=slopes,
        softcap=softcap))
    wanted = [t for t in (q, k, v, bias) if t is not None and t.requires_grad]
    got = torch.autograd.grad(out, wanted, dout)

    keep = None if p == 0 else mt.dropout_mask((B, Hq, Lq, Lk), p, state)
    keep_scale = mt.dropout_threshold(p).keep_scale if p > 0 else 1.0
    assert_output_and_grads_close(
        out, got, (q, k, v, bias), dout,
        lambda q, k, v, bias: reference_attention(
            q, k, v, bias=bias, causal=causal, keep=keep, keep_scale=keep_scale, window=window,
            alibi_slopes=slopes, softcap=softcap),
        dtype, ["dq", "dk", "dv", "dbias"])


def test_the_defaults_change_nothing(device):
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 2, 33, 16, generator=gen).to(device) for _ in range(3))
    plain = mt.scaled_dot_product_attention(q, k, v, is_causal=True, rng_state=None)
    same = mt.scaled_dot_product_attention(q, k, v, is_causal=True, window_size=(-1, -1),
                                           alibi_slopes=None, softcap=0.0)
    assert torch.equal(plain, same)


def packed(lengths_q, lengths_k, Hq, Hkv, D, device, dtype, gen):
    """Packed q [Tq, Hq, D], k, v [Tk, Hkv, D] (requiring grad) and their int32 offsets."""
    q, k, v = randn_leaves(gen, device, dtype, (sum(lengths_q), Hq, D), (sum(lengths_k), Hkv, D),
                           (sum(lengths_k), Hkv, D))
    cu_q, cu_k = ([0] + list(accumulate(lengths)) for lengths in (lengths_q, lengths_k))
    return q, k, v, cu_q, cu_k


# (query lengths, key lengths, Hq, Hkv, causal, window, alibi per sequence, softcap, p)
VARLEN_CASES = [
    ([9, 1, 0, 21], [9, 1, 0, 21], 4, 2, "top_left", (3, 0), False, 0.0, 0.0),
    ([5, 12, 3], [9, 7, 4], 2, 1, "bottom_right", (2, 0), True, 2.0, 0.3),
    ([5, 12, 3], [9, 7, 4], 2, 2, "none", (1, 2), True, 1.0, 0.2),
]


@pytest.mark.parametrize("case", VARLEN_CASES,
                         ids=lambda c: "{}_w{}_{}_alibi{}_cap{}_p{}".format(*c[4:5], *c[5], *c[6:]))
def test_varlen_matches_the_reference_per_sequence(device, case):
    lengths_q, lengths_k, Hq, Hkv, causal, window, per_sequence, softcap, p = case
    S, D = len(lengths_q), 16
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    gen = seeded_generator(case)
    q, k, v, cu_q, cu_k = packed(lengths_q, lengths_k, Hq, Hkv, D, device, dtype, gen)
    slopes = alibi(Hq, S if per_sequence else None).to(device)
    dout = torch.randn(q.shape[0], Hq, D, generator=gen).to(device, dtype)
    offsets = [torch.tensor(cu, dtype=torch.int32, device=device) for cu in (cu_q, cu_k)]

    out, state = skip_if_the_kernels_refuse(device, lambda: mt.varlen_attention(
        q, k, v, *offsets, max(lengths_q), max(lengths_k), dropout_p=p, causal=causal,
        return_rng_state=True, window_size=window, alibi_slopes=slopes, softcap=softcap))
    got = torch.autograd.grad(out, (q, k, v), dout)
    # Sequence s's mask is the padded batch's element s.
    keep = None if p == 0 else mt.dropout_mask((S, Hq, max(lengths_q), max(lengths_k)), p, state)
    keep_scale = mt.dropout_threshold(p).keep_scale if p > 0 else 1.0

    def reference(q, k, v):
        rows = []
        for s, (lq, lk) in enumerate(zip(lengths_q, lengths_k)):
            qs, ks, vs = (t[cu[s]:cu[s + 1]].transpose(0, 1).unsqueeze(0)
                          for t, cu in ((q, cu_q), (k, cu_k), (v, cu_k)))
            if lk == 0:  # no key: the rows' output is 0
                o = qs.new_zeros(1, Hq, lq, D) + 0 * qs.sum()
            else:
                o = reference_attention(
                    qs, ks, vs, causal=causal, window=window, softcap=softcap,
                    alibi_slopes=slopes[s:s + 1] if per_sequence else slopes, keep_scale=keep_scale,
                    keep=None if keep is None else keep[s:s + 1, :, :lq, :lk])
            rows.append(o[0].transpose(0, 1))
        return torch.cat(rows)

    assert_output_and_grads_close(out, got, (q, k, v), dout, reference, dtype, ["dq", "dk", "dv"])


def test_compiles_without_graph_breaks(device):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 4, 24, 16, generator=gen).to(device).requires_grad_()
               for _ in range(3))
    slopes = alibi(4).to(device)

    def attend(q, k, v):
        return mt.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True,
                                               window_size=(5, 0), alibi_slopes=slopes,
                                               softcap=2.0)

    def run(fn):
        torch.manual_seed(3)
        out = fn(q, k, v)
        return (out,) + torch.autograd.grad(out.square().sum(), (q, k, v))

    eager = skip_if_the_kernels_refuse(device, lambda: run(attend))
    compiled = run(torch.compile(attend, fullgraph=True, backend="aot_eager"))
    for name, a, b in zip(("out", "dq", "dk", "dv"), compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(window_size=(3,)), ValueError, "window_size.*pair of ints"),
    (dict(window_size=(3.0, 0)), ValueError, "window_size.*pair of ints"),
    (dict(window_size=(True, 0)), ValueError, "window_size.*pair of ints"),
    (dict(window_size=(-2, 0)), ValueError, r"window_size.*-1 \(unbounded\) or >= 0"),
    (dict(alibi_slopes=[0.5, 0.25]), TypeError, "alibi_slopes.*tensor"),
    (dict(alibi_slopes=torch.ones(2, dtype=torch.float64)), TypeError, "alibi_slopes.*float32"),
    (dict(alibi_slopes=torch.ones(3)), ValueError, r"alibi_slopes.*\[Hq\] = \[2\]"),
    (dict(alibi_slopes=torch.ones(3, 2)), ValueError, r"alibi_slopes.*\[B, Hq\] = \[1, 2\]"),
    (dict(softcap=-1.0), ValueError, "softcap.*finite number >= 0"),
    (dict(softcap=float("inf")), ValueError, "softcap.*finite number >= 0"),
    (dict(softcap=float("nan")), ValueError, "softcap.*finite number >= 0"),
    (dict(softcap="30"), TypeError, "softcap.*a number"),
])
def test_errors_name_the_argument(kwargs, error, match):
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(error, match=match):
        mt.scaled_dot_product_attention(q, q, q, **kwargs)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    rows = q[0].transpose(0, 1)
    with pytest.raises(error, match=match):
        mt.varlen_attention(rows, rows, rows, cu, cu, 8, 8, **kwargs)


def test_a_bottom_right_window_is_refused_with_global_coordinates():
    # Reached through the op's own keywords (context parallelism's): memeff names `window`.
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="window"):
        torch.ops.memeff.fwd(q, q, q, None, None, 0.0, "none", None, [], q_start=8,
                             window_left=2, window_right=0)


def test_slopes_that_require_grad_are_told_they_get_none():
    # memeff computes no gradient for the slopes (docs/window.md): a learnable slope would stay
    # as it is without a word, so the op warns; detached slopes, or no grad mode, say nothing.
    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    slopes = alibi(2).requires_grad_()
    with pytest.warns(UserWarning, match="alibi_slopes.*no gradient"):
        out = mt.scaled_dot_product_attention(q, q, q, alibi_slopes=slopes)
    out.sum().backward()
    assert slopes.grad is None and q.grad is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mt.scaled_dot_product_attention(q, q, q, alibi_slopes=slopes.detach())
        with torch.no_grad():
            mt.scaled_dot_product_attention(q, q, q, alibi_slopes=slopes)
