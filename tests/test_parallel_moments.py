"""The cluster search's pipeline DP prices a stage's memory at the simulator's own moments
(planner.schedules.memory.stage_memory_moments), derived cheaply from a schedule of two or three
rounds (planner.partition.parallel_eval.memory_moments). Before, it charged micro-batches in flight
alone, which missed what zero bubble and interleaved hold (their sends, their pending W): a 175B zb
plan the DP fitted in 115.6 GiB (limit 125 GiB) simulated at 133.3 GiB, and refusals named more
memory than plans need."""

import numpy as np

from planner.cost import moment_bytes
from planner.partition import parallel_search
from planner.partition.parallel_eval import inflight_peaks, memory_moments
from planner.partition.parallel_search import plan_parallel
from planner.schedules import SCHEDULE_NAMES, check_sizes, generate, get_schedule
from planner.schedules.memory import corner_moments, stack_moments, stage_inflight_peak, stage_memory_moments
from planner.units import parse_bytes


def test_the_short_schedules_moments_and_in_flight_peaks_are_the_whole_schedules():
    for name in SCHEDULE_NAMES:
        for v in get_schedule(name).chunk_counts:
            for p in range(1, 9):
                for m in range(1, 10 * p + 1):
                    try:
                        check_sizes(name, p, m, v)
                    except Exception:
                        continue
                    whole = generate(name, p, m, v)
                    assert memory_moments(name, p, m, v) == tuple(stage_memory_moments(whole)), (name, p, v, m)
                    assert inflight_peaks(name, p, m, v) == tuple(stage_inflight_peak(whole)), (name, p, v, m)


def test_the_dps_stage_bytes_are_the_simulated_peaks(monkeypatch):
    """One chunk per rank: the DP's bytes of each stage are its device's simulated peak, to the byte's
    rounding; interleaved (chunks charged each at their own worst moment) never below it."""
    seen = []
    simulate = parallel_search.simulate_task

    def judged(ctx, task, sol, mem, flops):
        got = simulate(ctx, task, sol, mem, flops)
        per_rank = [0.0] * task.cfg.pp
        for s, b in enumerate(sol.stage_bytes):
            per_rank[s % task.cfg.pp] += b
        seen.append((task.schedule, task.v, per_rank, [d.peak_memory_bytes for d in got.devices]))
        return got

    monkeypatch.setattr(parallel_search, "simulate_task", judged)
    # One search per schedule: which schedules reach the simulated top k depends on the cost model's
    # constants, and every schedule's bytes must be checked whichever wins.
    for schedule in ("zb", "interleaved", "1f1b"):
        plan_parallel(model="gpt:layers=24,hidden=2048,heads=16,seq=1024,vocab=32000", hardware="a100-80gb",
                      nodes=2, global_batch=64, memory_bytes=parse_bytes("20GiB"), top_k=4, schedules=[schedule],
                      check_hints=False)
    assert {name for name, *_ in seen} == {"zb", "interleaved", "1f1b"}, seen
    for name, v, dp_bytes, simulated in seen:
        for d, s in zip(dp_bytes, simulated):
            if v == 1:
                assert abs(d - s) <= 1e-6 * s, (name, dp_bytes, simulated)
            else:
                assert d >= s * (1 - 1e-9), (name, v, dp_bytes, simulated)


def _random_terms(rng, n):
    """moment_bytes' per-stage inputs for n stages, as the DP passes them (sent: three arrays)."""
    kept, trans, grads, wgrad, held = (rng.uniform(0, 1e9, n) for _ in range(5))
    sent = tuple(rng.uniform(0, 1e8, n) for _ in range(3))
    return kept, trans, grads, wgrad, sent, held


def test_a_stack_of_moments_is_priced_row_by_row_as_each_moment_alone():
    rng = np.random.default_rng(3)
    for name, p, m, v in (("zb", 4, 16, 1), ("interleaved", 4, 12, 2), ("gpipe", 3, 6, 1), ("1f1b", 4, 8, 1)):
        terms = _random_terms(rng, 50)
        for stage in memory_moments(name, p, m, v):
            rows = moment_bytes(stack_moments(stage), *terms)
            assert len(rows) == len(stage)
            for row, moment in zip(rows, stage):
                assert np.array_equal(row, moment_bytes(moment, *terms)), (name, moment)  # bit for bit


def test_the_corners_price_a_stage_at_the_peak_of_all_its_moments():
    rng = np.random.default_rng(5)
    for name, p, m, v in (("zb", 8, 64, 1), ("interleaved", 8, 64, 2), ("zb", 5, 40, 1), ("interleaved", 6, 18, 3)):
        terms = _random_terms(rng, 200)
        for stage in memory_moments(name, p, m, v):
            corners = corner_moments(stage)
            # at most 6: zero bubble's W-running moments (a later stage's W holds a workspace) are a
            # flag group of their own, three corners beside the I-running and idle ones
            assert len(corners) <= 6 < len(stage) or len(stage) <= 6, (name, len(stage), len(corners))
            whole = moment_bytes(stack_moments(stage), *terms).max(axis=0)
            assert np.allclose(moment_bytes(stack_moments(corners), *terms).max(axis=0), whole, rtol=1e-12, atol=0)
