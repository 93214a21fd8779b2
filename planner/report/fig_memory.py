"""Figure 2: per-device peak memory by kind against the limit, and memory over one iteration."""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.plan import PredictedDevice
from planner.report.inputs import ReportInputs
from planner.report.summary import peak_rows
from planner.report.style import (
    LIMIT_STYLE, MEASURED_COLOR, MEMORY_COLORS, MEMORY_PARTS, bytes_axis, device_color, new_figure,
)

__all__ = ["KEY", "TITLE", "missing", "draw", "caption", "settled", "draw_limit_marks"]

KEY = "2_memory"
TITLE = "Memory per device"


def missing(inputs: ReportInputs, derived: Any = None) -> str | None:
    """Why this figure cannot be drawn, or None."""
    if inputs.sim is None or not inputs.sim.prediction.devices:
        return "needs a simulation (--sim, or --plan with --profile to simulate here)"
    return None


def caption(inputs: ReportInputs) -> str:
    text = ("Left: predicted peak memory of each device split into weights, gradients, optimizer state, "
            "activations and communication buffers; the dashed line is the device's memory limit")
    if _measured_peaks(inputs):
        text += ", the diamond the peak measured by `pplan run`"
    text += ". Right: predicted memory over one iteration"
    if not _has_timeline(inputs):
        return text + " (the simulator did not record it)."
    return text + (". Where a micro-batch's activations are freed at the instant the next one's are allocated, "
                   "the line shows the level after both (the free lasts no time).")


def _has_timeline(inputs: ReportInputs) -> bool:
    return inputs.sim is not None and any(len(v) > 0 for v in inputs.sim.memory_timeline.values())


def _measured_peaks(inputs: ReportInputs) -> dict[int, float]:
    """Device -> measured peak, the largest of its ranks' (data parallelism), as the summary table has it."""
    return {device: measured for device, _, measured, _ in peak_rows(inputs) if measured}


def draw(inputs: ReportInputs, derived: Any = None) -> Any:
    devices = sorted(inputs.sim.prediction.devices, key=lambda d: _index(d, 0))
    has_tl = _has_timeline(inputs)
    bar_w = max(1.0, len(devices) / 5)
    fig = new_figure((11.5 if has_tl else 6.5) + 2.5 * (bar_w - 1), 4.6)
    if has_tl:
        ax_bar, ax_t = fig.subplots(1, 2, width_ratios=[bar_w, 1.6])
    else:
        ax_bar, ax_t = fig.subplots(1, 1), None

    peaks = [float(d.peak_memory_bytes or _part(d, "total")) for d in devices]
    limits = [d.memory_limit_bytes for d in devices]
    measured = _measured_peaks(inputs)
    top = max(peaks + [float(x) for x in limits if x] + list(measured.values()) + [1.0])
    div, unit = bytes_axis(top)

    x = np.arange(len(devices))
    labels = [_label(d, i) for i, d in enumerate(devices)]
    bottom = np.zeros(len(devices))
    for part in MEMORY_PARTS:
        values = np.array([float(_part(d, part)) for d in devices]) / div
        ax_bar.bar(x, values, bottom=bottom, width=0.6, color=MEMORY_COLORS[part], label=part)
        bottom += values
    draw_limit_marks(ax_bar, limits, div, 0.4)
    meas_drawn = False
    for i, d in enumerate(devices):
        value = measured.get(_index(d, i))
        if value is not None:
            ax_bar.plot([i], [value / div], marker="D", ms=8, color=MEASURED_COLOR, mec="white", ls="none",
                        label=None if meas_drawn else "measured peak")
            meas_drawn = True
    many = len(devices) > 4  # long labels would collide: numbers only
    for i, peak in enumerate(peaks):
        lim = limits[i]
        if many:
            note = f"{peak / div:.3g}" + (f"\n{peak / float(lim):.0%}" if lim else "")
        else:
            note = f"{peak / div:.2f} {unit}" + (f"\n{peak / float(lim):.0%} of limit" if lim else "")
        # Above whatever is highest here (bar, limit line, measured marker) so nothing overlaps.
        top_here = max([bottom[i]] + ([float(lim) / div] if lim else [])
                       + ([measured[_index(devices[i], i)] / div] if _index(devices[i], i) in measured else []))
        ax_bar.annotate(note, (i, top_here), ha="center", va="bottom", fontsize=7.5 if many else 8.5,
                        xytext=(0, 4), textcoords="offset points")
    ax_bar.set_xticks(x, labels)
    ax_bar.set_ylabel(f"peak memory ({unit})")
    ax_bar.set_title("Predicted peak memory by kind")
    ax_bar.set_ylim(0, top / div * 1.45)
    ax_bar.grid(axis="x", visible=False)
    ax_bar.legend(loc="upper center", ncols=3, fontsize=8)

    if ax_t is not None:
        _draw_timeline(ax_t, inputs, devices, limits, div, unit)
    return fig


