# memeff.torch.varlen_attention: packed variable-length sequences. On the CPU: the packed call
# against memeff's dense op on the padded batch of the same sequences (one dropout mask: sequence
# s is batch element s) in fp32 and fp64, bit for bit where the sequences have one length;
# gradcheck in fp64. On every device (fp32 on the CPU, bf16 on CUDA, where the fused kernels take
# 16-bit inputs): half precision against an fp64 per-sequence reference, outputs in the inputs'
# layout, opcheck of the ops, torch.compile with dynamic total lengths, torch's generators
# deciding the mask, the edges, autocast, error messages naming the argument. On CUDA only
# (skipped elsewhere): the fused backends ("cuda", "cuda_sm90") against an fp64 per-sequence
# reference with the mask from dropout_mask, against torch's own varlen attention, packed ==
# padded bit for bit, CUDA-graph capture and replay drawing fresh masks, offsets on another
# device.
import math
import zlib
from itertools import accumulate

import pytest

torch = pytest.importorskip("torch")
import memeff.torch as mt  # noqa: E402

from attention_helpers import (assert_close_to_reference,  # noqa: E402
                               assert_output_and_grads_close, capture_graph, causal_keep,
                               check_replays, reference_attention)

CAUSAL_MODES = ["none", "top_left", "bottom_right"]
QKV = ("dq", "dk", "dv")  # the gradients' names, for assert_output_and_grads_close


def dtype_for(device):
    """fp32 on the CPU; bf16 on CUDA (memeff's fused kernels take 16-bit inputs, and cuda_math
    runs dense batches only)."""
    return torch.float32 if device == "cpu" else torch.bfloat16


def close(device):
    """Tolerances of two memeff calls that should agree up to rounding."""
    return dict(rtol=1e-5, atol=1e-6) if device == "cpu" else dict(rtol=2e-2, atol=2e-2)


def offsets(lengths, device):
    return torch.tensor([0] + list(accumulate(lengths)), dtype=torch.int32, device=device)


def packed_inputs(lens_q, lens_k, Hq, Hkv, D, Dv, dtype, device, seed, requires_grad=True):
    """Random packed q [Tq, Hq, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv] and their offsets."""
    gen = torch.Generator().manual_seed(seed)
    Tq, Tk = sum(lens_q), sum(lens_k)
    q = torch.randn(Tq, Hq, D, generator=gen).to(device, dtype).requires_grad_(requires_grad)
    k = torch.randn(Tk, Hkv, D, generator=gen).to(device, dtype).requires_grad_(requires_grad)
    v = torch.randn(Tk, Hkv, Dv, generator=gen).to(device, dtype).requires_grad_(requires_grad)
    return q, k, v, offsets(lens_q, device), offsets(lens_k, device)


def visible(lq, lk, mode, max_q, max_k, device):
    """Boolean [max_q, max_k]: query i of a sequence of lq queries and lk keys sees key j
    (padding rows and columns see nothing)."""
    keep = torch.zeros(max_q, max_k, dtype=torch.bool, device=device)
    inner = causal_keep(lq, lk, mode, device)
    keep[:lq, :lk] = True if inner is None else inner
    return keep


def padded_call(q, k, v, lens_q, lens_k, causal, p, rng_state, scale=None):
    """The dense op on the padded batch [S, H, max_len, D] of the packed sequences (sequence s at
    batch element s, rows from 0): the visibility of each sequence (its keys, its causal pattern
    from its own lengths, nothing for padding rows) as a boolean mask, the same rng_state. Returns
    the real rows packed again; autograd reaches the packed q, k, v."""
    S, max_q, max_k = len(lens_q), max(lens_q), max(lens_k)

    def pad(t, lengths, rows):
        parts = list(t.split(list(lengths)))
        padded = torch.nn.utils.rnn.pad_sequence(parts, batch_first=True)  # [S, L, H, D]
        if padded.shape[1] < rows:
            padded = torch.nn.functional.pad(padded, (0, 0, 0, 0, 0, rows - padded.shape[1]))
        return padded.transpose(1, 2)

    mask = torch.stack([visible(lq, lk, causal, max_q, max_k, q.device)
                        for lq, lk in zip(lens_q, lens_k)]).unsqueeze(1)
    out = mt.scaled_dot_product_attention(pad(q, lens_q, max_q), pad(k, lens_k, max_k),
                                          pad(v, lens_k, max_k), attn_mask=mask, dropout_p=p,
                                          scale=scale, enable_gqa=True, rng_state=rng_state)
    return torch.cat([out[s, :, :lens_q[s]].transpose(0, 1) for s in range(S)])


