"""The step's batch on the stages that use it: the inputs on the first stage, the targets on the last.

`pplan run` makes one batch per step and gives the inputs to the first stage's rank and the
targets to the last stage's (planner.execute.train); torch's schedule splits each into
micro-batches that are views of it, so a stage holds its part of the batch for the whole step:
M x (bytes per micro-batch). A one-stage pipeline holds both. Every other stage holds neither.

Before the target was charged, a user model returning 16 x 500 logits and trained on regression
targets of that shape (32,000 bytes a sample) ran its last rank 2.0 MB above the prediction at a
global batch of 64. Profiles that do not record `target_bytes_per_sample` (made before pplan wrote
it) give 0 for the target, so their plans stay what they were.

Pure arithmetic over numbers or numpy arrays (the DP prices every (first, end) at once); the
result is buffer_bytes' `batch_in` (planner.cost.memory), which multiplies it by M.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.profiling.profile import LayerCosts

__all__ = ["stage_batch_bytes", "layer_range_batch_bytes"]


def stage_batch_bytes(batch_input_bytes: float, batch_target_bytes: float, is_first: Any, is_last: Any) -> Any:
    """Bytes per micro-batch of the step's batch a stage holds for the whole step: the model input
    (`batch_input_bytes`, per micro-batch) where `is_first`, the target (`batch_target_bytes`) where
    `is_last`, both on a stage that is both. `is_first`/`is_last`: bools, or bool arrays (numpy,
    broadcast together) for a float array; bools give a float."""
    if isinstance(is_first, np.ndarray) or isinstance(is_last, np.ndarray):
        return (np.where(is_first, float(batch_input_bytes), 0.0)
                + np.where(is_last, float(batch_target_bytes), 0.0))
    return (float(batch_input_bytes) if is_first else 0.0) + (float(batch_target_bytes) if is_last else 0.0)


def layer_range_batch_bytes(costs: LayerCosts, first: int, end: int) -> float:
    """stage_batch_bytes of the stage running layers [first, end) of the model `costs` describes."""
    return float(stage_batch_bytes(costs.input_bytes, costs.target_bytes, first == 0, end == len(costs.fwd_ms)))
