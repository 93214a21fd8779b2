"""Fit a Calibration from a measured run: what the profile cannot see.

  compute_scale, action_overhead_ms   least squares of measured = scale x profiled + overhead x
                                      actions over every (stage, kind) median action time of the
                                      run (B/I with their recompute; a split backward's I + W as one
                                      point of two actions, because torch runs stage 0's whole
                                      backward in its W), so that times made by the simulator's
                                      model (planner.cost.action_ms: each action pays the overhead)
                                      give back its scale and overhead
  comm_bandwidth_bytes_per_s          from the ping-pong between neighbouring ranks (median over
                                      pairs); kept from the previous calibration when not measured
  comm_latency_ms                     median of the measured hand-over gaps (sender's end to the
                                      waiting receiver's start, minus bytes / bandwidth); the
                                      ping-pong's when the run has none (one rank, several hosts)
  step_overhead_ms                    what is left: measured - simulated with the above (>= 0);
                                      the optimizer step and per-step bookkeeping land here

What a rank of a run is expected to do, for the run's comparisons: `run_stage_costs` (each
stage's cost on one rank; a data/tensor-parallel plan's one-GPU share, as `pplan simulate`
prices it), `compute_ratio` (its actions' measured over predicted times) and
`rank_grad_allreduce_ms` (the slowest rank's gradient all-reduce).
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from planner.calibration import MAX_OVERHEAD_MS, Calibration, FittedFrom
from planner.cost import compute_terms, scaled_ms
from planner.cost.comm import ms_per_byte
from planner.errors import PlanError, PplanError
from planner.execute.fitrecord import CalibrationFit, ComputePoint, as_recorded, calibration_values
from planner.execute.results import error_pct
from planner.execute.planmatch import check_run_of_plan
from planner.execute.runrecord import RUN_FILE_HINT, RunRecord
from planner.plan import Plan
from planner.profiling.profile import Profile

if TYPE_CHECKING:
    from planner.cost import StageCost
    from planner.cost.parallel import Link2, TrainingPrecision

__all__ = ["compute_points", "point_actions", "point_predicted_ms", "compute_ratio", "fit_compute",
           "check_calibratable", "check_fit_inputs", "fit_from_run", "Refit", "refit_from_run_file", "calibrate_from_run_file",
           "run_stage_costs", "rank_grad_allreduce_ms"]


@dataclass(frozen=True)
class _ReplicaPricing:
    """A data/tensor-parallel plan's stages priced for one GPU, as planner.simulate prices them."""

    stages: list[StageCost]
    """Per stage: compute / tp with the tensor-parallel collectives, param_bytes per GPU."""
    dp_link: Link2
    """The link the data-parallel gradient sync runs over."""
    precision: TrainingPrecision
    """Bytes per parameter of weights and gradients (the profile's dtype)."""


def _replica_pricing(plan: Plan, profile: Profile) -> _ReplicaPricing | None:
    """The plan's stages as `pplan simulate` prices one replica (planner.simulate's replica path:
    the same hardware, cluster, costs and precision); None for a one-pipeline plan, and for a
    data/tensor-parallel plan whose hardware is no preset (simulate cannot price it either)."""
    from planner.cost.parallel import model_flops
    from planner.simulate import is_replica_plan, plan_hardware, replica_cluster
    from planner.simulation.replica import replica_costs, replica_stages

    if not is_replica_plan(plan):
        return None
    try:
        hw = plan_hardware(plan)
    except PlanError:
        return None
    cfg = plan.parallel
    cluster = replica_cluster(plan, hw)
    precision = model_flops(profile, plan.global_batch).precision
    costs = replica_costs(profile.at(plan.micro_batch_size), profile.names, cfg, cluster)
    stages = replica_stages(costs, plan.cuts, [st.recompute for st in plan.stages], cfg, cluster, precision,
                            plan.n_microbatches)
    return _ReplicaPricing(stages=stages, dp_link=cluster.placement(cfg).dp, precision=precision)


