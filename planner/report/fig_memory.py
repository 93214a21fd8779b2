"""Figure 2: per-device peak memory by kind against the limit, and memory over one iteration.

What it draws is bounded, not the devices: up to MAX_BARS devices are bars (each annotated), more
are stacked areas over the device index (one polygon per kind: at the 4,000 devices a pipeline may
have, 20,000 bars, 4,000 notes and a 4,000-entry legend took minutes to draw and showed nothing a
reader could tell apart); memory over time shows at most MAX_LINES devices, those nearest their
limit, and the caption says how many were left out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.plan import PredictedDevice
from planner.report.inputs import ReportInputs
from planner.report.summary import peak_rows
from planner.report.style import (
    LIMIT_STYLE, MEASURED_COLOR, MEMORY_COLORS, MEMORY_PARTS, bytes_axis, device_color, new_figure,
)
from planner.units import format_bytes, format_share

__all__ = ["KEY", "TITLE", "MAX_BARS", "MAX_LINES", "LIMIT_OFF_SCALE", "missing", "draw", "caption", "settled",
           "draw_limit_marks", "nearest_limit", "off_scale_limit", "title_with_limit"]

KEY = "2_memory"
TITLE = "Memory per device"
MAX_BARS = 64
"""Devices drawn as bars; at 64 the figure is already as wide as a report draws (40 inches)."""
MAX_LINES = 8
"""Devices drawn over time: the colours style.device_color tells apart, a legend that fits."""
_AREA_WIDTH = 3.2
"""Width of the stacked-area panel, in units of the timeline panel's 1/1.6 share (a 17-inch figure)."""
LIMIT_OFF_SCALE = 0.05
"""When every peak is under this share of the smallest memory limit, the memory axes are scaled to the
peaks and the titles name the limit instead of drawing it: a few MiB under a 12 GiB line (the `cpu`
preset) are bars no one can see."""


def off_scale_limit(peaks: list[float], limits: list) -> str | None:
    """What a title says instead of the memory limit line when every one of `peaks` (bytes; NaN:
    unknown) is under LIMIT_OFF_SCALE of the smallest of `limits` (None or 0: no limit); None when
    the limit is to be drawn (a peak near it, no limit, or no peak)."""
    known = [float(p) for p in peaks if p is not None and np.isfinite(p)]
    given = sorted({float(v) for v in limits if v})
    if not known or not given or max(known) >= LIMIT_OFF_SCALE * given[0]:
        return None
    text = format_bytes(given[0]) if len(given) == 1 else f"{format_bytes(given[0])} to {format_bytes(given[-1])}"
    return f"limit {text}, not drawn: every peak is under {LIMIT_OFF_SCALE:.0%} of it"


def title_with_limit(ax: Any, title: str, off_scale: str | None) -> None:
    """The panel's title, and under it in small type what off_scale_limit said (a bold second line
    would be wider than a narrow panel)."""
    ax.set_title(title, pad=14 if off_scale else None)
    if off_scale:
        ax.annotate(off_scale, (0.5, 1.0), xycoords="axes fraction", xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize=8)


def missing(inputs: ReportInputs, derived: Any = None) -> str | None:
    """Why this figure cannot be drawn, or None."""
    if inputs.sim is None and (reason := getattr(derived, "not_simulated", None)):
        return reason
    if inputs.sim is None or not inputs.sim.prediction.devices:
        return "needs a simulation (--sim, or --plan with --profile to simulate here)"
    return None


def caption(inputs: ReportInputs) -> str:
    n = len(inputs.sim.prediction.devices) if inputs.sim is not None else 0
    off = _off_scale(inputs) if n else None
    limit = (f"every peak is under {LIMIT_OFF_SCALE:.0%} of the memory limit: the axes are scaled to the peaks and "
             "the titles name the limit instead of drawing it" if off
             else "the dashed line is the device's memory limit")
    text = ("Left: predicted peak memory of each device split into weights, gradients, optimizer state, "
            f"activations and communication buffers; {limit}")
    if n > MAX_BARS:
        limit = limit if off else "the dashed line is each device's memory limit"
        text = (f"Left: predicted peak memory of each of the {n} devices (too many for bars: stacked areas over "
                "the device index) split into weights, gradients, optimizer state, activations and communication "
                f"buffers; {limit}, the note the device nearest its limit")
    if _measured_peaks(inputs):
        text += (", the diamond the peak measured by `pplan run`" if n <= MAX_BARS
                 else ", the diamonds the peaks measured by `pplan run`")
    text += ". Right: predicted memory over one iteration"
    if not _has_timeline(inputs):
        return text + " (the simulator did not record it)."
    drawn = len(_timeline_devices(inputs))
    if drawn > MAX_LINES:
        text += (f" of the {MAX_LINES} devices nearest their memory limit (the highest peaks where there is none); "
                 f"the other {drawn - MAX_LINES} are left out")
    return text + (". Where a micro-batch's activations are freed at the instant the next one's are allocated, "
                   "the line shows the level after both (the free lasts no time).")


