"""Figure: the layer graph in order, skip edges as arcs, planned cuts with their bytes.

Drawn by `pplan partition --plot PLAN.png` (the plan's cuts) for any model; for models that are
not a chain (a U-Net's skip tensors) it shows why the planner cut where it did.

Layers sit left to right in the traced order, each box numbered with its layer index (the
numbers the title's "cuts after layers" and each cut's label use). A straight arrow carries what
layer i+1 reads from layer i; an arc above the row goes from a skip tensor's producer to each
consumer beyond the next layer, labelled with its bytes. Each cut is a dashed line labelled with
what crosses it hop by hop; every stage is a shaded band named with its device. No text sits on
a cut line: a chain label at a cut moves left of it, the cut's own label right of it, a skip
label along its arc. All bytes are per sample; a legend names each mark. matplotlib is imported
lazily, and the figure is drawn on its own Agg canvas (no pyplot).
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

import numpy as np

from planner.atomic import atomic_write_bytes
from planner.graph.crossing import crossing_bytes, stage_ranges
from planner.graph.edges import as_skip_edges
from planner.units import format_bytes

__all__ = ["draw_layer_graph", "layer_graph_figure", "plan_graph", "per_sample_outputs", "stage_label"]


_LABEL_BOX = dict(fc="white", ec="none", pad=0.5)  # behind a byte label, over the lines it sits on (matplotlib copies it)
_BOX, _CHAIN, _SKIP, _CUT = "#dde8f5", "#335", "#b35a00", "#c00"  # fill of a layer box; colours of the marks
_BANDS = ("#f4f4f4", "#fbf6ec")  # stage bands, alternating: neighbours differ, and neither is a layer box's fill
_BOX_W, _BOX_Y = 0.76, (-0.3, 0.3)  # a layer box's width and its bottom and top (data units: one layer is 1 wide)
_CLEAR = 0.06  # gap between a cut line and a label moved off it (data units)
_STAGE_Y = -1.08  # top of the stage labels, under the cut labels


def layer_graph_figure(names: Sequence[str], output_bytes: Sequence[float], skip_edges: Iterable[Sequence],
                       cuts: Iterable[int] = (), title: str | None = None,
                       stage_labels: Sequence[str] | None = None) -> Any:
    """The figure of the layers, their chain and skip edges, the cuts and the stages (module docstring).

    `stage_labels`: one per stage (len(cuts) + 1), e.g. stage_label's; None: "stage s" when there are
    cuts, no bands without.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(names)
    edges = as_skip_edges(skip_edges)
    cut_list = list(cuts)
    ranges = stage_ranges(n, cut_list)  # validates the cuts
    cross = crossing_bytes(n, output_bytes, edges) if n > 1 else np.zeros(0)
    span = max([e.dst - e.src for e in edges], default=1)
    fig = Figure(figsize=(max(6.0, 1.05 * n + 1), 2.5 + 0.3 * _arc_height(span) * 4))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylim(-1.4, 0.5 + _arc_height(span) if edges else 0.6)
    ax.axis("off")
    if cut_list or stage_labels is not None:
        labels = list(stage_labels) if stage_labels is not None else [f"stage {s}" for s in range(len(ranges))]
        _draw_stages(ax, ranges, labels)
    _draw_cuts(ax, cut_list, cross)
    _draw_layers(ax, names)
    _draw_chain(ax, _chain_bytes(n, output_bytes, edges), set(cut_list))
    _draw_skip_arcs(ax, edges, cut_list)
    ax.set_title(title or f"{n} layers, {len(edges)} skip edge(s); bytes per sample", fontsize=9)
    _add_legend(ax, bool(edges), bool(cut_list))
    return fig


def draw_layer_graph(names: Sequence[str], output_bytes: Sequence[float], skip_edges: Iterable[Sequence],
                     path: str | os.PathLike, cuts: Iterable[int] = (), title: str | None = None,
                     stage_labels: Sequence[str] | None = None) -> None:
    """Write a PNG of layer_graph_figure to `path`."""
    import io

    fig = layer_graph_figure(names, output_bytes, skip_edges, cuts, title, stage_labels)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130, bbox_inches="tight")
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


def _draw_stages(ax: Any, ranges: Sequence[tuple[int, int]], labels: Sequence[str]) -> None:
    """A shaded band behind each stage's layers, named under the row."""
    for s, ((first, end), label) in enumerate(zip(ranges, labels)):
        ax.axvspan(first - 0.5, end - 0.5, color=_BANDS[s % 2], lw=0, zorder=0)
        ax.text((first + end - 1) / 2, _STAGE_Y, label, ha="center", va="top", fontsize=7, color="#333", zorder=3)


def _draw_cuts(ax: Any, cut_list: list[int], cross: np.ndarray) -> None:
    """A dashed line after each cut's layer, labelled right of it with the bytes crossing it."""
    for c in cut_list:
        ax.axvline(c + 0.5, color=_CUT, ls="--", lw=1, zorder=1)
        ax.text(c + 0.5 + _CLEAR, -0.7, f"cut {c}\n{format_bytes(cross[c])}", ha="left", va="top", fontsize=7,
                color=_CUT, zorder=3)