def draw_limit_marks(ax: Any, limits: list, div: float, half_width: float) -> None:
    """A dashed line at each bar's memory limit (bar i spans i ± half_width; None or 0: no limit),
    in the legend once. Bytes are divided by `div` (bytes_axis)."""
    drawn = False
    for i, lim in enumerate(limits):
        if lim:
            ax.hlines(float(lim) / div, i - half_width, i + half_width, **LIMIT_STYLE,
                      label=None if drawn else "memory limit")
            drawn = True


def settled(points: list) -> list:
    """Memory points with one value per instant: the last one at each time.

    When one micro-batch's backward ends and the next forward starts at the same instant, the
    simulator records the free and then the allocation at that one time; drawn as steps, the
    free would show as a spike down to the baseline that lasts no time at all.
    """
    out: list = []
    for p in points:
        if out and float(out[-1][0]) == float(p[0]):
            out[-1] = p
        else:
            out.append(p)
    return out


def _index(d: PredictedDevice, default: int) -> int:
    """The device's index; `default` (its position) when the file leaves it out."""
    return d.device if d.device is not None else default


def _part(d: PredictedDevice, part: str) -> float:
    """One part of the device's peak memory breakdown (0 when absent)."""
    value = getattr(d.memory, part) if d.memory is not None else None
    return value if value is not None else 0


def _label(d: PredictedDevice, i: int) -> str:
    dev = _index(d, i)
    name = d.name
    return f"dev {dev}" if not name or name == f"dev{dev}" else f"{name} (dev {dev})"


def _draw_timeline(ax: Any, inputs: ReportInputs, devices: list[PredictedDevice], limits: list, div: float,
                   unit: str) -> None:
    timeline = inputs.sim.memory_timeline
    t_end = float(inputs.sim.prediction.iteration_ms or 0.0)
    for i, d in enumerate(devices):
        pts = timeline.get(_index(d, i)) or []
        if not pts:
            continue
        pts = settled(pts)
        t = [float(p[0]) for p in pts] + [max(t_end, float(pts[-1][0]))]
        y = [float(p[1]) / div for p in pts] + [float(pts[-1][1]) / div]
        color = device_color(_index(d, i))
        ax.step(t, y, where="post", color=color, lw=1.6, label=_label(d, i))
    distinct = sorted({float(v) for v in limits if v})
    for j, lim in enumerate(distinct):
        # One line per distinct limit: equal limits would hide each other.
        ax.axhline(lim / div, **LIMIT_STYLE, label="memory limit" if j == 0 else None)
    ax.set_xlabel("time in iteration (ms)")
    ax.set_ylabel(f"memory ({unit})")
    ax.set_title("Predicted memory over one iteration")
    ax.set_ylim(bottom=0)
    lo, hi = ax.get_ylim()
    ax.set_ylim(0, hi * 1.12)
    if t_end > 0:
        ax.set_xlim(0, t_end)
    ax.legend(loc="upper left", ncols=3, fontsize=8)
