# Reference attention and comparison helpers for memeff's PyTorch tests: an explicit fp64 math
# reference that can apply a given dropout keep-mask, causal masks built by hand (bottom-right
# too), a tolerance scaled by the error of a same-precision baseline (and the comparison of an
# output and its gradients under it), and the capture of a CUDA graph for replay tests.
import math
import zlib

import pytest
import torch

# Error floor per dtype, relative to the reference's magnitude (at least 1).
ERROR_FLOOR = {
    torch.float64: 1e-10,
    torch.float32: 2e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}


def diagonal_offsets(lq, lk, mode, device):
    """[Lq, Lk] integers i + shift - j: how far key j lies before query i's diagonal, the
    diagonal aligned as `mode` aligns it (shift 0 for top_left, Lk - Lq for bottom_right and,
    for windows and ALiBi, for "none"; docs/window.md)."""
    shift = 0 if mode == "top_left" else lk - lq
    i = torch.arange(lq, device=device).unsqueeze(1)
    j = torch.arange(lk, device=device).unsqueeze(0)
    return i + shift - j


def causal_keep(lq, lk, mode, device, window=(-1, -1)):
    """Boolean [Lq, Lk]: True where query i may see key j under `mode` and the sliding window
    (left, right) (-1: unbounded side), None when nothing is masked."""
    left, right = window
    if mode == "none" and left < 0 and right < 0:
        return None
    d = diagonal_offsets(lq, lk, mode, device)
    keep = torch.ones_like(d, dtype=torch.bool)
    if mode != "none":
        keep &= d >= 0
    if left >= 0:
        keep &= d <= left
    if right >= 0:
        keep &= d >= -right
    return keep


def additive(mask_bool, dtype):
    """0 where True, -inf where False."""
    zeros = torch.zeros(mask_bool.shape, dtype=dtype, device=mask_bool.device)
    return zeros.masked_fill(mask_bool.logical_not(), float("-inf"))


def reference_attention(q, k, v, bias=None, causal="none", scale=None, keep=None,
                        keep_scale=1.0, window=(-1, -1), alibi_slopes=None, softcap=0.0):
    """softmax(cap(q kᵀ·scale) + bias - slope·|i + shift - j| + causal and window masks)
    ∘ keep·keep_scale · v, computed in the inputs' dtype (pass fp64 tensors for the reference),
    cap(s) = softcap·tanh(s / softcap) when softcap > 0 (docs/window.md); rows that see no key
    give 0. GQA: head h uses key/value head h // (Hq/Hkv). alibi_slopes: [Hq] or [B, Hq]."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.to(s.dtype)
    if alibi_slopes is not None:
        distance = diagonal_offsets(q.shape[2], k.shape[2], causal, q.device).abs()
        slopes = alibi_slopes.detach().to(s.dtype)
        slopes = slopes.view(1, -1, 1, 1) if slopes.dim() == 1 else slopes[:, :, None, None]
        s = s - slopes * distance.to(s.dtype)
    allowed = causal_keep(q.shape[2], k.shape[2], causal, q.device, window)
    if allowed is not None:
        s = s.masked_fill(allowed.logical_not(), float("-inf"))
    # A row with no allowed key (bottom-right causal with Lq > Lk, an all -inf mask row) has
    # output 0 and no gradient, as in memeff and torch's math backend; softmax alone gives NaN.
    live = (s.amax(dim=-1, keepdim=True) > float("-inf"))
    s = torch.where(live, s, torch.zeros_like(s))
    p = torch.softmax(s.float() if s.dtype in (torch.float16, torch.bfloat16) else s, dim=-1)
    p = torch.where(live, p, torch.zeros_like(p)).to(q.dtype)
    if keep is not None:
        p = p * keep.to(p.dtype) * keep_scale
    return p @ v


def max_error(actual, expected):
    return (actual.detach().double() - expected.detach().double()).abs().max().item()


def assert_close_to_reference(actual, expected, baseline, dtype, what, magnitude=None):
    """|actual - expected| <= 2·|baseline - expected| + floor(dtype)·max(1, |expected|), or
    max(1, |expected|, magnitude) given the size of the terms that make up expected (where they
    cancel, their rounding errors stay)."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != " \
                                           f"{tuple(expected.shape)}"
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    err = max_error(actual, expected)
    base = max_error(baseline, expected)
    magnitude = max(1.0, expected.detach().abs().max().item(), magnitude or 0.0)
    tol = 2.0 * base + ERROR_FLOOR[dtype] * magnitude
    if not err <= tol:
        index = (actual.detach().double() - expected.detach().double()).abs().argmax().item()
        where = [int(i) for i in torch.unravel_index(torch.tensor(index), actual.shape)]
        raise AssertionError(f"{what}: max error {err:.3g} at {where} exceeds tolerance "
                             f"{tol:.3g} (same-precision baseline error {base:.3g}, "
                             f"{dtype}, shape {tuple(actual.shape)})")


