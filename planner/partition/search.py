"""The outer search of `pplan partition`: schedules x micro-batch counts x device orders x methods.

For every schedule that can run and every micro-batch count M dividing the global batch
(b = batch / M samples each, costs from Profile.at(b)), the schedule's own in-flight counts
set each stage position's activation memory; the DP (or ILP, or a baseline) picks cuts and
recompute sets; recompute sets are refined for the fixed cuts; and the simulator, the one
source of truth for time and memory, gives the iteration time and per-device peaks. The plan
is the fastest candidate that fits every device's memory in the simulator.

With --method auto the pool holds the DP's candidates and the baselines' (the simulator can
prefer a cut the DP's objective ranks lower); otherwise only the named method's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from planner.calibration import Calibration
from planner.cluster import Cluster, pipeline_orders
from planner.cost import optimizer_factor, stage_cost
from planner.errors import PplanError, ScheduleError
from planner.limits import DEFAULT_ILP_TIME_LIMIT
from planner.partition.baselines import BASELINES, baseline_cuts
from planner.partition.build import Layout, build_problem, stage_plans
from planner.partition.dp import solve_dp
from planner.partition.problem import RECOMPUTE_MODES, PartitionProblem, stage_bytes, stage_time
from planner.partition.recompute import stage_recompute
from planner.plan import DEFAULT_BANDWIDTH, DEFAULT_LATENCY_MS, Device, Links, StagePlan
from planner.profiling.profile import LayerCosts, Profile
from planner.schedules import SCHEDULE_NAMES, check_sizes, generate, get_schedule
from planner.schedules.memory import stage_inflight_peak, stage_memory_moments
from planner.simulate import SimResult, check_action_count, simulate_costs
from planner.units import format_bytes

__all__ = ["METHODS", "PartitionSettings", "GridPoint", "Candidate", "Search", "run_search", "grid_points", "layouts_for",
           "CandidateEvaluator", "device_orders", "polish_steps"]

METHODS = ("auto", "dp", "ilp") + BASELINES
MAX_AUTO_MICROBATCHES = 1024  # auto searches M up to this (a forced --microbatches may go beyond)
POLISH_TOP = 3  # candidates the simulator-driven polish starts from
POLISH_ROUNDS = 4  # passes over all cuts (each move is one simulation)


@dataclass(frozen=True)
class PartitionSettings:
    """What `pplan partition` was asked (validated by planner.partition.api)."""

    n_devices: int | None
    """Devices in the pipeline (None: every device of the cluster)."""
    memory_bytes: int | None
    """Memory limit per device (None = unlimited; cluster devices may carry their own)."""
    global_batch: int
    """Samples per iteration."""
    microbatches: int | None = None
    """Forced micro-batch count (None = search every divisor of the batch)."""
    schedule: str = "auto"
    """A schedule name or auto (all)."""
    recompute: str = "auto"
    """auto (per-layer choice), none or all."""
    optimizer: str = "adam"
    """Optimizer whose state counts in memory."""
    bandwidth: float = DEFAULT_BANDWIDTH
    """Default link bandwidth, bytes/s."""
    latency_ms: float = DEFAULT_LATENCY_MS
    """Default link latency, ms."""
    cluster: Cluster | None = None
    """Heterogeneous devices and links (None = n_devices identical devices)."""
    method: str = "auto"
    """auto, dp, ilp, uniform, params or time."""
    time_limit: float = DEFAULT_ILP_TIME_LIMIT
    """Seconds the ILP may spend over the whole search."""


@dataclass(frozen=True)
class GridPoint:
    """One (schedule, micro-batch count) of the search."""

    schedule: str
    """Schedule name."""
    n_microbatches: int
    """M."""
    micro_batch_size: int
    """b = global batch / M."""
    virtual_stages: int
    """Stages per device."""


@dataclass(frozen=True)
class Candidate:
    """One evaluated plan: a method's cuts at one grid point and device order."""

    method: str
    """dp, ilp, uniform, params or time; "<that>+polish" after the simulator-driven polish."""
    point: GridPoint
    """Schedule and micro-batching."""
    layout: Layout
    """Devices, their pipeline order and links."""
    stages: tuple[StagePlan, ...] | None
    """Stages (None when the method found no cut that fits)."""
    sim: SimResult | None
    """Simulator's verdict (None when not simulated)."""
    stage_ms: tuple[float, ...] = ()
    """Per-stage time of one micro-batch incl. recompute and sends (the DP's objective terms)."""
    stage_bytes: tuple[float, ...] = ()
    """Per-stage memory by the cost model with the schedule's in-flight count."""
    optimal: bool = True
    """False when the solver stopped early (ILP time limit); a polished candidate keeps its origin's flag."""
    note: str = ""
    """Why it is missing or does not fit."""
    polished: int = 0
    """Cut moves the simulator-driven polish made (0: the method's own cuts)."""

    @property
    def fits(self) -> bool:
        return self.sim is not None and self.sim.fits

    @property
    def origin(self) -> str:
        """The method whose cuts this started from (method without "+polish")."""
        return self.method.split("+")[0]

    @property
    def iteration_ms(self) -> float:
        return self.sim.iteration_ms if self.sim is not None else float("inf")

    @property
    def bottleneck_ms(self) -> float:
        return max(self.stage_ms) if self.stage_ms else float("inf")

    @property
    def peak_over_limit(self) -> float:
        """Largest peak / limit ratio over devices (inf when not simulated)."""
        if self.sim is None:
            return float("inf")
        return max((pk / lim if lim else 0.0) for pk, lim in zip(self.sim.peak_memory_bytes, self.sim.memory_limit_bytes))


