"""What a checkpoint folder must prove before pplan reads a byte of its rank files.

A save's marker, COMPLETE.json, records the layout of the run that wrote it (world_size, dp, tp)
and each rank file's size and sha256 (`describe_rank_file`, when the save completes). Folders in
--checkpoint-dir may come from anyone: copied from another machine, truncated by a full disk, or
crafted. So before a save is resumed from:

- the marker is read bounded and depth-limited (planner.jsonio), so 500,000 nested brackets are
  refused rather than recursed into, and it must be pplan's (`read_marker`);
- it must describe a run of the plan: no unknown key, world_size = dp x devices x tp, one entry
  per rank file with a size and a sha256 (`save_problem`);
- each rank file must be a regular file (a FIFO would block the open forever, /dev/zero would
  stream forever), of the recorded size (compared before a byte is hashed: a file that grew to a
  terabyte is refused at once), whose sha256 is the recorded one (`save_problem`).

A rank then loads its file from the very open file it has just hashed (`open_verified`), so the
file cannot be swapped between the check and torch.load.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from planner.errors import PplanError, RunError
from planner.execute.runrecord import MAX_RUN_RANKS
from planner.jsonio import nearest, open_regular, read_json_file
from planner.jsontypes import json_int
from planner.limits import MAX_MEMORY_BYTES

__all__ = ["FORMAT", "MARKER_NAME", "DAMAGED_HINT", "read_marker", "save_problem", "saved_degrees", "marker_entry",
           "open_verified", "describe_rank_file", "sha256_of"]

FORMAT = "pplan-checkpoint/1"
MARKER_NAME = "COMPLETE.json"
"""The marker of a complete save; a folder without it is a save that never finished."""
DAMAGED_HINT = "move the damaged save away, or use another --checkpoint-dir"

# The marker of the largest run (MAX_RUN_RANKS rank files), measured: 142 bytes per rank file and
# 603 for the rest. 160 per rank and 4 KiB besides: 5 MiB, which also holds, with that many ranks,
# a model spec of planner.limits.MAX_MODEL_SPEC_CHARS (262,144) ASCII characters.
_MAX_MARKER_BYTES = 4096 + 160 * MAX_RUN_RANKS
_MARKER_KEYS = ("format", "step", "world_size", "fingerprint", "schedule", "model", "files", "dp", "zero", "tp")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_HASH_BLOCK = 1 << 20  # read and hashed 1 MiB at a time: a rank file of many GB is never held in memory


def read_marker(folder: Path) -> dict[str, Any] | None:
    """COMPLETE.json of `folder` when it is pplan's (a dict with our format), else None."""
    try:  # bounded, depth-limited and strict: 500,000 nested brackets are refused, not recursed into
        meta = read_json_file(folder / MARKER_NAME, "checkpoint marker", RunError, _MAX_MARKER_BYTES)
    except PplanError:
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


def _whole(value: Any, low: int, high: int) -> bool:
    """A JSON integer (not true or false) in low..high."""
    return (whole := json_int(value)) is not None and low <= whole <= high


def _entry_ok(entry: Any) -> bool:
    """A marker's record of one rank file: {"bytes": its size, "sha256": 64 hex digits}."""
    return (isinstance(entry, dict) and sorted(entry) == ["bytes", "sha256"] and _whole(entry["bytes"], 0, MAX_MEMORY_BYTES)
            and isinstance(entry["sha256"], str) and _SHA256.fullmatch(entry["sha256"]) is not None)


def saved_degrees(folder: Path) -> tuple[int, int] | None:
    """(dp, tp) of the run that saved `folder`, by its marker: (1, 1) when the marker records none
    (a save of an older pplan, or no marker), None when what it records is no run's."""
    meta = read_marker(folder) or {}
    dp, tp = meta.get("dp", 1), meta.get("tp", 1)
    return (dp, tp) if _whole(dp, 1, MAX_RUN_RANKS) and _whole(tp, 1, MAX_RUN_RANKS) else None


def marker_entry(folder: Path, name: str) -> dict[str, Any] | None:
    """What `folder`'s marker records of its rank file `name` ({"bytes", "sha256"}), or None when
    there is no marker of pplan's or it records no valid size and sha256 for that file."""
    files = (read_marker(folder) or {}).get("files")
    expect = files.get(name) if isinstance(files, dict) else None
    return expect if _entry_ok(expect) else None


