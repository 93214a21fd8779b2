"""The machine file's `measured` block (where and when `pplan calibrate --machine` measured) is
checked value by value, not only by key: a 1,000-character string for `cores`, a case row nested
ten lists deep or a negative time is refused on one line naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.errors import PplanError
from planner.machine import CASE_KEYS, FORMAT_V1, Machine

CASE = {"schedule": "1f1b", "microbatches": 8, "measured_ms": 12.5, "step_spread_pct": 3.1, "simulated_base_ms": 9.0,
        "actions_on_path": 32.0, "predicted_ms": 12.2, "action_ms_median": None}
MEASURED = {"date": "2026-11-30T11:32:09Z", "host": "box", "cpu": "AMD EPYC 7B13", "cores": 2, "load_average": 0.41,
            "torch": "2.13.0+cpu", "seconds": 61.2, "cases": [CASE], "model": "synthetic:layers=2,fwd_ms=0,bwd_ms=0"}


def _file(measured: dict) -> dict:
    return {"format": FORMAT_V1, "device_type": "cpu", "backend": "gloo", "ranks": 2, "threads": 1,
            "action_overhead_ms": 0.24, "comm_latency_ms": 0.128, "comm_bandwidth_bytes_per_s": 3.3e9,
            "step_overhead_ms": 0.0, "measured": measured}


def test_what_the_bench_writes_is_read() -> None:
    assert set(CASE) == set(CASE_KEYS)
    assert Machine.from_dict(_file(MEASURED)).measured == MEASURED
    assert Machine.from_dict(_file({"load_average": None, "cases": []})).measured["load_average"] is None


@pytest.mark.parametrize("change, message", [
    ({"cores": "x" * 1000}, "machine measured.cores must be an integer, got 'xxxx"),
    ({"cores": 0}, "machine measured.cores 0 is out of range (1 to 1e+06)"),
    ({"cores": 2.5}, "machine measured.cores must be an integer, got '2.5'"),
    ({"host": "h" * 256}, "machine measured.host must be a string of at most 255 characters, got 256 characters"),
    ({"torch": 2}, "machine measured.torch must be a string of at most 64 characters, got int '2'"),
    ({"load_average": "high"}, "machine measured.load_average must be a number, got str 'high'"),
    ({"seconds": -1.0}, "machine measured.seconds -1.0 is out of range (0 to 1e+07)"),
    ({"cases": [[[[[]]]]]}, "machine measured.cases[0] must be an object, got list"),
    ({"cases": {"a": 1}}, "machine measured.cases must be a list of at most 64 rows, got dict"),
    ({"cases": [CASE] * 65}, "machine measured.cases must be a list of at most 64 rows, got 65 rows"),
    ({"cases": [dict(CASE, measured_ms=-3.0)]}, "machine measured.cases[0].measured_ms -3.0 is out of range"),
    ({"cases": [dict(CASE, microbatches=True)]}, "machine measured.cases[0].microbatches must be an integer"),
    ({"cases": [dict(CASE, schedule="s" * 65)]}, "machine measured.cases[0].schedule must be a string of at most 64"),
    ({"cases": [{"schedul": "1f1b"}]}, "machine measured.cases[0]: unknown key 'schedul'"),
])
def test_bad_values_are_refused(change: dict, message: str) -> None:
    with pytest.raises(PplanError) as e:
        Machine.from_dict(_file(dict(MEASURED, **change)))
    assert e.value.message.startswith(message), e.value.message


def test_simulate_with_such_a_machine_file_is_one_line(pplan, sim_work: Path, tmp_path: Path, monkeypatch) -> None:
    machine = tmp_path / "machine.json"
    machine.write_text(json.dumps(_file(dict(MEASURED, cores="x" * 1000))))
    monkeypatch.setenv("PPLAN_MACHINE", str(machine))
    code, _, err = pplan("simulate", sim_work / "plan.json")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{machine}: machine measured.cores must be an integer" in err and "x" * 50 not in err
