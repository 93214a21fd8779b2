"""The machine measured once: fixed costs of a pipelined step that no layer profile sees.

`pplan calibrate --machine` (planner.execute.machinebench) measures, on this machine and backend:

  action_overhead_ms          what each F/B/I/W action of torch pipelining costs beyond the
                              profiled layer times (fitted, with the simulator, to steps of a
                              pipeline whose layers cost nothing)
  comm_latency_ms             one hand-over between ranks inside the pipeline (send, receive and
                              waking the waiting rank), from the same runs
  comm_bandwidth_bytes_per_s  send/recv bandwidth between two processes (ping-pong)
  step_overhead_ms            fixed cost per step (schedule set-up, barrier, zero_grad)
  optimizer_ms_per_mib        optimizer step time per MiB of parameters, per optimizer (information
                              for profiles without optimizer times; measured profiles have them)
  concurrent_compute_ratio    a compute kernel's time with every rank busy / with one rank alone
                              (memory bandwidth and caches shared between ranks); informational

and writes them as JSON, by default to `~/.cache/pplan/machine.json` ($XDG_CACHE_HOME respected;
never inside a repository). `find_machine()` reads `$PPLAN_MACHINE` (a path, or `off`) or that
default. `machine_calibration(machine)` turns it into a `planner.calibration.Calibration` that the
simulator applies as is; a per-plan calibration (beside the profile) replaces it where one exists.
Reading is strict (bounded, no unknown keys, values in `planner.calibration.RANGES`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from planner.atomic import atomic_write_text
from planner.calibration import RANGES, Calibration, resolve_calibration
from planner.errors import PplanError
from planner.jsonio import check_keys, read_json_file

__all__ = ["FORMAT", "Machine", "default_machine_path", "load_machine", "save_machine", "find_machine",
           "machine_calibration", "machine_path", "prediction_basis", "MEASURED_KEYS"]

FORMAT = "pplan-machine/1"
_MAX_FILE_BYTES = 1 << 20
_MAX_RATIO = 100.0
_MAX_OPT_MS_PER_MIB = 1e6
OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-plain")
MEASURED_KEYS = ("date", "host", "cpu", "cores", "load_average", "torch", "seconds", "cases")
"""Keys of `measured` (where and when the numbers were taken): informational, checked."""


@dataclass(frozen=True)
class Machine:
    """Per-machine costs of a pipelined training step, measured once (see the module docstring)."""

    device_type: str
    """cpu or cuda: the runs these numbers describe."""
    backend: str
    """gloo or nccl."""
    ranks: int
    """Processes the bench ran (per-action costs grow with ranks sharing cores)."""
    threads: int
    """torch threads per rank during the bench."""
    action_overhead_ms: float
    """Added to every F/B/I/W action, ms."""
    comm_latency_ms: float
    """One hand-over between ranks inside the pipeline, ms."""
    comm_bandwidth_bytes_per_s: float
    """Send/recv bandwidth between processes, bytes/s."""
    step_overhead_ms: float
    """Fixed cost per step, ms."""
    optimizer_ms_per_mib: dict[str, float] = field(default_factory=dict)
    """Optimizer step ms per MiB of parameters, by optimizer name."""
    concurrent_compute_ratio: float | None = None
    """Compute time with all ranks busy / one rank alone (1 = no contention)."""
    hardware: str | None = None
    """The hardware preset or file this machine is (planner.hardware), if named."""
    measured: dict[str, Any] = field(default_factory=dict)
    """Where and when: date, host, cpu, cores, load_average, torch, seconds, cases."""

    def __post_init__(self) -> None:
        if self.device_type not in ("cpu", "cuda"):
            raise PplanError(f"machine device_type {self.device_type!r} is not cpu or cuda")
        if self.backend not in ("gloo", "nccl"):
            raise PplanError(f"machine backend {self.backend!r} is not gloo or nccl")
        for name in ("ranks", "threads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1_000_000:
                raise PplanError(f"machine {name} {v!r} must be an integer from 1 to 1000000")
        for name in ("action_overhead_ms", "comm_latency_ms", "comm_bandwidth_bytes_per_s", "step_overhead_ms"):
            _bounded(name, getattr(self, name), *RANGES[name])
        if not isinstance(self.optimizer_ms_per_mib, dict):
            raise PplanError("machine optimizer_ms_per_mib must be an object")
        check_keys(self.optimizer_ms_per_mib, OPTIMIZERS, "machine optimizer_ms_per_mib", PplanError)
        for k, v in self.optimizer_ms_per_mib.items():
            _bounded(f"optimizer_ms_per_mib.{k}", v, 0.0, _MAX_OPT_MS_PER_MIB)
        if self.concurrent_compute_ratio is not None:
            _bounded("concurrent_compute_ratio", self.concurrent_compute_ratio, 1.0 / _MAX_RATIO, _MAX_RATIO)
        if self.hardware is not None and (not isinstance(self.hardware, str) or len(self.hardware) > 200):
            raise PplanError("machine hardware must be a short string or null")
        if not isinstance(self.measured, dict):
            raise PplanError("machine measured must be an object")
        check_keys(self.measured, MEASURED_KEYS, "machine measured", PplanError)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Any, source: str = "machine") -> "Machine":
        if not isinstance(data, dict):
            raise PplanError(f"{source} is not a JSON object", "make one with `pplan calibrate --machine`")
        if data.get("format", FORMAT) != FORMAT:
            raise PplanError(f"{source} is not a {FORMAT} file (format {str(data.get('format'))[:40]!r})")
        names = [f.name for f in fields(cls)]
        check_keys(data, ["format", *names], source, PplanError)
        missing = [n for n in _REQUIRED if n not in data]
        if missing:
            raise PplanError(f"{source} lacks {', '.join(missing)}", "make it with `pplan calibrate --machine`")
        kwargs = {n: data[n] for n in names if n in data}
        if kwargs.get("optimizer_ms_per_mib") is None:
            kwargs.pop("optimizer_ms_per_mib", None)
        if kwargs.get("measured") is None:
            kwargs.pop("measured", None)
        return cls(**kwargs)


_REQUIRED = ("device_type", "backend", "ranks", "threads", "action_overhead_ms", "comm_latency_ms",
             "comm_bandwidth_bytes_per_s", "step_overhead_ms")


def _bounded(name: str, value: Any, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PplanError(f"machine {name} must be a number, got {type(value).__name__} {str(value)[:40]!r}")
    if not (math.isfinite(value) and low <= value <= high):
        raise PplanError(f"machine {name} {value!r} is out of range ({low:g} to {high:g})",
                         "remeasure with `pplan calibrate --machine`")


def default_machine_path() -> Path:
    """`$XDG_CACHE_HOME/pplan/machine.json`, else `~/.cache/pplan/machine.json`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pplan" / "machine.json"


