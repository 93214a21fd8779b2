"""Reading a run JSON (`pplan run --out`) back as its RunRecord, every key and value checked.

The report draws from run files and `pplan calibrate --from-run` fits from them; both may be
handed a file someone else wrote or edited, so both read it here: bounded and code-free
(planner.jsonio), unknown keys refused with the nearest known one at every level, and every
field's value checked against the record's type, each failure one line naming the field.
"""

from __future__ import annotations

import os
import re
from typing import Any

from planner.errors import PplanError
from planner.execute.runrecord import RUN_FILE_HINT, RunRecord
from planner.jsonio import read_json_file
from planner.jsontypes import INDEX_KEY, check_index_keys, is_number, objects_in, short

__all__ = ["load_run", "parse_run", "ACTION_KEY"]

ACTION_KEY = re.compile(r"[0-9]{1,9}[FBIWRO]")
"""Keys of objects keyed by stage and action kind ("0F")."""


def load_run(path: str | os.PathLike) -> RunRecord:
    """Read a run JSON written by `pplan run` as its typed record (every key and type checked)."""
    data = read_json_file(path, "run", PplanError)
    if not isinstance(data, dict):
        raise PplanError(f"{path}: run must be a JSON object, got {type(data).__name__}", RUN_FILE_HINT)
    return parse_run(data, str(path))


def parse_run(data: dict[str, Any], source: str = "<run>") -> RunRecord:
    """The RunRecord of a run JSON's object; PplanError names the first key or value that is wrong.

    RunRecord.from_dict refuses another format, and at every level (the run, each rank, the
    divergence, the ping-pongs, the calibration and its fit) an unknown key, a missing field and a
    value of the wrong type (planner.jsontypes.record_fields), the memory breakdowns included. The
    keys of objects keyed by data (actions, stages) are checked here first. So a hand-edited or
    hostile file fails on one line, never inside a figure or a fit.
    """
    _check_nested(data, source)
    # the record allows null, but every reader compares a prediction with it (absent: a missing field)
    if "iteration_ms_measured" in data and not is_number(measured := data["iteration_ms_measured"]):
        raise PplanError(f"{source}: run field 'iteration_ms_measured' must be a number, got {short(measured)}",
                         "give the JSON of a run that timed at least one step")
    try:
        return RunRecord.from_dict(data)
    except PplanError as e:
        raise PplanError(f"{source}: {e.message}", e.hint or RUN_FILE_HINT) from None


def _check_nested(data: dict[str, Any], source: str) -> None:
    """Refuse a key of an object keyed by data that is not an action or a stage."""
    for i, rank in enumerate(objects_in(data, "ranks")):
        for key in ("action_ms", "action_cpu_ms"):
            check_index_keys(rank.get(key), ACTION_KEY, "stage and action kind such as '0F'", f"{source}: ranks[{i}].{key}")
    check_index_keys(data.get("boundary_bytes"), INDEX_KEY, "stage indices", f"{source}: boundary_bytes")
