"""Figure 3: iteration time and bubble against micro-batch count, per schedule, chosen point marked."""

from __future__ import annotations

from typing import Any, Iterable

from planner.report.derive import replica_batch, sweep_counts
from planner.report.inputs import ReportInputs
from planner.report.fig_whatif import best_fitting
from planner.report.style import SCHEDULE_COLORS, new_figure

__all__ = ["KEY", "TITLE", "missing", "draw", "caption", "extrapolated_counts", "x_label"]

# Line style and marker per schedule: gpipe and 1f1b often take the same time, so their lines
# overlap; a dashed line over a solid one keeps both visible.
_LINES = {"gpipe": ("-", "o"), "1f1b": ((0, (5, 3)), "s"), "zb": ((0, (1, 1.5)), "^"), "interleaved": ("-.", "D")}
# Points whose micro-batch size lies outside the profiled sizes: costs scaled from the nearest profiled
# size, not measured, so they are drawn grey on a grey band (a hollow marker still says "exceeds memory").
EXTRAPOLATED_FACE = "#BDBDBD"
_EXTRAPOLATED_BAND = "#EBEBEB"

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


def _batch_split(plan: Any) -> str:
    """How the global batch splits: "128 = dp 4 x M x b" with data parallelism, "8 = M x b" without."""
    return f"{plan.global_batch} = " + (f"dp {plan.dp} x M x b" if plan.dp > 1 else "M x b")


def x_label(plan: Any) -> str:
    """The x axis: M counts one replica's micro-batches when the plan has several replicas."""
    per = "per replica" if plan.dp > 1 else "per iteration"
    return f"micro-batches {per} M (global batch {_batch_split(plan)})"


def extrapolated_counts(counts: Iterable[int], plan: Any, profile: Any) -> list[int]:
    """The counts M whose micro-batch size (one replica's batch / M) lies outside the profiled sizes, as
    the profile itself tells extrapolation from interpolation (`pplan simulate --sweep` marks the same
    rows "(size extrapolated)")."""
    batch = replica_batch(plan)
    return sorted({m for m in counts if profile.size_basis(batch // m) == "extrapolated"})


def caption(inputs: ReportInputs) -> str:
    plan, profile = inputs.plan, inputs.profile
    batch = replica_batch(plan)
    per = " per replica" if plan.dp > 1 else ""
    text = (f"Each point is the plan's stage cuts simulated with one schedule and M micro-batches{per} of "
            f"b = {batch} / M samples (the global batch stays {_batch_split(plan)}; each tick gives M and b). "
            "Hollow markers exceed a device's memory limit. ")
    if extrapolated_counts(sweep_counts(plan), plan, profile):
        sizes = ", ".join(map(str, profile.micro_batch_sizes))
        text += (f"Grey markers on a grey band have b outside the profiled sizes ({sizes}): their costs are "
                 "extrapolated from the nearest profiled size, not measured (between profiled sizes they are "
                 "interpolated and drawn as the rest). ")
    return text + ("The star is the fastest point that fits; when the plan's own setting is "
                   "another point (black ring), it is because the plan was chosen on another basis (e.g. before a "
                   "calibration this sweep applies), or because the partitioner judged that setting with the cuts it "
                   "found for it, while this sweep keeps the plan's cuts and recompute everywhere.")


def _bands(ms: list[int], flagged: list[int]) -> list[tuple[float, float]]:
    """x spans (log axis) covering each run of adjacent flagged counts, halfway (geometrically) to their
    unflagged neighbours."""
    spans: list[tuple[float, float]] = []
    for i, m in enumerate(ms):
        if m not in flagged:
            continue
        lo = (ms[i - 1] * m) ** 0.5 if i > 0 else m / 2 ** 0.5
        hi = (ms[i + 1] * m) ** 0.5 if i + 1 < len(ms) else m * 2 ** 0.5
        if spans and i > 0 and ms[i - 1] in flagged:
            spans[-1] = (spans[-1][0], hi)
        else:
            spans.append((lo, hi))
    return spans


def draw(inputs: ReportInputs, derived: Any) -> Any:
    plan = inputs.plan
    points = derived.sweep
    ms = sorted({p.n_microbatches for p in points})
    flagged = extrapolated_counts(ms, plan, inputs.profile)
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
                if not p.fits or x in flagged:
                    face = "white" if not p.fits else EXTRAPOLATED_FACE
                    ax.plot([x], [y], marker=marker, ms=7, color=color, mfc=face, mew=1.5, ls="none")
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
    if any(not p.fits for p in points):
        ax_t.plot([], [], marker="o", mfc="white", color="#555555", ls="none", label="exceeds memory limit")
    if flagged:
        sizes = inputs.profile.micro_batch_sizes
        ax_t.plot([], [], marker="o", mfc=EXTRAPOLATED_FACE, color="#555555", ls="none",
                  label=f"b extrapolated (beyond profiled b {sizes[0]} to {sizes[-1]})")
    batch = replica_batch(plan)
    for ax in (ax_t, ax_b):
        for lo, hi in _bands(ms, flagged):
            ax.axvspan(lo, hi, color=_EXTRAPOLATED_BAND, lw=0, zorder=0)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ms, [f"{m}\nb={batch // m}" for m in ms])
        ax.minorticks_off()
        ax.set_xlim(ms[0] / 2 ** 0.5, ms[-1] * 2 ** 0.5)
        ax.set_xlabel(x_label(plan))
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
