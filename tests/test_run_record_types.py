"""The run JSON's `calibration` (a Calibration) and `calibration_fit` (a CalibrationFit) are typed
records: written key for key as before, read back equal, a bad key or value refused on one line
that starts with the file, and read by attribute (the printed summary, the accuracy figure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.cmd_run import print_run
from planner.calibration import Calibration
from planner.errors import PplanError
from planner.execute.fitrecord import CalibrationFit, ComputePoint, as_recorded, calibration_from_dict
from planner.execute.runfile import load_run
from planner.execute.runrecord import RunRecord
from planner.jsontypes import record_fields
from planner.report.fig_accuracy import prediction_lines
from planner.report.inputs import ReportInputs

ROOT = Path(__file__).resolve().parents[1]
FITTED_RUN = ROOT / "reports" / "example" / "data" / "run_first.json"  # `pplan demo`'s calibrated first run
COMMITTED_RUNS = [ROOT / "tests" / "data" / "report" / "run.json", FITTED_RUN,
                  *(ROOT / "reports" / "example" / "data" / n for n in ("run.json", "run_uniform.json"))]
VALUE_KEYS = ["compute_scale", "action_overhead_ms", "comm_latency_ms", "comm_bandwidth_bytes_per_s", "step_overhead_ms",
              "handover_cpu_ms", "handover_cpu_ms_per_mib"]
FIT_KEYS = ["measured_ms", "predicted_ms_before", "error_pct_before", "predicted_ms_after", "error_pct_after",
            "compute_points", "path", "calibration"]


def _fit() -> CalibrationFit:
    return CalibrationFit(measured_ms=120.0, predicted_ms_before=100.0, error_pct_before=-16.7, predicted_ms_after=120.0,
                          error_pct_after=0.0, compute_points=[ComputePoint("0F", 10.0, 11.5), ComputePoint("1I+W", 20.0, 23.0)],
                          path="runs/syn.calibration.json",
                          calibration=Calibration(compute_scale=1.15, action_overhead_ms=0.25, comm_latency_ms=0.3,
                                                  comm_bandwidth_bytes_per_s=None, step_overhead_ms=4.0))


def _fitted_run() -> RunRecord:
    return load_run(FITTED_RUN).with_(calibration=Calibration(compute_scale=1.5, comm_latency_ms=None),
                                      calibration_fit=_fit())


def test_the_calibration_objects_write_the_keys_pplan_run_wrote_in_their_order():
    d = _fitted_run().to_dict()
    assert list(d["calibration"]) == VALUE_KEYS and d["calibration"]["comm_latency_ms"] is None
    fit = d["calibration_fit"]
    assert list(fit) == FIT_KEYS and list(fit["calibration"]) == VALUE_KEYS
    assert fit["compute_points"][1] == {"action": "1I+W", "profiled_ms": 20.0, "measured_ms": 23.0}
    assert "fitted_from" not in fit["calibration"] and list(d)[-1] == "calibration_fit"


def test_a_fitted_run_reads_back_equal_and_its_values_typed(tmp_path):
    run = _fitted_run()
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run.to_dict()))
    again = load_run(path)
    assert again == run
    assert isinstance(again.calibration_fit.compute_points[0], ComputePoint)
    assert again.calibration_fit.calibration.step_overhead_ms == 4.0
    # where a calibration was fitted stays in its file: the run records its values
    fitted = Calibration(compute_scale=2.0, fitted_from={"run": "r.json"})
    assert as_recorded(fitted) == Calibration(compute_scale=2.0) and as_recorded(None) is None


@pytest.mark.parametrize("path", COMMITTED_RUNS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_runs_load_and_write_their_calibration_objects_unchanged(path):
    data = json.loads(path.read_text())
    written = load_run(path).to_dict()
    for key in ("calibration", "calibration_fit"):
        if data.get(key) is None:
            assert written.get(key) is None
            continue
        old, new = data[key], written[key]
        # files from before the hand-over values read them as 0 and write them after the others
        if key == "calibration_fit":
            old, new = dict(old, calibration=None), dict(new, calibration=None)
            assert written[key]["calibration"] == _with_handover(data[key]["calibration"])
            assert new == old and list(new) == list(old)
        else:
            assert new == _with_handover(old)


def _with_handover(calibration: dict) -> dict:
    """A calibration's values as pplan writes them: the hand-over values 0 where the file has none."""
    return {"handover_cpu_ms": 0.0, "handover_cpu_ms_per_mib": 0.0, **calibration}


def _set(where: str, value):
    """An edit of the fitted run's JSON: put `value` at the dotted path `where` (None removes it)."""
    def edit(d):
        *parents, last = where.split(".")
        for part in parents:
            d = d[int(part)] if isinstance(d, list) else d[part]
        key = int(last) if isinstance(d, list) else last
        if value is None:
            del d[key]
        else:
            d[key] = value
    return edit


