"""One memory model: the partitioner charges a stage what the simulator's device peak holds.

A stage's gradients exist only from its first weight-gradient action to the optimizer step
(planner.schedules.memory), so its peak is the larger of two moments (planner.cost.stage_bytes):
before, with the most micro-batches in flight and no gradients, and after, with the gradients.
The partitioner (DP, ILP, brute force, recompute choice, min_memory_scale) charges exactly the
simulator's peak for GPipe, 1F1B and zero bubble.
"""

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from planner.cost import stage_peak_bytes
from planner.errors import PplanError
from planner.partition import PartitionSettings
from planner.partition.brute import solve_brute
from planner.partition.build import Layout, stage_costs
from planner.partition.dp import min_memory_scale, solve_dp
from planner.partition.ilp import solve_ilp
from planner.partition.problem import fits, stage_bytes
from planner.partition.search import CandidateEvaluator, GridPoint
from planner.plan import Device, Links
from planner.profiling.profile import load_profile
from planner.schedules import generate
from planner.schedules.memory import Moment, stage_inflight_peak, stage_memory_moments
from planner.simulate import simulate_costs

from helpers.oracles import brute_min_scale
from helpers.memory import solvers_agree
from helpers.problems import MODES, objective, random_problem
from helpers.profiles import random_profile

ROOT = Path(__file__).resolve().parents[1]
IMBALANCED = ROOT / "profiles" / "synthetic-memory-imbalanced.csv"
REL = 1e-12


def _simulated_and_charged(prof, schedule: str, n: int, m: int, b: int, cuts, rec, wgrad=None):
    """(simulated device peaks, the partitioner's stage bytes, stage_peak_bytes) for one plan;
    `wgrad`: per-layer bytes a split backward holds between I and W (the profile column)."""
    devices = tuple(Device(f"d{i}") for i in range(n))
    layout = Layout(devices, tuple(range(n)), Links(bandwidth_bytes_per_s=1e9, latency_ms=0.02))
    settings = PartitionSettings(n_devices=n, memory_bytes=None, global_batch=b * m)
    problem = dataclasses.replace(CandidateEvaluator(prof, settings, None).problem(GridPoint(schedule, m, b, 1), layout),
                                  wgrad_bytes=wgrad)
    sched = generate(schedule, n, m)
    stages = stage_costs(dataclasses.replace(prof.at(b), wgrad_bytes=wgrad), layout, cuts, rec, "adam", n_microbatches=m)
    sim = simulate_costs(sched, stages, list(range(n)), devices, layout.links, micro_batch_size=b)
    kinds, peak = stage_memory_moments(sched), stage_inflight_peak(sched)
    charged = [stage_bytes(problem, s, cuts[s], cuts[s + 1], rec[s]) for s in range(n)]
    direct = [stage_peak_bytes(stages[s], peak[s], kinds[s]) for s in range(n)]
    older = [stage_peak_bytes(stages[s], peak[s]) for s in range(n)]  # most in flight, every gradient
    return list(sim.peak_memory_bytes), charged, direct, older, [st.held_output_bytes for st in stages]


