"""What a rank measured (RankMeasurement) round-trips through the JSON the launcher reads, a malformed
one is refused on one line, and the run record's typed parts write the run JSON key for key."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from planner.errors import PplanError, RunError
from planner.execute.measurement import (
    ActionSpan, CommMeasurement, RankMeasurement, RankMemory, measurements_from_json,
)
from planner.execute.runrecord import Divergence, RunRecord
from planner.execute.runfile import parse_run
from planner.plan import MemoryRecord

RUN_FIXTURE = Path(__file__).resolve().parent / "data" / "report" / "run.json"


def _measurement(**changes) -> RankMeasurement:
    base = dict(
        rank=1, device=1, host="h", stages=(1, 3), runtime="ScheduleInterleaved1F1B", threads=2, first_step=2,
        step_ms=(12.5, 10.0, 11.0), measured_steps=(1, 2), timeline_step=2, timeline_t0=1234.5,
        events=(ActionSpan(1, "F", 0, 0.0, 1.5), ActionSpan(3, "R", 0, 2.0, 2.5), ActionSpan(3, "B", 0, 2.5, 4.0),
                ActionSpan(1, "O", -1, 4.0, 4.25)),
        action_ms={"1F": 1.5, "3B": 2.0}, action_cpu_ms={"1F": 1.25, "3B": 1.75}, replica=1, tp=0,
        grad_allreduce_ms=(0.5, 0.75), losses={2: 2.25, 3: float("nan")}, diverged_step=3,
        memory=RankMemory(measure="cpu-allocator", peak_bytes=5000,
                          breakdown=MemoryRecord(weights=1000, gradients=1000, optimizer=2000, activations=600,
                                                 buffers=64, total=4664),
                          transient_bytes=100, rss_peak_bytes=10**8, rss_baseline_bytes=9 * 10**7, rss_growth_bytes=None),
        comm=(CommMeasurement(a=1, b=2, latency_ms=0.05, bandwidth_bytes_per_s=None, points=[[256, 0.05]]),),
        boundary_bytes={1: (64, 128), 3: (128, 32)})
    return RankMeasurement(**{**base, **changes})


def _through_json(m: RankMeasurement) -> RankMeasurement:
    """As the launcher gets it: rank 0's json.dumps, then json.loads and from_dict."""
    return measurements_from_json(json.loads(json.dumps([m.to_dict()])))[0]


def test_a_measurement_round_trips_through_the_launchers_json_with_a_non_finite_loss():
    m = _measurement()
    back = _through_json(m)
    assert math.isnan(back.losses[3])  # the divergence is found from it: JSON's NaN token survives
    assert back == _measurement(losses={2: 2.25, 3: back.losses[3]})
    assert back.events[2].ms == 1.5 and back.boundary_bytes == {1: (64, 128), 3: (128, 32)}
    bare = _measurement(memory=None, comm=(), losses={}, diverged_step=None, grad_allreduce_ms=())
    assert _through_json(bare) == bare


