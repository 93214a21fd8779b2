"""Training checkpoints: each rank's stage weights and optimizer state, saved atomically.

Layout of `--checkpoint-dir DIR`:

    DIR/step-00000010/rank0.pt, rank1.pt, ..., COMPLETE.json
    DIR/.tmp-step-00000010/.pplan-save    <- a save in progress (ignored, removed by the next save)

A save is written into the temporary folder (marked `.pplan-save` when created); once every
rank's file is on disk (fsynced, after a barrier) rank 0 writes COMPLETE.json (the marker, with
each rank file's size and sha256) and renames the folder to its final name. Readers only trust
folders with the marker, so a save interrupted at any point is never used.

Each rank file holds its stages' full weights and full optimizer state, whatever the plan's
ZeRO stage or tensor-parallel degree (planner.execute.zero and planner.execute.tensor gather the
shards when saving and keep each rank's part when loading); COMPLETE.json records the dp, zero
and tp of the run that saved it.

Resuming picks the newest complete save whose fingerprint (model, seed, cut, optimizer, ranks)
matches the plan and whose files are intact (sizes and checksums as recorded): a newest save
damaged afterwards (a truncated or altered file) is skipped, with a note, for the one before it;
when no intact save is left, the run is refused naming the damaged file. Files are loaded with
`torch.load(weights_only=True)`: tensors and plain containers only, so a file crafted to run
code when unpickled is refused, never executed. Multi-machine runs need DIR on a file system
all machines share.

Cleanup (old saves beyond KEEP, a stale temporary folder, a step saved twice) deletes only
folders pplan itself wrote: a `step-N` folder with a pplan COMPLETE.json, or a `.tmp-step-N`
folder with the `.pplan-save` marker. Anything else in DIR is left alone, and a folder of
someone else's that is in the way of a save is refused before the run starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from planner.atomic import atomic_write_text
from planner.errors import PlanError, PplanError, RunError
from planner.plan import Plan

__all__ = ["KEEP", "FORMAT", "Resume", "fingerprint", "latest_checkpoint", "resume_point", "save_rank_file",
           "finish_save", "load_rank_file", "rank_file_for", "tmp_dir_for", "prepare_save", "check_save_targets",
           "save_steps"]

FORMAT = "pplan-checkpoint/1"
KEEP = 2  # complete saves kept; older ones are deleted after a new one completes
SAVE_MARKER = ".pplan-save"  # in a temporary folder pplan created
_STEP_RE = re.compile(r"^step-(\d{8})$")
_MAX_MARKER_BYTES = 1 << 20


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


def _read_marker(folder: Path) -> dict[str, Any] | None:
    """COMPLETE.json of `folder` when it is pplan's (a dict with our format), else None."""
    path = folder / "COMPLETE.json"
    try:
        if not path.is_file() or path.stat().st_size > _MAX_MARKER_BYTES:
            return None
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


