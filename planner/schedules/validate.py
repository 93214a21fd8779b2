"""Schedule validation: structure (exactly one F and one B, or I then W, per stage and
micro-batch, in a legal order on the right rank) and a deadlock check by a dry run.

The dry run gives every action one time step and every transfer none, and runs each rank's
actions in order as soon as their inputs exist; if some rank can never make progress the
schedule deadlocks and ScheduleError shows the rank x step grid with the stuck action marked.
The same unit-step run lays generated schedules out on a step grid (`spaced_order`).
"""

from __future__ import annotations

from planner.schedules.actions import Action, PipelineSchedule
from planner.schedules.compiled import CompiledSchedule, compile_schedule, sweep

__all__ = ["validate", "unit_steps", "spaced_order"]


def unit_steps(schedule: PipelineSchedule) -> tuple[CompiledSchedule, list[float]]:
    """Compile and dry-run with unit-time actions; returns (compiled, start step per action id)."""
    cs = compile_schedule(schedule)
    n_keys = cs.n_keys
    res = sweep(cs, [1.0] * n_keys, [0.0] * n_keys, [-1] * n_keys, 0, order=schedule.order)
    return cs, res.start


def validate(schedule: PipelineSchedule) -> None:
    """Raise ScheduleError unless `schedule` is complete, legal and deadlock-free."""
    unit_steps(schedule)


def spaced_order(schedule: PipelineSchedule) -> dict[int, tuple[Action | None, ...]]:
    """The schedule's actions placed on the unit-step grid of the dry run (None = idle step).

    Steps follow the dependencies with one step per action and free communication, the picture
    torch's `pipeline_order` draws; the simulator and executor ignore the idle slots.
    """
    cs, start = unit_steps(schedule)
    out: dict[int, tuple[Action | None, ...]] = {}
    for r in range(cs.n_ranks):
        row: list[Action | None] = []
        for a in (x for x in schedule.order[r] if x is not None):
            aid = cs.id_of(a)
            row.extend([None] * (int(start[aid]) - len(row)))
            row.append(a)
        out[r] = tuple(row)
    return out
