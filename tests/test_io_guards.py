"""Inputs that would do harm or mislead are refused up front: exit 2, one line naming the value
with a hint, no traceback, no file written or changed, and no rank started.

Every command runs in this process (tests/helpers/cli.py's run_captured), from a folder holding
a small profile and a plan made from it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from planner.errors import PplanError
from planner.execute.options import RunOptions
from planner.profiling.options import ProfileOptions
from planner.profiling.profile import load_profile
from helpers.cli import REPO, run_captured

PROFILE = REPO / "profiles" / "mlp.csv"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with mlp.csv, plan.json (2 devices, made from it) and cluster.json."""
    root = tmp_path_factory.mktemp("made")
    shutil.copy(PROFILE, root / "mlp.csv")
    shutil.copy(REPO / "examples" / "cluster.json", root / "cluster.json")
    got = run_captured("partition", "mlp.csv", "--devices", "2", "--global-batch", "8", "--out", "plan.json", cwd=root)
    assert got.code == 0, got.err
    return root


@pytest.fixture
def work(made: Path, tmp_path: Path) -> Path:
    """A fresh copy of `made` per test: what a refused command leaves is compared with it."""
    for f in made.iterdir():
        shutil.copy(f, tmp_path / f.name)
    return tmp_path


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(folder: Path, *args: object, match: str) -> str:
    """Run `pplan ARGS` in `folder`; check it is refused as the module docstring says; the message."""
    before = _snapshot(folder)
    got = run_captured(*args, cwd=folder)
    assert got.code == 2, f"exit {got.code}: {got.err[-2000:]}"
    assert "Traceback" not in got.err, got.err
    lines = got.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pplan: error:"), got.err
    assert match in lines[0], lines[0]
    assert _snapshot(folder) == before, "a refused command wrote or changed a file"
    return lines[0]


# ---- 1. an output on an input's path ----

@pytest.mark.parametrize("args,match", [
    (("simulate", "plan.json", "--out", "plan.json"), "--out 'plan.json' is the plan this command reads"),
    (("simulate", "plan.json", "--profile", "mlp.csv", "--timeline", "mlp.csv"),
     "--timeline 'mlp.csv' is the profile this command reads"),
    (("simulate", "plan.json", "--timeline", "./mlp.csv"), "is the profile this command reads"),  # the plan's own
    (("simulate", "plan.json", "--out", "link.json"), "is the plan this command reads"),  # a symlink to it
    (("partition", "mlp.csv", "--global-batch", "8", "--cluster", "cluster.json", "--out", "cluster.json"),
     "--out 'cluster.json' is the cluster file this command reads"),
    (("run", "plan.json", "--steps", "2", "--warmup", "1", "--threads", "1", "--out", "plan.json"),
     "--out 'plan.json' is the plan this command reads"),
    (("run", "plan.json", "--calibrate", "--out", "mlp.calibration.json"), "is also the calibration --calibrate writes"),
    (("run", "plan.json", "--steps", "2", "--warmup", "1", "--out", "cal/mlp.calibration.json", "--profile", "cal/mlp.csv"),
     "is the calibration this command reads"),  # the one beside the profile, read by the run
    (("report", "--profile", "rep/figures/mlp.csv", "--out", "rep"), "inside 'rep/figures', which the report replaces"),
    (("calibrate", "plan.json", "--from-run", "run.json", "-o", "fit.json"), "--out 'fit.json': not used with --from-run"),
], ids=["simulate-out-plan", "simulate-timeline-profile", "simulate-timeline-plans-profile", "simulate-out-symlink",
        "partition-out-cluster", "run-out-plan", "run-out-calibration", "run-out-read-calibration",
        "report-input-in-figures", "calibrate-from-run-out"])
