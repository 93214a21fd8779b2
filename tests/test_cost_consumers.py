"""Every consumer of the cost model charges what planner.cost says (DESIGN.md: one cost model).

On random small instances (chains and models with skip edges, heterogeneous devices and links,
with and without a calibration, every recompute mode and schedule), the stage figures that the
DP, the ILP and brute force report, and the action, transfer and memory figures the simulator
produces, are compared with the cost model's own: planner.cost.stage_cost for the stage,
microbatch_ms / stage_peak_bytes for the partitioner's objective and memory, action_ms,
scaled_ms and link_ms for the simulator.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from planner.calibration import Calibration
from planner.cost import (
    action_ms, link_between, link_ms, microbatch_ms, scaled_ms, stage_cost, stage_memory, stage_peak_bytes,
)
from planner.cost.comm import transfer_parts
from planner.partition.brute import solve_brute
from planner.partition.build import Layout, build_problem, stage_costs
from planner.partition.dp import solve_dp
from planner.partition.ilp import solve_ilp
from planner.partition.problem import Solution
from planner.plan import Device, Links
from planner.profiling.profile import LayerCosts, make_profile
from planner.schedules import SCHEDULE_NAMES, generate, get_schedule
from planner.schedules.memory import memory_peaks, stage_inflight_peak
from planner.schedules.registry import holds_warmup_send
from planner.simulation.engine import simulate_costs

REL = 1e-9  # summation order differs between the solvers' arrays and StageCost's sums
MB = 2  # micro-batch size the instances are priced at (skip-edge bytes scale with it)
M = 4  # micro-batches per step (torch's receive buffers, planner.cost.buffer_bytes)


def _instance(seed: int) -> tuple[LayerCosts, Layout, str, Calibration | None, str, str]:
    """(costs, layout, schedule name, calibration, optimizer, recompute mode) of one random instance."""
    rng = np.random.default_rng(seed)
    schedule = SCHEDULE_NAMES[seed % len(SCHEDULE_NAMES)]
    v = get_schedule(schedule).virtual_stages
    P = int(rng.integers(2, 4)) if v == 1 else 2
    L = int(rng.integers(P * v + 1, P * v + 4))
    sizes = [1, MB]
    per = lambda lo, hi: np.round(rng.uniform(lo, hi, L))[:, None] * np.asarray(sizes)[None, :]  # noqa: E731
    cols = {
        "fwd_ms": np.round(rng.uniform(0.5, 4.0, L), 3)[:, None] * np.asarray(sizes)[None, :],
        "param_bytes": np.repeat(np.round(rng.uniform(1e5, 4e6, L))[:, None], 2, axis=1),
        "activation_bytes": per(1e5, 3e6),
        "output_bytes": per(1e4, 1e6),
        "optimizer_ms": np.repeat(np.round(rng.uniform(0.0, 0.5, L), 3)[:, None], 2, axis=1),
    }
    cols["bwd_ms"] = np.round(cols["fwd_ms"] * rng.uniform(1.5, 2.5, L)[:, None], 3)
    if seed % 5 in (0, 2):  # the profile says what layers save of their input: torch's receive buffers
        data_in = 4096.0 * np.asarray(sizes, dtype=float)[None, :]
        layer_in = np.concatenate([data_in, cols["output_bytes"][:-1]])
        cols["input_saved_bytes"] = np.round(np.minimum(cols["activation_bytes"], layer_in) * rng.uniform(0, 1, L)[:, None])
        prev_act = np.concatenate([np.zeros((1, 2)), cols["activation_bytes"][:-1]])
        cols["shared_input_bytes"] = np.round(np.minimum(cols["input_saved_bytes"], prev_act) * rng.uniform(0, 1, L)[:, None])
    if seed % 8 in (3, 6):  # what a split backward holds between I and W (zero bubble is seed % 4 == 3)
        cols["wgrad_bytes"] = per(0, 2e6)
    if seed % 8 in (3, 7):  # what its W holds while it runs: weight-gradient sized, some layers without parameters
        cols["w_workspace_bytes"] = np.repeat(np.round(rng.uniform(0, 8e6, L))[:, None], 2, axis=1)
        cols["w_carry_bytes"] = np.round(cols["w_workspace_bytes"] * rng.choice([0.0, 0.5, 1.0], L)[:, None])
    if seed % 6 in (1, 2, 4):  # layer workspaces, the largest on another layer than the largest activation
        cols["workspace_bytes"] = per(0, 5e5)
        cols["workspace_bytes"][int(np.argmax(cols["activation_bytes"][:, 0]) + 1) % L] *= 8
    if seed % 4 in (0, 2):  # a checkpoint's RNG state, and the loss's saved tensors on the last layer
        cols["checkpoint_extra_bytes"] = np.full((L, 2), 5056.0)
        cols["checkpoint_extra_bytes"][-1] += np.round(cols["activation_bytes"][-1] * 0.8)
    edges: tuple = ()
    if seed % 3 == 0 and L >= 4:  # not a chain: skip tensors cross cuts and pass through stages
        edges = ((0, L - 1, int(rng.integers(1e4, 5e5))), (1, L - 2, int(rng.integers(1e4, 5e5)), (2,)) if L >= 5 else ())
        edges = tuple(e for e in edges if e)
    prof = make_profile([f"l{i}" for i in range(L)], sizes, cols, {"input_bytes_per_sample": "4096"}, skip_edges=edges)
    costs = prof.at(MB)
    speeds = rng.choice([0.5, 1.0, 2.0], P)
    static = float(np.sum(costs.param_bytes)) * 4.0
    acts = float(np.sum(costs.activation_bytes))
    limit = None if seed % 4 == 1 else int((static + 2.5 * acts) / P * rng.uniform(0.7, 1.6))
    devices = tuple(Device(f"d{i}", memory_bytes=limit, speed=float(speeds[i])) for i in range(P))
    links = Links(bandwidth_bytes_per_s=float(rng.choice([1e9, 25e9])), latency_ms=float(rng.choice([0.0, 0.05])),
                  pairs=((0, 1, 5e8, 0.2),))
    calibration = None if seed % 2 else Calibration(compute_scale=float(rng.uniform(0.8, 1.5)), action_overhead_ms=0.03,
                                                     comm_latency_ms=0.1 if seed % 4 == 0 else None,
                                                     comm_bandwidth_bytes_per_s=2e9 if seed % 4 == 0 else None)
    layout = Layout(devices=devices, order=tuple(range(P)), links=links, virtual_stages=v)
    optimizer = ("adam", "sgd", "sgd-plain")[seed % 3]
    recompute = ("auto", "none", "all", "auto")[(seed // 3) % 4]
    return costs, layout, schedule, calibration, optimizer, recompute


def _sends(costs: LayerCosts, layout: Layout, cal: Calibration | None, cuts: tuple[int, ...], s: int) -> tuple[float, float]:
    """The cost model's send of the input gradient and of the output of stage s."""
    sc = stage_cost(costs, cuts[s], cuts[s + 1])
    S = len(cuts) - 1
    send_in = link_ms(sc.input_bytes, link_between(layout.links, layout.device_of(s - 1), layout.device_of(s)), cal) if s > 0 else 0.0
    send_out = link_ms(sc.output_bytes, link_between(layout.links, layout.device_of(s), layout.device_of(s + 1)), cal) if s < S - 1 else 0.0
    return send_in, send_out


