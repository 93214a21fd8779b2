"""What a simulation returns: SimResult, its timeline rows, and the simulation JSON layout."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from planner.cost import MemoryBreakdown
from planner.errors import PplanError
from planner.jsontypes import INDEX_KEY, check_index_keys, check_object_keys, file_kind, range_error, short, type_error
from planner.limits import MAX_MEMORY_BYTES
from planner.plan.records import MAX_PIPELINE_STAGES, MAX_PREDICTED_MS, MemoryRecord, PredictedDevice, Prediction
from planner.textsafe import MAX_TEXT_CHARS, check_text

__all__ = ["TimelineRow", "SimResult", "SimulationRecord", "SIMULATION_KEYS", "TIMELINE_COLUMNS", "TIMELINE_KINDS",
           "ReplicaMetrics", "WHAT_IF_FIELDS", "what_if_text"]

TIMELINE_COLUMNS = ("device", "stage", "kind", "microbatch", "start_ms", "end_ms")
TIMELINE_KINDS = ("F", "B", "I", "W", "R", "T", "C", "A", "O")
"""Every kind a timeline row may have (TimelineRow's docstring says what each is)."""


class TimelineRow(NamedTuple):
    """One box of the timeline (the timeline CSV's columns).

    kind: F B I W compute, R the recompute part of a backward (its own row just before the B/I/W it belongs to),
    T the tensor-parallel collectives at the end of an F, B or I box (its own row), C a transfer:
    its latency on the link (device = sender, stage = sending stage) and the receiving of its
    bytes at the start of the consuming action (device = receiver, stage = receiving stage; not
    busy time: planner.cost.comm.transfer_parts), A the data-parallel gradient sync (microbatch -1,
    stage -1; it starts inside the last backward when that hides part of it), O the optimizer
    step (microbatch -1, stage -1).
    """

    device: int
    stage: int
    kind: str
    microbatch: int
    start_ms: float
    end_ms: float


@dataclass(frozen=True)
class ReplicaMetrics:
    """What a data x pipeline x tensor plan adds to the simulation of its one pipeline replica."""

    layout: str
    """dp=D,pp=P,tp=T (and zero=Z)."""
    gpus: int
    """D x P x T."""
    hardware: str
    """The hardware the costs are for."""
    global_batch: int
    """Samples per iteration over all replicas."""
    tokens_per_s: float
    """Tokens per second over all replicas."""
    tflops_per_gpu: float
    """Achieved model TFLOP/s per GPU (recomputed forwards counted, as Narayanan et al. 2021)."""
    mfu: float
    """Forward + backward model FLOPs / (iteration time x GPUs x the hardware's peak)."""
    grad_sync_ms: float
    """Largest stage's data-parallel gradient sync before overlap, ms."""
    grad_sync_exposed_ms: float
    """Largest device's gradient sync not hidden by its last backward, ms."""
    tp_comm_ms: float
    """Tensor-parallel collectives of one micro-batch (forward + backward) on the busiest stage, ms."""


@dataclass(frozen=True)
class SimResult:
    """Predicted iteration of a pipeline: time, bubble, per-device busy time and memory."""

    iteration_ms: float
    """Time of one iteration (all micro-batches, forward, backward, optimizer), ms."""
    bubble_fraction: float
    """1 - sum of device busy time / (devices x iteration time)."""
    throughput_samples_per_s: float
    """Samples per second (global batch / iteration time)."""
    schedule: str
    """Schedule name."""
    n_microbatches: int
    """Micro-batches per iteration."""
    micro_batch_size: int
    """Samples per micro-batch."""
    interpolated: bool
    """True when the profile had no rows at this micro-batch size and costs were interpolated."""
    device_names: tuple[str, ...]
    """Device index -> name."""
    busy_ms: tuple[float, ...]
    """Device index -> time spent computing (F, B, I, W, recompute, optimizer), ms."""
    idle_ms: tuple[float, ...]
    """Device index -> iteration time minus busy time, ms."""
    peak_memory_bytes: tuple[float, ...]
    """Device index -> peak memory (the breakdown's total), bytes."""
    memory: tuple[MemoryBreakdown, ...]
    """Device index -> peak memory by kind."""
    memory_limit_bytes: tuple[int | None, ...]
    """Device index -> memory limit (None = unlimited)."""
    timeline: tuple[TimelineRow, ...] = ()
    """Every box of the iteration, sorted by start time (empty unless record_timeline)."""
    memory_timeline: dict[int, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    """Device index -> (time ms, total bytes) after each change (empty unless record_timeline)."""
    replica: ReplicaMetrics | None = None
    """Data x pipeline x tensor plans: the cluster-wide figures (throughput is then over all replicas)."""

    @property
    def n_devices(self) -> int:
        return len(self.device_names)

    @property
    def fits(self) -> bool:
        """True when every device's peak is within its limit."""
        return all(lim is None or peak <= lim for peak, lim in zip(self.peak_memory_bytes, self.memory_limit_bytes))

    def prediction(self) -> Prediction:
        """The prediction a plan records (`predicted`): the simulation JSON without memory_timeline.
        A throughput that is not finite (an iteration of 0 ms) is None, since JSON has no infinity."""
        tput = self.throughput_samples_per_s
        return Prediction(
            iteration_ms=self.iteration_ms,
            bubble_fraction=self.bubble_fraction,
            throughput_samples_per_s=tput if math.isfinite(tput) else None,
            schedule=self.schedule,
            n_microbatches=self.n_microbatches,
            micro_batch_size=self.micro_batch_size,
            interpolated=self.interpolated,
            devices=tuple(
                PredictedDevice(
                    device=d,
                    name=self.device_names[d],
                    busy_ms=self.busy_ms[d],
                    idle_ms=self.idle_ms[d],
                    peak_memory_bytes=int(self.peak_memory_bytes[d]),
                    memory=MemoryRecord(**self.memory[d].as_dict()),
                    memory_limit_bytes=self.memory_limit_bytes[d],
                )
                for d in range(self.n_devices)
            ),
            **self._replica_fields(),
        )

    def _replica_fields(self) -> dict[str, Any]:
        rep = self.replica
        if rep is None:
            return {}
        return {"tokens_per_s": rep.tokens_per_s, "tflops_per_gpu": rep.tflops_per_gpu, "mfu": rep.mfu,
                "grad_sync_ms": rep.grad_sync_ms, "tp_comm_ms": rep.tp_comm_ms, "hardware": rep.hardware}

    def record(self) -> SimulationRecord:
        """What the simulation JSON holds, as its record (bytes whole, as the JSON writes them)."""
        timeline = {d: tuple((t, int(b)) for t, b in pts) for d, pts in self.memory_timeline.items()}
        return SimulationRecord(prediction=self.prediction(), memory_timeline=timeline)

    def to_dict(self) -> dict[str, Any]:
        """The simulation JSON layout (docs/simulator.md): the prediction, then memory_timeline."""
        return self.record().to_dict()


# ---- the simulation JSON read back: what `pplan simulate --out` writes, for the report ---------

SIMULATION_KEYS = (*Prediction.keys(), "memory_timeline", "basis", "what_if")
"""Every key of a simulation JSON's top level: the plan's prediction, memory over time, the basis and what a what-if changed."""
_NOT_PREDICTED = ("memory_timeline", "basis", "what_if")
WHAT_IF_FIELDS = ("schedule", "n_microbatches", "micro_batch_size", "bandwidth_bytes_per_s", "latency_ms", "hardware")
"""What `pplan simulate`'s what-if flags change, as the simulation JSON's `what_if` names them."""
_HINT = "give the JSON that `pplan simulate --out` writes"


@dataclass(frozen=True)
class SimulationRecord:
    """A simulation JSON as a record: the prediction a plan records, and each device's memory over time."""

    prediction: Prediction
    """Iteration time, bubble, throughput, schedule and per-device busy time and peak memory."""
    memory_timeline: dict[int, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    """Device index -> (time ms, total bytes) after each change (empty when the simulation did not record it)."""
    basis: str | None = None
    """What the costs were based on, as `pplan simulate --out` names it (None: not said)."""
    what_if: dict[str, dict[str, Any]] | None = None
    """What a what-if changed from the plan, {field: {"plan": old, "now": new}} (None: the plan as it is, or not said)."""
    what_if_said: bool = field(default=True, compare=False)
    """Whether the JSON says `what_if` (null included): a simulation made now does; a file from before it existed
    does not, and is written back without it, so nothing is added to a file read and written again."""

    def to_dict(self) -> dict[str, Any]:
        """The simulation JSON: the prediction's keys, memory_timeline keyed by device index as text, the basis, what_if."""
        out = self.prediction.to_dict()
        out["memory_timeline"] = {str(d): [[t, b] for t, b in pts] for d, pts in sorted(self.memory_timeline.items())}
        if self.basis is not None:
            out["basis"] = self.basis
        if self.what_if_said:  # null said too, so a reader never takes a what-if's numbers for the plan's
            out["what_if"] = self.what_if
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str = "<simulation>") -> SimulationRecord:
        """The record of a simulation JSON's object; PplanError names `source` and the first wrong key or value.

        Keys and values of the prediction are checked by Prediction.from_dict (a typo gets the nearest
        known key); memory_timeline is checked here; iteration_ms is required, since every figure reads it.
        """
        if not isinstance(data, dict):
            raise PplanError(f"{source}: a simulation must be a JSON object, got {type(data).__name__}", _HINT)
        if "format" in data:  # pplan's other JSON files say what they are; a simulation JSON has no format
            kind = file_kind(data)
            what = f"a {kind} file" if kind else "not a simulation JSON"
            raise PplanError(f"{source}: this is {what} (format {short(data['format'])}), not a simulation", _HINT)
        check_object_keys(data, SIMULATION_KEYS, f"{source}: simulation")
        try:
            prediction = Prediction.from_dict({k: v for k, v in data.items() if k not in _NOT_PREDICTED}, "simulation")
        except PplanError as e:
            raise PplanError(f"{source}: {e.message}", e.hint or _HINT) from None
        if prediction.iteration_ms is None:
            raise PplanError(f"{source}: simulation field 'iteration_ms' must be a number, got "
                             f"{short(data.get('iteration_ms'))}", _HINT)
        basis = data.get("basis")
        if basis is not None and not isinstance(basis, str):
            raise PplanError(f"{source}: simulation field 'basis' must be a string, got {short(basis)}", _HINT)
        if basis is not None:  # printed by the report: a file cannot rewrite the reader's terminal
            check_text(basis, "field 'basis'", PplanError, f"{source}: simulation", MAX_TEXT_CHARS, _HINT)
        return cls(prediction, _memory_timeline(data.get("memory_timeline", {}), source), basis,
                   _what_if(data.get("what_if"), source), what_if_said="what_if" in data)


def what_if_text(changes: dict[str, dict[str, Any]]) -> str:
    """'bandwidth 10MB/s (plan: 25GB/s), schedule zb (plan: 1f1b)': each changed value and the plan's, in words."""
    from planner.units import format_ms, format_rate

    words = {"schedule": ("schedule", str), "n_microbatches": ("micro-batches", str),
             "micro_batch_size": ("micro-batch size", str), "bandwidth_bytes_per_s": ("bandwidth", format_rate),
             "latency_ms": ("latency", format_ms), "hardware": ("hardware", str)}
    parts = []
    for key in WHAT_IF_FIELDS:
        if key in changes:
            name, fmt = words[key]
            old, new = changes[key]["plan"], changes[key]["now"]
            parts.append(f"{name} {'-' if new is None else fmt(new)} (plan: {'-' if old is None else fmt(old)})")
    return ", ".join(parts)


def _what_if(value: Any, source: str) -> dict[str, dict[str, Any]] | None:
    """what_if: null, or {field: {"plan": old, "now": new}} with fields of WHAT_IF_FIELDS and scalar values."""
    shape = 'it maps a changed field to {"plan": old, "now": new}, as `pplan simulate --out` writes it'
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PplanError(f"{source}: simulation field 'what_if' must be an object or null, got {short(value)}", shape)
    check_object_keys(value, WHAT_IF_FIELDS, f"{source}: what_if")
    for key, pair in value.items():
        if not isinstance(pair, dict) or set(pair) != {"plan", "now"} or not all(
                v is None or isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in pair.values()):
            raise PplanError(f"{source}: simulation field what_if[{key!r}] must be {{\"plan\": value, \"now\": value}}, "
                             f"got {short(pair)}", shape)
    return value


def _memory_timeline(value: Any, source: str) -> dict[int, tuple[tuple[float, float], ...]]:
    """memory_timeline: device index (as text) -> [[t_ms, bytes], ...], each checked."""
    shape = "it maps a device index to [[t_ms, bytes], ...]"
    if not isinstance(value, dict):
        raise PplanError(f"{source}: simulation field 'memory_timeline' must be an object, got {short(value)}", shape)
    check_index_keys(value, INDEX_KEY, "device indices", f"{source}: memory_timeline")
    out: dict[int, tuple[tuple[float, float], ...]] = {}
    for key, points in value.items():
        where = f"simulation field memory_timeline[{key!r}]"
        if int(key) >= MAX_PIPELINE_STAGES:  # the figure draws one line per device
            raise PplanError(f"{source}: {where}: device {int(key)} is beyond the largest pipeline "
                             f"({MAX_PIPELINE_STAGES} devices, numbered from 0)", shape)
        message = type_error(points, list[list[float]], where)  # names the first point that is not numbers
        bad = next((i for i, p in enumerate(points) if len(p) != 2), None) if message is None else None
        if bad is not None:
            message = f"{where} item {bad} must be [t_ms, bytes], got {short(points[bad])}"
        if message is None:
            message = next((m for i, (t, b) in enumerate(points)
                            if (m := range_error(t, 0.0, MAX_PREDICTED_MS, f"{where} item {i} time")
                                or range_error(b, 0.0, MAX_MEMORY_BYTES, f"{where} item {i} bytes"))), None)
        if message is not None:
            raise PplanError(f"{source}: {message}", shape)
        out[int(key)] = tuple((t, b) for t, b in points)
    return out
