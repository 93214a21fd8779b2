"""A module called in two places (its weights used twice in forward): traced into one layer per
call, the two layers hold the same Parameter, and a pipeline sums its gradient over the stages
that hold it, as for tied embeddings; a module with running statistics called twice is refused.
Its pipelined runs (two stages of one rank, two ranks, three ranks, both uses in one stage under
split backwards) are PINNED cases of tests/test_byom_run.py, which run in that module's launches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from planner.errors import ModelSpecError
from planner.models import build_model

from helpers.models import BYOM_MODELS

ROOT = Path(__file__).resolve().parents[1]
SPEC, SHAPE, _ = BYOM_MODELS["shared"]


def test_a_layer_called_twice_is_two_layers_sharing_one_weight(monkeypatch):
    monkeypatch.chdir(ROOT)
    bundle = build_model(SPEC, input_shape=SHAPE)
    layers = bundle.layers
    assert layers.graph.names == ("inp", "mix", "mid", "mix@2", "head")
    kids = list(layers.children())
    assert kids[1].mix.weight is kids[3].mix.weight and kids[1].mix.bias is kids[3].mix.bias
    assert len(list(layers.parameters())) == len(list(layers.source.parameters()))  # counted once
    x, _ = bundle.make_batch(3, 0)
    with torch.no_grad():
        assert torch.equal(layers(x), layers.source(x))


def test_a_layer_called_twice_profiles(monkeypatch):
    from planner.profiling.profiler import profile_model

    monkeypatch.chdir(ROOT)
    prof = profile_model(SPEC, [2], warmup=0, repeats=1, threads=1, input_shape=SHAPE)
    assert prof.names == ("inp", "mix", "mid", "mix@2", "head")
    params = prof.at(2).param_bytes
    assert params[1] == params[3] == (16 * 16 + 16) * 4  # each stage that holds it holds all of it


class _NormTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(4)
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.norm(self.fc(self.norm(x)))


def test_running_statistics_used_twice_are_refused_in_one_line():
    from planner.graph.trace import trace_layers

    with pytest.raises(ModelSpecError, match=r"'norm' \(BatchNorm1d inside\) is called in two separate places") as e:
        trace_layers(_NormTwice(), torch.randn(2, 4))
    assert "\n" not in e.value.one_line() and "give each place its own BatchNorm1d" in e.value.one_line()