def per_sequence_reference(q, k, v, lens_q, lens_k, causal, keep=None, keep_scale=1.0,
                           scale=None):
    """reference_attention (attention_helpers) of each sequence on its own, in the inputs'
    dtype; keep: the padded batch's [S, Hq, max_q, max_k] keep-mask."""
    outs = []
    cu_q, cu_k = [0] + list(accumulate(lens_q)), [0] + list(accumulate(lens_k))
    for s, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        qs = q[cu_q[s]:cu_q[s + 1]].transpose(0, 1).unsqueeze(0)
        ks = k[cu_k[s]:cu_k[s + 1]].transpose(0, 1).unsqueeze(0)
        vs = v[cu_k[s]:cu_k[s + 1]].transpose(0, 1).unsqueeze(0)
        if lk == 0:  # no key: the row's output is 0
            o = qs.new_zeros(1, q.shape[1], lq, v.shape[2]) + 0 * qs.sum()
        else:
            o = reference_attention(qs, ks, vs, causal=causal, scale=scale,
                                    keep=None if keep is None else keep[s:s + 1, :, :lq, :lk],
                                    keep_scale=keep_scale)
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs)


def grads(out, inputs, dout):
    return torch.autograd.grad(out, inputs, dout)


# ---------------------------------------------------------------------------------------------
# The CPU.

# (query lengths, key lengths or None for the same, Hq, Hkv, D, Dv)
MIXED = [
    ([17, 1, 0, 33, 8], None, 4, 2, 16, 16),
    ([5, 12, 3, 0], [9, 7, 0, 4], 2, 1, 8, 12),
]


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("causal", CAUSAL_MODES)
@pytest.mark.parametrize("case", MIXED, ids=["same_lengths_gqa", "keys_of_other_lengths"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_matches_the_dense_op_on_the_padded_batch(dtype, case, causal, p):
    device = "cpu"
    lens_q, lens_k, Hq, Hkv, D, Dv = case
    lens_k = lens_k or lens_q
    seed = zlib.crc32(repr((case, causal, p)).encode())
    q, k, v, cu_q, cu_k = packed_inputs(lens_q, lens_k, Hq, Hkv, D, Dv, dtype, device, seed)
    dout = torch.randn(q.shape[0], Hq, Dv, generator=torch.Generator().manual_seed(seed)).to(
        device, dtype)
    out, state = mt.varlen_attention(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), dropout_p=p,
                                     causal=None if causal == "none" else causal,
                                     return_rng_state=True)
    assert out.shape == (q.shape[0], Hq, Dv) and out.dtype == dtype
    assert (state is None) == (p == 0)
    got = grads(out, (q, k, v), dout)
    ref = padded_call(q, k, v, lens_q, lens_k, causal, p, state)
    want = grads(ref, (q, k, v), dout)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-6)
    torch.testing.assert_close(out, ref, **tol)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        torch.testing.assert_close(g, w, **tol, msg=lambda m, n=name: f"{n}: {m}")
    if p > 0:  # the packed call really dropped something
        keep = mt.dropout_mask((len(lens_q), Hq, max(lens_q), max(lens_k)), p, state)
        assert 0 < keep.sum().item() < keep.numel()


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("causal", CAUSAL_MODES)
def test_equal_lengths_equal_the_dense_batch_bit_for_bit(backend, causal):
    # S sequences of one length packed are the dense [S, H, L, D] batch: the same numbers, the
    # same mask (sequence s is batch element s), bit for bit on the host backends.
    device = "cpu"
    S, L, Hq, Hkv, D, p = 3, 24, 4, 2, 16, 0.25
    q, k, v, cu, _ = packed_inputs([L] * S, [L] * S, Hq, Hkv, D, D, torch.float32, device, 5)
    dout = torch.randn(S * L, Hq, D, generator=torch.Generator().manual_seed(6))
    state = torch.tensor([1234, 56], dtype=torch.int64)
    kw = dict(dropout_p=p, causal=None if causal == "none" else causal, rng_state=state)
    with mt.use_backends(backend):
        out, lse = mt.varlen_attention(q, k, v, cu, cu, L, L, return_lse=True, **kw)
        assert mt.last_backends()[0] == backend
        got = grads(out, (q, k, v), dout)

        def dense(t):  # [S·L, H, D] -> [S, H, L, D], a view of the same rows
            return t.view(S, L, t.shape[1], t.shape[2]).transpose(1, 2)

        ref = mt.scaled_dot_product_attention(dense(q), dense(k), dense(v), enable_gqa=True, **kw)
        want = grads(ref, (q, k, v), dense(dout))
    assert torch.equal(out, ref.transpose(1, 2).reshape(S * L, Hq, D))
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.equal(g, w), name
    # lse [Hq, S·L] is the logsumexp of each row (the dense op does not return its own).
    scores = (dense(q).double() @ dense(k).double().repeat_interleave(2, 1).transpose(-1, -2))
    scores = scores / math.sqrt(D)
    allowed = causal_keep(L, L, causal, device)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    want_lse = scores.logsumexp(-1).permute(1, 0, 2).reshape(Hq, S * L)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)


