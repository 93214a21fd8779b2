"""Training checkpoints: each rank's stage weights and optimizer state, saved atomically.

Layout of `--checkpoint-dir DIR`:

    DIR/step-00000010/rank0.pt, rank1.pt, ..., COMPLETE.json
    DIR/.tmp-step-00000010/          <- a save in progress (ignored, removed by the next save)

A save is written into the temporary folder; once every rank's file is on disk (fsynced, after a
barrier) rank 0 writes COMPLETE.json (the marker) and renames the folder to its final name.
Readers only trust folders with the marker, so a save interrupted at any point is never used.
Resuming picks the newest complete save whose fingerprint (model, seed, cut, optimizer, ranks)
matches the plan. Multi-machine runs need DIR on a file system all machines share.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from planner.atomic import atomic_write_text
from planner.errors import PlanError, RunError
from planner.plan import Plan

__all__ = ["KEEP", "fingerprint", "latest_checkpoint", "save_rank_file", "finish_save", "load_rank_file", "tmp_dir_for"]

FORMAT = "pplan-checkpoint/1"
KEEP = 2  # complete saves kept; older ones are deleted after a new one completes
_STEP_RE = re.compile(r"^step-(\d{8})$")


def fingerprint(plan: Plan) -> str:
    """What must match for a checkpoint to be resumable with `plan` (not the schedule)."""
    key = {
        "model": plan.model, "seed": plan.seed, "optimizer": plan.optimizer, "ranks": plan.n_devices,
        "stages": [[st.device, st.layers[0], st.layers[1]] for st in plan.stages],
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _final_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def tmp_dir_for(root: str | os.PathLike, step: int) -> Path:
    """The folder a save of `step` is written into before it is complete."""
    return Path(root) / f".tmp-step-{step:08d}"


def latest_checkpoint(root: str | os.PathLike, plan: Plan) -> tuple[int, Path] | None:
    """(completed steps, folder) of the newest complete save for `plan`, or None.

    Raises PlanError when the newest complete save belongs to another plan.
    """
    base = Path(root)
    if not base.is_dir():
        return None
    found = []
    for d in base.iterdir():
        m = _STEP_RE.match(d.name)
        if m and (d / "COMPLETE.json").is_file():
            found.append((int(m.group(1)), d))
    if not found:
        return None
    step, folder = max(found)
    try:
        meta = json.loads((folder / "COMPLETE.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise RunError(f"checkpoint marker {folder / 'COMPLETE.json'} is unreadable ({e})") from None
    if meta.get("fingerprint") != fingerprint(plan):
        raise PlanError(f"checkpoint {folder} was saved by a different plan (model, cut, optimizer or ranks differ)",
                        "use another --checkpoint-dir, or the plan it was made with")
    return step, folder


def save_rank_file(root: str | os.PathLike, step: int, rank: int, state: dict[str, Any]) -> None:
    """Write this rank's part of the save of `step` into the temporary folder (fsynced)."""
    import torch

    path = tmp_dir_for(root, step) / f"rank{rank}.pt"
    with open(path, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())


def finish_save(root: str | os.PathLike, step: int, plan: Plan, world: int) -> Path:
    """Rank 0, after every rank saved: mark complete, move into place, drop old saves."""
    base = Path(root)
    tmp = tmp_dir_for(base, step)
    missing = [r for r in range(world) if not (tmp / f"rank{r}.pt").is_file()]
    if missing:
        raise RunError(f"checkpoint files of ranks {missing} are missing in {tmp}",
                       "with several machines --checkpoint-dir must be on a shared file system")
    meta = {"format": FORMAT, "step": step, "world_size": world, "fingerprint": fingerprint(plan),
            "schedule": plan.schedule, "model": plan.model}
    atomic_write_text(tmp / "COMPLETE.json", json.dumps(meta, indent=2) + "\n")
    final = _final_dir(base, step)
    if final.exists():  # re-saving a step (a resumed run that ends where it began)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(base)
    complete = sorted(int(m.group(1)) for d in base.iterdir() if (m := _STEP_RE.match(d.name)))
    for old in complete[:-KEEP]:
        shutil.rmtree(_final_dir(base, old), ignore_errors=True)
    return final


def prepare_save(root: str | os.PathLike, step: int) -> None:
    """Rank 0, before a save: an empty temporary folder (a stale one from a crash removed)."""
    tmp = tmp_dir_for(root, step)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)


def load_rank_file(folder: Path, rank: int) -> dict[str, Any]:
    import torch

    path = folder / f"rank{rank}.pt"
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise RunError(f"checkpoint {folder} has no file for rank {rank}", "it was saved with another layout") from None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ += ["prepare_save"]
