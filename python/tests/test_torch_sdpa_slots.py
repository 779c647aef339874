# memeff inside torch's own scaled_dot_product_attention (memeff.torch.aten_sdpa): the registry
# entry and activate/restore toggling, the argument mapping, outputs in exactly the shapes, dtypes
# and strides of PyTorch's meta kernels, and results against torch's math path given memeff's
# dropout mask. On the CPU the kernels are registered for the CPU dispatch key (these aten ops
# have no CPU kernel of their own) and called as aten ops, so PyTorch's autograd formulas and
# torch.compile reach them as on a GPU; with CUDA the real thing runs:
# F.scaled_dot_product_attention eager (flash, efficient and cuDNN slots), under
# torch.compile(fullgraph=True), in a captured CUDA graph and under mode="reduce-overhead".
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
import memeff.torch as mt  # noqa: E402
from memeff.torch import aten_sdpa  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from attention_helpers import (assert_output_and_grads_close, capture_graph,  # noqa: E402
                               causal_keep, check_replays, seeded_generator)

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
REGISTRY = aten_sdpa._registry()
needs_registry = pytest.mark.skipif(REGISTRY is None,
                                    reason="this torch has no flash-attention registry")
aten = torch.ops.aten
pytestmark = pytest.mark.filterwarnings("ignore:Dropout mask should only be used")


@pytest.fixture
def cpu_kernels():
    handle = aten_sdpa.register_kernels(aten_sdpa.SLOTS, "CPU")
    yield handle
    handle.remove()


@pytest.fixture(params=["cpu", "cuda"])
def slot_device(request):
    """(device, dtype) with memeff's kernels in the slots for that device: on the CPU registered
    for the CPU key (fp32), on a GPU activated as a user would (bf16)."""
    if request.param == "cpu":
        handle = aten_sdpa.register_kernels(aten_sdpa.SLOTS, "CPU")
        yield "cpu", torch.float32
        handle.remove()
        return
    if not CUDA:
        pytest.skip("needs a CUDA device")
    mt.activate(slots=aten_sdpa.SLOTS)
    yield "cuda", torch.bfloat16
    mt.deactivate()


@pytest.fixture
def active():
    mt.activate(slots=aten_sdpa.SLOTS)
    yield
    mt.deactivate()


def assert_forward_and_backward_ran_memeff(calls, op):
    """explain_sdpa() recorded exactly aten::op and its backward, both run by memeff."""
    assert [(c.op, c.ran) for c in calls] == [(op, "memeff"), (op + "_backward", "memeff")], calls


def math_reference(causal, keep=None, p=0.0, scale=None, enable_gqa=False):
    """reference(q, k, v[, bias]) by torch's math SDPA, given memeff's keep mask: p_effective
    scales the kept values as memeff does (1/(1 - p_effective) = keep_scale)."""
    p_effective = mt.dropout_threshold(p).p_effective if keep is not None else 0.0

    def reference(q, k, v, attn_bias=None):
        mask, is_causal = attn_bias, causal == "top_left" and attn_bias is None
        if causal != "none" and not is_causal:
            allowed = causal_keep(q.shape[2], k.shape[2], causal, q.device)
            mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(
                allowed.logical_not(), float("-inf"))
            mask = mask if attn_bias is None else mask + attn_bias.to(q.dtype)
        elif mask is not None:
            mask = mask.to(q.dtype)
        out, _ = aten._scaled_dot_product_attention_math(
            q, k, v, mask, p_effective, is_causal, keep, scale=scale, enable_gqa=enable_gqa)
        return out
    return reference


def leaves(gen, device, dtype, *shapes):
    return [torch.randn(*s, generator=gen).to(device, dtype).requires_grad_() for s in shapes]


def described(t):
    return (tuple(t.shape), t.dtype, tuple(t.stride())) if isinstance(t, torch.Tensor) else t


def assert_like_meta(results, meta_results, what):
    """Each tensor output has the shape, dtype and strides (where a dimension has more than one
    element) of PyTorch's meta kernel's; other outputs are equal."""
    assert len(results) == len(meta_results), what
    for i, (r, m) in enumerate(zip(results, meta_results)):
        if not isinstance(m, torch.Tensor):
            assert r == m or (r is None and m is None), f"{what} output {i}: {r} != {m}"
            continue
        assert isinstance(r, torch.Tensor), f"{what} output {i}: {r!r}"
        assert (r.shape, r.dtype) == (m.shape, m.dtype), \
            f"{what} output {i}: {described(r)} != {described(m)}"
        assert aten_sdpa._same_layout(r, m.stride()), \
            f"{what} output {i}: strides {r.stride()} != {m.stride()}"


def to_meta(*tensors):
    return [None if t is None else
            torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
            for t in tensors]


# ---------------------------------------------------------------------------------------------
# Registration and toggling (CPU).

FLASH_OPS = [name for name in aten_sdpa._FLASH_KERNELS if aten_sdpa._has_aten_op(name)]


def cuda_kernel_names(ops):
    return {op: repr(torch.library.get_kernel(f"aten::{op}", "CUDA")) for op in ops
            if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "CUDA")}


@needs_registry
def test_import_registers_with_torch_without_activating():
    assert "memeff" in REGISTRY.list_flash_attention_impls()
    assert REGISTRY.current_flash_attention_impl() != "memeff"
    assert not aten_sdpa.is_active() and aten_sdpa.active_slots() == ()


