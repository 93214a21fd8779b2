"""`pplan report`: reports build from fixtures, skip what is missing, write atomically."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from planner.errors import PplanError
from planner.report import build_report, load_inputs, parse_formats, report_dir
from planner.report.derive import sweep_sizes
from planner.report.fig_schedule import one_iteration
from planner.report.inputs import TimelineRow, read_timeline_text

DATA = Path(__file__).parent / "data" / "report"
ALL = dict(profile=DATA / "profile.csv", plan=DATA / "plan.json", sim=DATA / "sim.json", run=DATA / "run.json",
           timeline=DATA / "timeline.csv", measured_timeline=DATA / "measured_timeline.csv")


@pytest.fixture(scope="module")
def full_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports") / "full"
    return build_report(load_inputs(**ALL), out)


def _referenced(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"]+)"', html)


def _svg_texts(path: Path) -> str:
    """The figure's texts: with svg.fonttype "path" matplotlib draws glyphs as paths and keeps each
    text as an XML comment beside them."""
    return "\n".join(re.findall(r"<!-- (.*?) -->", path.read_text(encoding="utf-8")))


def test_full_report_draws_every_figure_in_both_formats(full_report):
    from planner.report.style import KIND_COLORS
    from helpers.figures import assert_drawn_png

    assert [f.skipped for f in full_report.figures] == [None] * 6
    sim = json.loads(ALL["sim"].read_text())
    # what each figure must say, taken from the fixtures (plan: 1f1b, M=4, devices dev0 and dev1)
    says = {
        "1_schedule": [f"Predicted: {sim['iteration_ms']:.2f} ms", "Measured: ", "1f1b, 4 micro-batches of 2 on 2 devices",
                       "F forward", "B backward", "O optimizer step", "0: dev0", "1: dev1"],
        "2_memory": ["Predicted peak memory by kind", "memory limit", "measured peak", "activations"],
        "3_microbatch_sweep": ["1f1b, M=4", "fastest that fits", "Bubble fraction", "global batch 8"],
        "4_baselines": ["pplan plan", "uniform", f"{sim['iteration_ms']:.1f} ms"],
        "5_profile": ["stage 0 on dev0", "stage 1 on dev1", "0 embed", "Per-layer profile at micro-batch size 2"],
        "6_predicted_vs_measured": ["Busy time per device", "Peak memory per device", "predicted", "measured"],
    }
    assert sorted(says) == sorted(f.key for f in full_report.figures)
    for fig in full_report.figures:
        png = full_report.out_dir / f"figures/{fig.key}.png"
        svg = full_report.out_dir / f"figures/{fig.key}.svg"
        colors = (KIND_COLORS["F"], KIND_COLORS["B"]) if fig.key == "1_schedule" else ()  # the Gantt's boxes
        assert_drawn_png(png, min_width=600, min_height=300, colors=colors)  # decodes, right size, something drawn
        assert fig.png == png.read_bytes()  # what the HTML embeds is the file
        texts = _svg_texts(svg)
        for phrase in says[fig.key]:
            assert phrase in texts, (fig.key, phrase)


def test_html_is_self_contained_and_links_only_existing_files(full_report):
    html = full_report.html.read_text()
    refs = _referenced(html)
    embedded = [r for r in refs if r.startswith("data:image/png;base64,")]
    assert len(embedded) == 6
    for ref in refs:
        if not ref.startswith("data:"):
            assert not re.match(r"^[a-z]+://", ref), ref  # nothing fetched from elsewhere
            assert (full_report.out_dir / ref).is_file(), ref


def test_markdown_index_links_existing_figures(full_report):
    md = full_report.markdown.read_text()
    links = re.findall(r"\]\(([^)]+)\)", md)
    assert links
    for link in links:
        assert (full_report.out_dir / link).is_file(), link


def test_summary_has_the_numbers_that_matter(full_report):
    summary = dict(full_report.summary)
    assert "measured iteration time" in summary
    uniform = next(v for k, v in summary.items() if k.startswith("vs uniform split"))
    assert "does not fit" in uniform and "x the plan's" in uniform
    assert any(k.startswith("peak memory dev 1") for k in summary)


def test_missing_inputs_skip_figures_and_say_why(tmp_path):
    rep = build_report(load_inputs(profile=ALL["profile"]), tmp_path / "p")
    drawn = [f.key for f in rep.figures if not f.skipped]
    assert drawn == ["5_profile"]
    md = rep.markdown.read_text()
    assert md.count("*Skipped:") == 5
    assert "--run" in md and "--timeline" in md
    html = rep.html.read_text()
    assert html.count('class="skipped"') == 5


def test_plan_and_profile_alone_are_simulated_here(tmp_path):
    rep = build_report(load_inputs(profile=ALL["profile"], plan=ALL["plan"]), tmp_path / "pp")
    drawn = {f.key for f in rep.figures if not f.skipped}
    assert drawn == {"1_schedule", "2_memory", "3_microbatch_sweep", "4_baselines", "5_profile"}
    assert "computed here" in rep.markdown.read_text()


def test_no_simulate_uses_only_given_files(tmp_path):
    rep = build_report(load_inputs(profile=ALL["profile"], plan=ALL["plan"]), tmp_path / "ns", simulate=False)
    assert {f.key for f in rep.figures if not f.skipped} == {"4_baselines", "5_profile"}


def test_failed_report_leaves_previous_report_untouched(tmp_path, monkeypatch):
    out = tmp_path / "r"
    build_report(load_inputs(profile=ALL["profile"], run=ALL["run"]), out, simulate=False)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    from planner.report import fig_memory

    def boom(*_a, **_k):
        raise RuntimeError("drawing failed")

    monkeypatch.setattr(fig_memory, "draw", boom)  # after figure 1 was drawn
    with pytest.raises(RuntimeError):
        build_report(load_inputs(**ALL), out)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def test_rebuild_replaces_figures_and_drops_stale_ones(tmp_path):
    out = tmp_path / "r"
    build_report(load_inputs(profile=ALL["profile"], run=ALL["run"]), out, simulate=False)
    assert (out / "figures/6_predicted_vs_measured.png").exists()
    build_report(load_inputs(profile=ALL["profile"]), out, simulate=False, formats=("svg",))
    assert sorted(p.name for p in (out / "figures").iterdir()) == ["5_profile.svg"]
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def test_same_inputs_give_identical_files(tmp_path):
    few = dict(profile=ALL["profile"], plan=ALL["plan"], run=ALL["run"])
    a = build_report(load_inputs(**few), tmp_path / "a" / "r", simulate=False)
    b = build_report(load_inputs(**few), tmp_path / "b" / "r", simulate=False)
    for fig in a.figures:
        if not fig.skipped:
            name = f"figures/{fig.key}.svg"
            assert (a.out_dir / name).read_bytes() == (b.out_dir / name).read_bytes(), name
    assert a.markdown.read_text().replace("/a/r", "/b/r") == b.markdown.read_text()


def test_bad_inputs_are_user_errors(tmp_path):
    bad_sim = tmp_path / "sim.json"
    bad_sim.write_text(json.dumps({"devices": []}))
    with pytest.raises(PplanError, match="iteration_ms"):
        load_inputs(sim=bad_sim)
    bad_run = tmp_path / "run.json"
    bad_run.write_text("[1, 2]")
    with pytest.raises(PplanError, match="JSON object"):
        load_inputs(run=bad_run)
    with pytest.raises(PplanError, match="does not exist"):
        load_inputs(timeline=tmp_path / "nope.csv")
    with pytest.raises(PplanError, match="no input files"):
        load_inputs()
    with pytest.raises(PplanError, match="kind 'X'"):
        read_timeline_text("device,stage,kind,microbatch,start_ms,end_ms\n0,0,X,0,0,1\n")
    with pytest.raises(PplanError, match="before start_ms"):
        read_timeline_text("device,stage,kind,microbatch,start_ms,end_ms\n0,0,F,0,2,1\n")
    with pytest.raises(PplanError, match="missing column"):
        read_timeline_text("device,stage,kind\n0,0,F\n")


def test_out_dir_that_is_a_file_is_refused(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(PplanError, match="is a file"):
        build_report(load_inputs(profile=ALL["profile"]), target)


def test_formats_and_names():
    assert parse_formats("svg, PNG") == ("svg", "png")
    with pytest.raises(PplanError, match="jpg"):
        parse_formats("png,jpg")
    assert report_dir("demo") == Path("reports/demo")
    assert report_dir(None, "x/y") == Path("x/y")
    with pytest.raises(PplanError):
        report_dir("../escape")
    with pytest.raises(PplanError):
        report_dir("a", "b")


def test_one_iteration_keeps_the_last_repeat_and_starts_at_zero():
    rows = [TimelineRow(0, 0, "F", 0, 10.0, 12.0), TimelineRow(0, 0, "B", 0, 12.0, 15.0),
            TimelineRow(0, 0, "F", 0, 20.0, 21.0), TimelineRow(0, 0, "B", 0, 21.0, 23.0)]
    got = one_iteration(rows)
    assert [(r.kind, r.start_ms, r.end_ms) for r in got] == [("F", 0.0, 1.0), ("B", 1.0, 3.0)]


def test_sweep_sizes_divide_the_batch_and_stay_small():
    assert sweep_sizes(8, 2) == [1, 2, 4, 8]
    many = sweep_sizes(720, 4)
    assert len(many) <= 12 and all(720 % m == 0 for m in many)
    assert 1 in many and 720 in many and 4 in many


def test_importing_the_report_package_does_not_import_matplotlib():
    code = "import sys, planner.report, planner.report.build; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_report_json(tmp_path, pplan):
    code, out, err = pplan("report", "--profile", ALL["profile"], "--run", ALL["run"], "--out", tmp_path / "c", "--json",
                           "--no-simulate")
    assert code == 0, err
    data = json.loads(out)
    assert Path(data["html"]).is_file()
    assert {f["key"] for f in data["figures"] if not f["skipped"]} == {"5_profile", "6_predicted_vs_measured"}


def test_cli_report_bad_input_exits_2(tmp_path, pplan):
    bad = tmp_path / "t.csv"
    bad.write_text("device,stage\n")
    code, _, err = pplan("report", "--timeline", bad, "--out", tmp_path / "x")
    assert code == 2
    assert "missing column" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_plan_of_another_model_is_reported_not_fatal(tmp_path):
    import numpy as np

    from planner.profiling.profile import make_profile, write_profile

    cols = {c: np.ones((3, 1)) for c in ("fwd_ms", "bwd_ms", "param_bytes", "activation_bytes", "output_bytes")}
    other = tmp_path / "other.csv"
    write_profile(make_profile(["a", "b", "c"], [1], cols), other)
    rep = build_report(load_inputs(profile=other, plan=ALL["plan"]), tmp_path / "mix")
    md = rep.markdown.read_text()
    assert "could not be simulated" in md and "8 layers" in md
    assert {f.key for f in rep.figures if not f.skipped} == {"4_baselines", "5_profile"}
    assert "not drawn: it covers 8 layers, the profile has 3" in md


# ---- the run JSON is read as its typed record --------------------------------------------------

def _run_file(tmp_path: Path, edit) -> Path:
    """The fixture run JSON with `edit(data)` applied, written to a fresh file."""
    data = json.loads(ALL["run"].read_text())
    edit(data)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    return path


def test_a_run_loads_as_its_record_with_its_values():
    from planner.execute.runrecord import RankRecord, RunRecord
    from planner.report.inputs import load_run

    data = json.loads(ALL["run"].read_text())
    run = load_run(ALL["run"])
    assert isinstance(run, RunRecord) and all(isinstance(r, RankRecord) for r in run.ranks)
    assert run.iteration_ms_measured == data["iteration_ms_measured"] and run.step_ms == data["step_ms"]
    assert [r.peak_memory_bytes_measured for r in run.ranks] == [r["peak_memory_bytes_measured"] for r in data["ranks"]]
    assert run.diverged is None  # the fixture predates `diverged`: absent reads as none


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(step_ms=[1.0, 2.0, "fast"]), r"run field 'step_ms' must be a list of numbers; item 2 is 'fast'"),
    (lambda d: d.update(steps=8.5), r"run field 'steps' must be an integer, got 8.5"),
    (lambda d: d.update(iteration_ms_measured=None), r"run field 'iteration_ms_measured' must be a number, got null"),
    (lambda d: d["ranks"][1].update(busy_ms="12"), r"ranks\[1\] field 'busy_ms' must be a number, got '12'"),
    (lambda d: d["ranks"][0].update(rank=True), r"ranks\[0\] field 'rank' must be an integer, got true"),
    (lambda d: d["ranks"][0].update(stages="0"), r"ranks\[0\] field 'stages' must be a list of integers"),
    (lambda d: d["ranks"][0]["memory_measured"].update(weights="1 GB"),
     r"ranks\[0\]\.memory_measured field 'weights' must be a number or null, got '1 GB'"),
    (lambda d: d.update(diverged={"step": 3, "los": "nan"}), r"diverged: unknown key 'los'; did you mean 'loss'\?"),
    (lambda d: d.pop("step_ms"), r"run: missing field 'step_ms'"),
    (lambda d: d["ranks"][0].pop("busy_ms"), r"ranks\[0\]: missing field 'busy_ms'"),
    (lambda d: d.update(ranks={"0": {}}), r"run field 'ranks' must be a list of objects, got \{'0': \{\}\}"),
])
def test_a_bad_run_is_one_line_naming_the_field(tmp_path, edit, message):
    path = _run_file(tmp_path, edit)
    with pytest.raises(PplanError, match=message) as caught:
        load_inputs(run=path)
    line = caught.value.one_line()
    assert line.startswith(str(path)) and "\n" not in line and len(line) < 400


def test_a_byte_count_written_as_a_float_loads():
    from planner.report.inputs import parse_run

    data = json.loads(ALL["run"].read_text())
    data["ranks"][0]["peak_memory_bytes_predicted"] = 1.5e6  # the plan's predicted memory may be any number
    assert parse_run(data).ranks[0].peak_memory_bytes_predicted == 1.5e6


def test_report_inputs_take_a_run_record_only():
    from planner.execute.runrecord import RunRecord
    from planner.report.inputs import ReportInputs, load_run

    record = load_run(ALL["run"])
    with pytest.raises(TypeError, match="must be a RunRecord, got dict"):
        ReportInputs(run=record.to_dict())
    again = ReportInputs(run=RunRecord.from_dict(record.to_dict()))  # what `pplan demo` hands over
    assert again.run == record


def test_summary_and_fit_read_the_records_fields(tmp_path):
    from planner.calibration import Calibration
    from planner.report.derive import fitted_on_run
    from planner.report.inputs import ReportInputs, load_run
    from planner.report.summary import key_numbers, peak_rows

    run = load_run(_run_file(tmp_path, lambda d: d.update(iteration_ms_measured=250.0, measured_steps=[5, 6, 7],
                                                          step_ms=[*d["step_ms"][:5], 240.0, 250.0, 260.0])))
    rows = dict(key_numbers(ReportInputs(run=run)))
    assert rows["measured iteration time"].endswith("(median of 3 timed steps)")
    assert rows["prediction error (plan)"].startswith(f"{(run.iteration_ms_predicted - 250.0) / 250.0:+.1%}")
    assert [(dev, meas) for dev, _pred, meas, _lim in peak_rows(ReportInputs(run=run))] == \
        [(r.rank, float(r.peak_memory_bytes_measured)) for r in run.ranks]
    assert fitted_on_run(Calibration(fitted_from={"run": "elsewhere.json", "measured_ms": 250.0}), run)
    assert not fitted_on_run(Calibration(fitted_from={"run": "elsewhere.json", "measured_ms": 251.0}), run)
    assert not fitted_on_run(Calibration(fitted_from={"measured_ms": 250.0}), None)


def test_report_inputs_take_a_simulation_record_only():
    from planner.report.inputs import ReportInputs, SimulationRecord, load_sim

    record = load_sim(ALL["sim"])
    assert isinstance(record, SimulationRecord)
    assert record.to_dict() == json.loads(ALL["sim"].read_text())  # nothing in the file is lost
    with pytest.raises(TypeError, match="must be a SimulationRecord, got dict"):
        ReportInputs(sim=record.to_dict())
    assert ReportInputs(sim=record).sim.memory_timeline.keys() == {0, 1}


def test_a_simulation_reads_back_as_the_record_it_came_from():
    from planner.plan import load_plan
    from planner.profiling.profile import load_profile
    from planner.report.inputs import parse_sim
    from planner.simulate import simulate

    result = simulate(load_plan(ALL["plan"]), load_profile(ALL["profile"]))
    assert result.memory_timeline and result.prediction().devices
    assert parse_sim(json.loads(json.dumps(result.to_dict()))) == result.record()


def _sim_edit(fn):
    data = json.loads(ALL["sim"].read_text())
    fn(data)
    return data


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d.update(iteration=d.pop("iteration_ms")), r"simulation: unknown key 'iteration'; did you mean 'iteration_ms'\?"),
    (lambda d: d["devices"][0].update(peak_memory=d["devices"][0].pop("peak_memory_bytes")),
     r"devices\[0\]: unknown key 'peak_memory'; did you mean 'peak_memory_bytes'\?"),
    (lambda d: d["devices"][1]["memory"].update(weight=1), r"devices\[1\]\.memory: unknown key 'weight'; did you mean 'weights'\?"),
    (lambda d: d["devices"][0].update(busy_ms="12"), r"simulation\.devices\[0\] field 'busy_ms' must be a number or null, got '12'"),
    (lambda d: d.update(n_microbatches=4.5), r"simulation field 'n_microbatches' must be an integer or null, got 4\.5"),
    (lambda d: d.update(iteration_ms=None), r"'iteration_ms' must be a number, got null"),
    (lambda d: d["memory_timeline"].update({"cpu0": []}), r"memory_timeline: unknown key 'cpu0'; its keys are device indices"),
    (lambda d: d.update(memory_timeline=[]), r"'memory_timeline' must be an object, got \[\]"),
    (lambda d: d["memory_timeline"].update({"0": [[0, 1], ["a", 1]]}), r"memory_timeline\['0'\] must be a list of lists of numbers; item 1 is \['a', 1\]"),
    (lambda d: d["memory_timeline"].update({"1": [[0.5]]}), r"memory_timeline\['1'\] item 0 must be \[t_ms, bytes\], got \[0\.5\]"),
], ids=["typo", "device-typo", "memory-typo", "busy-text", "microbatches-fraction", "no-iteration", "timeline-key",
        "timeline-list", "timeline-text", "timeline-pair"])
def test_a_bad_simulation_is_one_line_naming_the_file_and_the_field(tmp_path, edit, expected):
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(_sim_edit(edit)))
    with pytest.raises(PplanError) as caught:
        load_inputs(sim=path)
    line = caught.value.one_line()
    assert line.startswith(f"{path}: ") and "\n" not in line, line
    assert re.search(expected, line), line


def test_peak_memory_rows_are_per_device_under_data_parallelism(tmp_path):
    """dp = 2: ranks 2 and 3 play devices 0 and 1 again; a device's row holds its ranks' largest peak."""
    from planner.report.inputs import ReportInputs, load_run
    from planner.report.summary import key_numbers, peak_rows

    def replicate(d):
        second = [dict(r, rank=r["rank"] + len(d["ranks"]), replica=1,
                       peak_memory_bytes_measured=r["peak_memory_bytes_measured"] + 1000 * (1 - r["rank"]))
                  for r in d["ranks"]]
        d["ranks"] += second
        d["n_ranks"], d["dp"] = len(d["ranks"]), 2  # the run of a dp = 2 plan records its two replicas

    run = load_run(_run_file(tmp_path, replicate))
    first = {r.device: r.peak_memory_bytes_measured for r in run.ranks if r.replica == 0}
    rows = peak_rows(ReportInputs(run=run))
    assert [dev for dev, *_ in rows] == [0, 1]  # devices, not the four ranks
    assert [meas for _, _, meas, _ in rows] == [float(first[0] + 1000), float(first[1])]
    assert sum(name.startswith("peak memory dev") for name, _ in key_numbers(ReportInputs(run=run))) == 2
