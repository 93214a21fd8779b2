"""What `pplan report` reads is bounded and checked: indices and counts within what a pipeline can
have, predictions within physical ranges, a file of another kind named for what it is, a run of
another plan refused as `pplan calibrate --from-run` refuses it; and what it draws grows with the
devices that occur, not with the largest index."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from planner.errors import PplanError
from planner.plan.records import MAX_PIPELINE_STAGES
from planner.report import load_inputs
from planner.report.inputs import parse_sim, read_timeline_text

DATA = Path(__file__).parent / "data" / "report"
HEADER = "device,stage,kind,microbatch,start_ms,end_ms\n"


def test_the_pipeline_limit_is_the_profile_layer_limit() -> None:
    from planner.profiling.csvio import MAX_LAYERS

    assert MAX_PIPELINE_STAGES == MAX_LAYERS  # every stage holds a layer: no pipeline has more stages


@pytest.mark.parametrize("row,fragment", [
    ("1000000,0,F,0,0,1", "line 2: column 'device' is 1000000, out of range (0 to 3999)"),
    ("99999999999999999999,0,F,0,0,1", "column 'device' is 1e+20, out of range"),
    ("0,4000,F,0,0,1", "column 'stage' is 4000, out of range (-1 to 3999)"),
    ("0,-2,F,0,0,1", "column 'stage' is -2, out of range"),
    ("0,0,F,100000000,0,1", "column 'microbatch' is 100000000, out of range (-1 to 99999999)"),
    ("0,0,F,0,0,1e308", "column 'end_ms' is 1e+308, out of range"),
])
def test_timeline_indices_beyond_any_pipeline_are_refused_at_their_line(row: str, fragment: str) -> None:
    with pytest.raises(PplanError) as e:
        read_timeline_text(HEADER + row + "\n", "t.csv")
    assert fragment in e.value.one_line()


def test_the_bound_is_the_largest_pipeline() -> None:
    rows = read_timeline_text(HEADER + "3999,3999,F,0,0,1\n0,-1,O,-1,1,2\n")
    assert [(r.device, r.stage, r.microbatch) for r in rows] == [(3999, 3999, 0), (0, -1, -1)]
    with pytest.raises(PplanError, match="column 'device' is 4000"):
        read_timeline_text(HEADER + "4000,0,F,0,0,1\n")


def test_a_timeline_longer_than_the_row_limit_is_refused(monkeypatch) -> None:
    import planner.report.inputs as inputs

    monkeypatch.setattr(inputs, "MAX_TIMELINE_ROWS", 3)  # the real limit, a million rows, reads for seconds
    text = HEADER + "".join(f"0,0,F,{m},{m},{m + 1}\n" for m in range(4))
    with pytest.raises(PplanError, match="line 5: more than 3 timeline rows"):
        read_timeline_text(text)
    assert len(read_timeline_text(text.rsplit("0,0,F,3", 1)[0])) == 3


def test_gantt_draws_a_row_per_device_that_occurs_not_per_index() -> None:
    from matplotlib.figure import Figure

    from planner.report.gantt import draw_gantt

    ax = Figure().subplots()
    draw_gantt(ax, [(0, 0, "F", 0, 0.0, 1.0), (3999, 1, "B", 0, 1.0, 3.0)])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0: dev0", "3999: dev3999"]
    assert sorted(ax.get_ylim()) == [-0.5, 1.5]


def test_gantt_of_many_devices_stays_a_bounded_figure() -> None:
    from planner.report.gantt import gantt_figure

    fig = gantt_figure([(d, d, "F", 0, float(d), d + 1.0) for d in range(400)])
    assert fig.get_size_inches()[1] <= 40.0  # 0.5 inch a device would be 200 inches
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(labels) <= 64 and labels[0] == "0: dev0"


def _sim() -> dict:
    return json.loads((DATA / "sim.json").read_text())


@pytest.mark.parametrize("change,fragment", [
    ({"bubble_fraction": 7}, "simulation field 'bubble_fraction' is 7, out of range (0 to 1)"),
    ({"iteration_ms": -1}, "simulation field 'iteration_ms' is -1, out of range"),
    ({"micro_batch_size": 0}, "simulation field 'micro_batch_size' is 0, out of range"),
    ({"schedule": "foo"}, "simulation field 'schedule' 'foo' is unknown"),
    ({"memory_timeline": {"5000": [[0, 1]]}}, "memory_timeline['5000']: device 5000 is beyond the largest pipeline"),
    ({"memory_timeline": {"0": [[0, -5]]}}, "memory_timeline['0'] item 0 bytes is -5, out of range"),
])
def test_a_simulation_out_of_range_is_refused_naming_the_field(change: dict, fragment: str) -> None:
    with pytest.raises(PplanError) as e:
        parse_sim({**_sim(), **change}, "s.json")
    assert e.value.one_line().startswith("s.json: ") and fragment in e.value.one_line()


def test_a_simulation_with_more_devices_than_a_pipeline_is_refused() -> None:
    sim = _sim()
    device = sim["devices"][0]
    sim["devices"] = [{**device, "device": i} for i in range(MAX_PIPELINE_STAGES + 1)]
    with pytest.raises(PplanError) as e:
        parse_sim(sim, "s.json")
    assert "out of range (0 to 3999)" in e.value.one_line() or "more than a pipeline can have" in e.value.one_line()
    sim["devices"] = sim["devices"][:2]
    assert len(parse_sim(sim).prediction.devices) == 2


@pytest.fixture
def files(tmp_path: Path) -> Path:
    for name in ("plan.json", "run.json", "sim.json"):
        shutil.copy(DATA / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("flag,name,fragment,hint", [
    ("sim", "plan.json", "this is a plan file (format 'pplan-plan/1'), not a simulation", "pass it as --plan"),
    ("run", "plan.json", "this is a plan file (format 'pplan-plan/1'), not a run", "pass it as --plan"),
    ("plan", "run.json", "this is a run file (format 'pplan-run/1'), not a plan", "pass it as --run"),
])
def test_a_file_of_another_kind_is_named_with_its_flag(files: Path, flag: str, name: str, fragment: str,
                                                       hint: str) -> None:
    with pytest.raises(PplanError) as e:
        load_inputs(**{flag: files / name})
    assert fragment in e.value.message and e.value.hint == hint


@pytest.mark.parametrize("change,fragment", [
    ({"schedule": "gpipe"}, "schedule gpipe vs 1f1b"),
    ({"n_microbatches": 8, "micro_batch_size": 1}, "micro_batch_size 1 vs 2, n_microbatches 8 vs 4"),
    ({"model": "mlp:layers=2"}, "model mlp:layers=2 vs gpt:"),
    ({"n_stages": 3}, "n_stages 3 vs 2"),
    ({"optimizer": "sgd"}, "optimizer sgd vs adam"),  # a field the report did not compare before
    ({"dp": 2}, "dp 2 vs 1"),
    ({"stage_recompute": [[1, 2], []]}, "stage_recompute [[1, 2], []] vs [[1, 2, 3], []]"),
])
def test_a_run_of_another_plan_is_refused(files: Path, change: dict, fragment: str) -> None:
    run = json.loads((files / "run.json").read_text())
    (files / "run.json").write_text(json.dumps({**run, **change}))
    with pytest.raises(PplanError) as e:
        load_inputs(plan=files / "plan.json", run=files / "run.json")
    assert e.value.message.startswith(f"{files / 'run.json'}: the run is of a different plan than {files / 'plan.json'}: ")
    assert fragment in e.value.message and "give the run of this plan" in e.value.hint


def test_a_run_cut_elsewhere_is_refused_by_report_as_by_calibrate(files: Path, pplan) -> None:
    """The same counts cut at another layer: `pplan report` and `pplan calibrate --from-run` refuse
    it on the same one line, exit code 2; a run file that predates `stage_layers` is read as before."""
    run = json.loads((files / "run.json").read_text())
    assert run.get("stage_layers") is None  # an older run: nothing to compare the cut with
    shutil.copy(DATA / "profile.csv", files / "profile.csv")
    (files / "cut.json").write_text(json.dumps({**run, "stage_layers": [[0, 4], [4, 8]]}))
    says = f"the run is of a different plan than {files / 'plan.json'}: stage_layers [[0, 4], [4, 8]] vs [[0, 5], [5, 8]]"
    lines = []
    for args in (("report", "--plan", files / "plan.json", "--run", files / "cut.json", "--out", files / "r"),
                 ("calibrate", files / "plan.json", "--from-run", files / "cut.json")):
        code, stdout, stderr = pplan(*args)
        assert code == 2 and stdout == "" and stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
        assert says in stderr, stderr
        lines.append(stderr)
    assert lines[0] == lines[1]
    assert not (files / "r").exists() and not (files / "profile.calibration.json").exists()
    load_inputs(plan=files / "plan.json", run=files / "run.json")  # the older run of this plan still reads


def test_a_plan_predicting_other_devices_is_refused(files: Path) -> None:
    plan = json.loads((files / "plan.json").read_text())
    device = plan["predicted"]["devices"][0]
    plan["predicted"]["devices"] = [{**device, "device": i} for i in range(3000)]
    (files / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(PplanError) as e:
        load_inputs(plan=files / "plan.json")
    assert "predicted lists 3000 devices but the plan has 2" in e.value.message
    from planner.plan import load_plan  # every command's plan reader, not only the report's

    with pytest.raises(PplanError, match="predicted lists 3000 devices but the plan has 2"):
        load_plan(files / "plan.json")


def test_report_of_a_huge_device_index_exits_2_on_one_line_and_writes_nothing(tmp_path: Path, pplan) -> None:
    (tmp_path / "t.csv").write_text(HEADER + "1000000,0,F,0,0,1\n")
    out = tmp_path / "r"
    code, stdout, stderr = pplan("report", "--measured-timeline", tmp_path / "t.csv", "--out", out, "--formats", "png")
    assert code == 2 and stdout == ""
    assert stderr.startswith("pplan: error: ") and stderr.count("\n") == 1 and "column 'device' is 1000000" in stderr
    assert not out.exists() or not any(out.iterdir())


def test_report_figures_are_at_most_40_inches_a_side(files: Path, tmp_path: Path) -> None:
    from PIL import Image

    from planner.report import build_report

    sim = _sim()
    device = sim["devices"][0]
    sim["devices"] = [{**device, "device": i} for i in range(100)]
    sim["memory_timeline"] = {}
    (files / "many.json").write_text(json.dumps(sim))
    report = build_report(load_inputs(sim=files / "many.json"), tmp_path / "r", formats=("png",), simulate=False)
    drawn = [f for f in report.figures if not f.skipped]
    assert drawn
    for figure in drawn:  # the memory figure asked for 56.5 inches at 100 devices
        with Image.open(tmp_path / "r" / figure.files[0]) as image:
            assert max(image.size) <= 40 * 150
