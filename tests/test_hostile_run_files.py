"""The files `pplan run` and reports read back, written by someone else: a checkpoint folder whose
COMPLETE.json nests half a million brackets or whose rank file is /dev/zero or a FIFO, and run JSONs
with counts, indices and lists no run has. Each is refused on one line naming the value, before it
is looped over, hashed, built or loaded; none hangs or escapes as a traceback."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from planner.errors import PplanError
from planner.execute import checkpoint as ckpt
from planner.execute import checkpoint_integrity
from planner.execute.runfile import MAX_TRANSFER_GAPS, check_run_sizes, load_run, parse_run
from planner.execute.runrecord import MAX_RUN_RANKS, RankRecord, check_run_values, count_ranges
from planner.plan import Device, Plan, StagePlan, load_plan

from helpers.cli import deadline, run_in_repo
from helpers.plans import synthetic_spec, write_plan

ROOT = Path(__file__).resolve().parents[1]
RUN_FIXTURE = ROOT / "reports" / "example" / "data" / "run_first.json"  # a real two-rank run with --calibrate


# ---- checkpoints ---------------------------------------------------------------------------------

def _plan() -> Plan:
    return Plan(schedule="1f1b", micro_batch_size=2, n_microbatches=4,
                stages=(StagePlan(0, (0, 2)), StagePlan(1, (2, 4))), devices=(Device("a"), Device("b")),
                model="mlp:layers=4")


def _save(root: Path, step: int, plan: Plan, state: dict | None = None) -> Path:
    ckpt.prepare_save(root, step)
    for r in range(2):
        ckpt.save_rank_file(root, step, r, state or {"step": step, "w": torch.full((3,), float(step))})
    return ckpt.finish_save(root, step, plan, 2)


def _vouch(folder: Path, name: str, data: bytes) -> None:
    """Make COMPLETE.json record `data` as the file `name` (what someone crafting a save would do)."""
    marker = folder / "COMPLETE.json"
    meta = json.loads(marker.read_text())
    meta["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    marker.write_text(json.dumps(meta))


def test_a_marker_nested_half_a_million_deep_is_no_pplan_marker(tmp_path):
    plan = _plan()
    folder = _save(tmp_path, 2, plan)
    (folder / "COMPLETE.json").write_text("[" * 500_000 + "]" * 500_000)  # 1 MB: under the old 1 MiB bound
    with pytest.raises(PplanError, match=r"COMPLETE\.json is unreadable or not a pplan checkpoint marker") as e:
        ckpt.resume_point(tmp_path, plan)  # was RecursionError inside json.loads
    assert "\n" not in e.value.one_line()


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_a_rank_file_that_is_no_regular_file_is_refused_unread(tmp_path, kind):
    plan = _plan()
    _save(tmp_path, 2, plan)
    folder = _save(tmp_path, 4, plan)
    victim = folder / "rank1.pt"
    victim.unlink()
    if kind == "dev-zero":
        victim.symlink_to("/dev/zero")  # its size reads 0
    else:
        os.mkfifo(victim)  # opening it for reading blocks until a writer comes
    _vouch(folder, "rank1.pt", b"")  # a marker that agrees with the size: only the type gives it away
    with deadline(20.0):  # the unfixed code hangs on these files forever
        found = ckpt.resume_point(tmp_path, plan)
        assert found.step == 2 and "rank1.pt is not a regular file" in found.skipped[0]
        with pytest.raises(PplanError, match=r"rank1\.pt' is not a regular file .*refused to load it"):
            ckpt.load_rank_file(folder, 1)


def test_a_size_that_differs_from_the_marker_is_refused_before_hashing(tmp_path, monkeypatch):
    plan = _plan()
    folder = _save(tmp_path, 2, plan)
    path = folder / "rank0.pt"
    path.write_bytes(path.read_bytes() + b"x" * 10)
    # every check of a rank file's bytes hashes through this one function: a file grown to a
    # terabyte must be refused by its size, not read to the end
    monkeypatch.setattr(checkpoint_integrity, "sha256_of", lambda *a: pytest.fail("hashed a file of the wrong size"))
    with pytest.raises(PplanError, match=r"rank0\.pt has \d+ bytes, the save wrote \d+"):
        ckpt.resume_point(tmp_path, plan)
    with pytest.raises(PplanError, match=r"differs from what the save wrote \(size or sha256\); refused to load it"):
        ckpt.load_rank_file(folder, 0)


class _Evil:
    """Unpickling this runs a shell command (what a crafted checkpoint would do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_file_its_marker_vouches_for_loads_weights_only(tmp_path, monkeypatch):
    plan = _plan()
    folder = _save(tmp_path, 2, plan)
    pwned = tmp_path / "pwned"
    torch.save({"layers": {0: _Evil(pwned)}}, folder / "rank0.pt")
    _vouch(folder, "rank0.pt", (folder / "rank0.pt").read_bytes())
    calls = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(k) or real_load(*a, **k))
    with pytest.raises(PplanError, match=r"rank0\.pt' holds objects other than tensors .*refused"):
        ckpt.load_rank_file(folder, 0)
    assert not pwned.exists() and calls == [{"map_location": "cpu", "weights_only": True}]
    # a file changed after its marker: refused before torch sees a byte of it
    calls.clear()
    data = bytearray((folder / "rank1.pt").read_bytes())
    data[-30] ^= 0xFF
    (folder / "rank1.pt").write_bytes(bytes(data))
    with pytest.raises(PplanError, match=r"rank1\.pt' differs from what the save wrote"):
        ckpt.load_rank_file(folder, 1)
    assert calls == []