# (query lengths, key lengths, Hq, Hkv, causal, dropout p)
GRADCHECK = [
    ([3, 0, 4], [3, 0, 4], 2, 1, "top_left", 0.0),
    ([2, 5], [4, 3], 2, 2, "bottom_right", 0.3),
    ([4, 1, 3], [2, 5, 3], 4, 2, "none", 0.5),
]


@pytest.mark.parametrize("case", GRADCHECK, ids=lambda c: "Lq{}_Lk{}_H{}x{}_{}_p{}".format(*c))
def test_gradcheck_fp64(case):
    lens_q, lens_k, Hq, Hkv, causal, p = case
    q, k, v, cu_q, cu_k = packed_inputs(lens_q, lens_k, Hq, Hkv, 4, 5, torch.float64, "cpu", 21)
    state = torch.tensor([12345, 678], dtype=torch.int64) if p > 0 else None

    def attention(q, k, v):
        return mt.varlen_attention(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), dropout_p=p,
                                   causal=causal, rng_state=state)

    assert torch.autograd.gradcheck(attention, (q, k, v), eps=1e-6, atol=1e-6, rtol=1e-4)
    assert mt.last_backends()[0] == "reference"
    if p > 0:
        keep = mt.dropout_mask((len(lens_q), Hq, max(lens_q), max(lens_k)), p, state)
        assert 0 < keep.sum().item() < keep.numel()


# ---------------------------------------------------------------------------------------------
# Every device: fp32 on the CPU, bf16 on CUDA (head dims of 8 and more: 16-byte rows).


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_against_the_fp64_reference(device, dtype):
    lens, Hq, Hkv, D = [40, 1, 0, 70, 9], 4, 1, 64
    q, k, v, cu, _ = packed_inputs(lens, lens, Hq, Hkv, D, D, dtype, device, 11)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(12)).to(device, dtype)
    out = mt.varlen_attention(q, k, v, cu, cu, max(lens), max(lens), causal="bottom_right")
    got = grads(out, (q, k, v), dout)
    assert_output_and_grads_close(
        out, got, (q, k, v), dout,
        lambda q, k, v: per_sequence_reference(q, k, v, lens, lens, "bottom_right"), dtype, QKV)


