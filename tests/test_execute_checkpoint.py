"""Checkpoint files: only complete saves count, old ones are pruned, another plan's are refused."""

from __future__ import annotations

import json

import pytest
import torch

from planner.errors import PlanError, RunError
from planner.execute import checkpoint as ckpt
from planner.plan import Plan, StagePlan, Device


def _plan(model: str = "mlp:layers=4", cut: int = 2) -> Plan:
    return Plan(schedule="1f1b", micro_batch_size=2, n_microbatches=4,
                stages=(StagePlan(0, (0, cut)), StagePlan(1, (cut, 4))),
                devices=(Device("a"), Device("b")), model=model)


def _save(root, step: int, plan: Plan, world: int = 2) -> None:
    ckpt.prepare_save(root, step)
    for r in range(world):
        ckpt.save_rank_file(root, step, r, {"step": step, "rank": r, "w": torch.full((3,), float(step))})
    ckpt.finish_save(root, step, plan, world)


def test_latest_complete_save_is_found_and_loaded(tmp_path):
    plan = _plan()
    assert ckpt.latest_checkpoint(tmp_path / "none", plan) is None
    _save(tmp_path, 2, plan)
    _save(tmp_path, 4, plan)
    step, folder = ckpt.latest_checkpoint(tmp_path, plan)
    assert step == 4 and folder.name == "step-00000004"
    assert torch.equal(ckpt.load_rank_file(folder, 1)["w"], torch.full((3,), 4.0))
    meta = json.loads((folder / "COMPLETE.json").read_text())
    assert meta["step"] == 4 and meta["world_size"] == 2


def test_interrupted_saves_are_never_used(tmp_path):
    plan = _plan()
    _save(tmp_path, 2, plan)
    # a save that died after writing rank 0's file: still in its temporary folder
    ckpt.prepare_save(tmp_path, 4)
    ckpt.save_rank_file(tmp_path, 4, 0, {"step": 4})
    # a folder with the final name but no marker (e.g. copied by hand, half done)
    (tmp_path / "step-00000006").mkdir()
    (tmp_path / "step-00000006" / "rank0.pt").write_bytes(b"garbage")
    step, _ = ckpt.latest_checkpoint(tmp_path, plan)
    assert step == 2
    # the next save of step 4 starts from an empty temporary folder and completes
    _save(tmp_path, 4, plan)
    assert ckpt.latest_checkpoint(tmp_path, plan)[0] == 4


def test_finish_refuses_when_a_rank_file_is_missing(tmp_path):
    plan = _plan()
    ckpt.prepare_save(tmp_path, 2)
    ckpt.save_rank_file(tmp_path, 2, 0, {"step": 2})
    with pytest.raises(RunError, match=r"ranks \[1\]"):
        ckpt.finish_save(tmp_path, 2, plan, 2)
    assert ckpt.latest_checkpoint(tmp_path, plan) is None


def test_old_saves_are_pruned(tmp_path):
    plan = _plan()
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, plan)
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == [f"step-{s:08d}" for s in range(5 - ckpt.KEEP, 5)]


def test_a_save_of_another_plan_is_refused(tmp_path):
    _save(tmp_path, 2, _plan(cut=2))
    with pytest.raises(PlanError, match="different plan"):
        ckpt.latest_checkpoint(tmp_path, _plan(cut=1))
    # the schedule is not part of the fingerprint: weights do not depend on it
    assert ckpt.fingerprint(_plan()) == ckpt.fingerprint(_plan().with_(schedule="gpipe"))
