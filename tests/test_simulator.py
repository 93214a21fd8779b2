"""The simulator: closed forms, memory over time, communication, calibration, invariants."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.calibration import Calibration
from planner.cost import StageCost
from planner.errors import ScheduleError
from planner.plan import Device, Links, Plan, StagePlan
from planner.profiling.profile import make_profile
from planner.schedules import Action, PipelineSchedule, generate, valid_microbatches
from planner.schedules.memory import rank_activation_peak
from planner.simulate import simulate, simulate_costs


def _profile(L: int, f=1.0, b=2.0, bi=None, out=0.0, act=100.0, params=0.0, opt=None, sizes=(1,)):
    n = len(sizes)
    cols = {
        "fwd_ms": np.tile(np.asarray(f, dtype=float).reshape(-1, 1) * np.ones((L, 1)), (1, n)) * np.array(sizes),
        "bwd_ms": np.tile(np.asarray(b, dtype=float).reshape(-1, 1) * np.ones((L, 1)), (1, n)) * np.array(sizes),
        "param_bytes": np.full((L, n), params),
        "activation_bytes": np.full((L, n), act) * np.array(sizes),
        "output_bytes": np.full((L, n), out) * np.array(sizes),
    }
    if bi is not None:
        cols["bwd_input_ms"] = np.full((L, n), bi)
    if opt is not None:
        cols["optimizer_ms"] = np.full((L, n), opt)
    return make_profile([f"l{i}" for i in range(L)], list(sizes), cols)


def _plan(schedule: str, P: int, M: int, v: int = 1, per_stage: int = 1, **kw) -> Plan:
    stages = tuple(StagePlan(device=s % P, layers=(s * per_stage, (s + 1) * per_stage)) for s in range(P * v))
    return Plan(schedule=schedule, micro_batch_size=kw.pop("b", 1), n_microbatches=M, stages=stages,
                devices=tuple(Device(f"d{i}") for i in range(P)), **kw)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("S", "M"), [(1, 1), (2, 2), (4, 4), (4, 8), (8, 16), (3, 7)])
def test_gpipe_and_1f1b_closed_form(schedule: str, S: int, M: int) -> None:
    f, b = 1.5, 2.5
    r = simulate(_plan(schedule, S, M), _profile(S, f=f, b=b), record_timeline=False)
    assert r.iteration_ms == pytest.approx((M + S - 1) * (f + b))
    assert r.bubble_fraction == pytest.approx((S - 1) / (M + S - 1))
    assert r.throughput_samples_per_s == pytest.approx(M * 1e3 / r.iteration_ms)
    assert r.busy_ms == pytest.approx((M * (f + b),) * S)


@pytest.mark.parametrize(("P", "M", "v"), [(2, 4, 2), (4, 8, 2), (4, 16, 4), (3, 9, 3)])
def test_interleaved_megatron_bubble(P: int, M: int, v: int) -> None:
    # Megatron (Narayanan et al. 2021): with v chunks of per-chunk time f/v, b/v and M a
    # multiple of P, the bubble is (P-1)(f+b)/v: iteration = M(f+b) + (P-1)(f+b)/v.
    f, b = 1.0, 2.0
    r = simulate(_plan("interleaved", P, M, v), _profile(P * v, f=f / v, b=b / v), record_timeline=False)
    assert r.iteration_ms == pytest.approx(M * (f + b) + (P - 1) * (f + b) / v)
    one = simulate(_plan("1f1b", P, M), _profile(P, f=f, b=b), record_timeline=False)
    assert r.bubble_fraction < one.bubble_fraction


@pytest.mark.parametrize(("P", "M"), [(2, 4), (4, 8), (4, 16), (6, 12)])
def test_zb_h1_bubble_is_paper_formula(P: int, M: int) -> None:
    # Qi et al. 2024: with F = I = W = t, 1F1B idles (P-1)(F+B) = 3(P-1)t per device, ZB-H1
    # (P-1)(F+I-W) = (P-1)t, a third. Iteration = 3Mt + bubble.
    t = 1.0
    zb = simulate(_plan("zb", P, M), _profile(P, f=t, b=2 * t, bi=t), record_timeline=False)
    one = simulate(_plan("1f1b", P, M), _profile(P, f=t, b=2 * t, bi=t), record_timeline=False)
    assert zb.iteration_ms == pytest.approx(3 * M * t + (P - 1) * t)
    assert one.iteration_ms - 3 * M * t == pytest.approx(3 * (P - 1) * t)
    assert max(zb.peak_memory_bytes) == max(one.peak_memory_bytes)  # same peak as 1F1B


def _inflight_from_timeline(r, kept: float) -> list[int]:
    return [int(round(max(b for _, b in r.memory_timeline[d]) / kept)) for d in range(r.n_devices)]


def test_memory_timeline_shows_gpipe_m_and_1f1b_s_minus_s() -> None:
    S, M = 4, 8
    g = simulate(_plan("gpipe", S, M), _profile(S, act=100.0))
    o = simulate(_plan("1f1b", S, M), _profile(S, act=100.0))
    assert _inflight_from_timeline(g, 100.0) == [M] * S
    assert _inflight_from_timeline(o, 100.0) == [S - s for s in range(S)]
    # and the timeline returns to zero activations at the end
    assert all(pts[-1][1] == 0 for pts in o.memory_timeline.values())


def test_simulated_memory_agrees_with_schedule_memory_and_cost_model() -> None:
    prof = _profile(8, act=1000.0, out=10.0, params=50.0)
    plan = _plan("interleaved", 2, 4, v=2, per_stage=2)
    plan = plan.with_(stages=tuple(dataclasses.replace(s, recompute=(s.layers[0],)) for s in plan.stages))
    r = simulate(plan, prof)
    from planner.simulate import plan_stage_costs

    stages, _ = plan_stage_costs(plan, prof)
    sch = generate("interleaved", 2, 4, 2)
    for d in range(2):
        act = rank_activation_peak(sch, d, [s.kept_bytes for s in stages], [s.transient_bytes for s in stages])
        assert r.memory[d].activations == act
        assert max(b for _, b in r.memory_timeline[d]) == pytest.approx(r.peak_memory_bytes[d])
        on = [s for i, s in enumerate(stages) if i % 2 == d]
        assert r.memory[d].weights == sum(s.param_bytes for s in on)
        assert r.memory[d].buffers == sum(s.buffer_bytes for s in on)


def test_communication_delays_and_overlaps() -> None:
    # 2 stages, 1 micro-batch: F0, send, F1, B1, send back, B0
    lat, bw, nbytes = 0.5, 1e6, 1000.0  # 1000 B at 1 MB/s = 1 ms
    plan = _plan("gpipe", 2, 1, links=Links(bandwidth_bytes_per_s=bw, latency_ms=lat))
    r = simulate(plan, _profile(2, f=1.0, b=2.0, out=nbytes))
    c = lat + nbytes / bw * 1e3
    assert r.iteration_ms == pytest.approx(1 + c + 1 + 2 + c + 2)
    comms = sorted((row for row in r.timeline if row.kind == "C"), key=lambda x: x.start_ms)
    # each transfer: its latency on the link under the sender, then its bytes on the waiting receiver
    assert [(x.device, x.stage, x.microbatch) for x in comms] == [(0, 0, 0), (1, 1, 0), (1, 1, 0), (0, 0, 0)]
    assert [x.end_ms - x.start_ms for x in comms] == pytest.approx([lat, 1.0, lat, 1.0])
    assert comms[1].start_ms == pytest.approx(comms[0].end_ms)
    assert sum(r.busy_ms) == pytest.approx(6.0)  # transfers are not compute


def test_link_serialises_latencies_and_receiver_takes_bytes_in_turn() -> None:
    # GPipe, fast compute, slow link: the sender's forwards queue on link 0->1 (latency, FIFO);
    # the receiver takes each one's bytes only when it gets to that forward (torch posts the
    # receive just before it), so the forwards of stage 1 are 1 ms of bytes + 0.1 ms apart
    plan = _plan("gpipe", 2, 4, links=Links(bandwidth_bytes_per_s=1e6, latency_ms=0.2))
    r = simulate(plan, _profile(2, f=0.1, b=0.1, out=1000.0))
    backward = min(x.start_ms for x in r.timeline if x.kind == "B")
    # device 0's C rows before any backward are its sends (later ones receive the gradients)
    sends = sorted((x for x in r.timeline if x.kind == "C" and x.device == 0 and x.start_ms < backward),
                   key=lambda x: x.start_ms)
    assert [x.microbatch for x in sends] == [0, 1, 2, 3]
    for a, b in zip(sends, sends[1:]):
        assert b.start_ms == pytest.approx(max(a.end_ms, b.start_ms))
        assert b.end_ms - b.start_ms == pytest.approx(0.2)
    fwd1 = sorted((x for x in r.timeline if x.kind == "F" and x.stage == 1), key=lambda x: x.microbatch)
    assert fwd1[0].start_ms == pytest.approx(0.1 + 0.2 + 1.0)
    for a, b in zip(fwd1, fwd1[1:]):
        assert b.start_ms == pytest.approx(a.end_ms + 1.0)
    assert fwd1[-1].end_ms == pytest.approx(0.3 + 4 * 1.1)


def test_a_late_receiver_pays_the_bytes_when_it_gets_there() -> None:
    # 1f1b on 2 stages: stage 1 is busy with B0 when stage 0's F1 arrives; it takes F1's bytes
    # after B0, not while computing (the old model hid them behind B0 entirely)
    lat, bw, nbytes = 0.1, 1e6, 2000.0  # the bytes: 2 ms
    plan = _plan("1f1b", 2, 2, links=Links(bandwidth_bytes_per_s=bw, latency_ms=lat))
    r = simulate(plan, _profile(2, f=1.0, b=10.0, out=nbytes))
    row = {(x.stage, x.kind, x.microbatch): x for x in r.timeline if x.kind in "FB"}
    assert row[(1, "F", 1)].start_ms == pytest.approx(row[(1, "B", 0)].end_ms + 2.0)
    assert r.busy_ms[1] == pytest.approx(2 * (1.0 + 10.0))


def test_recompute_row_and_optimizer_close_the_iteration() -> None:
    prof = _profile(4, f=1.0, b=2.0, opt=0.25)
    plan = _plan("1f1b", 2, 2, per_stage=2)
    plan = plan.with_(stages=(dataclasses.replace(plan.stages[0], recompute=(1,)), plan.stages[1]))
    r = simulate(plan, prof)
    rows = [x for x in r.timeline if x.device == 0]
    for i, x in enumerate(rows):
        if x.kind == "R":
            nxt = rows[i + 1]
            assert (nxt.kind, nxt.microbatch, nxt.start_ms) == ("B", x.microbatch, x.end_ms)
            assert x.end_ms - x.start_ms == pytest.approx(1.0)
    assert sum(x.kind == "R" for x in rows) == 2
    opt = [x for x in r.timeline if x.kind == "O"]
    assert len(opt) == 2 and all(x.microbatch == -1 and x.end_ms - x.start_ms == pytest.approx(0.5) for x in opt)
    last_bwd = max(x.end_ms for x in rows if x.kind == "B")
    assert [x for x in opt if x.device == 0][0].start_ms == pytest.approx(last_bwd)
    assert r.iteration_ms == pytest.approx(max(x.end_ms for x in opt))


def test_calibration_scales_compute_and_replaces_the_default_link() -> None:
    plan = _plan("1f1b", 2, 4)  # pplan's default link stands for this machine's, which a calibration measures
    prof = _profile(2, out=1000.0)
    free_link = dict(comm_latency_ms=0.0, comm_bandwidth_bytes_per_s=1e15)
    base = simulate(plan, prof, calibration=Calibration(**free_link), record_timeline=False)
    assert base.iteration_ms == pytest.approx((4 + 1) * 3.0)
    cal = Calibration(compute_scale=2.0, action_overhead_ms=0.5, step_overhead_ms=3.0, **free_link)
    r = simulate(plan, prof, calibration=cal, record_timeline=False)
    assert r.iteration_ms == pytest.approx((4 + 1) * (2.5 + 4.5) + 3.0)
    assert simulate(plan, prof, record_timeline=False).iteration_ms > base.iteration_ms + 0.01


def test_a_link_the_plan_describes_wins_over_the_calibrations() -> None:
    plan = _plan("1f1b", 2, 4, links=Links(bandwidth_bytes_per_s=1e3, latency_ms=5.0))
    prof = _profile(2, out=1000.0)
    cal = Calibration(comm_latency_ms=0.0, comm_bandwidth_bytes_per_s=1e15)
    described = simulate(plan, prof, calibration=cal, record_timeline=False)
    assert described.iteration_ms == pytest.approx(simulate(plan, prof, record_timeline=False).iteration_ms)
    assert described.iteration_ms > (4 + 1) * 3.0 + 2 * (5.0 + 1000.0)


def test_interpolated_micro_batch_size_is_flagged() -> None:
    prof = _profile(2, sizes=(1, 4))
    assert simulate(_plan("gpipe", 2, 2, b=2), prof, record_timeline=False).interpolated
    r = simulate(_plan("gpipe", 2, 2, b=4), prof, record_timeline=False)
    assert not r.interpolated and r.iteration_ms == pytest.approx(3 * 4 * 3.0)


def test_deadlocked_schedule_raises() -> None:
    order = {0: (Action(0, "F", 0), Action(0, "B", 0)), 1: (Action(1, "B", 0), Action(1, "F", 0))}
    sch = PipelineSchedule("custom", 2, 2, 1, (0, 1), order)
    st_ = StageCost(0, 1, (), 1, 1, 0.5, 0.5, 0, 0, 0, 0, 1, 0, 0, 0)
    with pytest.raises(ScheduleError):
        simulate_costs(sch, [st_, st_], [0, 1], [Device("a"), Device("b")], Links(), micro_batch_size=1)


def test_to_dict_layout() -> None:
    d = simulate(_plan("1f1b", 2, 2), _profile(2, params=10.0)).to_dict()
    assert list(d) == ["iteration_ms", "bubble_fraction", "throughput_samples_per_s", "schedule", "n_microbatches",
                       "micro_batch_size", "interpolated", "devices", "memory_timeline", "what_if"]
    assert d["what_if"] is None  # the plan as it is: said, so a reader never takes a what-if for it
    dev = d["devices"][0]
    assert list(dev) == ["device", "name", "busy_ms", "idle_ms", "peak_memory_bytes", "memory", "memory_limit_bytes"]
    assert list(dev["memory"]) == ["weights", "gradients", "optimizer", "activations", "buffers", "total"]
    assert list(d["memory_timeline"]) == ["0", "1"]


_SIZES = st.tuples(st.sampled_from(["gpipe", "1f1b", "interleaved", "zb"]), st.integers(1, 5), st.integers(1, 12))


@settings(max_examples=60, deadline=None)
@given(sizes=_SIZES, seed=st.integers(0, 2**31), comm=st.booleans())
def test_random_plans_respect_dependencies(sizes, seed: int, comm: bool) -> None:
    name, P, M = sizes
    v = 2 if name == "interleaved" else 1
    if not valid_microbatches(name, P, M):
        return
    rng = np.random.default_rng(seed)
    S = P * v
    stages = []
    for s in range(S):
        f, b = rng.uniform(0.1, 3.0, 2)
        bi = b * rng.uniform(0.2, 0.8)
        nbytes = float(rng.uniform(0, 5e4)) if comm else 0.0
        stages.append(StageCost(s, s + 1, (), f, b, bi, b - bi, 0.0, float(rng.uniform(0, 1)), 0, 0, 1.0, 0.0,
                                nbytes if s else 0.0, nbytes if s < S - 1 else 0.0))
    perm = [int(x) for x in rng.permutation(P)]
    stage_device = [perm[s % P] for s in range(S)]
    sch = generate(name, P, M, v)
    r = simulate_costs(sch, stages, stage_device, [Device(f"d{i}") for i in range(P)],
                       Links(bandwidth_bytes_per_s=1e7, latency_ms=0.05), micro_batch_size=2, record_timeline=True)
    compute = [x for x in r.timeline if x.kind in "FBIW"]
    keys = [(x.stage, x.kind, x.microbatch) for x in compute]
    assert len(keys) == len(set(keys)) == sum(len(sch.actions(q)) for q in range(P))
    end = {(x.stage, x.kind, x.microbatch): x.end_ms for x in compute}
    start = {(x.stage, x.kind, x.microbatch): x.start_ms for x in compute}
    bk = "I" if name == "zb" else "B"
    for (s, k, m), t0 in start.items():
        if k == "F" and s == 0:
            continue
        if k == "F":
            need = (s - 1, "F", m)
        elif k in "BI" and s < S - 1:
            need = (s + 1, bk, m)
        else:
            need = (s, "F" if k in "BI" else "I", m)
        got = end[need]
        if stage_device[need[0]] != stage_device[s]:
            sends = [x.end_ms for x in r.timeline if x.kind == "C" and x.stage == need[0] and x.microbatch == m
                     and (x.start_ms >= end[need] - 1e-9)]
            got = min(sends) if sends else got
        assert t0 >= got - 1e-9, (s, k, m)
    by_dev: dict[int, list] = {}
    for x in r.timeline:
        if x.kind != "C":
            by_dev.setdefault(x.device, []).append(x)
    for rows in by_dev.values():
        rows.sort(key=lambda x: (x.start_ms, x.end_ms))
        for a, b in zip(rows, rows[1:]):
            assert b.start_ms >= a.end_ms - 1e-9
    assert r.iteration_ms >= max(x.end_ms for x in r.timeline) - 1e-9
    assert 0.0 <= r.bubble_fraction < 1.0
