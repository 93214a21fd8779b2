"""The cluster search's branch and bound: which points get the pipeline DP, in what order, and when
to stop (planner.partition.parallel_search builds the points; parallel_eval prices one).

Points are solved cheapest estimate first. A point's estimate (balanced stages: every rank does
1/P of the work) is a lower bound of its DP-based estimate, so once the next point's estimate is
past the top_k-th best DP-based estimate found (by ESTIMATE_MARGIN), nothing later can be judged.

Balanced stages are often far from reachable: layers are whole, so 96 blocks and an LM head 1.4
blocks long on 64 ranks leave some rank two blocks, where the balance says 1.5. Before a point's
memory moments and DP (most of a search's time), `cut_estimate` prices it with the least
slowest stage any cut of its layers can have (`least_bottleneck_ms`, time alone, no memory); a
point whose cut estimate is already past the bound is skipped. Its DP-based estimate is at least
that (the DP's stage time adds sends and overhead to the same compute, and a rank's time is at least
its slowest stage's), so a skipped point is one the bound would have stopped at had it been
ordered by it: the points solved before the stop, and so the result, are the same.
"""

from __future__ import annotations

import bisect
import math
from typing import Callable, Sequence

import numpy as np

from planner.cost import layer_compute_ms
from planner.partition.parallel_eval import ParallelCosts, ParallelTask, solve_task
from planner.schedules import get_schedule

__all__ = ["least_bottleneck_ms", "cut_estimate", "solve_best", "ESTIMATE_MARGIN", "MAX_SOLVES"]

MAX_SOLVES = 400  # points priced at most per search (the bound usually stops far earlier)
# The DP-based estimate and the simulation order close plans differently (sends charged in full,
# zb's closed-form bubble): measured -4.1% .. +3.5% of the simulation over the plans within 15% of
# the best (docs/parallel.md, the 7.5B example), so every solution within this margin of the
# top_k-th best estimate is simulated too, rather than trusting an ordering it cannot resolve.
ESTIMATE_MARGIN = 0.05
# Relative slack of the bound's comparisons: prefix sums in another order than the DP's sums
# differ in the last bits, and a bound must never exceed what it bounds.
_SLACK = 1e-9


def least_bottleneck_ms(layer_ms: Sequence[float], n_stages: int) -> float:
    """A lower bound (within 1e-9 relative) of the slowest stage's time over every cut of these
    per-layer times into `n_stages` contiguous, non-empty stages. Bisection on the time: at a time
    x, cutting each stage as late as x allows uses the fewest stages (more are made by splitting,
    which slows none), so x is reachable exactly when that count is at most `n_stages`."""
    times = np.asarray(layer_ms, dtype=float)
    if not 1 <= n_stages <= len(times):
        raise ValueError(f"{n_stages} stages of {len(times)} layers")
    prefix = np.concatenate([[0.0], np.cumsum(times)]).tolist()
    total, L = prefix[-1], len(times)

    def reachable(x: float) -> bool:
        reach, start, used = x * (1 + _SLACK), 0, 0
        while start < L:
            used += 1
            if used > n_stages:
                return False
            start = max(start + 1, bisect.bisect_right(prefix, prefix[start] + reach, start) - 1)
        return True

    lo = max(float(times.max()), total / n_stages)  # no cut does better than its largest layer or the average
    if reachable(lo):
        return lo * (1 - _SLACK)
    hi = float(times.max()) + total / n_stages  # the greedy cut never passes this
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if reachable(mid):
            hi = mid
        else:
            lo = mid  # nothing reaches mid: every cut is slower
    return lo


def cut_estimate(ctx: ParallelCosts, task: ParallelTask) -> float:
    """task.estimate_ms with its balanced per-micro-batch time raised to the least slowest stage of
    any cut of its layers (least_bottleneck_ms on one GPU's costs, recompute included): a lower
    bound of the point's DP-based estimate (parallel_eval._dp_estimate)."""
    key = (task.cfg.tp, task.cfg.dp, task.cfg.pp, task.b, task.recompute, task.cfg.pp * task.v)
    slowest = ctx.bounds.get(key)
    if slowest is None:
        compute, recompute = layer_compute_ms(ctx.costs(task.cfg, task.b), None)
        per_layer = compute + recompute if task.recompute == "full" else compute
        balanced = float(np.sum(per_layer)) / task.cfg.pp
        slowest = ctx.bounds[key] = max(0.0, least_bottleneck_ms(per_layer, task.cfg.pp * task.v) - balanced)
    slots = task.m + get_schedule(task.schedule).bubble_slots(task.cfg.pp, task.v)
    return task.estimate_ms + slots * slowest


def solve_best(ctx: ParallelCosts, tasks: list[ParallelTask], mem: float, gpn: int, keep: int,
               on_step: Callable[[int, int, str], None] | None = None) -> tuple[list, int, float]:
    """(the `keep` best DP solutions as (estimate, task, solution), points priced, least memory
    scale that would fit among the points that did not); on_step(done, total, point) per point."""
    solved, found, floored = 0, [], []
    min_scale = math.inf
    total = min(len(tasks), MAX_SOLVES)
    for task in tasks:
        if len(found) >= keep:
            bound = sorted(f[0] for f in found)[keep - 1] * (1.0 + ESTIMATE_MARGIN)
            if task.estimate_ms > bound:
                break
            if cut_estimate(ctx, task) > bound:
                continue
        if solved >= MAX_SOLVES and found:
            break
        if on_step is not None:
            on_step(min(solved, total - 1), total, f"{task.cfg.describe()} b={task.b} {task.schedule}")
        got = solve_task(ctx, task, mem, gpn, floor=True)
        solved += 1
        if got is None:  # fits no cut, proven cheaply; its least scale matters only if nothing fits
            floored.append(task)
        elif isinstance(got, float):
            min_scale = min(min_scale, got)
        else:
            found.append(got)
    if not found:  # the refusal names the least scale over every point solved: learn the floored ones'
        min_scale = min([min_scale] + [solve_task(ctx, task, mem, gpn) for task in floored])
    if on_step is not None:
        on_step(total, total, "")
    return found, solved, min_scale
