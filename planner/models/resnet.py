"""`resnet:`: a residual CNN as pipeline layers: stem, s<stage>b<block>..., pool_head.

Early layers work at full resolution with few channels (activation-heavy); each stage after
the first halves the resolution and doubles the channels, so late layers are parameter-heavy.
GroupNorm instead of BatchNorm: its statistics are per sample, so splitting a batch into
micro-batches computes exactly what one big batch would (BatchNorm would not, nor would its
running statistics agree between a pipeline and a single device).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from planner.models.bundle import ModelBundle

__all__ = ["ResBlock", "build_resnet"]


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(math.gcd(8, channels), channels)


class ResBlock(nn.Module):
    """conv-norm-relu-conv-norm plus a shortcut (1x1 conv when the shape changes), then ReLU."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _norm(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.norm2 = _norm(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), _norm(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


def _class_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels)


def build_resnet(p: dict[str, Any], spec: str) -> ModelBundle:
    """Build from parsed parameters (see planner.models.spec.KEYS['resnet'])."""
    width, image, channels, classes = p["width"], p["image"], p["channels"], p["classes"]
    children: list[tuple[str, nn.Module]] = [
        ("stem", nn.Sequential(nn.Conv2d(channels, width, 3, padding=1, bias=False), _norm(width), nn.ReLU())),
    ]
    c = width
    for s, n_blocks in enumerate(p["blocks"]):
        c_out = width * 2**s
        for b in range(n_blocks):
            children.append((f"s{s}b{b}", ResBlock(c, c_out, 2 if (s > 0 and b == 0) else 1)))
            c = c_out
    children.append(("pool_head", nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes))))
    layers = nn.Sequential(OrderedDict(children))
    # Each class adds its own fixed pattern to noise: a task the network can learn.
    patterns = torch.randn(classes, channels, image, image, generator=torch.Generator().manual_seed(1234))

    def make_batch(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        labels = torch.randint(0, classes, (batch_size,), generator=g)
        x = torch.randn(batch_size, channels, image, image, generator=g) + patterns[labels]
        return x, labels

    return ModelBundle(
        spec=spec, layers=layers, make_batch=make_batch, loss_fn=_class_loss,
        input_bytes_per_sample=4 * channels * image * image,
    )
