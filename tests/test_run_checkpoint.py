"""A run resumed from a checkpoint equals the uninterrupted run (multi-process, slow). `pplan run`
goes through the CLI's entry point in this process (conftest's run_cli), its ranks in processes."""

from __future__ import annotations

import pytest
import torch

from planner.execute import RunOptions
from planner.execute.checkpoint import latest_checkpoint, load_rank_file
from planner.execute.run import run_plan
from planner.plan import load_plan

from helpers.plans import synthetic_spec, write_plan


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
                                         checkpoint_every=2), plan_path=str(plan_path)).record.to_dict()

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


# ---- through the CLI: crafted, truncated and random-number state ---------------------------------

import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

from planner.execute import checkpoint as ckpt  # noqa: E402


def _errors(res: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in res.stderr, res.stderr
    return [ln for ln in res.stderr.splitlines() if ln.startswith("pplan: error:")]


class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _synthetic_plan(tmp_path: Path) -> Path:
    return write_plan(tmp_path / "plan.json", synthetic_spec(2, fwd_ms=2, bwd_ms=2), "gpipe", 2, [(0, 1), (1, 2)],
                      n_microbatches=2, optimizer="sgd")


@pytest.mark.slow
def test_run_refuses_a_crafted_checkpoint_and_runs_nothing_from_it(tmp_path, run_cli):
    plan_path = _synthetic_plan(tmp_path)
    plan = load_plan(plan_path)
    root = tmp_path / "ckpt"
    marker = tmp_path / "pwned"
    folder = root / "step-00000001"
    folder.mkdir(parents=True)
    files = {}
    for r in range(2):  # crafted files, and a marker that vouches for exactly them
        torch.save({"layers": {0: _Evil(marker)}, "optimizer": {}, "rng": torch.get_rng_state()}, folder / f"rank{r}.pt")
        data = (folder / f"rank{r}.pt").read_bytes()
        files[f"rank{r}.pt"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "COMPLETE.json").write_text(json.dumps({"format": ckpt.FORMAT, "step": 1, "world_size": 2,
                                                      "fingerprint": ckpt.fingerprint(plan), "files": files}))
    res = run_cli("run", str(plan_path), "--device", "cpu", "--steps", "3", "--warmup", "0", "--checkpoint-dir", str(root))
    errors = _errors(res)
    assert res.returncode == 2, res.stderr
    assert len(errors) == 1 and "refused" in errors[0] and "rank" in errors[0] and ".pt" in errors[0], res.stderr
    assert not marker.exists(), "unpickling the checkpoint ran its code"


@pytest.mark.slow
def test_run_resumes_from_the_previous_save_when_the_newest_is_truncated(tmp_path, run_cli):
    plan_path = _synthetic_plan(tmp_path)
    root = tmp_path / "ckpt"
    first = run_cli("run", str(plan_path), "--device", "cpu", "--steps", "2", "--warmup", "0", "--checkpoint-dir", str(root),
                 "--checkpoint-every", "1")
    assert first.returncode == 0, first.stderr
    victim = root / "step-00000002" / "rank1.pt"
    victim.write_bytes(victim.read_bytes()[:100])
    out = tmp_path / "run.json"
    res = run_cli("run", str(plan_path), "--device", "cpu", "--steps", "3", "--warmup", "0", "--checkpoint-dir", str(root),
               "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert not _errors(res)
    assert "step-00000002/rank1.pt" in res.stderr and "truncated" in res.stderr, res.stderr
    assert "resuming from the previous complete save" in res.stderr and "step-00000001" in res.stderr
    assert json.loads(out.read_text())["first_step"] == 1


def _dropout_plan(tmp_path: Path) -> Path:
    return write_plan(tmp_path / "dplan.json", "dropout_model:build", "1f1b", 2, [(0, 2), (2, 4)], seed=5,
                      micro_batch_size=2, n_microbatches=2, optimizer="adam")


def _run_json(run_cli, plan_path: Path, out: Path, steps: int, root: Path) -> dict:
    res = run_cli("run", str(plan_path), "--trust-model", "--device", "cpu", "--steps", str(steps), "--warmup", "0",
               "--checkpoint-dir", str(root), "--out", str(out))
    assert res.returncode == 0, res.stderr
    return json.loads(out.read_text())


@pytest.mark.slow
def test_random_layers_give_the_same_losses_twice_and_resume_bit_exactly(tmp_path, run_cli):
    """torch dropout, numpy noise and Python random in the forward: seeded per rank, restored on resume."""
    plan_path = _dropout_plan(tmp_path)
    full = _run_json(run_cli, plan_path, tmp_path / "a.json", 4, tmp_path / "a")
    first = _run_json(run_cli, plan_path, tmp_path / "b1.json", 2, tmp_path / "b")
    assert first["losses"] == full["losses"][:2]  # two runs of the plan draw the same numbers
    resumed = _run_json(run_cli, plan_path, tmp_path / "b2.json", 4, tmp_path / "b")
    assert resumed["first_step"] == 2
    assert first["losses"] + resumed["losses"] == full["losses"]  # bit for bit
    plan = load_plan(plan_path)
    _, ranks_a = _state(tmp_path / "a", plan)
    _, ranks_b = _state(tmp_path / "b", plan)
    for ra, rb in zip(ranks_a, ranks_b):
        for layer, sd in ra["layers"].items():
            for name, t in sd.items():
                assert torch.equal(t, rb["layers"][layer][name]), f"layer {layer} {name}"