@pytest.mark.parametrize("edit, says", [
    (lambda m: m.update(world_size=10**12), "no valid world_size, dp and tp"),
    (lambda m: m.update(world_size=True), "no valid world_size, dp and tp"),
    (lambda m: m.update(dp=2), "says world_size 2, not dp 2 x 2 devices x tp 1"),
    (lambda m: m.update(wrld_size=2), "unknown key 'wrld_size' (did you mean 'world_size'?)"),
    (lambda m: m["files"].pop("rank1.pt"), "does not list one file per rank"),
    (lambda m: m["files"]["rank1.pt"].update(sha256="zz"), "does not record rank1.pt's size"),
    (lambda m: m["files"]["rank1.pt"].update(bytes=-1), "does not record rank1.pt's size"),
    (lambda m: m.pop("files"), "does not list one file per rank"),  # nothing to check a file against
])
def test_a_marker_that_describes_no_run_of_the_plan_is_skipped(tmp_path, edit, says):
    plan = _plan()
    _save(tmp_path, 2, plan)
    folder = _save(tmp_path, 4, plan)
    meta = json.loads((folder / "COMPLETE.json").read_text())
    edit(meta)
    (folder / "COMPLETE.json").write_text(json.dumps(meta))
    found = ckpt.resume_point(tmp_path, plan)
    assert found.step == 2 and says in found.skipped[0], found.skipped


def _record_lookups(monkeypatch, folder: Path) -> list[str]:
    """The names in `folder` that are looked up on disk from now on (os.stat and os.lstat, which
    Path.exists, is_dir, is_symlink and os.path's tests all call)."""
    looked: list[str] = []
    for name in ("stat", "lstat"):
        def recording(path, *args, real=getattr(os, name), **kwargs):
            if isinstance(path, (str, os.PathLike)) and Path(path).parent == folder:
                looked.append(Path(path).name)
            return real(path, *args, **kwargs)
        monkeypatch.setattr(os, name, recording)
    return looked


def test_save_targets_are_found_by_the_folders_entries_not_by_each_step(tmp_path, monkeypatch):
    """--steps 10,000,000 --checkpoint-every 1 listed every step and checked two names for each: 7 min
    and 431 MB before the run began. Now each entry of the folder is looked at once: only the entry
    named for a save is looked up, not the names of the 1,000 steps, nor an entry named for none."""
    (tmp_path / "step-00000007").mkdir()
    (tmp_path / "notes").mkdir()
    looked = _record_lookups(monkeypatch, tmp_path)
    with pytest.raises(PplanError, match="step-00000007' is in the way of the save of step 7"):
        ckpt.check_save_targets(tmp_path, ckpt.save_steps(0, 1000, 1))
    assert set(looked) == {"step-00000007"}, sorted(set(looked))[:10]  # not 2 x 1000 names
    steps = ckpt.save_steps(0, 10_000_000, 1)
    assert 1 in steps and 9_999_999 in steps and 10_000_000 in steps and 0 not in steps
    assert [s for s in range(0, 13) if s in ckpt.save_steps(3, 12, 5)] == [5, 10, 12]
    assert [s for s in range(0, 13) if s in ckpt.save_steps(0, 12, 0)] == [12]
    ckpt.check_save_targets(tmp_path, [8, 9])  # a plain list of steps too