def test_outputs_and_gradients_take_the_inputs_layout(device):
    # q, k, v slices of one fused [T, 3, H, D] projection (not dense): out and the gradients
    # are dense [T, H, D]; a [H, T, D] storage viewed as [T, H, D] gives results of that layout.
    lens, H, D, dtype = [5, 9, 2], 4, 16, dtype_for(device)
    T = sum(lens)
    cu = offsets(lens, device)
    qkv = torch.randn(T, 3, H, D, device=device, dtype=dtype, requires_grad=True)
    q, k, v = qkv.unbind(1)
    out = mt.varlen_attention(q, k, v, cu, cu, 9, 9)
    assert out.is_contiguous()
    dq, = torch.autograd.grad(out.sum(), (q,))
    assert dq.is_contiguous()
    x = torch.randn(H, T, D, device=device, dtype=dtype).transpose(0, 1).requires_grad_()
    out, lse, state = mt.varlen_attention(x, x, x, cu, cu, 9, 9, dropout_p=0.2, return_lse=True,
                                          return_rng_state=True)
    assert out.stride() == x.stride() == (D, T * D, 1)
    xd = x.detach()
    dq, dk, dv = torch.ops.memeff.varlen_bwd(torch.ones_like(out), xd, xd, xd, cu, cu, 9, 9,
                                             out.detach(), lse, state, 0.2, "none", None, [])
    assert dq.stride() == dk.stride() == dv.stride() == x.stride()
    xc = x.detach().contiguous()
    ref = mt.varlen_attention(xc, xc, xc, cu, cu, 9, 9, dropout_p=0.2, rng_state=state)
    torch.testing.assert_close(out, ref, **close(device))


def _opcheck_args(device, p):
    lens = [3, 0, 6]
    q, k, v, cu, _ = packed_inputs(lens, lens, 4, 2, 16, 8, dtype_for(device), device, 3)
    q = q.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()  # [H, T]-stored
    state = torch.tensor([7, 9], dtype=torch.int64) if p > 0 else None
    return q, k, v, cu, state


@pytest.mark.parametrize("p", [0.0, 0.25])
def test_opcheck_forward(device, p):
    # A given rng_state keeps the op deterministic, which opcheck's comparisons need.
    q, k, v, cu, state = _opcheck_args(device, p)
    torch.library.opcheck(torch.ops.memeff.varlen_fwd.default,
                          (q, k, v, cu, cu, 6, 6, state, p, "bottom_right", None, [], True))


def test_opcheck_backward(device):
    q, k, v, cu, state = (t.detach() for t in _opcheck_args(device, 0.25))
    out, lse, _ = torch.ops.memeff.varlen_fwd(q, k, v, cu, cu, 6, 6, state, 0.25, "top_left", 0.3,
                                              [], False)
    torch.library.opcheck(torch.ops.memeff.varlen_bwd.default,
                          (torch.randn_like(out), q, k, v, cu, cu, 6, 6, out, lse, state, 0.25,
                           "top_left", 0.3, []))


def test_fake_kernel_matches_the_real_one(device):
    from torch._subclasses.fake_tensor import FakeTensorMode
    q, k, v, cu, _ = _opcheck_args(device, 0.5)
    q, k, v = (t.detach() for t in (q, k, v))
    real = torch.ops.memeff.varlen_fwd(q, k, v, cu, cu, 6, 6, None, 0.5, "none", None, [], False)
    with FakeTensorMode() as mode:
        fake = torch.ops.memeff.varlen_fwd(*(mode.from_tensor(t) for t in (q, k, v, cu, cu)), 6, 6,
                                           None, 0.5, "none", None, [], False)
    for r, f in zip(real, fake):
        assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype)
    assert real[2].device.type == fake[2].device.type == "cpu" and real[2].numel() == 2


