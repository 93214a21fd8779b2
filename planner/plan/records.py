"""Typed records a plan carries: the simulator's prediction (`predicted`) and how the partitioner
chose (`search`, defined in planner.plan.search_records and exported here). Each is a frozen
dataclass whose fields are its JSON keys in the order written, with one to_dict / from_dict; the
key lists the plan reader enforces are derived from the fields.

A field left None is not written, except the ones a record lists in `_WRITE_NULL`, which the
producers always write (as null when there is no value). Every field may be absent or null when
read: a hand-written plan may carry a partial prediction. from_dict reads through
planner.jsontypes.record_fields, like every other record pplan reads: a field's JSON type is its
annotation, a nested record an object, `tuple[X, ...]` a list; a byte count may be any number
(pplan writes whole numbers, a person may write 16e9, and run files have always been read so).
Numbers are held to physical ranges (`_RANGES`, checked as each record is read): a hand-edited bubble
fraction of 7 or a peak of 1e300 bytes is refused on one line instead of shown as "700.0%".
The round-trip itself is planner.plan.recordbase.JsonRecord's, which also bounds each list's length
(`_LONGEST`) before reading its items and holds every string to one line a terminal can show.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from planner.errors import PlanError
from planner.jsontypes import short
from planner.limits import MAX_GLOBAL_BATCH, MAX_MEMORY_BYTES
from planner.plan.bounds import MAX_PIPELINE_STAGES, MAX_PREDICTED_MS, MAX_SEARCH_ROWS, MAX_SKIPPED
from planner.plan.recordbase import BYTES_RANGE, COUNT_RANGE, TIME_RANGE, JsonRecord
from planner.plan.search_records import AtPlanSetting, BaselineRow, SearchRecord, SearchRow
from planner.schedules.registry import SCHEDULE_NAMES

__all__ = [
    "MAX_PIPELINE_STAGES", "MAX_PREDICTED_MS", "MemoryRecord", "PredictedDevice", "PlanDigest", "Prediction",
    "AtPlanSetting", "SearchRow", "BaselineRow", "SearchRecord", "MAX_SEARCH_ROWS", "MAX_SKIPPED",
]


_ROUNDING_MS = 1e-6
"""idle_ms is iteration time minus busy time: it may fall below 0 by float rounding, not more."""


# ---- predicted: the simulation JSON (docs/simulator.md) without memory_timeline -------------------

@dataclass(frozen=True)
class MemoryRecord(JsonRecord):
    """Peak memory of one device by kind, bytes."""

    _ALL_BYTES = True
    _RANGES = dict.fromkeys(("weights", "gradients", "optimizer", "activations", "buffers", "total"), BYTES_RANGE)
    _HINT = "memory is in bytes, 0 to 2**60"

    weights: int | None = None
    """Parameters."""
    gradients: int | None = None
    """Gradients."""
    optimizer: int | None = None
    """Optimizer state."""
    activations: int | None = None
    """Activations kept for backward at the peak."""
    buffers: int | None = None
    """Communication and workspace buffers."""
    total: int | None = None
    """The sum: the device's peak."""


@dataclass(frozen=True)
class PredictedDevice(JsonRecord):
    """One device's predicted busy time and peak memory."""

    _WRITE_NULL = frozenset({"memory_limit_bytes"})
    _RANGES = {"device": (0, MAX_PIPELINE_STAGES - 1), "busy_ms": TIME_RANGE, "idle_ms": (-_ROUNDING_MS, MAX_PREDICTED_MS),
               "peak_memory_bytes": BYTES_RANGE, "memory_limit_bytes": (1, MAX_MEMORY_BYTES)}
    _HINT = f"a pipeline has at most {MAX_PIPELINE_STAGES} devices, numbered from 0; times are ms, memory bytes"

    device: int | None = None
    """Device index."""
    name: str | None = None
    """Device name."""
    busy_ms: float | None = None
    """Time spent computing in one iteration, ms."""
    idle_ms: float | None = None
    """Iteration time minus busy time, ms."""
    peak_memory_bytes: int | None = None
    """Peak memory (the breakdown's total), bytes."""
    memory: MemoryRecord | None = None
    """Peak memory by kind."""
    memory_limit_bytes: int | None = None
    """The device's memory limit (None = unlimited)."""


DIGEST_HEX = 12
"""Hex digits kept of each sha256 in a PlanDigest: 48 bits, so an edit passes unseen about once in 3e14."""


@dataclass(frozen=True)
class PlanDigest(JsonRecord):
    """What plan a prediction was made for: per group of plan fields it depends on, the first hex digits
    of the sha256 of their canonical JSON (planner.plan.digest computes and compares them)."""

    _HINT = "made_for is what pplan writes (hex digits per group of plan fields): re-create it with `pplan partition`"

    batch: str | None = None
    """schedule, micro_batch_size and n_microbatches."""
    optimizer: str | None = None
    """optimizer."""
    parallel: str | None = None
    """parallel (dp, pp, tp, zero, the hardware and GPUs per node planned for)."""
    devices: str | None = None
    """devices: each one's memory_bytes and speed (not its name)."""
    links: str | None = None
    """links: default bandwidth and latency, and the per-pair overrides."""
    stages: str | None = None
    """stages: each one's device, layers and recompute."""
    profile: str | None = None
    """profile.sha256 and the model string (not the profile's path: a plan travels with its profile)."""

    @classmethod
    def _check_texts(cls, d: dict[str, Any], where: str) -> None:
        """Nothing here: from_dict holds each value to 12 hex digits, stricter than one safe line."""

    @classmethod
    def from_dict(cls, d: Any, where: str) -> PlanDigest:
        """As every record, then each group's digest must be there and be what pplan writes (12
        lowercase hex digits): a file that leaves a group out, or puts anything else there, would
        otherwise keep a prediction through an edit of that group."""
        digest: PlanDigest = super().from_dict(d, where)
        for name in cls.keys():
            value = getattr(digest, name)
            if value is None:
                raise PlanError(f"{where} lacks {name!r}: a prediction's made_for holds every group", cls._HINT)
            if len(value) != DIGEST_HEX or value.strip("0123456789abcdef"):
                raise PlanError(f"{where} field {name!r} is {short(value)}, not {DIGEST_HEX} lowercase hex digits", cls._HINT)
        return digest


