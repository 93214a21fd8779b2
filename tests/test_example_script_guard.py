"""examples/train_with_plan.py as one process (a 1-rank gloo group): a plan naming a module:factory
model is refused before its module is imported unless --model (the same spec) or --trust-model
vouches for it, as `pplan run` does; and the loop steps the plan's optimizer, so an sgd plan's
losses are `pplan run`'s (the example once used Adam whatever the plan said)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cli import JOB_VARS, REPO
from helpers.plans import write_plan

EXAMPLE = REPO / "examples" / "train_with_plan.py"
STEPS = 3  # step 1's loss precedes any update: steps 2 and 3 tell the optimizers apart

# A factory model that leaves a marker when its module is imported; it brings its own data and loss.
FACTORY_SOURCE = """\
open({marker!r}, "w").close()
import torch
from torch import nn


def build():
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def make_batch(n, seed):
        x = torch.randn(n, 8, generator=torch.Generator().manual_seed(seed))
        return x, x.sum(1, keepdim=True)

    model.make_batch, model.loss_fn = make_batch, nn.functional.mse_loss
    return model
"""


def _factory_plan(tmp_path: Path) -> tuple[Path, Path, str]:
    """(plan of the marker-writing factory model on one device with sgd, the marker, the spec).
    The module's name is this test's own: an in-process import by another test cannot stand in."""
    marker = tmp_path / "imported"
    module = "sent_model_" + tmp_path.name.replace("-", "_").lower()
    (tmp_path / f"{module}.py").write_text(FACTORY_SOURCE.format(marker=str(marker)), encoding="utf-8")
    spec = f"{module}:build"
    plan = write_plan(tmp_path / "plan.json", spec, "gpipe", 1, [(0, 3)], micro_batch_size=2, n_microbatches=2,
                      optimizer="sgd", seed=5)
    return plan, marker, spec


def _run_example(tmp_path: Path, plan: Path, *flags: str) -> subprocess.CompletedProcess:
    """The example as rank 0 of a 1-process job, from the plan's folder (where a factory's module is found)."""
    from planner.execute.launch import free_port

    env = {k: v for k, v in os.environ.items() if k not in JOB_VARS}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, str(EXAMPLE), str(plan), "--steps", str(STEPS),
                           "--out", str(tmp_path / "losses.json"), *flags],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)


@pytest.mark.parametrize("flags", [[], ["--model", "other_module:build"]], ids=["no-flag", "other-model"])
def test_example_refuses_a_factory_model_only_the_plan_names(tmp_path, flags):
    plan, marker, spec = _factory_plan(tmp_path)
    res = _run_example(tmp_path, plan, *flags)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rank 0: error: "), res.stderr[-3000:]
    assert spec in lines[0] and ("--trust-model" in lines[0] if not flags else "does not match" in lines[0])
    assert not marker.exists(), "the plan's module was imported"
    assert not (tmp_path / "losses.json").exists()


def test_example_with_a_matching_model_runs_it(tmp_path):
    plan, marker, spec = _factory_plan(tmp_path)
    res = _run_example(tmp_path, plan, "--model", spec)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert marker.exists() and f"step {STEPS}/{STEPS}" in res.stdout


@pytest.mark.slow  # it also runs the plan with pplan run (a rank process)
def test_example_trusting_the_model_trains_with_the_plans_optimizer_as_pplan_run(tmp_path, monkeypatch):
    from planner.execute import RunOptions
    from planner.execute.run import run_plan
    from planner.plan import load_plan

    plan, marker, _ = _factory_plan(tmp_path)
    res = _run_example(tmp_path, plan, "--trust-model")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert marker.exists()
    mine = json.loads((tmp_path / "losses.json").read_text())["losses"]
    monkeypatch.chdir(tmp_path)  # pplan run's ranks find the factory's module in the current folder
    run = run_plan(load_plan(plan), RunOptions(steps=STEPS, warmup=1, device="cpu", threads=1, track_memory=False),
                   plan_path=str(plan), trust_model=True).record.to_dict()
    # the same stages, data, optimizer (SGD with momentum) and thread count: the same numbers
    assert len(mine) == STEPS and mine == pytest.approx(run["losses"], rel=1e-12, abs=0)
