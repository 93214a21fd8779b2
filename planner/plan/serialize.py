"""Plan JSON: read strictly (unknown keys refused at every level, numbers in range), write with a
fixed key order (equal plans serialize byte-identically), atomically."""

from __future__ import annotations

import json
import math
import os
from functools import partial
from pathlib import Path
from typing import Any

from planner.atomic import atomic_write_text
from planner.errors import PlanError, PplanError
from planner.filekind import FILE_KINDS, SNIFF_BYTES, wrong_kind
from planner.hardware import hardware_from_dict
from planner.jsonio import check_keys, loads_strict, read_bounded_text
from planner.jsontypes import file_kind, kind_mismatch
from planner.limits import MAX_MEMORY_BYTES, MAX_SEED
from planner.parallel import ParallelConfig
from planner.plan.bounds import MAX_PLAN_BYTES, MAX_PLAN_LAYERS, check_plan_counts, check_text
from planner.plan.checks import records_mismatch
from planner.plan.digest import digest_change
from planner.plan.fields import as_objects, get_field
from planner.plan.model import DEFAULT_BANDWIDTH, DEFAULT_LATENCY_MS, Device, Links, Plan, StagePlan
from planner.plan.profile_path import profile_path_from
from planner.plan.records import MemoryRecord, PredictedDevice, Prediction, SearchRecord, SearchRow
from planner.textsafe import check_name

__all__ = [
    "FORMAT", "PLAN_KEYS", "PROFILE_KEYS", "DEVICE_KEYS", "LINKS_KEYS", "PAIR_KEYS", "STAGE_KEYS", "MEMORY_KEYS",
    "PREDICTED_DEVICE_KEYS", "PREDICTED_KEYS", "SEARCH_KEYS", "SEARCH_ROW_KEYS",
    "plan_from_dict", "read_plan", "plan_to_dict", "plan_to_json", "load_plan", "write_plan",
]

FORMAT = "pplan-plan/1"
_MAKE_PLAN = "give a plan JSON (`pplan partition -o plan.json` writes one)"
_read_hardware_spec = partial(hardware_from_dict, source="plan field parallel.hardware_spec")

# Every key a plan may hold, per object level; anything else is refused with the nearest one.
PLAN_KEYS = ("format", "model", "seed", "n_layers", "profile", "schedule", "micro_batch_size", "n_microbatches",
             "global_batch", "parallel", "optimizer", "devices", "links", "stages", "predicted", "search")
PROFILE_KEYS = ("path", "sha256")
DEVICE_KEYS = ("name", "memory_bytes", "speed")
LINKS_KEYS = ("bandwidth_bytes_per_s", "latency_ms", "pairs")
PAIR_KEYS = ("a", "b", "bandwidth_bytes_per_s", "latency_ms")
STAGE_KEYS = ("device", "layers", "recompute")
# `predicted` and `search` are typed records (planner.plan.records): their keys are their fields.
MEMORY_KEYS = MemoryRecord.keys()
PREDICTED_DEVICE_KEYS = PredictedDevice.keys()
PREDICTED_KEYS = Prediction.keys()
SEARCH_KEYS = SearchRecord.keys()
SEARCH_ROW_KEYS = SearchRow.keys()

def _int_list(value: list, where: str, what: str) -> list[int]:
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        raise PlanError(f"plan field {where} must be {what}, got {value!r}"[:200])
    return value


