# memeff as a Hugging Face transformers attention implementation (memeff.torch.hf), on tiny
# random models: a BERT-style encoder with padding, Llama-style decoders with GQA, causal and
# padding masks (and Mistral's sliding window), outputs and gradients against transformers'
# "sdpa" implementation; attention dropout following the module's training mode; padding masks
# passed without a [B, H, Lq, Lk] bias; no copies around the attention in a training step;
# padding-free (packed) batches from DataCollatorWithFlattening through varlen_attention, against
# the same sequences one by one and, with dropout, against the padded batch; sliding windows
# (Mistral, without a mask from the second forward on) and softcapping (Gemma-2) against
# transformers' eager attention.
# Skipped where transformers is not importable.
import copy
from itertools import accumulate

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import memeff.torch as mt  # noqa: E402
import memeff.torch.hf as mhf  # noqa: E402
from attention_helpers import skip_if_the_kernels_refuse  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

mhf.register()

# Large initial weights, so that the attention visibly moves the outputs (with the default
# std of 0.02 it barely does, and any attention would pass).
INIT = 0.3


def bert_config(dropout=0.0):
    return transformers.BertConfig(vocab_size=97, hidden_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=128,
                                   max_position_embeddings=64, hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=dropout, initializer_range=INIT)


def llama_config(**extra):
    return transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, max_position_embeddings=64,
                                    initializer_range=INIT, **extra)


def mistral_config():
    return transformers.MistralConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=1, max_position_embeddings=64,
                                      sliding_window=5, initializer_range=INIT)


def pair(model_class, config, device):
    """The same random model with transformers' sdpa attention and with memeff's (each with its
    own copy of the config, where transformers records the implementation)."""
    models = []
    for implementation in ("sdpa", mhf.NAME):
        torch.manual_seed(0)
        model = model_class._from_config(copy.deepcopy(config), attn_implementation=implementation)
        assert model.config._attn_implementation == implementation
        models.append(model.to(device))
    return models


def inputs(device, batch=2, length=14, pad=None):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    if pad == "right":
        mask[1, length - 5:] = 0
    elif pad == "left":
        mask[1, :4] = 0
    return ids.to(device), mask.to(device)


def compare(reference, model, ids, mask, output):
    """Outputs and parameter gradients of the two models on the same batch."""
    results = []
    for m in (reference, model):
        m.zero_grad(set_to_none=True)
        y = getattr(m(input_ids=ids, attention_mask=mask), output)
        # Padded query rows see keys too, but only the real tokens matter to a model.
        y = y * mask.unsqueeze(-1).to(y.dtype)
        y.square().mean().backward()
        results.append((y.detach(), {n: p.grad for n, p in m.named_parameters()
                                     if p.grad is not None}))
    (y_ref, g_ref), (y, g) = results
    torch.testing.assert_close(y, y_ref, rtol=2e-4, atol=2e-4)
    assert g.keys() == g_ref.keys()
    for name in g_ref:
        torch.testing.assert_close(g[name], g_ref[name], rtol=2e-3, atol=2e-4,
                                   msg=lambda m, n=name: f"gradient of {n}: {m}")


@pytest.mark.parametrize("pad", [None, "right"])
def test_encoder_matches_sdpa(device, pad):
    reference, model = pair(transformers.BertModel, bert_config(), device)
    ids, mask = inputs(device, pad=pad)
    compare(reference, model, ids, mask, "last_hidden_state")


@pytest.mark.parametrize("pad", [None, "left", "right"])
def test_decoder_with_gqa_matches_sdpa(device, pad):
    reference, model = pair(transformers.LlamaForCausalLM, llama_config(), device)
    ids, mask = inputs(device, pad=pad)
    compare(reference, model, ids, mask, "logits")


def test_sliding_window_decoder_matches_sdpa(device):
    reference, model = pair(transformers.MistralForCausalLM, mistral_config(), device)
    ids, mask = inputs(device, length=12)
    compare(reference, model, ids, mask, "logits")