class PackedSelfAttention(torch.nn.Module):
    """A packed layer as a padding-free model writes it: x [T, W] -> q, k, v [T, H, D] views of
    one projection, varlen attention, the output projection."""

    def __init__(self, width=64, heads=4, dropout_p=0.0):
        super().__init__()
        self.heads, self.dropout_p = heads, dropout_p
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x, cu_seqlens, max_seqlen):
        T, W = x.shape
        q, k, v = self.qkv(x).view(T, 3, self.heads, W // self.heads).unbind(1)
        a = mt.varlen_attention(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                dropout_p=self.dropout_p, causal=True)
        return self.proj(a.reshape(T, W))


@pytest.mark.parametrize("dropout_p", [0.0, 0.2])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_equals_eager_with_dynamic_lengths(device, backend, dropout_p):
    # fullgraph, and one graph for every total length, sequence count and maximum length.
    torch._dynamo.reset()
    torch.manual_seed(0)
    dtype = dtype_for(device)
    module = PackedSelfAttention(dropout_p=dropout_p).to(device, dtype)
    compiled = torch.compile(module, fullgraph=True, backend=backend, dynamic=True)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for lens in ([7, 3, 12], [5, 16, 1, 9], [2, 30]):
        x = torch.randn(sum(lens), 64, device=device, dtype=dtype)
        cu = offsets(lens, device)

        def run(fn):
            torch.manual_seed(123)
            y = fn(x, cu, max(lens))
            return y, torch.autograd.grad(y.float().square().sum(), list(module.parameters()))

        y_eager, g_eager = run(module)
        y_comp, g_comp = run(compiled)
        torch.testing.assert_close(y_comp, y_eager, **close(device))
        for (name, _), a, b in zip(module.named_parameters(), g_comp, g_eager):
            torch.testing.assert_close(a, b, **close(device), msg=f"gradient of {name}")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 1, "recompiled"
    if dropout_p > 0:  # a different seed gives a different mask under compile as well
        torch.manual_seed(124)
        assert not torch.allclose(compiled(x, cu, max(lens)), y_eager)


def test_generators_decide_the_mask(device):
    lens = [20, 33]
    q, k, v, cu, _ = packed_inputs(lens, lens, 2, 2, 32, 32, dtype_for(device), device, 8,
                                   requires_grad=False)

    def call(**kw):
        return mt.varlen_attention(q, k, v, cu, cu, 33, 33, dropout_p=0.3, return_rng_state=True,
                                   **kw)

    torch.manual_seed(1)
    a, sa = call()
    torch.manual_seed(1)
    b, sb = call()
    c, sc = call()
    assert torch.equal(a, b) and torch.equal(sa, sb)
    assert not torch.equal(a, c) and not torch.equal(sa, sc)
    assert sa.device == q.device and torch.equal(mt.last_rng_state(), sc)
    d, again = call(rng_state=sa)
    assert torch.equal(d, a) and again is sa
    e, _ = call(generator=torch.Generator(device=device).manual_seed(5))
    f, _ = call(generator=torch.Generator(device=device).manual_seed(5))
    assert torch.equal(e, f)
    torch.manual_seed(4)
    before = torch.get_rng_state() if device == "cpu" else torch.cuda.get_rng_state()
    out, state = mt.varlen_attention(q, k, v, cu, cu, 33, 33, return_rng_state=True)
    after = torch.get_rng_state() if device == "cpu" else torch.cuda.get_rng_state()
    assert state is None and torch.equal(before, after)


def test_return_options(device):
    lens = [3, 5]
    q, k, v, cu, _ = packed_inputs(lens, lens, 2, 2, 8, 8, dtype_for(device), device, 9,
                                   requires_grad=False)
    out = mt.varlen_attention(q, k, v, cu, cu, 5, 5)
    assert isinstance(out, torch.Tensor)
    out2, lse = mt.varlen_attention(q, k, v, cu, cu, 5, 5, return_lse=True)
    assert torch.equal(out, out2) and lse.shape == (2, 8) and lse.dtype == torch.float32
    assert lse.is_contiguous()
    out3, lse3, state = mt.varlen_attention(q, k, v, cu, cu, 5, 5, return_lse=True,
                                            return_rng_state=True)
    assert torch.equal(out3, out) and torch.equal(lse3, lse) and state is None
    # A maximum length given as a one-element tensor (as transformers computes it) is read.
    out4 = mt.varlen_attention(q, k, v, cu, cu, torch.tensor(5), torch.tensor(5, device=device))
    assert torch.equal(out4, out)


def test_edges(device):
    # No keys in a sequence, bottom-right causal with more queries than keys: rows that see no
    # key give 0 and lse -inf, and no gradient.
    dtype = dtype_for(device)
    lens_q, lens_k = [4, 6, 0], [0, 3, 2]
    q, k, v, cu_q, cu_k = packed_inputs(lens_q, lens_k, 2, 1, 8, 8, dtype, device, 10)
    out, lse = mt.varlen_attention(q, k, v, cu_q, cu_k, 6, 3, causal="bottom_right",
                                   return_lse=True)
    assert torch.isfinite(out).all()
    assert (out[:7] == 0).all() and (out[7:] != 0).any()
    assert torch.isinf(lse[:, :7]).all() and (lse[:, :7] < 0).all()
    out.float().sum().backward()
    assert (q.grad[:7] == 0).all() and torch.isfinite(k.grad).all()
    # Nothing to compute: no sequences, sequences without rows, keys but no queries (dk and dv
    # are then zero).
    for lens_q, lens_k in (([], []), ([0, 0], [0, 0]), ([0, 0], [3, 2])):
        q, k, v, cu_q, cu_k = packed_inputs(lens_q, lens_k, 2, 2, 8, 8, dtype, device, 1)
        out = mt.varlen_attention(q, k, v, cu_q, cu_k, 0, max(lens_k, default=0), dropout_p=0.1)
        assert out.shape == (0, 2, 8)
        dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
        assert dq.shape == q.shape and (dk == 0).all() and (dv == 0).all()


def test_autocast_runs_in_the_region_dtype(device):
    # q and k in fp32 (as after a model's rotary embedding), v in bf16: under autocast memeff
    # computes in bf16; the gradients come back in each input's own dtype.
    lens = [6, 10]
    q, k, v, cu, _ = packed_inputs(lens, lens, 4, 2, 16, 16, torch.float32, device, 13)
    with torch.autocast(device, dtype=torch.bfloat16):
        out = mt.varlen_attention(q, k, v.detach().to(torch.bfloat16).requires_grad_(), cu, cu,
                                  10, 10, causal=True)
    assert out.dtype == torch.bfloat16
    dq, dk = torch.autograd.grad(out.float().sum(), (q, k))
    assert dq.dtype == dk.dtype == torch.float32


def test_errors_name_the_argument(device):
    lens = [3, 5]
    q, k, v, cu, _ = packed_inputs(lens, lens, 4, 2, 8, 8, dtype_for(device), device, 14,
                                   requires_grad=False)

    def call(q=q, k=k, v=v, cu_q=cu, cu_k=cu, max_q=5, max_k=5, **kw):
        return mt.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, **kw)

    with pytest.raises(ValueError, match=r"argument `cu_seqlens_q`: expected an int32 tensor"):
        call(cu_q=cu.long())
    with pytest.raises(ValueError, match=r"argument `cu_seqlens_k`: expected one dimension"):
        call(cu_k=cu.view(1, 3))
    with pytest.raises(ValueError, match=r"argument `cu_seqlens_k`: expected 3 entries"):
        call(cu_k=offsets([3, 5, 0], device))
    with pytest.raises(ValueError, match=r"argument `q`: expected a packed"):
        call(q=q.unsqueeze(0))
    with pytest.raises(ValueError, match=r"argument `k`"):
        call(k=k.float() if k.dtype != torch.float32 else k.half())
    with pytest.raises(ValueError, match=r"argument `k`"):
        call(k=torch.cat([k, k[:, :1]], 1), v=torch.cat([v, v[:, :1]], 1))  # 3 heads, Hq = 4
    with pytest.raises(ValueError, match=r"argument `v`"):
        call(v=v[:7])
    with pytest.raises(ValueError, match=r"argument `max_seqlen_q`"):
        call(max_q=9)  # more than total_q
    with pytest.raises(ValueError, match="causal"):
        call(causal="diagonal")
    with pytest.raises(ValueError, match="dropout_p"):
        call(dropout_p=1.0)
    with pytest.raises(ValueError, match=r"argument `max_seqlen_k`: expected an int"):
        call(max_k=torch.tensor([5.0]))
    # The offsets' values: checked on the CPU always, on a GPU with check_offsets=True.
    bad_values = [
        ([1, 3, 8], "cu_seqlens_q", r"expected 0 first"),
        ([0, 5, 4], "cu_seqlens_q", r"non-decreasing"),
        ([0, 3, 7], "cu_seqlens_q", r"the packed rows' count 8 last"),
        ([0, 2, 8], "max_seqlen_q", r"sequence 1 has length 6"),
    ]
    for values, name, what in bad_values:
        bad = torch.tensor(values, dtype=torch.int32, device=device)
        with pytest.raises(ValueError, match=rf"argument `{name}`: .*{what}"):
            call(cu_q=bad, check_offsets=True)
        if device == "cpu":
            with pytest.raises(ValueError, match=rf"argument `{name}`"):
                call(cu_q=bad)
    with pytest.raises(NotImplementedError, match="no_such_backend"):
        with mt.use_backends("no_such_backend"):
            call()


