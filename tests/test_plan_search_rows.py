"""The lists of a plan's `search` record are counted before any item is read: a hand-made plan with
150,000 candidate rows took 44.6 s to load, row by row. Refused past MAX_SEARCH_ROWS (and the other
lists past theirs) in one line; pplan's own plans list a few rows and load as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.errors import PlanError
from planner.plan import plan_from_dict
from planner.plan.records import MAX_PIPELINE_STAGES, MAX_SEARCH_ROWS, MAX_SKIPPED, SearchRecord

DATA = Path(__file__).resolve().parent / "data"
ROW = {"method": "dp", "fits": True, "iteration_ms": 10.0, "cuts": [0, 2, 4, 6]}


@pytest.mark.parametrize("field, item, most", [
    ("candidates", ROW, MAX_SEARCH_ROWS), ("baselines", ROW, MAX_SEARCH_ROWS), ("skipped", "gpipe M=3: why", MAX_SKIPPED),
    ("stage_ms", 1.0, MAX_PIPELINE_STAGES), ("stage_memory_bytes", 1, MAX_PIPELINE_STAGES),
    ("device_order", 0, MAX_PIPELINE_STAGES),
])
def test_a_list_past_its_bound_is_refused_by_count(field: str, item, most: int) -> None:
    with pytest.raises(PlanError) as e:
        SearchRecord.from_dict({field: [item] * (most + 1)}, "search")
    assert e.value.message == f"search field {field!r} lists {most + 1} items, more than a plan holds ({most})"
    assert "search" in e.value.hint


def test_the_count_is_checked_before_the_rows() -> None:
    # a malformed row past the bound: the count, not the row, is what is refused
    with pytest.raises(PlanError, match="lists 1001 items"):
        SearchRecord.from_dict({"candidates": [ROW] * MAX_SEARCH_ROWS + [{"method": 3}]}, "search")


def test_rows_up_to_the_bound_load() -> None:
    record = SearchRecord.from_dict({"candidates": [ROW] * MAX_SEARCH_ROWS, "baselines": [ROW] * 4}, "search")
    assert len(record.candidates) == MAX_SEARCH_ROWS and record.candidates[0].cuts == (0, 2, 4, 6)
    assert len(record.baselines) == 4


def test_simulate_refuses_the_plan_in_one_line(pplan, sim_work: Path) -> None:
    path = sim_work / "plan.json"
    plan = json.loads(path.read_text())
    plan["search"] = {"schedule": plan["schedule"], "candidates": [ROW] * (MAX_SEARCH_ROWS + 5)}
    path.write_text(json.dumps(plan))
    code, _, err = pplan("simulate", path)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"search field 'candidates' lists {MAX_SEARCH_ROWS + 5} items" in err
    plan["search"]["candidates"] = [ROW] * 6  # as many as `pplan partition` writes
    assert len(plan_from_dict(plan).search.candidates) == 6
