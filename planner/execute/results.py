"""The run JSON and the measured timeline, from what the ranks recorded, next to the prediction.

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
                         buffers (2 x (input + output) bytes of one micro-batch)
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
                         load unlike the profile's, actions slower or faster than profiled)

The run JSON is a `RunRecord` (ranks: `RankRecord`): one frozen dataclass, one to_dict/from_dict.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, fields, replace
from typing import Any

from planner.errors import PplanError
from planner.jsonio import check_keys, finite_or_null
from planner.jsontypes import missing_field
from planner.plan import Plan, PredictedDevice, Prediction
from planner.execute.mesh import world_size
from planner.execute.trust import (  # re-exported: the run record carries their verdicts
    COMPUTE_RATIO_WARN, LOAD_WARN_DIFF, SHORT_STEP_MS, SPREAD_WARN_PCT, step_spread, trust_warnings,
)
from planner.simulation.result import TimelineRow

__all__ = ["FORMAT", "RUN_FILE_HINT", "RankRecord", "RunRecord", "replica0", "assemble_record", "measured_timeline", "error_pct",
           "transfer_gaps", "step_spread", "trust_warnings", "SPREAD_WARN_PCT", "SHORT_STEP_MS", "LOAD_WARN_DIFF",
           "COMPUTE_RATIO_WARN"]

FORMAT = "pplan-run/1"
RUN_FILE_HINT = "give the JSON that `pplan run --out` wrote"

@dataclass(frozen=True)
class RankRecord:
    """What one rank measured, next to what the simulator predicted for its device."""

    rank: int
    """Process rank."""
    device: int
    """Plan device the rank plays."""
    host: str
    """Host name."""
    stages: list[int]
    """Global stages this rank ran."""
    busy_ms: float
    """F/B/I/W/R/O time in the timeline step, ms."""
    busy_ms_predicted: float | None = None
    """The simulator's busy time of the device, ms."""
    peak_memory_bytes_measured: int | None = None
    """The allocator's peak over the memory step (CUDA's; on CPU torch's own count via torch.profiler)."""
    peak_memory_bytes_predicted: int | None = None
    """The cost model's peak of the device."""
    memory_limit_bytes: int | None = None
    """The plan's device memory."""
    memory_measure: str | None = None
    """How peak_memory_bytes_measured was measured: cuda-allocator, cpu-allocator, or tracked (tensor sizes)."""
    memory_measured: dict[str, Any] | None = None
    """The tracked breakdown (weights, gradients, optimizer, activations, buffers, total)."""
    memory_predicted: dict[str, Any] | None = None
    """The predicted breakdown, same keys."""
    rss_peak_bytes: int | None = None
    """CPU: the process's lifetime max RSS (torch included)."""
    peak_memory_bytes_rss: int | None = None
    """CPU: peak RSS over the memory step minus the RSS before the model (independent measure)."""
    rss_baseline_bytes: int | None = None
    """CPU: RSS before the model was built (torch, process group)."""
    action_ms: dict[str, float] = field(default_factory=dict)
    """Median ms per '<stage><kind>'."""
    action_cpu_ms: dict[str, float] = field(default_factory=dict)
    """Median CPU ms per '<stage><kind>' (this rank's thread; below action_ms when it waited for a CPU)."""
    threads: int | None = None
    """torch threads of the rank."""
    replica: int = 0
    """Data-parallel replica of the rank (0 without data parallelism); rank = replica x P + pipeline rank."""
    grad_allreduce_ms: float | None = None
    """dp > 1: median over the measured steps of this rank's gradient all-reduce over its dp group, ms."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "ranks[i]") -> "RankRecord":
        check_keys(d, [f.name for f in fields(cls)], where, PplanError)
        if (name := missing_field(cls, d)) is not None:
            raise PplanError(f"{where}: missing field {name!r}", RUN_FILE_HINT)
        return cls(**d)


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """The run JSON (`pplan run --out`), key for key; docs/executor.md defines each. Fields with a
    default may be absent from a file written before they existed (`diverged` came later)."""

    plan: str | None
    """Plan file the run executed."""
    model: str | None
    """Model spec."""
    schedule: str
    """Schedule name."""
    runtime: str
    """torch class or runtime that executed it."""
    device_type: str
    """cpu or cuda."""
    n_ranks: int
    """Processes."""
    n_stages: int
    """Pipeline stages."""
    micro_batch_size: int
    """Samples per micro-batch."""
    n_microbatches: int
    """Micro-batches per step."""
    optimizer: str
    """Optimizer name."""
    steps: int
    """Steps reached."""
    first_step: int = 0
    """First step run (a resumed run starts later)."""
    warmup: int
    """Steps left out of the timing."""
    iteration_ms_measured: float | None
    """Median of step_ms over measured_steps."""
    iteration_ms_predicted: float | None
    """The simulator's iteration time."""
    error_pct: float | None
    """100 x (predicted - measured) / measured."""
    prediction_source: str | None = None
    """Where the prediction came from."""
    calibration: dict[str, Any] | None = None
    """The calibration the prediction used."""
    losses: list[float | None]
    """Mean loss of each step in loss_steps."""
    loss_steps: list[int]
    """Steps the losses belong to."""
    diverged: dict[str, Any] | None = None
    """First non-finite loss, if any."""
    step_ms: list[float]
    """Every step's time (slowest rank), ms."""
    measured_steps: list[int]
    """Indices into step_ms that are measured."""
    timeline_step: int
    """The step the timeline shows."""
    ranks: list[RankRecord]
    """Per rank."""
    comm: list[dict[str, Any]] = field(default_factory=list)
    """Ping-pong measurements (--calibrate)."""
    boundary_bytes: dict[str, list[int]] = field(default_factory=dict)
    """Stage -> [input bytes, output bytes] of one micro-batch."""
    transfer_gaps: list[list[float]] = field(default_factory=list)
    """[bytes, ms] of the hand-overs where the receiver waited."""
    step_ms_min: float | None = None
    """Fastest measured step, ms."""
    step_ms_median: float | None = None
    """Median measured step, ms (= iteration_ms_measured)."""
    step_ms_max: float | None = None
    """Slowest measured step, ms."""
    step_spread_pct: float | None = None
    """100 x (max - min) / median over the measured steps."""
    load_average: float | None = None
    """The machine's 1-minute load average just before the ranks started."""
    profile_load_average: float | None = None
    """The load the profile recorded (its metadata `load_average`), if any."""
    compute_ratio: float | None = None
    """Median over actions of measured / profiled time (1 = as profiled)."""
    compute_ratio_cpu: float | None = None
    """The same with the actions' CPU time: what stays when waiting for a busy machine's CPUs is taken out."""
    warnings: list[str] = field(default_factory=list)
    """Why the comparison may not be trusted, one line each."""
    dp: int = 1
    """Data-parallel replicas of the pipeline (n_ranks = dp x pipeline devices x tp)."""
    grad_allreduce_ms_measured: float | None = None
    """dp > 1: median over the measured steps of the slowest rank's gradient all-reduce, ms (inside step_ms)."""
    grad_allreduce_ms_predicted: float | None = None
    """dp > 1: the plan's predicted gradient synchronisation (predicted.grad_sync_ms), if it has one."""
    calibration_fit: dict[str, Any] | None = None
    """With --calibrate: what was fitted (omitted from the JSON otherwise)."""
    format: str = FORMAT
    """pplan-run/1."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": self.format}
        for f in fields(self):
            if f.name == "format" or (f.name == "calibration_fit" and self.calibration_fit is None):
                continue
            value = getattr(self, f.name)
            out[f.name] = [r.to_dict() for r in value] if f.name == "ranks" else value
        return finite_or_null(out)  # JSON has no inf/nan: a diverged run's non-finite loss is null

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunRecord":
        """Read a run JSON back (unknown keys refused with the nearest known one)."""
        if not isinstance(d, dict):
            raise PplanError("a run JSON must be an object")
        check_keys(d, [f.name for f in fields(cls)], "run", PplanError)
        if d.get("format", FORMAT) != FORMAT:
            raise PplanError(f"run format {d.get('format')!r} is not {FORMAT}")
        ranks = d.get("ranks")
        if not isinstance(ranks, list) or not all(isinstance(r, dict) for r in ranks):
            raise PplanError("run: ranks must be a list of objects")
        if (name := missing_field(cls, d)) is not None:
            raise PplanError(f"run: missing field {name!r}", RUN_FILE_HINT)
        return cls(**dict(d, ranks=[RankRecord.from_dict(r, f"ranks[{i}]") for i, r in enumerate(ranks)]))

    def with_(self, **changes: Any) -> "RunRecord":
        return replace(self, **changes)


def error_pct(predicted: float | None, measured: float) -> float | None:
    """100 x (predicted - measured) / measured, or None without a prediction."""
    if predicted is None or not measured > 0:  # NaN (no step timed) too
        return None
    return 100.0 * (predicted - measured) / measured


def _aligned_offsets(records: list[dict[str, Any]]) -> list[float]:
    """Per rank, ms to add to its event times so all ranks share one origin.

    On one machine perf_counter is one monotonic clock for all processes, so the ranks' step
    starts can be compared; across machines each rank keeps its own start (barrier exit).
    """
    if len({r["host"] for r in records}) != 1:
        return [0.0] * len(records)
    origin = min(r["chosen_t0"] for r in records)
    return [(r["chosen_t0"] - origin) * 1e3 for r in records]


def measured_timeline(records: list[dict[str, Any]]) -> list[TimelineRow]:
    """Timeline rows of the timeline step, in the simulator's layout (O rows have stage -1)."""
    rows = []
    for rec, off in zip(records, _aligned_offsets(records)):
        for stage, kind, mb, start, end in rec["events"]:
            rows.append(TimelineRow(rec["device"], -1 if kind == "O" else stage, kind, mb, start + off, end + off))
    rows.sort(key=lambda r: (r.start_ms, r.device, r.stage))
    return rows