@needs_registry
@pytest.mark.parametrize("route", ["registry", "memeff"])
def test_activate_and_restore_swap_the_cuda_kernels(route):
    if not hasattr(torch.library, "get_kernel"):
        pytest.skip("this torch has no torch.library.get_kernel")
    before = cuda_kernel_names(FLASH_OPS)
    assert before, "no CUDA kernels for the flash slot in this torch build"
    if route == "registry":
        REGISTRY.activate_flash_attention_impl("memeff")
    else:
        mt.activate()
    try:
        assert REGISTRY.current_flash_attention_impl() == "memeff"
        assert aten_sdpa.active_slots() == ("flash",)
        during = cuda_kernel_names(FLASH_OPS)
        for op in before:
            assert during[op] != before[op], f"{op} still runs PyTorch's kernel"
    finally:
        if route == "registry":
            REGISTRY.restore_flash_attention_impl()
        else:
            mt.deactivate()
    assert REGISTRY.current_flash_attention_impl() is None
    assert not aten_sdpa.is_active()
    assert cuda_kernel_names(FLASH_OPS) == before
    mt.deactivate()  # a second time is harmless


def test_activate_efficient_slot_and_bad_slot_names():
    efficient = [op for op in ("_scaled_dot_product_efficient_attention",
                               "_scaled_dot_product_efficient_attention_backward")
                 if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "CUDA")]
    before = cuda_kernel_names(efficient) if hasattr(torch.library, "get_kernel") else {}
    mt.activate(slots=("flash", "efficient"))
    try:
        assert aten_sdpa.active_slots() == ("flash", "efficient")
        if before:
            during = cuda_kernel_names(efficient)
            assert all(during[op] != before[op] for op in before)
    finally:
        mt.deactivate()
    assert not aten_sdpa.is_active()
    if before:
        assert cuda_kernel_names(efficient) == before
    with pytest.raises(ValueError, match="slots"):
        mt.activate(slots=("flash", "cudnn-ish"))
    assert not aten_sdpa.is_active()


def test_activate_without_a_registry(monkeypatch):
    """On a torch without the registry, activate() registers the kernels itself."""
    monkeypatch.setattr(aten_sdpa, "_registry", lambda: None)
    before = cuda_kernel_names(FLASH_OPS) if hasattr(torch.library, "get_kernel") else {}
    handle = mt.activate()
    try:
        assert aten_sdpa.is_active() and handle.ops and set(handle.ops) <= set(FLASH_OPS)
        if before:
            assert all(cuda_kernel_names(FLASH_OPS)[op] != before[op] for op in before)
    finally:
        mt.deactivate()
    assert not aten_sdpa.is_active() and not handle.active
    if before:
        assert cuda_kernel_names(FLASH_OPS) == before


@pytest.mark.parametrize("args, expected", [
    ((False,), ("none", "")),
    ((True,), ("bottom_right", "")),
    ((True, -1, 0), ("bottom_right", "")),
    ((False, None, 0), ("bottom_right", "")),
    ((True, 64, 0, 64), ("bottom_right", "")),      # a left window as long as the keys
    ((True, 8, 0, 64), (None, "a sliding window (window_size_left=8)")),
    ((False, -1, 4), (None, "a sliding window (window_size_right=4)")),
])
def test_flash_causal_mode(args, expected):
    assert aten_sdpa.flash_causal_mode(*args) == expected


def test_torch_layout_strides_is_empty_like_for_equal_shapes():
    base = torch.empty(2, 5, 3, 4, 8)
    views = [base[:, :, 0], base[:, :, 1].transpose(1, 2), base.permute(0, 3, 1, 2, 4)[:, :, :, 0],
             torch.empty(2, 3, 5, 8), torch.empty(2, 5, 3, 8).transpose(1, 2),
             torch.empty(1, 5, 1, 8).transpose(1, 2)]
    for view in views:
        strides = aten_sdpa.torch_layout_strides(view, view.shape)
        assert aten_sdpa._same_layout(torch.empty_like(view), strides), view.stride()


# ---------------------------------------------------------------------------------------------
# The flash slot's kernels on the CPU: layouts against PyTorch's meta kernels, results against
# torch's math path, PyTorch's autograd formula, torch.compile.

