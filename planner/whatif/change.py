"""What-if changes to a plan: its schedule, micro-batching or links (the `WhatIf` record and how it applies).

Micro-batching keeps the global batch by default, as `pplan partition` does: `microbatches=M` means M
micro-batches of global_batch / M samples, so a changed plan trains on the same data per step.
`keep="micro-batch-size"` keeps the plan's micro-batch size instead (the global batch then grows with M).
`planner.whatif.answer` applies a change before it simulates; `planner.whatif.sweep` splits each swept count the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.calibration import Calibration, links_given_win
from planner.errors import PplanError
from planner.plan import Links, Plan
from planner.schedules.registry import schedule_name

__all__ = ["KEEP", "WhatIf", "check_keep", "check_with_sweep", "split_batch", "apply_what_if", "what_if_changes"]

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
    keep: str | None = None
    """What a change of micro-batch count or size keeps: global-batch or micro-batch-size (None: not said,
    global-batch); said with nothing to keep it is refused, as a flag that would do nothing."""

    def __post_init__(self) -> None:
        if self.keep is not None:
            check_keep(self.keep)
        if self.schedule is not None:  # 'ZB' is zb, as `pplan partition --schedule ZB` reads it
            object.__setattr__(self, "schedule", schedule_name(self.schedule, "--schedule"))
        for flag, value, what, example in (("--microbatches", self.n_microbatches, "micro-batches per iteration", 8),
                                           ("--micro-batch-size", self.micro_batch_size, "samples per micro-batch", 4)):
            if value is not None and value < 1:  # worded as the CLI's counts are (cli.common.at_least)
                raise PplanError(f"{flag} {value} must be at least 1",
                                 f"give the {what}, e.g. {flag} {example}, or leave it out to keep the plan's")

    @property
    def kept(self) -> str:
        """What a micro-batch change keeps: `keep`, else global-batch."""
        return self.keep if self.keep is not None else "global-batch"

    def changes_batch(self) -> bool:
        """True when the micro-batch count or size is changed."""
        return self.n_microbatches is not None or self.micro_batch_size is not None


def check_with_sweep(w: WhatIf, parameter: str | None) -> None:
    """PplanError where a flag would be silently ignored: one that the sweep of `parameter` (None: no sweep)
    overrides, or --keep given with no micro-batch change for it to steer."""
    if parameter == "schedule" and w.schedule is not None:
        raise PplanError(f"--sweep schedule=... and --schedule {w.schedule} cannot be combined: the sweep sets the schedule",
                         "drop --schedule, or drop --sweep to simulate that one schedule")
    if parameter == "microbatches" and w.n_microbatches is not None:
        raise PplanError(f"--sweep microbatches=... and --microbatches {w.n_microbatches} cannot be combined: the sweep sets the count",
                         "drop --microbatches, or drop --sweep to simulate that one count")
    if parameter == "microbatches" and w.micro_batch_size is not None and w.kept == "global-batch":
        raise PplanError(f"--sweep microbatches=... and --micro-batch-size {w.micro_batch_size} cannot be combined while the "
                         "global batch is kept: each swept count sets the size",
                         "add --keep micro-batch-size to sweep counts at that size, or drop --micro-batch-size")
    if w.keep is not None and not w.changes_batch() and parameter != "microbatches":
        raise PplanError(f"--keep {w.keep} needs --microbatches, --micro-batch-size or --sweep microbatches=...: "
                         "nothing else changes the micro-batching", "drop --keep, or give the micro-batch change it applies to")


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
    if w.changes_batch():
        m, b = w.n_microbatches, w.micro_batch_size
        share = plan.n_microbatches * plan.micro_batch_size  # one replica's share of the global batch
        if w.keep == "global-batch" and m is not None and b is not None and m * b != share:
            raise PplanError(f"--keep global-batch with --microbatches {m} and --micro-batch-size {b}: {m} x {b} = {m * b} "
                             f"is not the plan's {'global batch' if plan.dp == 1 else 'replica batch'} {share}",
                             "give one of the two (the other follows), counts whose product is "
                             f"{share}, or drop --keep to let the global batch change")
        m, b = split_batch(plan, m, b, w.kept)
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
        cal = links_given_win(cal, bw is not None, lat is not None)
    if not changes:
        return plan, cal
    new = plan.with_(**changes)
    new.validate()
    return new, cal


def what_if_changes(before: Plan, after: Plan, w: WhatIf, hardware: str | None = None) -> dict[str, dict[str, Any]] | None:
    """What the what-if changed, {field: {"plan": the plan's value, "now": the simulated one}}, for each value a
    flag set or changed (the simulation JSON's `what_if`, so a reader never takes it for the plan's); None when no flag was given."""
    def hardware_of(p: Plan) -> str | None:
        return p.parallel.hardware if p.parallel is not None else None

    fields = (("schedule", w.schedule is not None, lambda p: p.schedule),
              ("n_microbatches", w.n_microbatches is not None, lambda p: p.n_microbatches),
              ("micro_batch_size", w.micro_batch_size is not None, lambda p: p.micro_batch_size),
              ("bandwidth_bytes_per_s", w.bandwidth_bytes_per_s is not None, lambda p: p.links.bandwidth_bytes_per_s),
              ("latency_ms", w.latency_ms is not None, lambda p: p.links.latency_ms),
              ("hardware", hardware is not None, hardware_of))
    # a value follows from another flag too: --microbatches sets the size with the global batch kept, --hardware the links
    changed = {name: {"plan": value(before), "now": value(after)} for name, given, value in fields
               if given or value(before) != value(after)}
    return changed or None
