"""The timeline figures (`pplan simulate --plot`, report figure 1) say what they draw and show every
transfer. A plan with a `parallel` object draws one pipeline replica: its title names the layout
("one of 4 pipeline replicas (dp 4 x pp 3 x tp 1 on 12 GPUs, ...)"), where "3 devices" hid 9 of
12 GPUs; a plan without one keeps its title. A 0.01 ms transfer on a 47 ms axis was a third of a
pixel: each transfer bar is now at least about 2 pixels wide from its true start, and the legend
says short ones are drawn wider."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from planner.parallel import ParallelConfig  # noqa: E402
from planner.plan import load_plan  # noqa: E402
from planner.profiling.profile import load_profile  # noqa: E402
from planner.report import fig_schedule  # noqa: E402
from planner.report.gantt import WIDENED, draw_gantt, drawn_devices, gantt_figure, min_thin_bar_width  # noqa: E402
from planner.report.inputs import ReportInputs, TimelineRow  # noqa: E402
from planner.report.style import KIND_COLORS, render  # noqa: E402

DATA = Path(__file__).parent / "data"
PLAN = DATA / "sim_plan.json"  # 3 devices (gpu0..2), 1f1b, 8 micro-batches of 4, no model recorded
RENDER_DPI = 150  # what the report and `pplan simulate --plot` render at (planner.report.style.render)


def _timeline(transfer_ms: float) -> tuple[TimelineRow, ...]:
    """3 devices, forwards over 43.5 ms, and each device's sends `transfer_ms` long."""
    rows = []
    for d in range(3):
        for m in range(8):
            start = d * 2.0 + m * 5.0
            rows.append(TimelineRow(d, d, "F", m, start, start + 4.5))
            rows.append(TimelineRow(d, d, "C", m, start + 4.5, start + 4.5 + transfer_ms))
    return tuple(rows)


def _transfer_bars(ax) -> list[tuple[float, float]]:
    """(start, width) in axis units of every transfer bar drawn on `ax`."""
    grey = to_rgba(KIND_COLORS["C"])
    bars = []
    for collection in ax.collections:
        colors = collection.get_facecolor()
        if len(colors) and tuple(colors[0]) == grey:
            for path in collection.get_paths():
                xs = path.vertices[:, 0]
                bars.append((float(xs.min()), float(xs.max() - xs.min())))
    return bars


def test_a_parallel_plans_title_says_it_draws_one_replica_of_the_layout() -> None:
    plan = load_plan(PLAN).with_(parallel=ParallelConfig(dp=4, pp=3, tp=1, hardware="a100-80gb"),
                                 model="gpt:layers=4,hidden=64")
    fig = fig_schedule.draw(ReportInputs(plan=plan, timeline=_timeline(0.01)))
    title = fig._suptitle.get_text()
    assert title.startswith("Pipeline schedule: 1f1b, 8 micro-batches of 4 on one of 4 pipeline replicas "
                            "(dp 4 x pp 3 x tp 1 on 12 GPUs, a100-80gb, gpt:layers=4,hidden=64): simulated, ")
    assert "3 devices" not in title
    assert "4 such pipelines side by side" in fig_schedule.caption(ReportInputs(plan=plan, timeline=_timeline(0.01)))


def test_the_model_comes_from_the_profile_when_the_plan_records_none_and_tp_is_named() -> None:
    plan = load_plan(PLAN).with_(parallel=ParallelConfig(dp=1, pp=3, tp=2))
    profile = load_profile(DATA / "sim_profile.csv")
    words = drawn_devices(plan, profile.meta.get("model"))
    assert words == ("the one pipeline, each row 2 tensor-parallel GPUs (dp 1 x pp 3 x tp 2 on 6 GPUs, "
                     "hand-written example for docs/simulator.md (6 layers, two micro-batch sizes))")
    inputs = ReportInputs(plan=plan, profile=profile, timeline=_timeline(0.01))
    assert words in fig_schedule.draw(inputs)._suptitle.get_text()
    # a $ would start matplotlib's math text: escaped, it is drawn as it is
    assert drawn_devices(plan.with_(model="m:cost=$5")).endswith(r"m:cost=\$5)")


def test_a_plan_without_parallel_keeps_its_title() -> None:
    plan = load_plan(PLAN)
    assert drawn_devices(plan, "any model") == "3 devices"
    fig = fig_schedule.draw(ReportInputs(plan=plan, timeline=_timeline(0.01)))
    assert fig._suptitle.get_text() == "Pipeline schedule: 1f1b, 8 micro-batches of 4 on 3 devices: simulated, 43.51 ms"


def test_every_transfer_bar_is_at_least_the_minimum_width_from_its_true_start() -> None:
    rows = _timeline(0.01)
    ax = Figure(figsize=(11, 3)).subplots()
    kinds = draw_gantt(ax, rows)
    x_span = ax.get_xlim()[1] - ax.get_xlim()[0]
    least = min_thin_bar_width(ax, x_span)
    bars = _transfer_bars(ax)
    assert len(bars) == 24 and least > 0.01
    assert all(width >= least * (1 - 1e-9) for _, width in bars)  # x + w - x: rounding only
    assert sorted(start for start, _ in bars) == pytest.approx(sorted(r.start_ms for r in rows if r.kind == "C"))
    assert "C" + WIDENED in kinds


def test_transfers_are_two_pixels_wide_or_more_once_rendered_and_the_legend_says_so() -> None:
    fig = gantt_figure(_timeline(0.01))
    render(fig, "png", dpi=RENDER_DPI)  # lays the figure out: the axes' final width
    ax = fig.axes[0]
    x_span = ax.get_xlim()[1] - ax.get_xlim()[0]
    px_per_ms = ax.get_position().width * fig.get_figwidth() * RENDER_DPI / x_span
    widths_px = [width * px_per_ms for _, width in _transfer_bars(ax)]
    assert len(widths_px) == 24 and min(widths_px) >= 2.0  # before: 0.01 ms was 0.3 px
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "C transfer (short ones drawn wider)" in labels


def test_transfers_long_enough_to_see_are_drawn_as_they_last() -> None:
    rows = _timeline(1.0)
    fig = gantt_figure(rows)
    assert sorted(width for _, width in _transfer_bars(fig.axes[0])) == pytest.approx([1.0] * 24)
    assert "C transfer" in [t.get_text() for t in fig.legends[0].get_texts()]
