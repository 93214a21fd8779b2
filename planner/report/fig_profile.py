"""Figure 5: the per-layer profile (time and bytes per layer) with the plan's stage cuts."""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.cost import checkpoint_input_bytes
from planner.report.inputs import ReportInputs
from planner.report.style import MEMORY_COLORS, KIND_COLORS, bytes_axis, new_figure

__all__ = ["KEY", "TITLE", "missing", "draw", "caption"]

KEY = "5_profile"
TITLE = "Per-layer profile and stage cuts"
_MAX_NAMED_TICKS = 40
_BANDS = (("#4C72B0", 0.16), ("#DD8452", 0.20))
"""Stage bands alternate these two tints (colour, alpha): neighbouring stages always differ, and the label
names each stage's device (device colours at a faint alpha made stages 1 and 3 look alike)."""
_RECOMPUTED_LABEL = "recomputed layer: keeps\nonly its checkpoint input"


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
        text += (" Shaded bands are the plan's stages, labelled with their device and time per micro-batch (F+B, "
                 "and R for the forward a recomputed layer repeats; above the panel where a band is too narrow). "
                 "Hatched activation bars are recomputed layers, drawn at what the cost model keeps for them: "
                 "the checkpoint's input (what the layer reads, plus what its checkpoint saves besides), not "
                 "their activations.")
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
    recompute = {i for st in plan.stages for i in st.recompute if 0 <= i < n} if plan is not None else set()
    act = ax_m.bar(x + w / 2, _kept_bytes(costs, recompute) / div, width=w, color=MEMORY_COLORS["activations"],
                   label="activations kept\n(per micro-batch)")
    for i in recompute:
        act[i].set_hatch("///")
        act[i].set_edgecolor("white")
    ax_m.set_ylabel(f"bytes ({unit})")
    ax_m.set_xlabel("layer")

    stage_labels = _draw_stages(ax_t, ax_m, plan, costs) if plan is not None else []
    if recompute:
        from matplotlib.patches import Patch

        handles, labels = ax_m.get_legend_handles_labels()
        handles.append(Patch(facecolor=MEMORY_COLORS["activations"], hatch="///", edgecolor="white"))
        labels.append(_RECOMPUTED_LABEL)
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
    if stage_labels:
        _fit_stage_labels(fig, ax_t, stage_labels, title)
    return fig


def _kept_bytes(costs: Any, recompute: set[int]) -> np.ndarray:
    """Per layer, the activation bytes kept per micro-batch: a recomputed layer keeps only its
    checkpoint input (planner.cost.memory's kept_bytes charges exactly that), any other its activations."""
    kept = np.asarray(costs.activation_bytes, dtype=float).copy()
    if recompute:
        rec = sorted(recompute)
        kept[rec] = checkpoint_input_bytes(costs)[rec]
    return kept


def _draw_stages(ax_t: Any, ax_m: Any, plan: Any, costs: Any) -> list[tuple[Any, int, int, str]]:
    """Each stage's band (two alternating tints) and cut line, and its label inside the top panel:
    (label, first, end, short label) per stage for _fit_stage_labels."""
    labels = []
    for s, st in enumerate(plan.stages):
        first, end = st.layers
        color, alpha = _BANDS[s % 2]
        for ax in (ax_t, ax_m):
            ax.axvspan(first - 0.5, end - 0.5, color=color, alpha=alpha, lw=0, zorder=0)
            if first > 0:
                ax.axvline(first - 0.5, color="#333333", ls="--", lw=1)
        # Recomputed layers run their forward again during the backward: count it.
        stage_ms = float(np.sum(costs.fwd_ms[first:end]) + np.sum(costs.bwd_ms[first:end])
                         + sum(float(costs.fwd_ms[i]) for i in st.recompute))
        name = plan.devices[st.device].name if st.device < len(plan.devices) else f"dev{st.device}"
        kinds = "F+B+R" if st.recompute else "F+B"
        text = ax_t.text((first + end - 1) / 2, 0.97, f"stage {s} on {name}\n{stage_ms:.1f} ms {kinds}",
                         transform=ax_t.get_xaxis_transform(), ha="center", va="top", fontsize=8.5, color="#333333")
        labels.append((text, first, end, f"s{s}: {stage_ms:.1f} ms"))
    return labels


def _fit_stage_labels(fig: Any, ax_t: Any, labels: list[tuple[Any, int, int, str]], title: str) -> None:
    """Lay the figure out once and move each stage label wider than its band above the panel, over
    its band (kept inside the panel's width), and the title up above them. Where the moved labels
    would still overlap each other, each is turned upright in its short form ("s3: 3.5 ms")."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw_without_rendering()  # constrained layout: the panel's real width
    lo, hi = ax_t.get_xlim()
    moved = []
    for text, first, end, short in labels:
        left, right = (ax_t.transData.transform((v, 0))[0] for v in (first - 0.5, end - 0.5))
        if text.get_window_extent(renderer).width > 0.95 * (right - left):
            ha = "left" if first - 0.5 <= lo + 0.5 else "right" if end - 0.5 >= hi - 0.5 else "center"
            x = {"left": max(first - 0.5, lo), "right": min(end - 0.5, hi), "center": (first + end - 1) / 2}[ha]
            text.set(x=x, y=1.01, ha=ha, va="bottom", fontsize=8, clip_on=False)
            moved.append((text, (first + end - 1) / 2, short))
    if not moved:
        return
    boxes = [t.get_window_extent(renderer) for t, _, _ in moved]
    if any(a.x1 > b.x0 for a, b in zip(boxes, boxes[1:])):
        for t, middle, short in moved:
            t.set(text=short, x=middle, ha="center", rotation=90, fontsize=7.5)
    tallest = max(t.get_window_extent(renderer).height for t, _, _ in moved) * 72.0 / fig.dpi
    ax_t.set_title(title, pad=tallest + 8)
