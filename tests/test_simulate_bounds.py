"""What `pplan simulate` will do is bounded before it starts: the actions of one simulation (a
lower bound when its timeline is kept for --json/--out/--timeline/--plot), the values and the total
actions of a --sweep; the timeline is recorded only for the outputs that show it; and --hardware,
which only re-prices data/tensor-parallel plans, is refused for a one-pipeline plan instead of
being ignored. Commands run in this process (conftest's `pplan`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers.cli import one_error_line
from planner.errors import PlanError, PplanError, ScheduleError
from planner.limits import MAX_SIMULATED_ACTIONS, MAX_SWEEP_VALUES, MAX_TIMELINE_ACTIONS


@pytest.fixture()
def work(sim_work: Path) -> Path:
    return sim_work  # plan.json: 3 stages, 1f1b, 8 micro-batches of 4 (2 actions per micro-batch and stage)


def test_the_action_bounds_refuse_one_past_them_and_accept_them() -> None:
    from planner.simulate import check_action_count

    most = MAX_SIMULATED_ACTIONS // (2 * 5)  # 1f1b on 5 stages
    assert check_action_count("1f1b", 5, most) == 10 * most
    with pytest.raises(ScheduleError, match=f"{MAX_SIMULATED_ACTIONS:,}"):
        check_action_count("1f1b", 5, most + 1)
    keep = MAX_TIMELINE_ACTIONS // (3 * 5)  # zb: F, I and W per micro-batch and stage
    assert check_action_count("zb", 5, keep, timeline=True) == 15 * keep
    with pytest.raises(ScheduleError, match="leave out those outputs") as refused:
        check_action_count("zb", 5, keep + 1, timeline=True)
    assert f"{MAX_TIMELINE_ACTIONS:,}" in str(refused.value)


@pytest.mark.parametrize("outputs, recorded", [
    ([], False), (["--json"], True), (["--out", "s.json"], True), (["--timeline", "t.csv"], True),
    (["--plot", "g.png"], True),
])
def test_the_timeline_is_recorded_only_for_outputs_that_show_it(work: Path, pplan, monkeypatch, outputs: list[str],
                                                                recorded: bool) -> None:
    import planner.simulate

    seen: list[bool] = []
    real = planner.simulate.simulate

    def spy(*args: Any, **kwargs: Any):
        seen.append(kwargs["record_timeline"])
        return real(*args, **kwargs)

    monkeypatch.setattr(planner.simulate, "simulate", spy)
    args = [a if a.startswith("--") else str(work / a) for a in outputs]
    code, _out, err = pplan("simulate", work / "plan.json", *args)
    assert code == 0, err
    assert seen == [recorded]


def test_the_library_keeps_no_timeline_unless_asked(work: Path) -> None:
    from planner.whatif import what_if

    assert what_if(work / "plan.json").sim.timeline == ()
    kept = what_if(work / "plan.json", record_timeline=True).sim
    assert kept.timeline and kept.memory_timeline


def test_an_output_that_needs_the_timeline_has_the_lower_bound(work: Path, pplan) -> None:
    m = MAX_TIMELINE_ACTIONS // (2 * 3) + 1  # just past it on 3 stages, far below the bound without a timeline
    line = one_error_line(*pplan("simulate", work / "plan.json", "--keep", "micro-batch-size", "--microbatches", m,
                            "--out", work / "s.json")[::2])
    assert f"{2 * 3 * m:,} actions" in line and f"{MAX_TIMELINE_ACTIONS:,}" in line and "leave out those outputs" in line
    assert not (work / "s.json").exists()


def test_a_sweep_lists_a_bounded_number_of_values(work: Path, pplan) -> None:
    values = ",".join(str(v) for v in range(1, MAX_SWEEP_VALUES + 2))
    line = one_error_line(*pplan("simulate", work / "plan.json", "--sweep", f"microbatches={values}",
                            "--out", work / "s.json")[::2])
    assert f"{MAX_SWEEP_VALUES + 1} values" in line and str(MAX_SWEEP_VALUES) in line
    assert not (work / "s.json").exists()


def test_a_sweep_is_bounded_by_its_actions_together(work: Path, pplan) -> None:
    # each value alone is within the bound; together they are not
    half = MAX_SIMULATED_ACTIONS // (2 * 3)
    values = (half, half - 1)
    line = one_error_line(*pplan("simulate", work / "plan.json", "--keep", "micro-batch-size", "--sweep",
                            f"microbatches={values[0]},{values[1]}", "--out", work / "s.json")[::2])
    assert f"{2 * 3 * sum(values):,} actions" in line and f"{MAX_SIMULATED_ACTIONS:,}" in line
    assert not (work / "s.json").exists()
    from planner.plan import load_plan
    from planner.whatif import check_sweep_actions

    plan = load_plan(work / "plan.json")
    assert check_sweep_actions(plan, "microbatches", [half], "micro-batch-size") == 2 * 3 * half
    # with the global batch kept (32 samples), 64 micro-batches cannot be made: it counts nothing
    assert check_sweep_actions(plan, "microbatches", [4, 64], "global-batch") == 2 * 3 * 4
    assert check_sweep_actions(plan, "schedule", ["gpipe", "zb"]) == (2 + 3) * 3 * 8


def test_hardware_is_refused_for_a_one_pipeline_plan(work: Path, pplan) -> None:
    line = one_error_line(*pplan("simulate", work / "plan.json", "--hardware", "h100-80gb", "--out", work / "s.json")[::2])
    assert "--hardware 'h100-80gb'" in line and "one pipeline of 3 devices" in line and "drop --hardware" in line
    assert not (work / "s.json").exists()
    line = one_error_line(*pplan("simulate", work / "plan.json", "--hardware", "h100-80gb", "--sweep", "schedule=gpipe,1f1b")[::2])
    assert "one pipeline" in line  # refused as itself, not as every row of the sweep failing

    from planner.hardware import PRESETS
    from planner.simulate import simulate
    from planner.whatif import load_setup

    setup = load_setup(work / "plan.json")
    with pytest.raises(PlanError, match="only data/tensor-parallel"):
        simulate(setup.plan, setup.profile, hardware=PRESETS["h100-80gb"])


def test_a_sweep_value_list_is_checked_by_the_library_too() -> None:
    from planner.whatif import parse_sweep

    assert parse_sweep("microbatches=" + ",".join(map(str, range(1, MAX_SWEEP_VALUES + 1))))[1][-1] == MAX_SWEEP_VALUES
    with pytest.raises(PplanError, match="more than"):
        parse_sweep("microbatches=" + ",".join(map(str, range(1, MAX_SWEEP_VALUES + 2))))