def test_run_refuses_a_fifo_rank_file_before_starting_ranks(tmp_path):
    plan_path = write_plan(tmp_path / "plan.json", synthetic_spec(2, fwd_ms=2, bwd_ms=2), "gpipe", 2, [(0, 1), (1, 2)],
                           n_microbatches=2, optimizer="sgd")
    root = tmp_path / "ckpt"
    folder = _save(root, 1, load_plan(plan_path))
    (folder / "rank0.pt").unlink()
    os.mkfifo(folder / "rank0.pt")
    _vouch(folder, "rank0.pt", b"")
    res = run_in_repo("run", str(plan_path), "--device", "cpu", "--steps", "3", "--checkpoint-dir", str(root),
                      timeout_s=60)  # a hang guard: the unfixed reader blocks in open() forever
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "rank0.pt is not a regular file" in lines[0], res.stderr


# ---- run JSON ------------------------------------------------------------------------------------

def _run() -> dict[str, Any]:
    return json.loads(RUN_FIXTURE.read_text())


def _refused(data: Any, *words: str) -> str:
    with pytest.raises(PplanError) as e:
        parse_run(data, "run.json")
    line = e.value.one_line()
    assert line.startswith("run.json: ") and "\n" not in line and len(line) < 500, line
    for word in words:
        assert word in line, line
    return line


def test_the_fixture_reads():
    run = parse_run(_run(), "run.json")
    assert run.n_stages == 2 and run.n_microbatches == 8 and len(run.comm) == 1


def test_both_readers_take_each_counts_range_from_one_definition():
    """check_run_sizes (before the record is built, step_ms unread: at most a time per step) and
    check_run_values (after, by step_ms as read) refuse one past either end of each count's range
    in runrecord.count_ranges; each once bounded the counts on its own, timeline_step differently."""
    run = parse_run(_run(), "run.json")
    for name, (low, high) in count_ranges(run.steps, n_step_times=run.steps).items():
        if name == "n_ranks":  # the number of rank records, refused as such first
            continue
        for value in (low - 1, high + 1):
            with pytest.raises(PplanError, match=rf"run field '{name}' is {value}, not "):
                check_run_sizes(dict(_run(), **{name: value}))
            with pytest.raises(PplanError, match=rf"run field '{name}' is {value}, not .*{low}\.\.{high}"):
                check_run_values(replace(run, **{name: value}))
    # a resumed run times fewer steps than it reached: the index is checked against the times it holds
    resumed = replace(run, step_ms=run.step_ms[:9], measured_steps=[3], timeline_step=9, iteration_ms_measured=None,
                      step_ms_min=None, step_ms_median=None, step_ms_max=None)
    assert count_ranges(run.steps, len(resumed.step_ms))["timeline_step"] == (-1, 8)
    with pytest.raises(PplanError, match=r"run field 'timeline_step' is 9, not in -1\.\.8"):
        check_run_values(resumed)