def _stages(d: dict, n_devices: int) -> list[StagePlan]:
    """The plan's stages; lengths are bounded first (check_plan_counts: the stage count), each stage's
    layers within MAX_PLAN_LAYERS and its recompute list no longer than its layers, each listed once."""
    stages, recomputed = [], 0
    for i, st in enumerate(as_objects(get_field(d, "stages", list, ""), "stages", STAGE_KEYS)):
        where = f"stages[{i}]."
        first, end = _layer_range(get_field(st, "layers", list, where), where)
        rec = _recompute(get_field(st, "recompute", list, where, []), first, end, where)
        recomputed += len(rec)
        if recomputed > MAX_PLAN_LAYERS:  # each layer is recomputed at most once (validate_plan checks which)
            raise PlanError(f"plan field {where}recompute brings the layers recomputed to {recomputed}, more than the "
                            f"{MAX_PLAN_LAYERS} layers a plan can have", "list each layer in one stage's recompute at most")
        device = get_field(st, "device", int, where, i % n_devices if n_devices else 0)
        stages.append(StagePlan(device=device, layers=(first, end), recompute=tuple(sorted(rec))))
    return stages


def _layer_range(layers: list, where: str) -> tuple[int, int]:
    """A stage's [first, end) as two integers, end at most MAX_PLAN_LAYERS (validate_plan checks the tiling)."""
    if len(layers) != 2:
        raise PlanError(f"plan field {where}layers must be [first, end) as two integers, got {layers!r}"[:200])
    first, end = _int_list(layers, f"{where}layers", "[first, end) as two integers")
    if max(first, end) > MAX_PLAN_LAYERS:
        raise PlanError(f"plan field {where}layers [{first}, {end}) goes past layer {MAX_PLAN_LAYERS}, more layers than "
                        "a profile can hold", "layers are numbered 0..n-1 in the profile's order")
    return first, end


def _recompute(listed: list, first: int, end: int, where: str) -> set[int]:
    """A stage's recompute list as a set: no longer than the stage (counted before any item is read),
    integers, each layer once (a duplicate is refused, naming the layer)."""
    if len(listed) > max(0, end - first):
        raise PlanError(f"plan field {where}recompute lists {len(listed)} layers but the stage [{first}, {end}) has "
                        f"{max(0, end - first)}", "list each of the stage's layers at most once")
    seen: set[int] = set()
    for layer in _int_list(listed, f"{where}recompute", "a list of layer indices"):
        if layer in seen:
            raise PlanError(f"plan field {where}recompute lists layer {layer} twice", "list each layer once")
        seen.add(layer)
    return seen


def _device(dv: dict, i: int) -> Device:
    where = f"devices[{i}]."
    mem = get_field(dv, "memory_bytes", (int, float, type(None)), where, None)
    if mem is not None and mem <= 0:
        raise PlanError(f"plan field {where}memory_bytes must be positive, got {mem}",
                        "give the device's memory in bytes, e.g. 85899345920 for 80 GiB, or null for no limit")
    if mem is not None and mem > MAX_MEMORY_BYTES:
        raise PlanError(f"plan field {where}memory_bytes {mem:.4g} is absurdly large (more than {MAX_MEMORY_BYTES:.3g} bytes)",
                        "give the device's memory in bytes, e.g. 85899345920 for 80 GiB")
    if isinstance(mem, float) and not mem.is_integer():  # int() would make 0.5 a device of 0 bytes, 1.5 one of 1
        raise PlanError(f"plan field {where}memory_bytes {mem!r} is not a whole number of bytes",
                        "give the device's memory in whole bytes (16e9 is one), e.g. 85899345920 for 80 GiB")
    speed = float(get_field(dv, "speed", (int, float), where, 1.0))
    if speed <= 0:
        raise PlanError(f"plan field {where}speed must be positive, got {speed}",
                        "speed is the device's compute speed relative to the profiled one: 1.0 for the same device")
    name = check_name(get_field(dv, "name", str, where, f"dev{i}"), "device name", PlanError, f"plan field {where}name")
    return Device(name=name, memory_bytes=None if mem is None else int(mem), speed=speed)


