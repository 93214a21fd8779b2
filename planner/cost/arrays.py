"""The cost model as per-layer arrays: what every stage-cut solver is handed.

torchgpipe and Alpa turn a profile into one cost table and hand it to pure solvers; this is
pplan's. Each array has one entry per layer (boundary bytes one per cut position), already in
the units the partitioner sums: compute calibrated at speed 1, static bytes with the
optimizer's state, what a checkpoint keeps. planner.partition.build adds the per-position
terms (device speed, budget, in-flight count, links) to make a PartitionProblem.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.calibration import Calibration
from planner.cost.compute import layer_compute_ms
from planner.cost.held import held_output_per_layer, loss_saved_bytes, wgrad_per_layer
from planner.cost.memory import (
    boundary_bytes, checkpoint_input_bytes, kept_activation_bytes, optimizer_workspace,
    runtime_buffers, scaled_skip_edges, stage_entry_bytes, static_bytes_per_layer,
)
from planner.cost.transient import rematerialized_bytes
from planner.graph.edges import SkipEdge
from planner.profiling.profile import LayerCosts

__all__ = ["LayerArrays", "layer_arrays"]


@dataclass(frozen=True)
class LayerArrays:
    """Per-layer costs of one micro-batch size (length L unless said otherwise)."""

    compute_ms: np.ndarray
    """Forward + backward at speed 1, calibrated, ms."""
    recompute_ms: np.ndarray
    """Extra time when the layer is recomputed (its forward again, calibrated), ms."""
    static_bytes: np.ndarray
    """Weights + gradients + optimizer state, bytes."""
    activation_bytes: np.ndarray
    """Bytes kept for the backward per micro-batch beyond what the layer before keeps (planner.cost.kept_activation_bytes)."""
    checkpoint_bytes: np.ndarray
    """Bytes kept instead when the layer is recomputed (its input) per micro-batch."""
    boundary_bytes: np.ndarray
    """Length L+1: bytes crossing the cut before layer x (0 at x = 0 and x = L)."""
    skip_edges: tuple[SkipEdge, ...]
    """Skip edges with bytes per micro-batch (the pass-through term); () for a chain."""
    workspace_bytes: np.ndarray | None = None
    """Bytes alive at each layer's worst moment beyond what it keeps (planner.cost.memory.workspace_max); None: 0."""
    optimizer_workspace_bytes: np.ndarray | None = None
    """Per layer, the optimizer step's temporaries for this optimizer (planner.cost.optimizer_workspace); None: 0."""
    held_output_bytes: np.ndarray | None = None
    """Bytes of each layer's output a runtime holds for the backward beyond what the layer saves
    (planner.cost.held.held_output); None: 0."""
    entry_bytes: np.ndarray | None = None
    """Per layer x, the kept-bytes correction of a stage starting at x (planner.cost.stage_entry_bytes); None: 0."""
    runtime_buffers: bool = False
    """Buffers as torch's stage allocates them, per micro-batch (planner.cost.buffer_bytes); False: the older model."""
    batch_input_bytes: float = 0.0
    """The model input per micro-batch (the first stage holds the step's batch of it)."""
    batch_target_bytes: float = 0.0
    """The target per micro-batch (the last stage holds the step's batch of it; planner.cost.batch)."""
    wgrad_bytes: np.ndarray | None = None
    """Per layer, bytes a split backward holds per micro-batch between its I and W (planner.cost.held.stage_wgrad); None: 0."""
    rematerialized_bytes: np.ndarray | None = None
    """Per layer, what its recompute brings back during its backward (planner.cost.transient.rematerialized_bytes);
    None: activation_bytes (profiles without checkpoint_extra_bytes)."""
    loss_saved_bytes: float = 0.0
    """What the loss saves per micro-batch, freed at the last stage's I when the backward is split (planner.cost.held.loss_saved_bytes)."""
    w_workspace_bytes: np.ndarray | None = None
    """Per layer, what its split W holds alone beyond the gradients (planner.cost.w_workspace); None: 0."""
    w_carry_bytes: np.ndarray | None = None
    """Per layer, its last parameter group's fresh weight gradients, held into the next layer's W (planner.cost.w_workspace)."""


def layer_arrays(costs: LayerCosts, optimizer: str, calibration: Calibration | None = None) -> LayerArrays:
    """The per-layer cost arrays of `costs` for this optimizer and calibration."""
    compute, recompute = layer_compute_ms(costs, calibration)
    return LayerArrays(
        compute_ms=compute,
        recompute_ms=recompute,
        static_bytes=static_bytes_per_layer(costs.param_bytes, optimizer, costs.param_element_bytes),
        activation_bytes=kept_activation_bytes(costs),
        checkpoint_bytes=checkpoint_input_bytes(costs),
        boundary_bytes=boundary_bytes(costs),
        skip_edges=scaled_skip_edges(costs),
        workspace_bytes=_workspace(costs),
        held_output_bytes=held_output_per_layer(costs),
        optimizer_workspace_bytes=_step_workspace(costs, optimizer),
        entry_bytes=stage_entry_bytes(costs),
        runtime_buffers=runtime_buffers(costs),
        batch_input_bytes=float(costs.input_bytes),
        batch_target_bytes=float(costs.target_bytes),
        wgrad_bytes=wgrad_per_layer(costs),
        rematerialized_bytes=(None if costs.checkpoint_extra_bytes is None
                              else rematerialized_bytes(kept_activation_bytes(costs), costs.checkpoint_extra_bytes)),
        loss_saved_bytes=loss_saved_bytes(costs),
        w_workspace_bytes=_floats(costs.w_workspace_bytes),
        w_carry_bytes=_floats(costs.w_carry_bytes),
    )


def _floats(column: np.ndarray | None) -> np.ndarray | None:
    """A profile column as floats (None stays None: not measured)."""
    return None if column is None else np.asarray(column, dtype=float)


def _step_workspace(costs: LayerCosts, optimizer: str) -> np.ndarray | None:
    """The profile's optimizer-step temporaries where this optimizer makes them, else None."""
    w = costs.optimizer_workspace_bytes
    if (w is None or not np.any(np.asarray(w) > 0)
            or optimizer_workspace(w, 0, len(w), optimizer, costs.param_element_bytes) == 0.0):
        return None
    return np.asarray(w, dtype=float)


def _workspace(costs: LayerCosts) -> np.ndarray | None:
    """The profile's workspace column, or None when it has none (or only zeros): the plans of
    profiles without it stay exactly what they were."""
    w = costs.workspace_bytes
    return None if w is None or not np.any(np.asarray(w) > 0) else np.asarray(w, dtype=float)