@pytest.mark.parametrize("changes, words", [
    ({"steps": 10**15}, ["run field 'steps' is 1000000000000000, not in 1..10000000"]),
    ({"n_microbatches": 0}, ["run field 'n_microbatches' is 0, not 1 or more (allowed: 1..100000000)"]),
    ({"n_stages": 10**6}, ["run field 'n_stages' is 1000000, not in 1..4000"]),
    ({"dp": 10**9}, ["run field 'dp' is 1000000000, not in 1..32768"]),
    ({"timeline_step": 10**15}, ["run field 'timeline_step' is 1000000000000000, not in -1..15"]),
    ({"first_step": 17}, ["run field 'first_step' is 17, not in 0..16"]),
    ({"stage_layers": [[0, 10**12], [10**12, 10**12 + 1]]},
     ["run field 'stage_layers' item 0 is [0, 1000000000000]", "end in 1..4000"]),
    ({"stage_layers": [[0, 9], [8, 10]]}, ["'stage_layers' item 1 is [8, 10]", "with first 9"]),
    ({"stage_layers": [[0, 9]]}, ["run field 'stage_layers' holds 1 stages, not the run's n_stages (2)"]),
    ({"stage_recompute": [[3, 3], []]}, ["'stage_recompute' item 0 is [3, 3]: a layer listed twice"]),
    ({"stage_recompute": [[], [4]]}, ["'stage_recompute' item 1 layer is 4, not 9 or more (allowed: 9..9)"]),
    ({"step_ms": [400.0] * 17}, ["run field 'step_ms' holds 17 step times, not 0..16"]),
    ({"loss_steps": [0] + [1] * 15}, ["run field 'loss_steps' item 2 is 1 after 1: not in increasing order"]),
    ({"loss_steps": list(range(10**6, 10**6 + 16))}, ["'loss_steps' item 0 is 1000000, not in 0..16"]),
    ({"losses": [1.0] * 17, "loss_steps": list(range(17))}, ["run field 'losses' holds 17 items, not 0..16"]),
    ({"measured_steps": [3, 3, 4]}, ["'measured_steps' item 1 is 3 after 3"]),
    ({"diverged": {"step": 10**12, "loss": "nan"}}, ["diverged field 'step' is 1000000000000, not in 0..16"]),
    ({"diverged": {"step": 3, "loss": "\x1b]0;pwned\x07"}}, ["diverged field 'loss' is", "not a loss"]),
    ({"boundary_bytes": {"0": [1, 2], "00": [1, 2]}}, ["'boundary_bytes' key '00' is not a stage index"]),
    ({"boundary_bytes": {str(i): [1, 2] for i in range(3)}}, ["'boundary_bytes' holds 3 stages, not 0..2"]),
    ({"warnings": ["x"] * 65}, ["run field 'warnings' holds 65 warnings, not 0..64"]),
    ({"warnings": ["x" * 5000]}, ["'warnings' item 0: text is 5,000 characters long, more than 4,096"]),
    ({"runtime": "Schedule\n1F1B"}, ["runtime", "control character"]),
    ({"warnings": ["ok", "\x1b]0;pwned\x07"]}, ["'warnings' item 1", "control character \\x1b"]),
    ({"model": "gpt\u202e"}, ["run field 'model'", "control character \\u202e"]),
    ({"load_average": -1.0}, ["run field 'load_average' is -1"]),
    ({"error_pct": float("nan")}, ["run field 'error_pct' must be finite, got nan"]),
    ({"steps": "16"}, ["run field 'steps' must be an integer, got '16'"]),  # a type: still the type's message
])
def test_a_run_count_index_or_list_out_of_range_is_one_line(changes, words):
    _refused(dict(_run(), **changes), *words)


def test_a_run_without_n_stages_is_told_so_not_compared_with_the_bound():
    """The per-stage lists were held to the bound that stood in for the missing count: "holds 2
    stages, not the run's n_stages (4000)"."""
    _refused({k: v for k, v in _run().items() if k != "n_stages"}, "missing field 'n_stages'")
    _refused(dict(_run(), n_stages=None), "run field 'n_stages' must be an integer, got null")


def _rank_edit(**changes: Any):
    def edit(d: dict) -> None:
        d["ranks"][0].update(changes)
    return edit


def _comm_edit(**changes: Any):
    def edit(d: dict) -> None:
        d["comm"][0].update(changes)
    return edit


@pytest.mark.parametrize("edit, words", [
    (_rank_edit(host="vm\n pplan: fake"), ["ranks[0] field 'host'", "control character"]),
    (_rank_edit(stages=[0, 0]), ["ranks[0] field 'stages' is [0, 0]: a stage listed twice"]),
    (_rank_edit(stages=[0] * 3), ["ranks[0] field 'stages' holds 3 stages, not 0..2"]),
    (_rank_edit(threads=10**9), ["ranks[0] field 'threads' is 1000000000, not in 1..65536"]),
    (_rank_edit(replica=1), ["ranks[0] field 'replica' is 1, not in 0..0"]),
    (_rank_edit(action_ms={"7F": 1.0}), ["ranks[0] field 'action_ms' key '7F' stage is 7, not in 0..1"]),
    (_rank_edit(action_ms={f"0{k}{i}": 1.0 for i in range(3) for k in "F"}), ["unknown key '0F0'"]),
    (_comm_edit(b=5), ["comm[0] field 'b' is 5, not in 1..1"]),
    (_comm_edit(a=7, b=8), ["comm[0] field 'a' is 7, not in 0..0"]),
    (_comm_edit(points=[[1, 2]] * 65), ["comm[0] field 'points' holds 65 points, not 0..64"]),
    (_comm_edit(points=[[1, 2, 3]]), ["comm[0] field 'points' item 0 is [1, 2, 3], not a [bytes, ms] pair"]),
    (_comm_edit(bandwidth_bytes_per_s=1e300), ["comm[0] field 'bandwidth_bytes_per_s' is 1e+300, out of range"]),
    (lambda d: d.update(comm=d["comm"] * 2), ["run field 'comm' holds 2 ping-pongs, not 0..1"]),
    (lambda d: d["calibration_fit"].update(path="p" * 5000), ["calibration_fit field 'path': text is 5,000 characters"]),
    (lambda d: d["calibration_fit"]["compute_points"][0].update(action="9F"),
     ["calibration_fit.compute_points[0] field 'action' stage is 9, not in 0..1"]),
    (lambda d: d["calibration_fit"].update(compute_points=d["calibration_fit"]["compute_points"] * 10),
     ["calibration_fit field 'compute_points' holds", "not 0..6"]),
    (lambda d: d["calibration_fit"].update(measured_ms=1e300), ["calibration_fit field 'measured_ms' is 1e+300"]),
])
def test_a_rank_ping_pong_or_fit_out_of_range_is_one_line(edit, words):
    data = _run()
    edit(data)
    _refused(data, *words)


