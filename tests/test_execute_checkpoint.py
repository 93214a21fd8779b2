"""Checkpoint files: only complete saves count, old ones are pruned, another plan's are refused."""

from __future__ import annotations

import json

import pytest
import torch

from planner.errors import PlanError, PplanError, RunError
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



def test_a_save_completed_removes_saves_interrupted_at_other_steps(tmp_path):
    """A run killed while saving step 5, resumed and saving step 7: the step-5 temporary folder (ours,
    by its marker) goes once step 7 is complete; it once stayed for good. Anyone else's stays."""
    plan = _plan()
    _save(tmp_path, 4, plan)
    ckpt.prepare_save(tmp_path, 5)
    ckpt.save_rank_file(tmp_path, 5, 0, {"step": 5})
    theirs = tmp_path / ".tmp-step-00000002"  # looks like one, without pplan's marker
    theirs.mkdir()
    ckpt.prepare_save(tmp_path, 9)  # a later step's save in progress: not this run's to end
    _save(tmp_path, 7, plan)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-step-00000002", ".tmp-step-00000009", "step-00000004",
                                                         "step-00000007"]


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


# ---- files someone else wrote: crafted pickles, damaged saves, folders that are not ours ----------

class _Evil:
    """Unpickling this runs a shell command (what a crafted checkpoint would do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_pickle_is_refused_and_nothing_runs(tmp_path):
    plan = _plan()
    _save(tmp_path, 2, plan)
    folder = tmp_path / "step-00000002"
    marker = tmp_path / "pwned"
    torch.save({"layers": {0: _Evil(marker)}}, folder / "rank0.pt")
    with pytest.raises(PplanError) as info:
        ckpt.load_rank_file(folder, 0)
    assert "refused" in info.value.one_line() and "rank0.pt" in info.value.one_line()
    assert "\n" not in info.value.one_line()
    assert not marker.exists()


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_a_truncated_newest_save_falls_back_to_the_previous_one(tmp_path):
    plan = _plan()
    _save(tmp_path, 2, plan)
    _save(tmp_path, 4, plan)
    _truncate(tmp_path / "step-00000004" / "rank1.pt")
    found = ckpt.resume_point(tmp_path, plan)
    assert found.step == 2 and found.folder.name == "step-00000002"
    assert len(found.skipped) == 1 and "step-00000004/rank1.pt" in found.skipped[0] and "truncated" in found.skipped[0]
    assert ckpt.latest_checkpoint(tmp_path, plan)[0] == 2
    # a file altered in place (same size) is caught by its checksum
    path = tmp_path / "step-00000002" / "rank0.pt"
    data = bytearray(path.read_bytes())
    data[-30] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(PplanError, match=r"step-00000004/rank1\.pt .*no earlier complete save"):
        ckpt.resume_point(tmp_path, plan)


def test_cleanup_deletes_only_folders_pplan_wrote(tmp_path):
    plan = _plan()
    mine = tmp_path / "step-00000001"  # a user's folder that happens to look like a save, without a marker
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    other = tmp_path / "step-00000003"  # a user's folder with a COMPLETE.json that is not pplan's
    other.mkdir()
    (other / "COMPLETE.json").write_text('{"mine": true}')
    (tmp_path / "results").mkdir()
    for step in (2, 4, 5, 6):
        _save(tmp_path, step, plan)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["results", "step-00000001", "step-00000003", "step-00000005", "step-00000006"]
    assert (mine / "notes.txt").read_text() == "mine"


def test_a_save_never_replaces_a_folder_it_did_not_write(tmp_path):
    theirs = tmp_path / ".tmp-step-00000002"
    theirs.mkdir(parents=True)
    (theirs / "keep.txt").write_text("x")
    with pytest.raises(PplanError, match="not written by pplan"):
        ckpt.check_save_targets(tmp_path, [1, 2])
    with pytest.raises(RunError, match="not written by pplan"):
        ckpt.prepare_save(tmp_path, 2)
    assert (theirs / "keep.txt").exists()
    final = tmp_path / "step-00000004"
    final.mkdir()
    (final / "keep.txt").write_text("x")
    with pytest.raises(PplanError, match="step-00000004"):
        ckpt.check_save_targets(tmp_path, [4])
    ckpt.check_save_targets(tmp_path, [3])  # nothing in the way
    # a stale temporary folder of pplan's own is replaced
    ckpt.prepare_save(tmp_path, 6)
    ckpt.save_rank_file(tmp_path, 6, 0, {"step": 6})
    ckpt.prepare_save(tmp_path, 6)
    assert sorted(p.name for p in (tmp_path / ".tmp-step-00000006").iterdir()) == [ckpt.SAVE_MARKER]
