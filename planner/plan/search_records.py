"""How the partitioner chose a plan: the plan's `search` record (planner.partition.api writes it,
`pplan bench` a bare one), its runners-up, its baselines and how each baseline's cuts do at the
plan's own setting; planner.plan.records exports these beside `predicted`.

The record is informational, never needed to run the plan, but `pplan partition` prints its rows and
`pplan report` draws its baselines. So a plan from someone else is held to the ranges pplan writes,
declared per record in `_RANGES` as `predicted`'s are and checked as it is read (planner.plan.recordbase):
a bubble fraction of -5, a negative stage time or a cut at layer 10**30 is refused on one line naming
the field and the range. Cuts are non-decreasing layer boundaries within MAX_PLAN_LAYERS here;
SearchRecord.layer_count_error holds them to the plan's own layer count, which only the plan knows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.errors import PlanError
from planner.plan.bounds import MAX_PIPELINE_STAGES, MAX_PLAN_LAYERS, MAX_SEARCH_ROWS, MAX_SKIPPED
from planner.plan.recordbase import BYTES_RANGE, COUNT_RANGE, TIME_RANGE, JsonRecord

__all__ = ["AtPlanSetting", "SearchRow", "BaselineRow", "SearchRecord", "MAX_POLISH_MOVES", "SLOWDOWN_RANGE"]

MAX_POLISH_MOVES = 2 * 4 * MAX_PIPELINE_STAGES
"""The most cut moves a polish can make: each shifts one of fewer than MAX_PIPELINE_STAGES cuts by a
layer, at most once each way per pass, in planner.partition.search's POLISH_ROUNDS (4) passes
(tests/test_plan_search_ranges.py checks the two agree)."""
SLOWDOWN_RANGE = (1e-9, 1e9)
"""A row's iteration time over the plan's: both simulated for one model at one global batch, so pplan's
lie within a few hundred of 1; this refuses 0, negatives and 1e300, and never a ratio pplan writes."""
_STAGE = (0, MAX_PIPELINE_STAGES - 1)
_SEARCH_HINT = ("the search record is what `pplan partition` wrote: re-create the plan with it, "
         "or drop `search` (it is informational)")


@dataclass(frozen=True)
class AtPlanSetting(JsonRecord):
    """A baseline's cuts at the plan's own (schedule, M)."""

    _WRITE_NULL = frozenset({"iteration_ms", "peak_memory_bytes"})
    _RANGES = {"iteration_ms": TIME_RANGE, "peak_memory_bytes": BYTES_RANGE}
    _HINT = _SEARCH_HINT

    fits: bool | None = None
    """Whether it fits memory."""
    iteration_ms: float | None = None
    """Simulated iteration time, ms."""
    peak_memory_bytes: int | None = None
    """Largest device peak, bytes."""


@dataclass(frozen=True)
class SearchRow(JsonRecord):
    """One candidate the search simulated (a runner-up)."""

    _WRITE_NULL = frozenset({"iteration_ms", "bubble_fraction", "bottleneck_ms", "peak_memory_bytes", "slowdown_vs_plan"})
    _LONGEST = {"cuts": MAX_PIPELINE_STAGES + 1}  # a stage boundary each, and the end
    _RANGES = {"polish_moves": (0, MAX_POLISH_MOVES), "n_microbatches": COUNT_RANGE, "micro_batch_size": COUNT_RANGE,
               "iteration_ms": TIME_RANGE, "bubble_fraction": (0.0, 1.0), "bottleneck_ms": TIME_RANGE,
               "peak_memory_bytes": BYTES_RANGE, "slowdown_vs_plan": SLOWDOWN_RANGE, "cuts": (0, MAX_PLAN_LAYERS)}
    _HINT = _SEARCH_HINT

    method: str | None = None
    """Which method cut it (dp, ilp, uniform, params, time)."""
    polish_moves: int | None = None
    """Cut moves made by the simulator-driven polish."""
    schedule: str | None = None
    """Schedule."""
    n_microbatches: int | None = None
    """Micro-batches per iteration."""
    micro_batch_size: int | None = None
    """Samples per micro-batch."""
    fits: bool | None = None
    """Whether it fits memory."""
    iteration_ms: float | None = None
    """Simulated iteration time, ms."""
    bubble_fraction: float | None = None
    """Simulated bubble fraction."""
    bottleneck_ms: float | None = None
    """Slowest stage's time per micro-batch, ms."""
    peak_memory_bytes: int | None = None
    """Largest device peak, bytes."""
    slowdown_vs_plan: float | None = None
    """Its iteration time over the plan's."""
    cuts: tuple[int, ...] | None = None
    """Stage boundaries [0, a, b, ..., n_layers]."""
    note: str | None = None
    """Why it does not fit."""

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Any:
        """As every record (types, ranges), then the cuts in layer order: each stage ends where the next
        begins. sorted() first: a row of 4,001 cuts in order is one C pass."""
        row = super().from_dict(d, where)
        cuts = row.cuts or ()
        if list(cuts) != sorted(cuts):
            i = next(i for i in range(1, len(cuts)) if cuts[i] < cuts[i - 1])
            raise PlanError(f"{where} field 'cuts[{i}]' is {cuts[i]}, below 'cuts[{i - 1}]' {cuts[i - 1]}: "
                            "cuts are stage boundaries in layer order", _SEARCH_HINT)
        return row