def test_lists_are_bounded_before_any_record_is_built(monkeypatch):
    """A million transfer gaps of a 2-stage, 8-micro-batch run, or more rank records than a run has
    processes: refused by length, with no rank record built and no gap looked at."""
    monkeypatch.setattr(RankRecord, "from_dict", classmethod(lambda *a, **k: pytest.fail("built a rank record")))
    gaps = [[1.0, 2.0]] * 1_000_000
    _refused(dict(_run(), transfer_gaps=gaps), "run field 'transfer_gaps' holds 1000000 gaps, not 0..32",
             f"at most {MAX_TRANSFER_GAPS:,}")
    ranks = [_run()["ranks"][0]] * (MAX_RUN_RANKS + 1)
    _refused(dict(_run(), ranks=ranks, n_ranks=len(ranks)), f"run field 'ranks' holds {MAX_RUN_RANKS + 1} rank records")
    _refused(dict(_run(), n_ranks=10**30), "run field 'n_ranks' is 1000000000000000000000000000000, not the 2 rank")


def test_a_run_file_that_is_not_an_object_and_a_cli_reader_are_one_line(tmp_path):
    _refused([1, 2], "run must be a JSON object")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(dict(_run(), steps=10**15)))
    with pytest.raises(PplanError, match=r"^.*run\.json: run field 'steps' is 1000000000000000, not in 1\.\.10000000"):
        load_run(path)
    res = run_in_repo("report", "--run", str(path), "--out", str(tmp_path / "report"))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "run field 'steps' is 1000000000000000" in res.stderr and not (tmp_path / "report").exists()


def test_ranks_that_report_nothing_or_another_device_are_a_run_error():
    from planner.execute.measurement import RankMeasurement
    from planner.execute.results import assemble_record
    from planner.errors import RunError

    def assemble(measurements):
        return assemble_record(measurements, _plan(), plan_path=None, device_type="cpu", steps=2, warmup=1,
                               prediction=None, prediction_source=None, calibration=None)

    with pytest.raises(RunError, match="no rank reported its measurements"):  # was IndexError
        assemble([])
    stray = RankMeasurement(rank=0, device=5, host="h", stages=(0,), runtime="Schedule1F1B", threads=1, first_step=0,
                            step_ms=(9.0, 5.0), measured_steps=(1,), timeline_step=1, timeline_t0=0.0, events=(),
                            action_ms={}, action_cpu_ms={}, losses={}, memory=None, boundary_bytes={})
    with pytest.raises(RunError, match=r"rank 0 reported device 5, but the plan has devices 0\.\.1"):
        assemble([stray])


def test_a_long_model_spec_is_read_back_from_every_file_that_holds_it(tmp_path):
    """A synthetic spec with per-layer lists runs to thousands of characters; plans and run files
    once refused what the profile had accepted (4,096), after the whole search."""
    from dataclasses import replace

    from planner.limits import MAX_MODEL_SPEC_CHARS
    from planner.plan import write_plan as save_plan

    spec = "synthetic:layers=400,fwd_ms=" + ":".join(["1.25"] * 400) + ",bwd_ms=" + ":".join(["2.625"] * 400)
    assert 4096 < len(spec) < MAX_MODEL_SPEC_CHARS
    save_plan(replace(_plan(), model=spec), tmp_path / "plan.json")
    assert load_plan(tmp_path / "plan.json").model == spec
    assert parse_run(dict(_run(), model=spec), "run.json").model == spec
    with pytest.raises(PplanError, match="more than 262,144"):
        parse_run(dict(_run(), model="x" * (MAX_MODEL_SPEC_CHARS + 1)), "run.json")