def run_stage_costs(plan: Plan, profile: Profile) -> list[StageCost]:
    """Each stage's cost on one rank of a run of `plan`: the profile's (planner.simulate's
    plan_stage_costs) for one pipeline; for a data/tensor-parallel plan on a preset, one GPU's
    share as `pplan simulate` prices it (block compute / tp, the tensor-parallel all-reduces
    inside F and B, as the run's tp ranks do them)."""
    from planner.simulate import plan_stage_costs

    replica = _replica_pricing(plan, profile)
    return replica.stages if replica is not None else plan_stage_costs(plan, profile)[0]


def rank_grad_allreduce_ms(plan: Plan, profile: Profile) -> float | None:
    """The slowest rank's gradient sync over the plan's dp replicas, priced as the simulator prices
    a stage's (planner.cost.parallel.grad_sync_ms on the same link), but of all the rank's
    stages at once: a rank all-reduces every gradient it holds in one buffer
    (planner.execute.pipeline's sync_gradients), so an interleaved rank's stages count together,
    in one sync with one set of latencies (the simulator prices each stage's sync on its own).
    None with dp = 1, or when the plan's hardware is no preset."""
    from planner.cost.parallel import grad_sync_ms

    replica = _replica_pricing(plan, profile) if plan.dp > 1 else None
    if replica is None:
        return None
    per_rank: dict[int, float] = {}
    for plan_stage, cost in zip(plan.stages, replica.stages):
        per_rank[plan_stage.device] = per_rank.get(plan_stage.device, 0.0) + cost.param_bytes
    to_grad = replica.precision.grad_bytes / replica.precision.element_bytes  # as replica_stages converts
    return max(grad_sync_ms(b * to_grad, plan.dp, plan.parallel.zero, replica.dp_link) for b in per_rank.values())


def compute_points(ranks: Iterable[tuple[Sequence[int], Mapping[str, float]]], plan: Plan,
                   profile: Profile) -> list[tuple[float, float, str]]:
    """(profiled ms, measured ms, label) for every stage and action kind the run measured; `ranks`:
    each rank's stages (stages of `plan`) and its median action times ('0F' -> ms). Profiled: as
    one rank does the action (run_stage_costs: a tensor-parallel rank's share with its collectives)."""
    stages = run_stage_costs(plan, profile)
    points = []
    for rank_stages, acts in ranks:
        for s in rank_stages:
            st = stages[s]
            if f"{s}F" in acts:
                points.append((st.fwd_ms, acts[f"{s}F"], f"{s}F"))
            if f"{s}B" in acts:
                points.append((st.bwd_ms, acts[f"{s}B"], f"{s}B"))
            if f"{s}I" in acts and f"{s}W" in acts:
                points.append((st.bwd_input_ms + st.bwd_weight_ms, acts[f"{s}I"] + acts[f"{s}W"], f"{s}I+W"))
    return [p for p in points if p[0] > 0]


def point_actions(label: str) -> int:
    """How many compute actions the measured time of a point spans: one ('0F', '1B'), or two for a
    split backward's '2I+W'. The simulator charges action_overhead_ms to each of them."""
    return label.count("+") + 1


def point_predicted_ms(profiled_ms: float, label: str, calibration: Calibration | None) -> float:
    """The calibrated time of a point as the simulator prices it: planner.cost.action_ms summed over
    the point's actions (scale x their profiled time + the overhead once per action)."""
    return scaled_ms(profiled_ms, calibration) + point_actions(label) * compute_terms(calibration)[1]


