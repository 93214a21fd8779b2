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


_PAIRS_PER_CHUNK = 1 << 22  # (end, start) pairs priced at once in _most_even


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
        new_g = np.full(width, np.inf)
        arg = np.zeros(width, dtype=np.int64)
        if int(counts.sum()) <= _MONOTONE_FROM * width or not _monotone_starts(pre, g, s, js, starts, counts, new_g, arg):
            k = 0
            while k < width:  # chunks of ends, so that a flat z never prices width^2 pairs at once
                stop = k + 1 + int(np.searchsorted(np.cumsum(counts[k:]), _PAIRS_PER_CHUNK, side="right"))
                stop = min(stop, width)
                _best_starts(pre, g, s, js[k:stop], starts[k:stop], counts[k:stop], new_g[k:stop], arg[k:stop])
                k = stop
        g = new_g
        back.append(arg)
    cuts = [L]
    for s in range(S - 1, 0, -1):
        cuts.append(int(back[s - 1][cuts[-1] - (s + 1)]))
    cuts.append(0)
    return tuple(reversed(cuts))


_MONOTONE_FROM = 64
"""Average starts per end above which _most_even searches starts by monotone divide and conquer.
Below it every (end, start) pair is priced, as the plans pinned by tests/data/golden_plans were."""


def _monotone_starts(pre: np.ndarray, g: np.ndarray, s: int, js: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                     out_g: np.ndarray, out_arg: np.ndarray) -> bool:
    """_best_starts for every end at once in O(width log width) pairs, not O(width^2); False (nothing
    written) where its premise does not hold, for the caller to price every pair.

    With non-negative weights a squared block sum satisfies the quadrangle inequality, and a block
    over z (infinite) or a previous end that cannot be reached (g infinite) keeps it; then the first
    best start of an end never decreases with the end, so each end's best start, found in the middle
    of a run of ends, bounds the searches of the runs on either side (divide and conquer, one numpy
    pass per level). The reachable previous ends and the ends reachable from them are each one
    interval; the search keeps to those. With one very heavy layer (every block fits under z) this
    took a 4000-layer, 2000-stage split from tens of seconds to about a second.
    """
    found_g, found = np.full(out_g.size, np.inf), np.zeros(out_arg.size, dtype=np.int64)
    finite = np.flatnonzero(np.isfinite(g))
    if finite.size == 0:
        return False
    p, q = s + int(finite[0]), s + int(finite[-1])
    lower = np.maximum(starts, p)
    upper = np.minimum(starts + counts - 1, q)
    ends = np.flatnonzero(lower <= upper)
    if ends.size == 0 or ends[-1] - ends[0] + 1 != ends.size:
        return False
    klo, khi = ends[:1].copy(), ends[-1:].copy()
    olo, ohi = np.array([p]), np.array([q])
    while klo.size:
        mid = (klo + khi) // 2
        first = np.maximum(lower[mid], olo)
        n = np.minimum(upper[mid], ohi) - first + 1
        if np.any(n < 1):
            return False  # cannot happen when the inequality holds; price every pair rather than guess
        best_g, best = np.empty(mid.size), np.empty(mid.size, dtype=np.int64)
        _best_starts(pre, g, s, js[mid], first, n, best_g, best)
        found_g[mid], found[mid] = best_g, best
        left, right = klo <= mid - 1, mid + 1 <= khi
        klo, khi = np.concatenate([klo[left], mid[right] + 1]), np.concatenate([mid[left] - 1, khi[right]])
        olo, ohi = np.concatenate([olo[left], best[right]]), np.concatenate([best[left], ohi[right]])
    out_g[:], out_arg[:] = found_g, found
    return True


def _best_starts(pre: np.ndarray, g: np.ndarray, s: int, js: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                 out_g: np.ndarray, out_arg: np.ndarray) -> None:
    """For each end j: the start i (first among equals) minimising g_{s-1}(i) + (pre[j] - pre[i])^2."""
    seg = np.flatnonzero(counts)
    if seg.size == 0:
        return
    n = counts[seg]
    offsets = np.concatenate([[0], np.cumsum(n)[:-1]])
    owner = np.repeat(np.arange(seg.size), n)
    i = starts[seg][owner] + (np.arange(int(n.sum())) - offsets[owner])
    block = pre[js[seg][owner]] - pre[i]
    cand = g[i - s] + block * block  # g holds the previous stage's ends s .. s+width-1
    low = np.minimum.reduceat(cand, offsets)
    hit = np.flatnonzero(cand == low[owner])
    _, firsts = np.unique(owner[hit], return_index=True)
    out_g[seg] = low
    out_arg[seg] = i[hit[firsts]]


def baseline_cuts(method: str, n_stages: int, param_bytes: np.ndarray, fwd_bwd_ms: np.ndarray) -> tuple[int, ...]:
    """Cuts of baseline `method` for `n_stages` stages."""
    if method == "uniform":
        return uniform_cuts(len(param_bytes), n_stages)
    if method == "params":
        return balanced_cuts(param_bytes, n_stages)
    if method == "time":
        return balanced_cuts(fwd_bwd_ms, n_stages)
    raise PplanError(f"unknown baseline {method!r}", f"use one of {', '.join(BASELINES)}")
