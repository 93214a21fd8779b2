"""Figure 5: the per-layer profile (time and bytes per layer) with the plan's stage cuts."""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.report.inputs import ReportInputs
from planner.report.style import MEMORY_COLORS, KIND_COLORS, bytes_axis, device_color, new_figure

__all__ = ["KEY", "TITLE", "missing", "draw", "caption"]

KEY = "5_profile"
TITLE = "Per-layer profile and stage cuts"
_MAX_NAMED_TICKS = 40


def missing(inputs: ReportInputs, derived: Any = None) -> str | None:
    """Why this figure cannot be drawn, or None."""
    return "needs a profile (--profile)" if inputs.profile is None else None


def _micro_batch_size(inputs: ReportInputs) -> int:
    if _plan_matches(inputs):
        return inputs.plan.micro_batch_size
    return inputs.profile.micro_batch_sizes[0]


def _plan_matches(inputs: ReportInputs) -> bool:
    plan = inputs.plan
    return plan is not None and plan.stages[-1].layers[1] == inputs.profile.n_layers


def caption(inputs: ReportInputs) -> str:
    b = _micro_batch_size(inputs)
    text = (f"Forward and backward time (top) and parameter and activation bytes (bottom) of each layer "
            f"at micro-batch size {b}.")
    if _plan_matches(inputs):
        text += (" Shaded bands are the plan's stages, labelled with their time per micro-batch (F+B, and R for "
                 "the forward a recomputed layer repeats); hatched activation bars are recomputed layers.")
    elif inputs.plan is not None:
        text += (f" The plan's stages are not drawn: it covers {inputs.plan.stages[-1].layers[1]} layers, "
                 f"the profile has {inputs.profile.n_layers}.")
    return text


def draw(inputs: ReportInputs, derived: Any = None) -> Any:
    profile = inputs.profile
    plan = inputs.plan if _plan_matches(inputs) else None
    b = _micro_batch_size(inputs)
    costs = profile.at(b)
    n = profile.n_layers
    x = np.arange(n)
    fig = new_figure(max(8.0, min(16.0, 0.32 * n + 4)), 6.4)
    ax_t, ax_m = fig.subplots(2, 1, sharex=True)

    ax_t.bar(x, costs.fwd_ms, width=0.8, color=KIND_COLORS["F"], label="forward")
    ax_t.bar(x, costs.bwd_ms, width=0.8, bottom=costs.fwd_ms, color=KIND_COLORS["B"], label="backward")
    ax_t.set_ylabel("time per micro-batch (ms)")
    title = f"Per-layer profile at micro-batch size {b}"
    if costs.interpolated:
        title += f" ({profile.size_basis(b)})"
    ax_t.set_title(title)

    top = float(max(np.max(costs.param_bytes), np.max(costs.activation_bytes), 1.0))
    div, unit = bytes_axis(top)
    w = 0.4
    ax_m.bar(x - w / 2, costs.param_bytes / div, width=w, color=MEMORY_COLORS["weights"], label="parameters")
    recompute = set()
    if plan is not None:
        for st in plan.stages:
            recompute.update(st.recompute)
    act = ax_m.bar(x + w / 2, costs.activation_bytes / div, width=w, color=MEMORY_COLORS["activations"],
                   label="activations kept\n(per micro-batch)")
    for i in recompute:
        if 0 <= i < n:
            act[i].set_hatch("///")
            act[i].set_edgecolor("white")
    ax_m.set_ylabel(f"bytes ({unit})")
    ax_m.set_xlabel("layer")

    if plan is not None:
        _draw_stages(ax_t, ax_m, plan, costs)
    if recompute:
        from matplotlib.patches import Patch

        handles, labels = ax_m.get_legend_handles_labels()
        handles.append(Patch(facecolor=MEMORY_COLORS["activations"], hatch="///", edgecolor="white"))
        labels.append("recomputed layer")
        ax_m.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    else:
        ax_m.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax_t.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    for ax in (ax_t, ax_m):
        ax.margins(x=0.01)
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, hi * 1.18)  # room for the stage labels

    if n <= _MAX_NAMED_TICKS:
        ax_m.set_xticks(x, [f"{i} {name}" for i, name in enumerate(profile.names)], rotation=45, ha="right",
                        fontsize=8 if n > 16 else 9)
    ax_m.grid(axis="x", visible=False)
    ax_t.grid(axis="x", visible=False)
    return fig


def _draw_stages(ax_t: Any, ax_m: Any, plan: Any, costs: Any) -> None:
    for s, st in enumerate(plan.stages):
        first, end = st.layers
        color = device_color(st.device)
        for ax in (ax_t, ax_m):
            ax.axvspan(first - 0.5, end - 0.5, color=color, alpha=0.08, lw=0)
            if first > 0:
                ax.axvline(first - 0.5, color="#333333", ls="--", lw=1)
        # Recomputed layers run their forward again during the backward: count it.
        stage_ms = float(np.sum(costs.fwd_ms[first:end]) + np.sum(costs.bwd_ms[first:end])
                         + sum(float(costs.fwd_ms[i]) for i in st.recompute))
        name = plan.devices[st.device].name if st.device < len(plan.devices) else f"dev{st.device}"
        narrow = (end - first) < max(2, len(costs.fwd_ms) / 12)  # a full label would spill over neighbours
        kinds = "F+B+R" if st.recompute else "F+B"
        label = f"s{s}" if narrow else f"stage {s} on {name}\n{stage_ms:.1f} ms {kinds}"
        ax_t.text((first + end - 1) / 2, 0.97, label,
                  transform=ax_t.get_xaxis_transform(), ha="center", va="top", fontsize=8.5, color="#333333")
