"""The layer workspace and the held stage output in the memory model: every solver charges them alike."""

from dataclasses import replace

import numpy as np

from planner.cost import workspace_max
from planner.partition.brute import solve_brute
from planner.partition.dp import solve_dp
from planner.partition.ilp import solve_ilp
from planner.partition.problem import stage_bytes

from helpers.problems import MODES, objective, random_problem


def _with_workspace(rng: np.random.Generator, p):
    w = rng.integers(0, 4, p.n_layers) * float(np.max(p.activation_bytes)) / 2
    w[rng.random(p.n_layers) < 0.4] = 0.0  # some layers need none
    held = rng.integers(0, 3, p.n_layers) * float(np.max(p.activation_bytes)) / 4
    step = rng.integers(0, 3, p.n_layers) * float(np.max(p.static_bytes))
    step[rng.random(p.n_layers) < 0.5] = 0.0
    return replace(p, workspace_bytes=w, held_output_bytes=held, optimizer_workspace_bytes=step)


def test_stage_memory_rises_by_the_largest_workspace_of_its_layers():
    p = random_problem(np.random.default_rng(5), "none")
    w = np.arange(p.n_layers, dtype=float) * 1000.0
    q = replace(p, workspace_bytes=w)
    for i in range(p.n_layers):
        for j in range(i + 1, p.n_layers + 1):
            assert stage_bytes(q, 0, i, j, ()) - stage_bytes(p, 0, i, j, ()) == w[j - 1]
    assert workspace_max(None, 0, 3) == 0.0 and workspace_max(w, 2, 2) == 0.0


def test_a_stage_holds_its_own_output_once_per_microbatch_in_flight():
    p = random_problem(np.random.default_rng(6), "none")
    held = np.arange(1, p.n_layers + 1, dtype=float) * 100.0
    q = replace(p, held_output_bytes=held)
    for s in range(p.n_stages):
        for i in range(p.n_layers):
            for j in range(i + 1, p.n_layers + 1):
                assert stage_bytes(q, s, i, j, ()) - stage_bytes(p, s, i, j, ()) == p.inflight[s] * held[j - 1]


def test_the_optimizer_step_counts_instead_of_the_activations_when_larger():
    p = random_problem(np.random.default_rng(7), "none")
    big = np.full(p.n_layers, 1e15)
    q = replace(p, optimizer_workspace_bytes=big)
    for i in range(p.n_layers):
        assert stage_bytes(q, 0, i, i + 1, ()) == stage_bytes(replace(p, activation_bytes=p.activation_bytes * 0,
                                                                       input_bytes=p.input_bytes * 0), 0, i, i + 1, ()) + 1e15
    small = replace(p, optimizer_workspace_bytes=np.zeros(p.n_layers) + 1.0)
    assert stage_bytes(small, 0, 0, 1, ()) == stage_bytes(p, 0, 0, 1, ())
    assert solve_dp(q) is None or not np.isfinite(q.budget).all()


def test_dp_matches_brute_force_with_workspace_and_held_outputs():
    rng = np.random.default_rng(77)
    feasible, tighter = 0, 0
    for case in range(300):
        base = random_problem(rng, MODES[case % 3])
        p = _with_workspace(rng, base)
        dp, brute = solve_dp(p), solve_brute(p)
        assert objective(dp) == objective(brute), (case, p)
        feasible += dp is not None
        tighter += (dp is None) != (solve_dp(base) is None)
    assert feasible > 50 and tighter > 0  # the workspace changed some answers


def test_ilp_matches_dp_with_workspace_and_held_outputs():
    rng = np.random.default_rng(78)
    for case in range(45):
        p = _with_workspace(rng, random_problem(rng, MODES[case % 3], max_layers=6, max_stages=3))
        dp, ilp, brute = solve_dp(p), solve_ilp(p, time_limit=120), solve_brute(p)
        assert objective(ilp) == objective(dp) == objective(brute), (case, p)
