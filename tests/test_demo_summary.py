"""The demo's key numbers (planner.demo.DemoResult.summary), without running the demo."""

from pathlib import Path

from planner.demo import DemoResult
from planner.demo_limit import LimitChoice

MIB = 2**20


def _result(device_peaks):
    limit = LimitChoice(limit_bytes=int(107.1 * MIB), uniform_floor_bytes=110.4 * MIB, pplan_floor_bytes=97.1 * MIB,
                        pplan_fastest_peak_bytes=120 * MIB, rule="between")
    predicted = [p for p, _ in device_peaks]
    measured = [m for _, m in device_peaks]
    return DemoResult(out_dir=Path("out"), html=Path("out/report.html"), limit=limit, first_predicted_ms=392.3,
                      first_measured_ms=410.1, predicted_ms=410.1, measured_ms=416.5, uniform_predicted_ms=676.4,
                      uniform_measured_ms=535.6, peak_predicted_bytes=max(predicted),
                      peak_measured_bytes=max(measured) if all(measured) else None,
                      device_peaks=tuple(device_peaks), elapsed_s=1.0)


def test_the_peak_row_names_each_devices_prediction_and_measurement():
    """The largest predicted peak was dev 0's, the largest measured dev 1's: the row read as one device's
    prediction against its measurement (97.9 vs 97.3) while dev 0 measured 90.7."""
    row = dict(_result([(97.9 * MIB, 90.7 * MIB), (97.1 * MIB, 97.3 * MIB)]).summary())["peak memory of pplan's plan"]
    assert row == ("largest predicted 97.9 MiB, measured 97.3 MiB (dev 0: 97.9 MiB / 90.7 MiB; "
                   "dev 1: 97.1 MiB / 97.3 MiB predicted / measured); limit 107.1 MiB")


def test_without_measurements_the_row_gives_predictions_only():
    row = dict(_result([(97.9 * MIB, None), (97.1 * MIB, None)]).summary())["peak memory of pplan's plan"]
    assert row == "largest predicted 97.9 MiB (dev 0: 97.9 MiB; dev 1: 97.1 MiB predicted); limit 107.1 MiB"
