"""Do the report's inputs describe one plan, and is each timeline what its flag says?

A report that set one plan's prediction beside another plan's measurement, or drew a simulated
timeline as the measured one, would compare nothing and say it compared something: a 1f1b
simulation set against a zb run read as "prediction error -48%". Each check here refuses such a
pair on one line that names the files and what differs.
"""

from __future__ import annotations

from typing import Any, Sequence

from planner.errors import PlanError, PplanError
from planner.execute.planmatch import check_run_of_plan
from planner.execute.runrecord import RunRecord
from planner.plan import Plan
from planner.report.style import KIND_LABELS
from planner.simulation.result import SimulationRecord, TimelineRow

__all__ = [
    "check_consistent",
    "sim_differences",
    "sim_run_differences",
    "SIM_OF_PLAN_HINT",
    "SIM_AND_RUN_HINT",
    "SIMULATED_ONLY_KINDS",
    "check_timeline_of_plan",
    "check_measured_timeline",
]

SIM_OF_PLAN_HINT = "give the simulation of this plan (`pplan simulate PLAN --out SIM` writes it), or the plan it simulated"
"""What to do about a simulation of another plan (the run's: planner.execute.planmatch.RUN_OF_PLAN_HINT)."""
SIM_AND_RUN_HINT = ("give the simulation and the run of one plan (`pplan simulate PLAN --out SIM` and `pplan run PLAN "
                    "--out RUN` write them), or add --plan PLAN to hold each to it")
"""What to do about a simulation and a run of two different plans, given without the plan."""
SIMULATED_ONLY_KINDS = ("C", "A", "T")
"""Timeline rows only the simulator writes: transfers, the data-parallel gradient sync and the tensor-parallel
collectives; the executor times compute and the optimizer step only (docs/executor.md, "Timeline")."""


def check_consistent(plan: Plan | None, run: RunRecord | None, sources: dict[str, str] | None = None,
                     sim: SimulationRecord | None = None) -> None:
    """Refuse a plan whose recorded prediction lists other devices than it has, a run of another
    plan and a simulation of another plan: a report that set one plan's prediction beside another's
    measurement, or drew another plan's simulation as this one's, would compare nothing. The run is
    held to its plan as `pplan calibrate --from-run` holds it (planner.execute.planmatch), the
    simulation in the same words; without a plan, the simulation is held to the run on what both
    record (sim_run_differences). `sources` names the files in the message."""
    sources = sources or {}
    if plan is None:
        if sim is not None and run is not None and (differences := sim_run_differences(sim, run)):
            than = f" than the run {sources['run']}" if "run" in sources else " than the run"
            raise PplanError(f"{_where(sources)}the simulation is of a different plan{than}: {', '.join(differences)}",
                             SIM_AND_RUN_HINT)
        return
    plan_name = sources.get("plan", "the plan")
    if plan.predicted is not None and (message := plan.predicted.device_count_error(plan.n_devices, "predicted")):
        raise PlanError(f"{plan_name}: {message}", "the prediction must be of this plan: re-run `pplan simulate` or "
                                                   "`pplan partition`, or drop `predicted`")
    if run is not None:
        check_run_of_plan(run, plan, sources.get("run"), sources.get("plan"))
    if sim is not None and (differences := sim_differences(sim, plan)):
        than = f" than {sources['plan']}" if "plan" in sources else ""
        raise PplanError(f"{_where(sources)}the simulation is of a different plan{than}: {', '.join(differences)}",
                         SIM_OF_PLAN_HINT)


def _where(sources: dict[str, str]) -> str:
    return f"{sources['sim']}: " if "sim" in sources else ""


def sim_differences(sim: SimulationRecord, plan: Plan) -> list[str]:
    """What makes `sim` a simulation of another plan than `plan`, one 'field sim-value vs plan-value'
    each (empty: the same plan): the schedule, micro-batches and their size, and the devices it lists
    (a simulation lists every device of its plan; a field the file leaves out is not compared)."""
    pred = sim.prediction
    return _differences([("schedule", pred.schedule, plan.schedule),
                         ("n_microbatches", pred.n_microbatches, plan.n_microbatches),
                         ("micro_batch_size", pred.micro_batch_size, plan.micro_batch_size),
                         ("devices", None if pred.devices is None else len(pred.devices), plan.n_devices)])


def sim_run_differences(sim: SimulationRecord, run: RunRecord) -> list[str]:
    """What makes `sim` a simulation of another plan than the one `run` ran, one 'field sim-value vs
    run-value' each (empty: no difference either records): the schedule, micro-batches and their
    size, the pipeline devices (a simulation lists each once; a run's ranks name the device each
    plays), as sim_differences holds a simulation to a plan."""
    pred = sim.prediction
    run_devices = {r.device: r for r in run.ranks}
    differences = _differences([("schedule", pred.schedule, run.schedule),
                                ("n_microbatches", pred.n_microbatches, run.n_microbatches),
                                ("micro_batch_size", pred.micro_batch_size, run.micro_batch_size),
                                ("devices", len(pred.devices) if pred.devices else None,
                                 len(run_devices) if run_devices else None)])
    # memory limits are not compared: `pplan simulate --hardware` prices a plan under other limits,
    # and with --plan (sim_differences) a simulation is not held to them either
    return differences


def _differences(pairs: Sequence[tuple[str, Any, Any]]) -> list[str]:
    """'name a vs b' for each pair whose values differ, where both files record the value."""
    return [f"{name} {_short(a)} vs {_short(b)}" for name, a, b in pairs if a is not None and b is not None and a != b]


def _short(value: Any) -> str:
    """A value in a one-line message, cut at 60 characters."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_timeline_of_plan(rows: Sequence[TimelineRow], plan: Plan, source: str) -> None:
    """Refuse the first timeline row whose device or stage the plan does not have: a timeline of
    another plan would be drawn as this one's (a 'dev3' lane under a 2-device plan). The gradient
    sync and optimizer rows have stage -1."""
    for i, row in enumerate(rows):
        if row.device >= plan.n_devices or row.stage >= plan.n_stages:
            raise PplanError(f"{source}: row {i + 1} ({row.kind} of micro-batch {row.microbatch}): device {row.device}, "
                             f"stage {row.stage} is outside the plan ({plan.n_devices} devices, {plan.n_stages} stages)",
                             "give the timeline `pplan simulate --timeline` or `pplan run` wrote for this plan")


def check_measured_timeline(rows: Sequence[TimelineRow], source: str, simulated: Sequence[TimelineRow] | None = None,
                            simulated_source: str | None = None) -> None:
    """Refuse a simulated timeline given as the measured one (--measured-timeline): it holds rows the
    executor never writes (SIMULATED_ONLY_KINDS), and would be drawn as what the run measured. When the
    --timeline given beside it (`simulated`) holds none of them, the hint says the two are swapped."""
    found = next(((i, row) for i, row in enumerate(rows) if row.kind in SIMULATED_ONLY_KINDS), None)
    if found is None:
        return
    i, row = found
    if simulated is not None and not any(r.kind in SIMULATED_ONLY_KINDS for r in simulated):
        hint = (f"the two timelines look swapped ({simulated_source} has no such rows): pass --timeline {source} "
                f"--measured-timeline {simulated_source}")
    else:
        hint = "pass it as --timeline; the measured timeline is the one `pplan run PLAN --timeline FILE` writes"
    raise PplanError(f"{source}: row {i + 1} is a {row.kind} row ({KIND_LABELS[row.kind]}), which only the simulator "
                     "writes: this is a simulated timeline, not a measured one", hint)
