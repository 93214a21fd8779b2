"""Training checkpoints: each rank's stage weights and optimizer state, saved atomically.

Layout of `--checkpoint-dir DIR`: DIR/step-00000010/rank0.pt, rank1.pt, ..., COMPLETE.json, and
DIR/.tmp-step-00000010/.pplan-save for a save in progress (ignored, removed by the next save).

A save is written into the temporary folder (marked `.pplan-save` when created); once every
rank's file is on disk (fsynced, after a barrier) rank 0 writes COMPLETE.json (the marker: each
rank file's size and sha256, the dp, zero and tp of the run) and renames the folder to its final
name, so a save interrupted at any point is never used. Each rank file holds its stages' full
weights and optimizer state whatever the ZeRO stage or tp degree (planner.execute.zero and tensor
gather the shards when saving and keep each rank's part when loading).

Resuming picks the newest complete save whose fingerprint (model, seed, cut, optimizer, ranks)
matches the plan, whose COMPLETE.json (read bounded and depth-limited: planner.jsonio) describes
the plan's layout (world_size = dp x devices x tp, a size and sha256 per rank file), and whose files
are regular files (a FIFO or /dev/zero in their place is refused unread) of the recorded size
(compared before a byte is hashed) and checksum; a newer damaged save is skipped with a note, and
with none intact the run is refused naming the damaged file. A rank loads its file from the open
file whose bytes it has just hashed against the marker, with `torch.load(weights_only=True)`: a file
crafted to run code when unpickled is refused, never executed. Several machines need DIR shared.

Cleanup (old saves beyond KEEP, a stale temporary folder, a step saved twice) deletes only folders
pplan wrote: `step-N` with a pplan COMPLETE.json, `.tmp-step-N` with `.pplan-save`. Anything else in
DIR is left alone; someone else's folder in the way of a save is refused before the run starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Container, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from planner.atomic import atomic_write_text
from planner.errors import PlanError, PplanError, RunError
from planner.execute.runrecord import MAX_RUN_RANKS
from planner.jsonio import nearest, read_json_file
from planner.limits import MAX_MEMORY_BYTES
from planner.plan import Plan

__all__ = ["KEEP", "FORMAT", "Resume", "SaveSteps", "fingerprint", "latest_checkpoint", "resume_point", "save_rank_file",
           "finish_save", "load_rank_file", "rank_file_for", "tmp_dir_for", "prepare_save", "check_save_targets", "save_steps"]

FORMAT = "pplan-checkpoint/1"
KEEP = 2  # complete saves kept; older ones are deleted after a new one completes
SAVE_MARKER = ".pplan-save"  # in a temporary folder pplan created
_STEP_RE = re.compile(r"^step-([0-9]{8})$")  # not \d: int() reads other scripts' digits as another folder's step
_TARGET_RE = re.compile(r"(?:\.tmp-)?step-([0-9]{8})")  # a save's folder, final or temporary
_MAX_MARKER_BYTES = 4096 + 160 * MAX_RUN_RANKS  # measured: 142 bytes per rank file, 603 for the rest: 5 MiB
_MARKER_KEYS = ("format", "step", "world_size", "fingerprint", "schedule", "model", "files", "dp", "zero", "tp")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def fingerprint(plan: Plan) -> str:
    """What must match for a checkpoint to be resumable with `plan` (not the schedule)."""
    key = {"model": plan.model, "seed": plan.seed, "optimizer": plan.optimizer, "ranks": plan.n_devices,
           "stages": [[st.device, st.layers[0], st.layers[1]] for st in plan.stages]}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _final_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def tmp_dir_for(root: str | os.PathLike, step: int) -> Path:
    """The folder a save of `step` is written into before it is complete."""
    return Path(root) / f".tmp-step-{step:08d}"


def _read_marker(folder: Path) -> dict[str, Any] | None:
    """COMPLETE.json of `folder` when it is pplan's (a dict with our format), else None."""
    try:  # bounded, depth-limited and strict: 500,000 nested brackets are refused, not recursed into
        meta = read_json_file(folder / "COMPLETE.json", "checkpoint marker", RunError, _MAX_MARKER_BYTES)
    except PplanError:
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _entry_ok(entry: Any) -> bool:
    """A marker's record of one rank file: {"bytes": its size, "sha256": 64 hex digits}."""
    return (isinstance(entry, dict) and sorted(entry) == ["bytes", "sha256"] and _whole(entry["bytes"], 0, MAX_MEMORY_BYTES)
            and isinstance(entry["sha256"], str) and _SHA256.fullmatch(entry["sha256"]) is not None)


