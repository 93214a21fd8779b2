"""The run record, assembled from what the ranks measured, next to the prediction.

Definitions (docs/executor.md):
  iteration_ms_measured  median step time over the measured steps (after --warmup); a step's time
                         is the slowest rank's, barrier exit to the end of its optimizer step
  error_pct              100 x (predicted - measured) / measured
  busy_ms                a rank's F/B/I/W/R/O time in the timeline step (the measured step whose
                         time is closest to the median), as the simulator's busy_ms
  peak_memory_bytes_measured  the allocator's peak over the memory step (the last warm-up step,
                         never a fresh run's first): CUDA's caching allocator; on CPU torch's
                         allocator as torch.profiler's memory events count it from before the
                         model was built (memory_measure "cpu-allocator"). memory_measured is
                         the tracked breakdown beside it: weights + gradients + optimizer state
                         (the tensors) + peak saved activations (saved-tensor hooks) + boundary
                         buffers (the stages' receive buffers, M x (input + output), and the first stage's input batch)
  losses                 mean loss of each step in loss_steps; JSON has no inf/NaN, so a loss
                         that is not finite is written as null
  diverged               null, or {"step": k, "loss": "inf" | "-inf" | "nan"}: the first step
                         (0-based) whose loss was not finite; the run stopped after it
  step_ms_min/median/max the spread of step_ms over the measured steps; step_spread_pct is
                         100 x (max - min) / median
  peak_memory_bytes_rss  CPU: the rank's peak resident-set growth over the memory step, from the
                         kernel (independent of the cost model); rss_baseline_bytes the RSS it
                         grew from (torch and the process group, before the model)
  warnings               one line each: why this run's comparison should not be trusted
                         (spread above SPREAD_WARN_PCT, median step under SHORT_STEP_MS, machine
                         load unlike the profile's, actions slower or faster than profiled,
                         a --profile other than the plan's)

The run JSON is a `RunRecord` (ranks: `RankRecord`; planner.execute.runrecord): one frozen dataclass,
one to_dict/from_dict. This module assembles it from the ranks' RankMeasurements
(planner.execute.measurement) and the timeline (planner.execute.timeline).
"""

from __future__ import annotations

import math
import statistics

from planner.calibration import Calibration
from planner.errors import RunError
from planner.execute.measurement import RankMeasurement
from planner.execute.runrecord import Divergence, RankRecord, RunRecord
from planner.execute.timeline import measured_timeline, one_clock, replica0, transfer_gaps
from planner.execute.trust import step_spread, trust_warnings
from planner.plan import Plan, PredictedDevice, Prediction

__all__ = ["assemble_record", "error_pct"]


def error_pct(predicted: float | None, measured: float) -> float | None:
    """100 x (predicted - measured) / measured, or None without a prediction."""
    if predicted is None or not measured > 0:  # NaN (no step timed) too
        return None
    return 100.0 * (predicted - measured) / measured


def _allreduce_ms(measurements: list[RankMeasurement]) -> float | None:
    """Median over measured steps of the slowest rank's all-reduce time, or None without dp."""
    n = min((len(m.grad_allreduce_ms) for m in measurements), default=0)
    if n == 0:
        return None
    return statistics.median(max(m.grad_allreduce_ms[i] for m in measurements) for i in range(n))


def _busy(m: RankMeasurement) -> float:
    return sum(e.ms for e in m.events if e.kind in ("F", "B", "I", "W", "R", "O"))


def _losses(measurements: list[RankMeasurement]) -> tuple[dict[int, float], list[int], Divergence | None]:
    """(step -> loss, the steps in order, the divergence or None): the first step whose loss was
    not finite, else the earliest step a rank stopped at (its loss may be unknown)."""
    losses: dict[int, float] = {}
    for m in measurements:
        losses.update(m.losses)
    loss_steps = sorted(losses)
    bad = [k for k in loss_steps if not math.isfinite(losses[k])]
    stops = [m.diverged_step for m in measurements if m.diverged_step is not None]
    if not (bad or stops):
        return losses, loss_steps, None
    step = bad[0] if bad else min(stops)
    value = losses.get(step)
    return losses, loss_steps, Divergence(step=step, loss="unknown" if value is None else str(value))


