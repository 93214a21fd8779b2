"""What-if questions about a plan: change its schedule, micro-batching or links, and sweep them.

`pplan simulate` and the report call this module; it sits above the simulator (it calls `planner.simulate`)
and below the figures (they draw its rows), and imports neither torch nor matplotlib.

Micro-batching keeps the global batch by default, as `pplan partition` does: `microbatches=M` means M
micro-batches of global_batch / M samples, so every row trains on the same data per step.
`keep="micro-batch-size"` keeps the plan's micro-batch size instead (the global batch then grows with M). A
value a schedule or the batch cannot take (e.g. 1f1b with fewer micro-batches than devices, or M not dividing
the global batch) becomes a row with its reason instead of stopping the sweep.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Iterable

from planner.atomic import ensure_outputs_distinct, ensure_writable_file
from planner.calibration import Calibration, basis_text, calibration_mismatch, calibration_path_for
from planner.machine import prediction_basis
from planner.errors import PlanError, PplanError
from planner.hardware import Hardware, load_hardware
from planner.jsonio import nearest
from planner.limits import MAX_SIMULATED_ACTIONS, MAX_SWEEP_VALUES
from planner.plan import Links, Plan, load_plan, resolve_profile_path
from planner.plan.checks import profile_change
from planner.profiling.profile import Profile, load_profile
from planner.schedules.registry import get_schedule, schedule_name

__all__ = ["KEEP", "WhatIf", "SimulationOutputs", "WhatIfResult", "SweepRow", "Setup", "what_if", "load_setup", "apply_what_if",
           "parse_sweep", "run_sweep", "check_sweep_actions", "sweep_grid", "sweep_to_dict"]

KEEP = ("global-batch", "micro-batch-size")


@dataclass(frozen=True)
class WhatIf:
    """Changes to a plan (None = keep the plan's value)."""

    schedule: str | None = None
    """Schedule name."""
    n_microbatches: int | None = None
    """Micro-batches per iteration."""
    micro_batch_size: int | None = None
    """Samples per micro-batch."""
    bandwidth_bytes_per_s: float | None = None
    """Every link's bandwidth (wins over a calibration's)."""
    latency_ms: float | None = None
    """Every link's latency (wins over a calibration's)."""
    keep: str = "global-batch"
    """What a change of micro-batch count or size keeps: global-batch or micro-batch-size."""

    def __post_init__(self) -> None:
        _check_keep(self.keep)
        if self.schedule is not None:  # 'ZB' is zb, as `pplan partition --schedule ZB` reads it
            object.__setattr__(self, "schedule", schedule_name(self.schedule, "--schedule"))
        for flag, value in (("--microbatches", self.n_microbatches), ("--micro-batch-size", self.micro_batch_size)):
            if value is not None and value < 1:
                raise PplanError(f"{flag} {value} must be at least 1")


def _check_keep(keep: str) -> None:
    if keep not in KEEP:
        raise PplanError(f"--keep {keep!r} is not one of {', '.join(KEEP)}")


@dataclass(frozen=True)
class SimulationOutputs:
    """The files a caller writes from what_if's result (None: not written); each must end in its suffix."""

    SUFFIXES: ClassVar[dict[str, tuple[str, ...]]] = {"--plot": (".png", ".svg"), "--out": (".json",), "--timeline": (".csv",)}

    out: str | os.PathLike | None = None
    """The simulation JSON, or the sweep's (.json)."""
    timeline: str | os.PathLike | None = None
    """Every action of the timeline as CSV (.csv; one simulation only, not a sweep)."""
    plot: str | os.PathLike | None = None
    """The Gantt chart, or the sweep's figure (.png or .svg)."""

    def __post_init__(self) -> None:
        for flag, path in self.named():
            if Path(path).suffix.lower() not in self.SUFFIXES[flag]:
                raise PplanError(f"{flag} {str(path)!r} must end in {' or '.join(self.SUFFIXES[flag])}")

    def named(self) -> list[tuple[str, str | os.PathLike]]:
        """(flag, path) of each output given, in the order they are checked."""
        return [(flag, p) for flag, p in (("--plot", self.plot), ("--out", self.out), ("--timeline", self.timeline)) if p is not None]


@dataclass(frozen=True)
class SweepRow:
    """One value of a sweep and what the simulator predicts for it."""

    value: Any
    """The parameter's value (an int micro-batch count or a schedule name)."""
    schedule: str
    """Schedule simulated."""
    n_microbatches: int
    """Micro-batches per iteration."""
    micro_batch_size: int
    """Samples per micro-batch."""
    global_batch: int
    """Samples per iteration (n_microbatches x micro_batch_size)."""
    iteration_ms: float | None
    """Predicted iteration time, ms (None when the value cannot run)."""
    bubble_fraction: float | None
    """Predicted bubble fraction."""
    throughput_samples_per_s: float | None
    """Predicted throughput."""
    peak_memory_bytes: float | None
    """Largest device peak, bytes."""
    fits: bool | None
    """All devices within their memory limits."""
    error: str | None = None
    """Why the value cannot run."""
    interpolated: bool = False
    """The micro-batch size was not profiled; costs are interpolated."""

    def as_dict(self) -> dict[str, Any]:
        """Its fields as JSON values, in field order (peak memory as whole bytes)."""
        peak = None if self.peak_memory_bytes is None else int(self.peak_memory_bytes)
        return {**asdict(self), "peak_memory_bytes": peak}


@dataclass(frozen=True)
class Setup:
    """A plan with its profile and calibration, as a command found them."""

    plan: Plan
    """The plan as loaded (before any what-if)."""
    profile: Profile
    """Its profile."""
    profile_path: Path
    """Where the profile was read."""
    calibration: Calibration | None
    """Calibration applied (None: the profile's times as measured)."""
    calibration_path: Path | None
    """Where the calibration was read."""
    warnings: tuple[str, ...] = ()
    """One line each for the command to show: the profile changed since the plan, a calibration fitted on another model or profile."""


def load_setup(plan_path: str | os.PathLike, profile: str | os.PathLike | None = None,
               calibration: str | os.PathLike | None = None) -> Setup:
    """Load a plan, its profile (--profile, else the one it names, as `pplan run` finds it) and the calibration
    (--calibration PATH or 'none', else the profile's own if there is one, except for a data/tensor-parallel
    plan: a calibration fits a pipeline measured on this machine)."""
    from planner.simulate import is_replica_plan

    plan = load_plan(plan_path)
    if calibration is None and is_replica_plan(plan):
        calibration = "none"
    path = resolve_profile_path(plan, plan_path, str(profile) if profile is not None else None)
    if path is None:
        raise PlanError(f"plan {str(plan_path)!r} names no profile", "pass --profile PROFILE.csv")
    prof = load_profile(path)
    cal, cal_path = prediction_basis(prof, calibration, ranks=plan.n_devices)  # the machine entry for its ranks
    warnings = (profile_change(plan, prof), calibration_mismatch(cal, prof, cal_path))
    return Setup(plan, prof, path, cal, cal_path, tuple(w for w in warnings if w))


def _split_batch(plan: Plan, m: int | None, b: int | None, keep: str) -> tuple[int, int]:
    """(micro-batches, micro-batch size) after a change, keeping what `keep` says."""
    _check_keep(keep)
    for flag, value in (("micro-batch count", m), ("micro-batch size", b)):
        if value is not None and value < 1:
            raise PplanError(f"{flag} {value} must be at least 1")
    if m is not None and b is not None:
        return m, b
    if keep == "micro-batch-size" or (m is None and b is None):
        return (m or plan.n_microbatches), (b or plan.micro_batch_size)
    g = plan.n_microbatches * plan.micro_batch_size  # one replica's share of the global batch
    dp = plan.dp
    batch = "global batch" if dp == 1 else f"replica's batch (global batch {plan.global_batch} / dp {dp})"
    given, other = ("micro-batches", m) if m is not None else ("micro-batch size", b)
    if other > g:
        raise PplanError(f"{given} {other} is too large for the {batch} {g}",
                         f"use at most {g}, or keep the micro-batch size (--keep micro-batch-size)")
    if g % other:
        raise PplanError(f"{given} {other} does not divide the {batch} {g}",
                         "choose a divisor, or keep the micro-batch size (--keep micro-batch-size)")
    return (m, g // m) if m is not None else (g // b, b)


def apply_what_if(plan: Plan, cal: Calibration | None, w: WhatIf) -> tuple[Plan, Calibration | None]:
    """The plan and calibration with `w`'s changes; explicit link values win over a calibration's."""
    changes: dict[str, Any] = {}
    if w.schedule is not None:
        changes["schedule"] = w.schedule
    if w.n_microbatches is not None or w.micro_batch_size is not None:
        m, b = _split_batch(plan, w.n_microbatches, w.micro_batch_size, w.keep)
        changes.update(n_microbatches=m, micro_batch_size=b)
    bw, lat = w.bandwidth_bytes_per_s, w.latency_ms
    if bw is not None or lat is not None:
        old = plan.links
        changes["links"] = Links(
            bandwidth_bytes_per_s=bw if bw is not None else old.bandwidth_bytes_per_s,
            latency_ms=lat if lat is not None else old.latency_ms,
            pairs=tuple((a, c, bw if bw is not None else pbw, lat if lat is not None else plat)
                        for a, c, pbw, plat in old.pairs),
        )
        if cal is not None:
            cal = replace(cal, comm_bandwidth_bytes_per_s=None if bw is not None else cal.comm_bandwidth_bytes_per_s,
                          comm_latency_ms=None if lat is not None else cal.comm_latency_ms)
    if not changes:
        return plan, cal
    new = plan.with_(**changes)
    new.validate()
    return new, cal


def parse_sweep(text: str) -> tuple[str, list[Any]]:
    """'microbatches=1,2,4' -> ('microbatches', [1, 2, 4]); 'schedule=gpipe,zb' -> names."""
    name, sep, values = text.partition("=")
    name = name.strip().replace("-", "_").lower()
    aliases = {"microbatches": "microbatches", "n_microbatches": "microbatches", "m": "microbatches", "schedule": "schedule"}
    if not sep or name not in aliases:
        guess = nearest(name, ("microbatches", "schedule")) if sep and name else None
        usage = "--sweep microbatches=1,2,4,8 or --sweep schedule=gpipe,1f1b,zb"
        raise PplanError(f"cannot read --sweep {text!r}" + (f": unknown parameter {name!r}" if sep else ""),
                         f"did you mean {guess!r}? write {usage}" if guess else f"write {usage}")
    name = aliases[name]
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not items:
        raise PplanError(f"--sweep {text!r} has no values", "list them after '=' separated by commas")
    if len(items) > MAX_SWEEP_VALUES:  # each value is one simulation
        raise PplanError(f"--sweep {name} lists {len(items):,} values, more than {MAX_SWEEP_VALUES}",
                         "sweep fewer values, e.g. powers of two: microbatches=1,2,4,8,16,32")
    if len(set(items)) != len(items):
        raise PplanError(f"--sweep {text!r} repeats a value")
    if name == "schedule":
        names = [schedule_name(v, "--sweep schedule") for v in items]
        if len(set(names)) != len(names):
            raise PplanError(f"--sweep {text!r} repeats a schedule")
        return name, names
    try:
        counts = [int(v) for v in items]
    except ValueError:
        raise PplanError(f"--sweep {text!r}: micro-batch counts must be integers", "write e.g. microbatches=1,2,4,8") from None
    if any(c < 1 or c > 1_000_000 for c in counts):
        raise PplanError(f"--sweep {text!r}: micro-batch counts must be between 1 and 1000000")
    return name, counts


def _row(value: Any, variant: Plan, profile: Profile, calibration: Calibration | None,
         hardware: Hardware | None = None) -> SweepRow:
    """Simulate one variant; a variant that cannot run becomes a row with its reason."""
    from planner.simulate import simulate

    base = dict(value=value, schedule=variant.schedule, n_microbatches=variant.n_microbatches,
                micro_batch_size=variant.micro_batch_size, global_batch=variant.global_batch)
    try:
        variant.validate(profile.n_layers)
        r = simulate(variant, profile, calibration=calibration, record_timeline=False, hardware=hardware)
    except PplanError as e:
        return SweepRow(**base, iteration_ms=None, bubble_fraction=None, throughput_samples_per_s=None,
                        peak_memory_bytes=None, fits=None, error=e.one_line())
    return SweepRow(**base, iteration_ms=r.iteration_ms, bubble_fraction=r.bubble_fraction,
                    throughput_samples_per_s=r.throughput_samples_per_s, peak_memory_bytes=max(r.peak_memory_bytes),
                    fits=r.fits, interpolated=bool(r.interpolated))


def run_sweep(plan: Plan, profile: Profile, parameter: str, values: list[Any],
              calibration: Calibration | None = None, keep: str = "global-batch",
              hardware: Hardware | None = None) -> list[SweepRow]:
    """Simulate `plan` once per value of `parameter` (see the module docstring)."""
    if parameter not in ("microbatches", "schedule"):
        raise PplanError(f"cannot sweep {parameter!r}", "sweep microbatches or schedule")
    rows = []
    for value in values:
        m, b = (value, 0) if parameter == "microbatches" else (plan.n_microbatches, plan.micro_batch_size)
        try:
            if parameter == "microbatches":
                m, b = _split_batch(plan, value, None, keep)
                variant = plan.with_(n_microbatches=m, micro_batch_size=b)
            else:
                variant = plan.with_(schedule=value)
        except PplanError as e:
            rows.append(SweepRow(value, value if parameter == "schedule" else plan.schedule, m, b, m * b,
                                 None, None, None, None, None, e.one_line()))
            continue
        rows.append(_row(value, variant, profile, calibration, hardware))
    return rows


def sweep_grid(plan: Plan, profile: Profile, schedules: Iterable[str], counts: Iterable[int],
               calibration: Calibration | None = None) -> list[SweepRow]:
    """The plan's cuts under each schedule and each micro-batch count, at the plan's global batch; combinations
    a schedule cannot run are left out (the report draws only what can run)."""
    rows = []
    for name in schedules:
        for row in run_sweep(plan.with_(schedule=name, predicted=None, search=None), profile, "microbatches",
                             list(counts), calibration):
            if row.error is None:
                rows.append(row)
    return rows


def sweep_to_dict(plan: Plan, parameter: str, rows: list[SweepRow], keep: str, basis: str) -> dict[str, Any]:
    """The JSON `pplan simulate --sweep --json` prints and `--out` writes."""
    return {"sweep": parameter, "keep": keep if parameter == "microbatches" else None, "basis": basis,
            "schedule": plan.schedule, "n_microbatches": plan.n_microbatches,
            "micro_batch_size": plan.micro_batch_size, "global_batch": plan.global_batch,
            "rows": [r.as_dict() for r in rows]}


@dataclass(frozen=True)
class WhatIfResult:
    """What `pplan simulate` prints and writes: one simulation, or a sweep's rows."""

    setup: Setup
    """Plan, profile and calibration as found."""
    plan: Plan
    """The plan after the what-if changes."""
    calibration: Calibration | None
    """The calibration applied (links given on the command line replace its values)."""
    sim: Any = None
    """SimResult of the plan (None for a sweep)."""
    parameter: str | None = None
    """The swept parameter (None for one simulation)."""
    rows: tuple[SweepRow, ...] = ()
    """The sweep's rows."""
    keep: str = "global-batch"
    """What micro-batch changes kept."""

    @property
    def basis(self) -> str:
        return basis_text(self.calibration, self.setup.calibration_path)

    @property
    def warnings(self) -> tuple[str, ...]:
        """The setup's warnings, and what the profile cannot price for the plan or a swept row (say zb's split backward)."""
        from planner.simulate import unpriced_memory_note

        note = unpriced_memory_note(self.plan, self.setup.profile, (r.schedule for r in self.rows if r.error is None))
        return self.setup.warnings + ((note,) if note else ())


def what_if(plan_path: str | os.PathLike, change: WhatIf = WhatIf(), *, sweep: str | None = None,
            profile: str | os.PathLike | None = None, calibration: str | os.PathLike | None = None, record_timeline: bool = False,
            hardware: str | None = None, outputs: SimulationOutputs = SimulationOutputs()) -> WhatIfResult:
    """Load a plan with its profile and calibration, apply `change`, then simulate it once or, with `sweep`
    ('microbatches=4,8,16' or 'schedule=gpipe,1f1b'), once per value. `record_timeline` keeps every box and the
    memory curve (for a timeline, a Gantt chart or the simulation JSON; a sweep never records them), as does any
    of `outputs`, the files the caller will write from the result, which are checked before any work.
    `hardware` (a preset or hardware JSON) prices a data/tensor-parallel plan instead of the hardware it names
    (PlanError for a one-pipeline plan); such a plan ignores the profile's own calibration (it fits this machine)."""
    from planner.simulate import check_hardware_applies, replica_on_hardware, simulate

    spec = parse_sweep(sweep) if sweep is not None else None
    if spec is not None and outputs.timeline is not None:
        raise PplanError("--timeline cannot be combined with --sweep", "run one simulation per timeline")
    for flag, path in outputs.named():
        ensure_writable_file(path, flag)  # before any work: an output that cannot be written fails now
    setup = load_setup(plan_path, profile, calibration)
    if outputs.named():  # none may replace a file it reads, nor without a calibration given the profile's own
        own, hw_file = calibration_path_for(setup.profile_path), Path(hardware) if hardware and Path(hardware).is_file() else None
        ensure_outputs_distinct(outputs.named(), [("plan", plan_path), ("profile", setup.profile_path), ("hardware file", hw_file),
                                                  ("calibration", setup.calibration_path),
                                                  ("calibration", own if calibration is None and own.exists() else None)])
    record_timeline = record_timeline or bool(outputs.named())
    hw = load_hardware(hardware) if hardware is not None else None
    check_hardware_applies(setup.plan, hw)
    # on another hardware, its devices and links first: --bandwidth and --latency then apply over them
    base = replica_on_hardware(setup.plan, hw) if hw is not None else setup.plan
    plan, cal = apply_what_if(base, setup.calibration, change)
    if spec is None:
        sim = simulate(plan, setup.profile, calibration=cal, record_timeline=record_timeline, hardware=hw)
        return WhatIfResult(setup, plan, cal, sim=sim, keep=change.keep)
    parameter, values = spec
    check_sweep_actions(plan, parameter, values, change.keep)
    rows = run_sweep(plan, setup.profile, parameter, values, calibration=cal, keep=change.keep, hardware=hw)
    if all(r.error for r in rows):
        raise PplanError(f"no value of the sweep can run: {rows[0].error}")
    return WhatIfResult(setup, plan, cal, parameter=parameter, rows=tuple(rows), keep=change.keep)


def check_sweep_actions(plan: Plan, parameter: str, values: list[Any], keep: str = "global-batch") -> int:
    """The compute actions the sweep simulates, all values together; PplanError beyond MAX_SIMULATED_ACTIONS (one
    sweep costs at most what one largest simulation does). A value the batch cannot take counts nothing."""
    from planner.cost import actions_per_microbatch

    total, largest = 0, (None, 0)  # (value, its actions)
    for value in values:
        schedule, m = (plan.schedule, value) if parameter == "microbatches" else (value, plan.n_microbatches)
        if parameter == "microbatches":
            try:
                m = _split_batch(plan, value, None, keep)[0]
            except PplanError:
                continue
        n = actions_per_microbatch(get_schedule(schedule).split_backward) * plan.n_stages * m
        total += n
        largest = (value, n) if n > largest[1] else largest
    if total > MAX_SIMULATED_ACTIONS:
        raise PplanError(f"--sweep {parameter} over {len(values)} values is {total:,} actions to simulate with "
                         f"{plan.n_stages} stages, beyond the simulator's bound of {MAX_SIMULATED_ACTIONS:,} for one command",
                         f"sweep fewer or smaller values (the largest, {largest[0]}, is {largest[1]:,} actions)")
    return total
