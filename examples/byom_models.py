"""Small models of the kinds users bring, for `--model examples.byom_models:NAME` (docs/models.md).

Each is an ordinary PyTorch model that knows nothing of pplan: in-place ReLUs, BatchNorm,
Flatten, views that are not contiguous, residual adds across modules, tuple outputs, tied
weights, a layer called twice. tests/test_byom_*.py run them from profile to run.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

__all__ = ["mlp", "cnn", "residual", "vit", "tied_lm", "shared"]


def mlp(width: int = 256) -> nn.Sequential:
    """docs/models.md's example: `--model examples.byom_models:mlp --input-shape 784`."""
    return nn.Sequential(OrderedDict(
        fc0=nn.Sequential(nn.Linear(784, width), nn.ReLU()),
        fc1=nn.Sequential(nn.Linear(width, width), nn.ReLU()),
        head=nn.Linear(width, 10),
    ))


def cnn(width: int = 8, classes: int = 10) -> nn.Sequential:
    """A plain CNN: in-place ReLU, BatchNorm, pooling, Flatten (input 3,16,16)."""
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(inplace=True),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(2 * width * 16, 32), nn.ReLU(inplace=True), nn.Linear(32, classes),
    )


class _Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.conv = nn.Conv2d(width, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.act(self.bn(self.conv(x)))
        return h, h.mean(dim=(2, 3))  # a tuple between layers


class Residual(nn.Module):
    """Residual adds across modules (skip edges), a tuple output, an in-place ReLU, a view."""

    def __init__(self, width: int = 8, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.b1 = _Block(width)
        self.b2 = _Block(width)
        self.b3 = _Block(width)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.relu(self.stem(x))
        h, m1 = self.b1(s)
        h, _ = self.b2(h + s)
        h, _ = self.b3(h)
        h = h + s  # s skips over b2 and b3
        feat = torch.cat([self.pool(h).flatten(1), m1], dim=1)
        return self.head(feat)


def residual(width: int = 8, classes: int = 10) -> nn.Module:
    """`--model examples.byom_models:residual --input-shape 3,16,16` (traced with torch.fx)."""
    return Residual(width, classes)


class _Patches(nn.Module):
    def __init__(self, dim: int, patch: int, image: int):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, patch, stride=patch)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2, dim) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2) + self.pos


class _Head(nn.Module):
    def __init__(self, dim: int, classes: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(x).mean(1))


class _TransposedBlock(nn.Module):
    """An encoder block whose output is a non-contiguous view (sequence-first inside)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.block = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=False, norm_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x.transpose(0, 1)).transpose(0, 1)


def vit(dim: int = 32, heads: int = 4, depth: int = 3, patch: int = 4, image: int = 16, classes: int = 10) -> nn.Sequential:
    """A ViT as a Sequential of encoder blocks (`--input-shape 3,16,16`): non-contiguous tensors at cuts."""
    return nn.Sequential(OrderedDict(
        [("patches", _Patches(dim, patch, image))]
        + [(f"block{i}", _TransposedBlock(dim, heads)) for i in range(depth)]
        + [("head", _Head(dim, classes))]))


class _Embed(nn.Module):
    def __init__(self, emb: nn.Embedding):
        super().__init__()
        self.emb = emb

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.emb(x)


class _TiedHead(nn.Module):
    def __init__(self, emb: nn.Embedding):
        super().__init__()
        self.norm = nn.LayerNorm(emb.embedding_dim)
        self.emb = emb

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) @ self.emb.weight.t()


def tied_lm(vocab: int = 64, dim: int = 16) -> nn.Sequential:
    """Embedding and output projection share one weight (`--input-shape 8 --input-dtype long --vocab 64`)."""
    emb = nn.Embedding(vocab, dim)
    return nn.Sequential(OrderedDict(embed=_Embed(emb), mix=nn.Sequential(nn.Linear(dim, dim), nn.GELU()),
                                     head=_TiedHead(emb)))


class Shared(nn.Module):
    """One Linear called in two places: its weight is used twice in forward (layers `mix`, `mix@2`)."""

    def __init__(self, dim: int = 16, out: int = 4):
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.mix = nn.Linear(dim, dim)
        self.mid = nn.Sequential(nn.LayerNorm(dim), nn.GELU())
        self.head = nn.Linear(dim, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.mix(self.inp(x)))
        h = self.mid(h)
        h = self.mix(h) + h  # the same weight again, and a skip over it
        return self.head(h)


def shared(dim: int = 16, out: int = 4) -> nn.Module:
    """`--model examples.byom_models:shared --input-shape 16`: 5 layers, `mix` and `mix@2` share weights."""
    return Shared(dim, out)
