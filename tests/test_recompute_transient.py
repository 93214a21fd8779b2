"""The recompute transient is one layer's: max over the stage's layers of workspace + (activation if
recomputed), not the largest recomputed activation plus the largest workspace of another layer
(planner.cost.transient). Held against a reference written out here, for the cost model and every
solver, on instances where one layer has a large workspace and another a large activation."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from planner.cost import layer_arrays, stage_cost
from planner.partition.brute import solve_brute
from planner.partition.dp import min_memory_scale, solve_dp
from planner.partition.ilp import solve_ilp
from planner.partition.problem import TIME_TOL, PartitionProblem, fits, recompute_family, stage_bytes, stage_time
from planner.partition.recompute import stage_recompute
from planner.profiling.profile import make_profile
from planner.schedules.memory import Moment

from helpers.oracles import brute_min_scale
from helpers.problems import MODES, objective, random_problem


def _reference_transient(p: PartitionProblem, i: int, j: int, rec) -> float:
    """The definition, layer by layer: a layer's workspace, and what its recompute brings back."""
    back = p.activation_bytes if p.rematerialized_bytes is None else p.rematerialized_bytes
    best = 0.0
    for layer in range(i, j):
        best = max(best, float(p.workspace_bytes[layer]) + (float(back[layer]) if layer in rec else 0.0))
    return best


def _reference_bytes(p: PartitionProblem, s: int, i: int, j: int, rec) -> float:
    """Memory of a stage of a one-moment problem without an optimizer step (random_problem's):
    fixed + k kept + transient, the transient alone written out here (the rest does not involve a
    workspace, so it is the problem's without one, less that problem's transient)."""
    assert p.moments is None and p.optimizer_workspace_bytes is None
    bare = stage_bytes(replace(p, workspace_bytes=None, rematerialized_bytes=None), s, i, j, rec)
    return bare - max((float(p.activation_bytes[x]) for x in rec), default=0.0) + _reference_transient(p, i, j, rec)


def _reference_objective(p: PartitionProblem):
    """(bottleneck, total) of the best plan by exhaustive search over _reference_bytes (None: none fits)."""
    plans = []
    for inner in itertools.combinations(range(1, p.n_layers), p.n_stages - 1):
        cuts = (0, *inner, p.n_layers)
        times = []
        for s in range(p.n_stages):
            i, j = cuts[s], cuts[s + 1]
            fitting = [stage_time(p, s, i, j, r) for r in recompute_family(p, i, j) if _reference_bytes(p, s, i, j, r) <= p.budget[s]]
            if not fitting:
                break
            times.append(min(fitting))  # given the cuts, each stage's fastest set is best for the max and the sum
        else:
            plans.append((max(times), sum(times)))
    if not plans:
        return None
    z = min(t for t, _ in plans)
    return round(z, 9), round(min(total for t, total in plans if t <= z + TIME_TOL * max(1.0, z)), 9)


def _with_workspace(p: PartitionProblem, rng: np.random.Generator, moments: bool) -> PartitionProblem:
    """`p` with a workspace column whose largest entry sits on a layer other than the largest
    activation's, budgets raised to match, and (with `moments`) several memory moments per position."""
    L, S = p.n_layers, p.n_stages
    work = rng.integers(0, 12, L).astype(float)
    big_act = int(np.argmax(p.activation_bytes))
    work[(big_act + 1 + int(rng.integers(0, max(L - 1, 1)))) % L if L > 1 else 0] = float(rng.integers(30, 90))
    fields = {"workspace_bytes": work, "budget": p.budget + rng.integers(0, 90, S)}
    if rng.random() < 0.5:  # a checkpoint keeps part of the activations all along (the loss's tensors)
        fields["rematerialized_bytes"] = p.activation_bytes - np.floor(p.activation_bytes * rng.choice([0.0, 0.5, 0.9], L))
    if moments:
        k = p.inflight
        fields["moments"] = tuple(
            (Moment(float(k[s]), True, False), Moment(float(max(k[s] - 1, 1)), True, True), Moment(float(k[s]) + 1, False, True))
            for s in range(S))
        fields["gradient_bytes"] = np.floor(p.static_bytes / 4)
    return replace(p, **fields)