class Recorder:
    """Wraps memeff.torch.hf's call of scaled_dot_product_attention and records its arguments
    (and the bias memeff makes of the mask)."""

    def __init__(self, monkeypatch):
        self.calls, self.biases = [], []
        sdpa, bias_of_mask = mhf.scaled_dot_product_attention, mt._bias_of_mask

        def recording_sdpa(q, k, v, **kwargs):
            self.calls.append((q.shape, k.shape, kwargs))
            return sdpa(q, k, v, **kwargs)

        def recording_bias(*args):
            bias = bias_of_mask(*args)
            self.biases.append(bias)
            return bias

        monkeypatch.setattr(mhf, "scaled_dot_product_attention", recording_sdpa)
        monkeypatch.setattr(mt, "_bias_of_mask", recording_bias)


def test_dropout_follows_the_training_mode(device, monkeypatch):
    recorder = Recorder(monkeypatch)
    torch.manual_seed(0)
    model = transformers.BertModel._from_config(bert_config(dropout=0.25),
                                                attn_implementation=mhf.NAME).to(device)
    ids, mask = inputs(device)
    model.train()
    a = model(input_ids=ids, attention_mask=mask).last_hidden_state
    b = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert [c[2]["dropout_p"] for c in recorder.calls] == [0.25] * 4
    assert not torch.allclose(a, b), "training-mode calls drew the same dropout masks"
    recorder.calls.clear()
    model.eval()
    c = model(input_ids=ids, attention_mask=mask).last_hidden_state
    d = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert [call[2]["dropout_p"] for call in recorder.calls] == [0.0] * 4
    assert torch.equal(c, d)


def test_padding_masks_are_not_expanded_over_heads(device, monkeypatch):
    recorder = Recorder(monkeypatch)
    B, L = 2, 14
    _, encoder = pair(transformers.BertModel, bert_config(), device)
    ids, mask = inputs(device, pad="left")  # right padding runs as key lengths instead
    encoder(input_ids=ids, attention_mask=mask)
    # An encoder's padding mask reaches memeff as one row of keys per batch element.
    assert [tuple(b.shape) for b in recorder.biases] == [(B, 1, 1, L)] * 2
    assert all(c[2]["causal"] is None for c in recorder.calls)

    recorder.calls.clear()
    recorder.biases.clear()
    _, decoder = pair(transformers.LlamaForCausalLM, llama_config(), device)
    decoder(input_ids=ids)  # no padding: causal mode, no mask at all, GQA without repeats
    assert recorder.biases == [None, None]
    for q_shape, k_shape, kwargs in recorder.calls:
        assert kwargs["causal"] == "top_left" and kwargs["enable_gqa"]
        assert q_shape[1] == 4 and k_shape[1] == 2
    decoder(input_ids=ids, attention_mask=inputs(device, pad="left")[1])
    # Causal + padding: one [Lq, Lk] mask per batch element, shared by the heads.
    assert [tuple(b.shape) for b in recorder.biases[2:]] == [(B, 1, L, L)] * 2


def test_a_training_step_copies_no_more_than_torch_flash(device):
    ids, mask = inputs(device)

    def copies(implementation, backend=None):
        torch.manual_seed(0)
        model = transformers.BertModel._from_config(bert_config(),
                                                    attn_implementation=implementation)
        # torch's CUDA flash kernel takes 16-bit inputs only
        model = model.to(device, torch.bfloat16 if device == "cuda" else torch.float32).train()

        def step():
            model.zero_grad(set_to_none=True)
            model(input_ids=ids, attention_mask=mask).last_hidden_state.square().mean().backward()

        with sdpa_kernel(backend) if backend is not None else torch.enable_grad():
            step()
            with torch.profiler.profile() as prof:
                step()
        return sum(e.count for e in prof.key_averages() if e.key == "aten::copy_")

    memeff_copies = copies(mhf.NAME)
    flash_copies = copies("sdpa", SDPBackend.FLASH_ATTENTION)
    print(f"aten::copy_ per BERT training step: memeff {memeff_copies}, flash {flash_copies}")
    assert memeff_copies <= flash_copies


