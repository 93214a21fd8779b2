"""The run JSON's record types: RunRecord (one run, `pplan run --out`) and RankRecord (one rank of it),
frozen dataclasses whose fields are the JSON's keys in the order written, one to_dict / from_dict
each; docs/executor.md defines every field. planner.execute.results assembles a RunRecord from the
ranks' measurements; planner.execute.runfile reads a file back, every value checked.

Reading checks each value's range too (`check_run_values`): counts in `count_ranges`, times finite,
at least 0 and under a day, byte counts within MAX_MEMORY_BYTES, a known schedule and optimizer,
indices that point inside the run (a rank's stages, the measured steps), one rank record per rank,
and a summary of the steps (iteration_ms_measured, step_ms_min/median/max) that agrees with them.
A file someone edited fails there on one line that names the field, never later inside a fit or a
figure (planner.execute.runfile bounds every count and list before the record is built). A record
assembled in memory is not checked: a run that timed no step holds NaN, which its JSON writes as null.

A field's nested records (a memory breakdown, a ping-pong measurement, a divergence, the
calibration and what --calibrate fitted: planner.execute.fitrecord) write the same JSON objects
the run file always had.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, fields, replace
from typing import Any, get_type_hints

from planner.calibration import Calibration
from planner.errors import PplanError
from planner.execute.fitrecord import CalibrationFit, calibration_from_dict, calibration_values
from planner.execute.measurement import CommMeasurement
from planner.execute.options import MAX_STEPS
from planner.jsonio import finite_or_null
from planner.jsontypes import is_number, kind_mismatch, record_fields, short, to_json
from planner.limits import MAX_GLOBAL_BATCH, MAX_LATENCY_MS, MAX_MEMORY_BYTES
from planner.plan import OPTIMIZERS, SCHEDULES, MemoryRecord
from planner.plan.records import MAX_PIPELINE_STAGES

__all__ = ["FORMAT", "RUN_FILE_HINT", "DEVICE_TYPES", "MEMORY_MEASURES", "MAX_RUN_RANKS", "COUNT_RANGES", "Divergence",
           "RankRecord", "RunRecord", "count_ranges", "check_count", "check_run_values"]

FORMAT = "pplan-run/1"
RUN_FILE_HINT = "give the JSON that `pplan run --out` wrote"
DEVICE_TYPES = ("cpu", "cuda")
"""What a run's `device_type` can be (planner.execute.preflight chooses one)."""
MEMORY_MEASURES = ("cuda-allocator", "cpu-allocator", "tracked")
"""How a rank's peak can have been measured (planner.execute.train)."""
MAX_RUN_RANKS = 32_768
"""The most processes a run (and a checkpoint) can have: twice the largest published training run's
16,384 GPUs (Llama 3 405B). A run JSON holds a rank record of at least 150 bytes per process."""
COUNT_RANGES = {"n_ranks": (1, MAX_RUN_RANKS), "dp": (1, MAX_RUN_RANKS), "n_stages": (1, MAX_PIPELINE_STAGES),
                "micro_batch_size": (1, MAX_GLOBAL_BATCH), "n_microbatches": (1, MAX_GLOBAL_BATCH),
                "steps": (1, MAX_STEPS)}
"""(low, high) of the counts of a run that depend on no other: what `pplan run` accepts (--steps <= MAX_STEPS)."""


def count_ranges(steps: int, n_step_times: int) -> dict[str, tuple[int, int]]:
    """(low, high) of every count of a run of `steps` steps with `n_step_times` items in step_ms: COUNT_RANGES
    (steps before what depends on it), first_step and warmup in 0..steps, and timeline_step, an index into
    step_ms (-1: none timed). The one definition: runfile checks them before the record is built, check_run_values after."""
    return {**COUNT_RANGES, "first_step": (0, steps), "warmup": (0, steps), "timeline_step": (-1, n_step_times - 1)}


