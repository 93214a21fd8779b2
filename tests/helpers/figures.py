"""Decoding the figures a test drew: whole PNGs, their pixels and colours, the layer-graph figure's parts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _rgb(color: str) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return to_rgb(color)


def png_pixels(src: "Path | bytes"):
    """RGB pixels (height x width x 3, floats 0..1) of a PNG file or bytes, decoded in full."""
    import io

    import matplotlib.image as mpimg

    data = src if isinstance(src, bytes) else Path(src).read_bytes()
    assert data[:8] == PNG_MAGIC, "not a PNG"
    return mpimg.imread(io.BytesIO(data), format="png")[..., :3]


def color_share(pixels, color: str, tol: float = 2 / 255) -> float:
    """Fraction of pixels within `tol` (per channel) of `color`."""
    import numpy as np

    return float((np.abs(pixels - np.array(_rgb(color))) <= tol).all(axis=-1).mean())


def assert_drawn_png(src: "Path | bytes", min_width: int = 300, min_height: int = 150,
                     colors: tuple[str, ...] = ()) -> Any:
    """A whole, decodable picture of at least that size with something drawn on it (not blank,
    not one solid fill) and every one of `colors` on it; returns the pixels."""
    import numpy as np

    px = png_pixels(src)
    h, w = px.shape[:2]
    assert w >= min_width and h >= min_height, (w, h)
    ink = float((px < 0.9).any(axis=-1).mean())  # anything clearly darker than white
    assert 0.005 < ink < 0.95, f"{ink:.1%} of the pixels are drawn"
    assert len(np.unique((px * 255).round().reshape(-1, 3), axis=0)) >= 8, "too few colours for a chart"
    for c in colors:
        assert color_share(px, c) > 0, f"no {c} on the figure"
    return px


LAYER_BOX, CUT_RED, SKIP_ARC = "#dde8f5", (0.7, 0.25), "#b35a00"
"""The layer-graph figure's layer fill, cut line (red above, green and blue below) and skip arc."""


def _runs(columns: Any) -> int:
    """Contiguous runs of True in a row of booleans."""
    import numpy as np

    return int((np.diff(np.concatenate([[0], columns.astype(int), [0]])) == 1).sum())


def layer_graph_counts(path: "Path | bytes") -> tuple[int, int, bool]:
    """(layer boxes, cut lines, skip arcs drawn) read from the pixels of a layer-graph PNG."""
    import numpy as np

    px = assert_drawn_png(path, min_width=300, min_height=150, colors=(LAYER_BOX,))
    box = (np.abs(px - np.array(_rgb(LAYER_BOX))) <= 2 / 255).all(axis=-1)
    red = (px[..., 0] > CUT_RED[0]) & (px[..., 1] < CUT_RED[1]) & (px[..., 2] < CUT_RED[1])
    cut_columns = red.sum(axis=0) >= 0.2 * px.shape[0]  # a dashed line spans the height; labels do not
    return _runs(box.any(axis=0)), _runs(cut_columns), color_share(px, SKIP_ARC) > 0