def _marker_problem(folder: Path, meta: dict[str, Any], n_devices: int) -> str | None:
    """Why pplan's marker in `folder` cannot vouch for its save for a plan of `n_devices` pipeline
    devices (None when it can): an unknown key, a layout that is no run's, files not one per rank.
    Checked before any rank file is looked at, so world_size bounds the loop over them."""
    where = folder / MARKER_NAME
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


def sha256_of(fh: IO[bytes], size: int) -> str | None:
    """sha256 of the open file's `size` bytes from where it stands; None when it holds fewer or more
    (it changed since its stat). Reads at most size + 1 bytes, whatever the file has become."""
    h, left = hashlib.sha256(), size
    while left > 0:
        block = fh.read(min(left, _HASH_BLOCK))
        if not block:
            return None
        h.update(block)
        left -= len(block)
    return h.hexdigest() if not fh.read(1) else None


# A process may look for the save to resume from more than once (preflight, then the run itself), and
# each time would hash every rank file again, gigabytes of them: each file is hashed once per process.
# Keyed by what changes when the file is replaced or rewritten (device, inode, size, mtime): hashed anew.
_VERIFIED: dict[tuple[Any, ...], str | None] = {}  # (file, device, inode, size, mtime_ns) -> problem


def _file_problem(path: Path, expect: dict[str, Any]) -> str | None:
    """Why `path` is not the rank file its marker entry `expect` describes (None when it is)."""
    try:
        opened = open_regular(path)
        if opened is None:
            return "is not a regular file (a device, FIFO or socket)"
        fh, st = opened
        with fh:
            if st.st_size != expect["bytes"]:  # refused before a byte is hashed
                truncated = " (truncated)" if st.st_size < expect["bytes"] else ""
                return f"has {st.st_size} bytes, the save wrote {expect['bytes']}{truncated}"
            key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if key not in _VERIFIED:
                same = sha256_of(fh, st.st_size) == expect["sha256"]
                _VERIFIED[key] = None if same else "differs from what the save wrote (sha256 mismatch)"
            return _VERIFIED[key]
    except FileNotFoundError:
        return "is missing"
    except OSError as e:
        return f"cannot be read ({e.strerror})"


def save_problem(folder: Path, meta: dict[str, Any], n_devices: int) -> str | None:
    """The first reason the complete save in `folder`, whose marker is `meta` (read_marker), cannot
    be resumed by a plan of `n_devices` pipeline devices, as 'PATH <problem>'; None when intact.
    The marker is checked first, then each rank file in rank order."""
    problem = _marker_problem(folder, meta, n_devices)
    for r in range(meta["world_size"]) if problem is None else ():
        name = f"rank{r}.pt"
        if (found := _file_problem(folder / name, meta["files"][name])) is not None:
            return f"{folder / name} {found}"
    return problem


@contextlib.contextmanager
def open_verified(path: Path, expect: dict[str, Any]) -> Iterator[IO[bytes]]:
    """The rank file `path` open at its start, once its bytes, read from this very open file, are
    the size and sha256 its marker entry `expect` records (marker_entry). PplanError when it is no
    regular file or differs; FileNotFoundError and other OSErrors are the caller's to word."""
    opened = open_regular(path)
    if opened is None:
        raise PplanError(f"checkpoint file {str(path)!r} is not a regular file (a device, FIFO or socket); "
                         "refused to load it", DAMAGED_HINT)
    fh, st = opened
    with fh:
        if st.st_size != expect["bytes"] or sha256_of(fh, expect["bytes"]) != expect["sha256"]:
            raise PplanError(f"checkpoint file {str(path)!r} differs from what the save wrote (size or sha256); "
                             "refused to load it", DAMAGED_HINT)
        fh.seek(0)
        yield fh


def describe_rank_file(path: Path) -> dict[str, Any]:
    """The marker's entry for a rank file this save just wrote: {"bytes", "sha256"} (RunError when
    it is not a regular file, or changed while it was hashed: something else writes into the folder)."""
    try:
        opened = open_regular(path)
        with opened[0] if opened else contextlib.nullcontext() as fh:
            digest = sha256_of(fh, opened[1].st_size) if opened else None
    except OSError as e:
        raise RunError(f"cannot read checkpoint file {path}: {e.strerror}") from None
    if opened is None or digest is None:
        raise RunError(f"checkpoint file {path} is not a regular file, or changed while it was hashed",
                       "nothing but pplan may write into --checkpoint-dir during a run")
    return {"bytes": opened[1].st_size, "sha256": digest}
