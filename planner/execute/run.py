"""`pplan run` as a library call: check, launch (or join torchrun), measure, compare, calibrate.

    outcome = run_plan(plan, RunOptions(steps=10), plan_path="plan.json")
    outcome.record.iteration_ms_measured, outcome.record.error_pct

A plan naming a `module:factory` model runs only when the caller vouches for it (`model=` the same
spec, or `trust_model=True`: planner.models.trust): a plan someone sent imports nothing by default.

Locally it starts one process per plan device; under torchrun (RANK, WORLD_SIZE set) this process
is one rank: it joins the job and rank 0 writes the results.

A run whose loss stops being finite (a too-large --lr) ends after that step on every rank; the
run JSON is still written, with the losses so far (the non-finite one as null, its text in
`diverged.loss`), and RunError says where it diverged. SIGTERM or SIGHUP of a local run stops the
ranks and removes the run folder (`pplan-run-*` in the temporary directory), then ends by it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from planner.atomic import atomic_write_text
from planner.calibration import Calibration, calibration_path_for, write_calibration
from planner.errors import PplanError, RunError
from planner.execute import checkpoint as ckpt
from planner.execute.fitrecord import as_recorded
from planner.execute.launch import launch_local
from planner.execute.measurement import RankMeasurement
from planner.execute.mesh import world_text
from planner.execute.options import RunOptions
from planner.execute.prediction import predict, unused_machine_file_warnings
from planner.execute.preflight import Preflight, check_host_memory, co_run_advice, preflight
from planner.hostinfo import load_average, usable_cores
from planner.execute.results import assemble_record
from planner.models.trust import check_model_trusted
from planner.execute.runrecord import Divergence, RunRecord
from planner.execute.timeline import measured_timeline, replica0
from planner.execute.worker import Env, read_env, run_worker
from planner.plan import Plan, Prediction, plan_to_dict
from planner.simulation.result import TimelineRow
from planner.warm_start import prestart

__all__ = ["RunOutcome", "run_plan", "co_run_warnings", "CO_RUN_WARN_RATIO", "RUNTIMES",
           "runtime_prefers_torch"]

RUNTIMES = {"torch": True, "plan": False}
"""`pplan run --runtime` names -> RunOptions.prefer_torch: torch's schedule classes where they run the
planned order, or always the plan's own action lists."""


def runtime_prefers_torch(runtime: str) -> bool:
    """RunOptions.prefer_torch of a runtime name (RUNTIMES); PplanError naming it when unknown."""
    if runtime not in RUNTIMES:
        raise PplanError(f"--runtime {str(runtime)[:40]!r} is unknown",
                         "use torch (torch's schedule classes) or plan (the plan's action lists)")
    return RUNTIMES[runtime]


@dataclass(frozen=True)
class RunOutcome:
    """What a run produced (on rank 0, or the local launcher)."""

    record: RunRecord
    """The run (`record.to_dict()` is the run JSON that --out writes)."""
    timeline: list[TimelineRow]
    """The measured timeline (one step after warm-up)."""
    calibration: Calibration | None = None
    """The calibration fitted from this run (--calibrate)."""
    calibration_path: str | None = None
    """Where it was written."""