def transfer_gaps(rows: list[TimelineRow], n_stages: int, boundary_bytes: dict[str, list[int]]) -> list[list[float]]:
    """[bytes, ms] for every cross-device hand-over where the receiver sat waiting for it.

    A hand-over is F(s-1, m) -> F(s, m) or B/I(s+1, m) -> B/I(s, m) on different devices. When
    the receiver was idle before it (its previous action ended before the sender's), the time
    from the sender's end to the receiver's start is what one transfer really costs in the
    pipeline (send, receive and waking the waiting process): calibration fits the link latency
    to it. Needs one clock for all ranks (a single machine).
    """
    begin: dict[tuple[int, str, int], tuple[float, float, int]] = {}  # action -> (start, prev end, device)
    end_of: dict[tuple[int, str, int], tuple[float, int]] = {}
    by_dev: dict[int, list[TimelineRow]] = {}
    for r in rows:
        if r.kind in ("F", "B", "I", "W", "R", "O"):
            by_dev.setdefault(r.device, []).append(r)
    for dev, rs in by_dev.items():
        rs.sort(key=lambda r: (r.start_ms, r.kind != "R"))
        prev_end, pending = float("-inf"), None  # pending: an R row waiting for its B/I
        for r in rs:
            group = "F" if r.kind == "F" else "BI"
            if r.kind == "R":
                pending = (r.start_ms, prev_end)
            elif r.kind in ("F", "B", "I"):
                start, before = pending if pending and r.kind != "F" else (r.start_ms, prev_end)
                begin[(r.stage, group, r.microbatch)] = (start, before, dev)
                end_of[(r.stage, group, r.microbatch)] = (r.end_ms, dev)
                pending = None
            prev_end = r.end_ms
    out = []
    for (s, group, m), (start, before, dev) in begin.items():
        if group == "F":
            src, nbytes = (s - 1, "F", m), (boundary_bytes.get(str(s)) or [0, 0])[0]
        else:
            src, nbytes = (s + 1, "BI", m), (boundary_bytes.get(str(s)) or [0, 0])[1]
        if not 0 <= src[0] < n_stages or src not in end_of:
            continue
        sent, sender = end_of[src]
        if sender != dev and sent >= before:
            out.append([float(nbytes), start - sent])
    return out


