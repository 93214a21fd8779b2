"""Safe to open a file someone sent you: a plan or profile runs no code and has bounded sizes.

Every case goes through the real CLI and checks what a user sees: exit code 2, one `pplan: error:`
line, no traceback, no output file, and nothing executed (a marker file the crafted model would
create does not exist). Model trust runs in a subprocess (`python -m cli.app`), where no earlier
test can have imported or run anything already; the file and output checks run the CLI's entry
point in this process (helpers.cli.run_in_repo; a subprocess per case cost ~0.35 s of CPU).
Timeouts here are hang guards (a FIFO read blocks forever), not timing assertions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from planner.errors import ModelSpecError
from planner.models.trust import check_model_trusted

from helpers.cli import run_in_repo, run_pplan
from helpers.plans import write_plan, write_synthetic_profile

FACTORY = "tests.factory_models:with_data"  # a legitimate 2-layer factory with its own data
_GUARD_S = 60


def _refused(res, *words: str) -> str:
    """The single error line of a refused command (asserting exit 2, no traceback)."""
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stdout + res.stderr, res.stderr
    # one line: `pplan run` announces "running PLAN: ..." only once every check has passed
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pplan: error:"), res.stderr
    assert "step 1/" not in res.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def _os_system_plan(tmp_path: Path, marker: Path) -> Path:
    return write_plan(tmp_path / "plan.json", f"os:system:command=touch {marker}", "gpipe", 1, [(0, 2)], n_microbatches=2)


# ---- model trust -------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["run", "calibrate"])
def test_a_plan_naming_os_system_runs_nothing(tmp_path, command):
    marker = tmp_path / "pwned"
    plan = _os_system_plan(tmp_path, marker)
    out = tmp_path / "run.json"
    res = run_pplan(command, str(plan), "--device", "cpu", "--steps", "1", "--out", str(out), timeout=_GUARD_S)
    line = _refused(res, "os:system", "--trust-model", "--model")
    assert "only the file names it" in line
    assert not marker.exists(), "the plan's model was executed"
    assert not out.exists()


def test_a_factory_module_named_by_a_plan_is_not_even_imported(tmp_path):
    marker = tmp_path / "imported"
    (tmp_path / "evil_model.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef build():\n    return None\n", encoding="utf-8")
    plan = write_plan(tmp_path / "plan.json", "evil_model:build", "gpipe", 1, [(0, 2)], n_microbatches=2)
    res = run_pplan("run", str(plan), "--device", "cpu", "--steps", "1", cwd=tmp_path, timeout=_GUARD_S)
    _refused(res, "evil_model:build")
    assert not marker.exists(), "the plan's module was imported"


def test_a_model_on_the_command_line_must_match_the_plan(tmp_path):
    marker = tmp_path / "pwned"
    plan = _os_system_plan(tmp_path, marker)
    res = run_pplan("run", str(plan), "--device", "cpu", "--model", "gpt:layers=2", timeout=_GUARD_S)
    _refused(res, "--model 'gpt:layers=2' does not match", "os:system")
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.parametrize("vouch", [["--model", FACTORY], ["--trust-model"]], ids=["matching-model", "trust-model"])
def test_a_factory_the_user_vouches_for_runs(tmp_path, vouch):
    plan = write_plan(tmp_path / "plan.json", FACTORY, "gpipe", 1, [(0, 2)], n_microbatches=2)
    out = tmp_path / "run.json"
    res = run_pplan("run", str(plan), "--device", "cpu", "--steps", "1", "--warmup", "0", "--out", str(out), *vouch)
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text())["steps"] == 1


def test_the_library_refuses_a_factory_the_caller_did_not_vouch_for(tmp_path, monkeypatch):
    """`run_plan(load_plan(path))`, as a caller's own script does it: a plan someone sent imports
    nothing unless the caller names its model or trusts it, as the CLI's --model/--trust-model."""
    import sys

    from planner.execute import RunOptions, run_plan
    from planner.plan import load_plan

    marker = tmp_path / "imported"
    (tmp_path / "sent_model.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef build():\n    return None\n",
                                            encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))  # importable, were it imported
    path = write_plan(tmp_path / "plan.json", "sent_model:build", "gpipe", 1, [(0, 2)], n_microbatches=2)
    opts = RunOptions(device="cpu", steps=1)
    with pytest.raises(ModelSpecError, match="'sent_model:build', which is Python code"):
        run_plan(load_plan(path), opts, plan_path=str(path))
    with pytest.raises(ModelSpecError, match="--model 'mlp:layers=2' does not match"):
        run_plan(load_plan(path), opts, plan_path=str(path), model="mlp:layers=2")
    assert not marker.exists() and "sent_model" not in sys.modules
    # vouched for: imported and built (this factory returns no model, which the build then refuses)
    with pytest.raises(ModelSpecError, match="the factory returned NoneType"):
        run_plan(load_plan(path), opts, plan_path=str(path), trust_model=True)
    assert marker.exists()
    sys.modules.pop("sent_model", None)  # imported from this test's folder: no other test may find it


