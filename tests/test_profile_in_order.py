"""A chain model's layer times are taken where a stage runs them: inside whole passes of the
model, in order (planner.profiling.inorder), not each layer alone on a hot input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from planner.profiling import inorder, measure
from planner.profiling.inorder import ALONE, IN_ORDER, layer_timing_text, retime_in_order
from planner.profiling.profiler import profile_model

TINY_GPT = "gpt:layers=2,hidden=16,heads=2,seq=8,vocab=50"


class _Clock:
    """A `time` module whose perf_counter only the layers' sleeps advance."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _CacheLayer(nn.Module):
    """Forward 5 ms when the layer called just before was this one (its data hot, as when it is
    timed alone, again and again), 10 ms after another layer (as in a stage); backward 1 ms."""

    last: list[int] = [-1]

    def __init__(self, index: int, clock: _Clock):
        super().__init__()
        self.index, self.clock = index, clock
        self.weight = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.sleep(0.005 if _CacheLayer.last[0] == self.index else 0.010)
        _CacheLayer.last[0] = self.index
        return _SleepBackward.apply(x * self.weight, self.clock)


class _SleepBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, clock):
        ctx.clock = clock
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.clock.sleep(0.001)
        return grad, None


def _cols(n: int) -> dict[str, np.ndarray]:
    """Column 0 as measured alone: 5 ms forward, 2 ms backward of which 0.5 ms input gradient."""
    cols = {c: np.zeros((n, 1)) for c in ("fwd_ms", "fwd_ms_std", "bwd_ms", "bwd_ms_std", "bwd_input_ms",
                                           "bwd_weight_ms", "activation_bytes", "output_bytes", "workspace_bytes")}
    cols["fwd_ms"][:] = 5.0
    cols["bwd_ms"][:] = 2.0
    cols["bwd_input_ms"][:] = 0.5
    cols["bwd_weight_ms"][:] = 1.5
    return cols


def test_the_times_in_order_replace_the_times_alone_keeping_the_input_gradients_share(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(measure, "time", clock)
    layers = [_CacheLayer(i, clock) for i in range(3)]
    cols = _cols(3)
    x = torch.ones(2, 4)
    assert retime_in_order(layers, x, lambda y, t: (y - t).pow(2).mean(), torch.zeros(2, 4), cols, 0,
                           warmup=1, repeats=3, timer="wall")
    exact = dict(rel=0, abs=1e-6)
    assert cols["fwd_ms"][:, 0].tolist() == pytest.approx([10, 10, 10], **exact)  # each after another layer
    assert cols["bwd_ms"][:, 0].tolist() == pytest.approx([1, 1, 1], **exact)
    assert cols["bwd_input_ms"][:, 0].tolist() == pytest.approx([0.25] * 3, **exact)  # 0.5 / 2 of it, as alone
    assert cols["bwd_weight_ms"][:, 0].tolist() == pytest.approx([0.75] * 3, **exact)
    assert cols["fwd_ms_std"].max() == 0 and cols["bwd_ms_std"].max() == 0


def test_a_pass_that_would_not_fit_keeps_the_times_alone(monkeypatch):
    cols = _cols(2)
    cols["activation_bytes"][:] = 600.0
    monkeypatch.setattr(inorder, "available_ram", lambda: 2000)  # the pass needs 1200 > half of 2000
    assert not retime_in_order([nn.Identity(), nn.Identity()], torch.ones(2, 2), lambda y, t: y.sum(), None, cols, 0,
                               warmup=0, repeats=1, timer="wall")
    assert cols["fwd_ms"][:, 0].tolist() == [5.0, 5.0]
    assert layer_timing_text([4, 8], graph=False) == f"{IN_ORDER}; alone at micro-batch sizes 4,8 (a whole pass did not fit)"
    assert layer_timing_text([], graph=True).startswith(ALONE)


def test_a_profile_says_how_its_layers_were_timed(monkeypatch):
    p = profile_model(TINY_GPT, [1, 2], warmup=0, repeats=2, threads=1)
    assert p.meta["layer_timing"] == IN_ORDER
    monkeypatch.setattr(inorder, "available_ram", lambda: 1)
    alone = profile_model(TINY_GPT, [1, 2], warmup=0, repeats=2, threads=1)
    assert alone.meta["layer_timing"] == f"{IN_ORDER}; alone at micro-batch sizes 1,2 (a whole pass did not fit)"


class _FailsToAllocate(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")


def test_a_pass_whose_allocation_fails_keeps_the_times_alone():
    cols = _cols(2)
    assert not retime_in_order([nn.Identity(), _FailsToAllocate()], torch.ones(2, 2), lambda y, t: y.sum(), None,
                               cols, 0, warmup=0, repeats=1, timer="wall")
    assert cols["fwd_ms"][:, 0].tolist() == [5.0, 5.0] and cols["bwd_ms"][:, 0].tolist() == [2.0, 2.0]
