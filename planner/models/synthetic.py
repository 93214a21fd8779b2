"""`synthetic:`: layers that take a given time by sleeping and hold given bytes.

Each layer sleeps `fwd_ms (+ fwd_ms_per_sample x batch)` in its forward and the same for its
backward, has `param_bytes` of float32 parameters and saves one buffer of exactly
`act_bytes x batch` bytes for backward (act_bytes is per sample; the buffer stands for
everything the layer keeps, its input included, so nothing else is saved). Layers pass
(batch, hidden) float32 tensors. Sleeping processes do not compete for CPU, so a 4- or
8-stage pipeline of these runs faithfully on a 2-core machine.

The backward is two autograd nodes: the input-gradient part (1 - weight_frac of the time)
and the weight-gradient part (weight_frac), so `autograd.grad` with respect to the input
alone, or the weights alone, runs only its own part, as a zero-bubble schedule's I and W
would. A layer without parameters spends all its backward on the input part; a layer whose
input needs no gradient (the first) spends it all on the weight part, which then also holds
the activation buffer. A first layer without parameters has no backward at all, so it
keeps nothing (as any such layer would).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from planner.models.bundle import ModelBundle

__all__ = ["SleepLayer", "build_synthetic"]


def _sleep(seconds: float) -> None:
    # Sleep to a deadline so an early wake-up (a signal) does not shorten the step.
    deadline = time.perf_counter() + seconds
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(left)


def _save_activation(ctx: Any, nbytes: int, device: torch.device) -> None:
    # Left uninitialised: writing hundreds of MB would cost real CPU time and the layer's
    # time must be the slept time. The allocator (CUDA) and saved-tensor accounting see all
    # of it; on CPU the pages become resident only if touched, so RSS undercounts it.
    ctx.save_for_backward(torch.empty(nbytes, dtype=torch.uint8, device=device))


class _InputPart(torch.autograd.Function):
    """Identity on the features; sleeps the forward and the input-gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fwd_s: float, bwd_s: float, act_nbytes: int) -> torch.Tensor:
        _sleep(fwd_s)
        _save_activation(ctx, act_nbytes, x.device)
        ctx.bwd_s = bwd_s
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        ctx.saved_tensors  # the activation is what backward "needs": keep it alive until here
        _sleep(ctx.bwd_s)
        return grad, None, None, None


class _WeightPart(torch.autograd.Function):
    """weight[0] as a scalar; sleeps the weight-gradient backward.

    One element, not a reduction: the forward must not read every parameter byte (real
    time), while the backward still produces a full parameter-sized gradient, as any layer's.
    """

    @staticmethod
    def forward(ctx: Any, w: torch.Tensor, bwd_s: float, act_nbytes: int) -> torch.Tensor:
        _save_activation(ctx, act_nbytes, w.device)
        ctx.bwd_s = bwd_s
        ctx.meta = (w.shape, w.dtype, w.device)
        return w[0].clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        ctx.saved_tensors
        _sleep(ctx.bwd_s)
        shape, dtype, device = ctx.meta
        grad_w = torch.zeros(shape, dtype=dtype, device=device)
        grad_w[0] = grad
        return grad_w, None, None


class SleepLayer(nn.Module):
    """y = x + weight[0], taking the configured time and memory."""

    def __init__(self, hidden: int, fwd_ms: float, bwd_ms: float, fwd_ms_per_sample: float,
                 bwd_ms_per_sample: float, weight_frac: float, param_bytes: int, act_bytes: int):
        super().__init__()
        self.hidden, self.act_bytes, self.weight_frac = hidden, act_bytes, weight_frac
        self.fwd_ms, self.bwd_ms = fwd_ms, bwd_ms
        self.fwd_ms_per_sample, self.bwd_ms_per_sample = fwd_ms_per_sample, bwd_ms_per_sample
        n = param_bytes // 4
        self.weight = nn.Parameter(torch.randn(n) * 0.02) if n else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        fwd_s = (self.fwd_ms + self.fwd_ms_per_sample * b) / 1000
        bwd_s = (self.bwd_ms + self.bwd_ms_per_sample * b) / 1000
        act = b * self.act_bytes
        # The node whose backward will run holds the activation: with no input gradient
        # (the first layer) the input part never runs backward, so the weight part keeps it.
        if self.weight is None:
            w_s, i_s, w_act = 0.0, bwd_s, 0
        elif not x.requires_grad:
            w_s, i_s, w_act = bwd_s, 0.0, act
        else:
            w_s, i_s, w_act = bwd_s * self.weight_frac, bwd_s * (1 - self.weight_frac), 0
        y = _InputPart.apply(x, fwd_s, i_s, act - w_act)
        if self.weight is not None:
            y = y + _WeightPart.apply(self.weight, w_s, w_act)
        return y

    def extra_repr(self) -> str:
        return f"fwd_ms={self.fwd_ms:g}, bwd_ms={self.bwd_ms:g}, act_bytes={self.act_bytes}"


def _mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.float(), target.float())


def build_synthetic(p: dict[str, Any], spec: str) -> ModelBundle:
    """Build from parsed parameters (see planner.models.spec.KEYS['synthetic'])."""
    hidden = p["hidden"]
    layers = nn.Sequential(OrderedDict(
        (f"layer{i}", SleepLayer(
            hidden, p["fwd_ms"][i], p["bwd_ms"][i], p["fwd_ms_per_sample"][i], p["bwd_ms_per_sample"][i],
            p["weight_frac"][i], p["param_bytes"][i], p["act_bytes"][i],
        ))
        for i in range(p["layers"])
    ))

    def make_batch(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return torch.randn(batch_size, hidden, generator=g), torch.randn(batch_size, hidden, generator=g)

    return ModelBundle(spec=spec, layers=layers, make_batch=make_batch, loss_fn=_mse, input_bytes_per_sample=4 * hidden)
