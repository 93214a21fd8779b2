"""The Gantt figure: draws simulated rows, measured rows in other shapes, and both together."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from planner.plan import Device, Plan, StagePlan  # noqa: E402
from planner.profiling.profile import make_profile  # noqa: E402
from planner.report.gantt import as_rows, draw_gantt, gantt_compare_figure, gantt_figure, gantt_png  # noqa: E402
from planner.simulate import simulate  # noqa: E402


def _result():
    cols = {"fwd_ms": np.ones((4, 1)), "bwd_ms": np.full((4, 1), 2.0), "param_bytes": np.zeros((4, 1)),
            "activation_bytes": np.ones((4, 1)), "output_bytes": np.full((4, 1), 1e6)}
    prof = make_profile([f"l{i}" for i in range(4)], [1], cols)
    plan = Plan(schedule="zb", micro_batch_size=1, n_microbatches=4,
                stages=(StagePlan(0, (0, 2), (1,)), StagePlan(1, (2, 4))), devices=(Device("a"), Device("b")))
    return simulate(plan, prof)


def test_rows_in_any_shape_normalise_alike() -> None:
    r = _result()
    x = r.timeline[3]
    as_dict = dict(zip(("device", "stage", "kind", "microbatch", "start_ms", "end_ms"), x))
    assert as_rows([x]) == as_rows([as_dict]) == as_rows([tuple(x)])


def test_gantt_draws_every_kind_with_legend_and_labels() -> None:
    r = _result()
    fig = gantt_figure(r.timeline, device_names=r.device_names)
    ax = fig.axes[0]
    assert "ms" in ax.get_xlabel() and fig._suptitle.get_text().startswith("Pipeline timeline")
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    for kind in ("F", "I", "W", "R", "C", "O"):
        assert any(t.startswith(kind + " ") for t in legend), kind
    assert "idle (bubble)" in legend
    numbers = {t.get_text() for t in ax.texts}
    assert {"0", "1", "2", "3"} <= numbers
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0: a", "1: b"]


def test_predicted_and_measured_share_one_time_axis() -> None:
    r = _result()
    measured = [dict(device=x.device, stage=x.stage, kind=x.kind, microbatch=x.microbatch,
                     start_ms=2 * x.start_ms, end_ms=2 * x.end_ms) for x in r.timeline]
    fig = gantt_compare_figure(r.timeline, measured)
    top, bottom = fig.axes[:2]
    assert top.get_xlim() == bottom.get_xlim()
    assert top.get_xlim()[1] >= 2 * r.iteration_ms
    from planner.report.style import KIND_COLORS
    from helpers.figures import assert_drawn_png

    # rendered, decoded: both panels show the zb schedule's I and W boxes and the recompute R
    px = assert_drawn_png(gantt_png(r.timeline, measured=measured), colors=tuple(KIND_COLORS[k] for k in "FIWR"))
    alone = assert_drawn_png(gantt_png(r.timeline))
    assert px.shape[0] > alone.shape[0]  # two panels stack higher than one


def test_draw_gantt_on_given_axes_returns_kinds() -> None:
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    kinds = draw_gantt(ax, [(0, 0, "F", 0, 0.0, 1.0), (1, 1, "B", 0, 1.0, 3.0)])
    assert kinds == {"F", "B"}
