"""What a report is drawn from: the files `pplan report` reads, loaded and checked.

Every input is optional; a figure whose inputs are missing is skipped and the index says why.
Formats (docs/HELPERS.md): profile CSV, plan JSON, simulation JSON, run JSON, and the timeline
CSV `device,stage,kind,microbatch,start_ms,end_ms` shared by the simulator and the executor.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field
from typing import Any

from planner.errors import PlanError, PplanError
from planner.execute.runrecord import RunRecord
from planner.execute.runfile import load_run, parse_run
from planner.filekind import SNIFF_BYTES, head_kind, wrong_kind
from planner.jsonio import MAX_JSON_BYTES, loads_strict, nearest, read_bounded_text
from planner.jsontypes import file_kind, kind_mismatch, range_error
from planner.limits import MAX_GLOBAL_BATCH
from planner.plan import Plan, load_plan
from planner.plan.bounds import MAX_PLAN_BYTES
from planner.plan.serialize import read_plan
from planner.plan.records import MAX_PIPELINE_STAGES, MAX_PREDICTED_MS
from planner.profiling.csvio import MAX_INT_CHARS, check_line_lengths, count_lines, csv_rows
from planner.units import PLAIN_INTEGER_HINT, PLAIN_NUMBER_HINT, plain_float, plain_int
from planner.profiling.profile import Profile, load_profile
from planner.report.agree import (  # re-exported: what the report's callers import from here
    SIM_OF_PLAN_HINT, check_consistent, check_measured_timeline, check_timeline_of_plan, sim_differences,
)
from planner.simulation.result import (  # one row type for simulated and measured timelines
    TIMELINE_COLUMNS, TIMELINE_KINDS, SimulationRecord, TimelineRow,
)
from planner.textsafe import check_name

__all__ = [
    "TIMELINE_COLUMNS",
    "TIMELINE_KINDS",
    "TimelineRow",
    "ReportInputs",
    "read_timeline",
    "read_timeline_text",
    "SimulationRecord",
    "load_sim",
    "parse_sim",
    "load_run",
    "parse_run",
    "load_inputs",
    "check_consistent",
    "sim_differences",
    "SIM_OF_PLAN_HINT",
    "check_timeline_of_plan",
    "MAX_TIMELINE_ROWS",
]

# What each column of a timeline row may be, and the hint when it is not: a pipeline has at most
# MAX_PIPELINE_STAGES devices and stages (the gradient sync and optimizer rows have stage and
# micro-batch -1), an iteration at most MAX_GLOBAL_BATCH micro-batches; times are ms.
_PIPELINE = f"a pipeline has at most {MAX_PIPELINE_STAGES} devices and stages, numbered from 0"
_TIMES = "times are ms from the start of the run or iteration"
_ROW_RANGES = {"device": (0, MAX_PIPELINE_STAGES - 1, _PIPELINE), "stage": (-1, MAX_PIPELINE_STAGES - 1, _PIPELINE),
               "microbatch": (-1, MAX_GLOBAL_BATCH - 1, f"an iteration has at most {MAX_GLOBAL_BATCH} micro-batches"),
               "start_ms": (-MAX_PREDICTED_MS, MAX_PREDICTED_MS, _TIMES), "end_ms": (-MAX_PREDICTED_MS, MAX_PREDICTED_MS, _TIMES)}
MAX_TIMELINE_ROWS = 1_000_000
"""Most rows a timeline file may hold: drawing 300,000 boxes took 0.6 GB; the file limit (64 MiB) alone allows 5 million."""
# The report's flag for each pplan file kind (planner.jsontypes.file_kind), to name the right one.
_FLAGS = {"plan": "--plan", "run": "--run", "sim": "--sim", "calibration": "--calibration", "profile": "--profile"}
_NAMES = {"plan": "plan", "run": "run", "sim": "simulation"}
# Each timeline option: (what it takes, the command that writes one).
_TIMELINES = {"--timeline": ("the simulated timeline", "`pplan simulate PLAN --timeline FILE`"),
              "--measured-timeline": ("the measured timeline", "`pplan run PLAN --timeline FILE`")}
_TIMELINE_HINT = "`pplan simulate PLAN --timeline FILE` or `pplan run PLAN --timeline FILE` writes a timeline of one iteration"


@dataclass(frozen=True)
class ReportInputs:
    """Everything a report may draw from; any field may be None."""

    profile: Profile | None = None
    """Per-layer profile."""
    plan: Plan | None = None
    """The plan (with `predicted` and `search` when written by `pplan partition`)."""
    sim: SimulationRecord | None = None
    """The simulation (`pplan simulate --out`, read by load_sim; or SimResult.record())."""
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
    warnings: tuple[str, ...] = ()
    """Why an input is not what it says (a plan's prediction made for another plan, dropped): the first summary rows."""
    basis: str | None = None
    """What the report's simulation is based on (set by derive: calibrated or not, and by what)."""
    sim_is_fit: bool = False
    """The simulation is calibrated on the very run shown: its gap to the run is a fit residual."""

    def __post_init__(self) -> None:
        if self.run is not None and not isinstance(self.run, RunRecord):  # a caller's mistake, not a user's
            raise TypeError(f"ReportInputs.run must be a RunRecord, got {type(self.run).__name__}; "
                            "read a run JSON with load_run(path) or parse_run(data)")
        if self.sim is not None and not isinstance(self.sim, SimulationRecord):
            raise TypeError(f"ReportInputs.sim must be a SimulationRecord, got {type(self.sim).__name__}; "
                            "read a simulation JSON with load_sim(path), or pass SimResult.record()")
        check_consistent(self.plan, self.run, self.sources, self.sim)

    def missing(self, *names: str) -> list[str]:
        """Which of the named inputs are absent."""
        return [n for n in names if getattr(self, n) is None]


def _bad(source: str, message: str, hint: str | None = None) -> PplanError:
    return PplanError(f"{source}: {message}", hint)


def read_timeline_text(text: str, source: str = "<timeline>") -> tuple[TimelineRow, ...]:
    """Parse timeline CSV text; PplanError names the line and column of the first problem."""
    _check_timeline_size(text, source)
    reader = csv.reader(text.splitlines(keepends=True))  # a quoted newline stays in its cell
    header: list[str] | None = None
    rows: list[TimelineRow] = []
    for row in csv_rows(reader, 0, source, PplanError):
        lineno = reader.line_num
        if not row or all(not c.strip() for c in row) or row[0].lstrip().startswith("#"):
            continue
        if header is None:
            header = [h.strip() for h in row]
            _check_header(header, source, lineno)
            missing = [c for c in TIMELINE_COLUMNS if c not in header]
            if missing:
                raise _bad(source, f"line {lineno}: timeline is missing column(s) {', '.join(missing)}",
                           "the header must be " + ",".join(TIMELINE_COLUMNS))
            continue
        if len(row) != len(header):
            raise _bad(source, f"line {lineno}: {len(row)} fields, header has {len(header)}")
        if len(rows) == MAX_TIMELINE_ROWS:
            raise _bad(source, f"line {lineno}: more than {MAX_TIMELINE_ROWS} timeline rows",
                       "a report draws one iteration: keep the rows of the iterations to show")
        cell = dict(zip(header, (c.strip() for c in row)))
        rows.append(_timeline_row(cell, source, lineno))
    if header is None:
        raise _bad(source, "empty timeline (no header row)", "the header must be " + ",".join(TIMELINE_COLUMNS))
    if not rows:  # an empty figure (and a matplotlib warning) otherwise
        raise _bad(source, "the timeline has no rows, only its header", _TIMELINE_HINT)
    return tuple(rows)


def _check_timeline_size(text: str, source: str) -> None:
    """Refuse more lines than any timeline has, or a line longer than any row, before splitting."""
    n_lines = count_lines(text)
    if n_lines > 2 * MAX_TIMELINE_ROWS:  # blank and comment lines count too: each is a string once split
        raise _bad(source, f"{n_lines} lines, more than any timeline has (at most {MAX_TIMELINE_ROWS} rows)",
                   "a report draws one iteration: keep the rows of the iterations to show")
    check_line_lengths(text, source, PplanError, what="timeline")


def _check_header(header: list[str], source: str, lineno: int) -> None:
    """Refuse a column given twice (which value counts?) or one no timeline has (a typo: `strat_ms`
    read as missing `start_ms` at best), naming the nearest known column, as the profile reader does."""
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise _bad(source, f"line {lineno}: column {name[:40]!r} appears twice in the header", "keep one of them")
        seen.add(name)
        if name not in TIMELINE_COLUMNS:
            guess = nearest(name, TIMELINE_COLUMNS)
            raise _bad(source, f"line {lineno}: unknown column {name[:40]!r}",
                       f"did you mean {guess!r}?" if guess else "the header must be " + ",".join(TIMELINE_COLUMNS))


def _timeline_row(cell: dict[str, str], source: str, lineno: int) -> TimelineRow:
    values: dict[str, Any] = {}
    for col in ("device", "stage", "microbatch"):
        try:
            if len(cell[col]) > MAX_INT_CHARS:
                raise ValueError
            values[col] = plain_int(cell[col])
        except ValueError:
            raise _bad(source, f"line {lineno}: column {col!r}: {cell[col][:40]!r} is not an integer in range",
                       PLAIN_INTEGER_HINT) from None
    for col in ("start_ms", "end_ms"):
        try:
            values[col] = plain_float(cell[col])
        except ValueError:
            raise _bad(source, f"line {lineno}: column {col!r}: {cell[col][:40]!r} is not a number", PLAIN_NUMBER_HINT) from None
        if not math.isfinite(values[col]):
            raise _bad(source, f"line {lineno}: column {col!r}: {cell[col][:40]!r} is not finite")
    kind = check_name(cell["kind"], "kind", PplanError, f"{source}:{lineno}").upper()  # no escape sequence in a message
    if kind not in TIMELINE_KINDS:
        raise _bad(source, f"line {lineno}: kind {cell['kind'][:40]!r} is unknown", f"use one of {' '.join(TIMELINE_KINDS)}")
    for col, (low, high, hint) in _ROW_RANGES.items():
        if message := range_error(values[col], low, high, f"column {col!r}"):
            raise _bad(source, f"line {lineno}: {message}", hint)
    if values["end_ms"] < values["start_ms"]:
        raise _bad(source, f"line {lineno}: end_ms {values['end_ms']} is before start_ms {values['start_ms']}")
    return TimelineRow(kind=kind, **values)


def read_timeline(path: str | os.PathLike, flag: str = "--timeline") -> tuple[TimelineRow, ...]:
    """Read a timeline CSV file (simulated or measured) given as `flag`: a pplan file of another kind
    (a run JSON given as a timeline) is named for what it is, with the option that reads it
    (planner.filekind), not as a CSV whose header is '{'."""
    text = _read_text(path, "timeline")
    what, writer = _TIMELINES[flag]
    make = f"give {what} as {flag} ({writer} writes one)"
    head = text[:SNIFF_BYTES]
    if wrong := wrong_kind(str(path), head.encode(), "timeline", make):
        kind = head_kind(head.encode())[0]  # a file this report reads under another option: that option
        raise PplanError(wrong[0], f"pass it as {_FLAGS[kind]}; {make}" if kind in _FLAGS else wrong[1])
    if head.lstrip("\ufeff \t\r\n").startswith(("{", "[")):
        raise PplanError(f"{path} is JSON, not a timeline CSV", make)
    return read_timeline_text(text, source=str(path))


def _read_text(path: str | os.PathLike, what: str) -> str:
    """A bounded read of a regular file (no FIFO, device or file larger than any real one)."""
    return read_bounded_text(path, what, PplanError, MAX_JSON_BYTES)


def load_sim(path: str | os.PathLike) -> SimulationRecord:
    """Read a simulation JSON (as written by `pplan simulate --out`) as its record, every key and value checked."""
    return parse_sim(_read_json(path, "sim"), str(path))


def _read_json(path: str | os.PathLike, kind: str) -> Any:
    """A JSON file the report reads as `kind` (plan, run, sim), refused when its `format` says it is
    another pplan file, with the flag that takes it (a simulation JSON has no format)."""
    # The bound each file's own loader applies: a plan that `pplan simulate` refuses is refused here too
    text = read_bounded_text(path, _NAMES[kind], PplanError, MAX_PLAN_BYTES if kind == "plan" else MAX_JSON_BYTES)
    head = text[:SNIFF_BYTES]
    if not head.lstrip("\ufeff \t\r\n").startswith("{") and (
            wrong := wrong_kind(str(path), head.encode(), kind, f"give the {_NAMES[kind]} JSON as {_FLAGS[kind]}")):
        raise PplanError(*wrong)  # a profile or timeline CSV given for it, not "invalid JSON" (JSON: below, with its flag)
    data = loads_strict(text, str(path), PplanError)
    if (other := kind_mismatch(data, kind)) is not None:
        flag = _FLAGS.get(file_kind(data) or "")
        hint = f"pass it as {flag}" if flag else f"give the {_NAMES[kind]} JSON as {_FLAGS[kind]}"
        raise PplanError(f"{path}: {other}", hint)
    return data


def _load_plan(path: str | os.PathLike) -> tuple[Plan, str | None]:
    """A plan file, read once: refused as another kind of pplan file first, then as load_plan does.
    Returns (plan, why its recorded prediction was dropped, or None: planner.plan.read_plan)."""
    if not os.path.lexists(path):
        return load_plan(path), None  # its message and hint for a plan that does not exist
    data = _read_json(path, "plan")
    try:
        return read_plan(data)
    except PplanError as e:
        raise PlanError(f"{path}: {e.message}", e.hint) from None


def _load_run(path: str | os.PathLike) -> RunRecord:
    """A run file, read once: refused as another kind of pplan file first, then as load_run does."""
    data = _read_json(path, "run")
    if not isinstance(data, dict):
        return load_run(path)  # its message for a JSON value that is not an object
    return parse_run(data, str(path))


def parse_sim(data: Any, source: str = "<simulation>") -> SimulationRecord:
    """The SimulationRecord of a simulation JSON's object; PplanError names `source` and the first bad field."""
    return SimulationRecord.from_dict(data, source)




def load_inputs(
    profile: str | os.PathLike | None = None,
    plan: str | os.PathLike | None = None,
    sim: str | os.PathLike | None = None,
    run: str | os.PathLike | None = None,
    timeline: str | os.PathLike | None = None,
    measured_timeline: str | os.PathLike | None = None,
    calibration: str | None = None,
) -> ReportInputs:
    """Load whichever files are given; raise PplanError on the first unreadable one. `calibration`
    (a file, 'none', or None for the profile's own) is read when the report simulates."""
    sources = {name: str(p) for name, p in (
        ("profile", profile), ("plan", plan), ("sim", sim), ("run", run),
        ("timeline", timeline), ("measured_timeline", measured_timeline)) if p is not None}
    if not sources:
        raise PplanError("nothing to report on: no input files given",
                         "pass at least one of --profile, --plan, --sim, --run, --timeline, --measured-timeline")
    loaded_plan, stale = _load_plan(plan) if plan is not None else (None, None)
    timelines = {name: read_timeline(path, flag) if path is not None else None for name, path, flag in (
        ("timeline", timeline, "--timeline"), ("measured_timeline", measured_timeline, "--measured-timeline"))}
    if timelines["measured_timeline"] is not None:
        check_measured_timeline(timelines["measured_timeline"], sources["measured_timeline"], timelines["timeline"],
                                sources.get("timeline"))
    for name, rows in timelines.items():
        if loaded_plan is not None and rows is not None:
            check_timeline_of_plan(rows, loaded_plan, sources[name])
    return ReportInputs(
        profile=load_profile(profile) if profile is not None else None,
        plan=loaded_plan,
        sim=load_sim(sim) if sim is not None else None,
        run=_load_run(run) if run is not None else None,
        timeline=timelines["timeline"],
        measured_timeline=timelines["measured_timeline"],
        sources=sources,
        calibration=calibration,
        warnings=(f"{sources['plan']}: {stale}",) if stale else (),
    )
