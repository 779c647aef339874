# Outputs in their inputs' layout: out is laid out like q and dq/dk/dv like q/k/v (a [B, L, H, D]
# storage viewed as [B, H, L, D] gives [B, L, H, D]-strided results), the fake kernels report
# the strides the real ones produce (torch.library.opcheck: schema, fake tensors, autograd
# registration, AOT dispatch), and a small model's training step makes no more copies with memeff
# than with torch's flash backend.
import pytest

torch = pytest.importorskip("torch")
import memeff.torch as mt  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402


def blhd(B, H, L, D, device, dtype=torch.float32, requires_grad=False):
    """A [B, H, L, D] view of [B, L, H, D] storage (what a model's projection.view().transpose()
    passes)."""
    t = torch.randn(B, L, H, D, device=device, dtype=dtype).transpose(1, 2)
    return t.requires_grad_(requires_grad)


def blhd_strides(B, H, L, D):
    return (L * H * D, D, H * D, 1)


@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_outputs_and_gradients_take_the_inputs_layout(device, dropout_p):
    B, Hq, Hkv, Lq, Lk, D, Dv = 2, 4, 2, 9, 13, 16, 8
    q = blhd(B, Hq, Lq, D, device, requires_grad=True)
    k = blhd(B, Hkv, Lk, D, device, requires_grad=True)
    v = blhd(B, Hkv, Lk, Dv, device, requires_grad=True)
    out = mt.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, enable_gqa=True)
    assert out.shape == (B, Hq, Lq, Dv)
    assert out.stride() == blhd_strides(B, Hq, Lq, Dv), out.stride()
    assert out.transpose(1, 2).is_contiguous()
    dout = blhd(B, Hq, Lq, Dv, device)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    assert dq.stride() == q.stride() == blhd_strides(B, Hq, Lq, D)
    assert dk.stride() == k.stride() == blhd_strides(B, Hkv, Lk, D)
    assert dv.stride() == v.stride() == blhd_strides(B, Hkv, Lk, Dv)
    # The same numbers as with contiguous inputs (the layout is storage, not semantics).
    qc, kc, vc = (t.detach().contiguous().requires_grad_() for t in (q, k, v))
    state = mt.last_rng_state()
    ref = mt.scaled_dot_product_attention(qc, kc, vc, dropout_p=dropout_p, enable_gqa=True,
                                          rng_state=state)
    assert ref.is_contiguous()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for got, want in zip((dq, dk, dv), torch.autograd.grad(ref, (qc, kc, vc), dout)):
        assert want.is_contiguous()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_fused_qkv_views_get_dense_outputs_in_their_order(device):
    # q, k, v slices of one [B, L, 3, H, D] projection: not dense, so dq is the dense tensor with
    # q's dimension order ([B, L, H, D]), not q's strides.
    B, L, H, D = 2, 7, 3, 16
    qkv = torch.randn(B, L, 3, H, D, device=device, requires_grad=True)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    out = mt.scaled_dot_product_attention(q, k, v)
    assert out.stride() == blhd_strides(B, H, L, D)
    dq, = torch.autograd.grad(out.sum(), (q,))
    assert dq.stride() == blhd_strides(B, H, L, D)


def test_size_one_dimensions_and_plain_layouts(device):
    q = torch.randn(1, 1, 5, 8, device=device)
    assert mt.scaled_dot_product_attention(q, q, q).is_contiguous()
    x = blhd(1, 1, 5, 8, device)  # B = H = 1: any order is the same memory
    assert mt.scaled_dot_product_attention(x, x, x).is_contiguous()
    # [B, H, D, L]-stored q (last dimension strided) is copied; out is then laid out like q's
    # B, H, L order.
    odd = torch.randn(2, 3, 8, 5, device=device).transpose(2, 3)
    assert mt.scaled_dot_product_attention(odd, odd, odd).is_contiguous()