def test_unsupported_arguments_are_refused_by_name():
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(NotImplementedError, match="s_aux"):
        mhf.attention_forward(torch.nn.Module(), q, q, q, None, s_aux=torch.zeros(2))


# Sliding windows and softcapping against transformers' eager attention (which computes both
# from the mask and the scores). transformers' sliding_window W lets a query see its last W keys,
# its own included: memeff's window (W - 1, 0).

def eager_pair(model_class, config, device):
    """The same random model with transformers' eager attention and with memeff's."""
    models = []
    for implementation in ("eager", mhf.NAME):
        torch.manual_seed(0)
        models.append(model_class._from_config(copy.deepcopy(config),
                                               attn_implementation=implementation).to(device))
    return models


def windowed_calls(recorder):
    return [kwargs for _, _, kwargs in recorder.calls if "window_size" in kwargs]


def test_a_sliding_window_runs_without_a_mask_and_matches_eager(device, monkeypatch):
    reference, model = eager_pair(transformers.MistralForCausalLM, mistral_config(), device)
    ids, mask = inputs(device, length=12)
    recorder = Recorder(monkeypatch)
    # The first forward learns that Mistral's attention receives sliding_window (and runs
    # transformers' mask); from the second on, no mask is built: causal with window (4, 0).
    for step in range(2):
        recorder.calls.clear()
        skip_if_the_kernels_refuse(device, lambda: compare(reference, model, ids, mask, "logits"))
    windowed = windowed_calls(recorder)
    if not mhf._kernels_take_windows(device, torch.float32, model.config):
        # No CUDA kernel takes this model's window (fp32, head dim 16): transformers' mask is
        # built and read as a bias.
        assert windowed == []
        return
    assert len(windowed) == 2 and all(kw["window_size"] == (4, 0) and kw["attn_mask"] is None
                                      and kw["causal"] == "top_left" for kw in windowed)


def gemma2_config(softcap):
    return transformers.Gemma2Config(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        sliding_window=5, query_pre_attn_scalar=4, attn_logit_softcapping=softcap,
        final_logit_softcapping=None, initializer_range=INIT)


def test_softcap_and_windows_of_a_gemma2_model_match_eager(device, monkeypatch):
    # Gemma-2: softcapped scores, sliding-window and full layers taking turns.
    reference, model = eager_pair(transformers.Gemma2ForCausalLM, gemma2_config(1.0), device)
    ids, mask = inputs(device, length=12)
    recorder = Recorder(monkeypatch)
    for step in range(2):
        recorder.calls.clear()
        skip_if_the_kernels_refuse(device, lambda: compare(reference, model, ids, mask, "logits"))
    assert all(kw["softcap"] == 1.0 for _, _, kw in recorder.calls)
    # The sliding-window layer goes without a mask where a kernel takes its window (the CPU);
    # on a GPU this fp32 model keeps transformers' mask, read as a bias by cuda_math, which also
    # runs the cap.
    take = mhf._kernels_take_windows(device, torch.float32, model.config)
    assert [kw["window_size"] for kw in windowed_calls(recorder)] == ([(4, 0)] if take else [])


def test_masks_of_models_not_passing_their_window_are_kept():
    # A model that builds a sliding-window mask but does not pass sliding_window to its
    # attention (transformers has some) keeps transformers' mask: nothing records its config.
    from transformers import masking_utils as mu
    config = mistral_config()
    request = dict(batch_size=1, q_length=8, kv_length=8, q_offset=0, kv_offset=0,
                   attention_mask=None, local_size=3, allow_is_causal_skip=True, device="cpu",
                   mask_function=mu.sliding_window_causal_mask_function(3), config=config)
    assert not mhf._window_without_mask(request)
    mhf._causal_window(type("Attention", (), {"config": config})(), None, None, True,
                       {"sliding_window": 3})
    assert mhf._window_without_mask(request)
    # Not for a GPU call no kernel takes (fp32 here): there the mask is built.
    assert not mhf._window_without_mask(dict(request, device="cuda", dtype=torch.float32))
    for other in (dict(local_size=4), dict(q_offset=2), dict(kv_offset=1),
                  dict(allow_is_causal_skip=False),
                  dict(mask_function=mu.sliding_window_causal_mask_function(4)),
                  dict(mask_function=mu.causal_mask_function)):
        assert not mhf._window_without_mask(dict(request, **other)), other


