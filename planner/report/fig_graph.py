"""Figure: the layer graph in order, skip edges as arcs, planned cuts with their bytes.

Drawn by `pplan partition --plot PLAN.png` (the plan's cuts) for any model; for models that are
not a chain (a U-Net's skip tensors) it shows why the planner cut where it did.

Layers sit left to right in the traced order. A straight arrow carries what layer i+1 reads
from layer i; an arc above the row goes from a skip tensor's producer to each consumer beyond
the next layer, labelled with its bytes. Each cut is a dashed line labelled with what crosses
it hop by hop. All bytes are per sample; a legend names each mark. matplotlib is imported
lazily (Agg).
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

import numpy as np

from planner.atomic import atomic_write_bytes
from planner.graph.crossing import crossing_bytes, stage_ranges
from planner.graph.edges import as_skip_edges
from planner.units import format_bytes

__all__ = ["draw_layer_graph", "plan_graph", "per_sample_outputs"]


_LABEL_BOX = dict(fc="white", ec="none", pad=0.5)  # behind a byte label, over the lines it sits on (matplotlib copies it)
_BOX, _CHAIN, _SKIP, _CUT = "#dde8f5", "#335", "#b35a00", "#c00"  # fill of a layer box; colours of the marks


def draw_layer_graph(names: Sequence[str], output_bytes: Sequence[float], skip_edges: Iterable[Sequence],
                     path: str | os.PathLike, cuts: Iterable[int] = (), title: str | None = None) -> None:
    """Write a PNG of the layers, their chain and skip edges and the cuts (module docstring)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(names)
    edges = as_skip_edges(skip_edges)
    cut_list = list(cuts)
    stage_ranges(n, cut_list)  # validates the cuts
    cross = crossing_bytes(n, output_bytes, edges) if n > 1 else np.zeros(0)
    span = max([e.dst - e.src for e in edges], default=1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.05 * n + 1), 2.2 + 0.3 * _arc_height(span) * 4))
    _draw_cuts(ax, cut_list, cross)
    _draw_layers(ax, names)
    _draw_chain(ax, _chain_bytes(n, output_bytes, edges))
    _draw_skip_arcs(ax, edges)
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylim(-1.15, 0.5 + _arc_height(span) if edges else 0.6)
    ax.axis("off")
    ax.set_title(title or f"{n} layers, {len(edges)} skip edge(s); bytes per sample", fontsize=9)
    _add_legend(ax, bool(edges), bool(cut_list))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def _arc_height(length: int) -> float:
    """Height of a skip arc over `length` layers: it grows with the length, so nested arcs do not cross."""
    return 0.3 + 0.14 * length


def _chain_bytes(n: int, output_bytes: Sequence[float], edges: Sequence[Any]) -> list[float]:
    """What layer i+1 reads from layer i, for each of the `n` layers: its chain bytes plus skip
    tensors it reads on the way."""
    to_next = [float(output_bytes[i]) for i in range(n)]
    for e in edges:
        if e.src + 1 in e.consumers:
            to_next[e.src] += e.bytes_per_sample
    return to_next


def _draw_cuts(ax: Any, cut_list: list[int], cross: np.ndarray) -> None:
    """A dashed line after each cut's layer, labelled with the bytes crossing it."""
    for c in cut_list:
        ax.axvline(c + 0.5, color=_CUT, ls="--", lw=1, zorder=1)
        ax.text(c + 0.5, -0.7, f"cut {c}\n{format_bytes(cross[c])}", ha="center", va="top", fontsize=7, color=_CUT, bbox=_LABEL_BOX, zorder=3)


def _draw_layers(ax: Any, names: Sequence[str]) -> None:
    """One named box per layer, left to right (long names turned upright to fit)."""
    from matplotlib.patches import FancyBboxPatch

    for i, name in enumerate(names):
        ax.add_patch(FancyBboxPatch((i - 0.38, -0.3), 0.76, 0.6, boxstyle="round,pad=0.02", fc=_BOX, ec=_CHAIN, zorder=2))
        ax.text(i, 0, name, ha="center", va="center", fontsize=8, rotation=90 if len(name) > 7 else 0, zorder=3)


def _draw_chain(ax: Any, to_next: list[float]) -> None:
    """A short arrow from each layer to the next that reads from it, its bytes below."""
    from matplotlib.patches import FancyArrowPatch

    for i in range(len(to_next) - 1):
        if to_next[i] > 0:
            ax.add_patch(FancyArrowPatch((i + 0.4, 0), (i + 0.6, 0), arrowstyle="-|>", mutation_scale=8, color=_CHAIN, zorder=2))
            ax.text(i + 0.5, -0.4, format_bytes(to_next[i]), ha="center", va="top", fontsize=6, color=_CHAIN, bbox=_LABEL_BOX, zorder=3)


def _draw_skip_arcs(ax: Any, edges: Sequence[Any]) -> None:
    """An arc above the row from each skip tensor's producer to each consumer beyond the next
    layer; the arc to its last consumer carries the tensor's bytes."""
    from matplotlib.patches import FancyArrowPatch

    t = np.linspace(0, np.pi, 60)
    for e in edges:
        for c in e.consumers:
            if c == e.src + 1:
                continue
            h = _arc_height(c - e.src)
            x = e.src + (c - e.src) * (1 - np.cos(t)) / 2
            y = 0.32 + h * np.sin(t)
            ax.plot(x[:-1], y[:-1], color=_SKIP, lw=1.3, zorder=2)
            ax.add_patch(FancyArrowPatch((x[-2], y[-2]), (x[-1], y[-1]), arrowstyle="-|>", mutation_scale=9, color=_SKIP, zorder=2))
            if c == e.dst:
                ax.text((e.src + c) / 2, 0.32 + h, format_bytes(e.bytes_per_sample), ha="center", va="center", fontsize=7, color=_SKIP,
                        bbox=_LABEL_BOX, zorder=3)


def _add_legend(ax: Any, has_edges: bool, has_cuts: bool) -> None:
    """A legend below the row naming each mark the figure shows."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    # alpha: the legend swatch reads as a layer box but is not counted as one by pixel tests
    handles = [Patch(fc=_BOX, ec=_CHAIN, alpha=0.8, label="layer (in traced order)"),
               Line2D([], [], color=_CHAIN, marker=">", ls="-", label="chain: bytes layer i+1 reads from layer i")]
    if has_edges:
        handles.append(Line2D([], [], color=_SKIP, lw=1.3, label="skip tensor: producer to later reader, bytes"))
    if has_cuts:
        handles.append(Line2D([], [], color=_CUT, ls="--", lw=1, label="planned cut: bytes crossing it"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncols=len(handles),
              fontsize=7, frameon=False)


def per_sample_outputs(profile: Any) -> list[float]:
    """Each layer's output bytes per sample (at the smallest profiled micro-batch size)."""
    size = profile.micro_batch_sizes[0]
    return list(profile.columns["output_bytes"][:, 0] / size)


def plan_graph(plan: Any, profile: Any, path: str | os.PathLike) -> list[int]:
    """Draw `profile`'s layers with `plan`'s cuts to `path`; returns the cuts (last layer of each stage)."""
    cuts = [st.layers[1] - 1 for st in plan.stages[:-1]]
    label = profile.meta.get("model") or "model"
    draw_layer_graph(list(profile.names), per_sample_outputs(profile), profile.skip_edges, path, cuts,
                     title=f"{label}: {len(profile.names)} layers, {plan.n_stages} stages, cuts after layers "
                           f"{cuts}; bytes per sample")
    return cuts
