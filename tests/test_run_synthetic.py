"""Four sleeping stages on four processes: measured vs simulated time and memory (slow).

Nothing here passes or fails on how fast the machine is. The sleeping layers give the checks
that load cannot break: each action sleeps to a deadline, so it is never shorter than its set
time, and a measured step never beats the simulated critical path; the ranks run the plan's
order; a hand-over never starts before its sender ended (one monotonic clock on one machine).
How close measured comes to predicted is printed here and judged by `pplan bench fidelity`.
Memory is deterministic and checked tightly.
"""

from __future__ import annotations

import csv
import json
import math

import pytest

from planner.calibration import Calibration, calibration_path_for, load_calibration
from planner.schedules import generate

from helpers.cli import run_pplan
from helpers.plans import write_plan, write_synthetic_profile

S, M, F_MS, B_MS = 4, 8, 10.0, 20.0
CLOCK_MS = 0.01  # slack for the timeline's rounding of times to CSV text, not for speed


@pytest.mark.slow
def test_four_sleeping_stages_match_the_simulation_and_calibrate(tmp_path):
    prof = tmp_path / "syn.csv"
    spec = write_synthetic_profile(prof, S, 2, fwd_ms=F_MS, bwd_ms=B_MS, param_bytes=4096, act_bytes=2000)
    plan = write_plan(tmp_path / "plan.json", spec, "1f1b", S, [(i, i + 1) for i in range(S)],
                      micro_batch_size=2, n_microbatches=M, profile=prof)
    res = run_pplan("run", str(plan), "--device", "cpu", "--steps", "4", "--warmup", "1", "--calibrate",
                    "--out", str(tmp_path / "run.json"), "--timeline", str(tmp_path / "t.csv"), timeout=600)
    assert res.returncode == 0, res.stderr
    run = json.loads((tmp_path / "run.json").read_text())
    print(f"measured {run['iteration_ms_measured']:.1f} ms, predicted {run['iteration_ms_predicted']:.1f} ms, "
          f"error {run['error_pct']:+.1f}%")
    _check_iteration_time(run)
    _check_rank_memory(run["ranks"])
    _check_calibration(run["calibration_fit"], load_calibration(calibration_path_for(prof)))
    with open(tmp_path / "t.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["device", "stage", "kind", "microbatch", "start_ms", "end_ms"]
    assert {r["kind"] for r in rows} == {"F", "B", "O"}
    assert len(rows) == S * (2 * M + 1)  # every F and B of every rank, and each optimizer step
    ends = _check_each_ranks_order_and_sleeps(rows)
    _check_hand_overs(rows, ends)


def _check_iteration_time(run: dict) -> None:
    """The simulation is exact for sleeping stages; the measurement can only add to it."""
    # (M + S - 1) x (f + b) = 11 x 30 ms = 330 ms: the simulation, exact
    assert run["iteration_ms_predicted"] == pytest.approx((M + S - 1) * (F_MS + B_MS), abs=1)
    # one-sided: the runtime can only add to the slept critical path (error = (pred - meas) / meas)
    assert run["iteration_ms_measured"] >= run["iteration_ms_predicted"] - CLOCK_MS
    assert run["error_pct"] == pytest.approx(100 * (run["iteration_ms_predicted"] - run["iteration_ms_measured"])
                                             / run["iteration_ms_measured"])


def _check_rank_memory(ranks: list[dict]) -> None:
    """Each rank's measured tensors match the cost model's (buffers apart), on the CPU allocator's count."""
    for r in ranks:
        # the allocator's count also holds torch's own small tensors, which a model this tiny
        # (2 kB of activations) cannot hide: the tensors' sizes are what match here
        assert r["memory_measure"] == "cpu-allocator"
        assert r["peak_memory_bytes_measured"] >= r["memory_measured"]["weights"]
        # buffers apart: this profile predates input_saved_bytes, so the cost model charges its older
        # 2 x (in + out) while the run counts the M receive buffers torch holds
        assert (r["memory_measured"]["total"] - r["memory_measured"]["buffers"]
                == pytest.approx(r["peak_memory_bytes_predicted"] - r["memory_predicted"]["buffers"], rel=0.05))
        assert r["memory_measured"]["activations"] == pytest.approx(r["memory_predicted"]["activations"], rel=0.05)


def _check_calibration(fit: dict, cal: Calibration) -> None:
    """The calibration's invariants, not its values (those follow the machine's load)."""
    assert cal.compute_scale > 0 and cal.action_overhead_ms >= 0 and cal.step_overhead_ms >= 0
    assert cal.comm_latency_ms is not None and math.isfinite(cal.comm_latency_ms)
    # every action sleeps at least its profiled time, so no measured point lies below it
    for p in fit["compute_points"]:
        assert p["measured_ms"] >= p["profiled_ms"] - CLOCK_MS, p
    # step_overhead_ms absorbs what is left, so after the fit the prediction meets the measurement
    # (unless the fitted actions alone already overshoot it, when step_overhead_ms is 0)
    assert abs(fit["error_pct_after"]) < 1e-6 or (cal.step_overhead_ms == 0 and fit["error_pct_after"] > 0)


def _check_each_ranks_order_and_sleeps(rows: list[dict]) -> dict[tuple[int, str, int], float]:
    """Each rank runs the plan's order, then its optimizer step, and no action is shorter than its
    sleep; returns when each (stage, kind, micro-batch) ended."""
    sched = generate("1f1b", S, M)
    done: dict[tuple[int, str, int], float] = {}
    for dev in range(S):
        mine = sorted((r for r in rows if int(r["device"]) == dev), key=lambda r: float(r["start_ms"]))
        assert [(int(r["stage"]), r["kind"], int(r["microbatch"])) for r in mine if r["kind"] != "O"] == \
               [(a.stage, str(a.kind), a.microbatch) for a in sched.actions(dev)], dev  # the plan's order
        assert mine[-1]["kind"] == "O"  # the optimizer step comes last
        for r in mine:
            start, end = float(r["start_ms"]), float(r["end_ms"])
            assert end >= start
            if r["kind"] in ("F", "B"):
                assert end - start >= (F_MS if r["kind"] == "F" else B_MS) - CLOCK_MS, r  # never shorter than its sleep
                done[(int(r["stage"]), r["kind"], int(r["microbatch"]))] = end
    return done


def _check_hand_overs(rows: list[dict], done: dict[tuple[int, str, int], float]) -> None:
    """No action starts before what it receives was sent: F after the stage before's F, B after the
    stage after's B (and its own F) of the same micro-batch."""
    for r in rows:
        s, kind, m, start = int(r["stage"]), r["kind"], int(r["microbatch"]), float(r["start_ms"])
        if kind == "F" and s > 0:
            assert start >= done[(s - 1, "F", m)] - CLOCK_MS, r
        if kind == "B":
            assert start >= done[(s, "F", m)] - CLOCK_MS, r
            if s < S - 1:
                assert start >= done[(s + 1, "B", m)] - CLOCK_MS, r