def _links(d: dict) -> Links:
    links_d = get_field(d, "links", dict, "", {})
    check_keys(links_d, LINKS_KEYS, "links", PlanError)
    pairs = []
    for j, pr in enumerate(as_objects(get_field(links_d, "pairs", list, "links.", []), "links.pairs", PAIR_KEYS)):
        w = f"links.pairs[{j}]."
        pairs.append((get_field(pr, "a", int, w), get_field(pr, "b", int, w),
                      float(get_field(pr, "bandwidth_bytes_per_s", (int, float), w)), float(get_field(pr, "latency_ms", (int, float), w))))
    links = Links(
        bandwidth_bytes_per_s=float(get_field(links_d, "bandwidth_bytes_per_s", (int, float), "links.", DEFAULT_BANDWIDTH)),
        latency_ms=float(get_field(links_d, "latency_ms", (int, float), "links.", DEFAULT_LATENCY_MS)),
        pairs=tuple(pairs),
    )
    named = [("links.", links.bandwidth_bytes_per_s, links.latency_ms)] + [(f"links.pairs[{j}].", p[2], p[3]) for j, p in enumerate(pairs)]
    for where, bandwidth, latency in named:
        if bandwidth <= 0:
            raise PlanError(f"plan field {where}bandwidth_bytes_per_s must be positive, got {bandwidth:g}",
                            "give the link's bandwidth in bytes per second, e.g. 25000000000 for 25 GB/s")
        if latency < 0:
            raise PlanError(f"plan field {where}latency_ms must be 0 or more, got {latency:g}",
                            "give the link's latency per message in ms, e.g. 0.01")
    return links


def _record(d: dict, key: str, cls: type) -> Any:
    """`predicted` or `search`: null or absent is None; else its record's reader checks it, an object."""
    value = d.get(key)
    return None if value is None else cls.from_dict(value, key)


def _stages_and_devices(d: dict[str, Any]) -> tuple[list[Any], tuple[Device, ...]]:
    """The plan's stages and devices; `devices` is a count (identical devices) or a list of objects."""
    raw_devices = get_field(d, "devices", (int, list), "")
    if isinstance(raw_devices, int):
        if raw_devices < 1:
            raise PlanError(f"plan field devices must be at least 1, got {raw_devices}",
                            "give the number of devices, or a list of device objects")
        n_devices = raw_devices
    else:
        n_devices = len(as_objects(raw_devices, "devices", DEVICE_KEYS))
    stages = _stages(d, n_devices)
    if not isinstance(raw_devices, int):
        return stages, tuple(_device(dv, i) for i, dv in enumerate(raw_devices))
    if raw_devices > max(1, len(stages)):  # refused before a huge count allocates that many devices
        raise PlanError(f"plan field devices is {raw_devices} but the plan has {len(stages)} stages",
                        "every device needs at least one stage")
    return stages, tuple(Device(name=f"dev{i}") for i in range(raw_devices))


def _parallel(d: dict[str, Any]) -> ParallelConfig | None:
    """The `parallel` object (dp, pp, tp, zero and the cluster), None when absent (one pipeline);
    its hardware_spec is checked as a hardware file is (bounded numbers, no unknown key)."""
    parallel_d = get_field(d, "parallel", (dict, type(None)), "", None)
    try:
        parallel = ParallelConfig.from_dict(parallel_d, _read_hardware_spec) if parallel_d is not None else None
    except PplanError as e:
        raise PlanError(e.message, e.hint) from None
    if parallel is not None and parallel.hardware is not None:  # printed with the plan's layout
        check_name(parallel.hardware, "hardware name", PlanError, "plan field parallel.hardware")
    return parallel


def plan_from_dict(d: Any) -> Plan:
    """Build and validate a Plan from parsed JSON; PlanError names the bad field.

    Every key at every level must be one pplan knows (a typo such as `memroy` or `optimiser`
    would otherwise be silently ignored); numbers must lie in physically meaningful ranges.
    A recorded prediction and search made for another plan than this one (the plan was edited by
    hand: its `predicted.made_for` or its schedule and batch split differ) are dropped: read_plan says so.
    """
    return read_plan(d)[0]


