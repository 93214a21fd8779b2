"""Typed records: a plan's `predicted` and `search` round-trip through JSON unchanged, their key
lists are their fields, a Plan is valid by construction, and the pandas views of profiles and
bench tables."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.bench.table import Table
from planner.errors import PlanError
from planner.plan.digest import plan_digest
from planner.plan import (
    PREDICTED_KEYS, SEARCH_KEYS, SEARCH_ROW_KEYS, AtPlanSetting, BaselineRow, Device, Plan, PredictedDevice,
    Prediction, SearchRecord, SearchRow, StagePlan, plan_from_dict, plan_to_json,
)
from planner.profiling.profile import OPTIONAL_COLUMNS, REQUIRED_COLUMNS, load_profile

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_PLAN = ROOT / "tests" / "data" / "report" / "plan.json"


def _two_stage(**changes) -> Plan:
    base = dict(schedule="1f1b", micro_batch_size=2, n_microbatches=4,
                stages=(StagePlan(0, (0, 2)), StagePlan(1, (2, 4))), devices=(Device("a"), Device("b")))
    return Plan(**{**base, **changes})


def test_key_lists_are_the_record_fields():
    assert PREDICTED_KEYS == tuple(f for f in Prediction.keys())
    assert SEARCH_KEYS == SearchRecord.keys() and SEARCH_ROW_KEYS == SearchRow.keys()
    assert BaselineRow.keys() == SearchRow.keys() + ("at_plan_setting",)


def test_written_plan_text_round_trips_through_the_records():
    text = GOLDEN_PLAN.read_text(encoding="utf-8")
    plan = plan_from_dict(json.loads(text))
    assert isinstance(plan.predicted, Prediction) and isinstance(plan.search, SearchRecord)
    assert isinstance(plan.predicted.devices[0], PredictedDevice)
    assert all(isinstance(r, BaselineRow) for r in plan.search.baselines)
    written = json.loads(plan_to_json(plan))
    # a file from before `made_for` is read as it was, and written again with what it is now made for
    assert "made_for" not in json.loads(text)["predicted"]
    assert written["predicted"].pop("made_for") == plan_digest(plan).to_dict()
    assert written == json.loads(text)
    assert plan_to_json(plan_from_dict(json.loads(plan_to_json(plan)))) == plan_to_json(plan)


def test_absent_and_null_are_written_as_the_producers_do():
    assert Prediction(iteration_ms=1.0).to_dict() == {"iteration_ms": 1.0, "throughput_samples_per_s": None}
    assert SearchRow(method="dp").to_dict()["iteration_ms"] is None and "cuts" not in SearchRow(method="dp").to_dict()
    assert BaselineRow(method="dp").to_dict()["at_plan_setting"] is None
    row = BaselineRow(method="dp", at_plan_setting=AtPlanSetting(fits=False))
    assert row.to_dict()["at_plan_setting"] == {"fits": False, "iteration_ms": None, "peak_memory_bytes": None}


@pytest.mark.parametrize("record,fragment", [
    ({"iteration_ms": "fast"}, "predicted field 'iteration_ms' must be a number or null, got 'fast'"),
    ({"devices": [{"busy": 1}]}, "predicted.devices[0]: unknown key 'busy'"),
    ({"devices": [{"memory": {"weight": 1}}]}, "predicted.devices[0].memory: unknown key 'weight'"),
    ({"interpolated": 1}, "predicted field 'interpolated' must be true or false or null, got 1"),
    # a dict built in Python (or by json.loads) may hold what the strict file reader refuses
    ({"iteration_ms": float("nan")}, "predicted field 'iteration_ms' must be finite, got nan"),
    ({"devices": [{"busy_ms": float("inf")}]}, "predicted.devices[0] field 'busy_ms' must be finite, got inf"),
    ({"devices": [{"memory": {"total": "1GB"}}]}, "predicted.devices[0].memory field 'total' must be a number or null"),
    ({"n_microbatches": 2.0}, "predicted field 'n_microbatches' must be an integer or null, got 2.0"),
    ({"devices": "two"}, "predicted field 'devices' must be a list of objects or null, got 'two'"),
    ({"devices": [3]}, "predicted field 'devices' must be a list of objects or null; item 0 is 3"),
    # in range: what the report would otherwise show as "700.0%", a 300-digit byte count or no row at all
    ({"bubble_fraction": 7}, "predicted field 'bubble_fraction' is 7, out of range (0 to 1)"),
    ({"iteration_ms": -1}, "predicted field 'iteration_ms' is -1, out of range (0 to 1e+12)"),
    ({"micro_batch_size": 0}, "predicted field 'micro_batch_size' is 0, out of range (1 to 100000000)"),
    ({"n_microbatches": 10**5, "micro_batch_size": 10**5}, "n_microbatches 100000 x micro_batch_size 100000 is more than"),
    ({"schedule": "foo"}, "predicted field 'schedule' 'foo' is unknown"),
    ({"devices": [{"device": 5000}]}, "predicted.devices[0] field 'device' is 5000, out of range (0 to 3999)"),
    ({"devices": [{"device": 0}, {"device": 0}]}, "predicted.devices[1]: device 0 is listed twice"),
    ({"devices": [{"peak_memory_bytes": 1e300}]}, "predicted.devices[0] field 'peak_memory_bytes' is 1e+300, out of range"),
    ({"devices": [{"memory": {"total": -1}}]}, "predicted.devices[0].memory field 'total' is -1, out of range"),
])
def test_bad_predictions_name_the_field(record, fragment):
    d = {"schedule": "1f1b", "micro_batch_size": 1, "n_microbatches": 2, "devices": 1,
         "stages": [{"layers": [0, 2]}], "predicted": record}
    with pytest.raises(PlanError) as e:
        plan_from_dict(d)
    assert fragment in str(e.value)


def test_search_rows_are_typed():
    d = {"schedule": "1f1b", "micro_batch_size": 1, "n_microbatches": 2, "devices": 1, "stages": [{"layers": [0, 2]}],
         "search": {"stage_ms": [1, "x"]}}
    with pytest.raises(PlanError, match=r"search field 'stage_ms' must be a list of numbers or null; item 1 is 'x'"):
        plan_from_dict(d)
    d["search"] = {"candidates": [{"method": "dp", "at_plan_setting": None}]}
    with pytest.raises(PlanError, match=r"search.candidates\[0\]: unknown key 'at_plan_setting'"):
        plan_from_dict(d)


def test_search_lists_refuse_non_finite_items_and_read_as_tuples():
    d = {"schedule": "1f1b", "micro_batch_size": 1, "n_microbatches": 2, "devices": 1, "stages": [{"layers": [0, 2]}],
         "search": {"stage_ms": [1.0, float("inf")]}}
    with pytest.raises(PlanError, match=r"search field 'stage_ms\[1\]' must be finite, got inf"):
        plan_from_dict(d)
    d["search"] = {"stage_ms": [1, 2.5], "candidates": [{"cuts": [0, 2]}]}
    search = plan_from_dict(d).search
    assert search.stage_ms == (1, 2.5) and search.candidates == (SearchRow(cuts=(0, 2)),)

def test_plan_is_valid_by_construction():
    assert _two_stage().n_stages == 2
    with pytest.raises(PlanError, match="overlaps"):
        _two_stage(stages=(StagePlan(0, (0, 2)), StagePlan(1, (1, 4))))
    with pytest.raises(PlanError, match="optimizer 'lion' is unknown"):
        _two_stage(optimizer="lion")
    with pytest.raises(PlanError, match="schedule 'pipedream' is unknown"):
        _two_stage().with_(schedule="pipedream")
    with pytest.raises(PlanError, match="model has 6 layers"):
        _two_stage().validate(n_layers=6)


def test_profile_to_frame_is_tidy():
    prof = load_profile(ROOT / "profiles" / "mlp.csv")
    df = prof.to_frame()
    assert len(df) == prof.n_layers * len(prof.micro_batch_sizes)
    assert list(df.columns) == list(REQUIRED_COLUMNS) + [c for c in OPTIONAL_COLUMNS if c in prof.present]
    row = df[(df.layer == 1) & (df.micro_batch_size == prof.micro_batch_sizes[-1])].iloc[0]
    assert row["name"] == prof.names[1]
    assert row["fwd_ms"] == prof.columns["fwd_ms"][1, -1]
    assert df["param_bytes"].dtype.kind == "i"


def test_table_to_frame():
    t = Table(name="t", title="T", columns=("a", "b"), rows=((1, 2.5), (2, None)))
    df = t.to_frame()
    assert list(df.columns) == ["a", "b"] and df["a"].tolist() == [1, 2] and df["b"].isna().tolist() == [False, True]


def test_planning_does_not_import_pandas():
    code = ("import sys, planner.plan, planner.partition, planner.simulate, planner.profiling.profile, planner.bench.table;"
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_byte_counts_may_be_written_as_any_number():
    """pplan writes whole numbers; a person editing a plan may write 16e9 (a float in JSON)."""
    d = {"schedule": "1f1b", "micro_batch_size": 1, "n_microbatches": 2, "devices": 1, "stages": [{"layers": [0, 2]}],
         "predicted": {"devices": [{"memory_limit_bytes": 16e9, "memory": {"total": 1.5e6}}]}}
    device = plan_from_dict(d).predicted.devices[0]
    assert device.memory_limit_bytes == 16e9 and device.memory.total == 1.5e6
