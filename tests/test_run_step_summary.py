"""A run JSON whose summary of its steps contradicts the steps (iteration_ms_measured 1e-300 beside
step_ms of 312 ms) is refused by the reader, so neither the report nor `pplan calibrate --from-run`
takes it; what pplan writes (exact) and a file rounded to 4 decimals pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from planner.errors import PplanError
from planner.execute.runfile import load_run, parse_run

RUN = Path(__file__).parent / "data" / "report" / "run.json"  # median of steps 2..7 is 192.4987 (rounded to 4 places)


def _data(**changes) -> dict:
    data = json.loads(RUN.read_text())
    data.update(changes)
    return data


def test_a_run_as_written_or_rounded_is_read():
    run = load_run(RUN)
    assert run.iteration_ms_measured == 192.4987
    exact = parse_run(_data(iteration_ms_measured=192.49869999999999, step_ms_median=192.4987,
                            step_ms_min=186.5131, step_ms_max=195.4595), "run.json")
    assert exact.step_ms_max == 195.4595


@pytest.mark.parametrize("field,value,says", [
    ("iteration_ms_measured", 1e-300, "run field 'iteration_ms_measured' is 1e-300 ms, but the median of step_ms "
                                      "over measured_steps [2, 3, 4, 5, 6, 7] is 192.499 ms"),
    ("iteration_ms_measured", 194.0, "run field 'iteration_ms_measured' is 194.0 ms, but the median"),
    ("step_ms_median", 10.0, "run field 'step_ms_median' is 10.0 ms, but the median"),
    ("step_ms_min", 211.5726, "run field 'step_ms_min' is 211.5726 ms, but the fastest of step_ms over measured_steps"),
    ("step_ms_max", 326.9759, "run field 'step_ms_max' is 326.9759 ms, but the slowest of step_ms"),
])
def test_a_summary_that_contradicts_the_steps_is_refused(field, value, says):
    with pytest.raises(PplanError) as e:
        parse_run(_data(**{field: value}), "run.json")
    assert e.value.message.startswith(f"run.json: {says}"), e.value.message
    assert e.value.message.endswith("the file contradicts itself")


def test_a_median_of_no_measured_step_is_refused():
    with pytest.raises(PplanError) as e:
        parse_run(_data(measured_steps=[]), "run.json")
    assert "run field 'iteration_ms_measured' is 192.4987, but measured_steps is empty" in e.value.message


def test_the_measured_steps_decide_which_steps_count():
    run = parse_run(_data(measured_steps=[0], iteration_ms_measured=326.9759), "run.json")  # the warm-up step alone
    assert run.iteration_ms_measured == 326.9759


def test_report_and_calibrate_refuse_it_on_one_line(tmp_path, run_cli):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_data(iteration_ms_measured=1e-300)))
    for name in ("plan.json", "profile.csv"):  # the calibration would be written beside the profile
        shutil.copy(RUN.parent / name, tmp_path / name)
    for args in (("report", "--run", path, "--out", tmp_path / "out", "--no-simulate"),
                 ("calibrate", tmp_path / "plan.json", "--from-run", path)):
        res = run_cli(*args)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        lines = res.stderr.strip().splitlines()
        assert lines == [f"pplan: error: {path}: run field 'iteration_ms_measured' is 1e-300 ms, but the median of "
                         "step_ms over measured_steps [2, 3, 4, 5, 6, 7] is 192.499 ms: the file contradicts itself; "
                         "give the run JSON as `pplan run --out` wrote it (it writes both from the same steps)"], lines
    assert not (tmp_path / "out").exists() and not (tmp_path / "profile.calibration.json").exists()
