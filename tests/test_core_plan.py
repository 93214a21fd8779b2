import json

import pytest

from planner.cost import link_between, link_ms
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
    (_with(micro_batch_size="4"), "must be an integer"),
    (_with(n_microbatches=0), "at least 1"),
    ({k: v for k, v in MINIMAL.items() if k != "stages"}, "missing field stages"),
    (_with(stages=[{"device": 0, "layers": [0]}]), "two integers"),
    (_with(devices=0), "at least 1"),
    (_with(optimizer="lion"), "optimizer"),
    (_with(schedule="interleaved"), "2 stages per device"),
    ([1, 2], "JSON object"),
    (_with(optimiser="adam"), "unknown key 'optimiser'; did you mean 'optimizer'?"),
    (_with(stages=[{"device": 0, "layers": [0, 3], "recompute_layers": []}, {"device": 1, "layers": [3, 6]}]),
     "stages[0]: unknown key 'recompute_layers'; did you mean 'recompute'?"),
    (_with(links={"latency_ms": -1}), "links.latency_ms must be 0 or more, got -1"),
    (_with(links={"bandwidth_bytes_per_s": 1e-300}), "out of range"),
    (_with(n_microbatches=10**12), "too large"),
    (_with(devices=10**9), "devices is 1000000000 but the plan has 2 stages"),
    (_with(global_batch=31), "global_batch 31 is not"),
    (_with(predicted={"iteration_ms": 1.0, "bubble": 0.1}), "predicted: unknown key 'bubble'"),
    (_with(search={"method": "dp", "candidate": []}), "search: unknown key 'candidate'; did you mean 'candidates'?"),
])
def test_bad_plans_are_refused_with_one_line(data, fragment):
    with pytest.raises(PlanError) as e:
        plan_from_dict(data)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_plan_json_is_read_strictly(tmp_path):
    p = tmp_path / "p.json"
    p.write_text('{"schedule": "1f1b", "schedule": "gpipe"}')
    with pytest.raises(PlanError, match="appears twice"):
        load_plan(p)
    p.write_text('{"n_microbatches": ' + "9" * 5000 + "}")
    with pytest.raises(PlanError, match="5000 digits"):
        load_plan(p)


def test_written_plan_with_prediction_round_trips(tmp_path):
    from planner.plan import PREDICTED_KEYS, SEARCH_KEYS

    plan = plan_from_dict(_with(predicted={k: None for k in PREDICTED_KEYS}, search={k: None for k in SEARCH_KEYS}))
    write_plan(plan, tmp_path / "p.json")
    assert plan_to_json(load_plan(tmp_path / "p.json")) == (tmp_path / "p.json").read_text()


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
    assert link_ms(1e6, link_between(links, 0, 1)) == pytest.approx(0.5 + 1.0)
    assert link_ms(1e6, link_between(links, 2, 0)) == pytest.approx(1.0 + 10.0)
    assert link_ms(1e9, link_between(links, 1, 1)) == 0.0
