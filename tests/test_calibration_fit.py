"""The compute fit prices a point as the simulator prices its actions, and `fitted_from` is a record.

A split backward's I + W is one point of two actions: the simulator charges the per-action
overhead to I and to W (planner.cost.action_ms), so times made by its own model must give back
its own scale and overhead, and a run's compute ratio against them must be 1. Calibration files'
`fitted_from` is read as a FittedFrom, with the checks every pplan file gets.
"""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest

from planner.calibration import Calibration, FittedFrom, basis_text, load_calibration, write_calibration
from planner.cost import action_ms
from planner.errors import PplanError
from planner.execute.calibrate import compute_points, compute_ratio, fit_compute, fit_from_run
from planner.execute.runrecord import RankRecord, RunRecord
from planner.plan import Device, Plan, StagePlan
from planner.profiling.profile import make_profile
from planner.simulate import plan_stage_costs, simulate

TRUTH = Calibration(compute_scale=1.3, action_overhead_ms=0.4)


def _profile():
    cols = {
        "fwd_ms": np.array([[2.0], [3.0], [1.0], [4.0]]),
        "bwd_ms": np.array([[4.0], [6.0], [2.0], [8.0]]),
        "param_bytes": np.full((4, 1), 1000.0),
        "activation_bytes": np.full((4, 1), 500.0),
        "output_bytes": np.full((4, 1), 40_000.0),
    }
    return make_profile([f"l{i}" for i in range(4)], [2], cols)


def _zb_plan() -> Plan:
    return Plan(schedule="zb", micro_batch_size=2, n_microbatches=4,
                stages=(StagePlan(0, (0, 1)), StagePlan(1, (1, 3)), StagePlan(2, (3, 4))),
                devices=(Device("a"), Device("b"), Device("c")), model="mlp:layers=4")


def _simulated_actions(plan: Plan, prof, cal: Calibration) -> list[tuple[list[int], dict[str, float]]]:
    """Each rank's stages and action times exactly as the simulator prices F, I and W under `cal`."""
    stages, _ = plan_stage_costs(plan, prof)
    return [([s], {f"{s}F": action_ms(st.fwd_ms, cal), f"{s}I": action_ms(st.bwd_input_ms, cal),
                   f"{s}W": action_ms(st.bwd_weight_ms, cal)}) for s, st in enumerate(stages)]


@pytest.mark.parametrize("scale, overhead", [(1.0, 1.0), (1.3, 0.4), (0.7, 2.5)])
def test_points_made_by_the_simulators_model_give_back_its_scale_and_overhead(scale, overhead):
    points = [(x, scale * x + overhead, f"{s}F") for s, x in enumerate((10.0, 30.0))]
    points += [(x, scale * x + 2 * overhead, f"{s}I+W") for s, x in enumerate((20.0, 40.0))]
    assert fit_compute(points) == pytest.approx((scale, overhead), rel=1e-12)


def test_plain_forward_and_backward_points_are_fitted_as_before():
    """One action per point: the fit is the least-squares line, or the line through the origin when
    that line's intercept is negative (what fit_compute returned before I+W counted two actions)."""
    xs, ys = [1.0, 2.0, 5.0, 8.0], [1.7, 3.4, 7.9, 12.0]
    line = statistics.linear_regression(xs, ys)
    assert fit_compute([(x, y, f"{i % 2}{'FB'[i // 2]}") for i, (x, y) in enumerate(zip(xs, ys))]) == \
        pytest.approx((line.slope, line.intercept), rel=1e-12)
    xs, ys = [1.0, 2.0, 4.0], [0.5, 1.9, 4.1]
    assert statistics.linear_regression(xs, ys).intercept < 0
    assert fit_compute([(x, y, "0F") for x, y in zip(xs, ys)]) == \
        pytest.approx((statistics.linear_regression(xs, ys, proportional=True).slope, 0.0), rel=1e-12)


