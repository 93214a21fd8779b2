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
  handover_cpu_ms, handover_cpu_ms_per_mib
                              what a rank loses per cross-rank hand-over while every core runs a
                              rank's compute (`pplan bench handover`'s compute rows, fitted as an
                              intercept and ms per MiB); measured when the ranks fill the cores,
                              else absent (0)

and writes them as JSON to `configured_machine_path()`: `$PPLAN_MACHINE` (a path, or `off`), else
`~/.cache/pplan/machine.json` ($XDG_CACHE_HOME respected; never inside a repository), the file `find_machine()`
reads. `machine_calibration(machine)` turns it into a `planner.calibration.Calibration` that the simulator applies
as is; a per-plan calibration (beside the profile) replaces it where one exists. Reading is strict (bounded, no
unknown keys, values in `planner.calibration.RANGES`).

Per rank count. Per-action overhead and hand-over latency grow with the processes that share the cores (on 2
cores, 8 ranks wait for a CPU when they wake where 2 do not), so the file holds one entry per rank count measured
(`pplan calibrate --machine --ranks 2,4,8`), format `pplan-machine/2`: {"format": ..., "entries": [entry, ...]},
each entry the fields of `Machine`. A plan is predicted with the entry of its process count, else the nearest
one (`MachineSet.pick`; the prediction says which). A `pplan-machine/1` file (one machine, its fields at the top
level) still loads, as a set of one entry.
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
from planner.limits import OPTIMIZERS

__all__ = ["FORMAT", "FORMAT_V1", "Machine", "MachineSet", "default_machine_path", "configured_machine_path",
           "load_machine", "load_machines", "save_machine", "find_machine", "machine_calibration", "machine_path",
           "prediction_basis", "MEASURED_KEYS", "MAX_ENTRIES", "machines_to_update"]

FORMAT = "pplan-machine/2"
FORMAT_V1 = "pplan-machine/1"
"""The first format: one machine (one rank count), its fields at the top level; still read."""
MAX_ENTRIES = 32
"""Rank counts one machine file holds (the bench takes about a minute per count)."""
_MAX_FILE_BYTES = 1 << 20
_MAX_RATIO, _MAX_OPT_MS_PER_MIB = 100.0, 1e6
MEASURED_KEYS = ("date", "host", "cpu", "cores", "load_average", "torch", "seconds", "cases", "model")
"""Keys of `measured` (where and when the numbers were taken): informational, checked."""
_MEASURED = {"date": (str, 64), "host": (str, 255), "cpu": (str, 256), "torch": (str, 64), "model": (str, 512),
             "cores": (int, 1, 1_000_000), "load_average": (float, 0.0, 1e6), "seconds": (float, 0.0, 1e7)}
"""`measured`'s values but cases: (str, longest) or (type, low, high); null allowed (informational). A
hostname is at most 255 characters, the bench's model string 76 for 64 ranks: a 1,000-character 'cores' was kept."""
CASE_KEYS = ("schedule", "microbatches", "measured_ms", "step_spread_pct", "simulated_base_ms", "actions_on_path",
             "predicted_ms", "action_ms_median")