@pytest.mark.parametrize("edit, message", [
    (_set("calibration_fit.error_pct_aftr", 0.0), r"calibration_fit: unknown key 'error_pct_aftr'; did you mean 'error_pct_after'\?"),
    (_set("calibration_fit.path", None), r"calibration_fit: missing field 'path'"),
    (_set("calibration_fit.measured_ms", "120"), r"calibration_fit field 'measured_ms' must be a number, got '120'"),
    (_set("calibration_fit.error_pct_after", [0]), r"calibration_fit field 'error_pct_after' must be a number or null, got \[0\]"),
    (_set("calibration_fit.compute_points", {"0F": 1.0}), r"calibration_fit field 'compute_points' must be a list of objects"),
    (_set("calibration_fit.compute_points.1.measured_ms", None), r"calibration_fit.compute_points\[1\]: missing field 'measured_ms'"),
    (_set("calibration_fit.compute_points.0.action", 0), r"compute_points\[0\] field 'action' must be a string, got 0"),
    (_set("calibration_fit.compute_points.0", 1.5), r"calibration_fit.compute_points\[0\] must be an object, got 1.5"),
    (_set("calibration_fit.calibration.compute_scael", 1.0), r"calibration_fit.calibration: unknown key 'compute_scael'"),
    (_set("calibration_fit.calibration", "fitted"), r"calibration_fit.calibration must be an object, got 'fitted'"),
    # a nested record's own mistake before the fit's missing fields: the most precise message first
    (_set("calibration_fit", {"measured_ms": 1.0, "calibration": {"compute_scael": 1.0}}),
     r"calibration_fit.calibration: unknown key 'compute_scael'"),
    (_set("calibration_fit", [1]), r"run field 'calibration_fit' must be an object or null, got \[1\]"),
    (_set("calibration.step_overhead_ms", None), r"calibration: missing field 'step_overhead_ms'"),
    (_set("calibration.compute_scale", True), r"calibration field 'compute_scale' must be a number, got true"),
    (_set("calibration.comm_latency_ms", "fast"), r"calibration field 'comm_latency_ms' must be a number or null, got 'fast'"),
    (_set("calibration.compute_scale", 1e308), r"calibration: calibration compute_scale 1e\+308 is out of range"),
    (_set("calibration.fitted_from", {}), r"calibration: unknown key 'fitted_from'"),
    (_set("calibration", 2.0), r"run field 'calibration' must be an object or null, got 2.0"),
])
def test_a_bad_calibration_object_is_one_line_naming_the_field(tmp_path, edit, message):
    data = _fitted_run().to_dict()
    edit(data)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PplanError, match=message) as caught:
        load_run(path)
    line = caught.value.one_line()
    assert line.startswith(f"{path}: ") and "\n" not in line and len(line) < 400


@pytest.mark.parametrize("data, message", [
    (["0F"], r"^p must be an object, got \['0F'\]$"),
    ({"actoin": "0F", "profiled_ms": "x"}, r"^p: unknown key 'actoin'"),  # before the missing field and the type
    ({"profiled_ms": "x", "measured_ms": 1.0}, r"^p: missing field 'action'$"),  # before the type
    ({"action": "0F", "profiled_ms": 1.0, "measured_ms": False}, r"^p field 'measured_ms' must be a number, got false$"),
])
def test_a_record_is_read_in_one_order_object_keys_missing_types(data, message):
    with pytest.raises(PplanError, match=message):
        record_fields(data, ComputePoint, "p")
    assert record_fields({"action": "0F", "profiled_ms": 1, "measured_ms": 2.5}, ComputePoint, "p")["profiled_ms"] == 1


def test_a_calibration_without_the_later_hand_over_values_reads_them_as_zero():
    old = {k: 1.0 for k in VALUE_KEYS[:5]}
    cal = calibration_from_dict(old)
    assert (cal.handover_cpu_ms, cal.handover_cpu_ms_per_mib, cal.fitted_from) == (0.0, 0.0, None)


def test_the_summary_and_the_accuracy_figure_read_the_records(capsys):
    print_run(_fitted_run(), out=None, timeline=None)
    out = capsys.readouterr().out
    assert ("calibration: compute_scale 1.150, action_overhead 0.250 ms, step_overhead 4.000 ms, comm latency 0.300 ms, "
            "bandwidth n/a") in out
    assert "prediction error: before -16.7% (100.0 ms), after +0.0% (120.0 ms); wrote runs/syn.calibration.json" in out
    calibrated = prediction_lines(ReportInputs(run=_fitted_run()))
    plain = prediction_lines(ReportInputs(run=_fitted_run().with_(calibration=None)))
    assert calibrated[0][0] == "predicted at run time (calibrated)" and plain[0][0] == "predicted at run time"
