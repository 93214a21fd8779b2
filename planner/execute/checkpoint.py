"""Training checkpoints: each rank's stage weights and optimizer state, saved atomically.

Layout of `--checkpoint-dir DIR`:

    DIR/step-00000010/rank0.pt, rank1.pt, ..., COMPLETE.json
    DIR/.tmp-step-00000010/.pplan-save    <- a save in progress (ignored; removed once the next save completes)

A save is written into the temporary folder (marked `.pplan-save` when created); once every
rank's file is on disk (fsynced, after a barrier) rank 0 writes COMPLETE.json (the marker: each
rank file's size and sha256, and the dp, zero and tp of the run that saved it) and renames the
folder to its final name. Readers only trust folders with the marker, so a save interrupted at
any point is never used.

Each rank file holds its stages' full weights and full optimizer state, whatever the plan's
ZeRO stage or tensor-parallel degree (planner.execute.zero and planner.execute.tensor gather the
shards when saving and keep each rank's part when loading), so a save resumes with another ZeRO
stage, replica count or tp degree alike.

Resuming picks the newest complete save whose fingerprint (model, seed, cut, optimizer, ranks)
matches the plan and that passes planner.execute.checkpoint_integrity: a marker that describes
the plan's layout, and rank files that are regular files of the recorded size and sha256. A newer
save damaged afterwards (a truncated or altered file) is skipped, with a note, for the one before
it; when no intact save is left, the run is refused naming the damaged file. A rank loads its file
from the open file whose bytes it has just hashed, with `torch.load(weights_only=True)`: tensors
and plain containers only, so a file crafted to run code when unpickled is refused, never
executed. Multi-machine runs need DIR on a file system all machines share.

Cleanup (old saves beyond KEEP, a stale temporary folder, a step saved twice) deletes only
folders pplan itself wrote: a `step-N` folder with a pplan COMPLETE.json, or a `.tmp-step-N`
folder with the `.pplan-save` marker. Anything else in DIR is left alone, and a folder of
someone else's that is in the way of a save is refused before the run starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Container, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.atomic import atomic_write_text
from planner.errors import PlanError, PplanError, RunError
from planner.execute.checkpoint_integrity import (
    DAMAGED_HINT, FORMAT, MARKER_NAME, describe_rank_file, marker_entry, open_verified, read_marker, save_problem,
    saved_degrees,
)
from planner.execute.runrecord import MAX_RUN_RANKS
from planner.plan import Plan

__all__ = ["KEEP", "FORMAT", "Resume", "SaveSteps", "fingerprint", "latest_checkpoint", "resume_point", "save_rank_file",
           "finish_save", "load_rank_file", "rank_file_for", "tmp_dir_for", "prepare_save", "check_save_targets", "save_steps"]

KEEP = 2  # complete saves kept; older ones are deleted after a new one completes
SAVE_MARKER = ".pplan-save"  # in a temporary folder pplan created
_STEP_RE = re.compile(r"^step-([0-9]{8})$")  # not \d: int() reads other scripts' digits as another folder's step
_TARGET_RE = re.compile(r"(?:\.tmp-)?step-([0-9]{8})")  # a save's folder, final or temporary


def fingerprint(plan: Plan) -> str:
    """What must match for a checkpoint to be resumable with `plan` (not the schedule)."""
    key = {"model": plan.model, "seed": plan.seed, "optimizer": plan.optimizer, "ranks": plan.n_devices,
           "stages": [[st.device, st.layers[0], st.layers[1]] for st in plan.stages]}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _final_dir(root: Path, step: int) -> Path:
    """The folder a complete save of `step` lives in."""
    return root / f"step-{step:08d}"


def tmp_dir_for(root: str | os.PathLike, step: int) -> Path:
    """The folder a save of `step` is written into before it is complete."""
    return Path(root) / f".tmp-step-{step:08d}"


def _is_ours(folder: Path) -> bool:
    """A folder pplan wrote: a complete save with our marker, or a temporary one with ours."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    return read_marker(folder) is not None or (folder / SAVE_MARKER).is_file()


