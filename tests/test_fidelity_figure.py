"""`pplan bench fidelity`'s figure from a hand-made table (no runs)."""

from __future__ import annotations

import pytest

from planner.bench.fidelity import fidelity_figure
from planner.bench.table import Table


def test_figure_is_a_png_with_one_point_per_case(tmp_path):
    pytest.importorskip("matplotlib")
    cols = ("model", "devices", "schedule", "microbatches", "predicted_ms", "measured_ms", "time_err_pct",
            "predicted_peak_bytes", "measured_peak_bytes", "mem_abs_err_pct", "error", "measured_ms_min",
            "measured_ms_max", "err_spread_pct", "repeats")
    rows = (("gpt", 2, "gpipe", 4, 100.0, 110.0, -9.1, 1, 1, 0.0, None, 105.0, 120.0, 12.0, 3),
            ("synthetic", 4, "1f1b", 8, 700.0, 690.0, 1.4, 1, 1, 0.0, None, 680.0, 700.0, 3.0, 3),
            ("mlp", 2, "zb", 4, None, None, None, None, None, None, "not planned: x", None, None, None, 0))
    table = Table(name="fidelity", title="t", columns=cols, rows=rows, notes=(), summary={})
    out = tmp_path / "fidelity.png"
    fidelity_figure(table, str(out))
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
