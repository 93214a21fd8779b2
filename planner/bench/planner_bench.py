"""`pplan bench planner`: seconds to solve the stage-cut problem, DP against ILP, over a grid.

Instances: `planner.partition.synthetic.imbalanced(L)` (layer times and sizes spread over two
orders of magnitude, seed 0) on S identical devices under the 1F1B schedule with M = 2S
micro-batches, recompute auto, and a memory limit of 1.2x the least memory any cut needs (so
the memory constraint and the recompute choice are active, as in real use). Both solvers get
the same PartitionProblem (planner.partition.build); the DP's two passes and the ILP's two
solves are timed from the problem to the solution.

The ILP runs only where it can finish: each cell has `ilp_time_limit` seconds per solve, and a
cell is skipped once a smaller instance (fewer layers at the same devices, or fewer devices at
the same layers) already hit the limit. The table says which.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import numpy as np

from planner.bench.table import Table
from planner.errors import PplanError
from planner.limits import MAX_BENCH_LIST, MAX_BENCH_PLANNER_CELL, check_time_limit
from planner.plan.records import MAX_PIPELINE_STAGES
from planner.profiling.profile import MAX_LAYERS

__all__ = ["bench_planner", "planner_problem", "check_counts", "check_grid"]

_MEMORY_SLACK = 1.2
_REF_BUDGET = 1e15  # any finite budget: min_memory_scale returns the least need / budget


def planner_problem(n_layers: int, n_devices: int, seed: int = 0):
    """The benchmark's PartitionProblem for L layers on S devices (see module docstring)."""
    from planner.partition.build import Layout, build_problem
    from planner.partition.dp import min_memory_scale
    from planner.partition.synthetic import imbalanced
    from planner.plan import Device, Links
    from planner.schedules import generate
    from planner.schedules.memory import stage_inflight_peak, stage_memory_moments

    costs = imbalanced(n_layers, seed=seed).at(1)
    devices = tuple(Device(f"dev{i}") for i in range(n_devices))
    layout = Layout(devices, tuple(range(n_devices)), Links())
    sched = generate("1f1b", n_devices, 2 * n_devices)
    p = build_problem(costs, layout, stage_inflight_peak(sched), optimizer="adam", recompute="auto",
                      moments=stage_memory_moments(sched))  # the memory moments pplan partition charges
    got = min_memory_scale(dataclasses.replace(p, budget=np.full(n_devices, _REF_BUDGET)))
    if got is None:
        raise PplanError(f"benchmark instance {n_layers} layers x {n_devices} devices has no cut")
    return dataclasses.replace(p, budget=np.full(n_devices, _REF_BUDGET * got[0] * _MEMORY_SLACK))


def check_counts(values: Sequence[int], what: str, most: int, example: str) -> list[int]:
    """`values` sorted and without repeats; PplanError unless 1 to MAX_BENCH_LIST integers in 1..`most`
    (each is a cell of the bench: a count beyond what pplan plans or a list without end would run
    for hours or exhaust memory before the first row)."""
    vals = list(values)
    if not vals or any(isinstance(v, bool) or not isinstance(v, int) for v in vals):
        raise PplanError(f"{what} {vals[:8]} must be positive integers", f"e.g. {example}")
    if len(vals) > MAX_BENCH_LIST:
        raise PplanError(f"{what} lists {len(vals):,} values, more than {MAX_BENCH_LIST}", f"bench fewer, e.g. {example}")
    bad = next((v for v in vals if not 1 <= v <= most), None)
    if bad is not None:
        raise PplanError(f"{what} {bad} is outside 1..{most:,}", f"pplan plans at most {most:,} {what.lstrip('-')}; e.g. {example}")
    return sorted(set(vals))


def check_grid(layers: Sequence[int], devices: Sequence[int]) -> tuple[list[int], list[int]]:
    """The grid's layer and device counts, checked as `check_counts` does; PplanError, before
    anything runs, when no cell runs (each needs devices <= layers: a stage holds at least one
    layer) or a cell that runs is beyond MAX_BENCH_PLANNER_CELL (layers^2 x devices: what its DP
    tables hold), naming the largest."""
    # a profile holds at most MAX_LAYERS layers, a pipeline at most MAX_PIPELINE_STAGES devices
    Ls = check_counts(layers, "--layers", MAX_LAYERS, "50,200,1000")
    Ss = check_counts(devices, "--devices", MAX_PIPELINE_STAGES, "4,16,64")
    cells = [(L, S) for L in Ls for S in Ss if S <= L]
    if not cells:
        raise PplanError(f"--layers {_listed(Ls)} and --devices {_listed(Ss)} make no cell to bench: "
                         "each cell needs devices <= layers (a stage holds at least one layer)",
                         f"give a device count of at most {Ls[-1]:,}, e.g. --layers 50,200,1000 --devices 4,16,64")
    L, S = max(cells, key=lambda c: c[0] * c[0] * c[1])
    if L * L * S > MAX_BENCH_PLANNER_CELL:
        raise PplanError(f"--layers {L} x --devices {S} is {L * L * S:,} layers^2 x devices, beyond the bench's bound of "
                         f"{MAX_BENCH_PLANNER_CELL:,} (its tables would take gigabytes)",
                         f"with {L} layers use at most {MAX_BENCH_PLANNER_CELL // (L * L):,} devices, e.g. --layers 1000 --devices 64")
    return Ls, Ss


