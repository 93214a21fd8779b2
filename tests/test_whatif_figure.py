"""The figure of `pplan simulate --sweep --plot`, drawn from hand-made sweep rows (no simulation)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from planner.report.fig_whatif import best_fitting, sweep_figure, sweep_title
from planner.whatif import SweepRow

pytest.importorskip("matplotlib")

CANNOT = "cannot run: schedule 1f1b needs at least as many micro-batches as ranks"


def _row(m: int, size: int, ms: float | None, fits: bool = True, schedule: str = "1f1b", value=None) -> SweepRow:
    if ms is None:
        return SweepRow(value if value is not None else m, schedule, m, size, m * size, None, None, None, None, None,
                        error=CANNOT)
    return SweepRow(value if value is not None else m, schedule, m, size, m * size, ms, 0.5 / m,
                    1000.0 * m * size / ms, 1.0, fits)


# --keep micro-batch-size: the global batch grows with M; M=4 has the shortest iteration (8 samples in
# 28 ms, 286 samples/s) but M=16 the highest throughput (32 samples in 84.9 ms, 377 samples/s)
GROWING = [_row(1, 2, None), _row(2, 2, None), _row(4, 2, 28.0), _row(8, 2, 50.0), _row(16, 2, 84.9),
           _row(32, 2, 180.0)]
# the global batch kept at 32: the shortest iteration is the best
KEPT = [_row(1, 32, None), _row(4, 8, 60.0), _row(8, 4, 52.0), _row(16, 2, 55.0)]
SCHEDULES = [_row(8, 2, 54.0, schedule="gpipe", value="gpipe"), _row(8, 2, 54.0, value="1f1b"),
             _row(8, 2, 45.0, schedule="zb", value="zb"), _row(8, 2, None, schedule="interleaved", value="interleaved")]


def _star_x(ax) -> list[float]:
    return [x for line in ax.get_lines() if line.get_marker() == "*" for x in line.get_xdata()]


def _tick_texts(ax) -> list[str]:
    return [t.get_text() for t in ax.get_xticklabels()]


def test_star_marks_the_highest_throughput_when_the_global_batch_varies():
    assert best_fitting(GROWING).n_microbatches == 16  # not M=4, the shortest iteration
    fig = sweep_figure("microbatches", GROWING, "t")
    speed, bubble = fig.axes
    assert _tick_texts(speed)[int(_star_x(speed)[0])].startswith("16\n")
    assert _star_x(bubble) == _star_x(speed)
    assert "throughput (samples/s, higher is better)" in speed.get_ylabel()


def test_star_marks_the_shortest_iteration_when_the_global_batch_is_the_same():
    assert best_fitting(KEPT).n_microbatches == 8
    over = [KEPT[0], KEPT[1], _row(8, 4, 52.0, fits=False), KEPT[3]]
    assert best_fitting(over).n_microbatches == 16  # 8 is faster but exceeds memory
    fig = sweep_figure("microbatches", KEPT, "t")
    speed = fig.axes[0]
    assert _tick_texts(speed)[int(_star_x(speed)[0])].startswith("8\n")
    assert "iteration time (ms, lower is better)" in speed.get_ylabel()


@pytest.mark.parametrize("parameter, rows, cannot", [
    ("microbatches", GROWING, {"1", "2"}), ("microbatches", KEPT, {"1"}), ("schedule", SCHEDULES, {"interleaved"})])
def test_values_that_cannot_run_stay_on_the_axis(parameter, rows, cannot):
    fig = sweep_figure(parameter, rows, "t")
    for ax in fig.axes:
        texts = _tick_texts(ax)
        assert len(texts) == len(rows)
        assert {t.split("\n")[0] for t in texts if t.endswith("cannot run")} == cannot
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(t.startswith("cannot run") for t in legend)


def test_bubble_has_its_own_panel_and_schedules_are_not_joined():
    fig = sweep_figure("schedule", SCHEDULES, "t")
    assert len(fig.axes) == 2  # no twin axis sharing the grid with milliseconds
    speed, bubble = fig.axes
    assert "ms" in speed.get_ylabel() and "bubble" in bubble.get_ylabel() and "ms" not in bubble.get_ylabel()
    assert all(line.get_linestyle() == "None" or len(line.get_xdata()) == 1 for line in bubble.get_lines())
    trend = sweep_figure("microbatches", KEPT, "t").axes[1]
    assert any(len(line.get_xdata()) == len(KEPT) and line.get_linestyle() != "None" for line in trend.get_lines())


def _plan(model: str | None) -> SimpleNamespace:
    return SimpleNamespace(schedule="1f1b", global_batch=16, micro_batch_size=2, n_microbatches=8, n_devices=4,
                           model=model, dp=1, tp=1)


@pytest.mark.parametrize("title", [
    sweep_title(_plan("gpt:layers=6,hidden=128,seq=64,vocab=4096"), "microbatches", "micro-batch-size", False),
    sweep_title(_plan("my_pkg.models:build_transformer:" + ",".join(f"opt{i}=${i}" for i in range(40))),
                "schedule", "global-batch", True),
    # the title `pplan simulate` drew before, which ran off both sides
    "Predicted iteration time by micro-batch count (1f1b, micro-batch size 2; uncalibrated) " * 2,
])
def test_title_stays_inside_the_figure(title):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = sweep_figure("microbatches", GROWING, title)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    box, page = fig._suptitle.get_window_extent(canvas.get_renderer()), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
    assert fig._suptitle.get_text().replace("\n", "").replace(" ", "").startswith(title.replace(" ", "")[:30])


def test_title_names_the_model_the_schedule_and_what_was_swept():
    title = sweep_title(_plan("gpt:layers=6,hidden=128,seq=64,vocab=4096"), "microbatches", "micro-batch-size", False)
    assert "micro-batch count" in title and "1f1b" in title and "micro-batch size 2 kept" in title
    assert "gpt:layers=6,hidden=128,seq=64,vocab=4096 on 4 pipeline devices" in title and "uncalibrated" in title
    assert "model not recorded" in sweep_title(_plan(None), "schedule", "global-batch", False)


@pytest.mark.parametrize("parameter, rows", [("microbatches", GROWING[2:]), ("schedule", SCHEDULES[:3])])
def test_a_sweep_where_every_value_runs_keeps_its_layout(parameter, rows):
    import warnings

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = sweep_figure(parameter, rows, "t")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "constrained_layout not applied because axes sizes collapsed to zero"
        FigureCanvasAgg(fig).draw()
    assert all(ax.get_position().width > 0.3 for ax in fig.axes)
