"""`partition(profile, settings)`: validate, search, pick, and build the plan with its evidence.

The plan records the simulator's prediction for the chosen candidate and, under `search`,
how it was chosen: the method and solver, the runners-up (best few (schedule, M) by simulated
time, feasible or not), and every baseline's best simulated plan with its feasibility. Nothing
time- or machine-dependent is recorded, so the same inputs give a byte-identical plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from planner.calibration import Calibration, links_described, links_given_win
from planner.cost import optimizer_factor
from planner.errors import ClusterError, PplanError, ProfileError, ScheduleError
from planner.limits import MAX_LAYER_BYTES, MAX_LAYER_MS, check_global_batch, check_time_limit
from planner.partition.diagnose import infeasible_error
from planner.partition.problem import RECOMPUTE_MODES
from planner.partition.search import (
    METHODS, Candidate, divisors, PartitionSettings, Search, device_orders, grid_points, run_search,
)
from planner.plan import AtPlanSetting, BaselineRow, Device, Links, Plan, SearchRecord, SearchRow
from planner.profiling.profile import Profile
from planner.schedules import SCHEDULE_NAMES, check_sizes, get_schedule
from planner.simulate import check_action_count

__all__ = ["PartitionResult", "partition", "resolve_devices", "validate_settings", "RUNNERS_UP"]

RUNNERS_UP = 6


@dataclass(frozen=True)
class PartitionResult:
    """The chosen plan and the search behind it."""

    plan: Plan
    """The plan, with `predicted` and `search` filled."""
    chosen: Candidate
    """The candidate the plan was made from."""
    search: Search
    """Every candidate evaluated."""
    profile: Profile
    """The profile planned for."""


def resolve_devices(settings: PartitionSettings) -> tuple[tuple[Device, ...], Links]:
    """Devices and links from the cluster file, or n identical devices."""
    if settings.cluster is not None:
        devices = settings.cluster.devices(settings.memory_bytes)
        if settings.n_devices is not None and settings.n_devices != len(devices):
            raise ClusterError(f"--devices {settings.n_devices} but the cluster {settings.cluster.source} has {len(devices)} devices",
                               "omit --devices to use every device of the cluster, or edit the cluster file")
        return devices, settings.cluster.links(settings.bandwidth, settings.latency_ms)
    n = settings.n_devices or 0
    devices = tuple(Device(name=f"dev{i}", memory_bytes=settings.memory_bytes) for i in range(n))
    return devices, Links(bandwidth_bytes_per_s=settings.bandwidth, latency_ms=settings.latency_ms)


# A profile built in code never met the CSV reader's bounds (planner.profiling.csvio): the same ones, checked here.
_LIMITS = {**dict.fromkeys(("fwd_ms", "bwd_ms", "bwd_input_ms", "bwd_weight_ms", "optimizer_ms"), MAX_LAYER_MS),
           **dict.fromkeys(("param_bytes", "activation_bytes", "output_bytes"), MAX_LAYER_BYTES)}


def _check_magnitudes(profile: Profile) -> None:
    """Refuse values no device has (they would overflow the planner's sums into inf/nan), and
    a profile without any compute time (there would be nothing to balance or to predict)."""
    total = (profile.columns["fwd_ms"] + profile.columns["bwd_ms"]).sum(axis=0)
    if not np.all(total > 0):
        raise ProfileError(f"{profile.path or 'profile'}: every layer has fwd_ms = bwd_ms = 0 at micro_batch_size "
                           f"{profile.micro_batch_sizes[int(np.argmin(total))]}", "profile the model again; times must be measured")
    for column, limit in _LIMITS.items():
        data = profile.columns[column]
        bad = np.argwhere(data > limit)
        if bad.size:
            layer, k = (int(x) for x in bad[0])
            raise ProfileError(f"{profile.path or 'profile'}: layer {layer} ({profile.names[layer]}) has {column}={data[layer, k]:.3g} "
                               f"at micro_batch_size {profile.micro_batch_sizes[k]}: too large for any device (limit {limit:.0e})",
                               "check the profile's units (ms and bytes)")


def validate_settings(profile: Profile, settings: PartitionSettings) -> None:
    """Raise a one-line PplanError for anything the search cannot start with."""
    _check_magnitudes(profile)
    L = profile.n_layers
    n = settings.n_devices
    if settings.cluster is None and (n is None or n < 1):
        raise PplanError(f"--devices must be at least 1, got {n}", "give the number of pipeline devices, e.g. --devices 4")
    if settings.cluster is not None and n is not None and n < 1:
        raise PplanError(f"--devices must be at least 1, got {n}")
    count = n if n is not None else len(settings.cluster.graph) if settings.cluster is not None else 0
    if count > L == 1:  # "use --devices 1 or fewer" would hide why: the model came out as one layer
        raise PplanError(f"{count} devices but the profile has 1 layer: there is no cut to place",
                         "plan it with --devices 1, or profile a model whose forward calls its submodules, each then a "
                         "layer (docs/models.md, 'A wrapper over a model's submodules')")
    if count > L:
        fewer = (f"use a cluster file with {L} devices or fewer (--cluster {settings.cluster.source} lists {count})"
                 if settings.cluster is not None else f"use --devices {L} or fewer")
        raise PplanError(f"{count} devices but the profile has only {L} layers", f"{fewer}; each stage needs a layer")
    check_global_batch(settings.global_batch)
    m = settings.microbatches
    if m is not None:
        if m < 1:
            raise PplanError(f"--microbatches must be at least 1 or auto, got {m}")
        if settings.global_batch % m:
            ok = ",".join(str(d) for d in divisors(settings.global_batch))
            raise PplanError(f"global batch {settings.global_batch} is not divisible by --microbatches {m}",
                             f"use one of {ok[:120]} or --microbatches auto")
    if settings.schedule != "auto" and settings.schedule not in SCHEDULE_NAMES:
        raise ScheduleError(f"unknown schedule {settings.schedule!r}", f"use auto or one of {', '.join(SCHEDULE_NAMES)}")
    if settings.method not in METHODS:
        raise PplanError(f"unknown method {settings.method!r}", f"use one of {', '.join(METHODS)}")
    if settings.recompute not in RECOMPUTE_MODES:
        raise PplanError(f"unknown recompute mode {settings.recompute!r}", f"use one of {', '.join(RECOMPUTE_MODES)}")
    optimizer_factor(settings.optimizer)
    check_time_limit(settings.time_limit)
    v = get_schedule(settings.schedule).virtual_stages if settings.schedule != "auto" else 1
    if v > 1 and count * v > L:
        raise PplanError(f"{settings.schedule} needs {v} stages per device ({count * v}) but the model has {L} layers",
                         f"use --devices {L // v} or fewer, or another schedule")


def partition(profile: Profile, settings: PartitionSettings, calibration: Calibration | None = None,
              on_step: Callable[[str], None] | None = None) -> PartitionResult:
    """Search and return the fastest plan that fits; InfeasibleError (with a fix) when none does.
    Links the settings describe win over the calibration's measured link (links_given_win)."""
    validate_settings(profile, settings)
    devices, links = resolve_devices(settings)
    calibration = links_given_win(calibration, *links_described(links))
    points, skipped = grid_points(settings, len(devices), profile.n_layers)
    if not points:
        if settings.schedule != "auto" and settings.microbatches:
            v = get_schedule(settings.schedule).virtual_stages
            check_sizes(settings.schedule, len(devices), settings.microbatches, v)
            check_action_count(settings.schedule, len(devices) * v, settings.microbatches)
        wider = " and ".join(f"{flag} auto" for flag, forced in (("--schedule", settings.schedule != "auto"),
                                                                 ("--microbatches", bool(settings.microbatches))) if forced)
        raise ScheduleError(f"no schedule can run at these sizes: {skipped[0] if skipped else 'nothing to try'}",
                            f"try {wider or 'another global batch or device count'}")
    search = run_search(profile, settings, devices, links, calibration, on_step)
    chosen = search.best()
    if chosen is None or not chosen.fits:
        _refuse_an_ilp_that_ran_out_of_time(settings, search)
        raise infeasible_error(profile, settings, devices, links, device_orders(profile, settings, devices, links), calibration)
    plan = _plan(profile, settings, chosen, search, links)
    return PartitionResult(plan=plan, chosen=chosen, search=search, profile=profile)


def _refuse_an_ilp_that_ran_out_of_time(settings: PartitionSettings, search: Search) -> None:
    """--method ilp found nothing that fits, yet the exact DP (run beside it on every problem) did: the
    ILP ran out of its time limit, which is no memory problem, so the memory advice would mislead."""
    dp = search.best(("dp",))
    if settings.method == "ilp" and dp is not None and dp.fits:
        raise PplanError(f"the ILP found no plan within --time-limit {settings.time_limit:g} s, though one fits "
                         f"(the DP's: {dp.point.schedule}, {dp.point.n_microbatches} micro-batches, "
                         f"{dp.sim.iteration_ms:.2f} ms)", "raise --time-limit, or use --method dp (exact, and faster)")


def _seed(profile: Profile) -> int:
    try:
        return int(profile.meta.get("seed", 0) or 0)
    except ValueError:
        raise PplanError(f"profile metadata 'seed: {profile.meta.get('seed')}' is not an integer") from None


def _row(c: Candidate, chosen: Candidate) -> dict[str, Any]:
    """The search-row fields of candidate `c` (iteration time, memory, cuts) next to the chosen one."""
    row: dict[str, Any] = {
        "method": c.method,
        "polish_moves": c.polished,
        "schedule": c.point.schedule,
        "n_microbatches": c.point.n_microbatches,
        "micro_batch_size": c.point.micro_batch_size,
        "fits": c.fits,
        "iteration_ms": c.sim.iteration_ms if c.sim else None,
        "bubble_fraction": c.sim.bubble_fraction if c.sim else None,
        "bottleneck_ms": c.bottleneck_ms if c.stage_ms else None,
        "peak_memory_bytes": int(max(c.sim.peak_memory_bytes)) if c.sim else None,
        "slowdown_vs_plan": (c.sim.iteration_ms / chosen.sim.iteration_ms) if c.sim and chosen.sim and chosen.sim.iteration_ms > 0 else None,
    }
    if c.stages is not None:
        row["cuts"] = tuple(st.layers[0] for st in c.stages) + (c.stages[-1].layers[1],)
    if c.note and not c.fits:
        row["note"] = c.note
    return row


def search_row(c: Candidate, chosen: Candidate) -> SearchRow:
    """Candidate `c` as a row of the plan's search record (a runner-up)."""
    return SearchRow(**_row(c, chosen))


def runners_up(search: Search, chosen: Candidate, n: int = RUNNERS_UP) -> list[Candidate]:
    """Best candidate per (schedule, M) from the plan's pool, best first, `n` of them."""
    seen, out = set(), []
    for c in search.candidates:  # already sorted best first
        key = (c.point.schedule, c.point.n_microbatches)
        if c.origin not in search.pool or key in seen:
            continue
        seen.add(key)
        out.append(c)
    return out[:n]


def baseline_rows(search: Search, chosen: Candidate) -> list[BaselineRow]:
    """Per method other than the plan's: its best simulated candidate, and at the plan's point."""
    rows = []
    for method in ("dp", "ilp", "uniform", "params", "time"):
        mine = [c for c in search.candidates if c.method == method]
        if not mine or method == chosen.origin:
            continue
        best = min(mine, key=lambda c: (not c.fits, c.iteration_ms if c.fits else c.peak_over_limit))
        same = next((c for c in mine if c.point == chosen.point), None)
        at = None if same is None else AtPlanSetting(
            fits=same.fits, iteration_ms=same.sim.iteration_ms if same.sim else None,
            peak_memory_bytes=int(max(same.sim.peak_memory_bytes)) if same.sim else None,
        )
        rows.append(BaselineRow(**_row(best, chosen), at_plan_setting=at))
    return rows


def _plan(profile: Profile, settings: PartitionSettings, chosen: Candidate, search: Search, links: Links) -> Plan:
    sim = chosen.sim
    if not (sim is not None and chosen.stages is not None):  # cannot happen for any input: the search always fills these
        raise RuntimeError("internal error: sim is not None and chosen.stages is not None")
    bottleneck = max(range(len(chosen.stage_ms)), key=lambda s: (chosen.stage_ms[s], -s))
    record = SearchRecord(
        method=settings.method,
        source=chosen.origin,
        polish_moves=chosen.polished,
        optimal=chosen.optimal if chosen.origin in ("dp", "ilp") else None,
        objective="min over cuts and recompute of max stage time per micro-batch (incl. recompute and sends), "
                  "then min total; per-stage memory with the schedule's in-flight count <= device limit; "
                  "candidates ranked by simulated iteration time",
        recompute=settings.recompute,
        schedule=chosen.point.schedule,
        n_microbatches=chosen.point.n_microbatches,
        micro_batch_size=chosen.point.micro_batch_size,
        device_order=tuple(chosen.layout.order),
        bottleneck_stage=bottleneck,
        stage_ms=tuple(chosen.stage_ms),
        stage_memory_bytes=tuple(int(b) for b in chosen.stage_bytes),
        calibrated=search.calibration is not None,
        candidates=tuple(search_row(c, chosen) for c in runners_up(search, chosen)),
        baselines=tuple(baseline_rows(search, chosen)),
        skipped=tuple(search.skipped),
    )
    return Plan(
        schedule=chosen.point.schedule,
        micro_batch_size=chosen.point.micro_batch_size,
        n_microbatches=chosen.point.n_microbatches,
        stages=chosen.stages,
        devices=chosen.layout.devices,
        optimizer=settings.optimizer,
        links=links,
        model=profile.meta.get("model"),
        seed=_seed(profile),
        n_layers=profile.n_layers,
        profile_path=profile.path,
        profile_sha256=profile.sha256,
        predicted=sim.prediction(),
        search=record,
    )