@dataclass(frozen=True)
class Prediction(JsonRecord):
    """What the simulator (or the data x pipeline x tensor search) predicts for a plan."""

    _WRITE_NULL = frozenset({"throughput_samples_per_s"})
    _RANGES = {"iteration_ms": TIME_RANGE, "bubble_fraction": (0.0, 1.0), "throughput_samples_per_s": (0.0, math.inf),
               "n_microbatches": COUNT_RANGE, "micro_batch_size": COUNT_RANGE, "tokens_per_s": (0.0, math.inf),
               "tflops_per_gpu": (0.0, math.inf), "mfu": (0.0, math.inf), "grad_sync_ms": TIME_RANGE, "tp_comm_ms": TIME_RANGE}
    _HINT = "the prediction is what the simulator wrote: re-create it with `pplan simulate` or `pplan partition`"

    iteration_ms: float | None = None
    """Time of one iteration, ms."""
    bubble_fraction: float | None = None
    """Idle share of device time."""
    throughput_samples_per_s: float | None = None
    """Samples per second (None when the iteration time is 0)."""
    schedule: str | None = None
    """Schedule simulated."""
    n_microbatches: int | None = None
    """Micro-batches per iteration."""
    micro_batch_size: int | None = None
    """Samples per micro-batch."""
    interpolated: bool | None = None
    """True when the profile's costs were interpolated at this micro-batch size."""
    devices: tuple[PredictedDevice, ...] | None = None
    """Per device: busy time and peak memory."""
    tokens_per_s: float | None = None
    """Data/tensor-parallel plans: tokens per second over all replicas."""
    tflops_per_gpu: float | None = None
    """Data/tensor-parallel plans: model TFLOP/s per GPU."""
    mfu: float | None = None
    """Data/tensor-parallel plans: model FLOP utilization."""
    grad_sync_ms: float | None = None
    """Data/tensor-parallel plans: the largest device's data-parallel gradient sync per iteration before overlap (its stages' summed), ms."""
    tp_comm_ms: float | None = None
    """Data/tensor-parallel plans: tensor-parallel collectives one micro-batch is charged on the busiest device (forward, input-gradient backward and any recomputed forward, its stages summed), ms."""
    hardware: str | None = None
    """Data/tensor-parallel plans: the hardware preset searched on."""
    made_for: PlanDigest | None = None
    """The plan it was made for (planner.plan.digest): stamped when it joins a plan; a plan read whose
    fields no longer match drops it. None: not yet joined, or an older file (trusted as before)."""

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Prediction:
        """As every record (types, ranges), then what spans fields: a known schedule, a global batch in
        range, and at most MAX_PIPELINE_STAGES devices, each index once. The device count is checked
        before any device is read: reading 200,000 device records took 22 s only to refuse them."""
        listed = d.get("devices") if isinstance(d, dict) else None
        if isinstance(listed, list) and len(listed) > MAX_PIPELINE_STAGES:
            raise PlanError(f"{where} field 'devices' lists {len(listed)} devices, more than a pipeline can have "
                            f"({MAX_PIPELINE_STAGES})", cls._HINT)
        prediction: Prediction = super().from_dict(d, where)
        if prediction.schedule is not None and prediction.schedule not in SCHEDULE_NAMES:
            raise PlanError(f"{where} field 'schedule' {short(prediction.schedule)} is unknown",
                            f"use one of {', '.join(SCHEDULE_NAMES)}")
        m, b = prediction.n_microbatches, prediction.micro_batch_size
        if m is not None and b is not None and m * b > MAX_GLOBAL_BATCH:
            raise PlanError(f"{where}: n_microbatches {m} x micro_batch_size {b} is more than {MAX_GLOBAL_BATCH:.0e} "
                            "samples per iteration", cls._HINT)
        devices = prediction.devices or ()
        seen: set[int] = set()
        for i, dev in enumerate(devices):
            if dev.device is None:
                continue
            if dev.device in seen:
                raise PlanError(f"{where}.devices[{i}]: device {dev.device} is listed twice", "list each device once")
            seen.add(dev.device)
        return prediction

    def device_count_error(self, n_devices: int, where: str) -> str | None:
        """None when the predicted devices fit a plan of `n_devices` devices (at most that many, each
        index below it); else the message naming both, for the plan's reader and the report."""
        devices = self.devices or ()
        if len(devices) > n_devices:
            return f"{where} lists {len(devices)} devices but the plan has {n_devices}"
        bad = next((d.device for d in devices if d.device is not None and d.device >= n_devices), None)
        if bad is not None:
            return f"{where} has device {bad} but the plan's devices are 0..{n_devices - 1}"
        return None