def _draw(rng, prof):
    L = prof.n_layers
    n = int(rng.integers(1, min(L, 4) + 1))
    cuts = (0, *sorted(int(x) for x in rng.choice(np.arange(1, L), n - 1, replace=False)), L)
    rec = tuple(tuple(int(x) for x in range(cuts[s], cuts[s + 1]) if rng.random() < 0.4) for s in range(n))
    return n, cuts, rec


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb"])
def test_partitioner_charges_the_simulators_device_peak(schedule):
    rng = np.random.default_rng({"gpipe": 1, "1f1b": 2, "zb": 3}[schedule])
    shipped = load_profile(IMBALANCED)
    checked = below_conservative = 0
    for case in range(60):
        prof = shipped if case % 5 == 0 else random_profile(rng, int(rng.integers(2, 9)))
        n, cuts, rec = _draw(rng, prof)
        m = int(rng.integers(1, 2 * n + 2))  # M <= P included: the in-flight cap is not reached
        b = int(rng.choice([1, 2, 4]))
        # zero bubble: what each micro-batch holds between its I and its W, up to a layer's activations
        wgrad = np.floor(rng.uniform(0, 1, prof.n_layers) * prof.at(b).activation_bytes) if schedule == "zb" else None
        try:
            sim, charged, direct, older, held = _simulated_and_charged(prof, schedule, n, m, b, cuts, rec, wgrad)
        except PplanError:  # a micro-batch count the schedule does not run (1f1b needs M >= P)
            continue
        checked += 1
        for s in range(n):
            assert direct[s] == pytest.approx(charged[s], rel=REL)
            assert charged[s] == pytest.approx(sim[s], rel=REL), (case, s, n, m, cuts, rec)
            below_conservative += charged[s] < older[s] * (1 - 1e-9)
    assert checked >= 30
    assert below_conservative > 0  # the moments mattered: the old bound (every gradient, most in flight) was above


def _with_moments(rng, p):
    """`p` with per-position memory moments as schedules give them (GPipe: k with no gradients,
    k - 1 with them; 1F1B: one; zero bubble: the later one without a backward running; M = 1:
    none with gradients) or drawn at random, and gradients up to the layers' static bytes."""
    def draw(k):
        shapes = (((k, True, False), (k - 1, True, True)), ((k, True, True),), ((k, True, False), (k - 1, False, True)),
                  ((k, True, False),), tuple((int(rng.integers(0, k + 1)), bool(rng.random() < 0.5), bool(rng.random() < 0.5))
                                             for _ in range(int(rng.integers(1, 4)))))
        return tuple(Moment(float(c), t, g) for c, t, g in shapes[int(rng.choice(len(shapes), p=(0.25, 0.05, 0.2, 0.05, 0.45)))])
    return dataclasses.replace(p, moments=tuple(draw(int(k)) for k in p.inflight),
                               gradient_bytes=np.floor(p.static_bytes * rng.uniform(0, 1, p.n_layers)))


def _with_pending_w(rng, p):
    """_with_moments' `p` as a split backward gives it: some moments hold micro-batches whose I ran
    and W did not (up to their in-flight count, as in a zero-bubble order), each charged wgrad bytes,
    and what sends hold until the step ends (input gradients, outputs, held outputs: planner.cost.sent_bytes)."""
    def split(m):
        pending = int(rng.integers(0, int(m.in_flight) + 1))
        return dataclasses.replace(m, pending_w=pending, sent_grads=pending + int(rng.integers(0, 4)))  # every pending W's I ended
    moments = tuple(tuple(split(m) for m in kinds) for kinds in p.moments)
    return dataclasses.replace(p, moments=moments, wgrad_bytes=np.floor(p.activation_bytes * rng.uniform(0, 2, p.n_layers)))


def test_dp_ilp_and_brute_force_agree_with_pending_weight_gradients():
    feasible, differs = solvers_agree(np.random.default_rng(2468), 800, lambda rng, p: _with_pending_w(rng, _with_moments(rng, p)),
                                      40, lambda p: dataclasses.replace(p, wgrad_bytes=None))
    assert 200 < feasible < 800
    assert differs > 20  # the pending weight gradients changed the optimum


def test_min_memory_scale_with_pending_weight_gradients_is_the_least_that_fits():
    rng = np.random.default_rng(13)
    for case in range(300):
        p = _with_pending_w(rng, _with_moments(rng, random_problem(rng, MODES[case % 3])))
        scale, _ = min_memory_scale(p)
        assert scale == pytest.approx(brute_min_scale(p), rel=1e-12, abs=1e-12)


def test_dp_matches_brute_force_with_two_memory_moments():
    feasible, differs = solvers_agree(np.random.default_rng(4321), 1500, _with_moments, 0,
                                      lambda p: dataclasses.replace(p, moments=None))
    assert 500 < feasible < 1500
    assert differs > 50  # instances where telling the moments apart changes the optimum


