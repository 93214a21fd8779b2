"""What a report is drawn from: the files `pplan report` reads, loaded and checked.

Every input is optional; a figure whose inputs are missing is skipped and the index says why.
Formats (docs/HELPERS.md): profile CSV, plan JSON, simulation JSON, run JSON, and the timeline
CSV `device,stage,kind,microbatch,start_ms,end_ms` shared by the simulator and the executor.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from dataclasses import dataclass, field
from types import UnionType
from typing import Any, Callable, Union, get_args, get_origin, get_type_hints

from planner.calibration import CALIBRATION_KEYS
from planner.errors import PplanError
from planner.execute.results import RankRecord, RunRecord
from planner.jsonio import MAX_JSON_BYTES, check_keys, read_bounded_text, read_json_file
from planner.plan import MEMORY_KEYS, PREDICTED_DEVICE_KEYS, PREDICTED_KEYS, Plan, load_plan
from planner.profiling.profile import Profile, load_profile
from planner.simulation.result import TIMELINE_COLUMNS, TIMELINE_KINDS, TimelineRow  # one row type for simulated and measured timelines

__all__ = [
    "TIMELINE_COLUMNS",
    "TIMELINE_KINDS",
    "TimelineRow",
    "ReportInputs",
    "read_timeline",
    "read_timeline_text",
    "load_sim",
    "load_run",
    "parse_run",
    "load_inputs",
]


# Every key a simulation JSON may hold, per object level (what `pplan simulate --out` writes:
# planner/simulation/result.py). Anything else is refused with the nearest known key.
SIM_KEYS = (*PREDICTED_KEYS, "memory_timeline")
# The run JSON is planner.execute.results.RunRecord: its fields (and RankRecord's) are the keys of
# the run and of each rank, which RunRecord.from_dict checks; the keys below are those of the
# objects it keeps as plain dicts, checked here.
DIVERGED_KEYS = ("step", "loss")
COMM_KEYS = ("a", "b", "latency_ms", "bandwidth_bytes_per_s", "points")
CALIBRATION_FIT_KEYS = ("measured_ms", "predicted_ms_before", "error_pct_before", "predicted_ms_after", "error_pct_after",
                        "compute_points", "path", "calibration")
COMPUTE_POINT_KEYS = ("action", "profiled_ms", "measured_ms")
# Objects keyed by data rather than field names: device or stage indices, and stage+kind ("0F")
_INDEX_KEY = re.compile(r"[0-9]{1,9}")
_ACTION_KEY = re.compile(r"[0-9]{1,9}[FBIWRO]")


def _json_types(record_type: type) -> dict[str, Any]:
    """Each field's type, which its value read from JSON must have. A byte count may be any number,
    as in the plan's predicted memory (planner.plan.records), which a run copies."""
    hints = get_type_hints(record_type)
    return {k: float | None if "bytes" in k and v == int | None else v for k, v in hints.items()}


_RUN_TYPES = {k: v for k, v in _json_types(RunRecord).items() if k != "ranks"}  # ranks: typed by from_dict
_RANK_TYPES = _json_types(RankRecord)
# Fields a pplan-run/1 file may lack, read as "not recorded": files written before a field existed
# (`diverged` came after the committed example report's runs) and the trimmed test fixture.
_NOT_RECORDED: dict[str, Any] = {"diverged": None, "prediction_source": None, "calibration": None, "first_step": 0,
                                 "runtime": "not recorded", "optimizer": "not recorded"}
_RUN_HINT = "give the JSON that `pplan run` writes"


@dataclass(frozen=True)
class ReportInputs:
    """Everything a report may draw from; any field may be None."""

    profile: Profile | None = None
    """Per-layer profile."""
    plan: Plan | None = None
    """The plan (with `predicted` and `search` when written by `pplan partition`)."""
    sim: dict[str, Any] | None = None
    """Simulation JSON (iteration_ms, devices, memory_timeline, ...)."""
    run: RunRecord | None = None
    """The measured run (the run JSON that `pplan run` writes, as its record)."""
    timeline: tuple[TimelineRow, ...] | None = None
    """Simulated timeline of one iteration."""
    measured_timeline: tuple[TimelineRow, ...] | None = None
    """Measured timeline of one iteration."""
    sources: dict[str, str] = field(default_factory=dict)
    """Input name -> file it came from (shown in the index)."""
    sim_label: str = "simulation"
    """How figures name the simulation's prediction (the demo says 'after calibration')."""
    notes: tuple[str, ...] = ()
    """Extra lines for the index (e.g. what was computed rather than read)."""
    extra_predictions: tuple[tuple[str, float], ...] = ()
    """(label, iteration ms) of further predictions to compare measured steps with."""
    calibration: str | None = None
    """Calibration JSON to simulate with, or 'none' (None: the profile's own, if any)."""
    basis: str | None = None
    """What the report's simulation is based on (set by derive: calibrated or not, and by what)."""
    sim_is_fit: bool = False
    """The simulation is calibrated on the very run shown: its gap to the run is a fit residual."""

    def __post_init__(self) -> None:
        if self.run is not None and not isinstance(self.run, RunRecord):  # a caller's mistake, not a user's
            raise TypeError(f"ReportInputs.run must be a RunRecord, got {type(self.run).__name__}; "
                            "read a run JSON with load_run(path) or RunRecord.from_dict(data)")

    def missing(self, *names: str) -> list[str]:
        """Which of the named inputs are absent."""
        return [n for n in names if getattr(self, n) is None]


