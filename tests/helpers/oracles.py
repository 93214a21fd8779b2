"""Answers the partition tests check the solvers against: brute force, and the simulator."""

from __future__ import annotations

import itertools

import numpy as np

from planner.partition import PartitionSettings
from planner.partition.build import Layout, stage_costs
from planner.partition.dp import solve_dp
from planner.partition.problem import PartitionProblem, recompute_family, stage_bytes
from planner.partition.search import CandidateEvaluator, GridPoint
from planner.plan import Device, Links
from planner.schedules import SCHEDULE_NAMES, generate
from planner.simulate import simulate_costs


def brute_min_scale(p: PartitionProblem) -> float:
    """The least factor on every budget that lets some split fit, by trying every split (each
    stage at its least-memory recompute choice)."""
    best = np.inf
    for inner in itertools.combinations(range(1, p.n_layers), p.n_stages - 1):
        cuts = (0, *inner, p.n_layers)
        worst = 0.0
        for s in range(p.n_stages):
            least = min(stage_bytes(p, s, cuts[s], cuts[s + 1], r) for r in recompute_family(p, cuts[s], cuts[s + 1]))
            worst = max(worst, least / p.budget[s] if np.isfinite(p.budget[s]) else 0.0)
        best = min(best, worst)
    return best


def dp_plan_fits_the_simulator(rng: np.random.Generator, case: int, prof):
    """Draw a pipeline for `prof` (1 to 4 devices at random speeds, schedule and recompute mode by
    `case`, micro-batch count and memory limit at random), solve it with the DP and simulate the
    plan: it must fit, and with one stage per device each device's simulated peak is at most the
    DP's stage memory (equal under gpipe and 1f1b).

    Returns (problem, solution); None where the draw has no plan (more stages than layers, or no
    split fits the limit)."""
    n = int(rng.integers(1, min(prof.n_layers, 4) + 1))
    schedule = SCHEDULE_NAMES[case % 4]
    v = 2 if schedule == "interleaved" else 1
    m = n * int(rng.integers(1, 4))
    if n * v > prof.n_layers:
        return None
    limit = int(rng.uniform(0.05, 0.6) * 16 * prof.columns["param_bytes"][:, 0].sum() + 4e8)
    devices = tuple(Device(f"d{i}", limit, speed=float(rng.choice([1.0, 0.5]))) for i in range(n))
    layout = Layout(devices, tuple(range(n)), Links(bandwidth_bytes_per_s=1e9, latency_ms=0.02), v)
    settings = PartitionSettings(n_devices=n, memory_bytes=limit, global_batch=4 * m, recompute=("auto", "none", "all")[case % 3])
    problem = CandidateEvaluator(prof, settings, None).problem(GridPoint(schedule, m, 4, v), layout)
    sol = solve_dp(problem)
    if sol is None:
        return None
    sim = simulate_costs(generate(schedule, n, m, v), stage_costs(prof.at(4), layout, sol.cuts, sol.recompute, "adam"),
                         [layout.device_of(s) for s in range(layout.n_stages)], devices, layout.links, micro_batch_size=4)
    assert sim.fits, (case, sol, sim.peak_memory_bytes, limit)
    if v == 1:  # one stage per device: the DP's stage memory bounds the simulator's peak, which
        # differs from it only by the gradients that do not exist yet at the activations' peak
        stages = stage_costs(prof.at(4), layout, sol.cuts, sol.recompute, "adam")
        for s in range(n):
            assert sim.peak_memory_bytes[s] <= sol.stage_bytes[s] * (1 + 1e-12)
            if schedule in ("gpipe", "1f1b"):
                assert sim.peak_memory_bytes[s] >= sol.stage_bytes[s] - stages[s].param_bytes * (1 + 1e-9)
    return problem, sol
