"""Throughput per GPU across dp x pp x tp layouts of one cluster: chosen point starred, layouts
that do not fit the GPU's memory hollow (drawn where they would be if they fitted)."""

from __future__ import annotations

from typing import Any, Sequence

from planner.atomic import atomic_write_bytes
from planner.report.style import new_figure, render, style_context

__all__ = ["draw_layouts", "write_layout_figure"]

_TP_COLORS = {1: "#4C72B0", 2: "#55A868", 4: "#C44E52", 8: "#8172B2"}


def draw_layouts(points: Sequence[Any], chosen: Any, title: str) -> Any:
    """Figure: one marker per layout (x: dp x pp x tp sorted by tp then pp), y: TFLOP/s per GPU."""
    points = sorted((p for p in points if p.tflops_per_gpu is not None), key=lambda p: (p.config.tp, p.config.pp))
    fig = new_figure(max(6.0, 0.42 * len(points) + 2.0), 4.2)
    ax = fig.add_subplot(1, 1, 1)
    for tp in sorted({p.config.tp for p in points}):  # legend entries: filled, whatever the first point is
        ax.scatter([], [], s=46, marker="o", color=_TP_COLORS.get(tp, "#555555"), label=f"tp={tp}")
    for x, p in enumerate(points):
        color = _TP_COLORS.get(p.config.tp, "#555555")
        ax.scatter([x], [p.tflops_per_gpu], s=46, marker="o", zorder=3,
                   facecolors=color if p.fits else "none", edgecolors=color, linewidths=1.5)
        if (p.config.dp, p.config.pp, p.config.tp) == (chosen.config.dp, chosen.config.pp, chosen.config.tp):
            ax.scatter([x], [p.tflops_per_gpu], s=260, marker="*", color="#DD8452", edgecolors="black", zorder=4,
                       label="chosen")
    ax.scatter([], [], s=46, marker="o", facecolors="none", edgecolors="#555555", label="does not fit (memory lifted)")
    ax.set_xticks(range(len(points)))
    ax.set_xticklabels([f"{p.config.dp}x{p.config.pp}x{p.config.tp}" for p in points], rotation=60, ha="right", fontsize=8)
    ax.set_xlabel("layout dp x pp x tp")
    ax.set_ylabel("achieved TFLOP/s per GPU")
    top = max((p.tflops_per_gpu for p in points), default=1.0)
    ax.set_ylim(0, top * 1.15)  # room for the star above the best point
    ax.set_title(title, fontsize=9, wrap=True)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)  # beside, never over a point
    return fig


def write_layout_figure(points: Sequence[Any], chosen: Any, title: str, path: Any) -> None:
    """Draw and write the PNG atomically."""
    with style_context():
        fig = draw_layouts(points, chosen, title)
        atomic_write_bytes(path, render(fig, "png", dpi=130))
