"""A test model whose forward draws random numbers from torch, numpy and Python's `random`.

`dropout_model:build` (a `module:factory` model, case 1 of planner.models.factory): four
pipeline layers; `drop` applies nn.Dropout (torch's RNG), `npnoise` adds numpy noise and
`pyscale` multiplies by a factor from Python's `random`. Two runs of a plan give the same losses
only when every rank seeds all three generators, and a resumed run equals the uninterrupted one
only when checkpoints restore all three states.
"""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from planner.models.bundle import ModelBundle

__all__ = ["build"]


class _NumpyNoise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "meta":  # torch's shape inference
            return x
        noise = np.random.standard_normal(tuple(x.shape)).astype(np.float32)
        return x + 0.05 * torch.from_numpy(noise)


class _PythonScale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (1.0 + 0.1 * random.random())


def build(hidden: int = 16, n_in: int = 8, classes: int = 4) -> ModelBundle:
    layers = nn.Sequential(OrderedDict([
        ("fc0", nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU())),
        ("drop", nn.Sequential(nn.Linear(hidden, hidden), nn.Dropout(0.3))),
        ("npnoise", nn.Sequential(nn.Linear(hidden, hidden), _NumpyNoise())),
        ("pyscale", nn.Sequential(nn.Linear(hidden, classes), _PythonScale())),
    ]))
    teacher = torch.randn(n_in, classes, generator=torch.Generator().manual_seed(7))

    def make_batch(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(batch_size, n_in, generator=g)
        return x, (x @ teacher).argmax(dim=1)

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels)

    return ModelBundle(spec="dropout_model:build", layers=layers, make_batch=make_batch, loss_fn=loss_fn,
                       input_bytes_per_sample=4 * n_in)