def dense_inputs(gen, device, dtype, layout, B, Hq, Hkv, Lq, Lk, D, Dv):
    """q, k, v [B, H, L, D] in one of several memory layouts, requiring grad."""
    if layout == "bhld":
        return leaves(gen, device, dtype, (B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, Dv))
    if layout == "blhd":
        q, k, v = leaves(gen, device, dtype, (B, Lq, Hq, D), (B, Lk, Hkv, D), (B, Lk, Hkv, Dv))
        return [t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    assert layout == "fused_qkv" and Hq == Hkv and Lq == Lk and D == Dv
    qkv = torch.randn(B, Lq, 3, Hq, D, generator=gen).to(device, dtype)
    return [qkv[:, :, i].transpose(1, 2).requires_grad_() for i in range(3)]


@pytest.mark.parametrize("layout", ["bhld", "blhd", "fused_qkv"])
@pytest.mark.parametrize("Dv", [32, 16])
def test_sdpa_flash_outputs_have_torch_layouts(slot_device, layout, Dv):
    if layout == "fused_qkv" and Dv != 32:
        pytest.skip("a fused projection has one head size")
    device, dtype = slot_device
    gen = seeded_generator(("layout", layout, Dv))
    q, k, v = dense_inputs(gen, device, dtype, layout, 2, 4, 4, 9, 9, 32, Dv)
    meta = aten._scaled_dot_product_flash_attention(*to_meta(q, k, v), 0.25, True, scale=0.3)
    if meta[0].shape[-1] != Dv:
        # This torch's flash slot takes one head size (its meta kernel shapes out by q), and
        # F.scaled_dot_product_attention sends it no other.
        pytest.skip("torch's flash slot takes one head size for q, k and v")
    results = aten._scaled_dot_product_flash_attention(q, k, v, 0.25, True, scale=0.3)
    assert_like_meta(results, meta, "_scaled_dot_product_flash_attention")
    out, lse, _, _, max_q, max_k, rng_state, unused, _ = results
    dout = torch.randn(out.shape, generator=gen).to(device, dtype)
    grads = aten._scaled_dot_product_flash_attention_backward(
        dout, q, k, v, out, lse, None, None, max_q, max_k, 0.25, True, rng_state, unused,
        scale=0.3)
    meta_grads = aten._scaled_dot_product_flash_attention_backward(
        *to_meta(dout, q, k, v, out, lse), None, None, max_q, max_k, 0.25, True,
        *to_meta(rng_state, unused), scale=0.3)
    assert_like_meta(grads, meta_grads, "_scaled_dot_product_flash_attention_backward")

    # The dense [B, L, H, D] form of the lower-level op.
    qt, kt, vt = (t.detach().transpose(1, 2) for t in (q, k, v))
    results = aten._flash_attention_forward(qt, kt, vt, None, None, 9, 9, 0.0, False, False)
    meta = aten._flash_attention_forward(*to_meta(qt, kt, vt), None, None, 9, 9, 0.0, False,
                                         False)
    assert_like_meta(results, meta, "_flash_attention_forward")


# (B, Hq, Hkv, Lq, Lk, D, causal, dropout_p)
FLASH_CASES = [
    (2, 4, 4, 33, 33, 32, False, 0.0),
    (1, 4, 4, 40, 40, 64, True, 0.0),
    (2, 4, 2, 17, 45, 32, False, 0.3),   # GQA
    (1, 6, 3, 30, 30, 16, True, 0.25),   # GQA + causal
]


@pytest.mark.parametrize("case", FLASH_CASES, ids=str)
def test_flash_slot_through_torch_autograd(slot_device, case):
    device, dtype = slot_device
    B, Hq, Hkv, Lq, Lk, D, causal, p = case
    gen = seeded_generator(case)
    q, k, v = leaves(gen, device, dtype, (B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D))
    dout = torch.randn(B, Hq, Lq, D, generator=gen).to(device, dtype)
    with mt.explain_sdpa() as calls:
        results = aten._scaled_dot_product_flash_attention(q, k, v, p, causal)
        out, rng_state = results[0], results[6]
        grads = torch.autograd.grad(out, (q, k, v), dout)  # PyTorch's formula: the aten backward
    assert [c.op for c in calls] == ["_scaled_dot_product_flash_attention",
                                     "_scaled_dot_product_flash_attention_backward"]
    assert all(c.ran == "memeff" and c.backend for c in calls), calls
    keep = None
    if p > 0:
        assert rng_state.dtype == torch.uint64 and rng_state.shape == (2,)
        assert torch.equal(mt.last_rng_state(), rng_state.view(torch.int64))
        keep = mt.dropout_mask((B, Hq, Lq, Lk), p, rng_state.view(torch.int64))
        assert 0 < keep.logical_not().sum() < keep.numel()
    assert_output_and_grads_close(out, grads, (q, k, v), dout,
                                  math_reference("bottom_right" if causal else "none", keep, p,
                                                 enable_gqa=Hq != Hkv),
                                  dtype, ("dq", "dk", "dv"))


def test_flash_debug_mask_on_cpu(cpu_kernels):
    """return_debug_mask: the probabilities, negative where dropped, padded to 128."""
    B, H, L, D, p = 1, 2, 20, 16, 0.4
    gen = seeded_generator("debug-mask")
    q, k, v = (torch.randn(B, H, L, D, generator=gen) for _ in range(3))
    results = aten._scaled_dot_product_flash_attention(q, k, v, p, True, True, scale=0.5)
    debug, state = results[8], results[6].view(torch.int64)
    assert debug.shape == (B, H, 128, 128) and debug.dtype == q.dtype
    assert not debug[:, :, L:].any() and not debug[:, :, :, L:].any()
    allowed = causal_keep(L, L, "bottom_right", "cpu")
    probs = torch.softmax((q @ k.transpose(-1, -2) * 0.5).masked_fill(~allowed, float("-inf")), -1)
    keep = mt.dropout_mask((B, H, L, L), p, state)
    torch.testing.assert_close(debug[:, :, :L, :L], torch.where(keep, probs, -probs))


@pytest.mark.parametrize("p", [0.0, 0.2])
def test_packed_flash_forward_and_backward(slot_device, p):
    """_flash_attention_forward/backward with cum_seq_q/k: each sequence as its own dense
    attention (bottom-right causal, FlashAttention's alignment), the dropout mask of sequence s
    being the padded batch's element s."""
    device, dtype = slot_device
    lengths_q, lengths_k, Hq, Hkv, D = [5, 1, 12], [7, 4, 12], 4, 2, 16
    gen = seeded_generator(("packed", p))
    q, k, v = leaves(gen, device, dtype, (sum(lengths_q), Hq, D),
                     (sum(lengths_k), Hkv, D), (sum(lengths_k), Hkv, D))
    offsets = [torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
               .to(device) for lengths in (lengths_q, lengths_k)]
    max_q, max_k = max(lengths_q), max(lengths_k)
    results = aten._flash_attention_forward(q, k, v, offsets[0], offsets[1], max_q, max_k, p,
                                            True, False, scale=0.2)
    meta = aten._flash_attention_forward(*to_meta(q, k, v, *offsets), max_q, max_k, p, True,
                                         False, scale=0.2)
    assert_like_meta(results, meta, "_flash_attention_forward (packed)")
    out, lse, rng_state, unused, _ = results
    dout = torch.randn(out.shape, generator=gen).to(device, dtype)
    dq, dk, dv = aten._flash_attention_backward(dout, q, k, v, out, lse, offsets[0], offsets[1],
                                                max_q, max_k, p, True, rng_state, unused,
                                                scale=0.2)
    keep_all = (mt.dropout_mask((3, Hq, max_q, max_k), p, rng_state.view(torch.int64))
                if p > 0 else None)
    for s in range(3):
        rows = slice(int(offsets[0][s]), int(offsets[0][s + 1]))
        keys = slice(int(offsets[1][s]), int(offsets[1][s + 1]))
        keep = None if keep_all is None else keep_all[s:s + 1, :, :lengths_q[s], :lengths_k[s]]
        dense = [t[idx].detach().transpose(0, 1).unsqueeze(0).requires_grad_()
                 for t, idx in ((q, rows), (k, keys), (v, keys))]
        grad = dout[rows].transpose(0, 1).unsqueeze(0)
        assert_output_and_grads_close(
            out[rows].transpose(0, 1).unsqueeze(0),
            [g[idx].transpose(0, 1).unsqueeze(0) for g, idx in ((dq, rows), (dk, keys),
                                                                 (dv, keys))],
            dense, grad, math_reference("bottom_right", keep, p, scale=0.2, enable_gqa=True),
            dtype, ("dq", "dk", "dv"), f"sequence {s} ")


def test_unsupported_flash_call_names_why(cpu_kernels):
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(NotImplementedError, match=r"sliding window \(window_size_left=2\)"):
        aten._flash_attention_forward(q, q, q, None, None, 8, 8, 0.0, True, False,
                                      window_size_left=2, window_size_right=0)


def test_unsupported_call_runs_the_kept_kernel():
    """The kernel memeff replaced (here a stand-in registered for the CPU key first) runs what
    memeff cannot, with the caller's arguments, and explain_sdpa says why."""
    if not hasattr(torch.library, "get_kernel"):
        pytest.skip("this torch has no torch.library.get_kernel")
    seen = []

    def stand_in(query, key, value, *args, **kwargs):
        seen.append((args, kwargs.get("window_size_left")))
        B, L, H, _ = query.shape
        return (query * 2, torch.zeros(B, H, L), torch.zeros(2, dtype=torch.uint64),
                torch.zeros((), dtype=torch.uint64), torch.empty(0))

    q = torch.randn(1, 8, 2, 16)
    with torch.library._scoped_library("aten", "IMPL") as lib:
        lib.impl("_flash_attention_forward", stand_in, "CPU")
        handle = aten_sdpa.register_kernels(("flash",), "CPU")
        try:
            with mt.explain_sdpa() as calls:
                out = aten._flash_attention_forward(q, q, q, None, None, 8, 8, 0.0, True, False,
                                                    window_size_left=2, window_size_right=0)[0]
                aten._flash_attention_forward(q, q, q, None, None, 8, 8, 0.0, True, False)
        finally:
            handle.remove()
    assert torch.equal(out, q * 2)
    assert seen == [((None, None, 8, 8, 0.0, True, False), 2)]
    assert [(c.ran, c.reason) for c in calls] == [
        ("pytorch", "a sliding window (window_size_left=2)"), ("memeff", "")]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("slot", ["flash", "efficient"])
def test_slots_under_torch_compile_on_cpu(cpu_kernels, backend, slot):
    """A fullgraph compile (AOTAutograd, so the backward is PyTorch's formula as traced; with
    inductor, which checks the strides of what the kernels return) calls the same kernels: with
    the same torch.manual_seed, the same mask and the same results."""
    gen = seeded_generator(("compile-cpu", slot))
    # One head size: some torch builds' flash meta kernel shapes out by q's.
    q, k, v = leaves(gen, "cpu", torch.float32, (2, 24, 4, 32), (2, 2, 24, 32), (2, 2, 24, 32))
    q = q.detach().transpose(1, 2).requires_grad_()  # [B, L, H, D] storage
    inputs = (q, k, v)
    if slot == "efficient":
        k, v = (torch.randn(2, 4, 24, 32, generator=gen).requires_grad_() for _ in range(2))
        bias = torch.randn(2, 1, 24, 24, generator=gen).requires_grad_()
        inputs = (q, k, v, bias)

    def attention(q, k, v, bias=None):
        if slot == "flash":
            return aten._scaled_dot_product_flash_attention(q, k, v, 0.3, True)[0] * 2
        return aten._scaled_dot_product_efficient_attention(
            q, k, v, bias.expand(2, 4, 24, 24), True, 0.2, False)[0] * 2

    def run(fn):
        torch.manual_seed(7)
        with mt.explain_sdpa() as calls:
            out = fn(*inputs)
            grads = torch.autograd.grad(out.square().sum(), inputs)
        assert [(c.op.endswith("_backward"), c.ran) for c in calls] == [
            (False, "memeff"), (True, "memeff")], calls
        return (out,) + grads

    torch._dynamo.reset()
    compiled = run(torch.compile(attention, fullgraph=True, backend=backend))
    for a, b in zip(compiled, run(attention)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# The efficient slot on the CPU.

@pytest.mark.parametrize("p", [0.0, 0.3])
def test_efficient_slot_with_bias_gradient_on_cpu(cpu_kernels, p):
    B, H, Lq, Lk, D = 2, 3, 19, 21, 16
    gen = seeded_generator(("efficient", p))
    q, k, v = leaves(gen, "cpu", torch.float32, (B, H, Lq, D), (B, H, Lk, D), (B, H, Lk, D))
    small = torch.randn(B, 1, 1, Lk, generator=gen).requires_grad_()
    bias = small.expand(B, H, Lq, Lk)  # as F.sdpa passes a broadcast mask
    results = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, p, True)
    meta = aten._scaled_dot_product_efficient_attention(*to_meta(q, k, v, bias), True, p, True)
    assert_like_meta(results, meta, "_scaled_dot_product_efficient_attention")
    out, lse, seed, offset = results
    dout = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad(out, (q, k, v, small), dout)
    keep = None
    if p > 0:
        keep = mt.dropout_mask((B, H, Lq, Lk), p, torch.stack([seed, offset]))
        filled = aten._fill_mem_eff_dropout_mask_(torch.empty(B, H, Lq, Lk), p, int(seed),
                                                  int(offset))
        assert torch.equal(filled > p, keep)
    reference = math_reference("top_left", keep, p)
    assert_output_and_grads_close(out, grads, (q, k, v, small), dout,
                                  lambda q, k, v, b: reference(q, k, v, b.expand(B, H, Lq, Lk)),
                                  torch.float32, ("dq", "dk", "dv", "dbias"))


@pytest.mark.parametrize("p", [0.0, 0.25])
def test_cudnn_slot_on_cpu(cpu_kernels, p):
    B, H, Lq, Lk, D = 2, 2, 24, 24, 16
    gen = seeded_generator(("cudnn", p))
    q, k, v = leaves(gen, "cpu", torch.float32, (B, H, Lq, D), (B, H, Lk, D), (B, H, Lk, D))
    bias = torch.randn(B, 1, Lq, Lk, generator=gen).expand(B, H, Lq, Lk)
    results = aten._scaled_dot_product_cudnn_attention(q, k, v, bias, True, p, True)
    meta = aten._scaled_dot_product_cudnn_attention(*to_meta(q, k, v, bias), True, p, True)
    assert_like_meta(results, meta, "_scaled_dot_product_cudnn_attention")
    out, seed, offset = results[0], results[6], results[7]
    dout = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    keep = mt.dropout_mask((B, H, Lq, Lk), p, torch.stack([seed, offset])) if p > 0 else None
    reference = math_reference("top_left", keep, p)
    assert_output_and_grads_close(out, grads, (q, k, v), dout,
                                  lambda q, k, v: reference(q, k, v, bias), torch.float32,
                                  ("dq", "dk", "dv"))


# ---------------------------------------------------------------------------------------------
# On a GPU: torch.nn.functional.scaled_dot_product_attention itself.

GPU_CASES = [  # (dtype, B, Hq, Hkv, L, D, causal, dropout_p)
    (torch.bfloat16, 2, 4, 4, 128, 64, False, 0.0),
    (torch.float16, 2, 4, 4, 97, 64, True, 0.0),
    (torch.bfloat16, 2, 8, 2, 130, 128, True, 0.2),
    (torch.float16, 1, 4, 1, 64, 64, False, 0.1),
]


def or_skip(fn, *args, **kwargs):
    """fn(...), or a skip where torch's dispatcher has no kernel for the call in the backends
    sdpa_kernel allows (that call never reaches memeff's slot)."""
    try:
        return fn(*args, **kwargs)
    except RuntimeError as error:
        if "No available kernel" in str(error):
            pytest.skip(f"torch's dispatcher gives this call no kernel of the slot: {error}")
        raise


def sdpa_step(q, k, v, dout, causal, p, backend=SDPBackend.FLASH_ATTENTION):
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal,
                                             enable_gqa=q.shape[1] != k.shape[1])
    state = mt.last_rng_state()
    return (out, state) + torch.autograd.grad(out, (q, k, v), dout)


