"""Small random partition problems with exact answers, and the objective solvers are compared on."""

from __future__ import annotations

import numpy as np

from planner.partition.problem import PartitionProblem

MODES = ("auto", "none", "all")


def random_problem(rng: np.random.Generator, mode: str, max_layers: int = 7, max_stages: int = 4) -> PartitionProblem:
    """Small instances on a dyadic grid (exact float sums) with half-integer budgets (no ties at the limit)."""
    L = int(rng.integers(1, max_layers + 1))
    S = int(rng.integers(1, min(L, max_stages) + 1))

    def ints(lo, hi, n):
        return rng.integers(lo, hi, n).astype(float)

    static, act = ints(0, 30, L), ints(0, 40, L)
    inflight = ints(1, 5, S)
    total = static.sum() + act.sum() * inflight.max()
    budget = rng.integers(int(total / (S + 1)) // 2 + 1, int(total) + 2, S).astype(float) + 0.5
    if rng.random() < 0.15:
        budget[:] = np.inf
    return PartitionProblem(
        compute_ms=ints(1, 40, L) / 4,
        recompute_ms=ints(0, 20, L) / 4,
        static_bytes=static,
        activation_bytes=act,
        input_bytes=ints(0, 20, L),
        boundary_bytes=np.concatenate([[0.0], ints(0, 10, L - 1), [0.0]]),
        inflight=inflight,
        budget=budget,
        speed=rng.choice([1.0, 0.5, 2.0], S),
        overhead_ms=rng.choice([0.0, 0.25], S),
        link_latency_ms=rng.choice([0.0, 0.125, 1.0], S - 1),
        link_ms_per_byte=rng.choice([0.0, 0.125, 0.5], S - 1),
        recompute=mode,
    )


def objective(sol):
    """(bottleneck, total) of a solution, rounded for comparison; None for no solution."""
    return None if sol is None else (round(sol.bottleneck_ms, 9), round(sol.total_ms, 9))


def column_problem(layers: int, **columns) -> PartitionProblem:
    """A 2-stage problem of `layers` unit-time layers with nothing to hold but the given columns
    (workspace_bytes=..., w_carry_bytes=...): for checking one memory table against its scalar rule."""
    zeros = np.zeros(layers)
    return PartitionProblem(compute_ms=np.ones(layers), recompute_ms=zeros, static_bytes=zeros,
                            activation_bytes=zeros, input_bytes=zeros, boundary_bytes=np.zeros(layers + 1),
                            inflight=np.ones(2), budget=np.full(2, np.inf), speed=np.ones(2),
                            overhead_ms=np.zeros(2), link_latency_ms=np.zeros(1), link_ms_per_byte=np.zeros(1),
                            recompute="none", **columns)
