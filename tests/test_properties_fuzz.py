"""Fuzzing the parsers: whatever a user hands in, the only exception is a PplanError.

Random text for profiles and command-line sizes, random JSON values and mutations of a good
plan, cluster and calibration: each parser either returns a valid object or raises the
project's error family (one line, exit code 2 at the CLI) — never TypeError, KeyError,
ValueError, IndexError or an overflow.
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cluster import cluster_from_dict
from planner.errors import PplanError
from planner.models import parse_spec
from planner.plan import plan_from_dict
from planner.profiling.profile import read_profile_text
from planner.units import parse_bandwidth, parse_bytes, parse_ms

BAD = Path(__file__).resolve().parent / "data" / "bad"
GOOD_PLAN = json.loads((BAD / "good_plan.json").read_text())
GOOD_PROFILE = (BAD / "good_profile.csv").read_text()
_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
_cells = st.one_of(st.text(max_size=6), st.sampled_from(["nan", "inf", "-1", "1e400", "1e308", "0", "", " ", "1.5", "x", "\x00"]),
                   st.integers(-5, 10).map(str))


def _only_pplan_errors(fn, *args):
    try:
        return fn(*args)
    except PplanError as e:
        line = e.one_line()
        assert line and "\n" not in line
        return None


@_SETTINGS
@given(text=st.text(max_size=300))
def test_profile_text_fuzz(text: str) -> None:
    _only_pplan_errors(read_profile_text, text)


@_SETTINGS
@given(data=st.data())
def test_profile_cell_mutations(data) -> None:
    """A good profile with a few cells replaced by odd values: rejected cleanly or still valid."""
    lines = GOOD_PROFILE.splitlines()
    body = [i for i, ln in enumerate(lines) if ln and not ln.startswith("#")][1:]
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.sampled_from(body))
        cells = lines[i].split(",")
        cells[data.draw(st.integers(0, len(cells) - 1))] = data.draw(_cells)
        lines[i] = ",".join(cells)
    prof = _only_pplan_errors(read_profile_text, "\n".join(lines))
    if prof is not None:  # what loads must be usable: finite costs, and a simulation that JSON can hold
        for arr in prof.columns.values():
            assert all(math.isfinite(x) and x >= 0 for x in arr.ravel())
        from planner.simulate import simulate

        result = _only_pplan_errors(simulate, plan_from_dict(GOOD_PLAN), prof)
        if result is not None:
            json.dumps(result.to_dict(), allow_nan=False)


@_SETTINGS
@given(value=_json)
def test_plan_from_arbitrary_json(value) -> None:
    _only_pplan_errors(plan_from_dict, value)


def _paths(d, prefix=()):
    if isinstance(d, dict):
        for k, v in d.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


_PLAN_PATHS = list(_paths(GOOD_PLAN))


@_SETTINGS
@given(data=st.data())
def test_plan_field_mutations(data) -> None:
    """A good plan with one to three fields replaced or deleted: a valid plan or a PlanError."""
    d = copy.deepcopy(GOOD_PLAN)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_PLAN_PATHS))
        parent = d
        try:
            for key in path[:-1]:
                parent = parent[key]
            if data.draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = data.draw(_json)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this path
    plan = _only_pplan_errors(plan_from_dict, d)
    if plan is not None:
        plan.validate()


def _check_usable_cluster(cluster) -> None:
    """What loads must be usable by the planner: devices and links with finite, positive values."""
    if cluster is None:
        return
    devices = cluster.devices(default_memory=None)
    assert devices and len({d.name for d in devices}) == len(devices)
    for d in devices:
        assert math.isfinite(d.speed) and d.speed > 0, d
        assert d.memory_bytes is None or (isinstance(d.memory_bytes, int) and d.memory_bytes > 0), d
    links = cluster.links(25e9, 0.01)
    for bw, lat in [(links.bandwidth_bytes_per_s, links.latency_ms)] + [(bw, lat) for _, _, bw, lat in links.pairs]:
        assert math.isfinite(bw) and bw > 0 and math.isfinite(lat) and lat >= 0, (bw, lat)
    for a, b, _, _ in links.pairs:
        assert 0 <= a < b < len(devices)


@_SETTINGS
@given(value=_json)
def test_cluster_from_arbitrary_json(value) -> None:
    _check_usable_cluster(_only_pplan_errors(cluster_from_dict, value))


@_SETTINGS
@given(data=st.data())
def test_cluster_field_mutations(data) -> None:
    good = {"format": "pplan-cluster/1",
            "devices": [{"name": "a", "memory": "40GiB", "speed": 1.0}, {"name": "b", "memory": "16GiB", "speed": 0.5}],
            "default_link": {"bandwidth": "25GB/s", "latency": "0.01ms"},
            "links": [{"a": "a", "b": "b", "bandwidth": "300GB/s", "latency": "5us"}]}
    paths = list(_paths(good))
    path = data.draw(st.sampled_from(paths))
    parent = good
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = data.draw(_json)
    _check_usable_cluster(_only_pplan_errors(cluster_from_dict, good))


@_SETTINGS
@given(text=st.text(max_size=20) | st.from_regex(r"-?[0-9.e+]{1,8}\s*[A-Za-z/]{0,6}", fullmatch=True))
def test_size_parsers_fuzz(text: str) -> None:
    for fn in (parse_bytes, parse_bandwidth, parse_ms):
        got = _only_pplan_errors(fn, text)
        if got is not None:
            assert math.isfinite(got) and got >= 0


@_SETTINGS
@given(text=st.text(max_size=40) | st.from_regex(r"(gpt|synthetic|mlp|resnet):([a-z_]{1,8}=[-0-9a-zA-Z./]{0,6},?){0,3}", fullmatch=True))
def test_model_spec_fuzz(text: str) -> None:
    _only_pplan_errors(parse_spec, text)


@pytest.mark.parametrize(("raw", "why"), [
    ("", "not valid JSON"), ("[]", "is not a pplan-calibration/1 file"), ("null", "is not a pplan-calibration/1 file"),
    ('{"format": "other"}', "is not a pplan-calibration/1 file"),
    ('{"compute_scale": -1}', "compute_scale -1 is out of range"), ('{"compute_scale": "x"}', "compute_scale must be a number"),
    ('{"compute_scale": 1e999}', "out of range"), ('{"comm_bandwidth_bytes_per_s": 0}', "comm_bandwidth_bytes_per_s 0 is out of range"),
])
def test_bad_calibration_files_are_refused(tmp_path: Path, raw: str, why: str) -> None:
    from planner.calibration import load_calibration

    p = tmp_path / "c.calibration.json"
    p.write_text(raw)
    with pytest.raises(PplanError, match=re.escape(why)) as e:
        load_calibration(p)
    assert "\n" not in e.value.one_line()


def test_empty_calibration_is_the_identity(tmp_path: Path) -> None:
    from planner.calibration import Calibration, load_calibration

    p = tmp_path / "c.calibration.json"
    p.write_text("{}")
    assert load_calibration(p) == Calibration()


@_SETTINGS
@given(value=st.dictionaries(st.sampled_from(["compute_scale", "action_overhead_ms", "comm_latency_ms",
                                               "comm_bandwidth_bytes_per_s", "step_overhead_ms", "format", "other"]),
                             _json, max_size=4))
def test_calibration_fuzz_accepts_only_values_in_range(tmp_path_factory, value) -> None:
    """Whatever loads is usable: every field within the documented range (else a PplanError)."""
    from planner.calibration import RANGES, Calibration, load_calibration

    p = tmp_path_factory.mktemp("cal") / "c.calibration.json"
    p.write_text(json.dumps(value, allow_nan=True))
    cal = _only_pplan_errors(load_calibration, p)
    if cal is None:
        return
    assert "other" not in value and value.get("format", "pplan-calibration/1") == "pplan-calibration/1"
    for name, (low, high) in RANGES.items():
        got = getattr(cal, name)
        assert got is None or (math.isfinite(got) and low <= got <= high), (name, got)
        if value.get(name) is not None:
            assert got == value[name]  # read as written, not clamped
        else:
            assert got == getattr(Calibration(), name)  # absent or null: the identity's value