def read_plan(d: Any) -> tuple[Plan, str | None]:
    """(plan, note) from parsed JSON, as plan_from_dict; `note` is None unless the file's `predicted`
    and `search` were dropped because they are of another plan: its `made_for` digests differ from the
    plan's (planner.plan.digest, checked before the prediction's device count, which may then differ),
    or they record another schedule or batch split (planner.plan.checks.records_mismatch). Then the
    line that says why, for a command to show. A stale prediction is never shown as this plan's
    numbers, and the plan still loads, simulates and runs."""
    _check_document(d)
    check_plan_counts(d)  # before any stage, device or link is read
    as_objects(get_field(d, "stages", list, ""), "stages", STAGE_KEYS)
    stages, devices = _stages_and_devices(d)
    links = _links(d)
    profile = get_field(d, "profile", (dict, type(None)), "", None) or {}
    check_keys(profile, PROFILE_KEYS, "profile", PlanError)
    predicted = _record(d, "predicted", Prediction)
    search = _record(d, "search", SearchRecord)
    seed = get_field(d, "seed", int, "", 0)
    parallel = _parallel(d)
    if not 0 <= seed <= MAX_SEED:
        raise PlanError(f"plan field seed {seed} is out of range (0 to {MAX_SEED})",
                        "use the seed of the profile the plan was made from, e.g. 0")
    bare = Plan(  # without its records first: a prediction stamped for another plan must not refuse it
        schedule=get_field(d, "schedule", str, ""),
        micro_batch_size=get_field(d, "micro_batch_size", int, ""),
        n_microbatches=get_field(d, "n_microbatches", int, ""),
        stages=tuple(stages),
        devices=devices,
        optimizer=get_field(d, "optimizer", str, "", "adam"),
        links=links,
        model=_text(d, "model", ""),
        seed=seed,
        n_layers=get_field(d, "n_layers", (int, type(None)), "", None),
        profile_path=_text(profile, "path", "profile."),
        profile_sha256=_text(profile, "sha256", "profile."),
        parallel=parallel,
    )
    _check_global_batch(d, bare)
    return _with_records(bare, predicted, search)


def _text(d: dict[str, Any], key: str, where: str) -> str | None:
    """A text field (model spec, profile path or checksum): null, absent or one line a terminal can show."""
    value = get_field(d, key, (str, type(None)), where, None)
    return None if value is None else check_text(value, "text", f"plan field {where}{key}")


def _check_document(d: Any) -> None:
    """PlanError unless `d` is a plan object of this format with only known keys (before any field is read)."""
    if not isinstance(d, dict):
        raise PlanError(f"plan must be a JSON object, got {type(d).__name__}")
    if (other := kind_mismatch(d, "plan")) is not None:
        reader = FILE_KINDS.get(file_kind(d) or "", ("", None))[1]
        raise PlanError(other, (f"{reader.replace('{file}', 'FILE')} reads it; " if reader else "") + _MAKE_PLAN)
    fmt = d.get("format", FORMAT)
    if fmt != FORMAT:
        raise PlanError(f"plan format {str(fmt)[:60]!r} is not supported (this pplan reads {FORMAT})")
    check_keys(d, PLAN_KEYS, "plan", PlanError)


def _check_global_batch(d: dict[str, Any], bare: Plan) -> None:
    """PlanError when the file writes a global_batch other than the one its fields derive."""
    written = get_field(d, "global_batch", (int, type(None)), "", None)
    if written is not None and written != bare.global_batch:
        dp = f"dp {bare.parallel.dp} x " if bare.parallel is not None else ""
        raise PlanError(f"plan field global_batch {written} is not {dp}micro_batch_size {bare.micro_batch_size} x "
                        f"n_microbatches {bare.n_microbatches} = {bare.global_batch}",
                        "global_batch is derived: change micro_batch_size or n_microbatches (or drop it)")