def _bad(source: str, message: str, hint: str | None = None) -> PplanError:
    return PplanError(f"{source}: {message}", hint)


def read_timeline_text(text: str, source: str = "<timeline>") -> tuple[TimelineRow, ...]:
    """Parse timeline CSV text; PplanError names the line and column of the first problem."""
    reader = csv.reader(io.StringIO(text))
    header: list[str] | None = None
    rows: list[TimelineRow] = []
    for lineno, row in enumerate(reader, start=1):
        if not row or all(not c.strip() for c in row) or row[0].lstrip().startswith("#"):
            continue
        if header is None:
            header = [h.strip() for h in row]
            missing = [c for c in TIMELINE_COLUMNS if c not in header]
            if missing:
                raise _bad(source, f"line {lineno}: timeline is missing column(s) {', '.join(missing)}",
                           "the header must be " + ",".join(TIMELINE_COLUMNS))
            continue
        if len(row) != len(header):
            raise _bad(source, f"line {lineno}: {len(row)} fields, header has {len(header)}")
        cell = dict(zip(header, (c.strip() for c in row)))
        rows.append(_timeline_row(cell, source, lineno))
    if header is None:
        raise _bad(source, "empty timeline (no header row)", "the header must be " + ",".join(TIMELINE_COLUMNS))
    return tuple(rows)


def _timeline_row(cell: dict[str, str], source: str, lineno: int) -> TimelineRow:
    values: dict[str, Any] = {}
    for col in ("device", "stage", "microbatch"):
        try:
            values[col] = int(cell[col])
        except ValueError:
            raise _bad(source, f"line {lineno}: column {col!r}: {cell[col]!r} is not an integer") from None
    for col in ("start_ms", "end_ms"):
        try:
            values[col] = float(cell[col])
        except ValueError:
            raise _bad(source, f"line {lineno}: column {col!r}: {cell[col]!r} is not a number") from None
        if not math.isfinite(values[col]):
            raise _bad(source, f"line {lineno}: column {col!r}: {cell[col]!r} is not finite")
    kind = cell["kind"].upper()
    if kind not in TIMELINE_KINDS:
        raise _bad(source, f"line {lineno}: kind {cell['kind']!r} is unknown", f"use one of {' '.join(TIMELINE_KINDS)}")
    if values["device"] < 0:
        raise _bad(source, f"line {lineno}: device {values['device']} is negative")
    if values["end_ms"] < values["start_ms"]:
        raise _bad(source, f"line {lineno}: end_ms {values['end_ms']} is before start_ms {values['start_ms']}")
    return TimelineRow(kind=kind, **values)


def read_timeline(path: str | os.PathLike) -> tuple[TimelineRow, ...]:
    """Read a timeline CSV file (simulated or measured)."""
    return read_timeline_text(_read_text(path, "timeline"), source=str(path))


def _read_text(path: str | os.PathLike, what: str) -> str:
    """A bounded read of a regular file (no FIFO, device or file larger than any real one)."""
    return read_bounded_text(path, what, PplanError, MAX_JSON_BYTES)


def _read_json(path: str | os.PathLike, what: str) -> dict[str, Any]:
    data = read_json_file(path, what, PplanError)
    if not isinstance(data, dict):
        raise PplanError(f"{path}: {what} must be a JSON object, got {type(data).__name__}")
    return data


def _keys(data: Any, known: tuple[str, ...], where: str, source: str) -> None:
    """Refuse a key of the object `data` (when it is one) that is not in `known`."""
    if isinstance(data, dict):
        check_keys(data, known, f"{source}: {where}", PplanError)


def _data_keys(data: Any, pattern: re.Pattern, what: str, where: str, source: str) -> None:
    """Refuse a key of `data` (an object keyed by indices) that does not look like one."""
    if isinstance(data, dict):
        for key in data:
            if not pattern.fullmatch(key):
                raise _bad(source, f"{where}: unknown key {key[:60]!r}", f"its keys are {what}")


