"""Recompute sets for fixed cuts: the cheapest set that makes a stage fit its budget.

The DP is exact over its family (the first q saving layers of a stage). Once the cuts are
fixed, each stage's set can be improved without touching the others: this module tries the
family's cheapest fitting set, a given start set (the DP's), and a ratio greedy (layers by
memory saved per ms of recompute, under each cap on the largest recomputed activation, since
that activation comes back as the transient), and keeps the fastest that fits. The result is
never slower than the start. Baselines get their sets here too, so every method is judged
with the same recompute policy. Candidate sets are screened with planner.cost.recompute_saving
and accepted only when planner.partition.problem.stage_bytes (the cost model) fits. When nothing fits it returns the least-memory set it saw.
"""

from __future__ import annotations

import numpy as np

from planner.cost import recompute_saving
from planner.partition.problem import PartitionProblem, saving_layers, stage_bytes

__all__ = ["stage_recompute"]


def _cost(p: PartitionProblem, rec: tuple[int, ...]) -> float:
    return float(sum(p.recompute_ms[l] for l in rec))


def _family(p: PartitionProblem, s: int, i: int, j: int, elig: list[int]) -> tuple[tuple[int, ...] | None, tuple[int, ...], float]:
    """(cheapest fitting prefix or None, least-memory prefix, its memory), vectorised over q."""
    k, budget = float(p.inflight[s]), float(p.budget[s])
    base = stage_bytes(p, s, i, j, ())
    if not elig:
        return (() if base <= budget else None), (), base
    a = np.asarray(p.activation_bytes, dtype=float)[elig]
    d = a - np.asarray(p.input_bytes, dtype=float)[elig]
    mem = base - recompute_saving(k, np.concatenate([[0.0], np.cumsum(d)]), np.concatenate([[0.0], np.maximum.accumulate(a)]))
    fitting = np.flatnonzero(mem <= budget)
    least = int(np.argmin(mem))
    first = tuple(elig[: int(fitting[0])]) if fitting.size else None
    return first, tuple(elig[:least]), float(mem[least])


def _greedy(p: PartitionProblem, s: int, i: int, j: int, elig: list[int]) -> tuple[int, ...] | None:
    """Fastest fitting set found by the ratio greedy under each transient cap (None: none fits)."""
    k, budget = float(p.inflight[s]), float(p.budget[s])
    need = stage_bytes(p, s, i, j, ()) - budget
    if need <= 0:
        return ()
    a = {l: float(p.activation_bytes[l]) for l in elig}
    d = {l: a[l] - float(p.input_bytes[l]) for l in elig}
    f = {l: float(p.recompute_ms[l]) for l in elig}
    order = sorted(elig, key=lambda l: (-(d[l] / f[l]) if f[l] > 0 else -np.inf, -d[l], l))
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
            if recompute_saving(k, saved, top) >= need:
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
