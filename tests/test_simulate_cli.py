"""`pplan simulate` end to end: exit codes, output and files through the CLI's entry point in
this process (conftest's run_cli; a subprocess per call cost ~0.35 s of CPU, ~25 calls here);
start-up imports and `--version` in real processes."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cli import run_pplan

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent


@pytest.fixture()
def work(sim_work: Path) -> Path:
    return sim_work


def test_human_output_and_files(work: Path, run_cli) -> None:
    r = run_cli("simulate", str(work / "plan.json"), "--out", str(work / "sim.json"),
               "--timeline", str(work / "t.csv"), "--plot", str(work / "g.png"))
    assert r.returncode == 0, r.stderr
    assert "iteration" in r.stdout and "bubble" in r.stdout and "gpu2" in r.stdout
    sim = json.loads((work / "sim.json").read_text())
    assert sim["schedule"] == "1f1b" and sim["n_microbatches"] == 8 and len(sim["devices"]) == 3
    assert sim["devices"][1]["memory"]["total"] == sim["devices"][1]["peak_memory_bytes"]
    from planner.report.inputs import load_sim

    record = load_sim(work / "sim.json")  # what the report reads: the same file, as its typed record
    assert record.to_dict() == sim
    assert record.prediction.devices[1].memory.total == record.prediction.devices[1].peak_memory_bytes
    assert sorted(record.memory_timeline) == [0, 1, 2] and record.basis == sim["basis"]
    with open(work / "t.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["device", "stage", "kind", "microbatch", "start_ms", "end_ms"]
    assert {r["kind"] for r in rows} == {"F", "B", "R", "C", "O"}  # stage 1 recomputes layer 3
    assert max(float(r["end_ms"]) for r in rows) == pytest.approx(sim["iteration_ms"], abs=1e-5)
    from planner.report.style import KIND_COLORS
    from helpers.figures import assert_drawn_png

    # the Gantt chart decodes and shows the kinds the timeline has (stage 1 recomputes: R)
    assert_drawn_png(work / "g.png", colors=tuple(KIND_COLORS[k] for k in ("F", "B", "R")))


def test_json_and_what_if_flags(work: Path, run_cli) -> None:
    base = json.loads(run_cli("simulate", str(work / "plan.json"), "--json").stdout)
    more = json.loads(run_cli("simulate", str(work / "plan.json"), "--json", "--microbatches", "16").stdout)
    assert more["n_microbatches"] == 16 and more["micro_batch_size"] == 2  # global batch 32 kept, as partition does
    assert more["bubble_fraction"] < base["bubble_fraction"]
    kept = json.loads(run_cli("simulate", str(work / "plan.json"), "--json", "--microbatches", "16",
                             "--keep", "micro-batch-size").stdout)
    assert kept["n_microbatches"] == 16 and kept["micro_batch_size"] == 4  # size kept, global batch doubles
    slow = json.loads(run_cli("simulate", str(work / "plan.json"), "--json", "--bandwidth", "10MB/s", "--latency", "1ms").stdout)
    assert slow["iteration_ms"] > base["iteration_ms"] + 10
    zb = json.loads(run_cli("simulate", str(work / "plan.json"), "--json", "--schedule", "zb").stdout)
    assert zb["schedule"] == "zb" and zb["iteration_ms"] < base["iteration_ms"]
    interp = run_cli("simulate", str(work / "plan.json"), "--micro-batch-size", "3", "--keep", "micro-batch-size")
    assert interp.returncode == 0 and "interpolated" in interp.stdout
    odd = run_cli("simulate", str(work / "plan.json"), "--micro-batch-size", "3")
    assert odd.returncode == 2 and "does not divide the global batch 32" in odd.stderr


def test_sweep_table_json_and_plot(work: Path, run_cli) -> None:
    r = run_cli("simulate", str(work / "plan.json"), "--sweep", "microbatches=1,4,8,16,3", "--plot", str(work / "s.png"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "global batch kept" in lines[0] and "basis: uncalibrated" in lines[0]
    assert lines[1].split()[:4] == ["schedule", "M", "size", "global"]
    assert "cannot run" in lines[2]  # 1f1b needs at least 3 micro-batches on 3 devices
    assert [line.split()[1:4] for line in lines[3:6]] == [["4", "8", "32"], ["8", "4", "32"], ["16", "2", "32"]]
    assert "cannot run" in lines[6] and "does not divide the global batch 32" in lines[6]
    assert len(lines) == 7
    grown = run_cli("simulate", str(work / "plan.json"), "--sweep", "microbatches=4,16", "--keep", "micro-batch-size")
    assert [line.split()[1:4] for line in grown.stdout.splitlines()[2:]] == [["4", "4", "16"], ["16", "4", "64"]]
    from helpers.figures import assert_drawn_png

    assert_drawn_png(work / "s.png")
    data = json.loads(run_cli("simulate", str(work / "plan.json"), "--sweep", "schedule=gpipe,1f1b,zb,interleaved", "--json").stdout)
    by = {row["value"]: row for row in data["rows"]}
    assert by["gpipe"]["iteration_ms"] == pytest.approx(by["1f1b"]["iteration_ms"], rel=0.05)
    assert by["zb"]["iteration_ms"] < by["1f1b"]["iteration_ms"]
    assert by["interleaved"]["error"] and by["gpipe"]["peak_memory_bytes"] > by["1f1b"]["peak_memory_bytes"]
    # the sample profile has no wgrad_bytes: zb's memory is a lower bound, in the JSON and as partition marks it
    assert [by[s]["memory_unpriced"] for s in ("gpipe", "1f1b", "zb")] == [False, False, True]
    table = run_cli("simulate", str(work / "plan.json"), "--sweep", "schedule=gpipe,1f1b,zb")
    assert [line.split()[-1] for line in table.stdout.splitlines()[2:5]] == ["yes", "yes", "yes?"]
    assert table.stdout.splitlines()[5].startswith("  yes?: fits if what the profile does not measure")
    assert table.stderr.startswith("pplan: warning: the profile has no wgrad_bytes column")


@pytest.mark.parametrize("args", [
    ["--schedule", "1f1b", "--microbatches", "2"],
    ["--schedule", "interleaved"],
    ["--bandwidth", "fast"],
    ["--sweep", "layers=1,2"],
    ["--profile", "missing.csv"],
    ["--plot", "g.txt"],
])
def test_errors_are_one_line_exit_2_and_leave_no_files(work: Path, args: list[str], run_cli) -> None:
    out = ["--out", str(work / "o.json"), "--timeline", str(work / "o.csv")]
    r = run_cli("simulate", str(work / "plan.json"), *out, *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("pplan: error: ") and r.stderr.count("\n") == 1
    assert sorted(p.name for p in work.iterdir()) == ["plan.json", "sim_profile.csv"]


def test_schedule_flags_read_any_case_as_partition_does(work: Path, run_cli) -> None:
    plain = json.loads(run_cli("simulate", str(work / "plan.json"), "--schedule", "zb", "--json").stdout)
    upper = run_cli("simulate", str(work / "plan.json"), "--schedule", " ZB", "--json")
    assert upper.returncode == 0, upper.stderr
    assert json.loads(upper.stdout) == plain and plain["schedule"] == "zb"
    sweep = run_cli("simulate", str(work / "plan.json"), "--sweep", "schedule=GPipe,1F1B", "--json")
    assert [row["value"] for row in json.loads(sweep.stdout)["rows"]] == ["gpipe", "1f1b"]
    unknown = run_cli("simulate", str(work / "plan.json"), "--schedule", "foo")
    assert unknown.returncode == 2 and unknown.stderr.startswith("pplan: error: --schedule: unknown schedule 'foo'")


def test_a_misspelt_sweep_parameter_gets_the_nearest(work: Path, run_cli) -> None:
    r = run_cli("simulate", str(work / "plan.json"), "--sweep", "microbatchs=1,2")
    assert r.returncode == 2 and "unknown parameter 'microbatchs'; did you mean 'microbatches'?" in r.stderr


def test_simulate_imports_neither_torch_nor_matplotlib(work: Path) -> None:
    code = (
        "import sys\n"
        "from cli.app import main\n"
        f"sys.argv = ['pplan', 'simulate', {str(work / 'plan.json')!r}, '--json']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('HEAVY', sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout


def test_json_errors_go_to_stdout_with_the_same_exit_code(work: Path, run_cli) -> None:
    r = run_cli("simulate", str(work / "missing.json"), "--json")
    assert r.returncode == 2 and r.stderr == ""
    data = json.loads(r.stdout)
    assert set(data) == {"error", "hint"} and "missing.json" in data["error"]
    usage = run_cli("simulate", "--json")  # a usage error (no PLAN.json) is JSON too
    assert usage.returncode == 2 and "error" in json.loads(usage.stdout)
    plain = run_cli("simulate", str(work / "missing.json"))
    assert plain.returncode == 2 and plain.stdout == "" and plain.stderr.startswith("pplan: error: ")


def test_version() -> None:
    r = run_pplan("--version")
    assert r.returncode == 0 and r.stdout.startswith("pplan 0.")


def test_basis_is_named_and_a_calibration_is_applied_only_when_asked_or_found(work: Path, run_cli) -> None:
    from planner.calibration import Calibration, write_calibration

    base = json.loads(run_cli("simulate", str(work / "plan.json"), "--json").stdout)
    assert base["basis"].startswith("uncalibrated")
    write_calibration(Calibration(compute_scale=2.0), work / "mine.json")
    r = run_cli("simulate", str(work / "plan.json"), "--calibration", str(work / "mine.json"))
    assert r.returncode == 0 and f"basis: calibrated by {work / 'mine.json'}" in r.stdout
    slow = json.loads(run_cli("simulate", str(work / "plan.json"), "--json", "--calibration", str(work / "mine.json")).stdout)
    assert slow["iteration_ms"] > 1.5 * base["iteration_ms"]
    write_calibration(Calibration(compute_scale=2.0), work / "sim_profile.calibration.json")  # the profile's own
    found = json.loads(run_cli("simulate", str(work / "plan.json"), "--json").stdout)
    assert found["basis"].startswith("calibrated") and found["iteration_ms"] == slow["iteration_ms"]
    off = json.loads(run_cli("simulate", str(work / "plan.json"), "--json", "--calibration", "none").stdout)
    assert off["basis"].startswith("uncalibrated") and off["iteration_ms"] == base["iteration_ms"]


def test_reference_profiles_never_receive_a_calibration(tmp_path: Path) -> None:
    from planner.calibration import calibration_path_for, is_reference_profile

    ref = ROOT / "profiles" / "gpt-8l-v32k.csv"
    assert is_reference_profile(ref) and not is_reference_profile(tmp_path / "gpt.csv")
    assert calibration_path_for(ref) == Path("gpt-8l-v32k.calibration.json")  # the current folder
    assert calibration_path_for(tmp_path / "gpt.csv") == tmp_path / "gpt.calibration.json"


# ---- the library call the command makes: what_if checks what a caller will write ----

def test_what_if_refuses_a_sweeps_timeline_and_outputs_with_the_wrong_suffix(work: Path) -> None:
    from planner.errors import PplanError
    from planner.whatif import SimulationOutputs, what_if

    with pytest.raises(PplanError, match="--plot 'g.txt' must end in .png or .svg"):
        SimulationOutputs(plot="g.txt")
    with pytest.raises(PplanError, match="--timeline cannot be combined with --sweep"):
        what_if(work / "plan.json", sweep="microbatches=4,8", outputs=SimulationOutputs(timeline=work / "t.csv"))


@pytest.mark.parametrize("input_name", ["plan.json", "sim_profile.csv", "sim_profile.calibration.json"])
def test_what_if_refuses_an_output_that_is_one_of_its_inputs(work: Path, input_name: str) -> None:
    """The plan, its profile and the profile's own calibration are read: writing over one is refused
    before any work, and the file is left as it was."""
    from planner.calibration import Calibration, write_calibration
    from planner.errors import PplanError
    from planner.whatif import SimulationOutputs, what_if

    write_calibration(Calibration(compute_scale=2.0), work / "sim_profile.calibration.json")
    victim = work / input_name
    before = victim.read_bytes()
    flag = {".json": "out", ".csv": "timeline"}[victim.suffix]
    with pytest.raises(PplanError, match=f"--{flag}"):
        what_if(work / "plan.json", outputs=SimulationOutputs(**{flag: victim}))
    assert victim.read_bytes() == before


def test_what_if_keeps_the_timeline_for_the_outputs_that_show_it(work: Path) -> None:
    from planner.whatif import SimulationOutputs, what_if

    assert what_if(work / "plan.json").sim.timeline == ()
    assert what_if(work / "plan.json", outputs=SimulationOutputs(plot=work / "g.svg")).sim.timeline
    assert not (work / "g.svg").exists()  # the caller writes them; what_if only checks and keeps what they need


def test_out_has_the_short_form_other_commands_have(work: Path, pplan) -> None:
    """profile, partition, run and calibrate take -o; simulate and report once refused it."""
    code, _, err = pplan("simulate", work / "plan.json", "-o", work / "s.json")
    assert code == 0, err
    assert json.loads((work / "s.json").read_text())["iteration_ms"] > 0