@needs_cuda
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_sdpa_flash_slot_matches_math_on_gpu(active, case):
    dtype, B, Hq, Hkv, L, D, causal, p = case
    gen = seeded_generator(case)
    q, k, v = leaves(gen, "cuda", dtype, (B, Hq, L, D), (B, Hkv, L, D), (B, Hkv, L, D))
    dout = torch.randn(B, Hq, L, D, generator=gen).to("cuda", dtype)
    torch.manual_seed(11)
    with mt.explain_sdpa() as calls:
        out, state, *grads = or_skip(sdpa_step, q, k, v, dout, causal, p)
    assert_forward_and_backward_ran_memeff(calls, "_scaled_dot_product_flash_attention")
    keep = None
    if p > 0:
        keep = mt.dropout_mask((B, Hq, L, L), p, state)
        torch.manual_seed(11)  # torch.manual_seed decides the mask, as for PyTorch's kernels
        again = sdpa_step(q, k, v, dout, causal, p)
        assert torch.equal(again[1].cpu(), state.cpu()) and torch.equal(again[0], out)
    assert_output_and_grads_close(out, grads, (q, k, v), dout,
                                  math_reference("top_left" if causal else "none", keep, p,
                                                 enable_gqa=Hq != Hkv),
                                  dtype, ("dq", "dk", "dv"))


