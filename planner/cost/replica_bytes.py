"""Bytes of one GPU's training state under a (D, P, T) layout, from its layers' parameter bytes. Pure.

A profile's `param_bytes` are in the profile's dtype; the gradients the data-parallel sync moves
and the static state (weights, gradients, optimizer with ZeRO's shares) follow from them through
the training precision (planner.cost.precision). These are the one place that conversion is
written, so the 3-D search's bound, its estimates, the pipeline DP and the replica simulation
price the same bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.cost.data_parallel import zero_bytes_per_param
from planner.cost.precision import TrainingPrecision

__all__ = ["gradient_bytes", "static_bytes", "least_stage_static_bytes"]


def gradient_bytes(param_bytes: Any, precision: TrainingPrecision) -> Any:
    """The gradients of weights holding `param_bytes` (the profile's dtype), bytes: what the
    data-parallel gradient sync moves (planner.cost.data_parallel.grad_sync_ms)."""
    return np.asarray(param_bytes, dtype=float) / precision.element_bytes * precision.grad_bytes


def static_bytes(param_bytes: Any, dp: int, zero: int, precision: TrainingPrecision) -> np.ndarray:
    """Per layer, one GPU's weights, gradients and optimizer state for weights of `param_bytes`
    (one GPU's share under tensor parallelism, the profile's dtype), with ZeRO stage `zero`'s
    shares over `dp` replicas (zero_bytes_per_param; ZeRO-3's gathered layer not included)."""
    return np.asarray(param_bytes, dtype=float) / precision.element_bytes * zero_bytes_per_param(dp, zero, precision)


def least_stage_static_bytes(static_per_layer: Any, ranks: int) -> float:
    """A lower bound of the largest static bytes any of `ranks` pipeline ranks holds, however the
    layers are cut and placed (several stages per rank too): at least an even share of the total,
    and at least the heaviest layer (a layer is never split between ranks: an embedding or head
    kept whole on every tp rank can outweigh the even share)."""
    static = np.asarray(static_per_layer, dtype=float)
    if static.size == 0:
        return 0.0
    return float(max(np.sum(static) / max(1, ranks), np.max(static)))
