"""The plan: what to run where, and what the simulator predicts for it. JSON, versioned.

Minimal hand-written plan (everything else has defaults):

    {"schedule": "1f1b", "micro_batch_size": 4, "n_microbatches": 8, "devices": 2,
     "stages": [{"device": 0, "layers": [0, 3]}, {"device": 1, "layers": [3, 6]}]}

`layers` is half-open [first, end). With v stages per device (interleaved schedules) stage s
runs on device s mod n_devices. Written plans carry the format tag, model spec and seed,
the profile's path and checksum, device memory limits, links and the simulator's prediction.

Reading is strict: a key pplan does not know, at any level (PLAN_KEYS, DEVICE_KEYS, ... below,
including `predicted` and `search`), is refused with the nearest known one, and numbers must lie
in physically meaningful ranges (MAX_MEMORY_BYTES, MIN/MAX_BANDWIDTH, ...). `global_batch` is
derived and must equal micro_batch_size x n_microbatches when given.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from planner.atomic import atomic_write_text
from planner.errors import PlanError, PplanError
from planner.jsonio import check_keys, read_json_file
from planner.limits import (
    MAX_BANDWIDTH, MAX_GLOBAL_BATCH, MAX_LATENCY_MS, MAX_MEMORY_BYTES, MAX_SEED, MAX_SPEED, MIN_BANDWIDTH, MIN_SPEED,
)
from planner.parallel import ParallelConfig
from planner.schedules.registry import SCHEDULE_NAMES, get_schedule

__all__ = [
    "FORMAT",
    "SCHEDULES",
    "Device",
    "StagePlan",
    "Links",
    "Plan",
    "load_plan",
    "plan_from_dict",
    "plan_to_dict",
    "write_plan",
]

FORMAT = "pplan-plan/1"
SCHEDULES = SCHEDULE_NAMES  # the registry is the one list of schedule names
DEFAULT_BANDWIDTH = 25e9  # bytes/s: a PCIe 4/5-class or NVLink-lite link
DEFAULT_LATENCY_MS = 0.01
OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-plain")  # planner.cost.memory prices the state of each

# Bounds on every number (planner.limits), re-exported for importers of the plan module.

# Every key a plan may hold, per object level; anything else is refused with the nearest one.
PLAN_KEYS = ("format", "model", "seed", "n_layers", "profile", "schedule", "micro_batch_size", "n_microbatches",
             "global_batch", "parallel", "optimizer", "devices", "links", "stages", "predicted", "search")
PROFILE_KEYS = ("path", "sha256")
DEVICE_KEYS = ("name", "memory_bytes", "speed")
LINKS_KEYS = ("bandwidth_bytes_per_s", "latency_ms", "pairs")
PAIR_KEYS = ("a", "b", "bandwidth_bytes_per_s", "latency_ms")
STAGE_KEYS = ("device", "layers", "recompute")
# `predicted` is the simulation JSON (SimResult.to_dict, docs/simulator.md) without memory_timeline
MEMORY_KEYS = ("weights", "gradients", "optimizer", "activations", "buffers", "total")
PREDICTED_DEVICE_KEYS = ("device", "name", "busy_ms", "idle_ms", "peak_memory_bytes", "memory", "memory_limit_bytes")
PREDICTED_KEYS = ("iteration_ms", "bubble_fraction", "throughput_samples_per_s", "schedule", "n_microbatches",
                  "micro_batch_size", "interpolated", "devices",
                  # plans with data/tensor parallelism (planner.partition.parallel_search) add these
                  "tokens_per_s", "tflops_per_gpu", "mfu", "grad_sync_ms", "tp_comm_ms", "hardware")
# `search` is what planner.partition.api (and `pplan bench`) record about how the plan was chosen
SEARCH_KEYS = ("method", "source", "polish_moves", "optimal", "objective", "recompute", "schedule", "n_microbatches",
               "micro_batch_size", "device_order", "bottleneck_stage", "stage_ms", "stage_memory_bytes", "calibrated",
               "candidates", "baselines", "skipped")
SEARCH_ROW_KEYS = ("method", "polish_moves", "schedule", "n_microbatches", "micro_batch_size", "fits", "iteration_ms",
                   "bubble_fraction", "bottleneck_ms", "peak_memory_bytes", "slowdown_vs_plan", "cuts", "note",
                   "at_plan_setting")
AT_PLAN_SETTING_KEYS = ("fits", "iteration_ms", "peak_memory_bytes")


@dataclass(frozen=True)
class Device:
    """One accelerator of the pipeline."""

    name: str
    """A label (cluster device name, or cpu0, cuda1 ...)."""
    memory_bytes: int | None = None
    """Memory limit in bytes; None = unlimited."""
    speed: float = 1.0
    """Relative compute speed: profile times are divided by it."""


@dataclass(frozen=True)
class StagePlan:
    """A contiguous range of layers on one device."""

    device: int
    """Index into Plan.devices."""
    layers: tuple[int, int]
    """[first, end) layer indices."""
    recompute: tuple[int, ...] = ()
    """Layers checkpointed (activations recomputed in backward)."""


@dataclass(frozen=True)
class Links:
    """Point-to-point links: a default, and overrides per device pair (undirected)."""

    bandwidth_bytes_per_s: float = DEFAULT_BANDWIDTH
    """Default bandwidth, bytes per second."""
    latency_ms: float = DEFAULT_LATENCY_MS
    """Default latency per message, ms."""
    pairs: tuple[tuple[int, int, float, float], ...] = ()
    """(device a, device b, bandwidth bytes/s, latency ms) overrides."""

    def between(self, a: int, b: int) -> tuple[float, float]:
        """(bandwidth bytes/s, latency ms) of the link from device a to device b."""
        for x, y, bw, lat in self.pairs:
            if {x, y} == {a, b}:
                return bw, lat
        return self.bandwidth_bytes_per_s, self.latency_ms



@dataclass(frozen=True)
class Plan:
    """A complete pipeline plan (see module docstring for the JSON form)."""

    schedule: str
    """gpipe, 1f1b, interleaved or zb."""
    micro_batch_size: int
    """Samples per micro-batch."""
    n_microbatches: int
    """Micro-batches per iteration (global batch = size x count)."""
    stages: tuple[StagePlan, ...]
    """Stages in model order."""
    devices: tuple[Device, ...]
    """Devices; stage.device indexes this."""
    optimizer: str = "adam"
    """adam, adamw, sgd (momentum) or sgd-plain."""
    links: Links = field(default_factory=Links)
    """Link model between devices."""
    model: str | None = None
    """Model spec the profile was made from (needed by `pplan run`)."""
    seed: int = 0
    """Seed the model weights are built from."""
    n_layers: int | None = None
    """Layer count of the model (checked against profile and model)."""
    profile_path: str | None = None
    """Profile the plan was made from."""
    profile_sha256: str | None = None
    """Checksum of that profile."""
    predicted: dict[str, Any] | None = None
    """The simulator's prediction (iteration_ms, bubble_fraction, ...)."""
    search: dict[str, Any] | None = None
    """How the partitioner chose (method, runners-up, baselines): informational."""
    parallel: ParallelConfig | None = None
    """Data/tensor parallelism around the pipeline (None: one pipeline, dp = tp = 1)."""

    @property
    def global_batch(self) -> int:
        """Samples per iteration: every data-parallel replica runs n_microbatches x micro_batch_size."""
        dp = self.parallel.dp if self.parallel is not None else 1
        return dp * self.micro_batch_size * self.n_microbatches

    @property
    def n_devices(self) -> int:
        return len(self.devices)

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    @property
    def virtual_stages(self) -> int:
        """Stages per device (1 except for interleaved schedules)."""
        return len(self.stages) // len(self.devices)

    def with_(self, **changes: Any) -> "Plan":
        """A copy with fields replaced (for what-if overrides)."""
        return replace(self, **changes)

    def validate(self, n_layers: int | None = None) -> None:
        """Raise PlanError unless stages tile [0, n_layers) and devices/recompute are consistent."""
        validate_plan(self, n_layers)