"""Keys of each `measured.cases` row: one empty-pipeline run (schedule, micro-batches) and its times, ms."""
_CASE = {"schedule": (str, 64), "microbatches": (int, 1, 1_000_000), **dict.fromkeys(CASE_KEYS[2:], (float, 0.0, 1e9))}
_MAX_CASES = 64
"""Rows of `measured.cases`: the bench runs 4 (2 with --quick)."""


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
    handover_cpu_ms: float | None = None
    """Time a rank loses per cross-rank hand-over while every core computes, ms (None: not measured, 0)."""
    handover_cpu_ms_per_mib: float | None = None
    """The same per MiB the hand-over moves, ms (None: 0)."""
    measured: dict[str, Any] = field(default_factory=dict)
    """Where and when: date, host, cpu, cores, load_average, torch, seconds, cases, model (the empty pipeline's)."""

    def __post_init__(self) -> None:
        for name, allowed in (("device_type", ("cpu", "cuda")), ("backend", ("gloo", "nccl"))):
            if getattr(self, name) not in allowed:
                raise PplanError(f"machine {name} {getattr(self, name)!r} is not {' or '.join(allowed)}")
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
        for name in ("handover_cpu_ms", "handover_cpu_ms_per_mib"):
            if getattr(self, name) is not None:
                _bounded(name, getattr(self, name), *RANGES[name])
        _check_measured(self.measured)

    def to_dict(self) -> dict[str, Any]:
        """One entry of the machine file (MachineSet.to_dict writes the file)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, source: str = "machine") -> "Machine":
        """An entry, or a whole `pplan-machine/1` file (the same fields and its format)."""
        if not isinstance(data, dict):
            raise PplanError(f"{source} is not a JSON object", "make one with `pplan calibrate --machine`")
        if data.get("format", FORMAT_V1) != FORMAT_V1:
            raise PplanError(f"{source} is not a {FORMAT_V1} machine (format {str(data.get('format'))[:40]!r})")
        names = [f.name for f in fields(cls)]
        check_keys(data, ["format", *names, *_DROPPED_KEYS], source, PplanError)
        missing = [n for n in _REQUIRED if n not in data]
        if missing:
            raise PplanError(f"{source} lacks {', '.join(missing)}", "make it with `pplan calibrate --machine`")
        nullable = ("optimizer_ms_per_mib", "measured")  # null: the default (empty)
        kwargs = {n: data[n] for n in names if n in data and not (n in nullable and data[n] is None)}
        return cls(**kwargs)


_REQUIRED = ("device_type", "backend", "ranks", "threads", "action_overhead_ms", "comm_latency_ms",
             "comm_bandwidth_bytes_per_s", "step_overhead_ms")
_DROPPED_KEYS = ("hardware",)
"""Keys older files carry that nothing reads any more (read and left out): `hardware` was a name
`calibrate --machine --hardware` stored unchecked, which no prediction used."""


def _check_measured(measured: Any) -> None:
    """PplanError unless `measured` holds only its known keys, each of its type and in range."""
    if not isinstance(measured, dict):
        raise PplanError("machine measured must be an object")
    check_keys(measured, MEASURED_KEYS, "machine measured", PplanError)
    _check_values(measured, _MEASURED, "measured")
    cases = measured.get("cases", [])
    if not isinstance(cases, list) or len(cases) > _MAX_CASES:
        got = f"{len(cases)} rows" if isinstance(cases, list) else type(cases).__name__
        raise PplanError(f"machine measured.cases must be a list of at most {_MAX_CASES} rows, got {got}", _REMEASURE)
    for i, row in enumerate(cases):
        if not isinstance(row, dict):
            raise PplanError(f"machine measured.cases[{i}] must be an object, got {type(row).__name__}", _REMEASURE)
        check_keys(row, CASE_KEYS, f"machine measured.cases[{i}]", PplanError)
        _check_values(row, _CASE, f"measured.cases[{i}]")


def _check_values(values: dict[str, Any], specs: dict[str, tuple], where: str) -> None:
    """Each value of `values` with a spec against it: (str, longest) or (int or float, low, high)."""
    for key, value in values.items():
        spec = specs.get(key)
        if spec is None or value is None:
            continue
        if spec[0] is str and not (isinstance(value, str) and len(value) <= spec[1]):
            got = f"{len(value)} characters" if isinstance(value, str) else f"{type(value).__name__} {str(value)[:40]!r}"
            raise PplanError(f"machine {where}.{key} must be a string of at most {spec[1]} characters, got {got}", _REMEASURE)
        if spec[0] is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise PplanError(f"machine {where}.{key} must be an integer, got {str(value)[:40]!r}", _REMEASURE)
        if spec[0] is not str:
            _bounded(f"{where}.{key}", value, spec[1], spec[2])


_REMEASURE = "remeasure with `pplan calibrate --machine`"


def _bounded(name: str, value: Any, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PplanError(f"machine {name} must be a number, got {type(value).__name__} {str(value)[:40]!r}")
    if not (math.isfinite(value) and low <= value <= high):
        raise PplanError(f"machine {name} {value!r} is out of range ({low:g} to {high:g})", _REMEASURE)


@dataclass(frozen=True)
class MachineSet:
    """The machine file: one Machine per rank count measured, all of one device type and backend."""

    entries: tuple[Machine, ...]
    """The entries, one per rank count, in increasing rank order (sorted on construction)."""

    def __post_init__(self) -> None:
        entries = tuple(self.entries) if isinstance(self.entries, (tuple, list)) else None
        if not entries or not all(isinstance(m, Machine) for m in entries):
            raise PplanError("a machine file needs at least one entry", "make one with `pplan calibrate --machine`")
        if len(entries) > MAX_ENTRIES:
            raise PplanError(f"machine file has {len(entries)} entries, at most {MAX_ENTRIES} (one per rank count)")
        counts = [m.ranks for m in entries]
        twice = sorted({r for r in counts if counts.count(r) > 1})
        if twice:
            raise PplanError(f"machine file has two entries for {twice[0]} ranks", "keep one entry per rank count")
        kinds = sorted({(m.device_type, m.backend) for m in entries})
        if len(kinds) > 1:
            raise PplanError(f"machine file mixes {' and '.join('/'.join(k) for k in kinds)} entries",
                             "keep one machine file per device type and backend")
        object.__setattr__(self, "entries", tuple(sorted(entries, key=lambda m: m.ranks)))

    @property
    def ranks(self) -> tuple[int, ...]:
        """The rank counts measured."""
        return tuple(m.ranks for m in self.entries)

    def pick(self, ranks: int | None = None) -> Machine:
        """The entry for `ranks` processes, else the nearest count (a tie goes to the larger, whose
        ranks share the cores more, as the plan's extra ranks do); None: the fewest ranks (what
        a `pplan-machine/1` file measured, and all a command that knows no process count can use)."""
        if ranks is None:
            return self.entries[0]
        return min(self.entries, key=lambda m: (abs(m.ranks - ranks), -m.ranks))

    def with_entry(self, machine: Machine) -> "MachineSet":
        """This set with `machine` added, replacing an entry of the same rank count."""
        return MachineSet(tuple(m for m in self.entries if m.ranks != machine.ranks) + (machine,))

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "entries": [m.to_dict() for m in self.entries]}

    @classmethod
    def from_dict(cls, data: Any, source: str = "machine") -> "MachineSet":
        """A `pplan-machine/2` file, or a `pplan-machine/1` one (a set of its one machine)."""
        if not isinstance(data, dict):
            raise PplanError(f"{source} is not a JSON object", "make one with `pplan calibrate --machine`")
        # a file without a format is read as the format of its shape (format 1 files could omit it)
        fmt = data.get("format", FORMAT if "entries" in data else FORMAT_V1)
        if fmt not in (FORMAT, FORMAT_V1):
            raise PplanError(f"{source} is a {str(fmt)[:40]!r} file; this pplan reads {_READS}",
                             "give a file made by `pplan calibrate --machine`, or remeasure with it")
        _check_body_matches_format(data, fmt, source)
        if fmt == FORMAT_V1:
            return cls((Machine.from_dict(data, source),))
        check_keys(data, ["format", "entries"], source, PplanError)
        entries = data.get("entries")
        if not isinstance(entries, list) or not entries:
            raise PplanError(f"{source}: entries must be a non-empty list", "make it with `pplan calibrate --machine`")
        if len(entries) > MAX_ENTRIES:
            raise PplanError(f"{source} has {len(entries)} entries, at most {MAX_ENTRIES} (one per rank count)")
        for i, e in enumerate(entries):
            if isinstance(e, dict) and "format" in e:
                raise PplanError(f"{source}: entries[{i}] has a format key", "only the file has a format")
        return cls(tuple(Machine.from_dict(e, f"{source} entries[{i}]") for i, e in enumerate(entries)))


_READS = f"{FORMAT} (entries, one per rank count) and {FORMAT_V1} (one machine's fields at the top level)"


def _check_body_matches_format(data: dict[str, Any], fmt: str, source: str) -> None:
    """Name both formats when the file's format says one and its keys are the other's (a hand edit
    that changed one), rather than refusing the other format's keys as unknown."""
    machine_keys = sorted(set(data) & {f.name for f in fields(Machine)})
    if fmt == FORMAT_V1 and "entries" in data:
        raise PplanError(f"{source} says format {FORMAT_V1} but has 'entries', the list of a {FORMAT} file; "
                         f"this pplan reads {_READS}", f"set \"format\": \"{FORMAT}\"")
    if fmt == FORMAT and machine_keys and "entries" not in data:
        raise PplanError(f"{source} says format {FORMAT} but has {machine_keys[0]!r} at the top level, as a "
                         f"{FORMAT_V1} file does; this pplan reads {_READS}", f"set \"format\": \"{FORMAT_V1}\"")


