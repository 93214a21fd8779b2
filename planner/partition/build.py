"""From profile costs and a device layout to a PartitionProblem, and from a solution to StageCosts.

The problem's arrays are planner.cost's (layer_arrays, link_terms, microbatch_overhead_ms),
so the DP, the baselines and the simulator judge a plan with one model; this module only adds
what depends on the layout. A stage position's budget is its device's limit divided by the
stages per device (interleaved chunks share a device; the split is conservative), less a 1e-9
safety margin so a plan that fits here also fits in the simulator despite floating-point
summation order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from planner.calibration import Calibration
from planner.cost import (
    StageCost, layer_arrays, link_between, link_terms, microbatch_overhead_ms, receive_buffer_microbatches, stage_cost,
)
from planner.partition.problem import PartitionProblem
from planner.plan import Device, Links, StagePlan
from planner.profiling.profile import LayerCosts
from planner.schedules.memory import Moment

__all__ = ["Layout", "build_problem", "stage_costs", "stage_plans", "BUDGET_MARGIN"]

BUDGET_MARGIN = 1e-9


@dataclass(frozen=True)
class Layout:
    """Which device runs which stage position, and the links between them."""

    devices: tuple[Device, ...]
    """All devices of the plan (plan order)."""
    order: tuple[int, ...]
    """Schedule rank -> device index (the pipeline order of devices)."""
    links: Links
    """Link model between devices."""
    virtual_stages: int = 1
    """Stages per device (2 for interleaved)."""

    @property
    def n_ranks(self) -> int:
        return len(self.order)

    @property
    def n_stages(self) -> int:
        return self.n_ranks * self.virtual_stages

    def device_of(self, s: int) -> int:
        """Device index of stage s (stage s runs on rank s mod P)."""
        return self.order[s % self.n_ranks]


def _links(layout: Layout, calibration: Calibration | None) -> tuple[np.ndarray, np.ndarray]:
    """Per boundary between positions s and s+1: planner.cost's (latency ms, ms per byte)."""
    S = layout.n_stages
    lat = np.zeros(max(S - 1, 0))
    mpb = np.zeros(max(S - 1, 0))
    for s in range(S - 1):
        lat[s], mpb[s] = link_terms(link_between(layout.links, layout.device_of(s), layout.device_of(s + 1)), calibration)
    return lat, mpb


def build_problem(costs: LayerCosts, layout: Layout, inflight: Sequence[int], *, optimizer: str,
                  recompute: str, calibration: Calibration | None = None,
                  split_backward: bool = False, n_microbatches: int | None = None,
                  moments: Sequence[tuple[Moment, ...]] | None = None) -> PartitionProblem:
    """The stage-cut instance for these costs, devices and the schedule's in-flight counts, in a
    step of `n_microbatches` (torch's receive buffers, planner.cost.buffer_bytes; None: the older model).

    `moments`: per stage position, planner.schedules.memory.stage_memory_moments (the simulator's
    own memory moments: gradients only once they exist); None: `inflight` micro-batches (the most
    at any moment, planner.schedules.memory.stage_inflight_peak) with the transient and every
    gradient, the older bound: above the simulator for GPipe, below it where sends are held or a W
    pending (interleaved, zb: a 175B zb stage 115.6 GiB against 133.3 GiB simulated), so every
    search passes moments."""
    S = layout.n_stages
    arrays = layer_arrays(costs, optimizer, calibration)
    budgets, speeds = np.empty(S), np.empty(S)
    for s in range(S):
        dev = layout.devices[layout.device_of(s)]
        budgets[s] = np.inf if dev.memory_bytes is None else dev.memory_bytes / layout.virtual_stages * (1 - BUDGET_MARGIN)
        speeds[s] = dev.speed
    lat, mpb = _links(layout, calibration)
    return PartitionProblem(
        compute_ms=arrays.compute_ms,
        recompute_ms=arrays.recompute_ms,
        static_bytes=arrays.static_bytes,
        activation_bytes=arrays.activation_bytes,
        input_bytes=arrays.checkpoint_bytes,
        boundary_bytes=arrays.boundary_bytes,
        inflight=np.asarray(inflight, dtype=float),
        budget=budgets,
        speed=speeds,
        overhead_ms=np.full(S, microbatch_overhead_ms(calibration, split_backward)),
        link_latency_ms=lat,
        link_ms_per_byte=mpb,
        recompute=recompute,
        passthrough_edges=arrays.skip_edges,
        workspace_bytes=arrays.workspace_bytes,
        held_output_bytes=arrays.held_output_bytes,
        optimizer_workspace_bytes=arrays.optimizer_workspace_bytes,
        entry_bytes=arrays.entry_bytes,
        recv_microbatches=receive_buffer_microbatches(arrays.runtime_buffers, n_microbatches),
        batch_input_bytes=arrays.batch_input_bytes,
        batch_target_bytes=arrays.batch_target_bytes,
        moments=None if moments is None else tuple(tuple(m) for m in moments),
        gradient_bytes=np.asarray(costs.param_bytes, dtype=float),
        wgrad_bytes=arrays.wgrad_bytes,
        rematerialized_bytes=arrays.rematerialized_bytes,
        loss_saved_bytes=arrays.loss_saved_bytes,
        w_workspace_bytes=arrays.w_workspace_bytes,
        w_carry_bytes=arrays.w_carry_bytes,
    )


def stage_costs(costs: LayerCosts, layout: Layout, cuts: Sequence[int], recompute: Sequence[tuple[int, ...]],
                optimizer: str, n_microbatches: int | None = None) -> list[StageCost]:
    """planner.cost's StageCost of every stage (what the simulator consumes)."""
    return [
        stage_cost(costs, cuts[s], cuts[s + 1], recompute[s], optimizer, layout.devices[layout.device_of(s)].speed,
                   n_microbatches)
        for s in range(len(cuts) - 1)
    ]


def stage_plans(layout: Layout, cuts: Sequence[int], recompute: Sequence[tuple[int, ...]]) -> tuple[StagePlan, ...]:
    """The plan's stages."""
    return tuple(
        StagePlan(device=layout.device_of(s), layers=(int(cuts[s]), int(cuts[s + 1])), recompute=tuple(int(x) for x in recompute[s]))
        for s in range(len(cuts) - 1)
    )
