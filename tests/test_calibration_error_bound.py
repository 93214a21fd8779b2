"""A calibration records how far its fit is off: error_pct_before within MAX_ERROR_PCT_BEFORE and
error_pct_after within MAX_ERROR_PCT_AFTER. A fit beyond them (a run whose steps took 1e-300 ms) is
refused with the numbers before anything is written, and a file holding one is refused when read,
so `pplan simulate` never applies a calibration 10^304 % off its own run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planner.calibration import (
    MAX_ERROR_PCT_AFTER, MAX_ERROR_PCT_BEFORE, Calibration, FittedFrom, load_calibration, write_calibration,
)
from planner.errors import PplanError
from planner.execute.calibrate import calibrate_from_run_file
from planner.execute.runrecord import RankRecord, RunRecord
from planner.plan import Device, Plan, StagePlan, write_plan
from planner.profiling.profile import make_profile, write_profile
from planner.simulate import plan_stage_costs


def test_errors_within_the_bounds_are_kept():
    fitted = FittedFrom(measured_ms=312.7, error_pct_before=-73.7, error_pct_after=MAX_ERROR_PCT_AFTER)
    assert Calibration(fitted_from=fitted).fitted_from == fitted
    assert FittedFrom(error_pct_before=MAX_ERROR_PCT_BEFORE, error_pct_after=-100.0).error_pct_after == -100.0


@pytest.mark.parametrize("field,value,says", [
    ("error_pct_after", 2.516e304, "fitted_from field 'error_pct_after' is 2.516e+304, out of range (-100 to 100): "
                                   "a prediction +2.516e+304% off the run's measured 312.7 ms"),
    ("error_pct_after", 150.0, "fitted_from field 'error_pct_after' is 150, out of range (-100 to 100)"),
    ("error_pct_before", 8.2e303, "fitted_from field 'error_pct_before' is 8.2e+303, out of range (-100 to 1e+06)"),
    ("error_pct_before", -250.0, "fitted_from field 'error_pct_before' is -250, out of range (-100 to 1e+06)"),
])
def test_a_fit_further_off_is_refused_with_its_numbers(field, value, says):
    with pytest.raises(PplanError) as e:
        FittedFrom(measured_ms=312.7, **{field: value})
    assert says in e.value.message, e.value.message
    assert "--calibration none" in e.value.hint


def test_a_calibration_file_holding_one_is_refused_when_read(tmp_path):
    path = tmp_path / "p.calibration.json"
    write_calibration(Calibration(compute_scale=2.0, fitted_from=FittedFrom(measured_ms=312.7, error_pct_after=0.0)), path)
    data = json.loads(path.read_text())
    data["fitted_from"]["error_pct_after"] = 2.516e304
    path.write_text(json.dumps(data))
    with pytest.raises(PplanError) as e:
        load_calibration(path)
    assert e.value.message.startswith(f"{path}: calibration fitted_from field 'error_pct_after' is 2.516e+304")


def _files(tmp_path, step_ms: float):
    """A 2-stage plan and its profile on disk, and a run of it whose actions took 1.5 x their profiled
    time and whose every step took `step_ms` (the run agrees with itself: only the fit can tell)."""
    cols = {"fwd_ms": np.array([[2.0], [3.0], [1.0], [4.0]]), "bwd_ms": np.array([[4.0], [6.0], [2.0], [8.0]]),
            "param_bytes": np.full((4, 1), 1000.0), "activation_bytes": np.full((4, 1), 500.0),
            "output_bytes": np.full((4, 1), 4000.0)}
    profile = make_profile([f"l{i}" for i in range(4)], [2], cols)
    write_profile(profile, tmp_path / "p.csv")
    plan = Plan(schedule="1f1b", micro_batch_size=2, n_microbatches=4, model="mlp:layers=4", profile_path="p.csv",
                stages=(StagePlan(0, (0, 2)), StagePlan(1, (2, 4))), devices=(Device("a"), Device("b")))
    write_plan(plan, tmp_path / "plan.json")
    ranks = [RankRecord(rank=s, device=s, host="h", stages=[s], busy_ms=0.0,
                        action_ms={f"{s}F": 1.5 * st.fwd_ms, f"{s}B": 1.5 * st.bwd_ms})
             for s, st in enumerate(plan_stage_costs(plan, profile)[0])]
    run = RunRecord(plan="plan.json", model=plan.model, schedule="1f1b", runtime="Schedule1F1B", device_type="cpu",
                    n_ranks=2, n_stages=2, micro_batch_size=2, n_microbatches=4, optimizer="adam", steps=3, warmup=1,
                    iteration_ms_measured=step_ms, iteration_ms_predicted=None, error_pct=None, losses=[],
                    loss_steps=[], step_ms=[step_ms] * 3, measured_steps=[1, 2], timeline_step=1, ranks=ranks)
    (tmp_path / "run.json").write_text(json.dumps(run.to_dict()))
    return tmp_path / "plan.json", tmp_path / "run.json"


def test_a_fit_on_steps_of_1e_300_ms_is_refused_and_nothing_written(tmp_path):
    plan, run = _files(tmp_path, 1e-300)
    with pytest.raises(PplanError) as e:
        calibrate_from_run_file(plan, run)
    assert "fitted_from field 'error_pct_before' is " in e.value.message
    assert "off the run's measured 1e-300 ms" in e.value.message
    assert not (tmp_path / "p.calibration.json").exists()


def test_a_fit_on_a_plausible_run_is_written(tmp_path):
    plan, run = _files(tmp_path, 100.0)
    cal, fit = calibrate_from_run_file(plan, run)
    assert abs(fit.error_pct_after) <= MAX_ERROR_PCT_AFTER and cal.compute_scale == pytest.approx(1.5)
    assert load_calibration(tmp_path / "p.calibration.json") == cal