def _has_timeline(inputs: ReportInputs) -> bool:
    return inputs.sim is not None and any(len(v) > 0 for v in inputs.sim.memory_timeline.values())


def _timeline_devices(inputs: ReportInputs) -> list[int]:
    """Positions (in draw's device order) of the devices that have a memory timeline."""
    devices = _sorted_devices(inputs)
    timeline = inputs.sim.memory_timeline
    return [i for i, d in enumerate(devices) if timeline.get(_index(d, i))]


def _sorted_devices(inputs: ReportInputs) -> list[PredictedDevice]:
    return sorted(inputs.sim.prediction.devices, key=lambda d: _index(d, 0))


def _peak(d: PredictedDevice) -> float:
    return float(d.peak_memory_bytes or _part(d, "total"))


def nearest_limit(devices: list[PredictedDevice], positions: list[int], k: int) -> list[int]:
    """The k of `positions` whose predicted peak is the largest share of their memory limit (devices
    with a limit first, then those without by peak; ties by position), in position order."""
    def key(i: int) -> tuple[float, float, int]:
        peak, lim = _peak(devices[i]), devices[i].memory_limit_bytes
        return (-(peak / float(lim)) if lim else 1.0, -peak, i)

    return sorted(sorted(positions, key=key)[:k])


def _off_scale(inputs: ReportInputs) -> str | None:
    """off_scale_limit over the predicted and measured peaks of figure 2's devices."""
    devices = _sorted_devices(inputs)
    return off_scale_limit([_peak(d) for d in devices] + list(_measured_peaks(inputs).values()),
                           [d.memory_limit_bytes for d in devices])


def _measured_peaks(inputs: ReportInputs) -> dict[int, float]:
    """Device -> measured peak, the largest of its ranks' (data parallelism), as the summary table has it."""
    return {device: measured for device, _, measured, _ in peak_rows(inputs) if measured}


def draw(inputs: ReportInputs, derived: Any = None) -> Any:
    devices = _sorted_devices(inputs)
    has_tl = _has_timeline(inputs)
    as_bars = len(devices) <= MAX_BARS
    bar_w = max(1.0, len(devices) / 5) if as_bars else _AREA_WIDTH
    fig = new_figure((11.5 if has_tl else 6.5) + 2.5 * (bar_w - 1), 4.6)
    if has_tl:
        ax_bar, ax_t = fig.subplots(1, 2, width_ratios=[bar_w, 1.6])
    else:
        ax_bar, ax_t = fig.subplots(1, 1), None

    peaks = [_peak(d) for d in devices]
    limits = [d.memory_limit_bytes for d in devices]
    measured = _measured_peaks(inputs)
    off = _off_scale(inputs)
    drawn = [None] * len(limits) if off else limits  # the limit lines drawn (none when off the scale)
    top = max(peaks + [float(x) for x in drawn if x] + list(measured.values()) + [1.0])
    div, unit = bytes_axis(top)

    if as_bars:
        _draw_bars(ax_bar, devices, peaks, limits, drawn, measured, div, unit)
    else:
        _draw_areas(ax_bar, devices, peaks, limits, drawn, measured, div, unit)
    ax_bar.set_ylabel(f"peak memory ({unit})")
    title_with_limit(ax_bar, "Predicted peak memory by kind", off)
    ax_bar.set_ylim(0, top / div * 1.45)
    ax_bar.grid(axis="x", visible=False)
    handles, names = ax_bar.get_legend_handles_labels()
    ax_bar.legend(handles, [_limit_legend(name, drawn) for name in names], loc="upper center", ncols=3, fontsize=8)

    if ax_t is not None:
        series, lines = _draw_timeline(ax_t, inputs, devices, drawn, div, unit)
        title_with_limit(ax_t, ax_t.get_title(), off)
        if lines:
            _label_limit_lines(fig, ax_t, lines, series, div)
    return fig


