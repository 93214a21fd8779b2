"""`pplan run` refuses, before any process starts, a CPU plan whose ranks are predicted to need more
than this machine's usable memory together: a gpipe plan of micro-batches of 10^7 (6.1 TiB a
device) used to start 4 ranks that died with `DefaultCPUAllocator: can't allocate memory`, exit 1.
"""

from __future__ import annotations

import pytest

import planner.models.bounds as bounds
from planner.errors import PplanError
from planner.execute import RunOptions
from planner.execute.preflight import check_host_memory, preflight
from planner.execute.prediction import predict
from planner.execute.run import run_plan
from planner.plan import load_plan

from helpers.plans import write_plan, write_synthetic_profile

CPU = RunOptions(device="cpu", steps=2, warmup=1)
TIB = 1 << 40


def _plan(tmp_path, act_bytes: int):
    """A 2-device gpipe plan whose profile keeps `act_bytes` per sample per layer (4 micro-batches of 2)."""
    prof = tmp_path / "syn.csv"
    spec = write_synthetic_profile(prof, 4, 2, act_bytes=act_bytes)
    plan = load_plan(write_plan(tmp_path / "p.json", spec, "gpipe", 2, [(0, 2), (2, 4)], profile=prof))
    pf = preflight(plan, CPU)  # passes: it prices nothing
    return plan, pf, predict(plan, pf, use_machine=False)[0]


def test_ranks_predicted_beyond_the_machines_memory_are_refused_with_the_numbers(tmp_path):
    plan, pf, pred = _plan(tmp_path, act_bytes=TIB)  # 2 layers x 4 micro-batches x 2 samples: 16 TiB a device
    peaks = [d.peak_memory_bytes for d in pred.devices]
    assert min(peaks) > 16 * TIB
    with pytest.raises(PplanError) as e:
        check_host_memory(plan, pred, pf.device_type)
    usable = bounds.usable_memory_bytes()
    assert e.value.one_line().startswith("the plan's 2 ranks are predicted to need ")
    assert "above this machine's usable memory of " in e.value.message and "they would fail to allocate" in e.value.message
    assert "pass --force" in e.value.hint and "pplan partition --memory" in e.value.hint
    assert sum(peaks) > usable


def test_force_cuda_and_a_plan_that_fits_are_not_refused(tmp_path):
    plan, pf, pred = _plan(tmp_path, act_bytes=TIB)
    check_host_memory(plan, pred, "cpu", force=True)
    check_host_memory(plan, pred, "cuda")  # its peaks are on the GPUs
    check_host_memory(plan, None, "cpu")  # nothing predicted: nothing to hold it to
    small, _, small_pred = _plan(tmp_path, act_bytes=1000)
    check_host_memory(small, small_pred, "cpu")


def test_the_ranks_torchrun_starts_here_are_summed_smallest_first(tmp_path, monkeypatch):
    plan, _, pred = _plan(tmp_path, act_bytes=1000)
    peaks = sorted(d.peak_memory_bytes for d in pred.devices)
    monkeypatch.setattr(bounds, "usable_memory_bytes", lambda: peaks[0] + peaks[1] - 1)
    with pytest.raises(PplanError, match="the plan's 2 ranks are predicted"):
        check_host_memory(plan, pred, "cpu")
    monkeypatch.setattr(bounds, "usable_memory_bytes", lambda: peaks[0])
    check_host_memory(plan, pred, "cpu", local_world=1)  # one rank here: the smaller peak fits
    monkeypatch.setattr(bounds, "usable_memory_bytes", lambda: peaks[0] - 1)
    with pytest.raises(PplanError, match="the 1 ranks torchrun starts here, at least, are predicted"):
        check_host_memory(plan, pred, "cpu", local_world=1)
    monkeypatch.setattr(bounds, "usable_memory_bytes", lambda: None)  # unknown: nothing to hold it to
    check_host_memory(plan, pred, "cpu")


def test_run_plan_refuses_before_starting_a_rank(tmp_path):
    plan, _, _ = _plan(tmp_path, act_bytes=TIB)
    started = []
    with pytest.raises(PplanError, match="predicted to need .* above this machine's usable memory"):
        run_plan(plan, CPU, plan_path=str(tmp_path / "p.json"), use_machine=False, on_start=lambda: started.append(1))
    assert started == []