def rank_key(c: Candidate) -> tuple:
    """Fits first, then fastest; ties by method, schedule and M (deterministic)."""
    methods = ("dp", "ilp") + BASELINES
    return (not c.fits, round(c.iteration_ms, 9), methods.index(c.origin), c.polished > 0, SCHEDULE_NAMES.index(c.point.schedule),
            c.point.n_microbatches, c.layout.order)


@dataclass(frozen=True)
class Search:
    """Everything the search evaluated."""

    candidates: tuple[Candidate, ...]
    """Best candidate per (method, grid point) over device orders, plus polished ones (best first)."""
    pool: tuple[str, ...]
    """Methods the plan may come from."""
    skipped: tuple[str, ...]
    """Grid points that could not run, with the reason."""
    calibration: Calibration | None
    """Calibration applied (None when the profile has none)."""

    def best(self, methods: tuple[str, ...] | None = None) -> Candidate | None:
        pool = [c for c in self.candidates if c.origin in (methods or self.pool)]
        return min(pool, key=rank_key) if pool else None


def divisors(n: int) -> list[int]:
    """Divisors of n, ascending (trial division up to sqrt(n))."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def grid_points(settings: PartitionSettings, n_devices: int, n_layers: int) -> tuple[list[GridPoint], list[str]]:
    """Runnable (schedule, M) points and the reasons others were skipped."""
    names = SCHEDULE_NAMES if settings.schedule == "auto" else (settings.schedule,)
    ms = [settings.microbatches] if settings.microbatches else [m for m in divisors(settings.global_batch) if m <= MAX_AUTO_MICROBATCHES]
    points, skipped = [], []
    for name in names:
        v = get_schedule(name).virtual_stages
        if n_devices * v > n_layers:
            skipped.append(f"{name}: needs {n_devices * v} stages but the model has {n_layers} layers")
            continue
        for m in ms:
            try:
                check_sizes(name, n_devices, m, v)
                check_action_count(name, n_devices * v, m)  # every candidate is simulated: bounded before it is built
            except ScheduleError as e:
                skipped.append(f"{name} M={m}: {e.message}")
                continue
            points.append(GridPoint(name, m, settings.global_batch // m, v))
    return points, skipped


def layouts_for(devices: tuple[Device, ...], links: Links, orders: list[tuple[int, ...]], v: int) -> list[Layout]:
    return [Layout(devices=devices, order=o, links=links, virtual_stages=v) for o in orders]


class CandidateEvaluator:
    """Shared state of one search: profile costs per micro-batch size, schedules, calibration."""

    def __init__(self, profile: Profile, settings: PartitionSettings, calibration: Calibration | None):
        self.profile, self.settings, self.calibration = profile, settings, calibration
        self._costs: dict[int, LayerCosts] = {}
        self._cuts: dict[tuple[str, int, bytes], tuple[int, ...]] = {}

    def baseline(self, method: str, n_stages: int, b: int) -> tuple[int, ...]:
        """A baseline's cuts (cached: parameter-balanced cuts do not depend on b)."""
        costs = self.costs(b)
        weights = np.asarray(costs.param_bytes if method == "params" else costs.fwd_ms + costs.bwd_ms, dtype=float)
        key = (method, n_stages, weights.tobytes())
        if key not in self._cuts:
            self._cuts[key] = baseline_cuts(method, n_stages, np.asarray(costs.param_bytes, dtype=float),
                                            np.asarray(costs.fwd_ms, dtype=float) + np.asarray(costs.bwd_ms, dtype=float))
        return self._cuts[key]

    def costs(self, b: int) -> LayerCosts:
        if b not in self._costs:
            self._costs[b] = self.profile.at(b)
        return self._costs[b]

    def problem(self, point: GridPoint, layout: Layout) -> PartitionProblem:
        sched = generate(point.schedule, layout.n_ranks, point.n_microbatches, point.virtual_stages)
        return build_problem(self.costs(point.micro_batch_size), layout, stage_inflight_peak(sched),
                             moments=stage_memory_moments(sched),
                             optimizer=self.settings.optimizer, recompute=self.settings.recompute,
                             calibration=self.calibration, split_backward=sched.split_backward,
                             n_microbatches=point.n_microbatches)

    def candidate(self, method: str, point: GridPoint, layout: Layout, problem: PartitionProblem,
                  cuts: tuple[int, ...] | None, rec: tuple[tuple[int, ...], ...] | None,
                  optimal: bool = True, note: str = "", memo: dict | None = None) -> Candidate:
        """Recompute sets for `cuts` (refined from `rec`), then the simulator's verdict.

        `memo` caches per-stage work for one problem: candidates of one grid point (and the
        polish's trial moves) share most of their stages.
        """
        if cuts is None:
            return Candidate(method, point, layout, None, None, optimal=optimal, note=note or "no stage cut fits the memory limits")
        memo = {} if memo is None else memo
        costs = self.costs(point.micro_batch_size)
        per_stage = []
        for s in range(len(cuts) - 1):
            i, j = cuts[s], cuts[s + 1]
            start = None if rec is None else rec[s]
            key = (s, i, j, start)
            got = memo.get(key)
            if got is None:
                r, _ = stage_recompute(problem, s, i, j, start)
                got = memo[key] = (r, stage_time(problem, s, i, j, r), stage_bytes(problem, s, i, j, r),
                                   stage_cost(costs, i, j, r, self.settings.optimizer, layout.devices[layout.device_of(s)].speed,
                                              point.n_microbatches))
            per_stage.append(got)
        sets = tuple(x[0] for x in per_stage)
        sched = generate(point.schedule, layout.n_ranks, point.n_microbatches, point.virtual_stages)
        sim = simulate_costs(
            sched, [x[3] for x in per_stage],
            [layout.device_of(s) for s in range(layout.n_stages)], layout.devices, layout.links,
            micro_batch_size=point.micro_batch_size,
            calibration=self.calibration, interpolated=costs.interpolated,
        )
        if not sim.fits:
            worst = int(np.argmax([pk / lim if lim else 0.0 for pk, lim in zip(sim.peak_memory_bytes, sim.memory_limit_bytes)]))
            note = note or (f"device {layout.devices[worst].name} needs {format_bytes(sim.peak_memory_bytes[worst])}"
                            f" > limit {format_bytes(sim.memory_limit_bytes[worst] or 0)}")
        return Candidate(method, point, layout, stage_plans(layout, cuts, sets), sim,
                         tuple(x[1] for x in per_stage), tuple(x[2] for x in per_stage), optimal=optimal, note=note)