@dataclass(frozen=True)
class BaselineRow(SearchRow):
    """A baseline method's best candidate, and how its cuts do at the plan's setting."""

    at_plan_setting: AtPlanSetting | None = None
    """Its cuts at the plan's (schedule, M); None when it was not simulated there."""

    _WRITE_NULL = SearchRow._WRITE_NULL | {"at_plan_setting"}


@dataclass(frozen=True)
class SearchRecord(JsonRecord):
    """How the partitioner chose the plan: informational, not needed to run it."""

    _WRITE_NULL = frozenset({"optimal"})
    _RANGES = {"polish_moves": (0, MAX_POLISH_MOVES), "n_microbatches": COUNT_RANGE, "micro_batch_size": COUNT_RANGE,
               "device_order": _STAGE, "bottleneck_stage": _STAGE, "stage_ms": TIME_RANGE,
               "stage_memory_bytes": BYTES_RANGE}
    _HINT = _SEARCH_HINT

    method: str | None = None
    """The --method asked for."""
    source: str | None = None
    """The method whose cuts won."""
    polish_moves: int | None = None
    """Cut moves made by the simulator-driven polish."""
    optimal: bool | None = None
    """dp/ilp: whether the cuts are proven optimal; None for heuristics."""
    objective: str | None = None
    """What was optimized, in words."""
    recompute: str | None = None
    """The recompute policy searched."""
    schedule: str | None = None
    """Chosen schedule."""
    n_microbatches: int | None = None
    """Chosen micro-batch count."""
    micro_batch_size: int | None = None
    """Chosen micro-batch size."""
    device_order: tuple[int, ...] | None = None
    """Device indices in pipeline order."""
    bottleneck_stage: int | None = None
    """The slowest stage."""
    stage_ms: tuple[float, ...] | None = None
    """Per stage: time per micro-batch, ms."""
    stage_memory_bytes: tuple[int, ...] | None = None
    """Per stage: memory, bytes."""
    calibrated: bool | None = None
    """Whether a calibration scaled the profile."""
    candidates: tuple[SearchRow, ...] | None = None
    """Runners-up, best first."""
    baselines: tuple[BaselineRow, ...] | None = None
    """Per other method: its best candidate."""
    skipped: tuple[str, ...] | None = None
    """(schedule, M) points not searched, and why."""

    _LONGEST = {"candidates": MAX_SEARCH_ROWS, "baselines": MAX_SEARCH_ROWS, "skipped": MAX_SKIPPED,
                "device_order": MAX_PIPELINE_STAGES, "stage_ms": MAX_PIPELINE_STAGES, "stage_memory_bytes": MAX_PIPELINE_STAGES}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> SearchRecord:
        """As every record (types, ranges, each row by SearchRow's reader), then the bottleneck is one of
        the stages listed."""
        record: SearchRecord = super().from_dict(d, where)
        stage, listed = record.bottleneck_stage, record.stage_ms
        if stage is not None and listed is not None and stage >= len(listed):
            raise PlanError(f"{where} field 'bottleneck_stage' is {stage} but 'stage_ms' lists {len(listed)} stages "
                            f"(0 to {len(listed) - 1})", _SEARCH_HINT)
        return record

    def layer_count_error(self, n_layers: int, where: str) -> str | None:
        """None when every row's cuts lie within a plan of `n_layers` layers; else the message naming
        the first row past it (the reader holds cuts to MAX_PLAN_LAYERS: only the plan knows its own)."""
        for name in ("candidates", "baselines"):
            for i, row in enumerate(getattr(self, name) or ()):
                if row.cuts and row.cuts[-1] > n_layers:  # in layer order: the last is the largest
                    return (f"{where}.{name}[{i}] field 'cuts' reaches layer {row.cuts[-1]} "
                            f"but the plan has {n_layers} layers (0 to {n_layers})")
        return None
