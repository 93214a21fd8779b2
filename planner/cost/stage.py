"""One stage priced: StageCost (what the simulator consumes) and the per-stage figures the
partitioner's objective and memory rows charge for it.

`stage_cost` sums a contiguous layer range with planner.cost.compute's and
planner.cost.memory's rules; `microbatch_ms` and `stage_peak_bytes` turn a StageCost into the
partitioner's per-micro-batch time and per-stage memory, so a solver's reported figures can be
checked against the cost model directly (tests/test_cost_consumers.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from planner.calibration import Calibration
from planner.cost.compute import compute_terms, microbatch_overhead_ms
from planner.cost.held import (
    held_output, held_output_per_layer, loss_saved_bytes, running_i_extra, sent_bytes, stage_wgrad, wgrad_per_layer,
)
from planner.cost.memory import (
    boundary_bytes, buffer_bytes, checkpoint_input_bytes, kept_activation_bytes, kept_bytes, optimizer_factor,
    optimizer_workspace, receive_buffer_microbatches, runtime_buffers, scaled_skip_edges, stage_bytes, stage_entry_bytes,
    transient_bytes,
)
from planner.cost.batch import layer_range_batch_bytes
from planner.cost.transient import rematerialized_bytes
from planner.cost.w_workspace import stage_w_workspace
from planner.errors import PplanError
from planner.profiling.profile import LayerCosts

__all__ = ["StageCost", "stage_cost", "microbatch_ms", "stage_peak_bytes"]


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
    """Extra bytes alive while a backward runs: the largest over the stage's layers of the layer's
    workspace + its activations if recomputed (planner.cost.transient)."""
    input_bytes: float
    """Bytes received per micro-batch (0 for the first stage)."""
    output_bytes: float
    """Bytes sent per micro-batch (0 for the last stage)."""
    comm_fwd_ms: float = 0.0
    """The part of fwd_ms spent in collectives (tensor-parallel all-reduces, ZeRO-3 gathers), ms."""
    comm_bwd_ms: float = 0.0
    """The part of bwd_ms (and of bwd_input_ms) spent in collectives, ms (a recomputed forward's own
    collectives are in recompute_ms)."""
    grad_sync_ms: float = 0.0
    """Data-parallel gradient synchronisation of this stage once per iteration, ms (0 without data
    parallelism); the simulator decides how much of it the last backward hides."""
    optimizer_workspace_bytes: float = 0.0
    """Temporaries of the optimizer step over this stage's parameters (planner.cost.optimizer_workspace)."""
    held_output_bytes: float = 0.0
    """The part of kept_bytes that is the stage output torch holds for the backward (planner.cost.held_output):
    freed with the rest at the end of B; with a split backward at the end of I, less sent_held_bytes,
    which stays until the end of W (the rest of kept_bytes goes at the end of W)."""
    recv_microbatches: int | None = None
    """Micro-batches torch's stage keeps a receive buffer for (planner.cost.buffer_bytes); None: the older
    two-buffers model (a profile without input_saved_bytes, or no micro-batch count given)."""
    batch_input_bytes: float = 0.0
    """The model input per micro-batch when this is the first stage (its share of the step's input batch), else 0."""
    wgrad_bytes: float = 0.0
    """Bytes held per micro-batch from the end of its I to the end of its W when the backward is split (planner.cost.held.stage_wgrad)."""
    running_i_bytes: float = 0.0
    """What a running I holds beyond transient_bytes: the wgrads it stores as its backward goes (planner.cost.held.running_i_extra)."""
    w_workspace_bytes: float = 0.0
    """What a split W holds while it runs beyond the stage's gradients: fresh weight gradients of two
    parameter groups and temporaries (planner.cost.w_workspace; 0 on the first stage)."""
    sent_grad_bytes: float = 0.0
    """Bytes each input gradient sent (by an I, or a B where the runtime holds its sends) holds until
    the step ends (planner.cost.held.sent_bytes)."""
    sent_output_bytes: float = 0.0
    """Bytes each output sent holds until the step ends, beyond its W (or its B where the runtime holds
    its sends) (planner.cost.held.sent_bytes)."""
    sent_held_bytes: float = 0.0
    """What a micro-batch still holds of held_output_bytes from the end of its I to the end of its W, less
    what its I freed of the loss's saved tensors (planner.cost.held.pending_output: all of the output on
    every stage but the last; on the last none, and minus the loss's tensors)."""

    @property
    def sent(self) -> tuple[float, float, float]:
        """planner.cost.moment_bytes' `sent`."""
        return self.sent_grad_bytes, self.sent_output_bytes, self.sent_held_bytes

    @property
    def buffer_bytes(self) -> float:
        return float(buffer_bytes(self.input_bytes, self.output_bytes, self.recv_microbatches, self.batch_input_bytes))