# ---------------------------------------------------------------------------------------------
# CUDA only: the fused backends. Each test runs on "cuda" and "cuda_sm90" (Hopper only).

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
FUSED = ["cuda", "cuda_sm90"]


def require_backend(name):
    if name not in mt.backend_names():
        pytest.skip(f"backend {name} is not in this build")
    if name == "cuda_sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("cuda_sm90 runs on compute capability 9.0 only")


@needs_cuda
@pytest.mark.parametrize("p", [0.0, 0.2])
@pytest.mark.parametrize("causal", CAUSAL_MODES)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("backend", FUSED)
def test_cuda_against_the_fp64_reference_with_its_mask(backend, D, causal, p):
    # Mixed lengths (empty, single-row and multi-tile sequences, keys of other lengths), GQA,
    # bf16; the mask of sequence s is the padded batch's element s (dropout_mask of the padded
    # shape), so a packed kernel that drew another mask fails here.
    require_backend(backend)
    dtype = torch.bfloat16
    lens_q, lens_k = [17, 1, 0, 300, 64, 65, 129], [17, 5, 3, 280, 64, 0, 200]
    Hq, Hkv = 4, 2
    q, k, v, cu_q, cu_k = packed_inputs(lens_q, lens_k, Hq, Hkv, D, D, dtype, "cuda", D + 7)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(D)).to("cuda", dtype)
    with mt.use_backends(backend):
        out, state = mt.varlen_attention(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                         dropout_p=p, causal=causal, return_rng_state=True)
        got = grads(out, (q, k, v), dout)
    assert mt.last_backends() == (backend, backend)
    keep = None
    if p > 0:
        keep = mt.dropout_mask((len(lens_q), Hq, max(lens_q), max(lens_k)), p, state)
    keep_scale = mt.dropout_threshold(p).keep_scale
    assert_output_and_grads_close(
        out, got, (q, k, v), dout,
        lambda q, k, v: per_sequence_reference(q, k, v, lens_q, lens_k, causal, keep, keep_scale),
        dtype, QKV)


