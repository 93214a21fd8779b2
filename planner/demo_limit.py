"""The demo's memory limit, computed from the profile: one that pplan's plan meets and the
uniform (equal-layer) split cannot, so the demo shows what planning buys.

Both floors come from the planner's least-memory search (partition/diagnose.py): pplan's over
every cut, the uniform split's over its own cuts with recompute auto, the least limit under which
`pplan partition --method uniform` finds a plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from planner.errors import InfeasibleError, PplanError
from planner.units import format_bytes

__all__ = ["LimitChoice", "choose_memory_limit", "partition_settings"]


@dataclass(frozen=True)
class LimitChoice:
    """How the demo's memory limit was chosen."""

    limit_bytes: int
    """The per-device limit."""
    uniform_floor_bytes: float
    """Least limit under which the uniform split finds a plan (recompute auto), above `limit_bytes`."""
    pplan_floor_bytes: float
    """Least limit under which pplan finds a plan (partition/diagnose.py's least-memory search)."""
    pplan_fastest_peak_bytes: float
    """Peak of pplan's fastest plan without a limit."""
    rule: str
    """One sentence: why this limit."""


def partition_settings(profile: Any, s: Any, limit: float | None, method: str = "auto") -> Any:
    """The demo's PartitionSettings (devices, batch, micro-batches of `s`) under `limit`."""
    from planner.partition.search import PartitionSettings

    return PartitionSettings(n_devices=s.n_devices, memory_bytes=None if limit is None else int(limit),
                             global_batch=s.global_batch, microbatches=s.n_microbatches, method=method)


def _least_memory(profile: Any, s: Any, method: str) -> float:
    """Least per-device memory (bytes, rounded up) under which `pplan partition --method <method>`
    finds a plan (recompute auto): partition/diagnose.py's least-memory search, which for a
    baseline method prices that method's own cuts."""
    from planner.partition.api import resolve_devices
    from planner.partition.diagnose import least_memory_scale

    budget = 2.0**30  # any limit: the search answers as a ratio of it
    settings = partition_settings(profile, s, budget, method)
    devices, links = resolve_devices(settings)
    scale = least_memory_scale(profile, settings, devices, links, [tuple(range(s.n_devices))], None)
    if not math.isfinite(scale):
        raise PplanError(f"no schedule can run the demo model on {s.n_devices} devices with {s.n_microbatches} micro-batches")
    return math.ceil(budget * scale)


def _uniform_fits(profile: Any, s: Any, limit: float) -> bool:
    """Whether the uniform split finds a plan under `limit`."""
    from planner.partition.api import partition

    try:
        partition(profile, partition_settings(profile, s, limit, "uniform"))
    except InfeasibleError:
        return False
    return True


def choose_memory_limit(profile: Any, s: Any) -> LimitChoice:
    """A limit the uniform split cannot meet and pplan can, from the profile alone.

    Both floors come from the least-memory search: pplan's over every cut, the uniform split's
    over its own (recompute auto, as `pplan partition --method uniform` plans it). If pplan's
    fastest plan peaks below the uniform floor, the limit is halfway between (pplan loses
    nothing); otherwise three quarters of the way from pplan's floor to the uniform split's,
    leaving pplan room to trade recompute for speed. The uniform split is then planned under the
    limit to confirm it fails: the floor is exact where each device runs one stage, and only
    conservative where interleaved chunks share a device's budget.
    """
    from planner.partition.api import partition

    fastest = partition(profile, partition_settings(profile, s, None))
    fast_peak = max(fastest.chosen.sim.peak_memory_bytes)
    p_floor = _least_memory(profile, s, "auto")
    u_floor = _least_memory(profile, s, "uniform")
    for _ in range(8):  # the limit must exclude the uniform split: lower its floor (a limit it fits) until it does
        if p_floor >= u_floor * 0.999:
            raise PplanError(f"the demo model gives pplan no memory advantage (pplan needs {format_bytes(p_floor)}, "
                             f"the uniform split {format_bytes(u_floor)})", "use a model with a larger vocabulary")
        limit, rule = _limit_between(fast_peak, p_floor, u_floor)
        if not _uniform_fits(profile, s, limit):
            return LimitChoice(int(limit), u_floor, p_floor, fast_peak, rule)
        u_floor = int(limit)
    raise PplanError("could not find a memory limit that excludes the uniform split")


def _limit_between(fast_peak: float, p_floor: float, u_floor: float) -> tuple[float, str]:
    if fast_peak < u_floor * 0.99:
        return (fast_peak + u_floor) / 2, (f"halfway between the peak of pplan's fastest plan, {format_bytes(fast_peak)}, "
                                           f"and the least the uniform split can need, {format_bytes(u_floor)}")
    return p_floor + 0.75 * (u_floor - p_floor), (f"between the least pplan can need, {format_bytes(p_floor)}, and the "
                                                  f"least the uniform split can need, {format_bytes(u_floor)}")