def _marker_problem(folder: Path, meta: dict[str, Any], n_devices: int) -> str | None:
    """Why pplan's marker in `folder` cannot vouch for its save for a plan of `n_devices` pipeline
    devices (None when it can): an unknown key, a layout that is no run's, files not one per rank."""
    where = folder / "COMPLETE.json"
    unknown = next((k for k in meta if k not in _MARKER_KEYS), None)
    if unknown is not None:
        guess = nearest(unknown, _MARKER_KEYS)
        return f"{where} has an unknown key {unknown[:60]!r}" + (f" (did you mean {guess!r}?)" if guess else "")
    world, dp, tp = meta.get("world_size"), meta.get("dp", 1), meta.get("tp", 1)
    if not all(_whole(v, 1, MAX_RUN_RANKS) for v in (world, dp, tp)):
        return f"{where} has no valid world_size, dp and tp (whole numbers in 1..{MAX_RUN_RANKS})"
    if world != dp * n_devices * tp:
        return f"{where} says world_size {world}, not dp {dp} x {n_devices} devices x tp {tp}"
    files, names = meta.get("files"), [f"rank{r}.pt" for r in range(world)]
    if not isinstance(files, dict) or sorted(files) != sorted(names):
        return f"{where} does not list one file per rank (rank0.pt ... rank{world - 1}.pt)"
    bad = next((name for name in names if not _entry_ok(files[name])), None)
    if bad is not None:
        return f"{where} does not record {bad}'s size (0..{MAX_MEMORY_BYTES}) and sha256 (64 hex digits)"
    return None


def _is_ours(folder: Path) -> bool:
    """A folder pplan wrote: a complete save with our marker, or a temporary one with ours."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    return _read_marker(folder) is not None or (folder / SAVE_MARKER).is_file()


def _complete_saves(base: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every folder named step-N that holds a COMPLETE.json, newest first."""
    return sorted(((int(m.group(1)), d) for d in base.iterdir() if (m := _STEP_RE.match(d.name))
                   and not d.is_symlink() and d.is_dir() and (d / "COMPLETE.json").is_file()), reverse=True)


def _open_regular(path: Path) -> tuple[IO[bytes], os.stat_result] | None:
    """(the open file, its stat) when `path` is a regular file, else None (OSError when unreadable).
    Stat before open, as planner.jsonio does: a device is never opened; a FIFO swapped in after the
    stat does not block the open (O_NONBLOCK) and is caught by comparing the open file with the stat."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        return None
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(opened.st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb"), opened


def _sha256_of(fh: IO[bytes], size: int) -> str | None:
    """sha256 of the file's `size` bytes; None when it holds fewer or more (it changed since its stat)."""
    h, left = hashlib.sha256(), size
    while left > 0:
        block = fh.read(min(left, 1 << 20))
        if not block:
            return None
        h.update(block)
        left -= len(block)
    return h.hexdigest() if not fh.read(1) else None


_VERIFIED: dict[tuple[Any, ...], str | None] = {}  # (file, device, inode, size, mtime_ns) -> problem (hashed once)


def _file_problem(path: Path, expect: dict[str, Any]) -> str | None:
    """Why `path` is not the rank file its marker entry `expect` describes (None when it is)."""
    try:
        opened = _open_regular(path)
        if opened is None:
            return "is not a regular file (a device, FIFO or socket)"
        fh, st = opened
        with fh:
            if st.st_size != expect["bytes"]:  # refused before a byte is hashed
                return f"has {st.st_size} bytes, the save wrote {expect['bytes']}" + " (truncated)" * (st.st_size < expect["bytes"])
            key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if key not in _VERIFIED:
                same = _sha256_of(fh, st.st_size) == expect["sha256"]
                _VERIFIED[key] = None if same else "differs from what the save wrote (sha256 mismatch)"
            return _VERIFIED[key]
    except FileNotFoundError:
        return "is missing"
    except OSError as e:
        return f"cannot be read ({e.strerror})"


def _save_problem(folder: Path, meta: dict[str, Any], n_devices: int) -> str | None:
    """The first reason a complete save cannot be resumed, as 'PATH <problem>' (None when intact)."""
    problem = _marker_problem(folder, meta, n_devices)
    for r in range(meta["world_size"]) if problem is None else ():
        name = f"rank{r}.pt"
        if (found := _file_problem(folder / name, meta["files"][name])) is not None:
            return f"{folder / name} {found}"
    return problem


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
    """The save a run of `plan` resumes from, or None when `root` holds no complete save. PlanError when
    the newest complete save is another plan's; PplanError when every one is damaged (naming the newest)."""
    base = Path(root)
    if not base.is_dir():
        return None
    saves = _complete_saves(base)
    if not saves:
        return None
    skipped: list[str] = []
    for i, (step, folder) in enumerate(saves):
        meta = _read_marker(folder)
        if meta is None:
            problem = f"{folder / 'COMPLETE.json'} is unreadable or not a pplan checkpoint marker"
        else:
            if i == 0 and meta.get("fingerprint") != fingerprint(plan):
                raise PlanError(f"checkpoint {folder} was saved by a different plan (model, cut, optimizer or ranks differ)",
                                "use another --checkpoint-dir, or the plan it was made with")
            if meta.get("fingerprint") != fingerprint(plan):
                problem = f"{folder} was saved by a different plan"
            else:
                problem = _save_problem(folder, meta, plan.n_devices)
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
    if not (path.exists() or path.is_symlink()):
        return
    if not _is_ours(path):
        raise RunError(f"{path} was not written by pplan; not replacing it", "move it away, or use another --checkpoint-dir")
    shutil.rmtree(path)


