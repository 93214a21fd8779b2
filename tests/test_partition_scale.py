"""Partitioning at many stages: each stage looks only at the cuts it can take.

Stage s of S can only end between layer s+1 and L-(S-1-s) (every later stage needs a layer), so
the balanced baselines and the DP work over that window; with S = L there is one choice per stage.
These tests hold the windows to exhaustive search, and check that the work really is windowed.
"""

import itertools
import tracemalloc

import numpy as np
import pytest

from planner.errors import PplanError
from planner.partition import dp, problem
from planner.partition import block_starts
from planner.partition.baselines import balanced_cuts
from planner.partition.brute import solve_brute
from planner.schedules import compiled, generate
from planner.schedules.compiled import compile_schedule

from helpers.problems import MODES, objective, random_problem


def _exhaustive_balanced(w: np.ndarray, S: int) -> tuple[int, ...]:
    """Least largest block, then least sum of squares, ties to the earliest cuts from the last one."""
    L = len(w)
    pre = np.concatenate([[0.0], np.cumsum(w)])
    parts = [(0, *inner, L) for inner in itertools.combinations(range(1, L), S - 1)]
    blocks = {c: [pre[c[k + 1]] - pre[c[k]] for k in range(S)] for c in parts}
    z = min(max(b) for b in blocks.values())
    z = z * (1 + 1e-12) + 1e-300

    def squares(c):
        total = 0.0
        for b in blocks[c]:
            total = total + b * b
        return total

    ok = [c for c in parts if max(blocks[c]) <= z]
    least = min(squares(c) for c in ok)
    return min((c for c in ok if squares(c) == least), key=lambda c: c[::-1])


def _weights(rng: np.random.Generator, L: int, kind: int) -> np.ndarray:
    if kind == 0:
        return rng.random(L)
    if kind == 1:  # small integers: many ties
        return rng.integers(0, 4, L).astype(float)
    if kind == 2:  # zero-parameter layers between heavy ones, one of them much heavier
        w = rng.random(L) * (rng.random(L) < 0.5)
        w[rng.integers(0, L)] = 1e6
        return w
    return np.ones(L)


def test_balanced_cuts_equal_exhaustive_search_including_one_layer_per_stage():
    rng = np.random.default_rng(7)
    for case in range(400):
        L = int(rng.integers(1, 10))
        S = L if case % 5 == 0 else int(rng.integers(1, L + 1))
        w = _weights(rng, L, case % 4)
        assert balanced_cuts(w, S) == _exhaustive_balanced(w, S), (case, w, S)


def test_balanced_cuts_refuse_negative_or_infinite_weights():
    for bad in (-1.0, np.inf, np.nan):
        with pytest.raises(PplanError, match="layer 1 has weight"):
            balanced_cuts(np.array([1.0, bad, 2.0]), 2)


def test_balanced_cuts_at_as_many_stages_as_layers_never_builds_a_layers_squared_table():
    L = 3000  # a whole (L+1)^2 table of floats is 72 MB
    tracemalloc.start()
    try:
        cuts = balanced_cuts(np.full(L, 4096.0), L)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert cuts == tuple(range(L + 1))
    assert peak < 16 * 2**20, peak


@pytest.fixture
def table_shapes(monkeypatch) -> list[tuple[int, ...]]:
    """The shape of every stage table StageTables builds during the test, in order."""
    shapes = []
    stage = dp.StageTables.stage

    def spy(self, *args, **kwargs):
        got = stage(self, *args, **kwargs)
        shapes.append(got[0].shape)
        return got

    monkeypatch.setattr(dp.StageTables, "stage", spy)
    return shapes


@pytest.mark.parametrize("windowed", [True, False])
def test_dp_equals_brute_force_with_and_without_per_stage_windows(monkeypatch, table_shapes, windowed):
    monkeypatch.setattr(problem, "RELAX_COLUMNS", 2)  # several column blocks even on small instances
    rng = np.random.default_rng(2026 + windowed)
    for case in range(300):
        p = random_problem(rng, MODES[case % 3], max_layers=8, max_stages=8)
        table_shapes.clear()
        assert objective(dp.solve_dp(p, windowed=windowed)) == objective(solve_brute(p)), (case, p)
        width, whole = p.n_layers - p.n_stages + 1, p.n_layers + 1
        if windowed:  # each position's window of starts and ends, never a whole table
            assert all(max(shape) <= width for shape in table_shapes), (case, table_shapes)
        else:
            assert set(table_shapes) <= {(whole, whole)}, (case, table_shapes)