def _hopper_kernels_present():
    return (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
            and "cuda_sm90" in mt.backend_names())


@pytest.mark.skipif(not _hopper_kernels_present(), reason="needs cuda_sm90 on a Hopper GPU")
def test_a_bf16_sliding_window_model_runs_its_window_in_the_hopper_kernels(monkeypatch):
    # Head dim 64 in bf16: from the second forward on, the window goes to cuda_sm90 with no mask;
    # logits and gradients agree with transformers' sdpa attention reading the window's mask.
    config = transformers.MistralConfig(vocab_size=97, hidden_size=256, intermediate_size=256,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=128,
                                        sliding_window=24, initializer_range=0.05)
    reference, model = (m.to(torch.bfloat16) for m in pair(transformers.MistralForCausalLM,
                                                           config, "cuda"))
    ids, mask = inputs("cuda", length=100)
    recorder = Recorder(monkeypatch)
    for step in range(2):
        recorder.calls.clear()
        results = []
        for m in (reference, model):
            m.zero_grad(set_to_none=True)
            y = m(input_ids=ids, attention_mask=mask).logits
            y.float().square().mean().backward()
            results.append((y.detach().float(), {n: p.grad.float()
                                                 for n, p in m.named_parameters()
                                                 if p.grad is not None}))
        (y_ref, g_ref), (y, g) = results
        scale = y_ref.abs().max().item()
        torch.testing.assert_close(y, y_ref, rtol=0.0, atol=3e-2 * scale)
        assert g.keys() == g_ref.keys()
        for name in g_ref:
            torch.testing.assert_close(g[name], g_ref[name], rtol=0.0,
                                       atol=5e-2 * g_ref[name].abs().max().item(),
                                       msg=lambda m, n=name: f"gradient of {n}: {m}")
    windowed = windowed_calls(recorder)
    assert len(windowed) == 2 and all(kw["window_size"] == (23, 0) and kw["attn_mask"] is None
                                      and kw["causal"] == "top_left" for kw in windowed)
    assert mt.last_backends() == ("cuda_sm90", "cuda_sm90")


def test_gpu_windows_go_without_a_mask_only_where_the_fused_kernels_take_them(monkeypatch):
    # The fused kernels run windows for fp16/bf16 at head dims that are multiples of 8 up to 256
    # on compute capability 8.0 and newer; every other GPU call keeps transformers' mask. (The
    # device is faked: no GPU is touched.)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(mt, "backend_names", lambda: ["reference", "cpu", "cuda_sm90", "cuda"])
    config = transformers.MistralConfig(hidden_size=512, num_attention_heads=8)  # head dim 64
    take = mhf._kernels_take_windows
    assert take("cuda", torch.bfloat16, config) and take("cuda:0", torch.float16, config)
    assert not take("cuda", torch.float32, config)
    assert not take("cuda", torch.bfloat16, None)
    for head_dim in (16, 96, 128, 256):
        assert take("cuda", torch.bfloat16, transformers.MistralConfig(head_dim=head_dim))
    for head_dim in (12, 100, 264, 512):  # not a multiple of 8, or above 256
        assert not take("cuda", torch.bfloat16, transformers.MistralConfig(head_dim=head_dim))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert take("cuda", torch.bfloat16, config)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert not take("cuda", torch.bfloat16, config)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(mt, "backend_names", lambda: ["reference", "cpu"])
    assert not take("cuda", torch.bfloat16, config)
    assert take("cpu", None, None)


# Padding-free batches ---------------------------------------------------------------------------