def _digest(path: Path) -> dict[str, Any]:
    """{"bytes", "sha256"} of a rank file this save just wrote (RunError when it is not a regular file)."""
    try:
        opened = _open_regular(path)
        with opened[0] if opened else contextlib.nullcontext() as fh:
            digest = _sha256_of(fh, opened[1].st_size) if opened else None
    except OSError as e:
        raise RunError(f"cannot read checkpoint file {path}: {e.strerror}") from None
    if opened is None or digest is None:
        raise RunError(f"checkpoint file {path} is not a regular file, or changed while it was hashed",
                       "nothing but pplan may write into --checkpoint-dir during a run")
    return {"bytes": opened[1].st_size, "sha256": digest}


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
    files = {f"rank{r}.pt": _digest(tmp / f"rank{r}.pt") for r in range(world)}
    meta = {"format": FORMAT, "step": step, "world_size": world, "fingerprint": fingerprint(plan),
            "schedule": plan.schedule, "model": plan.model, "files": files, "dp": plan.dp,
            "zero": plan.parallel.zero if plan.parallel is not None else 0, "tp": plan.tp}
    atomic_write_text(tmp / "COMPLETE.json", json.dumps(meta, indent=2) + "\n")
    final = _final_dir(base, step)
    _remove_ours(final)  # re-saving a step (a resumed run that ends where it began)
    os.replace(tmp, final)
    _fsync_dir(base)
    complete = sorted(s for s, d in _complete_saves(base) if _read_marker(d) is not None)
    for old in complete[:-KEEP]:
        shutil.rmtree(_final_dir(base, old), ignore_errors=True)
    return final


def prepare_save(root: str | os.PathLike, step: int) -> None:
    """Rank 0, before a save: an empty temporary folder, marked as pplan's (a stale one of ours removed)."""
    tmp = tmp_dir_for(root, step)
    _remove_ours(tmp)
    tmp.mkdir(parents=True)
    (tmp / SAVE_MARKER).write_text("written by pplan run; removed with its folder\n", encoding="utf-8")


def rank_file_for(folder: Path, rank: int, pp_index: int, *, dp_index: int | None = None, tp_index: int = 0,
                  n_devices: int | None = None) -> int:
    """Which rank's file `rank` resumes from: its own, or, for a replica added since the save, replica
    0's file at the same pipeline position (replicas hold the same state after every step). With
    `dp_index` and `n_devices`, by the saving run's layout in COMPLETE.json (rank = (d x P + p) x tp + t):
    the same replica (else 0), pipeline position and tp rank (else 0), whatever the tp of either run."""
    meta = _read_marker(Path(folder)) or {}
    saved_dp, saved_tp = meta.get("dp", 1), meta.get("tp", 1)
    if dp_index is None or n_devices is None or not all(_whole(v, 1, MAX_RUN_RANKS) for v in (saved_dp, saved_tp)):
        return rank if (Path(folder) / f"rank{rank}.pt").is_file() else pp_index
    d = dp_index if dp_index < saved_dp else 0
    t = tp_index if tp_index < saved_tp else 0
    return (d * n_devices + pp_index) * saved_tp + t


def load_rank_file(folder: Path, rank: int) -> dict[str, Any]:
    """This rank's saved state, loaded only from a regular file whose bytes (hashed from the same open
    file torch then reads) match the sha256 COMPLETE.json records: tensors and plain containers only."""
    import pickle

    import torch

    path = Path(folder) / f"rank{rank}.pt"
    files = (_read_marker(Path(folder)) or {}).get("files")
    expect = files.get(path.name) if isinstance(files, dict) else None
    if not _entry_ok(expect):
        raise PplanError(f"checkpoint {folder} has no COMPLETE.json of pplan's that records {path.name}'s size and "
                         "sha256; refused to load it", "resume from a complete save that pplan wrote")
    damaged = "move the damaged save away, or use another --checkpoint-dir"
    try:
        opened = _open_regular(path)
        if opened is None:
            raise PplanError(f"checkpoint file {str(path)!r} is not a regular file (a device, FIFO or socket); "
                             "refused to load it", damaged)
        with opened[0] as fh:
            if opened[1].st_size != expect["bytes"] or _sha256_of(fh, expect["bytes"]) != expect["sha256"]:
                raise PplanError(f"checkpoint file {str(path)!r} differs from what the save wrote (size or sha256); "
                                 "refused to load it", damaged)
            fh.seek(0)
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
        raise PplanError(f"checkpoint file {str(path)!r} cannot be read: {type(e).__name__}: {text}", damaged) from None
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