def test_a_zero_bubble_run_priced_by_the_simulator_is_fitted_exactly():
    prof, plan = _profile(), _zb_plan()
    ranks = _simulated_actions(plan, prof, TRUTH)
    measured = simulate(plan, prof, calibration=TRUTH, record_timeline=False).iteration_ms + 3.0
    run = RunRecord(plan=None, model=plan.model, schedule="zb", runtime="plan", device_type="cpu", n_ranks=3,
                    n_stages=3, micro_batch_size=2, n_microbatches=4, optimizer="adam", steps=3, warmup=1,
                    iteration_ms_measured=measured, iteration_ms_predicted=None, error_pct=None, losses=[],
                    loss_steps=[], step_ms=[measured], measured_steps=[0], timeline_step=0,
                    ranks=[RankRecord(rank=s, device=s, host="h", stages=st, busy_ms=0.0, action_ms=acts)
                           for s, (st, acts) in enumerate(ranks)])
    cal, fit = fit_from_run(run, plan, prof, calibration_path="c.calibration.json")
    assert (cal.compute_scale, cal.action_overhead_ms) == pytest.approx((1.3, 0.4), rel=1e-9)
    assert [p.action for p in fit.compute_points] == ["0F", "0I+W", "1F", "1I+W", "2F", "2I+W"]
    assert cal.step_overhead_ms == pytest.approx(3.0, rel=1e-9)  # what the run adds beyond the actions
    assert fit.error_pct_after == pytest.approx(0.0, abs=1e-9)


def test_a_run_priced_by_the_simulator_has_a_compute_ratio_of_one():
    prof, plan = _profile(), _zb_plan()
    ranks = _simulated_actions(plan, prof, TRUTH)
    assert {label for _, _, label in compute_points(ranks, plan, prof)} >= {"0I+W", "1I+W", "2I+W"}
    assert compute_ratio(ranks, plan, prof, TRUTH) == pytest.approx(1.0, rel=1e-12)


# ---- fitted_from -------------------------------------------------------------------------------

def test_fitted_from_is_a_record_that_round_trips(tmp_path):
    fitted = FittedFrom(run="run.json", schedule="zb", n_ranks=3, n_microbatches=4, measured_ms=120.5,
                        error_pct_before=-12.5, error_pct_after=0.0, model="mlp:layers=4", profile_sha256="ab" * 32)
    cal = Calibration(compute_scale=1.3, fitted_from=fitted)
    write_calibration(cal, tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text())["fitted_from"] == fitted.to_dict()
    assert load_calibration(tmp_path / "c.json") == cal
    assert "fitted on run.json" in basis_text(cal)
    write_calibration(Calibration(), tmp_path / "none.json")  # no fit: read back as none
    assert load_calibration(tmp_path / "none.json").fitted_from is None


def test_an_older_calibration_file_still_reads(tmp_path):
    """Written before model and profile_sha256 were recorded, and with an integer time."""
    path = tmp_path / "old.calibration.json"
    path.write_text(json.dumps({"format": "pplan-calibration/1", "compute_scale": 1.1, "fitted_from": {
        "run": None, "schedule": "1f1b", "n_ranks": 2, "n_microbatches": 4, "measured_ms": 100,
        "error_pct_before": None, "error_pct_after": 0.0}}))
    fitted = load_calibration(path).fitted_from
    assert fitted == FittedFrom(schedule="1f1b", n_ranks=2, n_microbatches=4, measured_ms=100, error_pct_after=0.0)
    assert fitted.model is None and fitted.run is None


@pytest.mark.parametrize("fitted, message", [
    ({"n_ranks": "2"}, r"fitted_from field 'n_ranks' must be an integer or null, got '2'"),
    ({"measured_ms": -1.0}, r"fitted_from field 'measured_ms' is -1, out of range \(0 to "),
    ({"n_microbatches": 0}, r"fitted_from field 'n_microbatches' is 0, out of range \(1 to "),
    ({"error_pct_after": -250.0}, r"fitted_from field 'error_pct_after' is -250, out of range \(-100 to "),
    ({"schedule": ["zb"]}, r"fitted_from field 'schedule' must be a string or null"),
    ({"measured_mss": 1.0}, r"fitted_from: unknown key 'measured_mss'"),
])
def test_a_fitted_from_value_of_the_wrong_type_or_range_is_refused_naming_it(tmp_path, fitted, message):
    path = tmp_path / "c.calibration.json"
    path.write_text(json.dumps({"format": "pplan-calibration/1", "fitted_from": fitted}))
    with pytest.raises(PplanError, match=message) as refused:
        load_calibration(path)
    assert refused.value.message.startswith(str(path)) and refused.value.hint


def test_fitted_from_checks_what_a_caller_builds_too():
    with pytest.raises(PplanError, match="did you mean 'measured_ms'"):
        FittedFrom.from_dict({"measured_mss": 1.0})
    with pytest.raises(PplanError, match="'n_ranks' is 0"):
        FittedFrom(n_ranks=0)
    with pytest.raises(PplanError, match="fitted_from must be an object, got 5"):
        Calibration(fitted_from=5)