LENGTHS = [5, 11, 1, 8]


def packed_batch(device, flash_kwargs, lengths=LENGTHS):
    """The sequences and their padding-free batch as DataCollatorWithFlattening makes it:
    input_ids and position_ids [1, T] (positions restarting at 0), and with flash_kwargs the
    cu_seq_lens_q/k and max_length_q/k keyword arguments too."""
    gen = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 97, (n,), generator=gen) for n in lengths]
    collator = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs)
    batch = collator([{"input_ids": s.tolist()} for s in seqs])
    del batch["labels"]
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return [s.to(device) for s in seqs], batch


def memeff_model(config, device, model_class=None):
    # On CUDA in bf16: memeff's fused kernels take 16-bit inputs (fp32 packed calls have no
    # CUDA backend).
    torch.manual_seed(0)
    model_class = model_class or transformers.LlamaForCausalLM
    model = model_class._from_config(config, attn_implementation=mhf.NAME)
    return model.to(device, torch.float32 if device == "cpu" else torch.bfloat16)


class AttentionCalls:
    """Counts memeff.torch.hf's calls of the dense and the packed attention."""

    def __init__(self, monkeypatch):
        self.dense = self.packed = 0
        sdpa, varlen = mhf.scaled_dot_product_attention, mhf.varlen_attention

        def dense(*args, **kwargs):
            self.dense += 1
            return sdpa(*args, **kwargs)

        def packed(*args, **kwargs):
            self.packed += 1
            return varlen(*args, **kwargs)

        monkeypatch.setattr(mhf, "scaled_dot_product_attention", dense)
        monkeypatch.setattr(mhf, "varlen_attention", packed)


def _gradient_scale(name, gradients):
    """What a parameter's gradient error is measured against: its own norm, except for the key
    projection's bias. That bias adds one amount to every score of a query's row, which the
    softmax ignores, so its gradient is zero but for rounding (in bf16 on a GPU, rounding of
    either run); it is measured against the gradient of the same layer's query bias."""
    if name.endswith("key.bias"):
        name = name[: -len("key.bias")] + "query.bias"
    return gradients[name].double().norm().clamp_min(1e-12)


def assert_same_training_signal(results, device):
    """(logits per sequence, parameter gradients) of two runs agree."""
    (y_ref, g_ref), (y, g) = results
    tol = dict(rtol=2e-4, atol=2e-4) if device == "cpu" else dict(rtol=3e-2, atol=3e-2)
    for s, (a, b) in enumerate(zip(y, y_ref)):
        torch.testing.assert_close(a, b, **tol, msg=lambda m, s=s: f"logits of sequence {s}: {m}")
    assert g.keys() == g_ref.keys()
    for name in g_ref:
        a, b = g[name].double(), g_ref[name].double()
        error = ((a - b).norm() / _gradient_scale(name, g_ref)).item()
        assert error < (1e-4 if device == "cpu" else 3e-2), f"gradient of {name}: {error:.3g}"


def step(model, run):
    """Logits per sequence and parameter gradients of the loss mean(logits²) per sequence."""
    model.zero_grad(set_to_none=True)
    logits = run(model)
    sum(y.float().square().mean() for y in logits).backward()
    return ([y.detach() for y in logits],
            {n: p.grad for n, p in model.named_parameters() if p.grad is not None})


@pytest.mark.parametrize("route", ["position_ids", "flash_kwargs"])
def test_padding_free_batch_matches_the_sequences_one_by_one(device, route, monkeypatch):
    model = memeff_model(llama_config(), device)
    seqs, batch = packed_batch(device, flash_kwargs=route == "flash_kwargs")
    cu = [0] + list(accumulate(LENGTHS))
    calls = AttentionCalls(monkeypatch)

    def one_by_one(m):
        return [m(input_ids=s[None], use_cache=False).logits[0] for s in seqs]

    def packed(m):
        logits = m(**batch, use_cache=False).logits[0]
        return [logits[a:b] for a, b in zip(cu[:-1], cu[1:])]

    reference = step(model, one_by_one)
    assert (calls.dense, calls.packed) == (2 * len(seqs), 0)
    result = step(model, packed)
    # One packed call per layer, and no dense call (no [T, T] mask either: the dense path is
    # where a mask would go).
    assert (calls.dense, calls.packed) == (2 * len(seqs), 2)
    assert_same_training_signal([reference, result], device)