def _check_solution(sol: Solution, costs: LayerCosts, layout: Layout, cal: Calibration | None, optimizer: str,
                    inflight: list[int], split: bool, budget: np.ndarray) -> None:
    for s in range(len(sol.cuts) - 1):
        i, j = sol.cuts[s], sol.cuts[s + 1]
        sc = stage_cost(costs, i, j, sol.recompute[s], optimizer, layout.devices[layout.device_of(s)].speed, M)
        send_in, send_out = _sends(costs, layout, cal, sol.cuts, s)
        assert sol.stage_ms[s] == pytest.approx(microbatch_ms(sc, cal, split, send_in, send_out), rel=REL)
        assert sol.stage_bytes[s] == pytest.approx(stage_peak_bytes(sc, inflight[s]), rel=REL)
        assert stage_peak_bytes(sc, inflight[s]) <= budget[s] * (1 + REL)


SEEDS = range(48)


@pytest.mark.parametrize("seed", SEEDS)
def test_dp_and_brute_force_charge_the_cost_model(seed: int) -> None:
    costs, layout, name, cal, optimizer, recompute = _instance(seed)
    sched = generate(name, layout.n_ranks, M, layout.virtual_stages)
    inflight = stage_inflight_peak(sched)
    p = build_problem(costs, layout, inflight, optimizer=optimizer, recompute=recompute, calibration=cal,
                      split_backward=sched.split_backward, n_microbatches=M)
    dp, brute = solve_dp(p), solve_brute(p)
    assert (dp is None) == (brute is None)
    for sol in (dp, brute):
        if sol is not None:
            _check_solution(sol, costs, layout, cal, optimizer, inflight, sched.split_backward, p.budget)


