"""What a report computes rather than reads: a simulation of the plan, and the micro-batch sweep.

Both need the plan and its profile; the sweep is planner.whatif's. Everything simulated here
uses one basis, named in the report: the calibration (--calibration, else the profile's own),
or the profile as measured. A calibration fitted on the very run the report shows is labelled
as a fit: its gap to that run is a residual, never a prediction error.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

from planner.atomic import resolved_path
from planner.errors import PplanError
from planner.partition.search import divisors as all_divisors
from planner.execute.runrecord import RunRecord
from planner.report.inputs import ReportInputs, TimelineRow

if TYPE_CHECKING:
    from planner.calibration import Calibration

__all__ = ["Derived", "derive", "without_simulation", "NOT_SIMULATED", "sweep_sizes", "sweep_counts", "replica_batch",
           "fitted_on_run", "MAX_SWEEP_POINTS"]

# Divisors of the global batch can be many (e.g. 720 has 30); keep the sweep to a few seconds.
MAX_SWEEP_POINTS = 12


@dataclass(frozen=True)
class Derived:
    """Results computed for the report; `inputs` replaces the given inputs when set."""

    inputs: ReportInputs | None = None
    """Inputs completed with a simulation of the plan (None = unchanged)."""
    sweep: tuple[Any, ...] = ()
    """The micro-batch x schedule sweep."""
    sweep_skipped: str | None = None
    """Why there is no sweep."""
    notes: tuple[str, ...] = ()
    """What was computed, for the index."""
    timeline_skipped: str | None = None
    """Why the simulated timeline was not recorded though the plan was simulated (too many actions to draw)."""
    calibration_warning: str | None = None
    """The calibration simulated with was fitted on another model or profile (calibration_mismatch's line)."""
    not_simulated: str | None = None
    """Why nothing was simulated though the plan and its profile were given (--no-simulate): the reason
    figures 1 to 3 give instead of naming inputs that were given or a simulation that was never tried."""


def sweep_sizes(batch: int, n_ranks: int, limit: int = MAX_SWEEP_POINTS) -> list[int]:
    """Micro-batch counts to try: divisors of `batch` (one replica's), thinned to at most `limit`.

    Thinning keeps the smallest and largest, the pipeline depth, and powers of two first.
    """
    divisors = all_divisors(batch)  # trial division to sqrt: a global batch of 10**8 took 8.4 s counted one by one
    if len(divisors) <= limit:
        return divisors
    preferred = {divisors[0], divisors[-1]} | {m for m in divisors if m == n_ranks}
    preferred |= {m for m in divisors if m & (m - 1) == 0}
    chosen = sorted(preferred)
    if len(chosen) > limit:  # too many powers of two: keep a log-spaced subset
        step = (len(chosen) - 1) / (limit - 1)
        chosen = sorted({chosen[round(i * step)] for i in range(limit)})
    rest = [m for m in divisors if m not in chosen]
    while len(chosen) < limit and rest:
        chosen.append(rest.pop(len(rest) // 2))
    return sorted(chosen)


def replica_batch(plan: Any) -> int:
    """Samples one data-parallel replica runs per iteration (global batch / dp): what a swept count M
    divides, each micro-batch then b = this / M samples (planner.whatif.change.split_batch)."""
    return plan.n_microbatches * plan.micro_batch_size


def sweep_counts(plan: Any) -> list[int]:
    """The micro-batch counts the report sweeps for `plan`: divisors of one replica's batch. Divisors of the
    global batch were swept before: with dp 4 those beyond the replica's batch (64 and 128 of a global 128)
    could not run, and thinning a large batch's divisors kept counts that do not divide the replica's."""
    return sweep_sizes(replica_batch(plan), plan.n_devices)


def fitted_on_run(cal: Calibration | None, run: RunRecord | None, run_source: str | None = None) -> bool:
    """Whether `cal` was fitted on `run` (its fitted_from names the same file, or the same measured
    iteration time)."""
    if cal is None or run is None or cal.fitted_from is None:
        return False
    src = cal.fitted_from.run
    if src and run_source and resolved_path(src) == resolved_path(run_source):  # a symlink loop raises nothing
        return True
    a, b = cal.fitted_from.measured_ms, run.iteration_ms_measured
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= 1e-6 * max(abs(b), 1.0)


def _sweep(plan: Any, profile: Any, sizes: list[int], calibration: Any) -> list[Any]:
    """The plan's cuts under each schedule it can use and each micro-batch count in `sizes`."""
    from planner.schedules.registry import SCHEDULE_NAMES, get_schedule
    from planner.whatif import sweep_grid

    schedules = tuple(n for n in SCHEDULE_NAMES if get_schedule(n).multi_chunk == (plan.virtual_stages > 1))
    return sweep_grid(plan, profile, schedules, sizes, calibration)


NOT_SIMULATED = "not simulated: --no-simulate draws only from the given files"


def without_simulation(inputs: ReportInputs) -> Derived:
    """What the report has when told not to simulate (--no-simulate): nothing computed, and the
    figures that a simulation of the given plan and profile would draw say why they are missing."""
    if inputs.plan is None or inputs.profile is None:
        return Derived()
    return Derived(sweep_skipped=NOT_SIMULATED, not_simulated=NOT_SIMULATED)


def derive(inputs: ReportInputs, say: Callable[[str], None] = lambda _m: None) -> Derived:
    """Simulate the plan if no simulation was given, and sweep micro-batch counts and schedules.

    A plan the simulator rejects (another model's profile, sizes a schedule cannot run) is
    not fatal: the figures that need the simulation are skipped and the index says why.
    """
    if inputs.plan is None or inputs.profile is None:
        return Derived(sweep_skipped="needs a plan and its profile (--plan and --profile) to simulate the sweep")
    from planner.calibration import basis_text, calibration_mismatch
    from planner.limits import MAX_TIMELINE_ACTIONS
    from planner.machine import prediction_basis
    from planner.simulate import check_action_count, simulate

    cal, cal_path = prediction_basis(inputs.profile, inputs.calibration, ranks=inputs.plan.n_devices)
    mismatch = calibration_mismatch(cal, inputs.profile, cal_path)
    basis = basis_text(cal, cal_path)
    fit = fitted_on_run(cal, inputs.run, inputs.sources.get("run"))
    notes = [f"Basis of everything simulated here: {basis}."]
    if fit:
        notes.append("That calibration was fitted on the run shown here, so the calibrated simulation's gap to this "
                     "run is a fit residual, not a prediction error; the run's own prediction (made before the "
                     "calibration) is the prediction to judge. Check a calibration on a new run.")
    changes: dict[str, Any] = {"basis": basis, "sim_is_fit": fit and inputs.sim is None}
    timeline_skipped = None
    if inputs.sim is None or inputs.timeline is None:
        say("simulating the plan")
        plan = inputs.plan
        try:
            # beyond the timeline's bound the plan is still simulated (figures 2 and 3 need no timeline)
            n = check_action_count(plan.schedule, plan.n_stages, plan.n_microbatches)
            with_timeline = n <= MAX_TIMELINE_ACTIONS
            result = simulate(plan, inputs.profile, calibration=cal, record_timeline=with_timeline)
        except PplanError as e:
            reason = f"the plan could not be simulated with this profile: {e.one_line()}"
            return Derived(sweep_skipped=reason, notes=(reason,), calibration_warning=mismatch)
        if not with_timeline and inputs.timeline is None:
            timeline_skipped = (f"the report draws the iteration's timeline only up to {MAX_TIMELINE_ACTIONS:,} actions and "
                                f"this plan has {n:,} ({plan.n_stages} stages x {plan.n_microbatches} micro-batches); "
                                "fewer micro-batches (larger ones instead) draw it")
            notes.append(f"The simulated timeline was not recorded: {timeline_skipped}.")
        if inputs.sim is None:
            changes["sim"] = replace(result.record(), basis=basis)  # the summary shows each value's basis
            if fit:
                changes["sim_label"] = "calibrated on this run (a fit)"
            elif cal is not None and inputs.sim_label == "simulation":
                changes["sim_label"] = "simulation (calibrated)"
            notes.append("The simulation was computed here from the plan and the profile.")
        if inputs.timeline is None and with_timeline:
            changes["timeline"] = tuple(TimelineRow(*row) for row in result.timeline)
            notes.append("The simulated timeline was computed here from the plan and the profile.")
    completed = replace(inputs, **changes)
    say("sweeping micro-batch counts and schedules")
    try:
        points = _sweep(inputs.plan, inputs.profile, sweep_counts(inputs.plan), cal)
    except PplanError as e:
        return Derived(inputs=completed, sweep_skipped=f"the sweep failed: {e.one_line()}", notes=tuple(notes),
                       timeline_skipped=timeline_skipped, calibration_warning=mismatch)
    return Derived(inputs=completed, sweep=tuple(points), notes=tuple(notes), timeline_skipped=timeline_skipped,
                   calibration_warning=mismatch,
                   sweep_skipped=None if points else "no schedule could run the plan at any micro-batch count")
