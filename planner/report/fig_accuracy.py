"""Figure 6: predicted against measured, per device (busy time, peak memory) and per step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.execute.runrecord import RankRecord
from planner.plan import PredictedDevice
from planner.report.fig_memory import LIMIT_OFF_SCALE, draw_limit_marks, off_scale_limit, title_with_limit
from planner.report.inputs import ReportInputs
from planner.report.layout import run_layout
from planner.report.style import (
    MEASURED_COLOR, MEMORY_COLORS, MEMORY_PARTS, PREDICTED_COLOR, bytes_axis, new_figure,
)

__all__ = ["KEY", "TITLE", "missing", "draw", "caption", "prediction_lines", "prediction_legend", "error_text",
           "rank_labels", "PeakMemoryBars", "peak_memory_bars"]

KEY = "6_predicted_vs_measured"
TITLE = "Predicted against measured"
_CALIBRATED_COLOR = "#55A868"
_LABEL_BOX = {"facecolor": "white", "alpha": 0.85, "lw": 0, "pad": 1}
_EXTRA_COLORS = ("#8172B3", "#937860", "#DA8BC3")


def missing(inputs: ReportInputs, derived: Any = None) -> str | None:
    """Why this figure cannot be drawn, or None."""
    return "needs a measured run (--run, the JSON written by `pplan run`)" if inputs.run is None else None


def error_text(error: float, decimals: int | None = None) -> str:
    """A relative error as the figure writes it, signed: `decimals` places, or (None) whole percent and one
    place under 1% (-0.004: "-0.4%", where whole percent would read "-0%"). An error that rounds to zero
    reads "0%" ("0.0%" with decimals=1), unsigned: a signed zero says the prediction leans one way when it does not."""
    places = decimals if decimals is not None else (1 if abs(error) < 0.01 else 0)
    text = f"{error:+.{places}%}"
    return f"{0:.{decimals or 0}%}" if float(text.rstrip("%")) == 0 else text


def prediction_legend(label: str, value: float, measured: float | None, fit: bool = False) -> str:
    """The step panel's legend entry of one prediction line. Every line predicts the plan of the run shown
    and its percentage compares it with that run's median, so the entry says both ("this plan", "vs this
    run"): the demo's key numbers set an earlier plan's prediction against an earlier run, and the same
    words without these would read as the same quantity. One decimal, as the key numbers write errors."""
    if not measured:
        return f"this plan, {label}: {value:.1f} ms"
    kind = " residual" if fit else ""
    return f"this plan, {label}: {value:.1f} ms ({error_text((value - measured) / measured, 1)}{kind} vs this run)"


def prediction_lines(inputs: ReportInputs) -> list[tuple[str, float, str]]:
    """(label, iteration ms, color) of each distinct prediction for the run's plan to compare its steps with."""
    lines: list[tuple[str, float, str]] = []
    run = inputs.run
    run_pred = run.iteration_ms_predicted if run is not None else None
    sim_pred = inputs.sim.prediction.iteration_ms if inputs.sim else None
    same = (isinstance(run_pred, (int, float)) and isinstance(sim_pred, (int, float))
            and abs(sim_pred - run_pred) <= 1e-3 * max(sim_pred, 1e-9))
    if isinstance(run_pred, (int, float)) and run_pred > 0:
        # One number from two files is one line, named after the simulation when it was named.
        label = inputs.sim_label if same and inputs.sim_label != "simulation" else "predicted at run time"
        if run.calibration is not None and "calibrat" not in label:
            label += " (calibrated)"
        lines.append((label, float(run_pred), PREDICTED_COLOR))
    if isinstance(sim_pred, (int, float)) and sim_pred > 0 and not same:
        lines.append((inputs.sim_label, float(sim_pred), _CALIBRATED_COLOR if lines else PREDICTED_COLOR))
    for i, (label, value) in enumerate(inputs.extra_predictions):
        lines.append((label, float(value), _EXTRA_COLORS[i % len(_EXTRA_COLORS)]))
    return lines


