"""Figure 6's memory panel compares the prediction with the measured peak the summary and the run JSON
use (the allocator's, `peak_memory_bytes_measured`), and draws the tracked breakdown (`memory_measured`,
the run's bookkeeping of the predicted items) beside it under its own name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from planner.execute.runfile import parse_run
from planner.report import fig_accuracy
from planner.report.inputs import ReportInputs
from planner.report.style import MEASURED_COLOR

RUN = Path(__file__).parent / "data" / "report" / "run.json"
# The allocator's peak above the tracked total, as on CPU runs (temporaries, the outputs torch keeps).
ALLOCATOR_PEAKS = [40_000_000, 35_000_000]


@pytest.fixture
def inputs() -> ReportInputs:
    data = json.loads(RUN.read_text(encoding="utf-8"))
    for rank, peak in zip(data["ranks"], ALLOCATOR_PEAKS):
        assert rank["memory_measured"]["total"] < peak  # the fixture's tracked totals, below the peaks set here
        rank.update(peak_memory_bytes_measured=peak, memory_measure="cpu-allocator")
    return ReportInputs(run=parse_run(data, str(RUN)))


def _expected_errors(inputs: ReportInputs) -> list[float]:
    ranks = sorted(inputs.run.ranks, key=lambda r: r.rank)
    return [(r.peak_memory_bytes_predicted - peak) / peak for r, peak in zip(ranks, ALLOCATOR_PEAKS)]


def test_memory_numbers_are_against_the_allocator_peak(inputs):
    ranks = sorted(inputs.run.ranks, key=lambda r: r.rank)
    bars = fig_accuracy.peak_memory_bars(inputs)
    assert [b.measured for b in bars] == ALLOCATOR_PEAKS
    assert [b.tracked for b in bars] == [r.memory_measured.total for r in ranks]
    assert [b.predicted for b in bars] == [r.peak_memory_bytes_predicted for r in ranks]
    assert [b.error for b in bars] == pytest.approx(_expected_errors(inputs), rel=1e-12)


def test_drawn_measured_bars_and_percentages_are_the_allocator_peak(inputs):
    import matplotlib.pyplot as plt

    fig = fig_accuracy.draw(inputs)
    try:
        ax_mem = next(ax for ax in fig.axes if ax.get_title() == "Peak memory per device")
        # the axis unit: the y label names it, the divisor is what the tallest of its numbers gives
        unit = ax_mem.get_ylabel().split("(")[1].rstrip(")")
        div = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[unit]
        solid = [p for p in ax_mem.patches if p.get_facecolor()[:3] == pytest.approx(_rgb(MEASURED_COLOR)) and not p.get_hatch()]
        assert sorted(p.get_height() * div for p in solid) == pytest.approx(sorted(ALLOCATOR_PEAKS), rel=1e-9)
        labels = sorted(t.get_text() for t in ax_mem.texts)
        assert labels == sorted(f"{e:+.0%}" for e in _expected_errors(inputs))
        assert "tracked (hatched)" in [t.get_text() for t in ax_mem.get_legend().get_texts()]
    finally:
        plt.close(fig)
    assert "tracked breakdown" in fig_accuracy.caption(inputs)


def _rgb(color: str) -> tuple[float, ...]:
    return tuple(np.array([int(color[i:i + 2], 16) for i in (1, 3, 5)]) / 255)
