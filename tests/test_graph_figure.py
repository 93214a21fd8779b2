"""The layer-graph figure: a PNG from data, and from `pplan partition --plot` on a profile with edge lines.

The PNGs are decoded and read back: one box per layer, one dashed line per cut, the skip arcs.
"""

from __future__ import annotations

import pytest

from planner.graph import add_edge_lines
from planner.report.fig_graph import draw_layer_graph

from helpers.figures import layer_graph_counts
from helpers.graphs import CHAIN, UNET_EDGES


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


def test_partition_plot_draws_the_plans_cuts_with_a_legend(tmp_path, pplan):
    (tmp_path / "p.csv").write_text(add_edge_lines(CHAIN, UNET_EDGES), encoding="utf-8")
    code, out, err = pplan("partition", tmp_path / "p.csv", "--devices", "3", "--global-batch", "8", "--schedule", "1f1b",
                           "--out", tmp_path / "plan.json", "--plot", tmp_path / "cuts.png")
    assert code == 0, err
    assert f"wrote {tmp_path / 'cuts.png'}" in err
    assert layer_graph_counts(tmp_path / "cuts.png") == (10, 2, True)  # the U-Net's 10 layers, 3 stages: 2 cuts
    code, _, err = pplan("partition", tmp_path / "p.csv", "--devices", "3", "--global-batch", "8",
                         "--out", tmp_path / "plan2.json", "--plot", tmp_path / "cuts.svg")
    assert code == 2 and "--plot" in err and not (tmp_path / "plan2.json").exists()


def test_the_figure_has_a_legend_naming_each_mark(tmp_path, monkeypatch):
    import matplotlib.axes

    seen: list[list[str]] = []
    real = matplotlib.axes.Axes.legend

    def spy(self, *args, **kwargs):
        seen.append([h.get_label() for h in kwargs.get("handles", [])])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "legend", spy)
    draw_layer_graph(["a", "b", "c", "d"], [0, 10, 20, 5], [(0, 3, 40, (1,))], tmp_path / "g.png", cuts=[1])
    assert len(seen) == 1 and any("skip tensor" in s for s in seen[0]) and any("cut" in s for s in seen[0])