def default_machine_path() -> Path:
    """`$XDG_CACHE_HOME/pplan/machine.json`, else `~/.cache/pplan/machine.json`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pplan" / "machine.json"


def load_machines(path: str | os.PathLike) -> MachineSet:
    """Read a machine file (either format): bounded, strict JSON, no unknown keys, values in range."""
    data = read_json_file(path, "machine file", PplanError, max_bytes=_MAX_FILE_BYTES)
    try:
        return MachineSet.from_dict(data, "machine")
    except PplanError as e:
        raise PplanError(f"{path}: {e.message}", e.hint) from None


def machines_to_update(path: str | os.PathLike) -> tuple[MachineSet | None, str | None]:
    """What `pplan calibrate --machine` merges its new entries into at `path`: (the file's entries, None);
    (None, None) where there is no file; (None, why) for a machine file that cannot be read (it says a machine
    format, and remeasuring is what its errors advise), which is replaced. Any other file is refused
    (PplanError): a profile, a plan or a user's JSON is not the machine file's to overwrite."""
    p = Path(path)
    if not p.exists():
        return None, None
    hint = "choose another --out, or delete the file first if it is yours to replace"
    try:
        data = read_json_file(p, "machine file", PplanError, max_bytes=_MAX_FILE_BYTES)
    except PplanError as e:
        raise PplanError(f"{str(p)!r} exists and is not a machine file ({e.message[:160]})", hint) from None
    if not isinstance(data, dict):
        raise PplanError(f"{str(p)!r} exists and holds a JSON {type(data).__name__}, not a machine file", hint)
    try:
        return MachineSet.from_dict(data, "machine"), None
    except PplanError as e:
        if data.get("format") in (FORMAT, FORMAT_V1):
            return None, f"{p}: {e.message}"
        what = f"a {str(data['format'])[:40]!r} file" if "format" in data else "a JSON object with no format key"
        raise PplanError(f"{str(p)!r} exists and is {what}, not a {FORMAT} machine file", hint) from None


def load_machine(path: str | os.PathLike, ranks: int | None = None) -> Machine:
    """The entry of a machine file for `ranks` processes (MachineSet.pick)."""
    return load_machines(path).pick(ranks)


def save_machine(machine: Machine | MachineSet, path: str | os.PathLike | None = None) -> Path:
    """Write atomically (creating the folder), as a `pplan-machine/2` file; returns the path."""
    p = Path(path) if path is not None else (configured_machine_path() or default_machine_path())
    p.parent.mkdir(parents=True, exist_ok=True)
    machines = machine if isinstance(machine, MachineSet) else MachineSet((machine,))
    atomic_write_text(p, json.dumps(machines.to_dict(), indent=2, allow_nan=False) + "\n")
    return p


def configured_machine_path() -> Path | None:
    """The machine file when no path is given: $PPLAN_MACHINE (a path; `off`, `none` or `0`: none),
    else default_machine_path(). `pplan run` reads it and `pplan calibrate --machine` writes it, so
    both name the same file (a user who set $PPLAN_MACHINE measured into one file and ran with another)."""
    env = os.environ.get("PPLAN_MACHINE", "")
    if env.lower() in ("off", "none", "0"):
        return None
    return Path(env) if env else default_machine_path()


def machine_path(path: str | os.PathLike | None = None) -> Path | None:
    """The machine file that applies: `path`, else configured_machine_path(), whose default
    location counts only if a file is there (a $PPLAN_MACHINE path is read, missing or not)."""
    if path is not None:
        return Path(path)
    chosen = configured_machine_path()
    return chosen if chosen is not None and (os.environ.get("PPLAN_MACHINE") or chosen.is_file()) else None


def find_machine(path: str | os.PathLike | None = None, device_type: str | None = None,
                 ranks: int | None = None) -> Machine | None:
    """The entry for `ranks` processes (MachineSet.pick) of the machine file that applies
    (machine_path); a file measured for another device type is not applied (None)."""
    chosen = machine_path(path)
    if chosen is None:
        return None
    try:
        m = load_machine(chosen, ranks)
    except PplanError as e:  # a variable set long ago breaks a command that names no machine file: say which
        if path is not None or not os.environ.get("PPLAN_MACHINE"):
            raise
        raise PplanError(f"$PPLAN_MACHINE: {e.message}", "point it at a file `pplan calibrate --machine` wrote, "
                         "or set PPLAN_MACHINE=off to predict without one") from None
    if device_type is not None and m.device_type != device_type:
        return None
    return m


def prediction_basis(profile: Any, given: str | os.PathLike | None = None,
                     ranks: int | None = None) -> tuple[Calibration | None, Path | None]:
    """(calibration, the file it came from) for predicting with `profile`: `given` ('none' = none),
    else the profile's own calibration file, else this machine's file (`pplan calibrate --machine`;
    its entry for `ranks` processes, MachineSet.pick) when the profile was measured on this kind of
    device; analytic profiles get no machine file."""
    cal, path = resolve_calibration(profile.path, given)
    if cal is not None or given is not None or profile.meta.get("analytic") == "true":
        return cal, path
    device = str(profile.meta.get("device") or "cpu").split(":")[0]
    machine = find_machine(device_type=device, ranks=ranks)
    return (machine_calibration(machine), machine_path()) if machine is not None else (None, None)


def machine_calibration(machine: Machine, *, optimizer: str | None = None,
                        optimizer_param_bytes: float = 0.0) -> Calibration:
    """The simulator's corrections for this machine: per-action overhead, in-pipeline link latency and
    bandwidth, per-step overhead. With `optimizer` and `optimizer_param_bytes` (the largest rank's parameters;
    only for profiles without optimizer times) the optimizer step's measured cost is added to the per-step
    overhead; the hand-over's CPU share where the machine measured one. compute_scale stays 1."""
    step = machine.step_overhead_ms
    if optimizer and optimizer_param_bytes > 0:
        step += machine.optimizer_ms_per_mib.get(optimizer, 0.0) * optimizer_param_bytes / 2**20
    return Calibration(action_overhead_ms=machine.action_overhead_ms, comm_latency_ms=machine.comm_latency_ms,
                       comm_bandwidth_bytes_per_s=machine.comm_bandwidth_bytes_per_s,
                       step_overhead_ms=min(step, RANGES["step_overhead_ms"][1]),
                       handover_cpu_ms=machine.handover_cpu_ms or 0.0,
                       handover_cpu_ms_per_mib=machine.handover_cpu_ms_per_mib or 0.0)
