"""Figure 1: the simulated schedule as a Gantt chart, and the measured one under it, same time axis."""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from planner.report.inputs import ReportInputs, TimelineRow
from planner.simulation.result import what_if_text

__all__ = ["KEY", "TITLE", "missing", "draw", "caption", "one_iteration"]

KEY = "1_schedule"
TITLE = "Schedule: simulated and measured"


def missing(inputs: ReportInputs, derived: Any = None) -> str | None:
    """Why this figure cannot be drawn, or None."""
    if inputs.timeline is None and inputs.measured_timeline is None:
        return getattr(derived, "not_simulated", None) or (
            "needs a timeline (--timeline from `pplan simulate`, --measured-timeline from `pplan run`, "
            "or --plan with --profile to simulate here)")
    return None


def caption(inputs: ReportInputs) -> str:
    parts = []
    if inputs.timeline is not None:
        parts.append("the simulated iteration")
    if inputs.measured_timeline is not None:
        parts.append("the measured one (`pplan run`)")
    text = ("Each row is a device; boxes are forward (F), backward (B, or I and W when split), recompute (R) "
            "and optimizer (O) work, numbered by micro-batch; thin grey bars are transfers the device sends "
            "(one too short to see is drawn about 2 pixels wide from its start); "
            "the hatched band is idle time (the bubble). ")
    layout = inputs.plan.parallel if inputs.plan is not None else None
    if layout is not None:  # the rows are one replica's devices, not every GPU
        if layout.dp > 1:
            text += f"The plan runs {layout.dp} such pipelines side by side, alike; one is drawn. "
        if layout.tp > 1:
            text += f"Each device is {layout.tp} tensor-parallel GPUs. "
    text += "Shown: " + " and ".join(parts) + ", on one time axis."
    sim_ms = inputs.sim.prediction.iteration_ms if inputs.sim is not None else None
    changes = inputs.sim.what_if if inputs.sim is not None else None
    if changes and isinstance(sim_ms, (int, float)):  # its time differs from the drawn plan's by the change, not overhead
        text += (f" The simulated iteration time, {sim_ms:.1f} ms, is a what-if's, not the plan's as it is: "
                 f"{what_if_text(changes)}.")
    elif inputs.timeline and isinstance(sim_ms, (int, float)):
        drawn = max(r.end_ms for r in inputs.timeline) - min(r.start_ms for r in inputs.timeline)
        if sim_ms > drawn * 1.005:
            text += (f" The simulated iteration time, {sim_ms:.1f} ms, also includes {sim_ms - drawn:.1f} ms per step "
                     "that the calibration attributes to no action (step overhead), not drawn here.")
    return text


def one_iteration(rows: Sequence[TimelineRow]) -> list[TimelineRow]:
    """The last complete iteration of a timeline, shifted to start at 0.

    A measured timeline may hold several iterations; each (device, stage, kind, micro-batch)
    then repeats. Keep the last occurrence of each so warm-up does not distort the picture.
    """
    rows = sorted(rows, key=lambda r: (r.start_ms, r.device, r.stage))
    counts = Counter((r.device, r.stage, r.kind, r.microbatch) for r in rows)
    repeats = max(counts.values(), default=1)
    if repeats > 1:
        seen: Counter = Counter()
        kept = []
        for r in rows:
            key = (r.device, r.stage, r.kind, r.microbatch)
            seen[key] += 1
            if seen[key] == counts[key]:
                kept.append(r)
        rows = kept
    t0 = min((r.start_ms for r in rows), default=0.0)
    return [TimelineRow(r.device, r.stage, r.kind, r.microbatch, r.start_ms - t0, r.end_ms - t0) for r in rows]


def _device_names(inputs: ReportInputs) -> list[str] | None:
    if inputs.plan is not None:
        return [d.name for d in inputs.plan.devices]
    devices = (inputs.sim.prediction.devices or ()) if inputs.sim is not None else ()
    if devices and all(d.device is not None for d in devices):
        names = {d.device: d.name or f"dev{d.device}" for d in devices}
        return [names.get(i, f"dev{i}") for i in range(max(names) + 1)]
    return None


def _title(inputs: ReportInputs) -> str:
    from planner.report.gantt import drawn_devices

    source = inputs.plan or None
    if source is not None:
        model = inputs.profile.meta.get("model") if inputs.profile is not None else None
        return (f"Pipeline schedule: {source.schedule}, {source.n_microbatches} micro-batches of "
                f"{source.micro_batch_size} on {drawn_devices(source, model)}")
    prediction = inputs.sim.prediction if inputs.sim is not None else None
    if prediction is not None and prediction.schedule:
        m = prediction.n_microbatches if prediction.n_microbatches is not None else "?"
        return f"Pipeline schedule: {prediction.schedule}, {m} micro-batches"
    return "Pipeline schedule"


def draw(inputs: ReportInputs, derived: Any = None) -> Any:
    from planner.report.gantt import gantt_compare_figure, gantt_figure

    names = _device_names(inputs)
    simulated = one_iteration(inputs.timeline) if inputs.timeline is not None else None
    measured = one_iteration(inputs.measured_timeline) if inputs.measured_timeline is not None else None
    n = max((r.device for rows in (simulated or [], measured or []) for r in rows), default=0) + 1
    if names is not None and len(names) < n:
        names = None  # the timeline has more devices than the plan names: number them
    if simulated is not None and measured is not None:
        return gantt_compare_figure(simulated, measured, title=_title(inputs) + ": simulated vs measured",
                                    device_names=names)
    rows, label = (simulated, "simulated") if simulated is not None else (measured, "measured")
    end = max((r.end_ms for r in rows), default=0.0)
    return gantt_figure(rows, title=f"{_title(inputs)}: {label}, {end:.2f} ms", device_names=names)
