"""Gantt charts of pipeline timelines: predicted, measured, or both on one time axis.

Rows are anything with the timeline CSV's fields (device, stage, kind, microbatch, start_ms,
end_ms) as attributes, dict keys or tuple positions: planner.simulation.result.TimelineRow (what the
simulator makes and the report reads from a measured timeline CSV) or plain tuples and dicts. Each device is one row of boxes, coloured by
kind (F, B, I, W, R recompute, O optimizer) with the micro-batch number inside when it fits;
transfers (C) are thin bars under the sending device, each at least _MIN_THIN_BAR_IN wide (a 0.01 ms
transfer on a 47 ms axis is a third of a pixel: some showed as slivers, others not at all; the
legend then says short ones are drawn wider, and a bar still starts at its true start); idle time
(the bubble) is a hatched band. A plan with a `parallel` object draws one pipeline replica of
dp x pp x tp GPUs: `drawn_devices` says which, for the title. matplotlib is imported lazily and
rendered through Agg (planner.report.style).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from planner.report.style import KIND_COLORS, KIND_LABELS, new_figure, render, style_context
from planner.simulation.result import TimelineRow
from planner.textsafe import printable

__all__ = ["WIDENED", "as_rows", "devices_in", "drawn_devices", "draw_gantt", "gantt_figure", "gantt_compare_figure",
           "gantt_png", "min_thin_bar_width"]

_KIND_ORDER = ("F", "B", "I", "W", "R", "T", "A", "O", "C")
_IDLE_COLOR = "#F3D9D9"
_MAX_LABELS = 1500  # beyond this many boxes, numbers would be unreadable anyway
_MAX_TICKS = 64  # device labels on the y axis; more would overlap
_MAX_HEIGHT_IN = 40.0  # tallest figure, inches (6000 pixels at the report's 150 dpi)
_MIN_THIN_BAR_IN = 2.5 / 150  # 2.5 pixels at the 150 dpi figures are rendered at: 2 once layout widens the axes
_MIN_AXES_FRACTION = 0.6  # the least share of the figure's width the time axis is taken to get after layout
_THIN_KINDS = "CA"  # drawn as thin bars in their own lanes, so widening one covers no other box
_MAX_MODEL_CHARS = 80  # a model spec with per-layer lists would fill the title
WIDENED = "widened"
"""Suffix draw_gantt adds to a kind ("C" + WIDENED) in the set it returns when some of its bars are drawn wider than they last."""


def as_rows(rows: Iterable[Any]) -> list[TimelineRow]:
    """Normalise timeline rows given as objects, dicts or tuples."""
    out = []
    for r in rows:
        if isinstance(r, dict):
            vals = (r["device"], r["stage"], r["kind"], r["microbatch"], r["start_ms"], r["end_ms"])
        elif hasattr(r, "kind"):
            vals = (r.device, r.stage, r.kind, r.microbatch, r.start_ms, r.end_ms)
        else:
            vals = tuple(r)
        out.append(TimelineRow(int(vals[0]), int(vals[1]), str(vals[2]), int(vals[3]), float(vals[4]), float(vals[5])))
    return out


def draw_gantt(ax: Any, rows: Sequence[Any], devices: Sequence[int] | None = None,
               device_names: Sequence[str] | None = None, t_max: float | None = None) -> set[str]:
    """Draw `rows` on matplotlib axes `ax`, one row per device of `devices` (default: the devices the
    rows use, in order; never every index up to the largest, which a file may make huge); returns
    the kinds drawn (for a shared legend), and kind + WIDENED for a thin kind (transfers, gradient
    syncs) some of whose bars were drawn min_thin_bar_width wide because they were shorter."""
    rows = as_rows(rows)
    shown = list(devices) if devices is not None else devices_in(rows)
    position = {d: i for i, d in enumerate(shown)}
    end = max((r.end_ms for r in rows), default=0.0)
    span = t_max if t_max else (end or 1.0)
    height, comm_h = 0.62, 0.14
    # the bubble: everything of a device's row not covered by compute is idle
    _add_boxes(ax, [(0.0, y - height / 2, end, height) for y in range(len(shown))], facecolors=_IDLE_COLOR,
               hatch="///", edgecolor="#E3B5B5", linewidth=0.0, zorder=1)
    lanes: dict[str, list[tuple[float, float, float, float]]] = {}  # kind -> (x, y, width, height) of its boxes
    thin_min = min_thin_bar_width(ax, span * 1.01)
    widened: set[str] = set()
    for r in rows:
        if r.device not in position:
            continue
        y, width = position[r.device], max(r.end_ms - r.start_ms, 0.0)
        if r.kind in _THIN_KINDS and width < thin_min:  # from its true start, so the bar's start stays exact
            width = thin_min
            widened.add(r.kind + WIDENED)
        if r.kind == "C":  # transfers: a thin bar under the device's row
            box = (r.start_ms, y + height / 2 + 0.02, width, comm_h)
        elif r.kind == "A":  # the gradient sync overlaps the last backward: its own thin lane above the bar
            box = (r.start_ms, y - height / 2 - 0.02 - comm_h, width, comm_h)
        else:
            box = (r.start_ms, y - height / 2, width, height)
        lanes.setdefault(r.kind, []).append(box)
    for kind, boxes in lanes.items():
        color = KIND_COLORS.get(kind, "#333333")
        if kind in "CA":
            _add_boxes(ax, boxes, facecolors=color, edgecolor="none", zorder=2)
        else:
            _add_boxes(ax, boxes, facecolors=color, edgecolor="white", linewidth=0.4, zorder=3)
    compute = [r for r in rows if r.kind in "FBIWR" and r.microbatch >= 0 and r.device in position]
    if len(compute) <= _MAX_LABELS:
        for r in compute:
            w = r.end_ms - r.start_ms
            if w >= span / 90:
                ax.text(r.start_ms + w / 2, position[r.device], str(r.microbatch), ha="center", va="center",
                        fontsize=7, color="white", zorder=4, clip_on=True)
    ax.set_ylim(len(shown) - 0.5, -0.5)  # the first device on top, like the schedule grid
    every = -(-len(shown) // _MAX_TICKS) or 1  # beyond _MAX_TICKS rows, label every k-th: labels would overlap
    ticks = range(0, len(shown), every)
    ax.set_yticks(ticks, [_device_label(shown[i], device_names) for i in ticks])
    ax.grid(axis="y", visible=False)
    ax.set_xlim(0, span * 1.01)
    return {r.kind for r in rows} | widened


def min_thin_bar_width(ax: Any, x_span: float) -> float:
    """The least width, in x-axis units over an axis `x_span` long, at which a thin bar on `ax` shows
    (_MIN_THIN_BAR_IN). The axes' final width is known only after layout, at render; before it, it
    is taken as its current share of the figure but at least _MIN_AXES_FRACTION, so that layout
    (which mostly widens it) leaves the bar about 2 pixels or more."""
    figure = ax.get_figure()
    axes_in = figure.get_figwidth() * max(ax.get_position().width, _MIN_AXES_FRACTION)
    return x_span * _MIN_THIN_BAR_IN / axes_in


def _add_boxes(ax: Any, boxes: Sequence[tuple[float, float, float, float]], **style: Any) -> None:
    """Rectangles (x, y, width, height) as one collection: one call per kind, not per device (adding a
    collection rescales the axes, so thousands of devices drawn one by one took minutes); the limits
    are set by draw_gantt."""
    from matplotlib.collections import PolyCollection

    verts = [((x, y), (x, y + h), (x + w, y + h), (x + w, y)) for x, y, w, h in boxes]
    ax.add_collection(PolyCollection(verts, **style), autolim=False)


def _device_label(device: int, names: Sequence[str] | None) -> str:
    """'1: gpu1': the index and the device's name (dev1 when none is given; the index alone past the names)."""
    if names is None:
        return f"{device}: dev{device}"
    return f"{device}: {names[device]}" if device < len(names) else str(device)


