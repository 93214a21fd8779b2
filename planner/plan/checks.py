"""What makes a plan valid: known schedule and optimizer, stages tiling the layers, every device
used evenly, devices and links within physical ranges. Plan runs these on construction."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from planner.errors import PlanError
from planner.limits import (
    MAX_BANDWIDTH, MAX_GLOBAL_BATCH, MAX_LATENCY_MS, MAX_MEMORY_BYTES, MAX_SPEED, MIN_BANDWIDTH, MIN_SPEED, OPTIMIZERS,
)
from planner.schedules.registry import SCHEDULE_NAMES, get_schedule

if TYPE_CHECKING:
    from planner.plan.model import Device, Links, Plan
    from planner.profiling.profile import Profile

__all__ = ["SCHEDULES", "OPTIMIZERS", "validate_plan", "records_mismatch", "profile_change"]

SCHEDULES = SCHEDULE_NAMES  # the registry is the one list of schedule names
# OPTIMIZERS is planner.limits' one list of optimizer names, re-exported as planner.plan.OPTIMIZERS


def validate_plan(plan: Plan, n_layers: int | None = None) -> None:
    """Raise PlanError unless `plan` is consistent (and covers `n_layers` layers when given)."""
    if plan.optimizer not in OPTIMIZERS:
        raise PlanError(f"plan optimizer {plan.optimizer[:60]!r} is unknown", f"use one of {', '.join(OPTIMIZERS)}")
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
    _check_stages(plan, n_layers)
    _check_device_use(plan)
    if plan.predicted is not None and (message := plan.predicted.device_count_error(len(plan.devices), "predicted")):
        raise PlanError(message, "the prediction must be of this plan: re-run `pplan partition` or drop `predicted`")
    if plan.search is not None and (message := plan.search.layer_count_error(plan.stages[-1].layers[1], "search")):
        raise PlanError(message, "the search must be of this plan: re-run `pplan partition` or drop `search`")


def _check_stages(plan: Plan, n_layers: int | None) -> None:
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


def _check_device_use(plan: Plan) -> None:
    """Every device runs the same number of stages; several per device need a multi-chunk schedule."""
    n_dev = len(plan.devices)
    if len(plan.stages) % n_dev:
        raise PlanError(f"{len(plan.stages)} stages cannot be spread evenly over {n_dev} devices", "give every device the same number of stages")
    v = len(plan.stages) // n_dev
    runs = Counter(st.device for st in plan.stages)
    uneven = next((dev for dev in range(n_dev) if runs[dev] != v), None)
    if uneven is not None:  # names one device: a listing of every stage's device may be 4,000 long
        raise PlanError(f"device {uneven} runs {runs[uneven]} stage(s), but each of the {n_dev} devices must run {v}",
                        "give every device the same number of stages")
    if v > 1:
        if not get_schedule(plan.schedule).multi_chunk:
            multi = [spec.name for spec in map(get_schedule, SCHEDULE_NAMES) if spec.multi_chunk]
            raise PlanError(f"{v} stages per device needs a schedule that runs several chunks per device ({', '.join(multi)}), not {plan.schedule!r}")
        order = [plan.stages[s].device for s in range(len(plan.stages))]
        first_round = order[:n_dev]
        off = next((s for s in range(len(order)) if order[s] != first_round[s % n_dev]), None)
        if off is not None:
            raise PlanError(f"interleaved stages must loop over the devices in one fixed order: stage {off} runs on device "
                            f"{order[off]}, stage {off % n_dev} on device {first_round[off % n_dev]}",
                            "stage s runs on the device of stage s mod the device count")
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


def records_mismatch(plan: Plan, records: tuple[object, ...] | None = None) -> str | None:
    """None when the plan's recorded `predicted` and `search` (or `records`, when given: ones not yet in
    the plan), when present, were made for the plan as
    it is; else what they were made for, in words ("schedule 'zb' (the plan has 'gpipe')"). A plan edited
    by hand keeps the numbers of the plan it was, which no report may show as its own. What the records
    hold is compared: schedule, micro-batch count and size. This is the check of files written before
    `predicted.made_for` (planner.plan.digest), which sees every other edit; for them a prediction of
    more devices than the plan has is refused by validate_plan."""
    wanted = {"schedule": plan.schedule, "n_microbatches": plan.n_microbatches, "micro_batch_size": plan.micro_batch_size}
    for record in records if records is not None else (plan.predicted, plan.search):
        for name, value in wanted.items():
            made_for = getattr(record, name, None) if record is not None else None
            if made_for is not None and made_for != value:
                return f"{name} {made_for!r} (the plan has {value!r})"
    return None


def profile_change(plan: Plan, profile: Profile) -> str | None:
    """None unless `profile` is not the file the plan was made from (both record a sha256 and they
    differ); then the warning's words, one line, that every command simulating the pair shows."""
    if not (plan.profile_sha256 and profile.sha256 and plan.profile_sha256 != profile.sha256):
        return None
    where = profile.path or "the profile"
    return f"{where} differs from the profile the plan was made from (checksum changed)"
