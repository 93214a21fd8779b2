"""The pure solvers: DP, ILP and brute force reach the same optimum; invariants of solutions."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.partition.baselines import balanced_cuts, uniform_cuts
from planner.partition.brute import solve_brute
from planner.partition.dp import min_memory_scale, solve_dp
from planner.partition.ilp import solve_ilp
from planner.partition.problem import PartitionProblem, evaluate, fits, recompute_family, stage_bytes

from helpers.oracles import brute_min_scale
from helpers.problems import MODES, objective, random_problem


def test_dp_matches_brute_force_on_hundreds_of_instances():
    rng = np.random.default_rng(1234)
    feasible = 0
    for case in range(600):
        p = random_problem(rng, MODES[case % 3])
        dp, brute = solve_dp(p), solve_brute(p)
        assert objective(dp) == objective(brute), (case, p)
        feasible += dp is not None
    assert 200 < feasible < 600  # both feasible and infeasible instances were exercised


def test_ilp_matches_dp_and_brute_force():
    rng = np.random.default_rng(99)
    for case in range(90):
        p = random_problem(rng, MODES[case % 3], max_layers=6, max_stages=3)
        dp, ilp, brute = solve_dp(p), solve_ilp(p, time_limit=120), solve_brute(p)  # ms each; 120 s guards a hang
        assert objective(ilp) == objective(dp) == objective(brute), (case, p)
        if ilp is not None:
            assert ilp.optimal and fits(p, ilp)


def test_dp_recompute_choice_is_the_cheapest_fitting_one():
    # 3 layers on one stage with 4 micro-batches in flight: only recompute makes it fit.
    p = PartitionProblem(
        compute_ms=np.array([3.0, 3.0, 3.0]), recompute_ms=np.array([1.0, 1.0, 1.0]),
        static_bytes=np.zeros(3), activation_bytes=np.array([10.0, 10.0, 10.0]), input_bytes=np.array([1.0, 1.0, 1.0]),
        boundary_bytes=np.zeros(4), inflight=np.array([4.0]), budget=np.array([4 * (1 + 10 + 10) + 10 + 0.5]),
        speed=np.ones(1), overhead_ms=np.zeros(1), link_latency_ms=np.zeros(0), link_ms_per_byte=np.zeros(0),
    )
    sol = solve_dp(p)
    assert sol.recompute == ((0,),) and sol.bottleneck_ms == 10.0
    none = solve_dp(PartitionProblem(**{**p.__dict__, "recompute": "none"}))
    assert none is None
    everything = solve_dp(PartitionProblem(**{**p.__dict__, "recompute": "all"}))
    assert everything.recompute == ((0, 1, 2),) and everything.bottleneck_ms == 12.0


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), mode=st.sampled_from(MODES))
def test_dp_solutions_are_contiguous_and_within_budget(seed, mode):
    p = random_problem(np.random.default_rng(seed), mode, max_layers=12, max_stages=5)
    sol = solve_dp(p)
    if sol is None:
        return
    L, S = p.n_layers, p.n_stages
    assert sol.cuts[0] == 0 and sol.cuts[-1] == L and len(sol.cuts) == S + 1
    assert all(a < b for a, b in zip(sol.cuts, sol.cuts[1:]))  # non-empty, contiguous: each layer in one stage
    for s in range(S):
        assert set(sol.recompute[s]) <= set(range(sol.cuts[s], sol.cuts[s + 1]))
        assert sol.recompute[s] in recompute_family(p, sol.cuts[s], sol.cuts[s + 1])
        assert stage_bytes(p, s, sol.cuts[s], sol.cuts[s + 1], sol.recompute[s]) <= p.budget[s]
    again = evaluate(p, sol.cuts, sol.recompute, "check")
    assert again.bottleneck_ms == pytest.approx(sol.bottleneck_ms) and again.total_ms == pytest.approx(sol.total_ms)


def test_min_memory_scale_matches_brute_force_and_is_sufficient():
    rng = np.random.default_rng(7)
    for case in range(200):
        p = random_problem(rng, MODES[case % 3])
        scale, _ = min_memory_scale(p)
        assert scale == pytest.approx(brute_min_scale(p), rel=1e-12, abs=1e-12)
        if np.all(np.isfinite(p.budget)):
            grown = PartitionProblem(**{**p.__dict__, "budget": p.budget * scale * (1 + 1e-12)})
            assert solve_dp(grown) is not None
            assert scale <= 1.0 or solve_dp(p) is None


def test_more_stages_than_layers_has_no_solution():
    p = random_problem(np.random.default_rng(0), "auto", max_layers=3)
    p = PartitionProblem(**{**p.__dict__, "inflight": np.ones(p.n_layers + 1), "budget": np.full(p.n_layers + 1, np.inf),
                            "speed": np.ones(p.n_layers + 1), "overhead_ms": np.zeros(p.n_layers + 1),
                            "link_latency_ms": np.zeros(p.n_layers), "link_ms_per_byte": np.zeros(p.n_layers)})
    assert solve_dp(p) is None and solve_brute(p) is None and min_memory_scale(p) is None


def test_baseline_cuts():
    assert uniform_cuts(10, 3) == (0, 4, 7, 10)
    assert balanced_cuts(np.ones(8), 4) == (0, 2, 4, 6, 8)
    # a heavy first and last layer get stages of their own
    assert balanced_cuts(np.array([10.0, 1, 1, 1, 1, 1, 1, 1, 1, 10]), 4) == (0, 1, 5, 9, 10)
    w = np.random.default_rng(3).uniform(0, 1, 30)
    cuts = balanced_cuts(w, 5)
    best = min(max(w[a:b].sum() for a, b in zip((0, *c, 30), (*c, 30))) for c in itertools.combinations(range(1, 30), 4))
    assert max(w[a:b].sum() for a, b in zip(cuts, cuts[1:])) == pytest.approx(best)
