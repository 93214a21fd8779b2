"""The one cost model for stage time and memory, shared by partitioner, simulator and executor.

Pure arithmetic over profile arrays: no torch, no schedules. What it assumes:

Time of one micro-batch on a stage (device speed s divides every compute time):
  F = sum fwd_ms over the stage's layers
  B = sum bwd_ms + sum fwd_ms over recomputed layers (the recompute runs just before backward)
  I = sum bwd_input_ms + recompute forward;  W = sum bwd_weight_ms   (split backward, I+W = B)
  optimizer step = sum optimizer_ms, once per iteration

Memory on a device:
  weights     = sum param_bytes
  gradients   = weights (same dtype as the parameters)
  optimizer   = state factor x weights: Adam/AdamW keep two moments (2x), SGD with momentum
                one buffer (1x), plain SGD none. torch keeps state in the parameter dtype.
  activations = in_flight x kept + transient, where
                kept = sum activation_bytes of kept layers
                     + sum input bytes of recomputed layers (checkpointing keeps only the input)
                transient = the largest activation_bytes among recomputed layers: during its
                backward one micro-batch of that layer's activations lives again
  buffers     = 2 x (stage input bytes + stage output bytes): one received activation and its
                outgoing gradient, one sent activation and its incoming gradient

Models that are not a chain (LayerCosts with skip edges, planner.graph): a stage [first, end)
receives crossing_bytes[first-1] and sends crossing_bytes[end-1] (every tensor crossing the
cut, hop by hop); kept also holds the pass-through tensors it only forwards
(planner.graph.passthrough_bytes); a recomputed layer keeps everything it reads from earlier
layers (LayerCosts.layer_input_bytes). Without skip edges these are the chain's numbers.

`in_flight` (micro-batches whose activations are held at once) is a property of the schedule,
computed from its action order in `planner.schedules.memory`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from planner.errors import PplanError
from planner.graph.crossing import passthrough_bytes
from planner.profiling.profile import LayerCosts

__all__ = [
    "OPTIMIZER_STATE_FACTOR",
    "StageCost",
    "MemoryBreakdown",
    "optimizer_factor",
    "stage_cost",
    "stage_memory",
    "recompute_input_bytes",
]

OPTIMIZER_STATE_FACTOR = {"adam": 2.0, "adamw": 2.0, "sgd": 1.0, "sgd-plain": 0.0}


def optimizer_factor(optimizer: str) -> float:
    """Optimizer state bytes per parameter byte."""
    try:
        return OPTIMIZER_STATE_FACTOR[optimizer]
    except KeyError:
        raise PplanError(f"unknown optimizer {optimizer!r}", f"choose one of {', '.join(OPTIMIZER_STATE_FACTOR)}") from None


@dataclass(frozen=True)
class StageCost:
    """Per-micro-batch time and per-stage memory of a contiguous layer range."""

    first: int
    """First layer (inclusive)."""
    end: int
    """End layer (exclusive)."""
    recompute: tuple[int, ...]
    """Layers whose activations are recomputed in backward."""
    fwd_ms: float
    """Forward of one micro-batch, ms."""
    bwd_ms: float
    """Full backward of one micro-batch including recompute, ms."""
    bwd_input_ms: float
    """Input-gradient part (I) including recompute, ms."""
    bwd_weight_ms: float
    """Weight-gradient part (W), ms."""
    recompute_ms: float
    """The part of bwd_ms spent re-running forwards, ms."""
    optimizer_ms: float
    """Optimizer step for this stage's parameters, ms."""
    param_bytes: float
    """Weights of the stage."""
    static_bytes: float
    """Weights + gradients + optimizer state."""
    kept_bytes: float
    """Activation bytes held per micro-batch in flight."""
    transient_bytes: float
    """Extra bytes alive during one recomputed layer's backward."""
    input_bytes: float
    """Bytes received per micro-batch (0 for the first stage)."""
    output_bytes: float
    """Bytes sent per micro-batch (0 for the last stage)."""

    @property
    def buffer_bytes(self) -> float:
        return 2.0 * (self.input_bytes + self.output_bytes)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak memory of one device, by kind, in bytes."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    buffers: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.buffers

    def as_dict(self) -> dict[str, int]:
        return {
            "weights": int(self.weights), "gradients": int(self.gradients),
            "optimizer": int(self.optimizer), "activations": int(self.activations),
            "buffers": int(self.buffers), "total": int(self.total),
        }