def run_plan(plan: Plan, opts: RunOptions, *, plan_path: str | None = None, profile_path: str | None = None,
             force: bool = False, out: str | os.PathLike | None = None,
             timeline_path: str | os.PathLike | None = None, machine: str | os.PathLike | None = None,
             use_machine: bool = True, model: str | None = None, trust_model: bool = False,
             on_start: Callable[[], None] | None = None) -> RunOutcome | None:
    """Run `plan`; returns the outcome (None on ranks other than 0 under torchrun).

    `model`, `trust_model`: vouch for a `module:factory` model (the same spec, or trust whatever the
    plan names); without either such a plan is refused before anything is imported or started
    (planner.models.trust.check_model_trusted), and a `model` other than the plan's is refused.
    `machine`: a machine file (planner.machine) to predict with when the profile has no
    calibration beside it; `use_machine=False` predicts from the profile alone. `on_start()` once every check passed.
    """
    # first: the preflight builds the model, which imports a factory's module
    check_model_trusted(plan.model, model, trust_model, source=f"plan {plan_path!r}" if plan_path else "the plan")
    env = read_env()
    if env is None:  # a local run: its rank server imports torch while this process checks the plan
        prestart()
    pf = _check_before_launch(plan, opts, env, plan_path=plan_path, profile_path=profile_path, force=force)
    # Predict before launching: no number, or ranks that cannot fit here, fail in a second, not after the run.
    prediction, source, used_cal = predict(plan, pf, machine=machine, use_machine=use_machine)
    check_host_memory(plan, prediction, pf.device_type, local_world=env.local_world if env else None, force=force)
    load_before = load_average()  # before the ranks add theirs
    if on_start is not None:  # after every refusal: a "running ..." line before one would make it two lines
        on_start()
    measurements = _launch(plan, opts, pf, env)
    if measurements is None:
        return None
    lead = replica0(measurements)  # the pipeline the simulator describes
    record = assemble_record(measurements, plan, plan_path=plan_path, device_type=pf.device_type, steps=opts.steps,
                             warmup=opts.warmup, prediction=prediction, prediction_source=source,
                             calibration=as_recorded(used_cal), load_average=load_before,
                             profile_load_average=_profile_load(pf),
                             compute_ratio=_compute_ratio(lead, plan, pf, used_cal),
                             compute_ratio_cpu=_compute_ratio(lead, plan, pf, used_cal, cpu_time=True),
                             grad_allreduce_ms_predicted=_grad_allreduce_predicted(plan, pf, prediction))
    record = record.with_(warnings=record.warnings + list(pf.warnings) + _thread_warnings(measurements, pf)
                          + co_run_warnings([m.host for m in measurements], pf, record.compute_ratio)
                          + unused_machine_file_warnings(machine, source, pf))
    rows = measured_timeline(lead)
    if record.diverged:
        _write(record, rows, out, timeline_path)
        raise _diverged_error(record.diverged, plan, opts, out)
    fitted, cal_path = None, None
    if opts.calibrate and pf.profile is not None:
        record, fitted, cal_path = _calibrate_from(record, plan, pf, used_cal, out)
    _write(record, rows, out, timeline_path)
    return RunOutcome(record=record, timeline=rows, calibration=fitted, calibration_path=cal_path)


def _check_before_launch(plan: Plan, opts: RunOptions, env: Env | None, *, plan_path: str | None,
                         profile_path: str | None, force: bool) -> Preflight:
    """Refuse, before any process starts, a torchrun job of the wrong size, a plan the preflight
    refuses, and --calibrate without a profile; returns the preflight's findings."""
    world = plan.n_processes
    if env is not None and env.world != world:
        raise PplanError(f"torchrun started {env.world} processes but the plan needs {world} "
                         f"({world_text(plan)})",
                         f"start {world} in total (--nnodes x --nproc-per-node)")
    pf = preflight(plan, opts, plan_path=plan_path, profile_override=profile_path, force=force,
                   under_torchrun=env is not None, local_world=env.local_world if env else None)
    if opts.calibrate and pf.profile is None:
        raise PplanError("--calibrate needs the plan's profile (to compare with and to store the calibration beside)",
                         "pass --profile PROFILE.csv")
    if opts.calibrate:  # ZeRO over one replica: the fit at the end could not simulate it calibrated
        from planner.execute.calibrate import check_calibratable

        check_calibratable(plan)
    return pf