def test_relax_window_reads_only_each_column_blocks_rows():
    """A block of RELAX_COLUMNS ends starts at its first end's first row: an entry above it (inf
    in a real table) is read only when the block reaches back to a column whose rows include it."""
    prev = np.zeros(4)
    t = np.full((4, 4), 5.0)
    t[0, 2] = 1.0  # above rows[2]: outside the band of ends 2 and 3
    rows = np.array([0, 0, 2, 2])
    with pytest.MonkeyPatch.context() as m:
        m.setattr(problem, "RELAX_COLUMNS", 2)
        blocks = problem.relax_window(prev, t, rows)[0]
        m.setattr(problem, "RELAX_COLUMNS", 4)
        one_block = problem.relax_window(prev, t, rows)[0]
    assert blocks[2] == 5.0 and one_block[2] == 1.0


def test_dp_with_one_layer_per_stage_builds_one_entry_per_stage(table_shapes):
    rng = np.random.default_rng(5)
    square = 0
    for case in range(300):
        p = random_problem(rng, MODES[case % 3], max_layers=5, max_stages=5)
        if p.n_stages != p.n_layers:
            continue
        square += 1
        table_shapes.clear()
        sol = dp.solve_dp(p)
        assert objective(sol) == objective(solve_brute(p)), (case, p)
        if sol is not None:
            assert sol.cuts == tuple(range(p.n_layers + 1))
        assert table_shapes and set(table_shapes) == {(1, 1)}, table_shapes
    assert square >= 20


def test_sweep_wakes_a_waiting_rank_only_when_its_input_is_ready():
    """GPipe's backward runs from the last rank down: a pass over all ranks per step would visit
    ranks x ranks times; waking only the waiting rank visits each rank a few times."""
    R, M = 64, 4
    cs = compile_schedule(generate("gpipe", R, M))
    keys = cs.n_keys
    res = compiled.sweep(cs, [1.0] * keys, [0.0] * keys, [-1] * keys, 0)
    assert max(res.end) == 2 * (M + R - 1)  # (M + S - 1)(f + b) with f = b = 1
    assert sum(res.rank_visits) <= R * (M + 1), res.rank_visits




def _one_stage_step(rng: np.random.Generator) -> tuple:
    """A random step of the most-even DP as balanced_cuts sets it up: integer weights (zeros and
    one heavy layer among them), the previous stage's costs with unreachable ends at either side,
    and each end's window of starts under a random largest block."""
    L, s = int(rng.integers(20, 300)), int(rng.integers(1, 4))
    w = rng.integers(0, 50, L).astype(float) * (rng.random(L) < 0.8)
    w[rng.integers(0, L)] = float(rng.integers(1000, 100000))
    pre = np.concatenate([[0.0], np.cumsum(w)])
    width = L - s  # the previous stage's ends s .. L - 1, this one's s + 1 .. L
    g = rng.integers(0, 10**6, width).astype(float)
    g[:int(rng.integers(0, width // 4 + 1))] = np.inf
    g[width - int(rng.integers(0, width // 4 + 1)):] = np.inf
    z = max(w.max(), pre[-1] * rng.choice([0.05, 0.3, 1.0]))  # balanced_cuts's z is never under one layer
    js = np.arange(s + 1, s + 1 + width)
    lo = np.array([int(np.argmax(pre[j] - pre[:j + 1] <= z)) for j in js])
    starts = np.maximum(lo, s)
    counts = np.maximum(np.minimum(js - 1, s + width - 1) - starts + 1, 0)
    return pre, g, s, js, starts, counts


def test_monotone_start_search_equals_pricing_every_pair():
    """Integer weights and costs keep every sum exact, so ties are real ties: both searches must give
    every end the same least cost and the same first start."""
    rng = np.random.default_rng(11)
    searched = 0
    for case in range(300):
        step = _one_stage_step(rng)
        fast = block_starts.monotone_starts(*step)
        if fast is None:
            continue
        searched += 1
        slow = block_starts.every_pair_starts(*step)
        reached = np.isfinite(slow[0])
        assert np.array_equal(fast[0], slow[0]), case
        assert np.array_equal(fast[1][reached], slow[1][reached]), case
    assert searched >= 250  # the premise holds on these steps: a search that gives up is a fault


def test_balanced_cuts_with_long_windows_reach_the_optimum():
    """One heavy layer lets every block fit, so windows average far more than MONOTONE_FROM starts;
    the cuts' largest block and sum of squares must be those of pricing every pair."""
    rng = np.random.default_rng(12)
    for case in range(12):
        L, S = int(rng.integers(300, 600)), int(rng.integers(2, 6))
        w = _weights(rng, L, 2 if case % 2 else 0)
        w[rng.integers(0, L)] = 1e6
        pre = np.concatenate([[0.0], np.cumsum(w)])

        def score(cuts):
            blocks = np.diff(pre[list(cuts)])
            return blocks.max(), float(np.sum(blocks * blocks))

        fast = score(balanced_cuts(w, S))
        with pytest.MonkeyPatch.context() as m:
            m.setattr(block_starts, "MONOTONE_FROM", 10**9)
            slow = score(balanced_cuts(w, S))
        assert fast[0] == slow[0] and fast[1] == pytest.approx(slow[1], rel=1e-12), case
