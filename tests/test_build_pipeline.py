"""The plan as a library: `from planner import load_plan, build_pipeline` in a user's own loop,
and examples/train_with_plan.py under torchrun (multi-process tests are slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cli import JOB_VARS, REPO
from helpers.equivalence import torch_threads
from helpers.plans import write_plan

GPT = "gpt:layers=2,hidden=32,heads=2,seq=16,vocab=128,ffn=2"
EXAMPLE = REPO / "examples" / "train_with_plan.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def test_import_planner_stays_light():
    code = ("import sys, planner; assert 'torch' not in sys.modules; f = planner.load_plan; "
            "assert 'torch' not in sys.modules, 'load_plan imported torch'; "
            "assert {'load_plan', 'build_pipeline'} <= set(dir(planner)); "
            "from planner import build_pipeline, Pipeline; assert callable(build_pipeline); print('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
    import planner

    with pytest.raises(AttributeError):
        planner.no_such_name  # noqa: B018


def test_pplan_run_builds_its_stages_with_build_pipeline():
    """One code path: the executor's rank loop calls the library function."""
    src = (REPO / "planner" / "execute" / "train.py").read_text()
    assert "build_pipeline(" in src and "make_schedule(" not in src and "build_stage_modules(" not in src


def _torchrun(nproc: int, plan: Path, out: Path, steps: int) -> subprocess.CompletedProcess:
    from planner.execute.launch import free_port

    env = {k: v for k, v in os.environ.items() if k not in JOB_VARS}
    env["OMP_NUM_THREADS"] = "1"  # torchrun's default too; pplan run --threads 1 matches it
    return subprocess.run([str(TORCHRUN), "--nproc-per-node", str(nproc), "--master-port", str(free_port()),
                           str(EXAMPLE), str(plan), "--steps", str(steps), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=env)


def _parallel_plan(tmp_path: Path, schedule: str, dp: int, tp: int) -> Path:
    """The GPT on 2 pipeline devices of 2 layers each, with `dp` replicas of `tp` ranks each."""
    path = write_plan(tmp_path / "plan.json", GPT, schedule, 2, [(0, 2), (2, 4)], micro_batch_size=2, n_microbatches=4,
                      seed=3)
    data = json.loads(path.read_text())
    data["parallel"] = {"dp": dp, "pp": 2, "tp": tp, "zero": 0}
    path.write_text(json.dumps(data))
    return path


def _example_losses(tmp_path: Path, plan: Path, nproc: int, steps: int) -> tuple[list[float], str]:
    """(the example's losses, its stdout) under torchrun with `nproc` processes."""
    res = _torchrun(nproc, plan, tmp_path / "losses.json", steps)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return json.loads((tmp_path / "losses.json").read_text())["losses"], res.stdout


@pytest.mark.slow
def test_example_under_torchrun_equals_pplan_run(tmp_path):
    from planner.execute import RunOptions
    from planner.execute.run import run_plan
    from planner.plan import load_plan

    steps = 3
    path = write_plan(tmp_path / "plan.json", GPT, "1f1b", 2, [(0, 2), (2, 4)], micro_batch_size=2, n_microbatches=4,
                      recompute={0: [1]}, seed=3)
    res = _torchrun(2, path, tmp_path / "losses.json", steps)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "rank 0: stages [0]" in res.stdout and "rank 1: stages [1]" in res.stdout and "Schedule1F1B" in res.stdout
    assert f"step {steps}/{steps}" in res.stdout
    mine = json.loads((tmp_path / "losses.json").read_text())["losses"]
    run = run_plan(load_plan(path), RunOptions(steps=steps, warmup=1, device="cpu", threads=1, track_memory=False),
                   plan_path=str(path)).record.to_dict()
    # the same stages, schedule, data, optimizer and thread count: the same numbers
    assert mine == pytest.approx(run["losses"], rel=1e-12, abs=0)


@pytest.mark.slow
def test_example_runs_a_data_parallel_plan(tmp_path):
    """dp = 2 x pp = 2 on 4 processes: the example's losses are the single-process reference's."""
    from planner.execute.reference import reference_run
    from planner.plan import load_plan

    steps = 2
    path = _parallel_plan(tmp_path, "gpipe", dp=2, tp=1)
    mine, stdout = _example_losses(tmp_path, path, 4, steps)
    assert "(replica 1)" in stdout
    with torch_threads(1):
        ref, _ = reference_run(load_plan(path), steps, lr=1e-3)
    assert mine == pytest.approx(ref, rel=1e-12, abs=0)
    # too few processes for it: one line per rank that gets to say it (torchrun stops the others
    # once one exits), not a traceback from each
    short = _torchrun(2, path, tmp_path / "none.json", steps)
    assert short.returncode != 0 and not (tmp_path / "none.json").exists()
    said = short.stderr.count(": error: the job has 2 processes but the plan needs 4")
    assert 1 <= said <= 2 and "exitcode  : 2" in short.stderr, short.stderr[-3000:]
    assert "planner/execute" not in short.stderr  # no traceback through pplan's code


@pytest.mark.slow
def test_example_prints_a_tensor_parallel_plans_loss_as_pplan_run_does(tmp_path):
    """pp = 2 x tp = 2: both tp ranks of the last stage hold the loss; the example summed them and
    divided by dp only, printing twice the loss (11.47 where pplan run said 5.74)."""
    from planner.execute import RunOptions
    from planner.execute.run import run_plan
    from planner.plan import load_plan

    steps = 2
    path = _parallel_plan(tmp_path, "1f1b", dp=1, tp=2)
    mine, _ = _example_losses(tmp_path, path, 4, steps)
    run = run_plan(load_plan(path), RunOptions(steps=steps, warmup=1, device="cpu", threads=1, track_memory=False),
                   plan_path=str(path)).record.to_dict()
    assert mine == pytest.approx(run["losses"], rel=1e-9)


def test_build_pipeline_refuses_a_job_of_the_wrong_size(tmp_path):
    """Without a process group this process is a job of one; a two-device plan needs two."""
    from planner import build_pipeline, load_plan
    from planner.errors import PplanError
    from planner.models import build_model

    plan = load_plan(write_plan(tmp_path / "plan.json", GPT, "1f1b", 2, [(0, 2), (2, 4)]))
    with pytest.raises(PplanError, match="the job has 1 processes but the plan needs 2"):
        build_pipeline(plan, build_model(GPT, seed=0))
    with pytest.raises(PplanError, match="nn.Sequential"):
        build_pipeline(plan, "not a model", loss_fn=lambda o, t: o)
