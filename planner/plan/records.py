"""Typed records a plan carries: the simulator's prediction (`predicted`) and how the partitioner
chose (`search`). Each is a frozen dataclass whose fields are its JSON keys in the order written,
with one to_dict / from_dict; the key lists the plan reader enforces are derived from the fields.

A field left None is not written, except the ones a record lists in `_WRITE_NULL`, which the
producers always write (as null when there is no value). Every field may be absent when read:
a hand-written plan may carry a partial prediction.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from planner.errors import PlanError
from planner.jsonio import check_keys
from planner.plan.fields import as_object, as_objects, get_field

__all__ = [
    "MemoryRecord", "PredictedDevice", "Prediction", "AtPlanSetting", "SearchRow", "BaselineRow", "SearchRecord",
]

_NUM = (int, float)


@dataclass(frozen=True)
class _ListOf:
    """Field kind: a JSON list whose items are of `kind` (a type tuple or a record class)."""

    kind: Any


def _opt(kind: Any) -> Any:
    """A field that may be absent (None), of `kind`: a type tuple, a record class or _ListOf."""
    return field(default=None, metadata={"kind": kind})


class _Record:
    """Shared JSON round-trip of the records below (fields declared with `_opt`)."""

    _WRITE_NULL: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The JSON keys of this record, in the order written."""
        return tuple(f.name for f in fields(cls))  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, keys in field order; None fields are left out unless in _WRITE_NULL."""
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is not None or f.name in self._WRITE_NULL:
                out[f.name] = _to_json(value)
        return out

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Any:
        """The record in JSON object `d` (at `where` in the plan); PlanError names a bad key or value."""
        check_keys(as_object(d, where), cls.keys(), where, PlanError)
        values = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if d.get(f.name) is not None:
                values[f.name] = _read(d, f.name, f.metadata["kind"], where)
        return cls(**values)


def _to_json(value: Any) -> Any:
    if isinstance(value, _Record):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_to_json(v) for v in value]
    return value


def _read(d: dict, key: str, kind: Any, where: str) -> Any:
    if isinstance(kind, type) and issubclass(kind, _Record):
        return kind.from_dict(d[key], f"{where}.{key}")
    if not isinstance(kind, _ListOf):
        return get_field(d, key, kind, f"{where}.")
    items, inner = d[key], kind.kind
    if isinstance(inner, type) and issubclass(inner, _Record):
        rows = as_objects(items, f"{where}.{key}", inner.keys())
        return tuple(inner.from_dict(row, f"{where}.{key}[{i}]") for i, row in enumerate(rows))
    if not isinstance(items, list):
        raise PlanError(f"field {where}.{key} must be a list, got {type(items).__name__}")
    return tuple(get_field({"": x}, "", inner, f"{where}.{key}[{i}]") for i, x in enumerate(items))


# ---- predicted: the simulation JSON (docs/simulator.md) without memory_timeline -------------------

@dataclass(frozen=True)
class MemoryRecord(_Record):
    """Peak memory of one device by kind, bytes."""

    weights: int | None = _opt(_NUM)
    """Parameters."""
    gradients: int | None = _opt(_NUM)
    """Gradients."""
    optimizer: int | None = _opt(_NUM)
    """Optimizer state."""
    activations: int | None = _opt(_NUM)
    """Activations kept for backward at the peak."""
    buffers: int | None = _opt(_NUM)
    """Communication and workspace buffers."""
    total: int | None = _opt(_NUM)
    """The sum: the device's peak."""


@dataclass(frozen=True)
class PredictedDevice(_Record):
    """One device's predicted busy time and peak memory."""

    _WRITE_NULL = frozenset({"memory_limit_bytes"})

    device: int | None = _opt(int)
    """Device index."""
    name: str | None = _opt(str)
    """Device name."""
    busy_ms: float | None = _opt(_NUM)
    """Time spent computing in one iteration, ms."""
    idle_ms: float | None = _opt(_NUM)
    """Iteration time minus busy time, ms."""
    peak_memory_bytes: int | None = _opt(_NUM)
    """Peak memory (the breakdown's total), bytes."""
    memory: MemoryRecord | None = _opt(MemoryRecord)
    """Peak memory by kind."""
    memory_limit_bytes: int | None = _opt(_NUM)
    """The device's memory limit (None = unlimited)."""


@dataclass(frozen=True)
class Prediction(_Record):
    """What the simulator (or the data x pipeline x tensor search) predicts for a plan."""

    _WRITE_NULL = frozenset({"throughput_samples_per_s"})

    iteration_ms: float | None = _opt(_NUM)
    """Time of one iteration, ms."""
    bubble_fraction: float | None = _opt(_NUM)
    """Idle share of device time."""
    throughput_samples_per_s: float | None = _opt(_NUM)
    """Samples per second (None when the iteration time is 0)."""
    schedule: str | None = _opt(str)
    """Schedule simulated."""
    n_microbatches: int | None = _opt(int)
    """Micro-batches per iteration."""
    micro_batch_size: int | None = _opt(int)
    """Samples per micro-batch."""
    interpolated: bool | None = _opt(bool)
    """True when the profile's costs were interpolated at this micro-batch size."""
    devices: tuple[PredictedDevice, ...] | None = _opt(_ListOf(PredictedDevice))
    """Per device: busy time and peak memory."""
    tokens_per_s: float | None = _opt(_NUM)
    """Data/tensor-parallel plans: tokens per second over all replicas."""
    tflops_per_gpu: float | None = _opt(_NUM)
    """Data/tensor-parallel plans: model TFLOP/s per GPU."""
    mfu: float | None = _opt(_NUM)
    """Data/tensor-parallel plans: model FLOP utilization."""
    grad_sync_ms: float | None = _opt(_NUM)
    """Data/tensor-parallel plans: the largest stage's gradient synchronisation per iteration (before overlap), ms."""
    tp_comm_ms: float | None = _opt(_NUM)
    """Data/tensor-parallel plans: tensor-parallel collectives of one micro-batch (forward + backward) on the busiest stage, ms."""
    hardware: str | None = _opt(str)
    """Data/tensor-parallel plans: the hardware preset searched on."""


