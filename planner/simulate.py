"""Simulate a plan: the single source of truth for iteration time and memory over time.

    simulate(plan, profile)            -> SimResult  (costs from the profile via planner.cost)
    simulate_costs(schedule, stages, stage_device, devices, links, micro_batch_size=...)
                                       -> SimResult  (the fast core the partitioner calls)

The model (communication overlap, FIFO links, recompute, optimizer, calibration) is described
in planner.simulation.engine and docs/simulator.md.
"""

from __future__ import annotations

from planner.calibration import Calibration
from planner.cost import StageCost, stage_cost
from planner.errors import PlanError
from planner.plan import Plan
from planner.profiling.profile import Profile
from planner.schedules import generate
from planner.simulation.engine import simulate_costs
from planner.simulation.result import TIMELINE_COLUMNS, SimResult, TimelineRow

__all__ = ["simulate", "simulate_costs", "plan_stage_costs", "SimResult", "TimelineRow", "TIMELINE_COLUMNS"]


def plan_stage_costs(plan: Plan, profile: Profile) -> tuple[list[StageCost], bool]:
    """(per-stage costs at the plan's micro-batch size and device speeds, interpolated?)."""
    if plan.n_layers is not None and plan.n_layers != profile.n_layers:
        raise PlanError(f"plan is for {plan.n_layers} layers but the profile has {profile.n_layers}", "simulate with the profile the plan was made from (--profile)")
    plan.validate(profile.n_layers)
    costs = profile.at(plan.micro_batch_size)
    stages = [
        stage_cost(costs, st.layers[0], st.layers[1], st.recompute, plan.optimizer, plan.devices[st.device].speed)
        for st in plan.stages
    ]
    return stages, costs.interpolated


def simulate(plan: Plan, profile: Profile, *, calibration: Calibration | None = None,
             record_timeline: bool = True) -> SimResult:
    """Simulate one training iteration of `plan` with costs from `profile`.

    The micro-batch size selects the profile's rows (interpolated if not measured: the result's
    `interpolated` says so). ScheduleError if the schedule cannot run at the plan's sizes.
    """
    stages, interpolated = plan_stage_costs(plan, profile)
    schedule = generate(plan.schedule, plan.n_devices, plan.n_microbatches, plan.virtual_stages)
    return simulate_costs(
        schedule, stages, [st.device for st in plan.stages], plan.devices, plan.links,
        micro_batch_size=plan.micro_batch_size, optimizer=plan.optimizer, calibration=calibration,
        record_timeline=record_timeline, interpolated=interpolated,
    )
