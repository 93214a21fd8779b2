"""Plan, cluster, hardware and calibration files from someone else: bounded before they are built,
and no name or text in them reaches the terminal raw.

A 61 MB plan listing 2.2 million stages used to be read whole, every stage built and then refused
(21-39 s, 1.1-1.3 GB). Now a plan file is at most MAX_PLAN_BYTES and each list's length is compared
with what such a plan can hold before any item is built; these tests see that by counting the
objects built (no timing). Names with ESC ] 0;title BEL, a newline or U+202E are refused at read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import planner.plan.serialize as serialize
from planner.calibration import Calibration, FittedFrom, load_calibration, write_calibration
from planner.cluster import MAX_CLUSTER_BYTES, cluster_from_dict, load_cluster
from planner.errors import ClusterError, PlanError, PplanError
from planner.hardware import PRESETS, hardware_from_dict
from planner.plan import Device, Links, Plan, StagePlan, load_plan, plan_from_dict, plan_to_json
from planner.plan.bounds import MAX_LINK_PAIRS, MAX_PIPELINE_STAGES, MAX_PLAN_BYTES, MAX_PLAN_LAYERS
from planner.plan.records import (
    AtPlanSetting, BaselineRow, MemoryRecord, PredictedDevice, Prediction, SearchRecord, SearchRow,
)

from helpers.cli import one_error_line

TITLE = "\x1b]0;pwned\x07"  # sets the terminal's title
HOSTILE_NAMES = [f"gpu{TITLE}", "gpu\nplan written to /tmp/x", "gpu\u202eevil", "gpu\x7f", "gpu\x9b31m"]


def _plan(**changes) -> dict:
    """A valid two-stage plan as parsed JSON, with `changes`."""
    base = {"schedule": "1f1b", "micro_batch_size": 1, "n_microbatches": 4, "devices": 2,
            "stages": [{"device": 0, "layers": [0, 3]}, {"device": 1, "layers": [3, 6]}]}
    return {**base, **changes}


def _refused(data: dict, *words: str) -> str:
    with pytest.raises(PlanError) as e:
        plan_from_dict(data)
    line = e.value.one_line()
    assert "\n" not in line and "\x1b" not in line and "\u202e" not in line, line
    for word in words:
        assert word in line, (word, line)
    return line


@pytest.fixture
def built(monkeypatch) -> dict[str, int]:
    """How many stages and devices the plan reader builds (a count, not a time)."""
    counts = {"stages": 0, "devices": 0}

    def counting(cls, key):
        def make(*args, **kwargs):
            counts[key] += 1
            return cls(*args, **kwargs)
        return make

    monkeypatch.setattr(serialize, "StagePlan", counting(StagePlan, "stages"))
    monkeypatch.setattr(serialize, "Device", counting(Device, "devices"))
    return counts


# ---- the bounds and why they hold -----------------------------------------------------------------

def test_the_plan_layer_bound_is_what_a_profile_can_hold():
    from planner.profiling.csvio import MAX_LAYERS

    assert MAX_PLAN_LAYERS == MAX_LAYERS == MAX_PIPELINE_STAGES


def _largest_plan() -> Plan:
    """The largest plan pplan can write: 4,000 one-layer stages on 4,000 devices, every record filled."""
    n = MAX_PIPELINE_STAGES
    devices = tuple(Device(f"node{i // 8:04d}-gpu{i % 8}-a100-80gb-sxm4", 85899345920, 1.0123456789) for i in range(n))
    mem = MemoryRecord(123456789012, 123456789012, 246913578024, 98765432109, 1234567890, 593827237047)
    predicted = Prediction(1358.02467901234, 0.0909090909090909, 94.2587601078167, "1f1b", 128, 1, False, tuple(
        PredictedDevice(i, devices[i].name, 1234.56789012345, 123.456789012345, 593827237047, mem, 85899345920)
        for i in range(n)))
    row = dict(method="dp", polish_moves=3, schedule="1f1b", n_microbatches=128, micro_batch_size=1, fits=True,
               iteration_ms=1400.123456789, bubble_fraction=0.0912345678, bottleneck_ms=10.123456789,
               peak_memory_bytes=593827237047, slowdown_vs_plan=1.0309876543, cuts=tuple(range(n + 1)))
    search = SearchRecord(
        method="auto", source="dp", polish_moves=3, optimal=True, objective="iteration time", recompute="auto",
        schedule="1f1b", n_microbatches=128, micro_batch_size=1, device_order=tuple(range(n)), bottleneck_stage=17,
        stage_ms=tuple(10.123456789 + i for i in range(n)), stage_memory_bytes=(593827237047,) * n, calibrated=False,
        candidates=tuple(SearchRow(**row) for _ in range(6)),
        baselines=tuple(BaselineRow(**row, at_plan_setting=AtPlanSetting(True, 1500.123456, 593827237047)) for _ in range(4)),
        skipped=tuple(f"interleaved M={m}: needs at least 2 stages per device" for m in range(8 * 1024)))
    return Plan(schedule="1f1b", micro_batch_size=1, n_microbatches=128, devices=devices,
                stages=tuple(StagePlan(i, (i, i + 1), (i,)) for i in range(n)),
                links=Links(pairs=tuple((i, i + 1, 3.0e11 + i, 0.00512345) for i in range(n - 1))),
                model="hf:gpt2:n_layer=4000", n_layers=n, profile_path="profiles/large.csv", profile_sha256="a" * 64,
                predicted=predicted, search=search)


def test_the_largest_plan_pplan_writes_is_far_below_the_byte_bound_and_reads_back(tmp_path):
    """MAX_PLAN_BYTES is chosen from this plan's size (about 5 MB): it must stay well inside it, and
    every count bound must let it through."""
    text = plan_to_json(_largest_plan())
    assert len(text.encode()) < MAX_PLAN_BYTES / 3
    path = tmp_path / "big.json"
    path.write_text(text)
    assert plan_to_json(load_plan(path)) == text


def test_a_plan_file_over_the_byte_bound_is_refused_before_parsing(tmp_path):
    path = tmp_path / "plan.json"
    with open(path, "wb") as fh:
        fh.truncate(MAX_PLAN_BYTES + 1)  # sparse: no 16 MiB is written
    with pytest.raises(PlanError, match=f"is {MAX_PLAN_BYTES + 1} bytes, more than the {MAX_PLAN_BYTES} bytes"):
        load_plan(path)


def test_the_report_bounds_a_plan_file_as_every_other_command_does(tmp_path):
    """`pplan report --plan` read plans under the general 64 MiB JSON bound: a 20 MiB plan that
    `pplan simulate` refused became a report."""
    from planner.report.inputs import load_inputs

    path = tmp_path / "plan.json"
    with open(path, "wb") as fh:
        fh.truncate(MAX_PLAN_BYTES + 1)
    with pytest.raises(PplanError, match=f"more than the {MAX_PLAN_BYTES} bytes"):
        load_inputs(plan=path)


# ---- lengths checked before anything is built ---------------------------------------------------

def test_more_stages_than_a_pipeline_has_are_refused_before_one_is_built(built):
    stages = [{"layers": [i, i + 1]} for i in range(MAX_PIPELINE_STAGES + 1)]
    _refused(_plan(devices=1, stages=stages), f"stages lists {MAX_PIPELINE_STAGES + 1:,} stages", "at most 4,000")
    assert built["stages"] == 0


def test_more_stages_than_the_plans_layers_are_refused(built):
    _refused(_plan(n_layers=1), "stages lists 2 stages", "n_layers 1")
    assert built["stages"] == 0


@pytest.mark.parametrize("n_layers", [0, MAX_PLAN_LAYERS + 1, 10**30])
def test_n_layers_out_of_range_is_refused(n_layers):
    _refused(_plan(n_layers=n_layers), f"n_layers {n_layers} is out of range")


def test_more_devices_than_a_pipeline_has_are_refused_before_one_is_built(built):
    devices = [{"name": f"d{i}"} for i in range(MAX_PIPELINE_STAGES + 1)]
    _refused(_plan(devices=devices), f"devices lists {MAX_PIPELINE_STAGES + 1} devices but the plan has 2 stages")
    assert built["devices"] == 0 and built["stages"] == 0


def test_more_link_pairs_than_device_pairs_are_refused(built):
    pair = {"a": 0, "b": 1, "bandwidth_bytes_per_s": 1e9, "latency_ms": 0.0}
    _refused(_plan(links={"pairs": [pair, pair]}), "links.pairs lists 2 pairs, more than the 1 pairs of its 2 devices")
    assert built["stages"] == 0
    many = [{"layers": [i, i + 1]} for i in range(1000)]
    _refused(_plan(devices=1000, stages=many, links={"pairs": [pair] * (MAX_LINK_PAIRS + 1)}),
             f"lists {MAX_LINK_PAIRS + 1:,} pairs", f"(or {MAX_LINK_PAIRS:,})")


def test_a_stage_past_the_last_layer_a_plan_can_have_is_refused():
    _refused(_plan(devices=1, stages=[{"layers": [0, MAX_PLAN_LAYERS + 1]}]), "goes past layer 4000")


def test_a_recompute_list_longer_than_its_stage_is_refused_before_its_items_are_read():
    stages = [{"device": 0, "layers": [0, 3], "recompute": ["x"] * 4}, {"device": 1, "layers": [3, 6]}]
    _refused(_plan(stages=stages), "stages[0].recompute lists 4 layers but the stage [0, 3) has 3")


def test_a_recompute_list_naming_a_layer_twice_is_refused_naming_it():
    stages = [{"device": 0, "layers": [0, 3]}, {"device": 1, "layers": [3, 6], "recompute": [5, 4, 5]}]
    _refused(_plan(stages=stages), "stages[1].recompute lists layer 5 twice")


def test_recompute_lists_are_still_read_sorted():
    stages = [{"device": 0, "layers": [0, 3], "recompute": [2, 0]}, {"device": 1, "layers": [3, 6]}]
    assert plan_from_dict(_plan(stages=stages)).stages[0].recompute == (0, 2)


def test_search_rows_with_more_cuts_than_a_pipeline_has_are_refused():
    row = {"method": "dp", "cuts": list(range(MAX_PIPELINE_STAGES + 2))}
    _refused(_plan(search={"candidates": [row]}), f"field 'cuts' lists {MAX_PIPELINE_STAGES + 2} items")


def test_an_integer_beyond_a_float_from_python_is_a_plan_error_not_an_overflow():
    _refused(_plan(links={"bandwidth_bytes_per_s": 10**400}), "bandwidth_bytes_per_s is out of range (401 digits)")


def test_uneven_device_use_names_one_device_not_every_stage():
    stages = [{"device": 0, "layers": [i, i + 1]} for i in range(2999)] + [{"device": 1, "layers": [2999, 3000]}]
    line = _refused(_plan(stages=stages), "device 0 runs 2999 stage(s), but each of the 2 devices must run 1500")
    assert len(line) < 300


# ---- names and text a terminal shows -------------------------------------------------------------

@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_device_name_with_control_characters_is_refused(name):
    _refused(_plan(devices=[{"name": name}, {"name": "ok"}]), "devices[0].name", "control character")


@pytest.mark.parametrize("where, change", [
    ("model", {"model": f"mlp{TITLE}"}),
    ("profile.path", {"profile": {"path": "p\n.csv"}}),
    ("profile.sha256", {"profile": {"sha256": "ab\u202ecd"}}),
    ("parallel.hardware", {"parallel": {"dp": 1, "pp": 2, "tp": 1, "hardware": f"h100{TITLE}"}}),
    ("predicted.devices[0]: field 'name'", {"predicted": {"devices": [{"device": 0, "name": f"d{TITLE}"}]}}),
    ("search: field skipped[1]", {"search": {"skipped": ["fine", f"M=2{TITLE}"]}}),
    ("search.candidates[0]: field 'note'", {"search": {"candidates": [{"note": "a\nb"}]}}),
    ("search: field 'objective'", {"search": {"objective": "x" * 300_000}}),
])
def test_text_a_plan_holds_is_one_safe_line(where, change):
    _refused(_plan(**change), where)


def test_the_cli_refuses_a_hostile_device_name_on_one_escaped_line(tmp_path, pplan):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_plan(devices=[{"name": f"gpu{TITLE}"}, {"name": "b"}])))
    code, out, err = pplan("simulate", str(path))
    line = one_error_line(code, err)
    assert "\x1b" not in out + err and "\x07" not in out + err and "\\x1b" in line


# ---- cluster files ------------------------------------------------------------------------------

def _cluster(**changes) -> dict:
    return {"devices": [{"name": "a"}, {"name": "b"}], **changes}


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_cluster_device_name_with_control_characters_is_refused(name):
    with pytest.raises(ClusterError, match="control character") as e:
        cluster_from_dict(_cluster(devices=[{"name": name}]))
    assert "\x1b" not in e.value.one_line() and "\n" not in e.value.one_line()


@pytest.mark.parametrize("data, says", [
    (_cluster(devices=[{"name": f"d{i}"} for i in range(MAX_PIPELINE_STAGES + 1)]), "lists 4,001 devices"),
    (_cluster(links=[{}] * (MAX_LINK_PAIRS + 1)), f"lists {MAX_LINK_PAIRS + 1:,} links"),
    (_cluster(links=[{"a": "a" * 100_000, "b": "b", "bandwidth": 1e9}]), "names unknown device 'aaaa"),
    (_cluster(links=[{"a": ["a"], "b": "b", "bandwidth": 1e9}]), "names unknown device ['a']"),
    (_cluster(default_link=[]), "'default_link' must be an object"),
])
def test_cluster_lists_and_links_are_bounded(data, says):
    with pytest.raises(ClusterError) as e:
        cluster_from_dict(data)
    assert says in e.value.one_line() and len(e.value.one_line()) < 600


def test_a_cluster_file_over_its_byte_bound_is_refused(tmp_path):
    path = tmp_path / "cluster.json"
    with open(path, "wb") as fh:
        fh.truncate(MAX_CLUSTER_BYTES + 1)
    with pytest.raises(ClusterError, match=f"more than the {MAX_CLUSTER_BYTES} bytes"):
        load_cluster(path)


def test_links_between_is_undirected_and_the_first_listed_pair_wins():
    links = Links(bandwidth_bytes_per_s=1.0, latency_ms=2.0, pairs=((3, 1, 10.0, 0.5), (1, 3, 20.0, 0.7), (0, 2, 5.0, 0.1)))
    assert links.between(1, 3) == links.between(3, 1) == (10.0, 0.5)
    assert links.between(2, 0) == (5.0, 0.1) and links.between(0, 1) == (1.0, 2.0)


# ---- hardware and calibration files -------------------------------------------------------------

@pytest.mark.parametrize("key, value", [("name", "h100\u202e"), ("name", f"gpu{TITLE}"), ("source", f"sheet{TITLE}"),
                                        ("source", "a\x7fb"), ("name", "n" * 201)])
def test_hardware_text_is_one_safe_line(key, value):
    data = {**PRESETS["h100-80gb"].to_dict(), key: value}
    with pytest.raises(ClusterError, match=f"{key} must be one line") as e:
        hardware_from_dict(data, "hw.json")
    assert "\x1b" not in e.value.one_line() and "\u202e" not in e.value.one_line()


def test_the_longest_preset_source_still_loads():
    for hw in PRESETS.values():
        assert hardware_from_dict(hw.to_dict()) == hw


@pytest.mark.parametrize("field", ["run", "schedule", "model", "profile_sha256"])
def test_calibration_fitted_from_text_is_one_safe_line(tmp_path, field):
    path = tmp_path / "cal.json"
    write_calibration(Calibration(fitted_from=FittedFrom(run="run.json", schedule="1f1b")), path)
    data = json.loads(path.read_text())
    data["fitted_from"][field] = f"x{TITLE}"
    path.write_text(json.dumps(data))
    with pytest.raises(PplanError, match="control character") as e:
        load_calibration(path)
    assert "\x1b" not in e.value.one_line()


def test_a_calibration_file_over_a_mebibyte_is_refused(tmp_path):
    path = tmp_path / "cal.json"
    write_calibration(Calibration(compute_scale=1.5), path)
    assert len(path.read_bytes()) < 1000 and load_calibration(path).compute_scale == 1.5
    with open(path, "ab") as fh:
        fh.write(b" " * (1 << 20))
    with pytest.raises(PplanError, match="bytes, more than the 1048576 bytes"):
        load_calibration(Path(path))