def _complete_saves(base: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every folder named step-N that holds a COMPLETE.json, newest first."""
    return sorted(((int(m.group(1)), d) for d in base.iterdir() if (m := _STEP_RE.match(d.name))
                   and not d.is_symlink() and d.is_dir() and (d / MARKER_NAME).is_file()), reverse=True)


@dataclass(frozen=True)
class Resume:
    """Where a run resumes: the newest intact complete save, and what was skipped to find it."""

    step: int
    """Completed steps of the save."""
    folder: Path
    """Its folder."""
    skipped: tuple[str, ...] = ()
    """One line per newer save that was damaged ('PATH is truncated ...')."""


def resume_point(root: str | os.PathLike, plan: Plan) -> Resume | None:
    """The save a run of `plan` resumes from, or None when `root` holds no complete save.

    PlanError when the newest complete save belongs to another plan; PplanError when complete
    saves exist but every one is damaged (naming the newest damaged file). A damaged save before
    an intact one is skipped, and named in Resume.skipped for the run to warn about.
    """
    base = Path(root)
    if not base.is_dir():
        return None
    saves = _complete_saves(base)
    if not saves:
        return None
    skipped: list[str] = []
    for i, (step, folder) in enumerate(saves):
        meta = read_marker(folder)
        if meta is None:
            problem = f"{folder / MARKER_NAME} is unreadable or not a pplan checkpoint marker"
        else:
            if i == 0 and meta.get("fingerprint") != fingerprint(plan):
                raise PlanError(f"checkpoint {folder} was saved by a different plan (model, cut, optimizer or ranks differ)",
                                "use another --checkpoint-dir, or the plan it was made with")
            if meta.get("fingerprint") != fingerprint(plan):
                problem = f"{folder} was saved by a different plan"
            else:
                problem = save_problem(folder, meta, plan.n_devices)
        if problem is None:
            return Resume(step, folder, tuple(skipped))
        skipped.append(problem)
    raise PplanError(f"checkpoint {skipped[0]}, and no earlier complete save in {str(base)!r} is usable",
                     f"move {saves[0][1]} away to start from step 0, or use another --checkpoint-dir")


def latest_checkpoint(root: str | os.PathLike, plan: Plan) -> tuple[int, Path] | None:
    """(completed steps, folder) of the newest intact complete save for `plan`, or None (see resume_point)."""
    found = resume_point(root, plan)
    return None if found is None else (found.step, found.folder)


@dataclass(frozen=True)
class SaveSteps(Container[int]):
    """The steps a run from `start` to `steps` saves at: every `every` steps (0: none) and the last.
    Not a list: --steps 10,000,000 --checkpoint-every 1 listed ten million steps (431 MB) and then
    looked for each one's folders (7 minutes) before the run began."""

    start: int
    steps: int
    every: int

    def __contains__(self, step: object) -> bool:
        return step == self.steps or (isinstance(step, int) and self.every > 0 and self.start < step <= self.steps
                                      and step % self.every == 0)


save_steps = SaveSteps  # save_steps(start, steps, every): the steps a run saves at (every K, and the last)


def check_save_targets(root: str | os.PathLike, steps: SaveSteps | Iterable[int]) -> None:
    """Refuse, before a run starts, a save that would have to replace a folder pplan did not write:
    each entry of the folder named for a save in `steps` is looked at once (not each step's names)."""
    base = Path(root)
    if not base.is_dir():
        return
    wanted = steps if isinstance(steps, SaveSteps) else set(steps)
    for path in base.iterdir():
        found = _TARGET_RE.fullmatch(path.name)
        if found and int(found.group(1)) in wanted and not _is_ours(path):
            raise PplanError(f"--checkpoint-dir: {str(path)!r} is in the way of the save of step {int(found.group(1))} "
                             "and was not written by pplan", "move it away, or use another --checkpoint-dir")


def save_rank_file(root: str | os.PathLike, step: int, rank: int, state: dict[str, Any]) -> None:
    """Write this rank's part of the save of `step` into the temporary folder (fsynced)."""
    import torch

    path = tmp_dir_for(root, step) / f"rank{rank}.pt"
    with open(path, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())


def _remove_ours(path: Path) -> None:
    """Delete `path` (a save's folder) when pplan wrote it; RunError, deleting nothing, when not."""
    if not (path.exists() or path.is_symlink()):
        return
    if not _is_ours(path):
        raise RunError(f"{path} was not written by pplan; not replacing it", "move it away, or use another --checkpoint-dir")
    shutil.rmtree(path)


def finish_save(root: str | os.PathLike, step: int, plan: Plan, world: int) -> Path:
    """Rank 0, after every rank saved: mark complete, move into place, drop old saves (pplan's only)."""
    base = Path(root)
    tmp = tmp_dir_for(base, step)
    missing = [r for r in range(world) if not (tmp / f"rank{r}.pt").is_file()]
    if missing:
        raise RunError(f"checkpoint files of ranks {missing} are missing in {tmp}",
                       "with several machines --checkpoint-dir must be on a shared file system")
    if world > MAX_RUN_RANKS:  # its COMPLETE.json would be larger than a reader accepts
        raise RunError(f"a checkpoint of {world} ranks is refused: at most {MAX_RUN_RANKS}", "run without --checkpoint-dir")
    files = {f"rank{r}.pt": describe_rank_file(tmp / f"rank{r}.pt") for r in range(world)}
    meta = {"format": FORMAT, "step": step, "world_size": world, "fingerprint": fingerprint(plan),
            "schedule": plan.schedule, "model": plan.model, "files": files, "dp": plan.dp,
            "zero": plan.parallel.zero if plan.parallel is not None else 0, "tp": plan.tp}
    atomic_write_text(tmp / MARKER_NAME, json.dumps(meta, indent=2) + "\n")
    final = _final_dir(base, step)
    _remove_ours(final)  # re-saving a step (a resumed run that ends where it began)
    os.replace(tmp, final)
    _fsync_dir(base)
    complete = sorted(s for s, d in _complete_saves(base) if read_marker(d) is not None)
    for old in complete[:-KEEP]:
        shutil.rmtree(_final_dir(base, old), ignore_errors=True)
    # saves interrupted at an earlier step (a killed run's, 99 MB once): prepare_save replaces only
    # its own step's, so they stayed for good. Ours only, by their marker; a later step's may be
    # another run's in progress (one DIR serves one run at a time, but that one is not ours to end)
    for stale in base.glob(".tmp-step-*"):
        number = stale.name.removeprefix(".tmp-step-")
        if number.isdigit() and int(number) < step and (stale / SAVE_MARKER).is_file() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    return final


def prepare_save(root: str | os.PathLike, step: int) -> None:
    """Rank 0, before a save: an empty temporary folder, marked as pplan's (a stale one of ours removed)."""
    tmp = tmp_dir_for(root, step)
    _remove_ours(tmp)
    tmp.mkdir(parents=True)
    (tmp / SAVE_MARKER).write_text("written by pplan run; removed with its folder\n", encoding="utf-8")


def rank_file_for(folder: Path, rank: int, pp_index: int, *, dp_index: int | None = None, tp_index: int = 0,
                  n_devices: int | None = None) -> int:
    """Which rank's file `rank` resumes from: its own, or, for a data-parallel replica added since
    the save (the run now has more replicas), replica 0's file at the same pipeline position:
    replicas hold the same weights and optimizer state after every step (their gradients are
    all-reduced), so any replica's file restores them. Fewer replicas than saved need nothing.
    Under ZeRO and tensor parallelism every rank file holds the full tensors too (gathered when
    saved), so a save resumes with another ZeRO stage, replica count or tp degree alike.

    With `dp_index` and `n_devices` the saving run's layout is read from COMPLETE.json (dp, tp;
    rank = (d x P + p) x tp + t): the file of the same replica (else replica 0), pipeline
    position and tp rank (else tp rank 0), whatever the tp of either run."""
    degrees = saved_degrees(Path(folder))
    if dp_index is None or n_devices is None or degrees is None:
        return rank if (Path(folder) / f"rank{rank}.pt").is_file() else pp_index
    saved_dp, saved_tp = degrees
    d = dp_index if dp_index < saved_dp else 0
    t = tp_index if tp_index < saved_tp else 0
    return (d * n_devices + pp_index) * saved_tp + t


def load_rank_file(folder: Path, rank: int) -> dict[str, Any]:
    """This rank's saved state, loaded only from a regular file whose bytes (hashed from the same open
    file torch then reads) match the sha256 COMPLETE.json records: tensors and plain containers only."""
    import pickle

    import torch

    path = Path(folder) / f"rank{rank}.pt"
    expect = marker_entry(Path(folder), path.name)
    if expect is None:  # a file no marker vouches for is never opened, let alone unpickled
        raise PplanError(f"checkpoint {folder} has no COMPLETE.json of pplan's that records {path.name}'s size and "
                         "sha256; refused to load it", "resume from a complete save that pplan wrote")
    try:
        with open_verified(path, expect) as fh:  # the bytes hashed are the bytes torch reads
            state = torch.load(fh, map_location="cpu", weights_only=True)  # never after a mismatch, never code
    except FileNotFoundError:
        raise RunError(f"checkpoint {folder} has no file for rank {rank}", "it was saved with another layout") from None
    except pickle.UnpicklingError as e:
        first = next((ln for ln in str(e).splitlines() if ln.strip()), "")[:200]
        raise PplanError(f"checkpoint file {str(path)!r} holds objects other than tensors and plain data; refused to "
                         f"load it ({' '.join(first.split())})", "only load checkpoints you or pplan wrote") from None
    except PplanError:
        raise
    except Exception as e:  # unreadable, or a damaged archive: torch raises RuntimeError and others
        text = " ".join(str(e).split())[:200]
        raise PplanError(f"checkpoint file {str(path)!r} cannot be read: {type(e).__name__}: {text}", DAMAGED_HINT) from None
    if not isinstance(state, dict):
        raise PplanError(f"checkpoint file {str(path)!r} is not a pplan rank file")
    return state


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # a file system without directory fsync: the rename is still atomic
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
