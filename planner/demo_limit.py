"""The demo's memory limit, computed from the profile: one that pplan's plan meets and the
uniform (equal-layer) split cannot, so the demo shows what planning buys.

pplan's floor comes from the planner's least-memory search (partition/diagnose.py); the uniform
split's from its plans with recompute allowed, lowered until the split no longer fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
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
    """A limit under which the uniform split fits (recompute allowed), above `limit_bytes`."""
    pplan_floor_bytes: float
    """Smallest limit under which pplan finds a plan (partition/diagnose.py's least-memory search)."""
    pplan_fastest_peak_bytes: float
    """Peak of pplan's fastest plan without a limit."""
    rule: str
    """One sentence: why this limit."""


def partition_settings(profile: Any, s: Any, limit: float | None, method: str = "auto") -> Any:
    """The demo's PartitionSettings (devices, batch, micro-batches of `s`) under `limit`."""
    from planner.partition.search import PartitionSettings

    return PartitionSettings(n_devices=s.n_devices, memory_bytes=None if limit is None else int(limit),
                             global_batch=s.global_batch, microbatches=s.n_microbatches, method=method)


def _pplan_floor(profile: Any, s: Any, budget: float) -> float:
    """Least per-device memory under which pplan finds a plan: partition/diagnose.py's min-max DP
    (one pass over the grid), as a ratio of `budget` times `budget`."""
    from planner.partition.api import resolve_devices
    from planner.partition.diagnose import least_memory_scale

    settings = partition_settings(profile, s, budget)
    devices, links = resolve_devices(settings)
    return budget * least_memory_scale(profile, settings, devices, links, [tuple(range(s.n_devices))], None)


def _uniform_peak(profile: Any, s: Any, limit: float | None) -> float | None:
    """Peak of the uniform split's best plan under `limit` (None: it cannot fit)."""
    from planner.partition.api import partition

    try:
        return max(partition(profile, partition_settings(profile, s, limit, "uniform")).chosen.sim.peak_memory_bytes)
    except InfeasibleError:
        return None


def choose_memory_limit(profile: Any, s: Any) -> LimitChoice:
    """A limit the uniform split cannot meet and pplan can, from the profile alone.

    pplan's floor comes from the least-memory search; the uniform split's from its plan with
    every layer recomputed, lowered while the uniform split still fits under it (a few
    partitions). If pplan's fastest plan peaks below the uniform floor, the limit is halfway
    between (pplan loses nothing); otherwise three quarters of the way from pplan's floor to the
    uniform split's, leaving pplan room to trade recompute for speed.
    """
    from planner.partition.api import partition

    fastest = partition(profile, partition_settings(profile, s, None))
    fast_peak = max(fastest.chosen.sim.peak_memory_bytes)
    p_floor = _pplan_floor(profile, s, fast_peak)
    u_floor = _uniform_peak(profile, s, None) or math.inf
    all_recompute = _uniform_peak_recompute_all(profile, s)
    u_floor = min(u_floor, all_recompute)
    for _ in range(8):  # the limit must exclude the uniform split: tighten its floor until it does
        if p_floor >= u_floor * 0.999:
            raise PplanError(f"the demo model gives pplan no memory advantage (pplan needs {format_bytes(p_floor)}, "
                             f"the uniform split {format_bytes(u_floor)})", "use a model with a larger vocabulary")
        limit, rule = _limit_between(fast_peak, p_floor, u_floor)
        below = _uniform_peak(profile, s, limit)
        if below is None:
            return LimitChoice(int(limit), u_floor, p_floor, fast_peak, rule)
        u_floor = below
    raise PplanError("could not find a memory limit that excludes the uniform split")


def _uniform_peak_recompute_all(profile: Any, s: Any) -> float:
    from planner.partition.api import partition

    settings = replace(partition_settings(profile, s, None, "uniform"), recompute="all")
    return max(partition(profile, settings).chosen.sim.peak_memory_bytes)


def _limit_between(fast_peak: float, p_floor: float, u_floor: float) -> tuple[float, str]:
    if fast_peak < u_floor * 0.99:
        return (fast_peak + u_floor) / 2, (f"halfway between the peak of pplan's fastest plan, {format_bytes(fast_peak)}, "
                                           f"and the least the uniform split can need, {format_bytes(u_floor)}")
    return p_floor + 0.75 * (u_floor - p_floor), (f"between the least pplan can need, {format_bytes(p_floor)}, and the "
                                                  f"least the uniform split can need, {format_bytes(u_floor)}")
