"""Properties over random profiles and clusters (hypothesis).

- Plans from `partition` on random profiles and heterogeneous clusters are valid, fit every
  device's memory in the simulator, and simulate to the prediction they record.
- DP = brute force (and = ILP on a sample) on problems built from random clusters: per-device
  memory and speed, link overrides, permuted device orders, interleaved budget splitting
  (test_partition_solvers.py covers the solvers on raw arrays; this goes through build_problem).
- The simulator's invariants on plans with recompute and uneven devices: every action once,
  no overlap on a device, dependencies and transfers respected, busy time and memory curve
  consistent with the reported figures.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner.cluster import cluster_from_dict
from planner.errors import InfeasibleError
from planner.partition.api import partition
from planner.partition.brute import solve_brute
from planner.partition.build import Layout, build_problem
from planner.partition.dp import solve_dp
from planner.partition.search import PartitionSettings
from planner.plan import Device, Links, Plan, StagePlan, plan_from_dict, plan_to_json
from planner.profiling.profile import make_profile
from planner.schedules import generate, valid_microbatches
from planner.schedules.memory import stage_inflight_peak
from planner.simulate import simulate

_FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _profile(seed: int, n_layers: int, sizes: tuple[int, ...] = (1, 2, 4)):
    """Layers whose costs spread over ~30x; bytes proportional to the micro-batch size."""
    rng = np.random.default_rng(seed)
    b = np.asarray(sizes, dtype=float)[None, :]

    def per(lo: float, hi: float) -> np.ndarray:
        return np.exp(rng.uniform(np.log(lo), np.log(hi), n_layers))[:, None]

    fwd = per(0.05, 2.0) * (b + 1.0)
    cols = {
        "fwd_ms": np.round(fwd, 6), "bwd_ms": np.round(2 * fwd, 6),
        "param_bytes": np.repeat(np.round(per(1e5, 4e7)), len(sizes), axis=1),
        "activation_bytes": np.round(per(1e5, 3e7) * b), "output_bytes": np.round(per(1e4, 3e6) * b),
    }
    return make_profile([f"l{i}" for i in range(n_layers)], list(sizes), cols, {"input_bytes_per_sample": "4096"})


@st.composite
def clusters(draw, n_devices: int, static_total: float):
    """A heterogeneous cluster: per-device memory (or the default) and speed, some fast links."""
    devices = []
    for i in range(n_devices):
        mem = draw(st.one_of(st.none(), st.floats(0.3, 3.0)))
        dev = {"name": f"g{i}", "speed": draw(st.sampled_from([0.5, 1.0, 1.0, 2.0]))}
        if mem is not None:
            dev["memory"] = int(mem * static_total / n_devices + 5e8)
        devices.append(dev)
    links = []
    for a in range(n_devices):
        for b in range(a + 1, n_devices):
            if draw(st.booleans()):
                links.append({"a": f"g{a}", "b": f"g{b}", "bandwidth": draw(st.sampled_from([1e8, 1e9, 1e11])),
                              "latency": draw(st.sampled_from([0.001, 0.05, 0.5]))})
    data = {"format": "pplan-cluster/1", "devices": devices, "links": links,
            "default_link": {"bandwidth": 5e9, "latency": 0.02}}
    return cluster_from_dict(data, source="<hypothesis>")


# ---- partition end to end ----------------------------------------------------------------------

@_FAST
@given(data=st.data(), seed=st.integers(0, 2**31), n_layers=st.integers(2, 9),
       batch=st.sampled_from([2, 4, 8]), recompute=st.sampled_from(["auto", "none", "all"]))
def test_partition_plans_are_valid_fit_and_simulate_to_their_prediction(data, seed, n_layers, batch, recompute):
    prof = _profile(seed, n_layers)
    n = data.draw(st.integers(1, min(n_layers, 4)), label="devices")
    static_total = 16 * float(prof.columns["param_bytes"][:, 0].sum())
    cluster = data.draw(clusters(n, static_total), label="cluster")
    default_mem = data.draw(st.one_of(st.none(), st.integers(int(static_total / n / 2), int(static_total * 2) + 10**9)),
                            label="memory")
    s = PartitionSettings(n_devices=None, memory_bytes=default_mem, global_batch=batch, recompute=recompute, cluster=cluster)
    try:
        result = partition(prof, s)
    except InfeasibleError as e:
        assert "memory" in e.one_line() or "device" in e.one_line()
        return
    plan = result.plan
    plan.validate(prof.n_layers)
    covered = [layer for st_ in plan.stages for layer in range(*st_.layers)]
    assert covered == list(range(prof.n_layers))  # every layer in exactly one stage, in order
    assert sorted({st_.device for st_ in plan.stages}) == list(range(plan.n_devices))
    for st_ in plan.stages:
        assert set(st_.recompute) <= set(range(*st_.layers))
        if recompute == "none":
            assert st_.recompute == ()
    sim = simulate(plan, prof, record_timeline=False)
    assert sim.fits, (sim.peak_memory_bytes, sim.memory_limit_bytes)
    for peak, dev in zip(sim.peak_memory_bytes, plan.devices):
        assert dev.memory_bytes is None or peak <= dev.memory_bytes
    assert sim.iteration_ms == pytest.approx(plan.predicted.iteration_ms, rel=1e-9)
    # the plan survives its own JSON, byte for byte
    again = plan_from_dict(json.loads(plan_to_json(plan)))
    assert plan_to_json(again) == plan_to_json(plan)


# ---- DP = brute force = ILP through build_problem ----------------------------------------------

def _objective(sol):
    return None if sol is None else (round(sol.bottleneck_ms, 7), round(sol.total_ms, 7))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), seed=st.integers(0, 2**31), n_layers=st.integers(1, 6),
       schedule=st.sampled_from(["gpipe", "1f1b", "interleaved", "zb"]), recompute=st.sampled_from(["auto", "none", "all"]))
def test_dp_equals_brute_force_on_random_clusters(data, seed, n_layers, schedule, recompute):
    v = 2 if schedule == "interleaved" else 1
    n = data.draw(st.integers(1, max(1, min(3, n_layers // v))), label="devices")
    assume(n * v <= n_layers)
    m = data.draw(st.sampled_from([n, 2 * n, 4]), label="microbatches")
    assume(valid_microbatches(schedule, n, m))
    prof = _profile(seed, n_layers, sizes=(2,))
    costs = prof.at(2)
    static_total = 16 * float(costs.param_bytes.sum())
    cluster = data.draw(clusters(n, static_total), label="cluster")
    devices = cluster.devices(None)
    links = cluster.links(5e9, 0.02)
    order = tuple(data.draw(st.permutations(list(range(n))), label="order"))
    layout = Layout(devices, order, links, v)
    sched = generate(schedule, n, m, v)
    p = build_problem(costs, layout, stage_inflight_peak(sched), optimizer="adam", recompute=recompute,
                      split_backward=sched.split_backward)
    dp, brute = solve_dp(p), solve_brute(p)
    assert _objective(dp) == _objective(brute)
    if dp is not None:
        assert dp.cuts[0] == 0 and dp.cuts[-1] == n_layers and all(a < b for a, b in zip(dp.cuts, dp.cuts[1:]))
        assert all(mem <= b for mem, b in zip(dp.stage_bytes, p.budget))
    if seed % 6 == 0:  # the ILP costs a solver start per call: a sample keeps this fast
        from planner.partition.ilp import solve_ilp

        assert _objective(solve_ilp(p, time_limit=120)) == _objective(dp)  # ms each; 120 s guards a hang


# ---- simulator invariants ----------------------------------------------------------------------

@st.composite
def plans(draw):
    """A random valid plan (with recompute, uneven speeds and memory) for a random profile."""
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "interleaved", "zb"]))
    v = 2 if schedule == "interleaved" else 1
    n = draw(st.integers(1, 4))
    n_layers = draw(st.integers(n * v, n * v + 6))
    m = draw(st.integers(1, 9))
    assume(valid_microbatches(schedule, n, m))
    S = n * v
    inner = sorted(draw(st.sets(st.integers(1, n_layers - 1), min_size=S - 1, max_size=S - 1))) if S > 1 else []
    cuts = [0, *inner, n_layers]
    order = draw(st.permutations(list(range(n))))
    stages = []
    for s in range(S):
        layers = list(range(cuts[s], cuts[s + 1]))
        rec = draw(st.sets(st.sampled_from(layers))) if draw(st.booleans()) else set()
        stages.append(StagePlan(device=order[s % n], layers=(cuts[s], cuts[s + 1]), recompute=tuple(sorted(rec))))
    devices = tuple(Device(f"d{i}", None, speed=draw(st.sampled_from([0.5, 1.0, 3.0]))) for i in range(n))
    links = Links(bandwidth_bytes_per_s=draw(st.sampled_from([1e7, 1e9, 1e12])), latency_ms=draw(st.sampled_from([0.0, 0.05])))
    plan = Plan(schedule=schedule, micro_batch_size=draw(st.sampled_from([1, 2, 3])), n_microbatches=m,
                stages=tuple(stages), devices=devices, links=links, n_layers=n_layers,
                optimizer=draw(st.sampled_from(["adam", "sgd", "sgd-plain"])))
    plan.validate(n_layers)
    return plan, _profile(draw(st.integers(0, 2**31)), n_layers)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=plans())
def test_simulator_invariants(case):
    plan, prof = case
    r = simulate(plan, prof, record_timeline=True)
    S, M = plan.n_stages, plan.n_microbatches
    split = plan.schedule == "zb"
    compute = [x for x in r.timeline if x.kind in "FBIW"]
    keys = [(x.stage, x.kind, x.microbatch) for x in compute]
    want = {(s, k, mb) for s in range(S) for mb in range(M) for k in (("F", "I", "W") if split else ("F", "B"))}
    assert len(keys) == len(set(keys)) and set(keys) == want  # every action exactly once
    box = {(x.stage, x.kind, x.microbatch): x for x in compute}
    for x in compute:  # each action runs on its stage's device
        assert x.device == plan.stages[x.stage].device and x.end_ms >= x.start_ms
    # recompute rows sit right before their backward, on the same device, for recomputed stages only
    for x in (y for y in r.timeline if y.kind == "R"):
        after = box[(x.stage, "I" if split else "B", x.microbatch)]
        assert plan.stages[x.stage].recompute and x.device == after.device and x.end_ms == pytest.approx(after.start_ms)
    # one optimizer step per device, its last box
    opt = {x.device: x for x in r.timeline if x.kind == "O"}
    assert sorted(opt) == list(range(plan.n_devices))
    by_dev: dict[int, list] = {}
    for x in r.timeline:
        if x.kind != "C":
            by_dev.setdefault(x.device, []).append(x)
    for d, rows in by_dev.items():
        rows.sort(key=lambda x: (x.start_ms, x.end_ms))
        for a, b in zip(rows, rows[1:]):
            assert b.start_ms >= a.end_ms - 1e-9, (d, a, b)  # no overlap on a device
        assert rows[-1].kind == "O"
        busy = sum(x.end_ms - x.start_ms for x in rows)
        assert busy == pytest.approx(r.busy_ms[d], rel=1e-9, abs=1e-9)
    # dependencies: input produced (and sent, across devices) before an action starts
    bk = "I" if split else "B"
    for (s, k, mb), x in box.items():
        if k == "F":
            need = None if s == 0 else (s - 1, "F", mb)
        elif k in "BI":
            need = (s, "F", mb) if s == S - 1 else (s + 1, bk, mb)
        else:
            need = (s, "I", mb)
        if need is None:
            continue
        ready = box[need].end_ms
        if box[need].device != x.device:
            sends = [c.end_ms for c in r.timeline if c.kind == "C" and c.stage == need[0] and c.microbatch == mb
                     and c.start_ms >= box[need].end_ms - 1e-9]
            assert sends, f"no transfer for {need}"
            ready = min(sends)
        assert x.start_ms >= ready - 1e-9, (s, k, mb)
    assert r.iteration_ms >= max(x.end_ms for x in r.timeline) - 1e-9
    assert 0.0 <= r.bubble_fraction < 1.0
    # the memory curve stays within the reported peak and returns to what stays between steps:
    # weights, optimizer state and buffers (the optimizer step frees the gradients)
    for d, pts in r.memory_timeline.items():
        levels = [b for _, b in pts]
        static = r.memory[d].weights + r.memory[d].optimizer + r.memory[d].buffers
        assert max(levels) <= r.peak_memory_bytes[d] * (1 + 1e-9) + 1
        assert levels[-1] == pytest.approx(static, rel=1e-9, abs=1)
        assert min(levels) >= static * (1 - 1e-9) - 1
