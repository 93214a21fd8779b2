"""The layer-graph figure: a PNG from data, from a traced model and from a profile with edge lines."""

from __future__ import annotations

import pytest

from planner.graph import add_edge_lines, draw_layer_graph
from planner.graph.figure import main

PNG = b"\x89PNG\r\n\x1a\n"


def test_draw_writes_a_png(tmp_path):
    path = tmp_path / "g.png"
    draw_layer_graph(["a", "b", "c", "d"], [0, 10, 20, 5], [(0, 3, 40, (1,))], path, cuts=[1])
    assert path.read_bytes().startswith(PNG)


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
    assert (tmp_path / "m.png").read_bytes().startswith(PNG) and (tmp_path / "p.png").read_bytes().startswith(PNG)
    assert main(["--profile", "p.csv", "--cuts", "9", "-o", "q.png"]) == 2