def caption(inputs: ReportInputs) -> str:
    tracked = inputs.run is not None and bool(inputs.run.ranks) and _has_breakdowns(_rank_rows(inputs))
    middle = ("Middle: peak memory per device against the limit: predicted by kind, the measured peak (the allocator's, "
              "as in the summary and the run JSON) and, hatched, the run's tracked breakdown by kind (tensor sizes: it "
              "checks the model's bookkeeping, not the memory). " if tracked else
              "Middle: peak memory per device, predicted and measured, against the limit. ")
    if inputs.run is not None and inputs.run.ranks and _off_scale(peak_memory_bars(inputs)):
        middle += (f"Every peak is under {LIMIT_OFF_SCALE:.0%} of the memory limit: the axis is scaled to the "
                   "peaks and the title names the limit instead of drawing it. ")
    return ("Left: busy time per device in one iteration, predicted (simulator) and measured (`pplan run`). " + middle
            + "Right: measured time of every training step of this run against the predicted iteration times of "
            "its plan; hollow points are warm-up steps, excluded from the median. Percentages are prediction "
            "errors as in the run JSON: (predicted - measured) / measured, each against this run's own measurement."
            + (" The line calibrated on this same run is a fit: its percentage is a residual, not a prediction error."
               if inputs.sim_is_fit else ""))


def _rank_rows(inputs: ReportInputs) -> list[RankRecord]:
    return sorted(inputs.run.ranks, key=lambda r: r.rank)


def rank_labels(inputs: ReportInputs) -> list[str]:
    """The x-axis label of each rank, in rank order: its pipeline device, with data parallelism its
    replica (`r1`), with tensor parallelism its tp rank (`tp1`): several ranks play one device, and
    labels alike would not say which bar is which."""
    layout = run_layout(inputs.run)
    labels = []
    for r in _rank_rows(inputs):
        place = " ".join(([f"r{r.replica}"] if layout.dp > 1 else [])
                         + ([f"tp{layout.tp_rank(r.rank)}"] if layout.tp > 1 else []))
        labels.append(f"dev {r.device}" + (f"\n{place}" if place else ""))  # on a second line: bars are narrow
    return labels


def _off_scale(bars: list["PeakMemoryBars"]) -> str | None:
    """What the memory panel's title says instead of drawing a limit far above every bar (fig_memory)."""
    return off_scale_limit([v for b in bars for v in (b.predicted, b.measured, b.tracked)], [b.limit for b in bars])


def draw(inputs: ReportInputs, derived: Any = None) -> Any:
    fig = new_figure(14.0, 4.6)
    ax_busy, ax_mem, ax_step = fig.subplots(1, 3, width_ratios=[1, 1.4, 1.6])
    ranks = _rank_rows(inputs)
    sim_devices = _sim_devices(inputs)
    w = 0.38

    if ranks:
        x = np.arange(len(ranks))
        labels = rank_labels(inputs)
        pred_busy = [float(r.busy_ms_predicted or _simulated(sim_devices, r.device, "busy_ms") or np.nan)
                     for r in ranks]
        meas_busy = [float(r.busy_ms or np.nan) for r in ranks]
        _paired_bars(ax_busy, x, pred_busy, meas_busy, w, 1.0)
        # from 6 ranks on, two-line labels run into each other in this narrow panel: smaller, turned
        tick_style = {"fontsize": 7, "rotation": 90} if len(ranks) > 5 else {}
        ax_busy.set_xticks(x, labels, **tick_style)
        ax_busy.set_ylabel("busy time per iteration (ms)")
        ax_busy.set_title("Busy time per device")

        bars = peak_memory_bars(inputs)
        pred_mem, meas_mem = [b.predicted for b in bars], [b.measured for b in bars]
        off = _off_scale(bars)
        limits = [None] * len(bars) if off else [b.limit for b in bars]  # the limit lines drawn
        top = np.nanmax(pred_mem + meas_mem + [b.tracked for b in bars] + [float(v) for v in limits if v] + [1.0])
        div, unit = bytes_axis(top)
        floors = [float(lim) / div if lim else 0.0 for lim in limits]  # labels sit above the limit line
        if _has_breakdowns(ranks):
            _stacked_triples(ax_mem, x, ranks, bars, div, floors)
        else:
            _paired_bars(ax_mem, x, pred_mem, meas_mem, w, div, floors)
        draw_limit_marks(ax_mem, limits, div, 0.45)
        ax_mem.set_xticks(x, labels, **tick_style)
        ax_mem.set_ylabel(f"peak memory ({unit})")
        title_with_limit(ax_mem, "Peak memory per device", off)
        ax_mem.set_ylim(0, top / div * (1.6 if _has_breakdowns(ranks) else 1.25))  # room for the legend
    else:
        for ax in (ax_busy, ax_mem):
            ax.text(0.5, 0.5, "run JSON has no per-rank data", ha="center", va="center", transform=ax.transAxes)
    for ax in (ax_busy, ax_mem):
        ax.grid(axis="x", visible=False)
        lo, hi = ax.get_ylim()
        ax.set_ylim(0, hi * 1.1)
    ax_busy.legend(loc="upper center", ncols=3, fontsize=8)
    handles, labels = ax_mem.get_legend_handles_labels()
    if ranks and _has_breakdowns(ranks):
        from matplotlib.patches import Patch

        handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="///"))
        labels.append("tracked (hatched)")
    if handles:
        ax_mem.legend(handles, labels, loc="upper center", ncols=3, fontsize=8)

    _draw_steps(ax_step, inputs)
    return fig