def load_machine(path: str | os.PathLike) -> Machine:
    """Read a machine file: bounded, strict JSON, no unknown keys, values in range."""
    data = read_json_file(path, "machine file", PplanError, max_bytes=_MAX_FILE_BYTES)
    try:
        return Machine.from_dict(data, "machine")
    except PplanError as e:
        raise PplanError(f"{path}: {e.message}", e.hint) from None


def save_machine(machine: Machine, path: str | os.PathLike | None = None) -> Path:
    """Write atomically (creating the folder); returns the path."""
    p = Path(path) if path is not None else default_machine_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p, json.dumps(machine.to_dict(), indent=2, allow_nan=False) + "\n")
    return p


def machine_path(path: str | os.PathLike | None = None) -> Path | None:
    """The machine file that applies: `path`, else $PPLAN_MACHINE (a path; `off` = none), else the
    default location if a file is there; None when none applies."""
    if path is not None:
        return Path(path)
    env = os.environ.get("PPLAN_MACHINE", "")
    if env.lower() in ("off", "none", "0"):
        return None
    if env:
        return Path(env)
    default = default_machine_path()
    return default if default.is_file() else None


def find_machine(path: str | os.PathLike | None = None, device_type: str | None = None) -> Machine | None:
    """The machine file to apply (machine_path), loaded; a file measured for another device type
    is not applied (None)."""
    chosen = machine_path(path)
    if chosen is None:
        return None
    m = load_machine(chosen)
    if device_type is not None and m.device_type != device_type:
        return None
    return m


def prediction_basis(profile: Any, given: str | os.PathLike | None = None) -> tuple[Calibration | None, Path | None]:
    """(calibration, the file it came from) for predicting with `profile`: `given` ('none' = none),
    else the profile's own calibration file, else this machine's file (`pplan calibrate --machine`)
    when the profile was measured on this kind of device; analytic profiles get no machine file."""
    cal, path = resolve_calibration(profile.path, given)
    if cal is not None or given is not None or profile.meta.get("analytic") == "true":
        return cal, path
    device = str(profile.meta.get("device") or "cpu").split(":")[0]
    chosen = machine_path()
    machine = find_machine(chosen, device_type=device) if chosen is not None else None
    return (machine_calibration(machine), chosen) if machine is not None else (None, None)


def machine_calibration(machine: Machine, *, optimizer: str | None = None,
                        optimizer_param_bytes: float = 0.0) -> Calibration:
    """The simulator's corrections for this machine: per-action overhead, in-pipeline link latency
    and bandwidth, per-step overhead. With `optimizer` and `optimizer_param_bytes` (the largest
    rank's parameters; only for profiles without optimizer times) the optimizer step's measured
    cost is added to the per-step overhead. compute_scale stays 1: layer times come from the profile."""
    step = machine.step_overhead_ms
    if optimizer and optimizer_param_bytes > 0:
        step += machine.optimizer_ms_per_mib.get(optimizer, 0.0) * optimizer_param_bytes / 2**20
    return Calibration(action_overhead_ms=machine.action_overhead_ms, comm_latency_ms=machine.comm_latency_ms,
                       comm_bandwidth_bytes_per_s=machine.comm_bandwidth_bytes_per_s,
                       step_overhead_ms=min(step, RANGES["step_overhead_ms"][1]))
