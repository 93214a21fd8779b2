"""Figure 4: the plan against the baseline splits (uniform, params, time): time and peak memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.plan import Prediction
from planner.report.inputs import ReportInputs
from planner.report.style import LIMIT_STYLE, bytes_axis, new_figure
from planner.units import format_share

__all__ = ["KEY", "TITLE", "missing", "draw", "caption", "candidates", "SplitBar"]

KEY = "4_baselines"
TITLE = "The plan against baseline splits"
_PLAN_COLOR = "#4C72B0"
_BASE_COLOR = "#9DB4D3"
_INFEASIBLE_COLOR = "#E8A5A5"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


_METHOD_NAMES = {"uniform": "uniform", "params": "params", "time": "time", "dp": "pplan DP", "ilp": "pplan ILP"}


@dataclass(frozen=True)
class SplitBar:
    """One row of the figure and of the summary's comparison: the plan, or one baseline split."""

    name: str
    """Label: "pplan plan", or the method (with its schedule and M when not at the plan's setting)."""
    iteration_ms: float | None
    """Predicted iteration time, ms (None: not known)."""
    peak_memory_bytes: float | None
    """Peak memory of the fullest device, bytes (None: not known)."""
    feasible: bool
    """Whether it fits the memory limit."""
    is_plan: bool
    """True for the plan itself (the first row)."""


def candidates(inputs: ReportInputs, derived: Any = None) -> list[SplitBar]:
    """The plan first, then each baseline split that `pplan partition` recorded in `plan.search.baselines`.

    Each baseline row holds the method's best candidate and, under `at_plan_setting`, the same
    method at the plan's schedule and micro-batch count, which is what is compared here when
    present (only the cuts differ).
    """
    plan = inputs.plan
    if plan is None:
        return []
    search = plan.search
    origin = search.source if search is not None else None
    name = "pplan plan" + (f" (= {origin} split)" if origin in ("uniform", "params", "time") else "")
    simulated = inputs.sim.prediction if inputs.sim is not None else None
    rows = [SplitBar(name, _iteration_ms(plan.predicted) or _iteration_ms(simulated),
                     _largest_peak(plan.predicted) or _largest_peak(simulated), feasible=True, is_plan=True)]
    for b in (search.baselines or ()) if search is not None else ():
        if not b.method:
            continue
        pick = b.at_plan_setting or b
        label = _METHOD_NAMES.get(b.method, b.method)
        if b.at_plan_setting is None and b.schedule:
            label += f" ({b.schedule}, M={b.n_microbatches if b.n_microbatches is not None else '?'})"
        rows.append(SplitBar(label, _number(pick.iteration_ms), _number(pick.peak_memory_bytes),
                             feasible=pick.fits is not False, is_plan=False))
    return rows


def _iteration_ms(prediction: Prediction | None) -> float | None:
    return _number(prediction.iteration_ms) if prediction is not None else None


def _largest_peak(prediction: Prediction | None) -> float | None:
    """The largest device peak a prediction records (None when it records none)."""
    devices = (prediction.devices or ()) if prediction is not None else ()
    peaks = [v for v in (_number(d.peak_memory_bytes) for d in devices) if v]
    return max(peaks) if peaks else None


def missing(inputs: ReportInputs, derived: Any = None) -> str | None:
    """Why this figure cannot be drawn, or None."""
    if inputs.plan is None:
        return "needs a plan (--plan) written by `pplan partition`"
    if len(candidates(inputs, derived)) < 2:  # the report never recomputes baselines: they are partition's
        if inputs.plan.search is None and inputs.warnings:  # the loader dropped records made for another plan
            return ("the plan's search record (with its baselines) was dropped as made for another plan (see the "
                    "warning); re-run `pplan partition` for this plan's baselines")
        if inputs.plan.search is None:
            return ("the plan has no search record (plan.search), so no baseline splits to compare; "
                    "re-run `pplan partition` to record them")
        return "the plan's search record holds no baseline splits (plan.search.baselines); re-run `pplan partition` to record them"
    return None


