"""planner.partition.memory_floor: the cheap proof that a point of the cluster search fits no cut.
It may only drop points the DP finds infeasible: at the DP's own least memory of a point (a hair
above), the floor never drops it; and a search gives the same result, refusals included, with the
floor as without it."""

import math
from dataclasses import replace

import numpy as np
import pytest

from planner.errors import InfeasibleError
from planner.partition import branch_bound, memory_floor, parallel_eval
from planner.partition.dp import min_memory_scale
from planner.partition.memory_floor import stage_snapshots
from planner.partition.parallel_eval import least_memory, memory_moments, solve_task
from planner.partition.parallel_search import plan_parallel
from planner.schedules.memory import Moment
from planner.units import parse_bytes

from helpers.problems import random_problem

GPT = "gpt:layers=24,hidden=2048,heads=16,seq=1024,vocab=32000"
SMALL = "gpt:layers=8,hidden=1024,heads=8,seq=512,vocab=8000"


def test_the_snapshots_are_states_of_each_stage_read_from_its_order():
    for p, m in ((4, 8), (4, 2), (3, 7)):
        first = [stage[0] for stage in stage_snapshots("1f1b", p, m, 1)]
        assert [x.in_flight for x in first] == [min(m, p - s) for s in range(p)]  # 1F1B's warm-up
        assert not any(x.gradients or x.pending_w or x.sent_grads for x in first)
        assert [stage[0].in_flight for stage in stage_snapshots("gpipe", p, m, 1)] == [m] * p
        assert all(len(stage) == 2 for stage in stage_snapshots("1f1b", p, m, 1))  # no state after the last action
    # zero bubble: the last forward holds the sends of the I that ended before it, the end all of them
    for stage, snaps in enumerate(stage_snapshots("zb", 4, 8, 1)):
        first, last_f, end = snaps
        assert first.running_i and first.in_flight == 4 - stage
        # in flight from F to W: the W ended by then are 8 - in_flight, and each of their I ended before
        assert last_f.sent_grads - last_f.pending_w == 8 - last_f.in_flight > 0 and last_f.gradients
        assert (end.in_flight, end.pending_w, end.sent_grads, end.gradients) == (0, 0, 8, True)
    # each snapshot is dominated by one of the stage's memory moments (what the DP prices)
    for name, p, m, v in (("zb", 4, 12, 1), ("interleaved", 4, 8, 2), ("1f1b", 3, 6, 1), ("gpipe", 3, 4, 1)):
        for snaps, moments in zip(stage_snapshots(name, p, m, v), memory_moments(name, p, m, v)):
            for x in snaps:
                assert any(y.in_flight >= x.in_flight and y.pending_w >= x.pending_w and y.sent_grads >= x.sent_grads
                           for y in moments), (name, x, moments)


def _points(monkeypatch, **search) -> list:
    """Every (ctx, task, gpus per node) a search solves, the cut bound's skips left out (more points)."""
    seen = []
    solve = branch_bound.solve_task

    def spy(ctx, task, mem, gpn, floor=False):
        seen.append((ctx, task, gpn))
        return solve(ctx, task, mem, gpn, floor)

    monkeypatch.setattr(branch_bound, "solve_task", spy)
    monkeypatch.setattr(branch_bound, "cut_estimate", lambda ctx, task: task.estimate_ms)
    try:
        plan_parallel(hardware="a100-80gb", check_hints=False, **search)
    except InfeasibleError:
        pass
    monkeypatch.undo()
    return seen


@pytest.mark.parametrize("search", [
    dict(model=GPT, nodes=2, global_batch=64, memory_bytes=parse_bytes("12GiB"), zero=0),
    dict(model=GPT, nodes=2, global_batch=64, memory_bytes=parse_bytes("12GiB"), zero=1),
    dict(model=SMALL, nodes=1, global_batch=32, memory_bytes=parse_bytes("1GiB"), zero=0),
], ids=["gpt24-zero0", "gpt24-zero1", "gpt8-1gib"])
def test_the_floor_never_drops_a_point_the_dp_fits(monkeypatch, search):
    points = _points(monkeypatch, **search)
    schedules = {task.schedule for _, task, _ in points}
    assert {"zb", "interleaved", "1f1b"} <= schedules, schedules
    dropped = 0
    for ctx, task, gpn in points:
        least = least_memory(ctx, task)
        if math.isfinite(least):  # a hair above it the DP fits a cut: the floor must let it through
            assert solve_task(ctx, task, least * (1 + 1e-9), gpn, floor=True) is not None, task
            dropped += solve_task(ctx, task, least * 0.9, gpn, floor=True) is None
    assert dropped, "the floor dropped no point 10% under its least memory"


@pytest.mark.parametrize("memory", ["12GiB", "1GiB"], ids=["fits", "refused"])
def test_a_search_is_the_same_with_the_floor_and_without(monkeypatch, memory):
    search = dict(model=GPT, hardware="a100-80gb", nodes=2, global_batch=64, memory_bytes=parse_bytes(memory), top_k=4)

    def run() -> str:
        try:
            return repr(plan_parallel(**search))
        except InfeasibleError as e:
            return "refused: " + e.one_line()

    with_floor = run()
    monkeypatch.setattr(parallel_eval, "fits_no_cut", lambda *a: False)
    without = run()
    assert with_floor == without
    assert with_floor.startswith("refused") == (memory == "1GiB"), with_floor[:200]


def test_on_random_problems_the_floor_drops_only_what_fits_no_cut():
    """The greedy pass over the floor against the exact memory-only DP, where the DP's moment is
    one: `inflight` micro-batches held with every gradient (moments None), a floor of the same count."""
    rng = np.random.default_rng(11)
    dropped = 0
    for _ in range(600):
        prob = random_problem(rng, ("none", "all")[int(rng.integers(2))], max_layers=9, max_stages=5)
        # the DP's one moment: every gradient, `inflight` micro-batches in flight, nothing else held
        counts = tuple((Moment(int(k), True, True),) for k in prob.inflight)
        if memory_floor.fits_no_cut(prob, counts):
            dropped += 1
            least = min_memory_scale(prob)
            assert least is None or least[0] > 1.0, (prob, least)
        if not np.isfinite(prob.budget).all():
            assert not memory_floor.fits_no_cut(prob, counts)  # no limit: nothing proven
    assert dropped > 50, dropped
    assert not memory_floor.fits_no_cut(replace(prob, recompute="auto", budget=np.full(prob.n_stages, 0.5)),
                                        counts)  # a per-layer recompute choice: the DP decides
