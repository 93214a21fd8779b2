"""Exact dynamic programme over stage cuts, with the recompute choice inside (chain models).

Solves planner.partition.problem's objective exactly: lexicographic (bottleneck, total).
A single DP over (max, sum) pairs is not exact (a prefix with a worse max can have the better
sum once a later stage dominates the max), so it runs in two passes:

  1. f_s(j) = min_i max(f_{s-1}(i), t_s(i, j))      -> the optimal bottleneck Z
  2. g_s(j) = min_i g_{s-1}(i) + t_s(i, j)  over stages with t_s(i, j) <= Z (+TIME_TOL)
                                                      -> the least total at that bottleneck
where t_s(i, j) is the stage time with the cheapest recompute set of the family that fits
position s's budget (inf when none fits). With f >= 0 recompute time grows with q, so the
cheapest fitting set is the smallest fitting q: "q layers recomputed saves
k*D(q) - T(q) bytes" is made monotone by a running max over q and searched by bisection.

Every table is an (L+1) x (L+1) numpy array over (i, j); a pass costs O(L^2) vector work per
stage position, O(L^2 * S) in all.
"""

from __future__ import annotations

import numpy as np

from planner.partition.problem import TIME_TOL, PartitionProblem, Solution, evaluate, saving_layers

__all__ = ["solve_dp", "min_memory_scale"]

_CACHE_ELEMENTS = 8_000_000  # keep pass-1 tables for pass 2 below this many floats (64 MB)


def _prefix(x: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.asarray(x, dtype=float))])


