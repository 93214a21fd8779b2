"""The layout figure (`pplan partition --nodes ... --plot`) from hand-made layout points (no search):
one width however many layouts, the chosen layout named, layouts that do not fit hollow."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from planner.parallel import ParallelConfig
from planner.partition.parallel_sweep import LayoutPoint

pytest.importorskip("matplotlib")

from planner.report.fig_parallel import draw_layouts, write_layout_figure  # noqa: E402

TITLE = "gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200\n1536 x a100-80gb, global batch 1536, chosen dp=24,pp=8,tp=8"


def _points(n_pp: int = 15, tps: tuple[int, ...] = (1, 2, 4, 8)) -> list[LayoutPoint]:
    """n_pp pipeline degrees per tp degree (60 layouts by default); every third one does not fit."""
    points = []
    for tp in tps:
        for i in range(n_pp):
            pp = i + 1
            points.append(LayoutPoint(ParallelConfig(dp=2 * n_pp, pp=pp, tp=tp), 100.0 + 3 * i - tp, fits=i % 3 != 0))
    return points


def _chosen(dp: int = 30, pp: int = 8, tp: int = 8, tflops: float = 121.0) -> SimpleNamespace:
    """The attributes of a ParallelCandidate the figure reads."""
    return SimpleNamespace(config=ParallelConfig(dp=dp, pp=pp, tp=tp), schedule_label="1f1b", micro_batch_size=1,
                           n_microbatches=64, recompute="none", tflops_per_gpu=tflops)


def _texts(fig) -> str:
    return "\n".join(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")) if t.get_text())


def _markers(fig) -> dict[tuple[float, float], bool]:
    """Each round marker's (x, y) -> whether it is filled (its face is not white or transparent)."""
    from matplotlib.collections import PathCollection

    out = {}
    for coll in fig.axes[0].collections:
        if not isinstance(coll, PathCollection) or max(coll.get_sizes()) > 200:  # the chosen layout's star
            continue
        assert len(coll.get_facecolors()) == len(coll.get_offsets())
        for (x, y), face in zip(coll.get_offsets(), coll.get_facecolors()):
            out[(float(x), round(float(y), 6))] = face[3] > 0 and tuple(face[:3]) != (1.0, 1.0, 1.0)
    return out


def test_sixty_layouts_keep_the_figure_at_most_twelve_inches_wide(tmp_path):
    import matplotlib.image as mpimg

    points = _points()
    assert len(points) == 60
    fig = draw_layouts(points, _chosen(), TITLE)
    assert fig.get_size_inches()[0] <= 12.0
    png = tmp_path / "layouts.png"
    write_layout_figure(points, _chosen(), TITLE, png)
    assert mpimg.imread(png).shape[1] <= 12 * 130  # the PNG's 130 dpi: nothing drawn outside the figure widens it


def test_the_chosen_layout_is_starred_and_named_with_its_schedule_and_batches():
    fig = draw_layouts(_points(), _chosen(), TITLE)
    texts = _texts(fig)
    assert "dp 30 × pp 8 × tp 8" in texts
    assert "chosen: dp 30 × pp 8 × tp 8, 1f1b, M = 64 micro-batches of b = 1, 121.0 TFLOP/s per GPU" in texts
    stars = [c for c in fig.axes[0].collections if len(c.get_offsets()) == 1 and c.get_sizes()[0] > 200]
    assert [tuple(map(float, c.get_offsets()[0])) for c in stars] == [(7.0, 121.0)]  # pp 8 is the 8th degree drawn


def test_the_title_is_plain_words_and_explains_the_hollow_markers():
    texts = _texts(draw_layouts(_points(), _chosen(), TITLE))
    assert "layers=96" not in texts and "chosen dp=24" not in texts
    assert "GPT, 96 layers, hidden size 12,288, 96 heads, sequence 2,048 tokens, vocabulary 51,200" in texts
    assert "on 1,536 × a100-80gb GPUs, global batch of 1,536 samples" in texts
    assert "does not fit the memory per GPU; drawn at its best plan's TFLOP/s with no memory limit" in " ".join(texts.split())


def test_layouts_that_do_not_fit_are_hollow_and_the_others_filled():
    points = _points(n_pp=6, tps=(1, 2))
    marks = _markers(draw_layouts(points, _chosen(dp=12, pp=5, tp=2, tflops=110.0), TITLE))
    want = {(float(p.config.pp - 1), round(p.tflops_per_gpu, 6)): p.fits for p in points}
    assert {k: marks[k] for k in want} == want
    assert any(want.values()) and not all(want.values())


def test_a_factory_spec_is_kept_as_written_and_a_long_one_wraps():
    spec = "mypkg.models:build_" + "x" * 150
    fig = draw_layouts(_points(n_pp=3), _chosen(dp=6, pp=2, tp=1, tflops=102.0), spec + "\n8 x h200, global batch 64, chosen x")
    title = fig._suptitle.get_text()
    assert title.replace("\n", "").replace("  ", "").startswith("mypkg.models:build_")
    assert max(len(line) for line in title.splitlines()) <= 90
