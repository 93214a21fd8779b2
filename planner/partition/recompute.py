"""Recompute sets for fixed cuts: the cheapest set that makes a stage fit its budget.

The DP is exact over its family (the first q saving layers of a stage). Once the cuts are
fixed, each stage's set can be improved without touching the others: this module tries the
family's cheapest fitting set, a given start set (the DP's), and a ratio greedy (layers by
memory saved per ms of recompute, under each cap on the largest recomputed layer's transient
term, what its recompute brings back + its workspace, alive during its backward: planner.cost.transient),
and keeps the fastest that fits. The result is
never slower than the start. Baselines get their sets here too, so every method is judged
with the same recompute policy. Candidate sets are screened with planner.cost.recompute_saving
at every memory moment of the stage (planner.cost.stage_bytes: each drops by its own in-flight
count) and accepted only when planner.partition.problem.stage_bytes (the cost model) fits. When nothing fits it returns the least-memory set it saw.
"""

from __future__ import annotations

import numpy as np

from planner.cost import recompute_saving, workspace_max
from planner.cost.transient import layer_transient
from planner.partition.problem import PartitionProblem, moment_terms, moments, rematerialized, saving_layers, stage_bytes

__all__ = ["stage_recompute", "run_ends", "first_fitting_all", "least_all"]


def _cost(p: PartitionProblem, rec: tuple[int, ...]) -> float:
    return float(sum(p.recompute_ms[l] for l in rec))


def _moments(p: PartitionProblem, s: int, i: int, j: int) -> tuple:
    """Layers [i, j) at position s without recompute, by moment (moment_terms), the moments, and
    the stage's largest workspace (its transient without recompute)."""
    return (*moment_terms(p, s, i, j), moments(p, s), workspace_max(p.workspace_bytes, i, j))


def _memory(terms: tuple, saved: np.ndarray | float, top: np.ndarray | float) -> np.ndarray:
    """Memory of a stage (its _moments) when recomputing sets that save `saved` kept bytes per
    micro-batch whose largest layer_transient is `top` (vectorised): each moment drops by its own
    saving; the transient grows from the stage's largest workspace to `top` where that is larger."""
    fixed, held, step, kinds, work = terms
    grown = np.maximum(np.asarray(top, dtype=float) - work, 0.0)
    out = np.maximum(step, 0.0)
    for base, m in zip(held, kinds):
        out = np.maximum(out, base - recompute_saving(m.in_flight, saved, grown if m.transient else 0.0))
    return fixed + out


def _family(p: PartitionProblem, s: int, i: int, j: int, elig: list[int]) -> tuple[tuple[int, ...] | None, tuple[int, ...], float]:
    """(cheapest fitting prefix or None, least-memory prefix, its memory), vectorised over q."""
    budget = float(p.budget[s])
    base = stage_bytes(p, s, i, j, ())
    if not elig:
        return (() if base <= budget else None), (), base
    d = np.asarray(p.activation_bytes, dtype=float)[elig] - np.asarray(p.input_bytes, dtype=float)[elig]
    top = layer_transient(rematerialized(p), p.workspace_bytes)[elig]
    mem = _memory(_moments(p, s, i, j), np.concatenate([[0.0], np.cumsum(d)]), np.concatenate([[0.0], np.maximum.accumulate(top)]))
    fitting = np.flatnonzero(mem <= budget)
    least = int(np.argmin(mem))
    first = tuple(elig[: int(fitting[0])]) if fitting.size else None
    return first, tuple(elig[:least]), float(mem[least])


def _greedy(p: PartitionProblem, s: int, i: int, j: int, elig: list[int]) -> tuple[int, ...] | None:
    """Fastest fitting set found by the ratio greedy under each transient cap (None: none fits)."""
    budget = float(p.budget[s])
    if stage_bytes(p, s, i, j, ()) <= budget:
        return ()
    trans = layer_transient(rematerialized(p), p.workspace_bytes)
    a = {l: float(trans[l]) for l in elig}  # what comes back during l's backward
    d = {l: float(p.activation_bytes[l]) - float(p.input_bytes[l]) for l in elig}
    f = {l: float(p.recompute_ms[l]) for l in elig}
    order = sorted(elig, key=lambda l: (-(d[l] / f[l]) if f[l] > 0 else -np.inf, -d[l], l))
    terms = _moments(p, s, i, j)
    best: tuple[float, int, tuple[int, ...]] | None = None
    for cap in sorted(set(a.values())):
        saved, top, chosen, ms = 0.0, 0.0, [], 0.0
        for l in order:
            if a[l] > cap:
                continue
            chosen.append(l)
            saved += d[l]
            top = max(top, a[l])
            ms += f[l]
            if float(_memory(terms, saved, top)) <= budget:
                key = (ms, len(chosen), tuple(sorted(chosen)))
                if best is None or key < best:
                    best = key
                break
    return None if best is None else best[2]


