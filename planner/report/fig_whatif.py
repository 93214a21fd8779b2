"""The figure of `pplan simulate --sweep`: per micro-batch count or schedule, how fast (left panel) and
the bubble (right panel).

When every value runs the same global batch, speed is the iteration time and the star marks the fastest
value that fits. When the global batch differs between values (--keep micro-batch-size), a shorter
iteration may only do less work, so speed is throughput (samples/s) and the star marks the highest.
Values whose plan exceeds a device's memory limit are drawn as the baselines figure draws them (red,
hollow or hatched, named in the legend). Values that cannot run stay on the axis, as a grey cross and a
'cannot run' tick, so a reader sees they were tried (the table says why). Micro-batch counts are a
trend and are joined by lines; schedules are not, so they get bars and lone markers.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any, Sequence

from planner.report.style import new_figure, style_context

__all__ = ["sweep_figure", "sweep_title", "best_fitting", "batch_varies"]

_OK_COLOR = "#4C72B0"
_OVER_COLOR = "#E8A3A5"
_OVER_EDGE = "#C44E52"
_BUBBLE_COLOR = "#DD8452"
_CANNOT_COLOR = "#8C8C8C"
_CANNOT = {"marker": "X", "ms": 9, "color": _CANNOT_COLOR, "ls": "none", "zorder": 4, "clip_on": False}
_STAR = {"marker": "*", "ms": 17, "color": "#F2C12E", "mec": "#333333", "ls": "none", "zorder": 5}
_TITLE_MARGIN_PX = 10  # room left at each side of the title, at the figure's own dpi
_MODEL_CHARS = 80  # a factory model's spec can run to hundreds of characters; the plan file holds it whole


@dataclass(frozen=True)
class _Measure:
    """What the left panel shows, and how the star is named."""

    attr: str
    axis: str
    panel: str
    star: str
    legend: str


_TIME = _Measure("iteration_ms", "predicted iteration time (ms, lower is better)",
                 "Iteration time (same global batch)", "fastest that fits", "iteration time")
_THROUGHPUT = _Measure("throughput_samples_per_s", "predicted throughput (samples/s, higher is better)",
                       "Throughput (the global batch differs)", "highest throughput that fits", "throughput")


def _runnable(rows: Sequence[Any]) -> list[Any]:
    return [r for r in rows if r.iteration_ms is not None]


def batch_varies(rows: Sequence[Any]) -> bool:
    """Whether the rows that run do not all run the same global batch (then only throughput compares them)."""
    return len({r.global_batch for r in _runnable(rows)}) > 1


def best_fitting(rows: Sequence[Any]) -> Any | None:
    """The best row that runs and fits memory (None when none does): the fastest when every row runs the
    same global batch, else the highest throughput (a shorter iteration may only do less work)."""
    ok = [r for r in _runnable(rows) if r.fits]
    if not ok:
        return None
    if batch_varies(rows):
        return max(ok, key=lambda r: r.throughput_samples_per_s)
    return min(ok, key=lambda r: r.iteration_ms)


def sweep_title(plan: Any, parameter: str, keep: str, calibrated: bool) -> str:
    """The figure's title: what was swept, the model and devices, what stayed fixed, the basis."""
    if parameter == "microbatches":
        swept = "micro-batch count"
        kept = (f"global batch {plan.global_batch} kept" if keep == "global-batch"
                else f"micro-batch size {plan.micro_batch_size} kept")
        fixed = f"{plan.schedule}, {kept}"
    else:
        swept, fixed = "schedule", f"{plan.n_microbatches} micro-batches of {plan.micro_batch_size}"
    model = plan.model or "model not recorded"
    if len(model) > _MODEL_CHARS:
        model = model[: _MODEL_CHARS - 1] + "…"
    devices = f"{plan.n_devices} pipeline devices"
    if plan.dp * plan.tp > 1:
        devices += f" (dp {plan.dp}, tp {plan.tp})"
    basis = "calibrated" if calibrated else "uncalibrated"
    return f"Sweep of the {swept} ({fixed}; {basis})\n{model} on {devices}"


def sweep_figure(parameter: str, rows: Sequence[Any], title: str) -> Any:
    """Speed and bubble fraction per swept value, in two panels (matplotlib Figure)."""
    trend = parameter == "microbatches"
    shown = sorted(rows, key=lambda r: r.n_microbatches) if trend else list(rows)
    varies = batch_varies(shown)
    measure = _THROUGHPUT if varies else _TIME
    best = best_fitting(shown)
    with style_context():
        fig = new_figure(11.0, 4.8)
        ax_m, ax_b = fig.subplots(1, 2)
        speeds = [getattr(r, measure.attr) if r.iteration_ms is not None else None for r in shown]
        bubbles = [100 * r.bubble_fraction if r.iteration_ms is not None else None for r in shown]
        if trend:
            _markers(ax_m, speeds, shown, _OK_COLOR, "o", joined=True)
        else:
            _bars(ax_m, speeds, shown)
        _markers(ax_b, bubbles, shown, _BUBBLE_COLOR, "s", joined=trend)
        _value_labels(ax_m, speeds, "{:,.0f}" if varies else "{:,.1f}")
        labels = [_tick_label(parameter, r, varies) for r in shown]
        xlabel = ("micro-batches per iteration x samples each" + (" = global batch" if varies else f" ({_global(shown)})")
                  if trend else "schedule")
        for ax, ys in ((ax_m, speeds), (ax_b, bubbles)):
            if None in ys:  # an empty line drawn unclipped has no extent and collapses the layout
                ax.plot([i for i, y in enumerate(ys) if y is None], [0.0] * ys.count(None), **_CANNOT)
            if best is not None:
                ax.plot([shown.index(best)], [ys[shown.index(best)]], **_STAR)
            ax.set_xticks(range(len(shown)), labels)
            for tick, r in zip(ax.get_xticklabels(), shown):
                if r.iteration_ms is None:
                    tick.set_color(_CANNOT_COLOR)
            ax.set_xlim(-0.6, len(shown) - 0.4)
            ax.set_xlabel(xlabel)
        known = [y for y in speeds if y is not None]
        ax_m.set_ylim(0, max(known + [1.0]) * 1.18)
        ax_m.set_ylabel(measure.axis)
        ax_m.set_title(measure.panel)
        ax_b.set_ylim(0, min(100.0, max([y for y in bubbles if y is not None] + [5.0]) * 1.2))
        ax_b.set_ylabel("bubble (% of device time idle)")
        ax_b.set_title("Bubble fraction")
        fig.legend(handles=_legend(shown, measure, best, trend), loc="outside lower center", fontsize=8,
                   ncols=6)
        _fit_title(fig, title)
    return fig


