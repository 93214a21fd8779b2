"""Records that are not what they claim: a plan's prediction made for another plan, a profile or a
calibration of another model, a timeline of another plan, a file of another kind, a seed out of
range. Each is named on one line (refused, or shown as a warning), never reported as this plan's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from planner.calibration import FORMAT as CALIBRATION_FORMAT, Calibration, calibration_mismatch, load_calibration
from planner.errors import PlanError, PplanError
from planner.execute.runfile import parse_run
from planner.jsonio import MAX_JSON_DEPTH, loads_strict, nearest
from planner.limits import MAX_SEED
from planner.plan import plan_from_dict
from planner.plan.records import MAX_PIPELINE_STAGES
from planner.plan.serialize import read_plan
from planner.profiling.metadata import read_meta
from planner.profiling.profile import load_profile
from planner.report.inputs import load_inputs, read_timeline_text
from planner.report.summary import key_numbers

DATA = Path(__file__).resolve().parents[1] / "reports" / "example" / "data"


def _plan_dict() -> dict:
    return json.loads((DATA / "plan.json").read_text())


def _run_dict() -> dict:
    return json.loads((DATA / "run.json").read_text())


# ---- a prediction made for another plan -------------------------------------------------------

def test_edited_schedule_drops_the_stale_prediction_with_a_note():
    d = _plan_dict()
    d["schedule"] = "gpipe"  # was 1f1b: the recorded numbers are 1f1b's
    plan, note = read_plan(d)
    assert plan.schedule == "gpipe" and plan.predicted is None and plan.search is None
    assert "schedule '1f1b' (the plan has 'gpipe')" in note
    assert plan_from_dict(d).predicted is None


def test_unedited_plan_keeps_its_prediction():
    plan, note = read_plan(_plan_dict())
    assert note is None and plan.predicted is not None and plan.search is not None


def test_report_warns_instead_of_showing_stale_numbers(tmp_path):
    d = _plan_dict()
    d["n_microbatches"], d["micro_batch_size"], d["global_batch"] = 4, 4, 16  # was 8 x 2
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(d))
    rows = dict(key_numbers(load_inputs(plan=path)))
    assert "n_microbatches 8 (the plan has 4)" in rows["warning"]
    assert "predicted iteration time" not in rows and not any(k.startswith("vs ") for k in rows)


# ---- sizes checked before records are read ----------------------------------------------------

def test_too_many_predicted_devices_refused_by_count_first():
    d = _plan_dict()
    # the first record is itself wrong: reading records first would name it instead of the count
    d["predicted"]["devices"] = [{"device": -1}] + [{}] * MAX_PIPELINE_STAGES
    with pytest.raises(PlanError, match=f"lists {MAX_PIPELINE_STAGES + 1} devices, more than a pipeline can have"):
        plan_from_dict(d)


def test_run_transfer_gaps_range_checked_by_the_reader():
    d = _run_dict()
    d["transfer_gaps"] = [[1e300, -1]]
    with pytest.raises(PplanError, match=r"'transfer_gaps\[0\]' bytes is 1e\+300"):
        parse_run(d, "run.json")
    d["transfer_gaps"] = [[1000, -1e9]]
    with pytest.raises(PplanError, match=r"'transfer_gaps\[0\]' ms is -1"):
        parse_run(d, "run.json")
    d["transfer_gaps"] = [[1000, -1]]  # what pplan wrote for zb with recompute before transfer_gaps was fixed
    assert parse_run(d, "run.json").transfer_gaps == [[1000, -1]]


# ---- timelines ---------------------------------------------------------------------------------

HEADER = "device,stage,kind,microbatch,start_ms,end_ms\n"


def test_timeline_of_another_plan_refused(tmp_path):
    timeline = tmp_path / "t.csv"
    timeline.write_text(HEADER + "0,0,F,0,0,1\n3,5,F,0,1,2\n")
    with pytest.raises(PplanError, match=r"row 2 .*device 3, stage 5 is outside the plan \(2 devices, 2 stages\)"):
        load_inputs(plan=DATA / "plan.json", timeline=timeline)
    load_inputs(timeline=timeline)  # without a plan there is nothing to hold it to


@pytest.mark.parametrize("header, message", [
    ("device,stage,knd,microbatch,start_ms,end_ms", "unknown column 'knd'; did you mean 'kind'"),
    ("device,stage,kind,microbatch,start_ms,end_ms,x", "unknown column 'x'"),
    ("device,stage,kind,microbatch,start_ms,end_ms,device", "column 'device' appears twice"),
])
def test_timeline_header_refuses_unknown_and_duplicate_columns(header, message):
    cells = ",".join("0" if name != "kind" else "F" for name in header.split(","))
    with pytest.raises(PplanError) as e:
        read_timeline_text(f"{header}\n{cells}\n", "t.csv")
    assert message in str(e.value)


# ---- a profile or calibration of another model ----------------------------------------------

def test_report_warns_when_the_profile_changed(tmp_path):
    profile = tmp_path / "profile.csv"
    shutil.copy(DATA / "profile.csv", profile)
    plain = dict(key_numbers(load_inputs(plan=DATA / "plan.json", profile=profile)))
    assert "warning" not in plain
    profile.write_text("# edited by hand\n" + profile.read_text())  # a comment: same numbers, another checksum
    rows = dict(key_numbers(load_inputs(plan=DATA / "plan.json", profile=profile)))
    assert rows["warning"] == f"{profile} differs from the profile the plan was made from (checksum changed)"


def test_calibration_records_and_names_the_model_it_was_fitted_on(tmp_path):
    profile = load_profile(DATA / "profile.csv")
    older = load_calibration(DATA / "profile.calibration.json")  # written before model was recorded
    assert calibration_mismatch(older, profile) is None
    fitted = Calibration(fitted_from={"model": "mlp:layers=8", "profile_sha256": "0" * 64})
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"format": CALIBRATION_FORMAT, "fitted_from": fitted.fitted_from.to_dict()}))
    assert load_calibration(path).fitted_from.model == "mlp:layers=8"
    assert "was fitted on model 'mlp:layers=8', not this profile's 'gpt:" in calibration_mismatch(fitted, profile, path)
    same_model = Calibration(fitted_from={"model": profile.meta["model"], "profile_sha256": "0" * 64})
    assert "fitted on another profile" in calibration_mismatch(same_model, profile)


# ---- files of another kind -------------------------------------------------------------------

def test_readers_name_a_file_of_another_kind(tmp_path):
    with pytest.raises(PlanError, match=r"this is a run file \(format 'pplan-run/1'\), not a plan"):
        plan_from_dict(_run_dict())
    sim = json.loads((DATA / "sim.json").read_text())
    with pytest.raises(PlanError, match="this is a simulation JSON .*, not a plan"):
        plan_from_dict(sim)
    with pytest.raises(PplanError, match=r"this is a plan file \(format 'pplan-plan/1'\), not a run"):
        parse_run(_plan_dict(), "plan.json")
    newer = tmp_path / "c2.json"
    newer.write_text('{"format": "pplan-calibration/2"}')
    with pytest.raises(PplanError, match=r"not a pplan-calibration/1 file \(its format is 'pplan-calibration/2'\)"):
        load_calibration(newer)


def test_nearest_prefers_a_name_that_starts_with_what_was_typed():
    presets = ("a100-40gb", "a100-80gb", "h100-80gb", "h200", "cpu")
    assert nearest("h100", presets) == "h100-80gb"
    assert nearest("h20", presets) == "h200"
    assert nearest("memroy_bytes", ("memory_bytes", "speed")) == "memory_bytes"


def test_depth_check_skips_brackets_inside_strings():
    deep = "[" * MAX_JSON_DEPTH
    # brackets inside strings, an escaped quote and an escaped backslash among them, do not nest
    text = deep + '"[[[\\"[[", "\\\\", "{{{"' + "]" * MAX_JSON_DEPTH
    assert loads_strict(text, "f.json", PplanError)  # 64 levels: read
    with pytest.raises(PplanError, match=f"nests deeper than {MAX_JSON_DEPTH} levels"):
        loads_strict("[" + text + "]", "f.json", PplanError)


# ---- seeds -------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [-1, MAX_SEED + 1])
def test_plan_seed_bounds(seed):
    d = _plan_dict()
    d["seed"] = seed
    with pytest.raises(PlanError, match=f"seed {seed} is out of range \\(0 to {MAX_SEED}\\)"):
        plan_from_dict(d)


def test_profile_seed_bound_is_the_plans():
    read_meta([f"# seed: {MAX_SEED}", "layer"], "p.csv")
    with pytest.raises(PplanError, match="out of range"):
        read_meta([f"# seed: {MAX_SEED + 1}", "layer"], "p.csv")
