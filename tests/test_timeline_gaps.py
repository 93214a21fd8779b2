"""Transfer gaps of a measured timeline: the time a rank waited for a message, never negative.

The rows below are a zero-bubble run with recompute on two ranks (custom:tuple_model, 4
micro-batches), shortened: stage 0 recomputes inside its W (its I has no input gradient to
compute), so an R row precedes each W, and the next I comes much later.
"""

import json

import pytest

from planner.calibration import Calibration
from planner.execute.calibrate import calibrate_from_run_file
from planner.execute.runfile import load_run
from planner.execute.timeline import transfer_gaps
from planner.simulation.result import TimelineRow

BOUNDARY = {"0": [0, 100], "1": [100, 0]}


def _rows(spec: list[tuple]) -> list[TimelineRow]:
    return [TimelineRow(*r) for r in spec]


ZB_RECOMPUTE = _rows([
    (0, 0, "F", 0, 0.2, 1.3), (0, 0, "F", 1, 1.4, 2.3),
    (1, 1, "F", 0, 2.9, 4.2), (1, 1, "R", 0, 14.6, 15.1), (1, 1, "I", 0, 15.1, 16.6),
    (0, 0, "I", 0, 26.6, 26.7), (0, 0, "R", 0, 26.8, 27.8), (0, 0, "W", 0, 27.8, 29.5),
    (1, 1, "R", 1, 65.5, 74.2), (1, 1, "I", 1, 74.2, 75.5),
    (0, 0, "I", 1, 82.6, 82.7), (0, 0, "R", 1, 82.8, 89.4), (0, 0, "W", 1, 89.4, 91.2),
])


def test_a_recompute_before_a_weight_backward_is_not_the_start_of_the_next_input_backward():
    gaps = sorted(round(g, 6) for _, g in transfer_gaps(ZB_RECOMPUTE, 2, BOUNDARY))
    # F(0,0) ends 1.3, F(1,0) starts 2.9; I(1,0) ends 16.6, I(0,0) starts 26.6;
    # I(1,1) ends 75.5, I(0,1) starts 82.6 (not at 26.8, where the R of W(0,0) started)
    assert gaps == pytest.approx([1.6, 7.1, 10.0])
    assert all(g >= 0 for g in gaps)


def test_a_recompute_row_starts_the_backward_it_precedes():
    rows = _rows([(0, 0, "F", 0, 0.0, 1.0), (1, 1, "F", 0, 1.5, 2.5),
                  (1, 1, "B", 0, 2.5, 4.0),
                  (0, 0, "R", 0, 5.0, 6.0), (0, 0, "B", 0, 6.0, 7.0)])
    # the receiver began its backward (with the recompute) 1 ms after the gradient was sent
    assert sorted(transfer_gaps(rows, 2, BOUNDARY)) == [[100.0, 0.5], [100.0, 1.0]]


def test_a_receiver_busy_when_the_message_was_sent_or_started_before_it_gives_no_gap():
    busy = _rows([(0, 0, "F", 0, 0.0, 1.0), (1, 1, "F", 9, 0.0, 2.0), (1, 1, "F", 0, 2.0, 3.0)])
    assert transfer_gaps(busy, 2, BOUNDARY) == []
    early = _rows([(0, 0, "F", 0, 0.0, 2.0), (1, 1, "F", 0, 1.0, 3.0)])  # clocks disagree: not a wait
    assert transfer_gaps(early, 2, BOUNDARY) == []
    # shifted to one origin, a receiver that started as the message arrived can read 1e-13 ms early
    rounded = _rows([(0, 0, "F", 0, 0.0, 1.0 + 3e-13), (1, 1, "F", 0, 1.0, 3.0)])
    assert transfer_gaps(rounded, 2, BOUNDARY) == [[100.0, 0.0]]


def run_zb_with_recompute(pplan, folder):
    """Profile the mlp, plan zb with every layer recomputed on 2 ranks, run 4 steps: (plan, run JSON)."""
    prof, plan, run = folder / "t.csv", folder / "t.json", folder / "r.json"
    code, _, err = pplan("profile", "--model", "mlp", "-b", "2,4", "--warmup", "1", "--repeats", "2", "-o", prof)
    assert code == 0, err
    code, _, err = pplan("partition", prof, "--devices", "2", "--global-batch", "16", "--microbatches", "4",
                         "--schedule", "zb", "--recompute", "all", "--out", plan)
    assert code == 0, err
    code, _, err = pplan("run", plan, "--model", "mlp", "--steps", "4", "--threads", "1", "--out", run)
    assert code == 0, err
    return plan, run


@pytest.mark.slow
def test_calibrate_reads_what_run_wrote_for_zero_bubble_with_recompute(pplan, tmp_path):
    """The reviewer's repro: a zb plan with every layer recomputed on 2 ranks, run, then
    calibrate --from-run on the run JSON (refused before: a negative gap)."""
    plan, run = run_zb_with_recompute(pplan, tmp_path)
    record = json.loads(run.read_text())
    assert record["schedule"] == "zb" and all(record["stage_recompute"])
    assert record["transfer_gaps"] and all(g >= 0 for _, g in record["transfer_gaps"])
    code, _, err = pplan("calibrate", plan, "--from-run", run)
    assert code == 0, err


@pytest.mark.slow
def test_an_old_run_with_a_negative_gap_is_read_and_its_gaps_left_out_of_the_fit(pplan, tmp_path):
    """Files written before transfer_gaps was fixed hold negative gaps (zero bubble with recompute):
    they are users' own runs, so they are read, and calibration fits no latency to their gaps."""
    plan, run = run_zb_with_recompute(pplan, tmp_path)
    record = json.loads(run.read_text())
    record["transfer_gaps"][-1][1] = -13.49  # what pplan wrote at 08c1db4
    run.write_text(json.dumps(record))
    assert load_run(run).transfer_gaps[-1][1] == -13.49
    cal, _ = calibrate_from_run_file(plan, run)
    # no latency fitted to gaps that may be too short: the one the run measured, or the default
    assert not record["comm"] and cal.comm_latency_ms == Calibration().comm_latency_ms
    code, _, err = pplan("calibrate", plan, "--from-run", run)
    assert code == 0, err
