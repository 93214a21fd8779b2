"""Calibration fitting and the run JSON assembly, on hand-made measurements (no processes)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from planner.calibration import Calibration
from planner.cost import action_ms
from planner.execute.calibrate import fit_compute, fit_from_run
from planner.execute.commbench import fit_line
from planner.execute.fitrecord import CalibrationFit, ComputePoint
from planner.errors import PplanError
from planner.execute.measurement import ActionSpan, CommMeasurement, RankMeasurement, RankMemory
from planner.execute.results import assemble_record, error_pct
from planner.execute.runrecord import RankRecord, RunRecord
from planner.execute.timeline import measured_timeline, transfer_gaps
from planner.execute.trust import step_spread, trust_warnings
from planner.plan import Device, MemoryRecord, Plan, PredictedDevice, Prediction, StagePlan
from planner.profiling.profile import make_profile
from planner.simulate import plan_stage_costs, simulate


def _profile():
    L = 4
    cols = {
        "fwd_ms": np.array([[2.0], [3.0], [1.0], [4.0]]),
        "bwd_ms": np.array([[4.0], [6.0], [2.0], [8.0]]),
        "param_bytes": np.full((L, 1), 1000.0),
        "activation_bytes": np.full((L, 1), 500.0),
        "output_bytes": np.full((L, 1), 40_000.0),
    }
    return make_profile([f"l{i}" for i in range(L)], [2], cols)


def _plan(schedule="1f1b") -> Plan:
    return Plan(schedule=schedule, micro_batch_size=2, n_microbatches=4,
                stages=(StagePlan(0, (0, 1)), StagePlan(1, (1, 3)), StagePlan(2, (3, 4))),
                devices=(Device("a"), Device("b"), Device("c")), model="mlp:layers=4")


def _run(measured_ms: float, ranks: list[dict], schedule: str = "1f1b", **fields) -> RunRecord:
    """A run record of `_plan(schedule)` holding just what a calibration fit reads (the rest filled, unread)."""
    rank_records = [RankRecord(rank=r["rank"], device=r["rank"], host="h", stages=r["stages"], busy_ms=0.0,
                               action_ms=r["action_ms"]) for r in ranks]
    return RunRecord(plan=None, model="mlp:layers=4", schedule=schedule, runtime="Schedule1F1B", device_type="cpu",
                     n_ranks=len(ranks), n_stages=len(ranks), micro_batch_size=2, n_microbatches=4, optimizer="adam",
                     steps=3, warmup=1, iteration_ms_measured=measured_ms, iteration_ms_predicted=None, error_pct=None,
                     losses=[], loss_steps=[], step_ms=[measured_ms], measured_steps=[0], timeline_step=0,
                     ranks=rank_records, **fields)


def test_fit_line_recovers_latency_and_bandwidth():
    points = [(b, 0.05 + b / 2e9 * 1e3) for b in (256.0, 65536.0, 1048576.0)]
    lat, bw = fit_line(points)
    assert lat == pytest.approx(0.05, rel=1e-6)
    assert bw == pytest.approx(2e9, rel=1e-6)


def test_fit_compute_recovers_scale_and_overhead_and_falls_back_through_the_origin():
    pts = [(p, 1.5 * p + 0.3, "") for p in (1.0, 2.0, 5.0, 8.0)]
    assert fit_compute(pts) == pytest.approx((1.5, 0.3))
    # measured below a line with positive slope through the points: a negative overhead is
    # unphysical, so the fit goes through the origin instead
    scale, overhead = fit_compute([(1.0, 0.5, ""), (2.0, 1.9, ""), (4.0, 4.1, "")])
    assert overhead == 0.0 and 0.9 < scale < 1.1


def test_fit_calibration_recovers_what_produced_the_measurements():
    prof, plan = _profile(), _plan()
    truth = Calibration(compute_scale=1.3, action_overhead_ms=0.4, comm_latency_ms=0.2,
                        comm_bandwidth_bytes_per_s=1e9, step_overhead_ms=0.0)
    stages, _ = plan_stage_costs(plan, prof)
    measured = simulate(plan, prof, calibration=truth, record_timeline=False).iteration_ms + 3.0
    ranks = [{"rank": s, "stages": [s], "action_ms": {f"{s}F": action_ms(st.fwd_ms, truth),
                                                      f"{s}B": action_ms(st.bwd_ms, truth)}}
             for s, st in enumerate(stages)]
    run = _run(measured, ranks, comm=[CommMeasurement(a=0, b=1, latency_ms=0.01, bandwidth_bytes_per_s=1e9, points=[])],
               transfer_gaps=[[40_000.0, 0.2 + 40_000 / 1e9 * 1e3]] * 5)
    cal, fit = fit_from_run(run, plan, prof, calibration_path="c.calibration.json")
    assert cal.compute_scale == pytest.approx(1.3)
    assert cal.action_overhead_ms == pytest.approx(0.4)
    assert cal.comm_latency_ms == pytest.approx(0.2)  # the in-pipeline gaps, not the ping-pong
    assert cal.comm_bandwidth_bytes_per_s == pytest.approx(1e9)
    assert cal.step_overhead_ms == pytest.approx(3.0)
    assert fit.error_pct_after == pytest.approx(0.0, abs=1e-9)
    assert fit.error_pct_before < -10  # the identity calibration was far too optimistic
    assert cal.fitted_from.schedule == "1f1b" and cal.fitted_from.measured_ms == measured
    # the fit records the calibration's values (not where it was fitted) and every point it used
    assert fit.calibration == replace(cal, fitted_from=None) and fit.path == "c.calibration.json"
    assert [(p.action, p.profiled_ms) for p in fit.compute_points] == \
        [(f"{s}{k}", getattr(st, f"{'fwd' if k == 'F' else 'bwd'}_ms")) for s, st in enumerate(stages) for k in "FB"]


def test_split_backward_is_fitted_as_one_point():
    prof, plan = _profile(), _plan("zb")
    stages, _ = plan_stage_costs(plan, prof)
    # torch runs stage 0's whole backward in its W (its I has no input gradient to compute)
    ranks = [{"rank": s, "stages": [s], "action_ms": {f"{s}F": 2 * st.fwd_ms,
              f"{s}I": 0.0 if s == 0 else 2 * st.bwd_input_ms,
              f"{s}W": 2 * st.bwd_ms if s == 0 else 2 * st.bwd_weight_ms}} for s, st in enumerate(stages)]
    run = _run(100.0, ranks, schedule="zb")
    cal, fit = fit_from_run(run, plan, prof, calibration_path="c.calibration.json")
    assert cal.compute_scale == pytest.approx(2.0)
    assert [p.action for p in fit.compute_points] == ["0F", "0I+W", "1F", "1I+W", "2F", "2I+W"]
    assert cal.action_overhead_ms == pytest.approx(0.0, abs=1e-9)


def _record(rank: int, device: int, events, t0: float, host: str = "h", losses=None, step_ms=(9.0, 5.0, 7.0, 6.0),
            measured_steps=(1, 2, 3)) -> RankMeasurement:
    return RankMeasurement(rank=rank, device=device, host=host, stages=(rank,), runtime="Schedule1F1B", threads=1,
                           first_step=0, step_ms=tuple(step_ms), measured_steps=tuple(measured_steps), timeline_step=3,
                           timeline_t0=t0, events=tuple(ActionSpan(*e) for e in events), action_ms={},
                           action_cpu_ms={}, losses=losses or {},
                           memory=RankMemory(measure="tracked", peak_bytes=100, breakdown=MemoryRecord(total=100)),
                           boundary_bytes={rank: (8, 8)})


def test_timeline_shares_one_clock_on_one_machine_and_gaps_are_measured():
    r0 = _record(0, 0, [[0, "F", 0, 0.0, 1.0], [0, "B", 0, 4.0, 6.0], [0, "O", -1, 6.0, 6.5]], t0=10.0)
    r1 = _record(1, 1, [[1, "F", 0, 0.5, 2.0], [1, "B", 0, 2.0, 3.5], [1, "O", -1, 3.5, 4.0]], t0=10.0005)
    rows = measured_timeline([r0, r1])
    f1 = next(r for r in rows if r.device == 1 and r.kind == "F")
    assert f1.start_ms == pytest.approx(1.0)  # 0.5 ms after its own start, which was 0.5 ms later
    assert next(r for r in rows if r.kind == "O" and r.device == 0).stage == -1
    gaps = transfer_gaps(rows, 2, {"0": [0, 8], "1": [8, 0]})
    # F(0,0) ends at 1.0, F(1,0) starts at 1.0 -> 0; B(1,0) ends at 4.0, B(0,0) starts at 4.0 -> 0
    assert sorted(g for _, g in gaps) == pytest.approx([0.0, 0.0])
    # on two machines the clocks cannot be compared: each rank keeps its own origin
    far = measured_timeline([r0, replace(r1, host="other")])
    assert next(r for r in far if r.device == 1 and r.kind == "F").start_ms == pytest.approx(0.5)


def test_assemble_run_takes_the_median_of_the_measured_steps_and_compares():
    recs = [_record(1, 1, [], 0.0, losses={0: 2.0, 1: 1.5, 2: 1.2, 3: 1.0}),
            _record(0, 0, [[0, "F", 0, 0.0, 1.0], [0, "O", -1, 1.0, 1.5]], 0.0)]
    pred = Prediction(iteration_ms=5.0, devices=(PredictedDevice(device=0, busy_ms=1.0, peak_memory_bytes=90),
                                                 PredictedDevice(device=1, busy_ms=1.0, peak_memory_bytes=110)))
    run = assemble_record(recs, _plan(), plan_path="p.json", device_type="cpu", steps=4, warmup=1,
                          prediction=pred, prediction_source="test", calibration=None).to_dict()
    assert run["iteration_ms_measured"] == 6.0  # median of 5, 7, 6 (step 0 is warm-up)
    assert run["error_pct"] == pytest.approx(100 * (5 - 6) / 6)
    assert run["losses"] == [2.0, 1.5, 1.2, 1.0]
    assert [r["rank"] for r in run["ranks"]] == [0, 1]
    assert run["ranks"][0]["busy_ms"] == pytest.approx(1.5)
    assert run["ranks"][1]["peak_memory_bytes_predicted"] == 110
    assert error_pct(None, 3.0) is None and math.isclose(error_pct(3.3, 3.0), 10.0)



def _assembled(step_ms, **kw):
    measured = range(1, len(step_ms))
    recs = [_record(1, 1, [], 0.0, step_ms=step_ms, measured_steps=measured),
            _record(0, 0, [[0, "F", 0, 0.0, 1.0]], 0.0, step_ms=step_ms, measured_steps=measured),
            _record(2, 2, [], 0.0, losses={0: 2.0}, step_ms=step_ms, measured_steps=measured)]  # one per device
    return assemble_record(recs, _plan(), plan_path="p.json", device_type="cpu", steps=len(step_ms), warmup=1,
                           prediction=None, prediction_source=None, calibration=None, **kw)


def test_run_record_reports_the_spread_and_round_trips():
    rec = _assembled([90.0, 100.0, 104.0, 96.0], load_average=0.4, profile_load_average=0.5, compute_ratio=1.02)
    assert (rec.step_ms_min, rec.step_ms_median, rec.step_ms_max) == (96.0, 100.0, 104.0)
    assert rec.step_spread_pct == pytest.approx(8.0)
    assert rec.warnings == []  # steady, long enough, same load, actions as profiled
    d = rec.to_dict()
    assert list(d)[:3] == ["format", "plan", "model"] and "calibration_fit" not in d
    assert RunRecord.from_dict(json.loads(json.dumps(d))) == rec
    with pytest.raises(PplanError, match="did you mean 'step_spread_pct'"):
        RunRecord.from_dict(dict(d, step_spread=1.0))
    fit = CalibrationFit(measured_ms=100.0, predicted_ms_before=90.0, error_pct_before=-10.0, predicted_ms_after=100.0,
                         error_pct_after=0.0, compute_points=[ComputePoint("0F", 1.0, 1.25)], path="p.calibration.json",
                         calibration=Calibration(compute_scale=1.25))
    fitted = rec.with_(calibration=Calibration(comm_latency_ms=0.5), calibration_fit=fit)
    d = fitted.to_dict()
    assert list(d)[-1] == "calibration_fit" and d["calibration"]["comm_latency_ms"] == 0.5
    assert d["calibration_fit"]["compute_points"] == [{"action": "0F", "profiled_ms": 1.0, "measured_ms": 1.25}]
    assert RunRecord.from_dict(json.loads(json.dumps(d))) == fitted


def test_untrustworthy_runs_say_why_in_one_line_each():
    rec = _assembled([9.0, 10.0, 5.0, 9.0, 12.0], load_average=3.2, profile_load_average=0.3, compute_ratio=1.6)
    text = "\n".join(rec.warnings)
    assert len(rec.warnings) == 4 and all("\n" not in w for w in rec.warnings)
    assert "spread 74%" in text and "median step 9.5 ms is under 20 ms" in text
    assert "machine load 3.2 before the run, 0.3 when the profile was made" in text
    assert "1.60x their profiled time" in text
    assert trust_warnings(n_measured=1, median_ms=100.0, spread_pct=0.0, load=None, profile_load=None,
                          compute_ratio=None)[0].startswith("only 1 measured step")
    assert step_spread([1.0, 2.0], []) == (None, None, None, None)


@pytest.mark.parametrize("cpu,says", [(1.05, "1.05x in CPU time: the ranks waited for CPUs"),
                                      (1.9, "1.90x in CPU time: the computation itself ran slower"),
                                      (None, "the profile does not describe this run")])
def test_slow_actions_say_whether_the_cpu_time_agrees_with_the_profile(cpu, says):
    warn = trust_warnings(n_measured=5, median_ms=100.0, spread_pct=1.0, load=None, profile_load=None,
                          compute_ratio=2.0, compute_ratio_cpu=cpu)
    assert len(warn) == 1 and warn[0].startswith("actions took 2.00x their profiled time") and says in warn[0]
    rec = _assembled([90.0, 100.0, 104.0, 96.0], compute_ratio=2.0, compute_ratio_cpu=cpu)
    assert rec.compute_ratio_cpu == cpu and RunRecord.from_dict(json.loads(json.dumps(rec.to_dict()))) == rec