def _list_of_objects(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key)
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


def _require_numbers(data: dict[str, Any], keys: tuple[str, ...], source: str, what: str, hint: str) -> None:
    for key in keys:
        value = data.get(key)
        if not _is_number(value):
            raise _bad(source, f"{what} field {key!r} must be a number, got {value!r}"[:200], hint)


def _require_list(data: dict[str, Any], key: str, item_ok: Callable[[Any], bool], items: str,
                  source: str, what: str, hint: str) -> list:
    """`data[key]` (absent: []), refused unless a list whose every item passes `item_ok`."""
    value = data.get(key, [])
    if not isinstance(value, list) or not all(item_ok(x) for x in value):
        raise _bad(source, f"{what} field {key!r} must be a list of {items}", hint)
    return value


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def load_sim(path: str | os.PathLike) -> dict[str, Any]:
    """Read a simulation JSON (as written by `pplan simulate --json-out`) and check its core fields."""
    data = _read_json(path, "simulation")
    check_sim(data, str(path))
    return data


def check_sim(data: dict[str, Any], source: str = "<simulation>") -> None:
    """Raise PplanError unless `data` has the simulation fields the figures read."""
    hint = "give the JSON that `pplan simulate` writes"
    _keys(data, SIM_KEYS, "simulation", source)
    for i, dev in enumerate(_list_of_objects(data, "devices")):
        _keys(dev, PREDICTED_DEVICE_KEYS, f"devices[{i}]", source)
        _keys(dev.get("memory"), MEMORY_KEYS, f"devices[{i}].memory", source)
    _data_keys(data.get("memory_timeline"), _INDEX_KEY, "device indices", "memory_timeline", source)
    _require_numbers(data, ("iteration_ms",), source, "simulation", hint)
    devices = _require_list(data, "devices", lambda d: isinstance(d, dict), "objects", source, "simulation", hint)
    for i, dev in enumerate(devices):
        mem = dev.get("memory")
        if mem is not None and not isinstance(mem, dict):
            raise _bad(source, f"simulation field devices[{i}].memory must be an object", hint)
    timeline = data.get("memory_timeline", {})
    if not isinstance(timeline, dict):
        raise _bad(source, "simulation field 'memory_timeline' must be an object of device -> [[t_ms, bytes], ...]", hint)


def load_run(path: str | os.PathLike) -> RunRecord:
    """Read a run JSON written by `pplan run` as its typed record (every key and type checked)."""
    return parse_run(_read_json(path, "run"), str(path))


def parse_run(data: dict[str, Any], source: str = "<run>") -> RunRecord:
    """The RunRecord of a run JSON's object; PplanError names the first key or value that is wrong.

    RunRecord.from_dict refuses unknown keys of the run and of each rank, a missing field and
    another format; it builds whatever values it is given. So the objects it keeps as dicts are
    checked here first (their keys), and every field of the record it built afterwards (its type):
    a hand-edited or hostile file fails on one line, never inside a figure.
    """
    _check_nested(data, source)
    try:
        record = RunRecord.from_dict({**_NOT_RECORDED, **data})
    except PplanError as e:
        raise _bad(source, e.message, e.hint or _RUN_HINT) from None
    measured = record.iteration_ms_measured
    if not _is_number(measured):  # the record allows null, but the report compares the prediction with it
        raise _bad(source, f"run field 'iteration_ms_measured' must be a number, got {_short(measured)}",
                   "give the JSON of a run that timed at least one step")
    _check_types(record, source)
    return record


def _check_nested(data: dict[str, Any], source: str) -> None:
    """Inside the objects RunRecord keeps as dicts: refuse a key `pplan run` does not write, and memory
    breakdowns whose parts are not numbers (the figures stack them)."""
    _keys(data.get("diverged"), DIVERGED_KEYS, "diverged", source)
    for i, rank in enumerate(_list_of_objects(data, "ranks")):
        for key in ("memory_measured", "memory_predicted"):
            memory = rank.get(key)
            _keys(memory, MEMORY_KEYS, f"ranks[{i}].{key}", source)
            for part, value in (memory.items() if isinstance(memory, dict) else ()):
                if value is not None and not _is_number(value):
                    raise _bad(source, f"ranks[{i}].{key}.{part} must be a number of bytes, got {_short(value)}",
                               _RUN_HINT)
        for key in ("action_ms", "action_cpu_ms"):
            _data_keys(rank.get(key), _ACTION_KEY, "stage and action kind such as '0F'", f"ranks[{i}].{key}", source)
    for i, comm in enumerate(_list_of_objects(data, "comm")):
        _keys(comm, COMM_KEYS, f"comm[{i}]", source)
    _data_keys(data.get("boundary_bytes"), _INDEX_KEY, "stage indices", "boundary_bytes", source)
    _keys(data.get("calibration"), CALIBRATION_KEYS, "calibration", source)
    fit = data.get("calibration_fit")
    _keys(fit, CALIBRATION_FIT_KEYS, "calibration_fit", source)
    if isinstance(fit, dict):
        _keys(fit.get("calibration"), CALIBRATION_KEYS, "calibration_fit.calibration", source)
        for i, point in enumerate(_list_of_objects(fit, "compute_points")):
            _keys(point, COMPUTE_POINT_KEYS, f"calibration_fit.compute_points[{i}]", source)


