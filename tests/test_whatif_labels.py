"""What-ifs that say what they changed, and flags a what-if would silently ignore refused: a sweep with
the flag it sweeps, --keep with nothing to keep or against the counts given; the simulation JSON's
`what_if` and how `pplan report` presents such a simulation (not as the plan's)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.errors import PplanError
from planner.plan import load_plan
from planner.report.fig_schedule import caption
from planner.report.inputs import ReportInputs, load_sim, read_timeline
from planner.report.summary import key_numbers
from planner.simulation.result import SimulationRecord
from planner.whatif import WhatIf, what_if


@pytest.fixture()
def work(sim_work: Path) -> Path:
    return sim_work  # plan.json: 3 devices, 1f1b, 8 micro-batches (global batch 8 x its size)


@pytest.mark.parametrize("flags, named", [
    (("--sweep", "microbatches=2,4", "--microbatches", "4"), ("--sweep microbatches", "--microbatches 4")),
    (("--sweep", "schedule=gpipe,zb", "--schedule", "zb"), ("--sweep schedule", "--schedule zb")),
    (("--sweep", "microbatches=2,4", "--micro-batch-size", "2"), ("--sweep microbatches", "--micro-batch-size 2")),
    (("--keep", "micro-batch-size"), ("--keep micro-batch-size", "--microbatches")),
    (("--keep", "global-batch", "--bandwidth", "1GB/s"), ("--keep global-batch", "--microbatches")),
])
def test_a_flag_the_what_if_would_ignore_is_refused(work: Path, run_cli, flags, named) -> None:
    out = work / "a.json"
    r = run_cli("simulate", str(work / "plan.json"), *flags, "--out", str(out))
    assert r.returncode == 2, r.stdout + r.stderr
    line = r.stderr.strip().splitlines()[0]
    assert all(n in line for n in named), line
    assert "Traceback" not in r.stderr and not out.exists()


def test_library_callers_get_the_sweep_check_too(work: Path) -> None:
    with pytest.raises(PplanError, match="--schedule zb"):
        what_if(work / "plan.json", WhatIf(schedule="zb"), sweep="schedule=gpipe,1f1b")


def test_keep_global_batch_against_counts_of_another_batch_is_refused(work: Path, run_cli) -> None:
    plan = load_plan(work / "plan.json")
    share = plan.n_microbatches * plan.micro_batch_size
    r = run_cli("simulate", str(work / "plan.json"), "--microbatches", str(2 * share), "--micro-batch-size", "1",
                "--keep", "global-batch")
    assert r.returncode == 2 and f"is not the plan's global batch {share}" in r.stderr
    # the same counts without --keep: the global batch is their product, as the help says
    assert run_cli("simulate", str(work / "plan.json"), "--microbatches", str(2 * share), "--micro-batch-size", "1").returncode == 0
    # counts whose product is the plan's batch keep it, so --keep global-batch is fine
    assert run_cli("simulate", str(work / "plan.json"), "--microbatches", str(share), "--micro-batch-size", "1",
                   "--keep", "global-batch").returncode == 0


def test_sweep_of_counts_at_a_size_kept_is_allowed(work: Path, run_cli) -> None:
    r = run_cli("simulate", str(work / "plan.json"), "--sweep", "microbatches=2,4", "--micro-batch-size", "2",
                "--keep", "micro-batch-size")
    assert r.returncode == 0, r.stderr
    assert "micro-batch size kept" in r.stdout


def test_latency_error_names_the_flag(work: Path, run_cli) -> None:
    r = run_cli("simulate", str(work / "plan.json"), "--latency", "-1ms")
    assert r.returncode == 2 and "--latency '-1ms'" in r.stderr


def test_what_if_is_said_in_the_table_and_recorded_in_the_json(work: Path, run_cli) -> None:
    plain = run_cli("simulate", str(work / "plan.json"), "--out", str(work / "plan_sim.json"))
    assert "what-if" not in plain.stdout
    assert json.loads((work / "plan_sim.json").read_text())["what_if"] is None
    r = run_cli("simulate", str(work / "plan.json"), "--bandwidth", "10MB/s", "--schedule", "gpipe", "--out", str(work / "wi.json"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].startswith("what-if: schedule gpipe (plan: 1f1b), bandwidth 10MB/s (plan: "), lines[1]
    data = json.loads((work / "wi.json").read_text())
    assert data["what_if"]["schedule"] == {"plan": "1f1b", "now": "gpipe"}
    assert data["what_if"]["bandwidth_bytes_per_s"]["now"] == 10e6
    assert load_sim(work / "wi.json").what_if == data["what_if"]  # the report reads it back
    printed = json.loads(run_cli("simulate", str(work / "plan.json"), "--latency", "1ms", "--json").stdout)
    assert printed["what_if"]["latency_ms"]["now"] == 1.0


def test_older_simulation_json_without_what_if_still_loads_and_a_typo_is_refused(work: Path, run_cli) -> None:
    run_cli("simulate", str(work / "plan.json"), "--out", str(work / "s.json"))
    data = json.loads((work / "s.json").read_text())
    del data["what_if"]
    older = SimulationRecord.from_dict(data)
    assert older.what_if is None and "what_if" not in older.to_dict()  # written back as it was read
    with pytest.raises(PplanError, match="what_if"):
        SimulationRecord.from_dict({**data, "what_if": {"bandwith_bytes_per_s": {"plan": 1, "now": 2}}})
    with pytest.raises(PplanError, match="what_if"):
        SimulationRecord.from_dict({**data, "what_if": {"schedule": "zb"}})


def test_report_says_a_what_if_simulation_is_not_the_plans(work: Path, run_cli) -> None:
    run_cli("simulate", str(work / "plan.json"), "--bandwidth", "10MB/s", "--out", str(work / "wi.json"),
            "--timeline", str(work / "t.csv"))
    sim = load_sim(work / "wi.json")
    plan = load_plan(work / "plan.json")
    inputs = ReportInputs(plan=plan, sim=sim, sources={"sim": "wi.json"})
    rows = dict(key_numbers(inputs))
    assert "bandwidth 10MB/s (plan: " in rows["what-if simulation (wi.json)"]
    assert "predicted iteration time (what-if simulation)" in rows
    # the plan's own (shorter) timeline drawn beside the what-if's time: the change explains it, not step overhead
    short = tuple(r._replace(end_ms=r.end_ms / 10, start_ms=r.start_ms / 10) for r in read_timeline(work / "t.csv"))
    text = caption(replace(inputs, timeline=short))
    assert "what-if" in text and "bandwidth 10MB/s" in text and "step overhead" not in text
    older = replace(inputs, sim=replace(sim, what_if=None), timeline=short)  # no what_if recorded: as before
    assert "step overhead" in caption(older)
    assert "predicted iteration time (simulation)" in dict(key_numbers(older))
