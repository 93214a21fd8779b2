"""A test model whose last layer fails on rank 1 once the process group is up.

`failing_rank_model:build` (a `module:factory` model): four layers; `boom` raises RuntimeError on
rank 1 of a joined process group, from its third forward on, and is the identity everywhere else
(the preflight's build, one-process runs), so a 2-stage job fails mid-run on one node only, as a
rank that runs out of memory mid-step would.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from planner.models.bundle import ModelBundle

__all__ = ["build"]


class _FailsOnRank1(nn.Module):
    """Counts the real forwards on rank 1 of a joined job and fails at the third: past the
    build's probe and torch's shape inference (on meta tensors), inside the first steps."""

    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if dist.is_initialized() and dist.get_rank() == 1 and x.device.type != "meta":
            _FailsOnRank1.calls += 1
            if _FailsOnRank1.calls >= 3:
                raise RuntimeError("injected failure on rank 1")
        return x


def build(hidden: int = 8, n_in: int = 4, classes: int = 3) -> ModelBundle:
    layers = nn.Sequential(OrderedDict([
        ("fc0", nn.Linear(n_in, hidden)),
        ("fc1", nn.Linear(hidden, hidden)),
        ("fc2", nn.Linear(hidden, classes)),
        ("boom", _FailsOnRank1()),
    ]))

    def make_batch(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(batch_size, n_in, generator=g)
        return x, torch.randint(0, classes, (batch_size,), generator=g)

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, labels)

    return ModelBundle(spec="failing_rank_model:build", layers=layers, make_batch=make_batch, loss_fn=loss_fn,
                       input_bytes_per_sample=4 * n_in)