def test_padding_free_dropout_matches_the_padded_batch(device):
    # With dropout the packed batch draws the padded batch's mask (sequence s is batch element
    # s), so the same seed gives the same training step as the right-padded batch.
    model = memeff_model(llama_config(attention_dropout=0.25), device).train()
    seqs, batch = packed_batch(device, flash_kwargs=False)
    L = max(LENGTHS)
    ids = torch.zeros(len(seqs), L, dtype=torch.long, device=device)
    mask = torch.zeros(len(seqs), L, dtype=torch.long, device=device)
    for s, x in enumerate(seqs):
        ids[s, :len(x)], mask[s, :len(x)] = x, 1
    cu = [0] + list(accumulate(LENGTHS))

    def padded(m):
        torch.manual_seed(7)
        logits = m(input_ids=ids, attention_mask=mask, use_cache=False).logits
        return [logits[s, :n] for s, n in enumerate(LENGTHS)]

    def packed(m):
        torch.manual_seed(7)
        logits = m(**batch, use_cache=False).logits[0]
        return [logits[a:b] for a, b in zip(cu[:-1], cu[1:])]

    reference = step(model, padded)
    assert_same_training_signal([reference, step(model, packed)], device)
    # ... and another seed another mask.
    torch.manual_seed(8)
    other = model(**batch, use_cache=False).logits[0, :cu[1]]
    assert not torch.allclose(other.float(), reference[0][0].float())


def test_a_windowed_packed_batch_keeps_its_mask(monkeypatch):
    # Mistral's sliding window is more than varlen_attention computes: the mask transformers
    # builds (window and sequences) goes to the dense path, which is as correct.
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM._from_config(mistral_config(),
                                                         attn_implementation=mhf.NAME)
    seqs, batch = packed_batch("cpu", flash_kwargs=False)
    cu = [0] + list(accumulate(LENGTHS))
    calls = AttentionCalls(monkeypatch)
    with torch.no_grad():
        packed = model(**batch, use_cache=False).logits[0]
        for s, x in enumerate(seqs):
            alone = model(input_ids=x[None], use_cache=False).logits[0]
            torch.testing.assert_close(packed[cu[s]:cu[s + 1]], alone, rtol=2e-4, atol=2e-4)
    assert calls.packed == 0


def test_plain_packed_masks_are_recognized():
    from transformers import masking_utils as mu
    positions = torch.tensor([[0, 1, 2, 0, 1]])
    segments = mu.find_packed_sequence_indices(positions)
    packed = mu.packed_sequence_mask_function(segments)
    remap = getattr(mu, "remap_positions_for_packed_sequence", lambda f, p: f)
    for pattern in (mu.causal_mask_function, mu.bidirectional_mask_function):
        assert mhf._is_plain_packed(mu.and_masks(remap(pattern, positions), packed))
    assert not mhf._is_plain_packed(mu.causal_mask_function)
    assert not mhf._is_plain_packed(mu.and_masks(mu.sliding_window_causal_mask_function(3),
                                                 packed))
    assert not mhf._is_plain_packed(
        mu.and_masks(mu.or_masks(mu.causal_mask_function, lambda b, h, q, kv: q == kv), packed))