def _typical_bytes(profile: Profile, settings: PartitionSettings) -> float:
    """Median boundary message for ordering devices by link speed (a weight, not a cost)."""
    costs = profile.at(max(1, settings.global_batch // max(1, settings.n_devices or 1)))
    out = np.asarray(costs.output_bytes[:-1], dtype=float)
    return float(np.median(out)) if out.size else 1.0


def device_orders(profile: Profile, settings: PartitionSettings, devices: tuple[Device, ...], links: Links) -> list[tuple[int, ...]]:
    """Device orders the search tries: the given order, or (on a cluster) orders along fast links."""
    if settings.cluster is None:
        return [tuple(range(len(devices)))]
    return pipeline_orders(devices, links, _typical_bytes(profile, settings))


def run_search(profile: Profile, settings: PartitionSettings, devices: tuple[Device, ...], links: Links,
               calibration: Calibration | None, on_step: Callable[[str], None] | None = None) -> Search:
    """Evaluate every method at every grid point and device order; on_step(note) as each grid point
    and each polish slot begins (len(grid points) + polish_steps(settings) calls)."""
    optimizer_factor(settings.optimizer)
    if settings.recompute not in RECOMPUTE_MODES:
        raise PplanError(f"unknown recompute mode {settings.recompute!r}", f"use one of {', '.join(RECOMPUTE_MODES)}")
    n = len(devices)
    L = profile.n_layers
    points, skipped = grid_points(settings, n, L)
    orders = device_orders(profile, settings, devices, links)
    solver = "ilp" if settings.method == "ilp" else "dp"
    pool = ("dp",) + BASELINES if settings.method == "auto" else (settings.method,)
    ev = CandidateEvaluator(profile, settings, calibration)
    deadline = time.monotonic() + settings.time_limit
    best: dict[tuple[str, GridPoint], Candidate] = {}

    def keep(c: Candidate) -> None:
        key = (c.method, c.point)
        if key not in best or rank_key(c) < rank_key(best[key]):
            best[key] = c

    for point in points:
        if on_step:
            on_step(f"{point.schedule} M={point.n_microbatches}")
        for layout in layouts_for(devices, links, orders, point.virtual_stages):
            problem = ev.problem(point, layout)
            memo: dict = {}
            for method in (solver,) + BASELINES:
                keep(_solve(ev, method, point, layout, problem, deadline, memo))
            if solver == "ilp":
                keep(_solve(ev, "dp", point, layout, problem, deadline, memo))
    # Polish: the DP optimises a per-micro-batch proxy; the simulator is the real objective.
    # Hill-climb the best few candidates of the pool by moving single cuts one layer.
    # A named baseline method (--method uniform ...) keeps its own cuts untouched.
    top = [c for c in sorted(best.values(), key=rank_key) if c.origin in pool and c.fits][:POLISH_TOP]
    if settings.method in BASELINES:
        top = []
    for i in range(polish_steps(settings)):
        # one step per slot, polished or not, so the caller's count (polish_steps) is exact; at
        # hundreds of devices the polish is most of the search (a simulation per cut move)
        if on_step:
            on_step(f"polish {top[i].origin} {top[i].point.schedule} M={top[i].point.n_microbatches}" if i < len(top)
                    else "polish: no other candidate")
        if i < len(top):
            polished = _polish(ev, top[i])
            if polished is not top[i]:
                keep(polished)
    ordered = tuple(sorted(best.values(), key=rank_key))
    return Search(candidates=ordered, pool=pool, skipped=tuple(skipped), calibration=calibration)


def polish_steps(settings: PartitionSettings) -> int:
    """How many times run_search calls on_step after its grid points: once per polish slot."""
    return 0 if settings.method in BASELINES else POLISH_TOP


def _polish(ev: CandidateEvaluator, cand: Candidate) -> Candidate:
    """First-improvement hill climbing on the cuts, judged by the simulator (deterministic)."""
    if not (cand.stages is not None):  # cannot happen for any input: the search always fills these
        raise RuntimeError("internal error: cand.stages is not None")
    point, layout = cand.point, cand.layout
    problem = ev.problem(point, layout)
    memo: dict = {}
    cuts = [st.layers[0] for st in cand.stages] + [cand.stages[-1].layers[1]]
    best, moves = cand, 0
    for _ in range(POLISH_ROUNDS):
        improved = False
        for s in range(1, len(cuts) - 1):
            for delta in (-1, 1):
                trial = cuts.copy()
                trial[s] += delta
                if not trial[s - 1] < trial[s] < trial[s + 1]:
                    continue
                c = ev.candidate(cand.method, point, layout, problem, tuple(trial), None, optimal=False, memo=memo)
                if c.fits and c.iteration_ms < best.iteration_ms * (1 - 1e-9):
                    best, cuts, improved, moves = c, trial, True, moves + 1
        if not improved:
            break
    if best is cand:
        return cand
    return Candidate(f"{cand.method}+polish", point, layout, best.stages, best.sim, best.stage_ms, best.stage_bytes,
                     optimal=cand.optimal, note=best.note, polished=moves)


def _solve(ev: CandidateEvaluator, method: str, point: GridPoint, layout: Layout, problem: PartitionProblem,
           deadline: float, memo: dict) -> Candidate:
    if method == "dp":
        sol = solve_dp(problem)
        return ev.candidate("dp", point, layout, problem, sol and sol.cuts, sol and sol.recompute, memo=memo)
    if method == "ilp":
        from planner.partition.ilp import solve_ilp

        left = deadline - time.monotonic()
        if left <= 0:
            return ev.candidate("ilp", point, layout, problem, None, None, optimal=False, note="ILP time limit reached before this point")
        sol = solve_ilp(problem, time_limit=max(1.0, left))
        return ev.candidate("ilp", point, layout, problem, sol and sol.cuts, sol and sol.recompute,
                            optimal=bool(sol and sol.optimal), note="" if sol else "ILP found no cut that fits", memo=memo)
    cuts = ev.baseline(method, layout.n_stages, point.micro_batch_size)
    return ev.candidate(method, point, layout, problem, cuts, None, optimal=False, memo=memo)
