"""Figure: the layer graph in order, skip edges as arcs, planned cuts with their bytes.

    python -m planner.graph.figure --model tests.unet_model:build --cuts 2,6 -o reports/unet_graph.png
    python -m planner.graph.figure --profile my.csv --cuts 3 -o graph.png
    python -m planner.graph.figure --plan plan.json -o graph.png     (the plan's cuts and profile)

Layers sit left to right in the traced order. A straight arrow carries what layer i+1 reads
from layer i; an arc above the row goes from a skip tensor's producer to each consumer beyond
the next layer, labelled with its bytes. Each cut is a dashed line labelled with
what crosses it hop by hop. All bytes are per sample. matplotlib is imported lazily (Agg).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Iterable, Sequence

import numpy as np

from planner.atomic import atomic_write_bytes
from planner.errors import PplanError
from planner.graph.crossing import crossing_bytes, stage_ranges
from planner.graph.edges import as_skip_edges
from planner.units import format_bytes

__all__ = ["draw_layer_graph", "main"]


def draw_layer_graph(names: Sequence[str], output_bytes: Sequence[float], skip_edges: Iterable[Sequence],
                     path: str | os.PathLike, cuts: Iterable[int] = (), title: str | None = None) -> None:
    """Write a PNG of the layers, their chain and skip edges and the cuts (module docstring)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    n = len(names)
    edges = as_skip_edges(skip_edges)
    cut_list = list(cuts)
    stage_ranges(n, cut_list)  # validates the cuts
    cross = crossing_bytes(n, output_bytes, edges) if n > 1 else np.zeros(0)
    # What layer i+1 reads from layer i: its chain bytes plus skip tensors it reads on the way.
    to_next = [float(output_bytes[i]) for i in range(n)]
    for e in edges:
        if e.src + 1 in e.consumers:
            to_next[e.src] += e.bytes_per_sample
    span = max([e.dst - e.src for e in edges], default=1)
    height = lambda d: 0.3 + 0.14 * d  # arc height grows with its length, so nested arcs do not cross
    fig, ax = plt.subplots(figsize=(max(6.0, 1.05 * n + 1), 2.2 + 0.3 * height(span) * 4))
    white = dict(fc="white", ec="none", pad=0.5)
    for c in cut_list:
        ax.axvline(c + 0.5, color="#c00", ls="--", lw=1, zorder=1)
        ax.text(c + 0.5, -0.7, f"cut {c}\n{format_bytes(cross[c])}", ha="center", va="top", fontsize=7, color="#c00", bbox=white, zorder=3)
    for i, name in enumerate(names):
        ax.add_patch(FancyBboxPatch((i - 0.38, -0.3), 0.76, 0.6, boxstyle="round,pad=0.02", fc="#dde8f5", ec="#335", zorder=2))
        ax.text(i, 0, name, ha="center", va="center", fontsize=8, rotation=90 if len(name) > 7 else 0, zorder=3)
    for i in range(n - 1):
        if to_next[i] > 0:
            ax.add_patch(FancyArrowPatch((i + 0.4, 0), (i + 0.6, 0), arrowstyle="-|>", mutation_scale=8, color="#335", zorder=2))
            ax.text(i + 0.5, -0.4, format_bytes(to_next[i]), ha="center", va="top", fontsize=6, color="#335", bbox=white, zorder=3)
    t = np.linspace(0, np.pi, 60)
    for e in edges:
        for c in e.consumers:
            if c == e.src + 1:
                continue
            h = height(c - e.src)
            x = e.src + (c - e.src) * (1 - np.cos(t)) / 2
            y = 0.32 + h * np.sin(t)
            ax.plot(x[:-1], y[:-1], color="#b35a00", lw=1.3, zorder=2)
            ax.add_patch(FancyArrowPatch((x[-2], y[-2]), (x[-1], y[-1]), arrowstyle="-|>", mutation_scale=9, color="#b35a00", zorder=2))
            if c == e.dst:
                ax.text((e.src + c) / 2, 0.32 + h, format_bytes(e.bytes_per_sample), ha="center", va="center", fontsize=7, color="#b35a00", bbox=white, zorder=3)
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylim(-1.15, 0.5 + height(span) if edges else 0.6)
    ax.axis("off")
    ax.set_title(title or f"{n} layers, {len(edges)} skip edge(s); bytes per sample", fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def _from_model(spec: str, batch: int, depth: int, opaque: bool) -> tuple[list[str], list[int], tuple, str]:
    import torch

    from planner.graph.trace import trace_layers

    module_name, _, rest = spec.partition(":")
    attr, _, args = rest.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    kwargs = {}
    for item in filter(None, args.split(",")):
        key, _, value = item.partition("=")
        kwargs[key] = int(value) if value.lstrip("-").isdigit() else value
    model = getattr(importlib.import_module(module_name), attr)(**kwargs)
    if not callable(getattr(model, "make_batch", None)):
        raise PplanError(f"model {spec!r} has no make_batch(batch_size, seed)", "the figure needs an example input")
    x, _ = model.make_batch(batch, 0)
    with torch.no_grad():
        lg = trace_layers(model, x, depth=depth, opaque=opaque)
    return list(lg.names), list(lg.output_bytes_per_sample), lg.skip_edges, spec


def _from_profile(path: str) -> tuple[list[str], list[float], tuple, str]:
    from planner.profiling.profile import load_profile

    prof = load_profile(path)
    size = prof.micro_batch_sizes[0]
    out = list(prof.columns["output_bytes"][:, 0] / size)
    return list(prof.names), out, prof.skip_edges, prof.meta.get("model", path)


def _plan_cuts(path: str) -> tuple[list[int], str | None]:
    """(cuts after these layers, the profile the plan names) of a plan JSON."""
    from planner.plan import load_plan

    plan = load_plan(path)
    return [st.layers[1] - 1 for st in plan.stages[:-1]], plan.profile_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planner.graph.figure", description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", help="module:factory[:key=value,...] returning an nn.Module with make_batch")
    src.add_argument("--profile", help="a profile CSV (with # edge: lines)")
    ap.add_argument("--plan", help="a plan JSON: draw its cuts (and its profile unless --model/--profile is given)")
    ap.add_argument("--cuts", default="", help="cut after these layers, e.g. 2,6")
    ap.add_argument("--batch", type=int, default=2, help="example batch size for tracing")
    ap.add_argument("--depth", type=int, default=1, help="grouping depth (1: outermost called modules)")
    ap.add_argument("--opaque", action="store_true", help="do not trace inside the layer modules")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    a = ap.parse_args(argv)
    try:
        cuts = [int(c) for c in a.cuts.split(",") if c.strip()]
        if a.plan:
            cuts, planned = _plan_cuts(a.plan)
            a.profile = a.profile or (None if a.model else planned)
        if not (a.model or a.profile):
            raise PplanError("nothing to draw", "give --model, --profile or --plan (with a profile path)")
        names, out, edges, label = _from_model(a.model, a.batch, a.depth, a.opaque) if a.model else _from_profile(a.profile)
        draw_layer_graph(names, out, edges, a.output, cuts, title=f"{label}: {len(names)} layers, cuts {cuts}; bytes per sample")
    except (PplanError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cross = crossing_bytes(len(names), out, edges)
    for i, name in enumerate(names):
        after = f"  | cut {i}: {format_bytes(cross[i])} crosses" if i < len(names) - 1 else ""
        print(f"{i:3d} {name:<16} chain {format_bytes(out[i]):>10}{after}")
    for e in as_skip_edges(edges):
        print(f"skip {e.src}->{','.join(map(str, e.consumers))}: {format_bytes(e.bytes_per_sample)}")
    print(f"cuts after layers {cuts}")
    print(f"wrote {a.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