class _Tables:
    """Position-independent (i, j) matrices, built once per problem."""

    def __init__(self, p: PartitionProblem):
        L = p.n_layers
        self.p = p
        self.L = L
        idx = np.arange(L + 1)
        self.I, self.J = idx[:, None], idx[None, :]
        self.valid = self.J > self.I
        bb = np.asarray(p.boundary_bytes, dtype=float)
        self.bb = bb
        ps, pa, pc = _prefix(p.static_bytes), _prefix(p.activation_bytes), _prefix(p.compute_ms)
        self.fixed_bytes = (ps[self.J] - ps[self.I]) + 2.0 * (bb[self.I] + bb[self.J])
        self.act = pa[self.J] - pa[self.I]
        self.comp = pc[self.J] - pc[self.I]
        self._h_cache: dict[float, np.ndarray] = {}
        if p.recompute == "all":
            pin, pr = _prefix(p.input_bytes), _prefix(p.recompute_ms)
            self.kept_all = pin[self.J] - pin[self.I]
            self.rec_all = pr[self.J] - pr[self.I]
            self.trans_all = _range_max(np.asarray(p.activation_bytes, dtype=float))
        elif p.recompute == "auto":
            mask = saving_layers(p)
            self.elig = np.flatnonzero(mask)
            ne = len(self.elig)
            self.ne = ne
            pe = np.concatenate([[0], np.cumsum(mask.astype(np.int64))])
            self.pe = pe  # pe[i] = index into the eligible list of the first saving layer >= i
            self.cnt = pe[self.J] - pe[self.I]
            a = np.asarray(p.activation_bytes, dtype=float)[self.elig]
            d = a - np.asarray(p.input_bytes, dtype=float)[self.elig]
            self.pf = _prefix(np.asarray(p.recompute_ms, dtype=float)[self.elig])
            pd = _prefix(d)
            q = np.arange(ne + 1)[None, :]
            start = np.arange(ne + 1)[:, None]
            end = start + q
            inside = end <= ne
            endc = np.minimum(end, ne)
            self.saved = np.where(inside, pd[endc] - pd[start], -np.inf)  # D(p, q)
            self.trans = np.where(inside, _prefix_runmax(a), np.inf)     # T(p, q)

    def h(self, k: float) -> np.ndarray:
        """H_k(p, q) = max over q' <= q of k*D(p, q') - T(p, q'): non-decreasing in q."""
        got = self._h_cache.get(k)
        if got is None:
            with np.errstate(invalid="ignore"):
                g = k * self.saved - self.trans
            g = np.where(np.isnan(g), -np.inf, g)
            got = np.maximum.accumulate(g, axis=1)
            self._h_cache[k] = got
        return got

    def comm(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """Per i: send of the input gradient; per j: send of the output (position s)."""
        p, bb = self.p, self.bb
        zero = np.zeros(self.L + 1)
        cin = zero if s == 0 else np.where(bb > 0, p.link_latency_ms[s - 1] + bb * p.link_ms_per_byte[s - 1], 0.0)
        cout = zero if s == p.n_stages - 1 else np.where(bb > 0, p.link_latency_ms[s] + bb * p.link_ms_per_byte[s], 0.0)
        return cin, cout

    def stage(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """(time[i, j] with inf where nothing fits or i >= j, chosen q[i, j]) at position s."""
        p = self.p
        k, budget = float(p.inflight[s]), float(p.budget[s])
        q = np.zeros((self.L + 1, self.L + 1), dtype=np.int64)
        if p.recompute == "all":
            mem = self.fixed_bytes + k * self.kept_all + self.trans_all
            ok = self.valid & (mem <= budget)
            rec = self.rec_all
        else:
            need = self.fixed_bytes + k * self.act - budget
            ok = self.valid & (need <= 0)
            rec = 0.0
            if p.recompute == "auto" and self.ne and np.isfinite(budget):
                h = self.h(k)
                over = self.valid & (need > 0)
                for i in np.flatnonzero(over.any(axis=1)):
                    cols = np.flatnonzero(over[i])
                    q[i, cols] = np.searchsorted(h[self.pe[i]], need[i, cols], side="left")
                ok = self.valid & ((need <= 0) | (q <= self.cnt))
                pi = self.pe[self.I]
                rec = self.pf[np.minimum(pi + q, self.ne)] - self.pf[pi]
        cin, cout = self.comm(s)
        t = (self.comp + rec) / float(p.speed[s]) + float(p.overhead_ms[s]) + cin[:, None] + cout[None, :]
        return np.where(ok, t, np.inf), q

    def min_bytes(self, s: int) -> np.ndarray:
        """Least memory over the family for each (i, j) at position s (inf where i >= j)."""
        p = self.p
        k = float(p.inflight[s])
        if p.recompute == "all":
            mem = self.fixed_bytes + k * self.kept_all + self.trans_all
        else:
            mem = self.fixed_bytes + k * self.act
            if p.recompute == "auto" and self.ne:
                pi = np.broadcast_to(self.pe[self.I], mem.shape)
                best = self.h(k)[pi, np.maximum(self.cnt, 0)]
                mem = mem - best
        return np.where(self.valid, mem, np.inf)


def _range_max(a: np.ndarray) -> np.ndarray:
    """M[i, j] = max a[i:j] (0 when empty)."""
    L = len(a)
    out = np.zeros((L + 1, L + 1))
    for i in range(L):
        out[i, i + 1:] = np.maximum.accumulate(a[i:])
    return out


def _prefix_runmax(a: np.ndarray) -> np.ndarray:
    """T[p, q] = max a[p:p+q] (0 for q = 0; beyond the end repeats the last value)."""
    n = len(a)
    out = np.zeros((n + 1, n + 1))
    for i in range(n):
        run = np.maximum.accumulate(a[i:])
        out[i, 1:n - i + 1] = run
        out[i, n - i + 1:] = run[-1]
    return out


def _position_key(p: PartitionProblem, s: int) -> tuple:
    S = p.n_stages
    lin = (float(p.link_latency_ms[s - 1]), float(p.link_ms_per_byte[s - 1])) if s > 0 else None
    lout = (float(p.link_latency_ms[s]), float(p.link_ms_per_byte[s])) if s < S - 1 else None
    return (float(p.inflight[s]), float(p.budget[s]), float(p.speed[s]), float(p.overhead_ms[s]), lin, lout)


def solve_dp(p: PartitionProblem) -> Solution | None:
    """The optimal solution of `p`, or None when no cut fits the memory budgets."""
    L, S = p.n_layers, p.n_stages
    if S < 1 or S > L:
        return None
    tab = _Tables(p)
    cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    keep = S * (L + 1) ** 2 <= _CACHE_ELEMENTS

    def table(s: int) -> tuple[np.ndarray, np.ndarray]:
        key = _position_key(p, s)
        got = cache.get(key)
        if got is None:
            got = tab.stage(s)
            if keep:
                cache[key] = got
            else:
                cache.clear()
                cache[key] = got
        return got

    # Pass 1: least bottleneck.
    f = table(0)[0][0].copy()
    for s in range(1, S):
        t, _ = table(s)
        f = np.maximum(f[:, None], t).min(axis=0)
    z = float(f[L])
    if not np.isfinite(z):
        return None
    limit = z + TIME_TOL * max(1.0, abs(z))
    # Pass 2: least total among stages no slower than the bottleneck.
    t0, q0 = table(0)
    g = np.where(t0[0] <= limit, t0[0], np.inf)
    back: list[np.ndarray] = []
    qsel: list[np.ndarray] = [q0[0].copy()]
    cols = np.arange(L + 1)
    for s in range(1, S):
        t, q = table(s)
        cand = g[:, None] + np.where(t <= limit, t, np.inf)
        arg = cand.argmin(axis=0)
        g = cand[arg, cols]
        back.append(arg)
        qsel.append(q[arg, cols])
    cuts = [L]
    for s in range(S - 1, 0, -1):
        cuts.append(int(back[s - 1][cuts[-1]]))
    cuts.append(0)
    cuts.reverse()
    rec = []
    for s in range(S):
        i, j = cuts[s], cuts[s + 1]
        if p.recompute == "all":
            rec.append(tuple(range(i, j)))
        elif p.recompute == "auto" and tab.ne:
            n = int(qsel[s][j])
            rec.append(tuple(int(x) for x in tab.elig[tab.pe[i]:tab.pe[i] + n]))
        else:
            rec.append(())
    return evaluate(p, tuple(cuts), tuple(rec), "dp")


def min_memory_scale(p: PartitionProblem) -> tuple[float, tuple[int, ...]] | None:
    """Least lambda such that budgets x lambda admit a plan, and its cuts (min-max DP).

    Positions with an unlimited budget do not constrain lambda. None when S > L.
    """
    L, S = p.n_layers, p.n_stages
    if S < 1 or S > L:
        return None
    tab = _Tables(p)

    def ratio(s: int) -> np.ndarray:
        b = float(p.budget[s])
        m = tab.min_bytes(s)
        if not np.isfinite(b):
            return np.where(tab.valid, 0.0, np.inf)
        return m / b

    f = ratio(0)[0].copy()
    back = []
    cols = np.arange(L + 1)
    for s in range(1, S):
        cand = np.maximum(f[:, None], ratio(s))
        arg = cand.argmin(axis=0)
        f = cand[arg, cols]
        back.append(arg)
    cuts = [L]
    for s in range(S - 1, 0, -1):
        cuts.append(int(back[s - 1][cuts[-1]]))
    cuts.append(0)
    return float(f[L]), tuple(reversed(cuts))