def caption(inputs: ReportInputs) -> str:
    search = inputs.plan.search if inputs.plan is not None else None
    calibrated = search.calibrated if search is not None else None
    basis = {True: " Basis: calibrated, as the plan was searched.",
             False: " Basis: uncalibrated (the profile as measured), as the plan was searched."}.get(calibrated, "")
    return ("Predicted iteration time (left) and largest per-device peak memory (right) of pplan's plan and "
            "of the baseline splits: equal layer counts (uniform), equal parameter bytes (params) and equal "
            "compute time (time), as `pplan partition` evaluated them: the plan's schedule and micro-batches, "
            + ("with recompute added where it helps them fit. Red hatched bars do not fit the memory limit (dashed)."
               if _limit(inputs) else "with no memory limit.")
            + basis)


def _limit(inputs: ReportInputs) -> float | None:
    if inputs.plan is None:
        return None
    limits = [d.memory_bytes for d in inputs.plan.devices if d.memory_bytes]
    return float(min(limits)) if limits else None


def draw(inputs: ReportInputs, derived: Any = None) -> Any:
    rows = candidates(inputs, derived)
    limit = _limit(inputs)
    fig = new_figure(11.0, 4.2)
    ax_t, ax_m = fig.subplots(1, 2)
    y = np.arange(len(rows))[::-1]
    names = [r.name for r in rows]
    colors = [_PLAN_COLOR if r.is_plan else (_BASE_COLOR if r.feasible else _INFEASIBLE_COLOR) for r in rows]
    hatches = [None if r.feasible else "///" for r in rows]

    times = [r.iteration_ms or 0.0 for r in rows]
    plan_ms = rows[0].iteration_ms
    bars = ax_t.barh(y, times, color=colors, hatch=hatches, edgecolor="#C44E52", lw=0)
    for bar, r in zip(bars, rows):
        text = f"{r.iteration_ms:.1f} ms" if r.iteration_ms else "n/a"
        if r.iteration_ms and plan_ms and not r.is_plan:
            text += f"  ({r.iteration_ms / plan_ms:.2f}x the plan's)"
        if not r.feasible:
            text += "  infeasible"
        ax_t.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + text, va="center", fontsize=8.5)
    ax_t.set_yticks(y, names)
    ax_t.set_xlabel("predicted iteration time (ms)")
    ax_t.set_title("Iteration time")
    ax_t.set_xlim(0, max(times + [1.0]) * 1.45)

    peaks = [r.peak_memory_bytes or 0.0 for r in rows]
    div, unit = bytes_axis(max(peaks + [limit or 0.0, 1.0]))
    bars = ax_m.barh(y, np.array(peaks) / div, color=colors, hatch=hatches, edgecolor="#C44E52", lw=0)
    for bar, r in zip(bars, rows):
        text = f"{r.peak_memory_bytes / div:.2f} {unit}" if r.peak_memory_bytes else "n/a"
        if r.peak_memory_bytes and limit:
            text += f"  ({format_share(r.peak_memory_bytes, limit)} of limit)"
        # Right of the bar or of the limit line, whichever is further: a label never crosses the line.
        x_text = max(bar.get_width(), limit / div if limit else 0.0)
        ax_m.text(x_text, bar.get_y() + bar.get_height() / 2, " " + text, va="center", fontsize=8.5,
                  bbox={"facecolor": "white", "alpha": 0.8, "lw": 0, "pad": 1})
    if limit:
        ax_m.axvline(limit / div, **LIMIT_STYLE)
    ax_m.set_yticks(y, names)
    ax_m.set_xlabel(f"peak memory of the fullest device ({unit})")
    ax_m.set_title(f"Peak memory (limit {limit / div:.2f} {unit}, dashed)" if limit else "Peak memory")
    ax_m.set_xlim(0, max(peaks + [limit or 0.0, 1.0]) / div * 1.6)
    for ax in (ax_t, ax_m):
        ax.grid(axis="y", visible=False)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=_PLAN_COLOR, label="pplan's plan")]
    if any(r.feasible and not r.is_plan for r in rows):
        # without a memory limit every split fits: saying so would hint at a limit there is not
        handles.append(Patch(facecolor=_BASE_COLOR, label="baseline that fits" if limit else "baseline split"))
    if any(not r.feasible for r in rows):
        handles.append(Patch(facecolor=_INFEASIBLE_COLOR, hatch="///", edgecolor="#C44E52",
                             label="does not fit the memory limit"))
    if limit:
        handles.append(Line2D([], [], **LIMIT_STYLE, label="memory limit"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles))
    return fig
