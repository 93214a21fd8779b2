"""What the profile cannot see, fitted from a measured run and applied by the simulator.

A calibration file lives beside its profile (`profiles/gpt.csv` -> `profiles/gpt.calibration.json`)
so that `partition` and `simulate` pick it up without a flag. Fields (all optional):

  compute_scale          multiplies every profiled compute time (isolated-layer timing vs in-pipeline)
  action_overhead_ms     added to every compute action (runtime bookkeeping, autograd launch)
  comm_latency_ms        replaces the plan's link latency between processes
  comm_bandwidth_bytes_per_s  replaces the plan's link bandwidth
  step_overhead_ms       added once per iteration (optimizer bookkeeping, barriers)
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from planner.atomic import atomic_write_text
from planner.errors import PplanError

__all__ = ["Calibration", "calibration_path_for", "load_calibration", "write_calibration", "find_calibration"]

FORMAT = "pplan-calibration/1"


@dataclass(frozen=True)
class Calibration:
    """Corrections the simulator applies on top of a profile (identity by default)."""

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
    fitted_from: dict[str, Any] = field(default_factory=dict)
    """Where the numbers came from (run file, residual error): informational."""

    def apply_compute(self, ms: float) -> float:
        return ms * self.compute_scale + self.action_overhead_ms


def calibration_path_for(profile_path: str | os.PathLike) -> Path:
    """The calibration file that belongs to a profile."""
    p = Path(profile_path)
    return p.with_name(p.stem + ".calibration.json")


def load_calibration(path: str | os.PathLike) -> Calibration:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PplanError(f"calibration {str(p)!r} does not exist", "make one with `pplan run --calibrate`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PplanError(f"calibration {str(p)!r} is not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format", FORMAT) != FORMAT:
        raise PplanError(f"calibration {str(p)!r} is not a {FORMAT} file")
    kwargs: dict[str, Any] = {}
    for name in ("compute_scale", "action_overhead_ms", "comm_latency_ms", "comm_bandwidth_bytes_per_s", "step_overhead_ms"):
        if data.get(name) is None:
            continue
        value = data[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise PplanError(f"calibration {str(p)!r}: {name} must be a finite number >= 0, got {value!r}")
        kwargs[name] = float(value)
    if kwargs.get("compute_scale", 1.0) <= 0 or kwargs.get("comm_bandwidth_bytes_per_s", 1.0) <= 0:
        raise PplanError(f"calibration {str(p)!r}: compute_scale and comm_bandwidth_bytes_per_s must be positive")
    fitted = data.get("fitted_from") if isinstance(data.get("fitted_from"), dict) else {}
    return Calibration(fitted_from=fitted, **kwargs)


def find_calibration(profile_path: str | os.PathLike | None) -> Calibration | None:
    """The calibration beside `profile_path`, if one exists."""
    if not profile_path:
        return None
    p = calibration_path_for(profile_path)
    return load_calibration(p) if p.exists() else None


def write_calibration(cal: Calibration, path: str | os.PathLike) -> None:
    atomic_write_text(path, json.dumps({"format": FORMAT, **asdict(cal)}, indent=2, allow_nan=False) + "\n")