@dataclass(frozen=True)
class PeakMemoryBars:
    """One rank's peak memory as the middle panel draws it, in bytes (NaN: unknown)."""

    predicted: float
    """The cost model's peak of the rank's device (the run's, else the simulation's)."""
    measured: float
    """The allocator's peak over the memory step (`peak_memory_bytes_measured`), the figure the summary and the
    run JSON compare with."""
    tracked: float
    """The total of the run's tracked breakdown (`memory_measured`): tensor sizes, a check of the bookkeeping."""
    limit: float | None
    """The device's memory limit (None: no limit)."""
    error: float | None
    """(predicted - measured) / measured, as the run JSON's error_pct; None when either is unknown."""


def peak_memory_bars(inputs: ReportInputs) -> list[PeakMemoryBars]:
    """The middle panel's numbers, one entry per rank in rank order."""
    sim_devices = _sim_devices(inputs)
    out = []
    for r in _rank_rows(inputs):
        # a rank plays pipeline device `device` (with data parallelism rank != device): predictions are per device
        pred = float(r.peak_memory_bytes_predicted or _simulated(sim_devices, r.device, "peak_memory_bytes") or np.nan)
        meas = float(r.peak_memory_bytes_measured or np.nan)
        limit = _simulated(sim_devices, r.device, "memory_limit_bytes")
        if not limit and inputs.plan is not None and 0 <= r.device < inputs.plan.n_devices:
            limit = inputs.plan.devices[r.device].memory_bytes
        limit = limit or r.memory_limit_bytes  # the run records its plan's limit: a report of the run alone has it
        tracked = float(r.memory_measured.total or np.nan) if r.memory_measured is not None else np.nan
        error = (pred - meas) / meas if np.isfinite(pred) and np.isfinite(meas) and meas > 0 else None
        out.append(PeakMemoryBars(predicted=pred, measured=meas, tracked=tracked, limit=float(limit) if limit else None,
                                  error=error))
    return out


def _sim_devices(inputs: ReportInputs) -> dict[int, PredictedDevice]:
    """The simulation's devices by index (none without a simulation)."""
    devices = (inputs.sim.prediction.devices or ()) if inputs.sim is not None else ()
    return {d.device: d for d in devices if d.device is not None}


def _simulated(devices: dict[int, PredictedDevice], device: int, name: str) -> float | None:
    """Field `name` of the simulation's record of `device` (None when the simulation has no such device)."""
    return getattr(devices[device], name) if device in devices else None


def _has_breakdowns(ranks: list[RankRecord]) -> bool:
    return all(r.memory_predicted is not None and r.memory_measured is not None for r in ranks)


