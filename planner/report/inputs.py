"""What a report is drawn from: the files `pplan report` reads, loaded and checked.

Every input is optional; a figure whose inputs are missing is skipped and the index says why.
Formats (docs/HELPERS.md): profile CSV, plan JSON, simulation JSON, run JSON, and the timeline
CSV `device,stage,kind,microbatch,start_ms,end_ms` shared by the simulator and the executor.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.errors import PplanError
from planner.plan import Plan, load_plan
from planner.profiling.profile import Profile, load_profile
from planner.simulation.result import TIMELINE_COLUMNS

__all__ = [
    "TIMELINE_COLUMNS",
    "TIMELINE_KINDS",
    "TimelineRow",
    "ReportInputs",
    "read_timeline",
    "read_timeline_text",
    "load_sim",
    "load_run",
    "load_inputs",
]

TIMELINE_KINDS = ("F", "B", "I", "W", "R", "C", "O")


@dataclass(frozen=True)
class TimelineRow:
    """One interval of a timeline: a compute action, a transfer or the optimizer step."""

    device: int
    """Device (rank) the interval ran on; for a transfer, the sender."""
    stage: int
    """Stage the work belongs to (sending stage for C, -1 if not known)."""
    kind: str
    """F, B, I, W, R (recompute), C (transfer) or O (optimizer step)."""
    microbatch: int
    """Micro-batch index (-1 for the optimizer step)."""
    start_ms: float
    """Start, ms from the iteration start."""
    end_ms: float
    """End, ms from the iteration start."""


@dataclass(frozen=True)
class ReportInputs:
    """Everything a report may draw from; any field may be None."""

    profile: Profile | None = None
    """Per-layer profile."""
    plan: Plan | None = None
    """The plan (with `predicted` and `search` when written by `pplan partition`)."""
    sim: dict[str, Any] | None = None
    """Simulation JSON (iteration_ms, devices, memory_timeline, ...)."""
    run: dict[str, Any] | None = None
    """Run JSON written by the executor (step_ms, ranks, ...)."""
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
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PplanError(f"{what} {str(p)!r} does not exist") from None
    except IsADirectoryError:
        raise PplanError(f"{what} {str(p)!r} is a directory, not a file") from None
    except UnicodeDecodeError:
        raise PplanError(f"{what} {str(p)!r} is not UTF-8 text") from None
    except OSError as e:
        raise PplanError(f"cannot read {what} {str(p)!r}: {e.strerror}") from None


def _read_json(path: str | os.PathLike, what: str) -> dict[str, Any]:
    text = _read_text(path, what)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PplanError(f"{path}:{e.lineno}:{e.colno}: invalid JSON in {what} ({e.msg})") from None
    if not isinstance(data, dict):
        raise PplanError(f"{path}: {what} must be a JSON object, got {type(data).__name__}")
    return data


def _require_numbers(data: dict[str, Any], keys: tuple[str, ...], source: str, what: str, hint: str) -> None:
    for key in keys:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(source, f"{what} field {key!r} must be a number, got {value!r}"[:200], hint)


def load_sim(path: str | os.PathLike) -> dict[str, Any]:
    """Read a simulation JSON (as written by `pplan simulate --json-out`) and check its core fields."""
    data = _read_json(path, "simulation")
    check_sim(data, str(path))
    return data


def check_sim(data: dict[str, Any], source: str = "<simulation>") -> None:
    """Raise PplanError unless `data` has the simulation fields the figures read."""
    hint = "give the JSON that `pplan simulate` writes"
    _require_numbers(data, ("iteration_ms",), source, "simulation", hint)
    devices = data.get("devices", [])
    if not isinstance(devices, list) or not all(isinstance(d, dict) for d in devices):
        raise _bad(source, "simulation field 'devices' must be a list of objects", hint)
    for i, dev in enumerate(devices):
        mem = dev.get("memory")
        if mem is not None and not isinstance(mem, dict):
            raise _bad(source, f"simulation field devices[{i}].memory must be an object", hint)
    timeline = data.get("memory_timeline", {})
    if not isinstance(timeline, dict):
        raise _bad(source, "simulation field 'memory_timeline' must be an object of device -> [[t_ms, bytes], ...]", hint)


def load_run(path: str | os.PathLike) -> dict[str, Any]:
    """Read a run JSON written by `pplan run` and check its core fields."""
    data = _read_json(path, "run")
    check_run(data, str(path))
    return data


def check_run(data: dict[str, Any], source: str = "<run>") -> None:
    """Raise PplanError unless `data` has the run fields the figures read."""
    hint = "give the JSON that `pplan run` writes"
    _require_numbers(data, ("iteration_ms_measured",), source, "run", hint)
    steps = data.get("step_ms", [])
    if not isinstance(steps, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in steps):
        raise _bad(source, "run field 'step_ms' must be a list of numbers", hint)
    ranks = data.get("ranks", [])
    if not isinstance(ranks, list) or not all(isinstance(r, dict) for r in ranks):
        raise _bad(source, "run field 'ranks' must be a list of objects", hint)


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


__all__ += ["check_sim", "check_run"]
