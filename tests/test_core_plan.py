import json

import pytest

from planner.errors import PlanError
from planner.plan import Links, load_plan, plan_from_dict, plan_to_json, write_plan

MINIMAL = {
    "schedule": "1f1b", "micro_batch_size": 4, "n_microbatches": 8, "devices": 2,
    "stages": [{"device": 0, "layers": [0, 3]}, {"device": 1, "layers": [3, 6]}],
}


def test_minimal_plan_loads_and_round_trips(tmp_path):
    plan = plan_from_dict(MINIMAL)
    assert plan.global_batch == 32 and plan.n_devices == 2 and plan.virtual_stages == 1
    path = tmp_path / "p.json"
    write_plan(plan, path)
    again = load_plan(path)
    assert again == plan
    assert plan_to_json(again) == path.read_text()


def _with(**changes):
    d = json.loads(json.dumps(MINIMAL))
    d.update(changes)
    return d


@pytest.mark.parametrize("data,fragment", [
    (_with(stages=[{"device": 0, "layers": [0, 3]}, {"device": 1, "layers": [2, 6]}]), "overlaps"),
    (_with(stages=[{"device": 0, "layers": [0, 3]}, {"device": 1, "layers": [4, 6]}]), "gap"),
    (_with(stages=[{"device": 0, "layers": [0, 3]}, {"device": 5, "layers": [3, 6]}]), "out of range"),
    (_with(stages=[{"device": 0, "layers": [0, 3], "recompute": [4]}, {"device": 1, "layers": [3, 6]}]), "outside"),
    (_with(schedule="pipedream"), "unknown"),
    (_with(micro_batch_size="4"), "must be int"),
    (_with(n_microbatches=0), "at least 1"),
    ({k: v for k, v in MINIMAL.items() if k != "stages"}, "missing stages"),
    (_with(stages=[{"device": 0, "layers": [0]}]), "two integers"),
    (_with(devices=0), "at least 1"),
    (_with(optimizer="lion"), "optimizer"),
    (_with(schedule="interleaved"), "2 stages per device"),
    ([1, 2], "JSON object"),
])
def test_bad_plans_are_refused_with_one_line(data, fragment):
    with pytest.raises(PlanError) as e:
        plan_from_dict(data)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_layer_count_is_checked():
    plan = plan_from_dict(MINIMAL)
    with pytest.raises(PlanError, match="model has 8 layers"):
        plan.validate(n_layers=8)


def test_interleaved_plan_loops_devices():
    stages = [{"device": s % 2, "layers": [s, s + 1]} for s in range(4)]
    plan = plan_from_dict(_with(schedule="interleaved", stages=stages))
    assert plan.virtual_stages == 2
    bad = [{"device": d, "layers": [s, s + 1]} for s, d in enumerate([0, 1, 1, 0])]
    with pytest.raises(PlanError, match="loop"):
        plan_from_dict(_with(schedule="interleaved", stages=bad))


def test_load_plan_reports_json_position(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"schedule": "1f1b",\n "stages": [}')
    with pytest.raises(PlanError, match=r"bad.json:2:"):
        load_plan(p)
    with pytest.raises(PlanError, match="does not exist"):
        load_plan(tmp_path / "none.json")


def test_links_transfer_time():
    links = Links(bandwidth_bytes_per_s=1e9, latency_ms=0.5, pairs=((0, 2, 1e8, 1.0),))
    assert links.transfer_ms(0, 1, 1e6) == pytest.approx(0.5 + 1.0)
    assert links.transfer_ms(2, 0, 1e6) == pytest.approx(1.0 + 10.0)
    assert links.transfer_ms(1, 1, 1e9) == 0.0