@pytest.mark.parametrize("compiling", [False, True])
def test_plain_patterns_without_padding_need_no_mask(monkeypatch, compiling):
    # A causal (as many queries as keys, or one) or bidirectional pattern with no padding mask is
    # computed without a mask, decided from the request alone: also while torch.compile traces,
    # where transformers' own sdpa masks (before torch 2.14) materialize the pattern.
    from transformers import masking_utils as mu
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    base = dict(batch_size=2, q_length=8, kv_length=8, q_offset=0, kv_offset=0,
                attention_mask=None, local_size=None, device="cpu")
    causal = dict(base, mask_function=mu.causal_mask_function, allow_is_causal_skip=True)
    bidirectional = dict(base, mask_function=mu.bidirectional_mask_function,
                         allow_is_causal_skip=False, allow_is_bidirectional_skip=True)
    assert mhf.mask_function(**causal) is None
    assert mhf.mask_function(**dict(causal, q_length=1, kv_length=9)) is None
    assert mhf.mask_function(**bidirectional) is None
    assert mhf.mask_function(**dict(bidirectional, q_length=3)) is None
    padding = torch.ones(2, 8, dtype=torch.long)
    padding[1, 6:] = 0
    assert mhf.mask_function(**dict(causal, q_length=4)) is None  # a prefill into a longer cache
    kept = [dict(causal, q_length=4, q_offset=4),  # a chunk after a cache: needs the mask
            dict(causal, allow_is_causal_skip=False),
            dict(causal, mask_function=mu.sliding_window_causal_mask_function(3)),
            dict(causal, local_size=4),
            dict(causal, q_offset=torch.tensor(0)),  # a static cache's traced offset
            dict(causal, attention_mask=padding),
            dict(bidirectional, allow_is_bidirectional_skip=False)]
    for request in kept:  # left to transformers' rules (which may still skip it when eager)
        assert not mhf._no_mask_needed(request), request


def encoder_batch(device, lengths, length=12):
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 97, (len(lengths), length), generator=gen).to(device)
    mask = torch.zeros(len(lengths), length, dtype=torch.long, device=device)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    return ids, mask


