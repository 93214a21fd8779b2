"""What one rank measured, as typed records: a rank builds its RankMeasurement when training ends,
rank 0 gathers them (torch's gather_object pickles them) and, in a local launch, hands the list to
the launcher through `<run_dir>/result.json` (to_dict / from_dict, the one JSON round trip).
planner.execute.results reads them into the run JSON; nothing reads them by key.

The JSON form keeps non-finite losses (json writes NaN / Infinity, which json reads back): the
run's divergence is found from them. Only the run JSON turns them into null.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from planner.errors import PplanError, RunError
from planner.jsonio import check_keys
from planner.jsontypes import INDEX_KEY, record_fields, short, type_error
from planner.plan import MemoryRecord

__all__ = ["ActionSpan", "CommMeasurement", "RankMemory", "RankMeasurement", "measurements_from_json"]

_HINT = "report this: a rank's measurements did not reach rank 0 intact"


@dataclass(frozen=True)
class ActionSpan:
    """One action of the timeline step on a rank, timed from the step's start."""

    stage: int
    """Global stage."""
    kind: str
    """F, B, I, W, R (recompute) or O (optimizer step)."""
    microbatch: int
    """Micro-batch (-1 for O)."""
    start_ms: float
    """Start, ms after the step's start on this rank."""
    end_ms: float
    """End, same origin."""

    @property
    def ms(self) -> float:
        """Its duration, ms."""
        return self.end_ms - self.start_ms

    def to_list(self) -> list[Any]:
        """[stage, kind, micro-batch, start ms, end ms]: the compact JSON form (a step has many)."""
        return [self.stage, self.kind, self.microbatch, self.start_ms, self.end_ms]

    @classmethod
    def from_list(cls, row: Any, where: str) -> "ActionSpan":
        """The span in its JSON form; RunError names the item that is wrong."""
        if not isinstance(row, list) or len(row) != 5:
            raise RunError(f"{where} must be [stage, kind, micro-batch, start ms, end ms], got {short(row)}", _HINT)
        for value, hint, name in zip(row, (int, str, int, float, float), ("stage", "kind", "micro-batch", "start", "end")):
            if (message := type_error(value, hint, f"{where} {name}")) is not None:
                raise RunError(message, _HINT)
        return cls(*row)