def _check_types(record: RunRecord, source: str) -> None:
    """Refuse the first field of the record, or of one of its ranks, whose value its type does not allow."""
    for name, hint in _RUN_TYPES.items():
        _check_type(getattr(record, name), hint, f"run field {name!r}", source)
    for i, rank in enumerate(record.ranks):
        for name, hint in _RANK_TYPES.items():
            _check_type(getattr(rank, name), hint, f"ranks[{i}] field {name!r}", source)


def _check_type(value: Any, hint: Any, what: str, source: str) -> None:
    if _conforms(value, hint):
        return
    if get_origin(hint) is list and isinstance(value, list):  # name the item: the list may be long
        i, item = next((i, x) for i, x in enumerate(value) if not _conforms(x, get_args(hint)[0]))
        raise _bad(source, f"{what} must be {_describe(hint)}; item {i} is {_short(item)}", _RUN_HINT)
    raise _bad(source, f"{what} must be {_describe(hint)}, got {_short(value)}", _RUN_HINT)


def _conforms(value: Any, hint: Any) -> bool:
    """Whether a value read from JSON fits a field's annotation."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return True
    if origin in (Union, UnionType):
        return any(_conforms(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(_conforms(x, args[0]) for x in value)
    if origin is dict:
        return isinstance(value, dict) and all(_conforms(x, args[1]) for x in value.values())
    if hint is float:
        return _is_number(value)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is type(None):
        return value is None
    return isinstance(value, hint)


_NAMES = {float: ("a number", "numbers"), int: ("an integer", "integers"), str: ("a string", "strings"),
          bool: ("true or false", "booleans"), type(None): ("null", "nulls")}


def _describe(hint: Any, plural: bool = False) -> str:
    """An annotation in words: `list[float] | None` -> 'a list of numbers or null'."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, UnionType):
        return " or ".join(_describe(a, plural) for a in args)
    if origin is list:
        return ("lists" if plural else "a list") + " of " + _describe(args[0], plural=True)
    if hint is Any:
        return "values" if plural else "any value"
    if origin is dict or hint not in _NAMES:
        of = "" if origin is not dict or args[1] is Any else " of " + _describe(args[1], plural=True)
        return ("objects" if plural else "an object") + of
    return _NAMES[hint][plural]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load_inputs(
    profile: str | os.PathLike | None = None,
    plan: str | os.PathLike | None = None,
    sim: str | os.PathLike | None = None,
    run: str | os.PathLike | None = None,
    timeline: str | os.PathLike | None = None,
    measured_timeline: str | os.PathLike | None = None,
) -> ReportInputs:
    """Load whichever files are given; raise PplanError on the first unreadable one."""
    sources = {name: str(p) for name, p in (
        ("profile", profile), ("plan", plan), ("sim", sim), ("run", run),
        ("timeline", timeline), ("measured_timeline", measured_timeline)) if p is not None}
    if not sources:
        raise PplanError("nothing to report on: no input files given",
                         "pass at least one of --profile, --plan, --sim, --run, --timeline, --measured-timeline")
    return ReportInputs(
        profile=load_profile(profile) if profile is not None else None,
        plan=load_plan(plan) if plan is not None else None,
        sim=load_sim(sim) if sim is not None else None,
        run=load_run(run) if run is not None else None,
        timeline=read_timeline(timeline) if timeline is not None else None,
        measured_timeline=read_timeline(measured_timeline) if measured_timeline is not None else None,
        sources=sources,
    )


__all__ += ["check_sim", "SIM_KEYS"]


def as_dict(record: Any) -> dict[str, Any]:
    """A plan's `predicted`/`search` as a plain dict, whether typed record, dict or None."""
    if record is None:
        return {}
    if hasattr(record, "to_dict"):
        return record.to_dict()
    return dict(record) if isinstance(record, dict) else {}
__all__ += ["as_dict"]
