"""Shared look of the report figures, and rendering to PNG/SVG bytes with the Agg backend.

matplotlib is imported only inside these functions, so `import planner.report` stays cheap.
Figures are built as `matplotlib.figure.Figure` objects rendered through Agg canvases, never
through pyplot: no global backend switch, no figure registry, nothing left open.
"""

from __future__ import annotations

import io
from typing import Any

__all__ = [
    "KIND_COLORS",
    "KIND_LABELS",
    "MEMORY_PARTS",
    "MEMORY_COLORS",
    "SCHEDULE_COLORS",
    "PREDICTED_COLOR",
    "MEASURED_COLOR",
    "LIMIT_COLOR",
    "LIMIT_STYLE",
    "new_figure",
    "render",
    "bytes_axis",
    "device_color",
]

# One color per kind of timeline interval, the same in every Gantt chart.
KIND_COLORS = {
    "F": "#4C72B0", "B": "#55A868", "I": "#8BC97A", "W": "#2D7F5E",
    "R": "#DD8452", "C": "#9A9A9A", "O": "#8172B3", "T": "#C44E52", "A": "#DA8BC3",
}
KIND_LABELS = {
    "F": "forward", "B": "backward", "I": "backward (input grad)", "W": "backward (weight grad)",
    "R": "recompute", "C": "transfer", "O": "optimizer step", "T": "tensor-parallel collectives",
    "A": "gradient sync (data parallel)",
}
MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "buffers")
MEMORY_COLORS = {
    "weights": "#4C72B0", "gradients": "#64B5CD", "optimizer": "#8172B3",
    "activations": "#DD8452", "buffers": "#BDBDBD",
}
SCHEDULE_COLORS = {"gpipe": "#4C72B0", "1f1b": "#DD8452", "interleaved": "#8172B3", "zb": "#55A868"}
PREDICTED_COLOR = "#4C72B0"
MEASURED_COLOR = "#C44E52"
LIMIT_COLOR = "#222222"
LIMIT_STYLE = {"color": LIMIT_COLOR, "ls": (0, (4, 2)), "lw": 1.8}
"""Memory limits are dashed dark lines in every figure."""
_DEVICE_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")

_RC = {
    "font.size": 9.5,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.labelsize": 9.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.fontsize": 8.5,
    "legend.frameon": False,
    "figure.titlesize": 13,
    "figure.titleweight": "bold",
    # Fixed salt and no date: the same inputs give byte-identical SVG files.
    "svg.hashsalt": "pplan",
    "svg.fonttype": "path",
}


def device_color(i: int) -> str:
    """A stable color for device (or rank) i."""
    return _DEVICE_COLORS[i % len(_DEVICE_COLORS)]


def new_figure(width: float, height: float) -> Any:
    """A fresh matplotlib Figure (inches), detached from pyplot.

    Call it (and add axes) inside `style_context()`: rc settings apply when artists are made.
    """
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def style_context() -> Any:
    """Context manager applying the report style (axes are styled when they are created)."""
    import matplotlib

    return matplotlib.rc_context(_RC)


def render(fig: Any, fmt: str, dpi: int = 150) -> bytes:
    """Render `fig` to PNG or SVG bytes through the Agg canvas."""
    import matplotlib

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    metadata = {"Date": None} if fmt == "svg" else {"Software": "pplan (matplotlib)"}
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format=fmt, dpi=dpi, metadata=metadata, facecolor="white")
    return buf.getvalue()


def bytes_axis(max_bytes: float) -> tuple[float, str]:
    """(divisor, unit) to show byte counts up to `max_bytes` in readable binary units."""
    for divisor, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if max_bytes >= divisor:
            return float(divisor), unit
    return 1.0, "B"


__all__ += ["style_context"]
