"""`pplan calibrate --from-run` fits only on the profile the plan was made from (another one, or
the plan's own file changed since, refused as `pplan run` refuses it, unless --force), and its
error line says what "before" was against: the calibration the fit replaces, else the one the run
recorded (a machine file's, where `pplan run --calibrate` starts too), else uncalibrated,
with the run's own recorded error beside it when that differs. In-process; the plan, profile and
run are built by hand (no ranks run)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from planner.calibration import Calibration, write_calibration
from planner.execute.results import error_pct
from planner.execute.runrecord import RankRecord, RunRecord
from planner.plan import Device, Plan, StagePlan, load_plan, write_plan
from planner.profiling.profile import make_profile, write_profile
from planner.simulate import plan_stage_costs, simulate

MEASURED_MS = 200.0


def _profile(fwd_first: float = 2.0):
    n = 4
    cols = {"fwd_ms": np.array([[fwd_first], [3.0], [1.0], [4.0]]), "bwd_ms": np.array([[4.0], [6.0], [2.0], [8.0]]),
            "param_bytes": np.full((n, 1), 1000.0), "activation_bytes": np.full((n, 1), 500.0),
            "output_bytes": np.full((n, 1), 4000.0)}
    return make_profile([f"l{i}" for i in range(n)], [2], cols)


def _run(plan: Plan, profile, **changes) -> RunRecord:
    """A run of `plan` whose actions took 1.5 x their profiled time."""
    stages, _ = plan_stage_costs(plan, profile)
    ranks = [RankRecord(rank=s, device=s, host="h", stages=[s], busy_ms=1.0,
                        action_ms={f"{s}F": 1.5 * st.fwd_ms, f"{s}B": 1.5 * st.bwd_ms})
             for s, st in enumerate(stages)]
    run = RunRecord(plan="plan.json", model=plan.model, schedule=plan.schedule, runtime="Schedule1F1B",
                    device_type="cpu", n_ranks=2, n_stages=2, micro_batch_size=plan.micro_batch_size,
                    n_microbatches=plan.n_microbatches, optimizer=plan.optimizer, steps=3, warmup=1,
                    iteration_ms_measured=MEASURED_MS, iteration_ms_predicted=47.1, error_pct=-52.9,
                    prediction_source="simulate(profile + calibration)",
                    losses=[2.3, 2.2, 2.1], loss_steps=[0, 1, 2], step_ms=[220.0, MEASURED_MS, MEASURED_MS],
                    measured_steps=[1, 2], timeline_step=1, ranks=ranks,
                    boundary_bytes={"0": [16, 4000], "1": [4000, 8]})
    return replace(run, **changes)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """tmp_path with p.csv, plan.json (made from p.csv: its sha256 recorded) and run.json (a run of it)."""
    profile = _profile()
    sha = write_profile(profile, tmp_path / "p.csv")
    plan = Plan(schedule="1f1b", micro_batch_size=2, n_microbatches=4, stages=(StagePlan(0, (0, 2)), StagePlan(1, (2, 4))),
                devices=(Device("a"), Device("b")), model="mlp:layers=4", profile_path="p.csv", profile_sha256=sha)
    write_plan(plan, tmp_path / "plan.json")
    (tmp_path / "run.json").write_text(json.dumps(_run(plan, profile).to_dict()))
    return tmp_path


def _calibrate(pplan, files: Path, *args: object) -> tuple[int, str, str]:
    return pplan("calibrate", files / "plan.json", "--from-run", files / "run.json", *args)


def test_another_profile_is_refused_unless_forced(pplan, files):
    (files / "alt").mkdir()
    write_profile(_profile(fwd_first=2.5), files / "alt" / "syn.csv")
    code, out, err = _calibrate(pplan, files, "--profile", files / "alt" / "syn.csv")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"profile {str(files / 'alt' / 'syn.csv')!r} differs from the profile the plan was made from (sha256 " in err
    assert "pass --force to fit this one anyway" in err
    assert not (files / "alt" / "syn.calibration.json").exists()
    code, out, err = _calibrate(pplan, files, "--profile", files / "alt" / "syn.csv", "--force")
    assert code == 0, err
    assert (files / "alt" / "syn.calibration.json").exists()


def test_the_plans_own_profile_changed_since_is_refused(pplan, files):
    write_profile(_profile(fwd_first=2.5), files / "p.csv")
    code, _, err = _calibrate(pplan, files)
    assert code == 2
    assert f"profile {str(files / 'p.csv')!r} changed since the plan was made (sha256 " in err and "--force" in err
    assert not (files / "p.calibration.json").exists()


def test_the_plans_profile_given_by_name_fits(pplan, files):
    code, _, err = _calibrate(pplan, files, "--profile", files / "p.csv")
    assert code == 0, err
    assert (files / "p.calibration.json").exists()


def test_before_names_the_calibration_it_replaces_and_the_runs_own_error(pplan, files):
    write_calibration(Calibration(compute_scale=1.2), files / "p.calibration.json")
    code, out, err = _calibrate(pplan, files)
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("prediction error on"))
    assert f"(with {files / 'p.calibration.json'}, the calibration this fit replaces; " in line
    assert "the run's own prediction, simulate(profile + calibration), was -52.9%)" in line
    assert line.endswith("after +0.0%")


def test_before_says_uncalibrated_and_agrees_with_the_run(pplan, files):
    """No calibration beside the profile, and the run predicted uncalibrated: one number, named."""
    plan_path, run_path = files / "plan.json", files / "run.json"
    predicted = simulate(load_plan(plan_path), _profile(), record_timeline=False).iteration_ms
    run = json.loads(run_path.read_text())
    run.update(iteration_ms_predicted=predicted, error_pct=error_pct(predicted, MEASURED_MS),
               prediction_source="simulate(profile)")
    run_path.write_text(json.dumps(run))
    code, out, err = _calibrate(pplan, files)
    assert code == 0, err
    before = f"{error_pct(predicted, MEASURED_MS):+.1f}%"
    assert (f"prediction error on {run_path}: before {before} (uncalibrated: no calibration was beside the profile, "
            "nor in the run; the same as the run's own prediction), after +0.0%") in out


def test_without_a_file_beside_the_profile_the_fit_starts_from_the_runs_calibration(pplan, files):
    """As `pplan run --calibrate` does: the run predicted with a machine file's entry, whose
    hand-over terms the fit cannot see and keeps; refitted from nothing they were lost."""
    plan_path, run_path = files / "plan.json", files / "run.json"
    machine = Calibration(compute_scale=1.2, handover_cpu_ms=0.3, handover_cpu_ms_per_mib=0.05)
    predicted = simulate(load_plan(plan_path), _profile(), calibration=machine, record_timeline=False).iteration_ms
    run = _run(load_plan(plan_path), _profile(), calibration=machine, iteration_ms_predicted=predicted,
               error_pct=error_pct(predicted, MEASURED_MS), prediction_source="simulate(profile + machine file, 2 ranks)")
    run_path.write_text(json.dumps(run.to_dict()))
    code, out, err = _calibrate(pplan, files)
    assert code == 0, err
    before = f"{error_pct(predicted, MEASURED_MS):+.1f}%"
    assert (f"before {before} (with the calibration the run recorded, as no calibration was beside the profile; "
            "the same as the run's own prediction), after +0.0%") in out
    written = json.loads((files / "p.calibration.json").read_text())
    assert written["handover_cpu_ms"] == 0.3 and written["handover_cpu_ms_per_mib"] == 0.05
    code, out, err = _calibrate(pplan, files, "--json")  # now the file written above is the basis
    assert json.loads(out)["calibration_before_from_run"] is False


def test_json_says_what_before_was_against(pplan, files):
    write_calibration(Calibration(compute_scale=1.2), files / "p.calibration.json")
    code, out, err = _calibrate(pplan, files, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["calibration_before"] == str(files / "p.calibration.json") and data["calibration_before_from_run"] is False
    assert data["run_error_pct"] == -52.9 and data["run_prediction_source"] == "simulate(profile + calibration)"


def test_a_run_without_a_prediction_says_so(pplan, files):
    run = json.loads((files / "run.json").read_text())
    run.update(iteration_ms_predicted=None, error_pct=None, prediction_source=None)
    (files / "run.json").write_text(json.dumps(run))
    code, out, err = _calibrate(pplan, files)
    assert code == 0, err
    assert "(uncalibrated: no calibration was beside the profile, nor in the run; the run recorded no prediction of its own)" in out