def compute_ratio(ranks: Iterable[tuple[Sequence[int], Mapping[str, float]]], plan: Plan, profile: Profile,
                  calibration: Calibration | None) -> float | None:
    """Median over the run's (stage, kind) points (compute_points of `ranks`) of measured / predicted
    time, the calibration applied as the simulator applies it (point_predicted_ms); None when no
    point can be compared (a run of other stages than the plan's, no action measured)."""
    try:
        points = compute_points(ranks, plan, profile)
    except (PplanError, KeyError, IndexError, ValueError):
        return None
    ratios = [measured / expected for profiled, measured, label in points
              if (expected := point_predicted_ms(profiled, label, calibration)) > 0 and math.isfinite(measured)]
    return statistics.median(ratios) if ratios else None


def fit_compute(points: list[tuple[float, float, str]]) -> tuple[float, float]:
    """(scale, overhead ms per action) minimising the squared error of measured vs scale x profiled +
    overhead x actions (point_actions of each label), the simulator's model (point_predicted_ms).
    With one action per point (F and B) that is the straight line through the points."""
    if not points:
        raise PplanError("the run measured no compute actions to calibrate from", "run at least one step after --warmup")
    xs = [p for p, _, _ in points]
    ys = [m for _, m, _ in points]
    ns = [float(point_actions(label)) for _, _, label in points]
    # normal equations of the two regressors (profiled ms, actions); the actions column stands for
    # the intercept of a straight line, which it is when every point is one action
    sxx = sum(x * x for x in xs)
    sxn = sum(x * n for x, n in zip(xs, ns))
    snn = sum(n * n for n in ns)
    sxy = sum(x * y for x, y in zip(xs, ys))
    sny = sum(n * y for n, y in zip(ns, ys))
    det = sxx * snn - sxn * sxn  # 0 when profiled time is proportional to actions (one point, equal points)
    if len(points) >= 2 and det > 1e-12 * sxx * snn:
        scale = (sxy * snn - sxn * sny) / det
        overhead = (sxx * sny - sxn * sxy) / det
        if scale > 0 and overhead >= 0:
            return scale, overhead
    # Through the origin when a free fit is impossible or unphysical (negative overhead).
    scale = sxy / sxx
    if scale <= 0:
        scale = statistics.median(y / x for x, y in zip(xs, ys))
    return max(scale, 1e-6), 0.0


def check_calibratable(plan: Plan) -> None:
    """PplanError for a data/tensor-parallel (or ZeRO) plan: a calibration fits one pipeline of
    whole, unsharded layers, and the simulator applies none to such a plan (planner.simulate)."""
    from planner.simulate import is_replica_plan

    if is_replica_plan(plan):
        raise PplanError(f"a calibration cannot be fitted on a plan with parallel {plan.parallel.describe()}: it fits "
                         "one pipeline of whole, unsharded layers, and pplan simulate applies none to such a plan",
                         'calibrate on the plan without its "parallel" object (one pipeline), then run this one')


