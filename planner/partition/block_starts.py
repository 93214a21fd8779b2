"""One step of the balanced baselines' "most even" DP: for each end of a stage, its best start.

The DP (planner.partition.baselines) adds stages one at a time. Given `g[i - s]`, the least sum of
squared blocks of the stages before this one when they end at layer i (i in s .. s + len(g) - 1;
inf where they cannot), this stage ending at `js[k]` may start at `starts[k]` .. `starts[k] +
counts[k] - 1` (its block fits under the largest block allowed), and costs
g[i - s] + (pre[j] - pre[i])^2. For each end: the least cost and its first start among equals.

Pricing every (end, start) pair is O(ends x starts); when windows are long (one very heavy layer
lets every block fit) that was tens of seconds at thousands of layers. A squared block sum of
non-negative weights satisfies the quadrangle inequality, so the first best start never decreases
with the end, and a divide and conquer over the ends finds them all in O(ends log ends) pairs.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MONOTONE_FROM", "best_starts", "every_pair_starts", "monotone_starts"]

MONOTONE_FROM = 64
"""Average starts per end above which best_starts searches by divide and conquer. Below it every
pair is priced, as the plans pinned by tests/data/golden_plans were."""

_PAIRS_PER_CHUNK = 1 << 22  # (end, start) pairs priced at once: a flat limit never prices ends x starts at once

Starts = tuple[np.ndarray, np.ndarray]  # per end: least cost (inf where none), first start reaching it


def best_starts(pre: np.ndarray, g: np.ndarray, s: int, js: np.ndarray, starts: np.ndarray,
                counts: np.ndarray) -> Starts:
    """Per end: the least cost and its first start (module docstring), by the cheaper exact search."""
    if int(counts.sum()) > MONOTONE_FROM * len(js):
        found = monotone_starts(pre, g, s, js, starts, counts)
        if found is not None:
            return found
    return every_pair_starts(pre, g, s, js, starts, counts)


def every_pair_starts(pre: np.ndarray, g: np.ndarray, s: int, js: np.ndarray, starts: np.ndarray,
                      counts: np.ndarray) -> Starts:
    """Per end: the least cost and its first start, pricing every allowed (end, start) pair."""
    out_g, out_arg = np.full(len(js), np.inf), np.zeros(len(js), dtype=np.int64)
    k = 0
    while k < len(js):
        stop = min(k + 1 + int(np.searchsorted(np.cumsum(counts[k:]), _PAIRS_PER_CHUNK, side="right")), len(js))
        _price(pre, g, s, js[k:stop], starts[k:stop], counts[k:stop], out_g[k:stop], out_arg[k:stop])
        k = stop
    return out_g, out_arg


def monotone_starts(pre: np.ndarray, g: np.ndarray, s: int, js: np.ndarray, starts: np.ndarray,
                    counts: np.ndarray) -> Starts | None:
    """Per end: the least cost and its first start, by divide and conquer over the ends (one numpy
    pass per level); None where its premise does not hold, for the caller to price every pair.

    The quadrangle inequality survives a block over the limit (no start) and a previous end that
    cannot be reached (g inf): the reachable previous ends and the ends reachable from them are
    each one interval, and the search keeps to those. Each end's first best start, found in the
    middle of a run of ends, bounds the searches of the runs on either side.
    """
    out_g, out_arg = np.full(len(js), np.inf), np.zeros(len(js), dtype=np.int64)
    finite = np.flatnonzero(np.isfinite(g))
    if finite.size == 0:
        return None
    p, q = s + int(finite[0]), s + int(finite[-1])
    lower = np.maximum(starts, p)
    upper = np.minimum(starts + counts - 1, q)
    ends = np.flatnonzero(lower <= upper)
    if ends.size == 0 or ends[-1] - ends[0] + 1 != ends.size:
        return None
    klo, khi = ends[:1].copy(), ends[-1:].copy()
    olo, ohi = np.array([p]), np.array([q])
    while klo.size:
        mid = (klo + khi) // 2
        first = np.maximum(lower[mid], olo)
        n = np.minimum(upper[mid], ohi) - first + 1
        if np.any(n < 1):
            return None  # cannot happen when the inequality holds (rounding aside): price every pair instead
        best_g, best = np.empty(mid.size), np.empty(mid.size, dtype=np.int64)
        _price(pre, g, s, js[mid], first, n, best_g, best)
        out_g[mid], out_arg[mid] = best_g, best
        left, right = klo <= mid - 1, mid + 1 <= khi
        klo, khi = np.concatenate([klo[left], mid[right] + 1]), np.concatenate([mid[left] - 1, khi[right]])
        olo, ohi = np.concatenate([olo[left], best[right]]), np.concatenate([best[left], ohi[right]])
    return out_g, out_arg


def _price(pre: np.ndarray, g: np.ndarray, s: int, js: np.ndarray, starts: np.ndarray, counts: np.ndarray,
           out_g: np.ndarray, out_arg: np.ndarray) -> None:
    """Writes, for each end with counts > 0, the least g[i - s] + (pre[j] - pre[i])^2 over its starts
    and the first start reaching it."""
    seg = np.flatnonzero(counts)
    if seg.size == 0:
        return
    n = counts[seg]
    offsets = np.concatenate([[0], np.cumsum(n)[:-1]])
    owner = np.repeat(np.arange(seg.size), n)
    i = starts[seg][owner] + (np.arange(int(n.sum())) - offsets[owner])
    block = pre[js[seg][owner]] - pre[i]
    cand = g[i - s] + block * block
    low = np.minimum.reduceat(cand, offsets)
    hit = np.flatnonzero(cand == low[owner])
    _, firsts = np.unique(owner[hit], return_index=True)
    out_g[seg] = low
    out_arg[seg] = i[hit[firsts]]
