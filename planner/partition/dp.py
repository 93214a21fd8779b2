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
A stage's memory is the largest over its schedule's moments (planner.cost.stage_bytes: GPipe's
first backward, k = M in flight and no gradients yet, and a later one, M - 1 and the gradients);
each drops by its own saving and all must fit. With one condition (1F1B once M >= P, no
workspace column) that is one bisection; with more, each one's bisection gives a lower bound, and
as T is constant on runs of q where every saving grows (one run per new largest recomputed
transient, few in practice), the least q fitting all is found by stepping run by run and bisecting
inside the first run whose last q fits. planner.partition.recompute_prefix holds those tables and
turns a moment's condition (its transient depends on the stage's end) into conditions per start.

Stage s can only end before layers s+1 .. L-(S-1-s) (problem.stage_window), so a pass relaxes an
(L-S+1)^2 window per stage (one entry when S = L), over (L+1)^2 tables (planner.partition.tables)
shared by equal positions or, when S is near L, built per window. Only a band is priced: a stage whose
compute alone exceeds a cap cannot be in a plan with a smaller bottleneck, so pass 1 starts with
a cap of twice the balanced share and raises it to the bottleneck found when that was larger
(exact: see _least_bottleneck); pass 2 uses the optimal bottleneck as its cap.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.cost import fixed_bytes, stage_batch_bytes, moment_bytes, stage_time_ms, transfer_ms
from planner.cost.held import sent_bytes
from planner.cost.transient import layer_transient
from planner.partition.recompute_prefix import PrefixRecompute
from planner.partition.problem import (
    TIME_TOL, PartitionProblem, Solution, band_starts, evaluate, moments, passthrough_table, position_key, rematerialized,
    relax_window, stage_window,
)
from planner.partition.tables import prefix_sums, range_max, split_backward_tables
from planner.schedules.memory import Moment, MomentStack, corner_moments, stack_moments

__all__ = ["solve_dp", "min_memory_scale", "StageTables", "windowed_is_cheaper"]

_CACHE_ELEMENTS = 8_000_000  # keep per-position tables while all of them fit in this many floats (64 MB)