@needs_cuda
def test_restore_gives_the_flash_slot_back_on_gpu():
    q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16)
    mt.activate()
    mt.deactivate()
    with mt.explain_sdpa() as calls, sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        F.scaled_dot_product_attention(q, q, q)
    assert calls == []


@needs_cuda
def test_unsupported_call_runs_pytorchs_kernel_on_gpu(active):
    """A sliding window: PyTorch's own kernel runs it, and explain_sdpa says why."""
    B, L, H, D = 1, 96, 2, 64
    gen = seeded_generator("window")
    q, k, v = (torch.randn(B, L, H, D, generator=gen).to("cuda", torch.bfloat16)
               for _ in range(3))
    with mt.explain_sdpa() as calls:
        out = aten._flash_attention_forward(q, k, v, None, None, L, L, 0.0, True, False,
                                            window_size_left=8, window_size_right=0)[0]
    assert [(c.ran, c.reason) for c in calls] == [
        ("pytorch", "a sliding window (window_size_left=8)")]
    i = torch.arange(L, device="cuda")
    band = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - 8)
    bias = torch.zeros(L, L, device="cuda").masked_fill(~band, float("-inf"))
    expected = aten._scaled_dot_product_attention_math(
        *(t.transpose(1, 2).double() for t in (q, k, v)), bias.double())[0]
    torch.testing.assert_close(out.transpose(1, 2).double(), expected, atol=3e-2, rtol=3e-2)


