"""`mlp:`: a multilayer perceptron, one pipeline layer per Linear (+ReLU): fc0..fc{n-2}, head."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from planner.models.bundle import ModelBundle

__all__ = ["build_mlp"]


def _class_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels)


def build_mlp(p: dict[str, Any], spec: str) -> ModelBundle:
    """Build from parsed parameters (see planner.models.spec.KEYS['mlp'])."""
    n, hidden, n_in, classes = p["layers"], p["hidden"], p["input"], p["classes"]
    widths = [n_in] + [hidden] * (n - 1) + [classes]
    children: list[tuple[str, nn.Module]] = [
        (f"fc{i}", nn.Sequential(nn.Linear(widths[i], widths[i + 1]), nn.ReLU())) for i in range(n - 1)
    ]
    children.append(("head", nn.Linear(widths[-2], classes)))
    layers = nn.Sequential(OrderedDict(children))
    # A fixed random linear "teacher" labels the data, so the task is learnable.
    teacher = torch.randn(n_in, classes, generator=torch.Generator().manual_seed(1234))

    def make_batch(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(batch_size, n_in, generator=g)
        return x, (x @ teacher).argmax(dim=1)

    return ModelBundle(spec=spec, layers=layers, make_batch=make_batch, loss_fn=_class_loss, input_bytes_per_sample=4 * n_in)