def _draw_layers(ax: Any, names: Sequence[str]) -> None:
    """One box per layer, left to right, its index in the top left corner and its name in the middle:
    every name upright when the longest does not fit across a box, none otherwise."""
    from matplotlib.patches import FancyBboxPatch

    bottom, top = _BOX_Y
    texts = []
    for i, name in enumerate(names):
        ax.add_patch(FancyBboxPatch((i - _BOX_W / 2, bottom), _BOX_W, top - bottom, boxstyle="round,pad=0.02", fc=_BOX,
                                    ec=_CHAIN, zorder=2))
        ax.text(i - _BOX_W / 2 + 0.04, top - 0.03, str(i), ha="left", va="top", fontsize=6.5, color="#556",
                zorder=3)
        texts.append(ax.text(i, -0.02, name, ha="center", va="center", fontsize=8, zorder=3))
    if texts and _widest(ax, texts) > 0.9 * _BOX_W:
        for t in texts:
            t.set_rotation(90)


def _widest(ax: Any, texts: Sequence[Any]) -> float:
    """The widest of `texts` as drawn, in x data units."""
    renderer = ax.figure.canvas.get_renderer()
    x0 = ax.transData.transform((0, 0))[0]
    return max(ax.transData.inverted().transform((x0 + t.get_window_extent(renderer).width, 0))[0] for t in texts)


def _draw_chain(ax: Any, to_next: list[float], cuts: set[int]) -> None:
    """A short arrow from each layer to the next that reads from it, its bytes below (left of the
    cut line where one runs through the gap)."""
    from matplotlib.patches import FancyArrowPatch

    for i in range(len(to_next) - 1):
        if to_next[i] > 0:
            ax.add_patch(FancyArrowPatch((i + 0.4, 0), (i + 0.6, 0), arrowstyle="-|>", mutation_scale=8, color=_CHAIN, zorder=2))
            x, ha = (i + 0.5 - _CLEAR, "right") if i in cuts else (i + 0.5, "center")
            ax.text(x, -0.4, format_bytes(to_next[i]), ha=ha, va="top", fontsize=6, color=_CHAIN, bbox=_LABEL_BOX, zorder=3)


def _draw_skip_arcs(ax: Any, edges: Sequence[Any], cut_list: Sequence[int]) -> None:
    """An arc above the row from each skip tensor's producer to each consumer beyond the next
    layer; the arc to its last consumer carries the tensor's bytes, at its top unless a cut line
    runs there (then along the arc, clear of the lines)."""
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
                label = ax.text((e.src + c) / 2, 0.32 + h, format_bytes(e.bytes_per_sample), ha="center", va="center",
                                fontsize=7, color=_SKIP, bbox=_LABEL_BOX, zorder=3)
                lx = _clear_of_cuts(e.src, c, cut_list, _widest(ax, [label]) / 2 + _CLEAR)
                label.set_position((lx, 0.32 + h * np.sin(np.arccos(1 - 2 * (lx - e.src) / (c - e.src)))))


def _clear_of_cuts(src: int, dst: int, cut_list: Sequence[int], half_width: float) -> float:
    """Where along the arc from `src` to `dst` a label `half_width` wide each side goes: the middle,
    or the nearest point to it where no cut line crosses the label (the middle when there is none)."""
    mid = (src + dst) / 2
    lines = [c + 0.5 for c in cut_list]
    candidates = sorted(np.arange(src + half_width, dst - half_width + 1e-9, 0.05), key=lambda v: abs(v - mid))
    for x in [mid, *candidates]:
        if all(abs(x - line) >= half_width for line in lines):
            return float(x)
    return mid


def _add_legend(ax: Any, has_edges: bool, has_cuts: bool) -> None:
    """A legend below the row naming each mark the figure shows."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    # alpha: the legend swatch reads as a layer box but is not counted as one by pixel tests
    handles = [Patch(fc=_BOX, ec=_CHAIN, alpha=0.8, label="layer (index, name; in traced order)"),
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


def stage_label(plan: Any, s: int) -> str:
    """Stage s of `plan` and the device it runs on: "stage 0 · dev 0" (a device's own name after it
    when it has one besides devN)."""
    d = plan.stages[s].device
    name = plan.devices[d].name if d < len(plan.devices) else f"dev{d}"
    return f"stage {s} · dev {d}" + ("" if name == f"dev{d}" else f"\n{name}")


def plan_graph(plan: Any, profile: Any, path: str | os.PathLike) -> list[int]:
    """Draw `profile`'s layers with `plan`'s cuts to `path`; returns the cuts (last layer of each stage)."""
    cuts = [st.layers[1] - 1 for st in plan.stages[:-1]]
    label = profile.meta.get("model") or "model"
    draw_layer_graph(list(profile.names), per_sample_outputs(profile), profile.skip_edges, path, cuts,
                     title=f"{label}: {len(profile.names)} layers, {plan.n_stages} stages, cuts after layers "
                           f"{cuts}; bytes per sample",
                     stage_labels=[stage_label(plan, s) for s in range(plan.n_stages)])
    return cuts