def test_an_output_on_an_input_is_refused_and_the_input_kept(work: Path, args: tuple[str, ...], match: str) -> None:
    (work / "link.json").symlink_to(work / "plan.json")
    (work / "cal").mkdir()
    shutil.copy(work / "mlp.csv", work / "cal" / "mlp.csv")
    (work / "cal" / "mlp.calibration.json").write_text('{"format": "pplan-calibration/1", "compute_scale": 1.2}')
    (work / "run.json").write_text("{}")
    (work / "rep" / "figures").mkdir(parents=True)
    shutil.copy(work / "mlp.csv", work / "rep" / "figures" / "mlp.csv")
    refused(work, *args, match=match)


def test_calibrate_from_run_and_bench_quality_keep_their_inputs(work: Path) -> None:
    (work / "mlp.calibration.json").write_text("{}")  # a run JSON saved where the fit would write
    refused(work, "calibrate", "plan.json", "--from-run", "mlp.calibration.json",
            match="the calibration file 'mlp.calibration.json' is the run JSON (--from-run) this command reads")
    (work / "qb").mkdir()
    shutil.copy(work / "mlp.csv", work / "qb" / "quality.csv")
    refused(work, "bench", "quality", "qb/quality.csv", "--out-dir", "qb",
            match="--out-dir's quality.csv 'qb/quality.csv' is the profile this command reads")


# ---- 2. thread counts ----

def test_a_thread_count_far_beyond_the_cores_is_refused_naming_the_cores(work: Path) -> None:
    line = refused(work, "profile", "-m", "mlp:layers=2,hidden=16", "--threads", "100000", "-b", "1",
                   "--warmup", "1", "--repeats", "1", "-o", "seg.csv", match="--threads 100000")
    assert "core" in line
    refused(work, "run", "plan.json", "--threads", "100000", match="--threads 100000")
    with pytest.raises(PplanError, match="per core"):
        ProfileOptions((1,), threads=100_000)
    with pytest.raises(PplanError, match="per core"):
        RunOptions(threads=100_000)


# ---- 3. run and profile counts ----

@pytest.mark.parametrize("args,match", [
    (("--lr", "inf"), "--lr inf must be a positive finite number"),
    (("--lr", "1e400"), "--lr inf must be a positive finite number"),
    (("--steps", "3", "--warmup", "5"), "--warmup 5 leaves none of --steps 3 to measure"),
    (("--steps", "3", "--warmup", "3"), "--warmup 3 leaves none of --steps 3 to measure"),
    (("--steps", str(10**20)), f"--steps {10**20} is more than"),
    (("--timeline", "x.png"), "--timeline 'x.png' must end in .csv"),
], ids=["lr-inf", "lr-overflow", "warmup-over-steps", "warmup-equal-steps", "steps-huge", "timeline-png"])
def test_run_refuses_settings_that_would_fail_late_or_mismeasure(work: Path, args: tuple[str, ...], match: str) -> None:
    refused(work, "run", "plan.json", *args, match=match)


def test_run_without_warmup_measures_its_last_step_when_it_has_fewer_than_the_default() -> None:
    assert RunOptions(steps=1).warmup == 0 and RunOptions(steps=2).warmup == 1 and RunOptions().warmup == 2


@pytest.mark.parametrize("args,match", [
    (("profile", "-m", "mlp:layers=2,hidden=16", "--repeats", str(10**20), "-o", "p.csv"), f"--repeats {10**20}"),
    (("profile", "-m", "mlp:layers=2,hidden=16", "--warmup", str(10**20), "-o", "p.csv"), f"--warmup {10**20}"),
    (("bench", "simulator", "--repeats", str(10**20), "--out-dir", "b"), f"--repeats {10**20} must be between 1 and"),
    (("bench", "fidelity", "--device", "foo", "--quick", "--out-dir", "b"), "--device 'foo' is unknown"),
], ids=["profile-repeats", "profile-warmup", "bench-simulator-repeats", "bench-fidelity-device"])
def test_counts_that_would_run_practically_forever_and_unknown_devices_are_refused(
        work: Path, args: tuple[str, ...], match: str) -> None:
    refused(work, *args, match=match)


# ---- 4. profile columns and dtype ----

