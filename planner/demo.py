"""`pplan demo`: the whole pipeline on a built-in gpt, on this machine's CPU, in a few minutes.

profile -> choose a memory limit -> partition -> simulate -> run (measure, calibrate) -> re-plan
-> re-simulate -> run again -> run the uniform split for comparison -> report.

The memory limit is computed, not hard-coded: pplan's least memory comes from the planner's
least-memory search (partition/diagnose.py), the uniform (equal-layer) split's from the same
search over its own cuts, recompute auto; the limit lies between them, checked so that the naive split cannot fit
and pplan's plan can. Both runs of the planned pipeline are real (`planner.execute`); the accuracy
after calibration is checked on the second run, not on the run it was fitted to.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from planner.demo_limit import LimitChoice, choose_memory_limit, partition_settings
from planner.execute import trust
from planner.units import format_bytes, format_ms, format_size_up

if TYPE_CHECKING:
    from planner.execute.runrecord import RunRecord

__all__ = ["DemoSettings", "DemoResult", "FULL", "QUICK", "NOISE", "run_demo", "choose_memory_limit", "step_spread", "uniform_plan"]


@dataclass(frozen=True)
class DemoSettings:
    """What the demo profiles, plans and runs."""

    model: str
    """Built-in model spec (a gpt with a large vocabulary: heavy embedding and LM head)."""
    micro_batch_sizes: tuple[int, ...]
    """Sizes the profile measures."""
    global_batch: int
    """Samples per training step."""
    n_microbatches: int
    """Micro-batches per step (fixed, so plan and uniform split train the same way)."""
    n_devices: int
    """Pipeline devices (one CPU process each)."""
    steps: int
    """Training steps per run."""
    warmup: int
    """Steps of each run left out of the timing."""
    profile_repeats: int
    """Timed repeats per layer and size (the median is kept)."""
    profile_warmup: int
    """Untimed runs per layer and size."""


FULL = DemoSettings(model="gpt:layers=8,hidden=128,heads=4,seq=128,vocab=16384", micro_batch_sizes=(1, 2, 4),
                    global_batch=16, n_microbatches=8, n_devices=2, steps=16, warmup=3,
                    profile_repeats=9, profile_warmup=2)
QUICK = DemoSettings(model="gpt:layers=6,hidden=32,heads=2,seq=64,vocab=4096", micro_batch_sizes=(1, 2),
                     global_batch=4, n_microbatches=2, n_devices=2, steps=3, warmup=1,
                     profile_repeats=2, profile_warmup=1)


@dataclass(frozen=True)
class DemoResult:
    """The numbers that matter, and where everything was written."""

    out_dir: Path
    """Report folder (inputs under data/)."""
    html: Path
    """report.html."""
    limit: LimitChoice
    """The memory limit and how it was chosen."""
    first_predicted_ms: float
    """Prediction for the first run, before calibration."""
    first_measured_ms: float
    """Measured step time of the first run."""
    predicted_ms: float
    """Prediction for the final plan after calibration."""
    measured_ms: float
    """Measured step time of the final plan (second run)."""
    uniform_predicted_ms: float
    """Calibrated prediction for the uniform split (same schedule and micro-batches, no limit)."""
    uniform_measured_ms: float
    """Measured step time of the uniform split, run without the limit."""
    peak_predicted_bytes: float
    """Largest predicted per-device peak of the final plan."""
    peak_measured_bytes: float | None
    """Largest measured per-device peak of the final plan."""
    elapsed_s: float
    """Wall time of the whole demo."""
    noisy: tuple[str, ...] = ()
    """Runs whose step times varied so much that another load probably shared the machine."""
    device_peaks: tuple[tuple[float, float | None], ...] = ()
    """(predicted, measured or None) peak of each device, in device order: the largest of each side
    can be two devices' (97.9 MiB predicted on dev 0, 97.3 measured on dev 1)."""

    def summary(self) -> list[tuple[str, str]]:
        """(quantity, value) rows: printed at the end and shown first in the report."""
        lim = self.limit
        def err(p: float, m: float) -> str:
            return f"{(p - m) / m:+.1%}" if m > 0 else "n/a"
        peak = f"predicted {format_bytes(self.peak_predicted_bytes)}"
        if self.peak_measured_bytes:
            peak += f", measured {format_bytes(self.peak_measured_bytes)}"
        if len(self.device_peaks) > 1:  # the two largest may be different devices': say each one's
            peak = "largest " + peak + " (" + "; ".join(
                f"dev {i}: {format_bytes(pred)}" + (f" / {format_bytes(meas)}" if meas else "")
                for i, (pred, meas) in enumerate(self.device_peaks)) + (
                " predicted / measured)" if self.peak_measured_bytes else " predicted)")
        return [
            ("memory limit per device", f"{format_bytes(lim.limit_bytes)} ({lim.rule})"),
            ("the uniform split", f"cannot fit {format_bytes(lim.limit_bytes)} per device even with recompute "
                                  f"(checked by the planner); it fits at {format_size_up(lim.uniform_floor_bytes)}"),
            ("peak memory of pplan's plan", f"{peak}; limit {format_bytes(lim.limit_bytes)}"),
            ("step time before calibration", f"predicted {format_ms(self.first_predicted_ms)}, measured "
                                             f"{format_ms(self.first_measured_ms)} "
                                             f"({err(self.first_predicted_ms, self.first_measured_ms)}; the first plan "
                                             "and its run, which the calibration is fitted on)"),
            ("step time after calibration", f"predicted {format_ms(self.predicted_ms)}, measured "
                                            f"{format_ms(self.measured_ms)} ({err(self.predicted_ms, self.measured_ms)}; "
                                            "a new run, not the one calibrated on)"),
            ("speedup over the uniform split", f"{self.uniform_measured_ms / self.measured_ms:.2f}x measured "
                                               f"({format_ms(self.uniform_measured_ms)} vs {format_ms(self.measured_ms)}), "
                                               f"{self.uniform_predicted_ms / self.predicted_ms:.2f}x predicted; the uniform "
                                               "split run as a user would if memory allowed: same schedule and "
                                               "micro-batches, no recompute, limit lifted"),
        ] + ([("timing noise", f"step times of {', '.join(self.noisy)} varied by more than {NOISE:.0%} of their "
                               "median: something else was probably running; rerun on a quiet machine")]
             if self.noisy else [])


