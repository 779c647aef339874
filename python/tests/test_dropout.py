# Dropout through memeff.torch: outputs and gradients against an fp64 math reference given the
# mask from dropout_mask (so the mask the kernels used is checked through their results), the
# keep rate, and torch's generators deciding the mask (manual_seed, generator=, rng_state=).
import math

import pytest

torch = pytest.importorskip("torch")
import memeff.torch as mt  # noqa: E402

from attention_helpers import (assert_output_and_grads_close, random_bias,  # noqa: E402
                               randn_leaves, reference_attention, seeded_generator)

# (B, Hq, Hkv, Lq, Lk, D, causal, bias kind, p)
CASES = [
    (2, 4, 4, 17, 17, 64, "none", None, 0.1),
    (1, 4, 2, 65, 129, 64, "bottom_right", None, 0.3),
    (2, 2, 2, 129, 64, 128, "top_left", "grad_rows", 0.2),
    (1, 8, 1, 48, 200, 64, "none", "full", 0.5),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}_H{}x{}_L{}x{}_D{}_{}_{}_p{}".format(*c))
def test_matches_reference_with_its_mask(device, dtype, case):
    B, Hq, Hkv, Lq, Lk, D, causal, bias_kind, p = case
    gen = seeded_generator(case)
    q, k, v = randn_leaves(gen, device, dtype, (B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D))
    bias = random_bias(bias_kind, gen, device, dtype, B, Hq, Lq, Lk)
    dout = torch.randn(B, Hq, Lq, D, generator=gen).to(device, dtype)

    out, rng_state = mt.scaled_dot_product_attention(
        q, k, v, attn_mask=bias, dropout_p=p, causal=None if causal == "none" else causal,
        enable_gqa=Hq != Hkv, return_rng_state=True)
    assert rng_state is not None and rng_state.device == q.device
    wanted = [t for t in (q, k, v, bias) if t is not None and t.requires_grad]
    got = torch.autograd.grad(out, wanted, dout)

    keep = mt.dropout_mask((B, Hq, Lq, Lk), p, rng_state)
    assert keep.dtype == torch.bool and keep.shape == (B, Hq, Lq, Lk)
    keep_scale = mt.dropout_threshold(p).keep_scale

    assert_output_and_grads_close(
        out, got, (q, k, v, bias), dout,
        lambda q, k, v, bias: reference_attention(q, k, v, bias=bias, causal=causal, keep=keep,
                                                  keep_scale=keep_scale),
        dtype, ["dq", "dk", "dv", "dbias"])


def test_keep_rate_is_binomial(device):
    p = 0.2
    q = torch.randn(4, 8, 128, 32, device=device)
    _, state = mt.scaled_dot_product_attention(q, q, q, dropout_p=p, return_rng_state=True)
    keep = mt.dropout_mask((4, 8, 128, 128), p, state)
    n = keep.numel()
    rate = 1.0 - mt.dropout_threshold(p).p_effective
    sigma = math.sqrt(rate * (1 - rate) / n)
    observed = keep.float().mean().item()
    assert abs(observed - rate) < 5 * sigma, f"keep rate {observed} vs {rate} ± {sigma}"
    # different heads and batches draw different masks
    assert not torch.equal(keep[0, 0], keep[0, 1]) and not torch.equal(keep[0, 0], keep[1, 0])


def call(device, seed=None, generator=None, rng_state=None, p=0.3):
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(2, 3, 40, 64, generator=gen).to(device)
    if seed is not None:
        torch.manual_seed(seed)
    return mt.scaled_dot_product_attention(q, q, q, dropout_p=p, generator=generator,
                                           rng_state=rng_state, return_rng_state=True)


def test_manual_seed_decides_the_mask(device):
    a, sa = call(device, seed=1)
    b, sb = call(device, seed=1)
    c, sc = call(device, seed=2)
    assert torch.equal(a, b) and torch.equal(sa, sb)
    assert not torch.equal(a, c) and not torch.equal(sa, sc)
    # successive calls draw fresh masks
    d, sd = call(device)
    e, se = call(device)
    assert not torch.equal(d, e) and not torch.equal(sd, se)


def test_generator_argument(device):
    torch.manual_seed(0)
    default_state = torch.get_rng_state() if device == "cpu" else torch.cuda.get_rng_state()
    a, _ = call(device, generator=torch.Generator(device=device).manual_seed(5))
    b, _ = call(device, generator=torch.Generator(device=device).manual_seed(5))
    c, _ = call(device, generator=torch.Generator(device=device).manual_seed(6))
    after = torch.get_rng_state() if device == "cpu" else torch.cuda.get_rng_state()
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(default_state, after), "a generator= call must leave the default one alone"


def test_rng_state_replays_a_call(device):
    a, state = call(device, seed=3)
    b, again = call(device, rng_state=state)
    assert torch.equal(a, b) and again is state
    assert torch.equal(mt.last_rng_state(), state)


def test_rng_state_is_kept_under_a_dispatch_mode_that_runs_the_call(device):
    # A user's own dispatch mode (FlopCounterMode here) runs the call for real, so its state is
    # the latest one; only the modes tracing runs under (fake tensors, functionalization, proxies)
    # leave the state alone.
    from torch.utils.flop_counter import FlopCounterMode
    call(device, seed=2)
    with FlopCounterMode(display=False):
        a, state = call(device, seed=3)
    assert state is not None and torch.equal(mt.last_rng_state(), state)
    b, _ = call(device, rng_state=mt.last_rng_state())
    assert torch.equal(a, b)


def test_no_dropout_draws_nothing(device):
    torch.manual_seed(4)
    before = torch.get_rng_state() if device == "cpu" else torch.cuda.get_rng_state()
    out, state = call(device, p=0.0)
    after = torch.get_rng_state() if device == "cpu" else torch.cuda.get_rng_state()
    assert state is None and torch.equal(before, after)
    # a state passed with p = 0 is not the call's: none is returned or kept (as documented)
    out, state = call(device, p=0.0, rng_state=torch.tensor([5, 6]))
    assert state is None and mt.last_rng_state() is None
