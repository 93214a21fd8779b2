"""One what-if question answered: a plan's inputs found, the change applied, then one simulation or a sweep.

`pplan simulate` calls `what_if`; it sits above the simulator (it calls `planner.simulate`) and below the
figures, and imports neither torch nor matplotlib. It finds a plan's inputs (`load_setup`), checks the outputs
a caller will write (`SimulationOutputs`), and returns what the command prints (`WhatIfResult`). The change
itself is `planner.whatif.change`; a sweep's rows are `planner.whatif.sweep`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from planner.atomic import ensure_outputs_distinct, ensure_writable_file
from planner.calibration import Calibration, basis_text, calibration_mismatch, calibration_path_for
from planner.machine import prediction_basis
from planner.errors import PplanError
from planner.hardware import load_hardware
from planner.plan import Plan, load_plan, require_profile_path
from planner.plan.checks import profile_change
from planner.profiling.profile import Profile, load_profile
from planner.whatif.change import WhatIf, apply_what_if, check_with_sweep, what_if_changes
from planner.whatif.sweep import SweepRow, check_sweep_actions, parse_sweep, run_sweep, skipped_note, sweep_refusal

__all__ = ["SimulationOutputs", "Setup", "WhatIfResult", "load_setup", "what_if"]


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
            suffixes = self.SUFFIXES[flag]
            if Path(path).suffix.lower() not in suffixes:
                formats = " or ".join(s[1:].upper() for s in suffixes)
                raise PplanError(f"{flag} {str(path)!r} must end in {' or '.join(suffixes)}",
                                 f"it is written as {formats}" + (", chosen by the suffix" if len(suffixes) > 1 else ""))

    def named(self) -> list[tuple[str, str | os.PathLike]]:
        """(flag, path) of each output given, in the order they are checked."""
        return [(flag, p) for flag, p in (("--plot", self.plot), ("--out", self.out), ("--timeline", self.timeline)) if p is not None]


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
    path = require_profile_path(plan, plan_path, profile)
    prof = load_profile(path)
    cal, cal_path = prediction_basis(prof, calibration, ranks=plan.n_devices)  # the machine entry for its ranks
    warnings = (profile_change(plan, prof), calibration_mismatch(cal, prof, cal_path))
    return Setup(plan, prof, path, cal, cal_path, tuple(w for w in warnings if w))


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
    changes: dict[str, dict[str, Any]] | None = None
    """What the what-if flags changed, {field: {"plan": old, "now": new}} (None: no flag given)."""

    @property
    def basis(self) -> str:
        return basis_text(self.calibration, self.setup.calibration_path)

    @property
    def warnings(self) -> tuple[str, ...]:
        """The setup's warnings, and what the profile cannot price for the plan or a swept row (say zb's split backward)."""
        from planner.simulate import unpriced_memory_note

        note = unpriced_memory_note(self.plan, self.setup.profile, (r.schedule for r in self.rows if r.error is None))
        flops = None
        if self.plan.parallel is not None:  # the output then gives MFU and TFLOP/s: say what their FLOPs leave out
            from planner.cost.model_flops import model_flops

            flops = model_flops(self.setup.profile, self.plan.global_batch).warning
        return self.setup.warnings + tuple(w for w in (note, flops) if w)

    @property
    def skipped(self) -> str | None:
        """For a sweep some of whose values cannot run, the line naming each (bounded) with its reason; else None."""
        return skipped_note(self.parameter, self.rows) if self.parameter is not None else None


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
    check_with_sweep(change, spec[0] if spec is not None else None)
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
        return WhatIfResult(setup, plan, cal, sim=sim, keep=change.kept,
                            changes=what_if_changes(setup.plan, plan, change, hardware))
    parameter, values = spec
    check_sweep_actions(plan, parameter, values, change.kept)
    rows = run_sweep(plan, setup.profile, parameter, values, calibration=cal, keep=change.kept, hardware=hw)
    if all(r.error for r in rows):
        raise sweep_refusal(plan, setup.profile, parameter, rows, calibration=cal, hardware=hw)
    return WhatIfResult(setup, plan, cal, parameter=parameter, rows=tuple(rows), keep=change.kept)
