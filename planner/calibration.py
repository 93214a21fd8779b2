"""What the profile cannot see, fitted from a measured run and applied by the simulator.

A calibration file lives beside the profile it corrects (`runs/gpt.csv` -> `runs/gpt.calibration.json`)
so that `partition`, `simulate` and `report` pick it up without a flag, or wherever the user asks
(`--calibration PATH`). The repository's committed reference profiles (profiles/) are never written
to: their calibration defaults to the current folder (`./gpt-8l-v32k.calibration.json`). Every
command that applies one says so (`basis_text`). Fields (all optional):

  compute_scale          multiplies every profiled compute time (isolated-layer timing vs in-pipeline)
  action_overhead_ms     added to every compute action (runtime bookkeeping, autograd launch)
  comm_latency_ms        replaces the plan's link latency between processes
  comm_bandwidth_bytes_per_s  replaces the plan's link bandwidth
  step_overhead_ms       added once per iteration (optimizer bookkeeping, barriers)
  handover_cpu_ms, handover_cpu_ms_per_mib
                         what a rank loses per cross-rank hand-over when ranks fill the CPU
                         cores (the machine's `pplan bench handover` fit: intercept and ms per
                         MiB), charged to the sending and to the receiving action
  fitted_from            where the numbers came from, a FittedFrom (run, schedule, n_ranks,
                         n_microbatches, measured_ms, error_pct_before, error_pct_after, and since
                         2026-12 the profile's model and sha256). No time is computed from it, but
                         it is read back: a calibration fitted on another model or profile is named
                         when applied (`calibration_mismatch`), the basis names its run
                         (`basis_text`), and `pplan report` calls a calibration fitted on the run it
                         shows a fit (run, measured_ms); older files without some keys still load

Values must lie in RANGES (compute_scale 0.001 to 1000, times up to a day in ms, bandwidth 1 B/s
to 1e15 B/s); any key not listed here, at either level, is refused with the nearest known one.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from planner.atomic import atomic_write_text
from planner.errors import PplanError
from planner.jsonio import check_keys, read_json_file
from planner.jsontypes import kind_mismatch, range_error, record_fields, short
from planner.limits import MAX_BANDWIDTH, MAX_GLOBAL_BATCH, MAX_LATENCY_MS, MAX_MODEL_SPEC_CHARS, MIN_BANDWIDTH
from planner.textsafe import check_text

__all__ = ["Calibration", "FittedFrom", "calibration_path_for", "load_calibration", "write_calibration",
           "find_calibration", "is_reference_profile", "basis_text", "resolve_calibration", "REFERENCE_PROFILES",
           "calibration_mismatch", "links_described", "links_given_win", "MAX_ERROR_PCT_BEFORE", "MAX_ERROR_PCT_AFTER"]

FORMAT = "pplan-calibration/1"

# Physically meaningful ranges (name -> (low, high)): a pipeline is not a thousand times faster
# or slower than its layers timed alone, and no overhead lasts a day. Outside them a value is a
# typo or a hostile file, and would overflow to inf in the simulator or its printing.
MIN_COMPUTE_SCALE, MAX_COMPUTE_SCALE = 1e-3, 1e3
MAX_OVERHEAD_MS = MAX_LATENCY_MS  # a day, in ms
RANGES: dict[str, tuple[float, float]] = {
    "compute_scale": (MIN_COMPUTE_SCALE, MAX_COMPUTE_SCALE),
    "action_overhead_ms": (0.0, MAX_OVERHEAD_MS),
    "comm_latency_ms": (0.0, MAX_LATENCY_MS),
    "comm_bandwidth_bytes_per_s": (MIN_BANDWIDTH, MAX_BANDWIDTH),
    "step_overhead_ms": (0.0, MAX_OVERHEAD_MS),
    "handover_cpu_ms": (0.0, MAX_OVERHEAD_MS),
    "handover_cpu_ms_per_mib": (0.0, MAX_OVERHEAD_MS),
}
CALIBRATION_KEYS = ("format", *RANGES, "fitted_from")


def _check_value(name: str, value: Any) -> None:
    low, high = RANGES[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PplanError(f"calibration {name} must be a number, got {type(value).__name__} {value!r}"[:200])
    if not (math.isfinite(value) and low <= value <= high):
        raise PplanError(f"calibration {name} {value!r} is out of range ({low:g} to {high:g})", _HINTS[name])


_HINTS = {
    "compute_scale": "it multiplies profiled compute times; refit it with `pplan calibrate` or re-profile on this machine",
    "action_overhead_ms": "it is added to every compute action, in ms",
    "comm_latency_ms": "it is the link latency in ms, e.g. 0.01",
    "comm_bandwidth_bytes_per_s": "it is the link bandwidth in bytes/s, e.g. 25e9",
    "step_overhead_ms": "it is added once per iteration, in ms",
    "handover_cpu_ms": "it is charged to both ranks per cross-rank hand-over, in ms",
    "handover_cpu_ms_per_mib": "it is charged to both ranks per MiB a hand-over moves, in ms",
}


_FITTED_WHERE = "calibration fitted_from"
_TEXT_MAX = MAX_MODEL_SPEC_CHARS
"""Longest text of a fitted_from: the model spec (planner.limits; the run's path is shorter)."""
_MAX_FILE_BYTES = 1 << 20
"""Largest calibration file read: pplan writes about 600 bytes (seven numbers and the fit's record)."""
_FITTED_HINT = "fitted_from records the run the calibration was fitted on: re-fit it with `pplan calibrate`"
MAX_ERROR_PCT_BEFORE = 1e6
"""Largest error of the prediction a fit starts from, percent: a prediction 10,000 x its run (a profile
of another machine, uncalibrated) is still a start; beyond, the run's times are not the plan's."""
MAX_ERROR_PCT_AFTER = 100.0
"""Largest error a fit may leave on the very run it was fitted on, percent: a calibration that still
predicts twice its own run corrects nothing, and simulate would apply it by default."""
# What a fit can have written (planner.execute.calibrate.fit_from_run): at least one rank and one
# micro-batch (no run has more of either than the largest global batch), a measured step of at
# most a day (check_fit_inputs); errors of at least -100% (a prediction is never negative) and
# at most _ERROR_RANGES' bounds, checked apart to say how far off the fit is.
_FITTED_RANGES: dict[str, tuple[float, float]] = {
    "n_ranks": (1, MAX_GLOBAL_BATCH),
    "n_microbatches": (1, MAX_GLOBAL_BATCH),
    "measured_ms": (0.0, MAX_OVERHEAD_MS),
}
_ERROR_RANGES = {"error_pct_before": (-100.0, MAX_ERROR_PCT_BEFORE), "error_pct_after": (-100.0, MAX_ERROR_PCT_AFTER)}
_ERROR_HINT = ("the run's times are not this plan's and profile's: check its step_ms and action_ms, and that run, "
               "plan and profile are of one model and machine; for a file, re-fit it with `pplan calibrate --from-run` "
               "or pass --calibration none")


def _check_text(text: str, where: str) -> None:
    """PplanError unless `text` is at most _TEXT_MAX characters, none a control or format character."""
    check_text(text, "text", PplanError, where, _TEXT_MAX, hint=_FITTED_HINT)


@dataclass(frozen=True)
class FittedFrom:
    """Where a calibration's numbers came from (planner.execute.calibrate.fit_from_run writes it).

    Every field may be null: a file written before a field existed lacks it. Checked on
    construction (types, _FITTED_RANGES, and the errors within MAX_ERROR_PCT_BEFORE and
    MAX_ERROR_PCT_AFTER), so what a file holds and what a caller builds pass
    the same checks.
    """

    run: str | None = None
    """The run JSON the fit read (null when the run was not written: no --out)."""
    schedule: str | None = None
    """The schedule of the plan that ran."""
    n_ranks: int | None = None
    """The processes the run had."""
    n_microbatches: int | None = None
    """Micro-batches per iteration of the run."""
    measured_ms: float | None = None
    """The run's measured iteration time, ms (the report matches a run to its fit by it)."""
    error_pct_before: float | None = None
    """Prediction error with the calibration the run was predicted with, percent."""
    error_pct_after: float | None = None
    """Prediction error with the fitted calibration, percent."""
    model: str | None = None
    """The profile's model spec (since 2026-12): applied to another model's profile, it is named."""
    profile_sha256: str | None = None
    """The profile's sha256 (since 2026-12): applied to another profile, it is named."""

    def __post_init__(self) -> None:
        record_fields(self.to_dict(), FittedFrom, _FITTED_WHERE, hint=_FITTED_HINT, ranges=_FITTED_RANGES)
        for name in ("run", "schedule", "model", "profile_sha256"):  # printed when the calibration is applied
            if isinstance(value := getattr(self, name), str):
                _check_text(value, f"{_FITTED_WHERE} field {name!r}")
        for name, (low, high) in _ERROR_RANGES.items():  # a fit that far off is refused, not written and applied
            value = getattr(self, name)
            if value is not None and (message := range_error(value, low, high, f"{_FITTED_WHERE} field {name!r}")):
                measured = f" the run's measured {self.measured_ms:.6g} ms" if self.measured_ms is not None else " its run"
                raise PplanError(f"{message}: a prediction {value:+.4g}% off{measured}", _ERROR_HINT)

    def to_dict(self) -> dict[str, Any]:
        """The calibration file's `fitted_from` object: every field, null where unknown."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Any) -> "FittedFrom":
        """The record of a `fitted_from` object: an object, no unknown key (nearest one suggested),
        each value of its field's type and in range (PplanError naming the field)."""
        return cls(**record_fields(data, cls, _FITTED_WHERE, hint=_FITTED_HINT))


@dataclass(frozen=True)
class Calibration:
    """Corrections the simulator applies on top of a profile (identity by default).

    Checked on construction (PplanError naming the value), so a fit that went wrong cannot be
    written, and whatever `write_calibration` writes `load_calibration` reads back.
    """

    compute_scale: float = 1.0
    """Factor on profiled compute times."""
    action_overhead_ms: float = 0.0
    """Added to each F/B/I/W action, ms."""
    comm_latency_ms: float | None = None
    """Link latency override, ms (None = keep the plan's)."""
    comm_bandwidth_bytes_per_s: float | None = None
    """Link bandwidth override, bytes/s (None = keep the plan's)."""
    step_overhead_ms: float = 0.0
    """Added once per iteration, ms."""
    handover_cpu_ms: float = 0.0
    """Charged to the sending and to the receiving action of each cross-rank hand-over, ms (machine-measured)."""
    handover_cpu_ms_per_mib: float = 0.0
    """Charged the same way per MiB the hand-over moves, ms."""
    fitted_from: FittedFrom | None = None
    """Where the numbers came from (None: not fitted, or not recorded); a mapping given here, such as
    a file's object, is read through FittedFrom.from_dict (an empty one as None)."""

    def __post_init__(self) -> None:
        for name in RANGES:
            value = getattr(self, name)
            if value is not None or name in ("compute_scale", "action_overhead_ms", "step_overhead_ms",
                                             "handover_cpu_ms", "handover_cpu_ms_per_mib"):
                _check_value(name, value)
        if isinstance(self.fitted_from, Mapping):
            # one reader for a file's object and a caller's dict; {} is what files without a fit hold
            fitted = FittedFrom.from_dict(dict(self.fitted_from)) if self.fitted_from else None
            object.__setattr__(self, "fitted_from", fitted)
        elif not (self.fitted_from is None or isinstance(self.fitted_from, FittedFrom)):
            raise PplanError(f"{_FITTED_WHERE} must be an object, got {short(self.fitted_from)}", _FITTED_HINT)


# The repository's committed reference profiles: read-only inputs, never a place to write.
REFERENCE_PROFILES = Path(__file__).resolve().parent.parent / "profiles"


def is_reference_profile(profile_path: str | os.PathLike) -> bool:
    """Whether `profile_path` is one of the repository's committed profiles (under profiles/)."""
    # realpath, not Path.resolve(): that raises RuntimeError on a symlink loop (Python 3.11), which
    # names no profile of ours, and the profile's reader then says so on one line
    return Path(os.path.realpath(profile_path)).is_relative_to(REFERENCE_PROFILES)


def calibration_path_for(profile_path: str | os.PathLike) -> Path:
    """The default calibration file of a profile: beside it (`gpt.csv` -> `gpt.calibration.json`),
    or in the current folder for a committed reference profile, which is never written to."""
    p = Path(profile_path)
    name = p.stem + ".calibration.json"
    return Path(name) if is_reference_profile(p) else p.with_name(name)


def basis_text(cal: "Calibration | None", path: str | os.PathLike | None = None) -> str:
    """One phrase naming the basis of a prediction: the profile as measured, or calibrated by a file."""
    if cal is None:
        return "uncalibrated (profile times as measured)"
    where = f" {path}" if path is not None else ""
    src = cal.fitted_from.run if cal.fitted_from is not None else None
    fitted = f", fitted on {src}" if src else ""
    return f"calibrated by{where} (compute x{cal.compute_scale:.3g}{fitted})"


def links_described(links: Any) -> tuple[bool, bool]:
    """(bandwidth, latency) the user described in `links` (a planner.plan.Links): a link of a pair (a
    cluster file) or a default other than pplan's. pplan's defaults stand for "the link of this
    machine", which a calibration measures; any other value is a link the user plans for."""
    from planner.limits import DEFAULT_BANDWIDTH, DEFAULT_LATENCY_MS

    pairs = bool(links.pairs)
    return (pairs or links.bandwidth_bytes_per_s != DEFAULT_BANDWIDTH, pairs or links.latency_ms != DEFAULT_LATENCY_MS)


def links_given_win(cal: "Calibration | None", bandwidth: bool, latency: bool) -> "Calibration | None":
    """`cal` without the link values the user described (`bandwidth`, `latency`: links_described, or a
    what-if's flags): a link the user describes is the link to plan for, where a calibration's comm
    values were measured between processes of the machine it was fitted on. partition, simulate,
    run and report follow this one rule, so a plan is priced the same way by each."""
    if cal is None or not (bandwidth or latency):
        return cal
    return replace(cal, comm_bandwidth_bytes_per_s=None if bandwidth else cal.comm_bandwidth_bytes_per_s,
                   comm_latency_ms=None if latency else cal.comm_latency_ms)


def calibration_mismatch(cal: "Calibration | None", profile: Any, path: str | os.PathLike | None = None) -> str | None:
    """None unless `cal` records (in fitted_from) a model or profile sha256 other than `profile`'s
    (a Profile: its meta 'model' and sha256); then one line naming both, for the command applying it
    to show. Compute scale and overheads fitted on one model's layers say little about another's."""
    fitted = (cal.fitted_from if cal is not None else None) or FittedFrom()
    name = f"calibration {str(path)!r}" if path is not None else "the calibration"
    model, theirs = fitted.model, (getattr(profile, "meta", None) or {}).get("model")
    if model and theirs and model != theirs:
        return (f"{name} was fitted on model {str(model)[:60]!r}, not this profile's {str(theirs)[:60]!r}: "
                "its corrections may not apply (fit one for this model: `pplan calibrate`, or pass --calibration none)")
    sha, ours = fitted.profile_sha256, getattr(profile, "sha256", None)
    if sha and ours and sha != ours:
        return (f"{name} was fitted on another profile (sha256 {str(sha)[:12]}..., this one {ours[:12]}...): "
                "its corrections may not apply (re-fit with `pplan calibrate`, or pass --calibration none)")
    return None


def load_calibration(path: str | os.PathLike) -> Calibration:
    """Read a calibration JSON (bounded read, strict JSON, no unknown keys, values in range)."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise PplanError(f"calibration {str(p)!r} does not exist", "make one with `pplan run --calibrate`")
    try:
        data = read_json_file(p, "calibration", PplanError, max_bytes=_MAX_FILE_BYTES)
    except PplanError as e:
        # strict-JSON refusals name the path first; say what the file is
        rest = e.message[len(str(p)):].lstrip(":") if e.message.startswith(str(p)) else None
        if rest is None:
            raise
        raise PplanError(f"calibration {str(p)!r} is not valid JSON ({rest.strip()})", e.hint) from None
    if not isinstance(data, dict):
        raise PplanError(f"calibration {str(p)!r} is not a {FORMAT} file (it holds a JSON {type(data).__name__})")
    if (other := kind_mismatch(data, "calibration")) is not None:
        raise PplanError(f"calibration {str(p)!r}: {other}", "give the calibration JSON `pplan calibrate` wrote")
    if data.get("format", FORMAT) != FORMAT:
        raise PplanError(f"calibration {str(p)!r} is not a {FORMAT} file (its format is {str(data.get('format'))[:60]!r})",
                         f"this pplan reads {FORMAT}: re-fit it with `pplan calibrate`")
    try:
        check_keys(data, CALIBRATION_KEYS, "calibration", PplanError)
        kwargs: dict[str, Any] = {name: data[name] for name in RANGES if data.get(name) is not None}
        fitted = data.get("fitted_from")  # null or {} in a file without a fit
        record = None if fitted is None or fitted == {} else FittedFrom.from_dict(fitted)
        return Calibration(fitted_from=record, **kwargs)
    except PplanError as e:
        raise PplanError(f"{p}: {e.message}", e.hint) from None


def find_calibration(profile_path: str | os.PathLike | None) -> Calibration | None:
    """The default calibration of `profile_path` (see calibration_path_for), if one exists."""
    if not profile_path:
        return None
    p = calibration_path_for(profile_path)
    return load_calibration(p) if p.exists() else None


def resolve_calibration(profile_path: str | os.PathLike | None,
                        given: str | os.PathLike | None = None) -> tuple[Calibration | None, Path | None]:
    """(calibration, its path) for a command: `given` ('none' for no calibration), else the
    profile's default file when it exists, else (None, None)."""
    if given is not None:
        if str(given).strip().lower() == "none":
            return None, None
        return load_calibration(given), Path(given)
    if not profile_path:
        return None, None
    p = calibration_path_for(profile_path)
    return (load_calibration(p), p) if p.exists() else (None, None)


def write_calibration(cal: Calibration, path: str | os.PathLike) -> None:
    """Write `cal` as a calibration file (atomically); `load_calibration` reads it back equal."""
    data = {"format": FORMAT, **{name: getattr(cal, name) for name in RANGES},
            "fitted_from": cal.fitted_from.to_dict() if cal.fitted_from is not None else {}}
    atomic_write_text(path, json.dumps(data, indent=2, allow_nan=False) + "\n")
