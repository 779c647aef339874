"""A small causal transformer whose attention is pluggable (memeff or torch's SDPA), and a
synthetic copy task for it: the training test and bench_train.py use both, so that the same
model is what gets checked and what gets timed."""

import math
from typing import Callable, Optional

import torch
from torch import nn
from torch.nn import functional as F

AttentionFn = Callable[..., torch.Tensor]


def torch_attention(q, k, v, dropout_p=0.0, is_causal=False):
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal)


def memeff_attention(q, k, v, dropout_p=0.0, is_causal=False):
    from memeff.torch import scaled_dot_product_attention

    return scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal)


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, attn_dropout: float, attention: AttentionFn):
        super().__init__()
        self.heads = heads
        self.attn_dropout = attn_dropout
        self.attention = attention
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        qkv = self.qkv(self.norm1(x)).view(batch, length, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, L, D], strided views
        p = self.attn_dropout if self.training else 0.0
        a = self.attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, max_len: int,
                 attn_dropout: float, attention: AttentionFn):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(max_len, d_model) / math.sqrt(d_model))
        self.blocks = nn.ModuleList(
            [Block(d_model, heads, attn_dropout, attention) for _ in range(layers)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def copy_task_batch(batch: int, half: int, vocab: int, device, generator: torch.Generator):
    """Sequences [a_1..a_n, a_1..a_n]: the second half is predictable only by attending back
    n positions (an induction/copy head). Returns (inputs, targets) for next-token prediction,
    with the first half's targets ignored (-100)."""
    first = torch.randint(0, vocab, (batch, half), generator=generator, device="cpu")
    seq = torch.cat([first, first], dim=1).to(device)
    inputs, targets = seq[:, :-1], seq[:, 1:].clone()
    targets[:, : half - 1] = -100
    return inputs, targets


def train(attention: AttentionFn, steps: int, device, seed: int = 0, batch: int = 32,
          half: int = 16, vocab: int = 16, d_model: int = 64, heads: int = 4, layers: int = 2,
          attn_dropout: float = 0.1, lr: float = 3e-3,
          dtype: Optional[torch.dtype] = None) -> list:
    """Trains a fresh model (initialized from `seed`, data from its own generator) and returns
    the loss of every step. `dtype` runs the model under autocast in that dtype."""
    torch.manual_seed(seed)
    model = TinyTransformer(vocab, d_model, heads, layers, 2 * half, attn_dropout,
                            attention).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    data = torch.Generator().manual_seed(seed + 1)
    losses = []
    device_type = torch.device(device).type
    for _ in range(steps):
        inputs, targets = copy_task_batch(batch, half, vocab, device, data)
        with torch.autocast(device_type, dtype=dtype, enabled=dtype is not None):
            logits = model(inputs)
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1),
                               ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