def test_the_json_form_keeps_the_keys_the_test_launcher_reads():
    # tests/helpers/meshruns.py keeps these four keys of each rank's measurement
    d = _measurement().to_dict()
    assert d["first_step"] == 2 and d["grad_allreduce_ms"] == [0.5, 0.75]
    assert d["losses"]["2"] == 2.25 and d["memory"]["breakdown"]["activations"] == 600


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(chosen_step=3), r"unknown key 'chosen_step'"),
    (lambda d: d.pop("step_ms"), r"missing field 'step_ms'"),
    (lambda d: d.update(threads="2"), r"field 'threads' must be an integer, got '2'"),
    (lambda d: d["events"].__setitem__(1, [3, "R", 0, 2.0]), r"events\[1\] must be \[stage, kind, micro-batch"),
    (lambda d: d["events"][0].__setitem__(1, 7), r"events\[0\] kind must be a string, got 7"),
    (lambda d: d["losses"].update(two=1.0), r"field 'losses': key 'two' is not a step or stage index"),
    (lambda d: d["boundary_bytes"].update({"1": [64]}), r"boundary_bytes\['1'\] must be \[input bytes, output bytes\]"),
    (lambda d: d["memory"].update(peak_bytes=None), r"memory field 'peak_bytes' must be an integer, got null"),
    (lambda d: d["memory"]["breakdown"].update(weight=1), r"memory.breakdown: unknown key 'weight'"),
    (lambda d: d["comm"][0].pop("points"), r"comm\[0\]: missing field 'points'"),
    # each field's JSON form from its annotation: tuple[int, ...] a list, a nested record an object
    (lambda d: d.update(stages=[1, "3"]), r"field 'stages' must be a list of integers; item 1 is '3'"),
    (lambda d: d.update(memory=[1]), r"field 'memory' must be an object or null, got \[1\]"),
    (lambda d: d.update(comm=[7]), r"field 'comm' must be a list of objects; item 0 is 7"),
    (lambda d: d.update(events={"0": []}), r"field 'events' must be a list, got \{'0': \[\]\}"),
])
def test_a_malformed_measurement_is_refused_on_one_line(edit, message):
    d = json.loads(json.dumps(_measurement().to_dict()))
    edit(d)
    with pytest.raises(RunError, match=message) as caught:
        measurements_from_json([d], "result.json")
    line = caught.value.one_line()
    assert line.startswith("result.json[0]") and "\n" not in line
    with pytest.raises(RunError, match="must be a list of rank measurements, got dict"):
        measurements_from_json(d)


def test_the_run_records_typed_parts_write_the_run_json_key_for_key():
    data = json.loads(RUN_FIXTURE.read_text())
    data["diverged"] = {"step": 3, "loss": "nan"}
    data["comm"] = [{"a": 0, "b": 1, "latency_ms": 0.05, "bandwidth_bytes_per_s": 2.5e9, "points": [[256, 0.1], [65536, 0.12]]}]
    run = parse_run(data)
    assert run.diverged == Divergence(step=3, loss="nan")
    assert run.comm[0].bandwidth_bytes_per_s == 2.5e9
    assert isinstance(run.ranks[0].memory_measured, MemoryRecord) and run.ranks[0].memory_measured.total > 0
    written = run.to_dict()
    for key in ("diverged", "comm"):  # the typed parts write what was read, key order included
        assert json.dumps(written[key]) == json.dumps(data[key])
    for got, read in zip(written["ranks"], data["ranks"]):
        for key in ("memory_measured", "memory_predicted"):
            assert json.dumps(got[key]) == json.dumps(read[key])
    # a record written now reads back as itself and writes the same text
    assert json.dumps(parse_run(json.loads(json.dumps(written))).to_dict()) == json.dumps(written)
    assert RunRecord.from_dict(written) == run


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(diverged={"step": "3", "loss": "nan"}), r"diverged field 'step' must be an integer, got '3'"),
    (lambda d: d.update(diverged={"step": 3}), r"diverged: missing field 'loss'"),
    (lambda d: d.update(comm=[{"a": 0, "b": 1, "latency_ms": "fast", "bandwidth_bytes_per_s": None, "points": []}]),
     r"comm\[0\] field 'latency_ms' must be a number, got 'fast'"),
    (lambda d: d.update(comm={"a": 0}), r"run field 'comm' must be a list of objects"),
    (lambda d: d["ranks"][0].update(memory_measured=7), r"ranks\[0\] field 'memory_measured' must be an object or null, got 7"),
    (lambda d: d.pop("ranks"), r"run: missing field 'ranks'"),
    # another format's keys are not this one's: the format is named, not its first new key
    (lambda d: d.update(format="pplan-run/2", ranks_by_host={}), r"run format 'pplan-run/2' is not pplan-run/1"),
])
def test_a_bad_typed_part_of_a_run_file_is_one_line(edit, message):
    data = json.loads(RUN_FIXTURE.read_text())
    edit(data)
    with pytest.raises(PplanError, match=message) as caught:
        parse_run(data, "run.json")
    assert caught.value.one_line().startswith("run.json: ") and "report this" not in caught.value.one_line()