@needs_cuda
@pytest.mark.parametrize("p", [0.0, 0.15])
def test_sdpa_under_torch_compile_fullgraph_on_gpu(active, p):
    B, H, L, D, dtype = 2, 4, 128, 64, torch.bfloat16
    gen = seeded_generator(("compile", p))
    q, k, v = leaves(gen, "cuda", dtype, (B, H, L, D), (B, H, L, D), (B, H, L, D))
    dout = torch.randn(B, H, L, D, generator=gen).to("cuda", dtype)

    @torch.compile(fullgraph=True)
    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)

    torch._dynamo.reset()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), mt.explain_sdpa() as calls:
        out = attention(q, k, v)
        state = mt.last_rng_state()
        grads = torch.autograd.grad(out, (q, k, v), dout)
    assert_forward_and_backward_ran_memeff(calls, "_scaled_dot_product_flash_attention")
    keep = mt.dropout_mask((B, H, L, L), p, state) if p > 0 else None
    assert_output_and_grads_close(out, grads, (q, k, v), dout,
                                  math_reference("top_left", keep, p), dtype, ("dq", "dk", "dv"))


@needs_cuda
def test_cuda_graph_replays_draw_fresh_masks_on_gpu(active):
    B, H, L, D, p, dtype = 2, 4, 96, 64, 0.25, torch.bfloat16
    gen = seeded_generator("graph")
    q, k, v = leaves(gen, "cuda", dtype, (B, H, L, D), (B, H, L, D), (B, H, L, D))
    dout = torch.randn(B, H, L, D, generator=gen).to("cuda", dtype)
    graph, static = capture_graph(lambda: sdpa_step(q, k, v, dout, True, p))

    def check(what, out, grads, keep):
        assert_output_and_grads_close(out, grads, (q, k, v), dout,
                                      math_reference("top_left", keep, p), dtype,
                                      ("dq", "dk", "dv"), what)

    check_replays(graph, static, lambda state: mt.dropout_mask((B, H, L, L), p, state), check)


@needs_cuda
def test_reduce_overhead_replays_draw_fresh_masks_on_gpu(active):
    """torch.compile(mode="reduce-overhead") of a training step: with v the identity, out is the
    dropped-out attention matrix itself (0 where dropped, P·keep_scale where kept), so each
    replay shows its mask; each replay's mask is new, and its backward used the same one
    (dv = outᵀ·dout)."""
    from torch._dynamo.utils import counters
    B, H, L, p, dtype = 1, 2, 64, 0.2, torch.float16
    gen = seeded_generator("reduce-overhead")
    q, k = ((0.5 * torch.randn(B, H, L, L, generator=gen)).to("cuda", dtype).requires_grad_()
            for _ in range(2))
    v = torch.eye(L).expand(B, H, L, L).to("cuda", dtype).contiguous().requires_grad_()
    dout = torch.randn(B, H, L, L, generator=gen).to("cuda", dtype)

    @torch.compile(mode="reduce-overhead", fullgraph=True)
    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p)

    torch._dynamo.reset()
    counters.clear()
    probs = torch.softmax((q.detach().double() @ k.detach().double().transpose(-1, -2)) / L ** 0.5,
                          dim=-1)
    keep_scale = mt.dropout_threshold(p).keep_scale
    masks = []
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for call in range(5):  # warm-up, capture, then replays
            out = attention(q, k, v)
            dv = torch.autograd.grad(out, v, dout)[0]
            out, dv = out.detach().clone(), dv.clone()
            keep = out != 0
            torch.testing.assert_close(out.double(), torch.where(keep, probs * keep_scale, 0.0),
                                       atol=2e-3, rtol=2e-2, msg=lambda m: f"call {call}: {m}")
            torch.testing.assert_close(dv.double(), out.double().transpose(-1, -2) @
                                       dout.double(), atol=3e-2, rtol=2e-2,
                                       msg=lambda m: f"call {call} (dv): {m}")
            masks.append(keep.cpu())
    assert counters["inductor"]["cudagraph_skips"] == 0, "torch.compile skipped CUDA graphs"
    for a in range(len(masks)):
        for b in range(a + 1, len(masks)):
            assert not torch.equal(masks[a], masks[b]), f"calls {a} and {b} reused a mask"


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_sdpa_efficient_slot_with_mask_gradient_on_gpu(active, dtype):
    B, H, Lq, Lk, D, p = 2, 4, 77, 100, 64, 0.1
    gen = seeded_generator(("efficient-gpu", dtype))
    q, k, v = leaves(gen, "cuda", dtype, (B, H, Lq, D), (B, H, Lk, D), (B, H, Lk, D))
    mask = torch.randn(B, 1, Lq, Lk, generator=gen).to("cuda", dtype).requires_grad_()
    dout = torch.randn(B, H, Lq, D, generator=gen).to("cuda", dtype)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION), mt.explain_sdpa() as calls:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        state = mt.last_rng_state()
        grads = torch.autograd.grad(out, (q, k, v, mask), dout)
    assert_forward_and_backward_ran_memeff(calls, "_scaled_dot_product_efficient_attention")
    keep = mt.dropout_mask((B, H, Lq, Lk), p, state)
    filled = aten._fill_mem_eff_dropout_mask_(
        torch.empty(B, H, Lq, Lk, device="cuda"), p, int(state[0]), int(state[1]))
    assert torch.equal(filled > p, keep)
    reference = math_reference("none", keep, p)
    assert_output_and_grads_close(out, grads, (q, k, v, mask), dout, reference, dtype,
                                  ("dq", "dk", "dv", "dmask"))