@pytest.mark.parametrize("seed", SEEDS[::4])
def test_ilp_charges_the_cost_model(seed: int) -> None:
    pytest.importorskip("pulp")
    costs, layout, name, cal, optimizer, recompute = _instance(seed)
    sched = generate(name, layout.n_ranks, M, layout.virtual_stages)
    inflight = stage_inflight_peak(sched)
    p = build_problem(costs, layout, inflight, optimizer=optimizer, recompute=recompute, calibration=cal,
                      split_backward=sched.split_backward, n_microbatches=M)
    sol = solve_ilp(p, time_limit=20)
    if sol is not None:
        _check_solution(sol, costs, layout, cal, optimizer, inflight, sched.split_backward, p.budget)


@pytest.mark.parametrize("seed", SEEDS)
def test_simulator_charges_the_cost_model(seed: int) -> None:
    costs, layout, name, cal, optimizer, recompute = _instance(seed)
    sched = generate(name, layout.n_ranks, M, layout.virtual_stages)
    S = layout.n_stages
    cuts = tuple(int(round(x)) for x in np.linspace(0, len(costs.fwd_ms), S + 1))
    rec = tuple(tuple(range(cuts[s], cuts[s + 1]))[: s % 2 + (recompute == "all")] for s in range(S))
    stages = stage_costs(costs, layout, cuts, rec, optimizer, M)
    placement = [layout.device_of(s) for s in range(S)]
    sim = simulate_costs(sched, stages, placement, layout.devices, layout.links, micro_batch_size=MB,
                         calibration=cal, record_timeline=True)
    for row in sim.timeline:
        if row.kind == "C":
            _check_transfer_row(sim, row, stages, placement, layout, cal)
        else:
            _check_action_row(row, stages, placement, cal)
    _check_rank_memory(sim, sched, stages, placement, layout, optimizer)
    _check_busy_time(sim, sched, stages, placement, layout, cal)


def _check_action_row(row, stages: list, placement: list[int], cal: Calibration | None) -> None:
    """A compute row lasts what the cost model charges: its action, its recompute, the optimizer step."""
    durations = {"F": "fwd_ms", "B": "bwd_ms", "I": "bwd_input_ms", "W": "bwd_weight_ms"}
    took = row.end_ms - row.start_ms
    if row.kind in durations:
        st = stages[row.stage]
        want = action_ms(getattr(st, durations[row.kind]), cal)
        if row.kind in "BI":  # the recompute part is drawn as its own R row just before
            want -= scaled_ms(st.recompute_ms, cal)
        assert took == pytest.approx(want, rel=REL, abs=1e-9)
    elif row.kind == "R":
        assert took == pytest.approx(scaled_ms(stages[row.stage].recompute_ms, cal), rel=REL, abs=1e-9)
    elif row.kind == "O":
        opt = sum(st.optimizer_ms for s, st in enumerate(stages) if placement[s] == row.device)
        assert took == pytest.approx(scaled_ms(opt, cal), rel=REL, abs=1e-9)


