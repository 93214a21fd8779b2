"""The layer-graph figure: a PNG from data, from a traced model and from a profile with edge lines.

The PNGs are decoded and read back: one box per layer, one dashed line per cut, the skip arcs.
"""

from __future__ import annotations

import numpy as np
import pytest

from planner.graph import add_edge_lines, draw_layer_graph
from planner.graph.figure import main

from test_run_support import assert_drawn_png, color_share

BOX, CUT_RED, SKIP = "#dde8f5", (0.7, 0.25), "#b35a00"  # the figure's layer fill, cut line, skip arc


def _runs(columns: np.ndarray) -> int:
    """Contiguous runs of True in a row of booleans."""
    return int((np.diff(np.concatenate([[0], columns.astype(int), [0]])) == 1).sum())


def layer_graph_counts(path) -> tuple[int, int, bool]:
    """(layer boxes, cut lines, skip arcs drawn) read from the pixels of a layer-graph PNG."""
    px = assert_drawn_png(path, min_width=300, min_height=150, colors=(BOX,))
    box = (np.abs(px - np.array([0xDD, 0xE8, 0xF5]) / 255) <= 2 / 255).all(axis=-1)
    red = (px[..., 0] > CUT_RED[0]) & (px[..., 1] < CUT_RED[1]) & (px[..., 2] < CUT_RED[1])
    cut_columns = red.sum(axis=0) >= 0.2 * px.shape[0]  # a dashed line spans the height; labels do not
    return _runs(box.any(axis=0)), _runs(cut_columns), color_share(px, SKIP) > 0


def test_draw_writes_a_png(tmp_path):
    path = tmp_path / "g.png"
    draw_layer_graph(["a", "b", "c", "d"], [0, 10, 20, 5], [(0, 3, 40, (1,))], path, cuts=[1])
    assert layer_graph_counts(path) == (4, 1, True)
    plain = tmp_path / "plain.png"
    draw_layer_graph(["a", "b", "c"], [1, 1, 1], [], plain)
    assert layer_graph_counts(plain) == (3, 0, False)


def test_bad_cuts_are_refused(tmp_path):
    from planner.errors import PplanError

    with pytest.raises(PplanError, match="cuts"):
        draw_layer_graph(["a", "b"], [1, 1], [], tmp_path / "g.png", cuts=[1])


def test_main_from_model_and_from_profile(tmp_path, capsys, monkeypatch):
    from test_graph_edges import CHAIN, UNET_EDGES

    monkeypatch.chdir(tmp_path)
    assert main(["--model", "unet_model:build:width=2", "--cuts", "2,6", "-o", "m.png"]) == 0
    out = capsys.readouterr().out
    assert "cut 2: 3.0 KiB crosses" in out and "skip 0->1,7: 2.0 KiB" in out  # width 2: half the bytes
    (tmp_path / "p.csv").write_text(add_edge_lines(CHAIN, UNET_EDGES), encoding="utf-8")
    assert main(["--profile", "p.csv", "--cuts", "4", "-o", "p.png"]) == 0
    assert "cut 4: 7.0 KiB crosses" in capsys.readouterr().out
    assert layer_graph_counts(tmp_path / "m.png") == (10, 2, True)  # the U-Net's 10 layers, cuts 2 and 6
    assert layer_graph_counts(tmp_path / "p.png") == (10, 1, True)
    assert main(["--profile", "p.csv", "--cuts", "9", "-o", "q.png"]) == 2
