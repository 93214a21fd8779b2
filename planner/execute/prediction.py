"""What `pplan run` compares its measurement with: the plan simulated here, before any process starts.

The prediction is the simulator's, on the profile the preflight read, with the most specific
calibration there is: the per-plan one beside the profile (`pplan run --calibrate`), else the
machine file's entry for the plan's process count (`pplan calibrate --machine`), else none.
"""

from __future__ import annotations

import math
import os

from planner.calibration import Calibration, calibration_path_for, find_calibration
from planner.errors import PlanError, PplanError
from planner.execute.preflight import Preflight
from planner.plan import Plan, Prediction

__all__ = ["predict", "unused_machine_file_warnings", "PER_PLAN_SOURCE"]

PER_PLAN_SOURCE = "simulate(profile + calibration)"
"""The prediction's source when the profile's own (per-plan) calibration priced it."""


def predict(plan: Plan, pf: Preflight, *, machine: str | os.PathLike | None = None,
            use_machine: bool = True) -> tuple[Prediction | None, str | None, Calibration | None]:
    """(prediction, where it came from, calibration used) for the plan as it is now.

    Calibration: the per-plan one beside the profile when it exists, else the machine file
    (`machine`, else planner.machine.find_machine's default: $PPLAN_MACHINE or
    ~/.cache/pplan/machine.json) measured for this device type: its entry for the plan's process
    count, else the nearest count measured (the source names the count used), else none.
    A data/tensor-parallel plan gets `pplan simulate`'s prediction for it: one replica priced on
    its hardware preset, uncalibrated (the source names layout and preset).
    """
    if pf.profile is None:
        if plan.predicted is not None and isinstance(plan.predicted.iteration_ms, (int, float)):
            return plan.predicted, "plan.predicted", None
        return None, None, None
    from planner.simulate import is_replica_plan, simulate

    import numpy as np

    priced = _layout_hardware(plan) if is_replica_plan(plan) else None
    cal, machine_source = None, ""
    if priced is None:
        cal = find_calibration(pf.profile.path)
        if cal is None and use_machine:
            from planner.machine import find_machine, machine_calibration

            # every process of the plan shares this machine's cores: the entry measured with that many
            found = find_machine(machine, device_type=pf.device_type, ranks=plan.n_processes)
            if found is not None:
                cal, machine_source = machine_calibration(found), _machine_text(found.ranks, plan.n_processes)
    # a data/tensor-parallel plan: what `pplan simulate` predicts for it, one replica priced on its
    # hardware with the tp split, its collectives and the gradient sync (which the measured step
    # includes), uncalibrated as simulate does (a calibration fits one pipeline of whole layers);
    # without a preset to price those on, one pipeline of whole layers, and the label says so
    one = plan.with_(parallel=None) if is_replica_plan(plan) and priced is None else plan
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported below, once
        sim = simulate(one, pf.profile, calibration=cal, record_timeline=False)
    source = (PER_PLAN_SOURCE if cal else "simulate(profile)") if not machine_source \
        else f"simulate(profile + {machine_source})"
    if priced is not None:
        source += f", {plan.parallel.describe()} on {priced}"
    elif one is not plan:
        source += ", one replica of whole layers: no tp split, collectives or gradient all-reduce (no hardware preset)"
    values = [sim.iteration_ms, *sim.busy_ms, *sim.peak_memory_bytes]
    if not all(math.isfinite(v) for v in values):
        raise PplanError(f"the prediction from profile {pf.profile.path!r} is not finite (its values overflow)",
                         "the profile's numbers are absurdly large; re-profile the model")
    return sim.prediction(), source, cal


def unused_machine_file_warnings(machine: str | os.PathLike | None, source: str | None, pf: Preflight) -> list[str]:
    """A machine file the caller named but the prediction did not use, said once: the profile's own
    calibration (fitted by a run of this plan) is more specific and wins, so the named file changed nothing."""
    if machine is None or source != PER_PLAN_SOURCE or pf.profile is None:
        return []
    return [f"--machine-file {os.fspath(machine)} was not used: the profile's own calibration "
            f"{calibration_path_for(pf.profile.path)} (fitted by a run of this plan) priced the prediction; "
            "move that file away to predict with the machine file"]


def _layout_hardware(plan: Plan) -> str | None:
    """The hardware a data/tensor-parallel plan is priced on (planner.simulate.plan_hardware), or None
    when it records none and names no preset: a hand-written plan the run executes but simulate cannot price."""
    from planner.simulate import plan_hardware

    try:
        return plan_hardware(plan).name
    except PlanError:
        return None


def _machine_text(measured: int, wanted: int) -> str:
    """Which entry of the machine file a prediction used: 'machine, 8 ranks', or the nearest
    count measured when the plan's was not ('machine, 4 ranks for 6')."""
    return f"machine, {measured} ranks" + ("" if measured == wanted else f" for {wanted}")
