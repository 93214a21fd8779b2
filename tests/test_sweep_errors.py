"""What `pplan simulate --sweep` says about values that cannot run: when none can, one error line naming
each value with its reason (at most MOST_NAMED, then how many more), each reason's hint once, and a value
that does run; when only some cannot, the table's rows say why, and beside --json stderr names them.
Commands run in this process (conftest's `pplan`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers.cli import one_error_line
from planner.errors import PplanError


@pytest.fixture()
def work(sim_work: Path) -> Path:
    return sim_work  # plan.json: 3 devices, 1f1b, 8 micro-batches of 4 (global batch 32)


def test_a_sweep_none_of_whose_values_run_names_each_with_its_reason(work: Path, pplan) -> None:
    line = one_error_line(*pplan("simulate", work / "plan.json", "--sweep", "microbatches=1,2,5")[::2])
    assert "no value of the sweep can run (3 tried)" in line
    # each value with its own reason, in the order given: not only the first value's
    assert re.search(r"microbatches=1: schedule 1f1b needs .*M=1 < P=3; microbatches=2: .*M=2 < P=3; "
                     r"microbatches=5: micro-batches 5 does not divide the global batch 32", line), line
    # the reasons' hints once each (1 and 2 share theirs), then a value that runs: the plan's own
    assert line.count("use --microbatches 3 or more, or gpipe") == 1
    assert line.count("choose a divisor") == 1
    # each hint says which values it is for (one after the last reason once read as that value's)
    assert "; for microbatches=1, 2: use --microbatches 3 or more, or gpipe; for microbatches=5: choose a divisor" in line
    assert line.endswith("or sweep values that can run, e.g. the plan's own: --sweep microbatches=8")
    assert " more;" not in line  # three values: none left uncounted


def test_the_refusal_names_a_bounded_number_of_values(work: Path, pplan) -> None:
    from planner.whatif.sweep import MOST_NAMED

    bad = [v for v in range(3, 200) if 32 % v][:MOST_NAMED + 5]  # none divides the global batch 32
    line = one_error_line(*pplan("simulate", work / "plan.json", "--sweep", "microbatches=" + ",".join(map(str, bad)))[::2])
    named = re.findall(r"microbatches=(\d+): ", line)
    assert [int(v) for v in named] == bad[:MOST_NAMED]
    assert f"({len(bad)} tried)" in line and "; and 5 more;" in line
    assert line.count("choose a divisor") == 1


def test_a_schedule_sweep_that_cannot_run_names_the_schedule(work: Path, pplan) -> None:
    line = one_error_line(*pplan("simulate", work / "plan.json", "--sweep", "schedule=interleaved")[::2])
    assert "schedule=interleaved: schedule 'interleaved' needs at least 2 stages per device" in line
    assert line.endswith("e.g. the plan's own: --sweep schedule=1f1b")


def test_when_the_plan_itself_cannot_run_the_hint_says_so(work: Path) -> None:
    from planner.whatif import what_if

    plan = json.loads((work / "plan.json").read_text())
    plan["stages"][-1]["layers"] = [4, 5]  # the profile has 6 layers: no schedule can run these stages
    (work / "short.json").write_text(json.dumps(plan))
    with pytest.raises(PplanError) as caught:
        what_if(work / "short.json", sweep="schedule=gpipe,zb")
    e = caught.value
    assert "schedule=gpipe: stages cover layers [0, 5) but the model has 6 layers; schedule=zb: stages cover" in e.message
    assert "the plan itself (schedule=1f1b) cannot run" in e.hint and "plan's own" not in e.hint


def test_skipped_values_are_named_in_the_table_and_beside_json(work: Path, pplan) -> None:
    code, out, err = pplan("simulate", work / "plan.json", "--sweep", "microbatches=1,4,5,8")
    assert code == 0, err
    cannot = [ln for ln in out.splitlines() if "cannot run" in ln]
    assert len(cannot) == 2 and "M=1 < P=3" in cannot[0] and "5 does not divide" in cannot[1]
    code, out, err = pplan("simulate", work / "plan.json", "--sweep", "microbatches=1,4,5,8", "--json")
    assert code == 0, err
    rows = json.loads(out)["rows"]  # stdout stays JSON; the note is on stderr
    assert [r["value"] for r in rows if r["error"]] == [1, 5]
    assert "hint" not in rows[0] and rows[0]["error"].endswith("use --microbatches 3 or more, or gpipe")
    note = [ln for ln in err.splitlines() if ln.startswith("note:")]
    assert len(note) == 1 and note[0].startswith("note: 2 of 4 values cannot run and have no prediction: ")
    assert "microbatches=1: schedule 1f1b" in note[0] and "microbatches=5: micro-batches 5 does not divide" in note[0]
    code, out, err = pplan("simulate", work / "plan.json", "--sweep", "microbatches=4,8", "--json")
    assert code == 0 and "note:" not in err  # every value runs: nothing skipped, nothing said


def test_a_row_keeps_its_reason_and_hint_apart(work: Path) -> None:
    from planner.whatif import load_setup
    from planner.whatif.sweep import run_sweep, skipped_note

    setup = load_setup(work / "plan.json")
    rows = run_sweep(setup.plan, setup.profile, "microbatches", [3, 4])
    bad, good = rows
    assert bad.reason == "micro-batches 3 does not divide the global batch 32"
    assert bad.error == f"{bad.reason}; {bad.hint}" and bad.hint.startswith("choose a divisor")
    assert good.error is None and good.reason is None and good.iteration_ms > 0
    assert skipped_note("microbatches", rows) == ("1 of 2 values cannot run and have no prediction: "
                                                  "microbatches=3: micro-batches 3 does not divide the global batch 32")
    assert skipped_note("microbatches", [good]) is None and skipped_note("microbatches", [bad]) is None
