"""Figure 6's labels: a relative error that rounds to zero reads without a sign ("-0%" said the prediction
leaned low when it did not), and each step-time line says what it compares (this plan's prediction against
this run), so it is not read as the demo's key-number row of the first plan against the first run."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.execute.runfile import parse_run
from planner.report import fig_accuracy
from planner.report.inputs import ReportInputs

RUN = Path(__file__).parent / "data" / "report" / "run.json"


def _inputs(**rank_changes: float) -> ReportInputs:
    """The fixture run, rank 0 edited by `rank_changes`."""
    data = json.loads(RUN.read_text(encoding="utf-8"))
    data["ranks"][0].update(rank_changes)
    return ReportInputs(run=parse_run(data, str(RUN)))


@pytest.mark.parametrize(("error", "decimals", "text"), [
    (-0.001, None, "-0.1%"), (-0.004, None, "-0.4%"), (0.0049, None, "+0.5%"), (-0.00004, None, "0%"),
    (0.0, None, "0%"), (-0.0, None, "0%"), (0.08, None, "+8%"), (-0.1049, None, "-10%"),
    (-0.015, 1, "-1.5%"), (-0.0004, 1, "0.0%"), (-0.0684, 1, "-6.8%"),
])
def test_an_error_near_zero_has_no_signed_zero(error, decimals, text):
    assert fig_accuracy.error_text(error, decimals) == text


def _panel_texts(inputs: ReportInputs, title: str) -> tuple[list[str], list[str]]:
    """(annotations, legend entries) of the panel titled `title`."""
    import matplotlib.pyplot as plt

    fig = fig_accuracy.draw(inputs)
    try:
        ax = next(ax for ax in fig.axes if ax.get_title() == title)
        return [t.get_text() for t in ax.texts], [t.get_text() for t in ax.get_legend().get_texts()]
    finally:
        plt.close(fig)


def test_drawn_memory_and_busy_errors_of_a_tenth_of_a_percent_read_so():
    predicted_bytes, predicted_ms = 36_742_104, 116.28
    inputs = _inputs(peak_memory_bytes_measured=predicted_bytes / (1 - 0.001), busy_ms=predicted_ms / (1 - 0.001))
    memory, _ = _panel_texts(inputs, "Peak memory per device")
    busy, _ = _panel_texts(inputs, "Busy time per device")
    for labels in (memory, busy):
        assert "-0.1%" in labels and "-0%" not in labels


def test_memory_errors_without_breakdowns_are_labelled_alike():
    """Without breakdowns the memory panel pairs bars (another drawing path): the same labels."""
    data = json.loads(RUN.read_text(encoding="utf-8"))
    for rank in data["ranks"]:
        rank.pop("memory_predicted", None)
        rank.pop("memory_measured", None)
    data["ranks"][0]["peak_memory_bytes_measured"] = 36_742_104 * 1.0002  # -0.02%: rounds to zero
    memory, _ = _panel_texts(ReportInputs(run=parse_run(data, str(RUN))), "Peak memory per device")
    assert memory[0] == "0%"


def test_each_prediction_line_names_the_plan_and_the_run_it_compares():
    inputs = replace(_inputs(), extra_predictions=(("uncalibrated", 150.0),))
    measured = inputs.run.iteration_ms_measured
    _, legend = _panel_texts(inputs, "Step time: measured against predicted")
    at_run_time = inputs.run.iteration_ms_predicted
    # one decimal, as the key numbers write the same kind of error
    assert f"this plan, uncalibrated: 150.0 ms ({(150.0 - measured) / measured:+.1%} vs this run)" in legend
    assert (f"this plan, predicted at run time: {at_run_time:.1f} ms "
            f"({(at_run_time - measured) / measured:+.1%} vs this run)") in legend
    assert "this run's own measurement" in fig_accuracy.caption(inputs)


def test_a_fit_is_named_a_residual_on_this_run():
    assert fig_accuracy.prediction_legend("calibrated on this run (a fit)", 192.5, 192.4987, fit=True) == (
        "this plan, calibrated on this run (a fit): 192.5 ms (0.0% residual vs this run)")
    assert fig_accuracy.prediction_legend("simulation", 150.0, None) == "this plan, simulation: 150.0 ms"