def test_the_runtime_is_checked_by_the_library():
    from planner.errors import PplanError
    from planner.execute.run import runtime_prefers_torch

    assert runtime_prefers_torch("torch") and not runtime_prefers_torch("plan")
    with pytest.raises(PplanError, match="--runtime 'jax' is unknown"):
        runtime_prefers_torch("jax")


def test_the_trust_rule():
    check_model_trusted("gpt:layers=2", None, False)  # built-ins run pplan's own code
    check_model_trusted(None, None, False)  # a missing model is reported elsewhere
    check_model_trusted(FACTORY, None, True)
    check_model_trusted(FACTORY, f" {FACTORY} ", False)
    with pytest.raises(ModelSpecError, match="Python code"):
        check_model_trusted(FACTORY, None, False)
    with pytest.raises(ModelSpecError, match="does not match"):
        check_model_trusted("mlp:layers=2", "gpt:layers=2", False)
    with pytest.raises(ModelSpecError, match="unknown model"):
        check_model_trusted("not a spec", None, True)


# ---- outputs are checked before anything runs ------------------------------------------------------

@pytest.mark.parametrize("option, below", [("--out", "run.json"), ("--timeline", "t.csv"), ("--checkpoint-dir", "ck")])
@pytest.mark.parametrize("command", ["run", "calibrate"])
def test_an_unwritable_output_is_refused_before_any_rank_starts(tmp_path, command, option, below):
    # root can write into chmod'ed folders, so the unwritable place is a path below a regular file
    afile = tmp_path / "afile"
    afile.write_text("keep\n")
    prof = tmp_path / "syn.csv"
    spec = write_synthetic_profile(prof, 2, 2)
    plan = write_plan(tmp_path / "plan.json", spec, "gpipe", 1, [(0, 2)], n_microbatches=2, profile=prof)
    res = run_in_repo(command, str(plan), "--device", "cpu", "--steps", "1", option, str(afile / below))
    _refused(res, option, "not a folder")
    assert afile.read_text() == "keep\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "plan.json", "syn.csv"]


def test_outputs_are_checked_before_the_plan_is_read(tmp_path):
    (tmp_path / "afile").write_text("")
    res = run_in_repo("run", str(tmp_path / "missing.json"), "--out", str(tmp_path / "afile" / "x.json"))
    _refused(res, "--out")


def test_calibrate_refuses_an_unwritable_calibration_before_running(tmp_path):
    prof = tmp_path / "syn.csv"
    spec = write_synthetic_profile(prof, 2, 2)
    plan = write_plan(tmp_path / "plan.json", spec, "gpipe", 1, [(0, 2)], n_microbatches=2, profile=prof)
    (tmp_path / "syn.calibration.json").mkdir()  # where the fit would be written
    res = run_in_repo("calibrate", str(plan), "--device", "cpu", "--steps", "1")
    _refused(res, "calibration", "syn.calibration.json", "folder")


# ---- calibrate --from-run reads a run JSON with bounds ---------------------------------------------

def _from_run_setup(tmp_path: Path) -> Path:
    prof = tmp_path / "syn.csv"
    spec = write_synthetic_profile(prof, 2, 2)
    return write_plan(tmp_path / "plan.json", spec, "gpipe", 1, [(0, 2)], n_microbatches=2, profile=prof)


def test_from_run_refuses_a_fifo(tmp_path):
    plan = _from_run_setup(tmp_path)
    fifo = tmp_path / "run.json"
    os.mkfifo(fifo)
    res = run_in_repo("calibrate", str(plan), "--from-run", str(fifo))
    _refused(res, "not a regular file")
    assert not (tmp_path / "syn.calibration.json").exists()


_RANK = {"rank": 0, "device": 0, "host": "h", "stages": [0], "busy_ms": 5.0, "action_ms": {"0F": 1.0, "0B": 2.0}}


