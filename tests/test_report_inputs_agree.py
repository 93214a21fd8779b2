"""`pplan report` holds its inputs to each other and to what they say of themselves: a simulation and a
run of two plans are refused without --plan too, a file of another kind or a swapped pair of timelines
is named for what it is, each predicted value shows its own basis, and --no-simulate and a resumed run
are described as they are."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.errors import PplanError
from planner.report import build_report
from planner.report.agree import SIM_AND_RUN_HINT
from planner.report.inputs import load_inputs, read_timeline
from planner.report.summary import key_numbers

DATA = Path(__file__).parent / "data" / "report"  # a 1f1b plan (4 x 2, 2 devices), its simulation and run
HEADER = "device,stage,kind,microbatch,start_ms,end_ms\n"
MEASURED = HEADER + "0,0,F,0,0.5,10\n1,1,F,0,10.6,20\n0,-1,O,-1,20,21\n"
SIMULATED = HEADER + "0,0,F,0,0,10\n0,0,C,0,10,10.1\n1,1,F,0,10.1,20\n0,-1,O,-1,20,21\n"


def _edited(tmp_path: Path, name: str, **changes) -> Path:
    """The fixture file `name` with top-level `changes` made, written to tmp_path."""
    data = json.loads((DATA / name).read_text())
    data.update(changes)
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- a simulation and a run of two plans, given without the plan ----------------------------------

@pytest.mark.parametrize("changes,says", [
    ({"schedule": "zb"}, "schedule zb vs 1f1b"),
    ({"n_microbatches": 8, "micro_batch_size": 1}, "n_microbatches 8 vs 4, micro_batch_size 1 vs 2"),
])
def test_a_simulation_of_another_plan_than_the_run_is_refused_without_the_plan(tmp_path, changes, says):
    sim = _edited(tmp_path, "sim.json", **changes)
    with pytest.raises(PplanError) as e:
        load_inputs(sim=sim, run=DATA / "run.json")
    assert e.value.message == f"{sim}: the simulation is of a different plan than the run {DATA / 'run.json'}: {says}"
    assert e.value.hint == SIM_AND_RUN_HINT


def test_a_simulation_of_other_devices_than_the_run_is_refused(tmp_path):
    assert load_inputs(sim=DATA / "sim.json", run=DATA / "run.json").sim is not None  # the pair of one plan is drawn
    devices = json.loads((DATA / "sim.json").read_text())["devices"]
    one = _edited(tmp_path, "sim.json", devices=devices[:1])
    with pytest.raises(PplanError) as e:
        load_inputs(sim=one, run=DATA / "run.json")
    assert e.value.message.endswith("devices 1 vs 2")
    limited = _edited(tmp_path, "sim.json", devices=[dict(devices[0], memory_limit_bytes=2**30), devices[1]])
    run = json.loads((DATA / "run.json").read_text())
    run["ranks"][0]["memory_limit_bytes"] = 2**31
    (tmp_path / "run.json").write_text(json.dumps(run))
    # other memory limits are not another plan: `pplan simulate --hardware` prices a plan under its own
    # (and with --plan a simulation is not held to the plan's limits either)
    assert load_inputs(sim=limited, run=tmp_path / "run.json").sim is not None


def test_the_cli_refuses_the_pair_on_one_line_and_writes_nothing(pplan, tmp_path):
    out = tmp_path / "rep"
    code, stdout, stderr = pplan("report", "--sim", _edited(tmp_path, "sim.json", schedule="gpipe"),
                                 "--run", DATA / "run.json", "--out", out, "--formats", "png")
    assert code == 2 and stdout == "" and stderr.count("\n") == 1
    assert "the simulation is of a different plan than the run" in stderr and "schedule gpipe vs 1f1b" in stderr
    assert not out.exists() or not any(out.iterdir())


# ---- timelines: another kind of file, and a swapped pair ---------------------------------------------

@pytest.mark.parametrize("name,flag,says,hint", [
    ("run.json", "--timeline", "is a run JSON (by its format 'pplan-run/1'), not a timeline CSV", "pass it as --run"),
    ("sim.json", "--measured-timeline", "is a simulation JSON (by its first key iteration_ms), not a timeline CSV",
     "pass it as --sim"),
    ("plan.json", "--timeline", "is a plan JSON (by its format 'pplan-plan/1'), not a timeline CSV", "pass it as --plan"),
])
def test_a_file_of_another_kind_given_as_a_timeline_is_named_with_its_option(name, flag, says, hint):
    with pytest.raises(PplanError) as e:
        read_timeline(DATA / name, flag)
    assert e.value.message == f"{DATA / name} {says}"
    assert e.value.hint.startswith(hint) and f"as {flag} (" in e.value.hint


def test_json_of_no_pplan_kind_given_as_a_timeline_is_called_json(tmp_path):
    path = _write(tmp_path, "t.csv", '{"rows": []}')
    with pytest.raises(PplanError) as e:
        load_inputs(measured_timeline=path)
    assert e.value.message == f"{path} is JSON, not a timeline CSV" and "pplan run PLAN --timeline" in e.value.hint


def test_swapped_timelines_are_refused_with_the_swap_in_the_hint(tmp_path):
    measured, simulated = _write(tmp_path, "run.csv", MEASURED), _write(tmp_path, "sim.csv", SIMULATED)
    with pytest.raises(PplanError) as e:
        load_inputs(timeline=measured, measured_timeline=simulated)
    assert e.value.message == (f"{simulated}: row 2 is a C row (transfer), which only the simulator writes: "
                               "this is a simulated timeline, not a measured one")
    assert e.value.hint == f"the two timelines look swapped ({measured} has no such rows): pass --timeline " \
                           f"{simulated} --measured-timeline {measured}"
    with pytest.raises(PplanError, match="only the simulator writes") as alone:
        load_inputs(measured_timeline=simulated)
    assert alone.value.hint.startswith("pass it as --timeline")
    right = load_inputs(timeline=simulated, measured_timeline=measured)
    assert [r.kind for r in right.measured_timeline] == ["F", "F", "O"]


# ---- the basis of each predicted value --------------------------------------------------------------

def test_a_given_simulation_is_shown_with_its_own_basis_not_the_reports(tmp_path):
    sim = _edited(tmp_path, "sim.json", basis="uncalibrated (profile times as measured)")
    inputs = replace(load_inputs(plan=DATA / "plan.json", sim=sim), basis="calibrated by cal.json (compute x1.5)")
    rows = key_numbers(inputs)
    labels = [k for k, _ in rows]
    above = rows[labels.index("predicted iteration time (simulation)") - 1]
    assert above == (f"basis of the given simulation ({sim})", "uncalibrated (profile times as measured)")
    own = dict(rows)[f"basis of what the report simulates itself (not {sim})"]
    assert own == "calibrated by cal.json (compute x1.5)" and "basis of what the report simulates" not in labels
    unrecorded = key_numbers(load_inputs(sim=DATA / "sim.json"))  # a file written without its basis
    assert (f"basis of the given simulation ({DATA / 'sim.json'})", f"not recorded in {DATA / 'sim.json'}") in unrecorded


def test_the_reports_own_simulation_records_its_basis():
    from planner.report.derive import derive

    derived = derive(load_inputs(profile=DATA / "profile.csv", plan=DATA / "plan.json", calibration="none"))
    inputs = derived.inputs
    assert inputs.sim.basis == inputs.basis and inputs.basis.startswith("uncalibrated")
    rows = key_numbers(inputs)
    labels = [k for k, _ in rows]
    assert labels.index("basis of what the report simulates") < labels.index("predicted iteration time (simulation)")
    assert not any(k.startswith("basis of the given") for k in labels)


# ---- --no-simulate, and a resumed run's steps --------------------------------------------------------

def test_no_simulate_says_so_for_the_figures_a_simulation_would_draw(tmp_path):
    inputs = load_inputs(profile=DATA / "profile.csv", plan=DATA / "plan.json")
    report = build_report(inputs, tmp_path / "rep", formats=("png",), simulate=False)
    skipped = {f.number: f.skipped for f in report.figures if f.skipped}
    assert set(skipped) == {1, 2, 3, 6}
    for number in (1, 2, 3):
        assert "--no-simulate" in skipped[number] and "could not" not in skipped[number]


def test_a_resumed_runs_steps_are_numbered_from_its_first_step(tmp_path):
    from planner.report.fig_accuracy import draw

    data = json.loads((DATA / "run.json").read_text())
    run = _edited(tmp_path, "run.json", first_step=3, steps=data["steps"] + 3,
                  loss_steps=[s + 3 for s in data["loss_steps"]])
    fig = draw(load_inputs(run=run))
    steps_axis = fig.axes[2]
    n = len(data["step_ms"])
    assert list(steps_axis.lines[0].get_xdata()) == list(range(4, 4 + n))
    assert steps_axis.get_xlim() == (3.5, 3.5 + n)
