"""The run JSON's two calibration objects as typed records, one to_dict / from_dict each.

  calibration        the calibration a run was predicted with: a planner.calibration.Calibration,
                     written as its values only (`calibration_values`; where it was fitted,
                     `fitted_from`, stays in the calibration file), read back by `calibration_from_dict`
  calibration_fit    what `pplan run --calibrate` fitted: a CalibrationFit (the error before and
                     after, the points the compute fit used as ComputePoints, where the
                     calibration was written and its values)

Both write the keys `pplan run` has always written, in the same order. A reader refuses an
unknown key (nearest one suggested), a missing field and a value of the wrong type, each on one
line that names the field; planner.execute.runfile puts the file's name in front (and its hint,
where the message has none).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from planner.calibration import RANGES, Calibration
from planner.errors import PplanError
from planner.jsontypes import record_fields

__all__ = ["CALIBRATION_VALUE_KEYS", "ComputePoint", "CalibrationFit", "calibration_values", "calibration_from_dict",
           "as_recorded"]

CALIBRATION_VALUE_KEYS = tuple(RANGES)
"""The keys of a run's `calibration`: the calibration's values, in the order a calibration file lists them."""
_REQUIRED_VALUES = ("compute_scale", "action_overhead_ms", "comm_latency_ms", "comm_bandwidth_bytes_per_s",
                    "step_overhead_ms")
"""The values every run with a calibration has written; the hand-over ones came later and read as 0 when absent."""


def as_recorded(cal: Calibration | None) -> Calibration | None:
    """`cal` as a run records it: its values, without `fitted_from` (which the run JSON does not
    hold), so that a record equals the one read back from its JSON."""
    return None if cal is None else replace(cal, fitted_from=None)


def calibration_values(cal: Calibration) -> dict[str, Any]:
    """The run JSON's object of a calibration: its values, keyed as in a calibration file."""
    return {name: getattr(cal, name) for name in CALIBRATION_VALUE_KEYS}


def calibration_from_dict(d: Any, where: str = "calibration") -> Calibration:
    """The Calibration of a run JSON's calibration object (`where` names it in messages); its
    values must lie in planner.calibration.RANGES, as in a calibration file."""
    d = record_fields(d, Calibration, where, keys=CALIBRATION_VALUE_KEYS, required=_REQUIRED_VALUES)
    try:
        return Calibration(**d)
    except PplanError as e:  # a value out of range: Calibration's own message, placed
        raise PplanError(f"{where}: {e.message}", e.hint) from None


@dataclass(frozen=True)
class ComputePoint:
    """One (stage, action kind) of a calibrated run: its profiled and its measured time."""

    action: str
    """Stage and kind: '0F', '1B', or '2I+W' for a split backward's two halves together."""
    profiled_ms: float
    """The profile's time of the action (its stage's layers summed), ms."""
    measured_ms: float
    """The run's median time of the action, ms."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "ComputePoint":
        return cls(**record_fields(d, cls, where))


@dataclass(frozen=True)
class CalibrationFit:
    """What `pplan run --calibrate` fitted (the run JSON's `calibration_fit`), key for key."""

    measured_ms: float
    """The run's measured iteration time, ms."""
    predicted_ms_before: float
    """The simulator's iteration time with the calibration the run was predicted with, ms."""
    error_pct_before: float | None
    """100 x (predicted_ms_before - measured_ms) / measured_ms."""
    predicted_ms_after: float
    """The simulator's iteration time with the fitted calibration, ms (measured_ms, unless the fitted
    actions alone overshoot it)."""
    error_pct_after: float | None
    """The same error after the fit."""
    compute_points: list[ComputePoint]
    """Every (stage, kind) the compute fit used."""
    path: str
    """Where the fitted calibration was written."""
    calibration: Calibration
    """The fitted calibration's values (its file also says where it was fitted)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["compute_points"] = [p.to_dict() for p in self.compute_points]
        out["calibration"] = calibration_values(self.calibration)
        return out

    @classmethod
    def from_dict(cls, d: Any, where: str = "calibration_fit") -> "CalibrationFit":
        # the nested records' own keys and values before this object's missing fields: the most
        # precise message first (a hand-written fit with one point lacks the rest, and the point has a typo)
        nested: dict[str, Any] = {}
        if isinstance(d, dict) and isinstance(points := d.get("compute_points"), list):
            nested["compute_points"] = [ComputePoint.from_dict(p, f"{where}.compute_points[{i}]")
                                        for i, p in enumerate(points)]
        if isinstance(d, dict) and "calibration" in d:
            nested["calibration"] = calibration_from_dict(d["calibration"], f"{where}.calibration")
        return cls(**dict(record_fields(d, cls, where), **nested))