NOISE = 0.25  # step_spread of a run above this: flagged as noisy


def step_spread(steps: list[float], measured: list[int]) -> float:
    """(max - min) / median of a run's timed steps (`measured` indexes `steps`; empty: all), as
    `pplan run` measures it (execute/trust.py); 0 with fewer than 3, too few to tell noise from a slow step."""
    measured = measured or list(range(len(steps)))
    if sum(0 <= i < len(steps) for i in measured) < 3:
        return 0.0
    pct = trust.step_spread(steps, measured)[3]
    return pct / 100.0 if pct is not None else 0.0


def _stderr(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def uniform_plan(plan: Any) -> Any:
    """The plan's schedule and micro-batches with equal layer counts per stage, no recompute, no limit."""
    from planner.partition.baselines import uniform_cuts
    from planner.plan import StagePlan

    cuts = uniform_cuts(plan.n_layers, plan.n_stages)
    stages = tuple(StagePlan(device=st.device, layers=(cuts[i], cuts[i + 1])) for i, st in enumerate(plan.stages))
    devices = tuple(replace(d, memory_bytes=None) for d in plan.devices)
    return plan.with_(stages=stages, devices=devices, predicted=None, search=None)


def _write_json(path: Path, data: Any) -> None:
    from planner.atomic import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=2, allow_nan=False) + "\n")