def _stacked_triples(ax: Any, x: np.ndarray, ranks: list[RankRecord], bars: list[PeakMemoryBars], div: float,
                     floors: list[float]) -> None:
    """Per device: the predicted breakdown (left, solid), the measured peak (middle, labelled with the error
    against it) and the tracked breakdown (right, hatched), the breakdowns stacked by kind."""
    w = 0.26
    for offset, key, hatch in ((-w, "memory_predicted", None), (w, "memory_measured", "///")):
        bottom = np.zeros(len(ranks))
        for part in MEMORY_PARTS:
            values = np.array([float(getattr(getattr(r, key), part) or 0) for r in ranks]) / div
            ax.bar(x + offset, values, bottom=bottom, width=w, color=MEMORY_COLORS[part], hatch=hatch,
                   edgecolor="white", lw=0.3, label=part if hatch is None else None)
            bottom += values
    measured = np.array([b.measured for b in bars]) / div
    ax.bar(x, measured, width=w, color=MEASURED_COLOR, label="measured peak")
    for i, b in enumerate(bars):
        if b.error is not None:
            ax.annotate(error_text(b.error), (x[i], max(measured[i], floors[i])), ha="center", va="bottom", fontsize=8,
                        xytext=(0, 2), textcoords="offset points", bbox=_LABEL_BOX)
    ax.set_xlabel("predicted, measured peak, tracked (hatched)")


def _paired_bars(ax: Any, x: np.ndarray, pred: list[float], meas: list[float], w: float, div: float,
                 floors: list[float] | None = None) -> None:
    bars_p = ax.bar(x - w / 2, np.array(pred) / div, width=w, color=PREDICTED_COLOR, label="predicted")
    bars_m = ax.bar(x + w / 2, np.array(meas) / div, width=w, color=MEASURED_COLOR, label="measured")
    for i, (bp, bm, p, m) in enumerate(zip(bars_p, bars_m, pred, meas)):
        if np.isfinite(p) and np.isfinite(m) and m > 0:
            # Labelled like the run JSON's error_pct: (predicted - measured) / measured; above a limit line.
            y = max(bm.get_height(), floors[i]) if floors else bm.get_height()
            ax.annotate(error_text((p - m) / m), (bm.get_x() + bm.get_width() / 2, y),
                        ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points",
                        bbox=_LABEL_BOX)


def _draw_steps(ax: Any, inputs: ReportInputs) -> None:
    steps = [float(s) for s in inputs.run.step_ms]
    timed_set = set(inputs.run.measured_steps)
    first = inputs.run.first_step  # a resumed run's step_ms[0] is step first_step + 1, as `pplan run` numbers it
    if steps:
        idx = np.arange(first + 1, first + len(steps) + 1)
        ax.plot(idx, steps, color=MEASURED_COLOR, lw=1.0, alpha=0.6)
        t = [i for i in range(len(steps)) if i in timed_set]
        u = [i for i in range(len(steps)) if i not in timed_set]
        ax.plot(idx[t], np.array(steps)[t], marker="o", ms=5, color=MEASURED_COLOR, ls="none", label="measured step")
        if u:
            ax.plot(idx[u], np.array(steps)[u], marker="o", ms=5, mfc="white", color=MEASURED_COLOR, ls="none",
                    label="warm-up step (not timed)")
    measured = inputs.run.iteration_ms_measured
    if measured is not None and np.isfinite(measured):
        ax.axhline(measured, color=MEASURED_COLOR, ls=":", lw=1.4, label=f"measured median {measured:.1f} ms")
    else:
        measured = None
    for label, value, color in prediction_lines(inputs):
        fit = inputs.sim_is_fit and label == inputs.sim_label
        ax.axhline(value, color=color, ls="--", lw=1.6, label=prediction_legend(label, value, measured, fit))
    ax.set_xlabel("training step")
    ax.set_ylabel("step time (ms)")
    ax.set_title("Step time: measured against predicted")
    ax.set_ylim(bottom=0)
    lo, hi = ax.get_ylim()
    ax.set_ylim(0, hi * 1.35)
    if steps:
        ax.set_xlim(first + 0.5, first + len(steps) + 0.5)
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="upper right", fontsize=8)
