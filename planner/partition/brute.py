"""Brute-force enumeration of the stage-cut problem: the reference the DP and ILP are tested against.

Enumerates every composition of the layers into S non-empty contiguous stages and every
recompute set of the problem's family per stage, evaluating each from the definitions in
planner.partition.problem (no prefix sums, no vector tricks). Exponential: small instances only.
"""

from __future__ import annotations

import itertools

from planner.errors import PplanError
from planner.partition.problem import (
    TIME_TOL, PartitionProblem, Solution, evaluate, recompute_family, stage_bytes, stage_time,
)

__all__ = ["solve_brute", "MAX_BRUTE_CONFIGS"]

MAX_BRUTE_CONFIGS = 2_000_000


def solve_brute(p: PartitionProblem) -> Solution | None:
    """The optimal solution by exhaustive search, or None when nothing fits."""
    L, S = p.n_layers, p.n_stages
    if S < 1 or S > L:
        return None
    best_per_stage: dict[tuple[int, int, int], list[tuple[float, tuple[int, ...]]]] = {}

    def options(s: int, i: int, j: int) -> list[tuple[float, tuple[int, ...]]]:
        key = (s, i, j)
        if key not in best_per_stage:
            best_per_stage[key] = [
                (stage_time(p, s, i, j, r), r) for r in recompute_family(p, i, j)
                if stage_bytes(p, s, i, j, r) <= float(p.budget[s])
            ]
        return best_per_stage[key]

    configs: list[tuple[float, float, tuple[int, ...], tuple[tuple[int, ...], ...]]] = []
    count = 0
    for inner in itertools.combinations(range(1, L), S - 1):
        cuts = (0, *inner, L)
        per_stage = [options(s, cuts[s], cuts[s + 1]) for s in range(S)]
        for choice in itertools.product(*per_stage):
            count += 1
            if count > MAX_BRUTE_CONFIGS:
                raise PplanError(f"brute force: more than {MAX_BRUTE_CONFIGS} configurations", "use a smaller instance")
            times = [t for t, _ in choice]
            configs.append((max(times), sum(times), cuts, tuple(r for _, r in choice)))
    if not configs:
        return None
    z = min(c[0] for c in configs)
    limit = z + TIME_TOL * max(1.0, abs(z))
    best = min((c for c in configs if c[0] <= limit), key=lambda c: (c[1], c[2], c[3]))
    return evaluate(p, best[2], best[3], "brute")