def encoder_step(model, ids, mask, seed=5):
    """Hidden states (real tokens) and parameter gradients of a BERT step with dropout."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    y = model(input_ids=ids, attention_mask=mask).last_hidden_state
    y = y * mask.unsqueeze(-1).to(y.dtype)
    y.float().square().mean().backward()
    return [y.detach()], {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lengths", [(12, 7, 1), (5, 12, 0)])
def test_right_padded_encoder_runs_key_lengths(device, lengths, monkeypatch):
    # An encoder's right-padded batch runs as per-batch key lengths (varlen_attention over the
    # keys each entry sees, no bias), with the dense path's dropout mask: the same seed gives
    # the same step as the [B, 1, 1, Lk] bias, including an entry with no key at all.
    model = memeff_model(bert_config(dropout=0.25), device, transformers.BertModel).train()
    ids, mask = encoder_batch(device, lengths)
    calls = AttentionCalls(monkeypatch)
    result = encoder_step(model, ids, mask)
    assert (calls.dense, calls.packed) == (0, 2)
    monkeypatch.setattr(mhf, "_right_padding", lambda mask, key: None)  # the dense bias path
    reference = encoder_step(model, ids, mask)
    assert (calls.dense, calls.packed) == (2, 2)
    assert_same_training_signal([reference, result], device)


def test_other_key_padding_keeps_the_bias(device, monkeypatch):
    # Left padding, holes, or no padding at all: the dense path with the mask as a bias.
    model = memeff_model(bert_config(), device, transformers.BertModel)
    calls = AttentionCalls(monkeypatch)
    ids, mask = encoder_batch(device, (12, 9))
    left = mask.flip(1)
    holes = mask.clone()
    holes[0, 3] = 0
    for m in (left, holes):
        model(input_ids=ids, attention_mask=m)
    assert (calls.dense, calls.packed) == (4, 0)
    keep = torch.ones(2, 1, 1, 12, dtype=torch.bool, device=device)
    assert mhf._right_padding(keep, torch.zeros(2, 4, 12, 16, device=device)) is None


@pytest.mark.parametrize("model_class, config", [
    (transformers.BertModel, bert_config()),
    (transformers.LlamaForCausalLM, llama_config()),
], ids=["bert", "llama"])
def test_compiled_models_pass_no_mask(model_class, config):
    # Under torch.compile (one graph) a model without padding reaches memeff with no bias: the
    # encoder with none, the decoder in causal mode; and the outputs are eager's.
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = model_class._from_config(config, attn_implementation=mhf.NAME).eval()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(model, backend=backend, fullgraph=True)
    ids = inputs("cpu")[0]
    with torch.no_grad():
        out = compiled(input_ids=ids)
        ref = model(input_ids=ids)
    key = "last_hidden_state" if model_class is transformers.BertModel else "logits"
    torch.testing.assert_close(getattr(out, key), getattr(ref, key), rtol=1e-5, atol=1e-5)
    calls = [n for g in graphs for n in g.graph.nodes
             if n.op == "call_function" and "memeff" in str(n.target)]
    assert len(calls) == config.num_hidden_layers
    for node in calls:
        assert node.args[3] is None, node.format_node()  # no bias
        causal = "top_left" if model_class is transformers.LlamaForCausalLM else "none"
        assert causal in [a for a in node.args if isinstance(a, str)], node.format_node()


def test_right_padded_decoder_runs_key_lengths(device, monkeypatch):
    # A decoder's right-padded training batch runs as per-batch key lengths with top-left causal
    # (no [B, 1, L, L] mask), with the dense path's dropout mask: the same seed gives the same
    # step as the key-padding bias under causal mode.
    model = memeff_model(llama_config(attention_dropout=0.25), device).train()
    ids, mask = encoder_batch(device, (12, 7, 1))
    calls = AttentionCalls(monkeypatch)

    def run(m):
        torch.manual_seed(6)
        logits = m(input_ids=ids, attention_mask=mask, use_cache=False).logits
        return [logits[b, :n] for b, n in enumerate((12, 7, 1))]

    result = step(model, run)
    assert (calls.dense, calls.packed) == (0, 2)
    monkeypatch.setattr(mhf, "_right_padding", lambda mask, key: None)
    reference = step(model, run)
    assert (calls.dense, calls.packed) == (2, 2)
    assert_same_training_signal([reference, result], device)


def test_causal_right_padding_is_kept_as_rows_only_where_it_holds():
    from transformers import masking_utils as mu
    padding = torch.ones(2, 8, dtype=torch.long)
    padding[1, 5:] = 0
    request = dict(batch_size=2, q_length=8, kv_length=8, q_offset=0, kv_offset=0,
                   mask_function=mu.causal_mask_function, attention_mask=padding,
                   local_size=None, allow_is_causal_skip=True, device="cpu")
    rows = mhf.mask_function(**request)
    assert rows.shape == (2, 1, 1, 8) and mhf._is_causal_padding(rows)
    assert not mhf._is_causal_padding(rows.clone())  # only the object mask_function returned
    for other in (dict(request, attention_mask=padding.flip(1)),  # left padding
                  dict(request, q_length=4, q_offset=4),  # a chunk after a cache
                  dict(request, mask_function=mu.sliding_window_causal_mask_function(3))):
        mask = mhf.mask_function(**other)
        assert mask is None or not mhf._is_causal_padding(mask)
        assert mask is None or mask.shape[2] == other["q_length"]


def test_key_lengths_fall_back_to_the_dense_path_where_no_backend_takes_them(device, monkeypatch):
    # A packed call memeff has no backend for (fp32 on a GPU, say) runs the dense path with the
    # same mask: here every packed call is refused.
    def refused(*args, **kwargs):
        raise NotImplementedError("memeff: no backend for this packed call (test)")

    model = memeff_model(bert_config(), device, transformers.BertModel)
    ids, mask = encoder_batch(device, (12, 7))
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
        calls = AttentionCalls(monkeypatch)
        monkeypatch.setattr(mhf, "varlen_attention", refused)
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert calls.dense == 2
    keep = mask.unsqueeze(-1).to(out.dtype)
    tol = 1e-5 if device == "cpu" else 2e-2  # bf16 on a GPU: two kernels' rounding
    torch.testing.assert_close(out * keep, expected * keep, rtol=tol, atol=tol)