def _listed(values: list[int], most: int = 8) -> str:
    """'4,16,64', or the first `most` values and '...' (a list may hold MAX_BENCH_LIST values)."""
    return ",".join(str(v) for v in values[:most]) + (",..." if len(values) > most else "")


def bench_planner(layers: Sequence[int] = (50, 200, 1000), devices: Sequence[int] = (4, 16, 64),
                  ilp_time_limit: float = 20.0, progress: Callable[[str], None] | None = None) -> Table:
    """Time the DP and (where practical) the ILP on every layers x devices cell."""
    from planner.partition.dp import solve_dp
    from planner.partition.ilp import solve_ilp

    Ls, Ss = check_grid(layers, devices)
    check_time_limit(ilp_time_limit, "--ilp-time-limit")  # inf would let CBC run unlimited
    say = progress or (lambda _m: None)
    rows = []
    failed: set[tuple[int, int]] = set()  # cells where the ILP hit its limit
    unrunnable = [(L, S) for L in Ls for S in Ss if S > L]  # more stages than layers: no cut exists
    for L in Ls:
        for S in Ss:
            if (L, S) in unrunnable:
                continue
            say(f"planner: {L} layers x {S} devices")
            p = planner_problem(L, S)
            t0 = time.perf_counter()
            dp = solve_dp(p)
            dp_s = time.perf_counter() - t0
            if dp is None:
                raise PplanError(f"DP found no plan for {L} layers x {S} devices (benchmark instance is wrong)")
            smaller = any((l2, s2) in failed for l2 in Ls for s2 in Ss if l2 <= L and s2 <= S)
            ilp_s, status, same = None, "skipped: a smaller instance hit the limit", None
            if not smaller:
                say(f"planner: {L} layers x {S} devices, ILP (limit {ilp_time_limit:g} s per solve)")
                t0 = time.perf_counter()
                ilp = solve_ilp(p, time_limit=ilp_time_limit)
                ilp_s = time.perf_counter() - t0
                if ilp is not None and ilp.optimal:
                    status = "optimal"
                    same = abs(ilp.bottleneck_ms - dp.bottleneck_ms) <= 1e-6 * max(1.0, dp.bottleneck_ms)
                else:
                    status = "time limit" + ("" if ilp is None else " (feasible, not proven)")
                    failed.add((L, S))
            rows.append((L, S, dp_s, dp.bottleneck_ms, ilp_s, status, same,
                         (ilp_s / dp_s) if ilp_s is not None and status == "optimal" and dp_s > 0 else None))
    practical = [(L, S) for L, S, *_rest in rows if _rest[3] == "optimal"]
    largest = max(practical, key=lambda c: c[0] * c[1]) if practical else None
    stops = sorted(failed, key=lambda c: c[0] * c[1])
    notes = (
        "Instances: imbalanced synthetic layers (seed 0), 1F1B with M = 2 x devices, recompute auto, "
        f"memory limit {_MEMORY_SLACK}x the least any cut needs; same problem for both solvers.",
        f"ILP: PuLP, {ilp_time_limit:g} s limit per solve (two solves: bottleneck, then total); "
        "'same optimum' compares its bottleneck with the DP's.",
        _ilp_note(largest, stops, bool(unrunnable)),
    ) + ((_unrunnable_note(unrunnable),) if unrunnable else ())
    return Table(
        name="planner",
        title="Planner: seconds to solve one stage-cut problem, DP vs ILP",
        columns=("layers", "devices", "dp_s", "bottleneck_ms", "ilp_s", "ilp_status", "same_optimum", "ilp_over_dp"),
        rows=tuple(rows),
        notes=notes,
        summary={"ilp_practical_up_to": None if largest is None else f"{largest[0]}x{largest[1]}",
                 "ilp_first_limit": None if not stops else f"{stops[0][0]}x{stops[0][1]}",
                 "dp_max_s": max(r[2] for r in rows) if rows else None},
    )


def _ilp_note(largest: tuple[int, int] | None, stops: list[tuple[int, int]], some_not_run: bool) -> str:
    """Where the ILP stopped being practical; `largest` is None when no cell finished."""
    if not stops:
        return "ILP finished every cell in the table." if some_not_run else "ILP finished every cell."
    first = ", ".join(f"{L}x{S}" for L, S in stops[:3])
    if largest is None:
        return f"ILP finished no cell; it hit the limit at {first}."
    return f"ILP practical up to {largest[0]} layers x {largest[1]} devices; it first hit the limit at {first}."


def _unrunnable_note(cells: list[tuple[int, int]]) -> str:
    """Which cells of the grid are not in the table: more devices than layers."""
    shown = ", ".join(f"{L}x{S}" for L, S in cells[:8]) + (", ..." if len(cells) > 8 else "")
    return (f"Not run: {len(cells)} layers x devices cell{'s' if len(cells) != 1 else ''} with more devices "
            f"than layers (a stage holds at least one layer): {shown}.")