def recompute_input_bytes(costs: LayerCosts, layer: int) -> float:
    """Bytes a checkpointed layer keeps: its input (the previous layer's output, plus skip tensors it reads)."""
    if costs.layer_input_bytes is not None:
        return float(costs.layer_input_bytes[layer])
    return float(costs.output_bytes[layer - 1]) if layer > 0 else float(costs.input_bytes)


def _boundary_bytes(costs: LayerCosts, cut: int) -> float:
    """Bytes crossing the cut after layer `cut` per micro-batch."""
    if costs.crossing_bytes is not None:
        return float(costs.crossing_bytes[cut])
    return float(costs.output_bytes[cut])


def stage_cost(
    costs: LayerCosts,
    first: int,
    end: int,
    recompute: Iterable[int] = (),
    optimizer: str = "adam",
    speed: float = 1.0,
) -> StageCost:
    """Cost of layers [first, end) with `recompute` checkpointed, on a device of relative `speed`."""
    n = len(costs.fwd_ms)
    if not (0 <= first < end <= n):
        raise PplanError(f"stage layers [{first}, {end}) are outside the model's 0..{n}")
    rec = tuple(sorted(set(recompute)))
    for layer in rec:
        if not first <= layer < end:
            raise PplanError(f"recompute layer {layer} is outside its stage [{first}, {end})")
    if speed <= 0:
        raise PplanError(f"device speed {speed} must be positive")
    sl = slice(first, end)
    fwd = float(np.sum(costs.fwd_ms[sl]))
    rec_ms = float(sum(costs.fwd_ms[i] for i in rec))
    params = float(np.sum(costs.param_bytes[sl]))
    rec_set = set(rec)
    kept = sum(
        recompute_input_bytes(costs, i) if i in rec_set else float(costs.activation_bytes[i])
        for i in range(first, end)
    )
    if costs.skip_edges:
        kept += passthrough_bytes(first, end, costs.skip_edges, costs.micro_batch_size)
    transient = max((float(costs.activation_bytes[i]) for i in rec), default=0.0)
    return StageCost(
        first=first,
        end=end,
        recompute=rec,
        fwd_ms=fwd / speed,
        bwd_ms=(float(np.sum(costs.bwd_ms[sl])) + rec_ms) / speed,
        bwd_input_ms=(float(np.sum(costs.bwd_input_ms[sl])) + rec_ms) / speed,
        bwd_weight_ms=float(np.sum(costs.bwd_weight_ms[sl])) / speed,
        recompute_ms=rec_ms / speed,
        optimizer_ms=float(np.sum(costs.optimizer_ms[sl])) / speed,
        param_bytes=params,
        static_bytes=params * (2.0 + optimizer_factor(optimizer)),
        kept_bytes=kept,
        transient_bytes=transient,
        input_bytes=_boundary_bytes(costs, first - 1) if first > 0 else 0.0,
        output_bytes=_boundary_bytes(costs, end - 1) if end < n else 0.0,
    )


def stage_memory(stages: list[StageCost], peak_activation_bytes: float, optimizer: str = "adam") -> MemoryBreakdown:
    """Peak memory of a device running `stages`, given the schedule's peak activation bytes.

    `peak_activation_bytes` comes from the schedule (in-flight micro-batches x kept bytes,
    plus transients); see planner.schedules.memory.
    """
    params = sum(s.param_bytes for s in stages)
    return MemoryBreakdown(
        weights=params,
        gradients=params,
        optimizer=params * optimizer_factor(optimizer),
        activations=peak_activation_bytes,
        buffers=sum(s.buffer_bytes for s in stages),
    )