@dataclass
class _Demo:
    """What every step of one demo shares: settings, folders, the clock and the progress line."""

    s: DemoSettings
    quick: bool
    out: Path
    emit: Callable[[str], None]
    started: float
    threads: int

    @property
    def data(self) -> Path:
        return self.out / "data"

    def step(self, n: int, text: str) -> None:
        elapsed = time.perf_counter() - self.started
        self.emit(f"[{elapsed:5.0f}s] {n}/8 {text}")


def run_demo(out_dir: str | os.PathLike = "reports/demo", quick: bool = False,
             say: Callable[[str], None] | None = None) -> DemoResult:
    """Run the whole pipeline and write the report to `out_dir` (inputs under `out_dir/data`)."""
    from planner.atomic import ensure_writable_dir
    from planner.hostinfo import usable_cores
    from planner.report.document import check_replaceable

    s = QUICK if quick else FULL
    out = Path(out_dir)
    ensure_writable_dir(out, "demo report folder")  # before minutes of profiling and training
    check_replaceable(out)  # and a folder with someone's own figures/ or report.md: refused now, not at step 8
    (out / "data").mkdir(parents=True, exist_ok=True)
    d = _Demo(s, quick, out, say or _stderr, time.perf_counter(), max(1, usable_cores() // s.n_devices))
    profile = _profile_step(d)
    d.step(2, "choosing a memory limit the uniform split cannot meet")
    limit = choose_memory_limit(profile, s)
    d.emit(f"        limit {format_bytes(limit.limit_bytes)} per device: {limit.rule}")
    first, run1, cal = _first_run_step(d, profile, limit)
    final, sim, basis = _replan_step(d, profile, limit, cal)
    d.step(6, "running the re-planned pipeline to check the calibrated prediction")
    run2 = _run(d, final, "plan.json", "run.json", "measured_timeline.csv")
    uniform_pred, run3 = _uniform_step(d, profile, final, cal)
    result = _result(d, limit, run1.record, run2.record, run3.record, sim, uniform_pred)
    d.step(8, f"writing the report to {out}")
    _report_step(d, profile, final, sim, basis, run2, result)
    result = replace(result, elapsed_s=time.perf_counter() - d.started)
    _write_json(d.data / "demo.json", _result_dict(result))
    return result


def _profile_step(d: _Demo) -> Any:
    """1: measure the model with as many threads as each pipeline rank will have."""
    from planner.calibration import calibration_path_for
    from planner.profiling.profile import load_profile, write_profile
    from planner.profiling.profiler import profile_model

    s = d.s
    d.step(1, f"profiling {s.model} at micro-batch sizes {','.join(map(str, s.micro_batch_sizes))} "
              f"({d.threads} thread{'s' if d.threads > 1 else ''}, as each pipeline rank will have)")
    seen = [0]

    def profiled(done: int, total: int, note: str) -> None:
        if done == total or done - seen[0] >= max(1, total // 6):
            seen[0] = done
            elapsed = time.perf_counter() - d.started
            left = f", about {elapsed * (total - done) / done:.0f}s left" if done < total else ""
            d.emit(f"        {100 * done // total}% of the estimated work ({note}; {elapsed:.0f}s{left})")

    prof_path = d.data / "profile.csv"
    calibration_path_for(prof_path).unlink(missing_ok=True)  # an earlier demo's calibration would skew the first prediction
    measured = profile_model(s.model, list(s.micro_batch_sizes), warmup=s.profile_warmup, repeats=s.profile_repeats,
                             threads=d.threads, command="pplan demo" + (" --quick" if d.quick else ""), on_step=profiled)
    write_profile(measured, prof_path)
    return load_profile(prof_path)  # carries its path and checksum into the plans


def _run(d: _Demo, plan: Any, plan_name: str, out_name: str, timeline_name: str | None, calibrate: bool = False) -> Any:
    """Train `plan` for the demo's steps on one process per device."""
    from planner.execute.options import RunOptions
    from planner.execute.run import run_plan

    opts = RunOptions(steps=d.s.steps, warmup=d.s.warmup, device="cpu", calibrate=calibrate, threads=d.threads)
    return run_plan(plan, opts, plan_path=str(d.data / plan_name), profile_path=str(d.data / "profile.csv"),
                    out=d.data / out_name, timeline_path=d.data / timeline_name if timeline_name else None)


def _first_run_step(d: _Demo, profile: Any, limit: LimitChoice) -> tuple[Any, Any, Any]:
    """3-4: plan under the limit on the profile alone, run it, and fit a calibration on that run."""
    from planner.calibration import calibration_path_for, load_calibration
    from planner.partition.api import partition
    from planner.plan import write_plan

    d.step(3, f"partitioning over {d.s.n_devices} devices under {format_bytes(limit.limit_bytes)}")
    first = partition(profile, partition_settings(profile, d.s, limit.limit_bytes)).plan
    write_plan(first, d.data / "plan_first.json")
    d.emit(f"        {_describe(first)}; predicted {format_ms(first.predicted.iteration_ms)} per step")
    d.step(4, f"running it: {d.s.steps} steps on {d.s.n_devices} processes, then calibrating the simulator")
    run1 = _run(d, first, "plan_first.json", "run_first.json", "measured_timeline_first.csv", calibrate=True)
    cal_path = calibration_path_for(d.data / "profile.csv")
    d.emit(f"        measured {format_ms(run1.record.iteration_ms_measured)}, predicted "
           f"{format_ms(run1.record.iteration_ms_predicted)}; calibration written to {cal_path}")
    return first, run1, load_calibration(cal_path)


def _replan_step(d: _Demo, profile: Any, limit: LimitChoice, cal: Any) -> tuple[Any, Any, str]:
    """5: plan again with the calibration and simulate the new plan; (plan, simulation, its basis)."""
    from planner.calibration import basis_text, calibration_path_for
    from planner.partition.api import partition
    from planner.plan import write_plan
    from planner.simulate import simulate
    from planner.simulation.timeline import write_timeline

    d.step(5, "re-planning and re-simulating with the calibration")
    final = partition(profile, partition_settings(profile, d.s, limit.limit_bytes), calibration=cal).plan
    write_plan(final, d.data / "plan.json")
    sim = simulate(final, profile, calibration=cal)
    basis = basis_text(cal, calibration_path_for(d.data / "profile.csv"))  # as `pplan simulate` records it
    _write_json(d.data / "sim.json", replace(sim.record(), basis=basis).to_dict())
    write_timeline(sim.timeline, d.data / "timeline.csv")
    d.emit(f"        {_describe(final)}; predicted {format_ms(sim.iteration_ms)} per step")
    return final, sim, basis


def _uniform_step(d: _Demo, profile: Any, final: Any, cal: Any) -> tuple[float, Any]:
    """7: the equal-layer split with the plan's schedule and micro-batches, limit lifted, predicted and run."""
    from planner.plan import write_plan
    from planner.simulate import simulate

    d.step(7, "running the uniform split (same schedule and micro-batches, limit lifted) for comparison")
    uniform = uniform_plan(final)
    write_plan(uniform, d.data / "plan_uniform.json")
    predicted = simulate(uniform, profile, calibration=cal, record_timeline=False).iteration_ms
    return predicted, _run(d, uniform, "plan_uniform.json", "run_uniform.json", None)


def _result(d: _Demo, limit: LimitChoice, run1: RunRecord, run2: RunRecord, run3: RunRecord,
            sim: Any, uniform_pred: float) -> DemoResult:
    """The numbers that matter, with a warning when the machine was busy."""
    runs = (("the first run", run1), ("the second run", run2), ("the uniform split's run", run3))
    noisy = tuple(name for name, r in runs if step_spread(r.step_ms, r.measured_steps) > NOISE)
    if noisy:
        d.emit(f"        warning: step times of {', '.join(noisy)} varied by more than {NOISE:.0%}: the machine "
               "seems busy with something else, so the times are noisy")
    fit = run1.calibration_fit
    peaks = [r.peak_memory_bytes_measured for r in run2.ranks]
    measured = {r.device: r.peak_memory_bytes_measured for r in run2.ranks}  # the demo's plan: one rank a device
    return DemoResult(
        out_dir=d.out, html=d.out / "report.html", limit=limit,
        first_predicted_ms=float(fit.predicted_ms_before if fit is not None else run1.iteration_ms_predicted),
        first_measured_ms=float(run1.iteration_ms_measured),
        predicted_ms=float(sim.iteration_ms), measured_ms=float(run2.iteration_ms_measured),
        uniform_predicted_ms=float(uniform_pred), uniform_measured_ms=float(run3.iteration_ms_measured),
        peak_predicted_bytes=float(max(sim.peak_memory_bytes)),
        peak_measured_bytes=float(max(peaks)) if all(isinstance(p, (int, float)) for p in peaks) else None,
        device_peaks=tuple((float(pred), float(measured[i]) if isinstance(measured.get(i), (int, float)) else None)
                           for i, pred in enumerate(sim.peak_memory_bytes)),
        elapsed_s=0.0, noisy=noisy,
    )


def _report_step(d: _Demo, profile: Any, final: Any, sim: Any, basis: str, run2: Any, result: DemoResult) -> None:
    """8: the report of the re-planned pipeline and its own run, with the prediction before calibration."""
    from planner.report import ReportInputs, build_report
    from planner.simulate import simulate

    s, data = d.s, d.data
    uncalibrated_ms = simulate(final, profile, record_timeline=False).iteration_ms
    inputs = ReportInputs(
        profile=profile, plan=final, sim=replace(sim.record(), basis=basis), run=run2.record, timeline=tuple(sim.timeline),
        measured_timeline=tuple(run2.timeline), sim_label="after calibration",
        extra_predictions=(("uncalibrated", uncalibrated_ms),),
        sources={"profile": str(data / "profile.csv"), "plan": str(data / "plan.json"), "sim": str(data / "sim.json"),
                 "run": str(data / "run.json"), "timeline": str(data / "timeline.csv"),
                 "measured_timeline": str(data / "measured_timeline.csv")},
        notes=(f"Made by `pplan demo{' --quick' if d.quick else ''}`: model {s.model}, global batch {s.global_batch} "
               f"in {s.n_microbatches} micro-batches, {s.n_devices} CPU processes, {s.steps} steps per run "
               f"({s.warmup} warm-up).",
               "The first run (data/run_first.json) calibrated the simulator; the figures show the re-planned "
               "pipeline and its own run (data/run.json), so the calibrated prediction is checked on a new run."),
    )
    build_report(inputs, d.out, title="pplan demo: a gpt pipeline on 2 CPU processes",
                 extra_summary=tuple(result.summary()), simulate=True)


def _describe(plan: Any) -> str:
    from planner.report.summary import plan_line

    return plan_line(plan)


def _result_dict(r: DemoResult) -> dict[str, Any]:
    return {
        "limit_bytes": r.limit.limit_bytes, "uniform_floor_bytes": r.limit.uniform_floor_bytes,
        "pplan_floor_bytes": r.limit.pplan_floor_bytes, "pplan_fastest_peak_bytes": r.limit.pplan_fastest_peak_bytes,
        "first_predicted_ms": r.first_predicted_ms, "first_measured_ms": r.first_measured_ms,
        "predicted_ms": r.predicted_ms, "measured_ms": r.measured_ms,
        "uniform_predicted_ms": r.uniform_predicted_ms, "uniform_measured_ms": r.uniform_measured_ms,
        "peak_predicted_bytes": r.peak_predicted_bytes, "peak_measured_bytes": r.peak_measured_bytes,
        "elapsed_s": r.elapsed_s, "noisy_runs": list(r.noisy), "summary": [{"quantity": k, "value": v} for k, v in r.summary()],
    }