def validate_plan(plan: Plan, n_layers: int | None = None) -> None:
    if plan.schedule not in SCHEDULES:
        raise PlanError(f"plan schedule {plan.schedule!r} is unknown", f"use one of {', '.join(SCHEDULES)}")
    if plan.micro_batch_size < 1 or plan.n_microbatches < 1:
        raise PlanError(f"micro_batch_size {plan.micro_batch_size} and n_microbatches {plan.n_microbatches} must be at least 1")
    if plan.micro_batch_size * plan.n_microbatches > MAX_GLOBAL_BATCH:
        raise PlanError(f"micro_batch_size {plan.micro_batch_size} x n_microbatches {plan.n_microbatches} is too large "
                        f"(more than {MAX_GLOBAL_BATCH:.0e} samples per iteration)", "check the plan's numbers")
    if not plan.devices:
        raise PlanError("plan has no devices")
    _check_devices(plan.devices)
    _check_links(plan.links, len(plan.devices))
    if not plan.stages:
        raise PlanError("plan has no stages")
    expected_first = 0
    for i, st in enumerate(plan.stages):
        first, end = st.layers
        if first != expected_first:
            kind = "overlaps the previous stage" if first < expected_first else "leaves a gap after the previous stage"
            raise PlanError(f"stages[{i}].layers [{first}, {end}) {kind} (expected it to start at {expected_first})", "stages must tile the layers contiguously: [0, a), [a, b), ...")
        if end <= first:
            raise PlanError(f"stages[{i}].layers [{first}, {end}) is empty", "each stage needs at least one layer")
        if not 0 <= st.device < len(plan.devices):
            raise PlanError(f"stages[{i}].device {st.device} is out of range (plan has {len(plan.devices)} devices)")
        for layer in st.recompute:
            if not first <= layer < end:
                raise PlanError(f"stages[{i}].recompute layer {layer} is outside the stage's layers [{first}, {end})")
        expected_first = end
    total = n_layers if n_layers is not None else plan.n_layers
    if total is not None and expected_first != total:
        raise PlanError(f"stages cover layers [0, {expected_first}) but the model has {total} layers", "the last stage must end at the layer count")
    if plan.n_layers is not None and n_layers is not None and plan.n_layers != n_layers:
        raise PlanError(f"plan is for {plan.n_layers} layers but the profile/model has {n_layers}")
    n_dev = len(plan.devices)
    if len(plan.stages) % n_dev:
        raise PlanError(f"{len(plan.stages)} stages cannot be spread evenly over {n_dev} devices", "give every device the same number of stages")
    v = len(plan.stages) // n_dev
    used = sorted(st.device for st in plan.stages)
    if used != sorted(list(range(n_dev)) * v):
        raise PlanError(f"stage devices {[st.device for st in plan.stages]} do not use each of the {n_dev} devices {v} time(s)")
    if v > 1:
        if not get_schedule(plan.schedule).multi_chunk:
            multi = [spec.name for spec in map(get_schedule, SCHEDULE_NAMES) if spec.multi_chunk]
            raise PlanError(f"{v} stages per device needs a schedule that runs several chunks per device ({', '.join(multi)}), not {plan.schedule!r}")
        order = [plan.stages[s].device for s in range(len(plan.stages))]
        first_round = order[:n_dev]
        if any(order[s] != first_round[s % n_dev] for s in range(len(order))):
            raise PlanError(f"interleaved stages must loop over the devices in one fixed order; got {order}")
    elif get_schedule(plan.schedule).multi_chunk:
        raise PlanError(f"schedule {plan.schedule!r} needs at least 2 stages per device", "give 2x (or more) as many stages as devices")