@needs_cuda
@pytest.mark.parametrize("p, masked", [(0.15, False), (0.0, True)], ids=["dropout", "mask"])
def test_sdpa_cudnn_slot_on_gpu(active, p, masked):
    B, H, L, D, dtype = 2, 4, 128, 64, torch.bfloat16
    gen = seeded_generator(("cudnn-gpu", p, masked))
    q, k, v = leaves(gen, "cuda", dtype, (B, H, L, D), (B, H, L, D), (B, H, L, D))
    mask = torch.randn(B, 1, L, L, generator=gen).to("cuda", dtype) if masked else None
    dout = torch.randn(B, H, L, D, generator=gen).to("cuda", dtype)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), mt.explain_sdpa() as calls:
        out = or_skip(F.scaled_dot_product_attention, q, k, v, attn_mask=mask, dropout_p=p,
                      is_causal=not masked)
        state = mt.last_rng_state()
        grads = torch.autograd.grad(out, (q, k, v), dout)
    assert_forward_and_backward_ran_memeff(calls, "_scaled_dot_product_cudnn_attention")
    keep = mt.dropout_mask((B, H, L, L), p, state) if p > 0 else None
    reference = math_reference("none" if masked else "top_left", keep, p)
    assert_output_and_grads_close(out, grads, (q, k, v), dout,
                                  lambda q, k, v: reference(q, k, v, mask), dtype,
                                  ("dq", "dk", "dv"))


# ---------------------------------------------------------------------------------------------
# The math slot: calls PyTorch's dispatcher sends to its math path (on the CPU registered for
# the CPU's autograd key; PyTorch's CPU dispatcher sends dropout calls there).


@pytest.fixture
def cpu_math_slot():
    handle = aten_sdpa.register_kernels(("math",), "CPU")
    yield handle
    handle.remove()


def math_slot_case(tag, p):
    gen = seeded_generator(("math-slot", tag, p))
    B, H, L, D = 2, 3, 40, 16
    q, k, v = leaves(gen, "cpu", torch.float32, (B, H, L, D), (B, H, L, D), (B, H, L, D))
    return q, k, v, torch.randn(B, H, L, D, generator=gen)


def test_math_slot_runs_memeff_where_pytorch_chose_math_on_cpu(cpu_math_slot):
    p = 0.25
    q, k, v, dout = math_slot_case("runs", p)
    assert int(torch._fused_sdp_choice(q, k, v, None, p, False)) == 0  # PyTorch's math path
    with mt.explain_sdpa() as calls:
        torch.manual_seed(5)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        state = mt.last_rng_state()
        grads = torch.autograd.grad(out, (q, k, v), dout)
    assert [(c.op, c.ran) for c in calls] == [("scaled_dot_product_attention", "memeff")]
    keep = mt.dropout_mask(tuple(q.shape[:3]) + (k.shape[2],), p, state)
    assert_output_and_grads_close(out, grads, (q, k, v), dout, math_reference("none", keep, p),
                                  torch.float32, ("dq", "dk", "dv"))


def test_math_slot_takes_a_boolean_mask_broadcast_over_keys_on_cpu(cpu_math_slot):
    # transformers' masks are boolean; under torch.compile they broadcast with a zero stride in
    # the key dimension, which no fused kernel of PyTorch takes.
    p = 0.25
    q, k, v, dout = math_slot_case("bool-mask", p)
    B, _, L, _ = q.shape
    rows = torch.arange(L) % 3 != 1  # every third query row sees no key: a zero output row
    mask = rows.view(1, 1, L, 1).expand(B, 1, L, L)
    assert mask.stride(-1) == 0 and int(torch._fused_sdp_choice(q, k, v, mask, p, False)) == 0
    with mt.explain_sdpa() as calls:
        torch.manual_seed(6)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        state = mt.last_rng_state()
        grads = torch.autograd.grad(out, (q, k, v), dout)
    assert [(c.op, c.ran) for c in calls] == [("scaled_dot_product_attention", "memeff")]
    assert torch.all(out[:, :, ~rows] == 0) and torch.all(out[:, :, rows] != 0)
    keep = mt.dropout_mask(tuple(q.shape[:3]) + (k.shape[2],), p, state)
    bias = torch.where(mask, 0.0, float("-inf"))
    assert_output_and_grads_close(out, grads, (q, k, v), dout,
                                  lambda q, k, v: math_reference("none", keep, p)(q, k, v, bias),
                                  torch.float32, ("dq", "dk", "dv"))


def test_math_slot_passes_fused_and_forced_math_calls_on(cpu_math_slot):
    q, k, v, dout = math_slot_case("passes", 0.0)
    # A call PyTorch's dispatcher gives a fused kernel goes on to it, unrecorded here.
    assert int(torch._fused_sdp_choice(q, k, v, None, 0.0, False)) != 0
    with mt.explain_sdpa() as calls:
        out = F.scaled_dot_product_attention(q, k, v)
    assert calls == []
    torch.testing.assert_close(out, math_reference("none")(q, k, v), rtol=1e-5, atol=1e-5)
    # The math path asked for by name is PyTorch's.
    with sdpa_kernel(SDPBackend.MATH), mt.explain_sdpa() as calls:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.2)
    assert [(c.op, c.ran) for c in calls] == [("scaled_dot_product_attention", "pytorch")]
    assert "all that is enabled" in calls[0].reason
    assert out.grad_fn is not None and "memeff" not in type(out.grad_fn).__name__.lower()
    # Inference mode skips the autograd key, and with it the slot: PyTorch's math path.
    with torch.inference_mode(), mt.explain_sdpa() as calls:
        F.scaled_dot_product_attention(q, k, v, dropout_p=0.2)
    assert calls == []


def test_math_slot_leaves_what_memeff_refuses_to_pytorch(cpu_math_slot):
    # A form memeff's op refuses (here 5-D inputs, and a mask memeff cannot broadcast) runs
    # PyTorch's math path, with the reason recorded, and PyTorch's own errors stay its own.
    gen = seeded_generator("math-slot-refused")
    q5 = torch.randn(2, 2, 3, 8, 16, generator=gen)
    with mt.explain_sdpa() as calls:
        out = F.scaled_dot_product_attention(q5, q5, q5, dropout_p=0.2)
    assert out.shape == q5.shape
    assert [(c.op, c.ran) for c in calls] == [("scaled_dot_product_attention", "pytorch")]
    q, k, v, _ = math_slot_case("refused", 0.2)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(40, 40), dropout_p=0.2,
                                       is_causal=True)


