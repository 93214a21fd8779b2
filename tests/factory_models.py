"""Factories used by the `module:factory` tests (no tests here; imported by spec string)."""

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from planner.models import ModelBundle


def plain(hidden=8, seed=None):
    """A plain Sequential: its input comes from --input-shape."""
    return nn.Sequential(OrderedDict(fc0=nn.Linear(4, hidden), act=nn.ReLU(), fc1=nn.Linear(hidden, 2)))


def tokens(vocab=50):
    """Long input: embedding, flatten, linear."""
    return nn.Sequential(OrderedDict(embed=nn.Embedding(vocab, 4), flat=nn.Flatten(), head=nn.Linear(4 * 6, 3)))


def with_data():
    """A Sequential that brings its own batch maker and loss as attributes."""
    model = nn.Sequential(OrderedDict(fc=nn.Linear(3, 5), head=nn.Linear(5, 2)))

    def make_batch(batch_size, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(batch_size, 3, generator=g), torch.randint(0, 2, (batch_size,), generator=g)

    model.make_batch = make_batch
    model.loss_fn = F.cross_entropy
    return model


def bundle(seed=0):
    """A full ModelBundle."""
    layers = nn.Sequential(OrderedDict(a=nn.Linear(2, 2), b=nn.Linear(2, 1)))

    def make_batch(batch_size, s):
        g = torch.Generator().manual_seed(s)
        return torch.randn(batch_size, 2, generator=g), torch.randn(batch_size, 1, generator=g)

    return ModelBundle("custom", layers, make_batch, F.mse_loss, 8)


def not_a_model():
    return 42


def empty():
    return nn.Sequential()


def broken():
    raise ValueError("factory exploded")


def tuple_output():
    """A layer returning a tuple: not a pipeline layer."""

    class Two(nn.Module):
        def forward(self, x):
            return x, x

    return nn.Sequential(OrderedDict(lin=nn.Linear(4, 4), two=Two()))


NOT_CALLABLE = 3


def fails_at_batch_two():
    """Runs at micro-batch size 1, fails at 2: a model error found only while profiling."""

    class Picky(nn.Module):
        def forward(self, x):
            if x.shape[0] >= 2:
                raise RuntimeError("boom at batch two")
            return x * 2

    model = nn.Sequential(OrderedDict(fc=nn.Linear(3, 3), picky=Picky()))
    model.make_batch = lambda batch_size, seed: (torch.randn(batch_size, 3), torch.randn(batch_size, 3))
    model.loss_fn = F.mse_loss
    return model