def _opcheck_args(device, bias, p):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 5, 4, 8, generator=gen).to(device).transpose(1, 2).requires_grad_()
    k = torch.randn(2, 6, 2, 8, generator=gen).to(device).transpose(1, 2).requires_grad_()
    v = torch.randn(2, 6, 2, 4, generator=gen).to(device).transpose(1, 2).requires_grad_()
    b = torch.randn(1, 4, 1, 6, generator=gen).to(device).requires_grad_() if bias else None
    state = torch.tensor([7, 9], dtype=torch.int64) if p > 0 else None
    return q, k, v, b, state


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("p", [0.0, 0.25])
def test_opcheck_forward(device, bias, p):
    # A given rng_state keeps the op deterministic, which opcheck's comparisons need.
    q, k, v, b, state = _opcheck_args(device, bias, p)
    torch.library.opcheck(torch.ops.memeff.fwd.default,
                          (q, k, v, b, state, p, "bottom_right", None, []))


def test_opcheck_backward(device):
    q, k, v, b, state = (t.detach() if t is not None else None
                         for t in _opcheck_args(device, True, 0.25))
    out, lse, _ = torch.ops.memeff.fwd(q, k, v, b, state, 0.25, "none", 0.3, [])
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.memeff.bwd.default,
                          (dout, q, k, v, b, out, lse, state, 0.25, "none", 0.3, True, []))


def test_fake_kernel_draws_on_the_cpu_like_the_real_one(device):
    from torch._subclasses.fake_tensor import FakeTensorMode
    q = blhd(1, 2, 3, 8, device)
    real = torch.ops.memeff.fwd(q, q, q, None, None, 0.5, "none", None, [])
    with FakeTensorMode() as mode:
        fq = mode.from_tensor(q)
        fake = torch.ops.memeff.fwd(fq, fq, fq, None, None, 0.5, "none", None, [])
    for r, f in zip(real, fake):
        assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype)
    assert real[2].device.type == fake[2].device.type == "cpu" and real[2].numel() == 2


class TinyEncoderLayer(torch.nn.Module):
    """Attention the way Hugging Face encoders write it: separate q/k/v projections viewed as
    [B, L, H, D] and transposed to heads, the output transposed back and reshaped."""

    def __init__(self, attention, dropout_p, width=64, heads=4):
        super().__init__()
        self.heads, self.attention, self.dropout_p = heads, attention, dropout_p
        self.q, self.k, self.v, self.o = (torch.nn.Linear(width, width) for _ in range(4))

    def forward(self, x):
        B, L, W = x.shape
        split = (B, L, self.heads, W // self.heads)
        q, k, v = (proj(x).view(split).transpose(1, 2) for proj in (self.q, self.k, self.v))
        a = self.attention(q, k, v, dropout_p=self.dropout_p)
        return self.o(a.transpose(1, 2).reshape(B, L, W))


def count_copies(device, attention, backend=None):
    torch.manual_seed(0)
    # torch's CUDA flash kernel takes 16-bit inputs only; its CPU one has no dropout.
    p, dtype = (0.1, torch.bfloat16) if device == "cuda" else (0.0, torch.float32)
    model = torch.nn.Sequential(TinyEncoderLayer(attention, p), TinyEncoderLayer(attention, p))
    model = model.to(device, dtype)
    x = torch.randn(2, 32, 64, device=device, dtype=dtype)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).square().mean().backward()

    guard = sdpa_kernel(backend) if backend is not None else None
    if guard is not None:
        guard.__enter__()
    try:
        step()  # warm-up
        with torch.profiler.profile() as prof:
            step()
    finally:
        if guard is not None:
            guard.__exit__(None, None, None)
    return sum(e.count for e in prof.key_averages() if e.key == "aten::copy_")


def no_copy_attention(q, k, v, dropout_p):
    """Not attention: an elementwise stand-in whose result and gradients keep the inputs'
    layout, so a step with it counts the copies the rest of the model makes."""
    return q + k + v


def test_a_training_step_copies_no_more_than_torch_flash(device):
    memeff_copies = count_copies(device, mt.scaled_dot_product_attention)
    flash_copies = count_copies(device, torch.nn.functional.scaled_dot_product_attention,
                                SDPBackend.FLASH_ATTENTION)
    rest = count_copies(device, no_copy_attention)
    print(f"aten::copy_ per training step: memeff {memeff_copies}, torch flash {flash_copies}, "
          f"the model without attention {rest}")
    assert memeff_copies <= flash_copies
    assert memeff_copies == rest, "copies around memeff's attention (out, dq, dk or dv)"