class StageTables:
    """Prefix sums of a problem, and per-position stage tables over a band of (i, j): how solve_dp
    and min_memory_scale price every stage [i, j) at a position at once."""

    def __init__(self, p: PartitionProblem):
        L = p.n_layers
        self.p, self.L = p, L
        self.valid = np.triu(np.ones((L + 1, L + 1), dtype=bool), k=1)  # i < j
        self.bb = np.asarray(p.boundary_bytes, dtype=float)
        self.ps, self.pa, self.pc = prefix_sums(p.static_bytes), prefix_sums(p.activation_bytes), prefix_sums(p.compute_ms)
        self.comp = self.pc[None, :] - self.pc[:, None]
        self.pt = passthrough_table(p)  # None for a chain; else per-(i, j) bytes held in flight
        self._band_cache: dict[float, tuple[np.ndarray, ...]] = {}
        self._starts_cache: dict[float, np.ndarray] = {}
        self.ne = 0
        # per-(i, j) largest layer workspace: the transient without recompute (planner.cost.transient); None: all 0
        self.work = range_max(np.asarray(p.workspace_bytes, dtype=float)) if p.workspace_bytes is not None else None
        # the optimizer step's temporaries: the stage's largest, charged instead of its activations
        self.optw = (range_max(np.asarray(p.optimizer_workspace_bytes, dtype=float))
                     if p.optimizer_workspace_bytes is not None else None)
        # hold[j]: what a stage ending before layer j holds of its output per micro-batch; None: all 0
        self.hold = (np.concatenate([[0.0], np.asarray(p.held_output_bytes, dtype=float)])
                     if p.held_output_bytes is not None else None)
        # entry[i]: what a stage starting at layer i keeps differently (its input is the receive buffer); None: all 0
        self.entry = (np.concatenate([np.asarray(p.entry_bytes, dtype=float), [0.0]])
                      if p.entry_bytes is not None else None)
        # per-(i, j) gradient bytes: absent at a stage's first memory moment; None: all 0
        self.pg = prefix_sums(p.gradient_bytes) if p.gradient_bytes is not None else None
        # per-(i, j) bytes held between a micro-batch's I and W, what a running I holds beyond the transient and
        # a running W beyond the gradients (0 for i = 0: planner.cost.held, planner.cost.w_workspace); None: all 0
        self.pw, self.running, self.wwork = split_backward_tables(p.wgrad_bytes, p.workspace_bytes, self.work, p.w_workspace_bytes, p.w_carry_bytes)
        self._min_cache: dict[tuple, np.ndarray] = {}
        self._stacks: dict[int, MomentStack | Moment] = {}  # per position, its moments as one MomentStack (or its one moment)
        if p.recompute == "all":
            self.pin, self.pr = prefix_sums(p.input_bytes), prefix_sums(p.recompute_ms)
            self.trans_all = range_max(layer_transient(rematerialized(p), p.workspace_bytes))  # every layer recomputed
        elif p.recompute == "auto":
            self.rec = PrefixRecompute(p)
            self.ne, self.elig, self.pe, self.pf = self.rec.ne, self.rec.elig, self.rec.pe, self.rec.pf

    def band(self, limit: float, window: tuple[int, int, int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(i, j) with i < j and compute(i, j) <= limit: the only stages that can be at most that slow
        (inside `window`, starts i0..i1 and ends j0..j1, when given)."""
        if window is not None:
            i0, i1, j0, j1 = window
            ii, jj = np.meshgrid(np.arange(i0, i1 + 1), np.arange(j0, j1 + 1), indexing="ij")
            keep = (ii < jj) & (self.pc[jj] - self.pc[ii] <= limit)
            return ii[keep], jj[keep]
        got = self._band_cache.get(limit)
        if got is None:
            got = np.nonzero(self.valid & (self.comp <= limit))
            self._band_cache[limit] = got
        return got

    def band_limit(self, s: int, cap: float) -> float:
        """The most compute a stage at position s may have to be no slower than `cap`."""
        return (cap - float(self.p.overhead_ms[s])) * float(self.p.speed[s]) * (1 + 1e-12) if np.isfinite(cap) else np.inf

    def first_starts(self, limit: float) -> np.ndarray:
        """problem.band_starts for band(limit), made once per limit."""
        if limit not in self._starts_cache:
            self._starts_cache[limit] = band_starts(self.pc, limit)
        return self._starts_cache[limit]

    def comm(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """Per i: send of the input gradient; per j: send of the output (position s)."""
        p, bb = self.p, self.bb
        zero = np.zeros(self.L + 1)
        cin = zero if s == 0 else transfer_ms(bb, p.link_latency_ms[s - 1], p.link_ms_per_byte[s - 1])
        cout = zero if s == p.n_stages - 1 else transfer_ms(bb, p.link_latency_ms[s], p.link_ms_per_byte[s])
        return cin, cout

    def memory_terms(self, ii: np.ndarray, jj: np.ndarray) -> tuple[Any, Any, Any, Any, Any]:
        """For stages [ii, jj): (fixed bytes (planner.cost.fixed_bytes), kept bytes per micro-batch
        besides the layers' own, the largest layer workspace, gradient bytes, the optimizer step's
        temporaries): pass-through tensors, the held output and the first layer's correction
        (planner.cost.stage_entry_bytes) in the second."""
        p, bb = self.p, self.bb
        static, pt = self.ps[jj] - self.ps[ii], (self.pt[ii, jj] if self.pt is not None else 0.0)
        work = self.work[ii, jj] if self.work is not None else 0.0
        if self.hold is not None:  # the stage's output, held per micro-batch in flight
            pt = pt + self.hold[jj]
        if self.entry is not None:
            pt = pt + self.entry[ii]
        fixed = fixed_bytes(static, bb[ii], bb[jj], p.recv_microbatches, stage_batch_bytes(p.batch_input_bytes, p.batch_target_bytes, ii == 0, jj == p.n_layers))
        grads = self.pg[jj] - self.pg[ii] if self.pg is not None else 0.0
        step = self.optw[ii, jj] if self.optw is not None else 0.0
        return fixed, pt, work, grads, step

    def _base(self, s: int, ii: np.ndarray, jj: np.ndarray) -> tuple[Any, np.ndarray, Any, tuple, Any]:
        """Stages [ii, jj) at position s with the family's recompute-free set (all: every layer):
        (fixed bytes, each moment's bytes beyond them (planner.cost.moment_bytes, a row each), the optimizer
        step's temporaries, the moments, the largest layer workspace)."""
        p = self.p
        kinds = moments(p, s)
        fixed, pt, work, grads, step = self.memory_terms(ii, jj)
        if p.recompute == "all":
            kept, trans = self.pin[jj] - self.pin[ii] + pt, self.trans_all[ii, jj]
        else:
            kept, trans = self.pa[jj] - self.pa[ii] + pt, work
        wgrad = np.where(ii > 0, self.pw[jj] - self.pw[ii], 0.0) if self.pw is not None else 0.0
        running = self.running[ii, jj] if self.running is not None else 0.0
        w_work = self.wwork[ii, jj] if self.wwork is not None else 0.0
        held = self.hold[jj] if self.hold is not None else 0.0
        sent = sent_bytes(self.bb[ii], self.bb[jj], held, self.pw is not None, jj == self.L, self.p.loss_saved_bytes)
        stack = self._stacks.get(s)
        if stack is None:  # without a recompute choice to price, the moments between two others never peak alone
            priced = kinds if p.recompute == "auto" else corner_moments(kinds)
            stack = self._stacks[s] = priced[0] if len(priced) == 1 else stack_moments(priced)
        rows = moment_bytes(stack, kept, trans, grads, wgrad, sent, held, running, w_work, self.bb[jj])  # a row per moment
        return fixed, np.atleast_2d(rows), step, kinds, work

    def stage(self, s: int, cap: float = np.inf, want_q: bool = True,
              window: tuple[int, int, int, int] | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """(time[i, j], chosen q[i, j] or None) at position s; time is inf where nothing fits,
        i >= j, or the stage cannot be as fast as `cap` (its compute alone is slower). With a
        `window` (starts i0..i1, ends j0..j1) only those entries, indexed from (i0, j0)."""
        p = self.p
        budget = float(p.budget[s])
        speed, ovh = float(p.speed[s]), float(p.overhead_ms[s])
        ii, jj = self.band(self.band_limit(s, cap), window)
        fixed, held, step, kinds, work = self._base(s, ii, jj)
        needs = fixed + held - budget  # how far each moment (a row) is over the budget
        # the optimizer step (with no activations: the floor of every moment) must fit too; recompute cannot shrink it
        step_ok = fixed + np.maximum(step, 0.0) <= budget
        ok = step_ok & (needs <= 0).all(axis=0)
        q = np.zeros(len(ii), dtype=np.int64)
        rec = self.pr[jj] - self.pr[ii] if p.recompute == "all" else 0.0
        if p.recompute == "auto" and self.ne and np.isfinite(budget):
            starts = self.pe[ii]
            over = np.flatnonzero(~ok & step_ok)
            count = self.pe[jj[over]] - starts[over]  # saving layers in each stage
            if over.size:
                got = self.rec.least_q(kinds, [need[over] for need in needs], starts[over], count,
                                       work[over] if np.ndim(work) else work)
                q[over] = got
                ok[over] = got <= count
            rec = self.pf[np.minimum(starts + q, self.ne)] - self.pf[starts]
        cin, cout = self.comm(s)
        t = stage_time_ms(self.pc[jj] - self.pc[ii], rec, speed, ovh, cin[ii], cout[jj])
        i0, i1, j0, j1 = window if window is not None else (0, self.L, 0, self.L)
        ii, jj = ii - i0, jj - j0
        table = np.full((i1 - i0 + 1, j1 - j0 + 1), np.inf)
        table[ii[ok], jj[ok]] = t[ok]
        if not want_q or p.recompute != "auto":
            return table, None
        qs = np.zeros(table.shape, dtype=np.int32)
        qs[ii, jj] = q
        return table, qs

    def min_bytes(self, s: int, window: tuple[int, int, int, int] | None = None) -> np.ndarray:
        """Least memory over the family for each (i, j) at position s (inf where i >= j): the whole
        (L+1)^2 table, shared by positions with the same moments, or only `window` (starts i0..i1,
        ends j0..j1, indexed from (i0, j0)), as stage tables are (StageTables.stage)."""
        key = (moments(self.p, s), window)
        got = self._min_cache.get(key)
        if got is None:
            got = self._min_cache[key] = self._min_bytes(s, window)
        return got

    def _min_bytes(self, s: int, window: tuple[int, int, int, int] | None) -> np.ndarray:
        p = self.p
        ii, jj = self.band(np.inf, window)
        fixed, held, step, kinds, work = self._base(s, ii, jj)
        if p.recompute == "auto" and self.ne:
            starts = self.pe[ii]
            least = self.rec.least_held(kinds, held, starts, self.pe[jj] - starts, work)
        else:
            least = np.maximum.reduce(held) if len(held) > 1 else held[0]
        i0, i1, j0, j1 = window if window is not None else (0, self.L, 0, self.L)
        out = np.full((i1 - i0 + 1, j1 - j0 + 1), np.inf)
        out[ii - i0, jj - j0] = fixed + np.maximum(least, np.maximum(step, 0.0))
        return out




def _first_cap(p: PartitionProblem) -> float:
    """A guess at the bottleneck: twice the balanced share, at least the slowest single layer."""
    comp = np.asarray(p.compute_ms, dtype=float)
    share = comp.sum() / float(np.sum(p.speed))
    return 2.0 * max(share, float(comp.max()) / float(np.min(p.speed))) + float(np.max(p.overhead_ms))


def windowed_is_cheaper(p: PartitionProblem) -> bool:
    """Whether solve_dp builds each position's window (S tables of width^2) rather than whole
    (L+1)^2 tables shared by equal positions: cheaper when S is near L, where each window is narrow."""
    L, S = p.n_layers, p.n_stages
    width = L - S + 1
    shared = len({position_key(p, s) for s in range(S)})
    return S * width * width < shared * (L + 1) ** 2 // 2


class _PassTables:
    """Each position's stage table over its window at the pass's cap, cached by what it depends on
    (equal positions share one), as both passes of solve_dp relax them."""

    def __init__(self, p: PartitionProblem, tab: StageTables, windowed: bool):
        L, S = p.n_layers, p.n_stages
        self.p, self.tab, self.windowed = p, tab, windowed
        # keep every position's table while they all fit; else only the last one built
        self.keep = S * ((L - S + 1) if windowed else L + 1) ** 2 <= _CACHE_ELEMENTS
        self.cap = _first_cap(p)
        self.final = False  # pass 2 needs the chosen q; pass 1 only times (when tables are not kept)
        self._cache: dict[tuple, tuple[np.ndarray, np.ndarray | None]] = {}
        # position -> a number per distinct position_key: hashed once, not at every call (a
        # held-sends schedule's key holds dozens of moments)
        self._position: dict[int, int] = {}
        self._positions: dict[tuple, int] = {}

    def __call__(self, s: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """Stage s's times, its q (or None) and each end's first start row: rows its starts, columns its ends."""
        p, tab = self.p, self.tab
        w = stage_window(p.n_layers, p.n_stages, s)
        if s not in self._position:
            self._position[s] = self._positions.setdefault(position_key(p, s), len(self._positions))
        key = (self._position[s], self.cap, w if self.windowed else None)
        got = self._cache.get(key)
        if got is None:
            if not self.keep:
                self._cache.clear()
            got = self._cache[key] = tab.stage(s, self.cap, want_q=self.keep or self.final,
                                               window=w if self.windowed else None)
        rows = np.maximum(tab.first_starts(tab.band_limit(s, self.cap))[w[2]:w[3] + 1] - w[0], 0)
        if self.windowed:
            return (*got, rows)
        return (*(None if x is None else x[w[0]:w[1] + 1, w[2]:w[3] + 1] for x in got), rows)


def _bottleneck(p: PartitionProblem, tables: _PassTables) -> float:
    """The least largest stage time over every cut, among stages no slower than the tables' cap."""
    f = tables(0)[0][0].copy()
    for s in range(1, p.n_stages):
        f = relax_window(f, *tables(s)[::2])[0]
    return float(f[-1])


def _least_bottleneck(p: PartitionProblem, tables: _PassTables) -> float:
    """Pass 1: the optimal bottleneck (inf when no cut fits). Stages slower than the cap are left
    out; the result is exact once it is <= cap (a left-out stage would be slower), else the found
    plan's bottleneck is a valid cap for one more pass; if nothing was found the cap grows."""
    while True:
        z = _bottleneck(p, tables)
        if z <= tables.cap or not np.isfinite(tables.cap):
            return z
        tables.cap = z if np.isfinite(z) else (tables.cap * 4 if tables.cap * 4 < _no_cap(p) else np.inf)


def _least_total(p: PartitionProblem, tables: _PassTables, limit: float) -> tuple[tuple[int, ...], list[np.ndarray]]:
    """Pass 2: the cuts of least total among stages no slower than `limit`, and per stage the q
    chosen at each of its ends. Arrays are over each stage's ends (s+1 ..), so stage s's row r is
    start s + r."""
    L, S = p.n_layers, p.n_stages
    width = L - S + 1
    tables.cap, tables.final = limit, True
    t0, q0, _ = tables(0)
    g = np.where(t0[0] <= limit, t0[0], np.inf)
    back: list[np.ndarray] = []
    qsel: list[np.ndarray] = [q0[0].copy() if q0 is not None else np.zeros(width, dtype=np.int32)]
    cols = np.arange(width)
    for s in range(1, S):
        t, q, rows = tables(s)
        g, arg = relax_window(g, t, rows, limit)
        back.append(arg + s)
        qsel.append(q[arg, cols] if q is not None else np.zeros(width, dtype=np.int32))
    return _trace_cuts(L, S, back), qsel


def _trace_cuts(L: int, S: int, back: list[np.ndarray]) -> tuple[int, ...]:
    """The cuts back pointers lead to from the last layer: back[s-1][c] is the best start of stage s
    when it ends before layer s+1+c."""
    cuts = [L]
    for s in range(S - 1, 0, -1):
        cuts.append(int(back[s - 1][cuts[-1] - (s + 1)]))
    cuts.append(0)
    return tuple(reversed(cuts))


def _recompute_sets(p: PartitionProblem, tab: StageTables, cuts: tuple[int, ...],
                    qsel: list[np.ndarray]) -> tuple[tuple[int, ...], ...]:
    """Each stage's recompute set of the family: every layer (all), the first q saving layers with
    the q pass 2 chose at the stage's end (auto), or none."""
    rec = []
    for s in range(p.n_stages):
        i, j = cuts[s], cuts[s + 1]
        if p.recompute == "all":
            rec.append(tuple(range(i, j)))
        elif p.recompute == "auto" and tab.ne:
            n = int(qsel[s][j - (s + 1)])
            rec.append(tuple(int(x) for x in tab.elig[tab.pe[i]:tab.pe[i] + n]))
        else:
            rec.append(())
    return tuple(rec)


def solve_dp(p: PartitionProblem, *, windowed: bool | None = None) -> Solution | None:
    """The optimal solution of `p`, or None when no cut fits the memory budgets.

    `windowed` builds each position's window of tables (True) or whole tables shared by equal
    positions (False); both reach the same solution, None takes the cheaper (windowed_is_cheaper).
    """
    if p.n_stages < 1 or p.n_stages > p.n_layers:
        return None
    tab = StageTables(p)
    tables = _PassTables(p, tab, windowed_is_cheaper(p) if windowed is None else windowed)
    z = _least_bottleneck(p, tables)
    if not np.isfinite(z):
        return None
    cuts, qsel = _least_total(p, tables, z + TIME_TOL * max(1.0, abs(z)))
    return evaluate(p, cuts, _recompute_sets(p, tab, cuts, qsel), "dp")


def _no_cap(p: PartitionProblem) -> float:
    """A cap above every possible stage time's compute bound (so the band is everything)."""
    comp = float(np.sum(p.compute_ms))
    return comp / float(np.min(p.speed)) + float(np.max(p.overhead_ms)) + 1.0


def min_memory_scale(p: PartitionProblem) -> tuple[float, tuple[int, ...]] | None:
    """Least lambda such that budgets x lambda admit a plan, and its cuts (min-max DP).

    Positions with an unlimited budget do not constrain lambda. None when S > L.
    """
    L, S = p.n_layers, p.n_stages
    if S < 1 or S > L:
        return None
    tab = StageTables(p)
    # as solve_dp: each position's window alone when S is near L (narrow windows), else whole
    # tables that positions with the same moments share
    windowed = windowed_is_cheaper(p)

    def ratio(s: int) -> np.ndarray:
        """Stage s's least bytes over its budget, over its window (planner.partition.problem.stage_window)."""
        i0, i1, j0, j1 = w = stage_window(L, S, s)
        b = float(p.budget[s])
        if not np.isfinite(b):
            return np.where(tab.valid[i0:i1 + 1, j0:j1 + 1], 0.0, np.inf)
        m = tab.min_bytes(s, w) if windowed else tab.min_bytes(s)[i0:i1 + 1, j0:j1 + 1]
        return m / b

    f = ratio(0)[0].copy()
    back = []
    for s in range(1, S):
        cand = np.maximum(f[:, None], ratio(s))
        arg = cand.argmin(axis=0)
        f = cand[arg, np.arange(len(arg))]
        back.append(arg + s)
    return float(f[-1]), _trace_cuts(L, S, back)