def drawn_devices(plan: Any, model: str | None = None) -> str:
    """What a plan's timeline draws, for a title: "4 devices" for one pipeline; for a plan with a
    `parallel` object, which part of the layout, e.g. "one of 4 pipeline replicas (dp 4 x pp 4 x tp 1
    on 16 GPUs, a100-80gb, gpt:layers=6)" ("4 devices" there hid 12 of 16 GPUs). The model is the
    plan's spec, else `model` (a profile's `# model`); none when neither records one."""
    layout = plan.parallel
    if layout is None:
        return f"{plan.n_devices} devices"
    what = f"one of {layout.dp} pipeline replicas" if layout.dp > 1 else "the one pipeline"
    if layout.tp > 1:
        what += f", each row {layout.tp} tensor-parallel GPUs"
    details = [f"dp {layout.dp} x pp {layout.pp} x tp {layout.tp} on {plan.n_processes:,} GPUs"]
    if layout.hardware:
        details.append(layout.hardware)
    spec = plan.model or model
    if spec:
        details.append(printable(spec, _MAX_MODEL_CHARS))
    return f"{what} ({', '.join(details)})".replace("$", r"\$")  # matplotlib reads text between two $ as math


def devices_in(*timelines: Sequence[TimelineRow]) -> list[int]:
    """The devices that occur in the timelines, in order."""
    return sorted({r.device for rows in timelines for r in rows})


