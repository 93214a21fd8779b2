"""The DP's recompute choice as tables: the first q saving layers of a stage, for every start at once.

The `auto` family (planner.partition.problem) recomputes, in a stage whose first saving layer
(activation > checkpoint input) is the p-th, the saving layers p .. p+q-1. Against no recompute
that saves D(p, q) kept bytes per micro-batch in flight (their activation - input summed) and
raises the transient from the stage's largest workspace W to max(W, T(p, q)), T(p, q) the largest
layer_transient (what the layer's recompute brings back + its workspace, planner.cost.transient)
among them. A moment holding c
micro-batches with a backward running fits when

    c D(p, q) - max(T(p, q) - W, 0) >= need,

which holds exactly when both  c D - T >= need - W  and  c D >= need.  The first has the form the
tables answer per start (H_c(p, q), a running max over q, searched by bisection); the second is
monotone in q and knows nothing of W. So `split_moments` turns each such moment into those two
conditions and the tables stay per start, although W depends on the stage's end. A moment without
a backward running fits when c D >= need. Without a workspace column (W = 0) the second condition
follows from the first and is left out: the tables and the search are the older ones exactly.

T is constant on runs of q, where every saving grows with q, so with several conditions the least
q fitting all is found run by run (planner.partition.recompute.first_fitting_all), and the least
memory over q is at a run's end (least_all).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from planner.cost import recompute_saving
from planner.cost.transient import layer_transient
from planner.partition.problem import PartitionProblem, rematerialized, saving_layers
from planner.partition.tables import prefix_runmax, prefix_sums
from planner.partition.recompute import first_fitting_all, least_all, run_ends

__all__ = ["PrefixRecompute"]

_H_CACHE = 4  # saving tables kept (one per in-flight count)


class PrefixRecompute:
    """D(p, q), T(p, q) and the saving tables of a problem's saving layers (module docstring)."""

    def __init__(self, p: PartitionProblem):
        mask = saving_layers(p)
        self.elig = np.flatnonzero(mask)
        self.ne = ne = len(self.elig)
        self.pe = np.concatenate([[0], np.cumsum(mask.astype(np.int64))])  # index of the first saving layer >= i
        self.pf = prefix_sums(np.asarray(p.recompute_ms, dtype=float)[self.elig])
        self.with_workspace = p.workspace_bytes is not None
        d = np.asarray(p.activation_bytes, dtype=float)[self.elig] - np.asarray(p.input_bytes, dtype=float)[self.elig]
        pd = prefix_sums(d)
        q = np.arange(ne + 1)[None, :]
        start = np.arange(ne + 1)[:, None]
        inside = start + q <= ne
        endc = np.minimum(start + q, ne)
        self.saved = np.where(inside, pd[endc] - pd[start], -np.inf)  # D(p, q)
        top = layer_transient(rematerialized(p), p.workspace_bytes)[self.elig]
        self.trans = np.where(inside, prefix_runmax(top), np.inf)     # T(p, q)
        self._h_cache: dict[tuple, np.ndarray] = {}
        self._run_end: np.ndarray | None = None

    def split_moments(self, kinds: tuple, values: Sequence[np.ndarray], work) -> tuple[tuple, list]:
        """Each moment's condition as the tables' conditions (module docstring): a moment with a
        backward running becomes itself with its value (a need, or bytes held) less the stage's
        largest workspace `work`, and the same moment without the transient with its value as it
        is. Without a workspace column the moments as they are."""
        if not self.with_workspace:
            return kinds, list(values)
        out_kinds, out_values = [], []
        for m, v in zip(kinds, values):
            if m.transient:
                out_kinds += [m, replace(m, transient=False)]
                out_values += [v - work, v]
            else:
                out_kinds.append(m)
                out_values.append(v)
        return tuple(out_kinds), out_values

    def h(self, k: float, qmax: int, transient: bool = True) -> np.ndarray:
        """H_k(p, q) = max over q' <= q of k*D(p, q') - T(p, q'), for q <= qmax: non-decreasing in q
        (without `transient`: k*D, for a condition without the transient)."""
        key = (k, qmax, transient)
        got = self._h_cache.get(key)
        if got is None:
            with np.errstate(invalid="ignore"):
                g = recompute_saving(k, self.saved[:, :qmax + 1], self.trans[:, :qmax + 1] if transient else 0.0)
            g = np.where(np.isnan(g), -np.inf, g)
            got = np.maximum.accumulate(g, axis=1)
            if len(self._h_cache) >= _H_CACHE:  # 1F1B has a different k per position: keep memory bounded
                self._h_cache.pop(next(iter(self._h_cache)))
            self._h_cache[key] = got
        return got

    def _first_fitting_q(self, k: float, starts: np.ndarray, need: np.ndarray, qmax: int, transient: bool) -> np.ndarray:
        """Least q <= qmax with H_k(starts, q) >= need (qmax + 1 when none): vectorised bisection."""
        h = self.h(k, qmax, transient)
        lo = np.zeros(len(need), dtype=np.int64)
        hi = np.full(len(need), qmax + 1, dtype=np.int64)
        while True:
            active = lo < hi
            if not active.any():
                return lo
            mid = (lo + hi) // 2
            reach = h[starts, np.minimum(mid, qmax)] >= need
            hi = np.where(active & reach, mid, hi)
            lo = np.where(active & ~reach, mid + 1, lo)

    def run_end(self) -> np.ndarray:
        """planner.partition.recompute.run_ends of T(p, q), made once."""
        if self._run_end is None:
            self._run_end = run_ends(self.trans)
        return self._run_end

    def least_q(self, kinds: tuple, needs: list[np.ndarray], starts: np.ndarray, count: np.ndarray, work) -> np.ndarray:
        """Per stage (its first saving layer `starts`, `count` saving layers, largest workspace
        `work`), the least q whose savings reach every moment's need (count + 1 when none)."""
        kinds, needs = self.split_moments(kinds, needs, work)
        qmax = int(count.max())
        firsts = [self._first_fitting_q(m.in_flight, starts, need, qmax, m.transient) for m, need in zip(kinds, needs)]
        if len(kinds) == 1:
            return firsts[0]
        return first_fitting_all(kinds, self.saved, self.trans, self.run_end(), starts, np.maximum.reduce(firsts), needs, count)

    def least_held(self, kinds: tuple, held: list[np.ndarray], starts: np.ndarray, count: np.ndarray, work) -> np.ndarray:
        """Per stage, the least over q <= count of the largest moment's bytes, max_m (held_m - saving_m(q)),
        with the stages' largest workspace `work`."""
        kinds, held = self.split_moments(kinds, held, work)
        if len(kinds) == 1:
            return held[0] - self.h(kinds[0].in_flight, self.ne, kinds[0].transient)[starts, count]
        return least_all(kinds, self.saved, self.trans, self.run_end(), starts, held, count)
