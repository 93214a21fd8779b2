"""What-if changes to a plan: its schedule, micro-batching or links (the `WhatIf` record and how it applies).

Micro-batching keeps the global batch by default, as `pplan partition` does: `microbatches=M` means M
micro-batches of global_batch / M samples, so a changed plan trains on the same data per step.
`keep="micro-batch-size"` keeps the plan's micro-batch size instead (the global batch then grows with M).
`planner.whatif.answer` applies a change before it simulates; `planner.whatif.sweep` splits each swept count the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from planner.calibration import Calibration
from planner.errors import PplanError
from planner.plan import Links, Plan
from planner.schedules.registry import schedule_name

__all__ = ["KEEP", "WhatIf", "check_keep", "split_batch", "apply_what_if"]

KEEP = ("global-batch", "micro-batch-size")


@dataclass(frozen=True)
class WhatIf:
    """Changes to a plan (None = keep the plan's value)."""

    schedule: str | None = None
    """Schedule name."""
    n_microbatches: int | None = None
    """Micro-batches per iteration."""
    micro_batch_size: int | None = None
    """Samples per micro-batch."""
    bandwidth_bytes_per_s: float | None = None
    """Every link's bandwidth (wins over a calibration's)."""
    latency_ms: float | None = None
    """Every link's latency (wins over a calibration's)."""
    keep: str = "global-batch"
    """What a change of micro-batch count or size keeps: global-batch or micro-batch-size."""

    def __post_init__(self) -> None:
        check_keep(self.keep)
        if self.schedule is not None:  # 'ZB' is zb, as `pplan partition --schedule ZB` reads it
            object.__setattr__(self, "schedule", schedule_name(self.schedule, "--schedule"))
        for flag, value, what, example in (("--microbatches", self.n_microbatches, "micro-batches per iteration", 8),
                                           ("--micro-batch-size", self.micro_batch_size, "samples per micro-batch", 4)):
            if value is not None and value < 1:  # worded as the CLI's counts are (cli.common.at_least)
                raise PplanError(f"{flag} {value} must be at least 1",
                                 f"give the {what}, e.g. {flag} {example}, or leave it out to keep the plan's")


def check_keep(keep: str) -> None:
    """PplanError unless `keep` is one of KEEP."""
    if keep not in KEEP:
        raise PplanError(f"--keep {keep!r} is not one of {', '.join(KEEP)}",
                         "global-batch changes the micro-batch size with the count; micro-batch-size keeps it")


def split_batch(plan: Plan, m: int | None, b: int | None, keep: str) -> tuple[int, int]:
    """(micro-batches, micro-batch size) after a change, keeping what `keep` says."""
    check_keep(keep)
    for flag, value in (("micro-batch count", m), ("micro-batch size", b)):
        if value is not None and value < 1:
            raise PplanError(f"{flag} {value} must be at least 1", "give 1 or more")
    if m is not None and b is not None:
        return m, b
    if keep == "micro-batch-size" or (m is None and b is None):
        return (m or plan.n_microbatches), (b or plan.micro_batch_size)
    g = plan.n_microbatches * plan.micro_batch_size  # one replica's share of the global batch
    dp = plan.dp
    batch = "global batch" if dp == 1 else f"replica's batch (global batch {plan.global_batch} / dp {dp})"
    given, other = ("micro-batches", m) if m is not None else ("micro-batch size", b)
    if other > g:
        raise PplanError(f"{given} {other} is too large for the {batch} {g}",
                         f"use at most {g}, or keep the micro-batch size (--keep micro-batch-size)")
    if g % other:
        raise PplanError(f"{given} {other} does not divide the {batch} {g}",
                         "choose a divisor, or keep the micro-batch size (--keep micro-batch-size)")
    return (m, g // m) if m is not None else (g // b, b)


def apply_what_if(plan: Plan, cal: Calibration | None, w: WhatIf) -> tuple[Plan, Calibration | None]:
    """The plan and calibration with `w`'s changes; explicit link values win over a calibration's."""
    changes: dict[str, Any] = {}
    if w.schedule is not None:
        changes["schedule"] = w.schedule
    if w.n_microbatches is not None or w.micro_batch_size is not None:
        m, b = split_batch(plan, w.n_microbatches, w.micro_batch_size, w.keep)
        changes.update(n_microbatches=m, micro_batch_size=b)
    bw, lat = w.bandwidth_bytes_per_s, w.latency_ms
    if bw is not None or lat is not None:
        old = plan.links
        changes["links"] = Links(
            bandwidth_bytes_per_s=bw if bw is not None else old.bandwidth_bytes_per_s,
            latency_ms=lat if lat is not None else old.latency_ms,
            pairs=tuple((a, c, bw if bw is not None else pbw, lat if lat is not None else plat)
                        for a, c, pbw, plat in old.pairs),
        )
        if cal is not None:
            cal = replace(cal, comm_bandwidth_bytes_per_s=None if bw is not None else cal.comm_bandwidth_bytes_per_s,
                          comm_latency_ms=None if lat is not None else cal.comm_latency_ms)
    if not changes:
        return plan, cal
    new = plan.with_(**changes)
    new.validate()
    return new, cal
