"""planner.partition.branch_bound: the cluster search's order and stops. The cut bound may only
skip points that could not have been judged: it is a lower bound of every point's DP-based
estimate, and a search with it is the search without it (but for the points it priced)."""

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from planner.errors import InfeasibleError
from planner.partition import branch_bound
from planner.partition.branch_bound import cut_estimate, least_bottleneck_ms
from planner.partition.parallel_search import plan_parallel
from planner.units import parse_bytes

GPT = "gpt:layers=24,hidden=2048,heads=16,seq=1024,vocab=32000"
# a head about as long as three blocks on one GPU: balanced stages are far from any cut
BIG_HEAD = "gpt:layers=12,hidden=1024,heads=8,seq=512,vocab=128000"


def _exact(times: np.ndarray, k: int) -> float:
    """The slowest stage of the best cut into k non-empty contiguous stages, by trying every cut."""
    best = math.inf
    for inner in itertools.combinations(range(1, len(times)), k - 1):
        cuts = (0,) + inner + (len(times),)
        best = min(best, max(float(times[a:b].sum()) for a, b in zip(cuts, cuts[1:])))
    return best


def test_least_bottleneck_is_the_best_cut_within_its_slack():
    rng = np.random.default_rng(5)
    for _ in range(300):
        times = rng.choice([0.1, 1.0, 3.7], size=int(rng.integers(1, 10))) * rng.uniform(0.5, 2.0, size=1)
        if rng.random() < 0.3:
            times = rng.uniform(0.0, 5.0, size=len(times))
        for k in range(1, len(times) + 1):
            exact, got = _exact(times, k), least_bottleneck_ms(times, k)
            assert exact * (1 - 1e-6) <= got <= exact, (times, k, got, exact)


def test_least_bottleneck_refuses_more_stages_than_layers():
    with pytest.raises(ValueError):
        least_bottleneck_ms([1.0, 2.0], 3)
    with pytest.raises(ValueError):
        least_bottleneck_ms([1.0], 0)


def _solved(monkeypatch, **search) -> list:
    """(ctx, task, what solve_task returned) for every point a search prices, none skipped by the cut bound."""
    seen = []
    solve = branch_bound.solve_task

    def spy(ctx, task, mem, gpn, floor=False):
        got = solve(ctx, task, mem, gpn, floor)
        seen.append((ctx, task, got))
        return got

    monkeypatch.setattr(branch_bound, "solve_task", spy)
    monkeypatch.setattr(branch_bound, "cut_estimate", lambda ctx, task: task.estimate_ms)
    plan_parallel(hardware="a100-80gb", check_hints=False, **search)
    monkeypatch.undo()
    return seen


@pytest.mark.parametrize("search", [
    dict(model=GPT, nodes=2, global_batch=64, memory_bytes=parse_bytes("12GiB")),
    dict(model=BIG_HEAD, nodes=1, global_batch=64, top_k=50),
    dict(model=BIG_HEAD, nodes=1, global_batch=64, top_k=50, vocab_parallel=True),
], ids=["gpt24", "big-head", "big-head-vocab-parallel"])
def test_the_cut_estimate_never_passes_the_dp_estimate(monkeypatch, search):
    seen = _solved(monkeypatch, **search)
    solutions = [(ctx, task, got[0]) for ctx, task, got in seen if isinstance(got, tuple)]
    assert len(solutions) > 10
    assert {task.recompute for _, task, _ in solutions} == {"none", "full"}
    assert any(task.v > 1 for _, task, _ in solutions)
    raised = 0
    for ctx, task, dp_estimate in solutions:
        bound = cut_estimate(ctx, task)
        # (the balanced estimate itself may pass the DP's by a rounding: P = 1 sums the same terms in another order)
        assert task.estimate_ms <= bound <= dp_estimate * (1 + 1e-9), (task, bound, dp_estimate)
        raised += bound > 1.05 * task.estimate_ms
    assert raised, "the cut bound never rose 5% above the balanced estimate"


@pytest.mark.parametrize("search", [
    dict(model=GPT, nodes=2, global_batch=64, memory_bytes=parse_bytes("12GiB")),
    dict(model=BIG_HEAD, nodes=2, global_batch=128),
    dict(model=GPT, nodes=2, global_batch=64, memory_bytes=parse_bytes("1GiB")),
], ids=["gpt24", "big-head", "refused"])
def test_a_search_is_the_same_with_the_cut_bound_and_without(monkeypatch, search):
    def run() -> tuple[str, int]:
        try:
            got = plan_parallel(hardware="a100-80gb", **search)
        except InfeasibleError as e:
            return "refused: " + e.one_line(), 0
        return repr(replace(got, solved=0)), got.solved

    with_bound, priced = run()
    monkeypatch.setattr(branch_bound, "cut_estimate", lambda ctx, task: task.estimate_ms)
    without, priced_without = run()
    assert with_bound == without
    assert priced <= priced_without
    if search.get("memory_bytes") != parse_bytes("1GiB"):
        assert not with_bound.startswith("refused")
