"""What a report computes rather than reads: a simulation of the plan, and the micro-batch sweep.

Both need the plan and its profile, and the simulator (`planner.simulate`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from planner.errors import PplanError
from planner.report.inputs import ReportInputs, TimelineRow

__all__ = ["SweepPoint", "Derived", "derive", "sweep_sizes", "MAX_SWEEP_POINTS"]

# Divisors of the global batch can be many (e.g. 720 has 30); keep the sweep to a few seconds.
MAX_SWEEP_POINTS = 12


@dataclass(frozen=True)
class SweepPoint:
    """One simulated (schedule, micro-batch count) variant of the plan."""

    schedule: str
    """Schedule name."""
    n_microbatches: int
    """Micro-batches per iteration."""
    micro_batch_size: int
    """Samples per micro-batch (global batch / n_microbatches)."""
    iteration_ms: float
    """Simulated iteration time, ms."""
    bubble_fraction: float
    """Simulated idle fraction of device time."""
    peak_memory_bytes: float
    """Largest per-device peak memory."""
    feasible: bool
    """Every device within its memory limit."""


@dataclass(frozen=True)
class Derived:
    """Results computed for the report; `inputs` replaces the given inputs when set."""

    inputs: ReportInputs | None = None
    """Inputs completed with a simulation of the plan (None = unchanged)."""
    sweep: tuple[SweepPoint, ...] = ()
    """The micro-batch x schedule sweep."""
    sweep_skipped: str | None = None
    """Why there is no sweep."""
    baselines: tuple[dict[str, Any], ...] = ()
    """Baselines recomputed here when the plan records none."""
    notes: tuple[str, ...] = ()
    """What was computed, for the index."""


def sweep_sizes(global_batch: int, n_ranks: int, limit: int = MAX_SWEEP_POINTS) -> list[int]:
    """Micro-batch counts to try: divisors of the global batch, thinned to at most `limit`.

    Thinning keeps the smallest and largest, the pipeline depth, and powers of two first.
    """
    divisors = [m for m in range(1, global_batch + 1) if global_batch % m == 0]
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


def _simulate_plan(plan: Any, profile: Any) -> tuple[dict[str, Any], list[TimelineRow]]:
    """Simulation JSON and timeline of `plan`, with the profile's calibration if it has one."""
    from planner.calibration import find_calibration
    from planner.simulate import simulate

    calibration = find_calibration(profile.path)
    result = simulate(plan, profile, calibration=calibration)
    return result.to_dict(), [TimelineRow(*row) for row in result.timeline]


def _sweep(plan: Any, profile: Any, sizes: list[int]) -> list[SweepPoint]:
    """The plan's cuts under each schedule it can use and each micro-batch count in `sizes`."""
    from planner.calibration import find_calibration
    from planner.errors import ScheduleError
    from planner.schedules.registry import SCHEDULE_NAMES, get_schedule
    from planner.simulate import simulate

    calibration = find_calibration(profile.path)
    schedules = tuple(n for n in SCHEDULE_NAMES if get_schedule(n).multi_chunk == (plan.virtual_stages > 1))
    points = []
    for name in schedules:
        for m in sizes:
            variant = plan.with_(schedule=name, n_microbatches=m, micro_batch_size=plan.global_batch // m,
                                 predicted=None, search=None)
            try:
                res = simulate(variant, profile, calibration=calibration, record_timeline=False)
            except ScheduleError:
                continue  # this schedule cannot run at this size (e.g. 1F1B needs M >= devices)
            points.append(SweepPoint(name, m, variant.micro_batch_size, res.iteration_ms, res.bubble_fraction,
                                     max(res.peak_memory_bytes), res.fits))
    return points


def derive(inputs: ReportInputs, say: Callable[[str], None] = lambda _m: None) -> Derived:
    """Simulate the plan if no simulation was given, and sweep micro-batch counts and schedules.

    A plan the simulator rejects (another model's profile, sizes a schedule cannot run) is
    not fatal: the figures that need the simulation are skipped and the index says why.
    """
    if inputs.plan is None or inputs.profile is None:
        return Derived(sweep_skipped="needs a plan and its profile (--plan and --profile) to simulate the sweep")
    from planner.calibration import find_calibration

    notes: list[str] = []
    completed = inputs
    if inputs.sim is None or inputs.timeline is None:
        say("simulating the plan")
        try:
            sim, timeline = _simulate_plan(inputs.plan, inputs.profile)
        except PplanError as e:
            reason = f"the plan could not be simulated with this profile: {e.one_line()}"
            return Derived(sweep_skipped=reason, notes=(reason,))
        changes: dict[str, Any] = {}
        if inputs.sim is None:
            changes["sim"] = sim
            notes.append("The simulation was computed here from the plan and the profile.")
        if inputs.timeline is None:
            changes["timeline"] = tuple(timeline)
            notes.append("The simulated timeline was computed here from the plan and the profile.")
        completed = replace(inputs, **changes)
    if find_calibration(inputs.profile.path) is not None:
        notes.append("What is simulated here (the sweep, and the simulation when no --sim was given) applies the "
                     "calibration found beside the profile.")
    say("sweeping micro-batch counts and schedules")
    try:
        points = _sweep(inputs.plan, inputs.profile, sweep_sizes(inputs.plan.global_batch, inputs.plan.n_devices))
    except PplanError as e:
        return Derived(inputs=completed, sweep_skipped=f"the sweep failed: {e.one_line()}", notes=tuple(notes))
    return Derived(inputs=completed, sweep=tuple(points), notes=tuple(notes),
                   sweep_skipped=None if points else "no schedule could run the plan at any micro-batch count")
