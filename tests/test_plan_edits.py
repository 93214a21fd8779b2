"""A plan edited by hand keeps no prediction of the plan it was: `predicted.made_for` records what the
prediction was made for (planner.plan.digest), and any edit of a field the numbers depend on drops
`predicted` and `search` on reading, with a note naming what changed. And listings of many devices
(`pplan simulate`, `pplan report`) show the first and last few and the extremes, not 4,000 lines
(planner.plan.devicelist)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from planner.errors import PlanError
from planner.plan import Device, Plan, Prediction, StagePlan, load_plan, plan_from_dict, plan_to_json, write_plan
from planner.plan.digest import plan_digest
from planner.plan.devicelist import LIST_ALL_UP_TO, LIST_ENDS, list_devices
from planner.plan.serialize import read_plan
from planner.report.inputs import load_inputs
from planner.report.summary import key_numbers, plan_line

DATA = Path(__file__).resolve().parents[1] / "reports" / "example" / "data"


def _written() -> dict:
    """The example plan (2 devices, 10 layers, 1f1b) as pplan writes it now: with `made_for`."""
    old = json.loads((DATA / "plan.json").read_text())
    return json.loads(plan_to_json(plan_from_dict(old)))


def _move_first_cut(d: dict) -> None:
    d["stages"][0]["layers"][1] -= 1
    d["stages"][1]["layers"][0] -= 1


def _add_pair(d: dict) -> None:
    d["links"]["pairs"] = [{"a": 0, "b": 1, "bandwidth_bytes_per_s": 1e9, "latency_ms": 0.5}]


_EDITS = {
    "cut": (_move_first_cut, "stages (cuts, recompute or devices)"),
    "recompute": (lambda d: d["stages"][0].update(recompute=[3]), "stages (cuts, recompute or devices)"),
    "stage devices": (lambda d: [st.update(device=1 - st["device"]) for st in d["stages"]],
                      "stages (cuts, recompute or devices)"),
    "memory": (lambda d: d["devices"][1].update(memory_bytes=2**31), "devices (count, memory or speed)"),
    "speed": (lambda d: d["devices"][0].update(speed=2.0), "devices (count, memory or speed)"),
    "bandwidth": (lambda d: d["links"].update(bandwidth_bytes_per_s=1e9), "links"),
    "link pair": (_add_pair, "links"),
    "optimizer": (lambda d: d.update(optimizer="sgd"), "optimizer"),
    "parallel": (lambda d: d.update(parallel={"dp": 2, "pp": 2, "tp": 1, "zero": 1}, global_batch=32),
                 "parallel layout or its hardware"),
    "profile": (lambda d: d["profile"].update(sha256="0" * 64), "model or profile checksum"),
    "model": (lambda d: d.update(model="mlp:layers=8,hidden=256"), "model or profile checksum"),  # what pplan run builds
}


@pytest.mark.parametrize("edit", list(_EDITS))
def test_an_edit_of_what_the_prediction_depends_on_drops_it_naming_what(edit: str) -> None:
    d = _written()
    change, words = _EDITS[edit]
    change(d)
    plan, note = read_plan(d)
    assert plan.predicted is None and plan.search is None
    assert note.startswith(f"the plan's recorded prediction and search were made before its {words} changed: "
                           "not shown as this plan's")
    assert plan_from_dict(d).predicted is None  # every command's reader, not only the report's


@pytest.mark.parametrize("label", ["device name", "seed", "profile path"])
def test_an_edit_of_a_label_keeps_the_prediction(label: str) -> None:
    d = _written()
    {"device name": lambda: d["devices"][0].update(name="gpu7"),
     "seed": lambda: d.update(seed=3), "profile path": lambda: d["profile"].update(path="elsewhere/profile.csv")}[label]()
    plan, note = read_plan(d)
    assert note is None and plan.predicted is not None and plan.predicted.made_for is not None
    assert plan.predicted.made_for.to_dict() == d["predicted"]["made_for"]


def test_a_written_plan_records_what_its_prediction_was_made_for() -> None:
    d = _written()
    made_for = d["predicted"]["made_for"]
    assert sorted(made_for) == ["batch", "devices", "links", "optimizer", "parallel", "profile", "stages"]
    assert all(len(v) == 12 and int(v, 16) >= 0 for v in made_for.values())
    # a file from before made_for is read as it was: its prediction is kept (an older cut edit is not seen)
    old = json.loads((DATA / "plan.json").read_text())
    old["predicted"].pop("made_for", None)  # as every plan was written before made_for
    _move_first_cut(old)
    assert read_plan(old)[1] is None and plan_from_dict(old).predicted is not None


def test_two_edits_are_both_named_and_a_schedule_by_its_values() -> None:
    d = _written()
    _move_first_cut(d)
    d["links"]["latency_ms"] = 1.0
    d["schedule"] = "gpipe"
    note = read_plan(d)[1]
    assert "made for schedule '1f1b' (the plan has 'gpipe'), and before its links and stages (cuts, recompute or " \
           "devices) changed" in note


def test_fewer_devices_than_predicted_reads_without_the_prediction() -> None:
    """Merging the two stages onto one device: the prediction of two devices is dropped, not refused."""
    d = _written()
    d["devices"] = d["devices"][:1]
    d["stages"] = [{"device": 0, "layers": [0, d["stages"][-1]["layers"][1]], "recompute": []}]
    plan, note = read_plan(d)
    assert plan.n_devices == 1 and plan.predicted is None
    assert "before its devices (count, memory or speed) and stages (cuts, recompute or devices) changed" in note


def test_a_plan_changed_in_memory_and_written_drops_its_old_prediction(tmp_path: Path) -> None:
    plan = plan_from_dict(_written())
    first, second = plan.stages
    cut = first.layers[1] - 1
    moved = (StagePlan(first.device, (0, cut)), StagePlan(second.device, (cut, second.layers[1])))
    write_plan(plan.with_(stages=moved), tmp_path / "moved.json")
    assert load_plan(tmp_path / "moved.json").predicted is None


def test_a_prediction_joined_to_a_plan_is_stamped_with_it() -> None:
    bare = dict(schedule="1f1b", micro_batch_size=2, n_microbatches=8, devices=(Device("a"), Device("b")),
                stages=(StagePlan(0, (0, 5)), StagePlan(1, (5, 10))))
    fresh = Plan(**bare, predicted=Prediction(iteration_ms=1.0, schedule="1f1b"))
    assert fresh.predicted.made_for == plan_digest(fresh)
    # a speed of 1 built in Python and 1.0 read from JSON are the same plan
    same = Plan(**{**bare, "devices": (Device("a", speed=1), Device("b", speed=1.0))})
    assert plan_digest(same) == fresh.predicted.made_for
    assert plan_digest(fresh.with_(optimizer="sgd")).stages == fresh.predicted.made_for.stages
    assert plan_digest(fresh.with_(optimizer="sgd")).optimizer != fresh.predicted.made_for.optimizer


def test_report_warns_instead_of_showing_a_prediction_of_other_cuts(tmp_path: Path) -> None:
    d = _written()
    _move_first_cut(d)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(d))
    rows = dict(key_numbers(load_inputs(plan=path)))
    assert "before its stages (cuts, recompute or devices) changed" in rows["warning"]
    assert "predicted iteration time" not in rows and not any(k.startswith("vs ") for k in rows)


# ---- listings of many devices ----------------------------------------------------------------

def test_every_device_is_listed_up_to_the_bound_and_above_it_the_ends_and_extremes() -> None:
    small = list_devices(LIST_ALL_UP_TO, [("slowest", list(range(LIST_ALL_UP_TO)))])
    assert small.shown == tuple(range(LIST_ALL_UP_TO)) and small.left_out_line("x") is None and small.label(63) == ""
    n = LIST_ALL_UP_TO + 1
    busy = [1.0] * n
    busy[30] = busy[40] = 5.0  # the first of equals is the slowest
    memory = [None] * n
    memory[20] = 9.0
    big = list_devices(n, [("slowest", busy), ("most memory", memory)])
    assert big.shown == (0, 1, 2, 3, 20, 30, n - 4, n - 3, n - 2, n - 1)
    assert big.label(30) == "slowest" and big.label(20) == "most memory" and big.label(0) == ""
    assert big.gap_before(20) == 16 and big.gap_before(30) == 9 and big.gap_before(1) == 0
    assert big.left_out_line("sim.json") == (f"{n - 10} of {n} devices not listed (shown: the first {LIST_ENDS}, the last "
                                             f"{LIST_ENDS}, the slowest and the one with the most memory); every device: sim.json")


def _many_device_plan(tmp_path: Path, n: int) -> Path:
    """A plan of `n` devices, one layer each, over a profile whose layer 37 is the slowest and 50 the largest."""
    from planner.profiling.profile import make_profile, write_profile

    fwd = np.full((n, 1), 1.0)
    fwd[37] = 3.0
    params = np.full((n, 1), 1000)
    params[50] = 50_000
    cols = {"fwd_ms": fwd, "bwd_ms": 2 * fwd, "param_bytes": params, "activation_bytes": np.full((n, 1), 100),
            "output_bytes": np.full((n, 1), 100)}
    sha = write_profile(make_profile([f"l{i}" for i in range(n)], [1], cols, {"model": "synthetic"}), tmp_path / "p.csv")
    plan = Plan(schedule="gpipe", micro_batch_size=1, n_microbatches=2, n_layers=n, profile_path=str(tmp_path / "p.csv"),
                profile_sha256=sha, stages=tuple(StagePlan(i, (i, i + 1)) for i in range(n)),
                devices=tuple(Device(f"d{i}", memory_bytes=10**6) for i in range(n)))
    write_plan(plan, tmp_path / "plan.json")
    return tmp_path / "plan.json"


def test_simulate_lists_the_ends_and_extremes_of_many_devices(tmp_path: Path, pplan) -> None:
    path = _many_device_plan(tmp_path, 100)
    code, out, err = pplan("simulate", path, "--out", tmp_path / "sim.json")
    assert code == 0, err
    rows = [line.split()[0] for line in out.splitlines() if line.split()[1:2] and line.split()[1].startswith("d")]
    assert rows == ["0", "1", "2", "3", "37", "50", "96", "97", "98", "99"]
    assert "d37 (slowest)" in out and "d50 (most memory)" in out and "...     (33 not listed)" in out
    assert (f"90 of 100 devices not listed (shown: the first 4, the last 4, the slowest and the one with the most "
            f"memory); every device: the simulation JSON {tmp_path / 'sim.json'}") in out
    assert len(json.loads((tmp_path / "sim.json").read_text())["devices"]) == 100


def test_report_lists_the_ends_and_extremes_of_many_devices(tmp_path: Path) -> None:
    sim = json.loads((DATA / "sim.json").read_text())
    device = sim["devices"][0]
    sim["devices"] = [{**device, "device": i, "peak_memory_bytes": 1000 + i % 7, "memory_limit_bytes": None}
                      for i in range(100)]
    sim["devices"][42]["peak_memory_bytes"] = 10**6
    sim["memory_timeline"] = {}
    (tmp_path / "many.json").write_text(json.dumps(sim))
    rows = key_numbers(load_inputs(sim=tmp_path / "many.json"))
    names = [k for k, _ in rows if k.startswith("peak memory")]
    assert names == [*(f"peak memory dev {i}" for i in range(4)), "peak memory dev 42 (most memory predicted)",
                     *(f"peak memory dev {i}" for i in range(96, 100)), "peak memory, devices not listed"]
    assert dict(rows)["peak memory, devices not listed"] == (
        "91 of 100 devices not listed (shown: the first 4, the last 4 and the one with the most memory predicted); "
        f"every device: the simulation JSON {tmp_path / 'many.json'}")


def test_the_plan_line_of_many_stages_names_the_ends(tmp_path: Path) -> None:
    line = plan_line(load_plan(_many_device_plan(tmp_path, 100)))
    assert line.endswith("layers [0, 1) on dev 0, [1, 2) on dev 1, [2, 3) on dev 2, [3, 4) on dev 3, "
                         "... 92 stages not listed ..., [96, 97) on dev 96, [97, 98) on dev 97, [98, 99) on dev 98, "
                         "[99, 100) on dev 99")


@pytest.mark.parametrize("made_for, says", [
    ({"stages": None}, "lacks 'stages'"),
    ("empty", "lacks 'batch'"),
    ({"links": "ABCDEF012345"}, "not 12 lowercase hex digits"),
    ({"devices": "0" * 100_000}, "not 12 lowercase hex digits"),
    ({"batch": "not-hex-at-a"}, "not 12 lowercase hex digits"),
])
def test_a_made_for_that_is_not_what_pplan_writes_is_refused(made_for, says: str) -> None:
    """A made_for lacking a group, or holding anything but a digest there, would keep a stale
    prediction through an edit of that group (a cut moved with made_for.stages deleted was kept)."""
    d = _written()
    if made_for == "empty":
        d["predicted"]["made_for"] = {}
    else:
        d["predicted"]["made_for"].update(made_for)
        d["predicted"]["made_for"] = {k: v for k, v in d["predicted"]["made_for"].items() if v is not None}
    with pytest.raises(PlanError, match=says):
        plan_from_dict(d)


def test_a_peak_far_under_its_limit_reads_under_one_percent_not_zero(tmp_path: Path) -> None:
    sim = json.loads((DATA / "sim.json").read_text())
    sim["devices"] = [{**d, "peak_memory_bytes": 1000, "memory_limit_bytes": 10**9} for d in sim["devices"]]
    sim["memory_timeline"] = {}
    (tmp_path / "far.json").write_text(json.dumps(sim))
    rows = dict(key_numbers(load_inputs(sim=tmp_path / "far.json")))
    assert rows["peak memory dev 0"] == "predicted 1000 B, limit 953.7 MiB (<1% used)"