@dataclass(frozen=True)
class CommMeasurement:
    """Ping-pong between neighbour ranks a and b (--calibrate; planner.execute.commbench)."""

    a: int
    """The lower rank of the pair."""
    b: int
    """The higher rank (a + 1)."""
    latency_ms: float
    """Fitted one-way latency, ms."""
    bandwidth_bytes_per_s: float | None
    """Fitted bandwidth (None when the times did not grow with the size)."""
    points: list[list[float]]
    """[bytes, one-way ms] of each message size."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Any, where: str, error: type[PplanError] = RunError, hint: str = _HINT) -> "CommMeasurement":
        """The measurement in JSON object `d`; a bad key or value raises `error` with `hint` (a run
        file's reader passes its own)."""
        return cls(**record_fields(d, cls, where, error=error, hint=hint))


@dataclass(frozen=True)
class RankMemory:
    """The memory step's measurement on one rank (planner.execute.train: the last warm-up step)."""

    measure: str
    """How peak_bytes was measured: cuda-allocator, cpu-allocator, or tracked (tensor sizes)."""
    peak_bytes: int
    """The allocator's peak over the memory step (tracked: breakdown.total)."""
    breakdown: MemoryRecord
    """The tracked breakdown: weights, gradients, optimizer, activations, buffers, total."""
    transient_bytes: int = 0
    """Recompute transients inside the tracked activations at the peak."""
    rss_peak_bytes: int | None = None
    """CPU: the process's lifetime max RSS (torch included)."""
    rss_baseline_bytes: int | None = None
    """RSS before the model was built (torch, process group)."""
    rss_growth_bytes: int | None = None
    """Peak RSS over the memory step minus rss_baseline_bytes (None where /proc cannot tell)."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name).to_dict() if f.name == "breakdown" else getattr(self, f.name)
                for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "RankMemory":
        # checked here too, so that a bad breakdown from a rank is a RunError, not MemoryRecord's PlanError
        d = record_fields(d, cls, where, error=RunError, hint=_HINT, types={"breakdown": dict[str, int]})
        check_keys(d["breakdown"], MemoryRecord.keys(), f"{where}.breakdown", RunError)
        return cls(**dict(d, breakdown=MemoryRecord.from_dict(d["breakdown"], f"{where}.breakdown")))


_JSON_FORMS: dict[str, Any] = {"events": list, "boundary_bytes": dict[str, list[int]]}
"""The fields whose JSON form is not their annotation's: each ActionSpan is a list (`to_list`), which
ActionSpan.from_list checks, and each boundary pair a list, whose length the reader checks."""


@dataclass(frozen=True)
class RankMeasurement:
    """Everything one rank measured in a run, for rank 0 to turn into the run JSON."""

    rank: int
    """Process rank."""
    device: int
    """Plan device the rank plays (its pipeline position)."""
    host: str
    """Host name (one host: the ranks' clocks can be compared)."""
    stages: tuple[int, ...]
    """Global stages this rank ran."""
    runtime: str
    """torch schedule class or runtime that executed them."""
    threads: int
    """torch threads of the rank."""
    first_step: int
    """First step trained (a resumed run starts later)."""
    step_ms: tuple[float, ...]
    """Each step's time, the slowest rank's (all ranks agree), ms."""
    measured_steps: tuple[int, ...]
    """Indices into step_ms that count (after the warm-up, without the memory step)."""
    timeline_step: int
    """The measured step closest to the median, whose actions `events` holds (-1: none measured)."""
    timeline_t0: float
    """That step's start on this rank (perf_counter seconds at the barrier exit)."""
    events: tuple[ActionSpan, ...]
    """The actions of the timeline step."""
    action_ms: dict[str, float]
    """Median ms per '<stage><kind>' over the measured steps (B and I include their recompute)."""
    action_cpu_ms: dict[str, float]
    """The same in CPU time of the rank's thread."""
    replica: int = 0
    """Data-parallel replica (0 without data parallelism)."""
    tp: int = 0
    """Tensor-parallel rank within the stage (0 without tensor parallelism)."""
    grad_allreduce_ms: tuple[float, ...] = ()
    """dp > 1: the gradient all-reduce of each measured step, ms; else empty."""
    losses: dict[int, float] = field(default_factory=dict)
    """step -> mean loss, on the rank that reports it (replica 0's last stage, tp rank 0); else empty."""
    diverged_step: int | None = None
    """The step whose loss was not finite (the run stopped after it), or None."""
    memory: RankMemory | None = None
    """The memory step's measurement (None when memory was not tracked)."""
    comm: tuple[CommMeasurement, ...] = ()
    """Ping-pong to the next rank (--calibrate, on the lower rank of each pair)."""
    boundary_bytes: dict[int, tuple[int, int]] = field(default_factory=dict)
    """stage -> (input bytes, output bytes) of one micro-batch."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the launcher's result.json); non-finite losses are kept."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(stages=list(self.stages), step_ms=list(self.step_ms), measured_steps=list(self.measured_steps),
                   events=[e.to_list() for e in self.events], grad_allreduce_ms=list(self.grad_allreduce_ms),
                   losses={str(k): v for k, v in self.losses.items()},
                   memory=self.memory.to_dict() if self.memory is not None else None,
                   comm=[c.to_dict() for c in self.comm],
                   boundary_bytes={str(s): list(v) for s, v in self.boundary_bytes.items()})
        return out

    @classmethod
    def from_dict(cls, d: Any, where: str = "rank measurement") -> "RankMeasurement":
        """The measurement in its JSON form; RunError names the first key or value that is wrong."""
        d = record_fields(d, cls, where, error=RunError, hint=_HINT, types=_JSON_FORMS)
        for name in ("losses", "boundary_bytes"):
            if bad := [k for k in d.get(name, {}) if not INDEX_KEY.fullmatch(k)]:
                raise RunError(f"{where} field {name!r}: key {bad[0][:20]!r} is not a step or stage index", _HINT)
        memory = d.get("memory")
        return cls(**dict(
            d, stages=tuple(d["stages"]), step_ms=tuple(d["step_ms"]), measured_steps=tuple(d["measured_steps"]),
            events=tuple(ActionSpan.from_list(e, f"{where}.events[{i}]") for i, e in enumerate(d["events"])),
            grad_allreduce_ms=tuple(d.get("grad_allreduce_ms", ())),
            losses={int(k): v for k, v in d.get("losses", {}).items()},
            memory=RankMemory.from_dict(memory, f"{where}.memory") if memory is not None else None,
            comm=tuple(CommMeasurement.from_dict(c, f"{where}.comm[{i}]") for i, c in enumerate(d.get("comm", ()))),
            boundary_bytes={int(s): _pair(v, f"{where}.boundary_bytes[{s!r}]")
                            for s, v in d.get("boundary_bytes", {}).items()}))


def _pair(value: list[int], where: str) -> tuple[int, int]:
    if len(value) != 2:
        raise RunError(f"{where} must be [input bytes, output bytes], got {len(value)} number(s)", _HINT)
    return value[0], value[1]


def measurements_from_json(data: Any, where: str = "result.json") -> list[RankMeasurement]:
    """The ranks' measurements from the JSON list rank 0 wrote (planner.execute.worker)."""
    if not isinstance(data, list):
        raise RunError(f"{where} must be a list of rank measurements, got {type(data).__name__}", _HINT)
    return [RankMeasurement.from_dict(d, f"{where}[{i}]") for i, d in enumerate(data)]
