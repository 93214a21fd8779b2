"""`gpt:`: a decoder-only transformer as pipeline layers: embed, block0..N-1, norm_head.

Pre-norm blocks (x + attn(ln(x)), x + mlp(ln(x))) with causal scaled-dot-product attention.
The embedding and the LM head are separate layers and not tied: tied weights would have to
live on two pipeline stages at once. With a large vocabulary they dominate the parameters.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from planner.models.bundle import ModelBundle

__all__ = ["Embed", "Block", "NormHead", "build_gpt"]


class Embed(nn.Module):
    """Token plus learned position embedding: (batch, seq) long -> (batch, seq, hidden)."""

    def __init__(self, vocab: int, seq: int, hidden: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(positions)


class Block(nn.Module):
    """One pre-norm transformer block: causal self-attention then an MLP, each residual."""

    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn * hidden)
        self.fc2 = nn.Linear(ffn * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class NormHead(nn.Module):
    """Final LayerNorm and the LM head: (batch, seq, hidden) -> logits (batch, seq, vocab)."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(x))


def _lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, -2), target.flatten())


def build_gpt(p: dict[str, Any], spec: str) -> ModelBundle:
    """Build from parsed parameters (see planner.models.spec.KEYS['gpt'])."""
    children: list[tuple[str, nn.Module]] = [("embed", Embed(p["vocab"], p["seq"], p["hidden"]))]
    children += [(f"block{i}", Block(p["hidden"], p["heads"], p["ffn"])) for i in range(p["layers"])]
    children.append(("norm_head", NormHead(p["hidden"], p["vocab"])))
    layers = nn.Sequential(OrderedDict(children))
    vocab, seq = p["vocab"], p["seq"]

    def make_batch(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Arithmetic sequences (start, stride per sample) mod vocab: random-looking tokens that
        # a model can learn to continue from context, so losses fall in demos and runs.
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (batch_size, 1), generator=g)
        stride = torch.randint(1, 8, (batch_size, 1), generator=g)
        tokens = (start + stride * torch.arange(seq + 1)) % vocab
        return tokens[:, :-1].clone(), tokens[:, 1:].clone()  # own storages, no shared slack

    return ModelBundle(spec=spec, layers=layers, make_batch=make_batch, loss_fn=_lm_loss, input_bytes_per_sample=8 * seq)
