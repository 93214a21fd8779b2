"""Pipeline schedules as data: generators, size checks, validation and their memory profile.

`generate(name, n_ranks, n_microbatches, virtual_stages)` returns a PipelineSchedule (per-rank
ordered actions, torch's IR) laid out on the unit-step grid. The families and what each
supports are in one registry (`get_schedule(name)`, `SCHEDULES`, `SCHEDULE_NAMES`: gpipe,
1f1b, interleaved with v >= 2 stages per rank (stage s on rank s mod P), zb = ZB-H1).
Generated schedules are validated once and cached: they are immutable and the partitioner
asks for the same sizes thousands of times.
"""

from __future__ import annotations

import functools

from planner.errors import ScheduleError
from planner.schedules.actions import Action, ActionKind, PipelineSchedule, format_order, parse_action
from planner.schedules.compiled import share_compiled
from planner.schedules.registry import SCHEDULE_NAMES, SCHEDULES, ScheduleSpec, get_schedule
from planner.schedules.validate import spaced_order, validate

__all__ = [
    "SCHEDULES",
    "SCHEDULE_NAMES",
    "Action",
    "ActionKind",
    "PipelineSchedule",
    "ScheduleError",
    "ScheduleSpec",
    "check_sizes",
    "format_order",
    "from_csv_rows",
    "generate",
    "generate_order",
    "get_schedule",
    "parse_action",
    "valid_microbatches",
    "validate",
]

_MAX_ACTIONS = 50_000_000  # beyond this a schedule would not fit in memory as Python objects


def valid_microbatches(name: str, n_ranks: int, n_microbatches: int) -> bool:
    """True when torch's schedule class of that name accepts this micro-batch count."""
    spec = SCHEDULES.get(name)
    return spec is None or spec.valid_microbatches(n_ranks, n_microbatches)


def check_sizes(name: str, n_ranks: int, n_microbatches: int, virtual_stages: int = 1) -> None:
    """Raise ScheduleError (values and a fix) unless `name` can run at these sizes.

    The limits are torch 2.13's, so that every plan can be executed by torch's own classes:
    Schedule1F1B needs M >= P; ScheduleInterleaved1F1B and ScheduleInterleavedZeroBubble need
    M to be a multiple of their round count max(1, M // P) (any M <= P, or multiples of P,
    qualify); interleaved needs v >= 2 stages per rank, the others exactly 1.
    """
    spec = get_schedule(name)
    for what, value in (("ranks", n_ranks), ("micro-batches", n_microbatches), ("virtual stages", virtual_stages)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScheduleError(f"schedule {name}: {what} must be a positive integer, got {value!r}")
    if spec.multi_chunk and virtual_stages < 2:
        raise ScheduleError(f"schedule {name} needs at least 2 stages per rank, got {virtual_stages}", "give it 2x (or more) as many stages as devices, or use 1f1b")
    if not spec.multi_chunk and virtual_stages != 1:
        raise ScheduleError(f"schedule {name} runs one stage per rank, got {virtual_stages}", "use interleaved for several stages per rank")
    if 2 * n_ranks * virtual_stages * n_microbatches > _MAX_ACTIONS:
        raise ScheduleError(f"schedule {name}: {n_ranks} ranks x {virtual_stages} stages x {n_microbatches} micro-batches is too large to simulate", "use fewer micro-batches")
    if not spec.valid_microbatches(n_ranks, n_microbatches):
        M, P = n_microbatches, n_ranks
        if spec.microbatches == "at-least-ranks":
            raise ScheduleError(f"schedule {name} needs at least as many micro-batches as ranks (torch's {spec.torch_class}): M={M} < P={P}", f"use --microbatches {P} or more, or gpipe")
        lower = next(m for m in range(M, 0, -1) if spec.valid_microbatches(P, m))
        upper = next(m for m in range(M, 2 * M + P) if spec.valid_microbatches(P, m))
        raise ScheduleError(
            f"schedule {name} needs the micro-batch count to be a multiple of its round count max(1, M // P) (torch's rule): M={M}, P={P}",
            f"use {lower} or {upper} micro-batches (a multiple of {P} always works)",
        )


def generate(name: str, n_ranks: int, n_microbatches: int, virtual_stages: int = 1) -> PipelineSchedule:
    """The schedule `name` for these sizes, validated (ScheduleError if it cannot run)."""
    check_sizes(name, n_ranks, n_microbatches, virtual_stages)
    return _generate(name, n_ranks, n_microbatches, virtual_stages)


def generate_order(name: str, n_ranks: int, n_microbatches: int, virtual_stages: int = 1) -> PipelineSchedule:
    """The schedule `name` as each rank's actions in order, without generate's unit-step layout
    (idle slots) and its deadlock dry run: for what reads only the order (planner.schedules.memory's
    moments: the cluster search asks for hundreds of schedules of up to 128 ranks, where the layout
    took most of the time). The same generator's schedule is validated wherever it is simulated or run."""
    check_sizes(name, n_ranks, n_microbatches, virtual_stages)
    return _draft(name, n_ranks, n_microbatches, virtual_stages)


def _draft(name: str, P: int, M: int, v: int) -> PipelineSchedule:
    order = SCHEDULES[name].order(P, M, v)
    return PipelineSchedule(
        name=name, n_ranks=P, n_stages=P * v, n_microbatches=M,
        stage_rank=tuple(s % P for s in range(P * v)),
        order={r: tuple(acts) for r, acts in order.items()},
    )


@functools.lru_cache(maxsize=128)
def _generate(name: str, P: int, M: int, v: int) -> PipelineSchedule:
    draft = _draft(name, P, M, v)
    spaced = PipelineSchedule(
        name=draft.name, n_ranks=P, n_stages=P * v, n_microbatches=M,
        stage_rank=draft.stage_rank, order=spaced_order(draft),
    )
    # Same actions in the same per-rank order as the validated draft: reuse its compiled form.
    share_compiled(draft, spaced)
    return spaced


def from_csv_rows(rows: list[list[str]], name: str = "custom", n_microbatches: int | None = None,
                  stage_rank: tuple[int, ...] | None = None) -> PipelineSchedule:
    """A schedule from torch's CSV layout (one row per rank, empty cell = idle), validated.

    Stages default to rank s mod P; the micro-batch count to one more than the largest seen.
    """
    order = {r: tuple(parse_action(c) if c.strip() else None for c in row) for r, row in enumerate(rows)}
    acts = [a for row in order.values() for a in row if a is not None]
    if not acts:
        raise ScheduleError("schedule CSV has no actions")
    n_stages = max(a.stage for a in acts) + 1
    M = n_microbatches if n_microbatches is not None else max(a.microbatch for a in acts) + 1
    sch = PipelineSchedule(
        name=name, n_ranks=len(rows), n_stages=n_stages, n_microbatches=M,
        stage_rank=stage_rank if stage_rank is not None else tuple(s % len(rows) for s in range(n_stages)),
        order=order,
    )
    validate(sch)
    return sch
