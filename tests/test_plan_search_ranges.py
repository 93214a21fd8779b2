"""The numbers of a plan's `search` record (runners-up, baselines, at-plan-setting rows, per-stage
lists) are held to ranges, as `predicted`'s are: a fuzz audit loaded a bubble fraction of -5, a peak of
-1 bytes, a cut at layer 10**30 and a negative stage time with exit 0, for `pplan partition`'s tables
and `pplan report` to show. Each is now refused in one line naming the field path and the range;
every plan pplan writes still loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.errors import PlanError
from planner.limits import MAX_GLOBAL_BATCH
from planner.partition.search import POLISH_ROUNDS
from planner.plan import load_plan, plan_from_dict
from planner.plan.bounds import MAX_PIPELINE_STAGES, MAX_PLAN_LAYERS
from planner.plan.search_records import MAX_POLISH_MOVES, SearchRecord

GOLDEN = Path(__file__).resolve().parent / "data" / "golden_plans"
BASE = GOLDEN / "mlp-d2-250MiB.json"  # 8 layers, 2 devices; 6 runners-up, 3 baselines at the plan's setting


def _plan() -> dict:
    return json.loads(BASE.read_text())


def _set(d: dict, path: str, value) -> None:
    """d's value at `path` ('search/candidates/0/cuts/1', list indices as numbers) set to `value`."""
    *parents, last = [int(p) if p.isdigit() else p for p in path.split("/")]
    for key in parents:
        d = d[key]
    d[last] = value


@pytest.mark.parametrize("path, value, message", [
    ("search/candidates/0/bubble_fraction", -5, "search.candidates[0] field 'bubble_fraction' is -5, out of range (0 to 1)"),
    ("search/baselines/0/peak_memory_bytes", -1, "search.baselines[0] field 'peak_memory_bytes' is -1, out of range (0 to 1.15292e+18)"),
    ("search/candidates/1/cuts/1", 10**30, "search.candidates[1] field 'cuts[1]' is 1e+30, out of range (0 to 4000)"),
    ("search/candidates/1/cuts/0", -1, "search.candidates[1] field 'cuts[0]' is -1, out of range (0 to 4000)"),
    ("search/stage_ms/1", -4, "search field 'stage_ms[1]' is -4, out of range (0 to 1e+12)"),
    ("search/stage_memory_bytes/0", -1, "search field 'stage_memory_bytes[0]' is -1, out of range (0 to 1.15292e+18)"),
    ("search/device_order/0", 4000, "search field 'device_order[0]' is 4000, out of range (0 to 3999)"),
    ("search/candidates/0/slowdown_vs_plan", -1, "search.candidates[0] field 'slowdown_vs_plan' is -1, out of range (1e-09 to 1e+09)"),
    ("search/candidates/0/slowdown_vs_plan", 0, "search.candidates[0] field 'slowdown_vs_plan' is 0, out of range (1e-09 to 1e+09)"),
    ("search/baselines/1/bottleneck_ms", 1e308, "search.baselines[1] field 'bottleneck_ms' is 1e+308, out of range (0 to 1e+12)"),
    ("search/baselines/2/at_plan_setting/iteration_ms", -2.5,
     "search.baselines[2].at_plan_setting field 'iteration_ms' is -2.5, out of range (0 to 1e+12)"),
    ("search/baselines/2/at_plan_setting/peak_memory_bytes", 1e300,
     "search.baselines[2].at_plan_setting field 'peak_memory_bytes' is 1e+300, out of range (0 to 1.15292e+18)"),
    ("search/candidates/2/n_microbatches", 0, f"search.candidates[2] field 'n_microbatches' is 0, out of range (1 to {MAX_GLOBAL_BATCH})"),
    ("search/polish_moves", -1, f"search field 'polish_moves' is -1, out of range (0 to {MAX_POLISH_MOVES})"),
    ("search/bottleneck_stage", -1, "search field 'bottleneck_stage' is -1, out of range (0 to 3999)"),
])
def test_a_search_number_out_of_range_is_refused_naming_field_and_range(path: str, value, message: str) -> None:
    d = _plan()
    _set(d, path, value)
    with pytest.raises(PlanError) as e:
        plan_from_dict(d)
    assert e.value.message == message
    assert "\n" not in e.value.message and "pplan partition" in e.value.hint