def assert_output_and_grads_close(out, grads, inputs, dout, reference, dtype, names, what=""):
    """memeff's `out` and `grads` (the gradients of the inputs that require one, in order)
    against reference(*inputs) run on fp64 copies of the inputs, with the tolerance of
    assert_close_to_reference from the same reference run on copies in their own dtype.
    `inputs` may hold None (passed as is) and non-float tensors such as a boolean mask (passed
    without conversion); names[i] names the gradient of inputs[i]; `what` prefixes the names."""
    def run(convert):
        copies = [None if t is None else convert(t).requires_grad_(t.requires_grad)
                  for t in inputs]
        o = reference(*copies)
        leaves = [c for c in copies if c is not None and c.requires_grad]
        return o, torch.autograd.grad(o, leaves, convert(dout))

    ref, ref_grads = run(lambda t: t.detach().double() if t.is_floating_point() else t.detach())
    base, base_grads = run(lambda t: t.detach())
    wanted = [n for n, t in zip(names, inputs) if t is not None and t.requires_grad]
    assert len(grads) == len(wanted), f"{what}{len(grads)} gradients for {wanted}"
    assert_close_to_reference(out, ref, base, dtype, f"{what}out")
    for name, g, r, b in zip(wanted, grads, ref_grads, base_grads):
        assert_close_to_reference(g, r, b, dtype, what + name)


def capture_graph(step):
    """A CUDA graph of one call of step() and the outputs that call left, after two warm-up
    calls on a side stream (as torch's docs advise for capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs


def check_replays(graph, outputs, mask_of, check, replays=3):
    """Replays a captured dropout step (outputs: out, rng_state, then the gradients) and calls
    check(what, out, grads, keep) on each replay's outputs with the mask of its rng_state
    (mask_of(state)); each replay must have drawn its own state and mask."""
    states, masks = [], []
    for replay in range(replays):
        graph.replay()
        torch.cuda.synchronize()
        out, state, *grads = (t.clone() for t in outputs)
        keep = mask_of(state)
        check(f"replay {replay} ", out, grads, keep)
        states.append(state.cpu())
        masks.append(keep)
    for a in range(replays):
        for b in range(a + 1, replays):
            assert not torch.equal(states[a], states[b]), f"replays {a} and {b} reused a state"
            assert not torch.equal(masks[a], masks[b]), f"replays {a} and {b} reused a mask"


def seeded_generator(case):
    """A CPU generator seeded from a test case's repr: each case its own inputs, the same in
    every run."""
    return torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))


def skip_if_the_kernels_refuse(device, call):
    """call(), or a skip on CUDA where the kernels do not take window/ALiBi/softcap yet (their
    reasons point to docs/window.md). On the CPU a refusal fails the test."""
    try:
        return call()
    except NotImplementedError as e:
        if device != "cpu" and "docs/window.md" in str(e):
            pytest.skip(f"the CUDA kernels refuse this call for now: {e}")
        raise


def random_bias(kind, gen, device, dtype, B, Hq, Lq, Lk):
    """A test case's bias: None, "grad_rows" (a [1, Hq, 1, Lk] bias requiring grad, broadcast
    over the batch and the queries) or "full" ([B, Hq, Lq, Lk], no gradient)."""
    if kind == "grad_rows":
        return torch.randn(1, Hq, 1, Lk, generator=gen).to(device, dtype).requires_grad_()
    if kind == "full":
        return torch.randn(B, Hq, Lq, Lk, generator=gen).to(device, dtype)
    return None


def randn_leaves(gen, device, dtype, *shapes):
    """Tensors of `shapes` drawn from `gen` on the CPU (so every device sees the same values),
    moved to device and dtype, requiring grad."""
    return [torch.randn(*shape, generator=gen).to(device, dtype).requires_grad_()
            for shape in shapes]
