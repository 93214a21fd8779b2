"""The differential check of a memory term: DP, ILP and brute force reach the same optimum on random
small problems that carry it, and the term changes the optimum of some of them."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from planner.partition.brute import solve_brute
from planner.partition.dp import solve_dp
from planner.partition.ilp import solve_ilp
from planner.partition.problem import PartitionProblem, fits, stage_bytes

from helpers.problems import MODES, objective, random_problem

__all__ = ["solvers_agree"]

Draw = Callable[[np.random.Generator, PartitionProblem], PartitionProblem]


def solvers_agree(rng: np.random.Generator, cases: int, draw: Draw, ilp_cases: int,
                  without: Callable[[PartitionProblem], PartitionProblem],
                  stage_bytes_rel: float | None = None) -> tuple[int, int]:
    """(problems that fit, problems whose optimum the term changed) over `cases` random problems,
    each `draw(rng, random_problem(...))`: asserts DP equals brute force on every one, and the ILP
    on the first `ilp_cases` small ones (6 layers, 3 stages at most); a DP plan fits, and with
    `stage_bytes_rel` its stage bytes are the problem's own formula's. `without(p)`: the problem
    without the term, to count whether it changed the optimum."""
    feasible = differs = 0
    for case in range(cases):
        p = draw(rng, random_problem(rng, MODES[case % 3]))
        dp, brute = solve_dp(p), solve_brute(p)
        assert objective(dp) == objective(brute), (case, p)
        if case < ilp_cases and p.n_layers <= 6 and p.n_stages <= 3:
            assert objective(solve_ilp(p, time_limit=120)) == objective(dp), (case, p)
        feasible += dp is not None
        if dp is not None:
            assert fits(p, dp)
            if stage_bytes_rel is not None:
                assert dp.stage_bytes == pytest.approx([stage_bytes(p, s, dp.cuts[s], dp.cuts[s + 1], dp.recompute[s])
                                                        for s in range(p.n_stages)], rel=stage_bytes_rel)
        differs += objective(dp) != objective(solve_dp(without(p)))
    return feasible, differs
