"""Four sleeping stages on four processes: measured vs simulated time and memory (slow).

Sleep-dominated timing is robust on a shared 2-core machine (sleeping processes do not compete
for the cores), so the prediction is checked with a tolerance; memory is deterministic.
"""

from __future__ import annotations

import json

import pytest

from planner.calibration import calibration_path_for, load_calibration

from test_run_support import pplan, write_plan, write_synthetic_profile


@pytest.mark.slow
def test_four_sleeping_stages_match_the_simulation_and_calibrate(tmp_path):
    prof = tmp_path / "syn.csv"
    spec = write_synthetic_profile(prof, 4, 2, fwd_ms=10, bwd_ms=20, param_bytes=4096, act_bytes=2000)
    plan = write_plan(tmp_path / "plan.json", spec, "1f1b", 4, [(i, i + 1) for i in range(4)],
                      micro_batch_size=2, n_microbatches=8, profile=prof)
    res = pplan("run", str(plan), "--device", "cpu", "--steps", "4", "--warmup", "1", "--calibrate",
                "--out", str(tmp_path / "run.json"), "--timeline", str(tmp_path / "t.csv"), timeout=240)
    assert res.returncode == 0, res.stderr
    run = json.loads((tmp_path / "run.json").read_text())
    print(f"measured {run['iteration_ms_measured']:.1f} ms, predicted {run['iteration_ms_predicted']:.1f} ms, "
          f"error {run['error_pct']:+.1f}%")
    # (M + S - 1) x (f + b) = 11 x 30 ms = 330 ms; measured adds runtime overhead and hand-overs
    assert run["iteration_ms_predicted"] == pytest.approx(330, abs=1)
    assert -25 < run["error_pct"] <= 2
    for r in run["ranks"]:
        assert r["memory_measure"] == "tracked"
        assert r["peak_memory_bytes_measured"] == pytest.approx(r["peak_memory_bytes_predicted"], rel=0.05)
        assert r["memory_measured"]["activations"] == pytest.approx(r["memory_predicted"]["activations"], rel=0.05)
    fit = run["calibration_fit"]
    assert abs(fit["error_pct_after"]) < 1e-6
    cal = load_calibration(calibration_path_for(prof))
    assert 0.9 < cal.compute_scale < 1.5 and cal.comm_latency_ms is not None
    rows = (tmp_path / "t.csv").read_text().splitlines()
    assert rows[0] == "device,stage,kind,microbatch,start_ms,end_ms"
    kinds = {ln.split(",")[2] for ln in rows[1:]}
    assert kinds == {"F", "B", "O"}
    assert len(rows) - 1 == 4 * (2 * 8 + 1)  # every F and B of every rank, and each optimizer step
