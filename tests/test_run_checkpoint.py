"""A run resumed from a checkpoint equals the uninterrupted run (multi-process, slow)."""

from __future__ import annotations

import pytest
import torch

from planner.execute import RunOptions
from planner.execute.checkpoint import latest_checkpoint, load_rank_file
from planner.execute.run import run_plan
from planner.plan import load_plan

from test_run_support import write_plan


def _state(root, plan):
    step, folder = latest_checkpoint(root, plan)
    ranks = [load_rank_file(folder, r) for r in range(plan.n_devices)]
    return step, ranks


@pytest.mark.slow
def test_resumed_run_equals_uninterrupted(tmp_path):
    plan_path = write_plan(tmp_path / "plan.json", "mlp:layers=4,hidden=32,input=16,classes=8", "1f1b", 2,
                           [(0, 2), (2, 4)], recompute={1: [2]}, optimizer="adam")
    plan = load_plan(plan_path)

    def run(root, steps):
        return run_plan(plan, RunOptions(steps=steps, warmup=0, device="cpu", lr=1e-2, checkpoint_dir=str(root),
                                         checkpoint_every=2), plan_path=str(plan_path)).run

    full = run(tmp_path / "a", 4)
    first = run(tmp_path / "b", 2)
    resumed = run(tmp_path / "b", 4)
    assert first["loss_steps"] == [0, 1] and resumed["loss_steps"] == [2, 3] and resumed["first_step"] == 2
    assert first["losses"] + resumed["losses"] == full["losses"]  # same data, same weights, same order
    step_a, ranks_a = _state(tmp_path / "a", plan)
    step_b, ranks_b = _state(tmp_path / "b", plan)
    assert step_a == step_b == 4
    for ra, rb in zip(ranks_a, ranks_b):
        for layer, sd in ra["layers"].items():
            for name, t in sd.items():
                assert torch.equal(t, rb["layers"][layer][name]), f"layer {layer} {name}"
        for key, st in ra["optimizer"]["state"].items():  # Adam's moments were restored too
            for name, t in st.items():
                assert torch.equal(t, rb["optimizer"]["state"][key][name]), f"optimizer {key} {name}"