def test_cuts_out_of_layer_order_are_refused() -> None:
    d = _plan()
    d["search"]["candidates"][1]["cuts"] = [0, 6, 4, 8]
    with pytest.raises(PlanError) as e:
        plan_from_dict(d)
    assert e.value.message == ("search.candidates[1] field 'cuts[2]' is 4, below 'cuts[1]' 6: "
                               "cuts are stage boundaries in layer order")
    d["search"]["candidates"][1]["cuts"] = [0, 4, 4, 8]  # non-decreasing is what is asked
    assert plan_from_dict(d).search.candidates[1].cuts == (0, 4, 4, 8)


def test_the_bottleneck_is_one_of_the_stages_listed() -> None:
    d = _plan()
    d["search"]["bottleneck_stage"] = 2
    with pytest.raises(PlanError) as e:
        plan_from_dict(d)
    assert e.value.message == "search field 'bottleneck_stage' is 2 but 'stage_ms' lists 2 stages (0 to 1)"


def test_the_ends_of_each_range_load() -> None:
    d = _plan()
    row = d["search"]["candidates"][0]
    row.update(bubble_fraction=0, peak_memory_bytes=0, slowdown_vs_plan=1e9, cuts=[0, MAX_PLAN_LAYERS])
    d["search"]["stage_ms"] = [0, 1e12]
    d["search"]["device_order"] = [MAX_PIPELINE_STAGES - 1, 0]
    search = SearchRecord.from_dict(d["search"], "search")  # the record's own bounds: the plan's layers are the plan's
    assert search.candidates[0].cuts == (0, MAX_PLAN_LAYERS) and search.stage_ms == (0, 1e12)


def test_cuts_past_the_plans_layers_are_named() -> None:
    d = _plan()
    d["search"]["baselines"][1]["cuts"] = [0, 4, 9]
    search = SearchRecord.from_dict(d["search"], "search")
    assert search.layer_count_error(8, "search") == \
        "search.baselines[1] field 'cuts' reaches layer 9 but the plan has 8 layers (0 to 8)"
    assert search.layer_count_error(9, "search") is None
    with pytest.raises(PlanError) as e:  # the plan holds its search to its own layers
        plan_from_dict(d)
    assert e.value.message == "search.baselines[1] field 'cuts' reaches layer 9 but the plan has 8 layers (0 to 8)"


@pytest.mark.parametrize("path", sorted(p for p in GOLDEN.glob("*.json") if not p.name.endswith(".sim.json")),
                         ids=lambda p: p.stem)
def test_every_golden_plan_loads_within_its_ranges(path: Path) -> None:
    plan = load_plan(path)
    assert plan.search is not None and plan.search.layer_count_error(plan.n_layers, "search") is None
    assert SearchRecord.from_dict(plan.search.to_dict(), "search") == plan.search


def test_the_polish_bound_covers_what_the_polish_can_make() -> None:
    # each move shifts one cut a layer; at most once each way per cut and pass
    assert MAX_POLISH_MOVES >= 2 * POLISH_ROUNDS * (MAX_PIPELINE_STAGES - 1)


def test_simulate_refuses_the_audits_plan_in_one_line(pplan, tmp_path: Path) -> None:
    d = _plan()
    d["profile"]["path"] = str(GOLDEN.parents[2] / "profiles" / "mlp.csv")
    d["search"]["stage_ms"] = [-3, -4]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(d))
    code, out, err = pplan("simulate", path, "-o", tmp_path / "out.json")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "search field 'stage_ms[0]' is -3, out of range (0 to 1e+12)" in err
    assert not (tmp_path / "out.json").exists()