# ---- search: how planner.partition.api (and `pplan bench`) chose -------------------------------

@dataclass(frozen=True)
class AtPlanSetting(_Record):
    """A baseline's cuts at the plan's own (schedule, M)."""

    _WRITE_NULL = frozenset({"iteration_ms", "peak_memory_bytes"})

    fits: bool | None = _opt(bool)
    """Whether it fits memory."""
    iteration_ms: float | None = _opt(_NUM)
    """Simulated iteration time, ms."""
    peak_memory_bytes: int | None = _opt(_NUM)
    """Largest device peak, bytes."""


@dataclass(frozen=True)
class SearchRow(_Record):
    """One candidate the search simulated (a runner-up)."""

    _WRITE_NULL = frozenset({"iteration_ms", "bubble_fraction", "bottleneck_ms", "peak_memory_bytes", "slowdown_vs_plan"})

    method: str | None = _opt(str)
    """Which method cut it (dp, ilp, uniform, params, time)."""
    polish_moves: int | None = _opt(int)
    """Cut moves made by the simulator-driven polish."""
    schedule: str | None = _opt(str)
    """Schedule."""
    n_microbatches: int | None = _opt(int)
    """Micro-batches per iteration."""
    micro_batch_size: int | None = _opt(int)
    """Samples per micro-batch."""
    fits: bool | None = _opt(bool)
    """Whether it fits memory."""
    iteration_ms: float | None = _opt(_NUM)
    """Simulated iteration time, ms."""
    bubble_fraction: float | None = _opt(_NUM)
    """Simulated bubble fraction."""
    bottleneck_ms: float | None = _opt(_NUM)
    """Slowest stage's time per micro-batch, ms."""
    peak_memory_bytes: int | None = _opt(_NUM)
    """Largest device peak, bytes."""
    slowdown_vs_plan: float | None = _opt(_NUM)
    """Its iteration time over the plan's."""
    cuts: tuple[int, ...] | None = _opt(_ListOf(int))
    """Stage boundaries [0, a, b, ..., n_layers]."""
    note: str | None = _opt(str)
    """Why it does not fit."""


@dataclass(frozen=True)
class BaselineRow(SearchRow):
    """A baseline method's best candidate, and how its cuts do at the plan's setting."""

    at_plan_setting: AtPlanSetting | None = _opt(AtPlanSetting)
    """Its cuts at the plan's (schedule, M); None when it was not simulated there."""

    _WRITE_NULL = SearchRow._WRITE_NULL | {"at_plan_setting"}


@dataclass(frozen=True)
class SearchRecord(_Record):
    """How the partitioner chose the plan: informational, not needed to run it."""

    _WRITE_NULL = frozenset({"optimal"})

    method: str | None = _opt(str)
    """The --method asked for."""
    source: str | None = _opt(str)
    """The method whose cuts won."""
    polish_moves: int | None = _opt(int)
    """Cut moves made by the simulator-driven polish."""
    optimal: bool | None = _opt(bool)
    """dp/ilp: whether the cuts are proven optimal; None for heuristics."""
    objective: str | None = _opt(str)
    """What was optimized, in words."""
    recompute: str | None = _opt(str)
    """The recompute policy searched."""
    schedule: str | None = _opt(str)
    """Chosen schedule."""
    n_microbatches: int | None = _opt(int)
    """Chosen micro-batch count."""
    micro_batch_size: int | None = _opt(int)
    """Chosen micro-batch size."""
    device_order: tuple[int, ...] | None = _opt(_ListOf(int))
    """Device indices in pipeline order."""
    bottleneck_stage: int | None = _opt(int)
    """The slowest stage."""
    stage_ms: tuple[float, ...] | None = _opt(_ListOf(_NUM))
    """Per stage: time per micro-batch, ms."""
    stage_memory_bytes: tuple[int, ...] | None = _opt(_ListOf(_NUM))
    """Per stage: memory, bytes."""
    calibrated: bool | None = _opt(bool)
    """Whether a calibration scaled the profile."""
    candidates: tuple[SearchRow, ...] | None = _opt(_ListOf(SearchRow))
    """Runners-up, best first."""
    baselines: tuple[BaselineRow, ...] | None = _opt(_ListOf(BaselineRow))
    """Per other method: its best candidate."""
    skipped: tuple[str, ...] | None = _opt(_ListOf(str))
    """(schedule, M) points not searched, and why."""