def stage_cost(
    costs: LayerCosts,
    first: int,
    end: int,
    recompute: Iterable[int] = (),
    optimizer: str = "adam",
    speed: float = 1.0,
    n_microbatches: int | None = None,
) -> StageCost:
    """Cost of layers [first, end) with `recompute` checkpointed, on a device of relative `speed`,
    in a step of `n_microbatches` (the receive buffers torch allocates; None: the older model)."""
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
    boundary = boundary_bytes(costs)
    kept = kept_activation_bytes(costs)
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
        static_bytes=params * (2.0 + optimizer_factor(optimizer, costs.param_element_bytes)),
        kept_bytes=kept_bytes(kept, checkpoint_input_bytes(costs), first, end, rec, scaled_skip_edges(costs),
                              held_output_per_layer(costs), stage_entry_bytes(costs)),
        transient_bytes=transient_bytes(rematerialized_bytes(kept, costs.checkpoint_extra_bytes), rec, costs.workspace_bytes, first, end),
        optimizer_workspace_bytes=optimizer_workspace(costs.optimizer_workspace_bytes, first, end, optimizer,
                                                      costs.param_element_bytes),
        held_output_bytes=held_output(held_output_per_layer(costs), end),
        input_bytes=float(boundary[first]),
        output_bytes=float(boundary[end]),
        recv_microbatches=receive_buffer_microbatches(runtime_buffers(costs), n_microbatches),
        batch_input_bytes=layer_range_batch_bytes(costs, first, end),
        wgrad_bytes=stage_wgrad(wgrad_per_layer(costs), first, end),
        running_i_bytes=running_i_extra(costs.workspace_bytes, wgrad_per_layer(costs), first, end),
        w_workspace_bytes=stage_w_workspace(costs.w_workspace_bytes, costs.w_carry_bytes, first, end),
        **_sent_fields(costs, boundary, first, end),
    )


def _sent_fields(costs: LayerCosts, boundary: np.ndarray, first: int, end: int) -> dict[str, float]:
    """StageCost's sent_* fields (planner.cost.held.sent_bytes)."""
    held = held_output(held_output_per_layer(costs), end)
    names = ("sent_grad_bytes", "sent_output_bytes", "sent_held_bytes")
    got = sent_bytes(boundary[first], boundary[end], held, costs.wgrad_bytes is not None, end == len(costs.fwd_ms),
                     loss_saved_bytes(costs))
    return dict(zip(names, (float(x) for x in got)))


def microbatch_ms(stage: StageCost, calibration: Calibration | None = None, split_backward: bool = False,
                  send_in_ms: float = 0.0, send_out_ms: float = 0.0) -> float:
    """The partitioner's time of one micro-batch on `stage` (planner.cost.compute.stage_time_ms),
    from its StageCost: calibrated forward + backward (recompute included) + per-action overheads + sends."""
    scale = compute_terms(calibration)[0]
    return (stage.fwd_ms + stage.bwd_ms) * scale + microbatch_overhead_ms(calibration, split_backward) + send_in_ms + send_out_ms


def stage_peak_bytes(stage: StageCost, in_flight: float, moments: Sequence[Any] | None = None) -> float:
    """The partitioner's memory of `stage` at the schedule's `moments` (planner.schedules.memory's
    stage_memory_moments for its position; None: `in_flight` micro-batches with the transient and
    every gradient, the older bound) (planner.cost.memory.stage_bytes)."""
    return float(stage_bytes(stage.static_bytes, stage.input_bytes, stage.output_bytes, in_flight,
                             stage.kept_bytes, stage.transient_bytes, stage.optimizer_workspace_bytes,
                             stage.recv_microbatches, stage.batch_input_bytes, stage.param_bytes, moments,
                             stage.wgrad_bytes, stage.sent, stage.held_output_bytes, stage.running_i_bytes,
                             stage.w_workspace_bytes))
