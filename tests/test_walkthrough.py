"""README's walk-through as a new user meets it: what the commands print, and what README says of them."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
REPORT = Path(__file__).parent / "data" / "report"


def _walkthrough() -> str:
    return README[README.index("## Walk-through"):README.index("## File formats")]


def test_readme_activates_the_venv_and_runs_figures_through_pplan_only():
    assert "source .venv/bin/activate" in README
    assert "python -m planner" not in README  # figures come from pplan commands
    assert "--plot unet-plan.png" in README
    walk = _walkthrough()
    made = re.search(r"pplan profile .* -o (\S+\.csv)", walk)[1]
    assert f"pplan partition {made} " in walk and f"--profile {made} " in walk  # the profile it just made
    assert "pplan calibrate plan.json --from-run run.json" in walk


def test_readme_says_how_to_get_the_cpu_build_without_naming_a_host():
    assert "torch>=2.6" in README and "--index-url" in README and "CUDA build" in README
    assert "download.pytorch" not in README


def test_version(pplan):
    code, out, _ = pplan("--version")
    assert code == 0 and re.fullmatch(r"pplan \d+\.\d+\.\d+\n", out)


def test_json_errors_are_json_on_stdout_with_exit_code_2(pplan, tmp_path):
    code, out, err = pplan("partition", REPORT / "profile.csv", "--devices", "2", "--global-batch", "8",
                           "--memory", "1KiB", "--out", tmp_path / "p.json", "--json")
    assert code == 2 and err == ""
    data = json.loads(out)
    assert "no plan fits" in data["error"] and "--memory" in data["hint"]
    assert not (tmp_path / "p.json").exists()


def test_progress_shows_elapsed_and_remaining(capsys, monkeypatch):
    from cli import common

    clock = iter([0.0, 10.0, 20.0, 30.0, 40.0])
    monkeypatch.setattr(common.time, "monotonic", lambda: next(clock))
    with common.progress(4, "profiling") as bar:
        for _ in range(4):
            bar.advance("layer")
    lines = capsys.readouterr().err.splitlines()
    assert "profiling: 1/4 (elapsed 10s, about 30s left) layer" in [line.strip() for line in lines]
    assert "profiling: 4/4 (elapsed 40s) layer" in [line.strip() for line in lines]


def test_step_progress_sizes_its_bar_from_the_work_and_is_quiet_off_a_terminal_when_asked(capsys, monkeypatch):
    from cli import common

    monkeypatch.setattr(common.time, "monotonic", lambda: 0.0)
    with common.step_progress("partition") as on_step:
        for done in range(4):  # the work announces its size with done=0 (partition_pipeline), then counts
            on_step(done, 3, f"M={done}")
    lines = [line.strip() for line in capsys.readouterr().err.splitlines()]
    assert lines[0] == "partition: 3 steps" and [line.split(" (")[0] for line in lines[1:]] == \
        ["partition: 1/3", "partition: 2/3", "partition: 3/3"]
    with common.step_progress("partition", terminal_only=True) as on_step:  # pytest's stderr is no terminal
        assert on_step is None
    assert capsys.readouterr().err == ""


def test_bench_messages_carry_elapsed_and_remaining(capsys, monkeypatch):
    from cli import common

    clock = iter([0.0, 30.0])
    monkeypatch.setattr(common.time, "monotonic", lambda: next(clock))
    common.timed_say("bench")("fidelity 4/10: synthetic")
    assert capsys.readouterr().err.strip() == "[bench] fidelity 4/10: synthetic (elapsed 30s, about 1m10s left)"  # 3 done in 30 s, 7 to go


def test_partition_names_its_basis_and_never_calibrates_into_profiles(pplan, tmp_path, monkeypatch):
    from planner.calibration import Calibration, calibration_path_for, write_calibration

    monkeypatch.chdir(tmp_path)
    prof = tmp_path / "gpt.csv"
    shutil.copy(REPORT / "profile.csv", prof)
    args = ("partition", prof, "--devices", "2", "--global-batch", "8", "--out", tmp_path / "p.json")
    code, out, _ = pplan(*args)
    assert code == 0 and out.startswith("basis: uncalibrated")
    write_calibration(Calibration(compute_scale=1.5, fitted_from={"run": "run.json"}), calibration_path_for(prof))
    code, out, _ = pplan(*args)
    assert code == 0 and out.startswith(f"basis: calibrated by {tmp_path / 'gpt.calibration.json'}")
    code, out, _ = pplan(*args, "--calibration", "none")
    assert out.startswith("basis: uncalibrated")
    committed = ROOT / "profiles" / "gpt-8l-v32k.csv"
    assert calibration_path_for(committed).parent == Path(".")


def test_report_calls_a_fit_on_its_own_run_a_residual(pplan, tmp_path):
    from planner.calibration import Calibration, write_calibration

    for name in ("profile.csv", "plan.json", "run.json"):
        shutil.copy(REPORT / name, tmp_path / name)
    run = json.loads((tmp_path / "run.json").read_text())
    write_calibration(Calibration(compute_scale=1.2, fitted_from={"run": str(tmp_path / "run.json"),
                                                                  "measured_ms": run["iteration_ms_measured"]}),
                      tmp_path / "profile.calibration.json")
    code, out, err = pplan("report", "--profile", tmp_path / "profile.csv", "--plan", tmp_path / "plan.json",
                           "--run", tmp_path / "run.json", "--out", tmp_path / "rep", "--formats", "png", "--json")
    assert code == 0, err
    rows = {r["quantity"]: r["value"] for r in json.loads(out)["summary"]}
    assert rows["basis of what the report simulates"].startswith("calibrated by")
    assert any(k.startswith("fit residual") for k in rows)
    assert not any(k.startswith("prediction error (simulation") for k in rows)
    assert "prediction error (plan)" in rows  # the run's own prediction, made before the calibration
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "fit residual" in md and "not a prediction error" in md


def test_sweep_star_is_the_fastest_point_that_fits():
    from planner.report.fig_whatif import best_fitting
    from planner.whatif import SweepRow

    def row(m: int, ms: float, fits: bool) -> SweepRow:
        return SweepRow(m, "1f1b", m, 32 // m, 32, ms, 0.5, 1.0, 1.0, fits)

    rows = [row(4, 10.0, False), row(8, 12.0, True), row(16, 11.0, True), row(32, 13.0, True)]
    assert best_fitting(rows).n_microbatches == 16  # 4 is faster but does not fit


def test_memory_timeline_draws_no_zero_length_dips():
    from planner.report.fig_memory import settled

    pts = [[0.0, 10], [1.0, 20], [2.0, 10], [2.0, 20], [3.0, 10]]
    assert settled(pts) == [[0.0, 10], [1.0, 20], [2.0, 20], [3.0, 10]]


def test_progress_in_estimated_work_shows_percent(capsys, monkeypatch):
    """`pplan profile` reports thousandths of its estimated work, which read as a percent."""
    from cli import common

    clock = iter([0.0, 10.0, 40.0])
    monkeypatch.setattr(common.time, "monotonic", lambda: next(clock))
    with common.progress(1000, "profiling", percent=True) as bar:
        bar.reach(500, "micro-batch 4")
        bar.reach(1000, "done")
    lines = [line.strip() for line in capsys.readouterr().err.splitlines()]
    assert lines[0] == "profiling: time left weighted by each step's cost"
    assert "profiling: 50% (elapsed 10s, about 10s left) micro-batch 4" in lines
    assert "profiling: 100% (elapsed 40s) done" in lines