def _limit_legend(name: str, limits: list) -> str:
    """A legend entry's text: the memory limit's names its value where every drawn limit is one value."""
    values = {float(v) for v in limits if v}
    return f"{name} {format_bytes(values.pop())}" if name == "memory limit" and len(values) == 1 else name


def _label_limit_lines(fig: Any, ax: Any, limits: list[float], series: list[tuple[Any, Any]], div: float) -> None:
    """Each limit line's value ("limit 20.0 MiB") on the line: at its right end above it, else below it,
    else at its left end, the first place where no memory line and not the legend is under the text
    (the first place when none is clear). The figure is laid out once to know where the text lands."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw_without_rendering()
    x0, x1 = ax.get_xlim()
    legend = ax.get_legend()
    avoid = [legend.get_window_extent(renderer)] if legend is not None else []
    places = [(x, ha, dy) for x, ha in ((x1, "right"), (x0, "left")) for dy in (3, -3)]
    for lim in limits:
        for place in places:
            note = _limit_note(ax, lim, div, *place)
            box = note.get_window_extent(renderer)
            if not (_covers_data(ax, box, series) or any(box.overlaps(a) for a in avoid)):
                break
            note.remove()
        else:
            note = _limit_note(ax, lim, div, *places[0])
        avoid.append(note.get_window_extent(renderer))


def _limit_note(ax: Any, lim: float, div: float, x: float, ha: str, dy: float) -> Any:
    """"limit 20.0 MiB" at (x, the limit), inset towards the middle, `dy` points above (or below) the line."""
    return ax.annotate(f"limit {format_bytes(lim)}", (x, lim / div), xytext=(-4 if ha == "right" else 4, dy),
                       textcoords="offset points", ha=ha, va="bottom" if dy > 0 else "top", fontsize=8,
                       color=LIMIT_STYLE["color"])


def _covers_data(ax: Any, box: Any, series: list[tuple[Any, Any]]) -> bool:
    """Whether any step line of `series` ((times, levels), drawn where="post") runs through `box` (pixels)."""
    (bx0, by0), (bx1, by1) = ax.transData.inverted().transform([[box.x0, box.y0], [box.x1, box.y1]])
    for t, y in series:
        ends = np.append(t[1:], np.inf)
        levels = y[(t < bx1) & (ends > bx0)]  # the levels the line holds across the box's width, in order
        pairs = list(zip(levels, levels[1:])) or [(v, v) for v in levels]  # a jump joins two of them
        if any(min(a, b) <= by1 and max(a, b) >= by0 for a, b in pairs):
            return True
    return False


def _draw_bars(ax_bar: Any, devices: list[PredictedDevice], peaks: list[float], limits: list, drawn: list,
               measured: dict[int, float], div: float, unit: str) -> None:
    """One stacked bar per device, its limit mark (`drawn`: the limits to draw), its measured peak and a
    note of its peak and of its share of `limits`."""
    x = np.arange(len(devices))
    labels = [_label(d, i) for i, d in enumerate(devices)]
    bottom = np.zeros(len(devices))
    for part in MEMORY_PARTS:
        values = np.array([float(_part(d, part)) for d in devices]) / div
        ax_bar.bar(x, values, bottom=bottom, width=0.6, color=MEMORY_COLORS[part], label=part)
        bottom += values
    draw_limit_marks(ax_bar, drawn, div, 0.4)
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
            note = f"{peak / div:.3g}" + (f"\n{format_share(peak, float(lim))}" if lim else "")
        else:
            note = f"{peak / div:.2f} {unit}" + (f"\n{format_share(peak, float(lim))} of limit" if lim else "")
        # Above whatever is highest here (bar, limit line, measured marker) so nothing overlaps.
        top_here = max([bottom[i]] + ([float(drawn[i]) / div] if drawn[i] else [])
                       + ([measured[_index(devices[i], i)] / div] if _index(devices[i], i) in measured else []))
        ax_bar.annotate(note, (i, top_here), ha="center", va="bottom", fontsize=7.5 if many else 8.5,
                        xytext=(0, 4), textcoords="offset points")
    ax_bar.set_xticks(x, labels)


def _draw_areas(ax: Any, devices: list[PredictedDevice], peaks: list[float], limits: list, drawn: list,
                measured: dict[int, float], div: float, unit: str) -> None:
    """Too many devices for bars: each kind one stacked area over the device index, a dashed line
    per run of equal limits, the measured peaks one marker line, and one note at the device nearest
    its limit."""
    x = np.array([_index(d, i) for i, d in enumerate(devices)], dtype=float)
    bottom = np.zeros(len(devices))
    for part in MEMORY_PARTS:
        values = np.array([float(_part(d, part)) for d in devices]) / div
        ax.fill_between(x, bottom, bottom + values, step="mid", color=MEMORY_COLORS[part], lw=0, label=part)
        bottom += values
    runs = _limit_runs(drawn)
    if runs:  # one dashed segment per run of equal limits: a dash pattern per device would look solid
        ax.hlines([float(lim) / div for _, _, lim in runs], [x[a] - 0.5 for a, _, _ in runs],
                  [x[b] + 0.5 for _, b, _ in runs], **LIMIT_STYLE, label="memory limit")
    shown = [(x[i], measured[_index(d, i)] / div) for i, d in enumerate(devices) if _index(d, i) in measured]
    if shown:
        ax.plot(*zip(*shown), marker="D", ms=4, color=MEASURED_COLOR, mec="white", ls="none", label="measured peak")
    worst = nearest_limit(devices, list(range(len(devices))), 1)[0]
    lim = limits[worst]
    note = (f"dev {_index(devices[worst], worst)}: {peaks[worst] / div:.3g} {unit}"
            + (f", {format_share(peaks[worst], float(lim))} of limit" if lim else ""))
    # towards the middle from the device, so a note at either end stays inside the axes
    span = x[-1] - x[0]
    where = (x[worst] - x[0]) / span if span else 0.5
    ha = "left" if where < 1 / 3 else "right" if where > 2 / 3 else "center"
    ax.annotate(note, (x[worst], bottom[worst]), ha=ha, va="bottom", fontsize=8.5, xytext=(0, 4),
                textcoords="offset points")
    ax.set_xlim(x[0] - 0.5, x[-1] + 0.5)
    ax.set_xlabel("device")


def _limit_runs(limits: list) -> list[tuple[int, int, float]]:
    """(first, last, limit) of each run of neighbouring devices with the same memory limit; devices
    without one (None or 0) end a run and start none."""
    runs: list[tuple[int, int, float]] = []
    for i, lim in enumerate(limits):
        if not lim:
            continue
        if runs and runs[-1][1] == i - 1 and runs[-1][2] == lim:
            runs[-1] = (runs[-1][0], i, lim)
        else:
            runs.append((i, i, lim))
    return runs


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
                   unit: str) -> tuple[list[tuple[Any, Any]], list[float]]:
    """The memory lines of the devices shown and a dashed line per distinct limit; returns the lines'
    (times, levels) and the limits drawn (bytes)."""
    series = []
    timeline = inputs.sim.memory_timeline
    t_end = float(inputs.sim.prediction.iteration_ms or 0.0)
    with_points = _timeline_devices(inputs)
    shown = with_points if len(with_points) <= MAX_LINES else nearest_limit(devices, with_points, MAX_LINES)
    for n, i in enumerate(shown):
        d = devices[i]
        pts = settled(timeline[_index(d, i)])
        t = [float(p[0]) for p in pts] + [max(t_end, float(pts[-1][0]))]
        y = [float(p[1]) / div for p in pts] + [float(pts[-1][1]) / div]
        # a few devices keep their own colour; a selection takes the palette in order, so none repeats
        color = device_color(_index(d, i) if shown is with_points else n)
        ax.step(t, y, where="post", color=color, lw=1.6, label=_label(d, i))
        series.append((np.array(t), np.array(y)))
    # a selection is drawn against its own limits: a line per distinct limit of thousands of devices
    # (a heterogeneous cluster) would be as many lines as there are devices
    distinct = sorted({float(v) for v in (limits if shown is with_points else [limits[i] for i in shown]) if v})
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
    return series, distinct
