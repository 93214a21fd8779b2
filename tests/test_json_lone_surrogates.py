"""Strings that are not Unicode text (a lone surrogate, written as a JSON escape) are refused when a
file is read, naming where; before, they passed and crashed printing (UnicodeEncodeError), after
`pplan partition --cluster` had written the plan. Also: a bracket inside an unterminated string is
not nesting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cluster import load_cluster
from planner.errors import ClusterError, PlanError, PplanError
from planner.jsonio import loads_strict

ROOT = Path(__file__).resolve().parents[1]
LONE = "\\ud800"  # the six characters of the JSON escape, as a hostile file writes them


@pytest.mark.parametrize("text, where", [
    ('{"devices": [{"name": "gpu' + LONE + '"}]}', "the string at devices[0].name"),
    ('{"a": ["ok", {"x\\udc00": 1}]}', "a key of a[1]"),
    ('["\\uDBFF"]', "the string at [0]"),
    ('"' + LONE + '"', "the string at the top level"),
])
def test_lone_surrogates_are_refused_naming_where(text: str, where: str) -> None:
    with pytest.raises(PplanError) as e:
        loads_strict(text, "f.json", PlanError)
    assert e.value.message.startswith(f"f.json: {where} (a lone surrogate ")
    assert "is not valid Unicode text" in e.value.message


def test_pairs_and_escaped_backslashes_are_text() -> None:
    assert loads_strict('["\\ud83d\\ude00", "\\\\ud800", "\\u00e9"]', "f.json", PlanError) == ["\U0001F600", "\\ud800", "é"]


def test_a_str_holding_a_surrogate_is_refused_too() -> None:
    with pytest.raises(PlanError, match=r"the string at \[0\] \(a lone surrogate \\ud800 at character 1\)"):
        loads_strict('["a\ud800"]', "f.json", PlanError)


def test_bracket_inside_an_unterminated_string_is_not_nesting() -> None:
    with pytest.raises(PlanError) as e:
        loads_strict('["' + "a\\\"[" * 100, "f.json", PlanError)
    assert "Unterminated string" in e.value.message and "nests deeper" not in e.value.message


def _cluster_with_name(tmp_path: Path, name_json: str) -> Path:
    data = json.loads((ROOT / "examples" / "cluster.json").read_text())
    text = json.dumps(data).replace(json.dumps(data["devices"][1]["name"]), name_json, 1)
    path = tmp_path / "cluster.json"
    path.write_text(text)
    return path


def test_cluster_device_name_refused_before_any_plan_is_written(pplan, tmp_path: Path) -> None:
    cluster = _cluster_with_name(tmp_path, '"gpu' + LONE + '"')
    with pytest.raises(ClusterError, match=r"devices\[1\]\.name \(a lone surrogate"):
        load_cluster(cluster)
    out = tmp_path / "plan.json"
    code, _, err = pplan("partition", ROOT / "profiles" / "mlp.csv", "--global-batch", "64", "--cluster", cluster, "-o", out)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "devices[1].name" in err, err
    assert not out.exists()


def test_plan_with_a_lone_surrogate_is_refused_by_simulate(pplan, sim_work: Path) -> None:
    plan = sim_work / "plan.json"
    plan.write_text(plan.read_text().replace('"gpu1"', '"gpu' + LONE + '"'))
    code, _, err = pplan("simulate", plan)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "devices[1].name (a lone surrogate \\ud800 at character 3) is not valid Unicode text" in err
