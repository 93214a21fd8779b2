"""`pplan calibrate`'s three ways (a plan run, --from-run, --machine) each refuse the options they
do not read, and --machine overwrites no file but a machine file (nothing is measured or run)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import cli.cmd_calibrate
from planner.machine import FORMAT, MachineSet, load_machines, save_machine

from helpers.machines import made_up_machine


@pytest.fixture
def runs(monkeypatch) -> list[object]:
    """The plans `pplan calibrate PLAN` handed to `pplan run`'s code (nothing runs)."""
    ran: list[object] = []
    monkeypatch.setattr(cli.cmd_calibrate, "run_command", lambda plan, **kw: ran.append(plan))
    return ran


def _refused(result: tuple[int, str, str], *says: str) -> None:
    code, out, err = result
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("pplan: error: ") and "Traceback" not in err, err
    for text in says:
        assert text in err, err


@pytest.mark.parametrize("args, says", [
    (["--steps", "0", "--timeline", "t.csv"], ["--steps 0, --timeline 't.csv': not used with --machine",
                                               "--steps goes with a plan run"]),
    (["--lr", "5", "--model", "mlp"], ["--lr 5.0, --model 'mlp': not used with --machine"]),
    (["--profile", "p.csv", "--checkpoint-dir", "ck"], ["--profile 'p.csv', --checkpoint-dir 'ck'",
                                                         "--profile goes with --from-run or a plan run"]),
    (["--steps", "10"], ["--steps 10: not used with --machine"]),  # given at its default value: still given
    (["--force", "--verbose"], ["--force, --verbose: not used with --machine"]),
    (["--from-run", "r.json"], ["--from-run 'r.json': not used with --machine", "another way to calibrate"]),
])
def test_machine_refuses_the_options_it_does_not_read(tmp_path, pplan, machine_bench, args, says):
    target = tmp_path / "machine.json"
    _refused(pplan("calibrate", "--machine", "--ranks", "2", "--out", target, *args), *says)
    assert machine_bench == [] and not target.exists()


def test_machine_refuses_a_plan_argument(tmp_path, pplan, machine_bench):
    _refused(pplan("calibrate", tmp_path / "plan.json", "--machine", "--out", tmp_path / "m.json"),
             "not used with --machine", "PLAN goes with --from-run or a plan run")
    assert machine_bench == []


def test_hardware_is_no_option_of_calibrate(tmp_path, pplan, machine_bench):
    # the name was stored unchecked in the machine file and never read
    code, _, err = pplan("calibrate", "--machine", "--ranks", "2", "--hardware", "nosuch", "--out", tmp_path / "m.json")
    assert code == 2 and "--hardware" in err and machine_bench == []


@pytest.mark.parametrize("args, says", [
    (["--steps", "3"], ["--steps 3: not used with --from-run", "goes with a plan run"]),
    (["--out", "x.json", "--timeline", "t.csv"], ["--out 'x.json', --timeline 't.csv': not used with --from-run"]),
    (["--ranks", "2", "--quick"], ["--ranks '2', --quick: not used with --from-run", "--ranks goes with --machine"]),
    (["--device", "cpu", "--trust-model"], ["--device 'cpu', --trust-model: not used with --from-run"]),
])
def test_from_run_refuses_the_options_it_does_not_read(tmp_path, pplan, runs, args, says):
    _refused(pplan("calibrate", tmp_path / "plan.json", "--from-run", tmp_path / "run.json", *args), *says)
    assert runs == []


@pytest.mark.parametrize("args, says", [
    (["--ranks", "2"], ["--ranks '2': not used when a plan is run", "--ranks goes with --machine"]),
    (["--quick"], ["--quick: not used when a plan is run"]),
])
def test_a_plan_run_refuses_the_machine_options(tmp_path, pplan, runs, args, says):
    _refused(pplan("calibrate", tmp_path / "plan.json", *args), *says)
    assert runs == []


def test_each_way_still_takes_its_own_options(tmp_path, pplan, machine_bench, runs):
    code, _, err = pplan("calibrate", tmp_path / "plan.json", "--steps", "3", "--timeline", tmp_path / "t.csv",
                         "--out", tmp_path / "r.json", "--threads", "1")
    assert code == 0 and len(runs) == 1, err
    code, _, err = pplan("calibrate", "--machine", "--ranks", "2", "--quick", "--threads", "1", "--json",
                         "--out", tmp_path / "m.json")
    assert code == 0 and machine_bench == [2], err


def test_machine_out_must_end_in_json(tmp_path, pplan, machine_bench):
    victim = tmp_path / "victim.csv"
    victim.write_text("name,fwd_ms\n")
    _refused(pplan("calibrate", "--machine", "--ranks", "2", "--out", victim), "must end in .json")
    assert machine_bench == [] and victim.read_text() == "name,fwd_ms\n"


def _plan_json(tmp_path, pplan) -> str:
    prof = tmp_path / "mlp.csv"
    shutil.copy(Path(__file__).resolve().parents[1] / "profiles" / "mlp.csv", prof)
    code, _, err = pplan("partition", prof, "-n", 2, "--global-batch", 8, "--out", tmp_path / "plan.json")
    assert code == 0, err
    return (tmp_path / "plan.json").read_text()


@pytest.mark.parametrize("content, says", [
    (None, "is a 'pplan-plan/1' file, not a pplan-machine/2 machine file"),
    ("layer,fwd_ms\nfc1,1.0\n", "is not a machine file (" ),
    ("", "is not a machine file ("),
    ("[1, 2]", "holds a JSON list, not a machine file"),
    ('{"format": "pplan-calibration/1", "compute_scale": 1.0}', "is a 'pplan-calibration/1' file"),
    ('{"weights": [1, 2]}', "is a JSON object with no format key"),
    ('{"format": "pplan-machine/3", "entries": []}', "is a 'pplan-machine/3' file"),
])
def test_machine_refuses_to_overwrite_another_file(tmp_path, pplan, machine_bench, content, says):
    target = tmp_path / "victim.json"
    target.write_text(_plan_json(tmp_path, pplan) if content is None else content)
    before = target.read_bytes()
    _refused(pplan("calibrate", "--machine", "--ranks", "2", "--out", target), says, "choose another --out")
    assert machine_bench == [] and target.read_bytes() == before


def test_machine_replaces_a_broken_machine_file_with_a_warning(tmp_path, pplan, machine_bench):
    target = save_machine(MachineSet((made_up_machine(4),)), tmp_path / "m.json")
    data = json.loads(target.read_text())
    data["entries"][0]["step_overhead_ms"] = -1.0  # what only remeasuring mends
    target.write_text(json.dumps(data))
    code, _, err = pplan("calibrate", "--machine", "--ranks", "2", "--out", target)
    assert code == 0 and machine_bench == [2], err
    assert "replacing the unreadable machine file" in err and "step_overhead_ms -1.0 is out of range" in err
    assert load_machines(target).ranks == (2,) and json.loads(target.read_text())["format"] == FORMAT
