# CUDA-graph capture of a memeff forward + backward with dropout, replayed: each replay draws a
# fresh mask from torch's CUDA generator (the seed/offset are resolved on the device when the
# graph runs), and each replay's backward uses the mask of its own forward.
import pytest

torch = pytest.importorskip("torch")
import memeff.torch as mt  # noqa: E402

from attention_helpers import (assert_output_and_grads_close, capture_graph,  # noqa: E402
                               check_replays, reference_attention)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_graph_replays_draw_fresh_masks_and_consistent_backward(dtype):
    B, H, Lq, Lk, D, p = 2, 4, 96, 80, 64, 0.25
    gen = torch.Generator().manual_seed(31)
    q = torch.randn(B, H, Lq, D, generator=gen).to("cuda", dtype).requires_grad_()
    k = torch.randn(B, H, Lk, D, generator=gen).to("cuda", dtype).requires_grad_()
    v = torch.randn(B, H, Lk, D, generator=gen).to("cuda", dtype).requires_grad_()
    dout = torch.randn(B, H, Lq, D, generator=gen).to("cuda", dtype)

    def step():
        out, state = mt.scaled_dot_product_attention(q, k, v, dropout_p=p, causal="bottom_right",
                                                     return_rng_state=True)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
        return out, state, dq, dk, dv

    graph, static = capture_graph(step)
    keep_scale = mt.dropout_threshold(p).keep_scale

    def check(what, out, grads, keep):
        assert_output_and_grads_close(
            out, grads, (q, k, v), dout,
            lambda q, k, v: reference_attention(q, k, v, causal="bottom_right", keep=keep,
                                                keep_scale=keep_scale),
            dtype, ("dq", "dk", "dv"), what)

    check_replays(graph, static, lambda state: mt.dropout_mask((B, H, Lq, Lk), p, state), check)