def test_ilp_matches_dp_and_brute_force_with_two_memory_moments():
    rng = np.random.default_rng(77)
    differs = 0
    for case in range(60):
        p = _with_moments(rng, random_problem(rng, MODES[case % 3], max_layers=6, max_stages=3))
        dp, ilp, brute = solve_dp(p), solve_ilp(p, time_limit=120), solve_brute(p)
        assert objective(ilp) == objective(dp) == objective(brute), (case, p)
        if ilp is not None:
            assert ilp.optimal and fits(p, ilp)
        differs += objective(dp) != objective(solve_dp(dataclasses.replace(p, moments=None)))
    assert differs > 0


def test_min_memory_scale_with_two_moments_is_the_least_that_fits():
    rng = np.random.default_rng(8)
    for case in range(600):
        p = _with_moments(rng, random_problem(rng, MODES[case % 3]))
        scale, _ = min_memory_scale(p)
        assert scale == pytest.approx(brute_min_scale(p), rel=1e-12, abs=1e-12)
        if np.all(np.isfinite(p.budget)) and scale > 0:
            assert solve_dp(dataclasses.replace(p, budget=p.budget * scale * (1 + 1e-12))) is not None
            assert solve_dp(dataclasses.replace(p, budget=p.budget * scale * 0.99)) is None


def test_a_least_scale_above_one_is_exactly_when_the_dp_fits_no_cut():
    # the cluster search asks min_memory_scale first and skips the DP above 1
    # (planner.partition.parallel_eval.solve_task): with no recompute choice, both must agree
    rng = np.random.default_rng(29)
    fitting = 0
    for case in range(600):
        p = random_problem(rng, ("none", "all")[case % 2])
        p = _with_pending_w(rng, _with_moments(rng, p)) if case % 3 else _with_moments(rng, p)
        scale, _ = min_memory_scale(p)
        sol = solve_dp(p)
        assert (sol is None) == (scale > 1.0), (case, scale)
        fitting += sol is not None
    assert 150 < fitting < 450


def test_min_memory_scale_agrees_with_the_simulator():
    # GPipe, M=4, no recompute: the scale it names fits the simulated peaks, 1% less has no plan
    prof = load_profile(IMBALANCED)
    limit = 100 * 2**20
    devices = tuple(Device(f"d{i}", limit) for i in range(2))
    layout = Layout(devices, (0, 1), Links())
    settings = PartitionSettings(n_devices=2, memory_bytes=limit, global_batch=8, recompute="none")
    problem = CandidateEvaluator(prof, settings, None).problem(GridPoint("gpipe", 4, 2, 1), layout)
    scale, cuts = min_memory_scale(problem)
    enough = dataclasses.replace(problem, budget=problem.budget * scale * (1 + 1e-12))
    sol = solve_dp(enough)
    assert sol is not None and solve_dp(dataclasses.replace(problem, budget=problem.budget * scale * 0.99)) is None
    big = tuple(Device(f"d{i}", int(limit * scale * (1 + 1e-9)) + 1) for i in range(2))
    stages = stage_costs(prof.at(2), layout, sol.cuts, sol.recompute, "adam", n_microbatches=4)
    sim = simulate_costs(generate("gpipe", 2, 4), stages, [0, 1], big, Links(), micro_batch_size=2)
    assert sim.fits
    assert max(sim.peak_memory_bytes) == pytest.approx(max(sol.stage_bytes), rel=REL)
    assert max(sim.peak_memory_bytes) > limit * scale * 0.99


def _least(stderr: str) -> str:
    got = re.search(r"least memory that works is ([0-9.]+MiB)", stderr)
    assert got, stderr
    return got.group(1)