def _rank_records(measurements: list[RankMeasurement], plan: Plan, prediction: Prediction | None) -> list[RankRecord]:
    """Each rank's measurements beside the prediction for the device it plays."""
    pred_devices = {d.device: d for d in (prediction.devices or ())} if prediction else {}
    ranks = []
    for m in measurements:
        pd = pred_devices.get(m.device, PredictedDevice())
        mem = m.memory
        ranks.append(RankRecord(
            rank=m.rank, device=m.device, host=m.host, stages=list(m.stages), busy_ms=_busy(m),
            busy_ms_predicted=pd.busy_ms, peak_memory_bytes_measured=mem.peak_bytes if mem else None,
            peak_memory_bytes_predicted=pd.peak_memory_bytes,
            memory_limit_bytes=plan.devices[m.device].memory_bytes, memory_measure=mem.measure if mem else None,
            memory_measured=mem.breakdown if mem else None, memory_predicted=pd.memory,
            rss_peak_bytes=mem.rss_peak_bytes if mem else None,
            peak_memory_bytes_rss=mem.rss_growth_bytes if mem else None,
            rss_baseline_bytes=mem.rss_baseline_bytes if mem else None, action_ms=m.action_ms, threads=m.threads,
            action_cpu_ms=m.action_cpu_ms, replica=m.replica,
            grad_allreduce_ms=statistics.median(m.grad_allreduce_ms) if m.grad_allreduce_ms else None))
    return ranks


def _check_reports(measurements: list[RankMeasurement], plan: Plan) -> None:
    """RunError, not an IndexError, when no rank reported or one reports a device the plan does not have."""
    if not measurements:
        raise RunError("no rank reported its measurements", "report this: the ranks' results did not reach rank 0")
    for m in measurements:
        if not 0 <= m.device < plan.n_devices:
            raise RunError(f"rank {m.rank} reported device {m.device}, but the plan has devices 0..{plan.n_devices - 1}",
                           "report this: a rank's measurements did not reach rank 0 intact")


def assemble_record(measurements: list[RankMeasurement], plan: Plan, *, plan_path: str | None, device_type: str,
                    steps: int, warmup: int, prediction: Prediction | None, prediction_source: str | None,
                    calibration: Calibration | None, load_average: float | None = None,
                    profile_load_average: float | None = None, compute_ratio: float | None = None,
                    compute_ratio_cpu: float | None = None,
                    grad_allreduce_ms_predicted: float | None = None) -> RunRecord:
    """The run record from the ranks' measurements and a prediction (docs/executor.md layout);
    `grad_allreduce_ms_predicted`: the slowest rank's gradient all-reduce as predicted (dp > 1)."""
    measurements = sorted(measurements, key=lambda m: m.rank)
    _check_reports(measurements, plan)
    r0 = measurements[0]
    step_ms = list(r0.step_ms)
    measured = list(r0.measured_steps)
    meas = statistics.median(step_ms[i] for i in measured) if measured else float("nan")
    pred = prediction.iteration_ms if prediction else None
    losses, loss_steps, diverged = _losses(measurements)
    boundary = {str(s): list(v) for m in measurements for s, v in m.boundary_bytes.items()}
    lo, med, hi, spread = step_spread(step_ms, measured)
    dp = plan.dp
    lead = replica0(measurements)  # the pipeline the simulator's timeline describes
    warnings = trust_warnings(n_measured=len(measured), median_ms=med, spread_pct=spread, load=load_average,
                              profile_load=profile_load_average, compute_ratio=compute_ratio,
                              compute_ratio_cpu=compute_ratio_cpu)
    return RunRecord(
        plan=plan_path, model=plan.model, schedule=plan.schedule, runtime=r0.runtime, device_type=device_type,
        n_ranks=plan.n_processes, n_stages=plan.n_stages, micro_batch_size=plan.micro_batch_size,
        n_microbatches=plan.n_microbatches, optimizer=plan.optimizer, steps=steps, first_step=r0.first_step,
        warmup=warmup, iteration_ms_measured=meas, iteration_ms_predicted=pred, error_pct=error_pct(pred, meas),
        prediction_source=prediction_source, calibration=calibration,
        losses=[losses[k] for k in loss_steps], loss_steps=loss_steps, diverged=diverged, step_ms=step_ms,
        measured_steps=measured, timeline_step=r0.timeline_step, ranks=_rank_records(measurements, plan, prediction),
        comm=[c for m in measurements for c in m.comm], boundary_bytes=boundary,
        transfer_gaps=transfer_gaps(measured_timeline(lead), plan.n_stages, boundary) if one_clock(lead) else [],
        step_ms_min=lo, step_ms_median=med, step_ms_max=hi, step_spread_pct=spread, load_average=load_average,
        profile_load_average=profile_load_average, compute_ratio=compute_ratio, compute_ratio_cpu=compute_ratio_cpu,
        warnings=warnings, dp=dp,
        grad_allreduce_ms_measured=_allreduce_ms(measurements) if dp > 1 else None,
        grad_allreduce_ms_predicted=grad_allreduce_ms_predicted if dp > 1 else None,
        stage_layers=[list(st.layers) for st in plan.stages], stage_recompute=[list(st.recompute) for st in plan.stages])
