# torch.compile(fullgraph=True) of a small attention module that calls memeff: it traces with no
# graph break (through the fake kernels and the registered autograd formula) and gives the same
# outputs and gradients as eager, with dropout too (the same seed draws the same mask).
import pytest

torch = pytest.importorskip("torch")
import memeff.torch as mt  # noqa: E402


class SelfAttention(torch.nn.Module):
    def __init__(self, width=64, heads=4, dropout_p=0.0):
        super().__init__()
        self.heads = heads
        self.dropout_p = dropout_p
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.mask = torch.nn.Parameter(torch.zeros(1, heads, 1, 24))  # a learned key bias

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = mt.scaled_dot_product_attention(q, k, v, attn_mask=self.mask,
                                            dropout_p=self.dropout_p, causal="bottom_right")
        return self.proj(a.transpose(1, 2).reshape(batch, length, width))


# aot_eager: the same tracing without code generation; inductor: torch.compile's default (C++ on
# the CPU, Triton on CUDA), where memeff's op runs between generated kernels.
@pytest.mark.parametrize("dropout_p", [0.0, 0.2])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_equals_eager(device, backend, dropout_p):
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = SelfAttention(dropout_p=dropout_p).to(device)
    compiled = torch.compile(module, fullgraph=True, backend=backend)
    x = torch.randn(2, 24, 64, device=device)

    def run(fn):
        torch.manual_seed(123)
        y = fn(x)
        grads = torch.autograd.grad(y.square().sum(), list(module.parameters()))
        return y, grads

    y_eager, g_eager = run(module)
    y_comp, g_comp = run(compiled)
    torch.testing.assert_close(y_comp, y_eager, rtol=1e-4, atol=1e-5)
    for (name, _), a, b in zip(module.named_parameters(), g_comp, g_eager):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"gradient of {name}")
    if dropout_p > 0:  # a different seed gives a different mask under compile as well
        torch.manual_seed(124)
        assert not torch.allclose(compiled(x), y_eager)


def test_a_mask_constant_over_the_keys_compiles(device):
    # The row mask of a boolean mask broadcast over the keys (what transformers builds inside a
    # compiled model) traces with no graph break: the attention without a bias, then the rows.
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 32, 16, generator=gen).to(device).requires_grad_()
               for _ in range(3))

    def attend(q, k, v):
        rows = torch.arange(q.shape[2], device=q.device) % 4 != 3
        mask = rows.view(1, 1, -1, 1).expand(q.shape[0], 1, q.shape[2], k.shape[2])
        return mt.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    out = compiled(q, k, v)
    torch.testing.assert_close(out, attend(q, k, v))
    assert torch.all(out[:, :, 3::4] == 0)
    (gq,) = torch.autograd.grad(out.sum(), (q,))
    assert torch.all(gq[:, :, 3::4] == 0) and torch.any(gq != 0)
