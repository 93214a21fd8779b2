"""When a run's comparison with its prediction cannot be trusted: the step-time spread and the
one-line warnings `pplan run` prints (too few or too short steps, a machine busier or quieter
than when the profile was made, actions far from their profiled times, other threads)."""

from __future__ import annotations

import math
import statistics

__all__ = ["SPREAD_WARN_PCT", "SHORT_STEP_MS", "LOAD_WARN_DIFF", "COMPUTE_RATIO_WARN", "step_spread", "trust_warnings"]

SPREAD_WARN_PCT = 20.0
"""Warn when (max - min) / median of the measured step times exceeds this, in percent."""
SHORT_STEP_MS = 20.0
"""Warn when the median step is shorter than this: per-action and per-step fixed costs dominate."""
LOAD_WARN_DIFF = 1.0
"""Warn when the machine's 1-minute load before the run differs from the profile's by more (one busy core)."""
COMPUTE_RATIO_WARN = (0.8, 1.25)
"""Warn when the run's actions took outside this factor of their profiled times (median over actions)."""



def step_spread(step_ms: list[float], measured: list[int]) -> tuple[float | None, float | None, float | None, float | None]:
    """(min, median, max, spread %) of the measured steps; Nones without any."""
    vals = [step_ms[i] for i in measured if 0 <= i < len(step_ms) and math.isfinite(step_ms[i])]
    if not vals:
        return None, None, None, None
    lo, med, hi = min(vals), statistics.median(vals), max(vals)
    return lo, med, hi, (100.0 * (hi - lo) / med if med > 0 else None)


def trust_warnings(*, n_measured: int, median_ms: float | None, spread_pct: float | None, load: float | None,
                   profile_load: float | None, compute_ratio: float | None,
                   compute_ratio_cpu: float | None = None) -> list[str]:
    """One line per reason the prediction's comparison with this run cannot be trusted."""
    out = []
    if n_measured < 3:
        out.append(f"only {n_measured} measured step(s): the median is not robust; run more --steps")
    if spread_pct is not None and spread_pct > SPREAD_WARN_PCT:
        out.append(f"step times spread {spread_pct:.0f}% (max - min over median, threshold {SPREAD_WARN_PCT:.0f}%): "
                   "the machine's speed changed during the run; compare with care or rerun on a quiet machine")
    if median_ms is not None and median_ms < SHORT_STEP_MS:
        out.append(f"median step {median_ms:.1f} ms is under {SHORT_STEP_MS:.0f} ms: fixed per-action and per-step "
                   "costs dominate, which layer profiles do not see; use a larger model or batch, or `pplan calibrate --machine`")
    if load is not None and profile_load is not None and abs(load - profile_load) > LOAD_WARN_DIFF:
        out.append(f"machine load {load:.1f} before the run, {profile_load:.1f} when the profile was made: compute "
                   "times differ with the load; re-profile or rerun under the same load")
    if compute_ratio is not None and not COMPUTE_RATIO_WARN[0] <= compute_ratio <= COMPUTE_RATIO_WARN[1]:
        out.append(_compute_warning(compute_ratio, compute_ratio_cpu))
    return out


def _compute_warning(wall: float, cpu: float | None) -> str:
    """Why the actions' times differ from the profile's: waiting for a CPU (the CPU time agrees
    with the profile) or the computation itself (threads, caches, another machine)."""
    head = f"actions took {wall:.2f}x their profiled time (median over actions)"
    if cpu is not None and COMPUTE_RATIO_WARN[0] <= cpu <= COMPUTE_RATIO_WARN[1]:
        return (f"{head} but {cpu:.2f}x in CPU time: the ranks waited for CPUs other work was using; "
                "the prediction holds for this machine when it is not shared: rerun when it is quieter")
    if cpu is not None:
        return (f"{head}, {cpu:.2f}x in CPU time: the computation itself ran slower or faster than profiled "
                "(threads, caches shared between ranks, another machine); re-profile with the run's --threads or calibrate")
    return (f"{head}: the profile does not describe this run (threads, load, machine); re-profile with the "
            "run's --threads or calibrate")
