"""The machine file (planner.machine) and the fits of `pplan calibrate --machine` (no processes)."""

from __future__ import annotations

import json

import pytest

from planner.errors import PplanError
from planner.execute.machinebench import fit_overheads
from planner.machine import (FORMAT, FORMAT_V1, Machine, default_machine_path, find_machine, load_machine,
                             load_machines, machine_calibration, save_machine)


def _machine(**kw) -> Machine:
    base = dict(device_type="cpu", backend="gloo", ranks=2, threads=1, action_overhead_ms=0.3, comm_latency_ms=0.13,
                comm_bandwidth_bytes_per_s=1.5e9, step_overhead_ms=4.0, optimizer_ms_per_mib={"adam": 1.2},
                concurrent_compute_ratio=1.1, measured={"load_average": 0.5})
    base.update(kw)
    return Machine(**base)


def test_round_trip_and_calibration(tmp_path):
    m = _machine()
    path = save_machine(m, tmp_path / "sub" / "machine.json")
    assert load_machine(path) == m
    cal = machine_calibration(m)
    assert (cal.compute_scale, cal.action_overhead_ms, cal.comm_latency_ms) == (1.0, 0.3, 0.13)
    assert cal.comm_bandwidth_bytes_per_s == 1.5e9 and cal.step_overhead_ms == 4.0
    # the optimizer's measured cost joins the step overhead only when asked (profiles without optimizer times)
    assert machine_calibration(m, optimizer="adam", optimizer_param_bytes=2 * 2**20).step_overhead_ms == pytest.approx(6.4)


@pytest.mark.parametrize("change, message", [
    ({"action_overhead_ms": -1.0}, "action_overhead_ms -1.0 is out of range"),
    ({"comm_bandwidth_bytes_per_s": 1e308}, "out of range"),
    ({"step_overhead_ms": float("nan")}, "out of range"),
    ({"ranks": 0}, "ranks 0 must be an integer"),
    ({"backend": "mpi"}, "backend 'mpi'"),
    ({"optimizer_ms_per_mib": {"adma": 1.0}}, "did you mean 'adam'"),
])
def test_values_are_bounded(change, message):
    with pytest.raises(PplanError, match=message):
        _machine(**change)


def test_reading_is_strict(tmp_path):
    p = tmp_path / "m.json"
    data = _machine().to_dict()
    p.write_text(json.dumps(dict(data, action_overhead=1.0)))
    with pytest.raises(PplanError, match="did you mean 'action_overhead_ms'"):
        load_machine(p)
    p.write_text(json.dumps({k: v for k, v in data.items() if k != "comm_latency_ms"}))
    with pytest.raises(PplanError, match="lacks comm_latency_ms"):
        load_machine(p)
    p.write_text('{"format": "pplan-machine/1", "ranks": 1e400}')
    with pytest.raises(PplanError):
        load_machine(p)


@pytest.mark.parametrize("body, says", [
    # a format 2 body under format 1's name, and the reverse: both formats named, not an unknown key
    (lambda m: {"format": FORMAT_V1, "entries": [m]},
     f"says format {FORMAT_V1} but has 'entries', the list of a {FORMAT} file; this pplan reads {FORMAT}"),
    (lambda m: dict(m, format=FORMAT), f"says format {FORMAT} but has 'action_overhead_ms' at the top level"),
    (lambda m: {"format": "pplan-machine/3", "entries": [m]}, f"is a 'pplan-machine/3' file; this pplan reads {FORMAT}"),
])
def test_a_format_that_does_not_match_the_body_names_both_formats(tmp_path, body, says):
    p = tmp_path / "m.json"
    p.write_text(json.dumps(body(_machine().to_dict())))
    with pytest.raises(PplanError) as e:
        load_machines(p)
    assert says in e.value.message and "unknown key" not in e.value.one_line()