def _check_transfer_row(sim, row, stages: list, placement: list[int], layout: Layout, cal: Calibration | None) -> None:
    """A transfer's two parts (C rows) last what the cost model's transfer_parts says; together its link_ms."""
    st = stages[row.stage]
    consumer = _consumer_of(sim, row)
    if consumer is not None:  # the receiver taking the bytes just before its action
        src = row.stage - 1 if consumer == "F" else row.stage + 1
        nbytes = st.input_bytes if consumer == "F" else st.output_bytes
        part = 1
    else:  # the latency on the link, under the sender (after waiting for the link)
        # the output leaves before this stage's backward of the micro-batch can start (that
        # backward needs the next stage's forward of it); the input gradient leaves after
        forward = row.start_ms < _first_backward(sim, row.stage, row.microbatch)
        src, dst = row.stage, (row.stage + 1 if forward else row.stage - 1)
        nbytes = st.output_bytes if forward else st.input_bytes
        part = 0
    ends = (src, row.stage) if part else (row.stage, dst)
    link = link_between(layout.links, placement[ends[0]], placement[ends[1]])
    assert row.end_ms - row.start_ms == pytest.approx(transfer_parts(nbytes, link, cal)[part], rel=REL, abs=1e-9)
    assert sum(transfer_parts(nbytes, link, cal)) == pytest.approx(link_ms(nbytes, link, cal))


def _check_rank_memory(sim, sched, stages: list, placement: list[int], layout: Layout, optimizer: str) -> None:
    """Each device's memory is the cost model's at the larger of its two moments, within the partitioner's bound."""
    peaks = memory_peaks(sched, [st.kept_bytes for st in stages], [st.transient_bytes for st in stages],
                         [st.param_bytes for st in stages], [st.held_output_bytes for st in stages],
                         [st.wgrad_bytes for st in stages], [st.sent for st in stages],
                         [st.running_i_bytes for st in stages], [st.w_workspace_bytes for st in stages],
                         [st.output_bytes for st in stages])
    for r in range(layout.n_ranks):
        d = layout.order[r]
        mine = [st for s, st in enumerate(stages) if placement[s] == d]
        # the larger of two moments: activations with the gradients that exist by then, and the
        # optimizer step (all gradients, its temporaries)
        act, grads = peaks[r]
        params = sum(st.param_bytes for st in mine)
        during = stage_memory(mine, act)
        during = replace(during, gradients=during.gradients * (grads / params if params else 1.0))
        step = stage_memory(mine, 0.0)
        want = during if during.total >= step.total else step
        assert sim.memory[d] == want
        # pending weight gradients and what sends hold: the bound has no moments to count them
        split_extras = sched.split_backward and any(st.wgrad_bytes or any(st.sent) or st.w_workspace_bytes for st in mine)
        # and 1F1B's warm-up send: an output held beyond the micro-batches in flight
        warm_send = holds_warmup_send(sched.name) and any(st.output_bytes for st in mine)
        if layout.virtual_stages == 1 and not split_extras and not warm_send:  # the partitioner's bound: peak count x kept + transient
            k = stage_inflight_peak(sched)[placement.index(d)]
            assert want.total <= stage_peak_bytes(mine[0], k) * (1 + REL)


def _check_busy_time(sim, sched, stages: list, placement: list[int], layout: Layout, cal: Calibration | None) -> None:
    """Each device is busy for M of each of its stages' actions and its optimizer step."""
    for d in (layout.order[r] for r in range(layout.n_ranks)):
        mine = [st for s, st in enumerate(stages) if placement[s] == d]
        backward = [(action_ms(st.bwd_input_ms, cal) + action_ms(st.bwd_weight_ms, cal)) if sched.split_backward
                    else action_ms(st.bwd_ms, cal) for st in mine]
        busy = sum(M * (action_ms(st.fwd_ms, cal) + b) for st, b in zip(mine, backward))
        busy += scaled_ms(sum(st.optimizer_ms for st in mine), cal)
        assert sim.busy_ms[d] == pytest.approx(busy, rel=REL)


def _consumer_of(sim, row) -> str | None:
    """The kind (F, or B/I/R for a backward) of the action a receiving C row leads into on its
    device, stage and micro-batch; None for a C row under a sender."""
    for r in sim.timeline:
        if (r.device, r.stage, r.microbatch) == (row.device, row.stage, row.microbatch) and r.kind in "FBIR" \
                and abs(r.start_ms - row.end_ms) < 1e-9:
            return r.kind
    return None


def _first_backward(sim, stage: int, microbatch: int) -> float:
    """Start of the backward (its recompute row included) of `stage` for `microbatch`."""
    return min(r.start_ms for r in sim.timeline if r.kind in ("B", "I", "R") and r.stage == stage and r.microbatch == microbatch)
