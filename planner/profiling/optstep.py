"""The optimizer step of one layer's parameters: its time and its temporaries.

Both run torch's Adam over copies of the layer's trainable parameters, each with a gradient, so
the layer itself is left alone; over 16-bit parameters it steps their fp32 masters, as `pplan run`
trains them (planner.master_weights: the masters' fp32 gradients and the algorithm's fp32
temporaries are the step's, measured on a bf16 GPT's embedding rank at about 4 MiB more than a
plain bf16 Adam step's). The time is a median over timed steps after at least one warm-up
step (the first allocates Adam's state); the temporaries are the allocator's peak over one step
after that, above its starting point (planner.profiling.layerpeak.allocator_peak_of).
"""

from __future__ import annotations

import statistics

import torch

from planner.master_weights import is_16bit, with_fp32_masters
from planner.profiling.layerpeak import allocator_peak_of
from planner.profiling.measure import sync_for, timed_ms

__all__ = ["optimizer_ms", "optimizer_workspace_bytes"]


def _adam_on_copies(layer: torch.nn.Module) -> tuple[torch.optim.Optimizer, torch.device] | None:
    """An Adam optimizer over copies of the layer's trainable parameters, each with a gradient
    (the layer itself is left alone), and their device; None without trainable parameters."""
    params = [p for p in layer.parameters() if p.requires_grad]
    if not params:
        return None
    copies = [p.detach().clone() for p in params]
    for c in copies:
        c.grad = torch.full_like(c, 1e-3)
    cls = with_fp32_masters(torch.optim.Adam) if any(is_16bit(c) for c in copies) else torch.optim.Adam
    return cls(copies, lr=1e-3), copies[0].device


def optimizer_workspace_bytes(layer: torch.nn.Module) -> int:
    """The allocator's peak during one Adam step over copies of the layer's trainable parameters
    (state already created, as in every step after the first), above its starting point: the
    step's temporaries. torch's single-tensor Adam (its default on CPU) makes two
    parameter-sized temporaries for the update's denominator, one parameter at a time."""
    made = _adam_on_copies(layer)
    if made is None:
        return 0
    opt, device = made
    opt.step()  # creates the state
    return allocator_peak_of(opt.step, device)


def optimizer_ms(layer: torch.nn.Module, *, warmup: int, repeats: int, timer: str = "sched") -> float:
    """Median time of one Adam step over copies of the layer's trainable parameters, ms."""
    made = _adam_on_copies(layer)
    if made is None:
        return 0.0
    opt, device = made
    # The first step allocates Adam's state: always warm up at least once.
    samples = timed_ms(opt.step, warmup=max(warmup, 1), repeats=repeats, sync=sync_for(device), timer=timer)
    return statistics.median(samples)
