"""`pplan run` as a library call: check, launch (or join torchrun), measure, compare, calibrate.

    outcome = run_plan(plan, RunOptions(steps=10), plan_path="plan.json")
    outcome.run["iteration_ms_measured"], outcome.run["error_pct"]

Locally it starts one process per plan device; under torchrun (RANK and WORLD_SIZE set) this
process is one rank: it joins the job and rank 0 writes the results.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.atomic import atomic_write_text
from planner.calibration import Calibration, calibration_path_for, find_calibration, write_calibration
from planner.errors import PplanError
from planner.execute.launch import launch_local
from planner.execute.options import RunOptions
from planner.execute.preflight import Preflight, available_cores, preflight
from planner.execute.results import assemble_run, measured_timeline
from planner.execute.worker import read_env, run_worker
from planner.plan import Plan, plan_to_dict
from planner.simulation.result import TimelineRow

__all__ = ["RunOutcome", "run_plan", "predict"]


@dataclass(frozen=True)
class RunOutcome:
    """What a run produced (on rank 0, or the local launcher)."""

    run: dict[str, Any]
    """The run JSON."""
    timeline: list[TimelineRow]
    """The measured timeline (one step after warm-up)."""
    calibration: Calibration | None = None
    """The calibration fitted from this run (--calibrate)."""
    calibration_path: str | None = None
    """Where it was written."""


def predict(plan: Plan, pf: Preflight) -> tuple[dict[str, Any] | None, str | None, Calibration | None]:
    """(simulation JSON, where it came from, calibration used) for the plan as it is now."""
    if pf.profile is not None:
        from planner.simulate import simulate

        import numpy as np

        cal = find_calibration(pf.profile.path)
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported below, once
            sim = simulate(plan, pf.profile, calibration=cal, record_timeline=False)
        source = "simulate(profile + calibration)" if cal else "simulate(profile)"
        values = [sim.iteration_ms, *sim.busy_ms, *sim.peak_memory_bytes]
        if not all(math.isfinite(v) for v in values):
            raise PplanError(f"the prediction from profile {pf.profile.path!r} is not finite (its values overflow)",
                             "the profile's numbers are absurdly large; re-profile the model")
        return sim.to_dict(), source, cal
    if plan.predicted and isinstance(plan.predicted.get("iteration_ms"), (int, float)):
        return plan.predicted, "plan.predicted", None
    return None, None, None


def run_plan(plan: Plan, opts: RunOptions, *, plan_path: str | None = None, profile_path: str | None = None,
             force: bool = False, out: str | os.PathLike | None = None,
             timeline_path: str | os.PathLike | None = None) -> RunOutcome | None:
    """Run `plan`; returns the outcome (None on ranks other than 0 under torchrun)."""
    env = read_env()
    if env is not None and env.world != plan.n_devices:
        raise PplanError(f"torchrun started {env.world} processes but the plan has {plan.n_devices} devices",
                         f"start {plan.n_devices} in total (--nnodes x --nproc-per-node)")
    pf = preflight(plan, opts, plan_path=plan_path, profile_override=profile_path, force=force,
                   under_torchrun=env is not None, local_world=env.local_world if env else None)
    if opts.calibrate and pf.profile is None:
        raise PplanError("--calibrate needs the plan's profile (to compare with and to store the calibration beside)",
                         "pass --profile PROFILE.csv")
    # Predict before launching: a profile or calibration that cannot give a number fails in a
    # second, not after the whole run.
    prediction, source, used_cal = predict(plan, pf)
    cfg = {"plan": plan_to_dict(plan), "options": opts.to_dict(), "device_type": pf.device_type,
           "model_kwargs": pf.model_kwargs}
    if env is None:
        threads = opts.threads or max(1, available_cores() // plan.n_devices)
        with tempfile.TemporaryDirectory(prefix="pplan-run-") as tmp:
            records = launch_local(cfg, plan.n_devices, Path(tmp), threads, verbose=opts.verbose)
    else:
        records = run_worker(cfg, env)
        if records is None:
            return None
    run = assemble_run(records, plan, plan_path=plan_path, device_type=pf.device_type, steps=opts.steps,
                       warmup=opts.warmup, prediction=prediction, prediction_source=source,
                       calibration=_cal_dict(used_cal))
    rows = measured_timeline(records)
    fitted, cal_path = None, None
    if opts.calibrate and pf.profile is not None:
        from planner.execute.calibrate import fit_calibration

        fitted, report = fit_calibration(run, plan, pf.profile, previous=used_cal, run_path=str(out) if out else None)
        cal_path = str(calibration_path_for(pf.profile.path))
        write_calibration(fitted, cal_path)
        run["calibration_fit"] = dict(report, path=cal_path, calibration=_cal_dict(fitted))
    run = _finite(run)
    if out is not None:
        atomic_write_text(out, json.dumps(run, indent=2, allow_nan=False) + "\n")
    if timeline_path is not None:
        from planner.simulation.timeline import write_timeline

        write_timeline(rows, timeline_path)
    return RunOutcome(run=run, timeline=rows, calibration=fitted, calibration_path=cal_path)


def _finite(obj: Any) -> Any:
    """The run with non-finite numbers as null (JSON has no inf/nan)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _cal_dict(cal: Calibration | None) -> dict[str, Any] | None:
    if cal is None:
        return None
    return {"compute_scale": cal.compute_scale, "action_overhead_ms": cal.action_overhead_ms,
            "comm_latency_ms": cal.comm_latency_ms, "comm_bandwidth_bytes_per_s": cal.comm_bandwidth_bytes_per_s,
            "step_overhead_ms": cal.step_overhead_ms}
