# CUDA-graph capture of a memeff forward + backward with dropout, replayed: each replay draws a
# fresh mask from torch's CUDA generator (the seed/offset are resolved on the device when the
# graph runs), and each replay's backward uses the mask of its own forward.
import pytest

torch = pytest.importorskip("torch")
import memeff.torch as mt  # noqa: E402

from attention_helpers import assert_close_to_reference, reference_attention  # noqa: E402

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

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture, as torch's docs advise
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()

    keep_scale = mt.dropout_threshold(p).keep_scale
    seen_states, seen_masks = [], []
    for replay in range(3):
        graph.replay()
        torch.cuda.synchronize()
        out, state, dq, dk, dv = (t.clone() for t in static)
        keep = mt.dropout_mask((B, H, Lq, Lk), p, state)
        inputs = [t.detach().double().requires_grad_() for t in (q, k, v)]
        ref = reference_attention(*inputs, causal="bottom_right", keep=keep, keep_scale=keep_scale)
        ref_grads = torch.autograd.grad(ref, inputs, dout.double())
        low = [t.detach().requires_grad_() for t in (q, k, v)]
        base = reference_attention(*low, causal="bottom_right", keep=keep, keep_scale=keep_scale)
        base_grads = torch.autograd.grad(base, low, dout)
        assert_close_to_reference(out, ref, base, dtype, f"replay {replay} out")
        for name, g, r, b in zip(["dq", "dk", "dv"], (dq, dk, dv), ref_grads, base_grads):
            assert_close_to_reference(g, r, b, dtype, f"replay {replay} {name}")
        seen_states.append(state.cpu())
        seen_masks.append(keep)
    for a in range(3):
        for b in range(a + 1, 3):
            assert not torch.equal(seen_states[a], seen_states[b]), "replays reused an rng state"
            assert not torch.equal(seen_masks[a], seen_masks[b]), "replays reused a mask"
