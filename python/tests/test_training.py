# A small transformer (2 layers, attention dropout 0.1) trained on a synthetic copy task with
# memeff's attention and with torch's SDPA: both losses fall, and they end within noise of each
# other. On the GPU (a few seconds); on the CPU only with MEMEFF_SLOW_TESTS=1 (minutes).
import os
import statistics

import pytest

torch = pytest.importorskip("torch")
from memeff.tiny_transformer import memeff_attention, torch_attention, train  # noqa: E402


def test_training_matches_torch_sdpa(device):
    if device == "cpu" and os.environ.get("MEMEFF_SLOW_TESTS") != "1":
        pytest.skip("several minutes on the CPU; set MEMEFF_SLOW_TESTS=1")
    steps, window = 400, 40
    results = {}
    for name, attention in [("memeff", memeff_attention), ("torch", torch_attention)]:
        losses = train(attention, steps, device, seed=0, attn_dropout=0.1)
        first = statistics.mean(losses[:10])
        last = statistics.mean(losses[-window:])
        spread = statistics.stdev(losses[-window:])
        results[name] = (first, last, spread)
        print(f"{name}: loss {first:.3f} -> {last:.3f} (std {spread:.3f} over the last {window})")
        assert last < 0.3 * first, f"{name}: loss did not fall ({first:.3f} -> {last:.3f})"
    (_, m_last, m_spread), (_, t_last, t_spread) = results["memeff"], results["torch"]
    noise = 3 * (m_spread + t_spread) + 0.05
    assert abs(m_last - t_last) <= noise, (
        f"final losses differ beyond noise: memeff {m_last:.3f}, torch {t_last:.3f} "
        f"(allowed {noise:.3f})")
