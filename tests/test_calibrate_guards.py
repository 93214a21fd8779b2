"""`pplan calibrate --from-run` refuses what it cannot fit from: a run of another plan, a run file
whose values no run measures, a fit whose values leave the calibration's ranges (in-process, no
processes: the records are built by hand)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from planner.errors import PplanError
from planner.execute.calibrate import calibrate_from_run_file, fit_from_run
from planner.execute.runfile import parse_run
from planner.execute.runrecord import RankRecord, RunRecord
from planner.execute.planmatch import RUN_OF_PLAN_HINT, plan_differences
from planner.plan import Device, Plan, StagePlan, write_plan
from planner.profiling.profile import make_profile, write_profile
from planner.simulate import plan_stage_costs

MODEL = "mlp:layers=4"


def _profile():
    n = 4
    cols = {"fwd_ms": np.array([[2.0], [3.0], [1.0], [4.0]]), "bwd_ms": np.array([[4.0], [6.0], [2.0], [8.0]]),
            "param_bytes": np.full((n, 1), 1000.0), "activation_bytes": np.full((n, 1), 500.0),
            "output_bytes": np.full((n, 1), 4000.0)}
    return make_profile([f"l{i}" for i in range(n)], [2], cols)


def _plan() -> Plan:
    return Plan(schedule="1f1b", micro_batch_size=2, n_microbatches=4,
                stages=(StagePlan(0, (0, 2)), StagePlan(1, (2, 4))), devices=(Device("a"), Device("b")), model=MODEL)


def _run(plan: Plan, profile, scale: float = 1.5, **changes) -> RunRecord:
    """A run of `plan` whose actions took `scale` x their profiled time (what the fit reads, the rest filled)."""
    stages, _ = plan_stage_costs(plan, profile)
    ranks = [RankRecord(rank=s, device=s, host="h", stages=[s], busy_ms=1.0,
                        action_ms={f"{s}F": scale * st.fwd_ms, f"{s}B": scale * st.bwd_ms})
             for s, st in enumerate(stages)]
    run = RunRecord(plan="plan.json", model=plan.model, schedule=plan.schedule, runtime="Schedule1F1B",
                    device_type="cpu", n_ranks=2, n_stages=2, micro_batch_size=plan.micro_batch_size,
                    n_microbatches=plan.n_microbatches, optimizer=plan.optimizer, steps=3, warmup=1,
                    iteration_ms_measured=100.0, iteration_ms_predicted=None, error_pct=None,
                    losses=[2.3, 2.2, 2.1], loss_steps=[0, 1, 2], step_ms=[120.0, 100.0, 100.0],
                    measured_steps=[1, 2], timeline_step=1, ranks=ranks,
                    boundary_bytes={"0": [16, 4000], "1": [4000, 8]})
    return replace(run, **changes)


@pytest.mark.parametrize("changes,says", [
    ({"schedule": "zb"}, "schedule zb vs 1f1b"),
    ({"n_microbatches": 8}, "n_microbatches 8 vs 4"),
    ({"micro_batch_size": 4}, "micro_batch_size 4 vs 2"),
    ({"model": "gpt:layers=2"}, f"model gpt:layers=2 vs {MODEL}"),
    ({"optimizer": "sgd"}, "optimizer sgd vs adam"),
    ({"stage_layers": [[0, 3], [3, 4]]}, "stage_layers [[0, 3], [3, 4]] vs [[0, 2], [2, 4]]"),  # same shape, cut elsewhere
    ({"stage_layers": [[0, 2], [2, 4]], "stage_recompute": [[1], []]}, "stage_recompute [[1], []] vs [[], []]"),
])
def test_a_run_of_another_plan_is_refused_naming_what_differs(changes, says):
    profile, plan = _profile(), _plan()
    with pytest.raises(PplanError, match="the run is of a different plan") as e:
        fit_from_run(_run(plan, profile, **changes), plan, profile, run_path="run.json", calibration_path="c.json")
    assert says in e.value.message and e.value.message.startswith("run.json: ")
    assert e.value.hint == RUN_OF_PLAN_HINT


def test_a_rank_that_ran_another_devices_stages_is_refused_and_the_plans_own_run_fits():
    profile, plan = _profile(), _plan()
    run = _run(plan, profile)
    assert plan_differences(run, plan) == []
    swapped = replace(run, ranks=[replace(run.ranks[0], stages=[1]), run.ranks[1]])
    with pytest.raises(PplanError, match=r"different plan: ranks\[0\]\.stages \[1\] vs \[0\] \(device 0\)"):
        fit_from_run(swapped, plan, profile, calibration_path="c.json")
    cal, fit = fit_from_run(run, plan, profile, calibration_path="c.json")
    assert cal.compute_scale == pytest.approx(1.5) and fit.measured_ms == 100.0


def test_a_fit_out_of_the_calibration_ranges_names_the_run():
    profile, plan = _profile(), _plan()
    with pytest.raises(PplanError, match=r"^run\.json: the run's times give calibration compute_scale"):
        fit_from_run(_run(plan, profile, scale=1e5), plan, profile, run_path="run.json", calibration_path="c.json")


@pytest.mark.parametrize("field,value,says", [
    ("schedule", "foo", "run field 'schedule' is 'foo', not one of gpipe, 1f1b, interleaved, zb"),
    ("micro_batch_size", 0, "run field 'micro_batch_size' is 0, not 1 or more"),
    ("n_ranks", 10**30, "run field 'n_ranks' is 1000000000000000000000000000000, not the 2 rank record(s)"),
    ("iteration_ms_measured", 1e308, "run field 'iteration_ms_measured' is 1e+308, not a time from 0 to"),
    ("measured_steps", [1, 99], "run field 'measured_steps' item 1 is 99, not in 0..2"),
    ("step_ms", [120.0, -1.0, 100.0], "run field 'step_ms' item 1 is -1.0, not a time"),
    ("boundary_bytes", {"7": [1, 2]}, "run field 'boundary_bytes' key is '7', not a stage of the run (0..1)"),
])
def test_the_run_reader_bounds_the_run_fields(field, value, says):
    data = _run(_plan(), _profile()).to_dict()
    parse_run(json.loads(json.dumps(data)), "run.json")  # the unmutated run reads
    with pytest.raises(PplanError) as e:
        parse_run(dict(data, **{field: value}), "run.json")
    assert e.value.message.startswith("run.json: " + says), e.value.message


@pytest.mark.parametrize("field,value,says", [
    ("busy_ms", -1, "ranks[0] field 'busy_ms' is -1, not a time"),
    ("peak_memory_bytes_measured", -1, "ranks[0] field 'peak_memory_bytes_measured' is -1, not a byte count"),
    ("stages", [5], "ranks[0] field 'stages' is 5, not in 0..1"),
    ("action_ms", {"0F": float("inf")}, "ranks[0] field 'action_ms'['0F'] is inf, not a time"),
])
def test_the_run_reader_bounds_the_rank_fields(field, value, says):
    data = _run(_plan(), _profile()).to_dict()
    data["ranks"][0][field] = value
    with pytest.raises(PplanError) as e:
        parse_run(data, "run.json")
    assert e.value.message.startswith("run.json: " + says), e.value.message


def test_calibrate_from_a_run_file_names_the_file_and_its_field(tmp_path):
    profile, plan = _profile(), _plan()
    write_profile(profile, tmp_path / "p.csv")
    plan = replace(plan, profile_path="p.csv")
    write_plan(plan, tmp_path / "plan.json")
    run_path = tmp_path / "run.json"
    run_path.write_text(json.dumps(_run(plan, profile, iteration_ms_measured=1e308).to_dict()))
    with pytest.raises(PplanError) as e:
        calibrate_from_run_file(tmp_path / "plan.json", run_path)
    assert e.value.message.startswith(f"{run_path}: run field 'iteration_ms_measured' is 1e+308"), e.value.message
    assert not (tmp_path / "p.calibration.json").exists()
    # the same files with the run of another plan: refused, nothing written
    run_path.write_text(json.dumps(_run(plan, profile, schedule="gpipe").to_dict()))
    with pytest.raises(PplanError) as e:
        calibrate_from_run_file(tmp_path / "plan.json", run_path)
    assert e.value.message == f"{run_path}: the run is of a different plan than {tmp_path / 'plan.json'}: schedule gpipe vs 1f1b"
    assert not (tmp_path / "p.calibration.json").exists()
    run_path.write_text(json.dumps(_run(plan, profile).to_dict()))
    cal, fit = calibrate_from_run_file(tmp_path / "plan.json", run_path)
    assert cal.compute_scale == pytest.approx(1.5) and (tmp_path / "p.calibration.json").exists()
