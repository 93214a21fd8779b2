"""Is a run a run of this plan? The one comparison `pplan calibrate --from-run` and `pplan report`
both make before they set a run's measurements beside a plan's prediction.

A run of another plan fits numbers to the wrong simulation (a 1-micro-batch zb run read as a
4-micro-batch gpipe plan gave a 'calibration' 132% off its own run) and draws a report that
compares nothing.
"""

from __future__ import annotations

from typing import Any

from planner.errors import PplanError
from planner.execute.runrecord import RunRecord
from planner.plan import Plan

__all__ = ["plan_differences", "check_run_of_plan", "RUN_OF_PLAN_HINT"]

RUN_OF_PLAN_HINT = "give the run of this plan (`pplan run PLAN` writes it), or the plan it ran"
"""What to do about a run of another plan, for every command that refuses one."""


def plan_differences(run: RunRecord, plan: Plan) -> list[str]:
    """What makes `run` a run of another plan than `plan`, one 'field run-value vs plan-value' each
    (empty: the same plan): the model, schedule, optimizer, micro-batches and their size, stages,
    processes and data-parallel replicas; where those agree, each stage's layers and recompute set
    (runs that record them: older ones hold None and are taken as they are) and each rank's device
    and stages."""
    pairs = [("model", run.model, plan.model), ("schedule", run.schedule, plan.schedule),
             ("optimizer", run.optimizer, plan.optimizer),
             ("micro_batch_size", run.micro_batch_size, plan.micro_batch_size),
             ("n_microbatches", run.n_microbatches, plan.n_microbatches), ("n_stages", run.n_stages, plan.n_stages),
             ("n_ranks", run.n_ranks, plan.n_processes), ("dp", run.dp, plan.dp)]
    differences = [f"{name} {_text(ran)} vs {_text(planned)}" for name, ran, planned in pairs if ran != planned]
    if differences:  # the ranks' stages follow from the counts: compared only where those agree
        return differences
    for name, ran, planned in (("stage_layers", run.stage_layers, [list(st.layers) for st in plan.stages]),
                               ("stage_recompute", run.stage_recompute, [list(st.recompute) for st in plan.stages])):
        # the same shape cut elsewhere, or other layers recomputed (None: a run from before they were recorded)
        if ran is not None and [list(s) for s in ran] != planned:
            return [f"{name} {_text(ran)} vs {_text(planned)}"]
    for i, rank in enumerate(run.ranks):
        if not 0 <= rank.device < plan.n_devices:
            return [f"ranks[{i}].device {rank.device} vs devices 0..{plan.n_devices - 1}"]
        planned_stages = [s for s, st in enumerate(plan.stages) if st.device == rank.device]
        if sorted(rank.stages) != planned_stages:
            return [f"ranks[{i}].stages {_text(rank.stages)} vs {planned_stages} (device {rank.device})"]
    return []


def check_run_of_plan(run: RunRecord, plan: Plan, run_source: str | None = None,
                      plan_source: str | None = None) -> None:
    """Refuse `run` unless it is a run of `plan` (plan_differences), on one line that leads with the
    run's file and names the plan's: `run.json: the run is of a different plan than plan.json:
    schedule zb vs gpipe, n_microbatches 1 vs 4`."""
    if differences := plan_differences(run, plan):
        than = f" than {plan_source}" if plan_source else ""
        where = f"{run_source}: " if run_source else ""
        raise PplanError(f"{where}the run is of a different plan{than}: {', '.join(differences)}", RUN_OF_PLAN_HINT)


def _text(value: Any) -> str:
    """A value in a one-line message: text as it is (cut at 60 characters), anything else its repr."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
