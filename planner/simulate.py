"""Simulate a plan: the single source of truth for iteration time and memory over time.

    simulate(plan, profile)            -> SimResult  (costs from the profile via planner.cost)
                                          a plan with data or tensor parallelism (`parallel`
                                          dp or tp > 1, or ZeRO) simulates one replica on its
                                          hardware: planner.simulation.replica
    simulate_costs(schedule, stages, stage_device, devices, links, micro_batch_size=...)
                                       -> SimResult  (the fast core the partitioner calls)

The model (communication overlap, FIFO links, recompute, optimizer, calibration) is described
in planner.simulation.engine and docs/simulator.md.

Bounds, checked before anything is allocated: a plan of more than MAX_SIMULATED_ACTIONS
compute actions (stages x micro-batches x 2, or x 3 for zb's split backward), or of more than
MAX_TIMELINE_ACTIONS when its timeline is recorded, is refused with ScheduleError (both in
planner.limits, with what they cost); a plan whose layers all have zero forward and backward
time is refused with ProfileError (there is no iteration time, and throughput would be
infinite). `hardware` re-prices only a data/tensor-parallel plan: a one-pipeline plan's costs are
the profile's measured times, so a hardware given for one is refused (PlanError), not ignored.
Without `hardware` a data/tensor-parallel plan is priced on the values it recorded
(`parallel.hardware_spec`) and the GPUs per node it was planned for; a plan from before the
values were recorded, on the preset it names. On another hardware than the plan's, it gets that
hardware's GPUs per node (refused when they do not hold whole tensor-parallel groups), memory
limit per GPU and pipeline links (`replica_on_hardware`), its collectives, gradient sync and MFU
peak; its compute times stay the profile's (but for the kernels tensor parallelism leaves whole,
priced at its memory bandwidth: planner.cost.tensor_parallel), and an MFU above 100% (the profile faster than the
hardware's peak) is refused as `pplan partition` refuses it (planner.cost.parallel.checked_mfu).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from planner.calibration import Calibration, links_described, links_given_win
from planner.cost import StageCost, actions_per_microbatch, stage_cost
from planner.cost.held import wgrad_unmeasured_note
from planner.cost.parallel import checked_mfu, model_flops
from planner.errors import PlanError, ProfileError, ScheduleError
from planner.hardware import PRESETS, Hardware
from planner.limits import MAX_SIMULATED_ACTIONS, MAX_TIMELINE_ACTIONS
from planner.parallel import ParallelConfig
from planner.plan import Plan
from planner.profiling.profile import LayerCosts, Profile
from planner.schedules import get_schedule
from planner.simulation.engine import simulate_costs
from planner.simulation.replica import Cluster, replica_costs, replica_layout, simulate_replica
from planner.simulation.result import TIMELINE_COLUMNS, SimResult, TimelineRow

__all__ = ["simulate", "simulate_costs", "plan_stage_costs", "check_action_count", "check_hardware_applies", "is_replica_plan",
           "plan_hardware", "replica_cluster", "replica_on_hardware", "unpriced_memory_note",
           "MAX_SIMULATED_ACTIONS", "MAX_TIMELINE_ACTIONS",
           "SimResult", "TimelineRow", "TIMELINE_COLUMNS"]

# a timeline's boxes are what --json, --out, --timeline and --plot write and draw
_TIMELINE_OUTPUTS = "a timeline (what --json, --out, --timeline and --plot need)"


def check_action_count(schedule: str, n_stages: int, n_microbatches: int, timeline: bool = False) -> int:
    """The number of compute actions of a plan; ScheduleError beyond MAX_SIMULATED_ACTIONS, or
    beyond MAX_TIMELINE_ACTIONS when `timeline` (the simulation records its timeline)."""
    per = actions_per_microbatch(get_schedule(schedule).split_backward)
    n = per * n_stages * n_microbatches
    bound = MAX_TIMELINE_ACTIONS if timeline else MAX_SIMULATED_ACTIONS
    if n > bound:
        most = max(1, bound // (per * max(1, n_stages)))
        what = f" with {_TIMELINE_OUTPUTS}" if timeline else ""
        # without the outputs that need a timeline, the larger bound applies
        other = f", or leave out those outputs (bound {MAX_SIMULATED_ACTIONS:,})" if timeline and n <= MAX_SIMULATED_ACTIONS else ""
        raise ScheduleError(f"{n_stages} stages x {n_microbatches} micro-batches is {n:,} actions to simulate{what}, beyond "
                            f"the simulator's bound of {bound:,}",
                            f"use at most {most:,} micro-batches with {n_stages} stages (larger micro-batches instead){other}")
    return n


def _plan_layer_costs(plan: Plan, profile: Profile) -> LayerCosts:
    """The profile's costs at the plan's micro-batch size, once the plan is checked against it."""
    if plan.n_layers is not None and plan.n_layers != profile.n_layers:
        raise PlanError(f"plan is for {plan.n_layers} layers but the profile has {profile.n_layers}", "simulate with the profile the plan was made from (--profile)")
    plan.validate(profile.n_layers)
    costs = profile.at(plan.micro_batch_size)
    total = sum(float(costs.fwd_ms[i]) + float(costs.bwd_ms[i]) for st in plan.stages for i in range(*st.layers))
    if not total > 0:
        where = f"{profile.path!r}" if getattr(profile, "path", None) else "the profile"
        raise ProfileError(f"{where}: every layer of the plan has fwd_ms = bwd_ms = 0 at micro_batch_size "
                           f"{plan.micro_batch_size}: there is no time to simulate", "profile the model again; times must be measured")
    return costs


def plan_stage_costs(plan: Plan, profile: Profile) -> tuple[list[StageCost], bool]:
    """(per-stage costs at the plan's micro-batch size and device speeds, interpolated?)."""
    costs = _plan_layer_costs(plan, profile)
    stages = [
        stage_cost(costs, st.layers[0], st.layers[1], st.recompute, plan.optimizer, plan.devices[st.device].speed,
                   plan.n_microbatches)
        for st in plan.stages
    ]
    return stages, costs.interpolated


def simulate(plan: Plan, profile: Profile, *, calibration: Calibration | None = None,
             record_timeline: bool = True, hardware: Hardware | None = None) -> SimResult:
    """Simulate one training iteration of `plan` with costs from `profile`.

    The micro-batch size selects the profile's rows (interpolated if not measured: the result's
    `interpolated` says so). ScheduleError if the schedule cannot run at the plan's sizes.
    A data/tensor-parallel plan is priced on `hardware` (default: the one the plan names). Links the
    plan describes win over the calibration's measured link (links_given_win), as when it was partitioned.
    """
    check_action_count(plan.schedule, plan.n_stages, plan.n_microbatches, timeline=record_timeline)
    calibration = links_given_win(calibration, *links_described(plan.links))
    if is_replica_plan(plan):
        return _simulate_replica_plan(plan, profile, calibration, record_timeline, hardware)
    check_hardware_applies(plan, hardware)
    stages, interpolated = plan_stage_costs(plan, profile)
    schedule = plan.pipeline_schedule()
    return simulate_costs(
        schedule, stages, [st.device for st in plan.stages], plan.devices, plan.links,
        micro_batch_size=plan.micro_batch_size, calibration=calibration,
        record_timeline=record_timeline, interpolated=interpolated,
    )


def unpriced_memory_note(plan: Plan, profile: Profile, schedules: Iterable[str] = ()) -> str | None:
    """The one line a command shows when the profile cannot price what `plan` (or a sweep's other
    `schedules`) holds: zero-bubble or interleaved memory from a profile without wgrad_bytes; None otherwise."""
    costs = profile.at(plan.micro_batch_size)
    own = get_schedule(plan.schedule)
    note = wgrad_unmeasured_note(costs, own.split_backward, own.holds_sends)
    if note is not None:
        return note
    others = sorted({name for name in schedules if name != plan.schedule})
    specs = [get_schedule(name) for name in others]
    unpriced = [name for name, s in zip(others, specs) if s.split_backward or s.holds_sends]
    return wgrad_unmeasured_note(costs, any(s.split_backward for s in specs), any(s.holds_sends for s in specs),
                                 subject=f"the memory shown for {' and '.join(unpriced)}") if unpriced else None


def is_replica_plan(plan: Plan) -> bool:
    """True when the plan is one replica of a data/tensor-parallel (or ZeRO) layout."""
    cfg = plan.parallel
    return cfg is not None and (cfg.dp > 1 or cfg.tp > 1 or cfg.zero > 0)


def check_hardware_applies(plan: Plan, hardware: Hardware | None) -> None:
    """PlanError when `hardware` is given for a one-pipeline plan: only a data/tensor-parallel plan
    is priced on a hardware; a pipeline's costs are its profile's times, which a preset cannot re-price."""
    if hardware is not None and not is_replica_plan(plan) and plan.parallel is not None:
        # `partition --nodes` chose dp = tp = 1: one pipeline, its costs the profile's times on the
        # hardware it was planned for (an analytic profile is per GPU: another GPU needs another profile)
        made_for = f", planned for {plan.parallel.hardware[:60]!r}" if plan.parallel.hardware else ""
        raise PlanError(f"--hardware {hardware.name[:60]!r} cannot re-price this plan: its layout "
                        f"{plan.parallel.describe()} is one pipeline of {plan.n_devices} devices{made_for}, costed by "
                        "its profile's times",
                        f"re-profile with `pplan profile --analytic --hardware {hardware.name[:60]}` and re-plan "
                        "with `pplan partition --nodes N`, or drop --hardware")
    if hardware is not None and not is_replica_plan(plan):
        raise PlanError(f"--hardware {hardware.name[:60]!r} prices only data/tensor-parallel plans; this plan is one pipeline "
                        f"of {plan.n_devices} devices, costed by its profile's measured times",
                        "drop --hardware (a preset does not re-price a measured profile), or plan for it with "
                        "pplan partition --nodes N --hardware NAME")


def plan_hardware(plan: Plan, hardware: Hardware | None = None) -> Hardware:
    """The hardware a data/tensor-parallel plan is priced on: `hardware`, else the values it
    recorded, else (a plan written before it recorded them) the preset it names."""
    if hardware is not None:
        return hardware
    if plan.parallel is not None and plan.parallel.hardware_spec is not None:
        return plan.parallel.hardware_spec
    name = (plan.parallel.hardware if plan.parallel is not None else None) or (plan.predicted.hardware if plan.predicted else None)
    if name is None:
        raise PlanError(f"plan uses parallel {plan.parallel.describe() if plan.parallel else '?'} but does not say which "
                        "hardware it is for", "give it with --hardware NAME (see `pplan hardware`) or a hardware JSON file")
    # a plan may come from someone else: it names a preset, never a file this command would open
    if name not in PRESETS:
        raise PlanError(f"plan was made for hardware {name[:60]!r}, which is not a preset",
                        "give its file with --hardware FILE.json (presets: `pplan hardware`)")
    return PRESETS[name]


def replica_on_hardware(plan: Plan, hardware: Hardware) -> Plan:
    """`plan`, one replica of a data/tensor-parallel plan, on `hardware`'s nodes: its GPUs per
    node, each GPU's memory limit and the pipeline links it gives (as the 3-D search builds them:
    replica_layout), `parallel.hardware` its name and `hardware_spec` its values. A plan whose own
    hardware is `hardware` (the values it recorded or, in an older plan, the preset it names; every
    value alike but the source text) is returned as it is: its devices, links (hand edits,
    --bandwidth and --latency included) and GPUs per node (--gpus-per-node) are what was planned.
    A hardware file that only shares the preset's name (a copy with other values) re-prices.
    PlanError when `hardware`'s nodes cannot hold the plan's tensor-parallel groups."""
    cfg = plan.parallel
    if cfg is None or _same_values(cfg.hardware_spec or PRESETS.get(cfg.hardware or ""), hardware):
        return plan
    gpn = _whole_tp_groups(cfg, hardware.gpus_per_node, f"--hardware {hardware.name[:60]!r}",
                           "re-plan for it with `pplan partition --nodes N --hardware FILE`")
    cfg = replace(cfg, hardware=hardware.name, hardware_spec=hardware, gpus_per_node=gpn)
    devices, links = replica_layout(cfg, hardware.memory_bytes, Cluster(hardware, gpn))
    return plan.with_(devices=devices, links=links, parallel=cfg)


def replica_cluster(plan: Plan, hardware: Hardware) -> Cluster:
    """The cluster one replica of data/tensor-parallel `plan` is priced on: `hardware`'s GPUs, the
    plan's GPUs per node (the hardware's when it records none) and its recorded way of syncing
    gradients (pplan simulate and run alike)."""
    cfg = plan.parallel
    gpn = cfg.gpus_per_node or _whole_tp_groups(cfg, hardware.gpus_per_node, f"the plan's hardware {hardware.name[:60]!r}",
                                                "record the GPUs per node in the plan (parallel.gpus_per_node) or re-plan")
    return Cluster(hardware, int(gpn), overlap_grad_sync=cfg.overlaps_grad_sync)


def _same_values(recorded: Hardware | None, hardware: Hardware) -> bool:
    """Whether `hardware` is the plan's own (`recorded`), its source text aside (a comment, not a value)."""
    return recorded is not None and replace(recorded, source=hardware.source) == hardware


def _whole_tp_groups(cfg: ParallelConfig, gpus_per_node: int, whose: str, remedy: str) -> int:
    """`gpus_per_node` when a node holds whole tensor-parallel groups of `cfg` (tp stays within one
    node, planner.cost.collectives.placement); PlanError naming `whose` nodes otherwise."""
    if gpus_per_node % cfg.tp:
        raise PlanError(f"{whose} has {gpus_per_node} GPUs per node, which the plan's tp={cfg.tp} ({cfg.describe()}) "
                        "does not divide: tensor parallelism stays within a node",
                        f"use hardware whose gpus_per_node is a multiple of {cfg.tp}, or {remedy}")
    return gpus_per_node


def _simulate_replica_plan(plan: Plan, profile: Profile, calibration: Calibration | None, record_timeline: bool,
                           hardware: Hardware | None) -> SimResult:
    cfg = plan.parallel
    if calibration is not None:
        # a calibration fits one pipeline measured on this machine; a cluster plan's costs are
        # for GPUs the profile describes (measured there or analytic)
        raise PlanError(f"a calibration cannot apply to a plan with parallel {cfg.describe()}",
                        "simulate it with --calibration none")
    if cfg.pp != plan.n_devices:
        raise PlanError(f"plan has {plan.n_devices} devices but parallel pp={cfg.pp}", "each pipeline device is one pp rank")
    raw = _plan_layer_costs(plan, profile)
    hw = plan_hardware(plan, hardware)
    if hardware is not None:
        plan = replica_on_hardware(plan, hardware)
        cfg = plan.parallel
    cluster = replica_cluster(plan, hw)
    flops = model_flops(profile, plan.global_batch)
    sim = simulate_replica(
        plan.pipeline_schedule(),
        replica_costs(raw, profile.names, cfg, cluster), plan.cuts, [st.recompute for st in plan.stages], cfg, cluster,
        flops, devices=plan.devices, links=plan.links,
        stage_device=[st.device for st in plan.stages], micro_batch_size=plan.micro_batch_size,
        record_timeline=record_timeline, interpolated=raw.interpolated,
    )
    checked_mfu(sim.replica.mfu, hw.peak_flops_per_s(flops.dtype), hw.name)
    return sim