def check_fit_inputs(run: RunRecord, plan: Plan, source: str | None = None) -> None:
    """Refuse, before any work, a run the fit cannot read as `plan`'s: a run of this plan
    (planner.execute.planmatch, the check `pplan report` makes too), a timed step, and finite times
    >= 0 in the actions and ping-pongs (a file someone edited; planner.execute.runfile has checked its
    keys, types and ranges, the hand-over gaps' included). `source` (the file) leads each message."""
    def bad(message: str, hint: str = RUN_FILE_HINT) -> PplanError:
        return PplanError(f"{source}: {message}" if source else message, hint)

    check_calibratable(plan)
    check_run_of_plan(run, plan, source)

    def ms(value: Any, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise bad(f"{where} is {str(value)[:40]!r}, not a finite number >= 0")

    measured = run.iteration_ms_measured
    if measured is None or not measured > 0:
        raise bad(f"iteration_ms_measured is {measured!r}, not a positive time", "give the run of a plan that timed a step")
    if measured > MAX_OVERHEAD_MS:  # what the simulation leaves of it becomes step_overhead_ms
        raise bad(f"iteration_ms_measured is {measured:g}, more than a day ({MAX_OVERHEAD_MS:g} ms)")
    for i, rank in enumerate(run.ranks):
        for key, value in rank.action_ms.items():
            ms(value, f"ranks[{i}].action_ms[{str(key)[:20]!r}]")
    for i, c in enumerate(run.comm):
        ms(c.latency_ms, f"comm[{i}].latency_ms")
        if c.bandwidth_bytes_per_s is not None:
            ms(c.bandwidth_bytes_per_s, f"comm[{i}].bandwidth_bytes_per_s")


def fit_from_run(run: RunRecord, plan: Plan, profile: Profile, previous: Calibration | None = None,
                 run_path: str | None = None, *, calibration_path: str) -> tuple[Calibration, CalibrationFit]:
    """(new calibration, what was fitted: the error before and after) for `run` of `plan`;
    `calibration_path` is where the caller writes the calibration (the fit records it)."""
    from planner.simulate import simulate

    check_fit_inputs(run, plan, run_path)
    measured = float(run.iteration_ms_measured)
    prev = previous or Calibration()
    before = simulate(plan, profile, calibration=prev, record_timeline=False).iteration_ms
    points = compute_points([(r.stages, r.action_ms) for r in run.ranks], plan, profile)
    scale, overhead = fit_compute(points)
    comm = run.comm
    lat = prev.comm_latency_ms
    bw = prev.comm_bandwidth_bytes_per_s
    if comm:
        lat = statistics.median(c.latency_ms for c in comm)
        bws = [c.bandwidth_bytes_per_s for c in comm if c.bandwidth_bytes_per_s]
        bw = statistics.median(bws) if bws else bw
    # a negative gap is no wait: the mark of a run written before timeline.transfer_gaps was fixed,
    # whose other backward gaps may be too short as well; the ping-pong's latency stands instead
    gaps = run.transfer_gaps if all(g >= 0 for _, g in run.transfer_gaps) else []
    if gaps:
        # What a hand-over costs inside the pipeline (waking the waiting rank included) is the
        # latency that matters; the ping-pong gives the bandwidth, which separates the two.
        per_byte = ms_per_byte(bw) if bw else 0.0
        lat = max(0.0, statistics.median(g - b * per_byte for b, g in gaps))
    # the machine's hand-over share stays: it is a cost of the transfers, which the compute fit does not see
    cal = _fitted(run_path, compute_scale=scale, action_overhead_ms=overhead, comm_latency_ms=lat,
                  comm_bandwidth_bytes_per_s=bw, step_overhead_ms=0.0, handover_cpu_ms=prev.handover_cpu_ms,
                  handover_cpu_ms_per_mib=prev.handover_cpu_ms_per_mib)
    without = simulate(plan, profile, calibration=cal, record_timeline=False).iteration_ms
    cal = _fitted(run_path, **dict(calibration_values(cal), step_overhead_ms=max(0.0, measured - without)))
    after = without + cal.step_overhead_ms
    fit = CalibrationFit(
        measured_ms=measured, predicted_ms_before=before, error_pct_before=error_pct(before, measured),
        predicted_ms_after=after, error_pct_after=error_pct(after, measured),
        compute_points=[ComputePoint(action=label, profiled_ms=p, measured_ms=m) for p, m, label in points],
        path=str(calibration_path), calibration=as_recorded(cal))
    fitted = FittedFrom(run=run_path, schedule=plan.schedule, n_ranks=plan.n_processes,
                        n_microbatches=plan.n_microbatches, measured_ms=measured,
                        error_pct_before=fit.error_pct_before, error_pct_after=fit.error_pct_after,
                        model=profile.meta.get("model") or plan.model, profile_sha256=profile.sha256)
    return replace(cal, fitted_from=fitted), fit


def _fitted(source: str | None, **values: Any) -> Calibration:
    """The Calibration of fitted values; one out of its range (a run whose actions took 10^4 x
    their profiled time) is refused as what the run gave, not as a calibration file's typo."""
    try:
        return Calibration(**values)
    except PplanError as e:
        where = f"{source}: " if source else ""
        raise PplanError(f"{where}the run's times give {e.message}",
                         "check that the run, the plan and the profile are of the same model and machine") from None


@dataclass(frozen=True)
class Refit:
    """What `pplan calibrate --from-run` fitted, and what its error "before" was measured against."""

    calibration: Calibration
    """The calibration written."""
    fit: CalibrationFit
    """The fit: its error before (with `replaced`, else the run's own calibration, else uncalibrated)
    and after; `path` the file written."""
    replaced: str | None
    """The calibration beside the profile that "before" applied and the fit rewrote; None when none
    was there (before then applies the run's own, `from_run`, else none)."""
    from_run: bool
    """No calibration was beside the profile, and "before" applied the one the run recorded it was
    predicted with (the machine file's entry), as `pplan run --calibrate` starts from it."""
    run_error_pct: float | None
    """The run's own recorded error (its prediction when it ran, `run_prediction_source`), None if it had none."""
    run_prediction_source: str | None
    """What the run predicted with (`simulate(profile)`, `simulate(profile + calibration)`, ...)."""


def refit_from_run_file(plan_path: str | os.PathLike, run_path: str | os.PathLike,
                        profile_path: str | os.PathLike | None = None, *, force: bool = False) -> Refit:
    """`pplan calibrate --from-run`: fit a calibration on a run JSON already on disk and write it
    beside the plan's profile (`profile_path` overrides the one the plan names). A profile that is
    not the file the plan was made from (its sha256 differs; `pplan run`'s preflight check) is
    refused unless `force`: the run's actions are the plan's cuts, and the fit would be recorded as
    this profile's. Every input is read and checked, and the target checked writable, before the
    fit; nothing is built or imported (no model code runs)."""
    from planner.atomic import ensure_writable_file
    from planner.calibration import calibration_path_for, resolve_calibration, write_calibration
    from planner.execute.preflight import check_profile_unchanged
    from planner.execute.runfile import load_run
    from planner.plan import load_plan, require_profile_path
    from planner.profiling.profile import load_profile

    plan = load_plan(plan_path)
    run = load_run(run_path)  # every key and value checked; what the fit needs, checked by it
    check_run_of_plan(run, plan, str(run_path), str(plan_path))  # in the words `pplan report` uses
    path = require_profile_path(plan, plan_path, profile_path)
    profile = load_profile(path)
    if not force and profile.sha256:
        check_profile_unchanged(plan, path, profile.sha256, given=profile_path is not None,
                                hint="calibrate with the profile the plan was made from, or pass --force to fit this one anyway")
    target = calibration_path_for(profile.path)
    ensure_writable_file(target, "calibration")
    previous, replaced = resolve_calibration(profile.path)  # the file beside the profile (target), if there
    # Without one, the fit starts where `pplan run --calibrate` would have: from what the run was
    # predicted with (a machine file's entry), whose hand-over terms the fit keeps; from nothing, the
    # same run refitted here lost them.
    from_run = previous is None and run.calibration is not None
    cal, fit = fit_from_run(run, plan, profile, previous=run.calibration if from_run else previous,
                            run_path=str(run_path), calibration_path=str(target))
    write_calibration(cal, target)
    return Refit(calibration=cal, fit=fit, replaced=str(replaced) if replaced is not None else None,
                 from_run=from_run, run_error_pct=run.error_pct, run_prediction_source=run.prediction_source)


def calibrate_from_run_file(plan_path: str | os.PathLike, run_path: str | os.PathLike,
                            profile_path: str | os.PathLike | None = None, *,
                            force: bool = False) -> tuple[Calibration, CalibrationFit]:
    """refit_from_run_file's (calibration written, fit; its `path` the file), for callers that
    need not say what the error before was against."""
    refit = refit_from_run_file(plan_path, run_path, profile_path, force=force)
    return refit.calibration, refit.fit