def _in_range(value: float, low: float, high: float) -> bool:
    return low <= value <= high  # False for NaN


def _check_devices(devices: tuple[Device, ...]) -> None:
    for i, dv in enumerate(devices):
        mem = dv.memory_bytes
        if mem is not None and not _in_range(mem, 1, MAX_MEMORY_BYTES):
            raise PlanError(f"devices[{i}].memory_bytes {mem:.4g} is out of range (1 to {MAX_MEMORY_BYTES:.3g} bytes)",
                            "give the device's memory in bytes, e.g. 85899345920 for 80 GiB")
        if not _in_range(dv.speed, MIN_SPEED, MAX_SPEED):
            raise PlanError(f"devices[{i}].speed {dv.speed!r} is out of range ({MIN_SPEED:g} to {MAX_SPEED:g})",
                            "speed is relative compute speed: 1.0 for the profiled device")


def _check_link(bw: float, lat: float, where: str) -> None:
    if not _in_range(bw, MIN_BANDWIDTH, MAX_BANDWIDTH):
        raise PlanError(f"{where}bandwidth_bytes_per_s {bw!r} is out of range ({MIN_BANDWIDTH:g} to {MAX_BANDWIDTH:g} bytes/s)",
                        "plan links need positive bandwidth, e.g. 25e9 for 25 GB/s")
    if not _in_range(lat, 0.0, MAX_LATENCY_MS):
        raise PlanError(f"{where}latency_ms {lat!r} is out of range (0 to {MAX_LATENCY_MS:g} ms)",
                        "plan links need non-negative latency in ms, e.g. 0.01")


