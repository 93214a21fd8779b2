"""Reading a run JSON (`pplan run --out`) back as its RunRecord, every key and value checked.

The report draws from run files and `pplan calibrate --from-run` fits from them; both may be
handed a file someone else wrote or edited, so both read it here: bounded and code-free
(planner.jsonio), unknown keys refused with the nearest known one at every level, and every
field's value checked against the record's type, each failure one line naming the field.
"""

from __future__ import annotations

import os
import re
from dataclasses import fields
from typing import Any, get_type_hints

from planner.errors import PplanError
from planner.execute.measurement import CommMeasurement
from planner.execute.runrecord import RUN_FILE_HINT, Divergence, RankRecord, RunRecord
from planner.jsonio import read_json_file
from planner.jsontypes import INDEX_KEY, check_index_keys, check_object_keys, is_number, objects_in, short, type_error
from planner.plan import MEMORY_KEYS

__all__ = ["load_run", "parse_run", "DIVERGED_KEYS", "COMM_KEYS", "ACTION_KEY"]

# RunRecord's fields (and RankRecord's) are the keys of the run and of each rank, which
# RunRecord.from_dict checks, as it checks every key, field and value of `calibration` and
# `calibration_fit` (planner.execute.fitrecord); these are the keys of its other nested records,
# checked here before any value is read.
DIVERGED_KEYS = tuple(f.name for f in fields(Divergence))
COMM_KEYS = tuple(f.name for f in fields(CommMeasurement))
ACTION_KEY = re.compile(r"[0-9]{1,9}[FBIWRO]")
"""Keys of objects keyed by stage and action kind ("0F")."""


def _json_types(record_type: type) -> dict[str, Any]:
    """Each field's type, which its value read from JSON must have. A byte count may be any number,
    as in the plan's predicted memory (planner.plan.records), which a run copies."""
    hints = get_type_hints(record_type)
    return {k: float | None if "bytes" in k and v == int | None else v for k, v in hints.items()}


_RUN_TYPES = {k: v for k, v in _json_types(RunRecord).items() if k != "ranks"}  # ranks: typed by from_dict
_RANK_TYPES = _json_types(RankRecord)


def load_run(path: str | os.PathLike) -> RunRecord:
    """Read a run JSON written by `pplan run` as its typed record (every key and type checked)."""
    data = read_json_file(path, "run", PplanError)
    if not isinstance(data, dict):
        raise PplanError(f"{path}: run must be a JSON object, got {type(data).__name__}", RUN_FILE_HINT)
    return parse_run(data, str(path))


def parse_run(data: dict[str, Any], source: str = "<run>") -> RunRecord:
    """The RunRecord of a run JSON's object; PplanError names the first key or value that is wrong.

    RunRecord.from_dict refuses unknown keys of the run and of each rank, a missing field and
    another format, and reads its nested records (divergence, ping-pongs, memory breakdowns; the
    calibration and its fit with every key and value checked); other values it keeps as given.
    So the other nested objects are checked here first (their keys and, for memory, that the parts
    are numbers), and every field of the record it built afterwards (its type): a hand-edited or
    hostile file fails on one line, never inside a figure or a fit.
    """
    _check_nested(data, source)
    try:
        record = RunRecord.from_dict(data)
    except PplanError as e:
        raise PplanError(f"{source}: {e.message}", e.hint or RUN_FILE_HINT) from None
    measured = record.iteration_ms_measured
    if not is_number(measured):  # the record allows null, but every reader compares a prediction with it
        raise PplanError(f"{source}: run field 'iteration_ms_measured' must be a number, got {short(measured)}",
                         "give the JSON of a run that timed at least one step")
    for name, hint in _RUN_TYPES.items():
        _check(type_error(getattr(record, name), hint, f"run field {name!r}"), source)
    for i, rank in enumerate(record.ranks):
        for name, hint in _RANK_TYPES.items():
            _check(type_error(getattr(rank, name), hint, f"ranks[{i}] field {name!r}"), source)
    return record


def _check(message: str | None, source: str) -> None:
    if message is not None:
        raise PplanError(f"{source}: {message}", RUN_FILE_HINT)


def _check_nested(data: dict[str, Any], source: str) -> None:
    """Inside the nested objects: refuse a key `pplan run` does not write, and memory breakdowns whose
    parts are not numbers (the figures stack them)."""
    check_object_keys(data.get("diverged"), DIVERGED_KEYS, f"{source}: diverged")
    for i, rank in enumerate(objects_in(data, "ranks")):
        for key in ("memory_measured", "memory_predicted"):
            memory = rank.get(key)
            check_object_keys(memory, MEMORY_KEYS, f"{source}: ranks[{i}].{key}")
            for part, value in (memory.items() if isinstance(memory, dict) else ()):
                if value is not None and not is_number(value):
                    raise PplanError(f"{source}: ranks[{i}].{key}.{part} must be a number of bytes, got {short(value)}",
                                     RUN_FILE_HINT)
        for key in ("action_ms", "action_cpu_ms"):
            check_index_keys(rank.get(key), ACTION_KEY, "stage and action kind such as '0F'", f"{source}: ranks[{i}].{key}")
    for i, comm in enumerate(objects_in(data, "comm")):
        check_object_keys(comm, COMM_KEYS, f"{source}: comm[{i}]")
    check_index_keys(data.get("boundary_bytes"), INDEX_KEY, "stage indices", f"{source}: boundary_bytes")