def replica0(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rank records of data-parallel replica 0 and tensor-parallel rank 0 (all of them without
    either): the pipeline whose timeline and actions are compared with the simulator's one
    pipeline (the other tp ranks of a stage run the same actions at the same times)."""
    return [r for r in records if r.get("replica", 0) == 0 and r.get("tp", 0) == 0]


def _allreduce_ms(records: list[dict[str, Any]]) -> float | None:
    """Median over measured steps of the slowest rank's all-reduce time, or None without dp."""
    per_rank = [r.get("grad_allreduce_ms") or [] for r in records]
    n = min((len(v) for v in per_rank), default=0)
    if n == 0:
        return None
    return statistics.median(max(v[i] for v in per_rank) for i in range(n))


def _busy(rec: dict[str, Any]) -> float:
    return sum(end - start for _, kind, _, start, end in rec["events"] if kind in ("F", "B", "I", "W", "R", "O"))


def _losses(records: list[dict[str, Any]]) -> tuple[dict[str, float], list[int], dict[str, Any] | None]:
    """(step -> loss, the steps in order, the divergence or None): the first step whose loss was
    not finite, else the earliest step a rank stopped at (its loss may be unknown)."""
    losses: dict[str, float] = {}
    for rec in records:
        losses.update(rec["losses"])
    loss_steps = sorted(int(k) for k in losses)
    bad = [k for k in loss_steps if not math.isfinite(losses[str(k)])]
    stops = [rec.get("diverged_step") for rec in records if rec.get("diverged_step") is not None]
    if not (bad or stops):
        return losses, loss_steps, None
    step = bad[0] if bad else min(stops)
    value = losses.get(str(step))
    return losses, loss_steps, {"step": step, "loss": "unknown" if value is None else str(value)}


def _rank_records(records: list[dict[str, Any]], plan: Plan, prediction: Prediction | None) -> list[RankRecord]:
    """Each rank's measurements beside the prediction for the device it plays."""
    pred_devices = {d.device: d for d in (prediction.devices or ())} if prediction else {}
    ranks = []
    for rec in records:
        pd = pred_devices.get(rec["device"], PredictedDevice())
        mem = rec.get("memory") or {}
        ranks.append(RankRecord(
            rank=rec["rank"], device=rec["device"], host=rec["host"], stages=rec["stages"], busy_ms=_busy(rec),
            busy_ms_predicted=pd.busy_ms, peak_memory_bytes_measured=mem.get("peak_bytes"),
            peak_memory_bytes_predicted=pd.peak_memory_bytes,
            memory_limit_bytes=plan.devices[rec["device"]].memory_bytes, memory_measure=mem.get("measure"),
            memory_measured=mem.get("breakdown"), memory_predicted=pd.memory.to_dict() if pd.memory else None,
            rss_peak_bytes=mem.get("rss_peak_bytes"), peak_memory_bytes_rss=mem.get("rss_growth_bytes"),
            rss_baseline_bytes=mem.get("rss_baseline_bytes"), action_ms=rec["action_ms"], threads=rec["threads"],
            action_cpu_ms=rec.get("action_cpu_ms") or {},
            replica=rec.get("replica", 0),
            grad_allreduce_ms=statistics.median(rec["grad_allreduce_ms"]) if rec.get("grad_allreduce_ms") else None))
    return ranks


def assemble_record(records: list[dict[str, Any]], plan: Plan, *, plan_path: str | None, device_type: str,
                    steps: int, warmup: int, prediction: Prediction | None, prediction_source: str | None,
                    calibration: dict[str, Any] | None, load_average: float | None = None,
                    profile_load_average: float | None = None, compute_ratio: float | None = None,
                    compute_ratio_cpu: float | None = None) -> RunRecord:
    """The run record from rank records and a prediction (docs/executor.md layout)."""
    records = sorted(records, key=lambda r: r["rank"])
    r0 = records[0]
    step_ms = r0["step_ms"]
    measured = r0["measured_steps"]
    meas = statistics.median(step_ms[i] for i in measured) if measured else float("nan")
    pred = prediction.iteration_ms if prediction else None
    losses, loss_steps, diverged = _losses(records)
    boundary = {k: v for rec in records for k, v in rec.get("boundary_bytes", {}).items()}
    ranks = _rank_records(records, plan, prediction)
    lo, med, hi, spread = step_spread(step_ms, measured)
    dp = plan.parallel.dp if plan.parallel is not None else 1
    lead = replica0(records)  # the pipeline the simulator's timeline describes
    warnings = trust_warnings(n_measured=len(measured), median_ms=med, spread_pct=spread, load=load_average,
                              profile_load=profile_load_average, compute_ratio=compute_ratio,
                              compute_ratio_cpu=compute_ratio_cpu)
    return RunRecord(
        plan=plan_path, model=plan.model, schedule=plan.schedule, runtime=r0["runtime"], device_type=device_type,
        n_ranks=world_size(plan), n_stages=plan.n_stages, micro_batch_size=plan.micro_batch_size,
        n_microbatches=plan.n_microbatches, optimizer=plan.optimizer, steps=steps, first_step=r0["first_step"],
        warmup=warmup, iteration_ms_measured=meas, iteration_ms_predicted=pred, error_pct=error_pct(pred, meas),
        prediction_source=prediction_source, calibration=calibration,
        losses=[losses[str(k)] for k in loss_steps], loss_steps=loss_steps, diverged=diverged, step_ms=step_ms,
        measured_steps=measured, timeline_step=r0["chosen_step"], ranks=ranks,
        comm=[c for rec in records for c in rec.get("comm", [])], boundary_bytes=boundary,
        transfer_gaps=transfer_gaps(measured_timeline(lead), plan.n_stages, boundary)
        if len({rec["host"] for rec in lead}) == 1 else [],
        step_ms_min=lo, step_ms_median=med, step_ms_max=hi, step_spread_pct=spread, load_average=load_average,
        profile_load_average=profile_load_average, compute_ratio=compute_ratio, compute_ratio_cpu=compute_ratio_cpu,
        warnings=warnings, dp=dp,
        grad_allreduce_ms_measured=_allreduce_ms(records) if dp > 1 else None,
        grad_allreduce_ms_predicted=(plan.predicted.grad_sync_ms if plan.predicted is not None and dp > 1 else None))