def test_the_hardware_name_older_files_carry_is_read_and_dropped(tmp_path):
    # `calibrate --machine --hardware NAME` stored it unchecked; nothing read it, so it is gone
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"format": FORMAT, "entries": [dict(_machine().to_dict(), hardware="a100-80gb")]}))
    assert load_machine(p) == _machine() and "hardware" not in _machine().to_dict()


def test_find_machine_honours_env_default_and_device_type(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("PPLAN_MACHINE", raising=False)
    assert default_machine_path() == tmp_path / "cache" / "pplan" / "machine.json"
    assert find_machine() is None  # nothing measured yet
    save_machine(_machine())
    assert find_machine() == _machine()
    assert find_machine(device_type="cuda") is None  # measured on cpu/gloo: not applied to GPU runs
    monkeypatch.setenv("PPLAN_MACHINE", "off")
    assert find_machine() is None
    other = save_machine(_machine(step_overhead_ms=9.0), tmp_path / "other.json")
    monkeypatch.setenv("PPLAN_MACHINE", str(other))
    assert find_machine().step_overhead_ms == 9.0


def test_a_broken_pplan_machine_names_the_variable_in_commands_that_name_no_file(tmp_path, monkeypatch, pplan,
                                                                                tiny_gpt_csv):
    """A variable set long ago, pointing at a file since moved, failed every partition with
    "machine file '...' does not exist" and no hint of where that path came from."""
    missing = tmp_path / "moved.json"
    monkeypatch.setenv("PPLAN_MACHINE", str(missing))
    code, out, err = pplan("partition", tiny_gpt_csv, "--devices", 2, "--global-batch", 8, "--out", tmp_path / "a.json")
    assert code == 2 and not (tmp_path / "a.json").exists()
    assert err.strip() == (f"pplan: error: $PPLAN_MACHINE: machine file {str(missing)!r} does not exist; point it at a "
                           "file `pplan calibrate --machine` wrote, or set PPLAN_MACHINE=off to predict without one")
    with pytest.raises(PplanError, match="^machine file .* does not exist$"):  # a path given is named as given
        find_machine(missing)


def test_fit_overheads_recovers_action_and_step_costs():
    # measured = base + k x a + c with a = 0.25 ms per action on the path, c = 3 ms per step
    cases = [(base + k * 0.25 + 3.0, base, k) for base, k in ((0.7, 6.0), (2.4, 16.0), (1.7, 18.0), (3.3, 34.0))]
    a, c = fit_overheads(cases)
    assert a == pytest.approx(0.25) and c == pytest.approx(3.0)
    # a free fit that would need a negative step overhead goes through the origin instead
    a, c = fit_overheads([(0.5 + 2.0, 0.5, 10.0), (1.0 + 5.0, 1.0, 20.0)])
    assert c == 0.0 and a > 0
    assert fit_overheads([]) == (0.0, 0.0)


def test_partition_predicts_with_the_machine_file_when_the_profile_has_no_calibration(tmp_path, monkeypatch, pplan,
                                                                                     tiny_gpt_csv):
    prof = tiny_gpt_csv
    machine = save_machine(_machine(), tmp_path / "machine.json")
    monkeypatch.setenv("PPLAN_MACHINE", str(machine))
    code, out, err = pplan("partition", prof, "--devices", 2, "--global-batch", 8, "--out", tmp_path / "a.json")
    assert code == 0, err
    assert f"basis: calibrated by {machine}" in out
    monkeypatch.setenv("PPLAN_MACHINE", "off")
    code, out, _ = pplan("partition", prof, "--devices", 2, "--global-batch", 8, "--out", tmp_path / "b.json")
    assert code == 0 and "basis: uncalibrated" in out
    # a calibration of the profile's own wins over the machine file
    monkeypatch.setenv("PPLAN_MACHINE", str(machine))
    code, out, _ = pplan("partition", prof, "--devices", 2, "--global-batch", 8, "--calibration", "none", "--out", tmp_path / "c.json")
    assert code == 0 and "basis: uncalibrated" in out
