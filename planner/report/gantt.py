"""Gantt charts of pipeline timelines: predicted, measured, or both on one time axis.

Rows are anything with the timeline CSV's fields (device, stage, kind, microbatch, start_ms,
end_ms) as attributes, dict keys or tuple positions: planner.simulation.result.TimelineRow (what the
simulator makes and the report reads from a measured timeline CSV) or plain tuples and dicts. Each device is one row of boxes, coloured by
kind (F, B, I, W, R recompute, O optimizer) with the micro-batch number inside when it fits;
transfers (C) are thin bars under the sending device; idle time (the bubble) is a hatched band.
matplotlib is imported lazily and rendered through Agg (planner.report.style).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from planner.report.style import KIND_COLORS, KIND_LABELS, new_figure, render, style_context
from planner.simulation.result import TimelineRow

__all__ = ["as_rows", "draw_gantt", "gantt_figure", "gantt_compare_figure", "gantt_png"]

_KIND_ORDER = ("F", "B", "I", "W", "R", "T", "A", "O", "C")
_IDLE_COLOR = "#F3D9D9"
_MAX_LABELS = 1500  # beyond this many boxes, numbers would be unreadable anyway


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


def draw_gantt(ax: Any, rows: Sequence[Any], n_devices: int | None = None,
               device_names: Sequence[str] | None = None, t_max: float | None = None) -> set[str]:
    """Draw `rows` on matplotlib axes `ax`; returns the kinds drawn (for a shared legend)."""
    rows = as_rows(rows)
    n = n_devices if n_devices is not None else max((r.device for r in rows), default=-1) + 1
    end = max((r.end_ms for r in rows), default=0.0)
    span = t_max if t_max else (end or 1.0)
    height, comm_h = 0.62, 0.14
    # the bubble: everything of a device's row not covered by compute is idle
    for d in range(n):
        ax.broken_barh([(0.0, end)], (d - height / 2, height), facecolors=_IDLE_COLOR, hatch="///",
                       edgecolor="#E3B5B5", linewidth=0.0, zorder=1)
    boxes: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for r in rows:
        boxes.setdefault((r.device, r.kind), []).append((r.start_ms, max(r.end_ms - r.start_ms, 0.0)))
    for (d, kind), spans in boxes.items():
        color = KIND_COLORS.get(kind, "#333333")
        if kind == "C":
            ax.broken_barh(spans, (d + height / 2 + 0.02, comm_h), facecolors=color, edgecolor="none", zorder=2)
        elif kind == "A":  # the gradient sync overlaps the last backward: its own thin lane above the bar
            ax.broken_barh(spans, (d - height / 2 - 0.02 - comm_h, comm_h), facecolors=color, edgecolor="none", zorder=2)
        else:
            ax.broken_barh(spans, (d - height / 2, height), facecolors=color, edgecolor="white", linewidth=0.4, zorder=3)
    compute = [r for r in rows if r.kind in "FBIWR" and r.microbatch >= 0]
    if len(compute) <= _MAX_LABELS:
        for r in compute:
            w = r.end_ms - r.start_ms
            if w >= span / 90:
                ax.text(r.start_ms + w / 2, r.device, str(r.microbatch), ha="center", va="center",
                        fontsize=7, color="white", zorder=4, clip_on=True)
    ax.set_ylim(n - 0.5, -0.5)  # device 0 on top, like the schedule grid
    names = device_names if device_names is not None else [f"dev{d}" for d in range(n)]
    ax.set_yticks(range(n), [f"{d}: {names[d]}" if d < len(names) else str(d) for d in range(n)])
    ax.grid(axis="y", visible=False)
    ax.set_xlim(0, span * 1.01)
    return {r.kind for r in rows}


def _legend(fig: Any, kinds: set[str]) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=KIND_COLORS[k], label=f"{k} {KIND_LABELS[k]}") for k in _KIND_ORDER if k in kinds]
    handles.append(Patch(facecolor=_IDLE_COLOR, edgecolor="#E3B5B5", hatch="///", label="idle (bubble)"))
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4))


def gantt_figure(rows: Sequence[Any], *, title: str | None = None,
                 device_names: Sequence[str] | None = None) -> Any:
    """One timeline as a figure (one row per device)."""
    rows = as_rows(rows)
    n = max((r.device for r in rows), default=0) + 1
    end = max((r.end_ms for r in rows), default=0.0)
    with style_context():
        fig = new_figure(11.0, 1.7 + 0.5 * n)
        ax = fig.subplots()
        kinds = draw_gantt(ax, rows, n, device_names)
        ax.set_xlabel("time from iteration start (ms)")
        ax.set_ylabel("device")
        fig.suptitle(title or f"Pipeline timeline: one iteration, {end:.2f} ms")
        _legend(fig, kinds)
    return fig


def gantt_compare_figure(predicted: Sequence[Any], measured: Sequence[Any], *, title: str | None = None,
                         device_names: Sequence[str] | None = None) -> Any:
    """Predicted (top) and measured (bottom) timelines stacked on one shared time axis."""
    panels = [("Predicted", as_rows(predicted)), ("Measured", as_rows(measured))]
    n = max((r.device for _, rows in panels for r in rows), default=0) + 1
    t_max = max((r.end_ms for _, rows in panels for r in rows), default=1.0) or 1.0
    with style_context():
        fig = new_figure(11.0, 2.2 + 1.0 * n)
        axes = fig.subplots(2, 1, sharex=True)
        kinds: set[str] = set()
        for ax, (label, rows) in zip(axes, panels):
            kinds |= draw_gantt(ax, rows, n, device_names, t_max)
            end = max((r.end_ms for r in rows), default=0.0)
            ax.set_title(f"{label}: {end:.2f} ms", loc="left")
            ax.set_ylabel("device")
        axes[-1].set_xlabel("time from iteration start (ms)")
        fig.suptitle(title or "Pipeline timeline: predicted vs measured")
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
