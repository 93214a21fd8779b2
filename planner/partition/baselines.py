"""Baseline stage cuts the planner is compared with (each also a `--method`).

uniform  equal layer counts (the first L mod S stages get one layer more)
params   parameter-balanced: contiguous blocks minimising the largest block's parameter bytes
time     torchgpipe's balance_by_time idea: blocks minimising the largest fwd+bwd time

Balanced blocks are solved exactly (min-max contiguous partition into S non-empty blocks),
which is at least as balanced as torchgpipe's block-partition heuristic. None of them looks at
memory, communication or device speed; recompute sets are then chosen per stage by the same
policy as the planner's (planner.partition.recompute).
"""

from __future__ import annotations

import numpy as np

from planner.errors import PplanError
from planner.partition.block_starts import best_starts
from planner.partition.problem import first_true

__all__ = ["BASELINES", "uniform_cuts", "balanced_cuts", "baseline_cuts"]

BASELINES = ("uniform", "params", "time")


def uniform_cuts(n_layers: int, n_stages: int) -> tuple[int, ...]:
    """Equal layer counts, the remainder spread over the first stages."""
    if not 1 <= n_stages <= n_layers:
        raise PplanError(f"cannot split {n_layers} layers into {n_stages} stages")
    base, extra = divmod(n_layers, n_stages)
    cuts = [0]
    for s in range(n_stages):
        cuts.append(cuts[-1] + base + (1 if s < extra else 0))
    return tuple(cuts)


def balanced_cuts(weights: np.ndarray, n_stages: int) -> tuple[int, ...]:
    """Contiguous non-empty blocks minimising the largest block sum (exact).

    Among optimal partitions it keeps the most even one; ties go to the earliest cut (deterministic).
    Stage s can only end between layer s+1 and L-(S-1-s) (every later stage needs a layer), so
    each stage looks at that window only: with S = L there is one choice per stage.
    """
    w = np.asarray(weights, dtype=float)
    L = len(w)
    if not 1 <= n_stages <= L:
        raise PplanError(f"cannot split {L} layers into {n_stages} stages")
    pre = np.concatenate([[0.0], np.cumsum(w)])
    bad = np.flatnonzero(~(np.isfinite(w) & (w >= 0)))
    if bad.size:  # the windows' bisections need block sums that grow with the block
        raise PplanError(f"layer {int(bad[0])} has weight {float(w[bad[0]])!r}; balanced cuts need weights >= 0",
                         "give non-negative parameter bytes or times")
    z = _least_largest_block(pre, L, n_stages)
    # Many partitions share the optimal largest block; keep the most even one (least sum of
    # squares), as a person balancing by hand would.
    return _most_even(pre, L, n_stages, z * (1 + 1e-12) + 1e-300)


def _least_largest_block(pre: np.ndarray, L: int, S: int) -> float:
    """min over partitions of the largest block pre[j] - pre[i] (non-negative weights).

    f_s(j) = min_i max(f_{s-1}(i), block(i, j)) with f_{s-1} non-decreasing and block(i, j)
    non-increasing in i: the minimum sits where they cross, found by bisection.
    """
    width = L - S + 1  # ends each stage can take
    f = pre[1:width + 1].copy()  # stage 0 ends at 1 .. width
    for s in range(1, S):
        j = np.arange(s + 1, s + 1 + width)  # this stage's ends; previous ends are s .. s+width-1
        lo = np.full(width, s, dtype=np.int64)

        def reaches(i: np.ndarray) -> np.ndarray:
            return f[i - s] >= pre[j] - pre[i]

        cross = first_true(lo, j - 1, reaches)  # first i where f_{s-1}(i) >= block(i, j); j when none
        at = np.minimum(cross, j - 1)
        right = np.where(cross <= j - 1, f[at - s], np.inf)
        before = np.maximum(cross - 1, s)
        left = np.where(cross > s, pre[j] - pre[before], np.inf)
        f = np.minimum(right, left)
    return float(f[-1])


def _most_even(pre: np.ndarray, L: int, S: int, z: float) -> tuple[int, ...]:
    """Least sum of squared blocks among partitions whose blocks are all <= z; ties to the earliest cut.

    A stage ending at j can start at i only where pre[j] - pre[i] <= z (i >= lo[j], by bisection)
    and inside the previous stage's window of ends.
    """
    width = L - S + 1
    ends = np.arange(L + 1)
    lo = first_true(np.zeros(L + 1, dtype=np.int64), ends, lambda i: pre[ends] - pre[i] <= z)
    first = pre[1:width + 1] - pre[0]
    g = np.where(first <= z, first * first, np.inf)
    back = []
    for s in range(1, S):
        js = np.arange(s + 1, s + 1 + width)
        starts = np.maximum(lo[js], s)
        counts = np.maximum(np.minimum(js - 1, s + width - 1) - starts + 1, 0)
        g, arg = best_starts(pre, g, s, js, starts, counts)
        back.append(arg)
    cuts = [L]
    for s in range(S - 1, 0, -1):
        cuts.append(int(back[s - 1][cuts[-1] - (s + 1)]))
    cuts.append(0)
    return tuple(reversed(cuts))


def baseline_cuts(method: str, n_stages: int, param_bytes: np.ndarray, fwd_bwd_ms: np.ndarray) -> tuple[int, ...]:
    """Cuts of baseline `method` for `n_stages` stages."""
    if method == "uniform":
        return uniform_cuts(len(param_bytes), n_stages)
    if method == "params":
        return balanced_cuts(param_bytes, n_stages)
    if method == "time":
        return balanced_cuts(fwd_bwd_ms, n_stages)
    raise PplanError(f"unknown baseline {method!r}", f"use one of {', '.join(BASELINES)}")
