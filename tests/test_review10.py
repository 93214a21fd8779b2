"""What a tenth review found: notes a zero-bubble plan needs wherever one is chosen or swept, a
report of a plan too long to draw as a timeline, the reasons a report gives for what it skips,
and `simulate --hardware` on a `partition --nodes` plan of one pipeline."""

from __future__ import annotations

import json

import pytest

from planner.calibration import FORMAT as CALIBRATION_FORMAT
from planner.plan import load_plan
from planner.report.inputs import ReportInputs, load_inputs
from helpers.plans import write_plan, write_synthetic_profile

GPT = "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000"


@pytest.fixture
def analytic_csv(analytic_profile):
    """An analytic profile less its wgrad_bytes column, as profiles made before the column read."""
    path = analytic_profile(GPT, "1,2")
    lines = path.read_text().splitlines(keepends=True)
    rows = [line.rstrip("\n").split(",") for line in lines if not line.startswith("#")]
    drop = rows[0].index("wgrad_bytes")
    body = "".join(",".join(r[:drop] + r[drop + 1:]) + "\n" for r in rows)
    path.write_text("".join(line for line in lines if line.startswith("#")) + body)
    return path


@pytest.fixture
def cluster_plan(pplan, analytic_csv, tmp_path):
    """A `partition --nodes` plan of one pipeline (dp = tp = 1) that the search priced as zero-bubble."""
    out = tmp_path / "plan.json"
    code, _, err = pplan("partition", analytic_csv, "--nodes", 1, "--gpus-per-node", 2, "--hardware", "a100-80gb",
                         "--global-batch", 64, "--parallel", "dp=1,pp=2,tp=1", "--out", out)
    assert code == 0, err
    return out, err


def test_partition_nodes_choosing_zero_bubble_says_the_profile_has_no_wgrad_bytes(cluster_plan):
    out, err = cluster_plan
    assert load_plan(out).schedule == "zb"  # the setting this test is about; the profile has no wgrad_bytes
    note = next(line for line in err.splitlines() if "wgrad_bytes" in line)
    assert note.startswith("pplan: warning:") and "--analytic" in note  # advice an analytic profile can follow


def test_cluster_job_records_the_note(analytic_csv):
    from planner.hardware import load_hardware
    from planner.partition.job import ClusterSettings, partition_cluster

    job = partition_cluster(analytic_csv, ClusterSettings(nodes=1, gpus_per_node=2, hardware=load_hardware("a100-80gb"),
                                                          global_batch=64, parallel="dp=1,pp=2,tp=1"))
    assert job.plan.schedule == "zb" and sum("wgrad_bytes" in w for w in job.warnings) == 1


def _pipeline(tmp_path, schedule="1f1b", n_microbatches=4, micro_batch_size=2):
    profile = tmp_path / "syn.csv"
    spec = write_synthetic_profile(profile, 4, micro_batch_size)  # no wgrad_bytes column
    plan = write_plan(tmp_path / "plan.json", spec, schedule, 2, [(0, 2), (2, 4)], micro_batch_size=micro_batch_size,
                      n_microbatches=n_microbatches, profile=profile)
    return plan, profile


def test_schedule_sweep_with_a_zero_bubble_row_says_what_its_memory_leaves_out(tmp_path):
    from planner.whatif import what_if

    plan, profile_path = _pipeline(tmp_path)
    swept = what_if(plan, sweep="schedule=1f1b,zb")
    assert [r.schedule for r in swept.rows if r.error is None] == ["1f1b", "zb"]
    assert sum("wgrad_bytes" in w for w in swept.warnings) == 1
    assert not any("wgrad_bytes" in w for w in what_if(plan, sweep="schedule=gpipe,1f1b").warnings)
    # interleaved (its runtime holds sends to the step's end) is priced without them too: one line says so
    from planner.plan import load_plan
    from planner.profiling.profile import load_profile
    from planner.simulate import unpriced_memory_note

    plan_obj, profile = load_plan(plan), load_profile(str(profile_path))
    assert unpriced_memory_note(plan_obj, profile) is None
    assert "sends hold" in unpriced_memory_note(plan_obj, profile, ("interleaved",))


def test_report_of_a_plan_too_long_to_draw_still_draws_memory_and_sweep(tmp_path):
    from planner.report.build import build_report

    # 2 stages x 37,501 micro-batches x 2 actions: beyond the timeline's 150,000, within the simulator's
    # 1,000,000; the global batch 37,501 is prime, so the sweep tries 1 and 37,501 micro-batches only
    plan, profile = _pipeline(tmp_path, n_microbatches=37_501, micro_batch_size=1)
    report = build_report(load_inputs(plan=plan, profile=profile), tmp_path / "rep", formats=("png",))
    skipped = {f.number: f.skipped for f in report.figures}
    assert "timeline only up to 150,000 actions" in skipped[1] and "150,004" in skipped[1]
    assert "--json" not in skipped[1]  # simulate's flags: report has none of them
    assert not skipped[2] and not skipped[3]  # per-device memory and the sweep need no timeline


def test_baseline_figure_says_why_there_are_no_baselines(tmp_path):
    from planner.report import fig_baselines

    plan, _ = _pipeline(tmp_path)
    bare = load_plan(plan)
    assert bare.search is None
    assert "no search record" in fig_baselines.missing(ReportInputs(plan=bare))
    dropped = fig_baselines.missing(ReportInputs(plan=bare, warnings=("plan.json: made for another plan",)))
    assert "dropped as made for another plan" in dropped and "re-run `pplan partition`" in dropped
    assert "recomputed" not in dropped


def test_report_names_a_calibration_fitted_on_another_model_once(tmp_path):
    from planner.report.derive import derive
    from planner.report.summary import key_numbers

    plan, profile = _pipeline(tmp_path)
    cal = tmp_path / "c.json"
    cal.write_text(json.dumps({"format": CALIBRATION_FORMAT, "compute_scale": 1.0,
                               "fitted_from": {"model": "mlp:layers=8", "profile_sha256": "0" * 64}}))
    derived = derive(load_inputs(plan=plan, profile=profile, calibration=str(cal)))
    assert "was fitted on model 'mlp:layers=8'" in derived.calibration_warning
    rows = key_numbers(derived.inputs, (), (derived.calibration_warning,))
    assert sum("mlp:layers=8" in value for name, value in rows if name == "warning") == 1


def test_simulate_hardware_on_a_one_pipeline_cluster_plan_says_to_re_profile(pplan, cluster_plan):
    out, _ = cluster_plan
    code, _, err = pplan("simulate", out, "--hardware", "h100-80gb")
    assert code != 0 and len(err.strip().splitlines()) == 1
    assert "dp=1,pp=2,tp=1" in err and "'a100-80gb'" in err
    assert "re-profile with `pplan profile --analytic --hardware h100-80gb`" in err and "measured times" not in err