def _edited(work: Path, old: str, new: str) -> str:
    text = (work / "mlp.csv").read_text()
    assert old in text
    (work / "edited.csv").write_text(text.replace(old, new, 1))
    return "edited.csv"


@pytest.mark.parametrize("old,new,match", [
    (",optimizer_ms", ",optimiser_ms", "unknown column 'optimiser_ms'; did you mean 'optimizer_ms'?"),
    (",fwd_ms,", ",fwd_mss,", "missing column(s) fwd_ms; did you mean 'fwd_ms' (the header has 'fwd_mss')?"),
    ("# dtype: float32", "# dtype: banana", "metadata 'dtype': 'banana' is not one of float32"),
    ("# dtype: float32", "# dtype: float23", "(did you mean 'float32'?)"),
], ids=["misspelt-optional-column", "misspelt-required-column", "unknown-dtype", "misspelt-dtype"])
def test_a_misspelt_profile_column_or_dtype_is_refused_with_the_nearest_name(
        work: Path, old: str, new: str, match: str) -> None:
    name = _edited(work, old, new)
    refused(work, "partition", name, "--devices", "2", "--global-batch", "8", "--out", "p.json", match=match)


@pytest.mark.parametrize("path", sorted(
    [*(REPO / "profiles").glob("*.csv"), REPO / "reports" / "example" / "data" / "profile.csv",
     REPO / "tests" / "data" / "report" / "profile.csv", REPO / "tests" / "data" / "sim_profile.csv",
     REPO / "tests" / "data" / "bad" / "good_profile.csv"]), ids=lambda p: str(p.relative_to(REPO)))
def test_every_committed_profile_still_loads(path: Path) -> None:
    assert load_profile(path).n_layers > 0


# ---- 7. partition flags the chosen search never reads ----

@pytest.mark.parametrize("extra,match", [
    (("--devices", "2"), "--devices 2: not used with --nodes/--hardware"),
    (("--calibration", "missing.json"), "--calibration 'missing.json': not used with --nodes/--hardware"),
    (("--time-limit", "5"), "--time-limit 5.0: not used with --nodes/--hardware"),
    (("--optimizer", "sgd", "--bandwidth", "1GB/s", "--latency", "1ms"), "--optimizer 'sgd', --bandwidth '1GB/s'"),
    (("--cluster", "cluster.json", "--method", "ilp", "--time-limit", "5"), "--cluster 'cluster.json', --method 'ilp'"),
], ids=["devices", "calibration", "time-limit", "optimizer-links", "cluster-method-time"])
def test_partition_with_nodes_refuses_pipeline_only_flags(work: Path, extra: tuple[str, ...], match: str) -> None:
    refused(work, "partition", "mlp.csv", "--global-batch", "8", "--nodes", "1", "--hardware", "a100-80gb",
            "--out", "p.json", *extra, match=match)


@pytest.mark.parametrize("extra,match", [
    (("--zero", "1"), "--zero 1: only used with --nodes and --hardware"),
    (("--parallel", "dp=2"), "--parallel 'dp=2': only used with --nodes"),
    (("--gpus-per-node", "4"), "--gpus-per-node 4: only used with --nodes"),
], ids=["zero", "parallel", "gpus-per-node"])
def test_partition_without_nodes_refuses_cluster_only_flags(work: Path, extra: tuple[str, ...], match: str) -> None:
    refused(work, "partition", "mlp.csv", "--global-batch", "8", "--devices", "2", "--out", "p.json", *extra, match=match)


def test_partition_still_takes_the_flags_of_its_mode(work: Path) -> None:
    got = run_captured("partition", "mlp.csv", "--global-batch", "8", "--devices", "2", "--schedule", "1f1b",
                       "--bandwidth", "100Gbit/s", "--out", "a.json", cwd=work)
    assert got.code == 0, got.err
    got = run_captured("partition", "mlp.csv", "--global-batch", "8", "--nodes", "1", "--hardware", "a100-80gb",
                       "--zero", "1", "--out", "b.json", cwd=work)
    assert got.code == 0, got.err