def test_math_slot_under_torch_compile_on_cpu(cpu_math_slot):
    # The compiled graph holds memeff's ops where PyTorch's math path would be; each seed draws
    # its own mask.
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    q, k, v, dout = math_slot_case("compile", 0.3)
    graphs = []

    def keep_graph(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.3),
                             backend=aot_autograd(fw_compiler=keep_graph, bw_compiler=keep_graph),
                             fullgraph=True)
    torch.manual_seed(9)
    out = compiled(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    torch.manual_seed(9)
    eager = mt.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    torch.testing.assert_close(out, eager)
    assert all(g is not None for g in grads)
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert "memeff.fwd.default" in targets and "memeff.bwd.default" in targets
    torch.manual_seed(10)
    assert not torch.allclose(compiled(q, k, v), out)


def test_math_slot_boolean_mask_compiles_afresh_and_after_eager_calls_on_cpu(cpu_math_slot):
    # A boolean mask becomes a bias through memeff's 0 and -inf values, which eager calls keep
    # per dtype. Under torch.compile the math slot's kernel runs in the trace's fake mode, and
    # each compile (Dynamo's fake run, then the backend's) has a mode of its own: a value kept
    # from one trace failed the next ("Mixing fake modes NYI", bench_hf's slots_math step), one
    # kept from an eager call failed inside a trace. Every step here compiles afresh and matches
    # the eager call with the same seed; no tensor of a trace is left as the latest rng_state.
    p = 0.25
    q, k, v, dout = math_slot_case("compile-bool-mask", p)
    B, _, L, _ = q.shape
    keep = torch.rand(B, 1, L, L, generator=seeded_generator("compile-bool-mask-keys")) > 0.3
    keep[..., 0] = True  # every query sees a key
    assert int(torch._fused_sdp_choice(q, k, v, keep, p, False)) == 0  # PyTorch's math path

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p)

    def run(fn):
        torch.manual_seed(11)
        out = fn(q, k, v)
        return out, torch.autograd.grad(out, (q, k, v), dout)

    def compiled_afresh():
        torch._dynamo.reset()
        return torch.compile(attend, backend="aot_eager", fullgraph=True)

    compiled = [run(compiled_afresh()) for _ in range(2)]
    eager = run(attend)
    compiled.append(run(compiled_afresh()))
    for i, (out, grads) in enumerate(compiled):
        torch.testing.assert_close(out, eager[0], msg=f"out of compile {i}")
        for name, g, e in zip(("dq", "dk", "dv"), grads, eager[1]):
            torch.testing.assert_close(g, e, msg=f"{name} of compile {i}")
    state = mt.last_rng_state()  # the eager call's
    assert type(state) is torch.Tensor, f"the latest rng_state is a {type(state).__name__}"


def test_compiled_attention_keeps_its_backward_after_the_math_slot_is_removed():
    # PyTorch's Python dispatcher caches, per op, where each dispatch key's call goes; a graph
    # traced after memeff's kernel left the composite op's autograd key must find PyTorch's
    # composite again, with its backward (it found the "not implemented" autograd fallback
    # before Handle.remove dropped that cache: no backward graph, and a warning at backward).
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    q, k, v, dout = math_slot_case("after-remove", 0.0)

    def traced(graphs):
        def keep_graph(gm, example_inputs):
            graphs.append(gm)
            return make_boxed_func(gm.forward)
        torch._dynamo.reset()
        return torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
                             backend=aot_autograd(fw_compiler=keep_graph, bw_compiler=keep_graph),
                             fullgraph=True)

    def targets(graphs):
        return {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}

    handle = aten_sdpa.register_kernels(("math",), "CPU")
    try:
        active = []
        torch.autograd.grad(traced(active)(q, k, v), (q, k, v), dout)
    finally:
        handle.remove()
    assert "memeff.bwd.default" in targets(active)
    after = []
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*autograd kernel was not registered.*")
        out = traced(after)(q, k, v)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    assert len(after) == 2  # a forward and a backward graph
    assert not any(t.startswith("memeff.") for t in targets(after))
    torch._dynamo.reset()
    expected = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v), (q, k, v), dout)
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e)


def test_math_slot_name_is_accepted_and_listed():
    handle = aten_sdpa.register_kernels(("math",), "CPU")
    assert handle.ops == ("scaled_dot_product_attention",)
    handle.remove()
    with pytest.raises(ValueError, match="'math'"):
        mt.activate(slots=("flash", "maths"))


@needs_cuda
def test_math_slot_takes_a_zero_stride_mask_on_gpu():
    # transformers' compiled masks broadcast with a zero stride in the key dimension: every fused
    # kernel of PyTorch refuses them, and its math path would run. With the math slot memeff does.
    B, H, L, D, dtype = 2, 4, 96, 64, torch.bfloat16
    gen = seeded_generator("math-slot-gpu")
    q, k, v = leaves(gen, "cuda", dtype, (B, H, L, D), (B, H, L, D), (B, H, L, D))
    dout = torch.randn(B, H, L, D, generator=gen).to("cuda", dtype)
    # Broadcast over the keys: their stride is 0.
    mask = torch.ones(B, 1, L, 1, dtype=torch.bool, device="cuda").expand(B, 1, L, L)
    assert int(torch._fused_sdp_choice(q, k, v, mask, 0.0, False)) == 0
    mt.activate(slots=("flash", "efficient", "cudnn", "math"))
    try:
        with mt.explain_sdpa() as calls:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            grads = torch.autograd.grad(out, (q, k, v), dout)
    finally:
        mt.deactivate()
    assert [(c.op, c.ran) for c in calls] == [("scaled_dot_product_attention", "memeff")]
    assert_output_and_grads_close(out, grads, (q, k, v, mask), dout, math_reference("none"), dtype,
                                  ("dq", "dk", "dv", "dmask"))