def _check_links(links: Links, n_devices: int) -> None:
    _check_link(links.bandwidth_bytes_per_s, links.latency_ms, "links.")
    seen = set()
    for j, (a, b, bw, lat) in enumerate(links.pairs):
        where = f"links.pairs[{j}]."
        for end in (a, b):
            if not 0 <= end < n_devices:
                raise PlanError(f"links.pairs[{j}]: device {end} is out of range (plan has {n_devices} devices)")
        if a == b:
            raise PlanError(f"links.pairs[{j}] links device {a} to itself")
        if frozenset((a, b)) in seen:
            raise PlanError(f"links.pairs[{j}]: the link {a}-{b} is given twice", "keep one of them")
        seen.add(frozenset((a, b)))
        _check_link(bw, lat, where)


# ---- JSON -------------------------------------------------------------------------------------

def _get(d: dict, key: str, kind: type | tuple, where: str, default: Any = ...) -> Any:
    if key not in d:
        if default is ...:
            raise PlanError(f"plan is missing {where}{key}")
        return default
    value = d[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise PlanError(f"plan field {where}{key} must be {kinds[0].__name__}, got {value!r}")
    if not isinstance(value, kinds):
        raise PlanError(f"plan field {where}{key} must be {kinds[0].__name__}, got {type(value).__name__} {value!r}"[:200])
    if isinstance(value, float) and not math.isfinite(value):
        raise PlanError(f"plan field {where}{key} must be finite, got {value!r}")
    return value


def _object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise PlanError(f"plan field {where} must be an object, got {type(value).__name__}")
    return value


def _objects(value: Any, where: str, known: tuple[str, ...]) -> list[dict]:
    """`value` as a list of objects whose keys are all in `known`."""
    if not isinstance(value, list):
        raise PlanError(f"plan field {where} must be a list, got {type(value).__name__}")
    for i, item in enumerate(value):
        check_keys(_object(item, f"{where}[{i}]"), known, f"{where}[{i}]", PlanError)
    return value


def _check_predicted(predicted: dict) -> None:
    """The simulator's prediction: the simulation JSON's keys, at every level."""
    check_keys(predicted, PREDICTED_KEYS, "predicted", PlanError)
    for i, dev in enumerate(_objects(predicted.get("devices") or [], "predicted.devices", PREDICTED_DEVICE_KEYS)):
        if dev.get("memory") is not None:
            check_keys(_object(dev["memory"], f"predicted.devices[{i}].memory"), MEMORY_KEYS, f"predicted.devices[{i}].memory", PlanError)


def _check_search(search: dict) -> None:
    """How the partitioner chose: its record's keys, at every level."""
    check_keys(search, SEARCH_KEYS, "search", PlanError)
    for name in ("candidates", "baselines"):
        for i, row in enumerate(_objects(search.get(name) or [], f"search.{name}", SEARCH_ROW_KEYS)):
            if row.get("at_plan_setting") is not None:
                where = f"search.{name}[{i}].at_plan_setting"
                check_keys(_object(row["at_plan_setting"], where), AT_PLAN_SETTING_KEYS, where, PlanError)


def plan_from_dict(d: Any) -> Plan:
    """Build and validate a Plan from parsed JSON; PlanError names the bad field.

    Every key at every level must be one pplan knows (a typo such as `memroy` or `optimiser`
    would otherwise be silently ignored); numbers must lie in physically meaningful ranges.
    """
    if not isinstance(d, dict):
        raise PlanError(f"plan must be a JSON object, got {type(d).__name__}")
    fmt = d.get("format", FORMAT)
    if fmt != FORMAT:
        raise PlanError(f"plan format {str(fmt)[:60]!r} is not supported (this pplan reads {FORMAT})")
    check_keys(d, PLAN_KEYS, "plan", PlanError)
    raw_stages = _objects(_get(d, "stages", list, ""), "stages", STAGE_KEYS)
    raw_devices = _get(d, "devices", (int, list), "")
    if isinstance(raw_devices, int):
        if raw_devices < 1:
            raise PlanError(f"plan field devices must be at least 1, got {raw_devices}")
        n_devices = raw_devices
    else:
        n_devices = len(_objects(raw_devices, "devices", DEVICE_KEYS))
    stages = []
    for i, st in enumerate(raw_stages):
        where = f"stages[{i}]."
        layers = _get(st, "layers", list, where)
        if len(layers) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers):
            raise PlanError(f"plan field {where}layers must be [first, end) as two integers, got {layers!r}"[:200])
        rec = _get(st, "recompute", list, where, [])
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in rec):
            raise PlanError(f"plan field {where}recompute must be a list of layer indices, got {rec!r}"[:200])
        device = _get(st, "device", int, where, i % n_devices if n_devices else 0)
        stages.append(StagePlan(device=device, layers=(layers[0], layers[1]), recompute=tuple(sorted(set(rec)))))
    if isinstance(raw_devices, int):
        if raw_devices > max(1, len(stages)):  # refused before a huge count allocates that many devices
            raise PlanError(f"plan field devices is {raw_devices} but the plan has {len(stages)} stages",
                            "every device needs at least one stage")
        devices = tuple(Device(name=f"dev{i}") for i in range(raw_devices))
    else:
        devs = []
        for i, dv in enumerate(raw_devices):
            where = f"devices[{i}]."
            mem = _get(dv, "memory_bytes", (int, float, type(None)), where, None)
            if mem is not None and mem <= 0:
                raise PlanError(f"plan field {where}memory_bytes must be positive, got {mem}")
            if mem is not None and mem > MAX_MEMORY_BYTES:
                raise PlanError(f"plan field {where}memory_bytes {mem:.4g} is absurdly large (more than {MAX_MEMORY_BYTES:.3g} bytes)",
                                "give the device's memory in bytes, e.g. 85899345920 for 80 GiB")
            speed = float(_get(dv, "speed", (int, float), where, 1.0))
            if speed <= 0:
                raise PlanError(f"plan field {where}speed must be positive, got {speed}")
            devs.append(Device(name=str(_get(dv, "name", str, where, f"dev{i}")), memory_bytes=None if mem is None else int(mem), speed=speed))
        devices = tuple(devs)
    links_d = _get(d, "links", dict, "", {})
    check_keys(links_d, LINKS_KEYS, "links", PlanError)
    pairs = []
    for j, pr in enumerate(_objects(_get(links_d, "pairs", list, "links.", []), "links.pairs", PAIR_KEYS)):
        w = f"links.pairs[{j}]."
        pairs.append((_get(pr, "a", int, w), _get(pr, "b", int, w), float(_get(pr, "bandwidth_bytes_per_s", (int, float), w)), float(_get(pr, "latency_ms", (int, float), w))))
    links = Links(
        bandwidth_bytes_per_s=float(_get(links_d, "bandwidth_bytes_per_s", (int, float), "links.", DEFAULT_BANDWIDTH)),
        latency_ms=float(_get(links_d, "latency_ms", (int, float), "links.", DEFAULT_LATENCY_MS)),
        pairs=tuple(pairs),
    )
    if links.bandwidth_bytes_per_s <= 0 or links.latency_ms < 0 or any(p[2] <= 0 or p[3] < 0 for p in pairs):
        raise PlanError("plan links need positive bandwidth and non-negative latency")
    profile = _get(d, "profile", (dict, type(None)), "", None) or {}
    check_keys(profile, PROFILE_KEYS, "profile", PlanError)
    predicted = _get(d, "predicted", (dict, type(None)), "", None)
    if predicted is not None:
        _check_predicted(predicted)
    search = _get(d, "search", (dict, type(None)), "", None)
    if search is not None:
        _check_search(search)
    seed = _get(d, "seed", int, "", 0)
    parallel_d = _get(d, "parallel", (dict, type(None)), "", None)
    try:
        parallel = ParallelConfig.from_dict(parallel_d) if parallel_d is not None else None
    except PplanError as e:
        raise PlanError(e.message, e.hint) from None
    if abs(seed) > MAX_SEED:
        raise PlanError(f"plan field seed {seed} is out of range (at most 2**62 in magnitude)")
    plan = Plan(
        schedule=_get(d, "schedule", str, ""),
        micro_batch_size=_get(d, "micro_batch_size", int, ""),
        n_microbatches=_get(d, "n_microbatches", int, ""),
        stages=tuple(stages),
        devices=devices,
        optimizer=_get(d, "optimizer", str, "", "adam"),
        links=links,
        model=_get(d, "model", (str, type(None)), "", None),
        seed=seed,
        n_layers=_get(d, "n_layers", (int, type(None)), "", None),
        profile_path=_get(profile, "path", (str, type(None)), "profile.", None),
        profile_sha256=_get(profile, "sha256", (str, type(None)), "profile.", None),
        predicted=predicted,
        search=search,
        parallel=parallel,
    )
    if plan.optimizer not in OPTIMIZERS:
        raise PlanError(f"plan optimizer {plan.optimizer[:60]!r} is unknown", f"use one of {', '.join(OPTIMIZERS)}")
    validate_plan(plan)
    written = _get(d, "global_batch", (int, type(None)), "", None)
    if written is not None and written != plan.global_batch:
        dp = f"dp {plan.parallel.dp} x " if plan.parallel is not None else ""
        raise PlanError(f"plan field global_batch {written} is not {dp}micro_batch_size {plan.micro_batch_size} x "
                        f"n_microbatches {plan.n_microbatches} = {plan.global_batch}",
                        "global_batch is derived: change micro_batch_size or n_microbatches (or drop it)")
    return plan


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """JSON-ready dict with a fixed key order (so equal plans serialize byte-identically)."""
    d: dict[str, Any] = {"format": FORMAT}
    d["model"] = plan.model
    d["seed"] = plan.seed
    d["n_layers"] = plan.n_layers
    d["profile"] = {"path": plan.profile_path, "sha256": plan.profile_sha256}
    d["schedule"] = plan.schedule
    d["micro_batch_size"] = plan.micro_batch_size
    d["n_microbatches"] = plan.n_microbatches
    d["global_batch"] = plan.global_batch
    if plan.parallel is not None:  # absent in one-pipeline plans, whose text stays as it was
        d["parallel"] = plan.parallel.to_dict()
    d["optimizer"] = plan.optimizer
    d["devices"] = [{"name": dv.name, "memory_bytes": dv.memory_bytes, "speed": dv.speed} for dv in plan.devices]
    d["links"] = {
        "bandwidth_bytes_per_s": plan.links.bandwidth_bytes_per_s,
        "latency_ms": plan.links.latency_ms,
        "pairs": [{"a": a, "b": b, "bandwidth_bytes_per_s": bw, "latency_ms": lat} for a, b, bw, lat in plan.links.pairs],
    }
    d["stages"] = [{"device": st.device, "layers": list(st.layers), "recompute": list(st.recompute)} for st in plan.stages]
    if plan.predicted is not None:
        d["predicted"] = plan.predicted
    if plan.search is not None:
        d["search"] = plan.search
    return d


def plan_to_json(plan: Plan) -> str:
    return json.dumps(plan_to_dict(plan), indent=2, allow_nan=False) + "\n"


def load_plan(path: str | os.PathLike) -> Plan:
    """Read and validate a plan JSON file (bounded read, strict JSON, no unknown keys)."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise PlanError(f"plan {str(p)!r} does not exist", "make one with `pplan partition` or write one by hand (see README)")
    data = read_json_file(p, "plan", PlanError)
    try:
        return plan_from_dict(data)
    except PlanError as e:
        raise PlanError(f"{p}: {e.message}", e.hint) from None


def write_plan(plan: Plan, path: str | os.PathLike) -> None:
    """Write `plan` atomically as JSON, refusing (PlanError, nothing written) one `load_plan` would refuse."""
    text = plan_to_json(plan)
    try:
        plan_from_dict(json.loads(text))
    except PlanError as e:
        raise PlanError(f"not writing plan {str(path)!r}, it could not be read back: {e.message}", e.hint) from None
    atomic_write_text(path, text)


__all__ += ["plan_to_json", "validate_plan", "DEFAULT_BANDWIDTH", "DEFAULT_LATENCY_MS"]
