"""The pipeline's device order for clusters too large for an exact search (planner.cluster.best_path):
the nearest-neighbour walk from every device, the one of least path_score, then first-improvement 2-opt.

Same choices, less work. These make exactly the choices of trying each start's walk in turn and
pricing every 2-opt candidate with path_score (slowest hop, then sum() of the hop costs), rounding
included (tests/test_cluster_order_scale.py holds the old code and compares); what changed is the
bookkeeping that made that O(n^3) (512 devices: 23 s, 1,024: over 120 s):

- hop costs are the default plus the listed pairs (O(pairs), not n^2 link_ms calls);
- all n walks advance together, one numpy step per position: a walk's next device is the first
  unvisited of its pairs cheaper than the default (in (cost, index) order), else the least unvisited
  device not listed at another cost (_least_at_default, on per-walk bitsets), else its first dearer pair;
- a 2-opt candidate changes two hops, so its slowest hop and the exact change of its sum come from
  prefix/suffix maxima, for every j of an i at once. Floats can only mislead where two sums are within
  rounding of each other (_slack): there sum() decides, as before. Skipped: reversals giving the same
  hops in the same order (equal end hops, a palindromic middle: Manacher's radii); summed once: those
  giving one hop sequence (_mirror_keys). What is left, near-ties that reorder the hops, costs O(n)
  each and can number O(n^2) a sweep: planner.cluster bounds n for that (MAX_ORDER_DEVICES).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.cost.comm import Link, link_between, link_ms
from planner.plan import Links

__all__ = ["heuristic_path"]


def heuristic_path(links: Links, n: int, nbytes: float) -> tuple[int, ...]:
    """Order of devices 0..n-1 (n >= 2) by the heuristic: 2-opt from the best nearest-neighbour walk."""
    hops = _pair_costs(links, n, nbytes)
    return _two_opt(hops, _nearest_neighbour(hops))


@dataclass(frozen=True, eq=False)
class _PairCosts:
    """Hop costs among devices 0..n-1, as path_score reads them: `default` but for the listed pairs,
    held both ways and sorted by (device, cost, other device): device a's are begin[a]:end[a], those
    cheaper than the default up to cheap_end[a], dearer ones from dear_begin[a]."""

    n: int
    default: float
    begin: np.ndarray
    cheap_end: np.ndarray
    dear_begin: np.ndarray
    end: np.ndarray
    other: np.ndarray
    cost: np.ndarray
    keys: np.ndarray
    """device * n + other of every listed pair, ascending (key_cost in the same order)."""
    key_cost: np.ndarray

    def between(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Hop cost from devices a to devices b (elementwise, a != b)."""
        key = a.astype(np.int64) * self.n + b
        if not self.keys.size:
            return np.full(key.shape, self.default)
        at = np.minimum(np.searchsorted(self.keys, key), self.keys.size - 1)
        return np.where(self.keys[at] == key, self.key_cost[at], self.default)

    def row(self, a: int) -> np.ndarray:
        """Hop cost from device a to every device (to itself: the default, never a hop)."""
        out = np.full(self.n, self.default)
        out[self.other[self.begin[a]:self.end[a]]] = self.cost[self.begin[a]:self.end[a]]
        return out


def _pair_costs(links: Links, n: int, nbytes: float) -> _PairCosts:
    """The costs of `links` among n devices, each from link_ms as _hop_costs has them: O(pairs log pairs)."""
    nb = max(nbytes, 1.0)
    pairs = sorted({(min(a, b), max(a, b)) for a, b, *_ in links.pairs if a != b and 0 <= min(a, b) and max(a, b) < n})
    cost = np.array([link_ms(nb, link_between(links, a, b)) for a, b in pairs], dtype=float)
    lo, hi = np.array(pairs, dtype=np.int64).reshape(-1, 2).T
    dev, other, cost = np.r_[lo, hi], np.r_[hi, lo], np.r_[cost, cost]
    by_device = np.lexsort((other, cost, dev))
    dev, other, cost = dev[by_device], other[by_device], cost[by_device]
    default = link_ms(nb, Link(links.bandwidth_bytes_per_s, links.latency_ms))
    devices = np.arange(n)
    begin, end = np.searchsorted(dev, devices), np.searchsorted(dev, devices, "right")
    keys = dev * n + other
    by_key = np.argsort(keys)
    return _PairCosts(n, default, begin, begin + np.bincount(dev[cost < default], minlength=n),
                      end - np.bincount(dev[cost > default], minlength=n), end, other, cost, keys[by_key], cost[by_key])