def _instances(seed: int, count: int, **kw):
    rng = np.random.default_rng(seed)
    for case in range(count):
        p = random_problem(rng, MODES[case % 3], **kw)
        yield case, _with_workspace(p, rng, moments=case % 2 == 1)


def test_cost_model_charges_one_layers_workspace_and_activation():
    # layer 0: an embedding (large workspace, tiny activations); layer 1: a block (the opposite)
    cols = {"fwd_ms": np.array([[1.0], [2.0]]), "bwd_ms": np.array([[2.0], [4.0]]), "param_bytes": np.array([[8e6], [3e6]]),
            "activation_bytes": np.array([[1e4], [1.6e7]]), "output_bytes": np.array([[1e6], [1e6]]),
            "optimizer_ms": np.zeros((2, 1)), "workspace_bytes": np.array([[8.5e6], [5.2e6]])}
    costs = make_profile(["embed", "block"], [1], cols, {"input_bytes_per_sample": "4096"}).at(1)
    assert stage_cost(costs, 0, 2, (0, 1)).transient_bytes == 1.6e7 + 5.2e6  # not 1.6e7 + 8.5e6
    assert stage_cost(costs, 0, 2, (0,)).transient_bytes == 8.5e6 + 1e4  # the block's workspace alone is less
    assert stage_cost(costs, 0, 2, ()).transient_bytes == 8.5e6


def test_the_loss_tensors_a_checkpoint_keeps_do_not_come_back():
    # the last layer (head + loss) saves 34 units, 32 of them the loss's, which the checkpoint keeps
    # outside (checkpoint_extra_bytes): its recompute brings back 2, on top of its workspace 64
    cols = {"fwd_ms": np.array([[1.0], [2.0]]), "bwd_ms": np.array([[2.0], [4.0]]), "param_bytes": np.array([[3e6], [8e6]]),
            "activation_bytes": np.array([[16e6], [34e6]]), "output_bytes": np.array([[1e6], [32e6]]),
            "optimizer_ms": np.zeros((2, 1)), "workspace_bytes": np.array([[5e6], [64e6]]),
            "checkpoint_extra_bytes": np.array([[5056.0], [32e6 + 5056.0]])}
    costs = make_profile(["block", "head"], [1], cols, {"input_bytes_per_sample": "4096"}).at(1)
    assert stage_cost(costs, 1, 2, (1,)).transient_bytes == 64e6 + 34e6 - 32e6 - 5056
    assert stage_cost(costs, 0, 2, (0,)).transient_bytes == 64e6  # the block's 5e6 + 16e6 is less
    arrays = layer_arrays(costs, "adam")
    assert list(arrays.rematerialized_bytes) == [16e6 - 5056, 2e6 - 5056]
    # and without the column, the activations as they are (the older model)
    plain = make_profile(["block", "head"], [1], {k: v for k, v in cols.items() if k != "checkpoint_extra_bytes"},
                         {"input_bytes_per_sample": "4096"}).at(1)
    assert layer_arrays(plain, "adam").rematerialized_bytes is None
    assert stage_cost(plain, 1, 2, (1,)).transient_bytes == 64e6 + 34e6


def test_problem_memory_is_the_reference_for_every_recompute_set():
    # one moment (the older bound) and no optimizer step: memory = fixed + k kept + transient, so the
    # difference a workspace column makes is the transient's alone
    for case, p in _instances(5, 150, max_layers=6):
        if p.moments is not None:
            continue
        for i, j in itertools.combinations(range(p.n_layers + 1), 2):
            for rec in recompute_family(replace(p, recompute="auto"), i, j) + [tuple(range(i, j))]:
                assert stage_bytes(p, 0, i, j, rec) == _reference_bytes(p, 0, i, j, rec), (case, i, j, rec)