def _is_ours(folder: Path) -> bool:
    """A folder pplan wrote: a complete save with our marker, or a temporary one with ours."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    return _read_marker(folder) is not None or (folder / SAVE_MARKER).is_file()


def _complete_saves(base: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every folder named step-N that holds a COMPLETE.json, newest first."""
    found = []
    for d in base.iterdir():
        m = _STEP_RE.match(d.name)
        if m and not d.is_symlink() and d.is_dir() and (d / "COMPLETE.json").is_file():
            found.append((int(m.group(1)), d))
    return sorted(found, reverse=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


_VERIFIED: dict[tuple[str, int, int], str | None] = {}  # (file, size, mtime_ns) -> problem (one process hashes once)


def _file_problem(path: Path, expect: dict[str, Any] | None) -> str | None:
    """Why `path` is not an intact rank file (None when it is)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return "is missing"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key in _VERIFIED:
        return _VERIFIED[key]
    problem: str | None = None
    if expect is not None:
        size = expect.get("bytes")
        if isinstance(size, int) and st.st_size != size:
            problem = f"has {st.st_size} bytes, the save wrote {size}" + (" (truncated)" if st.st_size < size else "")
        elif isinstance(expect.get("sha256"), str) and _sha256(path) != expect["sha256"]:
            problem = "differs from what the save wrote (sha256 mismatch)"
    else:  # a marker from before sizes were recorded: at least a complete zip archive (torch.save's format)
        try:
            with zipfile.ZipFile(path) as z:
                if z.testzip() is not None:
                    problem = "is damaged (a CRC check failed)"
        except (zipfile.BadZipFile, OSError, EOFError):
            problem = "is damaged (not a complete torch.save archive)"
    _VERIFIED[key] = problem
    return problem


def _save_problem(folder: Path, meta: dict[str, Any]) -> str | None:
    """The first damaged rank file of a complete save, as 'PATH <problem>' (None when intact)."""
    world = meta.get("world_size")
    files = meta.get("files") if isinstance(meta.get("files"), dict) else None
    if not isinstance(world, int) or world < 1:
        return f"{folder / 'COMPLETE.json'} has no valid world_size"
    for r in range(world):
        name = f"rank{r}.pt"
        expect = files.get(name) if files is not None else None
        if files is not None and not isinstance(expect, dict):
            return f"{folder / 'COMPLETE.json'} does not list {name}"
        problem = _file_problem(folder / name, expect)
        if problem:
            return f"{folder / name} {problem}"
    return None


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
    saves exist but every one is damaged (naming the newest damaged file).
    """
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
                problem = _save_problem(folder, meta)
        if problem is None:
            return Resume(step, folder, tuple(skipped))
        skipped.append(problem)
    raise PplanError(f"checkpoint {skipped[0]}, and no earlier complete save in {str(base)!r} is usable",
                     f"move {saves[0][1]} away to start from step 0, or use another --checkpoint-dir")


def latest_checkpoint(root: str | os.PathLike, plan: Plan) -> tuple[int, Path] | None:
    """(completed steps, folder) of the newest intact complete save for `plan`, or None (see resume_point)."""
    found = resume_point(root, plan)
    return None if found is None else (found.step, found.folder)


def save_steps(start: int, steps: int, every: int) -> list[int]:
    """The steps a run from `start` to `steps` saves at (every K steps, and the last)."""
    out = [s for s in range(start + 1, steps + 1) if every and s % every == 0]
    if steps not in out:
        out.append(steps)
    return out


def check_save_targets(root: str | os.PathLike, steps: Iterable[int]) -> None:
    """Refuse, before a run starts, a save that would have to replace a folder pplan did not write."""
    base = Path(root)
    if not base.is_dir():
        return
    for step in steps:
        for path in (_final_dir(base, step), tmp_dir_for(base, step)):
            if (path.exists() or path.is_symlink()) and not _is_ours(path):
                raise PplanError(f"--checkpoint-dir: {str(path)!r} is in the way of the save of step {step} and "
                                 "was not written by pplan", "move it away, or use another --checkpoint-dir")


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


def finish_save(root: str | os.PathLike, step: int, plan: Plan, world: int) -> Path:
    """Rank 0, after every rank saved: mark complete, move into place, drop old saves (pplan's only)."""
    base = Path(root)
    tmp = tmp_dir_for(base, step)
    missing = [r for r in range(world) if not (tmp / f"rank{r}.pt").is_file()]
    if missing:
        raise RunError(f"checkpoint files of ranks {missing} are missing in {tmp}",
                       "with several machines --checkpoint-dir must be on a shared file system")
    files = {f"rank{r}.pt": {"bytes": (tmp / f"rank{r}.pt").stat().st_size, "sha256": _sha256(tmp / f"rank{r}.pt")}
             for r in range(world)}
    meta = {"format": FORMAT, "step": step, "world_size": world, "fingerprint": fingerprint(plan),
            "schedule": plan.schedule, "model": plan.model, "files": files,
            "dp": plan.dp,
            "zero": plan.parallel.zero if plan.parallel is not None else 0,
            "tp": plan.tp}
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
    """Which rank's file `rank` resumes from: its own, or, for a data-parallel replica added since
    the save (the run now has more replicas), replica 0's file at the same pipeline position:
    replicas hold the same weights and optimizer state after every step (their gradients are
    all-reduced), so any replica's file restores them. Fewer replicas than saved need nothing.
    Under ZeRO and tensor parallelism every rank file holds the full tensors too (gathered when
    saved), so a save resumes with another ZeRO stage, replica count or tp degree alike.

    With `dp_index` and `n_devices` the saving run's layout is read from COMPLETE.json (dp, tp;
    rank = (d x P + p) x tp + t): the file of the same replica (else replica 0), pipeline
    position and tp rank (else tp rank 0), whatever the tp of either run."""
    meta = _read_marker(Path(folder)) or {}
    saved_dp, saved_tp = meta.get("dp", 1), meta.get("tp", 1)
    if dp_index is None or n_devices is None or not all(isinstance(v, int) and v >= 1 for v in (saved_dp, saved_tp)):
        return rank if (Path(folder) / f"rank{rank}.pt").is_file() else pp_index
    d = dp_index if dp_index < saved_dp else 0
    t = tp_index if tp_index < saved_tp else 0
    return (d * n_devices + pp_index) * saved_tp + t


def load_rank_file(folder: Path, rank: int) -> dict[str, Any]:
    """This rank's saved state: tensors and plain containers only (torch.load weights_only)."""
    import pickle

    import torch

    path = Path(folder) / f"rank{rank}.pt"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise RunError(f"checkpoint {folder} has no file for rank {rank}", "it was saved with another layout") from None
    except pickle.UnpicklingError as e:
        first = next((ln for ln in str(e).splitlines() if ln.strip()), "")[:200]
        raise PplanError(f"checkpoint file {str(path)!r} holds objects other than tensors and plain data; refused to "
                         f"load it ({' '.join(first.split())})", "only load checkpoints you or pplan wrote") from None
    except Exception as e:  # a damaged archive: torch raises RuntimeError and others
        text = " ".join(str(e).split())[:200]
        raise PplanError(f"checkpoint file {str(path)!r} cannot be read: {type(e).__name__}: {text}",
                         "move the damaged save away, or use another --checkpoint-dir") from None
    if not isinstance(state, dict):
        raise PplanError(f"checkpoint file {str(path)!r} is not a pplan rank file")
    return state


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
