"""Figure 3: iteration time and bubble against micro-batch count, per schedule, chosen point marked."""

from __future__ import annotations

from typing import Any

from planner.report.inputs import ReportInputs
from planner.report.fig_whatif import best_fitting
from planner.report.style import SCHEDULE_COLORS, new_figure

__all__ = ["KEY", "TITLE", "missing", "draw", "caption"]

# Line style and marker per schedule: gpipe and 1f1b often take the same time, so their lines
# overlap; a dashed line over a solid one keeps both visible.
_LINES = {"gpipe": ("-", "o"), "1f1b": ((0, (5, 3)), "s"), "zb": ((0, (1, 1.5)), "^"), "interleaved": ("-.", "D")}

KEY = "3_microbatch_sweep"
TITLE = "Micro-batch count and schedule"


def missing(inputs: ReportInputs, derived: Any = None) -> str | None:
    """Why this figure cannot be drawn, or None."""
    if inputs.plan is None or inputs.profile is None:
        return "needs a plan and its profile (--plan and --profile) to simulate the sweep"
    if not getattr(derived, "sweep", None):
        reason = getattr(derived, "sweep_skipped", None)
        return reason or "the sweep could not be simulated"
    return None


def caption(inputs: ReportInputs) -> str:
    plan = inputs.plan
    return (f"Each point is the plan's stage cuts simulated with one schedule and M micro-batches of "
            f"{plan.global_batch} / M samples (the global batch stays {plan.global_batch}). Hollow markers exceed "
            "a device's memory limit. The star is the fastest point that fits; when the plan's own setting is "
            "another point (black ring), it is because the plan was chosen on another basis (e.g. before a "
            "calibration this sweep applies), or because the partitioner judged that setting with the cuts it "
            "found for it, while this sweep keeps the plan's cuts and recompute everywhere.")


def draw(inputs: ReportInputs, derived: Any) -> Any:
    plan = inputs.plan
    points = derived.sweep
    fig = new_figure(11.0, 4.3)
    ax_t, ax_b = fig.subplots(1, 2)
    schedules = list(dict.fromkeys(p.schedule for p in points))
    for name in schedules:
        pts = sorted((p for p in points if p.schedule == name), key=lambda p: p.n_microbatches)
        color = SCHEDULE_COLORS.get(name, "#555555")
        ls, marker = _LINES.get(name, ("-", "o"))
        xs = [p.n_microbatches for p in pts]
        for ax, attr in ((ax_t, "iteration_ms"), (ax_b, "bubble_fraction")):
            ys = [getattr(p, attr) * (100 if attr == "bubble_fraction" else 1) for p in pts]
            ax.plot(xs, ys, color=color, lw=1.6, ls=ls, marker=marker, ms=6, mfc=color, label=name)
            for x, y, p in zip(xs, ys, pts):
                if not p.fits:
                    ax.plot([x], [y], marker=marker, ms=7, color=color, mfc="white", mew=1.5, ls="none")
    chosen = next((p for p in points if p.schedule == plan.schedule and p.n_microbatches == plan.n_microbatches), None)
    best = best_fitting(points)
    if best is not None:
        for ax, value in ((ax_t, best.iteration_ms), (ax_b, best.bubble_fraction * 100)):
            ax.plot([best.n_microbatches], [value], marker="*", ms=17, color="#F2C12E", mec="#333333",
                    ls="none", label=f"fastest that fits: {best.schedule}, M={best.n_microbatches}", zorder=5)
    if chosen is not None and chosen is not best:
        for ax, value in ((ax_t, chosen.iteration_ms), (ax_b, chosen.bubble_fraction * 100)):
            ax.plot([chosen.n_microbatches], [value], marker="o", ms=15, mfc="none", mec="#222222", mew=1.8,
                    ls="none", label=f"plan's setting: {chosen.schedule}, M={chosen.n_microbatches}", zorder=6)
    ax_t.plot([], [], marker="o", mfc="white", color="#555555", ls="none", label="exceeds memory limit")
    for ax in (ax_t, ax_b):
        ax.set_xscale("log", base=2)
        ms = sorted({p.n_microbatches for p in points})
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.minorticks_off()
        ax.set_xlabel(f"micro-batches per iteration M (global batch {plan.global_batch})")
        ax.set_ylim(bottom=0)
    lo, hi = ax_t.get_ylim()
    ax_t.set_ylim(0, hi * 1.1)
    ax_t.set_ylabel("predicted iteration time (ms)")
    ax_t.set_title("Iteration time")
    ax_b.set_ylabel("bubble (% of device time idle)")
    ax_b.set_title("Bubble fraction")
    lo, hi = ax_b.get_ylim()
    ax_b.set_ylim(0, max(hi, 1.0) * 1.1)
    ax_t.legend(loc="best", fontsize=8)
    ax_b.legend(loc="best", fontsize=8)
    return fig
