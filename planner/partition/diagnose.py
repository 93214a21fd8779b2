"""When nothing fits: the least memory, and the fewest devices, that would work at these settings.

Least memory: for every grid point and device order a min-max DP finds the cuts and recompute
sets minimising the largest stage memory / budget ratio (lambda); budgets x min lambda is the
least memory the planner can prove fits (exact for one stage per device; interleaved chunks
split a device's budget, which is conservative). A baseline method (--method uniform, params,
time) searches only its own cuts, which do not depend on the limit, so its lambda is that of
its cuts at each grid point: per stage the least memory of a recompute set the search's own
policy (planner.partition.recompute.stage_recompute) would pick, over the budget. Fewest devices
(identical devices only): galloping then bisection over the device count with the same test,
assuming more devices never need more memory per device (true of the static part; activations
per device shrink or stay); the count it names always passed the test.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from planner.calibration import Calibration
from planner.errors import InfeasibleError
from planner.partition.baselines import BASELINES
from planner.partition.dp import min_memory_scale
from planner.partition.problem import PartitionProblem, stage_bytes
from planner.partition.recompute import stage_recompute
from planner.partition.search import PartitionSettings, CandidateEvaluator, grid_points, layouts_for
from planner.plan import Device, Links
from planner.profiling.profile import Profile
from planner.units import format_bytes, format_size_up

__all__ = ["least_memory_scale", "fewest_devices", "infeasible_error"]


def least_memory_scale(profile: Profile, settings: PartitionSettings, devices: tuple[Device, ...], links: Links,
                       orders: list[tuple[int, ...]], calibration: Calibration | None,
                       stop_below: float = 0.0) -> float:
    """min over grid points and orders of the least memory/budget ratio (inf: no point): the DP's
    over all cuts, or for a baseline method its own cuts' (module docstring).

    Returns early once a ratio <= `stop_below` is found (a yes/no question needs no minimum).
    """
    ev = CandidateEvaluator(profile, settings, calibration)
    points, _ = grid_points(settings, len(devices), profile.n_layers)
    best = math.inf
    for point in points:
        for layout in layouts_for(devices, links, orders, point.virtual_stages):
            problem = ev.problem(point, layout)
            if settings.method in BASELINES:
                got: float | None = _cuts_scale(problem, ev.baseline(settings.method, layout.n_stages, point.micro_batch_size))
            else:
                dp = min_memory_scale(problem)
                got = None if dp is None else dp[0]
            if got is not None:
                best = min(best, got)
                if best <= stop_below:
                    return best
    return best


def _cuts_scale(problem: PartitionProblem, cuts: tuple[int, ...]) -> float:
    """Least lambda such that budgets x lambda fit these fixed cuts (stages at an unlimited budget do not constrain it)."""
    worst = 0.0
    for s in range(len(cuts) - 1):
        budget = float(problem.budget[s])
        if math.isfinite(budget):
            worst = max(worst, _least_stage_bytes(problem, s, cuts[s], cuts[s + 1]) / budget)
    return worst


def _least_stage_bytes(problem: PartitionProblem, s: int, i: int, j: int) -> float:
    """Least bytes of layers [i, j) at position s over the recompute sets stage_recompute picks at
    some budget: the set it falls back to when none fits (the family's least), then, while it finds
    a set under the least so far, that set. Whether it finds one grows with the budget (the family's
    first fitting set and each greedy cap's first fitting prefix only get earlier), so the least
    budget under which the search fits this stage is exactly this."""

    def at(budget: float) -> tuple[tuple[int, ...], bool]:
        budgets = np.array(problem.budget, dtype=float)
        budgets[s] = budget
        return stage_recompute(replace(problem, budget=budgets), s, i, j)

    rec, _ = at(0.0)
    least = stage_bytes(problem, s, i, j, rec)
    while least > 0:
        rec, fits = at(float(np.nextafter(least, 0.0)))
        if not fits:
            break
        least = stage_bytes(problem, s, i, j, rec)  # strictly smaller: a set fitting under the last least
    return least


def fewest_devices(profile: Profile, settings: PartitionSettings, memory_bytes: int, links: Links,
                   calibration: Calibration | None) -> int | None:
    """Fewest identical devices of `memory_bytes` that admit a plan (None: not even one per layer)."""
    L = profile.n_layers
    start = settings.n_devices or 1

    def ok(n: int) -> bool:
        devs = tuple(Device(name=f"dev{i}", memory_bytes=memory_bytes) for i in range(n))
        return least_memory_scale(profile, replace(settings, n_devices=n), devs, links, [tuple(range(n))], calibration, stop_below=1.0) <= 1.0

    lo, step, hi = start, 1, None
    while lo + step <= L:
        if ok(lo + step):
            hi = lo + step
            break
        lo, step = lo + step, step * 2
    if hi is None:
        if lo < L and ok(L):
            hi = L
        else:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def infeasible_error(profile: Profile, settings: PartitionSettings, devices: tuple[Device, ...], links: Links,
                     orders: list[tuple[int, ...]], calibration: Calibration | None) -> InfeasibleError:
    """The error to raise when no candidate fits, with the least memory / fewest devices."""
    n = len(devices)
    scale = least_memory_scale(profile, settings, devices, links, orders, calibration)
    limits = {d.memory_bytes for d in devices}
    what = (f"global batch {settings.global_batch}, micro-batches {settings.microbatches or 'auto'}, "
            f"schedule {settings.schedule}, recompute {settings.recompute}, optimizer {settings.optimizer}")
    if len(limits) == 1 and None not in limits:
        (limit,) = limits
        head = f"no plan fits {format_bytes(limit)} per device on {n} devices ({what})"
        if not math.isfinite(scale):
            return InfeasibleError(head, "no schedule can run at these sizes")
        need = format_size_up(scale * limit)
        hints = [f"the least memory that works is {need} per device: try --memory {need}"]
        if settings.cluster is None:
            more = fewest_devices(profile, settings, limit, links, calibration)
            if more is not None:
                hints.append(f"or --devices {more}")
            else:
                hints.append(f"(even {profile.n_layers} devices, one layer each, would not fit {format_bytes(limit)})")
        if _recompute_auto_fits(profile, settings, devices, links, orders, calibration):
            hints.append("or --recompute auto")
        return InfeasibleError(head, " ".join(hints))
    head = f"no plan fits the cluster's device memory ({what})"
    if not math.isfinite(scale):
        return InfeasibleError(head, "no schedule can run at these sizes")
    fixes = "add memory or devices"
    if _recompute_auto_fits(profile, settings, devices, links, orders, calibration):
        fixes += ", or allow --recompute auto"
    return InfeasibleError(head, f"every device would need {math.ceil(scale * 100) / 100:.2f}x its memory; {fixes}")


def _recompute_auto_fits(profile: Profile, settings: PartitionSettings, devices: tuple[Device, ...], links: Links,
                         orders: list[tuple[int, ...]], calibration: Calibration | None) -> bool:
    """Whether --recompute auto is a fix to name: not when it is what failed, and otherwise only when
    a plan fits with it (from all it need not: all also recomputes the layers whose input outweighs
    their activations, which auto keeps, so either may hold fewer bytes)."""
    if settings.recompute == "auto":
        return False
    auto = replace(settings, recompute="auto")
    return least_memory_scale(profile, auto, devices, links, orders, calibration, stop_below=1.0) <= 1.0