def _height(per_device: float, n_devices: int, base: float) -> float:
    """Figure height, inches: `per_device` a row, at most _MAX_HEIGHT_IN (thousands of devices would
    otherwise make a figure of thousands of inches, gigabytes once rendered)."""
    return min(base + per_device * n_devices, _MAX_HEIGHT_IN)


def _legend(fig: Any, kinds: set[str]) -> None:
    from matplotlib.patches import Patch

    widened = " (short ones drawn wider)"
    handles = [Patch(facecolor=KIND_COLORS[k], label=f"{k} {KIND_LABELS[k]}" + (widened if k + WIDENED in kinds else ""))
               for k in _KIND_ORDER if k in kinds]
    handles.append(Patch(facecolor=_IDLE_COLOR, edgecolor="#E3B5B5", hatch="///", label="idle (bubble)"))
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4))


def gantt_figure(rows: Sequence[Any], *, title: str | None = None,
                 device_names: Sequence[str] | None = None) -> Any:
    """One timeline as a figure (one row per device)."""
    rows = as_rows(rows)
    devices = devices_in(rows)
    end = max((r.end_ms for r in rows), default=0.0)
    with style_context():
        fig = new_figure(11.0, _height(0.5, max(len(devices), 1), 1.7))
        ax = fig.subplots()
        kinds = draw_gantt(ax, rows, devices, device_names)
        ax.set_xlabel("time from iteration start (ms)")
        ax.set_ylabel("device")
        fig.suptitle(title or f"Pipeline timeline: one iteration, {end:.2f} ms", wrap=True)
        _legend(fig, kinds)
    return fig


def gantt_compare_figure(predicted: Sequence[Any], measured: Sequence[Any], *, title: str | None = None,
                         device_names: Sequence[str] | None = None) -> Any:
    """Predicted (top) and measured (bottom) timelines stacked on one shared time axis."""
    panels = [("Predicted", as_rows(predicted)), ("Measured", as_rows(measured))]
    devices = devices_in(*(rows for _, rows in panels))  # both panels list the same devices
    t_max = max((r.end_ms for _, rows in panels for r in rows), default=1.0) or 1.0
    with style_context():
        fig = new_figure(11.0, _height(1.0, max(len(devices), 1), 2.2))
        axes = fig.subplots(2, 1, sharex=True)
        kinds: set[str] = set()
        for ax, (label, rows) in zip(axes, panels):
            kinds |= draw_gantt(ax, rows, devices, device_names, t_max)
            end = max((r.end_ms for r in rows), default=0.0)
            ax.set_title(f"{label}: {end:.2f} ms", loc="left")
            ax.set_ylabel("device")
        axes[-1].set_xlabel("time from iteration start (ms)")
        fig.suptitle(title or "Pipeline timeline: predicted vs measured", wrap=True)
        _legend(fig, kinds)
    return fig


def gantt_png(rows: Sequence[Any], *, title: str | None = None, device_names: Sequence[str] | None = None,
              measured: Sequence[Any] | None = None, fmt: str = "png") -> bytes:
    """PNG (or SVG) bytes of a timeline, or of predicted vs `measured` when given."""
    if measured is not None:
        fig = gantt_compare_figure(rows, measured, title=title, device_names=device_names)
    else:
        fig = gantt_figure(rows, title=title, device_names=device_names)
    return render(fig, fmt)