def _markers(ax: Any, ys: list[float | None], rows: Sequence[Any], color: str, marker: str, joined: bool) -> None:
    """One marker per value that runs: filled where it fits memory, hollow red where it does not; a line
    through them (broken where a value cannot run) only where the values are a trend."""
    if joined:
        ax.plot(range(len(ys)), [float("nan") if y is None else y for y in ys], color=color, lw=1.6, zorder=2)
    for i, (y, r) in enumerate(zip(ys, rows)):
        if y is not None:
            fits = bool(r.fits)
            ax.plot([i], [y], marker=marker, ms=7, ls="none", zorder=3, color=color if fits else _OVER_EDGE,
                    mfc=color if fits else "white", mew=1.5)


def _bars(ax: Any, ys: list[float | None], rows: Sequence[Any]) -> None:
    """One bar per value that runs, hatched red where it exceeds the memory limit."""
    ok = [(i, y, r) for i, (y, r) in enumerate(zip(ys, rows)) if y is not None]
    ax.bar([i for i, _, _ in ok], [y for _, y, _ in ok], width=0.6,
           color=[_OK_COLOR if r.fits else _OVER_COLOR for _, _, r in ok],
           hatch=[None if r.fits else "///" for _, _, r in ok], edgecolor=_OVER_EDGE, lw=0, zorder=2)


def _value_labels(ax: Any, ys: list[float | None], fmt: str) -> None:
    """Each value written above its point, so close values can be told apart."""
    for i, y in enumerate(ys):
        if y is not None:
            ax.annotate(fmt.format(y), (i, y), xytext=(0, 10), textcoords="offset points", ha="center",
                        va="bottom", fontsize=7.5, color="#333333")


def _tick_label(parameter: str, r: Any, varies: bool) -> str:
    if parameter != "microbatches":
        head = str(r.value)
    else:
        head = f"{r.n_microbatches}\nx{r.micro_batch_size}" if r.micro_batch_size else str(r.n_microbatches)
        if varies and r.global_batch:
            head += f"\n={r.global_batch}"
    return head + "\ncannot run" if r.iteration_ms is None else head


def _legend(rows: Sequence[Any], measure: _Measure, best: Any | None, trend: bool) -> list[Any]:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ran = _runnable(rows)
    if trend:
        handles = [Line2D([], [], color=_OK_COLOR, marker="o", label=f"{measure.legend} (fits memory)"),
                   Line2D([], [], color=_BUBBLE_COLOR, marker="s", label="bubble")]
    else:
        handles = [Patch(facecolor=_OK_COLOR, label=f"{measure.legend} (fits memory)"),
                   Line2D([], [], color=_BUBBLE_COLOR, marker="s", ls="none", label="bubble")]
    if any(not r.fits for r in ran):
        handles.append(Line2D([], [], color=_OVER_EDGE, marker="o", mfc="white", ls="none",
                              label="exceeds the memory limit") if trend else
                       Patch(facecolor=_OVER_COLOR, hatch="///", edgecolor=_OVER_EDGE, label="exceeds the memory limit"))
    if len(ran) < len(rows):
        handles.append(Line2D([], [], **{**_CANNOT, "ms": 8}, label="cannot run (the table says why)"))
    if best is not None:
        handles.append(Line2D([], [], **{**_STAR, "ms": 12}, label=measure.star))
    return handles


def _fit_title(fig: Any, title: str) -> None:
    """The title as the figure's suptitle, wrapped at spaces (or inside long words) until it fits the width."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    text = title.replace("$", r"\$")  # a model spec is not mathtext
    renderer = FigureCanvasAgg(fig).get_renderer()
    room = fig.bbox.width - 2 * _TITLE_MARGIN_PX
    width = max(len(line) for line in text.splitlines() or [""])
    while True:
        wrapped = "\n".join(textwrap.fill(line, width, break_on_hyphens=False) or line for line in text.splitlines())
        shown = fig.suptitle(wrapped)
        if shown.get_window_extent(renderer).width <= room or width <= 10:
            return
        width = max(10, int(width * 0.9))


def _global(rows: Sequence[Any]) -> str:
    """The one global batch the rows that run share (rows that cannot run may have none)."""
    sizes = {r.global_batch for r in _runnable(rows)}
    return f"global batch {sizes.pop()}" if len(sizes) == 1 else "no value runs"
