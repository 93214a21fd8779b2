"""What a review of 2026-12-05 found, fixed: links the user describes win over a calibration's
measured link in every command; `partition` bounds its simulated actions before it builds them;
usage errors show the value typed; hints a user can follow."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.cli import one_error_line
from helpers.plans import write_synthetic_profile
from planner.calibration import Calibration, write_calibration


def _predicted_ms(plan: Path) -> float:
    return float(json.loads(plan.read_text(encoding="utf-8"))["predicted"]["iteration_ms"])


def test_a_described_link_wins_over_the_calibrations_in_partition_and_simulate(pplan, tmp_path):
    write_synthetic_profile(tmp_path / "p.csv", layers=4, micro_batch_size=2, hidden=4096)
    cal = tmp_path / "cal.json"
    write_calibration(Calibration(comm_latency_ms=0.2, comm_bandwidth_bytes_per_s=3.9e9), cal)
    got = {}
    for bw in ("25GB/s", "1MB/s"):  # the default (stands for this machine's link), and a link to plan for
        out = tmp_path / f"plan-{bw.replace('/', '')}.json"
        code, _, err = pplan("partition", tmp_path / "p.csv", "--devices", 2, "--global-batch", 8, "--microbatches", 4,
                             "--schedule", "1f1b", "--bandwidth", bw, "--calibration", cal, "--out", out)
        assert code == 0, err
        assert ("not from the calibration's measured link (3.9 GB/s)" in err) == (bw == "1MB/s"), err
        code, sim, err = pplan("simulate", out, "--calibration", cal, "--json")
        assert code == 0, err
        assert json.loads(sim)["iteration_ms"] == _predicted_ms(out)  # simulate prices the plan as partition did
        got[bw] = _predicted_ms(out)
    # 32 KiB boundary tensors take 33 ms each over 1 MB/s, 0.2 ms at the calibration's link
    assert got["1MB/s"] > got["25GB/s"] + 100.0


def test_partition_refuses_more_actions_than_the_simulator_takes_before_building_them(pplan, tmp_path):
    write_synthetic_profile(tmp_path / "p.csv", layers=4, micro_batch_size=1)
    code, _, err = pplan("partition", tmp_path / "p.csv", "--devices", 4, "--global-batch", 262144,
                         "--microbatches", 262144, "--schedule", "1f1b", "--out", tmp_path / "x.json")
    line = one_error_line(code, err)
    assert "2,097,152 actions to simulate" in line and "use at most 125,000 micro-batches" in line
    code, _, err = pplan("partition", tmp_path / "p.csv", "--devices", 4, "--global-batch", 262144,
                         "--microbatches", 262144, "--out", tmp_path / "x.json")
    assert "try --microbatches auto" in one_error_line(code, err)
    assert not (tmp_path / "x.json").exists()


def test_a_bad_option_value_is_echoed_and_a_root_option_is_placed(pplan, tmp_path):
    code, _, err = pplan("partition", tmp_path / "p.csv", "--devices", "two", "--global-batch", 8)
    assert "(got 'two')" in one_error_line(code, err)
    code, _, err = pplan("partition", tmp_path / "p.csv", "--global-batch=1e3", "--devices", 2)
    assert "(got '1e3')" in one_error_line(code, err)
    code, _, err = pplan("partition", tmp_path / "p.csv", "--devices", 2, "--debug")
    assert "it goes before the command, e.g. `pplan --debug partition ...`" in one_error_line(code, err)


def test_too_many_cluster_devices_says_which_file_to_change(pplan, tmp_path):
    write_synthetic_profile(tmp_path / "p.csv", layers=2, micro_batch_size=2)
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"devices": [{"name": f"g{i}", "memory": "1GiB"} for i in range(3)]}), encoding="utf-8")
    code, _, err = pplan("partition", tmp_path / "p.csv", "--cluster", cluster, "--global-batch", 8, "--out", tmp_path / "x.json")
    line = one_error_line(code, err)
    assert "3 devices but the profile has only 2 layers" in line and "use a cluster file with 2 devices or fewer" in line
    assert "--devices" not in line


def test_running_a_cluster_plan_here_says_where_it_runs(pplan, analytic_profile, tmp_path, monkeypatch):
    from planner.models import bounds

    model = "gpt:layers=8,hidden=2048,heads=16,seq=512,vocab=32000"
    profile = analytic_profile(model, "1,2")
    plan = tmp_path / "plan.json"
    code, _, err = pplan("partition", profile, "--nodes", 2, "--hardware", "a100-80gb", "--global-batch", 64, "--out", plan)
    assert code == 0, err
    monkeypatch.setattr(bounds, "usable_memory_bytes", lambda: 2**30)  # a machine far smaller than the model
    line = one_error_line(*pplan("run", plan)[::2])
    assert "needs at least" in line and "this plan is for 16 processes: run it under torchrun on the cluster" in line
    assert "shrink" not in line


# --- every refusal of a profile or plan field says what to write instead -------------------------

_ROWS = "layer,name,micro_batch_size,fwd_ms,bwd_ms,param_bytes,activation_bytes,output_bytes\n"
BAD_PROFILES = {
    "format": "# format: pplan-profile/9\n" + _ROWS + "0,a,1,1,2,3,4,5\n",
    "duplicated column": _ROWS.replace("\n", ",fwd_ms_std,fwd_ms_std\n") + "0,a,1,1,2,3,4,5,0,0\n",
    "huge micro-batch": _ROWS + "0,a,999999999999,1,2,3,4,5\n",
    "no rows": _ROWS,
    "renamed layer": _ROWS + "0,a,1,1,2,3,4,5\n0,b,2,1,2,3,4,5\n",
    "duplicate row": _ROWS + "0,a,1,1,2,3,4,5\n0,a,1,1,2,3,4,5\n",
    "infinite": _ROWS + "0,a,1,1e400,2,3,4,5\n",
    "long integer": _ROWS + "0,a," + "1" * 50 + ",1,2,3,4,5\n",
    "size below 1": _ROWS + "0,a,0,1,2,3,4,5\n",
}


def test_every_profile_refusal_has_a_hint():
    import pytest

    from planner.errors import ProfileError
    from planner.profiling.profile import read_profile_text

    for case, text in BAD_PROFILES.items():
        with pytest.raises(ProfileError) as e:
            read_profile_text(text, f"{case}.csv")
        assert e.value.hint, (case, e.value.message)


def test_plan_link_and_device_refusals_name_the_field_and_a_fix():
    import pytest

    from planner.errors import PlanError
    from planner.plan import plan_from_dict

    base = {"format": "pplan-plan/1", "schedule": "gpipe", "micro_batch_size": 1, "n_microbatches": 2,
            "stages": [{"device": 0, "layers": [0, 1]}, {"device": 1, "layers": [1, 2]}]}
    cases = {
        "links.pairs[0].latency_ms must be 0 or more, got -1": {
            "devices": 2, "links": {"pairs": [{"a": 0, "b": 1, "bandwidth_bytes_per_s": 1e9, "latency_ms": -1}]}},
        "links.bandwidth_bytes_per_s must be positive, got 0": {"devices": 2, "links": {"bandwidth_bytes_per_s": 0}},
        "devices[1].speed must be positive": {"devices": [{"name": "a"}, {"name": "b", "speed": 0}]},
        "devices[0].memory_bytes must be positive": {"devices": [{"name": "a", "memory_bytes": 0}, {"name": "b"}]},
        "devices must be at least 1": {"devices": 0},
    }
    for words, change in cases.items():
        with pytest.raises(PlanError) as e:
            plan_from_dict({**base, **change})
        assert words in e.value.message and e.value.hint, (words, e.value.message, e.value.hint)