def test_a_stage_fits_once_the_two_maxima_are_not_added():
    # two layers on one stage, 2 micro-batches in flight: without recompute 2 x 22 + 20 = 64;
    # recomputing both keeps 2 x 2 and brings back one layer's activation + workspace, 22: 26 <= 30.5
    # (adding the largest activation to the largest workspace would charge 4 + 40 = 44)
    p = PartitionProblem(
        compute_ms=np.array([1.0, 2.0]), recompute_ms=np.array([0.5, 1.0]), static_bytes=np.zeros(2),
        activation_bytes=np.array([2.0, 20.0]), input_bytes=np.array([1.0, 1.0]), boundary_bytes=np.zeros(3),
        inflight=np.array([2.0]), budget=np.array([30.5]), speed=np.ones(1), overhead_ms=np.zeros(1),
        link_latency_ms=np.zeros(0), link_ms_per_byte=np.zeros(0), workspace_bytes=np.array([20.0, 2.0]),
    )
    for mode in ("auto", "all"):
        q = replace(p, recompute=mode)
        dp, brute = solve_dp(q), solve_brute(q)
        assert dp is not None and dp.recompute == ((0, 1),) and dp.stage_bytes == (26.0,)
        assert objective(dp) == objective(brute)
    # outside the DP's prefix family: the block alone, 2 x 3 + 22 = 28, and faster
    assert stage_recompute(p, 0, 0, 2) == ((1,), True) and stage_bytes(p, 0, 0, 2, (1,)) == 28.0
    assert min_memory_scale(replace(p, budget=np.array([1.0])))[0] == 26.0


def test_dp_matches_brute_force_with_workspaces():
    feasible = 0
    for case, p in _instances(11, 400):
        dp, brute = solve_dp(p), solve_brute(p)
        assert objective(dp) == objective(brute), (case, p)
        if p.moments is None:
            assert objective(dp) == _reference_objective(p), (case, p)
        if dp is not None:
            feasible += 1
            assert fits(p, dp)
            for s in range(p.n_stages):
                i, j, rec = dp.cuts[s], dp.cuts[s + 1], dp.recompute[s]
                want = stage_bytes(p, s, i, j, rec) if p.moments is not None else _reference_bytes(p, s, i, j, rec)
                assert dp.stage_bytes[s] == want, (case, s)
    assert 100 < feasible < 400  # both feasible and infeasible instances


def test_min_memory_scale_matches_brute_force_with_workspaces():
    for case, p in _instances(23, 200, max_layers=6):
        p = replace(p, budget=np.full(p.n_stages, 1000.0))
        got, want = min_memory_scale(p), brute_min_scale(p)
        assert (got is None) == (want is None), case
        if got is not None:
            assert got[0] == pytest.approx(want, rel=1e-12), (case, p)
            if p.moments is None:  # the found cut's least memory, by the reference
                cuts = got[1]
                least = max(min(_reference_bytes(p, s, cuts[s], cuts[s + 1], r) for r in recompute_family(p, cuts[s], cuts[s + 1]))
                            for s in range(p.n_stages))
                assert got[0] * 1000.0 == pytest.approx(least, rel=1e-12), (case, p)


def test_ilp_matches_dp_and_brute_force_with_workspaces():
    pytest.importorskip("pulp")
    for case, p in _instances(31, 45, max_layers=6, max_stages=3):
        dp, ilp, brute = solve_dp(p), solve_ilp(p, time_limit=120), solve_brute(p)
        assert objective(ilp) == objective(dp) == objective(brute), (case, p)
        if p.moments is None:
            assert objective(ilp) == _reference_objective(p), (case, p)


def test_refined_recompute_sets_fit_by_the_reference():
    # planner.partition.recompute screens candidate sets with the transient too: where a set of the
    # family fits, it finds one, no slower than the family's cheapest, that fits
    checked = 0
    for case, p in _instances(47, 300, max_layers=7):
        if p.recompute != "auto" or p.moments is not None:
            continue
        for s in range(p.n_stages):
            for i, j in itertools.combinations(range(p.n_layers + 1), 2):
                budget = float(p.budget[s])
                family = [r for r in recompute_family(p, i, j) if _reference_bytes(p, s, i, j, r) <= budget]
                rec, ok = stage_recompute(p, s, i, j)
                assert ok or not family, (case, s, i, j)  # the greedy may find a set outside the family too
                if ok:
                    checked += 1
                    assert _reference_bytes(p, s, i, j, rec) <= budget
                if family:
                    assert sum(p.recompute_ms[x] for x in rec) <= sum(p.recompute_ms[x] for x in family[0])
    assert checked > 100