def _with_records(bare: Plan, predicted: Prediction | None, search: SearchRecord | None) -> tuple[Plan, str | None]:
    """(plan, note) of read_plan: the records kept when they are of this plan, else dropped with the line why."""
    made_for = predicted.made_for if predicted is not None else None
    if made_for is not None and digest_change(made_for, bare) is not None:
        # the values the records hold name an edit of the schedule or batch split best; the digests the rest
        named = records_mismatch(bare, (predicted, search))
        changed = digest_change(made_for, bare, skip=("batch",) if named else ())
        why = [f"for {named}"] if named else []
        why += [f"before its {changed} changed"] if changed else []
        return bare, _dropped(", and ".join(why))
    if predicted is None and search is None:
        return bare, None
    plan = bare.with_(predicted=predicted, search=search)  # an older file's prediction (no made_for) is stamped here
    if (mismatch := records_mismatch(plan)) is None:
        return plan, None
    return bare, _dropped(f"for {mismatch}")


def _dropped(why: str) -> str:
    """The note of a plan whose recorded prediction and search were dropped, `why` saying of what plan they are."""
    return (f"the plan's recorded prediction and search were made {why}: not shown as this plan's "
            "(simulate it: `pplan simulate PLAN`, or re-run `pplan partition`)")


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """JSON-ready dict with a fixed key order (so equal plans serialize byte-identically)."""
    d: dict[str, Any] = {"format": FORMAT, "model": plan.model, "seed": plan.seed, "n_layers": plan.n_layers,
                         "profile": {"path": plan.profile_path, "sha256": plan.profile_sha256}, "schedule": plan.schedule,
                         "micro_batch_size": plan.micro_batch_size, "n_microbatches": plan.n_microbatches,
                         "global_batch": plan.global_batch}
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
        d["predicted"] = plan.predicted.to_dict()
    if plan.search is not None:
        d["search"] = plan.search.to_dict()
    return d


def _non_finite(value: Any, where: str) -> tuple[str, float] | None:
    """(path, value) of the first NaN or infinity in a JSON-ready value, None when there is none."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def plan_to_json(plan: Plan) -> str:
    """The plan's JSON text (2-space indent, newline-terminated); PlanError naming the field when a
    number is NaN or infinite (strict JSON has neither: an overflowed prediction, never a plan)."""
    d = plan_to_dict(plan)
    bad = _non_finite(d, "")
    if bad is not None:
        raise PlanError(f"plan field {bad[0]} is {bad[1]!r}, not a finite number",
                        "an input is out of range: check the hardware's peak FLOP/s, memory and bandwidths and the profile's times")
    return json.dumps(d, indent=2, allow_nan=False) + "\n"


def load_plan(path: str | os.PathLike) -> Plan:
    """Read and validate a plan JSON file (bounded read, strict JSON, no unknown keys)."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise PlanError(f"plan {str(p)!r} does not exist", "make one with `pplan partition` or write one by hand (see README)")
    text = read_bounded_text(p, "plan", PlanError, MAX_PLAN_BYTES)
    if (wrong := wrong_kind(str(p), text[:SNIFF_BYTES].encode(), "plan", _MAKE_PLAN)) is not None:
        raise PlanError(*wrong)  # a profile CSV, a run JSON: named, rather than "invalid JSON" or a missing field
    data = loads_strict(text, str(p), PlanError)
    try:
        return plan_from_dict(data)
    except PlanError as e:
        raise PlanError(f"{p}: {e.message}", e.hint) from None


def write_plan(plan: Plan, path: str | os.PathLike) -> None:
    """Write `plan` atomically as JSON, refusing (PlanError, nothing written) one `load_plan` would
    refuse. A relative profile path (from the folder the command ran in) is written from the plan's
    folder, where resolve_profile_path looks first: the plan finds its profile from any folder."""
    plan = profile_path_from(plan, path)
    try:
        text = plan_to_json(plan)
    except PlanError as e:
        raise PlanError(f"not writing plan {str(path)!r}: {e.message}", e.hint) from None
    try:
        plan_from_dict(json.loads(text))
    except PlanError as e:
        raise PlanError(f"not writing plan {str(path)!r}, it could not be read back: {e.message}", e.hint) from None
    atomic_write_text(path, text)