def stage_recompute(p: PartitionProblem, s: int, i: int, j: int,
                    start: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], bool]:
    """(recompute set, fits) for layers [i, j) at position s under the problem's recompute mode."""
    budget = float(p.budget[s])
    if p.recompute == "none":
        return (), stage_bytes(p, s, i, j, ()) <= budget
    if p.recompute == "all":
        rec = tuple(range(i, j))
        return rec, stage_bytes(p, s, i, j, rec) <= budget
    if not start and stage_bytes(p, s, i, j, ()) <= budget:
        return (), True  # fits without recompute: nothing is cheaper
    mask = saving_layers(p)
    elig = [l for l in range(i, j) if mask[l]]
    first, least, _ = _family(p, s, i, j, elig)
    options = [r for r in (start, first, _greedy(p, s, i, j, elig)) if r is not None]
    fitting = [r for r in options if stage_bytes(p, s, i, j, r) <= budget]
    if not fitting:
        return least, False
    return min(fitting, key=lambda r: (_cost(p, r), len(r), r)), True


# The DP's search over its family (the first q saving layers from the p-th, D(p, q) kept bytes
# saved, T(p, q) the largest recomputed activation) when a stage has several memory moments: each
# drops by its own c D - T (c D where no backward runs then). T is constant on runs of q, where
# every saving grows with q (D grows, c >= 0): fitting is monotone inside a run, and the least
# memory of a run is at its end.

def run_ends(trans: np.ndarray) -> np.ndarray:
    """R[p, q]: the last q' >= q with T(p, q') = T(p, q) (`trans` is T, inf beyond the last layer)."""
    n = trans.shape[1] - 1
    ends_here = np.ones_like(trans, dtype=bool)
    ends_here[:, :-1] = ~(trans[:, 1:] <= trans[:, :-1])
    ends = np.where(ends_here, np.arange(n + 1)[None, :], n + 1)
    return np.minimum.accumulate(ends[:, ::-1], axis=1)[:, ::-1]


def _savings(kinds: tuple, saved: np.ndarray, trans: np.ndarray) -> list[np.ndarray]:
    with np.errstate(invalid="ignore"):
        return [recompute_saving(m.in_flight, saved, trans if m.transient else 0.0) for m in kinds]


def _fits(kinds: tuple, saved: np.ndarray, trans: np.ndarray, needs: list[np.ndarray]) -> np.ndarray:
    ok = np.ones(len(saved), dtype=bool)
    for got, need in zip(_savings(kinds, saved, trans), needs):
        ok &= got >= need
    return ok


def first_fitting_all(kinds: tuple, saved: np.ndarray, trans: np.ndarray, run_end: np.ndarray, starts: np.ndarray,
                      lo: np.ndarray, needs: list[np.ndarray], count: np.ndarray) -> np.ndarray:
    """Per stage, the least q in [lo, count] whose savings reach `needs` at every moment `kinds`
    (count + 1 when none): run by run from `lo` (a lower bound, e.g. each moment's own least q),
    then bisection inside the first run whose last q fits."""
    out, lo = count + 1, lo.copy()
    idx = np.flatnonzero(lo <= count)
    if idx.size:  # most often the lower bound fits already: no run to step through, no bisection
        st = starts[idx]
        at_lo = _fits(kinds, saved[st, lo[idx]], trans[st, lo[idx]], [n[idx] for n in needs])
        out[idx[at_lo]] = lo[idx[at_lo]]
        idx = idx[~at_lo]
    while idx.size:
        st, e = starts[idx], np.minimum(run_end[starts[idx], lo[idx]], count[idx])
        fit = _fits(kinds, saved[st, e], trans[st, e], [n[idx] for n in needs])
        got = idx[fit]
        a, b = lo[got], e[fit]
        while (a < b).any():
            mid = (a + b) // 2
            ok = _fits(kinds, saved[starts[got], mid], trans[starts[got], mid], [n[got] for n in needs])
            b, a = np.where((a < b) & ok, mid, b), np.where((a < b) & ~ok, mid + 1, a)
        out[got] = a
        rest = idx[~fit]
        lo[rest] = e[~fit] + 1
        idx = rest[lo[rest] <= count[rest]]
    return out


def least_all(kinds: tuple, saved: np.ndarray, trans: np.ndarray, run_end: np.ndarray, starts: np.ndarray,
              held: list[np.ndarray], count: np.ndarray) -> np.ndarray:
    """Per stage, the least over q <= count of the largest moment, max_m (held_m - saving_m(q)):
    the least over the runs' last q."""
    best = np.full(len(starts), np.inf)
    q = np.zeros(len(starts), dtype=np.int64)
    idx = np.arange(len(starts))
    while idx.size:
        e = np.minimum(run_end[starts[idx], q[idx]], count[idx])
        at = np.full(len(idx), -np.inf)
        for base, got in zip(held, _savings(kinds, saved[starts[idx], e], trans[starts[idx], e])):
            at = np.maximum(at, base[idx] - got)
        best[idx] = np.minimum(best[idx], at)
        q[idx] = e + 1
        idx = idx[q[idx] <= count[idx]]
    return best
