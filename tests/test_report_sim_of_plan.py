"""`pplan report --sim SIM --plan PLAN` refuses a simulation of another plan (schedule, micro-batches,
their size, devices), in the words it refuses a run of another plan: drawn as this plan's prediction
it would compare nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.errors import PplanError
from planner.report.inputs import SIM_OF_PLAN_HINT, load_inputs, sim_differences, load_sim
from planner.plan import load_plan

DATA = Path(__file__).parent / "data" / "report"


def _sim_file(tmp_path: Path, **changes) -> Path:
    """The fixture simulation (of the fixture plan) with `changes` made, written to a fresh file."""
    data = json.loads((DATA / "sim.json").read_text())
    data.update(changes)
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(data))
    return path


def test_the_fixture_simulation_is_of_its_plan():
    inputs = load_inputs(plan=DATA / "plan.json", sim=DATA / "sim.json")
    assert inputs.sim is not None and sim_differences(inputs.sim, inputs.plan) == []


@pytest.mark.parametrize("changes,says", [
    ({"schedule": "gpipe"}, "schedule gpipe vs 1f1b"),
    ({"n_microbatches": 7}, "n_microbatches 7 vs 4"),
    ({"micro_batch_size": 32}, "micro_batch_size 32 vs 2"),
    ({"schedule": "zb", "n_microbatches": 8}, "schedule zb vs 1f1b, n_microbatches 8 vs 4"),
])
def test_a_simulation_of_another_plan_is_refused_naming_each_difference(tmp_path, changes, says):
    sim = _sim_file(tmp_path, **changes)
    with pytest.raises(PplanError) as e:
        load_inputs(plan=DATA / "plan.json", sim=sim)
    assert e.value.message == f"{sim}: the simulation is of a different plan than {DATA / 'plan.json'}: {says}"
    assert e.value.hint == SIM_OF_PLAN_HINT


def test_a_simulation_listing_other_devices_is_refused(tmp_path):
    data = json.loads((DATA / "sim.json").read_text())
    sim = _sim_file(tmp_path, devices=data["devices"][:1])  # one device of the plan's two
    with pytest.raises(PplanError) as e:
        load_inputs(plan=DATA / "plan.json", sim=sim)
    assert e.value.message.endswith(f"the simulation is of a different plan than {DATA / 'plan.json'}: devices 1 vs 2")
    three = [*data["devices"], dict(data["devices"][-1], device=2)]
    assert sim_differences(load_sim(_sim_file(tmp_path, devices=three)), load_plan(DATA / "plan.json")) == \
        ["devices 3 vs 2"]


def test_a_simulation_alone_or_of_its_plan_is_drawn(tmp_path):
    alone = load_inputs(sim=_sim_file(tmp_path, schedule="gpipe"))  # no plan to hold it to
    assert alone.sim is not None and alone.sim.prediction.schedule == "gpipe"


def test_pplan_report_refuses_it_on_one_line(tmp_path, run_cli):
    sim = _sim_file(tmp_path, schedule="gpipe", n_microbatches=7)
    out = tmp_path / "out"
    res = run_cli("report", "--plan", DATA / "plan.json", "--sim", sim, "--out", out, "--formats", "png",
                  "--no-simulate")
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr
    assert res.stderr.strip() == (f"pplan: error: {sim}: the simulation is of a different plan than "
                                  f"{DATA / 'plan.json'}: schedule gpipe vs 1f1b, n_microbatches 7 vs 4; {SIM_OF_PLAN_HINT}")
    assert not (out / "report.md").exists()