@pytest.mark.parametrize("change, words", [
    ({"iteration_ms_measured": "NaN"}, ["NaN"]),
    ({"ranks": [dict(_RANK, stages=[7])]}, ["'stages' is 7", "not in 0..0"]),
    ({"ranks": [dict(_RANK, action_ms={"0F": "slow"})]}, ["action_ms", "'slow'"]),
    ({"ranks": [dict(_RANK, action_ms={"0F": -3.0})]}, ["'action_ms'['0F']", "-3.0", "not a time from 0"]),
    ({"ranks": "all"}, ["run field 'ranks' must be a list of objects, got 'all'"]),
    ({"transfer_gaps": [[1.0, 2.0, 3.0]]}, ["transfer_gaps[0]", "[bytes, ms] pair"]),
    ({"step_ms": None}, ["run field 'step_ms' must be a list of numbers"]),
], ids=["nan", "stage-out-of-range", "text-time", "negative-time", "ranks-not-list", "gap-not-pair", "steps-null"])
def test_from_run_refuses_a_malformed_run_on_one_line(tmp_path, change, words):
    plan = _from_run_setup(tmp_path)
    path = tmp_path / "run.json"
    run = {"format": "pplan-run/1", "plan": "plan.json", "model": None, "schedule": "gpipe", "runtime": "ScheduleGPipe",
           "device_type": "cpu", "n_ranks": 1, "n_stages": 1, "micro_batch_size": 1, "n_microbatches": 2,
           "optimizer": "adam", "steps": 3, "warmup": 1, "iteration_ms_measured": 10.0, "iteration_ms_predicted": None,
           "error_pct": None, "losses": [], "loss_steps": [], "step_ms": [10.0, 10.0], "measured_steps": [1],
           "timeline_step": 1, "ranks": [_RANK]}
    planned = json.loads(plan.read_text())  # a run of this very plan: only `change` is wrong
    run.update(model=planned["model"], micro_batch_size=planned["micro_batch_size"])
    text = json.dumps({**run, **change})
    path.write_text(text.replace('"NaN"', "NaN"))  # JSON has no NaN: the strict reader refuses it
    res = run_in_repo("calibrate", str(plan), "--from-run", str(path))
    _refused(res, str(path), *words)  # the file leads the line
    assert not (tmp_path / "syn.calibration.json").exists()


# ---- profiles: bounded reads, bounded sizes ----------------------------------------------------------

_HEADER = "layer,name,micro_batch_size,fwd_ms,bwd_ms,param_bytes,activation_bytes,output_bytes\n"


def test_a_layer_index_far_beyond_the_rows_is_refused_at_its_line(tmp_path):
    prof = tmp_path / "p.csv"
    prof.write_text(_HEADER + "0,a,1,1,2,10,1,1\n1000000000,x,1,1,2,10,1,1\n")
    out = tmp_path / "plan.json"
    res = run_in_repo("partition", str(prof), "--devices", "2", "--global-batch", "4", "--out", str(out))
    _refused(res, f"{prof}:3:", "layer index 1000000000", "2 data row(s)")
    assert not out.exists()


def test_fifty_thousand_micro_batch_sizes_plan_quickly(tmp_path):
    """Loading was quadratic in the sizes (77 s for these); the guard below is a hang guard."""
    prof = tmp_path / "p.csv"
    prof.write_text(_HEADER + "".join(f"0,a,{s},1,2,10,{s},{s}\n" for s in range(1, 50_001)))
    out = tmp_path / "plan.json"
    res = run_in_repo("partition", str(prof), "--devices", "1", "--global-batch", "8", "--out", str(out), timeout_s=30)
    assert res.returncode == 0, res.stderr
    assert out.exists()


def test_a_fifo_profile_is_refused_by_partition(tmp_path):
    fifo = tmp_path / "p.csv"
    os.mkfifo(fifo)
    res = run_in_repo("partition", str(fifo), "--devices", "2", "--global-batch", "4", "--out", str(tmp_path / "plan.json"))
    _refused(res, "not a regular file")


@pytest.mark.parametrize("command", ["run", "simulate"])
def test_a_plan_whose_profile_is_a_fifo_is_refused(tmp_path, command):
    fifo = tmp_path / "p.csv"
    os.mkfifo(fifo)
    plan = write_plan(tmp_path / "plan.json", "mlp:layers=2", "gpipe", 1, [(0, 2)], n_microbatches=2)
    data = json.loads(plan.read_text())
    data["profile"] = {"path": str(fifo), "sha256": "0" * 64}
    plan.write_text(json.dumps(data))
    args = ["--device", "cpu", "--steps", "1"] if command == "run" else ["--out", str(tmp_path / "sim.json")]
    res = run_in_repo(command, str(plan), *args)
    _refused(res, str(fifo), "not a regular file")
    assert not (tmp_path / "sim.json").exists()


def test_a_profile_with_bad_metadata_is_refused_by_run_before_launch(tmp_path):
    prof = tmp_path / "syn.csv"
    spec = write_synthetic_profile(prof, 2, 2)
    prof.write_text(prof.read_text().replace("# input_bytes_per_sample: 64", "# input_bytes_per_sample: 64\n# seed: -5"))
    plan = write_plan(tmp_path / "plan.json", spec, "gpipe", 1, [(0, 2)], n_microbatches=2, profile=prof)
    res = run_in_repo("run", str(plan), "--device", "cpu", "--steps", "1")
    _refused(res, f"{prof}:4:", "'seed'", "'-5'")