def _launch(plan: Plan, opts: RunOptions, pf: Preflight, env: Env | None) -> list[RankMeasurement] | None:
    """Train: one local process per rank, or this process as one rank of a torchrun job. Returns
    the ranks' measurements (None on torchrun ranks other than 0)."""
    world = plan.n_processes
    cfg = {"plan": plan_to_dict(plan), "options": opts.to_dict(), "device_type": pf.device_type,
           "model_kwargs": pf.model_kwargs}
    if opts.checkpoint_dir:
        cfg["resume"] = _resume(plan, opts, say=env is None or env.rank == 0)
    if env is not None:
        return run_worker(cfg, env)
    threads = opts.threads or max(1, usable_cores() // world)
    with _signals_end_the_run():
        with tempfile.TemporaryDirectory(prefix="pplan-run-") as tmp:
            return launch_local(cfg, world, Path(tmp), threads, verbose=opts.verbose)


def _diverged_error(diverged: Divergence, plan: Plan, opts: RunOptions, out: str | os.PathLike | None) -> RunError:
    """The error of a run whose loss stopped being finite: where, and what was (not) kept."""
    kept = f"; wrote the run with the losses so far to {str(out)!r} (non-finite as null)" if out is not None else ""
    return RunError(f"training diverged: the loss became {diverged.loss} at step {diverged.step + 1} of {opts.steps} "
                    f"(--lr {opts.lr:g}, optimizer {plan.optimizer}){kept}",
                    "lower --lr" + ("" if out is not None else "; pass --out to keep the losses of such a run")
                    + ("; no checkpoint was saved from the diverged weights" if opts.checkpoint_dir else ""))


def _calibrate_from(record: RunRecord, plan: Plan, pf: Preflight, used_cal: Calibration | None,
                    out: str | os.PathLike | None) -> tuple[RunRecord, Calibration, str]:
    """--calibrate: fit a calibration to this run, write it beside the profile, and note the fit in
    the record. Returns (the record with `calibration_fit`, the calibration, where it was written)."""
    from planner.execute.calibrate import fit_from_run

    cal_path = str(calibration_path_for(pf.profile.path))
    fitted, fit = fit_from_run(record, plan, pf.profile, previous=used_cal, run_path=str(out) if out else None,
                               calibration_path=cal_path)
    write_calibration(fitted, cal_path)
    return record.with_(calibration_fit=fit), fitted, cal_path


def _grad_allreduce_predicted(plan: Plan, pf: Preflight, prediction: Prediction | None) -> float | None:
    """The slowest rank's gradient all-reduce as predicted (planner.execute.calibrate's
    rank_grad_allreduce_ms: all of a rank's stages at once); without a profile, the prediction's
    own figure (its largest stage's sync)."""
    if plan.dp <= 1:
        return None
    if pf.profile is not None:
        from planner.execute.calibrate import rank_grad_allreduce_ms

        return rank_grad_allreduce_ms(plan, pf.profile)
    return prediction.grad_sync_ms if prediction is not None else None


def _profile_load(pf: Preflight) -> float | None:
    """The load average the profile recorded in its metadata (`# load_average: 0.42`), if any."""
    value = pf.profile.meta.get("load_average") if pf.profile is not None else None
    try:
        load = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return load if load is not None and math.isfinite(load) and load >= 0 else None


def _compute_ratio(measurements: list[RankMeasurement], plan: Plan, pf: Preflight, cal: Calibration | None,
                   cpu_time: bool = False) -> float | None:
    """planner.execute.calibrate's compute_ratio of the run's actions (calibration applied);
    `cpu_time` compares the actions' CPU time instead of their wall time, except for the built-in
    synthetic model, whose layers sleep: their CPU time is no measure of them (a 0.19x "the
    computation itself ran faster" was the sleep, not the machine)."""
    if pf.profile is None or (cpu_time and (plan.model or "").split(":", 1)[0] == "synthetic"):
        return None
    from planner.execute.calibrate import compute_ratio

    return compute_ratio([(list(m.stages), m.action_cpu_ms if cpu_time else m.action_ms) for m in measurements],
                         plan, pf.profile, cal)


def _thread_warnings(measurements: list[RankMeasurement], pf: Preflight) -> list[str]:
    """A line when the ranks ran with another torch thread count than the profile measured with."""
    if pf.profile is None:
        return []
    try:
        prof = int(pf.profile.meta.get("threads") or 0)
    except ValueError:
        return []
    used = sorted({m.threads for m in measurements})
    if prof and used and used != [prof]:
        return [f"the ranks ran {'/'.join(map(str, used))} torch thread(s), the profile was measured with {prof}: "
                f"re-profile with --threads {used[0]} (or run with --threads {prof})"]
    return []


CO_RUN_WARN_RATIO = 1.1
"""Suggest `--co-run` when a CPU run's actions took more than this factor of a profile measured alone."""


def co_run_warnings(hosts: list[str], pf: Preflight, compute_ratio: float | None) -> list[str]:
    """The run's advice to re-profile with --co-run: a list of one line when a CPU run's actions
    took more than CO_RUN_WARN_RATIO times their profiled time (`compute_ratio`) and the profile
    measured its layers beside fewer processes than this run had ranks on one host (memory-bound
    layers slow each other down); else an empty list. `hosts`: each rank's host name."""
    if pf.profile is None or pf.device_type != "cpu" or compute_ratio is None or compute_ratio <= CO_RUN_WARN_RATIO:
        return []
    per_host: dict[str, int] = {}
    for host in hosts:
        per_host[host] = per_host.get(host, 0) + 1
    want = max(per_host.values(), default=1) - 1
    try:
        had = int(pf.profile.meta.get("co_run") or 0)
        threads = int(pf.profile.meta.get("threads") or 1)  # a co-run needs that many cores a process
    except ValueError:
        return []
    if want < 1 or had >= want or pf.profile.meta.get("analytic") == "true":
        return []
    return [f"actions took {compute_ratio:.2f}x their profiled time with {want + 1} ranks on one machine, and the "
            f"profile measured its layers beside {had} other process(es): memory-bound layers slow each other "
            f"down; {co_run_advice(want, threads, usable_cores())} (docs/simulator.md)"]



def _write(record: RunRecord, rows: list[TimelineRow], out: str | os.PathLike | None,
           timeline_path: str | os.PathLike | None) -> None:
    if out is not None:
        atomic_write_text(out, json.dumps(record.to_dict(), indent=2, allow_nan=False) + "\n")
    if timeline_path is not None:
        from planner.simulation.timeline import write_timeline

        write_timeline(rows, timeline_path)


def _resume(plan: Plan, opts: RunOptions, say: bool) -> dict[str, Any]:
    """Choose, once for every rank, the save to resume from; refuse saves that cannot be made."""
    found = ckpt.resume_point(opts.checkpoint_dir, plan)
    if found is not None and found.skipped and say:
        for line in found.skipped:
            sys.stderr.write(f"pplan: warning: checkpoint {line}; skipping that save\n")
        sys.stderr.write(f"pplan: warning: resuming from the previous complete save {found.folder} (step {found.step})\n")
        sys.stderr.flush()
    start = found.step if found is not None else 0
    ckpt.check_save_targets(opts.checkpoint_dir, ckpt.save_steps(start, opts.steps, opts.checkpoint_every))
    return {"step": start, "folder": str(found.folder) if found is not None else None}


class _Ended(BaseException):
    """SIGTERM/SIGHUP arrived: unwind (stop the ranks, remove the run folder), then die by it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_end_the_run():
    """Turn SIGTERM and SIGHUP into an exception for the duration of a local run, so the `finally` blocks
    stop the ranks and remove the run folder; then the process ends by the same signal, as it would have."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        if fired:
            return  # already unwinding: let the cleanup finish
        fired.append(signum)
        raise _Ended(signum)

    # one ignored (nohup) stays ignored: the run outlives the terminal, as the user asked
    sigs = [s for s in [signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
            if signal.getsignal(s) is not signal.SIG_IGN]
    old = {sig: signal.signal(sig, handler) for sig in sigs}
    try:
        yield
    except _Ended as e:
        for sig, h in old.items():
            signal.signal(sig, h)
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(e.signum, signal.SIG_DFL)
        os.kill(os.getpid(), e.signum)
        raise SystemExit(128 + e.signum) from None  # not reached: the signal ends the process
    finally:
        if not fired:
            for sig, h in old.items():
                signal.signal(sig, h)