def _plan(run_cli, tmp_path: Path, name: str, *args: object) -> dict:
    out = tmp_path / f"{name}.json"
    done = run_cli("partition", IMBALANCED, "--devices", 2, "--global-batch", 8, *args, "--out", out)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def test_the_named_least_memory_works(run_cli, tmp_path):
    for extra in ((), ("--schedule", "gpipe", "--microbatches", 4, "--recompute", "none")):
        done = run_cli("partition", IMBALANCED, "--devices", 2, "--memory", "100MB", "--global-batch", 8, *extra,
                       "--out", tmp_path / "no.json")
        assert done.returncode != 0
        least = _least(done.stderr)
        plan = _plan(run_cli, tmp_path, "least", "--memory", least, *extra)
        limit = plan["devices"][0]["memory_bytes"]
        assert max(d["peak_memory_bytes"] for d in plan["predicted"]["devices"]) <= limit
        assert max(d["peak_memory_bytes"] for d in plan["predicted"]["devices"]) > limit * 0.99
        peaks = [d["peak_memory_bytes"] for d in plan["predicted"]["devices"]]
        charged = plan["search"]["stage_memory_bytes"]  # what the stage table shows
        if plan["schedule"] in ("gpipe", "1f1b"):
            assert peaks == [pytest.approx(m, rel=REL, abs=1) for m in charged]
        assert all(m >= p - 1 for m, p in zip(charged, peaks))


def test_recompute_auto_is_not_slower_than_none_and_tables_show_simulated_peaks(run_cli, tmp_path):
    # just above the least that fits (366.25 MiB on the committed profile): memory binds
    auto = _plan(run_cli, tmp_path, "auto", "--memory", "370MiB")
    none = _plan(run_cli, tmp_path, "none", "--memory", "370MiB", "--recompute", "none")
    assert auto["predicted"]["iteration_ms"] <= none["predicted"]["iteration_ms"] * (1 + 1e-12)
    for plan in (auto, none):
        limit = plan["devices"][0]["memory_bytes"]
        assert all(m <= limit for m in plan["search"]["stage_memory_bytes"])


def test_recompute_refinement_fits_both_moments():
    from planner.partition.problem import recompute_family
    from planner.partition.recompute import stage_recompute

    rng = np.random.default_rng(21)
    refined = 0
    for case in range(1500):
        p = _with_moments(rng, random_problem(rng, "auto", max_layers=10))
        if case % 2:  # a split backward's pending weight gradients: recompute cannot shrink them
            p = _with_pending_w(rng, p)
        p = dataclasses.replace(p, gradient_bytes=p.static_bytes)  # large gradients: the second moment often binds
        s = int(rng.integers(0, p.n_stages))
        i = int(rng.integers(0, p.n_layers))
        j = int(rng.integers(i + 1, p.n_layers + 1))
        budget = float(p.budget[s])
        rec, ok = stage_recompute(p, s, i, j)
        family = [r for r in recompute_family(p, i, j) if stage_bytes(p, s, i, j, r) <= budget]
        assert ok == (stage_bytes(p, s, i, j, rec) <= budget)
        if family:  # never worse than the family's cheapest fitting set
            assert ok and sum(p.recompute_ms[l] for l in rec) <= min(sum(p.recompute_ms[l] for l in r) for r in family)
            refined += bool(rec)
    assert refined > 10


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_memory_moments_closed_form(schedule):
    # GPipe: M at the first backward with no gradients, M - 1 at later ones with them; 1F1B stage s
    # the same with at most w = P - s (one moment once M > P - s); M = 1: no moment with gradients.
    # 1F1B's warm-up send holds micro-batch w - 2's output from its backward to backward M - w, the
    # steady loop's last: a later backward holds it too where w >= 2 and w - 2 < M - w
    for P in range(1, 5):
        for M in range(P if schedule == "1f1b" else 1, 9):
            got = stage_memory_moments(generate(schedule, P, M))
            for s in range(P):
                cap = M if schedule == "gpipe" else P - s
                warm = schedule == "1f1b" and cap >= 2 and cap - 2 < M - cap
                first = Moment(min(M, cap), True, False)
                later = Moment(min(M - 1, cap), True, True, warmup_send=warm)
                want = (first,) if M == 1 else (later,) if later.in_flight >= first.in_flight else (first, later)
                assert got[s] == want, (P, M, s)