def _slack(n: int, total: Any) -> Any:
    """More than sum() of n non-negative hops can be off their exact sum `total` by, twice over (rounding
    of a float sum is at most n x 2^-53 x total): sums further apart than this compare the same exactly."""
    return 8 * n * 2.0 ** -53 * total


def _nearest_neighbour(hops: _PairCosts) -> np.ndarray:
    """Of the nearest-neighbour walks from every device, the one of least path_score (first start of a tie)."""
    paths, slowest, total = _walks(hops)
    least = slowest == slowest.min()
    bound = total[least].min()  # total sums in walk order, as sum() does on CPython 3.11: near it, sum() decides
    near = np.flatnonzero(least & (total <= bound + _slack(hops.n, bound)))
    return paths[min((_score(hops, paths[w]), w) for w in near)[1]]


def _score(hops: _PairCosts, path: np.ndarray) -> tuple[float, float]:
    """path_score of `path`, summed by sum() as it does."""
    listed = hops.between(path[:-1], path[1:]).tolist()
    return max(listed), sum(listed)


def _walks(hops: _PairCosts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The nearest-neighbour walk from every device at once, walk w from device w, each step to the
    unvisited device of least (hop cost, index): the walks (rows), their slowest hops and hop sums."""
    n = hops.n
    walks = np.arange(n)
    left = _Unvisited(n)
    left.visit(walks, walks)
    off = hops.keys[hops.key_cost != hops.default]  # device * n + other of pairs not at the default cost
    paths = np.empty((n, n), dtype=np.min_scalar_type(n))
    paths[:, 0] = walks
    slowest, total, at = np.zeros(n), np.zeros(n), walks
    for step in range(1, n):
        at, hop = _steps(hops, left, off, at)
        left.visit(walks, at)
        paths[:, step] = at
        np.maximum(slowest, hop, out=slowest)
        total += hop
    return paths, slowest, total


def _steps(hops: _PairCosts, left: _Unvisited, off: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each walk's next device and hop from device at[w]: the first unvisited of its pairs cheaper than
    the default, else the least unvisited device at the default cost, else the first unvisited of its
    dearer pairs."""
    n = hops.n
    nxt, hop = _first_listed(hops, left, np.arange(at.size), hops.begin[at], hops.cheap_end[at])
    rest = np.flatnonzero(nxt < 0)
    if rest.size:
        found = _least_at_default(left, off, rest, at[rest])
        nxt[rest], hop[rest] = np.where(found < n, found, -1), hops.default
        rest = rest[found == n]
    if rest.size:
        nxt[rest], hop[rest] = _first_listed(hops, left, rest, hops.dear_begin[at[rest]], hops.end[at[rest]])
    return nxt, hop


def _least_at_default(left: _Unvisited, off: np.ndarray, walks: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Per walk, the least unvisited device that device at[w] reaches at the default cost (n: none). It
    is the least unvisited one from 0 or from just past one of at[w]'s pairs not at the default (those
    listed in `off`), whichever is not such a pair itself: O(those pairs), with no scan."""
    n = left.n
    begin, end = np.searchsorted(off, at * n), np.searchsorted(off, at * n + n)
    count = 1 + end - begin
    owner = np.repeat(np.arange(walks.size), count)
    first = np.cumsum(count) - count
    rank = np.arange(owner.size) - first[owner]  # 0: from device 0; k: just past at[w]'s k-th pair off the default
    start = np.zeros(owner.size, dtype=np.int64)
    past = rank > 0
    start[past] = off[begin[owner[past]] + rank[past] - 1] % n + 1
    found = left.least_from(walks[owner], start)
    key = at[owner] * n + np.minimum(found, n - 1)
    listed = off[np.minimum(np.searchsorted(off, key), max(off.size - 1, 0))] == key if off.size else np.zeros(key.size, bool)
    return np.minimum.reduceat(np.where((found < n) & ~listed, found, n), first)


def _first_listed(hops: _PairCosts, left: _Unvisited, walks: np.ndarray, begin: np.ndarray,
                  end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per walk w, the first device of hops.other[begin[w]:end[w]] it has not visited (-1: none) and the
    cost, read 8 pairs at first and 4 times more each time after: about what the walks skip, not all."""
    found, cost = np.full(walks.size, -1), np.zeros(walks.size)
    todo, begin, width = np.flatnonzero(end > begin), begin.copy(), 8
    while todo.size:
        stop = np.minimum(begin[todo] + width, end[todo])
        found[todo], cost[todo] = _first_in(hops, left, walks[todo], begin[todo], stop)
        begin[todo] = stop
        todo = todo[(found[todo] < 0) & (stop < end[todo])]
        width *= 4
    return found, cost


def _first_in(hops: _PairCosts, left: _Unvisited, walks: np.ndarray, begin: np.ndarray,
              end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """_first_listed over one stretch of each walk's pairs, all read."""
    found, cost = np.full(walks.size, -1), np.zeros(walks.size)
    count = end - begin
    owner = np.repeat(np.arange(walks.size), count)
    at = np.arange(owner.size) - np.repeat(np.cumsum(count) - count - begin, count)
    free = np.flatnonzero(left.has(walks[owner], hops.other[at]))
    if free.size:
        first = free[np.r_[True, owner[free[1:]] != owner[free[:-1]]]]
        found[owner[first]], cost[owner[first]] = hops.other[at[first]], hops.cost[at[first]]
    return found, cost


_ONES = np.uint64(2**64 - 1)


class _Unvisited:
    """Per walk, its unvisited devices as bits (64 a word) and, per word, a summary bit saying the word
    has one: the least unvisited device from any position is a word and a summary look-up (plus one
    per further 64 summary bits: none below 4,096 devices)."""

    def __init__(self, n: int) -> None:
        self.n, words = n, n // 64 + 1  # a word more than n needs: a look-up may start at n
        self.bits = np.zeros((n, words), dtype=np.uint64)
        self.bits[:, :n // 64] = _ONES
        self.bits[:, n // 64] = (np.uint64(1) << np.uint64(n % 64)) - np.uint64(1)
        self.summary = np.zeros((n, words // 64 + 1), dtype=np.uint64)
        for k in np.flatnonzero(self.bits[0]):
            self.summary[:, k // 64] |= np.uint64(1) << np.uint64(k % 64)

    def has(self, walks: np.ndarray, devices: np.ndarray) -> np.ndarray:
        """Whether walk walks[k] has yet to visit devices[k]."""
        return ((self.bits[walks, devices // 64] >> (devices % 64).astype(np.uint64)) & np.uint64(1)) == 1

    def visit(self, walks: np.ndarray, devices: np.ndarray) -> None:
        word = devices // 64
        self.bits[walks, word] &= ~(np.uint64(1) << (devices % 64).astype(np.uint64))
        emptied = self.bits[walks, word] == 0
        w, word = walks[emptied], word[emptied]
        self.summary[w, word // 64] &= ~(np.uint64(1) << (word % 64).astype(np.uint64))

    def least_from(self, walks: np.ndarray, start: np.ndarray) -> np.ndarray:
        """Per k, the least device >= start[k] (<= n) walk walks[k] has yet to visit (n: none)."""
        out, word = np.full(walks.size, self.n), start // 64
        bits = self.bits[walks, word] & (_ONES << (start % 64).astype(np.uint64))
        hit = bits != 0
        out[hit] = word[hit] * 64 + _lowest_bit(bits[hit])
        todo, after = np.flatnonzero(~hit), word[~hit] + 1  # the next word with one, by the summary
        for part in range(self.summary.shape[1]):
            skip = np.clip(after - 64 * part, 0, 64).astype(np.uint64)
            marks = np.where(skip < 64, self.summary[walks[todo], part] & (_ONES << np.minimum(skip, np.uint64(63))), 0)
            hit = marks != 0
            found = 64 * part + _lowest_bit(marks[hit])
            out[todo[hit]] = found * 64 + _lowest_bit(self.bits[walks[todo[hit]], found])
            todo, after = todo[~hit], after[~hit]
        return out


def _lowest_bit(words: np.ndarray) -> np.ndarray:
    """The index of each non-zero word's lowest set bit (a power of two converts to a float exactly)."""
    return np.frexp((words & (~words + np.uint64(1))).astype(np.float64))[1].astype(np.int64) - 1


def _two_opt(hops: _PairCosts, path: np.ndarray, rounds: int = 20) -> tuple[int, ...]:
    """First-improvement 2-opt: for each i, each j > i in turn, reverse path[i..j] where that lowers
    path_score (then go on with j + 1 on the new path); `rounds` sweeps at most, fewer when one
    changes nothing."""
    tour, n = _Tour(hops, path), hops.n
    for _ in range(rounds):
        improved = False
        for i in range(n - 1):
            j = tour.first_better(i, i + 1)
            while j < n:
                tour.reverse(i, j)
                improved = True
                j = tour.first_better(i, j + 1)
        if not improved:
            break
    return tuple(tour.path.tolist())


class _Tour:
    """The path 2-opt works on, with what pricing a reversal of path[i..j] needs: its hop costs (hop k:
    path[k] to path[k + 1]), path_score, the slowest hop before and after each point, and (once asked)
    the palindromes among the hop costs and the sums of near-ties already taken."""

    def __init__(self, hops: _PairCosts, path: np.ndarray) -> None:
        self.hops, self.path = hops, np.asarray(path, dtype=np.int64).copy()
        self._rescore()

    def _rescore(self) -> None:
        self.costs = self.hops.between(self.path[:-1], self.path[1:])
        self.listed = self.costs.tolist()
        self.score = (max(self.listed), sum(self.listed))
        self.before = np.r_[-np.inf, np.maximum.accumulate(self.costs)]  # before[k]: slowest of hops 0..k-1
        self.after = np.r_[np.maximum.accumulate(self.costs[::-1])[::-1], -np.inf]  # after[k]: of hops k..
        self.mirrors: np.ndarray | None = None
        self.counted: int | None = None  # _mirror_keys has counted mismatches from here (None: not yet)

    def reverse(self, i: int, j: int) -> None:
        self.path[i:j + 1] = self.path[i:j + 1][::-1].copy()
        self._rescore()

    def first_better(self, i: int, j0: int) -> int:
        """The least j >= j0 whose reversal of path[i..j] lowers path_score (n: none)."""
        n, path, costs = self.hops.n, self.path, self.costs
        js = np.arange(j0, n)
        if not js.size:
            return n
        inner = np.maximum.accumulate(costs[i:])[js - 1 - i]  # the reversed hops i..j-1, slowest
        tail = js < n - 1  # a hop after the reversed part: path[i] to path[j + 1], for old hop j
        new_after = np.where(tail, self.hops.row(int(path[i]))[path[np.minimum(js + 1, n - 1)]], 0.0)
        old_after = np.where(tail, costs[np.minimum(js, n - 2)], 0.0)
        new_before = self.hops.row(int(path[i - 1]))[path[js]] if i else np.zeros(js.size)
        old_before = costs[i - 1] if i else 0.0
        slowest = np.maximum.reduce([inner, np.where(tail, new_after, -np.inf), self.after[np.minimum(js + 1, n - 1)],
                                     new_before if i else np.full(js.size, -np.inf), np.full(js.size, self.before[max(i - 1, 0)])])
        delta = (new_before + new_after) - (old_before + old_after)  # the exact sum's change, but for rounding
        most, total = self.score
        tol = _slack(n, total + np.abs(delta))
        same = slowest == most
        sure = (slowest < most) | (same & (delta < -tol))
        stop = int(np.argmax(sure)) if sure.any() else js.size
        unsure = np.flatnonzero((same & ~(delta < -tol) & ~(delta > tol))[:stop])
        if unsure.size:  # sums too close to call in floats: sum() decides
            kept = (new_before[unsure] == old_before) & (new_after[unsure] == old_after[unsure])
            j = self._first_lower_sum(i, js[unsure], new_before[unsure], new_after[unsure], kept)
            if j < n:
                return j
        return int(js[stop]) if stop < js.size else n

    def _first_lower_sum(self, i: int, js: np.ndarray, new_before: np.ndarray, new_after: np.ndarray,
                         kept: np.ndarray) -> int:
        """The first of js whose reversal's sum() is below the path's (n: none). Skipped: reversals
        that keep both end hops and mirror a palindrome (the same hops in the same order); summed once:
        those that keep both ends and share (i + j, _mirror_keys), which make the same hop sequence."""
        other = ~(kept & self._palindrome(i, js - 1))
        keys = self._mirror_keys(i, js)
        total, sums = self.score[1], self.sums
        for j, b, a, same_ends, key in zip(js[other].tolist(), new_before[other].tolist(), new_after[other].tolist(),
                                           kept[other].tolist(), keys[other].tolist()):
            summed = sums.get((i + j, key)) if same_ends else None
            if summed is None:
                summed = self._reversed_sum(i, j, b, a)
                if same_ends:
                    sums[(i + j, key)] = summed
            if summed < total:
                return j
        return self.hops.n

    def _mirror_keys(self, i: int, js: np.ndarray) -> np.ndarray:
        """Per j, the hops q (counted from the first i asked on this path) with hop q != hop i + j - 1 - q.
        Reversals with i + j equal and both end hops kept differ exactly where i < i' leaves such a q
        in i..i'-1: equal counts mean equal hop sequences."""
        n = self.hops.n
        if self.counted is None or i < self.counted:  # a new path, or a new sweep over it: count afresh
            self.mismatches, self.counted, self.sums = np.zeros(2 * n, dtype=np.int64), i, {}
        for q in range(self.counted, i):
            self.mismatches[2 * q + 2:n + q] += self.costs[q + 1:n - 1] != self.costs[q]
        self.counted = i
        return self.mismatches[i + js]

    def _reversed_sum(self, i: int, j: int, new_before: float, new_after: float) -> float:
        """sum() of the hop costs with path[i..j] reversed, in path order, as path_score sums them."""
        hops = self.listed.copy()
        hops[i:j] = hops[i:j][::-1]
        if i:
            hops[i - 1] = new_before
        if j < len(hops):
            hops[j] = new_after
        return sum(hops)

    def _palindrome(self, first: int, last: np.ndarray) -> np.ndarray:
        """Whether hop costs first..last[k] read the same backwards (Manacher's radii, computed once a path)."""
        if self.mirrors is None:
            self.mirrors = _mirror_radii(self.listed)
        return self.mirrors[first + last + 1] >= last - first + 1


def _mirror_radii(values: list[float]) -> np.ndarray:
    """Manacher: over values with a gap before, between and after them, out[k] is how far the
    palindrome centred at gapped position k reaches, so values[a..b] is one iff out[a + b + 1] >= b - a + 1."""
    gapped: list[Any] = [None] * (2 * len(values) + 1)
    gapped[1::2] = values
    radii, centre, right = [0] * len(gapped), 0, 0
    for k in range(len(gapped)):
        r = min(radii[2 * centre - k], right - k) if k < right else 0
        while k - r > 0 and k + r + 1 < len(gapped) and gapped[k - r - 1] == gapped[k + r + 1]:
            r += 1
        radii[k] = r
        if k + r > right:
            centre, right = k, k + r
    return np.array(radii)
