"""`pplan demo`: the memory limit it chooses, the comparison plan, and one quick end-to-end run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from planner.demo import NOISE, QUICK, DemoSettings, choose_memory_limit, step_spread, uniform_plan
from planner.errors import InfeasibleError
from planner.partition.api import partition
from planner.partition.search import PartitionSettings
from planner.plan import load_plan
from planner.profiling.profile import load_profile

from helpers.cli import run_pplan

DATA = Path(__file__).parent / "data" / "report"
SETTINGS = DemoSettings(model="gpt:layers=6", micro_batch_sizes=(1, 2, 4), global_batch=8, n_microbatches=4,
                        n_devices=2, steps=1, warmup=0, profile_repeats=1, profile_warmup=0)


def _settings(limit: int, method: str) -> PartitionSettings:
    return PartitionSettings(n_devices=2, memory_bytes=limit, global_batch=8, microbatches=4, method=method)


def test_limit_rules_out_the_uniform_split_but_not_pplan():
    profile = load_profile(DATA / "profile.csv")
    choice = choose_memory_limit(profile, SETTINGS)
    assert choice.pplan_floor_bytes < choice.limit_bytes < choice.uniform_floor_bytes
    with pytest.raises(InfeasibleError):
        partition(profile, _settings(choice.limit_bytes, "uniform"))
    plan = partition(profile, _settings(choice.limit_bytes, "auto")).plan
    assert max(d["peak_memory_bytes"] for d in plan.predicted.to_dict()["devices"]) <= choice.limit_bytes
    # The uniform split's floor is a limit it fits under (so the limit is not needlessly low).
    partition(profile, _settings(int(choice.uniform_floor_bytes * 1.01), "uniform"))


def test_uniform_comparison_plan_keeps_schedule_and_drops_limit_and_recompute():
    plan = load_plan(DATA / "plan.json")
    uniform = uniform_plan(plan)
    assert [st.layers for st in uniform.stages] == [(0, 4), (4, 8)]
    assert all(not st.recompute for st in uniform.stages)
    assert all(d.memory_bytes is None for d in uniform.devices)
    assert (uniform.schedule, uniform.n_microbatches, uniform.micro_batch_size) == \
        (plan.schedule, plan.n_microbatches, plan.micro_batch_size)


def test_step_spread_flags_a_run_disturbed_halfway_and_ignores_warmup():
    steady = [900.0] + [700.0 + (i % 3) for i in range(12)]
    assert step_spread(steady, list(range(1, 13))) < 0.01  # the slow first (warm-up) step does not count
    assert step_spread(steady, []) > NOISE  # ... it does when every step is timed
    assert step_spread([700.0] * 7 + [1100.0] * 6, list(range(13))) > NOISE
    assert step_spread([1.0, 2.0], []) == 0.0


def test_demo_help_and_readme_agree_on_folder_and_duration(pplan):
    code, out, _ = pplan("demo", "--help")
    assert code == 0 and "reports/demo" in out and "about a minute" in out.replace("\n", " ")
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    assert "writes [reports/demo/]" in readme or "writes `reports/demo/`" in readme


@pytest.mark.slow
def test_quick_demo_end_to_end(tmp_path):
    out = tmp_path / "demo"
    proc = run_pplan("demo", "--quick", "--out-dir", out, "--json", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    # progress on stderr, every stage announced
    for n in range(1, 9):
        assert re.search(rf"\] {n}/8 ", proc.stderr), n
    assert result["pplan_floor_bytes"] < result["limit_bytes"] < result["uniform_floor_bytes"]
    assert result["peak_predicted_bytes"] <= result["limit_bytes"]
    for key in ("first_measured_ms", "measured_ms", "uniform_measured_ms", "predicted_ms", "first_predicted_ms"):
        assert result[key] > 0, key
    names = {row["quantity"] for row in result["summary"]}
    assert {"memory limit per device", "speedup over the uniform split", "step time before calibration",
            "step time after calibration"} <= names
    for name in ("profile.csv", "profile.calibration.json", "plan.json", "plan_first.json", "sim.json",
                 "timeline.csv", "run.json", "run_first.json", "run_uniform.json", "measured_timeline.csv"):
        assert (out / "data" / name).is_file(), name
    md = (out / "report.md").read_text()
    assert "Skipped" not in md, md
    from helpers.figures import assert_drawn_png

    pngs = sorted((out / "figures").glob("*.png"))
    assert len(pngs) == 6
    for png in pngs:
        assert_drawn_png(png, min_width=600, min_height=300)  # decodes, full size, something drawn
    assert QUICK.model in md
