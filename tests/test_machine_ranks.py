"""The machine file per rank count: format 2, the old format still read, the entry a plan is
predicted with, and `calibrate --machine --ranks` (no processes are started)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.errors import PplanError
from planner.execute import machinebench
from planner.execute.machinebench import empty_model, measure_machines, parse_rank_counts
from planner.execute.preflight import Preflight
from planner.calibration import Calibration, calibration_path_for, write_calibration
from planner.execute.prediction import predict, unused_machine_file_warnings
from planner.machine import (FORMAT, FORMAT_V1, MAX_ENTRIES, Machine, MachineSet, find_machine, load_machine,
                             load_machines, machine_calibration, prediction_basis, save_machine)
from planner.plan import load_plan
from planner.profiling.profile import load_profile
from planner.simulate import simulate


ROOT = Path(__file__).resolve().parents[1]


def _machine(ranks: int = 2, **kw) -> Machine:
    base = dict(device_type="cpu", backend="gloo", ranks=ranks, threads=1, action_overhead_ms=0.1 * ranks,
                comm_latency_ms=0.05 * ranks, comm_bandwidth_bytes_per_s=2e9, step_overhead_ms=1.0)
    base.update(kw)
    return Machine(**base)


def _set(*counts: int) -> MachineSet:
    return MachineSet(tuple(_machine(r) for r in counts))


def test_a_format_1_file_still_loads_as_one_entry(tmp_path):
    # exactly what `pplan calibrate --machine` wrote before rank counts (format 1, fields at the top)
    old = {"format": FORMAT_V1, "device_type": "cpu", "backend": "gloo", "ranks": 2, "threads": 1,
           "action_overhead_ms": 0.24, "comm_latency_ms": 0.128, "comm_bandwidth_bytes_per_s": 3.3e9,
           "step_overhead_ms": 0.0, "optimizer_ms_per_mib": {"adam": 1.1}, "concurrent_compute_ratio": 0.97,
           "hardware": None, "measured": {"date": "2026-11-30T11:32:09Z", "cores": 2, "cases": []}}
    p = tmp_path / "machine.json"
    p.write_text(json.dumps(old))
    machines = load_machines(p)
    assert machines.ranks == (2,)
    assert load_machine(p, ranks=8).action_overhead_ms == 0.24  # the only entry is the nearest
    # rewriting it gives format 2 with the same numbers
    save_machine(machines, p)
    data = json.loads(p.read_text())
    assert data["format"] == FORMAT and data["entries"][0]["comm_latency_ms"] == 0.128
    assert load_machines(p) == machines


def test_round_trip_keeps_every_entry_sorted(tmp_path):
    machines = MachineSet((_machine(8), _machine(2), _machine(4)))
    assert machines.ranks == (2, 4, 8)
    p = save_machine(machines, tmp_path / "m.json")
    assert load_machines(p) == machines
    assert save_machine(_machine(4), tmp_path / "one.json") and load_machines(tmp_path / "one.json").ranks == (4,)


@pytest.mark.parametrize("ranks, picked", [(8, 8), (2, 2), (4, 4), (5, 4), (3, 4), (6, 8), (16, 8), (None, 2)])
def test_pick_takes_the_plans_count_else_the_nearest_and_a_tie_goes_to_more_ranks(ranks, picked):
    assert _set(2, 4, 8).pick(ranks).ranks == picked


def test_with_entry_replaces_the_same_count_and_keeps_the_others():
    updated = _set(2, 4).with_entry(_machine(4, step_overhead_ms=9.0)).with_entry(_machine(8))
    assert updated.ranks == (2, 4, 8)
    assert updated.pick(4).step_overhead_ms == 9.0 and updated.pick(2) == _machine(2)


@pytest.mark.parametrize("data, message", [
    ({"format": FORMAT, "entrys": []}, "did you mean 'entries'"),
    ({"format": FORMAT, "entries": []}, "entries must be a non-empty list"),
    ({"format": FORMAT, "entries": {"2": {}}}, "entries must be a non-empty list"),
    ({"format": "pplan-machine/9", "entries": []}, "is a 'pplan-machine/9' file; this pplan reads pplan-machine/2"),
    ({"entries": [{"ranks": 2}]}, "entries\\[0\\] lacks device_type"),
    ({"action_overhead": 1.0}, "did you mean 'action_overhead_ms'"),  # no format, no entries: format 1
])
def test_reading_format_2_is_strict(tmp_path, data, message):
    p = tmp_path / "m.json"
    p.write_text(json.dumps(data))
    with pytest.raises(PplanError, match=message):
        load_machines(p)


def test_entries_are_checked_one_by_one_and_as_a_set(tmp_path):
    p = tmp_path / "m.json"
    entry = _machine(2).to_dict()
    cases = [
        ([dict(entry, action_overhead=1.0)], "entries\\[0\\].*did you mean 'action_overhead_ms'"),
        ([dict(entry, format=FORMAT_V1)], "entries\\[0\\] has a format key"),
        ([entry, dict(entry, step_overhead_ms=2.0)], "two entries for 2 ranks"),
        ([entry, dict(entry, ranks=4, backend="nccl", device_type="cuda")], "mixes cpu/gloo and cuda/nccl"),
        ([dict(entry, ranks=2 + i) for i in range(MAX_ENTRIES + 1)], f"at most {MAX_ENTRIES}"),
        ([dict(entry, comm_latency_ms=-1.0)], "comm_latency_ms -1.0 is out of range"),
    ]
    for entries, message in cases:
        p.write_text(json.dumps({"format": FORMAT, "entries": entries}))
        with pytest.raises(PplanError, match=message):
            load_machines(p)


def test_find_machine_and_prediction_basis_choose_the_entry_for_the_process_count(tmp_path, monkeypatch, sim_work):
    path = save_machine(_set(2, 8), tmp_path / "machine.json")
    assert find_machine(path, device_type="cpu", ranks=7).ranks == 8
    assert find_machine(path, device_type="cpu").ranks == 2
    assert find_machine(path, device_type="cuda", ranks=8) is None
    monkeypatch.setenv("PPLAN_MACHINE", str(path))
    prof = load_profile(sim_work / "sim_profile.csv")
    cal, used = prediction_basis(prof, ranks=8)
    assert used == path and cal == machine_calibration(_machine(8))
    assert prediction_basis(prof)[0] == machine_calibration(_machine(2))


def _preflight(sim_work) -> tuple:
    plan = load_plan(sim_work / "plan.json")
    prof = load_profile(sim_work / "sim_profile.csv")
    return plan, prof, Preflight(n_layers=prof.n_layers, profile=prof, device_type="cpu", model_kwargs={}, resume_step=0)


def test_predict_uses_the_entry_for_the_plans_process_count_and_says_which(tmp_path, sim_work):
    plan, prof, pf = _preflight(sim_work)  # 3 devices: 3 processes
    assert len(plan.devices) == 3
    # the entries differ enough that the wrong one gives another iteration time
    machines = MachineSet((_machine(2, action_overhead_ms=0.0), _machine(3, action_overhead_ms=5.0),
                           _machine(8, action_overhead_ms=20.0)))
    path = save_machine(machines, tmp_path / "m.json")
    sim, source, cal = predict(plan, pf, machine=path)
    assert source == "simulate(profile + machine, 3 ranks)"
    assert cal == machine_calibration(machines.pick(3))
    want = simulate(plan, prof, calibration=machine_calibration(machines.pick(3)), record_timeline=False).iteration_ms
    assert sim.iteration_ms == pytest.approx(want)
    wrong = simulate(plan, prof, calibration=machine_calibration(machines.pick(2)), record_timeline=False).iteration_ms
    assert sim.iteration_ms > wrong
    # without an entry for 3 processes: the nearest count, named with the plan's
    path = save_machine(MachineSet((machines.pick(2), machines.pick(8))), tmp_path / "m2.json")
    _, source, cal = predict(plan, pf, machine=path)
    assert source == "simulate(profile + machine, 2 ranks for 3)" and cal == machine_calibration(machines.pick(2))



def test_a_named_machine_file_that_the_plans_own_calibration_overrides_is_said_to_be_unused(tmp_path, sim_work):
    plan, prof, pf = _preflight(sim_work)
    path = save_machine(MachineSet((_machine(3, action_overhead_ms=5.0),)), tmp_path / "m.json")
    own = Calibration(compute_scale=1.5)
    write_calibration(own, calibration_path_for(prof.path))
    sim, source, cal = predict(plan, pf, machine=path)
    assert cal == own and source == "simulate(profile + calibration)"  # the per-plan one wins
    (warning,) = unused_machine_file_warnings(path, source, pf)
    assert f"--machine-file {path} was not used" in warning and str(calibration_path_for(prof.path)) in warning
    assert unused_machine_file_warnings(None, source, pf) == []  # none named: nothing to say
    # without the per-plan calibration the named file prices the plan, and nothing is said
    calibration_path_for(prof.path).unlink()
    _, source, cal = predict(plan, pf, machine=path)
    assert source == "simulate(profile + machine, 3 ranks)" and unused_machine_file_warnings(path, source, pf) == []


def test_partition_of_a_cluster_file_prices_with_the_entry_for_its_device_count(tmp_path, monkeypatch):
    # a cluster file sets no --devices: the search once took the 2-rank entry (the default) where
    # `pplan simulate` of its plan took the 5-rank one, so the two disagreed on every device's busy time
    from planner.partition.job import partition_pipeline
    from planner.partition.options import settings_from_options

    machines = MachineSet((_machine(2, action_overhead_ms=0.0), _machine(5, action_overhead_ms=3.0)))
    monkeypatch.setenv("PPLAN_MACHINE", str(save_machine(machines, tmp_path / "m.json")))
    settings = settings_from_options(devices=None, memory=None, global_batch=16, cluster=ROOT / "examples" / "cluster.json")
    job = partition_pipeline(ROOT / "profiles" / "mlp.csv", settings)
    assert job.calibration.action_overhead_ms == machine_calibration(machines.pick(5)).action_overhead_ms == 3.0

def test_the_empty_pipeline_sleeps_only_when_ranks_outnumber_cores():
    assert "fwd_ms=0,bwd_ms=0" in empty_model(2, 2) and "layers=2" in empty_model(2, 2)
    fwd, bwd = machinebench.SLEEP_MS
    assert f"fwd_ms={fwd:g},bwd_ms={bwd:g}" in empty_model(8, 2) and "layers=8" in empty_model(8, 2)
    assert "fwd_ms=0," in empty_model(8, 16)


@pytest.mark.parametrize("text, counts", [("2,4,8", (2, 4, 8)), (" 8 , 2,8", (8, 2)), ("2", (2,))])
def test_rank_counts_parse(text, counts):
    assert parse_rank_counts(text, most=8) == counts


@pytest.mark.parametrize("text, message", [
    ("1", "'1' is not a whole number from 2 to 8"), ("16", "'16' is not a whole number from 2 to 8"),
    ("2,x", "'x' is not"), (" , ", "names no rank count"), ("2.5", "'2.5' is not"),
])
def test_rank_counts_are_bounded(text, message):
    with pytest.raises(PplanError, match=message):
        parse_rank_counts(text, most=8)
    with pytest.raises(PplanError, match="at most"):
        parse_rank_counts(",".join(str(r) for r in range(2, 3 + machinebench.MAX_RANK_COUNTS)), most=64)


def test_measure_machines_replaces_the_counts_measured_and_keeps_the_rest(monkeypatch):
    asked = []

    def fake(*, ranks, **kw):
        asked.append(ranks)
        return _machine(ranks, step_overhead_ms=7.0)

    monkeypatch.setattr(machinebench, "measure_machine", fake)
    out = measure_machines((4, 8), base=_set(2, 4))
    assert asked == [4, 8] and out.ranks == (2, 4, 8)
    assert out.pick(2).step_overhead_ms == 1.0 and out.pick(4).step_overhead_ms == 7.0
    assert measure_machines((2,)).ranks == (2,)


def test_calibrate_machine_merges_into_the_file(tmp_path, monkeypatch, pplan):
    monkeypatch.setattr(machinebench, "measure_machine", lambda *, ranks, **kw: _machine(ranks, step_overhead_ms=7.0))
    target = save_machine(_set(2, 4), tmp_path / "machine.json")
    code, out, err = pplan("calibrate", "--machine", "--ranks", "4,8", "--out", target)
    assert code == 0, err
    assert load_machines(target).ranks == (2, 4, 8) and load_machines(target).pick(2).step_overhead_ms == 1.0
    assert "8 processes" in out and "(measured now)" in out
    code, _, err = pplan("calibrate", "--machine", "--ranks", "1", "--out", target)
    assert code != 0 and "'1' is not a whole number from 2" in err
    # a machine file that cannot be read is replaced, and the command says so (other files are
    # refused: tests/test_calibrate_modes.py)
    target.write_text(json.dumps({"format": FORMAT, "entries": [dict(_machine(4).to_dict(), ranks=0)]}))
    code, out, err = pplan("calibrate", "--machine", "--ranks", "2", "--out", target)
    assert code == 0 and "replacing the unreadable machine file" in err and load_machines(target).ranks == (2,)


def test_calibrate_machine_refuses_an_unwritable_new_file_before_measuring(tmp_path, monkeypatch, pplan):
    asked = []
    monkeypatch.setattr(machinebench, "measure_machine", lambda *, ranks, **kw: asked.append(ranks))
    (tmp_path / "afile").write_text("not a folder")
    code, _, err = pplan("calibrate", "--machine", "--ranks", "2", "--out", tmp_path / "afile" / "machine.json")
    assert code == 2 and "is not a folder" in err and asked == []
