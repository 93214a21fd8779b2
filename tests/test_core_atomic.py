import os

import pytest

from planner.atomic import atomic_open, atomic_write_text
from planner.calibration import Calibration, calibration_path_for, find_calibration, load_calibration, write_calibration
from planner.cost import action_ms
from planner.errors import PplanError

from helpers.asserts import assert_file_refused


def test_failed_write_leaves_old_file_and_no_temp(tmp_path):
    target = tmp_path / "out.txt"
    atomic_write_text(target, "old")
    with pytest.raises(RuntimeError):
        with atomic_open(target) as fh:
            fh.write("half")
            raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.txt"]


def test_calibration_round_trip(tmp_path):
    profile = tmp_path / "gpt.csv"
    assert find_calibration(profile) is None
    cal = Calibration(compute_scale=1.1, action_overhead_ms=0.2, comm_latency_ms=0.05, fitted_from={"run": "x"})
    write_calibration(cal, calibration_path_for(profile))
    assert calibration_path_for(profile).name == "gpt.calibration.json"
    assert find_calibration(profile) == cal
    assert action_ms(10.0, cal) == pytest.approx(11.2)


@pytest.mark.parametrize("text, match", [('{"compute_scale": -1}', "compute_scale"), ("{not json", "not valid JSON")])
def test_bad_calibration(tmp_path, text, match):
    assert_file_refused(load_calibration, tmp_path / "c.json", text, PplanError, match)