@dataclass(frozen=True)
class Divergence:
    """Where a run's loss stopped being finite (the run stopped after that step)."""

    step: int
    """The step (0-based) whose loss was not finite, else the earliest step a rank stopped at."""
    loss: str
    """The loss as text: "inf", "-inf", "nan", or "unknown" (the stopping rank did not see it)."""

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "loss": self.loss}

    @classmethod
    def from_dict(cls, d: Any) -> "Divergence":
        return cls(**record_fields(d, cls, "diverged", hint=RUN_FILE_HINT))


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
    memory_measured: MemoryRecord | None = None
    """The tracked breakdown (weights, gradients, optimizer, activations, buffers, total)."""
    memory_predicted: MemoryRecord | None = None
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
        return {f.name: to_json(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Any, where: str = "ranks[i]") -> "RankRecord":
        d = record_fields(d, cls, where, hint=RUN_FILE_HINT, types=_RANK_JSON_FORMS)
        memory = {k: MemoryRecord.from_dict(d[k], f"{where}.{k}") for k in ("memory_measured", "memory_predicted")
                  if d.get(k) is not None}
        return cls(**dict(d, **memory))


_RANK_JSON_FORMS = {name: float | None for name, hint in get_type_hints(RankRecord).items()
                    if "bytes" in name and hint == int | None}
"""A rank's byte counts are read as any number, as run files have always been read (the fit and
the figures only compare them)."""


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
    calibration: Calibration | None = None
    """The calibration the prediction used (its values: planner.execute.fitrecord.as_recorded)."""
    losses: list[float | None]
    """Mean loss of each step in loss_steps."""
    loss_steps: list[int]
    """Steps the losses belong to."""
    diverged: Divergence | None = None
    """First non-finite loss, if any."""
    step_ms: list[float]
    """Every step's time (slowest rank), ms."""
    measured_steps: list[int]
    """Indices into step_ms that are measured."""
    timeline_step: int
    """The step the timeline shows."""
    ranks: list[RankRecord]
    """Per rank."""
    comm: list[CommMeasurement] = field(default_factory=list)
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
    """dp > 1: the slowest rank's gradient all-reduce as the cost model prices it, of all the rank's
    stages at once (planner.execute.calibrate.rank_grad_allreduce_ms); None when the plan's
    hardware is no preset (without a profile: the plan's predicted.grad_sync_ms)."""
    stage_layers: list[list[int]] | None = None
    """Each stage's [first, end) layers as the plan cut them (None: a run written before pplan recorded them)."""
    stage_recompute: list[list[int]] | None = None
    """Each stage's recomputed layers as the plan gave them (None: not recorded)."""
    calibration_fit: CalibrationFit | None = None
    """With --calibrate: what was fitted (omitted from the JSON otherwise)."""
    format: str = FORMAT
    """pplan-run/1."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": self.format}
        for f in fields(self):
            if f.name == "format" or (f.name == "calibration_fit" and self.calibration_fit is None):
                continue
            value = getattr(self, f.name)
            out[f.name] = calibration_values(value) if isinstance(value, Calibration) else to_json(value)
        return finite_or_null(out)  # JSON has no inf/nan: a diverged run's non-finite loss is null

    @classmethod
    def from_dict(cls, d: Any) -> "RunRecord":
        """Read a run JSON back: unknown keys refused with the nearest known one, a missing field
        named, every value checked against its field's type, and the nested records read."""
        # the format first: another format's keys would be refused as unknown
        if (other := kind_mismatch(d, "run")) is not None:
            raise PplanError(other, "give the run JSON that `pplan run --out` wrote")
        if isinstance(d, dict) and d.get("format", FORMAT) != FORMAT:
            raise PplanError(f"run format {short(d.get('format'))} is not {FORMAT}", "this pplan reads " + FORMAT)
        d = record_fields(d, cls, "run", hint=RUN_FILE_HINT)
        calibration, fit, diverged = d.get("calibration"), d.get("calibration_fit"), d.get("diverged")
        run = cls(**dict(
            d, ranks=[RankRecord.from_dict(r, f"ranks[{i}]") for i, r in enumerate(d["ranks"])],
            comm=[CommMeasurement.from_dict(c, f"comm[{i}]", PplanError, RUN_FILE_HINT)
                  for i, c in enumerate(d.get("comm", []))],
            diverged=Divergence.from_dict(diverged) if diverged is not None else None,
            calibration=calibration_from_dict(calibration) if calibration is not None else None,
            calibration_fit=CalibrationFit.from_dict(fit) if fit is not None else None))
        check_run_values(run)
        return run

    def with_(self, **changes: Any) -> "RunRecord":
        return replace(self, **changes)


def _refuse(where: str, value: Any, requirement: str) -> PplanError:
    return PplanError(f"{where} is {short(value)}, {requirement}", RUN_FILE_HINT)


def check_count(where: str, value: int, low: int, high: int | None = None) -> None:
    """Refuse a count or index outside low..high (high None: no upper end), naming `where` and the range."""
    if value < low:
        raise _refuse(where, value, f"not {low} or more" + (f" (allowed: {low}..{high})" if high is not None else ""))
    if high is not None and value > high:
        raise _refuse(where, value, f"not in {low}..{high}")


def _ms(where: str, value: Any) -> None:
    """A time in ms: finite, at least 0, at most a day (None passes: the field may be null)."""
    if value is not None and not (is_number(value) and math.isfinite(value) and 0 <= value <= MAX_LATENCY_MS):
        raise _refuse(where, value, f"not a time from 0 to {MAX_LATENCY_MS:g} ms (a day)")


def _bytes(where: str, value: Any) -> None:
    if value is not None and not (is_number(value) and 0 <= value <= MAX_MEMORY_BYTES):
        raise _refuse(where, value, f"not a byte count from 0 to {MAX_MEMORY_BYTES:g}")


def _choice(where: str, value: Any, known: tuple[str, ...]) -> None:
    if value is not None and value not in known:
        raise _refuse(where, value, f"not one of {', '.join(known)}")


def check_run_values(run: RunRecord) -> None:
    """Refuse a run read from a file whose values lie outside what a run can measure (module
    docstring); PplanError names the field ("run field 'micro_batch_size' is 0, not 1 or more")."""
    for name, (low, high) in count_ranges(run.steps, len(run.step_ms)).items():
        check_count(f"run field {name!r}", getattr(run, name), low, high)
    if run.micro_batch_size * run.n_microbatches > MAX_GLOBAL_BATCH:
        raise _refuse("run field 'micro_batch_size' x 'n_microbatches'", run.micro_batch_size * run.n_microbatches,
                      f"more than {MAX_GLOBAL_BATCH:g} samples per step")
    _choice("run field 'schedule'", run.schedule, SCHEDULES)
    _choice("run field 'optimizer'", run.optimizer, OPTIMIZERS)
    _choice("run field 'device_type'", run.device_type, DEVICE_TYPES)
    for name in ("iteration_ms_measured", "iteration_ms_predicted", "step_ms_min", "step_ms_median", "step_ms_max",
                 "grad_allreduce_ms_measured", "grad_allreduce_ms_predicted"):
        _ms(f"run field {name!r}", getattr(run, name))
    for i, ms in enumerate(run.step_ms):
        _ms(f"run field 'step_ms' item {i}", ms)
    for i, step in enumerate(run.measured_steps):
        check_count(f"run field 'measured_steps' item {i}", step, 0, len(run.step_ms) - 1)
    _check_step_stats(run)
    if len(run.losses) != len(run.loss_steps) or len(run.losses) > run.steps:
        raise PplanError(f"run field 'losses' holds {len(run.losses)} losses for {len(run.loss_steps)} loss_steps "
                         f"and {run.steps} steps: it holds one per loss step, at most one per step", RUN_FILE_HINT)
    for stage, pair in run.boundary_bytes.items():
        if not (stage.isascii() and stage.isdigit() and int(stage) < run.n_stages):  # int('²') raises
            raise _refuse("run field 'boundary_bytes' key", stage, f"not a stage of the run (0..{run.n_stages - 1})")
        if len(pair) != 2:
            raise _refuse(f"run field 'boundary_bytes' stage {stage}", pair, "not an [input bytes, output bytes] pair")
        for value in pair:
            _bytes(f"run field 'boundary_bytes' stage {stage}", value)
    for i, gap in enumerate(run.transfer_gaps):  # calibrate fits the link from these
        if len(gap) != 2:
            raise _refuse(f"run field 'transfer_gaps[{i}]'", gap, "not a [bytes, ms] pair")
        _bytes(f"run field 'transfer_gaps[{i}]' bytes", gap[0])
        ms = gap[1]
        if is_number(ms) and math.isfinite(ms) and -MAX_LATENCY_MS <= ms < 0:
            # pplan wrote negative gaps for zero-bubble runs with recompute until timeline.transfer_gaps
            # was fixed; those files are users' own runs, so they are read (calibrate leaves the gaps out)
            continue
        _ms(f"run field 'transfer_gaps[{i}]' ms", ms)
    if len(run.ranks) != run.n_ranks:
        raise _refuse("run field 'n_ranks'", run.n_ranks, f"not the {len(run.ranks)} rank record(s) the run holds")
    if run.dp > run.n_ranks:
        raise _refuse("run field 'dp'", run.dp, f"more than n_ranks ({run.n_ranks})")
    seen: set[int] = set()
    for i, rank in enumerate(run.ranks):
        _check_rank(rank, f"ranks[{i}] field", run)
        if rank.rank in seen:
            raise _refuse(f"ranks[{i}] field 'rank'", rank.rank, "a rank another record has already")
        seen.add(rank.rank)


STEP_STAT_REL_TOL = 1e-3
"""How far (relative) a run's iteration_ms_measured and step_ms_min/median/max may lie from what its
measured steps give: pplan writes them exactly; a file rounded by hand stays within 0.1%."""
STEP_STAT_ABS_TOL_MS = 1e-3
"""The same, absolute (ms): a step of a few microseconds rounded to 4 decimals is not refused."""


def _check_step_stats(run: RunRecord) -> None:
    """Refuse a run whose summary of its steps contradicts the steps themselves: iteration_ms_measured
    is the median of step_ms over measured_steps, and step_ms_min/median/max their spread. A file
    with 1e-300 there and steps of 312 ms otherwise fits a calibration 10^304 % off its own run."""
    timed = [run.step_ms[i] for i in run.measured_steps]
    if not timed:
        if run.iteration_ms_measured is not None:
            raise _refuse("run field 'iteration_ms_measured'", run.iteration_ms_measured,
                          "but measured_steps is empty: it is the median of the measured steps' times")
        return
    median = statistics.median(timed)
    for name, expected, what in (("iteration_ms_measured", median, "median"), ("step_ms_median", median, "median"),
                                 ("step_ms_min", min(timed), "fastest"), ("step_ms_max", max(timed), "slowest")):
        value = getattr(run, name)
        if value is not None and not math.isclose(value, expected, rel_tol=STEP_STAT_REL_TOL,
                                                  abs_tol=STEP_STAT_ABS_TOL_MS):
            raise PplanError(f"run field {name!r} is {short(value)} ms, but the {what} of step_ms over measured_steps "
                             f"{_steps(run.measured_steps)} is {expected:.6g} ms: the file contradicts itself",
                             "give the run JSON as `pplan run --out` wrote it (it writes both from the same steps)")


def _steps(steps: list[int]) -> str:
    """measured_steps in a message: the list, or its first and last indices when long."""
    return repr(steps) if len(steps) <= 6 else f"[{steps[0]}, ..., {steps[-1]}] ({len(steps)} steps)"


def _check_rank(rank: RankRecord, where: str, run: RunRecord) -> None:
    """One rank record's values, against its run's counts."""
    check_count(f"{where} 'rank'", rank.rank, 0, run.n_ranks - 1)
    check_count(f"{where} 'device'", rank.device, 0, run.n_stages - 1)  # a device runs one stage or more
    check_count(f"{where} 'replica'", rank.replica, 0, run.dp - 1)
    if rank.threads is not None:
        check_count(f"{where} 'threads'", rank.threads, 1)
    for stage in rank.stages:
        check_count(f"{where} 'stages'", stage, 0, run.n_stages - 1)
    for name in ("busy_ms", "busy_ms_predicted", "grad_allreduce_ms"):
        _ms(f"{where} {name!r}", getattr(rank, name))
    for name in ("action_ms", "action_cpu_ms"):
        for key, ms in getattr(rank, name).items():
            _ms(f"{where} {name!r}[{key!r}]", ms)
    for name in _RANK_JSON_FORMS:
        _bytes(f"{where} {name!r}", getattr(rank, name))
    _choice(f"{where} 'memory_measure'", rank.memory_measure, MEMORY_MEASURES)
