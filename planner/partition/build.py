"""From profile costs and a device layout to a PartitionProblem, and from a solution to StageCosts.

The problem's numbers are planner.cost's, so the DP, the baselines and the simulator judge a
plan with one model: stage time = (fwd + bwd + recomputed fwd) / speed, scaled and padded by
the calibration exactly as the simulator applies it; static memory = weights x (2 + optimizer
state factor); kept and transient activation bytes and boundary buffers as planner.cost says.
A stage position's budget is its device's limit divided by the stages per device (interleaved
chunks share a device; the split is conservative), less a 1e-9 safety margin so a plan that
fits here also fits in the simulator despite floating-point summation order.
For a model that is not a chain the boundary bytes are planner.cost's crossing bytes, a
recomputed layer's input what it reads from all earlier layers, and the skip edges travel
along (bytes per micro-batch) for the pass-through term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from planner.calibration import Calibration
from planner.cost import StageCost, optimizer_factor, stage_cost
from planner.graph.edges import SkipEdge
from planner.partition.problem import PartitionProblem
from planner.plan import Device, Links, StagePlan
from planner.profiling.profile import LayerCosts

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
    S = layout.n_stages
    lat = np.zeros(max(S - 1, 0))
    mpb = np.zeros(max(S - 1, 0))
    for s in range(S - 1):
        a, b = layout.device_of(s), layout.device_of(s + 1)
        if a == b:
            continue
        bw, la = layout.links.between(a, b)
        if calibration is not None and calibration.comm_bandwidth_bytes_per_s is not None:
            bw = calibration.comm_bandwidth_bytes_per_s
        if calibration is not None and calibration.comm_latency_ms is not None:
            la = calibration.comm_latency_ms
        lat[s], mpb[s] = la, 1e3 / bw
    return lat, mpb


def build_problem(costs: LayerCosts, layout: Layout, inflight: Sequence[int], *, optimizer: str,
                  recompute: str, calibration: Calibration | None = None,
                  split_backward: bool = False) -> PartitionProblem:
    """The stage-cut instance for these costs, devices and the schedule's in-flight counts."""
    S = layout.n_stages
    scale = calibration.compute_scale if calibration is not None else 1.0
    overhead = calibration.action_overhead_ms if calibration is not None else 0.0
    out = np.asarray(costs.output_bytes, dtype=float)
    input_bytes = np.concatenate([[float(costs.input_bytes)], out[:-1]])
    boundary = np.concatenate([[0.0], out[:-1], [0.0]])
    passthrough: tuple = ()
    if costs.skip_edges:  # not a chain: the same bytes planner.cost charges
        input_bytes = np.asarray(costs.layer_input_bytes, dtype=float)
        boundary = np.concatenate([[0.0], np.asarray(costs.crossing_bytes, dtype=float), [0.0]])
        b = costs.micro_batch_size
        passthrough = tuple(SkipEdge(e.src, e.dst, e.bytes_per_sample * b, e.also_to) for e in costs.skip_edges)
    budgets, speeds = np.empty(S), np.empty(S)
    for s in range(S):
        dev = layout.devices[layout.device_of(s)]
        budgets[s] = np.inf if dev.memory_bytes is None else dev.memory_bytes / layout.virtual_stages * (1 - BUDGET_MARGIN)
        speeds[s] = dev.speed
    lat, mpb = _links(layout, calibration)
    return PartitionProblem(
        compute_ms=(np.asarray(costs.fwd_ms, dtype=float) + np.asarray(costs.bwd_ms, dtype=float)) * scale,
        recompute_ms=np.asarray(costs.fwd_ms, dtype=float) * scale,
        static_bytes=np.asarray(costs.param_bytes, dtype=float) * (2.0 + optimizer_factor(optimizer)),
        activation_bytes=np.asarray(costs.activation_bytes, dtype=float),
        input_bytes=input_bytes,
        boundary_bytes=boundary,
        inflight=np.asarray(inflight, dtype=float),
        budget=budgets,
        speed=speeds,
        overhead_ms=np.full(S, overhead * (3 if split_backward else 2)),
        link_latency_ms=lat,
        link_ms_per_byte=mpb,
        recompute=recompute,
        passthrough_edges=passthrough,
    )


def stage_costs(costs: LayerCosts, layout: Layout, cuts: Sequence[int], recompute: Sequence[tuple[int, ...]],
                optimizer: str) -> list[StageCost]:
    """planner.cost's StageCost of every stage (what the simulator consumes)."""
    return [
        stage_cost(costs, cuts[s], cuts[s + 1], recompute[s], optimizer, layout.devices[layout.device_of(s)].speed)
        for s in range(len(cuts) - 1)
    ]


def stage_plans(layout: Layout, cuts: Sequence[int], recompute: Sequence[tuple[int, ...]]) -> tuple[StagePlan, ...]:
    """The plan's stages."""
    return tuple(
        StagePlan(device=layout.device_of(s), layers=(int(cuts[s]), int(cuts[s + 1])), recompute=tuple(int(x) for x in recompute[s]))
        for s in range(len(cuts) - 1)
    )