def torch_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal):
    """torch's own varlen attention (torch.nn.attention.varlen.varlen_attn, FlashAttention-2)
    across its signatures: is_causal= (2.9) or window_size=(-1, 0) (2.10+); enable_gqa= where
    it exists, else k and v repeated to the query heads."""
    import inspect

    from torch.nn.attention.varlen import varlen_attn
    params = inspect.signature(varlen_attn).parameters
    kw = {}
    if causal:
        if "is_causal" in params:
            kw["is_causal"] = True
        else:
            kw["window_size"] = (-1, 0)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        else:
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **kw)


@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", FUSED)
def test_cuda_against_torch_varlen(backend, causal):
    pytest.importorskip("torch.nn.attention.varlen")
    require_backend(backend)
    dtype = torch.bfloat16
    lens, Hq, Hkv, D = [100, 1, 513, 64, 250], 8, 2, 128
    q, k, v, cu, _ = packed_inputs(lens, lens, Hq, Hkv, D, D, dtype, "cuda", 17,
                                   requires_grad=False)
    try:
        theirs = torch_varlen(q, k, v, cu, cu, max(lens), max(lens), causal)
    except (RuntimeError, TypeError) as e:
        pytest.skip(f"torch's varlen_attn cannot run this: {e}")
    with mt.use_backends(backend):
        out = mt.varlen_attention(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
    ref = per_sequence_reference(q.double(), k.double(), v.double(), lens, lens,
                                 "top_left" if causal else "none")
    assert_close_to_reference(out, ref, theirs, dtype, "out vs torch varlen_attn")


@needs_cuda
@pytest.mark.parametrize("backend", FUSED)
def test_cuda_equal_lengths_equal_the_dense_batch_bit_for_bit(backend):
    # One mask and the same tiles as the dense [S, H, L, D] batch: out bit for bit, and the
    # gradients too with torch.use_deterministic_algorithms (memeff's deterministic backward).
    require_backend(backend)
    S, L, Hq, Hkv, D, p = 3, 192, 4, 2, 64, 0.25
    q, k, v, cu, _ = packed_inputs([L] * S, [L] * S, Hq, Hkv, D, D, torch.bfloat16, "cuda", 9)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to("cuda", q.dtype)
    state = torch.tensor([99, 7], dtype=torch.int64)
    kw = dict(dropout_p=p, causal="bottom_right", rng_state=state)

    def dense(t):
        return t.view(S, L, t.shape[1], t.shape[2]).transpose(1, 2)

    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with mt.use_backends(backend):
            out = mt.varlen_attention(q, k, v, cu, cu, L, L, **kw)
            got = grads(out, (q, k, v), dout)
            ref = mt.scaled_dot_product_attention(dense(q), dense(k), dense(v), enable_gqa=True,
                                                  **kw)
            want = grads(ref, (q, k, v), dense(dout))
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert torch.equal(out, ref.transpose(1, 2).reshape(S * L, Hq, D)), "out"
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.equal(g, w), name


@needs_cuda
@pytest.mark.parametrize("backend", FUSED)
def test_cuda_graph_replays_draw_fresh_masks(backend):
    # Forward + backward with dropout captured once (check_offsets=True is skipped inside the
    # capture), replayed: a fresh rng_state each replay, and each replay's results are those of
    # its own mask.
    require_backend(backend)
    lens, Hq, Hkv, D, p = [96, 33, 0, 130], 4, 2, 64, 0.25
    dtype = torch.bfloat16
    q, k, v, cu, _ = packed_inputs(lens, lens, Hq, Hkv, D, D, dtype, "cuda", 31)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(32)).to("cuda", dtype)

    def step():
        with mt.use_backends(backend):
            out, state = mt.varlen_attention(q, k, v, cu, cu, max(lens), max(lens), dropout_p=p,
                                             causal=True, return_rng_state=True,
                                             check_offsets=True)
            return (out, state) + grads(out, (q, k, v), dout)

    graph, static = capture_graph(step)
    keep_scale = mt.dropout_threshold(p).keep_scale

    def check(what, out, grads, keep):
        assert_output_and_grads_close(
            out, grads, (q, k, v), dout,
            lambda q, k, v: per_sequence_reference(q, k, v, lens, lens, "top_left", keep,
                                                   keep_scale),
            dtype, QKV, what)

    check_replays(graph, static,
                  lambda state: mt.dropout_mask((len(lens), Hq, max(lens), max(lens)), p, state),
                  check)


@needs_cuda
def test_cuda_offsets_on_another_device_are_named():
    lens = [3, 5]
    q, k, v, cu, _ = packed_inputs(lens, lens, 2, 2, 64, 64, torch.bfloat16, "cuda", 4,
                                   requires_grad=False)
    with pytest.raises(ValueError, match=r"argument `cu_seqlens_q`: expected it on cuda"):
        mt.varlen_attention(q, k, v, cu.cpu(), cu, 5, 5)
    with pytest.raises(ValueError, match=r"argument `cu_seqlens_k`: expected it on cpu"):
        mt.varlen_attention(q.cpu(), k.cpu(), v.cpu(), cu.cpu(), cu, 5, 5)
    # Unchecked bad offsets stay inside the tensors (no fault); checked ones are named.
    bad = torch.tensor([0, 7, 8], dtype=torch.int32, device="cuda")
    mt.varlen_attention(q, k, v, bad, cu, 5, 5)
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=r"argument `max_seqlen_q`"):
        mt.varlen_attention(q, k, v, bad, cu, 5, 5, check_offsets=True)
